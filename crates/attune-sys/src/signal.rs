//! The SIGBUS hook for faults delivered by a `Delivery::Signal` userfaultfd.
//!
//! One process-wide handler. It asks the installed resolver whether the faulting address
//! is managed memory; if so the resolver places the page and the access is replayed when
//! the handler returns. Otherwise the program's own disposition is honoured: its handler
//! is called, or the default action (core dump) happens as if Attune were not there.
//!
//! The handler runs with every signal blocked (`sa_mask` full), so an application
//! handler can never interrupt it and fault on managed memory re-entrantly, and on the
//! faulting thread's own stack, never an alternate signal stack (too small for eviction):
//! so signal-delivery memory must not be a thread's stack.
//!
//! **The program keeps its SIGBUS handler, and cannot block SIGBUS.** A program that
//! installed its own handler after the runtime replaced ours: every managed fault then
//! went to its handler, which returned, and the access faulted again forever (100% CPU).
//! A thread that blocked SIGBUS was killed by its first managed fault (the kernel forces
//! a blocked synchronous signal to its default action). So libattune interposes
//! `sigaction`, `signal`, `sigprocmask` and `pthread_sigmask` for SIGBUS only, through
//! [`program_sigaction`], [`program_signal`] and [`unblock_sigbus`]: the program's handler
//! is recorded and chained for faults that are not the runtime's, and SIGBUS is taken
//! out of any mask a thread asks to block. Only while the runtime's handler is installed.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// Resolves a fault at `addr`; returns false when the address is not managed.
pub type Resolver = fn(addr: usize) -> bool;

static RESOLVER: AtomicUsize = AtomicUsize::new(0);
static INSTALLED: AtomicBool = AtomicBool::new(false);

/// The program's SIGBUS disposition, the one the handler chains to: two slots, the
/// active one named by `PROGRAM_SLOT`; a change writes the other and flips (under
/// `PROGRAM_LOCK`), so the handler never reads a half-written one.
static mut PROGRAM: [std::mem::MaybeUninit<libc::sigaction>; 2] = [
    std::mem::MaybeUninit::uninit(),
    std::mem::MaybeUninit::uninit(),
];
static PROGRAM_SLOT: AtomicUsize = AtomicUsize::new(0);
static PROGRAM_LOCK: AtomicBool = AtomicBool::new(false);

/// libc's own `sigaction`, resolved at install: the process's `sigaction` may be
/// libattune's (below), which would only record the change.
static REAL_SIGACTION: crate::libc_alloc::NextFn = crate::libc_alloc::NextFn::new(c"sigaction");

fn real_sigaction(sig: i32, act: *const libc::sigaction, old: *mut libc::sigaction) -> i32 {
    REAL_SIGACTION.int_ipp(sig, act as usize, old as usize)
}

fn program_action() -> libc::sigaction {
    let i = PROGRAM_SLOT.load(Ordering::Acquire);
    // SAFETY: slot i was written before PROGRAM_SLOT named it (install, set_program).
    unsafe { (*std::ptr::addr_of!(PROGRAM))[i].assume_init() }
}

fn set_program(act: libc::sigaction) {
    while PROGRAM_LOCK
        .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
        .is_err()
    {
        std::hint::spin_loop();
    }
    let w = 1 - PROGRAM_SLOT.load(Ordering::Relaxed);
    // SAFETY: slot w is not the active one; writers are serialised by PROGRAM_LOCK.
    unsafe { (*std::ptr::addr_of_mut!(PROGRAM))[w].write(act) };
    PROGRAM_SLOT.store(w, Ordering::Release);
    PROGRAM_LOCK.store(false, Ordering::Release);
}

extern "C" fn on_sigbus(sig: i32, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for SA_SIGINFO handlers.
    let addr = unsafe { (*info).si_addr() } as usize;
    // A SIGBUS sent by a process or thread (`si_code` <= 0: kill, tgkill) is no fault and
    // carries no address: never resolved. The runtime sends one itself to a thread whose
    // page could not be read back where the kernel has no `UFFDIO_POISON`.
    // SAFETY: as above.
    let sent = unsafe { (*info).si_code } <= 0;
    let r = RESOLVER.load(Ordering::Acquire);
    if r != 0 && !sent {
        // SAFETY: RESOLVER only ever holds a `Resolver` function pointer.
        let f: Resolver = unsafe { std::mem::transmute::<usize, Resolver>(r) };
        // A panic must not unwind into this extern "C" handler and the program's frames.
        match std::panic::catch_unwind(|| f(addr)) {
            Ok(true) => return,
            Ok(false) => {}
            Err(_) => crate::os::runtime_failed(b"the SIGBUS handler"),
        }
    }
    // Not ours: behave as the process would without Attune.
    let prev = program_action();
    // SAFETY: the recorded disposition is a handler of the declared kind, or SIG_DFL/IGN.
    unsafe {
        if prev.sa_sigaction == libc::SIG_DFL || prev.sa_sigaction == libc::SIG_IGN {
            let mut dfl: libc::sigaction = std::mem::zeroed();
            dfl.sa_sigaction = libc::SIG_DFL;
            real_sigaction(sig, &dfl, std::ptr::null_mut());
            // Returning re-executes the access, which raises SIGBUS again with the
            // default action (a synchronous SIGBUS cannot be ignored). A sent one is sent
            // again: blocked in this handler, it is taken with the default action on return.
            if sent {
                libc::syscall(libc::SYS_tgkill, libc::getpid(), crate::os::gettid(), sig);
            }
            return;
        }
        if prev.sa_flags & libc::SA_SIGINFO != 0 {
            let h: extern "C" fn(i32, *mut libc::siginfo_t, *mut libc::c_void) =
                std::mem::transmute(prev.sa_sigaction);
            h(sig, info, ctx);
        } else {
            let h: extern "C" fn(i32) = std::mem::transmute(prev.sa_sigaction);
            h(sig);
        }
    }
}

