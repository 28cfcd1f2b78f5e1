//! The `remote` tier: pages on memory servers (`attune memserver`) on other hosts, over
//! libfabric (docs/design/remote.md).
//!
//! The fault path is signal-safe and the fabric library is not (it allocates and locks),
//! so one I/O thread owns the endpoint and every fabric call: a store or load posts a job
//! in a fixed table and sleeps on a futex until the thread answers. A job's range is cut
//! into 64 KiB units; each unit has one owner server (a hash of the unit), consecutive
//! units of one owner go as one request, and all the requests of a job are in flight at
//! once (each reply tagged with its request's number lands in the buffer posted for it).
//!
//! Failures are loud: a server that does not answer within `timeout_ms` fails the job
//! (ETIMEDOUT; a load then makes its region fail with SIGBUS) and the log names it; a
//! full server answers ENOSPC and the pages go to the next tier.

use crate::config::TierConfig;
use attune_proto::remote::{self as proto, Header, Op};
use attune_sys::fabric::{Endpoint, OpContext};
use attune_sys::uffd::Uffd;
use attune_sys::{Errno, SysResult};
use std::sync::atomic::{
    AtomicBool, AtomicI32, AtomicU32, AtomicU64, AtomicUsize,
    Ordering::{AcqRel, Acquire, Relaxed, Release},
};
use std::sync::Arc;

/// Pages are spread over the servers by units of this size.
pub const UNIT: u64 = 64 << 10;
/// Jobs posted at once (callers beyond wait for a free one).
const JOBS: usize = 8;

const FREE: u32 = 0;
const CLAIMED: u32 = 1;
const POSTED: u32 = 2;
const DONE: u32 = 3;

#[derive(Default)]
struct Job {
    state: AtomicU32,
    op: AtomicU32,
    addr: AtomicUsize,
    off: AtomicU64,
    len: AtomicUsize,
    result: AtomicI32,
    /// Nobody waits: the I/O thread frees the job (discards).
    detached: AtomicBool,
}

#[derive(Default)]
struct Shared {
    jobs: [Job; JOBS],
    /// Bumped at every post; the I/O thread sleeps on it.
    doorbell: AtomicU32,
    /// Bumped when a job is freed; callers waiting for a job sleep on it.
    freed: AtomicU32,
}

/// One server of the tier.
struct Server {
    name: String,
    fi: u64,
    session: u64,
    token: [u8; 16],
}

/// What the I/O thread owns.
struct Client {
    ep: Endpoint,
    servers: Vec<Server>,
    seq: u64,
    timeout_ns: u64,
    lease_ns: u64,
}

pub struct RemoteTier {
    shared: Arc<Shared>,
    /// In a forked child: the parent's sessions are not ours; stores go to the next tier.
    detached: AtomicBool,
}

/// Reads the job's secret: a file only its owner may read (a secret others can read is
/// no secret, so it is refused, as ssh refuses such a key).
pub fn read_secret(path: &std::path::Path) -> Result<Vec<u8>, String> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).map_err(|e| format!("secret file {}: {e}", path.display()))?;
    if m.mode() & 0o077 != 0 {
        return Err(format!(
            "secret file {} can be read by others (mode {:o}): chmod 600 it",
            path.display(),
            m.mode() & 0o777
        ));
    }
    let s = std::fs::read(path).map_err(|e| format!("secret file {}: {e}", path.display()))?;
    let s = s.trim_ascii().to_vec();
    if s.len() < 16 || s.len() > proto::SECRET_MAX {
        return Err(format!(
            "secret file {}: a secret has 16 to {} bytes",
            path.display(),
            proto::SECRET_MAX
        ));
    }
    Ok(s)
}

/// The server that owns `unit` (a 64 KiB unit of the tier's offset space) among `n`.
pub fn owner(unit: u64, n: usize) -> usize {
    // A multiplicative hash: neighbouring units land on different servers, so a stream
    // is spread over all of them (rMap §IV's interleaving).
    ((unit.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32) % n as u64) as usize
}

/// The pieces of `[off, off+len)`: (server, offset, length), units of one owner merged,
/// none above the protocol's payload bound.
pub fn pieces(off: u64, len: u64, n: usize) -> Vec<(usize, u64, u64)> {
    let mut out: Vec<(usize, u64, u64)> = Vec::new();
    let mut a = off;
    let end = off + len;
    while a < end {
        let b = ((a / UNIT + 1) * UNIT).min(end);
        let s = owner(a / UNIT, n);
        match out.last_mut() {
            Some((ls, lo, ll))
                if *ls == s && *lo + *ll == a && *ll + (b - a) <= proto::MAX_PAYLOAD as u64 =>
            {
                *ll += b - a
            }
            _ => out.push((s, a, b - a)),
        }
        a = b;
    }
    out
}

