//! Un-sharing after a fork: pages a fork left shared copy-on-write cannot be taken by
//! `UFFDIO_MOVE` (EBUSY), so an eviction that meets one marks its chunk `SHARED` and the
//! evictor copies it here before trying again (the fork protocol is in `crate::fork`).

use super::Pager;
use crate::region::{Where, SHARED};
use std::sync::atomic::Ordering::*;

/// Un-shares chunks whose eviction met pages a fork left shared (the evictor thread, no
/// gate and no lock held: a hole in the range faults into the fault path, which must be
/// free to run). Returns the chunks handled.
pub(crate) fn unshare_pass(e: &Pager) -> usize {
    if e.unshare_pending.swap(0, AcqRel) == 0 {
        return 0;
    }
    let regions: Vec<_> = {
        let _in = e.enter();
        e.regions.read().unwrap_or_else(|p| p.into_inner()).clone()
    };
    let ps = attune_sys::page_size();
    let mut done = 0;
    for r in &regions {
        for c in 0..r.chunks() {
            let s = r.state(c);
            if s.0 & SHARED == 0 {
                continue;
            }
            if s.place() == Where::Resident && !r.freed.load(Acquire) {
                let a = r.chunk_addr(c);
                // A write fault per page: copied if the other process still maps it,
                // taken back as exclusive if not. A hole (the application discarded a
                // page) is refused by signal-delivery regions: go on page by page.
                if attune_sys::mem::advise(a, r.chunk, attune_sys::mem::MADV_POPULATE_WRITE)
                    .is_err()
                {
                    let mut p = a;
                    while p < a + r.chunk {
                        let _ =
                            attune_sys::mem::advise(p, ps, attune_sys::mem::MADV_POPULATE_WRITE);
                        p += ps;
                    }
                }
            }
            r.set_bits(c, 0, SHARED);
            done += 1;
        }
    }
    e.counters.unshared.fetch_add(done as u64, Relaxed);
    done
}
