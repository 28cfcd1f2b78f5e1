//! System calls that take the program's buffers, for the case where the kernel cannot
//! fault managed pages in: userfaultfd restricted to user-mode faults (unprivileged users
//! where `vm.unprivileged_userfaultfd=0`) or SIGBUS delivery. The kernel then fails the
//! call with EFAULT when a buffer's page is in a far tier. Each wrapper calls the real
//! function first, unchanged; only on EFAULT over managed memory does it hold the
//! buffers in DRAM (`attune::runtime::hold`) and call again, so the program gets what it
//! would have got without Attune. docs/design/run.md, "System calls on managed memory".
//!
//! * A call whose managed bytes fit in a quarter of the budget is retried whole, with the
//!   same arguments: every call's meaning is kept (a datagram stays one datagram).
//! * A larger one is split where the call allows a short count: reads of regular files and
//!   writes to anything but datagram sockets continue piece by piece; reads of other
//!   descriptors (pipes, stream sockets) return the first piece, a short read they
//!   allow; a datagram is received whole with the buffer's first piece held.
//!   Sends of messages (`sendmsg`, `sendmmsg`) and `process_vm_*` are only retried
//!   whole; beyond the limit the EFAULT stands (documented).
//! * Socket receives are held *before* the call, never retried: the kernel dequeues a
//!   datagram before it copies it and drops it when the copy fails, so a retry would
//!   wait for a message that is gone. `read`/`readv` on a datagram socket likewise.
//! * `fread`/`fwrite` cannot be retried (the stream's state has moved), so their managed
//!   buffers are held before the call, in pieces, once any managed memory can fail a
//!   kernel access.
//!
//! * A short count on a regular file over managed memory goes on to the rest: the kernel
//!   returns what it copied before the first page it could not fault in, and programs
//!   take a regular file's short count as its end.
//!
//! Calls made by the runtime itself (inside it, or its threads) go straight through.
//!
//! Here in libattune, not only in the `attune run` interposer (which links this crate):
//! a program linked with libattune gets these definitions before libc's, so its own
//! `read` into an `allocate_TM` buffer works for an unprivileged user too. On success
//! each is one call of libc's function through a cached pointer.

use attune::runtime;
use attune_sys::libc_alloc::{self as sys, NextFn};
use libc::{c_int, c_uint, c_void, iovec, off_t, size_t, ssize_t};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Marks this thread as inside the runtime for the guard's life (the hold's faults and
/// their allocations are the runtime's), unless it already was.
struct Busy(bool);
impl Busy {
    fn enter() -> Busy {
        Busy(sys::enter_runtime())
    }
}
impl Drop for Busy {
    fn drop(&mut self) {
        if self.0 {
            sys::leave_runtime();
        }
    }
}

/// System calls retried after an EFAULT on managed memory, and bytes held for them
/// (including the stdio calls' holds).
pub static RETRIED: AtomicU64 = AtomicU64::new(0);
pub static HELD_BYTES: AtomicU64 = AtomicU64::new(0);
/// Calls whose EFAULT was left standing (a message call larger than the hold limit).
pub static UNRETRIED: AtomicU64 = AtomicU64::new(0);

static READ: NextFn = NextFn::new(c"read");
static WRITE: NextFn = NextFn::new(c"write");
static PREAD: NextFn = NextFn::new(c"pread64");
static PWRITE: NextFn = NextFn::new(c"pwrite64");
static READV: NextFn = NextFn::new(c"readv");
static WRITEV: NextFn = NextFn::new(c"writev");
static PREADV: NextFn = NextFn::new(c"preadv64");
static PWRITEV: NextFn = NextFn::new(c"pwritev64");
static PREADV2: NextFn = NextFn::new(c"preadv2");
static PWRITEV2: NextFn = NextFn::new(c"pwritev2");
static RECV: NextFn = NextFn::new(c"recv");
static GETRANDOM: NextFn = NextFn::new(c"getrandom");
static SEND: NextFn = NextFn::new(c"send");
static RECVFROM: NextFn = NextFn::new(c"recvfrom");
static SENDTO: NextFn = NextFn::new(c"sendto");
static RECVMSG: NextFn = NextFn::new(c"recvmsg");
static SENDMSG: NextFn = NextFn::new(c"sendmsg");
static RECVMMSG: NextFn = NextFn::new(c"recvmmsg");
static SENDMMSG: NextFn = NextFn::new(c"sendmmsg");
static FREAD: NextFn = NextFn::new(c"fread");
static FWRITE: NextFn = NextFn::new(c"fwrite");
static FREAD_UNLOCKED: NextFn = NextFn::new(c"fread_unlocked");
static FWRITE_UNLOCKED: NextFn = NextFn::new(c"fwrite_unlocked");
static PROCESS_VM_READV: NextFn = NextFn::new(c"process_vm_readv");
static PROCESS_VM_WRITEV: NextFn = NextFn::new(c"process_vm_writev");

