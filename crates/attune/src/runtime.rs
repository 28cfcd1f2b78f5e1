//! The process-wide runtime: lazily started engine and the API the C library exposes.
//!
//! Every entry point returns `Result<_, Errno>`; the C layer turns that into a return
//! code plus errno and keeps a readable message per thread ([`last_error`]).

use crate::config::{self, Config};
use crate::engine::Engine;
use crate::error::fail;
use crate::paging::AllocOptions;
use crate::region::{Region, RegionKind, Where};
use crate::small::SmallAllocator;
use attune_policy::{place, Flags};
use attune_sys::{mem, Errno};
use std::collections::BTreeMap;
use std::sync::atomic::Ordering::*;
use std::sync::{Arc, Mutex};

/// How the runtime runs in this process.
pub enum Runtime {
    /// Tiered: the fault engine manages every allocation.
    Tiered {
        engine: &'static Engine,
        small: SmallAllocator,
    },
    /// userfaultfd unavailable (or ATTUNE_DISABLE_UFFD=1): plain anonymous memory, no
    /// budget and no tiers, so the application still runs as it would without Attune.
    Plain {
        cfg: Config,
        maps: Mutex<BTreeMap<usize, usize>>,
    },
}

/// The runtime of this process. A forked child takes its parent's over (`crate::fork`); if
/// it cannot, it starts its own on first use.
static RUNTIME: Mutex<Option<(u32, &'static Result<Runtime, String>)>> = Mutex::new(None);
/// Lock-free fast path to the current runtime (cleared in a forked child that could not take
/// its parent's over).
static FAST: attune_sys::global::Published<Result<Runtime, String>> =
    attune_sys::global::Published::new();

/// The parts of the runtime a fork must quiesce: the engine and the small allocator's gate.
fn fork_parts() -> (
    Option<&'static Engine>,
    Option<&'static crate::sync::thread_gate::ThreadGate>,
) {
    match FAST.get() {
        Some(Ok(Runtime::Tiered { engine, small })) => (Some(engine), Some(&small.gate)),
        _ => (None, None),
    }
}

extern "C" fn fork_prepare() {
    let (e, g) = fork_parts();
    crate::fork::prepare(e.map(|e| &e.pager), g);
}

extern "C" fn fork_parent() {
    let (e, g) = fork_parts();
    crate::fork::parent(e.map(|e| &e.pager), g);
}

extern "C" fn fork_child() {
    if after_fork_in_child() {
        // The daemon knows the parent's connection, not this process: join it anew
        // (in a thread, so the fork does not wait for the daemon).
        if let (Some(e), _) = fork_parts() {
            let _ = attune_sys::os::spawn_runtime_thread("attune-tmm", move || {
                if let Err(m) = crate::daemon_client::start(&e.pager.cfg, Some(&e.pager)) {
                    crate::log::emit(crate::log::Level::Warn, &m);
                }
            });
        }
    }
}

/// In a forked child: takes the parent's runtime over (once; later calls return the first
/// outcome). True when the inherited managed memory is served here; false when it was
/// unmapped instead (then the child starts a runtime of its own on first use). The
/// interposer calls it before its own fork handling; the runtime's handler calls it too.
pub fn after_fork_in_child() -> bool {
    let (e, g) = fork_parts();
    let ok = crate::fork::child(e, g);
    if !ok {
        crate::small::publish(None);
        FAST.set(None);
        crate::engine::publish(None);
    }
    ok
}

/// The engine, if the runtime started in tiered mode (signal-safe, no initialisation).
pub fn engine_if_started() -> Option<&'static Engine> {
    crate::engine::current()
}

/// Called once the engine runs, whoever started it (the interposer starts its statistics
/// thread here: a program calling the C API directly under `attune run` has no
/// malloc-family request of the interposer's to start it).
static ON_START: std::sync::OnceLock<fn()> = std::sync::OnceLock::new();

/// Registers the hook run when the engine has started (at most one; later calls ignored).
pub fn on_start(f: fn()) {
    let _ = ON_START.set(f);
}

/// `leave_at_exit` is registered (once per process image: a forked child inherits it).
static EXIT_HOOK: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// At exit(3): the far tiers that hold memory outside the process (memory servers) are
/// told to free it once the process is gone, instead of a whole lease later. The tiers
/// keep serving meanwhile: an atexit handler registered before this one, stdio's final
/// flush or another thread may still read far pages.
extern "C" fn leave_at_exit() {
    if let Some(e) = engine_if_started() {
        for t in &e.pager.tiers {
            t.leave();
        }
    }
}

