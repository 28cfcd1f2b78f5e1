//! Which fault delivery an unmodified program gets under `attune run` (`--fault-mode auto`,
//! the default): signal delivery, unless the program has loaded something through which the
//! kernel or a device reads and writes its memory outside a call the interposer wraps.
//!
//! Signal delivery resolves a fault on the faulting thread (docs/benchmarks.md: about 3x
//! the rate of the handler thread on fault-bound programs), but under it a kernel access to
//! a non-resident page fails with EFAULT. The interposer retries the synchronous calls
//! (`read`, `write`, sockets, stdio: libattune's `io.rs`); what it cannot retry is an access
//! that happens later, on the kernel's or a device's own schedule: an io_uring or Linux AIO
//! request, glibc's POSIX AIO (its helper threads call glibc's internal `pread`), a page
//! spliced into a pipe, memory registered with an RDMA or GPU driver. A program that has
//! one of those loaded gets the handler thread, which serves every kernel access.
//!
//! Two kinds of evidence, both read from the loaded objects (`attune_sys::elf`): a loaded
//! library by its soname, and a symbol some object imports. A library that is loaded but
//! never used costs the program the handler thread, which is what it had before `auto`.
//! What neither shows (a raw `syscall(SYS_io_uring_setup)`, liburing linked statically)
//! is a documented limit: `--fault-mode thread` (docs/design/run.md, "Fault delivery").

/// Why a program gets thread delivery: what was found, and what it does with memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reason {
    /// The library or the symbol found.
    pub found: &'static str,
    /// What it lets the kernel or a device do.
    pub access: &'static str,
}

/// Libraries (soname prefixes) whose use hands program memory to the kernel or a device.
/// The first is not a file name: `attune_sys::elf` reports an object that carries Go's
/// build-ID note under it.
const LIBRARIES: &[(&str, &str)] = &[
    (
        GO_RUNTIME,
        "its goroutines run on stacks in its heap, where the kernel writes signal frames \
         and the signal resolver would run",
    ),
    (
        "liburing.so",
        "io_uring: the kernel reads and writes buffers after the call returns",
    ),
    (
        "libaio.so",
        "Linux AIO: the kernel reads and writes buffers after the call returns",
    ),
    (
        "libibverbs.so",
        "RDMA: registered memory is read and written by the adapter",
    ),
    (
        "librdmacm.so",
        "RDMA: registered memory is read and written by the adapter",
    ),
    (
        "libfabric.so",
        "a fabric: registered memory is read and written by the adapter",
    ),
    (
        "libucp.so",
        "UCX: registered memory is read and written by the adapter",
    ),
    (
        "libuct.so",
        "UCX: registered memory is read and written by the adapter",
    ),
    (
        "libpsm2.so",
        "PSM2: registered memory is read and written by the adapter",
    ),
    (
        "libcuda.so",
        "a GPU driver: registered host memory is read and written by the device",
    ),
    (
        "libhsa-runtime64.so",
        "a GPU driver: registered host memory is read and written by the device",
    ),
    (
        "libze_loader.so",
        "a GPU driver: registered host memory is read and written by the device",
    ),
    (
        "libboost_context.so",
        "fibers on stacks the library allocates, switched by its own assembly: the kernel \
         writes signal frames there and the signal resolver would run",
    ),
    (
        "libabt.so",
        "Argobots: user-level threads on stacks the library allocates, switched by its \
         own assembly: the kernel writes signal frames there and the signal resolver \
         would run",
    ),
    (
        "libqthread.so",
        "Qthreads: user-level threads on stacks the library allocates, switched by its \
         own assembly: the kernel writes signal frames there and the signal resolver \
         would run",
    ),
];

/// Libraries (soname prefixes of [`LIBRARIES`]) that run the program's code on stacks
/// they allocate and switch to without a libc call (`runs_on_program_stacks`).
/// `tests/run/fiber_stacks.cpp` (64 Boost.Context fibers on 1 MiB stacks) was killed by
/// SIGSEGV in 0.03 s under `attune run` before its row; Argobots and Qthreads switch the
/// same way and are named by their rows alone (not installed here).
const STACK_LIBRARIES: &[&str] = &["libboost_context.so", "libabt.so", "libqthread.so"];

