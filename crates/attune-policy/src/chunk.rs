//! The unit of movement of a region, by its flags.
//!
//! A miss moves one chunk. Latency-sensitive data is read a word here and a word there
//! (lookups, hash tables, graph frontiers): moving 64 KiB for an 8-byte read wastes the
//! link and evicts 15 useful pages, so LAT regions move page by page. Bandwidth and
//! capacity data is streamed: larger chunks cut the number of faults (16x at 64 KiB) and
//! read-ahead does the rest. The configured chunk size is the default for everything else.

use crate::Flags;

/// Chunk size for a region with `flags` when the caller did not choose one, given the
/// configured default. Pure: no kernel, no state.
pub fn chunk_for(flags: Flags, default: usize) -> usize {
    const PAGE: usize = 4096;
    if flags.contains(Flags::LAT) && !flags.contains(Flags::BW) {
        PAGE
    } else {
        default
    }
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
            assert_eq!(chunk_for(flags, d), want, "{flags}");
        }
        assert_eq!(chunk_for(Flags::LAT, 4096), 4096);
    }
}
