//! Unix-socket primitives of the daemon protocol: peer credentials, file descriptors
//! passed with `SCM_RIGHTS`, and the memory files (`memfd`) that back shared regions.
//!
//! Contract: every received descriptor is wrapped in an `OwnedFd` at once (closed if the
//! caller drops it) and marked close-on-exec (`MSG_CMSG_CLOEXEC`); a message carrying
//! more descriptors than asked for has the extra ones closed, never leaked.

use crate::{Errno, SysResult};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// Most descriptors one message carries (a client re-registering its shared regions).
pub const MAX_FDS: usize = 64;

/// Who is at the other end of a connected Unix socket (from the kernel, not the peer).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerCred {
    pub pid: i32,
    pub uid: u32,
    pub gid: u32,
}

/// `SO_PEERCRED` of a connected Unix socket.
pub fn peer_cred(fd: &impl AsRawFd) -> SysResult<PeerCred> {
    let mut c = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: c and len are valid for the kernel to write a ucred into.
    let r = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            &mut c as *mut _ as *mut libc::c_void,
            &mut len,
        )
    };
    if r != 0 {
        return Err(Errno::last());
    }
    Ok(PeerCred {
        pid: c.pid,
        uid: c.uid,
        gid: c.gid,
    })
}

/// Sends all of `data`, with `fds` attached to its first byte. Retries on EINTR.
pub fn send_with_fds(sock: &impl AsRawFd, data: &[u8], fds: &[RawFd]) -> SysResult<()> {
    if fds.len() > MAX_FDS {
        return Err(Errno(libc::E2BIG));
    }
    let mut sent = 0usize;
    let mut first = true;
    while sent < data.len() || (first && data.is_empty()) {
        let mut iov = libc::iovec {
            iov_base: data[sent..].as_ptr() as *mut libc::c_void,
            iov_len: data.len() - sent,
        };
        // Control buffer: u64-aligned, big enough for MAX_FDS descriptors.
        let mut cbuf = [0u64; (MAX_FDS * 4 + 64) / 8];
        // SAFETY: zeroed msghdr is a valid initial value.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        if first && !fds.is_empty() {
            let bytes = std::mem::size_of_val(fds);
            // SAFETY: CMSG_SPACE/CMSG_LEN are pure arithmetic.
            let space = unsafe { libc::CMSG_SPACE(bytes as u32) } as usize;
            msg.msg_control = cbuf.as_mut_ptr() as *mut libc::c_void;
            msg.msg_controllen = space;
            // SAFETY: msg_control points at `space` bytes we own; the header and data
            // written fit (space <= size of cbuf for fds.len() <= MAX_FDS).
            unsafe {
                let c = libc::CMSG_FIRSTHDR(&msg);
                (*c).cmsg_level = libc::SOL_SOCKET;
                (*c).cmsg_type = libc::SCM_RIGHTS;
                (*c).cmsg_len = libc::CMSG_LEN(bytes as u32) as usize;
                std::ptr::copy_nonoverlapping(fds.as_ptr() as *const u8, libc::CMSG_DATA(c), bytes);
            }
        }
        // SAFETY: msg describes buffers valid for the duration of the call.
        let n = unsafe { crate::raw::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
        if n < 0 {
            let e = Errno::last();
            if e.0 == libc::EINTR {
                continue;
            }
            return Err(e);
        }
        first = false;
        sent += n as usize;
        if data.is_empty() {
            break;
        }
    }
    Ok(())
}

