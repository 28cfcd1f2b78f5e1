//! Mappings, advice and raw-address file I/O.

use crate::{Errno, SysResult};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// Maps `len` bytes of private anonymous memory. `noreserve` skips commit accounting, for
/// large reservations whose pages are placed one by one.
pub fn map_anon(len: usize, noreserve: bool) -> SysResult<usize> {
    let mut flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
    if noreserve {
        flags |= libc::MAP_NORESERVE;
    }
    // SAFETY: a fresh anonymous mapping at a kernel-chosen address aliases nothing.
    raw_mmap(0, len, libc::PROT_READ | libc::PROT_WRITE, flags, -1, 0)
}

// mmap, munmap and mremap go straight to the kernel (not through libc's symbols): under
// `attune run` the interposer exports those symbols itself, and the runtime's own
// mappings must never be routed back into it.

/// The `mmap(2)` system call, bypassing any interposed `mmap` symbol. Signal-safe.
pub fn raw_mmap(
    addr: usize,
    len: usize,
    prot: i32,
    flags: i32,
    fd: i32,
    off: i64,
) -> SysResult<usize> {
    // SAFETY: with addr 0 or without MAP_FIXED the kernel picks an unused range; with
    // MAP_FIXED the caller (the interposer, on the application's behalf) owns the range.
    let p = unsafe { libc::syscall(libc::SYS_mmap, addr, len, prot, flags, fd, off) };
    if p == -1 {
        Err(Errno::last())
    } else {
        Ok(p as usize)
    }
}

/// The `munmap(2)` system call, bypassing any interposed symbol. Signal-safe.
pub fn raw_munmap(addr: usize, len: usize) -> SysResult<()> {
    // SAFETY: the caller owns the range; nothing in Rust references it.
    if unsafe { libc::syscall(libc::SYS_munmap, addr, len) } == 0 {
        Ok(())
    } else {
        Err(Errno::last())
    }
}

/// The `mremap(2)` system call, bypassing any interposed symbol.
pub fn raw_mremap(
    old: usize,
    old_len: usize,
    new_len: usize,
    flags: i32,
    new_addr: usize,
) -> SysResult<usize> {
    // SAFETY: the caller owns the old range (the application's own mapping).
    let p = unsafe { libc::syscall(libc::SYS_mremap, old, old_len, new_len, flags, new_addr) };
    if p == -1 {
        Err(Errno::last())
    } else {
        Ok(p as usize)
    }
}

/// A private anonymous copy of `[src, src+len)` (runtime-owned, readable, never
/// registered with a userfaultfd): a forked child's own copy of a segment of the node's
/// far pool, which it must not share with its parent. Returns the copy's address.
pub fn private_copy(src: usize, len: usize) -> SysResult<usize> {
    let dst = map_anon(len, true)?;
    // SAFETY: dst is a fresh mapping of len bytes; src..src+len is readable (caller).
    unsafe { copy_raw(dst, src, len) };
    Ok(dst)
}

/// Moves the mapping `[from, from+len)` to `to`, replacing whatever was mapped there
/// (`mremap` with `MREMAP_FIXED`): the caller owns both ranges.
pub fn move_mapping(from: usize, len: usize, to: usize) -> SysResult<()> {
    raw_mremap(
        from,
        len,
        len,
        libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
        to,
    )
    .map(|_| ())
}

/// Replaces `[addr, addr+len)` (owned by the caller) with inaccessible anonymous memory.
pub fn map_none_at(addr: usize, len: usize) -> SysResult<()> {
    raw_mmap(
        addr,
        len,
        libc::PROT_NONE,
        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED | libc::MAP_NORESERVE,
        -1,
        0,
    )
    .map(|_| ())
}

/// Replaces `[addr, addr+len)` (owned by the caller: a range the application asked to be
/// mapped there with `MAP_FIXED`) with fresh readable and writable anonymous memory.
pub fn map_anon_at(addr: usize, len: usize) -> SysResult<()> {
    raw_mmap(
        addr,
        len,
        libc::PROT_READ | libc::PROT_WRITE,
        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED | libc::MAP_NORESERVE,
        -1,
        0,
    )
    .map(|_| ())
}