/// Imported symbols that hand program memory to the kernel asynchronously.
const SYMBOLS: &[(&str, &str)] = &[
    (
        "aio_read",
        "POSIX AIO: glibc's helper threads fill buffers with unwrapped calls",
    ),
    (
        "aio_read64",
        "POSIX AIO: glibc's helper threads fill buffers with unwrapped calls",
    ),
    (
        "aio_write",
        "POSIX AIO: glibc's helper threads read buffers with unwrapped calls",
    ),
    (
        "aio_write64",
        "POSIX AIO: glibc's helper threads read buffers with unwrapped calls",
    ),
    (
        "lio_listio",
        "POSIX AIO: glibc's helper threads move buffers with unwrapped calls",
    ),
    (
        "lio_listio64",
        "POSIX AIO: glibc's helper threads move buffers with unwrapped calls",
    ),
    (
        "io_submit",
        "Linux AIO: the kernel reads and writes buffers after the call returns",
    ),
    (
        "io_uring_setup",
        "io_uring: the kernel reads and writes buffers after the call returns",
    ),
    (
        "vmsplice",
        "vmsplice: pages are read from a pipe after the call returns",
    ),
    (
        MAKECONTEXT,
        "user-level threads on stacks the program allocates, where the kernel writes \
         signal frames and the signal resolver would run",
    ),
];

/// glibc's `makecontext`: a context that runs on a stack the program gave it (ucontext
/// coroutines, tasking runtimes built on it). Such a stack in managed memory is the Go
/// runtime's case (`GO_RUNTIME`): under signal delivery a fault there could not be
/// resolved (`tests/run/coro_stacks.c`, 64 coroutines on 1 MiB `malloc`ed stacks, was
/// killed by SIGSEGV in 0.02 s under `attune run`), so the find gives the handler thread,
/// and memory is kept out where no delivery serves the stacks (`keeps_out`).
pub const MAKECONTEXT: &str = "makecontext";

/// Whether a find runs the program's code on stacks in memory it allocated: the kernel's
/// signal frames and the signal resolver would land there.
pub fn runs_on_program_stacks(r: Reason) -> bool {
    r.found == GO_RUNTIME || r.found == MAKECONTEXT || STACK_LIBRARIES.contains(&r.found)
}

/// The name the loader scan gives an object linked by Go's linker (its build-ID note):
/// with cgo, the Go runtime maps its heap through libc, so `attune run` manages it, and
/// goroutine stacks, signal stacks included, live there. Under signal delivery the
/// kernel cannot write a signal frame to a page that is not resident (the thread gets
/// SIGSEGV), and a resolver running on such a stack could evict the page under its own
/// frame (a program that hung in `UFFDIO_MOVE`). So the find gives the handler thread,
/// and where no delivery can serve those stacks the memory stays untiered (`keeps_out`;
/// docs/design/run.md, "Programs whose stacks are in their heap").
pub const GO_RUNTIME: &str = "the Go runtime";

/// The reason a loaded library gives, from its name as the loader reports it (a path or a
/// soname; only the file name counts).
pub fn library_reason(path: &str) -> Option<Reason> {
    let name = path.rsplit('/').next().unwrap_or(path);
    LIBRARIES
        .iter()
        .find(|(prefix, _)| name.starts_with(prefix))
        .map(|&(found, access)| Reason { found, access })
}

/// The reason an imported symbol gives (versioned names such as `aio_read@GLIBC_2.34`
/// are not how the dynamic symbol table spells them: the name alone is compared).
pub fn symbol_reason(name: &str) -> Option<Reason> {
    SYMBOLS
        .iter()
        .find(|(s, _)| *s == name)
        .map(|&(found, access)| Reason { found, access })
}

/// What the runtime's userfaultfd does for the program, known once it runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Kernel {
    /// The kernel's own accesses to missing pages are delivered (false: user-mode faults
    /// only, `vm.unprivileged_userfaultfd=0` for a user who is not root).
    pub faults: bool,
    /// The kernel reports the program's own discards (`UFFD_EVENT_REMOVE`, asked for
    /// where pages move by `UFFDIO_MOVE`: Linux 6.8).
    pub reports_discards: bool,
}

