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

/// How long a fault that found no far tier with room waits for the node daemon to grow
/// one (`waits_for_room`) before it places its chunk over the budget. A report leaves
/// within the runtime's 20 ms watch; the daemon allocates a segment's growth and the
/// runtime maps it before either uses it (about 0.4 s a GiB here: a wait for 420 MiB
/// took 220 ms). A second past that, no room is coming.
pub const ROOM_WAIT_NS: u64 = 1_000_000_000;

/// Whether a fault that found every far tier without room waits for room rather than
/// placing its chunk over the DRAM budget. It waits when a tier the node daemon sizes is
/// below its configured capacity (`growable`: the daemon is connected and the tier's
/// grant is under its capacity), so the daemon's next grant can make room; and not again
/// at the grant a wait gave up at (`gave_up_at`: the tiers' granted bytes then), so a
/// pool with no room left costs one wait per grant, not one per fault. Placing over the
/// budget is what runs a job into its memory cgroup's limit: a program filling 512 MiB
/// in a 128 MiB group was killed 70 ms after start while its 4 MiB far grant waited for
/// the daemon's first answer (tests/python/test_pool.py,
/// `test_a_fast_fill_waits_for_its_segment_to_grow`).
pub fn waits_for_room(growable: bool, granted: u64, gave_up_at: Option<u64>) -> bool {
    growable && gave_up_at.is_none_or(|g| granted > g)
}

/// How far ahead a process's far want reaches: what its far pages grow by over this
/// span at their recent rate. A report and the daemon's grant go round in 20-60 ms.
pub const FAR_AHEAD_NS: u64 = 250_000_000;

/// Far memory a process asks the node daemon for: what does not fit its DRAM budget
/// (`outside`), or what its far tiers hold if more (`used`; the small-object arenas are
/// not in `outside`), plus what its far pages grow by in `FAR_AHEAD_NS` at their recent
/// `rate` (bytes/s, `cgroup_rate` of `used`), at most half of `used` (a fill of a few
/// MiB at 2 GB/s asked for 500 MiB, which the daemon allocated), at least 4 MiB; within
/// the tiers' capacity `cap`. With 4 MiB ahead alone, a Python program filling 870 MiB of lists
/// under `--small` grew its grant 4 MiB a round trip: 364 faults waited for room, 2.1 s
/// of its 6.6 s (tests/python/test_pool.py, `test_a_fast_fill_waits_for_its_segment_to_grow`).
pub fn far_want(outside: u64, used: u64, rate: u64, cap: u64) -> u64 {
    if cap == 0 {
        return 0;
    }
    let ahead = (rate as u128 * FAR_AHEAD_NS as u128 / 1_000_000_000) as u64;
    let ahead = ahead.min(used / 2).max(4 << 20);
    outside.max(used).saturating_add(ahead).min(cap)
}

/// Room a budget that follows its memory cgroup keeps below the limit: what the program
/// may grow by before the runtime reads again and its evictor catches up, since the kernel
/// reclaims cache and then kills at the limit. A 32nd of the limit, 4 to 64 MiB; at least
/// what was held outside the runtime's pages grows by in 100 ms at its recent `rate`
/// (bytes/s; a Python interpreter filling a list grows by 700 MB/s), at most a quarter of
/// the limit.
pub fn cgroup_margin(limit: u64, rate: u64) -> u64 {
    (limit / 32)
        .clamp(4 << 20, 64 << 20)
        .max((rate / 10).min(limit / 4))
}

/// The shortest span (ns) over which the runtime measures growth (`cgroup_rate_over`), at
/// every reading of its group over the last 20 ms or more. Read 5 ms apart, what a group
/// holds outside the runtime's pages moves by 0.5-2 MiB either way with nothing growing
/// (the kernel's per-CPU charge batches, page tables, a file tier's pages between dirty
/// and clean), which read as 100-500 MB/s and held the margin at a quarter of the limit:
/// `test_a_budget_above_the_limit_is_lowered_and_the_program_finishes` ended 13-20 MiB
/// under its cap. A process's resident set and its managed pages, read microseconds
/// apart, looked like GB/s over a millisecond the same way.
pub const OWN_RATE_WINDOW_NS: u64 = 20_000_000;

