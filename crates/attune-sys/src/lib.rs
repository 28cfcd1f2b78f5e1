//! # attune-sys: the OS-primitive contract
//!
//! Every `unsafe` operation of Attune's Rust code lives in this crate: system calls, raw
//! memory, mimalloc, the published runtime. Every other crate is
//! `#![forbid(unsafe_code)]` but the two C ABI crates (`libattune`, `attune-preload`),
//! whose `unsafe` reads and writes what a C caller's pointers name and exports symbols
//! (docs/design/structure.md, "Unsafe code").
//!
//! ## Contract
//! * **Addresses are plain `usize`.** Nothing here creates Rust references to managed
//!   memory: managed pages may be absent at any time and touching them from runtime code
//!   would fault into our own handler. Only the application dereferences managed memory.
//! * **Address-taking functions are safe functions**, as `madvise` is: their obligation
//!   is on the address (runtime-owned, managed, or the caller's own, as each one's doc
//!   says), not on Rust references, so the crates above them need no `unsafe`. Functions
//!   whose misuse could break a Rust reference stay `unsafe fn`.
//! * **No allocation on the fault path.** Functions marked *signal-safe* do nothing but
//!   system calls and arithmetic on their arguments; they may be called from the SIGBUS
//!   handler. They return `Err(errno)` and never panic.
//! * **Errors are `errno` values** (`Errno`), never panics; callers decide what degrades.
//! * **Every fd is `O_CLOEXEC`**, so `exec` never leaks a userfaultfd, a tier file or an
//!   eventfd into a child program.
//!
//! Modules: [`kernel`] (the newer kernel features used, and the mask that turns them
//! off; [`probe`] asks the kernel which it has), [`uffd`] (userfaultfd ioctls), [`mem`] (mmap/madvise/files, raw mmap for the
//! interposer), [`numa`] (memory policy, page migration, mlock), [`pagemap`] (written-page tracking), [`libc_alloc`] (the program's allocator behind the interposer, and glibc's heap for the runtime's own data),
//! [`signal`] (SIGBUS hook), [`small_heap`] (mimalloc heaps in managed memory), [`threads`] (the program's threads from start to end, behind the interposer's `pthread_create`), [`os`] (small helpers: eventfd, time, thread ids, /proc), `raw` (the runtime's own read/write/pread/pwrite/sendmsg/recvmsg as system calls),
//! [`perf`] (software perf counters: page faults), [`global`] (the process-wide published runtime), [`elf`] (the loaded objects and what they import), [`caller`] (exported entry points that pass on their caller's address), [`unix`] (peer credentials, descriptor passing, memory files for shared regions, the far pool and the boards of a memory cgroup's runtimes).

pub mod caller;
pub mod elf;
pub mod fabric;
pub mod global;
pub mod kernel;
pub mod libc_alloc;
pub mod mem;
pub mod numa;
pub mod os;
pub mod pagemap;
pub mod perf;
pub mod probe;
mod raw;
pub mod signal;
pub mod small_heap;
pub mod threads;
pub mod uffd;
pub mod unix;

/// A raw `errno` value returned by a failed system call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Errno(pub i32);

impl Errno {
    /// The `errno` of the last failed call on this thread.
    pub fn last() -> Errno {
        Errno(
            std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO),
        )
    }
}