/// Every wrapper's next definition is looked up when the library is loaded (a
/// constructor: the loader runs it holding its own lock, which `dlsym` takes again
/// recursively), never at a wrapper's first call. That first call could come from a
/// runtime thread holding the region list's lock (std's file I/O in the evictor's cgroup
/// readings, the report thread) while another thread, inside `dlopen`, waited for that
/// lock in a constructor's `mmap`: a deadlock (attune_sys `raw.rs` says which one hung).
extern "C" fn resolve_at_load() {
    for f in [
        &READ,
        &WRITE,
        &PREAD,
        &PWRITE,
        &READV,
        &WRITEV,
        &PREADV,
        &PWRITEV,
        &PREADV2,
        &PWRITEV2,
        &RECV,
        &GETRANDOM,
        &SEND,
        &RECVFROM,
        &SENDTO,
        &RECVMSG,
        &SENDMSG,
        &RECVMMSG,
        &SENDMMSG,
        &FREAD,
        &FWRITE,
        &FREAD_UNLOCKED,
        &FWRITE_UNLOCKED,
        &PROCESS_VM_READV,
        &PROCESS_VM_WRITEV,
    ] {
        f.resolve();
    }
    attune_sys::signal::resolve_at_load();
    attune_sys::threads::resolve_at_load();
}

#[used]
#[allow(unsafe_code)]
#[link_section = ".init_array"]
static RESOLVE_AT_LOAD: extern "C" fn() = resolve_at_load;

/// Whether any managed memory can fail a kernel access: until then no wrapper looks
/// further (nothing allocated or locked on the common path: these calls are
/// async-signal-safe, and programs call them from signal handlers).
#[inline]
fn may_fail() -> bool {
    attune::paging::KERNEL_ACCESS_MAY_FAIL.load(Relaxed)
}

/// Whether a failed call's EFAULT may be the runtime's: managed memory in one of
/// `ranges` whose missing pages the kernel cannot fault in.
fn ours(ranges: &[(usize, usize)]) -> bool {
    if sys::errno() != libc::EFAULT
        || !attune::paging::KERNEL_ACCESS_MAY_FAIL.load(Relaxed)
        || sys::in_runtime()
    {
        return false;
    }
    let _b = Busy::enter();
    ranges
        .iter()
        .any(|&(a, n)| runtime::kernel_access_fails(a, n))
}

/// Holds every range (inside the runtime: the hold faults pages in).
fn hold_all(ranges: &[(usize, usize)]) -> Vec<runtime::Hold> {
    let _b = Busy::enter();
    ranges
        .iter()
        .filter(|r| r.1 > 0)
        .map(|&(a, n)| {
            let h = runtime::hold(a, n);
            HELD_BYTES.fetch_add(h.bytes() as u64, Relaxed);
            h
        })
        .collect()
}

fn release(h: Vec<runtime::Hold>) {
    let e = sys::errno();
    {
        let _b = Busy::enter();
        drop(h);
    }
    sys::set_errno(e);
}

fn limit() -> usize {
    runtime::hold_limit()
}

/// Calls `call` again with `ranges` held, up to three times while it fails with EFAULT
/// (another thread's hold may have ended between two chunks of ours).
fn retry_whole(ranges: &[(usize, usize)], mut call: impl FnMut() -> isize) -> isize {
    RETRIED.fetch_add(1, Relaxed);
    let mut r = -1;
    for _ in 0..3 {
        let h = hold_all(ranges);
        r = call();
        release(h);
        if r >= 0 || sys::errno() != libc::EFAULT {
            break;
        }
    }
    r
}