/// The `mprotect(2)` system call, bypassing any interposed symbol. Signal-safe.
pub fn protect(addr: usize, len: usize, prot: i32) -> SysResult<()> {
    // SAFETY: a protection change of a range the caller owns; nothing in Rust references
    // managed memory (the contract above), so no reference loses its access.
    if unsafe { libc::syscall(libc::SYS_mprotect, addr, len, prot) } == 0 {
        Ok(())
    } else {
        Err(Errno::last())
    }
}

/// A table of atomic words in a private anonymous mapping reserved without commit: a
/// page of it costs memory only once a word in it is written, so a table with an entry
/// per 64 KiB of a tier's (mostly unused) offset space stays small. Inherited by a
/// forked child as a copy.
pub struct AtomicTable {
    base: usize,
    n: usize,
}

impl AtomicTable {
    /// `n` words, all zero.
    pub fn new(n: usize) -> SysResult<AtomicTable> {
        let bytes = (n.max(1) * 8).div_ceil(crate::page_size()) * crate::page_size();
        Ok(AtomicTable {
            base: map_anon(bytes, true)?,
            n,
        })
    }

    pub fn len(&self) -> usize {
        self.n
    }

    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// Word `i`. Signal-safe. Panics (a runtime bug) when `i` is out of the table.
    pub fn get(&self, i: usize) -> &std::sync::atomic::AtomicU64 {
        assert!(i < self.n, "AtomicTable index {i} of {}", self.n);
        // SAFETY: base..base+n*8 is a private read-write mapping owned by this table,
        // 8-aligned (page-aligned base), and lives as long as &self; zero-filled pages
        // are valid AtomicU64 values, and every access goes through atomics.
        unsafe { &*((self.base + i * 8) as *const std::sync::atomic::AtomicU64) }
    }
}

impl Drop for AtomicTable {
    fn drop(&mut self) {
        let bytes = (self.n.max(1) * 8).div_ceil(crate::page_size()) * crate::page_size();
        let _ = raw_munmap(self.base, bytes);
    }
}

/// Maps anonymous memory aligned to `align` (a power of two), trimming the excess.
pub fn map_anon_aligned(len: usize, align: usize, noreserve: bool) -> SysResult<usize> {
    let ps = crate::page_size();
    let align = align.max(ps);
    let len = len.checked_add(ps - 1).ok_or(Errno(libc::ENOMEM))? & !(ps - 1);
    let total = len.checked_add(align).ok_or(Errno(libc::ENOMEM))?;
    let raw = map_anon(total, noreserve)?;
    let start = (raw + align - 1) & !(align - 1);
    if start > raw {
        unmap(raw, start - raw)?;
    }
    let end = start + len;
    let raw_end = raw + total;
    if raw_end > end {
        unmap(end, raw_end - end)?;
    }
    Ok(start)
}

/// Unmaps a range this process mapped.
pub fn unmap(addr: usize, len: usize) -> SysResult<()> {
    raw_munmap(addr, len)
}

/// `madvise(2)`: signal-safe.
pub fn advise(addr: usize, len: usize, advice: i32) -> SysResult<()> {
    // SAFETY: advice on a range the caller owns; DONTNEED drops contents the caller no
    // longer needs (its callers only use it on staging or freed ranges).
    // (a raw system call: the interposer exports `madvise` too, see raw_mmap)
    if unsafe { libc::syscall(libc::SYS_madvise, addr, len, advice) } == 0 {
        Ok(())
    } else {
        Err(Errno::last())
    }
}

pub use libc::{MADV_DONTFORK, MADV_DONTNEED, MADV_HUGEPAGE, MADV_NOHUGEPAGE, MADV_POPULATE_WRITE};

/// Outcome of [`collapse`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Collapse {
    /// The range is on huge pages now.
    Done,
    /// Not now: a page of it is missing, zero, shared or busy, or no huge page could be
    /// allocated (EAGAIN, ENOMEM, EBUSY). Worth a try later.
    Later,
    /// Never for this range: the kernel has no `MADV_COLLAPSE` (before 6.1), the range is
    /// `MADV_NOHUGEPAGE` (the program's choice) or not anonymous (EINVAL, EPERM).
    Never,
}

