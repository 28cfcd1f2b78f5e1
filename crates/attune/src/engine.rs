//! The composition root: builds the paging engine (`crate::paging`) and the NUMA placer
//! (`crate::numa`) from one configuration, starts their threads and the SIGBUS handler,
//! and publishes the process's engine for the signal handler and the C API
//! (`crate::runtime`). Nothing below this module refers to it: each subsystem gets the
//! narrow handle it needs (`&Pager`, `&NumaPlacer`) from here.

use crate::config::Config;
use crate::numa::NumaPlacer;
use crate::paging::{InitError, Pager};
use std::sync::atomic::{AtomicBool, Ordering::*};

/// The tiered runtime of this process: paged regions, and NUMA placement where NUMA
/// tiers are configured.
pub struct Engine {
    pub pager: Pager,
    /// Placement on NUMA tiers (configured `numa` tiers whose nodes are online).
    pub numa: Option<NumaPlacer>,
}

/// Set by the `attune run` interposer at load: system calls on managed memory are
/// retried there when the kernel cannot fault their pages in.
pub static INTERPOSED: AtomicBool = AtomicBool::new(false);

/// The started engine, None before start and in a forked child that could not take its
/// parent's over.
static CURRENT: attune_sys::global::Published<Engine> = attune_sys::global::Published::new();

/// The engine, if one runs in this process (signal-safe: one load).
pub fn current() -> Option<&'static Engine> {
    CURRENT.get()
}

/// Makes `e` the process's engine (None: no engine, for a child that gave it up).
pub(crate) fn publish(e: Option<&'static Engine>) {
    CURRENT.set(e);
}

impl Engine {
    /// Builds the engine: userfaultfds, tiers, buffers, NUMA placer. Threads are started
    /// by `start`.
    pub fn new(cfg: Config) -> Result<Engine, InitError> {
        // Small-object arenas reserve tier offsets like regions (`crate::small`).
        let arenas = (crate::small::CLASSES as u64).saturating_mul(cfg.small_arena as u64);
        // Before anything asks the kernel what it has: masked features are not used. A
        // feature the kernel offers but refuses when used (a seccomp profile) is masked
        // too, once, with a warning: its fallback runs instead of every use failing.
        attune_sys::kernel::set_mask(cfg.kernel_features);
        let broken = attune_sys::probe::broken();
        for (bit, errno) in &broken {
            let name = attune_sys::kernel::FEATURES
                .iter()
                .find(|f| f.bit == *bit)
                .map_or("?", |f| f.name);
            crate::warn!(
                "the kernel offers {name} but refuses it ({errno}); its fallback runs instead (`attune doctor`)"
            );
        }
        let extra = broken.iter().fold(0, |m, (bit, _)| m | bit);
        attune_sys::kernel::set_mask(cfg.kernel_features | extra);
        let numa = NumaPlacer::new(&cfg, std::path::Path::new("/"));
        let pager = Pager::new(cfg, arenas)?;
        if pager.user_mode_only() {
            // Under `attune run` the interposer covers it (and the report says so).
            let level = if INTERPOSED.load(Relaxed) {
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
                 or access to /dev/userfaultfd (docs/design/run.md, \"System calls on managed memory\")",
            );
        }
        Ok(Engine { pager, numa })
    }

    /// Starts the background threads and the SIGBUS resolver.
    pub fn start(self: &'static Self) -> Result<(), InitError> {
        crate::inject::arm_from_env();
        let first = crate::paging::limit::LimitWatch::read(&self.pager);
        self.start_threads(Some(first))?;
        attune_sys::signal::install(on_sigbus)
            .map_err(|e| InitError(format!("cannot install the SIGBUS handler: {e}")))?;
        Ok(())
    }

    /// Starts the background threads (evictor, fault handler, NUMA heat scanner, sampler):
    /// at start, and in a forked child, which has none of its parent's threads. Returns
    /// how many; each counts itself in `threads_started` when its body begins. `limit`:
    /// the memory cgroup's first reading, for the evictor (None: it reads it itself).
    pub(crate) fn start_threads(
        self: &'static Self,
        limit: Option<(crate::paging::limit::LimitWatch, i32)>,
    ) -> Result<u32, InitError> {
        let pager = &self.pager;
        let cfg = &pager.cfg;
        let spawned = std::cell::Cell::new(0u32);
        let spawn = |name: &str, what: &str, f: Box<dyn FnOnce() + Send>| {
            let body = move || {
                pager.threads_started.fetch_add(1, AcqRel);
                f()
            };
            attune_sys::os::spawn_runtime_thread(name, body)
                .map(|_| spawned.set(spawned.get() + 1))
                .map_err(|e| InitError(format!("cannot start the {what} thread: {e}")))
        };
        spawn(
            "attune-evict",
            "evictor",
            Box::new(move || crate::paging::evict::evictor_loop(pager, limit)),
        )?;
        spawn(
            "attune-fault",
            "fault",
            Box::new(move || crate::paging::fault::handler_loop(pager)),
        )?;
        if let (Some(n), true) = (&self.numa, cfg.heat_interval_ms > 0) {
            spawn(
                "attune-heat",
                "NUMA heat",
                Box::new(move || crate::numa::heat::heat_loop(n, pager)),
            )?;
        }
        if cfg.sample_rate > 0 || cfg.predict_window_ms > 0 {
            crate::paging::sampler::follow_threads(pager);
            spawn(
                "attune-sample",
                "sampler",
                Box::new(move || crate::paging::sampler::sampler_loop(pager)),
            )?;
        }
        Ok(spawned.get())
    }
}

/// The SIGBUS handler: faults of signal-delivery regions and of the runtime's staging
/// buffers; anything else is not ours (false: the signal module chains it on).
fn on_sigbus(addr: usize) -> bool {
    match current() {
        Some(e) => crate::paging::fault::on_sigbus(&e.pager, addr),
        None => false,
    }
}