/// `ATTUNE_USERFAULTFD_FD`: a descriptor of /dev/userfaultfd a privileged launcher opened
/// and left open for the program (the Slurm plugin's `userfaultfd=device`), so that a user
/// without the right to open it, where `vm.unprivileged_userfaultfd=0`, still gets kernel
/// faults served (docs/design/run.md, "Fault delivery"). Not under secure execution.
fn use_handed_userfaultfd() {
    if attune_sys::os::secure_execution() {
        return;
    }
    let Ok(v) = std::env::var("ATTUNE_USERFAULTFD_FD") else {
        return;
    };
    let r = v
        .trim()
        .parse::<i32>()
        .map_err(|_| Errno(libc::EINVAL))
        .and_then(attune_sys::uffd::use_handed_device);
    match r {
        Ok(()) => crate::info!("userfaultfd: through descriptor {v} of /dev/userfaultfd, handed down"),
        Err(e) => crate::log::emit(
            crate::log::Level::Warn,
            &format!("ATTUNE_USERFAULTFD_FD={v} is not an open descriptor of /dev/userfaultfd ({e}): ignored"),
        ),
    }
}

fn start(path: Option<&std::path::Path>) -> Result<Runtime, String> {
    let cfg = config::load_from_process(path).map_err(|e| e.0)?;
    crate::log::set_level(cfg.log);
    crate::info!("far tiers: {}", cfg.far_summary());
    if std::env::var("ATTUNE_DISABLE_UFFD")
        .map(|v| v == "1")
        .unwrap_or(false)
    {
        crate::info!("ATTUNE_DISABLE_UFFD=1: plain DRAM, no tiering");
        crate::daemon_client::start(&cfg, None)?;
        return Ok(Runtime::Plain {
            cfg,
            maps: Mutex::new(BTreeMap::new()),
        });
    }
    use_handed_userfaultfd();
    match Engine::new(cfg.clone()) {
        Ok(e) => {
            let e: &'static Engine = Box::leak(Box::new(e));
            crate::engine::publish(Some(e));
            // Registered before the engine starts: the daemon tells what the memory
            // cgroup's other runtimes hold before its welcome (`Reply::Peers`), and the
            // engine's first reading of the group needs it. Read first, those runtimes'
            // pages were this program's "outside" until the next reading, and the
            // growth rate taken from them widened the margin to a quarter of the limit
            // (docs/design/paging.md, "Several runtimes in one group").
            crate::daemon_client::start(&e.pager.cfg, Some(&e.pager))?;
            e.start().map_err(|x| x.0)?;
            if let Some(f) = ON_START.get() {
                f();
            }
            if !EXIT_HOOK.swap(true, Relaxed) {
                attune_sys::os::at_exit(leave_at_exit);
            }
            let small = SmallAllocator::new(e.pager.cfg.small_threshold);
            if !small.enabled {
                crate::log::emit(
                    crate::log::Level::Warn,
                    "this forked child could not take its parent's runtime over: its managed allocations below small_threshold get a region each",
                );
            }
            Ok(Runtime::Tiered { engine: e, small })
        }
        Err(x) => {
            crate::log::emit(
                crate::log::Level::Error,
                &format!("{}; continuing with plain DRAM (no tiering)", x.0),
            );
            crate::daemon_client::start(&cfg, None)?;
            Ok(Runtime::Plain {
                cfg,
                maps: Mutex::new(BTreeMap::new()),
            })
        }
    }
}

/// Starts the runtime with a configuration file (or the environment and defaults).
/// A second call returns the first result (the configuration cannot change).
pub fn init(path: Option<&std::path::Path>) -> Result<&'static Runtime, Errno> {
    let r: &'static Result<Runtime, String> = if let Some(r) = FAST.get() {
        r
    } else {
        let pid = std::process::id();
        let mut g = RUNTIME.lock().unwrap_or_else(|p| p.into_inner());
        match *g {
            Some((p, r)) if p == pid => r,
            _ => {
                // First use in this process (or in a child that could not take its
                // parent's over): start a runtime.
                crate::engine::publish(None);
                let r: &'static Result<Runtime, String> = Box::leak(Box::new(start(path)));
                if let Err(m) = r {
                    // Said once, here: a program that never asks attune_last_error (or
                    // runs under the preload, which falls back to plain memory) would
                    // otherwise fail or run untiered without a word.
                    crate::log::emit(
                        crate::log::Level::Error,
                        &format!("the runtime cannot start: {m}"),
                    );
                }
                *g = Some((pid, r));
                FAST.set(Some(r));
                if let Ok(Runtime::Tiered { small, .. }) = r {
                    crate::small::publish(Some(small));
                }
                // After start: the daemon client registered its own fork handler then, and
                // a child's handlers run in registration order (it forgets the parent's
                // connection before this one joins anew).
                static ATFORK: std::sync::Once = std::sync::Once::new();
                ATFORK.call_once(|| {
                    attune_sys::os::atfork(Some(fork_prepare), Some(fork_parent), Some(fork_child))
                });
                r
            }
        }
    };
    match r {
        Ok(rt) => Ok(rt),
        Err(m) => Err(fail(Errno(libc::EINVAL), m.clone())),
    }
}

/// The runtime, started on first use. Inlined fast path: a started runtime is one load.
#[inline]
pub fn runtime() -> Result<&'static Runtime, Errno> {
    if let Some(Ok(rt)) = FAST.get() {
        return Ok(rt);
    }
    init(None)
}

