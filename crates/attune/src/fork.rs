//! fork: a forked child takes over a copy of the runtime, so the managed memory it
//! inherits reads and writes as in the parent (Python multiprocessing, DataLoader workers,
//! fork-based task pools).
//!
//! The kernel copies a region's mapping into the child (copy-on-write) but drops its
//! userfaultfd registration: a chunk that is not resident would read as zero there. So:
//!
//! 1. **prepare** (parent, forking thread): close the gates (`crate::sync`) and wait until no runtime
//!    operation is in flight: no chunk is half fetched or half evicted and no engine lock
//!    is held at the instant of the fork. Asynchronous signals are blocked until the
//!    child's memory is served again, so no signal handler can touch a hole in between.
//! 2. **child**: new userfaultfds and eventfd under the old descriptor numbers
//!    (`reopen_in_place`), every region, the memory tiers' arenas and the staging buffers
//!    registered again, a private copy of the file tiers' data, event counters from zero,
//!    the runtime's threads started again. The budget is the parent's (per process, as for
//!    exec'd children).
//! 3. **both**: pages the fork left shared cannot be taken by `UFFDIO_MOVE` (EBUSY).
//!    Fetches from the memory tier fall back to a copy; an eviction that meets a shared
//!    page marks the chunk `SHARED` and the evictor un-shares it (`MADV_POPULATE_WRITE`,
//!    outside every lock) before it is tried again. Only evicted pages are copied: data
//!    the child only reads stays shared with the parent.
//!
//! If the prepare handler cannot quiesce in time (a fork from a signal handler that
//! interrupted the runtime itself), or the child cannot get userfaultfds, the child's
//! managed ranges are unmapped: touching them fails loudly (SIGSEGV), never with zeros.

use crate::engine::Engine;
use crate::paging::{Pager, MAX_RUN};
use crate::region::SHARED;
use crate::sync::thread_gate::ThreadGate;
use attune_sys::uffd::Delivery;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering::*};
use std::sync::Mutex;

/// How long the prepare handler waits for operations in flight.
const QUIESCE_TIMEOUT_NS: u64 = 5_000_000_000;

/// The forking thread's signal mask, saved by prepare, restored after the fork.
static SAVED_MASK: Mutex<Option<libc::sigset_t>> = Mutex::new(None);
/// Whether prepare quiesced the runtime (the child may take it over).
static QUIESCED: AtomicBool = AtomicBool::new(false);
/// The pid for which the child's takeover ran, and its outcome.
static ADOPTED_PID: AtomicU32 = AtomicU32::new(0);
static ADOPTED_OK: AtomicBool = AtomicBool::new(false);

/// Whether the file tiers' content hashes hold in the child (its files were copied).
static CHILD_HASHES_HOLD: AtomicBool = AtomicBool::new(true);

/// Where the global locale's LC_CTYPE data was at the last fork (`start_serving`).
static CTYPE_DATA: AtomicUsize = AtomicUsize::new(0);

/// atfork prepare: quiesce the runtime; make the child's tier files.
pub(crate) fn prepare(e: Option<&Pager>, small: Option<&ThreadGate>) {
    // Before the gates close: it allocates, and it takes glibc's locale lock, which the
    // child could find held by a thread that does not exist there. Only a child that
    // takes a runtime over needs it.
    if e.is_some() {
        CTYPE_DATA.store(attune_sys::os::global_ctype_data(), Release);
    }
    let mask = attune_sys::os::block_signals_saving();
    *SAVED_MASK.lock().unwrap_or_else(|p| p.into_inner()) = Some(mask);
    // Small allocations first: they touch arena pages whose faults need the engine.
    let mut ok = small.map_or(true, |g| g.close(QUIESCE_TIMEOUT_NS))
        && e.map_or(true, |e| e.gate.close(QUIESCE_TIMEOUT_NS));
    if !ok {
        crate::log::emit_static(
            "attune: warning: fork while a runtime operation could not finish; the child will not see managed memory\n",
        );
    }
    if let (true, Some(e)) = (ok, e) {
        // Quiesced: nothing writes the tier files now, so a copy is a snapshot.
        let mut hold = true;
        let bounce = e.bounce.claim(MAX_RUN);
        let buf = bounce.as_ref().map(|b| b.addr()).unwrap_or(0);
        for t in &e.tiers {
            match t.prepare_fork(buf, MAX_RUN) {
                Ok(h) => hold &= h,
                Err(m) => {
                    crate::log::emit(
                        crate::log::Level::Warn,
                        &format!(
                            "fork: tier '{}': {m}; the child will not see managed memory",
                            t.name()
                        ),
                    );
                    ok = false;
                }
            }
        }
        CHILD_HASHES_HOLD.store(hold, Release);
    }
    QUIESCED.store(ok, Release);
}

