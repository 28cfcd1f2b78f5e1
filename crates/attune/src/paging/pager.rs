//! The paging engine's state: the userfaultfds, the far tiers, the regions and their
//! chunks' DRAM accounting, the budget and the movement limit. The operations on it are
//! in the modules beside it: allocation, free, pin and prefetch in `ops.rs`, the fault
//! path in `fault.rs`, replacement in `evict.rs`.

use crate::config::{Config, FaultMode, Mode};
use crate::pool::BufferPool;
use crate::region::Region;
use crate::tier::{FarTier, IoContext};
use attune_policy::{budget, Flags};
use attune_sys::os;
use attune_sys::uffd::{feature, mode, Delivery, Uffd};
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

/// Counters of the paging engine.
#[derive(Default)]
pub struct Counters {
    pub faults: AtomicU64,
    /// Time spent resolving faults (ns): from the fault path's entry to the page's
    /// placement, in the handler thread or the faulting thread. Under thread delivery the
    /// hand-off to the handler is not in it.
    pub fault_ns: AtomicU64,
    pub evictions: AtomicU64,
    pub evicted_bytes: AtomicU64,
    pub fetched_bytes: AtomicU64,
    pub direct_reclaims: AtomicU64,
    /// Bytes evicted from behind streams (`super::behind::DropBehind`).
    pub dropped_behind_bytes: AtomicU64,
    /// Bytes read ahead, and the part of them a later fault of the same run showed was
    /// gone past (`attune_policy::readahead`, `Decision::used`): the rest is an upper
    /// bound of what read-ahead moved for nothing (a run's last window never shows).
    pub readahead_bytes: AtomicU64,
    pub readahead_used_bytes: AtomicU64,
    /// Bytes of the chunks faults asked for (not their read-ahead), and the part of the
    /// read-ahead the run's later faults show the program touched
    /// (`attune_policy::readahead::Decision::used_touched`): with them the report's
    /// amplification, (demand + read-ahead) / (demand + read-ahead shown touched).
    pub demand_bytes: AtomicU64,
    pub readahead_touched_bytes: AtomicU64,
    /// Bytes the background evictor evicted (the rest of `evicted_bytes` was evicted by
    /// faulting threads or handler threads reclaiming for themselves).
    pub evictor_evicted_bytes: AtomicU64,
    /// Times the budget was exceeded because nothing could be evicted (all pinned or all
    /// tiers full): the application keeps running, the overrun is reported.
    pub budget_overruns: AtomicU64,
    /// Chunks an eviction left in DRAM because the program had changed their protection
    /// (mprotect to read-only or none).
    pub protected_skips: AtomicU64,
    /// Runs the hand claimed for eviction that no far tier took for lack of room (all
    /// full, failing or backing off), put back in DRAM: a sweep ends at the first such run
    /// (`super::evict`), so they stay below one a fault.
    pub unplaced_runs: AtomicU64,
    /// Runs whose data could not be placed: the access failed with SIGBUS (and the error
    /// line said why).
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
    /// Regions created under each fault delivery.
    pub regions_thread: AtomicU64,
    pub regions_signal: AtomicU64,
    /// 2 MiB spans put on huge pages (`super::huge`), and huge spans a move out split.
    pub huge_collapses: AtomicU64,
    pub huge_splits: AtomicU64,
    /// Bytes of evicted pages a tier that keeps copies was not written again: it held
    /// their content already (`attune_policy::writeback`).
    pub clean_bytes: AtomicU64,
    /// Bytes of evicted chunks kept as one repeated word (`super::fill`), and bytes that
    /// faults placed from such words: no tier wrote or read them.
    pub filled_bytes: AtomicU64,
    pub fill_placed_bytes: AtomicU64,
    /// Bytes placed through a staging buffer because discard reports read and not yet
    /// acted on covered part of the run (`fault::place_zeroing`), and the time those
    /// placements took (ns), copy and load included.
    pub zeroed_placed_bytes: AtomicU64,
    pub zeroed_placed_ns: AtomicU64,
    /// Faults that found every far tier full and waited for the node daemon to grow one
    /// (`super::room`), and the time they waited (ns).
    pub room_waits: AtomicU64,
    pub room_wait_ns: AtomicU64,
}

