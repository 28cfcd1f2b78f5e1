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
/// How long the I/O thread polls for a reply before it sleeps (`Endpoint::wait`).
const SPIN_NS: u64 = 100_000;
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

/// An error and its message (naming the server).
type Failure = (Errno, String);

/// One request of an exchange.
struct Req {
    /// The job it serves.
    job: usize,
    server: usize,
    head: Header,
    /// Its payload: sent from (`incoming` false) or received into this buffer.
    addr: usize,
    len: usize,
    incoming: bool,
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
    /// Sends every request of `reqs` at once and waits for their replies, up to the
    /// timeout. Each request's payload goes out of (store, hello) or comes back into
    /// (load) its buffer. Returns each request's reply header or error.
    fn exchange(&mut self, reqs: &mut [Req]) -> Vec<Result<Header, Failure>> {
        let n = reqs.len();
        let mut send_ctx: Vec<OpContext> = (0..n).map(|_| OpContext::default()).collect();
        let mut recv_ctx: Vec<OpContext> = (0..n).map(|_| OpContext::default()).collect();
        let mut out_hdr: Vec<[u8; proto::HEADER]> = Vec::with_capacity(n);
        let mut in_hdr: Vec<[u8; proto::HEADER]> = vec![[0u8; proto::HEADER]; n];
        for r in reqs.iter_mut() {
            self.seq += 1;
            r.head.seq = self.seq;
            out_hdr.push(r.head.encode());
        }
        // Per request: operations still posted (receive and send), and its error.
        let mut posted = vec![0u8; n];
        let mut errs: Vec<Option<Failure>> = (0..n).map(|_| None).collect();
        let deadline = attune_sys::os::now_ns() + self.timeout_ns;
        let fabric_err =
            |e: Errno, what: &str| (e, format!("{what}: {}", attune_sys::fabric::strerror(e.0)));
        for i in 0..n {
            let r = &reqs[i];
            let fi = self.servers[r.server].fi;
            let mut riov = vec![(in_hdr[i].as_mut_ptr() as usize, proto::HEADER)];
            let mut siov = vec![(out_hdr[i].as_ptr() as usize, proto::HEADER)];
            if r.len > 0 {
                if r.incoming {
                    riov.push((r.addr, r.len));
                } else {
                    siov.push((r.addr, r.len));
                }
            }
            if let Err(e) = self.ep.recvv(&riov, Some(r.head.seq), &mut recv_ctx[i]) {
                errs[i] = Some(fabric_err(e, "cannot post a receive"));
                continue;
            }
            posted[i] += 1;
            loop {
                match self.ep.sendv(&siov, fi, None, &mut send_ctx[i]) {
                    Ok(()) => {
                        posted[i] += 1;
                        break;
                    }
                    Err(Errno(libc::EAGAIN)) if attune_sys::os::now_ns() < deadline => {
                        if let Ok(Some(c)) = self.ep.poll(0) {
                            Self::complete(c, &recv_ctx, &send_ctx, &mut posted, &mut errs);
                        }
                    }
                    Err(e) => {
                        let name = &self.servers[r.server].name;
                        errs[i] = Some(fabric_err(e, &format!("cannot send to {name}")));
                        // The receive stays posted: cancelled below with the others.
                        break;
                    }
                }
            }
        }
        let waiting = |posted: &[u8], errs: &[Option<Failure>]| {
            posted.iter().zip(errs).any(|(&p, e)| p > 0 && e.is_none())
        };
        while waiting(&posted, &errs) {
            if attune_sys::os::now_ns() >= deadline {
                for (i, r) in reqs.iter().enumerate() {
                    if posted[i] > 0 && errs[i].is_none() {
                        let name = &self.servers[r.server].name;
                        errs[i] = Some((
                            Errno(libc::ETIMEDOUT),
                            format!(
                                "no answer in {} ms from {name}",
                                self.timeout_ns / 1_000_000
                            ),
                        ));
                    }
                }
                break;
            }
            match self.ep.wait(SPIN_NS, 1) {
                Ok(Some(c)) => Self::complete(c, &recv_ctx, &send_ctx, &mut posted, &mut errs),
                Ok(None) => {}
                Err(e) => {
                    for x in errs.iter_mut().filter(|x| x.is_none()) {
                        *x = Some(fabric_err(e, "completion queue"));
                    }
                }
            }
        }
        if posted.iter().any(|&p| p > 0) {
            // Operations still posted (a failed or timed-out request): cancel them and
            // leak their contexts and buffers, which the provider may still name in a
            // late completion or write into.
            for (i, c) in recv_ctx.iter_mut().enumerate() {
                if posted[i] > 0 {
                    self.ep.cancel(c);
                }
            }
            std::mem::forget(recv_ctx);
            std::mem::forget(send_ctx);
            std::mem::forget(in_hdr);
            std::mem::forget(out_hdr);
            return errs
                .into_iter()
                .map(|e| Err(e.unwrap_or((Errno(libc::EIO), "cancelled".into()))))
                .collect();
        }
        let mut out = Vec::with_capacity(n);
        for (i, e) in errs.into_iter().enumerate() {
            if let Some(e) = e {
                out.push(Err(e));
                continue;
            }
            let name = &self.servers[reqs[i].server].name;
            out.push(match Header::decode(&in_hdr[i], proto::HEADER) {
                Err(e) => Err((Errno(libc::EPROTO), format!("{name}: bad reply: {e}"))),
                Ok(h) if h.seq != reqs[i].head.seq => Err((
                    Errno(libc::EPROTO),
                    format!("{name}: reply to another request"),
                )),
                Ok(h) if h.status != 0 => {
                    Err((Errno(h.status), format!("{name}: {}", Errno(h.status))))
                }
                Ok(h) => Ok(h),
            });
        }
        out
    }

