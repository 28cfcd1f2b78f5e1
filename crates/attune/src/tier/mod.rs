//! Tiers: places where the pages of a region can live when they are not in DRAM.
//!
//! The DRAM tier is the budget of resident managed memory (accounted in the engine).
//! A far tier implements two signal-safe operations on whole runs of chunks:
//! [`FarTier::store`] takes pages out of a region (the region range becomes missing) and
//! [`FarTier::load`] places them back into a missing range. Slots are addressed by a byte
//! offset reserved per region at allocation ([`FarTier::reserve`]).

pub mod file;
pub mod memory;
pub mod slots;

use crate::config::{TierConfig, TierKind};
use attune_sys::uffd::Uffd;
use attune_sys::{Errno, SysResult};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;

/// Counters of one far tier.
#[derive(Default)]
pub struct TierCounters {
    pub stored: AtomicU64,
    /// Highest `stored` so far (reports).
    pub peak_stored: AtomicU64,
    pub loads: AtomicU64,
    pub stores: AtomicU64,
    pub bytes_in: AtomicU64,
    pub bytes_out: AtomicU64,
    pub errors: AtomicU64,
    /// Stores refused because the medium was full (ENOSPC).
    pub full: AtomicU64,
}

enum Backend {
    Memory(memory::MemoryTier),
    File(file::FileTier),
}

/// A far tier with its offset space and counters.
pub struct FarTier {
    pub cfg: TierConfig,
    pub index: usize,
    backend: Backend,
    space: Mutex<slots::FreeList>,
    pub counters: TierCounters,
    /// After the medium reported ENOSPC, stores are refused until this time (ns) so that
    /// a full disk costs one failed write per interval, not one per eviction.
    full_until: AtomicU64,
    /// The node daemon's grant of far memory for this tier (u64::MAX: none); the tier
    /// holds at most the lower of it and its configured capacity.
    granted: AtomicU64,
}

/// How long a tier whose medium is full is left alone.
const FULL_BACKOFF_NS: u64 = 200_000_000;

/// Shared buffers the tiers use on the fault path (owned by the engine).
pub struct IoContext<'a> {
    /// The internal userfaultfd that the memory arena and staging are registered with.
    pub internal: &'a Uffd,
    pub staging: &'a crate::pool::BufferPool,
    pub bounce: &'a crate::pool::BufferPool,
}

impl FarTier {
    /// Opens a tier. `space` is the size of its offset space (the most bytes that regions
    /// may reserve in it at once).
    pub fn open(
        cfg: TierConfig,
        index: usize,
        space: u64,
        internal: &Uffd,
    ) -> Result<FarTier, String> {
        let backend = match cfg.kind {
            TierKind::Memory => Backend::Memory(memory::MemoryTier::new(&cfg, space, internal)?),
            TierKind::File => Backend::File(file::FileTier::new(&cfg)?),
            TierKind::Numa => {
                return Err(format!(
                    "tier '{}': NUMA tiers keep pages mapped and are placed by crate::numa",
                    cfg.name
                ))
            }
            TierKind::Dram => return Err("the DRAM tier is implicit".into()),
        };
        Ok(FarTier {
            cfg,
            index,
            backend,
            space: Mutex::new(slots::FreeList::new(space)),
            counters: TierCounters::default(),
            full_until: AtomicU64::new(0),
            granted: AtomicU64::new(u64::MAX),
        })
    }

    pub fn name(&self) -> &str {
        &self.cfg.name
    }

    /// Whether stored content survives a load (a file keeps its blocks; a memory slot is
    /// emptied by the move), so that identical content need not be written again.
    pub fn keeps_copy(&self) -> bool {
        matches!(self.backend, Backend::File(_))
    }

    /// Whether the fault engine can store pages here (every far tier it opens can; NUMA
    /// tiers are not far tiers of the fault engine).
    pub fn is_pageable(&self) -> bool {
        true
    }

    /// Whether a store could succeed now (capacity left, medium not known to be full).
    pub fn accepts(&self, len: u64) -> bool {
        self.is_pageable()
            && self.free_bytes() >= len
            && attune_sys::os::now_ns() >= self.full_until.load(Relaxed)
    }