/// Holds `ranges` (their first `limit` bytes) before a call that cannot be retried: a
/// socket receive dequeues a datagram before it copies it, and drops it when the copy
/// fails (`unix_dgram_recvmsg`, `udp_recvmsg`), so a retry would wait for a datagram
/// that is gone. None when no managed memory of them can fail a kernel access.
fn hold_before(ranges: &[(usize, usize)]) -> Option<Vec<runtime::Hold>> {
    if !attune::paging::KERNEL_ACCESS_MAY_FAIL.load(Relaxed) || sys::in_runtime() {
        return None;
    }
    let managed = {
        let _b = Busy::enter();
        ranges
            .iter()
            .any(|&(a, n)| runtime::kernel_access_fails(a, n))
    };
    if !managed {
        return None;
    }
    RETRIED.fetch_add(1, Relaxed);
    let mut left = limit();
    let mut clipped = Vec::new();
    for &(a, n) in ranges {
        let k = n.min(left);
        clipped.push((a, k));
        left -= k;
    }
    Some(hold_all(&clipped))
}

/// Whether `fd` is a socket that keeps message boundaries (a datagram is dropped when
/// its copy fails), for `read`/`readv`, which may be given any descriptor.
fn message_socket(fd: c_int) -> bool {
    !matches!(sys::socket_type(fd), -1 | libc::SOCK_STREAM)
}

/// How a call over more bytes than one hold covers goes on after a full piece.
#[derive(Clone, Copy, PartialEq)]
enum Split {
    /// Piece after piece until a short count (regular files; writes to streams).
    Continue,
    /// The first piece only: a short count (reads of pipes and sockets).
    First,
    /// Not at all: retried whole, or the EFAULT stands.
    Never,
    /// Retried once whole with only the buffer's first piece held: a datagram larger
    /// than a piece is rare, and one cannot be received in parts.
    Head,
}

fn split_for_read(fd: c_int) -> Split {
    match sys::fd_type(fd) {
        libc::S_IFREG | libc::S_IFBLK => Split::Continue,
        _ => Split::First,
    }
}

fn split_for_write(fd: c_int) -> Split {
    match sys::socket_type(fd) {
        -1 | libc::SOCK_STREAM => Split::Continue,
        _ => Split::Never,
    }
}

/// The slow path of a single-buffer call that failed with EFAULT: `call(offset, len)`
/// reads or writes `[buf+offset, buf+offset+len)`.
fn retry_buffer(
    buf: usize,
    len: usize,
    split: Split,
    mut call: impl FnMut(usize, usize) -> isize,
) -> isize {
    let lim = limit();
    if len > lim && split == Split::Head {
        return retry_whole(&[(buf, lim)], || call(0, len));
    }
    if len <= lim || split == Split::Never {
        if len > lim {
            UNRETRIED.fetch_add(1, Relaxed);
            sys::set_errno(libc::EFAULT);
            return -1;
        }
        return retry_whole(&[(buf, len)], || call(0, len));
    }
    let mut done = 0;
    while done < len {
        let n = (len - done).min(lim);
        let r = retry_whole(&[(buf + done, n)], || call(done, n));
        if r < 0 {
            return if done > 0 { done as isize } else { -1 };
        }
        done += r as usize;
        if (r as usize) < n || split == Split::First {
            break;
        }
    }
    done as isize
}

/// The iovecs of the array `iov` (count `cnt`) as ranges.
fn iov_ranges(iov: usize, cnt: usize) -> Vec<(usize, usize)> {
    (0..cnt).map(|i| sys::iovec_at(iov, i)).collect()
}

/// The part of the ranges `all` that starts `skip` bytes in, at most `want` bytes long.
fn window(all: &[(usize, usize)], mut skip: usize, mut want: usize) -> Vec<(usize, usize)> {
    let mut win = Vec::new();
    for &(a, n) in all {
        if want == 0 {
            break;
        }
        if skip >= n {
            skip -= n;
            continue;
        }
        let take = (n - skip).min(want);
        win.push((a + skip, take));
        skip = 0;
        want -= take;
    }
    win
}

/// The slow path of a vectored call that failed with EFAULT: `call(sub, offset)` runs on
/// a window of the vector (`sub`) that starts `offset` bytes into it.
fn retry_vector(
    iov: usize,
    cnt: c_int,
    split: Split,
    mut call: impl FnMut(&[iovec], usize) -> isize,
) -> isize {
    let all = iov_ranges(iov, cnt.max(0) as usize);
    let total: usize = all.iter().map(|r| r.1).sum();
    let lim = limit();
    let as_iov = |v: &[(usize, usize)]| -> Vec<iovec> {
        v.iter()
            .map(|&(a, n)| iovec {
                iov_base: a as *mut c_void,
                iov_len: n,
            })
            .collect()
    };
    if total <= lim || matches!(split, Split::Never | Split::Head) {
        if total > lim {
            UNRETRIED.fetch_add(1, Relaxed);
            sys::set_errno(libc::EFAULT);
            return -1;
        }
        let v = as_iov(&all);
        return retry_whole(&all, || call(&v, 0));
    }
    let mut done = 0;
    while done < total {
        let win = window(&all, done, lim);
        let n: usize = win.iter().map(|r| r.1).sum();
        let v = as_iov(&win);
        let r = retry_whole(&win, || call(&v, done));
        if r < 0 {
            return if done > 0 { done as isize } else { -1 };
        }
        done += r as usize;
        if (r as usize) < n || split == Split::First {
            break;
        }
    }
    done as isize
}

