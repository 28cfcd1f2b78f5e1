//! userfaultfd: opening, feature negotiation, registration and the resolving ioctls.
//!
//! Layouts follow `include/uapi/linux/userfaultfd.h` of Linux 6.8+ (UFFDIO_MOVE); they are
//! declared here because the distribution headers may be older than the running kernel.
//! Every resolving ioctl below is *signal-safe* (see the crate contract).

use crate::{Errno, SysResult};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

const UFFD_API: u64 = 0xAA;
const UFFDIO: u64 = 0xAA;

const fn iowr(nr: u64, size: usize) -> u64 {
    (3 << 30) | ((size as u64) << 16) | (UFFDIO << 8) | nr
}
const fn ior(nr: u64, size: usize) -> u64 {
    (2 << 30) | ((size as u64) << 16) | (UFFDIO << 8) | nr
}

#[repr(C)]
#[derive(Default)]
struct UffdioApi {
    api: u64,
    features: u64,
    ioctls: u64,
}
#[repr(C)]
#[derive(Default, Clone, Copy)]
struct UffdioRange {
    start: u64,
    len: u64,
}
#[repr(C)]
#[derive(Default)]
struct UffdioRegister {
    range: UffdioRange,
    mode: u64,
    ioctls: u64,
}
#[repr(C)]
#[derive(Default)]
struct UffdioCopy {
    dst: u64,
    src: u64,
    len: u64,
    mode: u64,
    copy: i64,
}
#[repr(C)]
#[derive(Default)]
struct UffdioZeropage {
    range: UffdioRange,
    mode: u64,
    zeropage: i64,
}
#[repr(C)]
#[derive(Default)]
struct UffdioMove {
    dst: u64,
    src: u64,
    len: u64,
    mode: u64,
    moved: i64,
}
#[repr(C)]
#[derive(Default)]
struct UffdioWriteprotect {
    range: UffdioRange,
    mode: u64,
}

const UFFDIO_API: u64 = iowr(0x3F, std::mem::size_of::<UffdioApi>());
const UFFDIO_REGISTER: u64 = iowr(0x00, std::mem::size_of::<UffdioRegister>());
const UFFDIO_UNREGISTER: u64 = ior(0x01, std::mem::size_of::<UffdioRange>());
const UFFDIO_WAKE: u64 = ior(0x02, std::mem::size_of::<UffdioRange>());
const UFFDIO_COPY: u64 = iowr(0x03, std::mem::size_of::<UffdioCopy>());
const UFFDIO_ZEROPAGE: u64 = iowr(0x04, std::mem::size_of::<UffdioZeropage>());
const UFFDIO_MOVE: u64 = iowr(0x05, std::mem::size_of::<UffdioMove>());
const UFFDIO_WRITEPROTECT: u64 = iowr(0x06, std::mem::size_of::<UffdioWriteprotect>());
const UFFDIO_POISON: u64 = iowr(0x08, std::mem::size_of::<UffdioPoison>());

#[repr(C)]
#[derive(Default)]
struct UffdioPoison {
    range: UffdioRange,
    mode: u64,
    updated: i64,
}
/// `USERFAULTFD_IOC_NEW` on `/dev/userfaultfd` (`_IO(0xAA, 0x00)`).
const USERFAULTFD_IOC_NEW: u64 = 0xAA00;

/// Feature bits (`UFFD_FEATURE_*`).
pub mod feature {
    /// Write-protect faults on anonymous memory are reported (Linux 5.7).
    pub const PAGEFAULT_FLAG_WP: u64 = 1 << 0;
    pub const EVENT_REMAP: u64 = 1 << 2;
    /// `madvise(MADV_DONTNEED, MADV_FREE, MADV_REMOVE)` of a registered range is reported
    /// (`EVENT_REMOVE`) before the kernel drops the pages; the caller waits until the
    /// message is read (Linux 4.11).
    pub const EVENT_REMOVE: u64 = 1 << 3;
    pub const SIGBUS: u64 = 1 << 7;
    pub const THREAD_ID: u64 = 1 << 8;
    pub const EXACT_ADDRESS: u64 = 1 << 11;
    pub const WP_UNPOPULATED: u64 = 1 << 13;
    pub const WP_ASYNC: u64 = 1 << 15;
    pub const POISON: u64 = 1 << 14;
    pub const MOVE: u64 = 1 << 16;
}

