//! Failure injection for the failure rules' tests (docs/reliability.md): with
//! `ATTUNE_INJECT=<point>[:<n>]` the runtime fails at the n-th pass (default 1) through
//! one named point, so the tests can show on the real build what a bug or a failing
//! medium there does to the program. The panic points show that it stops at once with a
//! message and no faulting thread waits for ever; `load-fail-half` makes one load place
//! the first half of its run and then fail, as a medium that breaks mid-run would;
//! `window-unmarked` breaks the rule that keeps the remote tier's windows fetched ahead
//! current, so that the content hashes, its second check, are what catches a stale one;
//! `discard-reply-lost` takes the reply of a discard the server applied for a broken
//! connection, so that the discard is sent again after a store that followed it, as a
//! connection that breaks mid-exchange does (the resend must keep their order).
//!
//! Compiled in, not behind a feature: the tests run the build users get (a second build
//! of the runtime would double CI's compile time). Read once, at engine start; ignored in
//! secure execution (set-user-ID programs), as every other `ATTUNE_*` variable. A point
//! costs one relaxed load when nothing is armed.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};

/// A place where a failure can be injected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum Point {
    /// The fault handler thread (thread delivery), at a fault.
    Handler = 1,
    /// A faulting thread's SIGBUS resolver (signal delivery), at a fault.
    Signal = 2,
    /// The evictor thread, as it starts to evict.
    Evictor = 3,
    /// A load from a far tier of a run of two chunks or more: its first half is placed,
    /// then it fails with EIO (not a panic: `hit`).
    LoadHalf = 4,
    /// The remote tier's I/O thread, as it takes a store or discard: from the n-th on, it
    /// no longer marks the windows fetched ahead that the job overlaps stale (`from`).
    WindowUnmarked = 5,
    /// The remote tier, as an exchange's first replies come in: from the n-th discard on
    /// that a store to the same server and offsets follows in the same exchange, the
    /// discard's reply is taken for a broken connection (ECONNRESET), though the server
    /// applied it (`from`). While it is armed, the I/O thread holds a batch with a
    /// discard back until a store to its offsets is posted (200 ms at most), so that both
    /// go in one exchange.
    DiscardReplyLost = 6,
}

const POINTS: [(&str, Point); 6] = [
    ("handler-panic", Point::Handler),
    ("signal-panic", Point::Signal),
    ("evictor-panic", Point::Evictor),
    ("load-fail-half", Point::LoadHalf),
    ("window-unmarked", Point::WindowUnmarked),
    ("discard-reply-lost", Point::DiscardReplyLost),
];

static ARMED: AtomicU32 = AtomicU32::new(0);
static LEFT: AtomicU64 = AtomicU64::new(0);

/// Parses an `ATTUNE_INJECT` value: the point and the pass at which it fires.
pub fn parse(v: &str) -> Result<(Point, u64), String> {
    let (name, n) = match v.split_once(':') {
        Some((name, n)) => (
            name,
            n.parse::<u64>()
                .ok()
                .filter(|&n| n > 0)
                .ok_or_else(|| format!("ATTUNE_INJECT: '{n}' is not a pass number (1 or more)"))?,
        ),
        None => (v, 1),
    };
    let names: Vec<&str> = POINTS.iter().map(|p| p.0).collect();
    POINTS
        .iter()
        .find(|p| p.0 == name)
        .map(|p| (p.1, n))
        .ok_or_else(|| {
            format!(
                "ATTUNE_INJECT: unknown point '{name}' (one of {}); nothing is injected",
                names.join(", ")
            )
        })
}

/// Arms the point `ATTUNE_INJECT` names, if any (at engine start).
pub fn arm_from_env() {
    let Ok(v) = std::env::var("ATTUNE_INJECT") else {
        return;
    };
    if attune_sys::os::secure_execution() {
        return;
    }
    match parse(&v) {
        Ok((p, n)) => {
            LEFT.store(n, Relaxed);
            ARMED.store(p as u32, Relaxed);
        }
        Err(m) => crate::log::emit(crate::log::Level::Warn, &m),
    }
}

/// Whether `p` is the armed point: a caller whose check of the point's condition costs
/// more than a load asks this first.
#[inline]
pub fn armed(p: Point) -> bool {
    ARMED.load(Relaxed) == p as u32
}

/// Passes through `p`: panics there when it is armed and its pass has come.
#[inline]
pub fn at(p: Point) {
    if ARMED.load(Relaxed) == p as u32 {
        fire(p);
    }
}

/// Passes through `p`, a point that fails without a panic: true at its armed pass, once.
/// Signal-safe (atomics only).
#[inline]
pub fn hit(p: Point) -> bool {
    ARMED.load(Relaxed) == p as u32 && last_pass()
}

/// Passes through `p`, a point that stays armed: true at its armed pass and every pass
/// after it. Signal-safe (atomics only).
#[inline]
pub fn from(p: Point) -> bool {
    ARMED.load(Relaxed) == p as u32 && counted_from(&LEFT)
}

/// Counts a pass of a point that stays armed: true from its n-th on (the count stops at 1).
#[cold]
fn counted_from(left: &AtomicU64) -> bool {
    left.fetch_update(Relaxed, Relaxed, |l| (l > 1).then(|| l - 1))
        .is_err()
}

/// Counts a pass of the armed point: true at its n-th, which disarms it.
#[cold]
fn last_pass() -> bool {
    if LEFT.fetch_sub(1, Relaxed) == 1 {
        ARMED.store(0, Relaxed);
        return true;
    }
    false
}

#[cold]
fn fire(p: Point) {
    if last_pass() {
        // Literal messages: a panic with arguments allocates, and the signal-delivery
        // point runs in a signal handler.
        match p {
            Point::Handler => panic!("injected failure (ATTUNE_INJECT=handler-panic)"),
            Point::Signal => panic!("injected failure (ATTUNE_INJECT=signal-panic)"),
            Point::Evictor => panic!("injected failure (ATTUNE_INJECT=evictor-panic)"),
            // Not panic points: their callers ask `hit` or `from`.
            Point::LoadHalf | Point::WindowUnmarked | Point::DiscardReplyLost => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_point_that_stays_armed_fires_from_its_pass_on() {
        for n in [1u64, 3] {
            let left = AtomicU64::new(n);
            let fired: Vec<bool> = (0..5).map(|_| counted_from(&left)).collect();
            let want: Vec<bool> = (1..=5).map(|pass| pass >= n).collect();
            assert_eq!(fired, want, "armed at pass {n}");
        }
    }

    #[test]
    fn values_parse_or_are_refused_with_the_points_named() {
        assert_eq!(parse("handler-panic"), Ok((Point::Handler, 1)));
        assert_eq!(parse("evictor-panic:30"), Ok((Point::Evictor, 30)));
        assert_eq!(parse("signal-panic:2"), Ok((Point::Signal, 2)));
        assert_eq!(parse("load-fail-half:3"), Ok((Point::LoadHalf, 3)));
        assert_eq!(parse("window-unmarked"), Ok((Point::WindowUnmarked, 1)));
        assert_eq!(
            parse("discard-reply-lost:2"),
            Ok((Point::DiscardReplyLost, 2))
        );
        for bad in ["handler-panic:0", "handler-panic:x", "evictor-panic:"] {
            assert!(parse(bad).unwrap_err().contains("pass number"), "{bad}");
        }
        let e = parse("evicter-panic").unwrap_err();
        assert!(
            e.contains("unknown point 'evicter-panic'") && e.contains("evictor-panic"),
            "{e}"
        );
    }
}
