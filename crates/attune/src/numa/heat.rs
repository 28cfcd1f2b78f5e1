//! Write heat and hot-page promotion on NUMA tiers (mechanism; the plan is
//! `attune_policy::promote::plan`).
//!
//! Every `heat_interval_ms` the scanner thread, for each write-tracked region:
//! 1. reads which of the cells it armed last round were written (`attune_sys::pagemap`:
//!    asynchronous write-protection read back with PAGEMAP_SCAN, or soft-dirty bits
//!    before 6.7) and ages their history;
//! 2. moves what `promote::plan` says: cold unprotected fast cells down while the fast
//!    tier is short of its headroom (background demotion), then hot cells of lower tiers to
//!    the fast tier while it has room above the headroom, a cold unprotected fast cell down
//!    for each when it has none, within the migration rate limit (`move_limit`, the node
//!    daemon's if lower) times the interval. Moves go through the same `move_range` as
//!    explicit moves (policy first, then `move_pages` in batches, checked) and the
//!    allocation map is re-cut;
//! 3. arms the cells `promote::choose_arm` picks, at most [`ARM_BYTES_PER_S`] times the
//!    interval: what the application pays for the tracking is bounded by that.
//!
//! Why writes: on NUMA tiers pages stay mapped, so no fault tells the runtime about an
//! access, and the accessed bits are not readable from user space without idle-page
//! tracking (not in the guest kernel, and shared with DAMON on this machine). Dirty
//! tracking through userfaultfd is available to any process on Linux 6.7+, soft-dirty bits
//! before that (re-armed for the whole process each round: dearer). Read-only hot
//! data is not seen; the kernel's NUMA balancing (where enabled) still promotes it, and
//! LAT flags place it in the fast tier in the first place.

use super::{NumaPlacer, HEAT_CELL};
use crate::paging::Pager;
use attune_policy::promote::{self, Cell, Limits};
use attune_policy::Flags;
use std::sync::atomic::Ordering::Relaxed;

/// Most bytes one round moves, whatever the rate limit: the moves happen under the
/// placer's lock, which allocations and frees of NUMA regions wait for (16 MiB is about
/// 10 ms of migration on DDR; with 200 ms rounds, 80 MB/s at most).
const ROUND_MAX: u64 = 16 << 20;
/// Memory armed per second. The first write to an armed page costs the application an
/// in-kernel fault (0.9 µs on this machine), so this bounds the tracking's cost at 65,536
/// faults a second, 6% of one CPU, and only if every armed page is written; the kernel's
/// NUMA balancing bounds its hinting faults the same way (256 MB per scan period).
pub const ARM_BYTES_PER_S: u64 = 256 << 20;

/// The scanner thread: one round per interval, for the life of the process.
pub(crate) fn heat_loop(n: &NumaPlacer, pager: &Pager) {
    let interval = std::time::Duration::from_millis(pager.cfg.heat_interval_ms);
    let arm_cells = (ARM_BYTES_PER_S as u128 * interval.as_nanos()
        / 1_000_000_000
        / HEAT_CELL as u128) as usize;
    // Bytes this process may still move: the rate limit's share of each interval, saved
    // up (to one round's most) so that a limit below one cell per round still moves.
    let mut credit = 0u64;
    loop {
        std::thread::sleep(interval);
        let rate = pager.move_limit();
        credit = if rate == 0 {
            ROUND_MAX
        } else {
            let share = (rate as u128 * interval.as_nanos() / 1_000_000_000) as u64;
            credit.saturating_add(share).min(ROUND_MAX)
        };
        // Inside the fork gate, as the evictor and the sampler: a fork while this thread
        // held the placer's lock would leave the child's copy locked for ever (its NUMA
        // allocations, frees and statistics would hang).
        let _in = pager.enter();
        credit -= n.heat_round(credit, arm_cells.max(1)).min(credit);
    }
}

/// Maximal runs of cells for which `pick` holds, as (first, end) cell indices.
fn runs(n: usize, pick: impl Fn(usize) -> bool) -> Vec<(usize, usize)> {
    let mut out: Vec<(usize, usize)> = Vec::new();
    for c in (0..n).filter(|&c| pick(c)) {
        match out.last_mut() {
            Some(last) if last.1 == c => last.1 = c + 1,
            _ => out.push((c, c + 1)),
        }
    }
    out
}

