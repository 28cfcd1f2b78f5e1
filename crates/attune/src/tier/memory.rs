//! The `memory` tier: far memory held on this node (emulates CXL or a memory pool).
//!
//! Its pages live in one large private anonymous arena registered with the engine's
//! internal userfaultfd. Eviction moves a region's page table entries into the arena
//! (`UFFDIO_MOVE`: no byte copied; taking a page from a running program costs a TLB
//! flush whatever we do). A fetch *copies* the slot into the region (`UFFDIO_COPY`):
//! placing a page where none is mapped needs no flush, where moving it out of the arena
//! needed one a fetch, half of all cycles under random faults (docs/benchmarks.md). The
//! copied-out slot ranges are released later, many with one `process_madvise` (one flush
//! a batch). A slot must be empty before the next store moves pages into it, so
//! its `store` releases the waiting ranges when one overlaps its slot; ranges
//! wait in a fixed array (the fault path allocates nothing). Optional emulated delay and bandwidth cap
//! make the tier model a slower medium.

use crate::config::TierConfig;
use attune_sys::uffd::{mode, Uffd};
use attune_sys::{mem, os, SysResult};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Mutex;

/// Most slot ranges, and bytes, that wait for release: a random-fault workload releases
/// 64 pages with one flush; read-ahead runs (up to 2 MiB) are released a few at a time,
/// so the arena holds at most a few MiB of copied-out pages.
const RELEASE_RANGES: usize = mem::DONTNEED_BATCH;
const RELEASE_BYTES: usize = 4 << 20;
/// Longest run a fetch copies; longer runs move (the copy costs more than the flush).
const COPY_MAX: usize = 64 << 10;

/// Slot ranges whose content a fetch copied out, waiting to be dropped.
struct Pending {
    n: usize,
    bytes: usize,
    ranges: [(usize, usize); RELEASE_RANGES],
}

