//! `Uffd::move_pages` accounts for pages the kernel moved but did not report.
//!
//! Linux 6.18 can end a `UFFDIO_MOVE` early with a count short of what it moved; the retry
//! then meets EEXIST at a page the same call had placed. That race cannot be forced from
//! here, so these tests build its aftermath directly: part of the range is moved first (as
//! the unreported part would be), then the whole range is moved. Real userfaultfd, real
//! page tables; no page of a registered range is touched unless mincore says it is there
//! (no handler thread serves faults here).

mod common;

use attune_sys::mem;
use attune_sys::Errno;
use common::{Pair, PAGES};

fn word(page: usize) -> u64 {
    common::word(0x5EED, page)
}

/// Source pages filled except `holes`; `dst_filled` destination pages written before
/// registration (a real conflict). Both ranges registered.
fn pair(holes: &[usize], dst_filled: &[usize]) -> Option<Pair> {
    common::pair(0x5EED, holes, dst_filled, true)
}

fn read_dst(p: &Pair, page: usize) -> Option<u64> {
    common::read(p.dst + page * attune_sys::page_size())
}

#[test]
fn a_move_continues_past_pages_already_moved() {
    let Some(p) = pair(&[], &[]) else { return };
    let ps = attune_sys::page_size();
    // The unreported part: the first 5 pages are already at the destination.
    assert_eq!(
        p.uffd.move_pages(p.dst, p.src, 5 * ps, true, false),
        Ok(5 * ps)
    );
    assert_eq!(
        p.uffd.move_pages(p.dst, p.src, p.len, true, false),
        Ok(p.len)
    );
    for page in 0..PAGES {
        assert_eq!(read_dst(&p, page), Some(word(page)), "page {page}");
        assert!(
            !mem::page_present(p.src + page * ps),
            "page {page} left at the source"
        );
    }
}

#[test]
fn a_move_continues_past_moved_pages_in_the_middle() {
    let Some(p) = pair(&[], &[]) else { return };
    let ps = attune_sys::page_size();
    // Pages 0-3 still at the source, 4-9 already moved: the kernel stops at page 4.
    let (d, s) = (p.dst + 4 * ps, p.src + 4 * ps);
    assert_eq!(p.uffd.move_pages(d, s, 6 * ps, true, false), Ok(6 * ps));
    assert_eq!(
        p.uffd.move_pages(p.dst, p.src, p.len, true, false),
        Ok(p.len)
    );
    for page in 0..PAGES {
        assert_eq!(read_dst(&p, page), Some(word(page)), "page {page}");
    }
}

#[test]
fn holes_between_moved_pages_count_as_skipped() {
    let Some(p) = pair(&[3, 4, 12, 13, 14, 15], &[]) else {
        return;
    };
    let ps = attune_sys::page_size();
    // Already moved: 0-2 and 5-7; holes at 3-4 and at the end.
    assert_eq!(
        p.uffd.move_pages(p.dst, p.src, 3 * ps, true, false),
        Ok(3 * ps)
    );
    let (d, s) = (p.dst + 5 * ps, p.src + 5 * ps);
    assert_eq!(p.uffd.move_pages(d, s, 3 * ps, true, false), Ok(3 * ps));
    assert_eq!(
        p.uffd.move_pages(p.dst, p.src, p.len, true, false),
        Ok(p.len)
    );
    for page in 0..PAGES {
        let hole = [3, 4, 12, 13, 14, 15].contains(&page);
        let want = if hole { None } else { Some(word(page)) };
        assert_eq!(read_dst(&p, page), want, "page {page}");
    }
}

#[test]
fn a_real_conflict_is_still_eexist() {
    // Destination page 0 holds data of its own while the source page is there too.
    let Some(p) = pair(&[], &[0]) else { return };
    assert_eq!(
        p.uffd.move_pages(p.dst, p.src, p.len, true, false),
        Err(Errno(libc::EEXIST))
    );
    assert_eq!(
        read_dst(&p, 0),
        Some(1),
        "the destination's own page is kept"
    );
    assert_eq!(read_dst(&p, 1), None, "nothing after the conflict moved");
}

#[test]
fn a_conflict_after_progress_reports_the_progress() {
    let Some(p) = pair(&[], &[9]) else { return };
    let ps = attune_sys::page_size();
    assert_eq!(
        p.uffd.move_pages(p.dst, p.src, p.len, true, false),
        Ok(9 * ps)
    );
    for page in 0..9 {
        assert_eq!(read_dst(&p, page), Some(word(page)), "page {page}");
    }
    assert!(
        mem::page_present(p.src + 9 * ps),
        "the conflicting page stays at its source"
    );
}
