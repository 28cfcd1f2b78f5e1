//! Small helpers: clocks, eventfds, thread signal masks, process facts.

use crate::{Errno, SysResult};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// A clock's time in nanoseconds; None for a clock id the kernel does not know (EINVAL:
/// a thread's clock after it ended). Signal-safe.
fn clock_ns(clock: libc::clockid_t) -> Option<u64> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid out-parameter; an unknown clock id is EINVAL.
    let r = unsafe { libc::clock_gettime(clock, &mut ts) };
    (r == 0).then(|| ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64)
}

/// Monotonic time in nanoseconds. Signal-safe.
pub fn now_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC).unwrap_or(0)
}

/// CPU time thread `tid` of this process has run so far, in ns (its `CPUCLOCK_SCHED`
/// clock: exact, the kernel brings a running thread's count up to date); None for a
/// thread that has ended or is not this process's. Signal-safe.
pub fn thread_cpu_ns(tid: i32) -> Option<u64> {
    // The kernel's MAKE_THREAD_CPUCLOCK(tid, CPUCLOCK_SCHED): (~tid << 3) | 4 | 2.
    clock_ns(((!tid) << 3) | 6)
}

/// CPU time every thread of this process has run so far, in ns (`CLOCK_PROCESS_CPUTIME_ID`:
/// the caller's own exact, the others' as of their last scheduler tick). Signal-safe.
pub fn process_cpu_ns() -> u64 {
    clock_ns(libc::CLOCK_PROCESS_CPUTIME_ID).unwrap_or(0)
}

/// Kernel thread id of the caller. Signal-safe.
pub fn gettid() -> i32 {
    // SAFETY: no arguments.
    unsafe { libc::syscall(libc::SYS_gettid) as i32 }
}

/// Sends SIGBUS to thread `tid` of this process (a thread whose page could not be read
/// back, where the kernel cannot poison it). Nothing for tid 0. Signal-safe.
pub fn send_sigbus(tid: i32) {
    if tid > 0 {
        // SAFETY: tgkill takes plain integers.
        unsafe { libc::syscall(libc::SYS_tgkill, libc::getpid(), tid, libc::SIGBUS) };
    }
}

/// Yields the CPU. Signal-safe.
pub fn yield_now() {
    // SAFETY: no arguments.
    unsafe { libc::sched_yield() };
}

/// Raises the calling thread's scheduling priority by `steps` nice levels above the
/// default (nice `-steps`); threads it starts afterwards inherit it. Err: EACCES or EPERM
/// without CAP_SYS_NICE.
pub fn raise_priority(steps: u32) -> Result<(), Errno> {
    let nice = -(steps.min(20) as i32);
    // SAFETY: setpriority of the calling thread (PRIO_PROCESS, 0); no pointers.
    let r = unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, nice) };
    if r == 0 {
        Ok(())
    } else {
        Err(Errno::last())
    }
}

/// The calling thread's thread pointer, read without a TLS lookup: on x86-64 the TCB's
/// self pointer at `%fs:0`, on aarch64 `tpidr_el0`. Distinct among live threads; 0 on
/// other architectures (callers then take their TLS path). Signal-safe.
#[inline(always)]
pub fn thread_pointer() -> usize {
    #[cfg(target_arch = "x86_64")]
    {
        let tp: usize;
        // SAFETY: glibc and musl keep the TCB's own address at %fs:0 for every thread.
        unsafe {
            std::arch::asm!("mov {}, fs:0", out(reg) tp, options(nostack, readonly, preserves_flags))
        };
        tp
    }
    #[cfg(target_arch = "aarch64")]
    {
        let tp: usize;
        // SAFETY: reading the thread register has no side effect.
        unsafe {
            std::arch::asm!("mrs {}, tpidr_el0", out(reg) tp, options(nostack, nomem, preserves_flags))
        };
        tp
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        0
    }
}

/// Sleeps for `us` microseconds (nanosleep; an interruption ends it early). Signal-safe.
pub fn sleep_us(us: u64) {
    let ts = libc::timespec {
        tv_sec: (us / 1_000_000) as libc::time_t,
        tv_nsec: ((us % 1_000_000) * 1000) as libc::c_long,
    };
    // SAFETY: ts is a valid timespec; no remainder is asked for.
    unsafe { libc::nanosleep(&ts, std::ptr::null_mut()) };
}

