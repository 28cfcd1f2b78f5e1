//! Tiers: places where the pages of a region can live when they are not in DRAM.
//!
//! The DRAM tier is the budget of resident managed memory (accounted in the engine).
//! A far tier is a [`Medium`] (the node's memory, a private file; next a node pool or a
//! memory server) under one [`FarTier`] that keeps what every medium needs alike: the
//! offset space, the capacity and the node daemon's grant, the counters, the back-off
//! after the medium was full. Two signal-safe operations move whole runs of chunks:
//! [`FarTier::store`] takes pages out of a region (the region range becomes missing) and
//! [`FarTier::load`] places them back into a missing range. Slots are addressed by a byte
//! offset reserved per region at allocation ([`FarTier::reserve`]).

#[cfg(test)]
mod fake;
pub mod file;
pub mod memory;
pub mod pool;
pub mod remote;
pub mod slots;

use crate::config::{TierConfig, TierKind};
pub use crate::region::HASH_PAGE;
pub use attune_policy::writeback::Pieces;
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

/// What a store through a staging buffer writes, as the engine judges from the staged
/// content (`dirty(staged, all)` of [`Medium::store`]).
// Returned by value on the fault path, where boxing the pieces would allocate.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Staged {
    /// These pieces of the run, in [`HASH_PAGE`]s (`attune_policy::writeback`; none: the
    /// medium holds all of it already). A medium that keeps no copy writes the whole run.
    Write(Pieces),
    /// Every chunk of the run is one 8-byte word repeated (`crate::paging::fill`): the
    /// engine keeps the words, the medium writes nothing and holds nothing new for the
    /// run (what its slot held before stays, unread), and the store succeeds.
    Filled,
}

/// Where a far tier keeps chunk runs. Every method may run on the fault path, in a SIGBUS
/// handler: signal-safe, no allocation, errors as errno values.
pub trait Medium: Send + Sync {
    /// Moves `len` bytes of region memory at `src` into slot `off`; on error nothing was
    /// taken from the region. A medium that stages the run (file, pool, remote) asks
    /// `dirty(staged, all)` what to write ([`Staged`]); `all`: the medium writes the
    /// whole run whatever changed (its copy is not whole), so that the engine counts what
    /// was written. The staged run has no hole ([`store_staged`] fills them first), so the
    /// engine may read it anywhere. The memory tier moves pages without staging and never
    /// asks: it holds fills as pages.
    fn store(
        &self,
        io: &IoContext,
        region_uffd: &Uffd,
        src: usize,
        off: u64,
        len: usize,
        dirty: &mut dyn FnMut(usize, bool) -> Staged,
    ) -> SysResult<()>;
    /// Places slot `off` into the missing region range at `dst` through the region's
    /// userfaultfd, waking no one: the fault path wakes the run once it is all placed
    /// (`paging::fault`, "No wake before the whole run"). `seen(data)` checks bytes read
    /// through a buffer; false is EBADMSG.
    fn load(
        &self,
        io: &IoContext,
        region_uffd: &Uffd,
        dst: usize,
        off: u64,
        len: usize,
        seen: &mut dyn FnMut(usize) -> bool,
    ) -> SysResult<()>;
    /// Drops the stored copy of a slot range.
    fn discard(&self, off: u64, len: usize);
    /// Whether stored content survives a load (a file keeps its blocks; a memory slot is
    /// emptied by the move).
    fn keeps_copy(&self) -> bool;
    /// Whether it is node memory, which the node daemon divides among workflows.
    fn is_node_memory(&self) -> bool;
    /// The most bytes one fault's read-ahead run loads from it (None: the `readahead`
    /// setting alone). Media that copy the run into place say [`COPIED_RUN`].
    fn run_max(&self) -> Option<usize> {
        None
    }
    /// Forward read-ahead runs end at multiples of this many bytes of the tier's offset
    /// space (None: anywhere). The remote tier fetches windows ahead on this grid, and a
    /// run that crossed two windows would be served by neither.
    fn run_grid(&self) -> Option<usize> {
        None
    }
    /// Whether its ENOSPC costs nothing (no system call), so the tier need not be left
    /// alone for a back-off after one (the pool's units, which a grant refills).
    fn refuses_cheaply(&self) -> bool {
        false
    }
    /// Finishes deferred work on slots loads copied out (a memory tier's batched release).
    fn release_pending(&self) {}
    /// The process is exiting: memory held outside it (a memory server's) is told to go
    /// once the process is gone. Loads and stores must still work afterwards.
    fn leave(&self) {}
    /// Before a fork, the runtime quiesced: makes what the child will use. `has_data`:
    /// something is stored. Returns whether the child's copy holds the content.
    fn prepare_fork(
        &self,
        cfg: &TierConfig,
        has_data: bool,
        buf: usize,
        buf_len: usize,
    ) -> Result<bool, String>;
    /// After a fork, in the parent.
    fn after_fork_in_parent(&self) {}
    /// In a forked child: takes over what `prepare_fork` made.
    fn reopen_in_child(&self, internal: &Uffd) -> Result<(), String>;
    /// In a forked child, with the runtime's threads: starts the tier's own (a remote
    /// tier's I/O thread) and waits until it serves. Err: the tier cannot serve what the
    /// child inherited.
    fn start_in_child(&self) -> Result<(), String> {
        Ok(())
    }
    /// The node-pool medium, which the daemon client attaches its segment to.
    fn as_pool(&self) -> Option<&pool::PoolTier> {
        None
    }
}