    fn complete(
        c: attune_sys::fabric::Completion,
        recv_ctx: &[OpContext],
        send_ctx: &[OpContext],
        posted: &mut [u8],
        errs: &mut [Option<Failure>],
    ) {
        let Some(i) = recv_ctx
            .iter()
            .position(|x| x.id() == c.ctx)
            .or_else(|| send_ctx.iter().position(|x| x.id() == c.ctx))
        else {
            // A late completion of an operation a timed-out exchange cancelled.
            return;
        };
        posted[i] = posted[i].saturating_sub(1);
        if c.status != 0 && errs[i].is_none() {
            errs[i] = Some((
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

    /// The requests that store or load `[off, off+len)` at `addr` (or discard it), one
    /// per piece, tagged with `job`.
    fn requests(&self, job: usize, op: Op, addr: usize, off: u64, len: usize, out: &mut Vec<Req>) {
        for (s, o, l) in pieces(off, len as u64, self.servers.len()) {
            let moves = matches!(op, Op::Store | Op::Load);
            out.push(Req {
                job,
                server: s,
                head: self.header(s, op, o, l as usize),
                addr: if moves { addr + (o - off) as usize } else { 0 },
                len: if moves { l as usize } else { 0 },
                incoming: op == Op::Load,
            });
        }
    }

    /// Keeps every session's lease.
    fn ping(&mut self) -> Result<(), Failure> {
        let mut reqs: Vec<Req> = (0..self.servers.len())
            .map(|s| Req {
                job: 0,
                server: s,
                head: self.header(s, Op::Ping, 0, 0),
                addr: 0,
                len: 0,
                incoming: false,
            })
            .collect();
        self.exchange(&mut reqs)
            .into_iter()
            .find_map(Result::err)
            .map_or(Ok(()), Err)
    }

    fn hello(&mut self, secret: &[u8], ask: u64) -> Result<(), String> {
        let me = self
            .ep
            .name()
            .map_err(|e| format!("the endpoint has no address: {e}"))?;
        let payload = proto::encode_hello(secret, &me);
        let mut reqs: Vec<Req> = (0..self.servers.len())
            .map(|s| Req {
                job: 0,
                server: s,
                head: Header {
                    op: Op::Hello as u16,
                    off: ask,
                    len: payload.len() as u32,
                    ..Default::default()
                },
                addr: payload.as_ptr() as usize,
                len: payload.len(),
                incoming: false,
            })
            .collect();
        let replies = self.exchange(&mut reqs);
        for (s, r) in replies.into_iter().enumerate() {
            let h = r.map_err(|(e, m)| {
                if e.0 == libc::EACCES {
                    format!("{m}: the server refused the job's secret")
                } else {
                    m
                }
            })?;
            self.servers[s].session = h.session;
            self.servers[s].token = h.token;
            // The server's lease, in the reply's offset field (ms).
            self.lease_ns = self.lease_ns.min(h.off.max(1000) * 1_000_000);
        }
        Ok(())
    }

    /// Serves the jobs: every job posted is sent at once (a fault's load does not wait
    /// behind the evictor's stores), then each is answered with its own result.
    fn run(mut self, shared: Arc<Shared>) {
        let mut last_ping = attune_sys::os::now_ns();
        let mut reqs: Vec<Req> = Vec::new();
        loop {
            let bell = shared.doorbell.load(Acquire);
            reqs.clear();
            let mut ops = [None; JOBS];
            for (k, j) in shared.jobs.iter().enumerate() {
                if j.state.load(Acquire) != POSTED {
                    continue;
                }
                let op = match j.op.load(Relaxed) {
                    2 => Op::Store,
                    3 => Op::Load,
                    _ => Op::Discard,
                };
                ops[k] = Some(op);
                self.requests(
                    k,
                    op,
                    j.addr.load(Relaxed),
                    j.off.load(Relaxed),
                    j.len.load(Relaxed),
                    &mut reqs,
                );
            }
            // Every server is pinged at a quarter of the lease, busy or not (a server
            // whose units are not in use would lose the session otherwise).
            let now = attune_sys::os::now_ns();
            if now.saturating_sub(last_ping) >= self.lease_ns / 4 {
                if let Err((_, m)) = self.ping() {
                    crate::warn!("remote tier: keeping the lease failed: {m}");
                }
                last_ping = now;
            }
            if ops.iter().all(Option::is_none) {
                attune_sys::os::futex_wait(&shared.doorbell, bell, self.lease_ns / 4);
                continue;
            }
            let results = self.exchange(&mut reqs);
            let mut codes = [0i32; JOBS];
            for (r, res) in reqs.iter().zip(results) {
                if let Err((e, m)) = res {
                    if codes[r.job] == 0 {
                        codes[r.job] = e.0;
                        if e.0 != libc::ENOSPC {
                            let what = match ops[r.job] {
                                Some(Op::Store) => "a store",
                                Some(Op::Load) => "a load",
                                _ => "a discard",
                            };
                            let len = shared.jobs[r.job].len.load(Relaxed);
                            crate::warn!("remote tier: {what} of {len} bytes failed: {m}");
                        }
                    }
                }
            }
            for (k, j) in shared.jobs.iter().enumerate() {
                if ops[k].is_none() {
                    continue;
                }
                j.result.store(codes[k], Relaxed);
                if j.detached.load(Relaxed) {
                    j.state.store(FREE, Release);
                    shared.freed.fetch_add(1, Release);
                    attune_sys::os::futex_wake(&shared.freed, i32::MAX);
                } else {
                    j.state.store(DONE, Release);
                    attune_sys::os::futex_wake(&j.state, 1);
                }
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