pub struct MemoryTier {
    base: usize,
    len: usize,
    delay_ns: u64,
    bandwidth: u64,
    /// Earliest time the emulated link is free (bandwidth cap).
    link_free_at: AtomicU64,
    pending: Mutex<Pending>,
    /// `pending.n`, readable without the lock (a store skips the lock when nothing waits).
    waiting: AtomicUsize,
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
            pending: Mutex::new(Pending {
                n: 0,
                bytes: 0,
                ranges: [(0, 0); RELEASE_RANGES],
            }),
            waiting: AtomicUsize::new(0),
        })
    }

    /// Queues a copied-out slot range for release; releases the queue when it is full.
    /// Signal-safe: never waits for the lock (a thread that finds it taken, perhaps by
    /// itself in an interrupted frame, releases its range at once).
    fn release_later(&self, addr: usize, len: usize) {
        let Ok(mut p) = self.pending.try_lock() else {
            let _ = mem::advise(addr, len, mem::MADV_DONTNEED);
            return;
        };
        // Never full here: the push that fills the queue releases it below.
        let n = p.n;
        p.ranges[n] = (addr, len);
        p.n += 1;
        p.bytes += len;
        self.waiting.store(p.n, Relaxed);
        if p.n == RELEASE_RANGES || p.bytes >= RELEASE_BYTES {
            Self::release(&mut p, &self.waiting);
        }
    }

    /// Releases every waiting range (one TLB flush). When it returns, no range queued
    /// before the call is still mapped.
    pub fn release_pending(&self) {
        self.release_if(|_| true);
    }

    /// Releases the waiting ranges if one of them overlaps `[addr, addr+len)`: what a
    /// store needs of its slot. Releasing the queue before every store had made the batch
    /// one range long when every fault evicts one chunk for itself (signal delivery): a
    /// `process_madvise` a fault.
    fn release_if_overlapping(&self, addr: usize, len: usize) {
        let end = addr + len;
        self.release_if(|&(a, l)| a < end && addr < a + l);
    }

    /// Releases every waiting range if any satisfies `needed`. Signal-safe: blocks
    /// signals while it holds the lock, so no handler of this thread can wait for it.
    fn release_if(&self, needed: impl Fn(&(usize, usize)) -> bool) {
        if self.waiting.load(Relaxed) == 0 {
            return;
        }
        let _g = os::SignalGuard::new();
        let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        if p.ranges[..p.n].iter().any(needed) {
            Self::release(&mut p, &self.waiting);
        }
    }

    fn release(p: &mut Pending, waiting: &AtomicUsize) {
        mem::dontneed_ranges(&p.ranges[..p.n]);
        p.n = 0;
        p.bytes = 0;
        waiting.store(0, Relaxed);
    }

    /// Places `[src, src+len)` of the arena at `dst` (missing in the region). One copy of
    /// the run: placing missing pages needs no TLB flush (and the pages may be shared
    /// with a forked child, which a move refuses). A page the application had discarded
    /// is a hole in the arena and stops the copy after the pages before it: then page by
    /// page, the move skipping holes (they read as zero, as discarded pages do), pages
    /// copied, pages the partial copy placed kept. The slot keeps its content; the caller
    /// releases it.
    fn copy_out(&self, region_uffd: &Uffd, dst: usize, src: usize, len: usize) -> SysResult<()> {
        use attune_sys::Errno;
        let placed = |r: SysResult<usize>| matches!(r, Ok(_) | Err(Errno(libc::EEXIST)));
        if !placed(region_uffd.copy(dst, src, len, false)) {
            let ps = attune_sys::page_size();
            let mut off = 0;
            while off < len {
                match region_uffd.move_pages(dst + off, src + off, ps, true, false) {
                    Ok(n) if n > 0 => {}
                    Err(Errno(libc::EEXIST)) => {}
                    Ok(_) | Err(Errno(libc::EBUSY | libc::EINVAL)) => {
                        let r = region_uffd.copy(dst + off, src + off, ps, false);
                        if !placed(r) {
                            return r.map(|_| ());
                        }
                    }
                    Err(e) => return Err(e),
                }
                off += ps;
            }
        }
        Ok(())
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

impl super::Medium for MemoryTier {
    fn store(
        &self,
        io: &super::IoContext,
        region_uffd: &Uffd,
        src: usize,
        off: u64,
        len: usize,
        _dirty: &mut dyn FnMut(usize, bool) -> super::Staged,
    ) -> SysResult<()> {
        debug_assert!(off as usize + len <= self.len);
        // The slot may still hold what a fetch copied out: it must be empty, or the move
        // would fail, and its accounting (`Uffd::move_pages` reads progress from the
        // pages) would count stale pages as moved ones. The fetch queued its range before
        // it published the chunk resident, and the caller claimed the chunk after that;
        // a freed region's ranges are in the queue until released too, so an overlap test
        // finds whatever could still be mapped in this slot.
        self.release_if_overlapping(self.base + off as usize, len);
        let (moved, _) =
            super::take_out(io.internal, region_uffd, self.base + off as usize, src, len)?;
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
                libc::ENOTRECOVERABLE
            }));
        }
        Ok(())
    }

    fn load(
        &self,
        _io: &super::IoContext,
        region_uffd: &Uffd,
        dst: usize,
        off: u64,
        len: usize,
        _seen: &mut dyn FnMut(usize) -> bool,
    ) -> SysResult<()> {
        self.emulate(len);
        let src = self.base + off as usize;
        if len > COPY_MAX {
            // A long run (read-ahead, large chunks): one move and its one flush cost less
            // than copying the bytes (sequential pass 4.3 GB/s moving, 2.2 copying).
            // EINVAL: the program changed the region's protection (mprotect), and a move
            // needs the same on both sides; a copy places pages under any protection.
            let done = match region_uffd.move_pages(dst, src, len, true, false) {
                Ok(n) => n,
                Err(attune_sys::Errno(libc::EBUSY | libc::EINVAL)) => 0,
                Err(e) => return Err(e),
            };
            if done < len {
                // Shared with a forked child, or holes: copied, then released at once.
                self.copy_out(region_uffd, dst + done, src + done, len - done)?;
                let _ = mem::advise(src + done, len - done, mem::MADV_DONTNEED);
            }
            return Ok(());
        }
        self.copy_out(region_uffd, dst, src, len)?;
        // Only after every page is placed: on an error the slot keeps the data, the chunk
        // goes back to far, and the next fetch copies again.
        self.release_later(src, len);
        Ok(())
    }

    fn discard(&self, off: u64, len: usize) {
        let _ = mem::advise(self.base + off as usize, len, mem::MADV_DONTNEED);
    }

    fn keeps_copy(&self) -> bool {
        false
    }

    fn is_node_memory(&self) -> bool {
        true
    }

    fn release_pending(&self) {
        MemoryTier::release_pending(self)
    }

    /// Before a fork: nothing waits for release (the child starts with an empty queue
    /// and its own pidfd, see `mem::dontneed_ranges`).
    fn prepare_fork(&self, _: &TierConfig, _: bool, _: usize, _: usize) -> Result<bool, String> {
        self.release_pending();
        Ok(true)
    }

    /// In a forked child: registers the inherited arena with the child's userfaultfd.
    fn reopen_in_child(&self, internal: &Uffd) -> Result<(), String> {
        internal
            .register(self.base, self.len, mode::MISSING)
            .map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{TierConfig, TierKind};
    use attune_sys::uffd::Delivery;

    fn tier() -> (MemoryTier, Uffd) {
        let uffd = Uffd::open(Delivery::Thread, 0).expect("userfaultfd");
        let cfg = TierConfig {
            name: "t".into(),
            kind: TierKind::Memory,
            capacity: 4 << 20,
            path: None,
            direct: false,
            latency_ns: 0,
            bandwidth: 0,
            emulate_delay_ns: 0,
            emulate_bandwidth: 0,
            min_chunk: 4096,
            node: None,
            servers: String::new(),
            secret_file: None,
            provider: "tcp".into(),
            timeout_ms: 5000,
            replicas: 1,
            rehome_ms: 0,
            concurrency: 8,
            ahead: 0,
        };
        let t = MemoryTier::new(&cfg, 4 << 20, &uffd).expect("tier");
        (t, uffd)
    }

    /// A slot range as a fetch leaves it: copied out, still mapped, queued for release.
    fn queue(t: &MemoryTier, uffd: &Uffd, page: usize) -> usize {
        let buf = [7u8; 4096];
        let a = t.base + page * 4096;
        uffd.copy(a, buf.as_ptr() as usize, 4096, false)
            .expect("place");
        t.release_later(a, 4096);
        a
    }

    #[test]
    fn a_store_releases_the_queue_only_when_its_slot_overlaps_a_queued_range() {
        let (t, uffd) = tier();
        let (a, b) = (queue(&t, &uffd, 3), queue(&t, &uffd, 10));
        // A slot elsewhere: nothing released, both ranges still mapped and waiting.
        t.release_if_overlapping(t.base + 5 * 4096, 4 * 4096);
        assert_eq!(t.waiting.load(Relaxed), 2);
        assert_eq!(
            mem::resident_pages(a, 4096).unwrap() + mem::resident_pages(b, 4096).unwrap(),
            2
        );
        // A slot that ends on b's page: the whole queue goes (one batch).
        t.release_if_overlapping(t.base + 8 * 4096, 3 * 4096);
        assert_eq!(t.waiting.load(Relaxed), 0);
        assert_eq!(
            mem::resident_pages(a, 4096).unwrap() + mem::resident_pages(b, 4096).unwrap(),
            0
        );
        // Adjacent but not overlapping: kept.
        let c = queue(&t, &uffd, 20);
        t.release_if_overlapping(t.base + 21 * 4096, 4096);
        t.release_if_overlapping(t.base + 19 * 4096, 4096);
        assert_eq!(mem::resident_pages(c, 4096).unwrap(), 1);
        t.release_pending();
        assert_eq!(mem::resident_pages(c, 4096).unwrap(), 0);
    }
}