/// glibc's English texts of the errors Attune meets, so that formatting one never calls
/// `strerror`: its translation (`dcgettext`) takes the C library's locale lock, and the
/// runtime can start inside `setlocale`, which holds that lock for writing (bash's first
/// `malloc`): a `strerror` there corrupted the lock and hung the program (7cae869).
const ERRNO_TEXTS: &[(i32, &str)] = &[
    (libc::EPERM, "Operation not permitted"),
    (libc::ENOENT, "No such file or directory"),
    (libc::ESRCH, "No such process"),
    (libc::EINTR, "Interrupted system call"),
    (libc::EIO, "Input/output error"),
    (libc::ENXIO, "No such device or address"),
    (libc::E2BIG, "Argument list too long"),
    (libc::ENOEXEC, "Exec format error"),
    (libc::EBADF, "Bad file descriptor"),
    (libc::ECHILD, "No child processes"),
    (libc::EAGAIN, "Resource temporarily unavailable"),
    (libc::ENOMEM, "Cannot allocate memory"),
    (libc::EACCES, "Permission denied"),
    (libc::EFAULT, "Bad address"),
    (libc::EBUSY, "Device or resource busy"),
    (libc::EEXIST, "File exists"),
    (libc::EXDEV, "Invalid cross-device link"),
    (libc::ENODEV, "No such device"),
    (libc::ENOTDIR, "Not a directory"),
    (libc::EISDIR, "Is a directory"),
    (libc::EINVAL, "Invalid argument"),
    (libc::ENFILE, "Too many open files in system"),
    (libc::EMFILE, "Too many open files"),
    (libc::ETXTBSY, "Text file busy"),
    (libc::EFBIG, "File too large"),
    (libc::ENOSPC, "No space left on device"),
    (libc::ESPIPE, "Illegal seek"),
    (libc::EROFS, "Read-only file system"),
    (libc::EPIPE, "Broken pipe"),
    (libc::ERANGE, "Numerical result out of range"),
    (libc::EDEADLK, "Resource deadlock avoided"),
    (libc::ENAMETOOLONG, "File name too long"),
    (libc::ENOSYS, "Function not implemented"),
    (libc::ENOTEMPTY, "Directory not empty"),
    (libc::ELOOP, "Too many levels of symbolic links"),
    (libc::ENODATA, "No data available"),
    (libc::EPROTO, "Protocol error"),
    (libc::EBADMSG, "Bad message"),
    (libc::EOVERFLOW, "Value too large for defined data type"),
    (libc::ENOTSOCK, "Socket operation on non-socket"),
    (libc::EOPNOTSUPP, "Operation not supported"),
    (libc::EADDRINUSE, "Address already in use"),
    (libc::ENETUNREACH, "Network is unreachable"),
    (libc::ECONNRESET, "Connection reset by peer"),
    (libc::ENOBUFS, "No buffer space available"),
    (libc::ENOTCONN, "Transport endpoint is not connected"),
    (libc::ETIMEDOUT, "Connection timed out"),
    (libc::ECONNREFUSED, "Connection refused"),
    (libc::EHOSTUNREACH, "No route to host"),
    (libc::EDQUOT, "Disk quota exceeded"),
    (libc::ECANCELED, "Operation canceled"),
    (libc::EOWNERDEAD, "Owner died"),
    (libc::ENOTRECOVERABLE, "State not recoverable"),
    (libc::EHWPOISON, "Memory page has hardware error"),
];

/// The text of an `errno` value, as glibc's `strerror` gives it in English, without
/// calling it (see [`ERRNO_TEXTS`]); `None` for one Attune does not expect.
pub fn errno_text(e: i32) -> Option<&'static str> {
    ERRNO_TEXTS.iter().find(|t| t.0 == e).map(|t| t.1)
}

/// "text (os error N)", as `std::io::Error` writes an OS error, but from [`errno_text`]
/// (never `strerror`); "error N (os error N)" for an errno the table does not hold.
impl std::fmt::Display for Errno {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match errno_text(self.0) {
            Some(t) => write!(f, "{t} (os error {})", self.0),
            None => write!(f, "error {} (os error {})", self.0, self.0),
        }
    }
}

/// An `std::io::Error` written as [`Errno`] writes it when it is an OS error (no
/// `strerror`), and as itself otherwise (a custom error's own text calls nothing).
pub fn io_error_text(e: &std::io::Error) -> String {
    match e.raw_os_error() {
        Some(n) => Errno(n).to_string(),
        None => e.to_string(),
    }
}

impl std::error::Error for Errno {}

impl From<Errno> for std::io::Error {
    fn from(e: Errno) -> Self {
        std::io::Error::from_raw_os_error(e.0)
    }
}

pub type SysResult<T> = Result<T, Errno>;

/// The base page size of the machine (4 KiB on x86-64).
pub fn page_size() -> usize {
    // SAFETY: sysconf has no memory-safety preconditions.
    let v = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if v <= 0 {
        4096
    } else {
        v as usize
    }
}

#[cfg(test)]
mod errno_tests {
    use super::*;

    #[test]
    fn errno_texts_are_glibcs_and_keep_the_io_error_form() {
        // The table must say what strerror says (a Rust program never calls setlocale,
        // so this is the C locale).
        for &(n, t) in ERRNO_TEXTS {
            assert_eq!(
                Errno(n).to_string(),
                std::io::Error::from_raw_os_error(n).to_string(),
                "{t}"
            );
        }
        assert_eq!(Errno(4095).to_string(), "error 4095 (os error 4095)");
        let custom = std::io::Error::other("no such tier");
        assert_eq!(io_error_text(&custom), "no such tier");
        let os = std::io::Error::from_raw_os_error(libc::ECONNREFUSED);
        assert_eq!(io_error_text(&os), "Connection refused (os error 111)");
    }
}