impl Client {
    /// Sends one request per server in `reqs` and waits for every reply. `data`: for each
    /// request, the buffer its payload goes out of (store, hello) or comes back into
    /// (load). Returns the replies' headers, or the first error.
    fn exchange(
        &mut self,
        reqs: &mut [(usize, Header, usize, usize, bool)],
    ) -> Result<Vec<Header>, (Errno, String)> {
        let n = reqs.len();
        let mut send_ctx: Vec<OpContext> = (0..n).map(|_| OpContext::default()).collect();
        let mut recv_ctx: Vec<OpContext> = (0..n).map(|_| OpContext::default()).collect();
        let mut out_hdr: Vec<[u8; proto::HEADER]> = Vec::with_capacity(n);
        let mut in_hdr: Vec<[u8; proto::HEADER]> = vec![[0u8; proto::HEADER]; n];
        for (_, h, _, _, _) in reqs.iter_mut() {
            self.seq += 1;
            h.seq = self.seq;
            out_hdr.push(h.encode());
        }
        let mut pending = 0usize;
        let mut err: Option<(Errno, String)> = None;
        let deadline = attune_sys::os::now_ns() + self.timeout_ns;
        for i in 0..n {
            let (s, h, addr, len, incoming) = reqs[i];
            let fi = self.servers[s].fi;
            let mut riov = vec![(in_hdr[i].as_mut_ptr() as usize, proto::HEADER)];
            let mut siov = vec![(out_hdr[i].as_ptr() as usize, proto::HEADER)];
            if len > 0 {
                if incoming {
                    riov.push((addr, len));
                } else {
                    siov.push((addr, len));
                }
            }
            if let Err(e) = self.ep.recvv(&riov, Some(h.seq), &mut recv_ctx[i]) {
                err = Some((
                    e,
                    format!(
                        "cannot post a receive: {}",
                        attune_sys::fabric::strerror(e.0)
                    ),
                ));
                break;
            }
            pending += 1;
            loop {
                match self.ep.sendv(&siov, fi, None, &mut send_ctx[i]) {
                    Ok(()) => {
                        pending += 1;
                        break;
                    }
                    Err(Errno(libc::EAGAIN)) if attune_sys::os::now_ns() < deadline => {
                        if let Ok(Some(c)) = self.ep.poll(0) {
                            Self::complete(c, &recv_ctx, &send_ctx, &mut pending, &mut err);
                        }
                    }
                    Err(e) => {
                        err = Some((
                            e,
                            format!(
                                "cannot send to {}: {}",
                                self.servers[s].name,
                                attune_sys::fabric::strerror(e.0)
                            ),
                        ));
                        break;
                    }
                }
            }
            if err.is_some() {
                break;
            }
        }
        while pending > 0 {
            let now = attune_sys::os::now_ns();
            if now >= deadline {
                // Nothing more will be read into these buffers: cancel what is still
                // posted, and leak the contexts and headers, which the provider may still
                // name in a late completion.
                for c in recv_ctx.iter_mut() {
                    self.ep.cancel(c);
                }
                let who: Vec<&str> = reqs
                    .iter()
                    .map(|r| self.servers[r.0].name.as_str())
                    .collect();
                std::mem::forget(recv_ctx);
                std::mem::forget(send_ctx);
                std::mem::forget(in_hdr);
                std::mem::forget(out_hdr);
                return Err((
                    Errno(libc::ETIMEDOUT),
                    format!(
                        "no answer in {} ms from {}",
                        self.timeout_ns / 1_000_000,
                        who.join(", ")
                    ),
                ));
            }
            match self.ep.poll(1) {
                Ok(Some(c)) => Self::complete(c, &recv_ctx, &send_ctx, &mut pending, &mut err),
                Ok(None) => {}
                Err(e) => {
                    err.get_or_insert((
                        e,
                        format!("completion queue: {}", attune_sys::fabric::strerror(e.0)),
                    ));
                }
            }
        }
        if let Some(e) = err {
            return Err(e);
        }
        let mut replies = Vec::with_capacity(n);
        for (i, b) in in_hdr.iter().enumerate() {
            let name = &self.servers[reqs[i].0].name;
            let h = Header::decode(b, proto::HEADER)
                .map_err(|e| (Errno(libc::EPROTO), format!("{name}: bad reply: {e}")))?;
            if h.seq != reqs[i].1.seq {
                return Err((
                    Errno(libc::EPROTO),
                    format!("{name}: reply to another request"),
                ));
            }
            if h.status != 0 {
                return Err((Errno(h.status), format!("{name}: {}", Errno(h.status))));
            }
            replies.push(h);
        }
        Ok(replies)
    }