impl Runtime {
    /// Whether small requests share the per-class arenas (false in a forked child that
    /// could not take its parent's runtime over, and without tiering).
    pub fn small_enabled(&self) -> bool {
        matches!(self, Runtime::Tiered { small, .. } if small.enabled)
    }
    pub fn config(&self) -> &Config {
        match self {
            Runtime::Tiered { engine, .. } => &engine.pager.cfg,
            Runtime::Plain { cfg, .. } => cfg,
        }
    }
    pub fn engine(&self) -> Option<&'static Engine> {
        match self {
            Runtime::Tiered { engine, .. } => Some(engine),
            Runtime::Plain { .. } => None,
        }
    }
}

fn check_flags(bits: u32) -> Result<Flags, Errno> {
    Flags::from_bits(bits).ok_or_else(|| {
        fail(
            Errno(libc::EINVAL),
            format!(
                "unknown flag bits {:#x} (valid: ATTUNE_LAT|ATTUNE_BW|ATTUNE_CAP|ATTUNE_SHL)",
                bits & !Flags::ALL
            ),
        )
    })
}

/// `allocate_TM` / `attune_alloc`. Inlined: a small request without options usually
/// never leaves [`crate::small::alloc_fast`].
#[inline]
pub fn alloc(size: usize, flag_bits: u32, opts: Option<AllocOptions>) -> Result<usize, Errno> {
    if opts.is_none() {
        if let Some(p) = crate::small::alloc_fast(size, flag_bits) {
            return Ok(p);
        }
    }
    alloc_general(size, flag_bits, opts)
}

#[inline(never)]
fn alloc_general(size: usize, flag_bits: u32, opts: Option<AllocOptions>) -> Result<usize, Errno> {
    let flags = check_flags(flag_bits)?;
    if size == 0 {
        return Err(fail(Errno(libc::EINVAL), "size 0: nothing to allocate"));
    }
    let rt = runtime()?;
    let mut opts = opts.unwrap_or_default();
    opts.flags = flags;
    match rt {
        Runtime::Plain { maps, .. } => {
            let a = mem::map_anon(size, false)
                .map_err(|e| fail(e, format!("cannot map {size} bytes: {e}")))?;
            maps.lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(a, size);
            Ok(a)
        }
        Runtime::Tiered { engine, small } => {
            let options = opts.own_region
                || opts.preferred_tier.is_some()
                || opts.pin_bytes.is_some()
                || opts.prefault
                || opts.chunk_size.is_some()
                || opts.fault_mode.is_some();
            let route = place::route(
                size,
                engine.pager.cfg.small_threshold,
                options,
                small.enabled,
            );
            if route == place::Route::Small {
                return small
                    .alloc(&engine.pager, size, flags)
                    .map_err(|e| fail(e, format!("small allocation of {size} bytes failed: {e}")));
            }
            let _in = engine.pager.enter();
            if let Some(n) = &engine.numa {
                return n.alloc(size, flags).map_err(|e| {
                    fail(
                        e,
                        format!(
                            "{size} bytes do not fit in the NUMA tiers ({:?} bytes planned per tier)",
                            n.used()
                        ),
                    )
                });
            }
            if size as u64 > engine.pager.capacity {
                return Err(fail(
                    Errno(libc::ENOMEM),
                    format!(
                        "{size} bytes is more than all tiers hold together ({} bytes)",
                        engine.pager.capacity
                    ),
                ));
            }
            let r = engine
                .pager
                .alloc_region(size, &opts, RegionKind::Dedicated, 0)
                .map_err(|e| {
                    let msg = if e.0 == libc::ENOMEM {
                        format!(
                            "{size} bytes do not fit in the tiers ({} of {} bytes allocated)",
                            engine.pager.committed.load(Relaxed),
                            engine.pager.capacity
                        )
                    } else {
                        format!("allocation of {size} bytes failed: {e}")
                    };
                    fail(e, msg)
                })?;
            Ok(r.base)
        }
    }
}

/// Makes `[addr, addr+len)` managed memory in place, as fresh zeroed memory: the
/// interposer's `mmap` with `MAP_FIXED` of anonymous memory over a range the program
/// reserved (a JVM's heap, committed in place). Only where the paging engine runs (not
/// NUMA tiers, not without userfaultfd): ENOTSUP. EINVAL when the range is not made of
/// whole chunks, ENOMEM when the tiers cannot hold it; an error leaves the range either as it was or as the plain anonymous
/// memory the program asked for, which the caller maps again to be sure.
pub fn adopt(addr: usize, len: usize, flag_bits: u32, opts: AllocOptions) -> Result<(), Errno> {
    let flags = check_flags(flag_bits)?;
    let Runtime::Tiered { engine, .. } = runtime()? else {
        return Err(Errno(libc::ENOTSUP));
    };
    if engine.numa.is_some() {
        return Err(Errno(libc::ENOTSUP));
    }
    let opts = AllocOptions { flags, ..opts };
    let _in = engine.pager.enter();
    engine.pager.adopt_region(addr, len, &opts).map(|_| ())
}

