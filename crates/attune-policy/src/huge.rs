//! Which resident parts of a region go on 2 MiB pages (the mechanism: the `attune`
//! crate's `paging::huge`, with `MADV_COLLAPSE`).
//!
//! A fault under userfaultfd always places 4 KiB pages, so a region Attune serves runs on
//! 4 KiB TLB entries even when all of it stays in DRAM. A random-access kernel over a
//! table larger than the TLB's reach (about 6-8 MiB of 4 KiB pages on current x86 cores)
//! then pays a page walk on most accesses; on 2 MiB pages the reach is 512 times larger
//! (docs/benchmarks.md, "Huge pages"). The rule:
//!
//! * **Which regions**: LAT, BW and unflagged ones of at least one span. Not CAP (headed
//!   for the big tier: a collapse would be split again by the first eviction) and not SHL
//!   (short-lived: a collapse copies 2 MiB, 0.7-0.9 ms here, which a region freed soon
//!   does not pay back). Small-object arenas are never collapsed (`eligible` is asked
//!   only for dedicated regions).
//! * **Which spans**: 2 MiB-aligned spans whose every chunk is resident. The kernel itself
//!   requires it under userfaultfd (a missing page must still fault to the handler), so a
//!   collapse never brings a far page back.
//! * **When**: not while the access sampler parks the region's chunks, and only while the
//!   region gave nothing to the far tiers since the last pass (a
//!   region under eviction pressure would be split again at once: the first move of a
//!   page out of a huge page splits it) and while the budget has a span of room (a
//!   collapse allocates the new 2 MiB page before it frees the 512 small ones).
//! * **How much**: at most [`MAX_BYTES_PER_PASS`] a pass, so the mmap lock a collapse
//!   holds delays the program's own faults and mappings by a bounded share of time.
//!
//! Eviction needs no rule of its own: moving a page out of a huge page splits it in the
//! kernel (`UFFDIO_MOVE` splits the folio), and the span is collapsed again once it is
//! whole and quiet.

use crate::Flags;

/// The unit of a collapse: one PMD-mapped page on x86-64 and arm64 (4 KiB base pages).
pub const SPAN: usize = 2 << 20;

/// Most bytes collapsed in one pass (one pass a second). A collapse of 64 MiB took
/// 24-29 ms here (a one-off scratch measurement, not reproducible from the repository:
/// docs/design/paging.md, "Huge pages"), so 256 MiB a pass keeps the collapsing thread
/// near a tenth of one core while a large region converts, and at nothing once it has.
pub const MAX_BYTES_PER_PASS: usize = 256 << 20;

/// Nanoseconds between two passes.
pub const PASS_EVERY_NS: u64 = 1_000_000_000;

/// The `huge_pages` option.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Collapse by the rule above.
    Auto,
    /// Never: every region stays on 4 KiB pages (`MADV_NOHUGEPAGE`), as before.
    Off,
}

/// Whether a region of `len` bytes with `flags` may ever be collapsed. Regions that may
/// not are created `MADV_NOHUGEPAGE`, so the kernel's own khugepaged (under
/// `transparent_hugepage/enabled = always`) leaves them alone too.
pub fn eligible(mode: Mode, flags: Flags, len: usize) -> bool {
    mode == Mode::Auto && len >= SPAN && !flags.contains(Flags::CAP) && !flags.contains(Flags::SHL)
}

/// What a pass knows of one eligible region.
#[derive(Clone, Copy, Debug)]
pub struct RegionView {
    /// Chunks of the region evicted or discarded since the last pass.
    pub evicted_since_last_pass: bool,
    /// DRAM budget less what is resident now.
    pub room: u64,
    /// The access sampler parks its chunks now (`attune profile`, the prediction window).
    pub sampled: bool,
}

/// Whether the pass collapses the whole resident spans of the region now. Not while it
/// is sampled: each park splits a span that the next pass would copy into a huge page
/// again, and a collapse holds the mmap lock while the sampler times the faults.
pub fn collapse_now(v: RegionView) -> bool {
    !v.evicted_since_last_pass && !v.sampled && v.room >= SPAN as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eligible_by_flags_size_and_mode() {
        const M: usize = 1 << 20;
        let rows: &[(Mode, Flags, usize, bool)] = &[
            (Mode::Auto, Flags::LAT, 64 * M, true),
            (Mode::Auto, Flags::BW, 64 * M, true),
            (Mode::Auto, Flags::NONE, 64 * M, true),
            (Mode::Auto, Flags(Flags::LAT.0 | Flags::BW.0), 64 * M, true),
            (Mode::Auto, Flags::CAP, 64 * M, false),
            (Mode::Auto, Flags::SHL, 64 * M, false),
            (
                Mode::Auto,
                Flags(Flags::LAT.0 | Flags::SHL.0),
                64 * M,
                false,
            ),
            (Mode::Auto, Flags::LAT, 2 * M, true),
            (Mode::Auto, Flags::LAT, 2 * M - 4096, false),
            (Mode::Off, Flags::LAT, 64 * M, false),
            (Mode::Off, Flags::NONE, 64 * M, false),
        ];
        for &(mode, flags, len, want) in rows {
            assert_eq!(eligible(mode, flags, len), want, "{mode:?} {flags:?} {len}");
        }
    }

    #[test]
    fn collapse_only_when_quiet_and_with_room() {
        let span = SPAN as u64;
        let rows: &[(bool, bool, u64, bool)] = &[
            (false, false, 100 * span, true),
            (false, false, span, true),
            (false, false, span - 1, false),
            (false, false, 0, false),
            (true, false, 100 * span, false),
            (true, false, 0, false),
            (false, true, 100 * span, false),
        ];
        for &(evicted, sampled, room, want) in rows {
            let v = RegionView {
                evicted_since_last_pass: evicted,
                room,
                sampled,
            };
            assert_eq!(collapse_now(v), want, "{v:?}");
        }
    }
}
