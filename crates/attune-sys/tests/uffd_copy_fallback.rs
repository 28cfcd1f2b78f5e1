//! `Uffd::move_pages` without `UFFDIO_MOVE` (Linux before 6.8, or `-move` masked): the
//! same contract by copy and drop. Real userfaultfd and page tables; the mask is set for
//! this test binary only (a process-wide word, so this file is its own process).
//!
//! Covered: a full move, holes skipped or refused, a page swapped out by the kernel (data,
//! not a hole: mincore cannot tell them apart, pagemap can), a run across a protection
//! change (one UFFDIO_COPY fills one VMA), and a destination page already there.

use attune_sys::uffd::{feature, mode, Delivery, Uffd};
use attune_sys::{kernel, mem, Errno};

const PAGES: usize = 16;

struct Pair {
    uffd: Uffd,
    src: usize,
    dst: usize,
    len: usize,
}

impl Drop for Pair {
    fn drop(&mut self) {
        let _ = mem::unmap(self.src, self.len);
        let _ = mem::unmap(self.dst, self.len);
    }
}

fn word(page: usize) -> u64 {
    0xC0FF_0000_0000_0000 | page as u64
}

fn pair(holes: &[usize], dst_filled: &[usize]) -> Option<Pair> {
    kernel::set_mask(kernel::MOVE | kernel::POISON);
    let ps = attune_sys::page_size();
    let len = PAGES * ps;
    let uffd = match Uffd::open(Delivery::Thread, 0) {
        Ok(u) => u,
        Err(e) => {
            eprintln!("skipped: userfaultfd not available ({:?})", e.errno);
            return None;
        }
    };
    assert!(!uffd.has(feature::MOVE), "the mask hides UFFDIO_MOVE");
    let src = mem::map_anon(len, false).expect("map src");
    let dst = mem::map_anon(len, false).expect("map dst");
    for p in 0..PAGES {
        if !holes.contains(&p) {
            // SAFETY: src is a fresh private mapping of PAGES pages, not yet registered.
            unsafe { *((src + p * ps) as *mut u64) = word(p) };
        }
    }
    for &p in dst_filled {
        // SAFETY: as above, for dst.
        unsafe { *((dst + p * ps) as *mut u64) = 1 };
    }
    uffd.register(dst, len, mode::MISSING)
        .expect("register dst");
    Some(Pair {
        uffd,
        src,
        dst,
        len,
    })
}

fn read(a: usize) -> Option<u64> {
    // SAFETY: read only when mincore says the page is mapped (no fault is raised).
    mem::page_present(a).then(|| unsafe { *(a as *const u64) })
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
