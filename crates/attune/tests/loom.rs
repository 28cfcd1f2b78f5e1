//! A model check (loom) of the runtime's lock-free protocols, on their own sources: the
//! fork gate (`src/sync/gate.rs`), the small allocator's flag gate (`src/sync/flag_gate.rs`,
//! its symmetric case), the chunk state machine (`src/region.rs`), the remote tier's
//! windows fetched ahead (`src/tier/remote/ahead.rs`) and the program clock's slots
//! (`src/paging/progclock.rs`). loom runs every
//! interleaving of the threads below, and every result the C11 memory model lets a load
//! return, up to a bound of preemptions; a `loom::cell::UnsafeCell` stands for what the
//! protocol protects, so an access that is not ordered after the previous one fails.
//!
//! Run: `RUSTFLAGS="--cfg loom" cargo test --release -p attune-core --test loom`
//! (`tests/test.sh` does, in its own target directory).
#![cfg(loom)]

/// The modules under test reach their atomics through the shim (`super::shim`,
/// `crate::sync::shim`): here, loom's.
#[allow(dead_code)]
mod shim {
    pub use loom::sync::atomic::{
        fence, AtomicBool, AtomicI32, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering,
    };
    /// A futex wait: loom runs another thread, and the caller's loop loads the word again.
    pub fn wait_while(_: &AtomicU32, _: u32) {
        loom::thread::yield_now()
    }
    pub fn wake_all(_: &AtomicU32) {}
    /// A compiler fence orders nothing between threads in the C11 model; the real one
    /// stands in for a fence only in the asymmetric case, which loom cannot run.
    pub fn compiler_fence(_: Ordering) {}
    pub fn yield_now() {
        loom::thread::yield_now()
    }
    pub fn spin_loop() {
        loom::thread::yield_now()
    }
    /// Timeouts never expire in the model: the closers below wait without one.
    pub fn now_ns() -> u64 {
        0
    }
}

#[allow(dead_code)]
#[path = "../src/sync/gate.rs"]
mod gate;

#[allow(dead_code)]
#[path = "../src/sync/flag_gate.rs"]
mod flag_gate;

/// `crate::sync::…` as the runtime crate spells it.
mod sync {
    pub(crate) use super::{gate, shim};
}

#[allow(dead_code)]
#[path = "../src/region.rs"]
mod region;

#[allow(dead_code)]
#[path = "../src/tier/remote/ahead.rs"]
mod ahead;

#[allow(dead_code)]
#[path = "../src/paging/progclock.rs"]
mod progclock;

use flag_gate::FlagGate;
use gate::Gate;
use loom::cell::UnsafeCell;
use loom::sync::Arc;
use loom::thread;
use region::{Claim, Region, RegionKind, Where};

const FOREVER: u64 = u64::MAX;

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    // Bugs in protocols this small show within two preemptions (the Relaxed load of
    // `closed` did, see `flag_gate`). At three, two threads that wait on a third make
    // loom's scheduler alternate between them without end (tokio-rs/loom#53, open: the
    // same with the plain counter gate): so a model has at most one waiting entrant.
    b.preemption_bound = Some(2);
    b.check(f);
}

/// What a gate protects: touched by the operations inside and by the closer while closed.
struct Shared(UnsafeCell<u64>);
unsafe impl Sync for Shared {}
impl Shared {
    fn new() -> Arc<Shared> {
        Arc::new(Shared(UnsafeCell::new(0)))
    }
    fn touch(&self) {
        self.0.with_mut(|p| unsafe { *p += 1 });
    }
    fn read(&self) -> u64 {
        self.0.with(|p| unsafe { *p })
    }
}

/// An operation run on a thread of its own.
type Op = Box<dyn FnOnce() + Send>;

/// Runs `ops` each on a thread against a closer: `close` (which must succeed), the
/// closer's own work on `data` (the fork, with nothing inside), `open`, then the joins.
fn against_a_closer(
    ops: Vec<Op>,
    close: impl FnOnce() -> bool,
    data: &[&Shared],
    open: impl FnOnce(),
) {
    let threads: Vec<_> = ops.into_iter().map(thread::spawn).collect();
    assert!(close(), "a close without timeout gave up");
    for d in data {
        d.touch();
    }
    open();
    for t in threads {
        t.join().unwrap();
    }
}

