//! Huge pages for whole resident spans: the mechanism of `attune_policy::huge`.
//!
//! A pass of the background evictor (at most one a second) walks the regions the policy
//! allows and collapses each 2 MiB span whose chunks are all resident
//! (`attune_sys::mem::collapse`). A span's cell says what the pass knows of it:
//!
//! * `SMALL`: on 4 KiB pages, or not known to be on huge ones;
//! * `HUGE`: collapsed. Set before the collapse and taken back if it fails, so a move out
//!   that splits the span (and clears the cell, [`split`]) can never be overwritten by a
//!   late "done";
//! * `NEVER`: the kernel refused for good (no `MADV_COLLAPSE`, or the program asked
//!   `MADV_NOHUGEPAGE` for that memory): not tried again.
//!
//! Eviction needs nothing else: `UFFDIO_MOVE` of a page out of a huge page splits it in
//! the kernel, and a discard's `MADV_DONTNEED` splits the mapping too.

use super::pager::Pager;
use crate::region::{Region, Where};
use attune_policy::huge::{self as rule, SPAN};
use attune_policy::Flags;
use attune_sys::mem::{self, Collapse};
use attune_sys::os;
use std::sync::atomic::Ordering::*;

const SMALL: u8 = 0;
const HUGE: u8 = 1;
const NEVER: u8 = 2;

/// Whether a new region of `flags` and `len` bytes may ever be collapsed (the flags are
/// ignored in temperature mode, as everywhere else).
pub fn eligible(e: &Pager, flags: Flags, len: usize) -> bool {
    rule::eligible(mode(e), effective(e, flags), len)
}

fn mode(e: &Pager) -> rule::Mode {
    if e.cfg.huge_pages == crate::config::HugePages::Auto
        && e.uffd_internal.has(attune_sys::uffd::feature::MOVE)
    {
        rule::Mode::Auto
    } else {
        // Without UFFDIO_MOVE an eviction copies a page out and drops it with
        // MADV_DONTNEED: the huge page's other 511 pages would stay charged to the job
        // until the kernel's deferred split runs under pressure.
        rule::Mode::Off
    }
}

fn effective(e: &Pager, flags: Flags) -> Flags {
    if e.cfg.mode == crate::config::Mode::Attuned {
        flags
    } else {
        Flags::NONE
    }
}

/// Whether the access sampler parks this region's chunks now (`super::sampler`: every
/// sampled region under `attune profile`, a region in its prediction window otherwise).
fn sampled(e: &Pager, r: &Region) -> bool {
    r.samples.enabled() && (e.cfg.sample_rate > 0 || r.predict_due.load(Relaxed) != 0)
}

/// Marks the spans of chunks `[c, c + n)` of `r` as split (a move out or a discard).
pub fn split(e: &Pager, r: &Region, c: usize, n: usize) {
    if r.huge.is_empty() {
        return;
    }
    let first = (c * r.chunk) / SPAN;
    let last = ((c + n) * r.chunk - 1) / SPAN;
    for s in first..=last.min(r.huge.len() - 1) {
        if r.huge[s]
            .compare_exchange(HUGE, SMALL, AcqRel, Relaxed)
            .is_ok()
        {
            e.counters.huge_splits.fetch_add(1, Relaxed);
        }
    }
}

/// Bytes of `r` on huge pages as far as the passes know (a span split by the kernel
/// for its own reasons, such as a `mprotect` of part of it, still counts).
pub fn huge_bytes(r: &Region) -> u64 {
    r.huge.iter().filter(|c| c.load(Relaxed) == HUGE).count() as u64 * SPAN as u64
}

/// Collapses whole resident spans of the regions the rule allows, at most `left` bytes,
/// until `deadline` (ns). Returns the bytes collapsed and whether spans may be left (the
/// work or the time ran out before the table did). On the evictor thread, inside the fork
/// gate. It stops at the deadline and when the evictor is woken (a fault wants room):
/// a pass of 112 MiB held the evictor 208 ms while a Python program grew to its memory
/// cgroup's limit unread (`super::limit`) and was killed.
pub fn pass(e: &Pager, left: usize, deadline: u64) -> (usize, bool) {
    if mode(e) == rule::Mode::Off {
        return (0, false);
    }
    // A copy of the table: a collapse takes up to a millisecond, and new regions must
    // not wait for the whole pass on the table's lock.
    let table: Vec<_> = e
        .regions
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .filter(|r| !r.huge.is_empty())
        .cloned()
        .collect();
    let start = left;
    let mut left = left;
    for r in &table {
        if r.freed.load(Acquire)
            || !rule::eligible(rule::Mode::Auto, effective(e, r.flags()), r.len)
        {
            continue;
        }
        let seen = r.counters.evictions.load(Relaxed) + r.counters.discarded.load(Relaxed);
        let before = r.huge_seen.swap(seen, Relaxed);
        let view = rule::RegionView {
            evicted_since_last_pass: seen != before,
            room: e.budget().saturating_sub(e.resident.load(Relaxed)),
            sampled: sampled(e, r),
        };
        if !rule::collapse_now(view) {
            continue;
        }
        let per_span = SPAN / r.chunk;
        for (s, cell) in r.huge.iter().enumerate() {
            if left < SPAN || e.wake_evictor.pending() || os::now_ns() >= deadline {
                return (start - left, true);
            }
            if cell.load(Relaxed) != SMALL {
                continue;
            }
            let c0 = s * per_span;
            if !(c0..c0 + per_span).all(|c| r.state(c).place() == Where::Resident) {
                continue;
            }
            if cell.compare_exchange(SMALL, HUGE, AcqRel, Relaxed).is_err() {
                continue;
            }
            match mem::collapse(r.base + s * SPAN, SPAN) {
                Collapse::Done => {
                    e.counters.huge_collapses.fetch_add(1, Relaxed);
                    left -= SPAN;
                }
                Collapse::Later => {
                    let _ = cell.compare_exchange(HUGE, SMALL, AcqRel, Relaxed);
                }
                Collapse::Never => {
                    let _ = cell.compare_exchange(HUGE, NEVER, AcqRel, Relaxed);
                }
            }
        }
    }
    (start - left, false)
}
