//! `--fault-mode auto` (the default): signal delivery until the program is seen to hand
//! memory to the kernel outside the calls libattune retries; then the handler thread for
//! every region created from then on (the rule: `attune_policy::delivery`).
//!
//! Looked at twice: when the runtime starts (everything the program linked), and before
//! each new region when the loader's object count moved (a `dlopen` since: MPI transports,
//! Python extensions). A region made before a late find keeps signal delivery; the warning
//! says how many, and `--fault-mode thread` is the way out.

use crate::settings;
use attune_policy::delivery::{self, Chosen, Requested};
use attune_sys::elf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};
use std::sync::Mutex;

struct State {
    seen: elf::Seen,
    generation: (u64, u64),
    /// Why new regions get the handler thread, once known.
    reason: Option<String>,
    /// The find the keep-out rule judges (`delivery::keeps_out`), and its description: the
    /// first find, or a later one whose rule is wider (`judge`).
    found: Option<(delivery::Reason, String)>,
    /// Why new requests stay with the program's allocator, once they do.
    kept_out: Option<String>,
}

static STATE: Mutex<State> = Mutex::new(State {
    seen: elf::Seen::new(),
    generation: (0, 0),
    reason: None,
    found: None,
    kept_out: None,
});
/// True once new regions get the handler thread.
static DECIDED: AtomicBool = AtomicBool::new(false);
/// True once new requests go to the program's allocator (`keep_out`, for a
/// `delivery::KeptOut`). Nothing is looked at after that.
static KEPT_OUT: AtomicBool = AtomicBool::new(false);

// The loader scan names an object with Go's build-ID note by the policy's key.
const _: () = {
    let (a, b) = (elf::GO_RUNTIME.as_bytes(), delivery::GO_RUNTIME.as_bytes());
    assert!(a.len() == b.len());
    let mut i = 0;
    while i < a.len() {
        assert!(a[i] == b[i]);
        i += 1;
    }
};
/// Taken around every use of `STATE` and across fork.
static GATE: AtomicBool = AtomicBool::new(false);

fn requested() -> Requested {
    match settings().fault_mode {
        "thread" => Requested::Thread,
        "signal" => Requested::Signal,
        _ => Requested::Auto,
    }
}

/// The runtime's fault mode before it starts (`ATTUNE_FAULT_MODE`): auto starts as signal.
pub fn initial_mode() -> &'static str {
    match requested() {
        Requested::Thread => "thread",
        _ => "signal",
    }
}

/// Looks at the objects loaded since the last look (all of them the first time), under
/// every requested mode: an object that keeps the program's memory out
/// (`delivery::keeps_out`, the Go runtime) does so whatever was asked; under `auto`, any
/// other find gives new regions the handler thread. Every object with a find is judged,
/// in the loader's order, until one keeps memory out. `at_start`: the runtime is not
/// running yet, so no region has been made under signal delivery.
pub fn check(at_start: bool) {
    if KEPT_OUT.load(Relaxed) {
        return;
    }
    let found = with(|st| {
        let generation = elf::generation();
        if !at_start && generation == st.generation {
            return Vec::new();
        }
        st.generation = generation;
        elf::scan_new(
            &mut st.seen,
            &|name| delivery::library_reason(name).is_some(),
            &|sym| delivery::symbol_reason(sym).is_some(),
        )
    });
    for f in found {
        judge(f, at_start);
        if KEPT_OUT.load(Relaxed) {
            return;
        }
    }
}

/// One object's find (`check`).
fn judge(f: elf::Found, at_start: bool) {
    let reason = if f.by_import {
        delivery::symbol_reason(&f.what)
    } else {
        delivery::library_reason(&f.what)
    };
    let Some(reason) = reason else { return };
    let go = reason.found == delivery::GO_RUNTIME;
    let text = if go {
        format!("{} carries {} ({})", f.object, f.what, reason.access)
    } else if f.by_import {
        format!("{} imports {} ({})", f.object, f.what, reason.access)
    } else {
        format!("{} is loaded ({})", f.what, reason.access)
    };
    // The keep-out rule is widest for the Go runtime, then for stacks in the program's
    // memory: the find judged again once the runtime runs is the widest seen.
    let rank = |r: delivery::Reason| {
        (r.found == delivery::GO_RUNTIME) as u8 * 2 + delivery::runs_on_program_stacks(r) as u8
    };
    with(|st| {
        if st
            .found
            .as_ref()
            .is_none_or(|(was, _)| rank(reason) > rank(*was))
        {
            st.found = Some((reason, text.clone()));
        }
        if delivery::runs_on_program_stacks(reason) && requested() == Requested::Thread {
            // Asked for the handler thread: the report says what it serves.
            st.reason = Some(text.clone());
        }
    });
    // Before the runtime starts, what the kernel does counts as served;
    // `keep_out_if_unserved` looks again once it runs.
    let kernel = kernel_now().unwrap_or(delivery::Kernel::ASSUMED);
    if let Some(why) = delivery::keeps_out(requested(), Some(reason), kernel) {
        keep_out(kept_out_text(why, &text));
        return;
    }
    if requested() != Requested::Auto
        || DECIDED.load(Relaxed)
        || delivery::choose(Requested::Auto, Some(reason)) != Chosen::Thread
    {
        return;
    }
    attune::paging::THREAD_FOR_NEW_REGIONS.store(true, Relaxed);
    DECIDED.store(true, Relaxed);
    with(|st| st.reason = Some(text.clone()));
    let earlier = attune::runtime::engine_if_started()
        .map(|e| e.pager.counters.regions_signal.load(Relaxed))
        .unwrap_or(0);
    let level = if at_start || earlier == 0 {
        attune::log::Level::Info
    } else {
        attune::log::Level::Warn
    };
    let tail = if earlier == 0 {
        String::new()
    } else {
        format!(
            "; {earlier} region(s) made before keep signal delivery, and a kernel access to \
             their non-resident pages outside a wrapped call fails with EFAULT (run with \
             --fault-mode thread if its I/O reaches them)"
        )
    };
    attune::log::emit(
        level,
        &format!("attune run: {text}: new regions use the handler thread{tail}"),
    );
}