/// `madvise(MADV_COLLAPSE)` (Linux 6.1): puts the 2 MiB-aligned range's pages on huge
/// pages, copying them into newly allocated ones, independently of the system's
/// transparent-huge-page settings. Under userfaultfd the kernel collapses a span only
/// when every one of its pages is present, so no page is created that the handler has
/// not placed. The range's content is unchanged (the kernel copies under the mmap lock).
pub fn collapse(addr: usize, len: usize) -> Collapse {
    const MADV_COLLAPSE: i32 = 25;
    match advise(addr, len, MADV_COLLAPSE) {
        Ok(()) => Collapse::Done,
        Err(Errno(libc::EAGAIN | libc::ENOMEM | libc::EBUSY)) => Collapse::Later,
        Err(_) => Collapse::Never,
    }
}

/// Maps the pages of `[addr, addr+len)`, a shared file mapping whose pages all exist
/// (a pool segment below its allocated size), into this process's page tables:
/// `MADV_POPULATE_READ` (Linux 5.14), else one read per page. A `UFFDIO_COPY` from a page
/// not mapped yet takes the kernel's slow path, which drops the address-space lock in
/// the middle of the copy (docs/design/pool.md, "Segments are mapped before use").
/// Not for memory registered with a userfaultfd.
pub fn populate_read(addr: usize, len: usize) -> SysResult<()> {
    const MADV_POPULATE_READ: i32 = 22;
    match advise(addr, len, MADV_POPULATE_READ) {
        Err(Errno(libc::EINVAL)) => {
            let ps = crate::page_size();
            let mut a = addr;
            while a < addr + len {
                // SAFETY: the caller guarantees every page of the range is mapped and
                // backed (a shared file mapping below the file's size), so the read
                // cannot fault into a userfaultfd or raise SIGBUS.
                unsafe { std::ptr::read_volatile(a as *const u8) };
                a += ps;
            }
            Ok(())
        }
        r => r,
    }
}

/// This process's pidfd for `process_madvise`, and the pid it was opened for: a forked
/// child inherits the descriptor, which still names its parent, so every use checks the
/// pid first (a child advising its parent's memory would drop the parent's pages).
static SELF_PIDFD: std::sync::Mutex<(i32, i32)> = std::sync::Mutex::new((0, -1));
/// Cleared when the kernel refuses `MADV_DONTNEED` through `process_madvise` (before
/// Linux 6.13, or seccomp): then every range is advised on its own.
static BATCH_DONTNEED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// Drops the pages of every range in `ranges` (`(addr, len)`, owned by the caller) with
/// one `process_madvise(MADV_DONTNEED)` on this process: the kernel flushes the TLB once
/// for the whole batch instead of once a range (`bench/tlb_batch.c`: 0.50 against 18.6 µs
/// a page with another thread running). Where the kernel refuses the batch, one `madvise`
/// a range. Batches of [`DONTNEED_BATCH`] ranges: the iovecs live on the stack, and this
/// runs inside the SIGBUS handler. Signal-safe if the caller blocks signals while it
/// holds no lock this takes (it takes one process-wide lock).
pub fn dontneed_ranges(ranges: &[(usize, usize)]) {
    for batch in ranges.chunks(DONTNEED_BATCH) {
        dontneed_batch(batch);
    }
}

/// Most ranges one `process_madvise` of [`dontneed_ranges`] takes (1 KiB of iovecs).
pub const DONTNEED_BATCH: usize = 64;

