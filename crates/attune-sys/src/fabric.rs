//! libfabric, the HPC fabric library of the remote tier (docs/design/remote.md): one
//! reliable unconnected endpoint (`FI_EP_RDM`) with tagged and untagged messages.
//!
//! The library is opened with `dlopen` on first use (`src/fabric_shim.c`), so programs
//! that use no remote tier never load it. An [`Endpoint`] is used by one thread at a time
//! (`FI_THREAD_DOMAIN`): the remote tier's I/O thread, or the memory server's loop.
//!
//! Buffers are plain addresses (the crate's contract): the caller keeps each buffer and
//! its [`OpContext`] alive and unmoved until the operation's completion is read, or until
//! the endpoint is closed.

// Without libfabric's headers the shim is not built and most of this module is unused.
#![cfg_attr(attune_no_fabric, allow(unused_imports, dead_code))]

use crate::Errno;
use std::ffi::{c_char, c_int, c_void, CStr, CString};

/// The provider's state of one operation (`struct fi_context2`), owned by the caller.
#[repr(C, align(8))]
#[derive(Default)]
pub struct OpContext(pub [u64; 8]);

impl OpContext {
    /// The address a completion reports for this operation.
    pub fn id(&self) -> usize {
        self as *const OpContext as usize
    }
}

/// One completion read from the queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    /// [`OpContext::id`] of the operation.
    pub ctx: usize,
    /// Bytes received (receives).
    pub len: usize,
    /// 0, or the error (an errno value or libfabric's own, above 255).
    pub status: i32,
}

#[cfg(not(attune_no_fabric))]
mod ffi {
    use super::*;
    extern "C" {
        pub fn atf_load(err: *mut c_char, n: usize) -> c_int;
        pub fn atf_strerror(rc: c_int) -> *const c_char;
        pub fn atf_open(
            prov: *const c_char,
            node: *const c_char,
            service: *const c_char,
            listen: c_int,
            out: *mut *mut c_void,
            err: *mut c_char,
            n: usize,
        ) -> c_int;
        pub fn atf_close(e: *mut c_void);
        pub fn atf_name(e: *mut c_void, buf: *mut c_void, len: *mut usize) -> c_int;
        pub fn atf_insert(e: *mut c_void, addr: *const c_void, fi: *mut u64) -> c_int;
        pub fn atf_resolve(
            e: *mut c_void,
            node: *const c_char,
            service: *const c_char,
            fi: *mut u64,
            err: *mut c_char,
            n: usize,
        ) -> c_int;
        pub fn atf_remove(e: *mut c_void, fi: u64) -> c_int;
        pub fn atf_sendv(
            e: *mut c_void,
            iov: *const libc::iovec,
            cnt: usize,
            dest: u64,
            tag: u64,
            tagged: c_int,
            ctx: *mut c_void,
        ) -> libc::c_long;
        pub fn atf_recvv(
            e: *mut c_void,
            iov: *const libc::iovec,
            cnt: usize,
            tag: u64,
            tagged: c_int,
            ctx: *mut c_void,
        ) -> libc::c_long;
        pub fn atf_cancel(e: *mut c_void, ctx: *mut c_void) -> c_int;
        pub fn atf_poll(
            e: *mut c_void,
            timeout_ms: c_int,
            ctx: *mut *mut c_void,
            len: *mut usize,
            status: *mut c_int,
        ) -> c_int;
        pub fn atf_provider(e: *mut c_void) -> *const c_char;
    }
}

/// Whether this build has the fabric shim (libfabric's headers were there).
pub const BUILT: bool = cfg!(not(attune_no_fabric));

/// libfabric's text for an error number.
pub fn strerror(code: i32) -> String {
    #[cfg(not(attune_no_fabric))]
    // SAFETY: atf_strerror returns a static NUL-terminated string ("?" before loading).
    unsafe {
        CStr::from_ptr(ffi::atf_strerror(code))
            .to_string_lossy()
            .into_owned()
    }
    #[cfg(attune_no_fabric)]
    format!("error {code}")
}

/// An open endpoint with its completion queue and address vector.
pub struct Endpoint {
    raw: *mut c_void,
}

// SAFETY: the endpoint is used by one thread at a time (FI_THREAD_DOMAIN), which `&mut`
// on every operation enforces; it may move between threads.
unsafe impl Send for Endpoint {}

fn cstr(s: &str) -> Result<CString, String> {
    CString::new(s).map_err(|_| format!("'{s}' contains a NUL byte"))
}