#[test]
fn gate_close_waits_for_operations_and_holds_new_ones() {
    model(|| {
        let (g, d) = (Arc::new(Gate::new()), Shared::new());
        let op: Op = {
            let (g, d) = (g.clone(), d.clone());
            Box::new(move || {
                let _in = g.enter();
                d.touch();
            })
        };
        against_a_closer(vec![op], || g.close(FOREVER), &[&d], || g.open());
        assert_eq!(d.read(), 2);
        assert_eq!(g.inside(), 0);
    });
}

/// Two threads with slots of their own (one by `enter`, one by `try_enter`) against a
/// closer: neither is inside while the gate is closed, and each sees the closer's work
/// when it gets in after the gate opens.
#[test]
fn flag_gate_close_waits_for_slots_and_holds_new_ones() {
    model(|| {
        let g = Arc::new(FlagGate::<2>::new());
        // Operations may run side by side: each has data of its own, which the closer
        // touches too.
        let (da, db) = (Shared::new(), Shared::new());
        let a: Op = {
            let (g, d) = (g.clone(), da.clone());
            Box::new(move || {
                let _in = g.enter(Some(0), || false);
                d.touch();
            })
        };
        let b: Op = {
            let (g, d) = (g.clone(), db.clone());
            Box::new(move || {
                if let Some(slot) = g.try_enter(1, false) {
                    d.touch();
                    FlagGate::<2>::leave(slot);
                }
            })
        };
        against_a_closer(
            vec![a, b],
            || g.close(FOREVER, || {}),
            &[&da, &db],
            || g.open(),
        );
        assert_eq!(g.inside(), 0);
    });
}

/// One operation against a closer, entering through `slot` (None: the counter gate, as a
/// thread without a slot does) `depth` times nested (a signal handler inside an
/// operation): an inner entry never waits for a close that waits for the outer one.
fn flag_gate_one_operation(slot: Option<usize>, depth: u64) {
    model(move || {
        let (g, d) = (Arc::new(FlagGate::<1>::new()), Shared::new());
        let op: Op = {
            let (g, d) = (g.clone(), d.clone());
            Box::new(move || {
                let mut held = Vec::new();
                for _ in 0..depth {
                    held.push(g.enter(slot, || false));
                    d.touch();
                }
            })
        };
        against_a_closer(vec![op], || g.close(FOREVER, || {}), &[&d], || g.open());
        assert_eq!(d.read(), depth + 1);
        assert_eq!(g.inside(), 0);
    });
}

#[test]
fn flag_gate_nested_operation_against_a_closer() {
    flag_gate_one_operation(Some(0), 2);
}

#[test]
fn flag_gate_thread_without_a_slot_against_a_closer() {
    flag_gate_one_operation(None, 1);
}

fn one_chunk_region() -> Arc<Region> {
    Arc::new(Region::new(
        0,
        1 << 20,
        4096,
        4096,
        4096,
        attune_policy::Flags(0),
        attune_sys::uffd::Delivery::Thread,
        RegionKind::Dedicated,
        Vec::new(),
        0,
        false,
        false,
    ))
}

/// Two faults and an eviction race on one chunk: one owner at a time (the cell is the
/// chunk's content, written by whoever owns it), and the chunk ends resident or far.
#[test]
fn chunk_has_one_owner_at_a_time() {
    model(|| {
        let (r, d) = (one_chunk_region(), Shared::new());
        let fault = |r: Arc<Region>, d: Arc<Shared>| {
            thread::spawn(move || match r.claim_fetch(0, true) {
                Some(Claim::Owned(from, _)) => {
                    assert!(matches!(from, Where::Fresh | Where::Far));
                    d.touch();
                    r.settle(0, Where::Resident, 0, 0);
                }
                Some(Claim::Resident) => {}
                None => unreachable!("a waiting claim always ends"),
            })
        };
        let f1 = fault(r.clone(), d.clone());
        let f2 = fault(r.clone(), d.clone());
        let s = r.state(0);
        if r.claim_evict(0, s) {
            d.touch();
            r.settle(0, Where::Far, 1, 0);
        }
        f1.join().unwrap();
        f2.join().unwrap();
        let end = r.state(0).place();
        assert!(matches!(end, Where::Resident | Where::Far), "{end:?}");
    });
}

