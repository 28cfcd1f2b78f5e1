//! The engine: the process-wide state of the runtime (tiers, regions, budget) and the
//! operations on regions that are not on the fault path (allocate, free, pin, prefetch).
//! The fault path is in `fault.rs`, replacement in `evict.rs`.

use crate::config::{Config, FaultMode, Mode};
use crate::pool::BufferPool;
use crate::region::{Region, RegionKind, Where, ACTIVE, CREDIT_MASK, PIN};
use crate::tier::{FarTier, IoContext};
use attune_policy::Flags;
use attune_sys::uffd::{feature, mode, Delivery, Uffd};
use attune_sys::{mem, os, Errno};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::*};
use std::sync::{Arc, Mutex, RwLock};

/// Largest run moved in one operation (the zero, staging and bounce buffers' size).
pub const MAX_RUN: usize = 2 << 20;

/// Options of one allocation (`attune_alloc`).
#[derive(Clone, Debug, Default)]
pub struct AllocOptions {
    pub flags: Flags,
    /// Far tier for this region's evicted chunks (index), or None for the policy's choice.
    pub preferred_tier: Option<usize>,
    /// Bytes from the start to pin and pre-fault (None: `pin_fraction` for LAT/SHL).
    pub pin_bytes: Option<usize>,
    /// Pre-fault the whole region now (up to the budget).
    pub prefault: bool,
    pub chunk_size: Option<usize>,
    pub fault_mode: Option<FaultMode>,
    /// A region of its own even below `small_threshold` (page-aligned: mmap requests).
    pub own_region: bool,
}

/// Counters of the whole engine.
#[derive(Default)]
pub struct EngineCounters {
    pub faults: AtomicU64,
    pub evictions: AtomicU64,
    pub evicted_bytes: AtomicU64,
    pub fetched_bytes: AtomicU64,
    pub direct_reclaims: AtomicU64,
    /// Bytes evicted from behind streams (`crate::evict::DropBehind`).
    pub dropped_behind_bytes: AtomicU64,
    /// Bytes the background evictor evicted (the rest of `evicted_bytes` was evicted by
    /// faulting threads or handler threads reclaiming for themselves).
    pub evictor_evicted_bytes: AtomicU64,
    /// Times the budget was exceeded because nothing could be evicted (all pinned or all
    /// tiers full): the application keeps running, the overrun is reported.
    pub budget_overruns: AtomicU64,
    /// Chunks an eviction left in DRAM because the program had changed their protection
    /// (mprotect to read-only or none).
    pub protected_skips: AtomicU64,
    pub load_errors: AtomicU64,
    /// Access sampling: chunks parked, and parked chunks touched within the window.
    pub sample_parks: AtomicU64,
    pub sample_hits: AtomicU64,
    /// Delays of sample hits in 1 us buckets (the last one: 31 us and more). Its low end is
    /// the delivery floor (fault raised, taken, timed) that analysis subtracts.
    pub sample_delay_us: [AtomicU64; 32],
    /// Time spent waiting for the movement limit (ns).
    pub paced_ns: AtomicU64,
    /// Chunks that refaulted close but found the active class full, and active chunks
    /// tested (evicted to see whether they are still used) because of them.
    pub denied_activations: AtomicU64,
    pub active_tests: AtomicU64,
    /// Chunks un-shared after a fork left their pages shared with another process.
    pub unshared: AtomicU64,
    /// Online flag prediction: regions split (hot part pinned, the rest CAP), regions left
    /// as they were, and bytes pinned for the splits.
    pub online_split_regions: AtomicU64,
    pub online_kept_regions: AtomicU64,
    pub online_pinned_bytes: AtomicU64,
}