/// Gives the region that starts at `ptr` back to the kernel in place (see
/// `Pager::release_region`): its memory stays mapped with its content and is no longer
/// managed. EBUSY when a chunk of it could not be settled in DRAM.
pub fn release(ptr: usize) -> Result<(), Errno> {
    let Runtime::Tiered { engine, .. } = runtime()? else {
        return Err(Errno(libc::ENOTSUP));
    };
    let Lookup::Region(r) = lookup(ptr)? else {
        return Err(Errno(libc::EINVAL));
    };
    let _in = engine.pager.enter();
    if engine.pager.release_region(&r) {
        Ok(())
    } else {
        Err(Errno(libc::EBUSY))
    }
}

/// What `ptr` is to the runtime.
pub enum Lookup {
    Region(Arc<Region>),
    Small(Arc<Region>, usize),
    Plain(usize),
}

fn lookup(ptr: usize) -> Result<Lookup, Errno> {
    let rt = runtime()?;
    match rt {
        Runtime::Plain { maps, .. } => {
            match maps.lock().unwrap_or_else(|p| p.into_inner()).get(&ptr) {
                Some(&l) => Ok(Lookup::Plain(l)),
                None => Err(fail(
                    Errno(libc::EINVAL),
                    format!("{ptr:#x} was not returned by allocate_TM"),
                )),
            }
        }
        Runtime::Tiered { engine, small } => {
            if let Some(sz) = small.size_of(ptr) {
                if let Some(r) = small.region_of(ptr) {
                    return Ok(Lookup::Small(r, sz));
                }
            }
            let found = {
                let _in = engine.pager.enter();
                engine.pager.find(ptr)
            };
            match found {
                Some(r) if r.base == ptr && r.kind == RegionKind::Dedicated => Ok(Lookup::Region(r)),
                Some(r) if r.kind == RegionKind::Dedicated => Err(fail(Errno(libc::EINVAL), format!("{ptr:#x} points inside an allocation starting at {:#x}", r.base))),
                Some(_) => Err(fail(Errno(libc::EINVAL), format!("{ptr:#x} is not the start of a live allocation (freed twice, or an interior pointer)"))),
                None => Err(fail(Errno(libc::EINVAL), format!("{ptr:#x} was not returned by allocate_TM (or was freed already)"))),
            }
        }
    }
}

/// `free_TM` / `attune_free`. NULL is a no-op, as for free(3).
#[inline]
pub fn free(ptr: usize) -> Result<(), Errno> {
    if crate::small::free_fast(ptr) {
        return Ok(());
    }
    free_general(ptr)
}

#[inline(never)]
fn free_general(ptr: usize) -> Result<(), Errno> {
    if ptr == 0 {
        return Ok(());
    }
    let rt = runtime()?;
    match rt {
        Runtime::Plain { maps, .. } => {
            let l = maps.lock().unwrap_or_else(|p| p.into_inner()).remove(&ptr);
            match l {
                Some(l) => {
                    let _ = mem::unmap(ptr, l);
                    Ok(())
                }
                None => Err(fail(
                    Errno(libc::EINVAL),
                    format!("{ptr:#x} was not returned by allocate_TM (or was freed already)"),
                )),
            }
        }
        Runtime::Tiered { engine, small } => {
            if engine.numa.as_ref().is_some_and(|n| {
                let _in = engine.pager.enter();
                n.free(ptr)
            }) {
                return Ok(());
            }
            if let Some(r) = small.free_if_owned(ptr) {
                return r.map_err(|e| fail(e, format!("{ptr:#x} is not a live small allocation (freed twice, or an interior pointer)")));
            }
            match lookup(ptr)? {
                Lookup::Region(r) => {
                    let _in = engine.pager.enter();
                    engine.pager.free_region(&r);
                    Ok(())
                }
                _ => Err(Errno(libc::EINVAL)),
            }
        }
    }
}

/// Range of `ptr` the runtime manages: (region, start, len) of the allocation.
fn allocation(ptr: usize) -> Result<(Arc<Region>, usize, usize), Errno> {
    match lookup(ptr)? {
        Lookup::Region(r) => {
            let (b, l) = (r.base, r.requested);
            Ok((r, b, l))
        }
        Lookup::Small(r, sz) => Ok((r, ptr, sz)),
        Lookup::Plain(_) => Err(fail(
            Errno(libc::ENOTSUP),
            "the runtime runs without userfaultfd: no tiers to manage",
        )),
    }
}

