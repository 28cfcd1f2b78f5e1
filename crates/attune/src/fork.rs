//! fork: a forked child takes over a copy of the runtime, so the managed memory it
//! inherits reads and writes as in the parent (Python multiprocessing, DataLoader workers,
//! fork-based task pools).
//!
//! The kernel copies a region's mapping into the child (copy-on-write) but drops its
//! userfaultfd registration: a chunk that is not resident would read as zero there. So:
//!
//! 1. **prepare** (parent, forking thread): close the [`Gate`]s and wait until no runtime
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
use crate::region::{Where, SHARED};
use crate::thread_gate::ThreadGate;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::*};
use std::sync::Mutex;

const CLOSED: u64 = 1 << 63;

/// A quiescence gate: operations run inside it (a count), the prepare handler closes it and
/// waits for the count to drain. Signal-safe (atomics and sched_yield).
///
/// Operations inside must never wait for something that needs to enter the gate (a fault
/// on managed memory that the handler thread resolves): such code runs outside, see the
/// small allocator's own gate.
pub struct Gate(AtomicU64);

/// Being inside the gate; leaves it on drop.
pub struct Inside<'a>(&'a Gate);

impl Drop for Inside<'_> {
    fn drop(&mut self) {
        self.0 .0.fetch_sub(1, Release);
    }
}

impl Gate {
    pub const fn new() -> Gate {
        Gate(AtomicU64::new(0))
    }

    /// Enters, waiting while a fork is being prepared.
    pub fn enter(&self) -> Inside<'_> {
        let mut spins = 0u32;
        loop {
            let v = self.0.load(Acquire);
            if v & CLOSED == 0 {
                if self
                    .0
                    .compare_exchange_weak(v, v + 1, AcqRel, Relaxed)
                    .is_ok()
                {
                    return Inside(self);
                }
                continue;
            }
            backoff(&mut spins);
        }
    }

    /// Closes the gate and waits until nothing is inside; false if that took longer than
    /// `timeout_ns` (the gate stays closed either way).
    pub fn close(&self, timeout_ns: u64) -> bool {
        self.0.fetch_or(CLOSED, AcqRel);
        let start = attune_sys::os::now_ns();
        while self.0.load(Acquire) & !CLOSED != 0 {
            if attune_sys::os::now_ns() - start > timeout_ns {
                return false;
            }
            attune_sys::os::yield_now();
        }
        true
    }

    pub fn open(&self) {
        self.0.fetch_and(!CLOSED, AcqRel);
    }

    /// In the child: the threads counted inside do not exist there.
    pub fn reset(&self) {
        self.0.store(0, Release);
    }

    /// Operations inside now (tests, diagnostics).
    pub fn inside(&self) -> u64 {
        self.0.load(Acquire) & !CLOSED
    }
}

/// One wait of a thread that found a gate closed: spin a little, then yield. Signal-safe.
pub(crate) fn backoff(spins: &mut u32) {
    *spins += 1;
    if *spins > 64 {
        attune_sys::os::yield_now();
    } else {
        std::hint::spin_loop();
    }
}

impl Default for Gate {
    fn default() -> Self {
        Self::new()
    }
}

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