    /// Bytes free on the tier by its capacity now.
    pub fn free_bytes(&self) -> u64 {
        self.capacity()
            .saturating_sub(self.counters.stored.load(Relaxed))
    }

    /// What the tier may hold now: its configured capacity, or less if the node daemon
    /// granted less. Over it, new stores go to the next tier; what is stored stays until
    /// it is fetched (nothing is lost, the tier drains as the program runs).
    pub fn capacity(&self) -> u64 {
        self.cfg.capacity.min(self.granted.load(Relaxed))
    }

    /// Sets (or with None lifts) the daemon's grant for this tier.
    pub fn set_grant(&self, bytes: Option<u64>) {
        self.granted.store(bytes.unwrap_or(u64::MAX), Relaxed);
    }

    /// Whether the tier is node memory (the daemon divides it among workflows).
    pub fn is_memory(&self) -> bool {
        matches!(self.backend, Backend::Memory(_))
    }

    /// Bytes stored now.
    pub fn used(&self) -> u64 {
        self.counters.stored.load(Relaxed)
    }

    /// Reserves offset space for a region of `len` bytes (not on the fault path).
    pub fn reserve(&self, len: u64) -> Option<u64> {
        self.space
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .alloc(len)
    }

    /// Returns a region's offset space and frees what it stored there.
    pub fn release(&self, base: u64, len: u64) {
        self.discard(base, len as usize);
        self.free_space(base, len);
    }

    /// Returns offset space to the free list (its content already discarded). For a
    /// freed region only once no fetch of it is in flight: a fetch from the memory tier
    /// queues its slot for release after it copied, and that release must not reach a
    /// new owner's data.
    pub fn free_space(&self, base: u64, len: u64) {
        self.space
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .free(base, len);
    }

    /// Releases slot ranges a memory tier's fetches copied out (one TLB flush); a file
    /// tier has none.
    pub fn release_pending(&self) {
        if let Backend::Memory(m) = &self.backend {
            m.release_pending();
        }
    }

    /// Moves `len` bytes of region memory at `src` into slot `off`. Signal-safe.
    /// On error nothing was taken from the region. `already_there(staged)` lets a file tier
    /// skip writing content it holds already (clean pages).
    pub fn store(
        &self,
        io: &IoContext,
        region_uffd: &Uffd,
        src: usize,
        off: u64,
        len: usize,
        already_there: &mut dyn FnMut(usize) -> bool,
    ) -> SysResult<()> {
        if !self.accepts(len as u64) {
            return Err(Errno(libc::ENOSPC));
        }
        let r = match &self.backend {
            Backend::Memory(m) => m.store(io, region_uffd, src, off, len),
            Backend::File(f) => f.store(io, region_uffd, src, off, len, already_there),
        };
        match r {
            Ok(()) => {
                let now = self.counters.stored.fetch_add(len as u64, Relaxed) + len as u64;
                self.counters.peak_stored.fetch_max(now, Relaxed);
                self.counters.stores.fetch_add(1, Relaxed);
                self.counters.bytes_out.fetch_add(len as u64, Relaxed);
            }
            Err(e) => {
                if e.0 == libc::ENOSPC {
                    self.counters.full.fetch_add(1, Relaxed);
                    self.full_until
                        .store(attune_sys::os::now_ns() + FULL_BACKOFF_NS, Relaxed);
                } else if e.0 != libc::EINVAL {
                    // EINVAL is the region's protection (see `crate::paging::evict`, `store_run`), not
                    // the tier's failure.
                    self.counters.errors.fetch_add(1, Relaxed);
                }
            }
        }
        r
    }

