//! The program's threads from their first instruction to their end: the interposer's
//! `pthread_create` ([`create`]) runs each new thread's start routine behind hooks the
//! runtime installs ([`follow`]): `begin` in the new thread before the start routine,
//! `end` when it ends (a return, `pthread_exit` or a cancellation: the destructor of a
//! thread-specific key, which glibc runs on all three). The program clock of `attune
//! profile` uses them, so that a thread is timed from its start to its end and not only
//! between the sampler's listings (docs/design/prediction.md, "Threads that come and go").
//!
//! Until hooks are installed, and for threads the runtime starts, `create` is libc's
//! `pthread_create` behind one load. Threads started by other means (`clone` directly, as
//! the Go runtime does) are not seen here; the sampler's listing still finds them.
//!
//! The start routine is called from a frame with nothing to drop (`extern "C-unwind"`):
//! glibc's `pthread_exit` and cancellation unwind through it to `start_thread`, which
//! Rust allows through such a frame and nowhere else.

use libc::{c_int, c_void};
use std::sync::atomic::{AtomicI64, Ordering::*};
use std::sync::OnceLock;

/// libc's `pthread_create` (resolved at load: [`resolve_at_load`]).
static REAL_PTHREAD_CREATE: crate::libc_alloc::NextFn =
    crate::libc_alloc::NextFn::new(c"pthread_create");

/// The hooks, once installed.
static HOOKS: OnceLock<Hooks> = OnceLock::new();
/// The thread-specific key whose destructor runs `end` (-1: none; the key could not be
/// made, and threads are followed from their start only).
static KEY: AtomicI64 = AtomicI64::new(-1);

struct Hooks {
    begin: fn(),
    end: fn(),
}

/// A start routine as the program passes it. "C-unwind": a forced unwind (`pthread_exit`,
/// cancellation) may pass through it and through [`begin_then_start`].
pub type StartRoutine = extern "C-unwind" fn(*mut c_void) -> *mut c_void;

/// Looks libc's `pthread_create` up now, from the library's constructor: a first
/// `dlsym` later could wait for the loader's lock held by a `dlopen` that waits for the
/// runtime (see libattune's `resolve_at_load`).
pub fn resolve_at_load() {
    REAL_PTHREAD_CREATE.resolve();
}

/// Installs the hooks every program thread started from now on calls: `begin` first
/// thing in the thread (it must not allocate: the program's allocator may not be ready
/// for this thread), `end` at its end (inside the runtime: it may allocate). Once per process: later calls (a forked child's
/// runtime starting again) keep the first hooks. Not signal-safe (it may allocate the key).
pub fn follow(begin: fn(), end: fn()) {
    if HOOKS.set(Hooks { begin, end }).is_err() {
        return;
    }
    let mut key: libc::pthread_key_t = 0;
    // SAFETY: key is a valid out-pointer; the destructor is a plain extern "C" function.
    if unsafe { libc::pthread_key_create(&mut key, Some(at_end)) } == 0 {
        KEY.store(key as i64, Release);
    }
}

/// Whether hooks are installed (new program threads are followed).
pub fn following() -> bool {
    HOOKS.get().is_some()
}

struct Start {
    start: StartRoutine,
    arg: *mut c_void,
}

/// `pthread_create` for the interposer: the program's arguments, passed on unchanged to
/// libc's; `start` runs behind the hooks when they are installed and the caller is not
/// the runtime (its own threads are not the program's). The caller's contract is
/// `pthread_create`'s: `thread` and `attr` as libc takes them.
pub fn create(
    thread: *mut libc::pthread_t,
    attr: *const libc::pthread_attr_t,
    start: StartRoutine,
    arg: *mut c_void,
) -> c_int {
    let real = |start: StartRoutine, arg: *mut c_void| -> c_int {
        type Create = extern "C" fn(
            *mut libc::pthread_t,
            *const libc::pthread_attr_t,
            StartRoutine,
            *mut c_void,
        ) -> c_int;
        // SAFETY: the address is libc's pthread_create, whose C signature this is.
        let f: Create = unsafe { std::mem::transmute(REAL_PTHREAD_CREATE.addr()) };
        f(thread, attr, start, arg)
    };
    if !following() || crate::libc_alloc::in_runtime() {
        return real(start, arg);
    }
    let layout = std::alloc::Layout::new::<Start>();
    // SAFETY: the layout is non-zero in size.
    let p = unsafe { std::alloc::alloc(layout) }.cast::<Start>();
    if p.is_null() {
        // No memory for the wrapper: the thread runs unwrapped (the sampler's listing
        // still finds it), as it would without Attune.
        return real(start, arg);
    }
    // SAFETY: p is a fresh allocation of a Start.
    unsafe { p.write(Start { start, arg }) };
    let e = real(begin_then_start, p.cast());
    if e != 0 {
        // SAFETY: the thread was not created; p is ours again, freed once.
        unsafe { std::alloc::dealloc(p.cast(), layout) };
    }
    e
}