/// Minor and major page faults of this process's reaped children so far
/// (getrusage(RUSAGE_CHILDREN)).
pub fn children_faults() -> (u64, u64) {
    // SAFETY: ru is a valid out-parameter.
    unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru);
        (ru.ru_minflt as u64, ru.ru_majflt as u64)
    }
}

/// Whether a process with this pid exists.
pub fn pid_alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks existence.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || Errno::last().0 == libc::EPERM
}

/// A full signal set minus the synchronous fault signals: a fault signal that arrives
/// while blocked makes the kernel kill the process, and the runtime's own SIGBUS resolver
/// must still run on its threads.
fn async_signal_set() -> libc::sigset_t {
    // SAFETY: set is initialised by sigfillset before use.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut set);
        for s in [
            libc::SIGBUS,
            libc::SIGSEGV,
            libc::SIGFPE,
            libc::SIGILL,
            libc::SIGTRAP,
        ] {
            libc::sigdelset(&mut set, s);
        }
        set
    }
}

/// Blocks every asynchronous signal on the calling thread. Runtime threads call this first so that an
/// application signal handler never runs on them (it could touch managed memory while the
/// thread holds runtime locks).
pub fn block_all_signals() {
    let set = async_signal_set();
    // SAFETY: set is a valid signal set.
    unsafe { crate::raw::sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
}

/// Blocks all signals until the guard drops (for short critical sections in API calls
/// that hold locks the fault path also takes).
pub struct SignalGuard {
    old: libc::sigset_t,
}

impl SignalGuard {
    pub fn new() -> SignalGuard {
        let set = async_signal_set();
        // SAFETY: both sets are valid; the old mask is restored on drop.
        unsafe {
            let mut old: libc::sigset_t = std::mem::zeroed();
            crate::raw::sigmask(libc::SIG_BLOCK, &set, &mut old);
            SignalGuard { old }
        }
    }
}

impl Default for SignalGuard {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for SignalGuard {
    fn drop(&mut self) {
        // SAFETY: restores the mask saved in `new`.
        unsafe { crate::raw::sigmask(libc::SIG_SETMASK, &self.old, std::ptr::null_mut()) };
    }
}

/// Blocks every asynchronous signal on the calling thread and returns the mask to restore
/// (fork: held from the prepare handler until the child's memory is ready again).
pub fn block_signals_saving() -> libc::sigset_t {
    let set = async_signal_set();
    // SAFETY: both sets are valid; the caller restores the old mask.
    unsafe {
        let mut old: libc::sigset_t = std::mem::zeroed();
        crate::raw::sigmask(libc::SIG_BLOCK, &set, &mut old);
        old
    }
}

/// Restores a mask saved by [`block_signals_saving`].
pub fn restore_signals(old: &libc::sigset_t) {
    // SAFETY: restores a valid saved mask.
    unsafe { crate::raw::sigmask(libc::SIG_SETMASK, old, std::ptr::null_mut()) };
}

/// Puts `new` in place of the descriptor numbered `target` (dup3 with O_CLOEXEC), so that
/// every holder of that number now uses `new`. A forked child uses it to trade the
/// descriptors it shares with its parent (userfaultfds, eventfds, tier files) for its own
/// without changing the numbers its structures hold.
pub fn replace_fd(new: OwnedFd, target: i32) -> SysResult<()> {
    // SAFETY: dup3 onto a number this process owns; `new` is closed when dropped.
    let r = unsafe { libc::dup3(new.as_raw_fd(), target, libc::O_CLOEXEC) };
    if r < 0 {
        Err(Errno::last())
    } else {
        Ok(())
    }
}

/// Like [`replace_fd`] for a raw descriptor this process owns (closed afterwards).
pub fn replace_raw_fd(new: i32, target: i32) -> SysResult<()> {
    // SAFETY: the caller owns `new`; it is closed when the OwnedFd drops.
    replace_fd(unsafe { OwnedFd::from_raw_fd(new) }, target)
}

/// Closes a raw descriptor this process owns (negative: nothing).
pub fn close_fd(fd: i32) {
    if fd >= 0 {
        // SAFETY: the caller owns fd and does not use it again.
        unsafe { libc::close(fd) };
    }
}

/// A non-blocking eventfd used to wake runtime threads (written from signal handlers).
pub struct EventFd(OwnedFd);

impl EventFd {
    pub fn new() -> SysResult<EventFd> {
        // SAFETY: eventfd returns an owned fd or -1.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(Errno::last());
        }
        Ok(EventFd(unsafe { OwnedFd::from_raw_fd(fd) }))
    }
    /// Signal-safe.
    pub fn notify(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a local.
        unsafe { crate::raw::write(self.0.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }
    /// Waits until notified or `timeout_ms` passes; returns whether it was notified.
    pub fn wait(&self, timeout_ms: i32) -> bool {
        let mut pfd = libc::pollfd {
            fd: self.0.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let r = unsafe { libc::poll(&mut pfd, 1, timeout_ms) };
        if r > 0 {
            let mut v: u64 = 0;
            // SAFETY: reads 8 bytes into a local.
            unsafe { crate::raw::read(self.0.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
            true
        } else {
            false
        }
    }
    /// Whether a notification waits, without taking it.
    pub fn pending(&self) -> bool {
        let mut pfd = libc::pollfd {
            fd: self.0.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd; a zero timeout does not block.
        unsafe { libc::poll(&mut pfd, 1, 0) > 0 }
    }
    pub fn raw_fd(&self) -> i32 {
        self.0.as_raw_fd()
    }
    /// In a forked child: a new eventfd under the same number (the inherited one is the
    /// parent's: a notify would wake the parent's threads).
    pub fn reopen_in_place(&self) -> SysResult<()> {
        let fresh = EventFd::new()?;
        replace_fd(fresh.0, self.0.as_raw_fd())
    }
}

/// Waits for any of `fds` to become readable; returns the readiness mask per fd.
pub fn poll_readable(fds: &[i32], timeout_ms: i32) -> Vec<bool> {
    let mut pfds: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    // SAFETY: pfds is a valid array of pollfd.
    let r = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, timeout_ms) };
    if r <= 0 {
        return vec![false; fds.len()];
    }
    pfds.iter()
        .map(|p| p.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0)
        .collect()
}

/// Total memory of the machine in bytes (from sysinfo).
pub fn total_memory() -> u64 {
    // SAFETY: sysinfo fills a zeroed struct.
    unsafe {
        let mut si: libc::sysinfo = std::mem::zeroed();
        if libc::sysinfo(&mut si) == 0 {
            si.totalram as u64 * si.mem_unit as u64
        } else {
            0
        }
    }
}

/// `statfs(2)` of the file system holding `path`.
fn statfs(path: &std::path::Path) -> SysResult<libc::statfs> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).map_err(|_| Errno(libc::EINVAL))?;
    // SAFETY: c is NUL-terminated; st is an out-parameter the call fills.
    unsafe {
        let mut st: libc::statfs = std::mem::zeroed();
        if libc::statfs(c.as_ptr(), &mut st) != 0 {
            return Err(Errno::last());
        }
        Ok(st)
    }
}

/// Free bytes available to unprivileged users on the file system holding `path`.
pub fn fs_available(path: &std::path::Path) -> SysResult<u64> {
    let st = statfs(path)?;
    // The fragment size where the file system reports one (as statvfs's f_frsize).
    let unit = if st.f_frsize > 0 {
        st.f_frsize
    } else {
        st.f_bsize
    };
    Ok(st.f_bavail as u64 * unit as u64)
}

/// The file system type (`statfs`'s `f_type`, a `*_SUPER_MAGIC` number) of the file
/// system holding `path`.
pub fn fs_magic(path: &std::path::Path) -> SysResult<u64> {
    Ok(statfs(path)?.f_type as u64)
}

/// Busy-waits for `ns` nanoseconds (emulated medium delay; no syscall, signal-safe).
pub fn spin_for_ns(ns: u64) {
    if ns == 0 {
        return;
    }
    let end = now_ns() + ns;
    while now_ns() < end {
        std::hint::spin_loop();
    }
}

/// Runs `f` on the raw fd of an OwnedFd (keeps AsRawFd out of callers' imports).
pub fn raw(fd: &OwnedFd) -> i32 {
    fd.as_raw_fd()
}

/// Writes bytes to stderr with one write(2). Signal-safe.
pub fn write_stderr(b: &[u8]) {
    // SAFETY: writes a caller-provided buffer.
    unsafe { crate::raw::write(2, b.as_ptr().cast(), b.len()) };
}

/// Where the global locale's LC_CTYPE data (glibc's `struct __locale_data`, under 1 KiB)
/// lies now: every new thread reads it in glibc's thread start (`__ctype_init`) while all
/// its signals are still blocked. 0 when unknown. Allocates and takes glibc's locale lock
/// (`duplocale`): not for a forked child before its threads run, nor a signal handler.
pub fn global_ctype_data() -> usize {
    // glibc's LC_GLOBAL_LOCALE.
    let global = -1isize as libc::locale_t;
    // SAFETY: duplocale of the global locale returns a new locale object (or null) whose
    // first field, in glibc, is the array of per-category data pointers, shared with the
    // global locale; it is freed at once.
    unsafe {
        let l = libc::duplocale(global);
        if l.is_null() {
            return 0;
        }
        let p = *(l as *const usize).add(libc::LC_CTYPE as usize);
        libc::freelocale(l);
        p
    }
}

/// Registers fork handlers (pthread_atfork), each optional.
pub fn atfork(
    prepare: Option<extern "C" fn()>,
    parent: Option<extern "C" fn()>,
    child: Option<extern "C" fn()>,
) {
    // SAFETY: registers handlers with no preconditions.
    let u = |f: Option<extern "C" fn()>| f.map(|f| f as unsafe extern "C" fn());
    unsafe { libc::pthread_atfork(u(prepare), u(parent), u(child)) };
}

/// Registers `f` to run at exit(3) (not at _exit or on a fatal signal).
pub fn at_exit(f: extern "C" fn()) {
    // SAFETY: registers a handler with no preconditions.
    unsafe { libc::atexit(f) };
}

static FORWARD_PID: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

extern "C" fn forward_signal(sig: libc::c_int) {
    let pid = FORWARD_PID.load(std::sync::atomic::Ordering::Acquire);
    if pid > 0 {
        // SAFETY: kill is async-signal-safe.
        unsafe { libc::kill(pid, sig) };
    }
}

/// For a launcher waiting on `child`: SIGINT and SIGQUIT (which the terminal sends to the
/// whole group, child included) are ignored here, as system(3) does; SIGTERM, SIGHUP,
/// SIGUSR1 and SIGUSR2 sent to the launcher are passed on to the child.
pub fn forward_signals_to(child: i32) {
    FORWARD_PID.store(child, std::sync::atomic::Ordering::Release);
    // SAFETY: installs handlers that only call kill(2); SIG_IGN has no preconditions.
    unsafe {
        libc::signal(libc::SIGINT, libc::SIG_IGN);
        libc::signal(libc::SIGQUIT, libc::SIG_IGN);
        for s in [libc::SIGTERM, libc::SIGHUP, libc::SIGUSR1, libc::SIGUSR2] {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = forward_signal as extern "C" fn(libc::c_int) as usize;
            sa.sa_flags = libc::SA_RESTART;
            libc::sigaction(s, &sa, std::ptr::null_mut());
        }
    }
}

/// For a launcher: passes signals on to `child` ([`forward_signals_to`]) and waits for it
/// to end (a wait interrupted by a forwarded signal is resumed).
pub fn wait_forwarding(
    child: &mut std::process::Child,
) -> std::io::Result<std::process::ExitStatus> {
    forward_signals_to(child.id() as i32);
    loop {
        match child.wait() {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            r => return r,
        }
    }
}

/// For a launcher: the program `cmd` starts gets SIGKILL when the launcher dies, so a
/// launcher killed with SIGKILL (which it cannot forward) does not leave its program
/// running unsupervised. Set in the child between fork and exec; a launcher already gone
/// by then (the race `prctl` cannot see) makes the child exit at once.
pub fn die_with_launcher(cmd: &mut std::process::Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: getpid is async-signal-safe and has no preconditions.
    let launcher = unsafe { libc::getpid() };
    // SAFETY: the closure runs in the forked child before exec and calls only prctl,
    // getppid and _exit, which are async-signal-safe; it allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            if libc::getppid() != launcher {
                libc::_exit(137);
            }
            Ok(())
        });
    }
}