impl EngineCounters {
    /// The counters the statistics report, by their names there (`attune_stats_json`'s
    /// `engine` object, each process snapshot of the `attune run` report and its totals):
    /// one list, so they cannot drift apart. Page movement, then the online prediction.
    pub fn statistics(&self) -> [(&'static str, &AtomicU64); 12] {
        [
            ("faults", &self.faults),
            ("evictions", &self.evictions),
            ("fetched_bytes", &self.fetched_bytes),
            ("evicted_bytes", &self.evicted_bytes),
            ("budget_overruns", &self.budget_overruns),
            ("direct_reclaims", &self.direct_reclaims),
            ("evictor_evicted_bytes", &self.evictor_evicted_bytes),
            ("dropped_behind_bytes", &self.dropped_behind_bytes),
            ("online_split_regions", &self.online_split_regions),
            ("online_kept_regions", &self.online_kept_regions),
            ("online_pinned_bytes", &self.online_pinned_bytes),
            ("protected_skips", &self.protected_skips),
        ]
    }
}

/// Clock hand over all regions.
#[derive(Default)]
pub struct ClockState {
    pub region_cursor: usize,
    /// Region where the tests of active chunks go on.
    pub test_cursor: usize,
    /// Where the capacity-first pass goes on (`attune_policy::victim::capacity_first`).
    pub cap_cursor: usize,
}

pub struct Engine {
    pub cfg: Config,
    pub(crate) uffd_thread: Uffd,
    pub(crate) uffd_signal: Uffd,
    /// Registered over the memory tier arena and the staging buffers (MOVE destinations).
    pub(crate) uffd_internal: Uffd,
    pub tiers: Vec<FarTier>,
    /// Placement on NUMA tiers (configured `numa` tiers whose nodes are online).
    pub numa: Option<crate::numa::NumaPlacer>,
    pub(crate) staging: BufferPool,
    pub(crate) bounce: BufferPool,
    pub(crate) zero: BufferPool,
    /// Sorted by base address.
    pub(crate) regions: RwLock<Vec<Arc<Region>>>,
    /// Freed regions waiting until no fault handler holds them (dropped by the evictor).
    pub(crate) retired: Mutex<Vec<Arc<Region>>>,
    /// Freed regions whose access samples the profile still reports (the last 1024).
    pub(crate) sampled_history: Mutex<Vec<Arc<Region>>>,
    pub(crate) clock: Mutex<ClockState>,
    /// Resident managed bytes (the DRAM tier's use).
    pub resident: AtomicU64,
    /// Bytes of dedicated regions allocated (capacity check).
    pub committed: AtomicU64,
    /// Highest `resident` seen after a fault's reservation (reports).
    pub peak_resident: AtomicU64,
    /// Bytes of pinned chunks over all regions.
    pub pinned: AtomicU64,
    /// Bytes of resident chunks in the active class (refaulted soon after eviction).
    pub active: AtomicU64,
    /// The DRAM budget now: the configured `dram`, or the node daemon's grant (`tmm.rs`).
    budget: AtomicU64,
    /// Page movement limit in bytes/s (0: none), set by the node daemon while a
    /// latency-sensitive neighbour runs; `move_next` is the pacing's virtual time.
    move_limit: AtomicU64,
    move_next: AtomicU64,
    pub capacity: u64,
    pub(crate) wake_evictor: os::EventFd,
    /// Chunks streams have just passed, the first victims (`crate::evict::DropBehind`).
    pub(crate) drop_behind: crate::evict::DropBehind,
    pub counters: EngineCounters,
    next_id: AtomicU32,
    pub(crate) shutdown: AtomicBool,
    /// Operations that claim chunks or take engine locks run inside it; a fork waits
    /// until none is in flight (`crate::fork`).
    pub(crate) gate: crate::fork::Gate,
    /// Forks this process took part in, as parent or child: after one, pages may be
    /// shared copy-on-write and `UFFDIO_MOVE` refuses them (EBUSY).
    pub forks: AtomicU64,
    /// Chunks marked SHARED since the evictor's last un-share pass.
    pub(crate) unshare_pending: AtomicU64,
}

/// Set once kernel accesses to some managed memory may fail with EFAULT (see
/// [`Engine::kernel_access_fails`]): until then the interposer's system-call wrappers
/// cost one load.
pub static KERNEL_ACCESS_MAY_FAIL: AtomicBool = AtomicBool::new(false);

/// Why the engine could not start.
#[derive(Debug)]
pub struct InitError(pub String);

impl Engine {
    /// Builds the engine: userfaultfds, tiers, buffers. Threads are started by `start`.
    pub fn new(cfg: Config) -> Result<Engine, InitError> {
        let open = |d: Delivery| {
            Uffd::open(d, feature::POISON).map_err(|e| {
                InitError(format!(
                    "userfaultfd is not available ({}{}). Attune needs it to move pages between tiers. \
                     Enable it with `sysctl vm.unprivileged_userfaultfd=1`, or grant access to /dev/userfaultfd, \
                     or allow the userfaultfd system call in the container's seccomp profile. \
                     Without it, set ATTUNE_DISABLE_UFFD=1 to run with plain DRAM (no tiering, no budget).",
                    e.errno,
                    if e.missing_features != 0 { format!("; missing kernel features {:#x}, Linux 6.8 or newer is needed", e.missing_features) } else { String::new() }
                ))
            })
        };
        let uffd_thread = open(Delivery::Thread)?;
        let uffd_signal = open(Delivery::Signal)?;
        let uffd_internal = open(Delivery::Signal)?;
        if uffd_thread.user_mode_only {
            KERNEL_ACCESS_MAY_FAIL.store(true, Relaxed);
            // Under `attune run` the interposer covers it (and the report says so).
            let level = if crate::runtime::INTERPOSED.load(Relaxed) {
                crate::log::Level::Info
            } else {
                crate::log::Level::Warn
            };
            crate::log::emit(
                level,
                "userfaultfd sees user-mode faults only (vm.unprivileged_userfaultfd=0): \
                 the kernel cannot fault in managed pages held in a far tier, so libattune \
                 holds them in DRAM around read/write, the socket calls and stdio. Calls \
                 it does not wrap (io_uring, AIO, a peer's process_vm_readv) fail with \
                 EFAULT on such pages. Full delivery: `sysctl vm.unprivileged_userfaultfd=1` \
                 or access to /dev/userfaultfd (docs/design.md, \"System calls on managed memory\")",
            );
        }
        // NUMA tiers keep pages mapped: the placer owns them, the fault engine never
        // stores into them.
        let numa = crate::numa::NumaPlacer::new(&cfg, std::path::Path::new("/"));
        let paged: Vec<_> = cfg
            .tiers
            .iter()
            .filter(|t| t.kind != crate::config::TierKind::Numa)
            .cloned()
            .collect();
        let far_capacity: u64 = paged.iter().map(|t| t.capacity).sum();
        let capacity = cfg.dram.saturating_add(far_capacity);
        // Offset space of each tier: enough for every byte that can be allocated at once,
        // plus the virtual size of every small-object arena: an arena reserves a slot range
        // like any region but holds only what mimalloc carved, and counted against the
        // capacity two arenas left no room for a region in a 1 GiB file tier. Offsets are
        // virtual: the memory tier's arena is a reservation, the file tier's file sparse.
        let arenas = (crate::small::CLASSES as u64).saturating_mul(cfg.small_arena as u64);
        let space = capacity.min(1 << 45) + arenas + (64 << 20);
        let mut tiers = Vec::new();
        for (i, t) in paged.into_iter().enumerate() {
            tiers.push(FarTier::open(t, i, space, &uffd_internal).map_err(InitError)?);
        }
        let pool = |n, registered: bool| -> Result<BufferPool, InitError> {
            let p = BufferPool::new(n, MAX_RUN)
                .map_err(|e| InitError(format!("cannot map runtime buffers: {e}")))?;
            if registered {
                uffd_internal
                    .register(p.base(), p.len(), mode::MISSING)
                    .map_err(|e| InitError(format!("cannot register staging buffers: {e}")))?;
            }
            Ok(p)
        };
        let staging = pool(16, true)?;
        let bounce = pool(32, false)?;
        let zero = pool(1, false)?;
        Ok(Engine {
            numa,
            budget: AtomicU64::new(cfg.dram),
            move_limit: AtomicU64::new(cfg.move_limit),
            move_next: AtomicU64::new(0),
            capacity,
            cfg,
            uffd_thread,
            uffd_signal,
            uffd_internal,
            tiers,
            staging,
            bounce,
            zero,
            regions: RwLock::new(Vec::new()),
            retired: Mutex::new(Vec::new()),
            sampled_history: Mutex::new(Vec::new()),
            clock: Mutex::new(ClockState::default()),
            active: AtomicU64::new(0),
            resident: AtomicU64::new(0),
            committed: AtomicU64::new(0),
            peak_resident: AtomicU64::new(0),
            pinned: AtomicU64::new(0),
            wake_evictor: os::EventFd::new().map_err(|e| InitError(format!("eventfd: {e}")))?,
            drop_behind: crate::evict::DropBehind::new(),
            counters: EngineCounters::default(),
            next_id: AtomicU32::new(1),
            shutdown: AtomicBool::new(false),
            gate: crate::fork::Gate::new(),
            forks: AtomicU64::new(0),
            unshare_pending: AtomicU64::new(0),
        })
    }