/// The recent growth rate of what a group holds outside the runtime's pages (bytes/s):
/// the rate since the last reading, or the previous one halved every 500 ms if higher, so
/// a program that grows in steps keeps its margin through the pauses between them.
pub fn cgroup_rate(prev_rate: u64, rise: u64, dt_ns: u64) -> u64 {
    cgroup_rate_over(prev_rate, rise, dt_ns, dt_ns)
}

/// [`cgroup_rate`] of a `rise` over `span_ns`, the previous rate decayed over the
/// `elapsed_ns` since it was taken: readings 5 ms apart each measure the last 20 ms
/// (`OWN_RATE_WINDOW_NS`), and the decay still halves the rate every 500 ms of time.
pub fn cgroup_rate_over(prev_rate: u64, rise: u64, span_ns: u64, elapsed_ns: u64) -> u64 {
    let span = span_ns.max(1_000_000) as f64 / 1e9;
    let now = rise as f64 / span;
    let kept = prev_rate as f64 * 0.5f64.powf(elapsed_ns as f64 / 1e9 / 0.5);
    now.max(kept) as u64
}

/// Bytes of this process's own pages the kernel may still count after the runtime stopped
/// counting them (a region just freed; the memory tier's slots waiting to be released):
/// what `outside` rose by, up to what `ours` fell by since the last reading. Counted as
/// the runtime's for one reading, a freed region does not cut the budget to nothing; real
/// growth shows again at the next reading, 5 ms later near the limit.
pub fn cgroup_lag(prev_outside: u64, outside: u64, prev_ours: u64, ours: u64) -> u64 {
    outside
        .saturating_sub(prev_outside)
        .min(prev_ours.saturating_sub(ours))
}

/// The levels at which a memory cgroup v1 wakes the runtime (`cgroup.event_control`
/// thresholds, crossed either way): 8, 4, 2, 1 and a half margin below the limit. The
/// low ones give warning early enough for the evictor to outrun fast growth: a program
/// growing by 700 MB/s from a reading at 115 MiB reached a 160 MiB limit before the
/// two-margin level woke the evictor (1 run in 15); from the 8-margin level it has 40 ms.
pub fn cgroup_thresholds(limit: u64) -> [u64; 5] {
    let m = cgroup_margin(limit, 0);
    [8 * m, 4 * m, 2 * m, m, m / 2].map(|d| limit.saturating_sub(d))
}

/// A memory cgroup as the runtime reads it, and what of it is the runtime's own.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CgroupReading {
    /// u64::MAX: no limit (lifted while the job runs).
    pub limit: u64,
    pub usage: u64,
    /// Page cache the kernel takes back before it kills (unmapped file pages).
    pub reclaimable: u64,
    /// This process's managed pages charged to the group: resident ones and those of its
    /// in-process far tiers (memory, NUMA).
    pub ours: u64,
    /// What the in-process far tiers may still grow to hold (their capacity): eviction into
    /// them does not relieve the group, so the budget leaves it room as if they were full.
    pub reserved: u64,
    /// How fast `outside` grew lately, bytes/s (`cgroup_rate`; 0 at the first reading).
    pub rate: u64,
    /// Resident managed pages of the other runtimes in the same group, as the node's
    /// daemon last told (0: none, or no daemon). Not outside: each of those runtimes
    /// follows the limit too, so an excess is divided among them (`cgroup_cap`).
    pub peers: u64,
    /// How many those runtimes are, as the daemon last told (0: none, no daemon, or one
    /// that does not say): the free room below the limit is divided by their number.
    pub peer_runtimes: u64,
}

impl CgroupReading {
    /// What the group holds that is neither managed pages (this process's and its peers')
    /// nor cache: the program's own heap, an interpreter, other processes of the job.
    pub fn outside(&self) -> u64 {
        self.usage
            .saturating_sub(self.reclaimable)
            .saturating_sub(self.ours)
            .saturating_sub(self.peers)
    }
}

