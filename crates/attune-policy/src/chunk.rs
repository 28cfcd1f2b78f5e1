//! The unit of movement of a region, by its flags.
//!
//! A miss moves one chunk. Latency-sensitive data is read a word here and a word there
//! (lookups, hash tables, graph frontiers): moving 64 KiB for an 8-byte read wastes the
//! link and evicts 15 useful pages, so LAT regions move page by page. Bandwidth and
//! capacity data is streamed: larger chunks cut the number of faults (16x at 64 KiB) and
//! read-ahead does the rest. The configured chunk size is the default for everything else.
//!
//! The home tier sets a floor (its `min_chunk`): a file tier pays a system call, a content
//! hash and a copy per chunk, so a 4 KiB chunk costs nearly what a 16 KiB one does, and a
//! sequential pass over 4 KiB chunks ran at 0.6x the kernel's mapped file where 16 KiB ran
//! at 1.6x (docs/benchmarks.md). The floor applies to LAT regions too: on such a tier a
//! page-sized move saves nothing.

use crate::Flags;

/// Chunk size for a region with `flags` when the caller did not choose one, given the
/// configured default and the home tier's floor. Pure: no kernel, no state.
pub fn chunk_for(flags: Flags, default: usize, tier_min: usize) -> usize {
    const PAGE: usize = 4096;
    let by_flags = if flags.contains(Flags::LAT) && !flags.contains(Flags::BW) {
        PAGE
    } else {
        default
    };
    by_flags.max(tier_min)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table() {
        let d = 64 << 10;
        for (flags, want) in [
            (Flags(0), d),
            (Flags::LAT, 4096),
            (Flags(Flags::LAT.0 | Flags::SHL.0), 4096),
            (Flags(Flags::LAT.0 | Flags::BW.0), d),
            (Flags::BW, d),
            (Flags::CAP, d),
            (Flags::SHL, d),
        ] {
            assert_eq!(chunk_for(flags, d, 4096), want, "{flags}");
        }
        assert_eq!(chunk_for(Flags::LAT, 4096, 4096), 4096);
    }

    #[test]
    fn the_home_tier_sets_a_floor() {
        let (k4, k16, k64) = (4096, 16 << 10, 64 << 10);
        for (flags, default, floor, want) in [
            (Flags(0), k4, k16, k16),
            (Flags::LAT, k4, k16, k16),
            (Flags::CAP, k64, k16, k64),
            (Flags::BW, k4, k64, k64),
            (Flags::LAT, k64, k4, k4),
        ] {
            assert_eq!(
                chunk_for(flags, default, floor),
                want,
                "{flags} {default} {floor}"
            );
        }
    }
}
