//! Replacement decisions: a CLOCK over chunks with two classes (IMME Algorithm 2's filter
//! on top), and the class and credit a chunk earns when it is placed.
//!
//! The runtime sees a chunk's accesses only when it faults, so a plain CLOCK (one
//! reference bit set on fault) degenerates into FIFO between faults: hot chunks are
//! evicted as readily as dead ones, and refault right away. What a fault does tell is the
//! **refault distance** (the kernel's workingset detection, in bytes evicted instead of
//! LRU positions): a chunk that comes back from a far tier before the budget's worth of
//! other bytes was evicted was evicted while still in use. Such chunks become **active**
//! (LIRS's and CLOCK-Pro's hot set) while the active class has room (`active_target`);
//! everything else is **inactive** and is evicted in clock order after a lap of grace.
//!
//! The active set is **stable**: the hand leaves it alone (it cannot see whether an active
//! chunk is still used, so demoting in clock order would only rotate it). This is what
//! makes a loop over more than the budget hit on the active part instead of missing on
//! everything (LRU's and FIFO's failure). It changes in two ways: a budget shrink puts the
//! class over its target and the hand demotes; and a chunk that refaulted close but found
//! no room (**denied**) asks the evictor to **test** an active chunk: move it back to the
//! inactive class; if it is still hot it refaults close after the hand evicts it and takes
//! the room back, if it was stale it is evicted and stays out.
//! Tests are paced (`ACTIVE_TESTS_PER_S`), so a phase change replaces an old hot set at a
//! bounded rate, and a loop rotates its active part no faster than that.

/// Active chunks tested at most this many times a second (only while activations are
/// denied): a hot chunk costs at most one eviction and one refault per test.
pub const ACTIVE_TESTS_PER_S: u64 = 200;

/// Most credit (laps of grace) an inactive chunk can hold: one bit in the state word.
/// Every arrival gets one lap; the fault path sees nothing that would earn more.
pub const MAX_CREDIT: u8 = 1;

/// What the clock hand sees of one chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkView {
    pub resident: bool,
    pub pinned: bool,
    /// Refaulted close: in the working set.
    pub active: bool,
    /// Laps an inactive chunk may still survive.
    pub credit: u8,
    /// The chunk's region is LAT or SHL.
    pub protected_region: bool,
}

/// What the hand does with a chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClockAction {
    /// Not a candidate now (absent, pinned, protected outside a last-resort pass, or
    /// active while the active class is within its target).
    Skip,
    /// Inactive with credit: take one.
    Age,
    /// Active while the active class is over its target: back to inactive, one lap of grace.
    Demote,
    /// Evict now.
    Evict,
}

/// The CLOCK rule with Algorithm 2's filter: pinned chunks are never victims; pageable
/// chunks of LAT/SHL regions are taken only in `last_resort` passes (after every other
/// region was swept without freeing enough); active chunks only while the active class
/// holds more than its target (or in a last-resort pass).
pub fn clock_decide(c: ChunkView, last_resort: bool, active_over_target: bool) -> ClockAction {
    if !c.resident || c.pinned {
        return ClockAction::Skip;
    }
    if c.protected_region && !last_resort {
        return ClockAction::Skip;
    }
    if c.active {
        return if active_over_target || last_resort {
            ClockAction::Demote
        } else {
            ClockAction::Skip
        };
    }
    if c.credit > 0 {
        ClockAction::Age
    } else {
        ClockAction::Evict
    }
}

/// Whether a region's chunks give way first (a clock pass over such regions before the
/// ordinary one): CAP says the data belongs in the capacity tier and DRAM to the others,
/// so in attuned mode an unprotected CAP region's inactive chunks are evicted before any
/// other region's. Among CAP regions the clock's age order holds, so a workflow whose data
/// is all CAP is replaced as before. (Dropping CAP data behind its writer instead, as BW
/// streams are, was tried: it kept the mixed benchmark's arrays resident, but the zstd
/// workflow, which reads back what it wrote within its window, moved 34% more pages.)
pub fn capacity_first(flags: crate::Flags, attuned: bool) -> bool {
    attuned && flags.contains(crate::Flags::CAP) && !flags.is_protected()
}

/// How a chunk came to be placed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arrival {
    /// First touch (zero fill) or read ahead of a fault.
    First,
    /// Brought back from a far tier; `distance` is the bytes evicted by the whole runtime
    /// between its eviction and now.
    Refault { distance: u64 },
}

/// Where a placed chunk goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placed {
    pub active: bool,
    pub credit: u8,
    /// It refaulted close but the active class had no room: an active chunk should be
    /// tested.
    pub denied: bool,
}

