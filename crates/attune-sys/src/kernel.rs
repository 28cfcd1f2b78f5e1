//! Kernel features Attune uses beyond its base, and the mask that turns them off.
//!
//! The base is what Linux 5.10 has: userfaultfd missing faults, `UFFDIO_COPY`,
//! write-protection of anonymous memory (`UFFDIO_WRITEPROTECT`, 5.7), `UFFD_FEATURE_SIGBUS`
//! and `UFFD_FEATURE_THREAD_ID` (4.14). Everything newer is an accelerator with a fallback
//! (docs/design/kernels.md): a feature is used when the kernel offers it and the mask does
//! not name it. The mask (`kernel_features`, `ATTUNE_KERNEL_FEATURES=-move,-poison`) makes
//! every fallback path run on a new kernel, in the test suite and in benchmarks.
//!
//! The mask is one process-wide word, set once from the configuration before the engine
//! opens anything (`set_mask`) and read with one relaxed load (signal-safe).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// `UFFDIO_MOVE` (6.8): eviction and long fetches move page-table entries.
/// Fallback: write-protect, copy, drop (`crate::uffd::Uffd::move_pages`).
pub const MOVE: u64 = 1 << 0;
/// `UFFDIO_POISON` (6.6): a page whose only copy cannot be read back raises SIGBUS in
/// every thread that touches it. Fallback: SIGBUS sent to the faulting thread.
pub const POISON: u64 = 1 << 1;
/// `UFFD_FEATURE_WP_ASYNC` (6.7): written pages tracked without a handler (NUMA heat).
/// Fallback: no write heat (access heat only).
pub const WP_ASYNC: u64 = 1 << 2;
/// `PAGEMAP_SCAN` (6.7): the written pages read back in one walk. Fallback as `WP_ASYNC`.
pub const PAGEMAP_SCAN: u64 = 1 << 3;
/// `MPOL_WEIGHTED_INTERLEAVE` (6.9): BW pages spread by tier bandwidth in one policy.
/// Fallback: stripes placed with `mbind` per range.
pub const WEIGHTED_INTERLEAVE: u64 = 1 << 4;
/// Soft-dirty bits (`CONFIG_MEM_SOFT_DIRTY`, 3.11; not a 6.x feature, so `-all` leaves
/// it): NUMA write heat where `WP_ASYNC`/`PAGEMAP_SCAN` are missing. Fallback: none.
pub const SOFT_DIRTY: u64 = 1 << 5;

/// One row per feature: its mask name, bit, first kernel, what it gives, what replaces it.
pub struct Feature {
    pub name: &'static str,
    pub bit: u64,
    pub since: &'static str,
    pub gives: &'static str,
    pub fallback: &'static str,
    /// What the fallback costs here (docs/benchmarks.md, "Kernel feature fallbacks").
    pub cost: &'static str,
}

pub const FEATURES: &[Feature] = &[
    Feature {
        name: "move",
        cost: "sequential passes 0.16x (signal) / 0.42x (thread), random updates 0.62x / 0.78x, fault latency 1.0x (bench/kernel_features.py)",
        bit: MOVE,
        since: "6.8",
        gives: "UFFDIO_MOVE: eviction and long fetches move page-table entries, no copy",
        fallback: "write-protect, copy, MADV_DONTNEED (one copy per moved page)",
    },
    Feature {
        name: "poison",
        cost: "none while pages read back; a lost page fails each access again instead of once",
        bit: POISON,
        since: "6.6",
        gives: "UFFDIO_POISON: an unreadable page raises SIGBUS in whoever touches it",
        fallback: "SIGBUS sent to the faulting thread (UFFD_FEATURE_THREAD_ID)",
    },
    Feature {
        name: "wp_async",
        cost: "after each heat round every first write to any page of the process takes an in-kernel fault, not only writes to armed cells (not measured on this machine, whose kernel keeps no soft-dirty bits)",
        bit: WP_ASYNC,
        since: "6.7",
        gives: "asynchronous write-protection: write heat for NUMA placement",
        fallback: "write heat from soft-dirty bits (clear_refs, pagemap bit 55), re-armed for the whole process each round; none without them",
    },
    Feature {
        name: "pagemap_scan",
        cost: "as wp_async",
        bit: PAGEMAP_SCAN,
        since: "6.7",
        gives: "PAGEMAP_SCAN: written pages read back in one walk (NUMA write heat)",
        fallback: "as wp_async: soft-dirty bits read from /proc/self/pagemap",
    },
    Feature {
        name: "weighted_interleave",
        cost: "one mbind per stripe at allocation",
        bit: WEIGHTED_INTERLEAVE,
        since: "6.9",
        gives: "MPOL_WEIGHTED_INTERLEAVE: BW pages spread by bandwidth in one policy",
        fallback: "stripes placed range by range with mbind",
    },
    Feature {
        name: "soft_dirty",
        cost: "no write heat: hot pages written in the far tier stay there, no headroom demotion",
        bit: SOFT_DIRTY,
        since: "3.11",
        gives: "soft-dirty bits (CONFIG_MEM_SOFT_DIRTY): NUMA write heat where wp_async or pagemap_scan is missing",
        fallback: "needed only without wp_async or pagemap_scan: then no write heat, NUMA placement by flags alone",
    },
];