    pub(crate) fn uffd_for(&self, d: Delivery) -> &Uffd {
        match d {
            Delivery::Thread => &self.uffd_thread,
            Delivery::Signal => &self.uffd_signal,
        }
    }

    pub(crate) fn io(&self) -> IoContext<'_> {
        IoContext {
            internal: &self.uffd_internal,
            staging: &self.staging,
            bounce: &self.bounce,
        }
    }

    /// Zeroed buffer of MAX_RUN bytes (never written after start).
    pub(crate) fn zero_addr(&self) -> usize {
        self.zero.base()
    }

    pub(crate) fn internal_contains(&self, addr: usize) -> bool {
        self.staging.contains(addr)
    }

    /// The DRAM budget now.
    pub fn budget(&self) -> u64 {
        self.budget.load(Relaxed)
    }

    /// A new budget (the node daemon's grant, never above the configured `dram`): the
    /// evictor demotes down to it at once. Returns the budget applied.
    pub fn set_budget(&self, bytes: u64) -> u64 {
        let b = bytes.clamp(1 << 20, self.cfg.dram);
        let old = self.budget.swap(b, Relaxed);
        if b < old {
            self.wake_evictor.notify();
        }
        b
    }

    /// Limits page movement (fetches and evictions) to `bps` bytes/s (the node daemon's
    /// limit); 0 lifts it. The configured `move_limit` stays in force: the lower of the two
    /// applies.
    pub fn set_move_limit(&self, bps: u64) {
        let eff = match (self.cfg.move_limit, bps) {
            (0, b) => b,
            (c, 0) => c,
            (c, b) => c.min(b),
        };
        self.move_limit.store(eff, Relaxed);
    }