/// Class and credit of a chunk placed now, given the DRAM budget and whether the active
/// class has room for it.
pub fn on_arrival(a: Arrival, budget: u64, room: bool) -> Placed {
    let inactive = Placed {
        active: false,
        credit: 1,
        denied: false,
    };
    match a {
        Arrival::First => inactive,
        // Evicted and wanted again before the budget's worth of other bytes was evicted:
        // with a little more DRAM it would have been a hit. It is in the working set.
        Arrival::Refault { distance } if distance <= budget => {
            if room {
                Placed {
                    active: true,
                    ..inactive
                }
            } else {
                Placed {
                    denied: true,
                    ..inactive
                }
            }
        }
        Arrival::Refault { .. } => inactive,
    }
}

/// Bytes the active class may hold: the pageable budget less a share kept for inactive
/// chunks, where newcomers prove themselves (2Q keeps about a quarter for its A1 queue).
pub fn active_target(budget: u64, pinned: u64, inactive_share_pct: u64) -> u64 {
    let pageable = budget.saturating_sub(pinned);
    pageable - pageable * inactive_share_pct.min(100) / 100
}

/// How many chunks the hand looks at in a region per visit: every region is lapped in
/// about `laps_per` visits whatever its size, so the hand moves over all regions' chunks
/// at one rate (one global clock) instead of draining whichever region it stands in.
pub fn scan_quantum(chunks: usize, laps_per: usize) -> usize {
    chunks.div_ceil(laps_per.max(1)).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clock_table() {
        let v = |resident, pinned, active, credit, protected_region| ChunkView {
            resident,
            pinned,
            active,
            credit,
            protected_region,
        };
        use ClockAction::*;
        // (chunk, last resort, active over target) -> action
        let cases = [
            (v(false, false, false, 0, false), false, false, Skip),
            (v(false, false, true, 1, false), true, true, Skip),
            (v(true, true, false, 0, false), true, true, Skip),
            (v(true, false, false, 1, false), false, false, Age),
            (v(true, false, false, 1, false), false, true, Age),
            (v(true, false, false, 0, false), false, false, Evict),
            (v(true, false, true, 0, false), false, false, Skip),
            (v(true, false, true, 1, false), false, true, Demote),
            (v(true, false, true, 1, false), true, false, Demote),
            (v(true, false, false, 0, true), false, true, Skip),
            (v(true, false, true, 1, true), false, true, Skip),
            (v(true, false, false, 0, true), true, false, Evict),
            (v(true, false, false, 1, true), true, false, Age),
            (v(true, true, false, 0, true), true, true, Skip),
        ];
        for (i, (c, lr, over, want)) in cases.into_iter().enumerate() {
            assert_eq!(clock_decide(c, lr, over), want, "case {i}");
        }
    }

    #[test]
    fn arrival_table() {
        let mib = 1u64 << 20;
        let p = |active, denied| Placed {
            active,
            credit: 1,
            denied,
        };
        let far = |distance| Arrival::Refault { distance };
        let cases = [
            (Arrival::First, true, p(false, false)),
            (Arrival::First, false, p(false, false)),
            (far(0), true, p(true, false)),
            (far(64 * mib), true, p(true, false)),
            (far(64 * mib), false, p(false, true)),
            (far(64 * mib + 1), true, p(false, false)),
            (far(u64::MAX), false, p(false, false)),
        ];
        for (i, (a, room, want)) in cases.into_iter().enumerate() {
            assert_eq!(on_arrival(a, 64 * mib, room), want, "case {i}");
        }
    }

    #[test]
    fn active_target_table() {
        assert_eq!(active_target(100, 0, 25), 75);
        assert_eq!(active_target(100, 40, 25), 45);
        assert_eq!(active_target(100, 200, 25), 0);
        assert_eq!(active_target(100, 0, 0), 100);
        assert_eq!(active_target(100, 0, 300), 0);
    }

    #[test]
    fn quantum_laps_every_region_at_one_rate() {
        assert_eq!(scan_quantum(0, 32), 1);
        assert_eq!(scan_quantum(1, 32), 1);
        assert_eq!(scan_quantum(512, 32), 16);
        assert_eq!(scan_quantum(513, 32), 17);
        assert_eq!(scan_quantum(100, 0), 100);
        for n in [64usize, 4096, 100_000] {
            let q = scan_quantum(n, 32);
            assert!(n.div_ceil(q) <= 32 && n.div_ceil(q) >= 31, "{n}");
        }
    }

    /// The rule simulated on one region: each step touches one chunk of `hot` (round robin,
    /// never seen by the runtime when resident) and, every 4th step, a new once-used chunk;
    /// `slots` chunks of DRAM. A denied activation tests (evicts) the oldest active chunk,
    /// at most one per `test_every` faults (the pacing). Returns the hot chunks' refaults
    /// after warm-up.
    fn simulate(slots: usize, hot: usize, with_classes: bool, test_every: usize) -> usize {
        // (id, active, credit), in clock order; new chunks go behind the hand.
        let mut resident: Vec<(usize, bool, u8)> = Vec::new();
        let mut evicted_at = std::collections::HashMap::new();
        let mut evictions = 0u64;
        let mut hand = 0usize;
        let mut hot_refaults = 0;
        let mut next_stream = hot;
        let mut faults = 0usize;
        let mut last_test = 0usize;
        let target = active_target(slots as u64, 0, 25);
        for step in 0..20_000 {
            let mut want = vec![step % hot];
            if step % 4 == 0 {
                want.push(next_stream);
                next_stream += 1;
            }
            for id in want {
                if resident.iter().any(|&(r, _, _)| r == id) {
                    continue; // a hit: invisible to the runtime
                }
                faults += 1;
                if id < hot && step > 2000 {
                    hot_refaults += 1;
                }
                while resident.len() >= slots {
                    hand %= resident.len();
                    let (_, act, credit) = resident[hand];
                    let active = resident.iter().filter(|r| r.1).count() as u64;
                    let view = ChunkView {
                        resident: true,
                        pinned: false,
                        active: act,
                        credit,
                        protected_region: false,
                    };
                    match clock_decide(view, false, active > target) {
                        ClockAction::Age => {
                            resident[hand].2 -= 1;
                            hand += 1;
                        }
                        ClockAction::Demote => {
                            resident[hand].1 = false;
                            hand += 1;
                        }
                        ClockAction::Evict => {
                            let (gone, _, _) = resident.remove(hand);
                            evictions += 1;
                            evicted_at.insert(gone, evictions);
                        }
                        ClockAction::Skip => hand += 1,
                    }
                }
                let arrival = match evicted_at.get(&id) {
                    Some(&at) if with_classes => Arrival::Refault {
                        distance: evictions - at,
                    },
                    _ => Arrival::First,
                };
                let active = resident.iter().filter(|r| r.1).count() as u64;
                let placed = on_arrival(arrival, slots as u64, active < target);
                if placed.denied && faults - last_test >= test_every {
                    last_test = faults;
                    if let Some(k) = resident.iter().position(|r| r.1) {
                        let (gone, _, _) = resident.remove(k);
                        evictions += 1;
                        evicted_at.insert(gone, evictions);
                        if k < hand {
                            hand -= 1;
                        }
                    }
                }
                let at = hand.min(resident.len());
                resident.insert(at, (id, placed.active, placed.credit));
                hand = at + 1;
            }
        }
        hot_refaults
    }

    #[test]
    fn a_hot_set_that_fits_stops_refaulting() {
        let with = simulate(100, 70, true, 50);
        let without = simulate(100, 70, false, 50);
        assert!(
            without > 1000,
            "plain CLOCK keeps refaulting the hot set: {without}"
        );
        assert!(
            with < 20,
            "active class: {with} hot refaults (plain CLOCK {without})"
        );
    }

    /// A loop over more than memory: plain CLOCK (FIFO between faults) misses on every
    /// touch; a stable active set hits on its part of the loop.
    #[test]
    fn a_loop_larger_than_memory_keeps_a_stable_part() {
        let with = simulate(100, 130, true, 50);
        let without = simulate(100, 130, false, 50);
        assert!(
            without > 15_000,
            "plain CLOCK misses the whole loop: {without}"
        );
        assert!(
            with * 2 < without,
            "stable active part: {with} vs plain {without}"
        );
    }

    #[test]
    fn capacity_data_gives_way_first_in_attuned_mode_only() {
        use crate::Flags;
        for (flags, attuned, want) in [
            (Flags::CAP, true, true),
            (Flags(Flags::CAP.0 | Flags::BW.0), true, true),
            (Flags::CAP, false, false),
            (Flags(Flags::CAP.0 | Flags::LAT.0), true, false),
            (Flags(Flags::CAP.0 | Flags::SHL.0), true, false),
            (Flags::BW, true, false),
            (Flags::NONE, true, false),
        ] {
            assert_eq!(capacity_first(flags, attuned), want, "{flags} {attuned}");
        }
    }
}