/// Changes a region's flags (dedicated allocations only).
pub fn set_flags(ptr: usize, bits: u32) -> Result<(), Errno> {
    let flags = check_flags(bits)?;
    if let Some(e) = runtime()?.engine().filter(|e| e.numa.is_some()) {
        let _in = e.pager.enter();
        let n = e.numa.as_ref().expect("checked");
        if n.owns(ptr) {
            return n.set_flags(ptr, flags).map(|_| ()).map_err(|e| {
                fail(
                    e,
                    format!("re-placing {ptr:#x} with flags {flags} failed: {e}"),
                )
            });
        }
    }
    match lookup(ptr)? {
        Lookup::Region(r) => {
            r.flags.store(flags.0, Relaxed);
            Ok(())
        }
        Lookup::Small(..) => Err(fail(
            Errno(libc::EINVAL),
            "small allocations share their class's flags; allocate with the flags you need",
        )),
        Lookup::Plain(_) => Ok(()),
    }
}

fn range_in(ptr: usize, len: usize) -> Result<(Arc<Region>, &'static Engine), Errno> {
    let rt = runtime()?;
    let Some(e) = rt.engine() else {
        return Err(fail(
            Errno(libc::ENOTSUP),
            "the runtime runs without userfaultfd",
        ));
    };
    let found = {
        let _in = e.pager.enter();
        e.pager.find(ptr)
    };
    let r = found.ok_or_else(|| {
        fail(
            Errno(libc::EINVAL),
            format!("{ptr:#x} is not managed memory"),
        )
    })?;
    if len == 0 || ptr.checked_add(len).is_none_or(|end| end > r.base + r.len) {
        return Err(fail(
            Errno(libc::EINVAL),
            format!("range {ptr:#x}+{len} is empty or leaves its allocation"),
        ));
    }
    Ok((r, e))
}

/// Pins (or unpins) a range: resident and never evicted.
pub fn pin(ptr: usize, len: usize, on: bool) -> Result<(), Errno> {
    let (r, e) = range_in(ptr, len)?;
    if on {
        let all_pinned = e.pager.pinned_bytes();
        if !attune_policy::budget::explicit_pin_fits(e.pager.budget(), all_pinned, len as u64) {
            return Err(fail(Errno(libc::ENOMEM), format!("pinning {len} bytes would exceed the DRAM budget ({} bytes, {} pinned already)", e.pager.budget(), all_pinned)));
        }
    }
    let _in = e.pager.enter();
    e.pager.pin(&r, ptr, len, on);
    Ok(())
}

/// Managed memory kept resident while the kernel reads or writes it, released on drop
/// (see [`hold`]).
#[derive(Default)]
pub struct Hold(Option<crate::paging::ops::HeldRange<'static>>);

impl Hold {
    /// Bytes of managed memory the hold covers.
    pub fn bytes(&self) -> usize {
        self.0.as_ref().map_or(0, |h| h.bytes())
    }
}

/// Whether a system call on `[ptr, ptr+len)` may fail with EFAULT because of the
/// runtime: part of it is managed memory whose missing pages the kernel cannot fault in
/// (user-mode-only userfaultfd, or SIGBUS delivery). False without a started engine.
pub fn kernel_access_fails(ptr: usize, len: usize) -> bool {
    let Some(e) = engine_if_started() else {
        return false;
    };
    if len == 0 {
        return false;
    }
    let _in = e.pager.enter();
    e.pager
        .overlapping(ptr, len)
        .iter()
        .any(|r| e.pager.kernel_access_fails(r))
}

/// Brings the managed part of `[ptr, ptr+len)` into DRAM and keeps it there until the
/// returned [`Hold`] is dropped, so that a system call can read or write it where the
/// kernel cannot fault it in. Parts that are not managed are left as they are. The caller
/// bounds `len` ([`hold_limit`]): held bytes count against the budget like pins.
pub fn hold(ptr: usize, len: usize) -> Hold {
    Hold(engine_if_started().map(|e| e.pager.hold_range(ptr, len)))
}

/// The most bytes one [`hold`] should cover: a quarter of the budget (at least 64 KiB),
/// so that held I/O buffers never starve the program's other pages.
pub fn hold_limit() -> usize {
    engine_if_started()
        .map(|e| attune_policy::budget::hold_limit(e.pager.budget()) as usize)
        .unwrap_or(usize::MAX)
}

/// Drops the content of a page-aligned range of an allocation: it reads as zero afterwards
/// and its DRAM and far-tier space are released (`MADV_DONTNEED` for managed memory).
pub fn discard(ptr: usize, len: usize) -> Result<(), Errno> {
    let ps = attune_sys::page_size();
    if ptr % ps != 0 || len % ps != 0 {
        return Err(fail(
            Errno(libc::EINVAL),
            format!("discard {ptr:#x}+{len}: start and length must be multiples of the page size ({ps})"),
        ));
    }
    if let Some(e) = runtime()?.engine().filter(|e| e.numa.is_some()) {
        // NUMA tiers keep pages mapped: the kernel's own advice does it.
        let _in = e.pager.enter();
        let n = e.numa.as_ref().expect("checked");
        let inside = n.region(ptr).is_some_and(|r| {
            len > 0
                && ptr
                    .checked_add(len)
                    .is_some_and(|end| end <= r.base + r.len)
        });
        if !inside {
            // Never advise past the allocation: that would drop someone else's memory.
            return Err(fail(
                Errno(libc::EINVAL),
                format!("range {ptr:#x}+{len} is not inside one managed allocation"),
            ));
        }
        return mem::advise(ptr, len, mem::MADV_DONTNEED)
            .map_err(|e| fail(e, format!("madvise: {e}")));
    }
    let (r, e) = range_in(ptr, len)?;
    if r.kind == RegionKind::SmallArena {
        return Err(fail(
            Errno(libc::EINVAL),
            format!("{ptr:#x} is inside the arena of small allocations: free_TM them instead"),
        ));
    }
    let zero = {
        let _in = e.pager.enter();
        e.pager.discard(&r, ptr, len)
    };
    crate::paging::ops::zero_discarded(&zero);
    Ok(())
}

/// Brings a range into DRAM now.
pub fn prefetch(ptr: usize, len: usize) -> Result<(), Errno> {
    let (r, e) = range_in(ptr, len)?;
    let _in = e.pager.enter();
    e.pager.prefetch(&r, ptr, len);
    Ok(())
}

/// Statistics of one allocation's region.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct RegionStats {
    pub size: u64,
    pub chunk_size: u64,
    pub flags: u32,
    pub resident_bytes: u64,
    /// Bytes stored in each far tier (same order as `tier_stats`).
    pub tier_bytes: Vec<u64>,
    pub pinned_bytes: u64,
    pub faults: u64,
    pub evictions: u64,
    pub fetched_bytes: u64,
    pub evicted_bytes: u64,
    pub zero_fills: u64,
    pub readahead_chunks: u64,
    pub clean_skips: u64,
    pub heat: u64,
    /// How the region's faults are resolved: "signal" or "thread" ("" on NUMA tiers,
    /// which take no faults of ours).
    pub delivery: &'static str,
    /// Bytes on 2 MiB pages (`crate::paging::huge`).
    pub huge_bytes: u64,
    /// Moved by faults over shown touched (`Region::amplification`).
    pub amplification: f64,
}