impl NumaPlacer {
    /// One round: observe, move (at most `max_bytes`), arm (at most `arm_cells`).
    /// Returns the bytes moved (promoted, and demoted to make room).
    pub fn heat_round(&self, max_bytes: u64, arm_cells: usize) -> u64 {
        let Some(tracker) = &self.heat else {
            return 0;
        };
        let t0 = attune_sys::os::now_ns();
        tracker.begin_round();
        let mut guard = self.lock();
        let st = &mut *guard;
        let mut written = Vec::new();
        for r in st.regions.values_mut().filter(|r| r.tracked) {
            let cell_len = |c: usize| (HEAT_CELL as usize).min(r.len - c * HEAT_CELL as usize);
            let mut hit = vec![false; r.heat.len()];
            let mut failed = None;
            for (a, b) in runs(r.heat.len(), |c| r.heat[c].armed) {
                written.clear();
                let start = a * HEAT_CELL as usize;
                let len = (b - a - 1) * HEAT_CELL as usize + cell_len(b - 1);
                if let Err(e) = tracker.written(r.base + start, len, &mut written) {
                    failed = Some(e);
                    break;
                }
                for &(p, l) in &written {
                    let first = (p - r.base) / HEAT_CELL as usize;
                    let last = (p + l - 1 - r.base) / HEAT_CELL as usize;
                    for h in &mut hit[first..=last] {
                        *h = true;
                    }
                }
            }
            if let Some(e) = failed {
                // EPERM in a forked child (the registration stayed with the parent).
                crate::info!("region at {:#x}: write heat stops ({e})", r.base);
                r.tracked = false;
                continue;
            }
            for (h, w) in r.heat.iter_mut().zip(hit) {
                if h.armed {
                    h.history = promote::age(h.history, w);
                    h.seen = h.seen.saturating_add(1);
                    h.armed = false;
                }
            }
        }
        self.counters.heat_scans.fetch_add(1, Relaxed);

        // The policy's view: every cell of every tracked region, and where it may go.
        let mut cells = Vec::new();
        let mut at = Vec::new();
        for r in st.regions.values().filter(|r| r.tracked) {
            let flags = attune_policy::place::effective_flags(Flags(r.flags), !self.temperature);
            let protected = flags.is_protected();
            let capacity = attune_policy::victim::capacity_first(flags, !self.temperature);
            let cut = r.ranges.len() > crate::numa::MAX_RANGES;
            for (i, (tier, movable)) in r.cell_places().into_iter().enumerate() {
                cells.push(Cell {
                    history: r.heat[i].history,
                    seen: r.heat[i].seen,
                    tier,
                    protected,
                    movable: movable && !cut,
                    recency: r.seq,
                    capacity,
                });
                at.push((r.base, i));
            }
        }
        let used = st.used(self.tiers.len(), None);
        let fast = self.tiers[0].capacity;
        let plan = promote::plan(
            &cells,
            Limits {
                room: fast.saturating_sub(used[0]).saturating_sub(self.headroom),
                short: (used[0] + self.headroom).saturating_sub(fast),
                room_below: self.tiers[1].capacity.saturating_sub(used[1]),
                max_bytes,
                cell: HEAT_CELL,
            },
        );
        let t_moves = attune_sys::os::now_ns();
        let (mut promoted, mut demoted, mut restored) = (0, 0, 0);
        // Fast cells go to tier 1 (the next lower tier, Algorithm 2), far cells to tier 0.
        let moves: Vec<(usize, usize, bool)> = plan
            .restore
            .iter()
            .map(|&i| (i, 1, true))
            .chain(plan.demote.iter().map(|&i| (i, 1, false)))
            .chain(plan.promote.iter().map(|&i| (i, 0, false)))
            .collect();
        for (i, to, for_headroom) in moves {
            let (base, c) = at[i];
            let r = st.regions.get_mut(&base).expect("scanned under the lock");
            let start = c as u64 * HEAT_CELL;
            let len = HEAT_CELL.min(r.len as u64 - start);
            if self
                .move_range(base + start as usize, len as usize, to)
                .is_err()
            {
                continue;
            }
            r.retarget(start, start + len, to, self.tiers.len());
            cells[i].tier = to;
            match (to, for_headroom) {
                (0, _) => promoted += len,
                (_, true) => restored += len,
                _ => demoted += len,
            }
        }
        let t_arm = attune_sys::os::now_ns();

        let (arm, next) = promote::choose_arm(&cells, arm_cells, plan.starved, st.heat_cursor);
        st.heat_cursor = next;
        let mut by_region: std::collections::BTreeMap<usize, Vec<usize>> = Default::default();
        for i in arm {
            by_region.entry(at[i].0).or_default().push(at[i].1);
        }
        for (base, mut list) in by_region {
            let r = st.regions.get_mut(&base).expect("scanned under the lock");
            list.sort_unstable();
            let mut mark = vec![false; r.heat.len()];
            for c in list {
                mark[c] = true;
            }
            for (a, b) in runs(mark.len(), |c| mark[c]) {
                let start = a * HEAT_CELL as usize;
                let end = (b * HEAT_CELL as usize).min(r.len);
                if tracker.arm(base + start, end - start).is_ok() {
                    for h in &mut r.heat[a..b] {
                        h.armed = true;
                    }
                }
            }
        }
        drop(guard);
        let t_end = attune_sys::os::now_ns();
        self.counters.promoted_bytes.fetch_add(promoted, Relaxed);
        self.counters.demoted_cold_bytes.fetch_add(demoted, Relaxed);
        self.counters
            .demoted_headroom_bytes
            .fetch_add(restored, Relaxed);
        self.counters
            .heat_scan_ns
            .fetch_add((t_moves - t0) + (t_end - t_arm), Relaxed);
        promoted + demoted + restored
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn runs_join_neighbours() {
        let v = [true, true, false, true, false, false, true];
        assert_eq!(super::runs(v.len(), |c| v[c]), vec![(0, 2), (3, 4), (6, 7)]);
        assert_eq!(super::runs(0, |_| true), vec![]);
    }
}