fn err_text(buf: &[u8]) -> String {
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

fn iovecs(iov: &[(usize, usize)], out: &mut [libc::iovec; 4]) -> Result<usize, Errno> {
    if iov.len() > out.len() {
        return Err(Errno(libc::EINVAL));
    }
    for (o, &(a, l)) in out.iter_mut().zip(iov) {
        *o = libc::iovec {
            iov_base: a as *mut c_void,
            iov_len: l,
        };
    }
    Ok(iov.len())
}

impl Endpoint {
    /// Opens an endpoint of provider `provider` ("tcp", "verbs", "efa", "cxi"; empty:
    /// libfabric's choice). `listen`: bound to that host and port (a server).
    pub fn open(provider: &str, listen: Option<(&str, &str)>) -> Result<Endpoint, String> {
        #[cfg(attune_no_fabric)]
        {
            let _ = (provider, listen);
            Err(
                "this build has no libfabric support (libfabric-dev was missing at build time)"
                    .into(),
            )
        }
        #[cfg(not(attune_no_fabric))]
        {
            let prov = cstr(provider)?;
            let (node, service) = match listen {
                Some((h, p)) => (Some(cstr(h)?), Some(cstr(p)?)),
                None => (None, None),
            };
            let mut raw = std::ptr::null_mut();
            let mut err = [0u8; 256];
            // SAFETY: every pointer is valid for the call; the shim copies the strings.
            let rc = unsafe {
                ffi::atf_open(
                    prov.as_ptr(),
                    node.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()),
                    service.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()),
                    listen.is_some() as c_int,
                    &mut raw,
                    err.as_mut_ptr().cast(),
                    err.len(),
                )
            };
            if rc != 0 {
                return Err(err_text(&err));
            }
            Ok(Endpoint { raw })
        }
    }

    /// The provider in use.
    pub fn provider(&self) -> String {
        #[cfg(not(attune_no_fabric))]
        // SAFETY: raw is an open endpoint; the name lives as long as it.
        unsafe {
            CStr::from_ptr(ffi::atf_provider(self.raw))
                .to_string_lossy()
                .into_owned()
        }
        #[cfg(attune_no_fabric)]
        String::new()
    }

    /// The endpoint's own address (what a peer inserts).
    pub fn name(&mut self) -> Result<Vec<u8>, Errno> {
        #[cfg(not(attune_no_fabric))]
        {
            let mut buf = vec![0u8; 256];
            let mut len = buf.len();
            // SAFETY: buf has len bytes.
            let rc = unsafe { ffi::atf_name(self.raw, buf.as_mut_ptr().cast(), &mut len) };
            if rc != 0 || len > buf.len() {
                return Err(Errno(-rc));
            }
            buf.truncate(len);
            Ok(buf)
        }
        #[cfg(attune_no_fabric)]
        Err(Errno(libc::ENOSYS))
    }

    /// Adds a peer by the address it sent; returns its handle for sends.
    pub fn insert(&mut self, addr: &[u8]) -> Result<u64, Errno> {
        #[cfg(not(attune_no_fabric))]
        {
            // The provider reads its own address length from the bytes: never pass it a
            // short buffer (a peer's bytes are copied into a full-size one).
            let mut full = [0u8; 256];
            let n = addr.len().min(full.len());
            full[..n].copy_from_slice(&addr[..n]);
            let mut fi = 0u64;
            // SAFETY: full is 256 bytes, more than any provider's address.
            let rc = unsafe { ffi::atf_insert(self.raw, full.as_ptr().cast(), &mut fi) };
            if rc != 0 {
                return Err(Errno(-rc));
            }
            Ok(fi)
        }
        #[cfg(attune_no_fabric)]
        {
            let _ = addr;
            Err(Errno(libc::ENOSYS))
        }
    }

    /// Adds a peer by host and port (a server), resolved by the endpoint's own provider.
    pub fn resolve(&mut self, host: &str, port: &str) -> Result<u64, String> {
        #[cfg(not(attune_no_fabric))]
        {
            let (h, s) = (cstr(host)?, cstr(port)?);
            let mut fi = 0u64;
            let mut err = [0u8; 256];
            // SAFETY: valid strings and out pointers for the call.
            let rc = unsafe {
                ffi::atf_resolve(
                    self.raw,
                    h.as_ptr(),
                    s.as_ptr(),
                    &mut fi,
                    err.as_mut_ptr().cast(),
                    err.len(),
                )
            };
            if rc != 0 {
                return Err(err_text(&err));
            }
            Ok(fi)
        }
        #[cfg(attune_no_fabric)]
        {
            let _ = (host, port);
            Err("no libfabric support".into())
        }
    }

    /// Forgets a peer.
    pub fn remove(&mut self, fi: u64) {
        #[cfg(not(attune_no_fabric))]
        // SAFETY: raw is open; an unknown handle is an error the provider reports.
        unsafe {
            ffi::atf_remove(self.raw, fi);
        }
        #[cfg(attune_no_fabric)]
        let _ = fi;
    }

    /// Sends the buffers `iov` (address, length; at most 4) to `dest` as one message,
    /// tagged with `tag` (a reply) or untagged (a request). EAGAIN: read completions, retry.
    pub fn sendv(
        &mut self,
        iov: &[(usize, usize)],
        dest: u64,
        tag: Option<u64>,
        ctx: &mut OpContext,
    ) -> Result<(), Errno> {
        self.post(true, iov, dest, tag, ctx)
    }

    /// Posts a receive into `iov`: of the reply tagged `tag`, or (None) of any request.
    pub fn recvv(
        &mut self,
        iov: &[(usize, usize)],
        tag: Option<u64>,
        ctx: &mut OpContext,
    ) -> Result<(), Errno> {
        self.post(false, iov, 0, tag, ctx)
    }

    fn post(
        &mut self,
        send: bool,
        iov: &[(usize, usize)],
        dest: u64,
        tag: Option<u64>,
        ctx: &mut OpContext,
    ) -> Result<(), Errno> {
        let mut v: [libc::iovec; 4] = [libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        }; 4];
        let n = iovecs(iov, &mut v)?;
        #[cfg(not(attune_no_fabric))]
        {
            let (t, tagged, c) = (
                tag.unwrap_or(0),
                tag.is_some() as c_int,
                (ctx as *mut OpContext).cast(),
            );
            // SAFETY: the caller keeps the buffers and ctx alive until the completion.
            let rc = unsafe {
                if send {
                    ffi::atf_sendv(self.raw, v.as_ptr(), n, dest, t, tagged, c)
                } else {
                    ffi::atf_recvv(self.raw, v.as_ptr(), n, t, tagged, c)
                }
            };
            if rc != 0 {
                return Err(Errno((-rc) as i32));
            }
            Ok(())
        }
        #[cfg(attune_no_fabric)]
        {
            let _ = (send, n, dest, tag, ctx);
            Err(Errno(libc::ENOSYS))
        }
    }

    /// Cancels a posted operation; its completion reports ECANCELED.
    pub fn cancel(&mut self, ctx: &mut OpContext) {
        #[cfg(not(attune_no_fabric))]
        // SAFETY: ctx is an operation's context or unknown (then the call does nothing).
        unsafe {
            ffi::atf_cancel(self.raw, (ctx as *mut OpContext).cast());
        }
        #[cfg(attune_no_fabric)]
        let _ = ctx;
    }

    /// Reads one completion, waiting up to `timeout_ms` (0: no wait). Reading is what
    /// moves data on providers with manual progress (tcp).
    pub fn poll(&mut self, timeout_ms: i32) -> Result<Option<Completion>, Errno> {
        #[cfg(not(attune_no_fabric))]
        {
            let mut ctx = std::ptr::null_mut();
            let (mut len, mut status) = (0usize, 0 as c_int);
            // SAFETY: out pointers valid for the call.
            let rc =
                unsafe { ffi::atf_poll(self.raw, timeout_ms, &mut ctx, &mut len, &mut status) };
            match rc {
                1 => Ok(Some(Completion {
                    ctx: ctx as usize,
                    len,
                    status,
                })),
                0 => Ok(None),
                e => Err(Errno(-e)),
            }
        }
        #[cfg(attune_no_fabric)]
        {
            let _ = timeout_ms;
            Err(Errno(libc::ENOSYS))
        }
    }
}

