//! Fixed pools of runtime-owned buffers for the fault path (no allocation there).

use attune_sys::{mem, os};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Bytes of written-out pages a staging buffer keeps before one `MADV_DONTNEED` drops
/// them all. Dropping each staged run on its own cost a system call and a TLB flush per
/// eviction: 12% of a random-insert B-tree build's samples through the pool
/// (docs/benchmarks.md, "Staged pages dropped in batches"). The kept pages are the
/// runtime's own, outside the DRAM budget: at most this much per staging buffer in use.
pub const KEEP_BATCH: usize = 128 << 10;

/// Up to 64 buffers of `slot` bytes each, claimed with one atomic bitmask.
pub struct BufferPool {
    base: usize,
    slot: usize,
    count: usize,
    used: AtomicU64,
    /// Per buffer: bytes at its start that still hold pages [`Claimed::keep`] kept (only
    /// the buffer's claimant reads or writes its word).
    kept: [AtomicUsize; 64],
}

/// A claimed buffer; returned to the pool on drop.
pub struct Claimed<'a> {
    pool: &'a BufferPool,
    index: usize,
}

impl Claimed<'_> {
    pub fn addr(&self) -> usize {
        self.pool.base + self.index * self.pool.slot
    }

    /// The address of `len` bytes of the buffer that hold no page (a move's destination),
    /// after the pages [`Claimed::keep`] kept: those are dropped first when `len` would
    /// not fit after them. Signal-safe.
    pub fn fresh(&self, len: usize) -> usize {
        let k = self.pool.kept[self.index].load(Ordering::Relaxed);
        if k + len <= self.pool.slot {
            return self.addr() + k;
        }
        self.drop_kept();
        self.addr()
    }

    /// Keeps the `len` bytes [`Claimed::fresh`] gave, which the caller is done with: they
    /// are dropped with the others once [`KEEP_BATCH`] bytes are kept. Signal-safe.
    pub fn keep(&self, len: usize) {
        let w = &self.pool.kept[self.index];
        let k = w.load(Ordering::Relaxed) + len;
        w.store(k, Ordering::Relaxed);
        if k >= KEEP_BATCH {
            self.drop_kept();
        }
    }

    fn drop_kept(&self) {
        let w = &self.pool.kept[self.index];
        let k = w.load(Ordering::Relaxed);
        if k > 0 {
            let _ = mem::advise(self.addr(), k, mem::MADV_DONTNEED);
            w.store(0, Ordering::Relaxed);
        }
    }
}

impl Drop for Claimed<'_> {
    fn drop(&mut self) {
        self.pool
            .used
            .fetch_and(!(1u64 << self.index), Ordering::Release);
    }
}

impl BufferPool {
    pub fn new(count: usize, slot: usize) -> Result<BufferPool, attune_sys::Errno> {
        let count = count.clamp(1, 64);
        let base = mem::map_anon_aligned(count * slot, 2 << 20, true)?;
        // Inherited by a forked child (staging must be at the same address there).
        let _ = mem::advise(base, count * slot, mem::MADV_NOHUGEPAGE);
        Ok(BufferPool {
            base,
            slot,
            count,
            used: AtomicU64::new(0),
            kept: std::array::from_fn(|_| AtomicUsize::new(0)),
        })
    }

    pub fn base(&self) -> usize {
        self.base
    }
    pub fn len(&self) -> usize {
        self.count * self.slot
    }
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }
    pub fn contains(&self, addr: usize) -> bool {
        addr >= self.base && addr < self.base + self.len()
    }

    /// Drops the pages every buffer nobody holds now still keeps (an idle process keeps
    /// none for long: the evictor calls this each tick).
    pub fn drop_kept(&self) {
        for i in 0..self.count {
            if self.kept[i].load(Ordering::Relaxed) == 0 {
                continue;
            }
            let cur = self.used.load(Ordering::Acquire);
            if cur & (1 << i) == 0
                && self
                    .used
                    .compare_exchange(cur, cur | (1 << i), Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
            {
                Claimed {
                    pool: self,
                    index: i,
                }
                .drop_kept();
            }
        }
    }

    /// Bytes of pages the buffers keep now (the tests' view; nothing else needs it).
    #[cfg(test)]
    pub fn kept_bytes(&self) -> usize {
        self.kept.iter().map(|k| k.load(Ordering::Relaxed)).sum()
    }

    /// Claims a buffer of at least `len` bytes, yielding while all are busy (bounded).
    /// Signal-safe.
    pub fn claim(&self, len: usize) -> Option<Claimed<'_>> {
        if len > self.slot {
            return None;
        }
        for _ in 0..100_000 {
            let cur = self.used.load(Ordering::Acquire);
            let free = !cur
                & if self.count == 64 {
                    u64::MAX
                } else {
                    (1u64 << self.count) - 1
                };
            if free == 0 {
                os::yield_now();
                continue;
            }
            let i = free.trailing_zeros() as usize;
            if self
                .used
                .compare_exchange(cur, cur | (1 << i), Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                return Some(Claimed {
                    pool: self,
                    index: i,
                });
            }
        }
        None
    }
}

