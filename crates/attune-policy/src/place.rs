//! Where a new allocation lives, for every path that makes one:
//! * [`route`]: the small allocator's class arenas or a region of its own;
//! * [`effective_flags`]: the flags that decide (none in temperature mode);
//! * on NUMA tiers, [`numa`]: the ranges Algorithm 1 lays out (`crate::numa::layout`);
//! * in the paging engine, [`place`]: the home far tier (where evicted chunks go) and the
//!   unit of movement, [`initial_pin`]: the part pinned in DRAM from the start, and
//!   [`predicts`]: whether the online prediction samples it.
//!
//! The runtime asks once per allocation (`runtime::alloc_general`, `paging/ops.rs`,
//! `numa/mod.rs`) and applies the answer.

use crate::chunk::chunk_for;
use crate::Flags;

/// Where an allocation goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// A block in the small allocator's arena for its flags.
    Small,
    /// A region of its own (or NUMA ranges of its own).
    Region,
}

/// The small allocator takes an allocation below `small_threshold` that asks for nothing
/// of its own (`options`: a region of its own, a tier, a pin, pre-faulting, a chunk size
/// or a fault delivery, which only a region can honour), while it is on (off in a forked
/// child that could not take its parent's runtime over). Everything else gets a region.
pub fn route(size: usize, small_threshold: usize, options: bool, small_on: bool) -> Route {
    if size < small_threshold && !options && small_on {
        Route::Small
    } else {
        Route::Region
    }
}

/// The flags placement follows: the caller's in attuned mode; none in temperature mode
/// (IMME's TME baseline, where every region is placed and moved alike).
pub fn effective_flags(flags: Flags, attuned: bool) -> Flags {
    if attuned {
        flags
    } else {
        Flags::NONE
    }
}

/// The ranges of a new NUMA region of `len` bytes (a multiple of `page`): Algorithm 1
/// over what `tiers` have left, with the flags that decide. None when they cannot hold it.
pub fn numa(
    len: u64,
    flags: Flags,
    attuned: bool,
    tiers: &[crate::TierView],
    pin_fraction: f64,
    page: u64,
) -> Option<Vec<crate::numa::RangePlan>> {
    crate::numa::layout(
        len,
        effective_flags(flags, attuned),
        tiers,
        pin_fraction,
        page,
    )
}

/// A pageable far tier as placement sees it, in the engine's order (fastest first).
#[derive(Clone, Copy, Debug)]
pub struct FarTierView {
    /// Node memory (a `memory` tier) rather than a file.
    pub node_memory: bool,
    pub capacity: u64,
    /// The medium's least chunk size.
    pub min_chunk: usize,
}

/// What the caller asked for.
#[derive(Clone, Copy, Debug, Default)]
pub struct Request {
    pub flags: Flags,
    /// Flags decide (attuned mode); false: temperature only, every region alike.
    pub attuned: bool,
    pub preferred_tier: Option<usize>,
    pub chunk: Option<usize>,
}

/// The decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement {
    /// Index of the home far tier.
    pub home: usize,
    pub chunk: usize,
}

/// Home tier and chunk size of a new region. The home: the tier asked for; else for CAP
/// data (attuned, not protected) the capacity tier, the biggest far tier that is node
/// memory, else the biggest of all (a file tier takes CAP data first only where no memory
/// tier exists; docs/design/evaluation.md, "CAP's tier"); else the fastest. The chunk: the
/// one asked for; else by flags (`chunk::chunk_for`) in attuned mode, the default in
/// temperature mode; never below the home tier's floor.
pub fn place(req: Request, default_chunk: usize, tiers: &[FarTierView]) -> Placement {
    let home = match req.preferred_tier {
        Some(t) if t < tiers.len() => t,
        _ if req.attuned && req.flags.contains(Flags::CAP) && !req.flags.is_protected() => {
            let biggest = |memory_only: bool| {
                tiers
                    .iter()
                    .enumerate()
                    .filter(|(_, t)| t.node_memory || !memory_only)
                    .max_by_key(|(_, t)| t.capacity)
                    .map(|(i, _)| i)
            };
            biggest(true).or_else(|| biggest(false)).unwrap_or(0)
        }
        _ => 0,
    };
    let floor = tiers.get(home).map(|t| t.min_chunk).unwrap_or(4096);
    let chunk = req.chunk.unwrap_or(if req.attuned {
        chunk_for(req.flags, default_chunk, floor)
    } else {
        default_chunk.max(floor)
    });
    Placement { home, chunk }
}

/// Bytes of a new region pinned and pre-faulted from the start: what the caller asked for
/// (within the region); else, in attuned mode, `pin_fraction` of a LAT/SHL region (IMME
/// Algorithm 1) within the room the runtime's pins have left, in whole chunks.
pub fn initial_pin(
    asked: Option<usize>,
    len: usize,
    flags: Flags,
    attuned: bool,
    pin_fraction: f64,
    room: usize,
    chunk: usize,
) -> usize {
    match asked {
        Some(p) => p.min(len),
        None if attuned && flags.is_protected() => {
            let want = (len as f64 * pin_fraction) as usize;
            want.min(room) / chunk.max(1) * chunk.max(1)
        }
        None => 0,
    }
}

/// Whether the online prediction samples a new region: attuned mode, no flags and no
/// pin of the caller's (a region that says what it is needs no guess).
pub fn predicts(flags: Flags, attuned: bool, asked_pin: bool, window_ms: u64) -> bool {
    window_ms > 0 && attuned && flags == Flags::NONE && !asked_pin
}