/// atfork prepare: quiesce the runtime; make the child's tier files.
pub(crate) fn prepare(e: Option<&Engine>, small: Option<&ThreadGate>) {
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
        let bounce = e.bounce.claim(crate::engine::MAX_RUN);
        let buf = bounce.as_ref().map(|b| b.addr()).unwrap_or(0);
        for t in &e.tiers {
            match t.prepare_fork(buf, crate::engine::MAX_RUN) {
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
pub(crate) fn parent(e: Option<&Engine>, small: Option<&ThreadGate>) {
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
        None => true,
        Some(e) => {
            let ok = QUIESCED.load(Acquire) && take_over(e).is_ok();
            if !ok {
                abandon(e);
            }
            e.gate.reset();
            ok
        }
    };
    if let Some(g) = small {
        g.reset();
    }
    ADOPTED_OK.store(ok, Release);
    ADOPTED_PID.store(pid, Release);
    restore_mask();
    ok
}

/// The child's side of a fork: its own userfaultfds, registrations, tier files, threads.
fn take_over(e: &'static Engine) -> Result<(), String> {
    let reopen = |u: &attune_sys::uffd::Uffd| {
        u.reopen_in_place()
            .map_err(|x| format!("userfaultfd in the child: {}", x.errno))
    };
    reopen(&e.uffd_thread)?;
    reopen(&e.uffd_signal)?;
    reopen(&e.uffd_internal)?;
    e.wake_evictor
        .reopen_in_place()
        .map_err(|x| format!("eventfd in the child: {x}"))?;
    let internal = &e.uffd_internal;
    let miss = attune_sys::uffd::mode::MISSING;
    internal
        .register(e.staging.base(), e.staging.len(), miss)
        .map_err(|x| format!("staging buffers: {x}"))?;
    let hashes_hold = CHILD_HASHES_HOLD.load(Acquire);
    for t in &e.tiers {
        t.reopen_in_child(internal)
            .map_err(|x| format!("tier '{}': {x}", t.name()))?;
    }
    {
        let table = e.regions.read().unwrap_or_else(|p| p.into_inner());
        for r in table.iter() {
            if !hashes_hold {
                // The child's file does not hold what the hashes describe: a clean-page
                // skip would lose a write.
                for h in r.file_hash.iter() {
                    h.store(0, Relaxed);
                }
            }
            e.uffd_for(r.delivery)
                .register(r.base, r.len, miss)
                .map_err(|x| format!("region at {:#x}: {x}", r.base))?;
            // A mark from before the fork means nothing to the child's own copies.
            for c in 0..r.chunks() {
                if r.state(c).0 & SHARED != 0 {
                    r.set_bits(c, 0, SHARED);
                }
            }
        }
    }
    e.reset_event_counters();
    e.forks.fetch_add(1, Release);
    e.start_threads().map_err(|x| x.0)?;
    Ok(())
}

/// Set in a child that could not take the runtime over: mimalloc's thread state there
/// still links heap structures inside the small-object arenas just unmapped, so any
/// mimalloc call would touch them (seen: SIGBUS in the child's first `allocate_TM(64)`).
static ABANDONED: AtomicBool = AtomicBool::new(false);

/// Whether this process is a child that could not take its parent's runtime over.
pub(crate) fn abandoned() -> bool {
    ABANDONED.load(Acquire)
}

/// The child cannot serve its managed memory: unmap it, so a touch faults loudly instead
/// of reading zeros where a chunk was not resident.
fn abandon(e: &Engine) {
    ABANDONED.store(true, Release);
    let table = e.regions.read().unwrap_or_else(|p| p.into_inner());
    for r in table.iter() {
        let _ = attune_sys::mem::unmap(r.base, r.len);
        r.freed.store(true, Release);
    }
    crate::log::emit_static(
        "attune: error: this forked child cannot serve the managed memory it inherited; it is unmapped (a touch faults)\n",
    );
}

/// Un-shares chunks whose eviction met pages a fork left shared (the evictor thread, no
/// gate and no lock held: a hole in the range faults into the fault path, which must be
/// free to run). Returns the chunks handled.
pub(crate) fn unshare_pass(e: &Engine) -> usize {
    if e.unshare_pending.swap(0, AcqRel) == 0 {
        return 0;
    }
    let regions: Vec<_> = {
        let _in = e.enter();
        e.regions.read().unwrap_or_else(|p| p.into_inner()).clone()
    };
    let ps = attune_sys::page_size();
    let mut done = 0;
    for r in &regions {
        for c in 0..r.chunks() {
            let s = r.state(c);
            if s.0 & SHARED == 0 {
                continue;
            }
            if s.place() == Where::Resident && !r.freed.load(Acquire) {
                let a = r.chunk_addr(c);
                // A write fault per page: copied if the other process still maps it,
                // taken back as exclusive if not. A hole (the application discarded a
                // page) is refused by signal-delivery regions: go on page by page.
                if attune_sys::mem::advise(a, r.chunk, attune_sys::mem::MADV_POPULATE_WRITE)
                    .is_err()
                {
                    let mut p = a;
                    while p < a + r.chunk {
                        let _ =
                            attune_sys::mem::advise(p, ps, attune_sys::mem::MADV_POPULATE_WRITE);
                        p += ps;
                    }
                }
            }
            r.set_bits(c, 0, SHARED);
            done += 1;
        }
    }
    e.counters.unshared.fetch_add(done as u64, Relaxed);
    done
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn close_waits_for_operations_inside_and_blocks_new_ones() {
        let g = Arc::new(Gate::new());
        let inside = g.enter();
        assert_eq!(g.inside(), 1);
        let g2 = g.clone();
        let closer = std::thread::spawn(move || g2.close(2_000_000_000));
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(
            !closer.is_finished(),
            "close returned while an operation was inside"
        );
        drop(inside);
        assert!(closer.join().unwrap());
        // Closed: a new operation waits until the gate opens.
        let g3 = g.clone();
        let entrant = std::thread::spawn(move || {
            let _in = g3.enter();
        });
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(!entrant.is_finished(), "entered a closed gate");
        g.open();
        entrant.join().unwrap();
        assert_eq!(g.inside(), 0);
    }

    #[test]
    fn close_gives_up_after_its_timeout() {
        let g = Gate::new();
        let _in = g.enter();
        assert!(!g.close(20_000_000));
        g.open();
    }
}