/// After a short count `r` of a call on `fd` over `[buf, buf+n)`: the kernel stops at
/// the first page it cannot fault in and returns what it copied so far, which a program
/// trusting a regular file's full count takes as the end. On a regular file (where one
/// more call never blocks) with managed memory left, the rest is transferred too.
fn finish_short(
    fd: c_int,
    buf: usize,
    n: usize,
    r: isize,
    rest: impl FnMut(usize, usize) -> isize,
) -> isize {
    if r <= 0
        || r as usize >= n
        || !attune::paging::KERNEL_ACCESS_MAY_FAIL.load(Relaxed)
        || sys::in_runtime()
        || sys::fd_type(fd) != libc::S_IFREG
        || {
            let _b = Busy::enter();
            !runtime::kernel_access_fails(buf + r as usize, n - r as usize)
        }
    {
        return r;
    }
    let done = r as usize;
    let mut rest = rest;
    let more = retry_buffer(buf + done, n - done, Split::Continue, |o, l| {
        rest(done + o, l)
    });
    if more < 0 {
        done as isize
    } else {
        (done + more as usize) as isize
    }
}

/// The same for a vectored call: the rest of the vector after `r` bytes.
fn finish_short_vector(
    fd: c_int,
    iov: usize,
    cnt: c_int,
    r: isize,
    rest: impl FnMut(&[iovec], usize) -> isize,
) -> isize {
    if r <= 0 || !attune::paging::KERNEL_ACCESS_MAY_FAIL.load(Relaxed) || sys::in_runtime() {
        return r;
    }
    let all = iov_ranges(iov, cnt.max(0) as usize);
    let total: usize = all.iter().map(|x| x.1).sum();
    if r as usize >= total || sys::fd_type(fd) != libc::S_IFREG {
        return r;
    }
    let left: Vec<iovec> = window(&all, r as usize, usize::MAX)
        .into_iter()
        .map(|(a, n)| iovec {
            iov_base: a as *mut c_void,
            iov_len: n,
        })
        .collect();
    let managed = {
        let _b = Busy::enter();
        left.iter()
            .any(|v| runtime::kernel_access_fails(v.iov_base as usize, v.iov_len))
    };
    if !managed {
        return r;
    }
    let done = r as usize;
    let mut rest = rest;
    let more = retry_vector(
        left.as_ptr() as usize,
        left.len() as c_int,
        Split::Continue,
        |v, o| rest(v, done + o),
    );
    if more < 0 {
        done as isize
    } else {
        (done + more as usize) as isize
    }
}

/// A single-buffer call: `call(offset, len)` transfers `[b+offset, b+offset+len)`. The
/// call first; a short count on a regular file finished, an EFAULT of ours retried held
/// (`split` decides how a transfer larger than one hold goes on).
fn buffer_call(
    fd: c_int,
    b: usize,
    n: usize,
    split: impl FnOnce() -> Split,
    call: impl Fn(usize, usize) -> isize,
) -> isize {
    let r = call(0, n);
    if r >= 0 {
        return finish_short(fd, b, n, r, &call);
    }
    if !ours(&[(b, n)]) {
        return r;
    }
    retry_buffer(b, n, split(), &call)
}

/// A vectored call, likewise: `call(iov, count, offset)` transfers a vector (the
/// program's, or a window of it that starts `offset` bytes in).
fn vector_call(
    fd: c_int,
    iov: usize,
    cnt: c_int,
    split: impl FnOnce() -> Split,
    call: impl Fn(usize, c_int, usize) -> isize,
) -> isize {
    let r = call(iov, cnt, 0);
    let windowed = |v: &[iovec], o: usize| call(v.as_ptr() as usize, v.len() as c_int, o);
    if r >= 0 {
        return finish_short_vector(fd, iov, cnt, r, windowed);
    }
    if !ours(&iov_ranges(iov, cnt.max(0) as usize)) {
        return r;
    }
    retry_vector(iov, cnt, split(), windowed)
}