/// A far tier with its offset space and counters.
pub struct FarTier {
    pub cfg: TierConfig,
    pub index: usize,
    medium: Box<dyn Medium>,
    space: Mutex<slots::FreeList>,
    pub counters: TierCounters,
    /// After the medium reported ENOSPC, stores are refused until this time (ns) so that
    /// a full disk costs one failed write per interval, not one per eviction.
    full_until: AtomicU64,
    /// The error of the last store the medium failed (EIO, EROFS; 0: none since the
    /// evictor last reported it): see [`FarTier::take_failure`].
    failure: std::sync::atomic::AtomicI32,
    /// The node daemon's grant of far memory for this tier (u64::MAX: none); the tier
    /// holds at most the lower of it and its configured capacity.
    granted: AtomicU64,
    /// The clock of the back-off (`os::now_ns`; a test's own clock).
    now: fn() -> u64,
}

/// How long a tier whose medium is full is left alone.
const FULL_BACKOFF_NS: u64 = 200_000_000;

/// How long a tier whose medium failed a write (EIO; EROFS, a file system remounted
/// read-only after an error) is left alone before it is tried again. Without it every
/// fault's reclaim wrote to the failing medium chunk after chunk: a program over a file
/// tier whose ext4 went read-only mid-run made 570 faults a second instead of 25,000,
/// its handler thread at 100% (2026-11-27, `tests/python/test_failing_tier.py`).
pub const FAILED_BACKOFF_NS: u64 = 10_000_000_000;

/// Store errors that say the medium is full (the tier takes no more for a while).
fn full_errno(e: i32) -> bool {
    matches!(e, libc::ENOSPC | libc::EDQUOT | libc::EFBIG)
}

/// Store errors that say the medium failed (the tier is left alone longer, said aloud).
pub fn failed_errno(e: i32) -> bool {
    matches!(e, libc::EIO | libc::EROFS)
}