pub fn region_stats(ptr: usize) -> Result<RegionStats, Errno> {
    if let Some(e) = runtime()?.engine().filter(|e| e.numa.is_some()) {
        let _in = e.pager.enter();
        let n = e.numa.as_ref().expect("checked");
        if let Some(r) = n.region(ptr).filter(|r| r.base == ptr) {
            // Mapped pages: where the kernel holds them now (tier 0 is DRAM).
            let (per_tier, _absent) = n.residency(r.base, r.len)?;
            return Ok(RegionStats {
                size: r.len as u64,
                chunk_size: 4096,
                flags: r.flags,
                resident_bytes: per_tier[0] * 4096,
                tier_bytes: per_tier[1..].iter().map(|p| p * 4096).collect(),
                pinned_bytes: r.pinned(),
                // Nothing moves through our faults on NUMA tiers.
                amplification: 1.0,
                ..Default::default()
            });
        }
    }
    let (r, _, len) = allocation(ptr)?;
    let e = runtime()?.engine().ok_or(Errno(libc::ENOTSUP))?;
    let (res, far) = r.residency(e.pager.tiers.len());
    let c = &r.counters;
    Ok(RegionStats {
        size: len as u64,
        chunk_size: r.chunk as u64,
        flags: r.flags().0,
        resident_bytes: res,
        tier_bytes: far,
        pinned_bytes: (r.pinned_chunks() * r.chunk) as u64,
        faults: c.faults.load(Relaxed),
        evictions: c.evictions.load(Relaxed),
        fetched_bytes: c.fetched_bytes.load(Relaxed),
        evicted_bytes: c.evicted_bytes.load(Relaxed),
        zero_fills: c.zero_fills.load(Relaxed),
        readahead_chunks: c.readahead_chunks.load(Relaxed),
        clean_skips: c.clean_skips.load(Relaxed),
        heat: r.heat_total(),
        delivery: match r.delivery {
            attune_sys::uffd::Delivery::Signal => "signal",
            attune_sys::uffd::Delivery::Thread => "thread",
        },
        huge_bytes: crate::paging::huge::huge_bytes(&r),
        amplification: r.amplification(),
    })
}

/// Statistics of every dedicated region (address, stats), for reports.
pub fn all_region_stats() -> Vec<(usize, RegionStats)> {
    let Some(e) = engine_if_started() else {
        return Vec::new();
    };
    let regions: Vec<Arc<Region>> = {
        let _in = e.pager.enter();
        e.pager
            .regions
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|r| r.kind == RegionKind::Dedicated)
            .cloned()
            .collect()
    };
    regions
        .iter()
        .filter_map(|r| region_stats(r.base).ok().map(|s| (r.base, s)))
        .collect()
}

/// Whether `ptr` is a live small managed block, and its size.
pub fn small_block_size(ptr: usize) -> Option<usize> {
    match runtime().ok()? {
        Runtime::Tiered { small, .. } if small.owns(ptr) => small.size_of(ptr),
        _ => None,
    }
}