/// What the runtime's userfaultfd does for the program, once it runs.
fn kernel_now() -> Option<delivery::Kernel> {
    attune::runtime::engine_if_started().map(|e| delivery::Kernel {
        faults: !e.pager.user_mode_only(),
        reports_discards: e.pager.sees_removes(),
    })
}

/// The warning for a find that keeps memory out (`what`: the find, described).
fn kept_out_text(why: delivery::KeptOut, what: &str) -> String {
    match why {
        delivery::KeptOut::SignalFrames => format!(
            "{what}, whose stacks no signal delivery serves (docs/design/run.md, \"Programs \
             whose stacks are in their heap\")"
        ),
        delivery::KeptOut::UserModeFaults => format!(
            "{what}; this process's userfaultfd sees user-mode faults only \
             (vm.unprivileged_userfaultfd=0), so those kernel accesses would fail with EFAULT \
             on non-resident pages. Kernel faults are served where /dev/userfaultfd is handed \
             to the job (docs/design/run.md, \"Fault delivery\")"
        ),
        delivery::KeptOut::UnreportedDiscards => format!(
            "{what}, which returns memory with madvise made without libc and then uses it as \
             zeroed; this kernel does not report such discards to the runtime (that needs \
             UFFDIO_MOVE, Linux 6.8), so a page held in a far tier would come back with its \
             old content (docs/design/run.md, \"Discards the interposer does not see\")"
        ),
    }
}

/// Once the runtime runs (when it starts; a later find is judged as it is made): a find
/// made before judged again by the keep-out rule (`attune_policy::delivery::keeps_out`)
/// with what the kernel does for this process now known. A process kept out says why, and
/// how to get the kernel's faults served where that is the reason.
pub fn keep_out_if_unserved() {
    if KEPT_OUT.load(Relaxed) {
        return;
    }
    let Some(kernel) = kernel_now() else {
        return;
    };
    let Some((reason, text)) = with(|st| st.found.clone()) else {
        return;
    };
    if let Some(why) = delivery::keeps_out(requested(), Some(reason), kernel) {
        keep_out(kept_out_text(why, &text));
    }
}

/// From now on new requests stay with the program's allocator, untiered, for `why`
/// (the warning, and the report's `kept_out_reason`). Regions made before stay managed.
fn keep_out(why: String) {
    KEPT_OUT.store(true, Relaxed);
    let earlier = attune::runtime::engine_if_started()
        .map(|e| {
            e.pager.counters.regions_signal.load(Relaxed)
                + e.pager.counters.regions_thread.load(Relaxed)
        })
        .unwrap_or(0);
    attune::log::emit(
        attune::log::Level::Warn,
        &format!(
            "attune run: {why}: new allocations stay with the program's allocator, untiered{}",
            if earlier > 0 {
                format!(" ({earlier} region(s) made before stay managed)")
            } else {
                String::new()
            }
        ),
    );
    with(|st| st.kept_out = Some(why));
}

/// Under `--small`, once the runtime runs: the small arenas take the delivery
/// `attune_policy::delivery::small_arenas` gives, or small requests stay with the
/// program's allocator (false), with a warning that says why.
pub fn settle_small_arenas() -> bool {
    let Some(e) = attune::runtime::engine_if_started() else {
        return false;
    };
    match delivery::small_arenas(requested(), !e.pager.user_mode_only()) {
        delivery::Heap::Managed(c) => {
            attune::small::set_arena_fault_mode(Some(match c {
                Chosen::Thread => attune::config::FaultMode::Thread,
                Chosen::Signal => attune::config::FaultMode::Signal,
            }));
            true
        }
        delivery::Heap::KeptOut => {
            attune::log::emit(
                attune::log::Level::Warn,
                "attune run: --small: small objects are the arguments of system calls no \
                 wrapper retries (path strings, stat buffers, lock words), and this \
                 process's userfaultfd sees user-mode faults only \
                 (vm.unprivileged_userfaultfd=0), so a kernel access to a non-resident one \
                 would fail with EFAULT: small requests stay with the program's allocator, \
                 untiered. Kernel faults are served where /dev/userfaultfd is handed to the \
                 job (docs/design/run.md, \"Fault delivery\")",
            );
            false
        }
    }
}