/// Registration modes (`UFFDIO_REGISTER_MODE_*`).
pub mod mode {
    pub const MISSING: u64 = 1;
    pub const WP: u64 = 2;
}

const COPY_MODE_DONTWAKE: u64 = 1;
const MOVE_MODE_DONTWAKE: u64 = 1;
const ZEROPAGE_MODE_DONTWAKE: u64 = 1;
const MOVE_MODE_ALLOW_SRC_HOLES: u64 = 2;

/// `uffd_msg.event` for a page fault.
pub const EVENT_PAGEFAULT: u8 = 0x12;
/// `uffd_msg.event` for an mremap of a registered range (with `EVENT_REMAP`).
pub const EVENT_REMAP: u8 = 0x14;
/// `uffd_msg.event` for a discard of a registered range (with `feature::EVENT_REMOVE`):
/// `arg[0]` its start, `arg[1]` its end.
pub const EVENT_REMOVE: u8 = 0x15;
/// Page-fault flag: the access was a write.
pub const PAGEFAULT_FLAG_WRITE: u64 = 1;

/// One message read from a userfaultfd (`struct uffd_msg`, 32 bytes).
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct Msg {
    pub event: u8,
    _r1: u8,
    _r2: u16,
    _r3: u32,
    /// For a page fault: flags, address, thread id. For remap: from, to, len. For remove:
    /// start, end.
    pub arg: [u64; 3],
}

impl Msg {
    /// The faulting thread of a page fault (`UFFD_FEATURE_THREAD_ID`; 0 without it).
    pub fn thread_id(&self) -> i32 {
        self.arg[2] as u32 as i32
    }
}

/// How faults on a userfaultfd are delivered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Delivery {
    /// Faulting threads sleep in the kernel; a handler thread reads messages and resolves them.
    /// Kernel accesses (system calls on managed buffers) are resolved too.
    Thread,
    /// The faulting thread gets SIGBUS and resolves its own fault (no hand-off). Kernel
    /// accesses to missing pages fail with EFAULT instead.
    Signal,
}

/// An open, API-negotiated userfaultfd.
pub struct Uffd {
    fd: OwnedFd,
    features: u64,
    /// The features asked for (what a reopened descriptor asks for again).
    wanted: u64,
    /// True when the fd only sees user-mode faults (unprivileged fallback).
    pub user_mode_only: bool,
}

/// What a failed [`Uffd::open`] tried, for the error message shown to users.
#[derive(Debug)]
pub struct OpenError {
    pub errno: Errno,
    pub missing_features: u64,
}

/// A descriptor of `/dev/userfaultfd` this process inherited, or -1 (`use_handed_device`).
static HANDED_DEVICE: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(-1);

/// Makes [`Uffd::open`] create userfaultfds through `fd`, an inherited descriptor of
/// `/dev/userfaultfd` (a launcher with the right to open the device gave it, so that a
/// user without that right gets kernel-mode faults). Refused unless `fd` is open and is
/// that device (same character device as the path): a stray number in the environment
/// must not send ioctls to another file. The descriptor stays open and inheritable, for
/// the program's children.
pub fn use_handed_device(fd: i32) -> SysResult<()> {
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    let mut dev: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat and stat write a stat struct we own; the path is NUL-terminated.
    let ok = unsafe {
        fd >= 0
            && libc::fstat(fd, &mut st) == 0
            && libc::stat(c"/dev/userfaultfd".as_ptr(), &mut dev) == 0
    };
    if !ok {
        return Err(Errno(libc::EBADF));
    }
    let chr = |s: &libc::stat| s.st_mode & libc::S_IFMT == libc::S_IFCHR;
    if !chr(&st) || !chr(&dev) || st.st_rdev != dev.st_rdev {
        return Err(Errno(libc::ENODEV));
    }
    HANDED_DEVICE.store(fd, std::sync::atomic::Ordering::Relaxed);
    Ok(())
}