/// Whether `ptr` lies in a small-object arena (lock-free range test).
pub fn in_small_arena(ptr: usize) -> bool {
    let Some(_) = engine_if_started() else {
        return false;
    };
    match runtime() {
        Ok(Runtime::Tiered { small, .. }) => small.owns(ptr),
        _ => false,
    }
}

/// Statistics of one tier (index 0 is DRAM).
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct TierStats {
    pub name: String,
    pub kind: String,
    pub capacity: u64,
    pub used_bytes: u64,
    /// Highest `used_bytes` so far.
    pub peak_used_bytes: u64,
    pub latency_ns: u64,
    pub bandwidth: u64,
    /// DRAM: faults resolved; far tier: loads.
    pub faults: u64,
    pub evictions: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub errors: u64,
}

pub fn tier_stats() -> Result<Vec<TierStats>, Errno> {
    let rt = runtime()?;
    let cfg = rt.config();
    let mut v = Vec::new();
    match rt.engine() {
        None => v.push(TierStats {
            name: "dram".into(),
            kind: "dram".into(),
            capacity: cfg.dram,
            ..Default::default()
        }),
        Some(e) => {
            let c = &e.pager.counters;
            v.push(TierStats {
                name: "dram".into(),
                kind: "dram".into(),
                capacity: e.pager.budget(),
                used_bytes: e.pager.resident.load(Relaxed),
                peak_used_bytes: e.pager.peak_resident.load(Relaxed),
                latency_ns: 100,
                bandwidth: 0,
                faults: c.faults.load(Relaxed),
                evictions: c.evictions.load(Relaxed),
                bytes_in: c.fetched_bytes.load(Relaxed),
                bytes_out: c.evicted_bytes.load(Relaxed),
                errors: c.budget_overruns.load(Relaxed),
            });
            for t in &e.pager.tiers {
                let k = &t.counters;
                v.push(TierStats {
                    name: t.cfg.name.clone(),
                    kind: format!("{:?}", t.cfg.kind).to_lowercase(),
                    capacity: t.capacity(),
                    used_bytes: k.stored.load(Relaxed),
                    peak_used_bytes: k.peak_stored.load(Relaxed),
                    latency_ns: t.cfg.latency_ns,
                    bandwidth: t.cfg.bandwidth,
                    faults: k.loads.load(Relaxed),
                    evictions: k.stores.load(Relaxed),
                    bytes_in: k.bytes_out.load(Relaxed),
                    bytes_out: k.bytes_in.load(Relaxed),
                    errors: k.errors.load(Relaxed) + k.full.load(Relaxed),
                });
            }
        }
    }
    Ok(v)
}

/// The NUMA tiers' statistics (`NumaPlacer::stats`); None without NUMA tiers or before
/// the runtime started.
pub fn numa_stats() -> Option<serde_json::Value> {
    engine_if_started()?.numa.as_ref().map(|n| n.stats())
}

/// Where a chunk is, for tests and tools: None if not managed.
pub fn chunk_place(ptr: usize) -> Option<(Where, usize)> {
    let e = engine_if_started()?;
    let r = {
        let _in = e.pager.enter();
        e.pager.find(ptr)?
    };
    let s = r.state(r.chunk_of(ptr));
    Some((s.place(), s.tier()))
}

/// Access-sampling cells of every sampled region, live or freed (the last 1024): (base,
/// requested bytes, chunk size, flags, per chunk (hits, exposure ns, parks)). Empty when
/// sampling is off.
pub type SampledRegion = (usize, u64, usize, u32, Vec<(u32, u64, u32)>);

pub fn sampling_cells() -> Vec<SampledRegion> {
    let Some(e) = engine_if_started() else {
        return Vec::new();
    };
    let _in = e.pager.enter();
    let mut regions: Vec<Arc<Region>> = e
        .pager
        .sampled_history
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    regions.extend(
        e.pager
            .regions
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|r| r.samples.enabled() && !r.freed.load(std::sync::atomic::Ordering::Acquire))
            .cloned(),
    );
    // Allocation order: the history (`attune profile`) matches regions by it.
    regions.sort_by_key(|r| r.id);
    regions
        .iter()
        .map(|r| {
            (
                r.base,
                r.requested as u64,
                r.chunk,
                r.flags().0,
                crate::paging::sample::cells(r),
            )
        })
        .collect()
}

/// A phase of the program marked with `attune_phase_begin/end`: its span and the access
/// samples taken during it (per sampled region, per chunk (hits, exposure ns)). Phases of
/// the same name (an iteration loop) are one mark: their samples add up, `count` says how
/// many, `active_ns` how long they lasted in all; so memory grows with the names, not
/// with the iterations.
#[derive(Clone, Debug)]
pub struct PhaseMark {
    pub name: String,
    /// First start and last end.
    pub begin_ns: u64,
    pub end_ns: u64,
    pub active_ns: u64,
    pub count: u64,
    pub regions: Vec<(usize, usize, Vec<(u32, u64)>)>,
}

