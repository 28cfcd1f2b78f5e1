//! Every limit derived from the DRAM budget, in one place: the mechanism asks for a limit
//! with the figures it holds (the budget in force, what is resident or pinned) and applies
//! the answer. The budget in force is the configured `dram` or the node daemon's grant.

/// The free DRAM the background evictor keeps, as (high, low) watermarks: it evicts
/// above `high` down to `low`. The headroom was configured against the configured `dram`
/// and scales with the budget in force.
pub fn watermarks(budget: u64, headroom: u64, dram: u64) -> (u64, u64) {
    let headroom = (headroom as u128 * budget as u128 / dram.max(1) as u128) as u64;
    (
        budget.saturating_sub(headroom / 2),
        budget.saturating_sub(headroom),
    )
}

/// What a thread placing chunks must evict first: resident memory over the budget.
pub fn overrun(resident: u64, budget: u64) -> u64 {
    resident.saturating_sub(budget)
}

/// Above this resident level a fault wakes the evictor. A thread that resolves its own
/// fault (signal delivery) evicts for itself and wakes it only past the budget: the
/// evictor's moves on the other CPU would interrupt its own. A handler thread serves many
/// faulting threads and gains from the evictor keeping the headroom (the high watermark).
/// Measured: docs/benchmarks-history.md, "Why eviction stays one move per run".
pub fn wake_evictor_above(budget: u64, high: u64, resolves_inline: bool) -> u64 {
    if resolves_inline {
        budget
    } else {
        high
    }
}

/// What the evictor brings resident memory down to when it wakes: the headroom when a
/// fault asked for it, only an overrun on a timed wake-up.
pub fn evictor_keep_below(budget: u64, high: u64, asked: bool) -> u64 {
    if asked {
        high
    } else {
        budget
    }
}

/// Room the runtime's own pins (LAT/SHL `pin_fraction`, online prediction's hot parts)
/// may still take: half the budget less what is pinned. Pins that fill the budget leave
/// nothing to page through, and every fault thrashes.
pub fn policy_pin_room(budget: u64, pinned: u64) -> u64 {
    (budget / 2).saturating_sub(pinned)
}

/// Whether the program's own pin of `len` more bytes fits: explicit pins are refused only
/// beyond the whole budget.
pub fn explicit_pin_fits(budget: u64, pinned: u64, len: u64) -> bool {
    pinned.saturating_add(len) <= budget
}

/// Bytes a pre-fault may bring in: what the budget leaves above resident memory.
pub fn prefault_room(budget: u64, resident: u64) -> u64 {
    budget.saturating_sub(resident)
}

/// Most managed bytes one system call holds resident (interposer, user-mode-only
/// userfaultfd or signal delivery): a quarter of the budget, at least 64 KiB, so held I/O
/// buffers never starve the program's other pages.
pub fn hold_limit(budget: u64) -> u64 {
    (budget / 4).max(64 << 10)
}

/// Bytes of freed regions the interposer keeps mapped for reuse: an eighth of the
/// budget, at most 64 MiB.
pub fn reuse_cache(budget: u64) -> u64 {
    (budget / 8).min(64 << 20)
}

/// DRAM a process asks the node daemon for: its managed footprint (dedicated regions,
/// or what is resident if more: the small-object arenas) plus the evictor's headroom (at
/// least 4 MiB), within the configured `dram`. Asking for `dram` itself would let an idle
/// or small process hold DRAM its neighbours thrash for.
pub fn daemon_want(committed: u64, resident: u64, headroom: u64, dram: u64) -> u64 {
    committed
        .max(resident)
        .saturating_add(headroom.max(4 << 20))
        .min(dram)
}

pub use crate::victim::active_target;

#[cfg(test)]
mod tests {
    use super::*;

    const M: u64 = 1 << 20;

    #[test]
    fn watermarks_scale_the_headroom_with_the_budget_in_force() {
        // (budget, headroom, dram) -> (high, low)
        for (b, h, d, want) in [
            (100 * M, 4 * M, 100 * M, (98 * M, 96 * M)),
            (50 * M, 4 * M, 100 * M, (49 * M, 48 * M)), // a grant of half: half the headroom
            (100 * M, 0, 100 * M, (100 * M, 100 * M)),
            (M, 4 * M, 100 * M, (M - 20971, M - 41943)),
            (100 * M, 4 * M, 0, (0, 0)), // no dram: saturates, never wraps
        ] {
            assert_eq!(watermarks(b, h, d), want, "{b} {h} {d}");
        }
    }

    #[test]
    fn the_evictor_is_woken_and_stops_by_who_asks() {
        assert_eq!(wake_evictor_above(100, 90, true), 100);
        assert_eq!(wake_evictor_above(100, 90, false), 90);
        assert_eq!(evictor_keep_below(100, 90, true), 90);
        assert_eq!(evictor_keep_below(100, 90, false), 100);
        assert_eq!((overrun(120, 100), overrun(80, 100)), (20, 0));
    }

    #[test]
    fn pins_policy_half_explicit_whole() {
        assert_eq!(policy_pin_room(100 * M, 0), 50 * M);
        assert_eq!(policy_pin_room(100 * M, 60 * M), 0);
        assert!(explicit_pin_fits(100 * M, 60 * M, 40 * M));
        assert!(!explicit_pin_fits(100 * M, 60 * M, 40 * M + 1));
        assert!(!explicit_pin_fits(100 * M, u64::MAX, 1), "no wrap");
        assert_eq!(prefault_room(100 * M, 30 * M), 70 * M);
        assert_eq!(prefault_room(100 * M, 130 * M), 0);
    }

    #[test]
    fn held_io_and_the_reuse_cache_are_shares_of_the_budget() {
        assert_eq!(hold_limit(64 * M), 16 * M);
        assert_eq!(hold_limit(M / 8), 64 << 10, "at least 64 KiB");
        assert_eq!(reuse_cache(64 * M), 8 * M);
        assert_eq!(reuse_cache(4096 * M), 64 * M, "at most 64 MiB");
    }

    #[test]
    fn the_daemon_is_asked_for_the_footprint_plus_headroom_within_dram() {
        assert_eq!(daemon_want(100 * M, 10 * M, 2 * M, 1024 * M), 104 * M);
        assert_eq!(daemon_want(10 * M, 30 * M, 8 * M, 1024 * M), 38 * M);
        assert_eq!(daemon_want(2000 * M, 0, 8 * M, 1024 * M), 1024 * M);
        assert_eq!(daemon_want(0, 0, 0, 1024 * M), 4 * M);
    }
}