    pub fn move_limit(&self) -> u64 {
        self.move_limit.load(Relaxed)
    }

    /// Waits until moving `bytes` fits the movement limit (a 20 ms burst allowed).
    /// Signal-safe: atomics and nanosleep only.
    pub(crate) fn pace(&self, bytes: u64) {
        let rate = self.move_limit.load(Relaxed);
        if rate == 0 {
            return;
        }
        let now = os::now_ns();
        let mut cur = self.move_next.load(Relaxed);
        loop {
            let (next, wait) = attune_policy::share::pace(now, cur, bytes, rate, 20_000_000);
            match self
                .move_next
                .compare_exchange_weak(cur, next, AcqRel, Relaxed)
            {
                Ok(_) => {
                    if wait > 0 {
                        self.counters.paced_ns.fetch_add(wait, Relaxed);
                        std::thread::sleep(std::time::Duration::from_nanos(wait));
                    }
                    return;
                }
                Err(c) => cur = c,
            }
        }
    }

    /// Free DRAM headroom the evictor keeps: evict above `high`, down to `low`. The
    /// headroom scales with the budget (it was configured against `dram`).
    pub fn watermarks(&self) -> (u64, u64) {
        let budget = self.budget();
        let headroom =
            (self.cfg.headroom as u128 * budget as u128 / self.cfg.dram.max(1) as u128) as u64;
        let low = budget.saturating_sub(headroom);
        let high = budget.saturating_sub(headroom / 2);
        (high, low)
    }

    /// Applies the node daemon's far-memory grant over the `memory` tiers, fastest first
    /// (None lifts it).
    pub fn set_far_grant(&self, bytes: Option<u64>) {
        let mut left = bytes;
        for t in self.tiers.iter().filter(|t| t.is_memory()) {
            let mine = left.map(|l| l.min(t.cfg.capacity));
            t.set_grant(mine);
            left = left.map(|l| l - mine.unwrap_or(0));
        }
    }

    /// Bytes in the `memory` tiers now, and what this process wants there: the managed
    /// bytes that do not fit its DRAM budget, within the tiers' configured capacity.
    pub fn far_memory(&self) -> (u64, u64) {
        let mem = || self.tiers.iter().filter(|t| t.is_memory());
        let used: u64 = mem().map(|t| t.used()).sum();
        let cap: u64 = mem().map(|t| t.cfg.capacity).sum();
        let outside = self.committed.load(Relaxed).saturating_sub(self.budget());
        let want = if cap == 0 {
            0
        } else {
            outside.max(used).saturating_add(4 << 20).min(cap)
        };
        (used, want)
    }

    /// Bytes the active class may hold now (`attune_policy::victim`).
    pub fn active_target(&self) -> u64 {
        attune_policy::victim::active_target(
            self.budget(),
            self.pinned.load(Relaxed),
            self.cfg.inactive_share,
        )
    }

    /// Whether the active class holds more than it may (after a budget shrink).
    pub fn active_over_target(&self) -> bool {
        self.active.load(Relaxed) > self.active_target()
    }

    /// Takes `bytes` out of the active class's count.
    pub(crate) fn deactivate(&self, bytes: u64) {
        let _ = self
            .active
            .fetch_update(AcqRel, Acquire, |v| Some(v.saturating_sub(bytes)));
    }

    /// Evicted bytes so far in 4 KiB pages, wrapping: the clock of refault distances.
    pub(crate) fn eviction_clock(&self) -> u32 {
        (self.counters.evicted_bytes.load(Relaxed) >> 12) as u32
    }

    /// Whether flags protect a region in the current mode.
    pub fn is_protected(&self, r: &Region) -> bool {
        self.cfg.mode == Mode::Attuned && r.flags().is_protected()
    }