    fn complete(
        c: attune_sys::fabric::Completion,
        recv_ctx: &[OpContext],
        send_ctx: &[OpContext],
        pending: &mut usize,
        err: &mut Option<(Errno, String)>,
    ) {
        let ours = recv_ctx.iter().chain(send_ctx).any(|x| x.id() == c.ctx);
        if !ours {
            // A late completion of an operation a timed-out job cancelled.
            return;
        }
        *pending = pending.saturating_sub(1);
        if c.status != 0 && err.is_none() {
            *err = Some((
                Errno(if c.status < 256 { c.status } else { libc::EIO }),
                format!(
                    "transfer failed: {}",
                    attune_sys::fabric::strerror(c.status)
                ),
            ));
        }
    }

    fn header(&self, s: usize, op: Op, off: u64, len: usize) -> Header {
        Header {
            op: op as u16,
            session: self.servers[s].session,
            token: self.servers[s].token,
            off,
            len: len as u32,
            ..Default::default()
        }
    }

    /// Stores or loads `[off, off+len)` at `addr`, over the owners of its units.
    fn transfer(
        &mut self,
        op: Op,
        addr: usize,
        off: u64,
        len: usize,
    ) -> Result<(), (Errno, String)> {
        let n = self.servers.len();
        let mut reqs: Vec<(usize, Header, usize, usize, bool)> = pieces(off, len as u64, n)
            .into_iter()
            .map(|(s, o, l)| {
                let a = addr + (o - off) as usize;
                match op {
                    Op::Store => (s, self.header(s, op, o, l as usize), a, l as usize, false),
                    Op::Load => (s, self.header(s, op, o, l as usize), a, l as usize, true),
                    _ => (s, self.header(s, op, o, l as usize), 0, 0, false),
                }
            })
            .collect();
        self.exchange(&mut reqs).map(|_| ())
    }

    /// Keeps every session's lease.
    fn ping(&mut self) -> Result<(), (Errno, String)> {
        let mut reqs: Vec<_> = (0..self.servers.len())
            .map(|s| (s, self.header(s, Op::Ping, 0, 0), 0, 0, false))
            .collect();
        self.exchange(&mut reqs).map(|_| ())
    }

    fn hello(&mut self, secret: &[u8], ask: u64) -> Result<(), String> {
        let me = self
            .ep
            .name()
            .map_err(|e| format!("the endpoint has no address: {e}"))?;
        let payload = proto::encode_hello(secret, &me);
        let mut reqs: Vec<_> = (0..self.servers.len())
            .map(|s| {
                let h = Header {
                    op: Op::Hello as u16,
                    off: ask,
                    len: payload.len() as u32,
                    ..Default::default()
                };
                (s, h, payload.as_ptr() as usize, payload.len(), false)
            })
            .collect();
        let replies = self.exchange(&mut reqs).map_err(|(e, m)| {
            if e.0 == libc::EACCES {
                format!("{m}: the server refused the job's secret")
            } else {
                m
            }
        })?;
        for (s, h) in replies.iter().enumerate() {
            self.servers[s].session = h.session;
            self.servers[s].token = h.token;
            // The server's lease, in the reply's offset field (ms).
            self.lease_ns = self.lease_ns.min(h.off.max(1000) * 1_000_000);
        }
        Ok(())
    }