/// A hold (pin, then fetch) against the evictor: once the hold returns the chunk is
/// resident and pinned, whatever the evictor saw or claimed first, and stays so.
#[test]
fn a_pinned_chunk_ends_resident_and_is_never_evicted() {
    model(|| {
        let r = one_chunk_region();
        r.settle(0, Where::Resident, 0, 0);
        let evictor = {
            let r = r.clone();
            thread::spawn(move || {
                for _ in 0..2 {
                    let s = r.state(0);
                    if r.claim_evict(0, s) {
                        r.settle(0, Where::Far, 1, 0);
                    }
                }
            })
        };
        assert!(r.pin(0), "nobody else pins");
        if let Some(Claim::Owned(..)) = r.claim_fetch(0, true) {
            r.settle(0, Where::Resident, 0, 0);
        }
        let s = r.state(0);
        assert!(s.place() == Where::Resident && s.pinned(), "{s:?}");
        evictor.join().unwrap();
        let s = r.state(0);
        assert!(s.place() == Where::Resident && s.pinned(), "{s:?}");
        assert!(r.unpin(0));
    });
}

/// A window's buffer as the model sees it: written by the I/O thread (the fabric's
/// receive) and read by the load that places from it.
struct Buffer(UnsafeCell<u64>);
unsafe impl Sync for Buffer {}
unsafe impl Send for Buffer {}

const W: u64 = 64 << 10;

/// A tier's windows at depth 1 (four windows of `W`), window 0 posted for the cell at
/// `2 W` by a stream's second load.
fn one_window_posted() -> Arc<ahead::Ahead> {
    let a = Arc::new(ahead::Ahead::new(1, W as usize, 16 * W).unwrap());
    // The first load starts no stream; the second continues it and posts one window.
    let mut posted = Vec::new();
    a.after_load(0, W as usize, None, |_, _| true, |_, _, _, _| false);
    a.after_load(
        W,
        W as usize,
        None,
        |_, _| true,
        |addr, o, l, i| {
            posted.push((addr, o, l, i));
            true
        },
    );
    assert_eq!(posted.len(), 1, "a stream posts one window at depth 1");
    let (_, o, l, i) = posted[0];
    assert_eq!((o, l as u64, i), (2 * W, W, 0));
    a
}

/// A load that a posted window holds waits for its pages and reads what the I/O thread
/// received into the buffer (the answer's Release, the wait's Acquire), and gives the
/// window back free when it placed its end.
#[test]
fn a_window_is_read_only_after_its_pages_arrived() {
    model(|| {
        let a = one_window_posted();
        let buf = Arc::new(Buffer(UnsafeCell::new(0)));
        let io = {
            let (a, buf) = (a.clone(), buf.clone());
            thread::spawn(move || {
                buf.0.with_mut(|p| unsafe { *p = 7 });
                a.arrive(0, 0);
            })
        };
        let t = a.take(2 * W, W as usize).expect("held, and it arrives");
        assert_eq!(buf.0.with(|p| unsafe { *p }), 7);
        a.give_back(t, true, W as usize);
        io.join().unwrap();
        assert_eq!(a.counts.used.load(loom::sync::atomic::Ordering::Relaxed), W);
    });
}

/// A store taken before the window's answer marks it stale: the load that comes for it
/// is told to go to the servers, and the window is counted stale and freed. A store
/// taken after may or may not be seen by a load already placing; nothing else may
/// differ.
#[test]
fn a_window_a_store_overlapped_before_its_answer_is_dropped() {
    model(|| {
        let a = one_window_posted();
        let io = {
            let a = a.clone();
            thread::spawn(move || {
                a.overlaps(2 * W + 4096, 4096);
                a.arrive(0, 0);
            })
        };
        assert!(
            a.take(2 * W, 4096).is_none(),
            "a stale window was placed from"
        );
        io.join().unwrap();
        assert_eq!(
            a.counts.stale.load(loom::sync::atomic::Ordering::Relaxed),
            1
        );
    });
}