// ---- read and write, positional and vectored ----

#[no_mangle]
pub extern "C" fn read(fd: c_int, buf: *mut c_void, n: size_t) -> ssize_t {
    let b = buf as usize;
    if may_fail() && message_socket(fd) {
        if let Some(h) = hold_before(&[(b, n)]) {
            let r = READ.isize_ipz(fd, b, n);
            release(h);
            return r;
        }
    }
    buffer_call(
        fd,
        b,
        n,
        || split_for_read(fd),
        |o, l| READ.isize_ipz(fd, b + o, l),
    )
}

#[no_mangle]
pub extern "C" fn write(fd: c_int, buf: *const c_void, n: size_t) -> ssize_t {
    let b = buf as usize;
    buffer_call(
        fd,
        b,
        n,
        || split_for_write(fd),
        |o, l| WRITE.isize_ipz(fd, b + o, l),
    )
}

#[no_mangle]
pub extern "C" fn pread64(fd: c_int, buf: *mut c_void, n: size_t, off: off_t) -> ssize_t {
    let b = buf as usize;
    buffer_call(
        fd,
        b,
        n,
        || Split::Continue,
        |o, l| PREAD.isize_ipzo(fd, b + o, l, off + o as off_t),
    )
}

#[no_mangle]
pub extern "C" fn pread(fd: c_int, buf: *mut c_void, n: size_t, off: off_t) -> ssize_t {
    pread64(fd, buf, n, off)
}

#[no_mangle]
pub extern "C" fn pwrite64(fd: c_int, buf: *const c_void, n: size_t, off: off_t) -> ssize_t {
    let b = buf as usize;
    buffer_call(
        fd,
        b,
        n,
        || Split::Continue,
        |o, l| PWRITE.isize_ipzo(fd, b + o, l, off + o as off_t),
    )
}

#[no_mangle]
pub extern "C" fn pwrite(fd: c_int, buf: *const c_void, n: size_t, off: off_t) -> ssize_t {
    pwrite64(fd, buf, n, off)
}

#[no_mangle]
pub extern "C" fn readv(fd: c_int, iov: *const iovec, cnt: c_int) -> ssize_t {
    if may_fail() && message_socket(fd) {
        if let Some(h) = hold_before(&iov_ranges(iov as usize, cnt.max(0) as usize)) {
            let r = READV.isize_ipi(fd, iov as usize, cnt);
            release(h);
            return r;
        }
    }
    vector_call(
        fd,
        iov as usize,
        cnt,
        || split_for_read(fd),
        |p, k, _| READV.isize_ipi(fd, p, k),
    )
}

#[no_mangle]
pub extern "C" fn writev(fd: c_int, iov: *const iovec, cnt: c_int) -> ssize_t {
    vector_call(
        fd,
        iov as usize,
        cnt,
        || split_for_write(fd),
        |p, k, _| WRITEV.isize_ipi(fd, p, k),
    )
}

#[no_mangle]
pub extern "C" fn preadv64(fd: c_int, iov: *const iovec, cnt: c_int, off: off_t) -> ssize_t {
    vector_call(
        fd,
        iov as usize,
        cnt,
        || Split::Continue,
        |p, k, o| PREADV.isize_ipio(fd, p, k, off + o as off_t),
    )
}

#[no_mangle]
pub extern "C" fn preadv(fd: c_int, iov: *const iovec, cnt: c_int, off: off_t) -> ssize_t {
    preadv64(fd, iov, cnt, off)
}

#[no_mangle]
pub extern "C" fn pwritev64(fd: c_int, iov: *const iovec, cnt: c_int, off: off_t) -> ssize_t {
    vector_call(
        fd,
        iov as usize,
        cnt,
        || Split::Continue,
        |p, k, o| PWRITEV.isize_ipio(fd, p, k, off + o as off_t),
    )
}

#[no_mangle]
pub extern "C" fn pwritev(fd: c_int, iov: *const iovec, cnt: c_int, off: off_t) -> ssize_t {
    pwritev64(fd, iov, cnt, off)
}

