//! Fixed pools of runtime-owned buffers for the fault path (no allocation there).

use attune_sys::{mem, os};
use std::sync::atomic::{AtomicU64, Ordering};

/// Up to 64 buffers of `slot` bytes each, claimed with one atomic bitmask.
pub struct BufferPool {
    base: usize,
    slot: usize,
    count: usize,
    used: AtomicU64,
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