/// The cap a memory cgroup's usage puts on the DRAM budget (u64::MAX: none), from the
/// cap in force (`now`, u64::MAX at first). The budget is what the limit leaves less the
/// margin, what is outside the runtime's pages, and the in-process tiers' room; moving a
/// page between DRAM and those tiers leaves it unchanged, so it does not feed on itself.
/// A lower cap applies at once (the kernel kills at the limit); a higher one rises by half
/// the gap per reading, so several runtimes in one group, each seeing the others' pages as
/// outside, settle instead of rising and falling together. Changes under a 16th of the
/// margin are noise in the kernel's per-CPU charge batches and are left alone.
///
/// Runtimes that know their peers' pages (`peers`, from the daemon) divide an excess over
/// the limit in proportion to what each holds, instead of each giving back all of it:
/// four runtimes in one job's group cut the group four times over before, and a LAT
/// workflow's budget fell to a quarter of its grant. Those that know their peers' number
/// (`peer_runtimes`) divide the free room below the limit by it, instead of each taking
/// all of it: six programs filling one group at once overshot its limit between two
/// readings and were killed (docs/design/paging.md, "Several runtimes in one group").
/// Their cap then rises to its share at once: shares of one reading add up to the free
/// room, so no halving is needed to settle, and a runtime alone in its growth takes the
/// room in a few readings while its idle peers leave theirs.
pub fn cgroup_cap(r: &CgroupReading, now: u64) -> u64 {
    if r.limit == u64::MAX {
        return u64::MAX;
    }
    let margin = cgroup_margin(r.limit, r.rate);
    let room = r.limit.saturating_sub(margin).saturating_sub(r.reserved);
    let held = r.outside() as u128 + r.ours as u128 + r.peers as u128;
    let target = if held > room as u128 {
        if r.peers > 0 {
            // The excess, this runtime's part of it by its share of the managed pages.
            let excess = held - room as u128;
            let managed = r.ours as u128 + r.peers as u128;
            let mine = (excess * r.ours as u128).div_ceil(managed);
            (r.ours as u128).saturating_sub(mine) as u64
        } else {
            room.saturating_sub(r.outside())
        }
    } else {
        // Below the limit (`held` counts `ours` whole, so `ours` + the free room is what
        // the limit leaves this runtime): its share of the free room.
        let free = room as u128 - held;
        (r.ours as u128 + free / (r.peer_runtimes as u128 + 1)) as u64
    };
    if now == u64::MAX {
        return target;
    }
    let step = cgroup_margin(r.limit, 0) / 16;
    if target + step < now {
        target
    } else if target > now + step {
        if r.peer_runtimes == 0 {
            now + (target - now) / 2
        } else {
            target
        }
    } else {
        now
    }
}

/// Whether what a memory cgroup holds (less reclaimable cache) is within two margins of
/// its limit: the runtime reads it every 5 ms then, and collapses no huge page (a collapse
/// allocates its 2 MiB page before it frees the small ones).
pub fn cgroup_near(r: &CgroupReading) -> bool {
    let held = r.usage.saturating_sub(r.reclaimable);
    r.limit != u64::MAX && held.saturating_add(2 * cgroup_margin(r.limit, r.rate)) >= r.limit
}

/// The growth the cgroup's reading interval is sized for (bytes/s): one thread writing
/// fresh 4 KiB pages, 1.9 µs a first-touch fault on this kind of machine
/// (../shared/notes/machine-limits.md). A Python interpreter filling a list grows by
/// 400-700 MB/s.
pub const CGROUP_FAST_GROWTH: u64 = 2 << 30;

/// How long the runtime may wait before it reads its memory cgroup again (ms): 5 near the
/// limit, 50 (the evictor's tick) far from it, and in between the time growth at
/// `CGROUP_FAST_GROWTH` takes to bring the group within two margins of its limit. The
/// group is counted as if this process's managed pages filled `budget` and its in-process
/// tiers (`reserved`): they may, without another reading. Fixed 50 ms below the two
/// margins let a Python heap grow by 35 MiB unread from 38 MiB below a 160 MiB limit, and
/// CI once saw the kernel kill it (docs/design/paging.md, "Budgets under a memory
/// cgroup"). A reading costs 33 µs here.
pub fn cgroup_check_ms(r: &CgroupReading, budget: u64) -> u32 {
    if r.limit == u64::MAX {
        return 50;
    }
    let held = r.usage.saturating_sub(r.reclaimable);
    let filled = held
        .saturating_sub(r.ours)
        .saturating_add(budget)
        .saturating_add(r.reserved)
        .max(held);
    let near = r.limit.saturating_sub(2 * cgroup_margin(r.limit, r.rate));
    let ms = near.saturating_sub(filled) as u128 * 1000 / CGROUP_FAST_GROWTH as u128;
    ms.clamp(5, 50) as u32
}