    /// The region containing `addr` (lock held only for the lookup). Signal-safe.
    pub fn find(&self, addr: usize) -> Option<Arc<Region>> {
        let t = self.regions.read().unwrap_or_else(|p| p.into_inner());
        let i = t.partition_point(|r| r.base <= addr);
        if i == 0 {
            return None;
        }
        let r = &t[i - 1];
        if r.contains(addr) {
            Some(r.clone())
        } else {
            None
        }
    }

    /// The regions that overlap `[addr, addr+len)`, in address order.
    pub fn overlapping(&self, addr: usize, len: usize) -> Vec<Arc<Region>> {
        let end = addr.saturating_add(len);
        let t = self.regions.read().unwrap_or_else(|p| p.into_inner());
        let i = t.partition_point(|r| r.base + r.len <= addr);
        t[i..]
            .iter()
            .take_while(|r| r.base < end)
            .cloned()
            .collect()
    }

    /// Whether kernel accesses to missing pages fail with EFAULT instead of faulting: the
    /// userfaultfd sees user-mode faults only (what an unprivileged user gets where
    /// `vm.unprivileged_userfaultfd=0`), or the region's faults come by SIGBUS.
    pub fn kernel_access_fails(&self, r: &Region) -> bool {
        self.uffd_thread.user_mode_only || r.delivery == Delivery::Signal
    }

    /// True when every userfaultfd sees user-mode faults only.
    pub fn user_mode_only(&self) -> bool {
        self.uffd_thread.user_mode_only
    }

    /// Makes `[addr, addr+len)` (inside `r`) resident and keeps it so: pins the chunks
    /// that were not pinned and pushes them on `held`, for [`Engine::release`]. For a
    /// kernel access that cannot fault (see `kernel_access_fails`). Chunks pinned already
    /// (by the program, or by another thread's hold) are left to their owner.
    pub fn hold(&self, r: &Region, addr: usize, len: usize, held: &mut Vec<usize>) {
        let (c0, c1) = chunk_span(r, addr, len);
        for c in c0..c1 {
            if !r.set_bits(c, PIN, 0).pinned() {
                self.pinned.fetch_add(r.chunk as u64, Relaxed);
                held.push(c);
            }
        }
        self.prefetch(r, addr, len);
    }

    /// Unpins the chunks a [`Engine::hold`] pinned.
    pub fn release(&self, r: &Region, held: &[usize]) {
        for &c in held {
            if r.set_bits(c, 0, PIN).pinned() {
                self.pinned.fetch_sub(r.chunk as u64, Relaxed);
            }
        }
    }