impl Drop for BufferPool {
    fn drop(&mut self) {
        let _ = mem::unmap(self.base, self.len());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PS: usize = 4096;

    fn touch(addr: usize, len: usize) {
        for a in (addr..addr + len).step_by(PS) {
            mem::store_u8(a, 1);
        }
    }

    #[test]
    fn a_staging_buffer_keeps_written_pages_until_a_batch_and_then_drops_them_all() {
        let pool = BufferPool::new(2, 2 << 20).unwrap();
        let slot = pool.claim(PS).unwrap();
        let base = slot.addr();
        let mut at = base;
        // Pages kept below the batch stay present; each fresh range follows them.
        for _ in 0..KEEP_BATCH / PS - 1 {
            let f = slot.fresh(PS);
            assert_eq!(f, at, "fresh pages follow the kept ones");
            assert!(!mem::page_present(f), "a fresh page holds nothing");
            touch(f, PS);
            slot.keep(PS);
            at += PS;
        }
        assert_eq!(pool.kept_bytes(), KEEP_BATCH - PS);
        assert_eq!(
            mem::resident_pages(base, KEEP_BATCH).unwrap(),
            KEEP_BATCH / PS - 1
        );
        // The batch's last page: all of them go, in one call.
        let f = slot.fresh(PS);
        touch(f, PS);
        slot.keep(PS);
        assert_eq!(pool.kept_bytes(), 0);
        assert_eq!(mem::resident_pages(base, KEEP_BATCH).unwrap(), 0);
        assert_eq!(mem::load_u8(base), 0, "a dropped page reads as zero");
        assert_eq!(slot.fresh(PS), base);
    }

    #[test]
    fn a_run_that_does_not_fit_after_the_kept_pages_drops_them_first() {
        let pool = BufferPool::new(1, 256 << 10).unwrap();
        let slot = pool.claim(PS).unwrap();
        let f = slot.fresh(64 << 10);
        touch(f, 64 << 10);
        slot.keep(64 << 10);
        let g = slot.fresh(32 << 10);
        assert_eq!(g, f + (64 << 10));
        touch(g, 32 << 10);
        slot.keep(32 << 10);
        // 96 KiB kept: 192 KiB more does not fit in the 256 KiB buffer.
        let h = slot.fresh(192 << 10);
        assert_eq!(h, slot.addr());
        assert_eq!(mem::resident_pages(slot.addr(), 256 << 10).unwrap(), 0);
    }

    #[test]
    fn the_evictors_tick_drops_what_idle_buffers_keep_and_leaves_held_ones() {
        let pool = BufferPool::new(2, 2 << 20).unwrap();
        let held = pool.claim(PS).unwrap();
        {
            let idle = pool.claim(PS).unwrap();
            let f = idle.fresh(PS);
            touch(f, PS);
            idle.keep(PS);
        }
        let f = held.fresh(PS);
        touch(f, PS);
        held.keep(PS);
        assert_eq!(pool.kept_bytes(), 2 * PS);
        pool.drop_kept();
        // The held buffer's claimant may be using its pages: they stay.
        assert_eq!(pool.kept_bytes(), PS);
        assert!(mem::page_present(f));
        drop(held);
        pool.drop_kept();
        assert_eq!(pool.kept_bytes(), 0);
        assert!(!mem::page_present(f));
    }
}