fn dontneed_batch(ranges: &[(usize, usize)]) {
    use std::sync::atomic::Ordering::Relaxed;
    if BATCH_DONTNEED.load(Relaxed) {
        let mut g = SELF_PIDFD.lock().unwrap_or_else(|p| p.into_inner());
        // SAFETY: getpid has no preconditions.
        let pid = unsafe { libc::getpid() };
        if g.0 != pid {
            // SAFETY: pidfd_open(pid, 0) returns a new descriptor or -1. The inherited
            // descriptor of a parent is ours to close (a copy in this process).
            let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) } as i32;
            if g.1 >= 0 {
                // SAFETY: g.1 is a descriptor this process opened (or inherited) here.
                unsafe { libc::close(g.1) };
            }
            // pidfds are close-on-exec from birth.
            *g = (pid, fd);
            if fd < 0 {
                // Refused (seccomp, or before Linux 5.3): not asked again for every batch
                // (it was, 137,703 times in one churn run under a filter refusing it).
                BATCH_DONTNEED.store(false, Relaxed);
            }
        }
        if g.1 >= 0 {
            let mut iov = [libc::iovec {
                iov_base: std::ptr::null_mut(),
                iov_len: 0,
            }; DONTNEED_BATCH];
            let mut total = 0usize;
            for (v, &(a, l)) in iov.iter_mut().zip(ranges) {
                v.iov_base = a as *mut libc::c_void;
                v.iov_len = l;
                total += l;
            }
            // SAFETY: iov holds `ranges.len()` valid iovecs over ranges the caller owns;
            // the pidfd names this very process (checked above).
            let rc = unsafe {
                libc::syscall(
                    libc::SYS_process_madvise,
                    g.1,
                    iov.as_ptr(),
                    ranges.len(),
                    libc::MADV_DONTNEED,
                    0,
                )
            };
            if rc >= 0 && rc as usize == total {
                return;
            }
            if rc < 0 {
                let e = Errno::last();
                if matches!(e.0, libc::EINVAL | libc::ENOSYS | libc::EPERM | libc::EBADF) {
                    BATCH_DONTNEED.store(false, Relaxed);
                }
            }
            // Partial or refused: advise each range (dropping a page twice is harmless).
        }
    }
    for &(a, l) in ranges {
        let _ = advise(a, l, libc::MADV_DONTNEED);
    }
}

/// Counts the pages of `[addr, addr+len)` that are resident, using mincore(2).
pub fn resident_pages(addr: usize, len: usize) -> SysResult<usize> {
    let ps = crate::page_size();
    let n = len.div_ceil(ps);
    let mut vec = vec![0u8; n];
    // SAFETY: vec has one byte per page of the range.
    if unsafe { libc::mincore(addr as *mut libc::c_void, len, vec.as_mut_ptr()) } != 0 {
        return Err(Errno::last());
    }
    Ok(vec.iter().filter(|b| **b & 1 == 1).count())
}

/// Whether the page at `addr` is mapped (mincore(2)), without touching it. Signal-safe.
pub fn page_present(addr: usize) -> bool {
    let ps = crate::page_size();
    let mut v = 0u8;
    // SAFETY: one page, one result byte on the stack.
    let r = unsafe { libc::mincore((addr & !(ps - 1)) as *mut libc::c_void, ps, &mut v) };
    r == 0 && v & 1 == 1
}

/// Bits of a `/proc/self/pagemap` entry.
pub const PM_PRESENT: u64 = 1 << 63;
pub const PM_SWAPPED: u64 = 1 << 62;