/// Distinct phase names kept; marks of further names are dropped.
const MAX_PHASE_NAMES: usize = 256;

/// Adds `m` to the mark of the same name, or appends it.
fn record(done: &mut Vec<PhaseMark>, m: PhaseMark) {
    let Some(d) = done.iter_mut().find(|d| d.name == m.name) else {
        if done.len() < MAX_PHASE_NAMES {
            done.push(m);
        }
        return;
    };
    d.end_ns = m.end_ns;
    d.active_ns += m.active_ns;
    d.count += 1;
    for (base, chunk, cells) in m.regions {
        match d
            .regions
            .iter_mut()
            .find(|r| r.0 == base && r.2.len() == cells.len())
        {
            Some(r) => {
                for (a, b) in r.2.iter_mut().zip(cells) {
                    a.0 += b.0;
                    a.1 += b.1;
                }
            }
            None => d.regions.push((base, chunk, cells)),
        }
    }
}

struct Phases {
    /// The open phase: name, start time, sample counters at the start.
    open: Option<(String, u64, Vec<SampledRegion>)>,
    done: Vec<PhaseMark>,
}

static PHASES: std::sync::Mutex<Phases> = std::sync::Mutex::new(Phases {
    open: None,
    done: Vec::new(),
});

/// Starts phase `name` (ending the open one, if any: phases do not nest).
pub fn phase_begin(name: &str) -> Result<(), Errno> {
    if name.is_empty() || name.len() > 256 {
        return Err(Errno(libc::EINVAL));
    }
    let (now, cells) = (attune_sys::os::now_ns(), sampling_cells());
    let mut p = PHASES.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(open) = p.open.take() {
        let m = mark(open, now, &cells);
        record(&mut p.done, m);
    }
    p.open = Some((name.to_string(), now, cells));
    Ok(())
}

/// Ends the open phase; EINVAL when none is open.
pub fn phase_end() -> Result<(), Errno> {
    let (now, cells) = (attune_sys::os::now_ns(), sampling_cells());
    let mut p = PHASES.lock().unwrap_or_else(|p| p.into_inner());
    let open = p.open.take().ok_or(Errno(libc::EINVAL))?;
    let m = mark(open, now, &cells);
    record(&mut p.done, m);
    Ok(())
}

/// A phase from its start (name, time, counters) and the counters at its end: the
/// samples taken during it are the difference (a region allocated during the phase
/// counts whole).
fn mark(open: (String, u64, Vec<SampledRegion>), now: u64, at_end: &[SampledRegion]) -> PhaseMark {
    let (name, begin_ns, at_begin) = open;
    let regions = at_end
        .iter()
        .map(|(base, _, chunk, _, end)| {
            let start = at_begin
                .iter()
                .find(|r| r.0 == *base && r.4.len() == end.len());
            let cells = end
                .iter()
                .enumerate()
                .map(|(i, e)| {
                    let s = start.map(|r| r.4[i]).unwrap_or((0, 0, 0));
                    (e.0.saturating_sub(s.0), e.1.saturating_sub(s.1))
                })
                .collect();
            (*base, *chunk, cells)
        })
        .collect();
    PhaseMark {
        name,
        begin_ns,
        end_ns: now,
        active_ns: now.saturating_sub(begin_ns),
        count: 1,
        regions,
    }
}

/// The phases so far; an open one is reported up to now (and stays open).
pub fn phases() -> Vec<PhaseMark> {
    let (mut out, open) = {
        let p = PHASES.lock().unwrap_or_else(|p| p.into_inner());
        (p.done.clone(), p.open.clone())
    };
    if let Some(open) = open {
        record(
            &mut out,
            mark(open, attune_sys::os::now_ns(), &sampling_cells()),
        );
    }
    out
}

#[cfg(test)]
mod phase_tests {
    use super::*;

    fn m(name: &str, t: u64, cells: Vec<(u32, u64)>) -> PhaseMark {
        PhaseMark {
            name: name.into(),
            begin_ns: t,
            end_ns: t + 10,
            active_ns: 10,
            count: 1,
            regions: vec![(0x1000, 4096, cells)],
        }
    }

    #[test]
    fn phases_of_one_name_add_up() {
        let mut done = Vec::new();
        record(&mut done, m("solve", 0, vec![(1, 5), (0, 7)]));
        record(&mut done, m("io", 10, vec![(0, 1), (0, 1)]));
        record(&mut done, m("solve", 20, vec![(2, 3), (1, 1)]));
        assert_eq!(done.len(), 2);
        let s = &done[0];
        assert_eq!((s.count, s.active_ns, s.begin_ns, s.end_ns), (2, 20, 0, 30));
        assert_eq!(s.regions[0].2, vec![(3, 8), (1, 8)]);
        for i in 0..MAX_PHASE_NAMES {
            record(&mut done, m(&format!("p{i}"), 40, vec![]));
        }
        assert_eq!(done.len(), MAX_PHASE_NAMES);
    }
}