impl Counters {
    /// The counters the statistics report, by their names there (`attune_stats_json`'s
    /// `engine` object, each process snapshot of the `attune run` report and its totals):
    /// one list, so they cannot drift apart. Page movement, then the online prediction.
    pub fn statistics(&self) -> [(&'static str, &AtomicU64); 30] {
        [
            ("faults", &self.faults),
            ("fault_ns", &self.fault_ns),
            ("evictions", &self.evictions),
            ("fetched_bytes", &self.fetched_bytes),
            ("evicted_bytes", &self.evicted_bytes),
            ("budget_overruns", &self.budget_overruns),
            ("room_waits", &self.room_waits),
            ("room_wait_ns", &self.room_wait_ns),
            ("direct_reclaims", &self.direct_reclaims),
            ("evictor_evicted_bytes", &self.evictor_evicted_bytes),
            ("dropped_behind_bytes", &self.dropped_behind_bytes),
            ("readahead_bytes", &self.readahead_bytes),
            ("readahead_used_bytes", &self.readahead_used_bytes),
            ("demand_bytes", &self.demand_bytes),
            ("readahead_touched_bytes", &self.readahead_touched_bytes),
            ("online_split_regions", &self.online_split_regions),
            ("online_kept_regions", &self.online_kept_regions),
            ("online_pinned_bytes", &self.online_pinned_bytes),
            ("protected_skips", &self.protected_skips),
            ("unplaced_runs", &self.unplaced_runs),
            ("regions_thread", &self.regions_thread),
            ("regions_signal", &self.regions_signal),
            ("huge_collapses", &self.huge_collapses),
            ("huge_splits", &self.huge_splits),
            ("clean_bytes", &self.clean_bytes),
            ("filled_bytes", &self.filled_bytes),
            ("fill_placed_bytes", &self.fill_placed_bytes),
            ("zeroed_placed_bytes", &self.zeroed_placed_bytes),
            ("zeroed_placed_ns", &self.zeroed_placed_ns),
            ("load_errors", &self.load_errors),
        ]
    }
}

/// How a memory cgroup's usage bounded the budget (`super::limit`).
#[derive(Default)]
pub struct CgroupStats {
    /// The limit of the group read (0: no limit, or `follow_limit` off).
    pub limit: AtomicU64,
    /// Times the cap lowered the budget, the lowest budget it left (0: never), and the
    /// most the group held outside the runtime's pages.
    pub lowered: AtomicU64,
    pub lowest_budget: AtomicU64,
    pub outside_peak: AtomicU64,
    /// Resident managed bytes of the other runtimes in the group, as attuned last said
    /// (0: alone, or no daemon): not outside (`attune_policy::budget::CgroupReading`).
    pub peers: AtomicU64,
    /// How many they are, as attuned last said (0: alone, no daemon, or one before
    /// this figure): the free room below the limit is divided by it.
    pub peer_runtimes: AtomicU64,
    /// The boards of the group's runtimes attuned gave (`attune_proto::BOARD_WORDS`), one
    /// per connection that had one: they are kept for the process's life (a daemon restart
    /// gives a new one; after 16 restarts `Peers` alone), so no thread ever reads an
    /// unmapped one, and a forked child drops its parent's with one store.
    boards: [std::sync::OnceLock<Board>; 16],
    /// Which board is this process's now (its index + 1; 0: none).
    board_now: std::sync::atomic::AtomicUsize,
}

/// This process's slot on its memory cgroup's board (`attune_proto::BOARD_WORDS`).
pub struct Board {
    pub words: attune_sys::unix::SharedWords,
    pub slot: usize,
}

impl Board {
    /// What the others hold resident (the sum of their slots) and how many they are.
    pub fn peers(&self) -> (u64, u64) {
        let w = self.words.words();
        let sum = w
            .iter()
            .enumerate()
            .skip(1)
            .filter(|&(i, _)| i != self.slot)
            .fold(0u64, |s, (_, v)| s.saturating_add(v.load(Relaxed)));
        let count = w[0].load(Relaxed).min(w.len() as u64 - 1);
        (sum, count.saturating_sub(1))
    }

    /// Writes what this process holds resident in its slot.
    pub fn publish(&self, resident: u64) {
        self.words.words()[self.slot].store(resident, Relaxed);
    }

