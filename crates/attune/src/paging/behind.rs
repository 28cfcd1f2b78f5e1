//! The drop-behind ring: runs of chunks streams have just passed, the first victims of a
//! reclaim (`evict.rs` takes them, the fault path pushes them).

use crate::region::Region;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::*};

/// Entries of the drop-behind ring: about the last 256 runs streams passed.
pub(super) const BEHIND: usize = 256;

/// Runs of chunks that streams (BW regions faulting sequentially) have just passed:
/// `attune_policy::stream` says why they are the best victims. The fault path pushes, a
/// reclaim (evictor or direct, under the clock lock) takes the newest first. Lock-free
/// and signal-safe: an entry is a chunk address with the run's chunk count in its low 12
/// bits (chunks are 4 KiB-aligned, a run is at most 512 chunks), 0 when empty; a full
/// ring overwrites its oldest entries. An entry names memory, not a region: a reclaim
/// looks the region up and checks each chunk's state, so a stale entry (freed region,
/// chunk gone or touched again and active) is skipped.
pub struct DropBehind {
    pub(super) ring: [AtomicU64; BEHIND],
    pub(super) head: AtomicUsize,
    /// `head` when a reclaim last found the ring empty: equal to `head` means nothing was
    /// pushed since, and a reclaim skips the ring (a process without streams, whose
    /// faults each reclaim under signal delivery, must not pay a scan of 256 entries).
    pub(super) empty_at: AtomicUsize,
}

impl DropBehind {
    pub fn new() -> DropBehind {
        DropBehind {
            ring: [const { AtomicU64::new(0) }; BEHIND],
            head: AtomicUsize::new(0),
            empty_at: AtomicUsize::new(0),
        }
    }

    /// Marks chunks `[c, c+n)` of `r` as first victims.
    pub fn push(&self, r: &Region, c: usize, n: usize) {
        let n = n.min(r.chunks() - c.min(r.chunks())).min(0xfff);
        if n == 0 {
            return;
        }
        let i = self.head.fetch_add(1, Relaxed) % BEHIND;
        self.ring[i].store(r.chunk_addr(c) as u64 | n as u64, Release);
    }

    /// Forgets the entries inside `[base, base+len)` (a region being freed: its address
    /// range may be mapped again for a new region, whose chunks no stream passed).
    pub fn forget(&self, base: usize, len: usize) {
        for e in &self.ring {
            let v = e.load(Acquire);
            let a = (v & !0xfff) as usize;
            if v != 0 && a >= base && a < base + len {
                let _ = e.compare_exchange(v, 0, AcqRel, Relaxed);
            }
        }
    }
}

impl Default for DropBehind {
    fn default() -> Self {
        Self::new()
    }
}