    /// Creates a region of at least `size` bytes.
    pub fn alloc_region(
        &self,
        size: usize,
        opts: &AllocOptions,
        kind: RegionKind,
        align: usize,
    ) -> Result<Arc<Region>, Errno> {
        // Attuned: the flags choose the unit of movement (attune_policy::chunk); the
        // temperature-only mode treats every region alike. Either way the home tier's
        // floor applies (a property of the medium, not of the workflow).
        let home = self.home_tier(opts);
        let tier_min = self
            .tiers
            .get(home)
            .map(|t| t.cfg.min_chunk)
            .unwrap_or(4096);
        let chunk = opts.chunk_size.unwrap_or(match self.cfg.mode {
            Mode::Attuned => {
                attune_policy::chunk::chunk_for(opts.flags, self.cfg.chunk_size, tier_min)
            }
            Mode::Temperature => self.cfg.chunk_size.max(tier_min),
        });
        if crate::config::validate_chunk(chunk).is_err() {
            return Err(Errno(libc::EINVAL));
        }
        if size == 0 {
            return Err(Errno(libc::EINVAL));
        }
        let len = size.checked_add(chunk - 1).ok_or(Errno(libc::ENOMEM))? / chunk * chunk;
        if kind == RegionKind::Dedicated {
            let prev = self.committed.fetch_add(len as u64, AcqRel);
            if prev + len as u64 > self.capacity {
                self.committed.fetch_sub(len as u64, AcqRel);
                return Err(Errno(libc::ENOMEM));
            }
        }
        let undo_commit = || {
            if kind == RegionKind::Dedicated {
                self.committed.fetch_sub(len as u64, AcqRel);
            }
        };
        let align = align.max(if len >= 2 << 20 { 2 << 20 } else { chunk });
        let base = match mem::map_anon_aligned(len, align, true) {
            Ok(b) => b,
            Err(e) => {
                undo_commit();
                return Err(e);
            }
        };
        // Inherited by a forked child, which takes the runtime over (`crate::fork`).
        let _ = mem::advise(base, len, mem::MADV_NOHUGEPAGE);
        let delivery = match opts.fault_mode.unwrap_or(self.cfg.fault_mode) {
            FaultMode::Thread => Delivery::Thread,
            FaultMode::Signal => Delivery::Signal,
        };
        if delivery == Delivery::Signal {
            KERNEL_ACCESS_MAY_FAIL.store(true, Relaxed);
        }
        if let Err(e) = self.uffd_for(delivery).register(base, len, mode::MISSING) {
            let _ = mem::unmap(base, len);
            undo_commit();
            return Err(e);
        }
        let mut slots = Vec::with_capacity(self.tiers.len());
        for t in &self.tiers {
            match t.reserve(len as u64) {
                Some(o) => slots.push(o),
                None => {
                    for (i, o) in slots.iter().enumerate() {
                        self.tiers[i].release(*o, len as u64);
                    }
                    let _ = mem::unmap(base, len);
                    undo_commit();
                    return Err(Errno(libc::ENOMEM));
                }
            }
        }
        let id = self.next_id.fetch_add(1, Relaxed);
        // Online prediction samples the regions that come without flags (and without a
        // pin of their own) for `predict_window_ms`; `attune profile` samples every region.
        let predicting = self.cfg.predict_window_ms > 0
            && self.cfg.mode == Mode::Attuned
            && opts.flags == Flags::NONE
            && opts.pin_bytes.is_none();
        let sampling = self.cfg.sample_rate > 0 || predicting;
        let r = Arc::new(Region::new(
            id,
            base,
            len,
            size,
            chunk,
            opts.flags,
            delivery,
            kind,
            slots,
            home,
            sampling && kind == RegionKind::Dedicated,
        ));
        if predicting && kind == RegionKind::Dedicated {
            r.predict_due.store(
                os::now_ns() + self.cfg.predict_window_ms * 1_000_000,
                Relaxed,
            );
        }
        {
            let _g = os::SignalGuard::new();
            let mut t = self.regions.write().unwrap_or_else(|p| p.into_inner());
            let i = t.partition_point(|x| x.base < base);
            t.insert(i, r.clone());
        }
        // Pin and pre-fault: LAT/SHL get `pin_fraction` by default (IMME Algorithm 1).
        let pin = match opts.pin_bytes {
            Some(p) => p.min(len),
            None if self.cfg.mode == Mode::Attuned && opts.flags.is_protected() => {
                // The policy's share, within the policy pins' room.
                let want = (len as f64 * self.cfg.pin_fraction) as usize;
                want.min(self.policy_pin_room()) / r.chunk * r.chunk
            }
            None => 0,
        };
        if pin > 0 {
            self.pin(&r, base, pin, true);
        }
        if opts.prefault {
            let room = self.budget().saturating_sub(self.resident.load(Relaxed)) as usize;
            self.prefetch(&r, base, len.min(room));
        }
        Ok(r)
    }

    fn home_tier(&self, opts: &AllocOptions) -> usize {
        if let Some(t) = opts.preferred_tier {
            if t < self.tiers.len() {
                return t;
            }
        }
        // CAP data goes to the capacity tier: the biggest far tier that is memory, else
        // the biggest of all; everything else to the fastest. (A file tier holds CAP data
        // only as every region's overflow, when memory tiers are full or absent: see
        // docs/design.md, "CAP's tier".)
        let pageable: Vec<&FarTier> = self.tiers.iter().filter(|t| t.is_pageable()).collect();
        if self.cfg.mode == Mode::Attuned
            && opts.flags.contains(Flags::CAP)
            && !opts.flags.is_protected()
        {
            let memory = pageable
                .iter()
                .filter(|t| t.cfg.kind == crate::config::TierKind::Memory)
                .max_by_key(|t| t.cfg.capacity);
            if let Some(t) = memory.or_else(|| pageable.iter().max_by_key(|t| t.cfg.capacity)) {
                return t.index;
            }
        }
        pageable.first().map(|t| t.index).unwrap_or(0)
    }

