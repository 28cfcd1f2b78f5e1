//! # The `attune run` interposer (`libattune_preload.so`)
//!
//! Loaded with LD_PRELOAD into an unmodified program, it exports the malloc family and
//! `mmap`/`munmap`/`mremap`/`madvise` and sends requests of at least
//! `ATTUNE_RUN_THRESHOLD` bytes to the runtime's tiers; everything else goes to the
//! program's own allocator (glibc's, or the jemalloc, tcmalloc or mimalloc it links:
//! `attune_sys::libc_alloc`), so the program's small objects cost nothing extra and its
//! allocator's API keeps working.
//!
//! * `hooks.rs`: the exported symbols (the only entry points the program calls), and
//!   `pthread_create`, whose threads the profile's clock follows from start to end
//!   (`attune_sys::threads`).
//! * `foreign.rs`: other allocators' own entry points that take a pointer.
//! * libattune's `io.rs` (linked in with the C API): system calls on the program's
//!   buffers, retried where the kernel cannot fault managed pages in.
//! * `table.rs`: which addresses are managed (fork-safe lock; inherited entries).
//! * `report.rs`: the per-process statistics file `attune run` turns into its report.
//!
//! Start-up: the constructor only reads settings and registers fork/exit handlers; the
//! runtime (threads, userfaultfd) starts at the first managed request, so processes that
//! never allocate much (a shell, `ls`) pay nothing; with `--small` (every request
//! managed) it starts in the constructor, outside the C library's locks. Until it is ready, and on any thread
//! already inside the interposer, requests go to glibc: correct, only unmanaged.

// `#[no_mangle]` and `#[link_section]` count as unsafe code: only the exported symbols
// and the constructor use them; every other unsafe operation is in attune-sys.
#![deny(unsafe_code)]

mod delivery;
#[allow(unsafe_code)]
mod foreign;
#[allow(unsafe_code)]
mod hooks;
mod report;
mod table;
#[allow(unsafe_code)]
mod wrap;

use attune::run_options::{self, RunSettings};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering::*};
use std::sync::OnceLock;

/// The interposer's own data lives in glibc's heap, never in managed memory.
#[global_allocator]
static ALLOC: attune_sys::libc_alloc::LibcAllocator = attune_sys::libc_alloc::LibcAllocator;

const UNSTARTED: u8 = 0;
const STARTING: u8 = 1;
const READY: u8 = 2;
const OFF: u8 = 3;

/// Runtime state of this process (reset in a forked child).
static STATE: AtomicU8 = AtomicU8::new(UNSTARTED);
static SETTINGS: OnceLock<RunSettings> = OnceLock::new();
/// Copies of the two settings every malloc and free reads (one relaxed load each, no
/// OnceLock on the hot path). Until the constructor sets them nothing is managed, so
/// other libraries' constructors that allocate first are served by glibc and the runtime
/// never starts inside someone else's initialiser.
pub(crate) static THRESHOLD: AtomicUsize = AtomicUsize::new(usize::MAX);
pub(crate) static SMALL: AtomicBool = AtomicBool::new(false);

/// Marks this thread as inside the runtime for the guard's life (its own requests go to
/// glibc's heap, never to the program's allocator: `attune_sys::libc_alloc`); None if it
/// already was (re-entry, or one of the runtime's own threads).
struct Busy;
impl Busy {
    fn enter() -> Option<Busy> {
        attune_sys::libc_alloc::enter_runtime().then_some(Busy)
    }
}
impl Drop for Busy {
    fn drop(&mut self) {
        attune_sys::libc_alloc::leave_runtime();
    }
}

fn settings() -> &'static RunSettings {
    SETTINGS.get_or_init(|| {
        // Under secure execution the environment is the caller's, not the program's: no
        // settings from it (see attune::config::load_from_process).
        let secure = attune_sys::os::secure_execution();
        run_options::from_env(|k| (!secure).then(|| std::env::var(k).ok()).flatten())
            .unwrap_or_else(|e| {
                attune::log::emit(
                    attune::log::Level::Error,
                    &format!("attune run: {e}; using the defaults"),
                );
                RunSettings::default()
            })
    })
}