    /// Places `len` bytes of slot `off` into the missing region range at `dst`, through
    /// the region's userfaultfd (which wakes threads waiting on it). Signal-safe.
    /// `seen(data)` is called with the fetched bytes when the tier reads them through a
    /// buffer (file), to check and record content hashes; when it returns false the data
    /// is not what was written, nothing is placed and the load fails with EBADMSG.
    pub fn load(
        &self,
        io: &IoContext,
        region_uffd: &Uffd,
        dst: usize,
        off: u64,
        len: usize,
        seen: &mut dyn FnMut(usize) -> bool,
    ) -> SysResult<()> {
        let r = match &self.backend {
            Backend::Memory(m) => m.load(region_uffd, dst, off, len),
            Backend::File(f) => f.load(io, region_uffd, dst, off, len, seen),
        };
        match r {
            Ok(()) => {
                self.counters.stored.fetch_sub(len as u64, Relaxed);
                self.counters.loads.fetch_add(1, Relaxed);
                self.counters.bytes_in.fetch_add(len as u64, Relaxed);
            }
            Err(_) => {
                self.counters.errors.fetch_add(1, Relaxed);
            }
        }
        r
    }

    /// Before a fork, the runtime quiesced: a file tier makes the child's file (a copy of
    /// its data when it holds any). Returns whether the child's file will hold the
    /// content (so the content hashes of it still hold there).
    pub fn prepare_fork(&self, buf: usize, buf_len: usize) -> Result<bool, String> {
        match &self.backend {
            Backend::Memory(m) => {
                m.prepare_fork();
                Ok(true)
            }
            Backend::File(f) => {
                // Nothing stored: no copy (fork+exec pays nothing); the hashes are dropped.
                let copy = self.counters.stored.load(Relaxed) > 0;
                f.prepare_child_file(&self.cfg, copy, buf, buf_len)?;
                Ok(copy)
            }
        }
    }

    /// After a fork, in the parent.
    pub fn after_fork_in_parent(&self) {
        if let Backend::File(f) = &self.backend {
            f.drop_child_file();
        }
    }

    /// In a forked child: the memory arena registered with the child's userfaultfd; the
    /// file prepared before the fork in place of the parent's.
    pub fn reopen_in_child(&self, internal: &Uffd) -> Result<(), String> {
        match &self.backend {
            Backend::Memory(m) => m.reattach(internal).map_err(|e| e.to_string()),
            Backend::File(f) => f.take_child_file(),
        }
    }

    /// Sets event counters to zero (a forked child reports its own); `stored` stays.
    pub fn reset_event_counters(&self) {
        let c = &self.counters;
        for a in [
            &c.loads,
            &c.stores,
            &c.bytes_in,
            &c.bytes_out,
            &c.errors,
            &c.full,
        ] {
            a.store(0, Relaxed);
        }
        c.peak_stored.store(c.stored.load(Relaxed), Relaxed);
    }

    /// Drops the stored copy of a slot range (region freed or chunk discarded).
    pub fn discard(&self, off: u64, len: usize) {
        match &self.backend {
            Backend::Memory(m) => m.discard(off, len),
            Backend::File(f) => f.discard(off, len),
        }
    }

    /// Forgets `len` stored bytes without touching the medium (the chunk's copy is stale).
    pub fn forget(&self, len: u64) {
        let _ = self
            .counters
            .stored
            .fetch_update(Relaxed, Relaxed, |v| Some(v.saturating_sub(len)));
    }
}

/// Puts pages a store had moved out of the region (`[st, st+len)`, a staging slot or a
/// far-memory slot) back at `src`: one move of the range (which already retries and
/// accounts for what it moved), then the pages it could not move copied one by one.
/// A page absent from the slot is a hole the application had discarded (it reads as zero
/// where it was) or a page already back. Returns false when a page could not be placed:
/// a lost write, reported as EIO by the caller. Signal-safe.
pub(crate) fn give_back(region_uffd: &Uffd, src: usize, st: usize, len: usize) -> bool {
    let moved = region_uffd
        .move_pages(src, st, len, true, true)
        .unwrap_or(0);
    if moved >= len {
        return true;
    }
    let ps = attune_sys::page_size();
    let mut ok = true;
    let mut off = moved & !(ps - 1);
    while off < len {
        // Never read an absent slot page: the slot is registered with the internal
        // userfaultfd, and a copy from it would wait for a fault nobody serves.
        if attune_sys::mem::page_present(st + off)
            && !matches!(
                region_uffd.copy(src + off, st + off, ps, true),
                Ok(_) | Err(Errno(libc::EEXIST))
            )
        {
            ok = false;
        }
        off += ps;
    }
    ok
}
