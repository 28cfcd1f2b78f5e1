//! The runtime's own I/O goes to the kernel directly, never through the symbols `read`,
//! `write`, `pread`, `pwrite`, `sendmsg` and `recvmsg`, which libattune interposes
//! (`crates/libattune/src/io.rs`) and which therefore resolve to its wrappers inside this
//! process. A wrapper resolves the next definition with `dlsym` on its first call, which
//! takes the dynamic loader's lock: the evictor, holding the region list's lock, stored
//! to a far tier with `pwrite` while the main thread, inside `dlopen` (the loader's lock
//! held), ran OpenBLAS's constructor, whose `mmap` waited for the region list: both
//! waited for ever (`bench/imme.py --quick`, 3 runs of 6 hung on 2026-11-28). `dlsym` is
//! not async-signal-safe either, and the SIGBUS handler reads far tiers. Same return
//! value and `errno` as the libc functions. Signal masks too ([`sigmask`]): the runtime's
//! threads block signals first thing, and going through libattune's `pthread_sigmask`
//! wrapper that was a `dlsym` while a `dlopen` on another thread mapped memory
//! (`tests/run/dlopen_ctor.c` hung every time).

use libc::{c_int, c_void, msghdr};

/// # Safety
/// As `read(2)`: `buf` writable for `n` bytes.
pub(crate) unsafe fn read(fd: c_int, buf: *mut c_void, n: usize) -> isize {
    unsafe { libc::syscall(libc::SYS_read, fd, buf, n) as isize }
}
/// # Safety
/// As `write(2)`: `buf` readable for `n` bytes.
pub(crate) unsafe fn write(fd: c_int, buf: *const c_void, n: usize) -> isize {
    unsafe { libc::syscall(libc::SYS_write, fd, buf, n) as isize }
}
/// # Safety
/// As `pread(2)`.
pub(crate) unsafe fn pread(fd: c_int, buf: *mut c_void, n: usize, off: libc::off_t) -> isize {
    unsafe { libc::syscall(libc::SYS_pread64, fd, buf, n, off) as isize }
}
/// # Safety
/// As `pwrite(2)`.
pub(crate) unsafe fn pwrite(fd: c_int, buf: *const c_void, n: usize, off: libc::off_t) -> isize {
    unsafe { libc::syscall(libc::SYS_pwrite64, fd, buf, n, off) as isize }
}
/// # Safety
/// As `sendmsg(2)`.
pub(crate) unsafe fn sendmsg(fd: c_int, msg: *const msghdr, flags: c_int) -> isize {
    unsafe { libc::syscall(libc::SYS_sendmsg, fd, msg, flags) as isize }
}
/// # Safety
/// As `recvmsg(2)`.
pub(crate) unsafe fn recvmsg(fd: c_int, msg: *mut msghdr, flags: c_int) -> isize {
    unsafe { libc::syscall(libc::SYS_recvmsg, fd, msg, flags) as isize }
}

/// glibc's own signals (SIGCANCEL 32, SIGSETXID 33), which `pthread_sigmask` never blocks:
/// a thread that blocks SIGSETXID hangs every `setuid` of the process.
const GLIBC_SIGNALS: u64 = (1 << 31) | (1 << 32);

/// `pthread_sigmask(2)` without libc's wrapper (or libattune's): `rt_sigprocmask` on the
/// calling thread, glibc's own signals never blocked. 0 or -1 with `errno`.
///
/// # Safety
/// `set` null or a valid `sigset_t`; `old` null or writable for one.
pub(crate) unsafe fn sigmask(
    how: c_int,
    set: *const libc::sigset_t,
    old: *mut libc::sigset_t,
) -> c_int {
    // The kernel's mask is the first 64 bits of glibc's 1024-bit sigset_t.
    let k: u64 = if set.is_null() {
        0
    } else {
        // SAFETY: a non-null `set` is a valid sigset_t (the contract), 128 bytes.
        let bits = unsafe { *(set as *const u64) };
        if how == libc::SIG_UNBLOCK {
            bits
        } else {
            bits & !GLIBC_SIGNALS
        }
    };
    let kset = if set.is_null() {
        std::ptr::null()
    } else {
        &k as *const u64
    };
    let mut kold: u64 = 0;
    // SAFETY: both kernel masks are 8 bytes, valid or null.
    let r = unsafe {
        libc::syscall(
            libc::SYS_rt_sigprocmask,
            how,
            kset,
            &mut kold as *mut u64,
            8usize,
        ) as c_int
    };
    if r == 0 && !old.is_null() {
        // SAFETY: `old` is writable for a sigset_t (the contract).
        unsafe {
            libc::sigemptyset(old);
            *(old as *mut u64) = kold;
        }
    }
    r
}