/// Starts the runtime on first use; true when managed requests can be served.
fn ready() -> bool {
    match STATE.load(Acquire) {
        READY => true,
        UNSTARTED => {
            if STATE
                .compare_exchange(UNSTARTED, STARTING, AcqRel, Acquire)
                .is_err()
            {
                return STATE.load(Acquire) == READY;
            }
            // Before the first region: a program that links io_uring or RDMA gets no
            // region under signal delivery at all.
            delivery::check(true);
            let ok = matches!(
                attune::runtime::runtime(),
                Ok(rt) if rt.engine().is_some()
            );
            if ok {
                delivery::absorb_runtime_libraries();
                delivery::note_heap_owners();
                delivery::keep_out_if_unserved();
                if SMALL.load(Relaxed) && !delivery::settle_small_arenas() {
                    SMALL.store(false, Relaxed);
                    THRESHOLD.store(settings().threshold, Relaxed);
                }
                report::start();
            }
            STATE.store(if ok { READY } else { OFF }, Release);
            ok
        }
        _ => false,
    }
}

extern "C" fn before_fork() {
    delivery::before_fork();
    table::before_fork();
}

extern "C" fn after_fork_in_parent() {
    table::after_fork_in_parent();
    delivery::after_fork();
}

extern "C" fn in_child_after_fork() {
    // First: the runtime takes the parent's over (its regions are the child's memory now),
    // before anything here could touch it. Registered before the runtime's own handler,
    // this one runs first in the child.
    delivery::after_fork();
    let was_ready = STATE.load(Acquire) == READY;
    let adopted =
        attune::runtime::after_fork_in_child() && attune::runtime::engine_if_started().is_some();
    table::after_fork_in_child(adopted);
    report::after_fork_in_child();
    if !settings().children {
        // New allocations go to glibc; the inherited ones are still served (and freed) by
        // the runtime, and this process writes no report.
        THRESHOLD.store(usize::MAX, Relaxed);
        SMALL.store(false, Relaxed);
        STATE.store(OFF, Release);
    } else if adopted && was_ready {
        STATE.store(READY, Release);
        report::start_in_child();
    } else {
        // Not started in the parent, or the child could not take it over: start on first
        // use, as a new process would.
        STATE.store(UNSTARTED, Release);
    }
}

extern "C" fn at_exit() {
    // The engine may have been started by the C API (a program linked against libattune,
    // whose calls bind to this library's copy of it) rather than by a malloc request.
    let st = STATE.load(Acquire);
    if st == READY || (st != OFF && attune::runtime::engine_if_started().is_some()) {
        if let Some(_b) = Busy::enter() {
            report::write_now(true);
        }
    }
}

extern "C" fn constructor() {
    attune_sys::libc_alloc::resolve();
    attune::engine::INTERPOSED.store(true, Relaxed);
    let _b = Busy::enter();
    let s = settings();
    // Signal delivery unless asked for the handler thread: `auto` turns new regions over
    // to the handler thread when the program is seen to hand memory to the kernel outside
    // the calls libattune retries (delivery.rs). (Single-threaded here: the program's main
    // has not run yet.)
    std::env::set_var("ATTUNE_FAULT_MODE", delivery::initial_mode());
    if !s.children {
        // exec'd children must not load the interposer again; other preloads stay.
        let rest: Vec<String> = std::env::var("LD_PRELOAD")
            .unwrap_or_default()
            .split([' ', ':'])
            .filter(|e| !e.is_empty() && !e.ends_with("libattune_preload.so"))
            .map(String::from)
            .collect();
        if rest.is_empty() {
            std::env::remove_var("LD_PRELOAD");
        } else {
            std::env::set_var("LD_PRELOAD", rest.join(" "));
        }
    }
    attune_sys::os::atfork(
        Some(before_fork),
        Some(after_fork_in_parent),
        Some(in_child_after_fork),
    );
    attune_sys::os::at_exit(at_exit);
    attune::runtime::on_start(report::start);
    SMALL.store(s.small, Relaxed);
    THRESHOLD.store(if s.small { 0 } else { s.threshold }, Relaxed);
    if s.small {
        // The whole heap is managed, so the first request comes at once, and often from
        // inside the C library with one of its locks held: bash's first malloc is in
        // setlocale, under the locale lock, and a start there that formats an error
        // (strerror takes that lock to translate it) released the lock it did not own and
        // hung bash (`attune run --small -- bash -c 'echo hi'`, 2026-11-27). Started here,
        // no lock of the C library is held.
        ready();
    }
}

#[used]
#[allow(unsafe_code)]
#[link_section = ".init_array"]
static CONSTRUCTOR: extern "C" fn() = constructor;