    /// Frees a dedicated region that starts exactly at `ptr`.
    pub fn free_region(&self, r: &Arc<Region>) {
        // The clock lock keeps the evictor out of this region while it goes away.
        let _g = os::SignalGuard::new();
        let _clock = self.clock.lock().unwrap_or_else(|p| p.into_inner());
        {
            let mut t = self.regions.write().unwrap_or_else(|p| p.into_inner());
            t.retain(|x| !Arc::ptr_eq(x, r));
        }
        r.freed.store(true, Release);
        self.drop_behind.forget(r.base, r.len);
        let _ = self.uffd_for(r.delivery).unregister(r.base, r.len);
        let _ = mem::unmap(r.base, r.len);
        let mut resident = 0u64;
        let mut pinned = 0u64;
        let mut active = 0u64;
        for c in 0..r.chunks() {
            let s = r.state(c);
            if s.pinned() {
                pinned += r.chunk as u64;
            }
            match s.place() {
                Where::Resident | Where::Fetching | Where::Evicting => {
                    resident += r.chunk as u64;
                    if s.active() {
                        active += r.chunk as u64;
                    }
                }
                Where::Far => {
                    if let Some(t) = self.tiers.get(s.tier()) {
                        t.forget(r.chunk as u64);
                    }
                }
                Where::Fresh => {}
            }
        }
        let _ = self
            .resident
            .fetch_update(AcqRel, Acquire, |v| Some(v.saturating_sub(resident)));
        let _ = self
            .pinned
            .fetch_update(AcqRel, Acquire, |v| Some(v.saturating_sub(pinned)));
        self.deactivate(active);
        // The stored content goes now; the offsets return in `evict::drop_retired`, once
        // no fetch of this region is in flight (a use after free by another thread must
        // not release a new owner's slot).
        for (i, o) in r.slots.iter().enumerate() {
            self.tiers[i].discard(*o, r.len as usize);
        }
        if r.kind == RegionKind::Dedicated {
            self.committed.fetch_sub(r.len as u64, AcqRel);
        }
        self.retired
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(r.clone());
        if r.samples.enabled() {
            let mut h = self
                .sampled_history
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            if h.len() >= 1024 {
                h.remove(0);
            }
            h.push(r.clone());
        }
    }

    /// Bytes pinned over all regions.
    pub fn pinned_bytes(&self) -> u64 {
        self.pinned.load(Relaxed)
    }

    /// Bytes the runtime's own pins (LAT/SHL `pin_fraction`, online prediction's hot
    /// parts) may still take: what is left of half the budget. Pins that fill the budget
    /// leave nothing to page through, and every fault thrashes. Explicit `attune_pin`
    /// calls are refused only beyond the whole budget.
    pub fn policy_pin_room(&self) -> usize {
        (self.budget() / 2).saturating_sub(self.pinned_bytes()) as usize
    }

    /// Makes `[addr, addr+len)` resident and, with `pin`, never evicted.
    pub fn pin(&self, r: &Region, addr: usize, len: usize, pin: bool) {
        let (c0, c1) = chunk_span(r, addr, len);
        for c in c0..c1 {
            if pin {
                if !r.set_bits(c, PIN, 0).pinned() {
                    self.pinned.fetch_add(r.chunk as u64, Relaxed);
                }
            } else if r.set_bits(c, 0, PIN).pinned() {
                self.pinned.fetch_sub(r.chunk as u64, Relaxed);
            }
        }
        if pin {
            self.prefetch(r, addr, len);
        }
    }

    /// Drops the content of `[addr, addr+len)` (page-aligned, inside `r`): it reads as zero
    /// afterwards. Whole chunks go back to Fresh, their DRAM and far-tier space released
    /// (the application's `MADV_DONTNEED` cannot do that for a chunk in a far tier: its
    /// pages are not mapped, so its old content would come back). The parts of chunks at
    /// the edges, and pinned chunks (they stay resident), are written with zeros.
    pub fn discard(&self, r: &Region, addr: usize, len: usize) {
        let end = addr + len;
        let lo = (addr - r.base).div_ceil(r.chunk);
        let hi = (end - r.base) / r.chunk;
        let zero = |a: usize, b: usize| {
            if b > a {
                // SAFETY: inside r, asked for by the application; no chunk is held here.
                unsafe { mem::zero_managed(a, b - a) };
            }
        };
        if lo >= hi {
            zero(addr, end);
            return;
        }
        zero(addr, r.chunk_addr(lo));
        for c in lo..hi {
            if !self.discard_chunk(r, c) {
                zero(r.chunk_addr(c), r.chunk_addr(c) + r.chunk);
            }
        }
        zero(r.chunk_addr(hi), end);
    }