/// Store errors after which the next tier may take the chunk: full, failing, or a medium
/// that cannot hold it (EOPNOTSUPP). Nothing left the region on any of them.
pub fn passes_on(e: i32) -> bool {
    full_errno(e) || failed_errno(e) || e == libc::EOPNOTSUPP
}

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
        let medium: Box<dyn Medium> = match cfg.kind {
            TierKind::Memory => Box::new(memory::MemoryTier::new(&cfg, space, internal)?),
            TierKind::File => Box::new(file::FileTier::new(&cfg)?),
            TierKind::Pool => Box::new(pool::PoolTier::new(&cfg, space)?),
            TierKind::Remote => Box::new(remote::RemoteTier::new(&cfg, space)?),
            TierKind::Numa => {
                return Err(format!(
                    "tier '{}': NUMA tiers keep pages mapped and are placed by crate::numa",
                    cfg.name
                ))
            }
            TierKind::Dram => return Err("the DRAM tier is implicit".into()),
        };
        Ok(FarTier::with_medium(cfg, index, space, medium))
    }

    /// A tier over any medium (`open` picks the medium of the configured kind).
    pub fn with_medium(
        cfg: TierConfig,
        index: usize,
        space: u64,
        medium: Box<dyn Medium>,
    ) -> FarTier {
        FarTier {
            cfg,
            index,
            medium,
            space: Mutex::new(slots::FreeList::new(space)),
            counters: TierCounters::default(),
            full_until: AtomicU64::new(0),
            failure: std::sync::atomic::AtomicI32::new(0),
            granted: AtomicU64::new(u64::MAX),
            now: attune_sys::os::now_ns,
        }
    }

    pub fn name(&self) -> &str {
        &self.cfg.name
    }

    /// Whether stored content survives a load (a file keeps its blocks; a memory slot is
    /// emptied by the move), so that identical content need not be written again.
    pub fn keeps_copy(&self) -> bool {
        self.medium.keeps_copy()
    }

    /// The most bytes one fault's run loads from this tier (`Medium::run_max`).
    pub fn run_max(&self) -> Option<usize> {
        self.medium.run_max()
    }

    /// Where forward runs from this tier end (`Medium::run_grid`).
    pub fn run_grid(&self) -> Option<usize> {
        self.medium.run_grid()
    }

    /// Whether the fault engine can store pages here (every far tier it opens can; NUMA
    /// tiers are not far tiers of the fault engine).
    pub fn is_pageable(&self) -> bool {
        true
    }

    /// Whether a store of `len` bytes could succeed now (see [`FarTier::room`]).
    pub fn accepts(&self, len: u64) -> bool {
        self.room() >= len
    }

    /// The most bytes a store could put here now: its free capacity, 0 while the medium
    /// backs off after a full or failed write. Eviction asks at every run, so a tier that
    /// never backed off reads no clock.
    pub fn room(&self) -> u64 {
        let until = self.full_until.load(Relaxed);
        if !self.is_pageable() || (until != 0 && (self.now)() < until) {
            return 0;
        }
        // A pool tier holds no more than its segment, which the daemon sizes to the far
        // grant rounded down to its unit, and shrinks no lower than the pages in use:
        // room by the grant alone was up to a unit more than a store could take, so a
        // fault with no real room placed its chunk over the budget instead of waiting.
        match self.as_pool() {
            Some(p) => self.free_bytes().min(p.free_bytes()),
            None => self.free_bytes(),
        }
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
        self.medium.is_node_memory()
    }

    /// The node-pool medium of a `pool` tier.
    pub fn as_pool(&self) -> Option<&pool::PoolTier> {
        self.medium.as_pool()
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
        self.medium.release_pending();
    }

    /// The process is exiting (`Medium::leave`).
    pub fn leave(&self) {
        self.medium.leave();
    }

    /// The error of the medium's last failed store since the last call (0: none), for
    /// the evictor's warning (a store may run in a signal handler, which cannot write
    /// one).
    pub fn take_failure(&self) -> i32 {
        self.failure.swap(0, Relaxed)
    }

    /// Moves `len` bytes of region memory at `src` into slot `off`. Signal-safe.
    /// On error nothing was taken from the region. `dirty(staged, all)`: what a staging
    /// medium writes ([`Medium::store`]); after [`Staged::Filled`] the tier holds nothing
    /// new.
    pub fn store(
        &self,
        io: &IoContext,
        region_uffd: &Uffd,
        src: usize,
        off: u64,
        len: usize,
        dirty: &mut dyn FnMut(usize, bool) -> Staged,
    ) -> SysResult<()> {
        if !self.accepts(len as u64) {
            return Err(Errno(libc::ENOSPC));
        }
        let mut filled = false;
        let r = self
            .medium
            .store(io, region_uffd, src, off, len, &mut |st, all| {
                let d = dirty(st, all);
                filled = d == Staged::Filled;
                d
            });
        match r {
            // A fill: the medium holds nothing new (the engine counts it).
            Ok(()) if filled => {}
            Ok(()) => {
                let now = self.counters.stored.fetch_add(len as u64, Relaxed) + len as u64;
                self.counters.peak_stored.fetch_max(now, Relaxed);
                self.counters.stores.fetch_add(1, Relaxed);
                self.counters.bytes_out.fetch_add(len as u64, Relaxed);
            }
            Err(e) => {
                if full_errno(e.0) {
                    self.counters.full.fetch_add(1, Relaxed);
                    if !self.medium.refuses_cheaply() {
                        self.full_until
                            .store((self.now)() + FULL_BACKOFF_NS, Relaxed);
                    }
                } else if failed_errno(e.0) {
                    self.counters.errors.fetch_add(1, Relaxed);
                    self.failure.store(e.0, Relaxed);
                    self.full_until
                        .store((self.now)() + FAILED_BACKOFF_NS, Relaxed);
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
    /// the region's userfaultfd, without waking the threads waiting on it (the caller
    /// does, once the whole run is placed). Signal-safe.
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
        let r = self.medium.load(io, region_uffd, dst, off, len, seen);
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
        let has_data = self.counters.stored.load(Relaxed) > 0;
        self.medium.prepare_fork(&self.cfg, has_data, buf, buf_len)
    }

    /// After a fork, in the parent.
    pub fn after_fork_in_parent(&self) {
        self.medium.after_fork_in_parent();
    }

    /// In a forked child: the memory arena registered with the child's userfaultfd; the
    /// file prepared before the fork in place of the parent's.
    pub fn reopen_in_child(&self, internal: &Uffd) -> Result<(), String> {
        self.medium.reopen_in_child(internal)
    }

    /// In a forked child: the tier's own threads (`Medium::start_in_child`).
    pub fn start_in_child(&self) -> Result<(), String> {
        self.medium.start_in_child()
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
        self.medium.discard(off, len)
    }

    /// Forgets `len` stored bytes without touching the medium (the chunk's copy is stale).
    pub fn forget(&self, len: u64) {
        let _ = self
            .counters
            .stored
            .fetch_update(Relaxed, Relaxed, |v| Some(v.saturating_sub(len)));
    }
}

/// Takes the pages of `[src, src+len)` (region memory, which the program may be writing)
/// into `dst`, a missing slot registered with `internal`. Same contract as
/// [`Uffd::move_pages`] with holes allowed and no wake: the bytes accounted; a short
/// count when a page could not be taken. With it, whether the run was whole: no hole (a
/// page the program discarded), so a read of `dst` cannot fault. The move is tried
/// without holes first: a run without one, the common case, costs nothing more to know
/// it (before, a `mincore` of each staged run made random updates through the pool 1.09x
/// slower with fills on); a hole stops it (ENOENT) and the rest moves with holes allowed.
///
/// With `UFFDIO_MOVE` the move is atomic against the program's writers. Without it (before
/// Linux 6.8, or masked) the pages are copied, then dropped, and a write between the copy
/// and the drop would be lost: so the range is write-protected first (the regions are
/// registered for write-protect faults then, `Pager::region_mode`). A writer waits in the
/// kernel (thread delivery) or in its SIGBUS handler until the chunk, claimed Evicting,
/// settles; then its write faults the page back. The protection is cleared on every path
/// before returning (with a wake): pages not taken keep their data and stay writable.
/// Signal-safe.
pub(crate) fn take_out(
    internal: &Uffd,
    region_uffd: &Uffd,
    dst: usize,
    src: usize,
    len: usize,
) -> attune_sys::SysResult<(usize, bool)> {
    if internal.has(attune_sys::uffd::feature::MOVE) {
        return move_noting_holes(internal, dst, src, len);
    }
    // EINVAL here: the program made the range read-only or inaccessible (mprotect), which
    // the caller treats as it treats a move's EINVAL: the chunk stays resident.
    region_uffd.writeprotect(src, len, true)?;
    let r = move_noting_holes(internal, dst, src, len);
    let _ = region_uffd.writeprotect(src, len, false);
    match r {
        // A page the copy could not read: the program removed read access (PROT_NONE).
        Err(Errno(libc::EFAULT)) => Err(Errno(libc::EINVAL)),
        r => r,
    }
}

/// [`take_out`]'s move: without holes, then, if it stopped short (a hole, or a page that
/// cannot move), the rest with holes allowed. Whole only when the first move took all.
fn move_noting_holes(
    internal: &Uffd,
    dst: usize,
    src: usize,
    len: usize,
) -> attune_sys::SysResult<(usize, bool)> {
    let first = match internal.move_pages(dst, src, len, false, false) {
        Ok(n) if n >= len => return Ok((len, true)),
        Ok(n) => n,
        Err(Errno(libc::ENOENT)) => 0,
        Err(e) => return Err(e),
    };
    match internal.move_pages(dst + first, src + first, len - first, true, false) {
        Ok(n) => Ok((first + n, false)),
        Err(_) if first > 0 => Ok((first, false)),
        Err(e) => Err(e),
    }
}

/// A store through a staging buffer (the file and pool media): moves `[src, src+len)`
/// into a staging slot (`take_out`), hands the slot's address to `write`, and leaves the
/// written pages for the slot to drop in a batch (`pool::KEEP_BATCH`). All or nothing: when a page cannot move, or `write` fails, the pages go back to
/// the region and the error is returned (ENOTRECOVERABLE if even that failed: a lost write).
/// `write(staged)`: the staged run has no hole (pages the program discarded are mapped as
/// zeros before the call; [`take_out`] says whether there were any). A write that fails
/// with EFAULT all the same is given the holes filled again and called once more.
/// Signal-safe.
pub(crate) fn store_staged(
    io: &IoContext,
    region_uffd: &Uffd,
    src: usize,
    len: usize,
    write: &mut dyn FnMut(usize) -> SysResult<()>,
) -> SysResult<()> {
    let slot = io.staging.claim(len).ok_or(Errno(libc::EAGAIN))?;
    let st = slot.fresh(len);
    let (moved, whole) = take_out(io.internal, region_uffd, st, src, len)?;
    if moved < len {
        // A page could not move (EBUSY: shared since a fork, or pinned by the kernel
        // for I/O): put back what moved so the caller sees all-or-nothing.
        let back = give_back(region_uffd, src, st, moved);
        let _ = attune_sys::mem::advise(st, len, attune_sys::mem::MADV_DONTNEED);
        return Err(Errno(if back {
            libc::EBUSY
        } else {
            libc::ENOTRECOVERABLE
        }));
    }
    if !whole {
        // Holes (pages the program dropped behind the interposer's back, `madvise` without
        // libc) are mapped as zeros, which they read as, before anything reads the run:
        // the content hashes and the fill test read it directly, and inside a SIGBUS
        // resolver a fault on a hole of the staging buffer is a second SIGBUS, which the
        // kernel delivers by killing the program (tests/run/raw_madvise.c, signal
        // delivery: killed in 6 runs of 8 before).
        fill_holes(io.internal, st, len);
    }
    let mut r = write(st);
    if matches!(r, Err(Errno(libc::EFAULT))) {
        fill_holes(io.internal, st, len);
        r = write(st);
    }
    if let Err(e) = r {
        // Full disk or I/O error: the pages go back to the region. Nothing is lost.
        let back = give_back(region_uffd, src, st, len);
        let _ = attune_sys::mem::advise(st, len, attune_sys::mem::MADV_DONTNEED);
        return Err(if back {
            e
        } else {
            Errno(libc::ENOTRECOVERABLE)
        });
    }
    // Written: the staged pages are dropped with the buffer's next ones (`KEEP_BATCH`).
    slot.keep(len);
    Ok(())
}

/// Maps zeros where `[st, st+len)` (a staging buffer, registered with `internal`) holds no
/// page; pages there are left as they are.
pub(crate) fn fill_holes(internal: &Uffd, st: usize, len: usize) {
    let ps = attune_sys::page_size();
    let mut a = st;
    while a < st + len {
        let _ = internal.zeropage(a, ps);
        a += ps;
    }
}

/// The longest run a fault loads from a medium that copies it into place (file and
/// remote through a bounce buffer, the pool from its mapping): their sequential passes
/// ran faster at 256 KiB runs than at 1 MiB, the memory tier's (moves, which cost less
/// the longer they are) slower (docs/benchmarks.md, "Read-ahead runs from copying
/// tiers"). Likely the copied run is still in the core's cache when the program reads it;
/// not measured apart.
pub const COPIED_RUN: usize = 256 << 10;

/// A load through a bounce buffer (the file and remote media): `read` fills the buffer
/// with the slot's `len` bytes, `seen` checks them (false: EBADMSG, nothing placed), and
/// they are copied into the missing region range at `dst`. Signal-safe.
pub(crate) fn load_bounced(
    io: &IoContext,
    region_uffd: &Uffd,
    dst: usize,
    len: usize,
    read: &mut dyn FnMut(usize) -> SysResult<()>,
    seen: &mut dyn FnMut(usize) -> bool,
) -> SysResult<()> {
    let slot = io.bounce.claim(len).ok_or(Errno(libc::EAGAIN))?;
    let b = slot.addr();
    // The buffer is ours, mapped and writable: EFAULT is the kernel failing to fault a
    // page of it in for the read (an `O_DIRECT` read pins it first), which happens when
    // the memory cgroup is at its limit and cannot be reclaimed at that moment. It passes
    // as the evictor follows the limit down: ENOMEM, which the fault path retries. Seen
    // under signal delivery, where each faulting thread takes a slot of its own, in
    // Figure 7's pool column (its file tier is `O_DIRECT`): 1-2 of 4 runs lost a workflow
    // to "could not be read back (EFAULT)".
    read(b).map_err(|e| {
        if e.0 == libc::EFAULT {
            Errno(libc::ENOMEM)
        } else {
            e
        }
    })?;
    if !seen(b) {
        return Err(Errno(libc::EBADMSG));
    }
    region_uffd.place_copy(dst, b, len, false)
}

/// Puts pages a store had moved out of the region (`[st, st+len)`, a staging slot or a
/// far-memory slot) back at `src`: one move of the range (which already retries and
/// accounts for what it moved), then the pages it could not move copied one by one.
/// A page absent from the slot is a hole the application had discarded (it reads as zero
/// where it was) or a page already back. Returns false when a page could not be placed:
/// a lost write, reported as ENOTRECOVERABLE by the caller (not EIO, which says the
/// medium failed and sends the chunk to the next tier). Signal-safe.
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

#[cfg(test)]
mod tests {
    use super::fake::Fake;
    use super::*;
    use crate::pool::BufferPool;
    use attune_sys::uffd::Delivery;
    use std::sync::Arc;

    // The test clock of the back-off, one per test thread: tests run in parallel and one
    // test's jump must not end another's back-off.
    thread_local! {
        static NOW: std::cell::Cell<u64> = const { std::cell::Cell::new(1_000_000_000) };
    }
    fn now() -> u64 {
        NOW.with(|n| n.get())
    }
    fn advance(ns: u64) {
        NOW.with(|n| n.set(n.get() + ns));
    }

    const K4: usize = 4096;

    fn tier(capacity: u64) -> (FarTier, Arc<Fake>) {
        let fake = Arc::new(Fake::default());
        let cfg = TierConfig {
            name: "fake".into(),
            kind: TierKind::Memory,
            capacity,
            path: None,
            direct: false,
            latency_ns: 300,
            bandwidth: 10 << 30,
            emulate_delay_ns: 0,
            emulate_bandwidth: 0,
            min_chunk: K4,
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
        let mut t = FarTier::with_medium(cfg, 0, 1 << 30, Box::new(fake.clone()));
        t.now = now;
        (t, fake)
    }

    /// The buffers and userfaultfd a store or load is handed (the fake uses none of them).
    struct Io {
        uffd: Uffd,
        staging: BufferPool,
        bounce: BufferPool,
    }
    fn io() -> Io {
        Io {
            uffd: Uffd::open(Delivery::Thread, 0).expect("userfaultfd (the tests run as root)"),
            staging: BufferPool::new(1, K4).unwrap(),
            bounce: BufferPool::new(1, K4).unwrap(),
        }
    }
    fn store(t: &FarTier, io: &Io, len: usize) -> SysResult<()> {
        let ctx = IoContext {
            internal: &io.uffd,
            staging: &io.staging,
            bounce: &io.bounce,
        };
        t.store(&ctx, &io.uffd, 0, 0, len, &mut |_, _| {
            Staged::Write(Pieces::whole(len / HASH_PAGE))
        })
    }
    fn load(t: &FarTier, io: &Io, len: usize) -> SysResult<()> {
        let ctx = IoContext {
            internal: &io.uffd,
            staging: &io.staging,
            bounce: &io.bounce,
        };
        t.load(&ctx, &io.uffd, 0, 0, len, &mut |_| true)
    }

    #[test]
    fn take_out_says_whether_the_run_it_moved_had_a_hole() {
        use attune_sys::mem;
        use attune_sys::uffd::mode;
        let internal = Uffd::open(Delivery::Signal, 0).expect("userfaultfd (root)");
        let region = Uffd::open(Delivery::Thread, 0).expect("userfaultfd (root)");
        let len = 4 * K4;
        for hole in [None, Some(0), Some(2), Some(3)] {
            let src = mem::map_anon(len, false).unwrap();
            let dst = mem::map_anon(len, false).unwrap();
            internal.register(dst, len, mode::MISSING).unwrap();
            for p in (0..4).filter(|&p| Some(p) != hole) {
                mem::with_words_mut(src + p * K4, 8, |w| w[0] = p as u64 + 7);
            }
            // Registered once written (nothing serves its faults here); the fallback
            // write-protects the source, which must be a registered region.
            region.register(src, len, mode::MISSING | mode::WP).unwrap();
            let (moved, whole) = take_out(&internal, &region, dst, src, len).unwrap();
            assert_eq!(moved, len, "hole {hole:?}");
            assert_eq!(whole, hole.is_none(), "hole {hole:?}");
            for p in (0..4).filter(|&p| Some(p) != hole) {
                assert!(
                    mem::page_present(dst + p * K4),
                    "hole {hole:?}: page {p} moved"
                );
                assert_eq!(mem::with_words(dst + p * K4, 8, |w| w[0]), p as u64 + 7);
            }
            if let Some(h) = hole {
                assert!(!mem::page_present(dst + h * K4), "a hole stays a hole");
            }
            let _ = mem::unmap(src, len);
            let _ = mem::unmap(dst, len);
        }
    }

    #[test]
    fn a_read_that_cannot_fault_its_buffer_in_passes_as_short_of_memory() {
        // EFAULT into the runtime's own buffer is a memory cgroup at its limit (transient:
        // the fault path retries ENOMEM); every other error of the medium stays as it is.
        let io = io();
        let ctx = IoContext {
            internal: &io.uffd,
            staging: &io.staging,
            bounce: &io.bounce,
        };
        for (read, want) in [
            (libc::EFAULT, libc::ENOMEM),
            (libc::EIO, libc::EIO),
            (libc::ENOMEM, libc::ENOMEM),
        ] {
            let r = load_bounced(
                &ctx,
                &io.uffd,
                0,
                K4,
                &mut |_| Err(Errno(read)),
                &mut |_| true,
            );
            assert_eq!(r, Err(Errno(want)), "a read failing with {read}");
        }
    }

    #[test]
    fn a_full_medium_is_left_alone_for_the_backoff_then_tried_again() {
        let (t, fake) = tier(1 << 20);
        let io = io();
        fake.then(&[Err(Errno(libc::ENOSPC))]);
        assert_eq!(store(&t, &io, K4), Err(Errno(libc::ENOSPC)));
        assert_eq!(t.counters.full.load(Relaxed), 1);
        assert_eq!(t.counters.errors.load(Relaxed), 0, "full is not an error");
        assert!(!t.accepts(K4 as u64));
        // Refused without asking the medium again, until the back-off is over.
        assert_eq!(store(&t, &io, K4), Err(Errno(libc::ENOSPC)));
        assert_eq!(fake.stores.load(Relaxed), 1);
        advance(FULL_BACKOFF_NS - 1);
        assert!(!t.accepts(K4 as u64));
        advance(1);
        assert!(t.accepts(K4 as u64));
        assert_eq!(store(&t, &io, K4), Ok(()));
        assert_eq!((fake.stores.load(Relaxed), t.used()), (2, K4 as u64));
    }

    #[test]
    fn a_protection_refusal_is_not_a_tier_error_but_a_failure_is() {
        let (t, fake) = tier(1 << 20);
        let io = io();
        fake.then(&[Err(Errno(libc::EINVAL)), Err(Errno(libc::EIO))]);
        assert_eq!(store(&t, &io, K4), Err(Errno(libc::EINVAL)));
        assert_eq!(t.counters.errors.load(Relaxed), 0);
        assert_eq!(store(&t, &io, K4), Err(Errno(libc::EIO)));
        assert_eq!(t.counters.errors.load(Relaxed), 1);
        assert_eq!(t.used(), 0, "a failed store stores nothing");
        // A failing medium (EIO; EROFS after an ext4 error) is left alone for longer, and
        // the failure is kept for the evictor's warning, once.
        assert!(!t.accepts(K4 as u64));
        assert_eq!((t.take_failure(), t.take_failure()), (libc::EIO, 0));
        advance(FAILED_BACKOFF_NS - 1);
        assert!(!t.accepts(K4 as u64));
        advance(1);
        assert!(t.accepts(K4 as u64));
        fake.then(&[Err(Errno(libc::EROFS)), Err(Errno(libc::EDQUOT))]);
        assert_eq!(store(&t, &io, K4), Err(Errno(libc::EROFS)));
        assert_eq!(t.take_failure(), libc::EROFS);
        advance(FAILED_BACKOFF_NS);
        // A quota is a full medium, not a failure.
        assert_eq!(store(&t, &io, K4), Err(Errno(libc::EDQUOT)));
        assert_eq!((t.counters.full.load(Relaxed), t.take_failure()), (1, 0));
    }

    #[test]
    fn capacity_is_the_lower_of_the_configured_one_and_the_grant() {
        let (t, fake) = tier(64 << 10);
        let io = io();
        assert_eq!(t.capacity(), 64 << 10);
        for _ in 0..8 {
            assert_eq!(store(&t, &io, K4), Ok(()));
        }
        t.set_grant(Some(16 << 10));
        assert_eq!((t.capacity(), t.free_bytes()), (16 << 10, 0));
        assert_eq!(store(&t, &io, K4), Err(Errno(libc::ENOSPC)));
        assert_eq!(
            fake.stores.load(Relaxed),
            8,
            "over the grant: the medium is not asked"
        );
        assert_eq!(t.counters.full.load(Relaxed), 0, "nor is it full");
        t.set_grant(None);
        assert_eq!(t.free_bytes(), 32 << 10);
        assert_eq!(store(&t, &io, K4), Ok(()));
    }

    #[test]
    fn stored_bytes_follow_stores_loads_and_forgets() {
        let (t, fake) = tier(1 << 20);
        let io = io();
        assert_eq!(store(&t, &io, 2 * K4), Ok(()));
        assert_eq!(load(&t, &io, K4), Ok(()));
        assert_eq!(t.used(), K4 as u64);
        assert_eq!(t.counters.peak_stored.load(Relaxed), 2 * K4 as u64);
        fake.then(&[Err(Errno(libc::EIO))]);
        assert_eq!(load(&t, &io, K4), Err(Errno(libc::EIO)));
        assert_eq!(t.used(), K4 as u64, "a failed load leaves the bytes stored");
        assert_eq!(t.counters.errors.load(Relaxed), 1);
        t.reset_event_counters();
        assert_eq!(t.counters.loads.load(Relaxed), 0);
        assert_eq!(t.used(), K4 as u64, "a child still holds what is stored");
        t.forget(1 << 20);
        assert_eq!(t.used(), 0, "forget saturates");
        assert_eq!(t.prepare_fork(0, 0), Ok(false), "nothing stored: no copy");
    }

    #[test]
    fn offset_space_is_reserved_and_given_back() {
        let (t, fake) = tier(1 << 20);
        let a = t.reserve(1 << 29).unwrap();
        let b = t.reserve(1 << 29).unwrap();
        assert_ne!(a, b);
        assert_eq!(t.reserve(K4 as u64), None, "the space is full");
        t.release(a, 1 << 29);
        assert_eq!(fake.discarded.load(Relaxed), 1 << 29);
        assert_eq!(t.reserve(K4 as u64), Some(a));
    }
}