/// Receives up to `buf.len()` bytes and any descriptors sent with them. Returns 0 bytes
/// at end of stream. Retries on EINTR.
pub fn recv_with_fds(
    sock: &impl AsRawFd,
    buf: &mut [u8],
    fds: &mut Vec<OwnedFd>,
) -> SysResult<usize> {
    loop {
        let mut iov = libc::iovec {
            iov_base: buf.as_mut_ptr() as *mut libc::c_void,
            iov_len: buf.len(),
        };
        let mut cbuf = [0u64; (MAX_FDS * 4 + 64) / 8];
        // SAFETY: zeroed msghdr is a valid initial value.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.as_mut_ptr() as *mut libc::c_void;
        msg.msg_controllen = std::mem::size_of_val(&cbuf);
        // SAFETY: msg describes buffers valid for the duration of the call.
        let n = unsafe { crate::raw::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n < 0 {
            let e = Errno::last();
            if e.0 == libc::EINTR {
                continue;
            }
            return Err(e);
        }
        // SAFETY: walking the control messages the kernel wrote into cbuf; every
        // descriptor found is owned from here on (the kernel installed it in our table).
        unsafe {
            let mut c = libc::CMSG_FIRSTHDR(&msg);
            while !c.is_null() {
                if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                    let data = libc::CMSG_DATA(c);
                    let hdr = libc::CMSG_LEN(0) as usize;
                    let count = ((*c).cmsg_len as usize - hdr) / std::mem::size_of::<RawFd>();
                    for i in 0..count {
                        let fd = std::ptr::read_unaligned((data as *const RawFd).add(i));
                        fds.push(OwnedFd::from_raw_fd(fd));
                    }
                }
                c = libc::CMSG_NXTHDR(&msg, c);
            }
        }
        if msg.msg_flags & libc::MSG_CTRUNC != 0 {
            // Descriptors beyond what fits were closed by the kernel; refuse the message.
            fds.clear();
            return Err(Errno(libc::EMSGSIZE));
        }
        return Ok(n as usize);
    }
}

/// An anonymous memory file (`memfd_create`), sealed against shrinking so a mapping of
/// it can never SIGBUS because someone truncated it. Holds `size` bytes, unallocated.
pub fn memfd_sized(name: &str, size: u64) -> SysResult<OwnedFd> {
    let cname = std::ffi::CString::new(name.replace('\0', "_")).map_err(|_| Errno(libc::EINVAL))?;
    // SAFETY: cname is a valid C string.
    let fd =
        unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    if fd < 0 {
        return Err(Errno::last());
    }
    // SAFETY: fd was just returned by the kernel and is owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: plain syscalls on an fd we own.
    unsafe {
        if libc::ftruncate(fd.as_raw_fd(), size as libc::off_t) != 0 {
            return Err(Errno::last());
        }
        if libc::fcntl(
            fd.as_raw_fd(),
            libc::F_ADD_SEALS,
            libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL,
        ) != 0
        {
            return Err(Errno::last());
        }
    }
    Ok(fd)
}