/// A window freed by the load that placed its end is reused by another stream's load
/// only after that placing is over: the I/O thread's receive into the reused buffer
/// never overlaps the first load's read of it.
#[test]
fn a_window_is_reused_only_after_the_load_placing_from_it_gave_it_back() {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(2);
    b.max_branches = 100_000;
    b.check(|| {
        let a = one_window_posted();
        // The other three windows are held by streams of their own, so that the second
        // stream below can only have window 0, once it is free.
        for s in 0..3u64 {
            let base = (4 + 3 * s) * W;
            a.after_load(base, W as usize, None, |_, _| true, |_, _, _, _| false);
            a.after_load(base + W, W as usize, None, |_, _| true, |_, _, _, _| true);
        }
        let buf = Arc::new(Buffer(UnsafeCell::new(0)));
        buf.0.with_mut(|p| unsafe { *p = 1 });
        a.arrive(0, 0);
        // Which window a post claimed, for the I/O thread (main, after the join).
        let claimed = Arc::new(loom::sync::atomic::AtomicUsize::new(usize::MAX));
        let first = {
            let (a, buf) = (a.clone(), buf.clone());
            thread::spawn(move || {
                if let Some(t) = a.take(2 * W, W as usize) {
                    assert_eq!(buf.0.with(|p| unsafe { *p }), 1);
                    a.give_back(t, true, W as usize);
                }
            })
        };
        let second = {
            let (a, claimed) = (a.clone(), claimed.clone());
            thread::spawn(move || {
                // A stream at 14 W: its next cell is free, and it wants a window.
                a.after_load(13 * W, W as usize, None, |_, _| true, |_, _, _, _| false);
                a.after_load(
                    14 * W,
                    W as usize,
                    None,
                    |_, _| true,
                    |_, _, _, i| {
                        claimed.store(i, loom::sync::atomic::Ordering::Release);
                        true
                    },
                );
            })
        };
        second.join().unwrap();
        let i = claimed.load(loom::sync::atomic::Ordering::Acquire);
        if i != usize::MAX {
            assert_eq!(i, 0, "only window 0 can be free");
            // The I/O thread receives the new window's pages into its buffer.
            buf.0.with_mut(|p| unsafe { *p = 2 });
            a.arrive(0, 0);
        }
        first.join().unwrap();
    });
}

/// The program clock's slots (`src/paging/progclock.rs`): a thread that claims its own
/// slot as it begins, while the sampler's listing claims one for it too, ends in at most
/// one (both claim, then look for the other: sequentially consistent, so at least one
/// sees it), and in one whenever either claim says it succeeded. Without the look (a
/// mutation) the model finds the thread published twice.
#[test]
fn progclock_a_thread_claimed_by_itself_and_the_sampler_at_once_holds_one_slot() {
    model(|| {
        let c = Arc::new(progclock::ProgramClock::new());
        // A third thread's slot is taken first: the two claims race for the two left.
        assert!(c.claim(9, 0, 1));
        let itself = {
            let c = c.clone();
            thread::spawn(move || c.claim(7, 0, 10))
        };
        let sampler = c.claim(7, 0, 20);
        let itself = itself.join().unwrap();
        assert!(!(sampler && itself), "thread 7 published twice");
        assert_eq!(c.slots_of(7), (sampler || itself) as usize);
        assert_eq!(c.slots_of(9), 1);
    });
}

/// A reader's sum while the sampler retires an ended thread and a new thread claims a
/// slot (perhaps the one just freed) counts the ended thread once, in its slot or as
/// retired, and never goes back. The thread ids are not this process's, so their clocks
/// cannot be read and the last readings stand: 100 ns for the ended one, 50 for the new.
/// With the epoch left unchanged by `change` (a mutation) the model finds a sum of 200.
#[test]
fn progclock_a_sum_during_a_hand_over_counts_each_thread_once() {
    model(|| {
        let c = Arc::new(progclock::ProgramClock::new());
        assert!(c.claim(5, 0, 100));
        let sampler = {
            let c = c.clone();
            thread::spawn(move || c.change(|| c.retire(&[0])))
        };
        let beginner = {
            let c = c.clone();
            thread::spawn(move || assert!(c.claim(9, 0, 50)))
        };
        let (a, b) = (c.now(), c.now());
        assert!(a <= b, "the clock went back: {a} then {b}");
        assert!(b <= 150, "a thread counted twice: {b}");
        sampler.join().unwrap();
        beginner.join().unwrap();
        assert_eq!(c.now(), 150);
    });
}