/// Installs the SIGBUS handler once and sets the resolver.
pub fn install(resolver: Resolver) -> crate::SysResult<()> {
    RESOLVER.store(resolver as usize, Ordering::Release);
    if INSTALLED.load(Ordering::Acquire) {
        return Ok(());
    }
    // SAFETY: sigaction with a fully initialised struct; the old one is recorded as the
    // program's before INSTALLED tells the wrappers to record changes.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_sigbus as *const () as usize;
        // Not SA_ONSTACK: resolving a fault may evict (direct reclaim through a far tier),
        // which needs more stack than the small alternate stacks that Rust's std and
        // Python's faulthandler give each thread (8 KiB; overflowed here). The handler
        // runs on the faulting thread's own stack, like the function it interrupted.
        sa.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
        libc::sigfillset(&mut sa.sa_mask);
        let mut old: libc::sigaction = std::mem::zeroed();
        if real_sigaction(libc::SIGBUS, &sa, &mut old) != 0 {
            return Err(crate::Errno::last());
        }
        set_program(old);
    }
    INSTALLED.store(true, Ordering::Release);
    Ok(())
}

/// Whether the runtime's SIGBUS handler is installed.
pub fn installed() -> bool {
    INSTALLED.load(Ordering::Acquire)
}

/// `sigaction(sig, act, old)` as the program calls it. For SIGBUS while the runtime's
/// handler is installed, the program's disposition is read or recorded (chained for
/// faults that are not the runtime's) and the kernel's stays the runtime's; every other
/// call is libc's. `act` and `old` are the program's pointers (null or valid).
pub fn program_sigaction(sig: i32, act: usize, old: usize) -> i32 {
    if sig != libc::SIGBUS || !installed() || crate::libc_alloc::in_runtime() {
        return real_sigaction(sig, act as *const _, old as *mut _);
    }
    let prev = program_action();
    if act != 0 {
        // SAFETY: a non-null act is the program's valid sigaction.
        set_program(unsafe { *(act as *const libc::sigaction) });
    }
    if old != 0 {
        // SAFETY: a non-null old is the program's writable sigaction.
        unsafe { *(old as *mut libc::sigaction) = prev };
    }
    0
}

/// `signal(sig, handler)` as the program calls it (glibc's BSD semantics: SA_RESTART,
/// the signal not blocked in its handler... as glibc's own `signal`). Returns the
/// previous handler, or SIG_ERR with errno set.
pub fn program_signal(sig: i32, handler: usize) -> usize {
    // SAFETY: a zeroed sigaction with a handler and an empty mask is valid.
    let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
    sa.sa_sigaction = handler;
    sa.sa_flags = libc::SA_RESTART;
    // SAFETY: sa_mask is a valid sigset_t.
    unsafe {
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaddset(&mut sa.sa_mask, sig);
    }
    // SAFETY: as above.
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    if program_sigaction(sig, &sa as *const _ as usize, &mut old as *mut _ as usize) != 0 {
        return libc::SIG_ERR;
    }
    old.sa_sigaction
}

/// `sigprocmask`/`pthread_sigmask(how, set, old)` as the program calls it (`real` is
/// libc's): where the program asks to block SIGBUS while the runtime's handler is
/// installed, SIGBUS is taken out of the set first.
pub fn program_sigmask(real: &crate::libc_alloc::NextFn, how: i32, set: usize, old: usize) -> i32 {
    let mut copy = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
    let mut set = set;
    if set != 0 && how != libc::SIG_UNBLOCK && installed() && !crate::libc_alloc::in_runtime() {
        // SAFETY: a non-null set is the program's valid sigset_t; copy is written whole
        // before it is used.
        unsafe {
            if libc::sigismember(set as *const libc::sigset_t, libc::SIGBUS) == 1 {
                copy.write(*(set as *const libc::sigset_t));
                libc::sigdelset(copy.as_mut_ptr(), libc::SIGBUS);
                set = copy.as_ptr() as usize;
            }
        }
    }
    real.int_ipp(how, set, old)
}

/// libc's `sigprocmask`/`pthread_sigmask`, for the wrappers.
pub static REAL_SIGPROCMASK: crate::libc_alloc::NextFn =
    crate::libc_alloc::NextFn::new(c"sigprocmask");
pub static REAL_PTHREAD_SIGMASK: crate::libc_alloc::NextFn =
    crate::libc_alloc::NextFn::new(c"pthread_sigmask");
/// libc's `signal`, for calls that are not about SIGBUS.
pub static REAL_SIGNAL: crate::libc_alloc::NextFn = crate::libc_alloc::NextFn::new(c"signal");

/// Looks up libc's signal functions now, from the library's constructor (libattune's
/// `resolve_at_load`): never from a first call on a runtime thread, whose `dlsym` waits
/// for the loader's lock while a `dlopen` on another thread may be waiting for the
/// runtime.
pub fn resolve_at_load() {
    for f in [
        &REAL_SIGACTION,
        &REAL_SIGPROCMASK,
        &REAL_PTHREAD_SIGMASK,
        &REAL_SIGNAL,
    ] {
        f.resolve();
    }
}