    /// [`Board::publish`] from the fault path: only when the figure moved by a MiB, so
    /// the other processes' reads of the line are not disturbed on every fault. Published
    /// at the evictor's readings alone, three programs filling one group at once read
    /// each other 45 MiB low (their readings are 5-50 ms apart).
    #[inline]
    pub fn publish_moved(&self, resident: u64) {
        let w = &self.words.words()[self.slot];
        if w.load(Relaxed).abs_diff(resident) >= 1 << 20 {
            w.store(resident, Relaxed);
        }
    }
}

impl CgroupStats {
    /// The board in use, if any.
    pub fn board(&self) -> Option<&Board> {
        match self.board_now.load(std::sync::atomic::Ordering::Acquire) {
            0 => None,
            i => self.boards.get(i - 1).and_then(|b| b.get()),
        }
    }

    /// Takes `b` as the board in use (None: none, as after a fork or without a daemon).
    /// Called by one thread at a time (the daemon client's, or a forked child's start).
    pub fn set_board(&self, b: Option<Board>) {
        let i = match b {
            None => 0,
            Some(b) => match self.boards.iter().position(|s| s.get().is_none()) {
                Some(i) if self.boards[i].set(b).is_ok() => i + 1,
                _ => 0,
            },
        };
        self.board_now
            .store(i, std::sync::atomic::Ordering::Release);
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

pub struct Pager {
    pub cfg: Config,
    pub(crate) uffd_thread: Uffd,
    pub(crate) uffd_signal: Uffd,
    /// Registered over the memory tier arena and the staging buffers (MOVE destinations).
    pub(crate) uffd_internal: Uffd,
    pub tiers: Vec<FarTier>,
    pub(crate) staging: BufferPool,
    pub(crate) bounce: BufferPool,
    pub(crate) zero: BufferPool,
    /// The words of filled chunks (`super::fill`).
    pub(crate) fills: super::fill::Fills,
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
    /// Highest `resident` seen after a fault's reservation (reports), less the bytes
    /// other faulting threads had reserved but not yet made room for (`reserving`).
    pub peak_resident: AtomicU64,
    /// Bytes reserved by faults whose reclaim has not finished yet: under signal delivery
    /// several threads reserve at once, and each one's room is made by its own reclaim.
    pub(crate) reserving: AtomicU64,
    /// Bytes of pinned chunks over all regions.
    pub pinned: AtomicU64,
    /// Bytes of resident chunks in the active class (refaulted soon after eviction).
    pub active: AtomicU64,
    /// The DRAM budget now: the lower of `grant` and `cgroup_cap`.
    budget: AtomicU64,
    /// The configured `dram`, or the node daemon's grant (`crate::daemon_client`).
    grant: AtomicU64,
    /// What the memory cgroup's usage leaves (`super::limit`; u64::MAX: no cap).
    cgroup_cap: AtomicU64,
    /// How the cgroup's usage bounded the budget, for the reports.
    pub cgroup: CgroupStats,
    /// Page movement limit in bytes/s (0: none), set by the node daemon while a
    /// latency-sensitive neighbour runs; `move_next` is the pacing's virtual time.
    move_limit: AtomicU64,
    move_next: AtomicU64,
    pub capacity: u64,
    pub(crate) wake_evictor: os::EventFd,
    /// Chunks streams have just passed, the first victims (`super::behind::DropBehind`).
    pub(crate) drop_behind: super::behind::DropBehind,
    pub counters: Counters,
    pub(super) next_id: AtomicU32,
    pub(crate) shutdown: AtomicBool,
    /// Operations that claim chunks or take engine locks run inside it; a fork waits
    /// until none is in flight (`crate::fork`).
    pub(crate) gate: crate::sync::gate::Gate,
    /// A forked child starting its runtime threads (`crate::fork`): thread-delivery regions
    /// are registered on the signal userfaultfd meanwhile, so whoever faults resolves the
    /// fault itself; the handler thread cannot serve before it runs, and starting it reads
    /// memory the program allocated (locale data, the new thread's DTV under `--small`).
    pub(crate) serving_inline: AtomicBool,
    /// Runtime threads whose body has begun (glibc's thread start-up done).
    pub(crate) threads_started: AtomicU32,
    /// Forks this process took part in, as parent or child: after one, pages may be
    /// shared copy-on-write and `UFFDIO_MOVE` refuses them (EBUSY).
    pub forks: AtomicU64,
    /// Chunks marked SHARED since the evictor's last un-share pass.
    pub(crate) unshare_pending: AtomicU64,
    /// Discard reports read and not acted on yet (`super::removes`).
    pub(crate) removes: super::removes::Removes,
    /// Messages the handler thread read and has not acted on (`super::fault::handler_loop`).
    pub(crate) handler_queue: super::removes::Queue,
    /// Faults waiting for the node daemon to grow a full far tier (`super::room`).
    pub far_growth: FarGrowth,
}

/// A fault waiting for the node daemon to grow a full far tier (`super::room`), between
/// the fault path and the daemon client.
pub struct FarGrowth {
    /// The daemon is connected: its grants can grow the tiers it sizes.
    pub(super) daemon: AtomicBool,
    /// Waits begun; the daemon client reports at once when this moved.
    pub(super) asks: AtomicU64,
    /// The tiers' granted bytes when the last wait gave up (u64::MAX: none did).
    pub(super) gave_up_at: AtomicU64,
}

impl Default for FarGrowth {
    fn default() -> Self {
        FarGrowth {
            daemon: AtomicBool::new(false),
            asks: AtomicU64::new(0),
            gave_up_at: AtomicU64::new(u64::MAX),
        }
    }
}

impl FarGrowth {
    /// The daemon client's session began (true) or ended (false).
    pub fn set_daemon(&self, connected: bool) {
        self.daemon.store(connected, Release);
    }

    /// Waits begun so far (the daemon client reports when it moved).
    pub fn asks(&self) -> u64 {
        self.asks.load(Acquire)
    }
}

/// Set once kernel accesses to some managed memory may fail with EFAULT (see
/// [`Pager::kernel_access_fails`]): until then the interposer's system-call wrappers
/// cost one load.
pub static KERNEL_ACCESS_MAY_FAIL: AtomicBool = AtomicBool::new(false);

/// Set once the process is seen to hand memory to the kernel outside the calls the
/// interposer retries (`attune run`'s automatic delivery, `attune_policy::delivery`):
/// regions created afterwards without a delivery of their own get the handler thread.
/// Regions created before keep theirs: a region cannot change userfaultfd without a window
/// in which its missing pages would fill with zeros.
pub static THREAD_FOR_NEW_REGIONS: AtomicBool = AtomicBool::new(false);

/// Why the engine could not start.
#[derive(Debug)]
pub struct InitError(pub String);

impl Pager {
    /// The time samples are timed by: the program's clock under `attune profile`
    /// (`sample_rate` set; `super::progclock`), wall time for the online prediction alone,
    /// which pays no system call per thread for it and whose cross-check on even and odd
    /// chunks kept a uniform region whole beside two busy loops (3 of 3,
    /// `tests/c/predict_online.c`). Signal-safe.
    pub fn sample_now(&self) -> u64 {
        if self.cfg.sample_rate > 0 {
            super::progclock::CLOCK.now()
        } else {
            attune_sys::os::now_ns()
        }
    }

    /// Builds the paging engine: userfaultfds, tiers, buffers. `arena_space` is the
    /// virtual size of the small-object arenas, which reserve tier offsets like regions.
    /// Its threads are started by the composition root (`crate::engine`).
    pub fn new(cfg: Config, arena_space: u64) -> Result<Pager, InitError> {
        let open = |d: Delivery, wanted: u64| {
            Uffd::open(d, wanted).map_err(|e| {
                InitError(format!(
                    "userfaultfd is not available ({}{}). Attune needs it to move pages between tiers. \
                     Enable it with `sysctl vm.unprivileged_userfaultfd=1`, or grant access to /dev/userfaultfd, \
                     or allow the userfaultfd system call in the container's seccomp profile. \
                     Without it, set ATTUNE_DISABLE_UFFD=1 to run with plain DRAM (no tiering, no budget).",
                    e.errno,
                    if e.missing_features != 0 { format!("; missing kernel features {:#x}, Linux 5.10 or newer is needed", e.missing_features) } else { String::new() }
                ))
            })
        };
        let uffd_internal = open(Delivery::Signal, 0)?;
        // The regions' descriptors report discards (`EVENT_REMOVE`) where pages leave by
        // `UFFDIO_MOVE`: the kernel's `MADV_DONTNEED` cannot reach a page held in a far
        // tier, and a program that calls it without libc (Go's scavenger) would read the
        // old content back where the kernel promises zeros (`Pager::removed`). Without
        // the move, an eviction drops its copied pages with `MADV_DONTNEED` while it
        // holds their chunk, and would wait for its own message: no reports there.
        let removes = if uffd_internal.has(feature::MOVE) {
            feature::EVENT_REMOVE
        } else {
            0
        };
        let uffd_thread = open(Delivery::Thread, removes)?;
        let uffd_signal = open(Delivery::Signal, removes)?;
        // Without UFFDIO_MOVE (before 6.8, or masked) a page leaves a region by copy under
        // write protection (`crate::tier::take_out`): anonymous write-protect (5.7) is the
        // one thing that fallback cannot do without (docs/design/kernels.md).
        // Tried, not only read from the feature bit: a seccomp profile can refuse the
        // ioctl, and every eviction would then fail without a word.
        if !uffd_thread.has(feature::MOVE) {
            if let Err(e) = attune_sys::probe::write_protect_works(&uffd_thread) {
                return Err(InitError(format!(
                    "neither UFFDIO_MOVE (Linux 6.8) nor userfaultfd write-protection of anonymous \
                     memory (Linux 5.7) is usable here (write-protect: {e}): Attune cannot take pages \
                     out of a region safely. Linux 5.10 or newer is needed, with both ioctls allowed \
                     by the container's seccomp profile; set ATTUNE_DISABLE_UFFD=1 to run with plain DRAM."
                )));
            }
        }
        if uffd_thread.user_mode_only {
            KERNEL_ACCESS_MAY_FAIL.store(true, Relaxed);
        }
        // NUMA tiers keep pages mapped: their placer (`crate::numa`) owns them, the paging
        // engine never stores into them.
        let paged: Vec<_> = cfg
            .tiers
            .iter()
            .filter(|t| t.kind != crate::config::TierKind::Numa)
            .cloned()
            .collect();
        let far_capacity: u64 = paged.iter().map(|t| t.capacity).sum();
        // Every configured tier, whether it opens or not: offsets are virtual.
        let planned = cfg.dram.saturating_add(far_capacity);
        // Offset space of each tier: enough for every byte that can be allocated at once,
        // plus the virtual size of every small-object arena: an arena reserves a slot range
        // like any region but holds only what mimalloc carved, and counted against the
        // capacity two arenas left no room for a region in a 1 GiB file tier. Offsets are
        // virtual: the memory tier's arena is a reservation, the file tier's file sparse.
        let space = planned.min(1 << 45) + arena_space + (64 << 20);
        // A far tier that cannot be opened (an unwritable or missing directory, a file
        // system that refuses the file) is left out with a warning, and the others serve:
        // before, one bad directory stopped all tiering and the budget with it. Without
        // any far tier left there is nowhere to evict to, and that fails as before.
        let mut tiers: Vec<FarTier> = Vec::new();
        let mut left_out = Vec::new();
        let wanted = paged.len();
        for t in paged {
            match FarTier::open(t, tiers.len(), space, &uffd_internal) {
                Ok(f) => tiers.push(f),
                Err(e) => {
                    crate::warn!("{e}; left out, the other tiers serve");
                    left_out.push(e);
                }
            }
        }
        if tiers.is_empty() && wanted > 0 {
            return Err(InitError(left_out.join("; ")));
        }
        let capacity = cfg
            .dram
            .saturating_add(tiers.iter().map(|t| t.cfg.capacity).sum::<u64>());
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
        Ok(Pager {
            budget: AtomicU64::new(cfg.dram),
            grant: AtomicU64::new(cfg.dram),
            cgroup_cap: AtomicU64::new(u64::MAX),
            cgroup: CgroupStats::default(),
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
            fills: super::fill::Fills::new(),
            regions: RwLock::new(Vec::new()),
            retired: Mutex::new(Vec::new()),
            sampled_history: Mutex::new(Vec::new()),
            clock: Mutex::new(ClockState::default()),
            active: AtomicU64::new(0),
            resident: AtomicU64::new(0),
            committed: AtomicU64::new(0),
            peak_resident: AtomicU64::new(0),
            reserving: AtomicU64::new(0),
            pinned: AtomicU64::new(0),
            wake_evictor: os::EventFd::new().map_err(|e| InitError(format!("eventfd: {e}")))?,
            drop_behind: super::behind::DropBehind::new(),
            counters: Counters::default(),
            next_id: AtomicU32::new(1),
            shutdown: AtomicBool::new(false),
            gate: crate::sync::gate::Gate::new(),
            serving_inline: AtomicBool::new(false),
            threads_started: AtomicU32::new(0),
            forks: AtomicU64::new(0),
            unshare_pending: AtomicU64::new(0),
            removes: super::removes::Removes::default(),
            handler_queue: super::removes::Queue::default(),
            far_growth: FarGrowth::default(),
        })
    }

    /// How regions are registered: missing faults, and write-protect faults where pages
    /// leave by copy (no `UFFDIO_MOVE`): a write during the copy waits for the chunk.
    pub(crate) fn region_mode(&self) -> u64 {
        if self.moves_pages() {
            mode::MISSING
        } else {
            mode::MISSING | mode::WP
        }
    }

    /// Whether pages leave and return by `UFFDIO_MOVE` (else by copy, `crate::tier::take_out`).
    pub fn moves_pages(&self) -> bool {
        self.uffd_thread.has(feature::MOVE)
    }

    /// The kernel features whose fallback this engine runs (absent, masked, or refused at
    /// start and so masked), by name (`attune_sys::kernel::FEATURES`): what the run report
    /// shows. Read from the engine's own descriptor, which leaves masked features out:
    /// the report refreshes every `report_interval_ms` and opens no userfaultfd for it.
    pub fn kernel_fallbacks(&self) -> Vec<&'static str> {
        use attune_sys::{kernel, probe};
        let in_use = probe::offered_from(self.uffd_thread.features()) & !kernel::mask();
        kernel::fallbacks(in_use)
    }

    /// Whether the regions' descriptors report discards (`feature::EVENT_REMOVE`).
    pub fn sees_removes(&self) -> bool {
        self.uffd_thread.asked(feature::EVENT_REMOVE)
    }

    /// Drops the pages of `[addr, addr+len)` (a region's, page-aligned, its chunks held by
    /// the caller): they are missing afterwards, and a touch finds them resident and
    /// maps zeros (`super::fault`). Moved out through a staging buffer where pages move,
    /// which reports nothing: a `MADV_DONTNEED` of the region would report a discard and
    /// wait for the handler thread to read it, while the handler may be waiting for the
    /// chunk this caller holds. Whether every page went: a page a fork left shared cannot
    /// move (EBUSY), and stays. Signal-safe.
    pub(crate) fn drop_pages(&self, addr: usize, len: usize) -> bool {
        if !self.sees_removes() {
            return attune_sys::mem::advise(addr, len, attune_sys::mem::MADV_DONTNEED).is_ok();
        }
        let mut done = 0;
        while done < len {
            let n = (len - done).min(MAX_RUN);
            // Every buffer busy for long (`claim` gives up after a bounded wait): again,
            // never the kernel's advice (above). Buffers are held for one move and write.
            let Some(slot) = self.staging.claim(n) else {
                os::yield_now();
                continue;
            };
            if attune_sys::mem::any_present(addr + done, n) {
                let st = slot.fresh(n);
                let _ = self
                    .uffd_internal
                    .move_pages(st, addr + done, n, true, false);
                slot.keep(n);
            }
            done += n;
        }
        !attune_sys::mem::any_present(addr, len)
    }

    /// Whether an unreadable page is poisoned (else its thread gets SIGBUS sent).
    pub fn poisons(&self) -> bool {
        self.uffd_thread.has(feature::POISON)
    }

    /// The userfaultfd a region of delivery `d` is registered on (the signal one for every
    /// region while a forked child starts its threads: `serving_inline`).
    pub(crate) fn uffd_for(&self, d: Delivery) -> &Uffd {
        match d {
            Delivery::Thread if !self.serving_inline.load(Acquire) => &self.uffd_thread,
            _ => &self.uffd_signal,
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

    /// A new grant (the node daemon's, never above the configured `dram`): the evictor
    /// demotes down to the budget at once. Returns the budget applied.
    pub fn set_budget(&self, bytes: u64) -> u64 {
        self.grant.store(bytes, Relaxed);
        self.apply_budget()
    }

    /// A new cap from the memory cgroup's usage (`super::limit`); u64::MAX lifts it.
    pub(crate) fn set_cgroup_cap(&self, cap: u64) -> u64 {
        self.cgroup_cap.store(cap, Relaxed);
        self.apply_budget()
    }

    /// The cap in force from the memory cgroup (u64::MAX: none).
    pub(crate) fn cgroup_cap(&self) -> u64 {
        self.cgroup_cap.load(Relaxed)
    }

    /// The budget from the grant and the cap, within 1 MiB and the configured `dram`.
    /// The daemon client and the evictor set them from two threads: the budget is stored
    /// again until neither changed under it, so the last writer's view is the one kept.
    fn apply_budget(&self) -> u64 {
        loop {
            let (g, c) = (self.grant.load(Relaxed), self.cgroup_cap.load(Relaxed));
            let b = g.min(c).clamp(1 << 20, self.cfg.dram);
            let old = self.budget.swap(b, Relaxed);
            if (g, c) != (self.grant.load(Relaxed), self.cgroup_cap.load(Relaxed)) {
                continue;
            }
            if b < old {
                self.wake_evictor.notify();
            }
            return b;
        }
    }

    /// The budget the grant alone would give (reports: what the cgroup's usage lowered).
    pub fn granted_budget(&self) -> u64 {
        self.grant.load(Relaxed).clamp(1 << 20, self.cfg.dram)
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
        budget::watermarks(self.budget(), self.cfg.headroom, self.cfg.dram)
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

    /// The `pool` tier's medium (the node's far pool), if one is configured.
    pub fn pool_tier(&self) -> Option<&crate::tier::pool::PoolTier> {
        self.tiers.iter().find_map(|t| t.as_pool())
    }

    /// Bytes in the `memory` tiers now, and what this process wants there
    /// (`attune_policy::budget::far_want`; `rate`: how fast `used` grew lately, bytes/s).
    pub fn far_memory(&self, rate: u64) -> (u64, u64) {
        let mem = || self.tiers.iter().filter(|t| t.is_memory());
        let used: u64 = mem().map(|t| t.used()).sum();
        let cap: u64 = mem().map(|t| t.cfg.capacity).sum();
        let outside = self.committed.load(Relaxed).saturating_sub(self.budget());
        (used, budget::far_want(outside, used, rate, cap))
    }

    /// Bytes the active class may hold now (`attune_policy::victim`).
    pub fn active_target(&self) -> u64 {
        budget::active_target(
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

    /// Bytes pinned over all regions.
    pub fn pinned_bytes(&self) -> u64 {
        self.pinned.load(Relaxed)
    }

    /// Bytes the runtime's own pins (LAT/SHL `pin_fraction`, online prediction's hot
    /// parts) may still take: what is left of half the budget. Pins that fill the budget
    /// leave nothing to page through, and every fault thrashes. Explicit `attune_pin`
    /// calls are refused only beyond the whole budget.
    pub fn policy_pin_room(&self) -> usize {
        budget::policy_pin_room(self.budget(), self.pinned_bytes()) as usize
    }

    /// Enters the fork gate (`crate::sync::gate`): every API operation on regions.
    pub fn enter(&self) -> crate::sync::gate::Inside<'_> {
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
            &c.readahead_bytes,
            &c.readahead_used_bytes,
            &c.evictor_evicted_bytes,
            &c.budget_overruns,
            &c.room_waits,
            &c.room_wait_ns,
            &c.protected_skips,
            &c.unplaced_runs,
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
}

pub(crate) fn chunk_span(r: &Region, addr: usize, len: usize) -> (usize, usize) {
    let start = addr.max(r.base);
    let end = addr.saturating_add(len).min(r.base + r.len);
    if end <= start {
        return (0, 0);
    }
    (r.chunk_of(start), r.chunk_of(end - 1) + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_board_sums_the_other_slots_and_counts_the_others() {
        let words =
            attune_sys::unix::SharedWords::create("board-test", attune_proto::BOARD_WORDS).unwrap();
        let w = words.words();
        w[0].store(3, Relaxed);
        w[1].store(10 << 20, Relaxed);
        w[4095].store(5 << 20, Relaxed);
        let b = Board { words, slot: 7 };
        b.publish(64 << 20);
        assert_eq!(b.peers(), (15 << 20, 2));
        // Garbage another process wrote saturates, and a count beyond the slots is cut.
        b.words.words()[2].store(u64::MAX, Relaxed);
        b.words.words()[0].store(u64::MAX, Relaxed);
        assert_eq!(b.peers(), (u64::MAX, attune_proto::BOARD_WORDS as u64 - 2));
        // Taken and dropped: a fork's child reads none.
        let st = CgroupStats::default();
        st.set_board(Some(b));
        assert!(st.board().is_some_and(|b| b.slot == 7));
        st.set_board(None);
        assert!(st.board().is_none());
    }
}
