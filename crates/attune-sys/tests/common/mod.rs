//! A source and a destination range for the page-moving tests (`uffd_move.rs`,
//! `uffd_copy_fallback.rs`): real userfaultfd, real page tables. No page of a registered
//! range is touched unless mincore says it is there (no handler thread serves faults).

use attune_sys::mem;
use attune_sys::uffd::{mode, Delivery, Uffd};

pub const PAGES: usize = 16;

pub struct Pair {
    pub uffd: Uffd,
    pub src: usize,
    pub dst: usize,
    pub len: usize,
}

impl Drop for Pair {
    fn drop(&mut self) {
        let _ = mem::unmap(self.src, self.len);
        let _ = mem::unmap(self.dst, self.len);
    }
}

/// What page `page` of the source holds (tagged with `tag`).
pub fn word(tag: u64, page: usize) -> u64 {
    tag << 48 | page as u64
}

/// Source pages filled with `word(tag, page)` except `holes`; `dst_filled` destination
/// pages written before registration (a real conflict). The destination is registered,
/// the source too with `register_src`. None when userfaultfd is not available.
pub fn pair(tag: u64, holes: &[usize], dst_filled: &[usize], register_src: bool) -> Option<Pair> {
    let ps = attune_sys::page_size();
    let len = PAGES * ps;
    let uffd = match Uffd::open(Delivery::Thread, 0) {
        Ok(u) => u,
        Err(e) => {
            eprintln!("skipped: userfaultfd not available ({:?})", e.errno);
            return None;
        }
    };
    let src = mem::map_anon(len, false).expect("map src");
    let dst = mem::map_anon(len, false).expect("map dst");
    for p in 0..PAGES {
        if !holes.contains(&p) {
            // SAFETY: src is a fresh private mapping of PAGES pages, not yet registered.
            unsafe { *((src + p * ps) as *mut u64) = word(tag, p) };
        }
    }
    for &p in dst_filled {
        // SAFETY: as above, for dst.
        unsafe { *((dst + p * ps) as *mut u64) = 1 };
    }
    if register_src {
        uffd.register(src, len, mode::MISSING)
            .expect("register src");
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

/// The first word of the page at `a`, if the page is mapped (read without a fault).
pub fn read(a: usize) -> Option<u64> {
    // SAFETY: read only when mincore says the page is mapped (no fault is raised).
    mem::page_present(a).then(|| unsafe { *(a as *const u64) })
}
