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
            // A page could not move (EBUSY: pinned by the kernel for I/O). Put back what
            // moved so the caller sees all-or-nothing, and report busy.
            let _ = region_uffd.move_pages(src, self.base + off as usize, moved, true, false);
            return Err(attune_sys::Errno(libc::EBUSY));
        }
        Ok(())
    }

    pub fn load(&self, region_uffd: &Uffd, dst: usize, off: u64, len: usize) -> SysResult<()> {
        self.emulate(len);
        let src = self.base + off as usize;
        let busy = |r: SysResult<usize>| match r {
            Ok(n) => Ok(n),
            Err(attune_sys::Errno(libc::EBUSY)) => Ok(0),
            Err(e) => Err(e),
        };
        let mut done = busy(region_uffd.move_pages(dst, src, len, true, true))?;
        if done < len {
            // Pages a fork left shared with another process (copy-on-write) cannot be
            // moved: copy the rest of the run in one go (placing missing pages needs no
            // TLB flush, a copy-on-write break per page does: measured 60% of a forked
            // child's time in shootdowns), then drop the arena's references at once.
            let rest = len - done;
            match region_uffd.copy(dst + done, src + done, rest, true) {
                Ok(_) | Err(attune_sys::Errno(libc::EEXIST)) => {
                    let _ = mem::advise(src + done, rest, mem::MADV_DONTNEED);
                    done = len;
                }
                Err(_) => {}
            }
        }
        let ps = attune_sys::page_size();
        while done < len {
            // A hole in the arena (the application had discarded the page) stops the copy:
            // page by page, holes skipped by the move, shared pages copied.
            match busy(region_uffd.move_pages(dst + done, src + done, ps, true, true))? {
                0 => match region_uffd.copy(dst + done, src + done, ps, true) {
                    Ok(_) | Err(attune_sys::Errno(libc::EEXIST)) => {
                        let _ = mem::advise(src + done, ps, mem::MADV_DONTNEED);
                    }
                    Err(e) => return Err(e),
                },
                _ => {}
            }
            done += ps;
        }
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