/// `/proc/self/pagemap` opened by this process: (pid << 32) | fd, 0 when not open. A
/// forked child inherits the descriptor, which still reads its parent's page tables, so
/// every use checks the pid first and the child opens its own (the inherited one is left
/// open: another thread may be reading it; it is close-on-exec).
static PAGEMAP: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// This process's `/proc/self/pagemap`, opened once per process (a forked child opens its
/// own). Signal-safe after the first call in a process.
pub(crate) fn pagemap_fd() -> SysResult<i32> {
    use std::sync::atomic::Ordering::*;
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() } as u32 as u64;
    let cur = PAGEMAP.load(Acquire);
    if cur != 0 && cur >> 32 == pid {
        return Ok(cur as u32 as i32);
    }
    let path = b"/proc/self/pagemap\0";
    // SAFETY: path is NUL-terminated.
    let fd = unsafe { libc::open(path.as_ptr().cast(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(Errno::last());
    }
    let new = pid << 32 | fd as u32 as u64;
    match PAGEMAP.compare_exchange(cur, new, AcqRel, Acquire) {
        Ok(_) => Ok(fd),
        Err(won) => {
            // SAFETY: fd is ours and unused.
            unsafe { libc::close(fd) };
            if won >> 32 == pid {
                Ok(won as u32 as i32)
            } else {
                Err(Errno(libc::EAGAIN))
            }
        }
    }
}

/// Reads the pagemap entries of the `out.len()` pages from `addr` (page-aligned):
/// [`PM_PRESENT`], [`PM_SWAPPED`]. Unlike mincore(2) it tells a page swapped out by the
/// kernel (data) from a page never placed or discarded (a hole). Signal-safe.
pub fn page_states(addr: usize, out: &mut [u64]) -> SysResult<()> {
    let fd = pagemap_fd()?;
    let ps = crate::page_size();
    let bytes = out.len() * 8;
    let mut done = 0usize;
    while done < bytes {
        // SAFETY: out is a writable buffer of `bytes` bytes.
        let n = unsafe {
            crate::raw::pread(
                fd,
                out.as_mut_ptr().cast::<u8>().add(done).cast(),
                bytes - done,
                ((addr / ps) * 8 + done) as libc::off_t,
            )
        };
        if n <= 0 {
            return Err(if n == 0 {
                Errno(libc::EIO)
            } else {
                Errno::last()
            });
        }
        done += n as usize;
    }
    Ok(())
}

/// Copies `len` bytes between two runtime-owned, resident ranges (staging buffers, far
/// tier slots). Never call it on application-visible managed memory.
///
/// # Safety
/// Both ranges must be mapped, resident or fault-free for the runtime, and not overlap.
pub unsafe fn copy_raw(dst: usize, src: usize, len: usize) {
    std::ptr::copy_nonoverlapping(src as *const u8, dst as *mut u8, len);
}

/// Fills a runtime-owned range with zeros.
///
/// # Safety
/// As for [`copy_raw`].
pub unsafe fn zero_raw(dst: usize, len: usize) {
    std::ptr::write_bytes(dst as *mut u8, 0, len);
}

/// Writes zeros over application memory the runtime manages (`attune_discard` of a part of
/// a chunk). Unlike [`zero_raw`], the range may be unmapped: the write faults and the fault
/// path places the page first. Contract: `[dst, dst+len)` lies inside one live managed
/// region, the application allowed its content to go (it asked for the discard), and the
/// calling thread holds no chunk of it (Fetching or Evicting): its own fault would wait
/// on that chunk forever.
pub fn zero_managed(dst: usize, len: usize) {
    // SAFETY: by the contract the range is mapped (or faults in) and its content is
    // the application's to drop; no Rust reference points into it.
    unsafe { std::ptr::write_bytes(dst as *mut u8, 0, len) }
}

/// Opens an anonymous file in `dir`: `O_TMPFILE` where the file system has it (no name, so
/// nothing is left behind even after SIGKILL); otherwise a named file removed at once.
/// Mode 0600: the file holds the process's memory and no one else may read it.
/// Returns the file, whether it is `O_DIRECT`, and whether it had a name (the file system
/// has no `O_TMPFILE`: only then can a crash have left files for [`clean_stale_files`]).
pub fn open_private_file(dir: &std::path::Path, direct: bool) -> SysResult<(OwnedFd, bool, bool)> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let cdir = CString::new(dir.as_os_str().as_bytes()).map_err(|_| Errno(libc::EINVAL))?;
    let base = libc::O_RDWR | libc::O_CLOEXEC;
    let mut tries: Vec<(i32, bool)> = Vec::new();
    if direct {
        tries.push((base | libc::O_DIRECT, true));
    }
    tries.push((base, false));
    let mut last = Errno(libc::EINVAL);
    for (flags, is_direct) in &tries {
        // SAFETY: cdir is NUL-terminated.
        let fd = unsafe { libc::open(cdir.as_ptr(), flags | libc::O_TMPFILE, 0o600) };
        if fd >= 0 {
            // SAFETY: fresh owned fd.
            return Ok((unsafe { OwnedFd::from_raw_fd(fd) }, *is_direct, false));
        }
        last = Errno::last();
    }
    // Named fallback: attune-<pid>-<nanos>, unlinked at once. A crash between open and
    // unlink leaves a file that `clean_stale_files` removes at the next start.
    for (flags, is_direct) in &tries {
        let name = dir.join(format!(
            "attune-{}-{}",
            std::process::id(),
            crate::os::now_ns()
        ));
        let cname = CString::new(name.as_os_str().as_bytes()).map_err(|_| Errno(libc::EINVAL))?;
        // SAFETY: cname is NUL-terminated.
        let fd = unsafe { libc::open(cname.as_ptr(), flags | libc::O_CREAT | libc::O_EXCL, 0o600) };
        if fd >= 0 {
            // SAFETY: as above.
            unsafe { libc::unlink(cname.as_ptr()) };
            return Ok((unsafe { OwnedFd::from_raw_fd(fd) }, *is_direct, true));
        }
        last = Errno::last();
    }
    Err(last)
}