impl Endpoint {
    /// Reads one completion: polls without sleeping for up to `spin_ns` (a reply to a
    /// request in flight comes within tens of microseconds, and sleeping on the queue's
    /// wait object costs as much again), then sleeps up to `timeout_ms`.
    ///
    /// Between polls it yields the CPU: with a CPU free that returns at once, and where
    /// threads outnumber CPUs (servers and clients on the same cores) the peer that has
    /// the reply to make runs instead of waiting for a spinner's time slice. Random 4 KiB
    /// reads through two servers on this 2-vCPU host: 192 MB/s yielding, 23 MB/s
    /// spinning, 44 MB/s sleeping at once (`bench/rmap.py --cell 2,1,random`;
    /// docs/benchmarks.md, "rMap's figures").
    pub fn wait(&mut self, spin_ns: u64, timeout_ms: i32) -> Result<Option<Completion>, Errno> {
        let end = crate::os::now_ns() + spin_ns;
        loop {
            if let Some(c) = self.poll(0)? {
                return Ok(Some(c));
            }
            if crate::os::now_ns() >= end {
                break;
            }
            crate::os::yield_now();
        }
        self.poll(timeout_ms)
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        #[cfg(not(attune_no_fabric))]
        // SAFETY: raw was opened by atf_open and is closed once.
        unsafe {
            ffi::atf_close(self.raw)
        }
    }
}

/// Loads libfabric now (to report its absence early). Err: the reason.
pub fn load() -> Result<(), String> {
    #[cfg(not(attune_no_fabric))]
    {
        let mut err = [0u8; 256];
        // SAFETY: err has its length.
        if unsafe { ffi::atf_load(err.as_mut_ptr().cast(), err.len()) } != 0 {
            return Err(err_text(&err));
        }
        Ok(())
    }
    #[cfg(attune_no_fabric)]
    Err("this build has no libfabric support".into())
}