/// An empty anonymous memory file that grows as it is written and can be sealed later
/// ([`seal_read_only`]): what a staged input is copied into. Close-on-exec.
pub fn memfd_growable(name: &str) -> SysResult<OwnedFd> {
    let cname = std::ffi::CString::new(name.replace('\0', "_")).map_err(|_| Errno(libc::EINVAL))?;
    // SAFETY: cname is a valid C string.
    let fd =
        unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    if fd < 0 {
        return Err(Errno::last());
    }
    // SAFETY: fd was just returned by the kernel and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Seals a memory file against every change (size, contents, seals): nobody who gets
/// it, the daemon included, can write to it any more, so many users may map one copy.
/// Fails with EBUSY while a writable shared mapping of it exists.
pub fn seal_read_only(fd: &impl AsRawFd) -> SysResult<()> {
    // SAFETY: fcntl on a descriptor the caller holds; no memory is passed.
    let r = unsafe {
        libc::fcntl(
            fd.as_raw_fd(),
            libc::F_ADD_SEALS,
            libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_WRITE | libc::F_SEAL_SEAL,
        )
    };
    if r != 0 {
        return Err(Errno::last());
    }
    Ok(())
}

/// Whether a memory file is sealed against writes (a staged input): it can only be
/// mapped read-only.
pub fn is_write_sealed(fd: &impl AsRawFd) -> bool {
    // SAFETY: fcntl on a descriptor the caller holds; no memory is passed.
    let s = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
    s >= 0 && s & libc::F_SEAL_WRITE != 0
}

/// An empty, unsealed anonymous memory file for one runtime's segment of the node's far
/// pool (`attuned` grows and shrinks it with [`resize_allocated`]). Close-on-exec.
pub fn pool_memfd(name: &str) -> SysResult<OwnedFd> {
    let cname = std::ffi::CString::new(name.replace('\0', "_")).map_err(|_| Errno(libc::EINVAL))?;
    // SAFETY: cname is a valid C string.
    let fd = unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(Errno::last());
    }
    // SAFETY: fd was just returned by the kernel and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Sets a memory file's size to `new` bytes with every page below it allocated now, by
/// the calling process: a shmem page is charged to the memory cgroup of the process that
/// allocates it, so pages `attuned` allocates stay out of the job's cgroup however the
/// job then writes them. Growing allocates `[old, new)` (on ENOMEM or ENOSPC the size
/// stays `old`); shrinking frees what lies above `new`.
pub fn resize_allocated(fd: &impl AsRawFd, old: u64, new: u64) -> SysResult<()> {
    let raw = fd.as_raw_fd();
    // SAFETY: plain syscalls on a descriptor the caller holds.
    unsafe {
        if new > old {
            if libc::ftruncate(raw, new as libc::off_t) != 0 {
                return Err(Errno::last());
            }
            if libc::fallocate(raw, 0, old as libc::off_t, (new - old) as libc::off_t) != 0 {
                let e = Errno::last();
                libc::ftruncate(raw, old as libc::off_t);
                return Err(e);
            }
        } else if new < old && libc::ftruncate(raw, new as libc::off_t) != 0 {
            return Err(Errno::last());
        }
    }
    Ok(())
}

/// Whether a descriptor is a memory file (`memfd_create`; only shmem files answer
/// `F_GET_SEALS`).
pub fn is_memfd(fd: &impl AsRawFd) -> bool {
    // SAFETY: F_GET_SEALS on a descriptor the caller holds.
    unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) >= 0 }
}

/// Whether a descriptor is a memory file sealed the way [`memfd_sized`] seals it (cannot
/// shrink or grow): safe to map without a truncation turning into SIGBUS.
pub fn is_sealed_memfd(fd: &impl AsRawFd) -> bool {
    // SAFETY: F_GET_SEALS on a descriptor the caller holds.
    let s = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
    s >= 0
        && s & (libc::F_SEAL_SHRINK | libc::F_SEAL_GROW)
            == (libc::F_SEAL_SHRINK | libc::F_SEAL_GROW)
}

/// Size of a file behind a descriptor (fstat).
pub fn fd_size(fd: &impl AsRawFd) -> SysResult<u64> {
    // SAFETY: st is valid for the kernel to fill.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: plain fstat on a descriptor the caller holds.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(Errno::last());
    }
    Ok(st.st_size as u64)
}

/// Bytes of a file actually allocated (st_blocks x 512): a shared region's resident size.
pub fn fd_allocated(fd: &impl AsRawFd) -> SysResult<u64> {
    // SAFETY: st is valid for the kernel to fill.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: plain fstat on a descriptor the caller holds.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(Errno::last());
    }
    Ok(st.st_blocks as u64 * 512)
}

/// Maps `len` bytes of a file shared, read-write (or read-only). Returns the address.
pub fn map_shared(fd: &impl AsRawFd, len: usize, writable: bool) -> SysResult<usize> {
    let prot = if writable {
        libc::PROT_READ | libc::PROT_WRITE
    } else {
        libc::PROT_READ
    };
    // SAFETY: a new mapping chosen by the kernel; no existing memory is affected.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            prot,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(Errno::last());
    }
    Ok(p as usize)
}

/// Closes a descriptor number inherited across `fork` whose owner object lives on in the
/// parent's copy of memory and is never dropped in the child (the daemon connection: a
/// child holding it would keep the parent registered after the parent's death).
pub fn close_inherited(fd: RawFd) {
    // SAFETY: the caller guarantees no live object in this process uses `fd`.
    unsafe { libc::close(fd) };
}