/// `preadv2`/`pwritev2`: offset -1 means the file position, so only retried whole.
#[no_mangle]
pub extern "C" fn preadv2(
    fd: c_int,
    iov: *const iovec,
    cnt: c_int,
    off: off_t,
    fl: c_int,
) -> ssize_t {
    let r = PREADV2.isize_ipioi(fd, iov as usize, cnt, off, fl);
    if r >= 0 || !ours(&iov_ranges(iov as usize, cnt.max(0) as usize)) {
        return r;
    }
    retry_vector(iov as usize, cnt, Split::Never, |_, _| {
        PREADV2.isize_ipioi(fd, iov as usize, cnt, off, fl)
    })
}

#[no_mangle]
pub extern "C" fn pwritev2(
    fd: c_int,
    iov: *const iovec,
    cnt: c_int,
    off: off_t,
    fl: c_int,
) -> ssize_t {
    let r = PWRITEV2.isize_ipioi(fd, iov as usize, cnt, off, fl);
    if r >= 0 || !ours(&iov_ranges(iov as usize, cnt.max(0) as usize)) {
        return r;
    }
    retry_vector(iov as usize, cnt, Split::Never, |_, _| {
        PWRITEV2.isize_ipioi(fd, iov as usize, cnt, off, fl)
    })
}

// ---- sockets ----

/// A receive into `[b, b+n)`: held before the call (see `hold_before`); on a stream
/// socket a buffer larger than one hold is given its first piece (a short read).
fn receive(fd: c_int, b: usize, n: usize, call: impl Fn(usize) -> isize) -> isize {
    match hold_before(&[(b, n)]) {
        Some(h) => {
            let len = if sys::socket_type(fd) == libc::SOCK_STREAM {
                n.min(limit())
            } else {
                n
            };
            let r = call(len);
            release(h);
            r
        }
        None => call(n),
    }
}

#[no_mangle]
pub extern "C" fn recv(fd: c_int, buf: *mut c_void, n: size_t, fl: c_int) -> ssize_t {
    let b = buf as usize;
    receive(fd, b, n, |len| RECV.isize_ipzi(fd, b, len, fl))
}

#[no_mangle]
pub extern "C" fn send(fd: c_int, buf: *const c_void, n: size_t, fl: c_int) -> ssize_t {
    let b = buf as usize;
    let r = SEND.isize_ipzi(fd, b, n, fl);
    if r >= 0 || !ours(&[(b, n)]) {
        return r;
    }
    retry_buffer(b, n, split_for_write(fd), |o, l| {
        SEND.isize_ipzi(fd, b + o, l, fl)
    })
}

#[no_mangle]
pub extern "C" fn recvfrom(
    fd: c_int,
    buf: *mut c_void,
    n: size_t,
    fl: c_int,
    addr: *mut libc::sockaddr,
    alen: *mut libc::socklen_t,
) -> ssize_t {
    let (b, a, l) = (buf as usize, addr as usize, alen as usize);
    receive(fd, b, n, |len| RECVFROM.isize_ipzipz(fd, b, len, fl, a, l))
}

#[no_mangle]
pub extern "C" fn sendto(
    fd: c_int,
    buf: *const c_void,
    n: size_t,
    fl: c_int,
    addr: *const libc::sockaddr,
    alen: libc::socklen_t,
) -> ssize_t {
    let (b, a, l) = (buf as usize, addr as usize, alen as usize);
    let r = SENDTO.isize_ipzipz(fd, b, n, fl, a, l);
    if r >= 0 || !ours(&[(b, n)]) {
        return r;
    }
    let split = if a == 0 {
        split_for_write(fd)
    } else {
        Split::Never
    };
    retry_buffer(b, n, split, |o, len| {
        SENDTO.isize_ipzipz(fd, b + o, len, fl, a, l)
    })
}

/// The ranges of a msghdr that the kernel reads or writes.
fn msg_ranges(m: usize) -> Vec<(usize, usize)> {
    let (iov, cnt, name, control) = sys::msghdr_parts(m);
    let mut v = iov_ranges(iov, cnt);
    v.push(name);
    v.push(control);
    v
}

/// Message calls are retried whole (their iovecs, name and control buffer held).
fn retry_message(ranges: Vec<(usize, usize)>, call: impl FnMut() -> isize) -> isize {
    if ranges.iter().map(|r| r.1).sum::<usize>() > limit() {
        UNRETRIED.fetch_add(1, Relaxed);
        sys::set_errno(libc::EFAULT);
        return -1;
    }
    retry_whole(&ranges, call)
}