    fn run(mut self, shared: Arc<Shared>) {
        let mut last_ping = attune_sys::os::now_ns();
        loop {
            let bell = shared.doorbell.load(Acquire);
            let mut did = false;
            for j in &shared.jobs {
                if j.state.load(Acquire) != POSTED {
                    continue;
                }
                did = true;
                let op = match j.op.load(Relaxed) {
                    2 => Op::Store,
                    3 => Op::Load,
                    _ => Op::Discard,
                };
                let r = self.transfer(
                    op,
                    j.addr.load(Relaxed),
                    j.off.load(Relaxed),
                    j.len.load(Relaxed),
                );
                let code = match r {
                    Ok(()) => 0,
                    Err((e, m)) => {
                        if e.0 != libc::ENOSPC {
                            let what = match op {
                                Op::Store => "a store",
                                Op::Load => "a load",
                                _ => "a discard",
                            };
                            crate::warn!(
                                "remote tier: {what} of {} bytes failed: {m}",
                                j.len.load(Relaxed)
                            );
                        }
                        e.0
                    }
                };
                j.result.store(code, Relaxed);
                if j.detached.load(Relaxed) {
                    j.state.store(FREE, Release);
                    shared.freed.fetch_add(1, Release);
                    attune_sys::os::futex_wake(&shared.freed, i32::MAX);
                } else {
                    j.state.store(DONE, Release);
                    attune_sys::os::futex_wake(&j.state, 1);
                }
            }
            let now = attune_sys::os::now_ns();
            if now.saturating_sub(last_ping) >= self.lease_ns / 4 {
                if let Err((_, m)) = self.ping() {
                    crate::warn!("remote tier: keeping the lease failed: {m}");
                }
                last_ping = now;
            }
            if !did {
                attune_sys::os::futex_wait(&shared.doorbell, bell, self.lease_ns / 4);
            }
        }
    }
}

impl RemoteTier {
    pub fn new(cfg: &TierConfig) -> Result<RemoteTier, String> {
        let path = cfg
            .secret_file
            .as_deref()
            .ok_or_else(|| format!("tier '{}' has no secret_file", cfg.name))?;
        let secret = read_secret(path).map_err(|e| format!("tier '{}': {e}", cfg.name))?;
        let mut ep = Endpoint::open(&cfg.provider, None).map_err(|e| {
            format!(
                "tier '{}': libfabric provider '{}': {e}",
                cfg.name, cfg.provider
            )
        })?;
        let mut servers = Vec::new();
        for s in cfg.server_list() {
            let (h, p) = s
                .rsplit_once(':')
                .ok_or_else(|| format!("'{s}' is not HOST:PORT"))?;
            let fi = ep
                .resolve(&cfg.provider, h, p)
                .map_err(|e| format!("tier '{}': server {s}: {e}", cfg.name))?;
            servers.push(Server {
                name: s.to_string(),
                fi,
                session: 0,
                token: [0; 16],
            });
        }
        let mut c = Client {
            ep,
            servers,
            seq: 0,
            timeout_ns: cfg.timeout_ms * 1_000_000,
            lease_ns: 60_000_000_000,
        };
        let per_server = cfg.capacity / c.servers.len().max(1) as u64 + UNIT;
        c.hello(&secret, per_server)
            .map_err(|e| format!("tier '{}': {e}", cfg.name))?;
        crate::info!(
            "tier '{}': {} memory server(s) over libfabric '{}'",
            cfg.name,
            c.servers.len(),
            c.ep.provider()
        );
        let shared = Arc::new(Shared::default());
        let s2 = shared.clone();
        attune_sys::os::spawn_runtime_thread("attune-remote", move || c.run(s2))
            .map_err(|e| format!("tier '{}': cannot start its I/O thread: {e}", cfg.name))?;
        Ok(RemoteTier {
            shared,
            detached: AtomicBool::new(false),
        })
    }

    /// Posts a job to the I/O thread and (unless `detached`) waits for its answer.
    /// Signal-safe: atomics and futexes only.
    fn post(&self, op: Op, addr: usize, off: u64, len: usize, detached: bool) -> SysResult<()> {
        let sh = &*self.shared;
        let job = loop {
            let seen = sh.freed.load(Acquire);
            if let Some(j) = sh.jobs.iter().find(|j| {
                j.state
                    .compare_exchange(FREE, CLAIMED, AcqRel, Relaxed)
                    .is_ok()
            }) {
                break j;
            }
            attune_sys::os::futex_wait(&sh.freed, seen, 10_000_000);
        };
        job.op.store(op as u32, Relaxed);
        job.addr.store(addr, Relaxed);
        job.off.store(off, Relaxed);
        job.len.store(len, Relaxed);
        job.detached.store(detached, Relaxed);
        job.state.store(POSTED, Release);
        sh.doorbell.fetch_add(1, Release);
        attune_sys::os::futex_wake(&sh.doorbell, 1);
        if detached {
            return Ok(());
        }
        loop {
            let s = job.state.load(Acquire);
            if s == DONE {
                break;
            }
            attune_sys::os::futex_wait(&job.state, s, 0);
        }
        let r = job.result.load(Relaxed);
        job.state.store(FREE, Release);
        sh.freed.fetch_add(1, Release);
        attune_sys::os::futex_wake(&sh.freed, i32::MAX);
        if r == 0 {
            Ok(())
        } else {
            Err(Errno(r))
        }
    }
}

