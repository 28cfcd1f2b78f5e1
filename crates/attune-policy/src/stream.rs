//! Drop-behind for streamed (BW) regions: which chunks to evict first.
//!
//! A loop that streams more bytes than DRAM holds (`c[i] = a[i] + b[i]` over arrays
//! larger than the budget) is the case where least-recently-used replacement fails
//! worst: the chunk it evicts is always the one the next pass needs soonest, so a pass
//! misses on much more than the shortfall. Evicting the chunks the stream has *just
//! passed* (most recently used, the kernel's drop-behind for `MADV_SEQUENTIAL` files) keeps
//! a fixed part of the loop resident, and each pass misses only on the shortfall plus the
//! distance kept behind the cursor. The BW flag says a region is streamed; a sequential
//! fault (read-ahead running) says the stream is on. The temperature-only mode ignores
//! flags and does not drop behind.

use crate::Flags;

/// Whether a fault in a region with `flags` marks chunks behind it as first victims, and
/// how far behind the faulting chunk they start (in chunks). `attuned`: the flag-driven
/// mode; `sequential`: the fault continues a sequential run; `pressed`: DRAM is at its
/// low watermark, so chunks are being evicted now (a stream that fits, such as the first
/// pass writing an array, marks nothing: its marks would wait in the ring and evict the
/// array much later, when another region needs room); `readahead_max`: the most
/// chunks one fault's read-ahead claims. A fault places a run of up to `1 + readahead_max`
/// chunks at the cursor, so the marked run starts one run and two chunks behind it: never
/// a chunk of the run just placed, and not the chunks right behind the cursor that a loop
/// body may still read (a stencil's `i - 1`).
pub fn drop_behind(
    flags: Flags,
    attuned: bool,
    sequential: bool,
    pressed: bool,
    readahead_max: usize,
) -> Option<usize> {
    if !attuned || !sequential || !pressed || !flags.contains(Flags::BW) || flags.is_protected() {
        return None;
    }
    Some(readahead_max + 3)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table() {
        let lat_bw = Flags(Flags::LAT.0 | Flags::BW.0);
        for (flags, attuned, seq, pressed, ra, want) in [
            (Flags::BW, true, true, true, 31, Some(34)),
            (Flags::BW, true, true, true, 0, Some(3)),
            (Flags::BW, true, false, true, 31, None),
            (Flags::BW, true, true, false, 31, None),
            (Flags::BW, false, true, true, 31, None),
            (
                Flags(Flags::BW.0 | Flags::CAP.0),
                true,
                true,
                true,
                1,
                Some(4),
            ),
            (lat_bw, true, true, true, 31, None),
            (Flags::CAP, true, true, true, 31, None),
            (Flags(0), true, true, true, 31, None),
            (Flags::LAT, true, true, true, 31, None),
        ] {
            assert_eq!(
                drop_behind(flags, attuned, seq, pressed, ra),
                want,
                "{flags} {attuned} {seq}"
            );
        }
    }
}