impl Kernel {
    /// Before the runtime runs: what it will do is not known, and counts as served.
    pub const ASSUMED: Kernel = Kernel {
        faults: true,
        reports_discards: true,
    };
}

/// Why a find keeps the program's new allocations with its own allocator, untiered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeptOut {
    /// Stacks in the program's memory (the Go runtime, `makecontext`) under an explicit
    /// signal delivery: the kernel writes signal frames on them, and cannot fault a missing
    /// page in for one.
    SignalFrames,
    /// The userfaultfd sees user-mode faults only (`vm.unprivileged_userfaultfd=0` for a
    /// user who is not root): the handler thread cannot serve the kernel's accesses the find
    /// makes (a Go stack's signal frames, an io_uring's buffers) any more than a signal can.
    UserModeFaults,
    /// The Go runtime where the kernel does not report discards: Go returns memory with
    /// `madvise` made without libc and then uses it as zeroed, and a chunk in a far tier
    /// would come back with its old content (8 of 150 runs of `go_cgo` failed so before
    /// the reports).
    UnreportedDiscards,
}

/// Whether, and why, a find keeps the program's new allocations with its own allocator:
/// stacks in the program's memory (`runs_on_program_stacks`) where no delivery serves
/// them; the Go runtime where its discards would not be seen; under `auto`, any find where
/// the kernel's faults are not delivered (the handler thread it would give serves nothing
/// more than a signal). An explicit `thread` or `signal` with another find is kept: the
/// user was told its limit. Under the handler thread with both kernel features the Go
/// runtime is tiered: 120 runs without a failure (docs/design/run.md). The first reason
/// that holds is given, in the order above.
pub fn keeps_out(requested: Requested, reason: Option<Reason>, kernel: Kernel) -> Option<KeptOut> {
    let reason = reason?;
    let go = reason.found == GO_RUNTIME;
    let stacks = runs_on_program_stacks(reason);
    if stacks && requested == Requested::Signal {
        Some(KeptOut::SignalFrames)
    } else if !kernel.faults && (stacks || requested == Requested::Auto) {
        Some(KeptOut::UserModeFaults)
    } else if go && !kernel.reports_discards {
        Some(KeptOut::UnreportedDiscards)
    } else {
        None
    }
}

/// The delivery `attune run` asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Requested {
    Auto,
    Thread,
    Signal,
}

/// The delivery new regions get.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Chosen {
    Thread,
    Signal,
}

/// The rule: an explicit choice is kept (a user who asked for signal delivery over an
/// io_uring program has been told its limit); `auto` is signal until a reason is found.
pub fn choose(requested: Requested, reason: Option<Reason>) -> Chosen {
    match (requested, reason) {
        (Requested::Thread, _) => Chosen::Thread,
        (Requested::Signal, _) => Chosen::Signal,
        (Requested::Auto, Some(_)) => Chosen::Thread,
        (Requested::Auto, None) => Chosen::Signal,
    }
}

/// What becomes of memory that holds a program's small objects: the runtime's arenas
/// under `attune run --small`, and the mappings a program's allocator makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Heap {
    /// Managed, with this delivery.
    Managed(Chosen),
    /// Small requests stay with the program's allocator, untiered.
    KeptOut,
}

/// The rule for small arenas. Small objects are the arguments of system calls that no
/// wrapper covers (path strings, `struct stat`, lock words, descriptor arrays), and a
/// kernel access to a non-resident page fails with EFAULT under signal delivery, and
/// under either delivery when the userfaultfd sees user-mode faults only
/// (`kernel_faults` false). So the arenas take the handler thread, or stay out; an
/// explicit `signal` is kept, as for regions (the user has been told its limit).
pub fn small_arenas(requested: Requested, kernel_faults: bool) -> Heap {
    match requested {
        Requested::Signal => Heap::Managed(Chosen::Signal),
        _ if kernel_faults => Heap::Managed(Chosen::Thread),
        _ => Heap::KeptOut,
    }
}