/// Ends this process with signal `sig`, as the child it ran did (so a shell sees the same
/// status): default action, signal unblocked, no core file of the launcher.
pub fn die_by_signal(sig: i32) -> ! {
    // SAFETY: resetting a disposition, unblocking and raising have no preconditions.
    unsafe {
        let lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        libc::setrlimit(libc::RLIMIT_CORE, &lim);
        libc::signal(sig, libc::SIG_DFL);
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, sig);
        crate::raw::sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
        libc::raise(sig);
    }
    std::process::exit(128 + sig)
}

/// What became of a child started by [`fork_run`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ForkRun {
    /// It returned this status.
    Exited(i32),
    /// A signal ended it.
    Killed(i32),
    /// It outlived the timeout and was killed (SIGKILL) and reaped.
    Hung,
    /// fork(2) failed.
    NotStarted(Errno),
}

/// Forks; the child runs `child` and leaves with `_exit` of what it returns (never the
/// parent's exit handlers); the parent waits `timeout` at most, then kills and reaps it.
/// As for any fork of a threaded process, `child` may only use what fork handlers made
/// safe to use (the runtime's and the allocator's are: this is how a program's forked
/// worker behaves under Attune).
pub fn fork_run(child: impl FnOnce() -> i32, timeout: std::time::Duration) -> ForkRun {
    // SAFETY: see the function's contract; the child never returns from here.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return ForkRun::NotStarted(Errno::last());
    }
    if pid == 0 {
        let code = child();
        // SAFETY: leaving the child without running the parent's exit handlers.
        unsafe { libc::_exit(code) };
    }
    let t0 = std::time::Instant::now();
    loop {
        let mut status = 0;
        // SAFETY: our own child; status is a valid out-pointer.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            return if libc::WIFEXITED(status) {
                ForkRun::Exited(libc::WEXITSTATUS(status))
            } else {
                ForkRun::Killed(libc::WTERMSIG(status))
            };
        }
        if r < 0 || t0.elapsed() > timeout {
            // SAFETY: our own child, by PID, not reaped yet.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
            }
            return ForkRun::Hung;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// Whether the dynamic loader would run `path` in secure-execution mode for this user