/// Removes the files a crashed process of this user left in `dir`: regular files named
/// exactly `attune-<pid>-<n>` (the named fallback above). Returns how many.
pub fn clean_stale_files(dir: &std::path::Path) -> usize {
    remove_stale(dir, "attune-", false)
}

/// Removes what processes of this user that are gone left in `dir`: entries named exactly
/// `<prefix><pid>-<n>`, regular files (or directories, with `dirs`, and all they hold),
/// owned by this process's effective uid, whose pid is not running. Returns how many.
///
/// Such directories are often world-writable (`$TMPDIR`, /tmp, a scratch file system):
/// any other entry there may be another user's, so ownership is checked on the entry
/// itself (`lstat`: a symbolic link is never followed or removed), never inferred from
/// the name. Used for the file tier's named files and `attune run`'s statistics
/// directories.
pub fn remove_stale(dir: &std::path::Path, prefix: &str, dirs: bool) -> usize {
    use std::os::unix::fs::MetadataExt;
    let Ok(rd) = std::fs::read_dir(dir) else {
        return 0;
    };
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    let mut removed = 0;
    for e in rd.flatten() {
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some((pid, n)) = name
            .strip_prefix(prefix)
            .and_then(|rest| rest.split_once('-'))
        else {
            continue;
        };
        let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        let Some(pid) = digits(n).then(|| pid.parse::<i32>().ok()).flatten() else {
            continue;
        };
        let Ok(m) = std::fs::symlink_metadata(e.path()) else {
            continue;
        };
        let kind = if dirs {
            m.is_dir()
        } else {
            m.file_type().is_file()
        };
        if !kind || m.uid() != me || crate::os::pid_alive(pid) {
            continue;
        }
        let gone = if dirs {
            std::fs::remove_dir_all(e.path())
        } else {
            std::fs::remove_file(e.path())
        };
        if gone.is_ok() {
            removed += 1;
        }
    }
    removed
}

