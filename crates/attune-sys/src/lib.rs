//! # attune-sys: the OS-primitive contract
//!
//! Every `unsafe` call Attune makes to the kernel lives in this crate; the rest of the
//! workspace is safe Rust (`#![forbid(unsafe_code)]` where it can be, and the few
//! remaining `unsafe` blocks elsewhere only dereference pointers this crate handed out).
//!
//! ## Contract
//! * **Addresses are plain `usize`.** Nothing here creates Rust references to managed
//!   memory: managed pages may be absent at any time and touching them from runtime code
//!   would fault into our own handler. Only the application dereferences managed memory.
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
//! [`signal`] (SIGBUS hook), [`os`] (small helpers: eventfd, time, thread ids, /proc),
//! [`perf`] (software perf counters: page faults), [`elf`] (the loaded objects and what they import), [`unix`] (peer credentials, descriptor passing, memory files for shared regions and the far pool).

pub mod elf;
pub mod fabric;
pub mod kernel;
pub mod libc_alloc;
pub mod mem;
pub mod numa;
pub mod os;
pub mod pagemap;
pub mod perf;
pub mod probe;
pub mod signal;
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

impl std::fmt::Display for Errno {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", std::io::Error::from_raw_os_error(self.0))
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