/// Duplicates a descriptor (close-on-exec).
pub fn dup(fd: &impl AsRawFd) -> SysResult<OwnedFd> {
    // SAFETY: F_DUPFD_CLOEXEC on a descriptor the caller holds returns a new one we own.
    let n = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 0) };
    if n < 0 {
        return Err(Errno::last());
    }
    // SAFETY: n is a fresh descriptor.
    Ok(unsafe { OwnedFd::from_raw_fd(n) })
}

/// A duplicate that programs this process starts inherit (no close-on-exec), at or
/// above 3: `attune run --staged` hands its program a staged input this way.
pub fn dup_inheritable(fd: &impl AsRawFd) -> SysResult<OwnedFd> {
    // SAFETY: F_DUPFD on a descriptor the caller holds returns a new one we own.
    let n = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD, 3) };
    if n < 0 {
        return Err(Errno::last());
    }
    // SAFETY: n is a fresh descriptor.
    Ok(unsafe { OwnedFd::from_raw_fd(n) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;

    #[test]
    fn a_pool_file_is_allocated_by_its_resizer_and_freed_when_shrunk() {
        let f = pool_memfd("attune-pool-test").unwrap();
        assert!(is_memfd(&f));
        assert_eq!((fd_size(&f).unwrap(), fd_allocated(&f).unwrap()), (0, 0));
        resize_allocated(&f, 0, 4 << 20).unwrap();
        assert_eq!(fd_size(&f).unwrap(), 4 << 20);
        assert_eq!(
            fd_allocated(&f).unwrap(),
            4 << 20,
            "every page allocated now"
        );
        resize_allocated(&f, 4 << 20, 1 << 20).unwrap();
        assert_eq!(
            (fd_size(&f).unwrap(), fd_allocated(&f).unwrap()),
            (1 << 20, 1 << 20)
        );
        // A file that is not a memory file.
        let t = std::fs::File::open("/proc/self/stat").unwrap();
        assert!(!is_memfd(&t));
    }

    #[test]
    fn passes_a_memfd_and_reads_credentials() {
        let (a, b) = UnixStream::pair().unwrap();
        let c = peer_cred(&a).unwrap();
        assert_eq!(c.pid, std::process::id() as i32);
        let m = memfd_sized("t", 1 << 16).unwrap();
        send_with_fds(&a, b"hello", &[m.as_raw_fd()]).unwrap();
        let mut buf = [0u8; 16];
        let mut fds = Vec::new();
        let n = recv_with_fds(&b, &mut buf, &mut fds).unwrap();
        assert_eq!(&buf[..n], b"hello");
        assert_eq!(fds.len(), 1);
        assert_eq!(fd_size(&fds[0]).unwrap(), 1 << 16);
        // Both descriptors name one file: a write through one mapping shows in the other.
        let p = map_shared(&m, 1 << 16, true).unwrap();
        let q = map_shared(&fds[0], 1 << 16, false).unwrap();
        // SAFETY: both are fresh 64 KiB shared mappings of the same file.
        unsafe {
            *(p as *mut u64) = 0xfeed;
            assert_eq!(*(q as *const u64), 0xfeed);
        }
        crate::mem::unmap(p, 1 << 16).unwrap();
        crate::mem::unmap(q, 1 << 16).unwrap();
    }

    #[test]
    fn shared_words_are_seen_by_every_mapping_and_refuse_unsealed_files() {
        use std::sync::atomic::Ordering::Relaxed;
        let a = SharedWords::create("words-test", 512).unwrap();
        let b = SharedWords::attach(dup(a.fd()).unwrap(), 512).unwrap();
        a.words()[7].store(0xfeed, Relaxed);
        assert_eq!(b.words()[7].load(Relaxed), 0xfeed);
        assert_eq!(b.words().len(), 512);
        // Fewer words than asked, a file that could shrink, no words: refused.
        assert_eq!(
            SharedWords::attach(dup(a.fd()).unwrap(), 513).err(),
            Some(Errno(libc::EINVAL))
        );
        let g = memfd_growable("words-unsealed").unwrap();
        resize_allocated(&g, 0, 4096).unwrap();
        assert_eq!(SharedWords::attach(g, 8).err(), Some(Errno(libc::EINVAL)));
        assert_eq!(
            SharedWords::attach(dup(a.fd()).unwrap(), 0).err(),
            Some(Errno(libc::EINVAL))
        );
    }

    #[test]
    fn read_only_seal_refuses_writes_and_writable_maps() {
        use std::io::Write;
        let fd = memfd_growable("stage-test").unwrap();
        let mut f = std::fs::File::from(fd.try_clone().unwrap());
        f.write_all(&[7u8; 8192]).unwrap();
        assert!(!is_write_sealed(&fd));
        seal_read_only(&fd).unwrap();
        assert!(is_write_sealed(&fd));
        assert!(f.write_all(&[1]).is_err());
        assert_eq!(map_shared(&fd, 8192, true), Err(Errno(libc::EPERM)));
        let a = map_shared(&fd, 8192, false).unwrap();
        // SAFETY: a maps 8192 readable bytes.
        assert_eq!(unsafe { *(a as *const u8).add(8191) }, 7);
        crate::mem::unmap(a, 8192).unwrap();
    }

    #[test]
    fn sealed_memfd_cannot_shrink() {
        let m = memfd_sized("t", 8192).unwrap();
        // SAFETY: ftruncate on our own fd.
        let r = unsafe { libc::ftruncate(m.as_raw_fd(), 0) };
        assert_ne!(r, 0);
        assert!(is_sealed_memfd(&m));
        let f = std::fs::File::open("/proc/self/exe").unwrap();
        assert!(!is_sealed_memfd(&f));
    }
}

/// Words of memory several processes share through a sealed memory file ([`memfd_sized`]),
/// read and written only as atomics: what the node daemon's board of a memory cgroup's
/// runtimes is made of (each runtime's resident bytes in its slot). Any bit pattern is a
/// valid `AtomicU64`, so words another process writes (a confused or hostile one) are
/// figures to doubt, never unsoundness; the seals keep the file from shrinking under the
/// mapping (a truncation would turn every read into SIGBUS).
pub struct SharedWords {
    addr: usize,
    len: usize,
    fd: OwnedFd,
}

// SAFETY: the mapping is only reached as `&[AtomicU64]`; it lives until drop.
unsafe impl Send for SharedWords {}
// SAFETY: as above: shared access is atomic.
unsafe impl Sync for SharedWords {}

impl SharedWords {
    /// A new memory file of `n` zeroed words, mapped.
    pub fn create(name: &str, n: usize) -> SysResult<SharedWords> {
        let fd = memfd_sized(name, (n * 8) as u64)?;
        Self::attach(fd, n)
    }

    /// Maps `n` words of a memory file someone passed: refused (EINVAL) unless it is a
    /// memory file sealed against shrinking and holding at least `n` words.
    pub fn attach(fd: OwnedFd, n: usize) -> SysResult<SharedWords> {
        let len = n
            .checked_mul(8)
            .filter(|&l| l > 0)
            .ok_or(Errno(libc::EINVAL))?;
        if !is_sealed_memfd(&fd) || fd_size(&fd)? < len as u64 {
            return Err(Errno(libc::EINVAL));
        }
        let addr = map_shared(&fd, len, true)?;
        Ok(SharedWords { addr, len: n, fd })
    }

    pub fn words(&self) -> &[std::sync::atomic::AtomicU64] {
        // SAFETY: `addr` is a live, page-aligned shared mapping of `len` words that cannot
        // shrink (sealed); atomics accept every bit pattern other processes may store.
        unsafe {
            std::slice::from_raw_parts(self.addr as *const std::sync::atomic::AtomicU64, self.len)
        }
    }

    /// The memory file, to pass to another process.
    pub fn fd(&self) -> &OwnedFd {
        &self.fd
    }
}

impl Drop for SharedWords {
    fn drop(&mut self) {
        let _ = crate::mem::unmap(self.addr, self.len * 8);
    }
}