fn restore_mask() {
    if let Some(m) = SAVED_MASK.lock().unwrap_or_else(|p| p.into_inner()).take() {
        attune_sys::os::restore_signals(&m);
    }
}

/// atfork parent: pages are now shared with the child; open the gates.
pub(crate) fn parent(e: Option<&Pager>, small: Option<&ThreadGate>) {
    if let Some(e) = e {
        for t in &e.tiers {
            t.after_fork_in_parent();
        }
        e.forks.fetch_add(1, Release);
        e.gate.open();
    }
    if let Some(g) = small {
        g.open();
    }
    restore_mask();
}

/// atfork child: take the runtime over (once per process; later calls return the first
/// outcome). Returns whether the child's managed memory is served.
pub(crate) fn child(e: Option<&'static Engine>, small: Option<&ThreadGate>) -> bool {
    let pid = std::process::id();
    if ADOPTED_PID.load(Acquire) == pid {
        return ADOPTED_OK.load(Acquire);
    }
    let ok = match e {
        None => {
            if let Some(g) = small {
                g.reset();
            }
            true
        }
        Some(e) => {
            let ok = QUIESCED.load(Acquire) && take_over(e).is_ok();
            if !ok {
                abandon(&e.pager);
            }
            // Open before the threads start: starting one faults (served inline).
            e.pager.gate.reset();
            if let Some(g) = small {
                g.reset();
            }
            let served = ok
                && start_serving(e)
                    .map_err(|m| crate::log::emit(crate::log::Level::Error, &format!("fork: {m}")))
                    .is_ok();
            if ok && !served {
                // Loud, never zeros: the child cannot serve what it inherited.
                abandon(&e.pager);
            }
            served
        }
    };
    ADOPTED_OK.store(ok, Release);
    ADOPTED_PID.store(pid, Release);
    restore_mask();
    ok
}

/// The child's side of a fork: its own userfaultfds, registrations, tier files, threads.
fn take_over(e: &'static Engine) -> Result<(), String> {
    let p = &e.pager;
    let reopen = |u: &attune_sys::uffd::Uffd| {
        u.reopen_in_place()
            .map_err(|x| format!("userfaultfd in the child: {}", x.errno))
    };
    reopen(&p.uffd_thread)?;
    reopen(&p.uffd_signal)?;
    reopen(&p.uffd_internal)?;
    p.wake_evictor
        .reopen_in_place()
        .map_err(|x| format!("eventfd in the child: {x}"))?;
    let internal = &p.uffd_internal;
    let miss = attune_sys::uffd::mode::MISSING;
    internal
        .register(p.staging.base(), p.staging.len(), miss)
        .map_err(|x| format!("staging buffers: {x}"))?;
    let hashes_hold = CHILD_HASHES_HOLD.load(Acquire);
    for t in &p.tiers {
        t.reopen_in_child(internal)
            .map_err(|x| format!("tier '{}': {x}", t.name()))?;
    }
    // Until the child's threads run, faults are resolved by the thread that takes them
    // (`Pager::serving_inline`, switched back in `start_serving`).
    p.serving_inline.store(true, Release);
    {
        let table = p.regions.read().unwrap_or_else(|p| p.into_inner());
        for r in table.iter() {
            if !hashes_hold {
                // The child's file does not hold what the hashes describe: a clean-page
                // skip would lose a write.
                for h in r.file_hash.iter() {
                    h.store(0, Relaxed);
                }
            }
            p.uffd_for(r.delivery)
                .register(r.base, r.len, p.region_mode())
                .map_err(|x| format!("region at {:#x}: {x}", r.base))?;
            // A mark from before the fork means nothing to the child's own copies.
            for c in 0..r.chunks() {
                if r.state(c).0 & SHARED != 0 {
                    r.set_bits(c, 0, SHARED);
                }
            }
        }
    }
    p.reset_event_counters();
    // Messages and discard reports the parent's handler read are the parent's.
    p.handler_queue.clear();
    p.removes.clear();
    // The parent's threads are not the child's; the child's sampler finds its own.
    crate::paging::progclock::CLOCK.reset();
    p.forks.fetch_add(1, Release);
    Ok(())
}