/// Mappings an allocator asked for that stayed unmanaged (`for_mapping`).
pub static MAPPINGS_KEPT_OUT: AtomicU64 = AtomicU64::new(0);

/// The delivery of a mapping asked for from code address `caller` (0 unknown), or None
/// when it stays with the kernel: `attune_policy::delivery::mapping`. The runtime runs.
pub fn for_mapping(caller: usize) -> Option<attune::config::FaultMode> {
    let kernel_faults = attune::runtime::engine_if_started()
        .map(|e| !e.pager.user_mode_only())
        .unwrap_or(false);
    let by = if caller != 0 && attune_sys::libc_alloc::is_heap_code(caller) {
        delivery::MappedBy::Allocator
    } else if caller != 0
        && requested() == Requested::Auto
        && kernel_faults
        // Only there does a collected heap get another delivery than other mappings
        // (`attune_policy::delivery::mapping`): the loader's list is walked only then.
        && attune_sys::elf::code_object(caller).is_some_and(|o| delivery::collected_heap_owner(&o))
    {
        delivery::MappedBy::CollectedHeap
    } else {
        delivery::MappedBy::Program
    };
    match delivery::mapping(requested(), kernel_faults, by) {
        delivery::Heap::Managed(Chosen::Thread) => Some(attune::config::FaultMode::Thread),
        delivery::Heap::Managed(Chosen::Signal) => Some(attune::config::FaultMode::Signal),
        delivery::Heap::KeptOut => {
            if MAPPINGS_KEPT_OUT.fetch_add(1, Relaxed) == 0 {
                attune::log::emit(
                    attune::log::Level::Info,
                    &format!(
                        "attune run: an allocator (the program's is {}) maps its heap, whose \
                         small objects reach system calls no wrapper retries, and this \
                         process's userfaultfd sees user-mode faults only \
                         (vm.unprivileged_userfaultfd=0): its mappings stay unmanaged; \
                         its large blocks (malloc) are tiered. Kernel faults are served \
                         where /dev/userfaultfd is handed to the job (docs/design/run.md, \
                         \"Fault delivery\")",
                        attune_sys::libc_alloc::program_allocator().unwrap_or_default()
                    ),
                );
            }
            None
        }
    }
}

/// Records the objects that map heaps besides the program's allocator
/// (`attune_policy::delivery::HEAP_OWNERS`), once the runtime runs: a mapping made after
/// is judged by its caller (`for_mapping`). An interpreter `dlopen`ed later (an embedded
/// libpython) is not seen: its arenas keep the rule of other mappings.
pub fn note_heap_owners() {
    for name in delivery::HEAP_OWNERS {
        if let Ok(c) = std::ffi::CString::new(*name) {
            attune_sys::libc_alloc::add_heap_owner(&c);
        }
    }
}

/// Whether new requests must stay with the program's allocator.
pub fn kept_out() -> bool {
    KEPT_OUT.load(Relaxed)
}

/// Why new requests stay with the program's allocator, once they do (for the report).
pub fn kept_out_reason() -> Option<String> {
    with(|st| st.kept_out.clone())
}

/// Marks everything loaded now as looked at without judging it: the runtime's own
/// libraries (libfabric for a remote tier) are not the program's.
pub fn absorb_runtime_libraries() {
    if KEPT_OUT.load(Relaxed) {
        return;
    }
    with(|st| {
        st.generation = elf::generation();
        let _ = elf::scan_new(&mut st.seen, &|_| false, &|_| false);
    });
}

/// The delivery new regions get now, and why (for the report).
pub fn current() -> (&'static str, Option<String>) {
    let reason = with(|s| s.reason.clone());
    let mode = match requested() {
        Requested::Thread => "thread",
        Requested::Signal => "signal",
        Requested::Auto if DECIDED.load(Relaxed) => "thread",
        Requested::Auto => "signal",
    };
    (mode, reason)
}

/// Fork: the child must not inherit the state's lock held by a thread that does not
/// exist there; the prepare handler takes it, both sides give it back.
pub fn before_fork() {
    lock_gate();
}

pub fn after_fork() {
    GATE.store(false, Release);
}

fn lock_gate() {
    while GATE
        .compare_exchange_weak(false, true, Acquire, Relaxed)
        .is_err()
    {
        std::thread::yield_now();
    }
}

/// Runs `f` on the state under the fork-safe gate.
fn with<R>(f: impl FnOnce(&mut State) -> R) -> R {
    lock_gate();
    let r = f(&mut STATE.lock().unwrap_or_else(|p| p.into_inner()));
    GATE.store(false, Release);
    r
}