#[no_mangle]
pub extern "C" fn recvmsg(fd: c_int, msg: *mut libc::msghdr, fl: c_int) -> ssize_t {
    // Held before the call (see `hold_before`); a message larger than one hold is held
    // in its first piece only.
    let h = may_fail()
        .then(|| hold_before(&msg_ranges(msg as usize)))
        .flatten();
    let r = RECVMSG.isize_ipi(fd, msg as usize, fl);
    if let Some(h) = h {
        release(h);
    }
    r
}

#[no_mangle]
pub extern "C" fn sendmsg(fd: c_int, msg: *const libc::msghdr, fl: c_int) -> ssize_t {
    let r = SENDMSG.isize_ipi(fd, msg as usize, fl);
    if r >= 0 || !ours(&msg_ranges(msg as usize)) {
        return r;
    }
    retry_message(msg_ranges(msg as usize), || {
        SENDMSG.isize_ipi(fd, msg as usize, fl)
    })
}

fn mmsg_ranges(v: usize, n: u32) -> Vec<(usize, usize)> {
    (0..n as usize)
        .flat_map(|i| msg_ranges(sys::mmsghdr_at(v, i)))
        .collect()
}

#[no_mangle]
pub extern "C" fn recvmmsg(
    fd: c_int,
    v: *mut libc::mmsghdr,
    n: u32,
    fl: c_int,
    t: *mut libc::timespec,
) -> c_int {
    let h = may_fail()
        .then(|| hold_before(&mmsg_ranges(v as usize, n)))
        .flatten();
    let r = RECVMMSG.i32_ipuip(fd, v as usize, n, fl, t as usize);
    if let Some(h) = h {
        release(h);
    }
    r
}

#[no_mangle]
pub extern "C" fn sendmmsg(fd: c_int, v: *mut libc::mmsghdr, n: u32, fl: c_int) -> c_int {
    let r = SENDMMSG.i32_ipui(fd, v as usize, n, fl);
    if r >= 0 || !ours(&mmsg_ranges(v as usize, n)) {
        return r;
    }
    retry_message(mmsg_ranges(v as usize, n), || {
        SENDMMSG.i32_ipui(fd, v as usize, n, fl) as isize
    }) as c_int
}

// ---- another process's memory, into or out of ours ----

/// `process_vm_readv`/`writev` with our *local* buffers managed, or either side when the
/// "remote" process is this one. A peer reading our managed memory cannot be helped from
/// here: a documented limit (Open MPI's single-copy transport: docs/design.md).
fn process_vm(
    f: &NextFn,
    pid: libc::pid_t,
    l: usize,
    ln: usize,
    rm: usize,
    rn: usize,
    fl: usize,
) -> isize {
    let r = f.isize_ipzpzz(pid, l, ln, rm, rn, fl);
    let total: usize = (0..ln).map(|i| sys::iovec_at(l, i).1).sum();
    if !may_fail() || (r >= 0 && r as usize >= total) {
        return r;
    }
    let mut ranges = iov_ranges(l, ln);
    if pid as u32 == std::process::id() {
        // The "remote" memory is ours too.
        ranges.extend(iov_ranges(rm, rn));
    }
    // A short count (the kernel stops at the first page it cannot fault in) or EFAULT:
    // the whole call again, held; copying the same bytes twice is harmless.
    if r >= 0 {
        sys::set_errno(libc::EFAULT);
    }
    if !ours(&ranges) {
        return r;
    }
    let again = retry_message(ranges, || f.isize_ipzpzz(pid, l, ln, rm, rn, fl));
    if again < 0 && r > 0 {
        r
    } else {
        again
    }
}

/// getrandom(3): the kernel fills the buffer (Python's `os.urandom`, `random.randbytes`
/// and NumPy's seeding hand it buffers from malloc). It may return fewer bytes than asked
/// and every caller loops, so a buffer larger than the hold limit is filled a window at a
/// time.
#[no_mangle]
pub extern "C" fn getrandom(buf: *mut c_void, n: size_t, flags: c_uint) -> ssize_t {
    let b = buf as usize;
    let call = |o: usize, l: usize| GETRANDOM.isize_pzu(b + o, l, flags);
    let r = call(0, n);
    if r >= 0 || !ours(&[(b, n)]) {
        return r;
    }
    retry_buffer(b, n, Split::First, call)
}

#[no_mangle]
pub extern "C" fn process_vm_readv(
    pid: libc::pid_t,
    l: *const iovec,
    ln: libc::c_ulong,
    rm: *const iovec,
    rn: libc::c_ulong,
    fl: libc::c_ulong,
) -> ssize_t {
    process_vm(
        &PROCESS_VM_READV,
        pid,
        l as usize,
        ln as usize,
        rm as usize,
        rn as usize,
        fl as usize,
    )
}

