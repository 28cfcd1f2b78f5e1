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
//!
//! CAP regions drop behind too: capacity data belongs in the big tier, and DRAM is only
//! where it passes through when it is written or read in sequence. Without this, a
//! program that fills its capacity data after its working arrays (the usual order:
//! inputs, work arrays, then bulk data) evicts the arrays it is about to use while the
//! data it will hardly touch stays resident (the mixed benchmark: arrays `a` and `b` at
//! 1 MiB resident of 85 each when the loop starts, the CAP data at 222 MiB).

use crate::Flags;

/// Whether a fault in a region with `flags` (BW or CAP, not LAT/SHL) marks chunks behind it as first victims, and
/// how far behind the faulting chunk they start (in chunks). `attuned`: the flag-driven
/// mode; `sequential`: the fault continues a sequential run; `readahead_max`: the most
/// chunks one fault's read-ahead claims. A fault places a run of up to `1 + readahead_max`
/// chunks at the cursor, so the marked run starts one run and two chunks behind it: never
/// a chunk of the run just placed, and not the chunks right behind the cursor that a loop
/// body may still read (a stencil's `i - 1`).
pub fn drop_behind(
    flags: Flags,
    attuned: bool,
    sequential: bool,
    readahead_max: usize,
) -> Option<usize> {
    let streamed = flags.contains(Flags::BW) || flags.contains(Flags::CAP);
    if !attuned || !sequential || !streamed || flags.is_protected() {
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
        for (flags, attuned, seq, ra, want) in [
            (Flags::BW, true, true, 31, Some(34)),
            (Flags::BW, true, true, 0, Some(3)),
            (Flags::BW, true, false, 31, None),
            (Flags::BW, false, true, 31, None),
            (Flags(Flags::BW.0 | Flags::CAP.0), true, true, 1, Some(4)),
            (lat_bw, true, true, 31, None),
            (Flags::CAP, true, true, 31, Some(34)),
            (Flags::CAP, true, false, 31, None),
            (Flags(Flags::LAT.0 | Flags::CAP.0), true, true, 31, None),
            (Flags(0), true, true, 31, None),
            (Flags::LAT, true, true, 31, None),
        ] {
            assert_eq!(
                drop_behind(flags, attuned, seq, ra),
                want,
                "{flags} {attuned} {seq}"
            );
        }
    }
}