#[cfg(test)]
mod tests {
    use super::*;

    const MEM: FarTierView = FarTierView {
        node_memory: true,
        capacity: 4 << 30,
        min_chunk: 4096,
    };
    const BIGMEM: FarTierView = FarTierView {
        node_memory: true,
        capacity: 8 << 30,
        min_chunk: 4096,
    };
    const FILE: FarTierView = FarTierView {
        node_memory: false,
        capacity: 100 << 30,
        min_chunk: 16 << 10,
    };

    fn req(flags: Flags) -> Request {
        Request {
            flags,
            attuned: true,
            ..Default::default()
        }
    }

    #[test]
    fn the_route_of_an_allocation() {
        for (size, options, small_on, want) in [
            (64, false, true, Route::Small),
            (4095, false, true, Route::Small),
            (4096, false, true, Route::Region), // the threshold itself: a region
            (64, true, true, Route::Region),    // asks for something of its own
            (64, false, false, Route::Region),  // small allocator off
            (0, false, true, Route::Small),
        ] {
            assert_eq!(
                route(size, 4096, options, small_on),
                want,
                "{size} {options} {small_on}"
            );
        }
        assert_eq!(
            route(64, 0, false, true),
            Route::Region,
            "threshold 0: never small"
        );
    }

    #[test]
    fn temperature_mode_ignores_flags_on_every_path() {
        let lat = Flags::LAT;
        assert_eq!(effective_flags(lat, true), lat);
        assert_eq!(effective_flags(lat, false), Flags::NONE);
        let tiers = [
            crate::TierView {
                available: 1 << 30,
                bandwidth: 100,
            },
            crate::TierView {
                available: 8 << 30,
                bandwidth: 30,
            },
        ];
        let attuned = numa(64 << 20, lat, true, &tiers, 0.5, 4096).unwrap();
        let temp = numa(64 << 20, lat, false, &tiers, 0.5, 4096).unwrap();
        assert!(
            attuned.iter().any(|r| r.pin > 0),
            "LAT pins part of its region"
        );
        assert!(
            temp.iter().all(|r| r.pin == 0 && r.flags == Flags::NONE),
            "{temp:?}"
        );
        assert_eq!(
            temp,
            numa(64 << 20, Flags::NONE, true, &tiers, 0.5, 4096).unwrap(),
            "temperature mode places a LAT region as an unflagged one"
        );
    }

    #[test]
    fn the_home_tier() {
        let cap_lat = Flags(Flags::CAP.0 | Flags::LAT.0);
        for (r, tiers, want) in [
            (req(Flags::NONE), &[MEM, FILE][..], 0),
            (req(Flags::CAP), &[MEM, FILE][..], 0), // memory before a bigger file
            (req(Flags::CAP), &[MEM, BIGMEM, FILE][..], 1), // the biggest memory tier
            (req(Flags::CAP), &[FILE][..], 0),
            (req(Flags::CAP), &[FILE, FILE][..], 1), // equal: the last (max_by_key)
            (req(cap_lat), &[MEM, BIGMEM][..], 0),   // protected: the fastest
            (
                Request {
                    attuned: false,
                    ..req(Flags::CAP)
                },
                &[MEM, BIGMEM][..],
                0,
            ),
            (
                Request {
                    preferred_tier: Some(1),
                    ..req(Flags::NONE)
                },
                &[MEM, FILE][..],
                1,
            ),
            (
                Request {
                    preferred_tier: Some(7),
                    ..req(Flags::NONE)
                },
                &[MEM, FILE][..],
                0,
            ),
            (req(Flags::CAP), &[][..], 0),
        ] {
            assert_eq!(place(r, 64 << 10, tiers).home, want, "{r:?}");
        }
    }

    #[test]
    fn the_chunk_respects_the_home_tiers_floor() {
        let t = [MEM, FILE];
        let pref_file = |flags| Request {
            preferred_tier: Some(1),
            ..req(flags)
        };
        for (r, want) in [
            (req(Flags::LAT), 4096),
            (req(Flags::BW), 64 << 10),
            (pref_file(Flags::LAT), 16 << 10),
            (
                Request {
                    chunk: Some(4096),
                    ..pref_file(Flags::BW)
                },
                4096,
            ), // asked: as asked
            (
                Request {
                    attuned: false,
                    ..req(Flags::LAT)
                },
                64 << 10,
            ),
        ] {
            assert_eq!(place(r, 64 << 10, &t).chunk, want, "{r:?}");
        }
    }

    #[test]
    fn initial_pins() {
        let m = 1 << 20;
        // (asked, len, flags, attuned, room) -> bytes
        for (asked, len, flags, attuned, room, want) in [
            (Some(3 * m), 2 * m, Flags::NONE, true, 0, 2 * m),
            (None, 8 * m, Flags::LAT, true, 100 * m, 2 * m),
            (None, 8 * m, Flags::SHL, true, m + 100, m),
            (None, 8 * m, Flags::LAT, false, 100 * m, 0),
            (None, 8 * m, Flags::CAP, true, 100 * m, 0),
        ] {
            assert_eq!(
                initial_pin(asked, len, flags, attuned, 0.25, room, 64 << 10),
                want,
                "{asked:?} {len} {flags:?}"
            );
        }
        assert!(predicts(Flags::NONE, true, false, 2000));
        assert!(!predicts(Flags::CAP, true, false, 2000));
        assert!(!predicts(Flags::NONE, true, true, 2000));
        assert!(!predicts(Flags::NONE, false, false, 2000));
        assert!(!predicts(Flags::NONE, true, false, 0));
    }
}