/// The start routine of a followed thread: the hooks' `begin`, the key that runs `end`,
/// then the program's start routine. Nothing here has a destructor live across that call
/// (a forced unwind passes through this frame).
extern "C-unwind" fn begin_then_start(p: *mut c_void) -> *mut c_void {
    let p = p.cast::<Start>();
    // SAFETY: p is the Start `create` wrote for this thread, read and freed once here.
    let Start { start, arg } = unsafe { p.read() };
    // SAFETY: allocated in `create` with this layout.
    unsafe { std::alloc::dealloc(p.cast(), std::alloc::Layout::new::<Start>()) };
    if let Some(h) = HOOKS.get() {
        (h.begin)();
        let key = KEY.load(Acquire);
        if key >= 0 {
            // SAFETY: key is a live key made by `follow`; any non-null value makes glibc
            // run the destructor at the thread's end.
            unsafe {
                libc::pthread_setspecific(
                    key as libc::pthread_key_t,
                    std::ptr::dangling::<c_void>(),
                )
            };
        }
    }
    start(arg)
}

extern "C" fn at_end(_: *mut c_void) {
    if let Some(h) = HOOKS.get() {
        // Inside the runtime: what the hook allocates comes from glibc's heap, not the
        // program's allocator, which may be tearing down this thread's cache.
        let entered = crate::libc_alloc::enter_runtime();
        (h.end)();
        if entered {
            crate::libc_alloc::leave_runtime();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    static BEGUN: AtomicUsize = AtomicUsize::new(0);
    static ENDED: AtomicUsize = AtomicUsize::new(0);

    extern "C-unwind" fn returns(arg: *mut c_void) -> *mut c_void {
        assert_eq!(BEGUN.load(SeqCst), 1, "begin ran before the start routine");
        arg
    }

    extern "C-unwind" fn exits(_: *mut c_void) -> *mut c_void {
        // SAFETY: pthread_exit on a thread libc started.
        unsafe { libc::pthread_exit(7 as *mut c_void) }
    }

    fn run(start: StartRoutine, arg: usize) -> usize {
        let mut t: libc::pthread_t = 0;
        assert_eq!(
            create(&mut t, std::ptr::null(), start, arg as *mut c_void),
            0
        );
        let mut ret: *mut c_void = std::ptr::null_mut();
        // SAFETY: t is a joinable thread created above.
        assert_eq!(unsafe { libc::pthread_join(t, &mut ret) }, 0);
        ret as usize
    }

    /// One test: the hooks are once per process.
    #[test]
    fn a_followed_thread_begins_and_ends_through_the_hooks_on_return_and_on_exit() {
        resolve_at_load();
        // Not followed yet: straight through.
        assert_eq!(run(returns_unhooked, 5), 5);
        assert_eq!(ENDED.load(SeqCst), 0);
        follow(
            || {
                BEGUN.fetch_add(1, SeqCst);
            },
            || {
                ENDED.fetch_add(1, SeqCst);
            },
        );
        assert_eq!(run(returns, 42), 42);
        assert_eq!((BEGUN.load(SeqCst), ENDED.load(SeqCst)), (1, 1));
        BEGUN.store(0, SeqCst);
        // pthread_exit unwinds through the wrapper's frame and still runs `end`.
        assert_eq!(run(exits, 0), 7);
        assert_eq!((BEGUN.load(SeqCst), ENDED.load(SeqCst)), (1, 2));
        // The runtime's own threads are not the program's.
        BEGUN.store(0, SeqCst);
        assert!(crate::libc_alloc::enter_runtime());
        assert_eq!(run(returns_unhooked, 9), 9);
        crate::libc_alloc::leave_runtime();
        assert_eq!((BEGUN.load(SeqCst), ENDED.load(SeqCst)), (0, 2));
    }

    extern "C-unwind" fn returns_unhooked(arg: *mut c_void) -> *mut c_void {
        assert_eq!(BEGUN.load(SeqCst), 0);
        arg
    }
}