/// (set-user-ID or set-group-ID to someone else), where it ignores LD_PRELOAD.
pub fn is_secure_exec(meta: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::MetadataExt;
    // SAFETY: geteuid/getegid have no preconditions.
    let (euid, egid) = unsafe { (libc::geteuid(), libc::getegid()) };
    (meta.mode() & libc::S_ISUID != 0 && meta.uid() != euid)
        || (meta.mode() & libc::S_ISGID != 0 && meta.gid() != egid)
}

/// Whether this process runs as root (effective uid 0).
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// `membarrier(2)` commands used here (linux/membarrier.h).
const MEMBARRIER_CMD_PRIVATE_EXPEDITED: libc::c_long = 1 << 3;
const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED: libc::c_long = 1 << 4;

/// Registers this process (its mm; a forked child must register again) for
/// [`membarrier_private_expedited`]. False where the kernel or a seccomp filter refuses it.
pub fn membarrier_register() -> bool {
    // SAFETY: membarrier takes no pointers.
    unsafe {
        libc::syscall(
            libc::SYS_membarrier,
            MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED,
            0,
            0,
        ) == 0
    }
}

/// Makes every running thread of this process execute a full memory barrier before it
/// returns (IPIs to the CPUs running them): the slow side of an asymmetric fence, whose
/// fast side needs only a compiler barrier. Signal-safe.
pub fn membarrier_private_expedited() -> crate::SysResult<()> {
    // SAFETY: as above.
    if unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) } == 0 {
        Ok(())
    } else {
        Err(crate::Errno::last())
    }
}