impl Uffd {
    /// Opens a userfaultfd with `wanted` features, trying in turn the system call, the
    /// system call restricted to user-mode faults (allowed to unprivileged users when
    /// `vm.unprivileged_userfaultfd=0`), and `/dev/userfaultfd`.
    ///
    /// `wanted` are features that change behaviour and must be there. Features that only
    /// announce an ioctl (`MOVE`, `POISON`) are not asked for: the kernel reports all it
    /// has, and a kernel older than one of them would refuse the whole request. Ask
    /// [`Uffd::has`] instead. `THREAD_ID` (4.14) is always asked for: a fault's message then
    /// names its thread, which gets SIGBUS where `POISON` is missing.
    pub fn open(delivery: Delivery, wanted: u64) -> Result<Uffd, OpenError> {
        let mut wanted = wanted | feature::THREAD_ID;
        if delivery == Delivery::Signal {
            wanted |= feature::SIGBUS;
        }
        Self::open_exact(wanted)
    }

    /// Opens a userfaultfd with exactly the `wanted` features (as [`Uffd::open`] without
    /// the fault engine's own).
    pub fn open_exact(wanted: u64) -> Result<Uffd, OpenError> {
        // In order: the system call with kernel-mode faults, /dev/userfaultfd (access by
        // file permissions, also kernel-mode faults), and last the system call restricted
        // to user-mode faults, which unprivileged users get where
        // `vm.unprivileged_userfaultfd=0`: a kernel access to a missing page then fails
        // with EFAULT instead of faulting (the caller must know: `user_mode_only`).
        let flags = libc::O_CLOEXEC | libc::O_NONBLOCK;
        let syscall = |fl: i32| {
            // SAFETY: userfaultfd(2) takes an int flag argument and returns an fd or -1.
            let fd = unsafe { libc::syscall(libc::SYS_userfaultfd, fl) };
            // SAFETY: fd is a freshly returned, owned descriptor.
            (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
        };
        if let Some(owned) = syscall(flags) {
            return Self::negotiate(owned, wanted, false);
        }
        // A descriptor of /dev/userfaultfd handed down by a launcher that could open it
        // (the Slurm plugin, as root, before the task drops its privileges): the ioctl
        // makes a userfaultfd for the calling process's memory, whoever opened the device.
        let handed = HANDED_DEVICE.load(std::sync::atomic::Ordering::Relaxed);
        if handed >= 0 {
            // SAFETY: the ioctl takes the flags by value; `handed` was checked to be the
            // device by `use_handed_device` and is never closed by us.
            let fd = unsafe { libc::ioctl(handed, USERFAULTFD_IOC_NEW as _, flags) };
            if fd >= 0 {
                // SAFETY: fd is a freshly returned, owned descriptor.
                let owned = unsafe { OwnedFd::from_raw_fd(fd) };
                return Self::negotiate(owned, wanted, false);
            }
        }
        // The error reported is the device's where it exists (its permissions), else the
        // restricted system call's (a seccomp filter's refusal, say).
        let mut dev_err = None;
        let path = b"/dev/userfaultfd\0";
        // SAFETY: path is NUL-terminated.
        let dev = unsafe { libc::open(path.as_ptr().cast(), libc::O_RDWR | libc::O_CLOEXEC) };
        if dev >= 0 {
            // SAFETY: dev is an owned descriptor; the ioctl takes the flags by value.
            let dev = unsafe { OwnedFd::from_raw_fd(dev) };
            let fd = unsafe { libc::ioctl(dev.as_raw_fd(), USERFAULTFD_IOC_NEW as _, flags) };
            if fd >= 0 {
                let owned = unsafe { OwnedFd::from_raw_fd(fd) };
                return Self::negotiate(owned, wanted, false);
            }
            dev_err = Some(Errno::last());
        }
        if let Some(owned) = syscall(flags | 1 /* UFFD_USER_MODE_ONLY */) {
            return Self::negotiate(owned, wanted, true);
        }
        Err(OpenError {
            errno: dev_err.unwrap_or_else(Errno::last),
            missing_features: 0,
        })
    }

    fn negotiate(fd: OwnedFd, wanted: u64, user_mode_only: bool) -> Result<Uffd, OpenError> {
        // A masked feature is neither asked for nor reported (`crate::kernel`).
        let masked = masked_bits();
        let mut api = UffdioApi {
            api: UFFD_API,
            features: wanted & !masked,
            ioctls: 0,
        };
        // SAFETY: UFFDIO_API reads and writes a UffdioApi.
        let r = unsafe { libc::ioctl(fd.as_raw_fd(), UFFDIO_API as _, &mut api) };
        if r != 0 {
            let errno = Errno::last();
            // Ask what the kernel has, to name what is missing.
            let probe = Self::probe_features().unwrap_or(0);
            return Err(OpenError {
                errno,
                missing_features: wanted & !probe,
            });
        }
        Ok(Uffd {
            fd,
            features: api.features & !masked,
            wanted,
            user_mode_only,
        })
    }

    /// Whether this process would get a userfaultfd that sees user-mode faults only (it
    /// may open one, but not with kernel-mode faults); false when it gets full delivery
    /// or none at all.
    pub fn user_mode_only_here() -> bool {
        Self::open_exact(0).is_ok_and(|u| u.user_mode_only)
    }

    /// The feature bits the running kernel offers (0 when userfaultfd cannot be opened).
    /// Masked features (`crate::kernel`) are left out.
    pub fn probe_features() -> SysResult<u64> {
        Self::probe_features_unmasked().map(|f| f & !masked_bits())
    }

    /// [`Uffd::probe_features`] with the masked ones.
    pub fn probe_features_unmasked() -> SysResult<u64> {
        // Unrestricted first: before 5.11 the user-mode-only flag is unknown (EINVAL).
        // SAFETY: as in `open`.
        let mut fd = unsafe { libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC) };
        if fd < 0 {
            // SAFETY: as above.
            fd = unsafe { libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC | 1) };
        }
        if fd < 0 {
            return Err(Errno::last());
        }
        let fd = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
        let mut api = UffdioApi {
            api: UFFD_API,
            features: 0,
            ioctls: 0,
        };
        // SAFETY: as above.
        if unsafe { libc::ioctl(fd.as_raw_fd(), UFFDIO_API as _, &mut api) } != 0 {
            return Err(Errno::last());
        }
        Ok(api.features)
    }

    /// In a forked child: a new userfaultfd with the same features under the same number.
    /// The inherited descriptor is the parent's (its registrations cover the parent's
    /// address space; the child's copies of the ranges were unregistered by the fork), so
    /// the child's ranges must then be registered again.
    pub fn reopen_in_place(&self) -> Result<(), OpenError> {
        let delivery = if self.wanted & feature::SIGBUS != 0 {
            Delivery::Signal
        } else {
            Delivery::Thread
        };
        let fresh = Uffd::open(delivery, self.wanted)?;
        crate::os::replace_fd(fresh.fd, self.fd.as_raw_fd()).map_err(|errno| OpenError {
            errno,
            missing_features: 0,
        })
    }

    /// The features the kernel offers on this descriptor, less the masked ones.
    pub fn features(&self) -> u64 {
        self.features
    }

    /// Whether the kernel offers `feature` (a `feature::*` bit) and the mask leaves it.
    /// Signal-safe.
    pub fn has(&self, feature: u64) -> bool {
        self.features & feature != 0
    }

    /// Whether `feature` was asked for when this descriptor was opened, and is in force.
    /// For a feature that changes what the descriptor delivers (a report of discards, say),
    /// [`Uffd::has`] is not enough: `UFFDIO_API` answers with every feature the kernel
    /// has, asked for or not. Signal-safe.
    pub fn asked(&self, feature: u64) -> bool {
        self.wanted & feature != 0 && self.has(feature)
    }

    /// Whether anonymous memory can be write-protected (Linux 5.7): the fallback for a
    /// move needs it.
    pub fn has_write_protect(&self) -> bool {
        self.features & feature::PAGEFAULT_FLAG_WP != 0
    }

    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    fn ioctl<T>(&self, req: u64, arg: &mut T) -> SysResult<()> {
        // SAFETY: every caller passes the structure that matches `req`.
        let r = unsafe { libc::ioctl(self.fd.as_raw_fd(), req as _, arg as *mut T) };
        if r == 0 {
            Ok(())
        } else {
            Err(Errno::last())
        }
    }

    /// Registers `[start, start+len)` with the given `mode` bits.
    pub fn register(&self, start: usize, len: usize, mode: u64) -> SysResult<()> {
        let mut reg = UffdioRegister {
            range: UffdioRange {
                start: start as u64,
                len: len as u64,
            },
            mode,
            ioctls: 0,
        };
        self.ioctl(UFFDIO_REGISTER, &mut reg)
    }

    pub fn unregister(&self, start: usize, len: usize) -> SysResult<()> {
        let mut r = UffdioRange {
            start: start as u64,
            len: len as u64,
        };
        self.ioctl(UFFDIO_UNREGISTER, &mut r)
    }

    /// Wakes threads sleeping on faults in the range (signal-safe).
    pub fn wake(&self, start: usize, len: usize) -> SysResult<()> {
        let mut r = UffdioRange {
            start: start as u64,
            len: len as u64,
        };
        self.ioctl(UFFDIO_WAKE, &mut r)
    }

    /// Copies `len` bytes from `src` into the missing range at `dst` (signal-safe).
    /// Returns the bytes placed; `EEXIST` when a page was already present.
    pub fn copy(&self, dst: usize, src: usize, len: usize, wake: bool) -> SysResult<usize> {
        match self.copy_progress(dst, src, len, wake) {
            (n, Ok(())) => Ok(n),
            (_, Err(e)) => Err(e),
        }
    }

    /// [`Uffd::copy`] that also says how far it got before an error: the bytes from `dst`
    /// placed by this call (the kernel stops at the first page it cannot place and
    /// reports what went before as partial progress). Signal-safe.
    pub fn copy_progress(
        &self,
        dst: usize,
        src: usize,
        len: usize,
        wake: bool,
    ) -> (usize, SysResult<()>) {
        let mut placed = 0usize;
        let mut c = UffdioCopy {
            dst: dst as u64,
            src: src as u64,
            len: len as u64,
            mode: if wake { 0 } else { COPY_MODE_DONTWAKE },
            copy: 0,
        };
        let mut retries = 0;
        loop {
            match self.ioctl(UFFDIO_COPY, &mut c) {
                Ok(()) => return (len, Ok(())),
                Err(Errno(libc::EAGAIN)) if retries < 1000 => {
                    // Partial progress: continue after what was copied.
                    retries += 1;
                    let done = c.copy.max(0) as u64;
                    placed += done as usize;
                    c = UffdioCopy {
                        dst: c.dst + done,
                        src: c.src + done,
                        len: c.len - done,
                        mode: c.mode,
                        copy: 0,
                    };
                    if c.len == 0 {
                        return (len, Ok(()));
                    }
                    crate::os::yield_now();
                }
                Err(e) => return (placed, Err(e)),
            }
        }
    }

    /// Places `[src, src+len)` (readable memory) into the missing range `dst`, as a far
    /// tier's load must: one copy, and where that stops, page by page: one `UFFDIO_COPY`
    /// fills one VMA, so a range the program split (`mprotect`, `mlock` of a part)
    /// answers ENOENT at the first boundary; a page already there (EEXIST) is kept. Any
    /// other error is returned. With `wake`, the range's waiters are woken as pages are
    /// placed; a load placing a run in several pieces wakes once at its end instead, or
    /// the faulting thread could run on and free the region while the read-ahead part of
    /// its run is still being placed. Signal-safe.
    pub fn place_copy(&self, dst: usize, src: usize, len: usize, wake: bool) -> SysResult<()> {
        let (placed, r) = self.copy_progress(dst, src, len, wake);
        let ps = crate::page_size();
        self.place_rest(dst, len, placed, r, wake, |k| {
            self.copy(dst + k, src + k, ps, wake).map(|_| ())
        })
    }

    /// [`Uffd::place_copy`] for zeros (pages discarded while they were far).
    pub fn place_zeros(&self, dst: usize, len: usize, wake: bool) -> SysResult<()> {
        let r = self.zeropage_mode(dst, len, wake);
        let ps = crate::page_size();
        self.place_rest(dst, len, 0, r, wake, |k| {
            self.zeropage_mode(dst + k, ps, wake)
        })
    }

    /// The rest of a placement of `[dst, dst+len)` whose first call placed `done` bytes
    /// and returned `first`: after ENOENT (a VMA boundary) or EEXIST (a page already
    /// there), page by page with `one(offset)`, pages already there kept (woken with
    /// `wake`). Signal-safe.
    fn place_rest(
        &self,
        dst: usize,
        len: usize,
        done: usize,
        first: SysResult<()>,
        wake: bool,
        one: impl Fn(usize) -> SysResult<()>,
    ) -> SysResult<()> {
        match first {
            Err(Errno(libc::EEXIST | libc::ENOENT)) => {}
            r => return r,
        }
        let ps = crate::page_size();
        let mut k = done & !(ps - 1);
        while k < len {
            match one(k) {
                Ok(()) => {}
                Err(Errno(libc::EEXIST)) => {
                    if wake {
                        let _ = self.wake(dst + k, ps);
                    }
                }
                Err(e) => return Err(e),
            }
            k += ps;
        }
        Ok(())
    }

    /// Maps zero pages over a missing range and wakes its waiters (signal-safe).
    pub fn zeropage(&self, dst: usize, len: usize) -> SysResult<()> {
        self.zeropage_mode(dst, len, true)
    }

    /// [`Uffd::zeropage`], waking the range's waiters or not.
    pub fn zeropage_mode(&self, dst: usize, len: usize, wake: bool) -> SysResult<()> {
        let mut z = UffdioZeropage {
            range: UffdioRange {
                start: dst as u64,
                len: len as u64,
            },
            mode: if wake { 0 } else { ZEROPAGE_MODE_DONTWAKE },
            zeropage: 0,
        };
        self.ioctl(UFFDIO_ZEROPAGE, &mut z)
    }

    /// Moves the pages of `[src, src+len)` to `dst` without copying (signal-safe).
    /// Both ranges must be private anonymous memory registered with this fd. With
    /// `allow_holes`, absent source pages are skipped. Returns the bytes accounted
    /// (moved pages and skipped holes); a short count comes back as `Ok` with the
    /// partial length when the kernel reports progress before an error.
    pub fn move_pages(
        &self,
        dst: usize,
        src: usize,
        len: usize,
        allow_holes: bool,
        wake: bool,
    ) -> SysResult<usize> {
        // The kernel may stop early with EAGAIN (a page briefly locked or in transition):
        // continue from where it stopped, a bounded number of times.
        //
        // Where it stopped is not always what it reports. On Linux 6.18 a move that stops
        // early can report fewer bytes than it moved: the retry then fails with EEXIST on
        // a destination page this call had just filled, its source now empty (seen under
        // tests/c/stress.c with 48 threads; crates/attune-sys/tests/uffd_move.rs rebuilds
        // what it leaves behind).
        // Trusting the report had left such a page in the far tier while its chunk was
        // published resident (it then read as zero), or made the fetch fail. So after any
        // early stop the progress is read from the pages themselves (`settled`), and an
        // EEXIST that `settled` explains is progress.
        if !self.has(feature::MOVE) {
            return self.copy_and_drop(dst, src, len, allow_holes, wake);
        }
        let ps = crate::page_size();
        let mut done = 0usize;
        let mut retries = 0;
        while done < len {
            let mut m = UffdioMove {
                dst: (dst + done) as u64,
                src: (src + done) as u64,
                len: (len - done) as u64,
                mode: (if allow_holes {
                    MOVE_MODE_ALLOW_SRC_HOLES
                } else {
                    0
                }) | (if wake { 0 } else { MOVE_MODE_DONTWAKE }),
                moved: 0,
            };
            let err = match self.ioctl(UFFDIO_MOVE, &mut m) {
                // The kernel returns success only when the whole range moved.
                Ok(()) => return Ok(len),
                Err(e) => e,
            };
            if m.moved > 0 {
                done = (done + m.moved as usize).min(len);
            }
            let reported = done;
            done = settled(dst, src, done, len, allow_holes, ps);
            if wake && done > reported {
                // Sleepers on the unreported pages: the kernel woke only what it reported.
                let _ = self.wake(dst + reported, done - reported);
            }
            match err {
                Errno(libc::EAGAIN) if retries < 1000 => {
                    retries += 1;
                    crate::os::yield_now();
                }
                Errno(libc::EEXIST) if done > reported => {}
                e => {
                    if done > 0 {
                        return Ok(done);
                    }
                    return Err(e);
                }
            }
        }
        Ok(len)
    }

    /// [`Uffd::move_pages`] where the kernel has no `UFFDIO_MOVE` (before 6.8, or masked):
    /// the present and swapped-out source pages are copied into `dst` (missing, registered
    /// with this fd) with `UFFDIO_COPY`, then dropped from `src`. The same contract, one
    /// copy of every byte more (docs/benchmarks.md, "Kernel feature fallbacks").
    ///
    /// Unlike a move this is not atomic against writers of `src`: a caller whose source
    /// the program can write must write-protect it first (`crate::uffd` callers in the
    /// tiers do). Holes (pages neither present nor swapped) are never read: a copy from
    /// one would fault on a userfaultfd range from inside the kernel. The states come from
    /// `/proc/self/pagemap` (mincore cannot tell a swapped page from a hole). Stops at the
    /// first hole when `!allow_holes`, or at a page already present at `dst` (EEXIST), and
    /// returns what was done as a short count. Signal-safe.
    fn copy_and_drop(
        &self,
        dst: usize,
        src: usize,
        len: usize,
        allow_holes: bool,
        wake: bool,
    ) -> SysResult<usize> {
        use crate::mem::{PM_PRESENT, PM_SWAPPED};
        const BATCH: usize = 512;
        let ps = crate::page_size();
        let pages = len / ps;
        let mut states = [0u64; BATCH];
        let mut done = 0usize; // pages accounted (copied or skipped holes)
        let mut dropped = 0usize; // pages of `src` up to which the copies were dropped
        let result = 'outer: loop {
            if done >= pages {
                break Ok(());
            }
            let n = (pages - done).min(BATCH);
            if let Err(e) = crate::mem::page_states(src + done * ps, &mut states[..n]) {
                break Err(e);
            }
            let mut i = 0;
            while i < n {
                let data = |s: u64| s & (PM_PRESENT | PM_SWAPPED) != 0;
                if !data(states[i]) {
                    if !allow_holes {
                        break 'outer Err(Errno(libc::ENOENT));
                    }
                    i += 1;
                    done += 1;
                    continue;
                }
                let mut j = i + 1;
                while j < n && data(states[j]) {
                    j += 1;
                }
                let at = done * ps;
                let run = (j - i) * ps;
                if let (placed, Err(e)) = self.copy_progress(dst + at, src + at, run, wake) {
                    // One copy fills one VMA: a run across a protection change (a guard
                    // page the program made) fails with ENOENT there. Then page by page,
                    // up to the first page that cannot be placed (EEXIST: one already
                    // there, a conflict left to the caller).
                    let mut k = placed & !(ps - 1);
                    let mut err = (e.0 != libc::ENOENT).then_some(e);
                    while err.is_none() && k < run {
                        match self.copy(dst + at + k, src + at + k, ps, wake) {
                            Ok(_) => k += ps,
                            Err(pe) => err = Some(pe),
                        }
                    }
                    if let Some(e) = err {
                        done += k / ps;
                        break 'outer Err(e);
                    }
                }
                done += j - i;
                i = j;
            }
            if done > dropped {
                let _ = crate::mem::advise(
                    src + dropped * ps,
                    (done - dropped) * ps,
                    libc::MADV_DONTNEED,
                );
                dropped = done;
            }
        };
        if done > dropped {
            let _ = crate::mem::advise(
                src + dropped * ps,
                (done - dropped) * ps,
                libc::MADV_DONTNEED,
            );
        }
        match result {
            Ok(()) => Ok(len),
            Err(_) if done > 0 => Ok(done * ps),
            Err(e) => Err(e),
        }
    }

    /// Sets (`protect`) or clears write protection on a registered range.
    pub fn writeprotect(&self, start: usize, len: usize, protect: bool) -> SysResult<()> {
        let mut w = UffdioWriteprotect {
            range: UffdioRange {
                start: start as u64,
                len: len as u64,
            },
            mode: protect as u64,
        };
        self.ioctl(UFFDIO_WRITEPROTECT, &mut w)
    }

    /// Marks a missing range as poisoned: any access raises SIGBUS in the accessing thread.
    /// Used when a page's only copy cannot be read back (the failure is made loud).
    /// `ENOTSUP` where the kernel has no `UFFDIO_POISON` (before 6.6, or masked).
    pub fn poison(&self, start: usize, len: usize) -> SysResult<()> {
        if !self.has(feature::POISON) {
            return Err(Errno(libc::ENOTSUP));
        }
        let mut p = UffdioPoison {
            range: UffdioRange {
                start: start as u64,
                len: len as u64,
            },
            mode: 0,
            updated: 0,
        };
        self.ioctl(UFFDIO_POISON, &mut p)
    }

    /// Reads pending messages into `buf` without blocking; returns how many were read.
    pub fn read_msgs(&self, buf: &mut [Msg]) -> SysResult<usize> {
        let bytes = std::mem::size_of_val(buf);
        // SAFETY: buf is a valid writable buffer of `bytes` bytes of plain-old-data.
        let n = unsafe { crate::raw::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), bytes) };
        if n < 0 {
            let e = Errno::last();
            if e.0 == libc::EAGAIN {
                return Ok(0);
            }
            return Err(e);
        }
        Ok(n as usize / std::mem::size_of::<Msg>())
    }
}