    /// Drops chunk `c`'s content and space; false for a pinned resident chunk (the caller
    /// zeroes it in place).
    fn discard_chunk(&self, r: &Region, c: usize) -> bool {
        let mut spins = 0u32;
        loop {
            let s = r.state(c);
            match s.place() {
                Where::Fresh => return true,
                Where::Fetching | Where::Evicting => crate::fork::backoff(&mut spins),
                Where::Resident if s.pinned() => return false,
                Where::Resident | Where::Far => {
                    // Held while its content goes: no fetch or eviction runs meanwhile.
                    if !r.cas(c, s, s.with(Where::Fetching, s.tier())) {
                        continue;
                    }
                    if s.place() == Where::Resident {
                        let _ = mem::advise(r.chunk_addr(c), r.chunk, mem::MADV_DONTNEED);
                        let _ = self.resident.fetch_update(AcqRel, Acquire, |v| {
                            Some(v.saturating_sub(r.chunk as u64))
                        });
                        if s.active() {
                            self.deactivate(r.chunk as u64);
                        }
                    } else if let Some(t) = self.tiers.get(s.tier()) {
                        t.discard(r.slots[s.tier()] + (c * r.chunk) as u64, r.chunk);
                        t.forget(r.chunk as u64);
                    }
                    r.file_hash[c].store(0, Relaxed);
                    r.counters.discarded.fetch_add(1, Relaxed);
                    r.set_bits(c, 0, ACTIVE | CREDIT_MASK);
                    r.settle(c, Where::Fresh, 0, 0);
                    return true;
                }
            }
        }
    }

    /// Brings `[addr, addr+len)` into DRAM now (as if faulted), within the budget.
    pub fn prefetch(&self, r: &Region, addr: usize, len: usize) {
        let (c0, c1) = chunk_span(r, addr, len);
        for c in c0..c1 {
            crate::fault::fetch_chunk(self, r, c);
        }
    }

    /// Enters the fork gate (see `crate::fork::Gate`): every API operation on regions.
    pub fn enter(&self) -> crate::fork::Inside<'_> {
        self.gate.enter()
    }

    /// Sets the counters of events (not of state) to zero: a forked child reports its own.
    pub(crate) fn reset_event_counters(&self) {
        let c = &self.counters;
        for a in [
            &c.faults,
            &c.evictions,
            &c.evicted_bytes,
            &c.fetched_bytes,
            &c.direct_reclaims,
            &c.dropped_behind_bytes,
            &c.evictor_evicted_bytes,
            &c.budget_overruns,
            &c.protected_skips,
            &c.load_errors,
            &c.sample_parks,
            &c.sample_hits,
            &c.paced_ns,
            &c.denied_activations,
            &c.active_tests,
            &c.unshared,
        ] {
            a.store(0, Relaxed);
        }
        for a in &c.sample_delay_us {
            a.store(0, Relaxed);
        }
        self.peak_resident
            .store(self.resident.load(Relaxed), Relaxed);
        for t in &self.tiers {
            t.reset_event_counters();
        }
        for r in self
            .regions
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
        {
            r.counters.reset();
        }
    }

    /// Starts the background threads and the SIGBUS resolver.
    pub fn start(self: &'static Self) -> Result<(), InitError> {
        self.start_threads()?;
        attune_sys::signal::install(crate::fault::on_sigbus)
            .map_err(|e| InitError(format!("cannot install the SIGBUS handler: {e}")))?;
        Ok(())
    }

    /// Starts the background threads (evictor, fault handler, NUMA heat scanner, sampler): at start, and in a
    /// forked child, which has none of its parent's threads.
    pub(crate) fn start_threads(self: &'static Self) -> Result<(), InitError> {
        attune_sys::os::spawn_runtime_thread("attune-evict", move || {
            crate::evict::evictor_loop(self)
        })
        .map_err(|e| InitError(format!("cannot start the evictor thread: {e}")))?;
        attune_sys::os::spawn_runtime_thread("attune-fault", move || {
            crate::fault::handler_loop(self)
        })
        .map_err(|e| InitError(format!("cannot start the fault thread: {e}")))?;
        if self.numa.is_some() && self.cfg.heat_interval_ms > 0 {
            attune_sys::os::spawn_runtime_thread("attune-heat", move || {
                crate::numa_heat::heat_loop(self)
            })
            .map_err(|e| InitError(format!("cannot start the NUMA heat thread: {e}")))?;
        }
        if self.cfg.sample_rate > 0 || self.cfg.predict_window_ms > 0 {
            attune_sys::os::spawn_runtime_thread("attune-sample", move || {
                crate::sample::sampler_loop(self)
            })
            .map_err(|e| InitError(format!("cannot start the sampler thread: {e}")))?;
        }
        Ok(())
    }
}

pub(crate) fn chunk_span(r: &Region, addr: usize, len: usize) -> (usize, usize) {
    let start = addr.max(r.base);
    let end = addr.saturating_add(len).min(r.base + r.len);
    if end <= start {
        return (0, 0);
    }
    (r.chunk_of(start), r.chunk_of(end - 1) + 1)
}
