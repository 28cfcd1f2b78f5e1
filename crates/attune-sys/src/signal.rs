//! The SIGBUS hook for faults delivered by a `Delivery::Signal` userfaultfd.
//!
//! One process-wide handler. It asks the installed resolver whether the faulting address
//! is managed memory; if so the resolver places the page and the access is replayed when
//! the handler returns. Otherwise the previous disposition is honoured: a previous handler
//! is called, or the default action (core dump) happens as if Attune were not there.
//!
//! The handler runs with every signal blocked (`sa_mask` full), so an application
//! handler can never interrupt it and fault on managed memory re-entrantly, and on the
//! faulting thread's own stack, never an alternate signal stack (too small for eviction):
//! so signal-delivery memory must not be a thread's stack.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// Resolves a fault at `addr`; returns false when the address is not managed.
pub type Resolver = fn(addr: usize) -> bool;

static RESOLVER: AtomicUsize = AtomicUsize::new(0);
static INSTALLED: AtomicBool = AtomicBool::new(false);
static mut PREVIOUS: std::mem::MaybeUninit<libc::sigaction> = std::mem::MaybeUninit::uninit();

extern "C" fn on_sigbus(sig: i32, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for SA_SIGINFO handlers.
    let addr = unsafe { (*info).si_addr() } as usize;
    let r = RESOLVER.load(Ordering::Acquire);
    if r != 0 {
        // SAFETY: RESOLVER only ever holds a `Resolver` function pointer.
        let f: Resolver = unsafe { std::mem::transmute::<usize, Resolver>(r) };
        if f(addr) {
            return;
        }
    }
    // Not ours: behave as the process would without Attune.
    // SAFETY: PREVIOUS was written before INSTALLED became true.
    unsafe {
        let prev = (*std::ptr::addr_of!(PREVIOUS)).assume_init();
        if prev.sa_sigaction == libc::SIG_DFL || prev.sa_sigaction == libc::SIG_IGN {
            libc::signal(sig, libc::SIG_DFL);
            // Returning re-executes the access, which raises SIGBUS again with the
            // default action.
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
    if INSTALLED.swap(true, Ordering::AcqRel) {
        return Ok(());
    }
    // SAFETY: sigaction with a fully initialised struct; PREVIOUS receives the old one.
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
        if libc::sigaction(libc::SIGBUS, &sa, &mut old) != 0 {
            INSTALLED.store(false, Ordering::Release);
            return Err(crate::Errno::last());
        }
        (*std::ptr::addr_of_mut!(PREVIOUS)).write(old);
    }
    Ok(())
}