/// How long the child waits for its runtime threads to begin.
const START_TIMEOUT_NS: u64 = 5_000_000_000;

/// Bytes held from the start of the global locale's LC_CTYPE data: its header and 86
/// value slots take about 750 bytes on glibc 2.36.
const CTYPE_DATA_BYTES: usize = 1024;

/// The child's threads, started while every region is served inline: creating a thread
/// and its start in glibc read memory the program allocated, which is managed under
/// `--small` (the locale data `__ctype_init` reads, the DTV `pthread_create` allocates). Had
/// the arena pages been moved out, those threads would have waited for a handler thread
/// that was not running yet (`attune run --small --dram 32M -- python3
/// tests/run/mp_fork.py 64` hung in every worker). Once every thread's body has begun,
/// the thread-delivery regions go back to the handler thread's userfaultfd, with the
/// gate closed so that no eviction is moving their pages meanwhile. The runtime's
/// threads touch no managed memory of their own, and the forking thread touches none
/// between the two registrations.
fn start_serving(e: &'static Engine) -> Result<(), String> {
    let p = &e.pager;
    // The parent's slot on its group's board is the parent's: the child's evictor would
    // publish the child's pages there. The child gets its own when it joins the daemon.
    p.cgroup.set_board(None);
    // glibc starts a thread with every signal blocked and reads the global locale's
    // LC_CTYPE data (`__ctype_init`) before it restores the mask. Under `--small` that
    // data is in a managed arena, and a fault there cannot be delivered: the kernel kills
    // the process with the SIGBUS it cannot deliver (Python's `multiprocessing.Process`
    // children died so, every time). It is placed in DRAM now, by this thread, and held
    // there until the threads have begun.
    let _held = p.hold_range(CTYPE_DATA.load(Acquire), CTYPE_DATA_BYTES);
    let before = p.threads_started.load(Acquire);
    let started = e.start_threads(None).map_err(|x| x.0)?;
    let t0 = attune_sys::os::now_ns();
    while p.threads_started.load(Acquire).wrapping_sub(before) < started {
        if attune_sys::os::now_ns() - t0 > START_TIMEOUT_NS {
            return Err("the runtime's threads did not start within 5 s".into());
        }
        attune_sys::os::sleep_us(200);
    }
    for t in &p.tiers {
        t.start_in_child()
            .map_err(|x| format!("tier '{}': {x}", t.name()))?;
    }
    if !p.gate.close(QUIESCE_TIMEOUT_NS) {
        p.gate.open();
        return Err("the runtime's threads did not settle within 5 s".into());
    }
    let mut res = Ok(());
    {
        let table = p.regions.read().unwrap_or_else(|p| p.into_inner());
        for r in table.iter().filter(|r| r.delivery == Delivery::Thread) {
            if let Err(x) = p
                .uffd_signal
                .unregister(r.base, r.len)
                .and_then(|_| p.uffd_thread.register(r.base, r.len, p.region_mode()))
            {
                res = Err(format!(
                    "region at {:#x} back to the handler thread: {x}",
                    r.base
                ));
                break;
            }
        }
    }
    if res.is_ok() {
        p.serving_inline.store(false, Release);
    }
    p.gate.open();
    res
}

/// The child cannot serve its managed memory: unmap it, so a touch faults loudly instead
/// of reading zeros where a chunk was not resident.
fn abandon(e: &Pager) {
    crate::sync::mark_abandoned();
    let table = e.regions.read().unwrap_or_else(|p| p.into_inner());
    for r in table.iter() {
        let _ = attune_sys::mem::unmap(r.base, r.len);
        r.freed.store(true, Release);
    }
    crate::log::emit_static(
        "attune: error: this forked child cannot serve the managed memory it inherited; it is unmapped (a touch faults)\n",
    );
}