type ThreadBody = Box<dyn FnOnce() + Send + 'static>;

extern "C" fn runtime_thread_start(arg: *mut libc::c_void) -> *mut libc::c_void {
    // First, before any allocation (Rust's own thread set-up allocates): this thread is
    // the runtime's, so its C-library allocations never reach the program's allocator.
    crate::libc_alloc::mark_runtime_thread();
    // SAFETY: arg is the Box<(name, body)> leaked by spawn_runtime_thread, taken once.
    let b: Box<(std::ffi::CString, ThreadBody)> = unsafe { Box::from_raw(arg.cast()) };
    let (name, body) = *b;
    // SAFETY: pthread_self is this thread; the name is NUL-terminated (15 bytes kept).
    unsafe { libc::pthread_setname_np(libc::pthread_self(), name.as_ptr()) };
    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)).is_err() {
        // A panic must not unwind into the C start routine; the panic hook has printed it.
        runtime_failed(name.to_bytes());
    }
    std::ptr::null_mut()
}

/// Stops the process after a panic in the runtime (printed above by the panic hook), on
/// the thread `what` (a runtime thread's name, or the SIGBUS handler). A runtime that
/// lost a thread cannot serve the memory it manages: a thread faulting there would wait
/// for ever (a userfaultfd fault has no timeout), and a program that goes on could read
/// pages that were never put back. So the rule is: say so and abort, never hang.
/// Signal-safe: raw writes of fixed text, then `abort`.
pub fn runtime_failed(what: &[u8]) -> ! {
    let parts: [&[u8]; 3] = [
        b"attune: error: the runtime failed (the panic above, in ",
        what,
        b"); the program is stopped, as the memory Attune manages can no longer be served\n",
    ];
    for p in parts {
        // SAFETY: p is a valid byte slice; a short or failed write loses only the text.
        let _ = unsafe { crate::raw::write(2, p.as_ptr().cast(), p.len()) };
    }
    std::process::abort()
}