impl super::Medium for RemoteTier {
    fn store(
        &self,
        io: &super::IoContext,
        region_uffd: &Uffd,
        src: usize,
        off: u64,
        len: usize,
        already_there: &mut dyn FnMut(usize) -> bool,
    ) -> SysResult<()> {
        if self.detached.load(Relaxed) {
            return Err(Errno(libc::ENOSPC));
        }
        super::store_staged(io, region_uffd, src, len, &mut |st| {
            if already_there(st) {
                return Ok(());
            }
            // The provider's send reads the staged pages in the kernel: a page the
            // program had discarded is absent there and would fail the whole connection
            // (EFAULT inside the provider), so holes are filled with zeros first.
            super::file::fill_holes(io.internal, st, len);
            self.post(Op::Store, st, off, len, false)
        })
    }

    fn load(
        &self,
        io: &super::IoContext,
        region_uffd: &Uffd,
        dst: usize,
        off: u64,
        len: usize,
        seen: &mut dyn FnMut(usize) -> bool,
    ) -> SysResult<()> {
        if self.detached.load(Relaxed) {
            return Err(Errno(libc::EIO));
        }
        let slot = io.bounce.claim(len).ok_or(Errno(libc::EAGAIN))?;
        let b = slot.addr();
        self.post(Op::Load, b, off, len, false)?;
        if !seen(b) {
            return Err(Errno(libc::EBADMSG));
        }
        region_uffd.place_copy(dst, b, len, true)
    }

    fn discard(&self, off: u64, len: usize) {
        if !self.detached.load(Relaxed) {
            let _ = self.post(Op::Discard, 0, off, len, true);
        }
    }

    fn keeps_copy(&self) -> bool {
        true
    }

    fn is_node_memory(&self) -> bool {
        false
    }

    /// A child cannot share the parent's sessions (both would write the same pages), and
    /// the fabric endpoint does not survive a fork: the child's remote tier is detached
    /// (stores go to the next tier). What the parent holds remotely the child cannot see.
    fn prepare_fork(
        &self,
        _cfg: &TierConfig,
        has_data: bool,
        _buf: usize,
        _buf_len: usize,
    ) -> Result<bool, String> {
        if has_data {
            return Err("pages on memory servers are not copied for a child".into());
        }
        Ok(false)
    }

    fn reopen_in_child(&self, _internal: &Uffd) -> Result<(), String> {
        self.detached.store(true, Relaxed);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_cover_the_range_once_and_merge_one_owners_units() {
        for n in 1..=4 {
            for &(off, len) in &[
                (0u64, 4096u64),
                (60 << 10, 8 << 10),
                (0, 2 << 20),
                (4096, 1 << 20),
            ] {
                let p = pieces(off, len, n);
                let mut a = off;
                for &(s, o, l) in &p {
                    assert_eq!(o, a, "contiguous");
                    assert!(s < n && l > 0 && l <= proto::MAX_PAYLOAD as u64);
                    // Every unit of a piece has the piece's owner.
                    let mut u = o / UNIT;
                    while u * UNIT < o + l {
                        assert_eq!(owner(u, n), s);
                        u += 1;
                    }
                    a += l;
                }
                assert_eq!(a, off + len);
                if n == 1 {
                    assert_eq!(p.len(), 1, "one server: one request");
                }
            }
        }
    }

    #[test]
    fn units_spread_over_every_server() {
        for n in 2..=8 {
            let mut seen = vec![0u32; n];
            for u in 0..(64 * n as u64) {
                seen[owner(u, n)] += 1;
            }
            assert!(seen.iter().all(|&c| c >= 32), "{n}: {seen:?}");
        }
    }

    #[test]
    fn a_secret_others_can_read_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("s");
        std::fs::write(&p, "0123456789abcdef0123\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(read_secret(&p).unwrap_err().contains("chmod 600"));
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(read_secret(&p).unwrap(), b"0123456789abcdef0123");
        std::fs::write(&p, "short").unwrap();
        assert!(read_secret(&p).unwrap_err().contains("16 to"));
    }
}