pub use crate::victim::active_target;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_far_want_reaches_ahead_by_the_growth_rate() {
        let m = 1u64 << 20;
        let g = 1u64 << 30;
        // (outside, used, rate, cap) -> want
        let table = [
            (0, 0, 0, 0, 0),                   // no daemon-sized tier
            (100 * m, 0, 0, g, 104 * m),       // the budget's overflow, 4 MiB ahead
            (0, 100 * m, 0, g, 104 * m),       // arenas: what the tiers hold
            (0, 100 * m, 400 * m, g, 150 * m), // 400 MB/s: 100 MiB, cut to half of 100
            (0, 400 * m, 400 * m, g, 500 * m), // 400 MB/s: 100 MiB ahead
            (0, 100 * m, 8 * m, g, 104 * m),   // slow growth: the 4 MiB floor
            (1022 * m, 0, 400 * m, g, g),      // within the capacity
        ];
        for (outside, used, rate, cap, want) in table {
            assert_eq!(
                far_want(outside, used, rate, cap),
                want,
                "{outside} {used} {rate}"
            );
        }
    }

    #[test]
    fn a_fault_waits_for_room_only_where_a_grant_can_bring_it() {
        let m = 1u64 << 20;
        // (growable, granted, gave up at) -> waits
        let table = [
            (true, 4 * m, None, true),
            (false, 4 * m, None, false), // no daemon, or every tier at its capacity
            (true, 4 * m, Some(4 * m), false), // gave up at this grant already
            (true, 8 * m, Some(4 * m), true), // the grant grew since
            (true, 2 * m, Some(4 * m), false), // and shrank: no room coming
        ];
        for (growable, granted, gave_up, want) in table {
            assert_eq!(
                waits_for_room(growable, granted, gave_up),
                want,
                "{growable} {granted} {gave_up:?}"
            );
        }
    }

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

    #[test]
    fn the_cgroup_cap_leaves_the_limit_less_what_is_held_outside() {
        let r = |limit, usage, reclaimable, ours, reserved| CgroupReading {
            limit,
            usage,
            reclaimable,
            ours,
            reserved,
            rate: 0,
            peers: 0,
            peer_runtimes: 0,
        };
        // (reading, cap now) -> cap
        for (rd, now, want, why) in [
            // 85 MiB limit (margin 4), an interpreter of 59 MiB, 20 MiB ours: 22 MiB.
            (
                r(85 * M, 79 * M, 0, 20 * M, 0),
                u64::MAX,
                22 * M,
                "first reading",
            ),
            // Evicting our pages changes nothing: usage and ours fall together.
            (
                r(85 * M, 69 * M, 0, 10 * M, 0),
                22 * M,
                22 * M,
                "stable after eviction",
            ),
            // Reclaimable cache is not outside.
            (
                r(85 * M, 89 * M, 10 * M, 20 * M, 0),
                u64::MAX,
                22 * M,
                "cache",
            ),
            // The in-process memory tier's room is kept, whatever it holds now.
            (
                r(85 * M, 79 * M, 0, 20 * M, 16 * M),
                u64::MAX,
                6 * M,
                "memory tier",
            ),
            (
                r(85 * M, 95 * M, 0, 36 * M, 16 * M),
                6 * M,
                6 * M,
                "tier filled",
            ),
            // Outside shrinks: up by half the gap per reading.
            (
                r(85 * M, 40 * M, 0, 20 * M, 0),
                22 * M,
                41 * M + M / 2,
                "rising",
            ),
            // Noise under a 16th of the margin is left alone, both ways.
            (
                r(85 * M, 79 * M + (100 << 10), 0, 20 * M, 0),
                22 * M,
                22 * M,
                "noise down",
            ),
            (
                r(85 * M, 79 * M - (100 << 10), 0, 20 * M, 0),
                22 * M,
                22 * M,
                "noise up",
            ),
            // Outside alone over the limit: no budget at all (the pager keeps its floor).
            (r(85 * M, 120 * M, 0, 0, 0), 22 * M, 0, "over"),
            // A limit lifted: no cap.
            (
                r(u64::MAX, 79 * M, 0, 20 * M, 0),
                22 * M,
                u64::MAX,
                "lifted",
            ),
            // Ours above usage (charged elsewhere after a move of cgroup): outside 0.
            (
                r(85 * M, 10 * M, 0, 20 * M, 0),
                u64::MAX,
                81 * M,
                "ours elsewhere",
            ),
            // Outside rising fast: the margin is what 100 ms of growth adds (10 MiB here).
            (
                CgroupReading {
                    rate: 100 * M,
                    ..r(85 * M, 79 * M, 0, 20 * M, 0)
                },
                30 * M,
                16 * M,
                "rising fast",
            ),
        ] {
            assert_eq!(cgroup_cap(&rd, now), want, "{why}");
        }
    }

    /// Two runtimes of 150 MiB each and 20 MiB of other memory in a 200 MiB group, both
    /// reading before either evicts, each holding its cap after each reading (evicting down
    /// to it, or growing to it: both want all they can): what each holds, reading by reading. `know`: the daemon tells each the other's
    /// pages (`peers`).
    fn two_in_one_group(know: bool, rounds: usize) -> Vec<(u64, u64)> {
        let (limit, other) = (200 * M, 20 * M);
        let (mut a, mut b) = (150 * M, 150 * M);
        let (mut ca, mut cb) = (u64::MAX, u64::MAX);
        let mut held = Vec::new();
        for _ in 0..rounds {
            let ra = CgroupReading {
                limit,
                usage: a + b + other,
                reclaimable: 0,
                ours: a,
                reserved: 0,
                rate: 0,
                peers: if know { b } else { 0 },
                peer_runtimes: know as u64,
            };
            let rb = CgroupReading {
                ours: b,
                peers: if know { a } else { 0 },
                ..ra
            };
            (ca, cb) = (cgroup_cap(&ra, ca), cgroup_cap(&rb, cb));
            (a, b) = (ca, cb);
            held.push((a, b));
        }
        held
    }

    #[test]
    fn two_runtimes_in_one_group_settle_under_the_limit() {
        // Each sees the other's pages as outside.
        let (limit, other) = (200 * M, 20 * M);
        let (a, b) = *two_in_one_group(false, 40).last().unwrap();
        let held = a + b + other;
        assert!(held <= limit - cgroup_margin(limit, 0), "{held}");
        assert!(
            held + 2 * cgroup_margin(limit, 0) >= limit,
            "settles near the limit: {held}"
        );
    }

    #[test]
    fn runtimes_that_know_their_peers_give_an_excess_back_once() {
        let r = |usage, ours, peers| CgroupReading {
            limit: 1000 * M,
            usage,
            reclaimable: 0,
            ours,
            reserved: 0,
            rate: 0,
            peers,
            peer_runtimes: (peers > 0) as u64,
        };
        let room = 1000 * M - cgroup_margin(1000 * M, 0);
        // Four runtimes hold 1000 MiB, 100 MiB is the programs' own: 100 MiB plus the
        // margin over. This one (300 of the 1000) gives back 30% of the excess, not all.
        let excess = 1100 * M - room;
        let cap = cgroup_cap(&r(1100 * M, 300 * M, 700 * M), u64::MAX);
        assert_eq!(cap, 300 * M - (excess * 3).div_ceil(10));
        // Unknown peers: the excess is all this runtime's (the rule before the daemon told).
        assert_eq!(
            cgroup_cap(&r(1100 * M, 300 * M, 0), u64::MAX),
            300 * M - excess
        );
        // Below the limit the free room is divided by the runtimes' number: two here.
        assert_eq!(
            cgroup_cap(&r(800 * M, 300 * M, 400 * M), u64::MAX),
            300 * M + (room - 800 * M) / 2
        );
        // A daemon that does not tell the number: this runtime may take all of it.
        let untold = CgroupReading {
            peer_runtimes: 0,
            ..r(800 * M, 300 * M, 400 * M)
        };
        assert_eq!(cgroup_cap(&untold, u64::MAX), room - 500 * M);
        // Peers over-reported (they evicted since the daemon heard): outside reads 0 and
        // the excess is counted from the larger figure, never from less than the usage.
        assert!(cgroup_cap(&r(900 * M, 300 * M, 700 * M), u64::MAX) <= room - 600 * M);
        // The programs' own memory alone over the limit: nothing left for anyone.
        assert_eq!(cgroup_cap(&r(1400 * M, 100 * M, 100 * M), u64::MAX), 0);
    }

    #[test]
    fn two_runtimes_that_know_each_other_settle_in_one_reading() {
        let (limit, other) = (200 * M, 20 * M);
        for (round, (a, b)) in two_in_one_group(true, 10).into_iter().enumerate() {
            // From the first reading on: under the limit, within rounding of it, and
            // shared evenly (each gave back half the excess, not all of it).
            let held = a + b + other;
            assert!(held <= limit - cgroup_margin(limit, 0), "{round}: {held}");
            assert!(
                held + 4096 >= limit - cgroup_margin(limit, 0),
                "{round}: {held}"
            );
            assert!(a.abs_diff(b) <= 4096, "{round}: {a} {b}");
        }
    }

    /// `n` runtimes in a 256 MiB group, each with 4 MiB of its program's own and the
    /// grants of `wants` (MiB), all reading the group at once and then growing to their
    /// caps (or to their wants) before the next reading: the group's peak, and what each
    /// holds after `rounds`. `told`: the daemon tells each the others' number.
    fn fill_together(wants: &[u64], told: bool, rounds: usize) -> (u64, Vec<u64>) {
        let (limit, own) = (256 * M, 4 * M);
        let n = wants.len() as u64;
        let mut held = vec![0u64; wants.len()];
        let mut caps = vec![u64::MAX; wants.len()];
        let mut peak = 0;
        for _ in 0..rounds {
            let usage = held.iter().sum::<u64>() + n * own;
            for (i, cap) in caps.iter_mut().enumerate() {
                let rd = CgroupReading {
                    limit,
                    usage,
                    reclaimable: 0,
                    ours: held[i],
                    reserved: 0,
                    rate: 0,
                    peers: usage - n * own - held[i],
                    peer_runtimes: if told { n - 1 } else { 0 },
                };
                *cap = cgroup_cap(&rd, *cap);
            }
            for (i, h) in held.iter_mut().enumerate() {
                *h = caps[i].min(wants[i] * M);
            }
            peak = peak.max(held.iter().sum::<u64>() + n * own);
        }
        (peak, held)
    }

    #[test]
    fn runtimes_filling_one_group_at_once_divide_its_free_room() {
        let limit = 256 * M;
        let room = limit - cgroup_margin(limit, 0);
        // Six programs of 80 MiB (grants of 85 MiB each: 510 MiB in all) start together.
        // Each taking all the free room, the group is over its limit at the first reading
        // (the kernel kills); sharing it, never over the room, and the room is used.
        let (peak, _) = fill_together(&[80; 6], false, 1);
        assert!(peak > limit, "untold: {peak}");
        let (peak, held) = fill_together(&[80; 6], true, 20);
        assert!(peak <= room, "told: {peak}");
        assert!(peak + 6 * 4096 >= room - 6 * M, "told, room used: {peak}");
        assert!(
            held.iter().all(|&h| h.abs_diff(held[0]) <= 4096),
            "{held:?}"
        );
    }

    #[test]
    fn a_runtime_growing_alone_takes_the_room_its_idle_peers_leave() {
        // One program of 300 MiB beside five idle ones of 4 MiB: within a few readings it
        // holds nearly all the room they leave (a margin's 16th is noise).
        let limit = 256 * M;
        let room = limit - cgroup_margin(limit, 0);
        let (_, held) = fill_together(&[300, 4, 4, 4, 4, 4], true, 40);
        let left = room - held.iter().sum::<u64>() - 6 * 4 * M;
        assert!(
            left <= cgroup_margin(limit, 0) / 16 * 6,
            "{} MiB left: {held:?}",
            left >> 20
        );
        let (_, in_10) = fill_together(&[300, 4, 4, 4, 4, 4], true, 10);
        assert!(in_10[0] > held[0] * 3 / 4, "{in_10:?}");
    }

    #[test]
    fn the_cgroup_is_read_more_often_near_its_limit() {
        let r = |usage| CgroupReading {
            limit: 128 * M,
            usage,
            reclaimable: 0,
            ours: 0,
            reserved: 0,
            rate: 0,
            peers: 0,
            peer_runtimes: 0,
        };
        // 5 ms within two margins (8 MiB) of the limit, 50 ms when growth at 2 GiB/s
        // takes that long to get there, in between the time it takes.
        let at = |usage, budget| cgroup_check_ms(&r(usage), budget);
        assert_eq!(at(120 * M, 0), 5);
        assert_eq!(at(64 * M, 0), 27); // 56 MiB at 2 GiB/s
        assert_eq!(at(20 * M, 0), 48);
        let big = CgroupReading {
            limit: 8 << 30,
            ..r(64 * M)
        };
        assert_eq!(cgroup_check_ms(&big, 0), 50);
        let none = CgroupReading {
            limit: u64::MAX,
            ..r(64 * M)
        };
        assert_eq!(cgroup_check_ms(&none, 0), 50);
        // The budget this process may still fill counts as held: 64 MiB of outside
        // memory beside a budget of 48 MiB leaves 8 MiB to the two margins.
        assert_eq!(at(64 * M, 48 * M), 5);
        assert_eq!(at(64 * M, 24 * M), 15);
        // Managed pages already resident are not counted twice.
        let ours = CgroupReading {
            ours: 24 * M,
            ..r(64 * M)
        };
        assert_eq!(cgroup_check_ms(&ours, 24 * M), 27);
        assert_eq!(cgroup_margin(128 * M, 0), 4 * M);
        assert_eq!(cgroup_margin(8 << 30, 0), 64 * M);
        // Fast growth widens the margin, to a quarter of the limit at most.
        assert_eq!(cgroup_margin(128 * M, 200 * M), 20 * M);
        assert_eq!(cgroup_margin(128 * M, 1000 * M), 32 * M);
        assert_eq!(
            cgroup_thresholds(128 * M),
            [96 * M, 112 * M, 120 * M, 124 * M, 126 * M]
        );
    }

    #[test]
    fn growth_is_measured_over_the_window_and_decays_by_time() {
        // 2 MiB over the last 20 ms is 100 MiB/s, whether the last reading was 5 ms ago.
        assert_eq!(cgroup_rate_over(0, 2 * M, 20_000_000, 5_000_000), 100 * M);
        // A rate kept decays by the time since it was taken, not by the window: readings
        // 5 ms apart keep nearly all of it.
        let kept = cgroup_rate_over(500 * M, 0, 20_000_000, 5_000_000);
        assert!(kept > 495 * M && kept < 500 * M, "{kept}");
        // The same rise read over 5 ms alone: four times the rate (the noise it removes).
        assert_eq!(cgroup_rate(0, 2 * M, 5_000_000), 400 * M);
    }

    #[test]
    fn growth_in_steps_keeps_its_rate_through_the_pauses() {
        // 7 MiB in 20 ms: 350 MiB/s.
        let r = cgroup_rate(0, 7 * M, 20_000_000);
        assert_eq!(r, 350 * M);
        // A pause of 50 ms with no growth keeps most of it (halved every 500 ms).
        let kept = cgroup_rate(r, 0, 50_000_000);
        assert!(kept > 320 * M && kept < r, "{kept}");
        // Two seconds later it has gone.
        assert!(cgroup_rate(r, 0, 2_000_000_000) < 25 * M);
        // Faster growth wins at once; a zero interval is read as a millisecond.
        assert_eq!(cgroup_rate(10 * M, 1 * M, 0), 1000 * M);
    }

    #[test]
    fn a_freed_region_still_charged_is_not_growth_outside() {
        // (prev outside, outside, prev ours, ours) -> lag
        for (po, o, pu, u, want) in [
            (70 * M, 118 * M, 76 * M, 8 * M, 48 * M), // freed 68, kernel still counts 48
            (70 * M, 80 * M, 76 * M, 76 * M, 0),      // real growth: ours did not fall
            (70 * M, 80 * M, 76 * M, 72 * M, 4 * M),  // both: 4 of the 10 may be ours
            (70 * M, 60 * M, 76 * M, 8 * M, 0),       // outside fell
        ] {
            assert_eq!(cgroup_lag(po, o, pu, u), want);
        }
    }
}