/// Starts a detached thread of the runtime (evictor, fault handler, report, daemon
/// client) that is marked as such before its first instruction of Rust set-up:
/// `std::thread::spawn` allocates in the new thread before the body runs, which reached
/// a jemalloc whose lock the spawning thread held (a deadlock at start).
pub fn spawn_runtime_thread(name: &str, body: impl FnOnce() + Send + 'static) -> SysResult<()> {
    let short: String = name.chars().take(15).collect();
    let cname = std::ffi::CString::new(short).map_err(|_| Errno(libc::EINVAL))?;
    let arg = Box::into_raw(Box::new((cname, Box::new(body) as ThreadBody)));
    // SAFETY: attr is initialised before use and destroyed after; the start routine
    // takes ownership of arg, which is reclaimed here if the thread was not created.
    unsafe {
        let mut attr: libc::pthread_attr_t = std::mem::zeroed();
        libc::pthread_attr_init(&mut attr);
        libc::pthread_attr_setdetachstate(&mut attr, libc::PTHREAD_CREATE_DETACHED);
        // 2 MiB, as Rust's default: the fault handler's and evictor's frames are small.
        libc::pthread_attr_setstacksize(&mut attr, 2 << 20);
        let mut t: libc::pthread_t = 0;
        // Inside the runtime while it starts the thread: the interposer's pthread_create
        // (`threads::create`) then leaves it to libc, not followed as the program's.
        let entered = crate::libc_alloc::enter_runtime();
        let e = libc::pthread_create(&mut t, &attr, runtime_thread_start, arg.cast());
        if entered {
            crate::libc_alloc::leave_runtime();
        }
        libc::pthread_attr_destroy(&mut attr);
        if e != 0 {
            drop(Box::from_raw(arg));
            return Err(Errno(e));
        }
    }
    Ok(())
}

/// Whether this process runs with secure execution (`AT_SECURE`: a set-user-ID or
/// set-group-ID program, or one with file capabilities, started by another user). Such a
/// process must not take settings from its environment, which the user who started it
/// controls: a path in it would make the program read or delete files with its own
/// rights.
pub fn secure_execution() -> bool {
    // SAFETY: getauxval has no preconditions; 0 when the entry is absent.
    unsafe { libc::getauxval(libc::AT_SECURE) != 0 }
}

/// Sleeps while `*word == expected`, up to `timeout_ns` (0: no limit), or until
/// [`futex_wake`]. Returns early on a signal or a spurious wake-up: callers re-check the
/// word. Signal-safe. The address must be a live `AtomicU32` of this process.
pub fn futex_wait(word: &std::sync::atomic::AtomicU32, expected: u32, timeout_ns: u64) {
    let ts = libc::timespec {
        tv_sec: (timeout_ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (timeout_ns % 1_000_000_000) as libc::c_long,
    };
    let tp: *const libc::timespec = if timeout_ns == 0 {
        std::ptr::null()
    } else {
        &ts
    };
    // SAFETY: word is a valid u32 for the call; FUTEX_PRIVATE: this process only.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
            expected,
            tp,
        );
    }
}

/// Wakes up to `n` threads sleeping in [`futex_wait`] on `word`. Signal-safe.
pub fn futex_wake(word: &std::sync::atomic::AtomicU32, n: i32) {
    // SAFETY: as above.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
            n,
        );
    }
}

/// Fills `buf` with bytes from the kernel's random source (session tokens, secrets).
pub fn random_bytes(buf: &mut [u8]) -> crate::SysResult<()> {
    let mut done = 0;
    while done < buf.len() {
        // SAFETY: the pointer and length describe the rest of buf.
        let n = unsafe { libc::getrandom(buf[done..].as_mut_ptr().cast(), buf.len() - done, 0) };
        if n < 0 {
            let e = crate::Errno::last();
            if e.0 == libc::EINTR {
                continue;
            }
            return Err(e);
        }
        done += n as usize;
    }
    Ok(())
}
