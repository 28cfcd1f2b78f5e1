//! The `memory` tier: far memory held on this node (emulates CXL or a memory pool).
//!
//! Its pages live in one large private anonymous arena registered with the engine's
//! internal userfaultfd, so both directions are `UFFDIO_MOVE`: eviction moves a region's
//! page table entries into the arena and a fetch moves them back. No byte is copied;
//! the cost is the page-table work (about 0.1 us a page in batches). Optional emulated
//! delay and bandwidth cap make it model a slower medium.

use crate::config::TierConfig;
use attune_sys::uffd::{mode, Uffd};
use attune_sys::{mem, os, SysResult};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

pub struct MemoryTier {
    base: usize,
    len: usize,
    delay_ns: u64,
    bandwidth: u64,
    /// Earliest time the emulated link is free (bandwidth cap).
    link_free_at: AtomicU64,
}

impl MemoryTier {
    pub fn new(cfg: &TierConfig, space: u64, internal: &Uffd) -> Result<MemoryTier, String> {
        let len = (space.max(2 << 20) as usize).div_ceil(2 << 20) * (2 << 20);
        let base = mem::map_anon_aligned(len, 2 << 20, true)
            .map_err(|e| format!("tier '{}': cannot reserve {len} bytes: {e}", cfg.name))?;
        // Inherited by a forked child (copy-on-write): its far chunks are there.
        let _ = mem::advise(base, len, mem::MADV_NOHUGEPAGE);
        internal
            .register(base, len, mode::MISSING)
            .map_err(|e| format!("tier '{}': cannot register with userfaultfd: {e}", cfg.name))?;
        Ok(MemoryTier {
            base,
            len,
            delay_ns: cfg.emulate_delay_ns,
            bandwidth: cfg.emulate_bandwidth,
            link_free_at: AtomicU64::new(0),
        })
    }

    pub fn store(
        &self,
        io: &super::IoContext,
        region_uffd: &Uffd,
        src: usize,
        off: u64,
        len: usize,
    ) -> SysResult<()> {
        debug_assert!(off as usize + len <= self.len);
        let moved = io
            .internal
            .move_pages(self.base + off as usize, src, len, true, false)?;
        if moved < len {
            // A page could not move (EBUSY: shared since a fork, or pinned by the kernel
            // for I/O). Put back what moved so the caller sees all-or-nothing, and report
            // busy; the slot is emptied for its next store.
            let slot = self.base + off as usize;
            let back = super::give_back(region_uffd, src, slot, moved);
            let _ = mem::advise(slot, moved, mem::MADV_DONTNEED);
            return Err(attune_sys::Errno(if back {
                libc::EBUSY
            } else {
                libc::EIO
            }));
        }
        Ok(())
    }

    pub fn load(&self, region_uffd: &Uffd, dst: usize, off: u64, len: usize) -> SysResult<()> {
        self.emulate(len);
        let src = self.base + off as usize;
        let done = match region_uffd.move_pages(dst, src, len, true, true) {
            Ok(n) => n,
            Err(attune_sys::Errno(libc::EBUSY)) => 0,
            Err(e) => return Err(e),
        };
        if done < len {
            self.copy_shared(region_uffd, dst + done, src + done, len - done)?;
        }
        Ok(())
    }

    /// Places `[src, src+len)` of the arena at `dst` when the pages are shared with another
    /// process since a fork (`UFFDIO_MOVE` refuses them). One copy of the run: placing
    /// missing pages needs no TLB flush, a copy-on-write break per page does (measured 60%
    /// of a forked child's time in shootdowns). A page the application had discarded is a
    /// hole in the arena and stops the copy after the pages before it: then page by page,
    /// the move skipping holes (they read as zero, as discarded pages do), shared pages
    /// copied, pages the partial copy placed kept. The arena's range is dropped at the end:
    /// the slot must be empty for its next store.
    fn copy_shared(&self, region_uffd: &Uffd, dst: usize, src: usize, len: usize) -> SysResult<()> {
        use attune_sys::Errno;
        let placed = |r: SysResult<usize>| matches!(r, Ok(_) | Err(Errno(libc::EEXIST)));
        if !placed(region_uffd.copy(dst, src, len, true)) {
            let ps = attune_sys::page_size();
            let mut off = 0;
            while off < len {
                match region_uffd.move_pages(dst + off, src + off, ps, true, true) {
                    Ok(n) if n > 0 => {}
                    Err(Errno(libc::EEXIST)) => {}
                    Ok(_) | Err(Errno(libc::EBUSY)) => {
                        let r = region_uffd.copy(dst + off, src + off, ps, true);
                        if !placed(r) {
                            return r.map(|_| ());
                        }
                    }
                    Err(e) => return Err(e),
                }
                off += ps;
            }
        }
        let _ = mem::advise(src, len, mem::MADV_DONTNEED);
        Ok(())
    }

    /// In a forked child: registers the inherited arena with the child's userfaultfd.
    pub fn reattach(&self, internal: &Uffd) -> SysResult<()> {
        internal.register(self.base, self.len, mode::MISSING)
    }

    pub fn discard(&self, off: u64, len: usize) {
        let _ = mem::advise(self.base + off as usize, len, mem::MADV_DONTNEED);
    }

    fn emulate(&self, len: usize) {
        let mut wait_until = 0;
        if self.bandwidth > 0 {
            let dur = (len as u128 * 1_000_000_000 / self.bandwidth as u128) as u64;
            let now = os::now_ns();
            let start = self
                .link_free_at
                .fetch_update(Relaxed, Relaxed, |t| Some(t.max(now) + dur))
                .unwrap_or(now)
                .max(now);
            wait_until = start + dur;
        }
        let delay_end = if self.delay_ns > 0 {
            os::now_ns() + self.delay_ns
        } else {
            0
        };
        let end = wait_until.max(delay_end);
        if end > 0 {
            let now = os::now_ns();
            if end > now {
                os::spin_for_ns(end - now);
            }
        }
    }
}

impl Drop for MemoryTier {
    fn drop(&mut self) {
        let _ = mem::unmap(self.base, self.len);
    }
}