/// The `feature::*` bits the process's kernel mask turns off.
fn masked_bits() -> u64 {
    use crate::kernel;
    let m = kernel::mask();
    let mut bits = 0;
    for (k, f) in [
        (kernel::MOVE, feature::MOVE),
        (kernel::POISON, feature::POISON),
        (kernel::WP_ASYNC, feature::WP_ASYNC),
    ] {
        if m & k != 0 {
            bits |= f;
        }
    }
    bits
}

/// How far a move from `src` to `dst` really got, starting from `done` bytes the kernel
/// reported: the pages after it whose destination is present and whose source is gone
/// were moved too (every caller hands `move_pages` an empty destination). With
/// `allow_holes`, a page absent on both sides counts only when a moved page follows it:
/// the kernel went past it, so it was a hole it skipped (or a swapped-out page it moved).
/// A trailing one is left for the retry, since mincore(2) cannot tell a hole from a
/// source page swapped out. Stops at the first page still at its source, or present on
/// both sides (a real conflict, left to the caller). No page is touched. Signal-safe.
fn settled(dst: usize, src: usize, done: usize, len: usize, allow_holes: bool, ps: usize) -> usize {
    let mut at = done;
    let mut proven = done;
    while at < len {
        let at_dst = crate::mem::page_present(dst + at);
        let at_src = crate::mem::page_present(src + at);
        if at_dst && !at_src {
            proven = at + ps;
        } else if !(allow_holes && !at_dst && !at_src) {
            break;
        }
        at += ps;
    }
    proven
}