/// pwrite(2) from a runtime-owned address; retries short writes. Signal-safe.
pub fn pwrite_raw(fd: &OwnedFd, src: usize, len: usize, off: u64) -> SysResult<()> {
    let mut done = 0usize;
    while done < len {
        // SAFETY: src..src+len is a runtime-owned readable range.
        let n = unsafe {
            crate::raw::pwrite(
                fd.as_raw_fd(),
                (src + done) as *const libc::c_void,
                len - done,
                (off + done as u64) as i64,
            )
        };
        if n < 0 {
            let e = Errno::last();
            if e.0 == libc::EINTR {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(Errno(libc::ENOSPC));
        }
        done += n as usize;
    }
    Ok(())
}

/// pread(2) into a runtime-owned address; bytes past end of file read as zero. Signal-safe.
pub fn pread_raw(fd: &OwnedFd, dst: usize, len: usize, off: u64) -> SysResult<()> {
    pread_inner(fd, dst, len, off, true)
}

/// Reads exactly `len` bytes at `off` into `[dst, dst+len)`: the end of the file before
/// that is EIO (data that was written is gone: the file was truncated under us).
/// Signal-safe.
pub fn pread_exact_raw(fd: &OwnedFd, dst: usize, len: usize, off: u64) -> SysResult<()> {
    pread_inner(fd, dst, len, off, false)
}

fn pread_inner(fd: &OwnedFd, dst: usize, len: usize, off: u64, eof_zero: bool) -> SysResult<()> {
    let mut done = 0usize;
    while done < len {
        // SAFETY: dst..dst+len is a runtime-owned writable range.
        let n = unsafe {
            crate::raw::pread(
                fd.as_raw_fd(),
                (dst + done) as *mut libc::c_void,
                len - done,
                (off + done as u64) as i64,
            )
        };
        if n < 0 {
            let e = Errno::last();
            if e.0 == libc::EINTR {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            if !eof_zero {
                return Err(Errno(libc::EIO));
            }
            // Past end of file: the rest was never written, so it is zero.
            // SAFETY: as above.
            unsafe { zero_raw(dst + done, len - done) };
            return Ok(());
        }
        done += n as usize;
    }
    Ok(())
}

/// Starts the write-back of the dirty page cache of `[off, off+len)` without waiting for
/// it (`sync_file_range(SYNC_FILE_RANGE_WRITE)`). Signal-safe. Metadata is not written:
/// this bounds how long written pages stay dirty, it makes nothing durable.
pub fn start_writeback(fd: &OwnedFd, off: u64, len: u64) -> SysResult<()> {
    // SAFETY: sync_file_range on an owned fd; it reads no memory of ours.
    let r = unsafe {
        libc::sync_file_range(
            fd.as_raw_fd(),
            off as i64,
            len as i64,
            libc::SYNC_FILE_RANGE_WRITE,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(Errno::last())
    }
}

/// Frees the file blocks of `[off, off+len)` (sparse hole). Errors are ignored by callers
/// that only want to give space back.
pub fn punch_hole(fd: &OwnedFd, off: u64, len: u64) -> SysResult<()> {
    // SAFETY: fallocate on an owned fd.
    let r = unsafe {
        libc::fallocate(
            fd.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            off as i64,
            len as i64,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(Errno::last())
    }
}

/// Copies every data extent of `src` into `dst` at the same offsets (holes stay holes), with
/// copy_file_range (in the kernel; a reflink where the file system can) and, where that is
/// refused (O_DIRECT, another file system), pread/pwrite through `buf` (`buf_len` bytes,
/// runtime-owned). Returns the bytes copied.
pub fn copy_file_data(src: &OwnedFd, dst: &OwnedFd, buf: usize, buf_len: usize) -> SysResult<u64> {
    let (s, d) = (src.as_raw_fd(), dst.as_raw_fd());
    let mut pos: i64 = 0;
    let mut copied = 0u64;
    loop {
        // SAFETY: lseek on owned descriptors.
        let data = unsafe { libc::lseek(s, pos, libc::SEEK_DATA) };
        if data < 0 {
            let e = Errno::last();
            if e.0 == libc::ENXIO {
                // A hole at the end is part of the file too: same size, so a read there
                // is not past the end (the file tier reads that as lost data).
                // SAFETY: fstat into a local; ftruncate on an owned descriptor.
                unsafe {
                    let mut st: libc::stat = std::mem::zeroed();
                    if libc::fstat(s, &mut st) != 0 || libc::ftruncate(d, st.st_size) != 0 {
                        return Err(Errno::last());
                    }
                }
                return Ok(copied);
            }
            return Err(e);
        }
        // SAFETY: as above.
        let hole = unsafe { libc::lseek(s, data, libc::SEEK_HOLE) };
        if hole < 0 {
            return Err(Errno::last());
        }
        let mut off = data;
        while off < hole {
            let (mut so, mut doff) = (off, off);
            // SAFETY: offsets are locals; both descriptors are owned.
            let n = unsafe {
                libc::copy_file_range(s, &mut so, d, &mut doff, (hole - off) as usize, 0)
            };
            let n = if n > 0 {
                n as usize
            } else if n == 0 {
                break;
            } else {
                let e = Errno::last();
                if !matches!(
                    e.0,
                    libc::EXDEV | libc::EINVAL | libc::EOPNOTSUPP | libc::ENOSYS
                ) {
                    return Err(e);
                }
                let len = ((hole - off) as usize).min(buf_len);
                pread_raw(src, buf, len, off as u64)?;
                pwrite_raw(dst, buf, len, off as u64)?;
                len
            };
            off += n as i64;
            copied += n as u64;
        }
        pos = hole;
    }
}

/// Maps `len` bytes of an open file shared and read-only (the kernel-mmap baseline).
pub fn map_file_shared_ro(fd: &OwnedFd, len: usize) -> SysResult<usize> {
    raw_mmap(0, len, libc::PROT_READ, libc::MAP_SHARED, fd.as_raw_fd(), 0)
}

/// Drops a file's clean pages from the page cache (POSIX_FADV_DONTNEED), after fsync.
pub fn drop_file_cache(fd: &OwnedFd) -> SysResult<()> {
    // SAFETY: fsync and posix_fadvise on a descriptor the caller owns.
    unsafe {
        if libc::fsync(fd.as_raw_fd()) != 0 {
            return Err(Errno::last());
        }
        match libc::posix_fadvise(fd.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) {
            0 => Ok(()),
            e => Err(Errno(e)),
        }
    }
}

/// Reads the byte at `addr` (one relaxed atomic load). Contract: `addr` lies in a
/// mapping of the runtime that lives for the process (the small allocator's block map);
/// a page not present faults and is placed by the fault path.
#[inline(always)]
pub fn load_u8(addr: usize) -> u8 {
    // SAFETY: by the contract the byte is mapped for the life of the process; the
    // reference does not outlive this call.
    unsafe { std::sync::atomic::AtomicU8::from_ptr(addr as *mut u8) }
        .load(std::sync::atomic::Ordering::Relaxed)
}

/// Writes the byte at `addr` (one relaxed atomic store), under [`load_u8`]'s contract.
#[inline(always)]
pub fn store_u8(addr: usize, v: u8) {
    // SAFETY: as in `load_u8`.
    unsafe { std::sync::atomic::AtomicU8::from_ptr(addr as *mut u8) }
        .store(v, std::sync::atomic::Ordering::Relaxed)
}

/// Runs `f` over the `len` bytes at `addr`. Contract: a runtime-owned range (a bounce or
/// staging buffer) that stays mapped and unwritten by others during the call; a hole
/// faults into the runtime's internal resolver, which maps a zero page.
pub fn with_bytes<R>(addr: usize, len: usize, f: impl FnOnce(&[u8]) -> R) -> R {
    // SAFETY: by the contract; the slice does not outlive the call.
    f(unsafe { std::slice::from_raw_parts(addr as *const u8, len) })
}

/// Runs `f` over the `len / 8` words at `addr`, under [`with_bytes`]'s contract (and `addr`
/// 8-byte aligned).
pub fn with_words<R>(addr: usize, len: usize, f: impl FnOnce(&[u64]) -> R) -> R {
    debug_assert_eq!(addr % 8, 0);
    // SAFETY: by the contract; the slice does not outlive the call.
    f(unsafe { std::slice::from_raw_parts(addr as *const u64, len / 8) })
}

/// Runs `f` over the `len / 8` words at `addr` for writing: a runtime-owned buffer (a
/// bounce slot) that no one else uses during the call, 8-byte aligned.
pub fn with_words_mut<R>(addr: usize, len: usize, f: impl FnOnce(&mut [u64]) -> R) -> R {
    debug_assert_eq!(addr % 8, 0);
    // SAFETY: by the contract the range is ours alone for the call.
    f(unsafe { std::slice::from_raw_parts_mut(addr as *mut u64, len / 8) })
}

/// Whether any page of `[addr, addr+len)` is mapped (mincore(2), without touching any).
/// Signal-safe, one system call per 2 MiB. An error counts as mapped (the caller then
/// acts as if there were pages).
pub fn any_present(addr: usize, len: usize) -> bool {
    let ps = crate::page_size();
    let mut v = [0u8; 512];
    let mut at = addr & !(ps - 1);
    let end = addr + len;
    while at < end {
        let n = (end - at).div_ceil(ps).min(v.len());
        // SAFETY: n pages, n result bytes in the buffer on the stack.
        let r = unsafe { libc::mincore(at as *mut libc::c_void, n * ps, v.as_mut_ptr()) };
        if r != 0 || v[..n].iter().any(|b| b & 1 != 0) {
            return true;
        }
        at += n * ps;
    }
    false
}

/// Reads the 8-byte word at `addr` as the application would (a volatile load, which may
/// fault and be served). Contract: `addr` lies in memory the caller allocated and holds
/// (the CLI's own checks of NUMA placement, acting as the application).
pub fn read_word(addr: usize) -> u64 {
    // SAFETY: by the contract the word is the caller's; no reference is made.
    unsafe { (addr as *const u64).read_volatile() }
}

/// Writes the 8-byte word at `addr` as the application would, under [`read_word`]'s
/// contract.
pub fn write_word(addr: usize, v: u64) {
    // SAFETY: as in `read_word`.
    unsafe { (addr as *mut u64).write_volatile(v) }
}
