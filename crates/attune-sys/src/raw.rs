//! The runtime's own I/O goes to the kernel directly, never through the symbols `read`,
//! `write`, `pread`, `pwrite`, `sendmsg` and `recvmsg`, which libattune interposes
//! (`crates/libattune/src/io.rs`) and which therefore resolve to its wrappers inside this
//! process. A wrapper resolves the next definition with `dlsym` on its first call, which
//! takes the dynamic loader's lock: the evictor, holding the region list's lock, stored
//! to a far tier with `pwrite` while the main thread, inside `dlopen` (the loader's lock
//! held), ran OpenBLAS's constructor, whose `mmap` waited for the region list: both
//! waited for ever (`bench/imme.py --quick`, 3 runs of 6 hung on 2026-11-28). `dlsym` is
//! not async-signal-safe either, and the SIGBUS handler reads far tiers. Same return
//! value and `errno` as the libc functions.

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