/// Symbols whose defining object maps heaps of small objects with `mmap`, besides the
/// program's `malloc` when it is not glibc's: CPython's object allocator (its 1 MiB
/// arenas), and a jemalloc built with the `je_` prefix, which a program links without
/// replacing `malloc` (Redis does). An executable that defines one has all of its own
/// mappings counted as heaps: untiered where kernel faults are not served, never wrong.
pub const HEAP_OWNERS: &[&str] = &["PyObject_Malloc", "je_malloc"];

/// Whose code asked for a mapping (`mmap`) the interposer would manage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MappedBy {
    /// An allocator: the program's when it is not glibc's (jemalloc, tcmalloc, mimalloc),
    /// or an object that defines one of `HEAP_OWNERS` (CPython). A heap, whose small
    /// objects are system-call arguments.
    Allocator,
    /// Other code: the program's own data, or a heap nothing marks.
    Program,
    /// A garbage-collected runtime's object heap (an object named in
    /// [`COLLECTED_HEAP_OWNERS`]): bulk data no system call sees but through a copy or a
    /// wrapped call (`collected_heap_owner`).
    CollectedHeap,
}

/// File names (without version) of the objects whose mappings are the object heap of a
/// garbage-collected runtime: HotSpot's `libjvm.so` (every JDK build, any collector). Its
/// objects move with every collection, so no native code may keep their addresses beyond
/// a JNI critical section, and neither the JDK's own native code nor the VM hands them to
/// the kernel: file and socket I/O copy through buffers outside the heap (a stack buffer,
/// a direct buffer from `malloc`), lock words live in the C heap (`ObjectMonitor`,
/// `pthread` parkers). What reaches the kernel from a heap array is a JNI library's call
/// on a critical pointer, a libc call the interposer retries. So such a heap takes the
/// regions' delivery under `auto`: on the JVM's own heap benchmark, 2.87 s against
/// 4.07 s for the handler thread (`bench/real_programs.py --only java`,
/// docs/benchmarks.md).
pub const COLLECTED_HEAP_OWNERS: &[&str] = &["libjvm.so"];

/// Whether the object at `path` owns a collected heap (`COLLECTED_HEAP_OWNERS`, matched on
/// the file name up to its version suffix).
pub fn collected_heap_owner(path: &str) -> bool {
    let file = path.rsplit('/').next().unwrap_or(path);
    COLLECTED_HEAP_OWNERS.iter().any(|name| {
        file.strip_prefix(name)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('.'))
    })
}

