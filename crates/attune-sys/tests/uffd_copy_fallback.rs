//! `Uffd::move_pages` without `UFFDIO_MOVE` (Linux before 6.8, or `-move` masked): the
//! same contract by copy and drop. Real userfaultfd and page tables; the mask is set for
//! this test binary only (a process-wide word, so this file is its own process).
//!
//! Covered: a full move, holes skipped or refused, a page swapped out by the kernel (data,
//! not a hole: mincore cannot tell them apart, pagemap can), a run across a protection
//! change (one UFFDIO_COPY fills one VMA), and a destination page already there; the
//! loads' `place_copy` and `place_zeros` across such a change.

mod common;

use attune_sys::uffd::{feature, Delivery, Uffd};
use attune_sys::{kernel, mem, Errno};
use common::{read, Pair, PAGES};

fn word(page: usize) -> u64 {
    common::word(0xC0FF, page)
}

/// As `common::pair`, the source not registered (a region the program writes), with
/// `UFFDIO_MOVE` masked for this process.
fn pair(holes: &[usize], dst_filled: &[usize]) -> Option<Pair> {
    kernel::set_mask(kernel::MOVE | kernel::POISON);
    let p = common::pair(0xC0FF, holes, dst_filled, false)?;
    assert!(!p.uffd.has(feature::MOVE), "the mask hides UFFDIO_MOVE");
    Some(p)
}

#[test]
fn every_page_is_copied_and_dropped() {
    let Some(p) = pair(&[], &[]) else { return };
    let ps = attune_sys::page_size();
    assert_eq!(
        p.uffd.move_pages(p.dst, p.src, p.len, false, false),
        Ok(p.len)
    );
    for page in 0..PAGES {
        assert_eq!(read(p.dst + page * ps), Some(word(page)), "page {page}");
        assert!(
            !mem::page_present(p.src + page * ps),
            "page {page} left at the source"
        );
    }
}

#[test]
fn holes_are_skipped_or_refused() {
    let Some(p) = pair(&[3, 4, 15], &[]) else {
        return;
    };
    let ps = attune_sys::page_size();
    // Refused: stops at the first hole, with the pages before it done.
    assert_eq!(
        p.uffd.move_pages(p.dst, p.src, p.len, false, false),
        Ok(3 * ps)
    );
    // Allowed: the rest goes, the holes stay holes on both sides.
    let (d, s, l) = (p.dst + 3 * ps, p.src + 3 * ps, p.len - 3 * ps);
    assert_eq!(p.uffd.move_pages(d, s, l, true, false), Ok(l));
    for page in 0..PAGES {
        let want = (![3, 4, 15].contains(&page)).then(|| word(page));
        assert_eq!(read(p.dst + page * ps), want, "page {page}");
    }
}

#[test]
fn a_page_swapped_out_is_data_not_a_hole() {
    let Some(p) = pair(&[], &[]) else { return };
    let ps = attune_sys::page_size();
    // MADV_PAGEOUT swaps the page out where the machine has swap; without swap it stays.
    // SAFETY: madvise on our own private mapping.
    unsafe {
        libc::madvise(
            (p.src + 5 * ps) as *mut libc::c_void,
            ps,
            libc::MADV_PAGEOUT,
        )
    };
    let mut st = [0u64; 1];
    mem::page_states(p.src + 5 * ps, &mut st).unwrap();
    assert_ne!(
        st[0] & (mem::PM_PRESENT | mem::PM_SWAPPED),
        0,
        "page 5 is data"
    );
    assert_eq!(
        p.uffd.move_pages(p.dst, p.src, p.len, true, false),
        Ok(p.len)
    );
    assert_eq!(read(p.dst + 5 * ps), Some(word(5)));
}

#[test]
fn a_run_across_a_protection_change_is_placed() {
    let Some(p) = pair(&[], &[]) else { return };
    let ps = attune_sys::page_size();
    // Page 7 of the destination read-only: three VMAs, a copy fills only one.
    // SAFETY: mprotect on our own mapping.
    assert_eq!(
        unsafe { libc::mprotect((p.dst + 7 * ps) as *mut libc::c_void, ps, libc::PROT_READ) },
        0
    );
    assert_eq!(
        p.uffd.move_pages(p.dst, p.src, p.len, true, false),
        Ok(p.len)
    );
    for page in 0..PAGES {
        assert_eq!(read(p.dst + page * ps), Some(word(page)), "page {page}");
    }
}

#[test]
fn a_destination_page_already_there_stops_the_copy() {
    let Some(p) = pair(&[], &[6]) else { return };
    let ps = attune_sys::page_size();
    assert_eq!(
        p.uffd.move_pages(p.dst, p.src, p.len, true, false),
        Ok(6 * ps)
    );
    assert_eq!(read(p.dst + 6 * ps), Some(1), "the page there is kept");
    assert!(mem::page_present(p.src + 6 * ps), "its source is kept");
    assert_eq!(
        p.uffd
            .move_pages(p.dst + 6 * ps, p.src + 6 * ps, ps, true, false),
        Err(Errno(libc::EEXIST))
    );
}

#[test]
fn poison_is_refused_where_masked() {
    kernel::set_mask(kernel::MOVE | kernel::POISON);
    let Ok(u) = Uffd::open(Delivery::Thread, 0) else {
        return;
    };
    assert!(!u.has(feature::POISON));
    assert_eq!(u.poison(0x10000, 4096), Err(Errno(libc::ENOTSUP)));
}

/// A far tier's load into a region the program split (mprotect): every page placed, a
/// page already there kept, zeros too.
#[test]
fn place_copy_and_place_zeros_cross_vma_boundaries() {
    let Some(p) = pair(&[], &[3]) else { return };
    let ps = attune_sys::page_size();
    // SAFETY: mprotect on our own mapping.
    assert_eq!(
        unsafe { libc::mprotect((p.dst + 7 * ps) as *mut libc::c_void, ps, libc::PROT_READ) },
        0
    );
    // The first half from the source (page 3 is already there: kept), the second zeros.
    let half = p.len / 2;
    assert_eq!(p.uffd.place_copy(p.dst, p.src, half, true), Ok(()));
    assert_eq!(p.uffd.place_zeros(p.dst + half, half, false), Ok(()));
    for page in 0..PAGES {
        let want = match page {
            3 => 1,
            p if p < PAGES / 2 => word(p),
            _ => 0,
        };
        assert_eq!(read(p.dst + page * ps), Some(want), "page {page}");
    }
    // A range that is not registered at all is still an error.
    let other = attune_sys::mem::map_anon(ps, false).unwrap();
    assert!(p.uffd.place_copy(other, p.src, ps, true).is_err());
    let _ = attune_sys::mem::unmap(other, ps);
}