/// Every 6.x feature bit (`-all`: as on 5.10, which has soft-dirty bits).
pub const ALL: u64 = MOVE | POISON | WP_ASYNC | PAGEMAP_SCAN | WEIGHTED_INTERLEAVE;
/// Every bit the mask may hold.
const MASKABLE: u64 = ALL | SOFT_DIRTY;

static MASK: AtomicU64 = AtomicU64::new(0);

/// Parses a mask: comma-separated `-name` (turn off) or `+name` (leave to the kernel)
/// entries; `-all` turns off every feature. An empty string masks nothing.
pub fn parse_mask(s: &str) -> Result<u64, String> {
    let mut mask = 0u64;
    for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let (off, name) = match item.as_bytes()[0] {
            b'-' => (true, &item[1..]),
            b'+' => (false, &item[1..]),
            _ => {
                return Err(format!(
                    "'{item}': write -{item} to turn the feature off (or +{item} to leave it on)"
                ))
            }
        };
        let bit = if name == "all" {
            ALL
        } else {
            match FEATURES.iter().find(|f| f.name == name) {
                Some(f) => f.bit,
                None => {
                    let names: Vec<_> = FEATURES.iter().map(|f| f.name).collect();
                    return Err(format!(
                        "'{name}' is not a kernel feature Attune uses (expected all, {})",
                        names.join(", ")
                    ));
                }
            }
        };
        if off {
            mask |= bit;
        } else {
            mask &= !bit;
        }
    }
    Ok(mask)
}

/// The mask in its written form (`-move,-poison`; empty for none).
pub fn mask_string(mask: u64) -> String {
    FEATURES
        .iter()
        .filter(|f| mask & f.bit != 0)
        .map(|f| format!("-{}", f.name))
        .collect::<Vec<_>>()
        .join(",")
}

/// Sets the process's mask (before the engine opens anything).
pub fn set_mask(mask: u64) {
    MASK.store(mask & MASKABLE, Relaxed);
}

/// The process's mask. Signal-safe.
pub fn mask() -> u64 {
    MASK.load(Relaxed)
}

/// Whether `bit` is masked off. Signal-safe.
pub fn masked(bit: u64) -> bool {
    mask() & bit != 0
}

/// The names of the features whose fallback runs (absent or masked), in table order.
/// Soft-dirty bits count only where they would stand in (asynchronous write-protection
/// or `PAGEMAP_SCAN` missing): otherwise nothing runs without them.
pub fn fallbacks(in_use: u64) -> Vec<&'static str> {
    let async_heat = in_use & (WP_ASYNC | PAGEMAP_SCAN) == WP_ASYNC | PAGEMAP_SCAN;
    FEATURES
        .iter()
        .filter(|f| in_use & f.bit == 0 && !(f.bit == SOFT_DIRTY && async_heat))
        .map(|f| f.name)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mask_is_read_as_written() {
        let cases: &[(&str, Result<u64, &str>)] = &[
            ("", Ok(0)),
            ("-move", Ok(MOVE)),
            ("-move,-poison", Ok(MOVE | POISON)),
            (" -move , -pagemap_scan ", Ok(MOVE | PAGEMAP_SCAN)),
            ("-all", Ok(ALL)),
            ("-all,-soft_dirty", Ok(ALL | SOFT_DIRTY)),
            ("-all,+move", Ok(ALL & !MOVE)),
            ("+move", Ok(0)),
            ("move", Err("write -move")),
            ("-mvoe", Err("'mvoe' is not a kernel feature")),
            ("-", Err("'' is not a kernel feature")),
        ];
        for (s, want) in cases {
            match (parse_mask(s), want) {
                (Ok(got), Ok(w)) => assert_eq!(got, *w, "{s}"),
                (Err(e), Err(w)) => assert!(e.contains(w), "{s}: {e}"),
                (got, w) => panic!("{s}: got {got:?}, want {w:?}"),
            }
        }
    }

    #[test]
    fn soft_dirty_is_a_fallback_only_where_it_stands_in() {
        assert_eq!(fallbacks(ALL), Vec::<&str>::new());
        assert_eq!(fallbacks(ALL & !MOVE), vec!["move"]);
        assert_eq!(fallbacks(ALL & !WP_ASYNC), vec!["wp_async", "soft_dirty"]);
        assert_eq!(
            fallbacks(MOVE | POISON | SOFT_DIRTY),
            vec!["wp_async", "pagemap_scan", "weighted_interleave"]
        );
    }

    #[test]
    fn the_written_form_reads_back() {
        for m in [0, MOVE, POISON | WP_ASYNC, ALL, ALL | SOFT_DIRTY] {
            assert_eq!(parse_mask(&mask_string(m)).unwrap(), m);
        }
    }
}