/// The rule for mappings. A mapping may be a heap: jemalloc, tcmalloc, mimalloc and
/// CPython map their arenas this way, and their objects reach system calls no wrapper
/// covers (`opendir`'s buffer, which glibc fills with its internal `getdents64`; a path
/// string). A kernel write to a fresh or moved-out page of one fails with EFAULT under
/// signal delivery. So under `auto`, where the userfaultfd serves kernel faults, every
/// mapping takes the handler thread (no heap is missed; the cost falls on programs whose
/// bulk data is `mmap`ed: docs/benchmarks.md). Where it does not, an allocator's
/// mappings follow the small arenas' rule (unmanaged), and other mappings keep the
/// regions' delivery: bulk data, whose transfers the wrapped calls retry, as malloc's
/// large blocks. A collected heap (`MappedBy::CollectedHeap`) is such bulk data wherever
/// the faults are served. Explicit choices are kept, as for regions.
pub fn mapping(requested: Requested, kernel_faults: bool, by: MappedBy) -> Heap {
    match (requested, by) {
        (_, MappedBy::Allocator) => small_arenas(requested, kernel_faults),
        (Requested::Thread, MappedBy::CollectedHeap) => Heap::Managed(Chosen::Thread),
        (_, MappedBy::CollectedHeap) => Heap::Managed(Chosen::Signal),
        (Requested::Auto, MappedBy::Program) if kernel_faults => Heap::Managed(Chosen::Thread),
        (Requested::Thread, MappedBy::Program) => Heap::Managed(Chosen::Thread),
        (_, MappedBy::Program) => Heap::Managed(Chosen::Signal),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libraries_by_file_name() {
        for (path, found) in [
            (
                "/usr/lib/x86_64-linux-gnu/liburing.so.2",
                Some("liburing.so"),
            ),
            ("liburing.so.2.3", Some("liburing.so")),
            ("/lib/libaio.so.1t64", Some("libaio.so")),
            ("/usr/lib/libibverbs.so.1.14.44.0", Some("libibverbs.so")),
            ("/opt/ucx/lib/libucp.so.0", Some("libucp.so")),
            ("/usr/lib/libfabric.so.1", Some("libfabric.so")),
            ("/usr/lib/libcuda.so.1", Some("libcuda.so")),
            // The loader scan's name for an object Go's linker made.
            ("the Go runtime", Some(GO_RUNTIME)),
            // Not a prefix match on the directory, nor on a look-alike name.
            ("/opt/liburing.so.2/libc.so.6", None),
            ("/usr/lib/libc.so.6", None),
            ("/usr/lib/libm.so.6", None),
            ("/usr/lib/libjemalloc.so.2", None),
            ("/usr/lib/libmpi.so.40", None),
            ("", None),
        ] {
            assert_eq!(library_reason(path).map(|r| r.found), found, "{path}");
        }
    }

    #[test]
    fn what_keeps_memory_out_and_why() {
        use KeptOut::*;
        use Requested::*;
        let k = |faults, reports_discards| Kernel {
            faults,
            reports_discards,
        };
        // What is kept out for each kind of find: the Go runtime; stacks in the program's
        // memory (makecontext and the stack libraries: Go's rules for the stacks, not
        // for discards); any other find (only under auto, only where the kernel's faults
        // are not delivered: an explicit choice stays).
        let go = [library_reason(GO_RUNTIME)];
        let stacks = [
            symbol_reason("makecontext"),
            library_reason("/usr/lib/x86_64-linux-gnu/libboost_context.so.1.74.0"),
            library_reason("libabt.so.1"),
            library_reason("libqthread.so.20"),
        ];
        let other = [
            library_reason("liburing.so.2"),
            library_reason("/usr/lib/libfabric.so.1"),
            symbol_reason("aio_read"),
        ];
        for (requested, kernel, for_go, for_stacks, for_other) in [
            (Auto, k(true, true), None, None, None),
            (Thread, k(true, true), None, None, None),
            (
                Signal,
                k(true, true),
                Some(SignalFrames),
                Some(SignalFrames),
                None,
            ),
            (
                Auto,
                k(false, true),
                Some(UserModeFaults),
                Some(UserModeFaults),
                Some(UserModeFaults),
            ),
            (
                Thread,
                k(false, true),
                Some(UserModeFaults),
                Some(UserModeFaults),
                None,
            ),
            // Either reason holds; the signal frames come first.
            (
                Signal,
                k(false, true),
                Some(SignalFrames),
                Some(SignalFrames),
                None,
            ),
            // No discard reports (before 6.8, or `-move`): Go's own `madvise` is not seen.
            (Auto, k(true, false), Some(UnreportedDiscards), None, None),
            (Thread, k(true, false), Some(UnreportedDiscards), None, None),
            (
                Signal,
                k(true, false),
                Some(SignalFrames),
                Some(SignalFrames),
                None,
            ),
            (
                Auto,
                k(false, false),
                Some(UserModeFaults),
                Some(UserModeFaults),
                Some(UserModeFaults),
            ),
            (
                Thread,
                k(false, false),
                Some(UserModeFaults),
                Some(UserModeFaults),
                None,
            ),
            (
                Signal,
                k(false, false),
                Some(SignalFrames),
                Some(SignalFrames),
                None,
            ),
        ] {
            for (finds, out) in [
                (&go[..], for_go),
                (&stacks, for_stacks),
                (&other, for_other),
            ] {
                for &find in finds {
                    assert!(find.is_some());
                    assert_eq!(
                        keeps_out(requested, find, kernel),
                        out,
                        "{find:?}, {requested:?}, {kernel:?}"
                    );
                }
            }
            assert_eq!(keeps_out(requested, None, kernel), None);
        }
        // Each of them under auto gets the handler thread, as every find does.
        for find in go.iter().chain(&stacks).chain(&other) {
            assert_eq!(choose(Auto, *find), Chosen::Thread);
        }
        assert!(stacks
            .iter()
            .chain(&go)
            .all(|f| f.is_some_and(runs_on_program_stacks)));
        assert!(!other.iter().any(|f| f.is_some_and(runs_on_program_stacks)));
        assert_eq!(Kernel::ASSUMED, k(true, true));
    }

    #[test]
    fn symbols_by_exact_name() {
        for (sym, found) in [
            ("aio_read", true),
            ("aio_write64", true),
            ("lio_listio", true),
            ("io_submit", true),
            ("vmsplice", true),
            ("makecontext", true),
            ("swapcontext", false), // switches to contexts makecontext made
            ("aio_error", false),   // status only, no buffer
            ("aio_return", false),
            ("read", false),
            ("splice", false), // between descriptors: no user memory
            ("aio_readx", false),
            ("", false),
        ] {
            assert_eq!(symbol_reason(sym).is_some(), found, "{sym}");
        }
    }

    #[test]
    fn explicit_choices_are_kept_and_auto_follows_the_evidence() {
        let r = library_reason("liburing.so.2");
        assert!(r.is_some());
        for (req, reason, chosen) in [
            (Requested::Auto, None, Chosen::Signal),
            (Requested::Auto, r, Chosen::Thread),
            (Requested::Thread, None, Chosen::Thread),
            (Requested::Thread, r, Chosen::Thread),
            (Requested::Signal, None, Chosen::Signal),
            (Requested::Signal, r, Chosen::Signal),
        ] {
            assert_eq!(choose(req, reason), chosen, "{req:?} {reason:?}");
        }
    }

    #[test]
    fn small_arenas_need_kernel_faults_served() {
        use Heap::*;
        for (req, kernel_faults, want) in [
            (Requested::Auto, true, Managed(Chosen::Thread)),
            (Requested::Thread, true, Managed(Chosen::Thread)),
            (Requested::Signal, true, Managed(Chosen::Signal)),
            (Requested::Auto, false, KeptOut),
            (Requested::Thread, false, KeptOut),
            (Requested::Signal, false, Managed(Chosen::Signal)),
        ] {
            assert_eq!(
                small_arenas(req, kernel_faults),
                want,
                "{req:?} {kernel_faults}"
            );
        }
    }

    #[test]
    fn mappings_get_kernel_faults_served_or_the_allocators_stay_out() {
        use Heap::*;
        use MappedBy::*;
        use Requested::*;
        let (t, s) = (Managed(Chosen::Thread), Managed(Chosen::Signal));
        for (req, kernel_faults, by, want) in [
            (Auto, true, Allocator, t),
            (Auto, true, Program, t),
            (Auto, false, Allocator, KeptOut),
            (Auto, false, Program, s),
            (Thread, true, Allocator, t),
            (Thread, true, Program, t),
            (Thread, false, Allocator, KeptOut),
            (Thread, false, Program, t),
            (Signal, true, Allocator, s),
            (Signal, true, Program, s),
            (Signal, false, Allocator, s),
            (Signal, false, Program, s),
            (Auto, true, CollectedHeap, s),
            (Auto, false, CollectedHeap, s),
            (Thread, true, CollectedHeap, t),
            (Thread, false, CollectedHeap, t),
            (Signal, true, CollectedHeap, s),
            (Signal, false, CollectedHeap, s),
        ] {
            assert_eq!(
                mapping(req, kernel_faults, by),
                want,
                "{req:?} {kernel_faults} {by:?}"
            );
        }
    }

    #[test]
    fn collected_heaps_by_file_name() {
        for (path, owns) in [
            (
                "/usr/lib/jvm/java-17-openjdk-amd64/lib/server/libjvm.so",
                true,
            ),
            ("/opt/jdk/lib/client/libjvm.so", true),
            ("libjvm.so.1", true),
            ("/usr/lib/jvm/java-17-openjdk-amd64/lib/libjava.so", false),
            ("/opt/libjvm.so/libc.so.6", false),
            ("/usr/lib/libjvm.sox", false),
            ("/usr/bin/java", false),
            ("", false),
        ] {
            assert_eq!(collected_heap_owner(path), owns, "{path}");
        }
    }

    #[test]
    fn every_reason_says_what_it_does() {
        for (f, a) in LIBRARIES.iter().chain(SYMBOLS) {
            assert!(!f.is_empty() && a.len() > 10, "{f}");
        }
    }
}