#[no_mangle]
pub extern "C" fn process_vm_writev(
    pid: libc::pid_t,
    l: *const iovec,
    ln: libc::c_ulong,
    rm: *const iovec,
    rn: libc::c_ulong,
    fl: libc::c_ulong,
) -> ssize_t {
    process_vm(
        &PROCESS_VM_WRITEV,
        pid,
        l as usize,
        ln as usize,
        rm as usize,
        rn as usize,
        fl as usize,
    )
}

// ---- stdio: held before the call ----

/// `fread`/`fwrite` of `size * n` bytes at `buf`: where the buffer is managed and the
/// kernel may fail to fault it, in held pieces (glibc reads and writes
/// large requests straight between the buffer and the file, by its internal `read` and
/// `write`, which no wrapper sees).
fn stdio(f: &NextFn, buf: usize, size: usize, n: usize, file: usize) -> usize {
    let Some(total) = size.checked_mul(n) else {
        return f.size_pzzp(buf, size, n, file);
    };
    if total == 0 || !attune::paging::KERNEL_ACCESS_MAY_FAIL.load(Relaxed) || sys::in_runtime() || {
        let _b = Busy::enter();
        !runtime::kernel_access_fails(buf, total)
    } {
        return f.size_pzzp(buf, size, n, file);
    }
    RETRIED.fetch_add(1, Relaxed);
    // Byte pieces: reading `size` items of one byte each is the same call to the stream
    // (it moves by the bytes transferred, and a short count means the same).
    let lim = limit();
    let mut done = 0;
    while done < total {
        let k = (total - done).min(lim);
        let h = hold_all(&[(buf + done, k)]);
        let got = f.size_pzzp(buf + done, 1, k, file);
        release(h);
        done += got;
        if got < k {
            break;
        }
    }
    done / size
}

#[no_mangle]
pub extern "C" fn fread(buf: *mut c_void, size: size_t, n: size_t, f: *mut libc::FILE) -> size_t {
    stdio(&FREAD, buf as usize, size, n, f as usize)
}

#[no_mangle]
pub extern "C" fn fwrite(
    buf: *const c_void,
    size: size_t,
    n: size_t,
    f: *mut libc::FILE,
) -> size_t {
    stdio(&FWRITE, buf as usize, size, n, f as usize)
}

#[no_mangle]
pub extern "C" fn fread_unlocked(
    buf: *mut c_void,
    size: size_t,
    n: size_t,
    f: *mut libc::FILE,
) -> size_t {
    stdio(&FREAD_UNLOCKED, buf as usize, size, n, f as usize)
}

#[no_mangle]
pub extern "C" fn fwrite_unlocked(
    buf: *const c_void,
    size: size_t,
    n: size_t,
    f: *mut libc::FILE,
) -> size_t {
    stdio(&FWRITE_UNLOCKED, buf as usize, size, n, f as usize)
}

// ---- SIGBUS stays the runtime's under signal delivery: attune_sys::signal says why ----

#[no_mangle]
pub extern "C" fn sigaction(
    sig: c_int,
    act: *const libc::sigaction,
    old: *mut libc::sigaction,
) -> c_int {
    attune_sys::signal::program_sigaction(sig, act as usize, old as usize)
}

#[no_mangle]
pub extern "C" fn signal(sig: c_int, handler: libc::sighandler_t) -> libc::sighandler_t {
    if sig == libc::SIGBUS && attune_sys::signal::installed() && !sys::in_runtime() {
        return attune_sys::signal::program_signal(sig, handler);
    }
    attune_sys::signal::REAL_SIGNAL.ptr_ip(sig, handler)
}

#[no_mangle]
pub extern "C" fn sigprocmask(
    how: c_int,
    set: *const libc::sigset_t,
    old: *mut libc::sigset_t,
) -> c_int {
    use attune_sys::signal::{program_sigmask, REAL_SIGPROCMASK};
    program_sigmask(&REAL_SIGPROCMASK, how, set as usize, old as usize)
}

#[no_mangle]
pub extern "C" fn pthread_sigmask(
    how: c_int,
    set: *const libc::sigset_t,
    old: *mut libc::sigset_t,
) -> c_int {
    use attune_sys::signal::{program_sigmask, REAL_PTHREAD_SIGMASK};
    program_sigmask(&REAL_PTHREAD_SIGMASK, how, set as usize, old as usize)
}
