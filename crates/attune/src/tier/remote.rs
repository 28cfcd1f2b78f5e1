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
/// How often lost servers are asked to rejoin (while the tier is idle).
const REJOIN_NS: u64 = 2_000_000_000;
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

struct Shared {
    jobs: [Job; JOBS],
    /// Bumped at every post; the I/O thread sleeps on it.
    doorbell: AtomicU32,
    /// Bumped when a job is freed; callers waiting for a job sleep on it.
    freed: AtomicU32,
    /// Per page of the offset space: bit r set when copy r (server `(owner + r) % n`,
    /// the owner of the page's unit) holds the page's current content. Per page, not per
    /// unit: the pages of one unit are stored, discarded and refused apart, and a unit's
    /// bit once cleared by one page's discard lost its other pages (seen in
    /// bench/remote.py's random updates). Written by the I/O thread; read by stores, which
    /// must not skip writing content no server holds any more. Zero pages mapped on
    /// demand (`AtomicTable`): only the offsets in use cost memory.
    valid: attune_sys::mem::AtomicTable,
}

impl Shared {
    fn new(pages: usize) -> Result<Shared, Errno> {
        Ok(Shared {
            jobs: Default::default(),
            doorbell: AtomicU32::new(0),
            freed: AtomicU32::new(0),
            valid: attune_sys::mem::AtomicTable::new(pages)?,
        })
    }

    fn word(&self, page: u64) -> Option<&AtomicU64> {
        ((page as usize) < self.valid.len()).then(|| self.valid.get(page as usize))
    }

    /// The copies of the page at byte offset `at`.
    fn bits(&self, at: u64) -> u8 {
        self.word(at / proto::PAGE)
            .map_or(0, |v| v.load(Acquire) as u8)
    }

    /// The copies every page of `[off, off+len)` has.
    fn common(&self, off: u64, len: u64) -> u8 {
        (off / proto::PAGE..(off + len).div_ceil(proto::PAGE))
            .fold(0xff, |m, p| m & self.bits(p * proto::PAGE))
    }

    /// Whether every page of `[off, off+len)` has a copy on some server.
    fn held(&self, off: u64, len: usize) -> bool {
        (off / proto::PAGE..(off + len as u64).div_ceil(proto::PAGE))
            .all(|p| self.bits(p * proto::PAGE) != 0)
    }

    /// Applies `f` to the copy bits of every page of `[off, off+len)`.
    fn update(&self, off: u64, len: u64, f: impl Fn(&AtomicU64)) {
        for p in off / proto::PAGE..(off + len).div_ceil(proto::PAGE) {
            if let Some(v) = self.word(p) {
                f(v);
            }
        }
    }
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
    /// Which copy of its units it moves.
    replica: u8,
}

/// A job's place: its number, its buffer and the tier offset the buffer starts at.
#[derive(Clone, Copy)]
struct At {
    job: usize,
    addr: usize,
    off: u64,
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
    /// Copies of each unit (at most the number of servers).
    replicas: usize,
    /// Servers that stopped answering: no request goes to them until they rejoin.
    down: Vec<bool>,
    secret: Vec<u8>,
    /// Bytes asked of each server at hello.
    ask: u64,
}

/// Whether an error means the server (or the way to it) is lost, not that it refused.
fn is_loss(e: Errno) -> bool {
    !matches!(e.0, libc::ENOSPC)
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
        // Receives first, then the sends in passes: a send the provider cannot take yet
        // (EAGAIN: its connection to a dead server is being retried) waits for the next
        // pass, and does not hold up the requests to the other servers.
        let mut iovs: Vec<Vec<(usize, usize)>> = Vec::with_capacity(n);
        let mut unsent: Vec<usize> = Vec::with_capacity(n);
        for i in 0..n {
            let r = &reqs[i];
            let mut riov = vec![(in_hdr[i].as_mut_ptr() as usize, proto::HEADER)];
            let mut siov = vec![(out_hdr[i].as_ptr() as usize, proto::HEADER)];
            if r.len > 0 {
                if r.incoming {
                    riov.push((r.addr, r.len));
                } else {
                    siov.push((r.addr, r.len));
                }
            }
            iovs.push(siov);
            if let Err(e) = self.ep.recvv(&riov, Some(r.head.seq), &mut recv_ctx[i]) {
                errs[i] = Some(fabric_err(e, "cannot post a receive"));
                continue;
            }
            posted[i] += 1;
            unsent.push(i);
        }
        while !unsent.is_empty() {
            let late = attune_sys::os::now_ns() >= deadline;
            unsent.retain(|&i| {
                let fi = self.servers[reqs[i].server].fi;
                match self.ep.sendv(&iovs[i], fi, None, &mut send_ctx[i]) {
                    Ok(()) => {
                        posted[i] += 1;
                        false
                    }
                    Err(Errno(libc::EAGAIN)) if !late => true,
                    Err(e) => {
                        let name = &self.servers[reqs[i].server].name;
                        errs[i] = Some(fabric_err(e, &format!("cannot send to {name}")));
                        // The receive stays posted: cancelled below with the others.
                        false
                    }
                }
            });
            if !unsent.is_empty() {
                if let Ok(Some(c)) = self.ep.poll(0) {
                    Self::complete(c, &recv_ctx, &send_ctx, &mut posted, &mut errs);
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
        if posted.iter().any(|&p| p > 0) {
            // Operations still posted (a failed or timed-out request): cancel them and
            // leak their contexts and buffers, which the provider may still name in a
            // late completion or write into. The other requests' results stand.
            for (i, c) in recv_ctx.iter_mut().enumerate() {
                if posted[i] > 0 {
                    self.ep.cancel(c);
                }
            }
            std::mem::forget(recv_ctx);
            std::mem::forget(send_ctx);
            std::mem::forget(in_hdr);
            std::mem::forget(out_hdr);
            std::mem::forget(iovs);
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

    /// The server of replica `r` of the units of a piece whose owner is `s`.
    fn slot(&self, s: usize, r: usize) -> usize {
        (s + r) % self.servers.len()
    }

    /// The request to server `s` that moves `[o, o+l)` of job `at` (copy `replica`).
    fn request(&self, at: At, s: usize, replica: usize, op: Op, o: u64, l: u64) -> Req {
        let moves = matches!(op, Op::Store | Op::Load);
        let At { job, addr, off } = at;
        Req {
            job,
            server: s,
            head: self.header(s, op, o, l as usize),
            addr: if moves { addr + (o - off) as usize } else { 0 },
            len: if moves { l as usize } else { 0 },
            incoming: op == Op::Load,
            replica: replica as u8,
        }
    }

    /// The requests of a store or discard of `[off, off+len)`: one per piece and live
    /// replica. The pages' copies are stale from now until a store's reply (a discard:
    /// for good).
    fn write_requests(&self, sh: &Shared, at: At, op: Op, len: usize, out: &mut Vec<Req>) {
        let off = at.off;
        sh.update(off, len as u64, |v| v.store(0, Release));
        for (s, o, l) in pieces(off, len as u64, self.servers.len()) {
            for r in 0..self.replicas {
                let t = self.slot(s, r);
                if !self.down[t] {
                    out.push(self.request(at, t, r, op, o, l));
                }
            }
        }
    }

    /// The requests of a load of `[o, o+l)` (within a job at `off`): from the first live
    /// copy that holds every page of a piece, page by page where none holds them all.
    /// Err: a page no live server holds (its copies were on lost servers).
    fn load_requests(
        &self,
        sh: &Shared,
        at: At,
        o: u64,
        l: u64,
        out: &mut Vec<Req>,
    ) -> Result<(), u64> {
        for (s, po, pl) in pieces(o, l, self.servers.len()) {
            let all = sh.common(po, pl);
            let pick = |bits: u8| {
                (0..self.replicas).find(|&r| bits & (1 << r) != 0 && !self.down[self.slot(s, r)])
            };
            if let Some(r) = pick(all) {
                out.push(self.request(at, self.slot(s, r), r, Op::Load, po, pl));
                continue;
            }
            let mut a = po;
            while a < po + pl {
                let r = pick(sh.bits(a)).ok_or(a)?;
                // The run of pages this copy holds, from a.
                let mut b = a + proto::PAGE;
                while b < po + pl && pick(sh.bits(b)) == Some(r) {
                    b += proto::PAGE;
                }
                out.push(self.request(at, self.slot(s, r), r, Op::Load, a, b - a));
                a = b;
            }
        }
        Ok(())
    }

    /// A server stopped answering: nothing more goes to it, and its copies no longer
    /// count (it may come back empty, or with a session that expired).
    fn lose(&mut self, sh: &Shared, t: usize, why: &str) {
        if self.down[t] {
            return;
        }
        self.down[t] = true;
        let n = self.servers.len();
        for p in 0..sh.valid.len() {
            let v = sh.valid.get(p);
            if v.load(Relaxed) == 0 {
                continue;
            }
            let s = owner(p as u64 * proto::PAGE / UNIT, n);
            for r in 0..self.replicas {
                if (s + r) % n == t {
                    v.fetch_and(!(1u64 << r), AcqRel);
                }
            }
        }
        let left = if self.replicas > 1 {
            format!("the other {} cop(ies) serve", self.replicas - 1)
        } else {
            "pages held only there are lost".to_string()
        };
        crate::warn!(
            "remote tier: server {} lost ({why}); {left}",
            self.servers[t].name
        );
    }

    /// Keeps every live server's session: a server that does not answer is lost.
    fn ping(&mut self, sh: &Shared) {
        let mut reqs: Vec<Req> = (0..self.servers.len())
            .filter(|&s| !self.down[s])
            .map(|s| Req {
                job: 0,
                server: s,
                head: self.header(s, Op::Ping, 0, 0),
                addr: 0,
                len: 0,
                incoming: false,
                replica: 0,
            })
            .collect();
        let res = self.exchange(&mut reqs);
        for (q, r) in reqs.iter().zip(res) {
            if let Err((_, m)) = r {
                self.lose(sh, q.server, &m);
            }
        }
    }

    /// Opens a session on each server of `which`; per server, an error message.
    fn hello(&mut self, which: &[usize]) -> Vec<Result<(), String>> {
        let me = match self.ep.name() {
            Ok(me) => me,
            Err(e) => {
                return which
                    .iter()
                    .map(|_| Err(format!("the endpoint has no address: {e}")))
                    .collect()
            }
        };
        let payload = proto::encode_hello(&self.secret, &me);
        let mut reqs: Vec<Req> = which
            .iter()
            .map(|&s| Req {
                job: 0,
                server: s,
                head: Header {
                    op: Op::Hello as u16,
                    off: self.ask,
                    len: payload.len() as u32,
                    ..Default::default()
                },
                addr: payload.as_ptr() as usize,
                len: payload.len(),
                incoming: false,
                replica: 0,
            })
            .collect();
        let replies = self.exchange(&mut reqs);
        which
            .iter()
            .zip(replies)
            .map(|(&s, r)| {
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
                Ok(())
            })
            .collect()
    }

    /// Lost servers that answer again get a new session and take copies from now on
    /// (they hold none of the old ones). Tried with a short deadline, while idle.
    fn rejoin(&mut self) {
        let lost: Vec<usize> = (0..self.servers.len()).filter(|&s| self.down[s]).collect();
        if lost.is_empty() {
            return;
        }
        let full = self.timeout_ns;
        self.timeout_ns = full.min(500_000_000);
        let res = self.hello(&lost);
        self.timeout_ns = full;
        for (s, r) in lost.into_iter().zip(res) {
            if r.is_ok() {
                self.down[s] = false;
                crate::warn!("remote tier: server {} rejoined (empty: copies are made again as pages are stored)", self.servers[s].name);
            }
        }
    }

    /// Serves the posted jobs `ops`: every request of every job at once (a fault's load
    /// does not wait behind the evictor's stores), loads retried on the next copy when a
    /// server is lost. Returns each job's result (0 or an errno value).
    fn serve(&mut self, sh: &Shared, ops: &[Option<Op>; JOBS]) -> [i32; JOBS] {
        let mut codes = [0i32; JOBS];
        let mut reqs: Vec<Req> = Vec::new();
        let job = |k: usize| {
            let j = &sh.jobs[k];
            (
                j.addr.load(Relaxed),
                j.off.load(Relaxed),
                j.len.load(Relaxed),
            )
        };
        let what = |op: Op| match op {
            Op::Store => "a store",
            Op::Load => "a load",
            _ => "a discard",
        };
        for (k, op) in ops.iter().enumerate() {
            let Some(op) = *op else { continue };
            let (addr, off, len) = job(k);
            if op == Op::Load {
                let at = At { job: k, addr, off };
                if let Err(bad) = self.load_requests(sh, at, off, len as u64, &mut reqs) {
                    crate::warn!("remote tier: a load of {len} bytes failed: no live server holds the page at offset {bad:#x}");
                    codes[k] = libc::EIO;
                }
            } else {
                self.write_requests(sh, At { job: k, addr, off }, op, len, &mut reqs);
            }
        }
        // Rounds: a load whose server is lost is asked again of the next copy.
        for _round in 0..=self.replicas {
            if reqs.is_empty() {
                break;
            }
            let results = self.exchange(&mut reqs);
            let mut again: Vec<Req> = Vec::new();
            let mut first_err: [Option<Failure>; JOBS] = Default::default();
            for (q, res) in reqs.iter().zip(results) {
                let op = Op::from_u16(q.head.op).unwrap_or(Op::Discard);
                match res {
                    Ok(_) if op == Op::Store => {
                        let (o, l) = (q.head.off, q.head.len as u64);
                        sh.update(o, l, |v| {
                            v.fetch_or(1 << q.replica, AcqRel);
                        });
                    }
                    Ok(_) => {}
                    Err((e, m)) => {
                        if is_loss(e) {
                            self.lose(sh, q.server, &m);
                        }
                        if op == Op::Load && codes[q.job] == 0 {
                            let (addr, off, _) = job(q.job);
                            let at = At {
                                job: q.job,
                                addr,
                                off,
                            };
                            let (o, l) = (q.head.off, q.head.len as u64);
                            if self.load_requests(sh, at, o, l, &mut again).is_err() {
                                crate::warn!(
                                    "remote tier: a load of {} bytes failed: {m}",
                                    q.head.len
                                );
                                codes[q.job] = e.0;
                            }
                        } else if op == Op::Store {
                            first_err[q.job].get_or_insert((e, m));
                        }
                    }
                }
            }
            // A store succeeds when every unit has a copy somewhere (fewer copies than
            // asked while a server is lost or full); otherwise its pages stay in DRAM.
            for (k, op) in ops.iter().enumerate() {
                if *op == Some(Op::Store) && codes[k] == 0 {
                    let (_, off, len) = job(k);
                    if !sh.held(off, len) {
                        let (e, m) = first_err[k]
                            .take()
                            .unwrap_or((Errno(libc::EIO), "no copy made".into()));
                        if e.0 != libc::ENOSPC {
                            crate::warn!(
                                "remote tier: {} of {len} bytes failed: {m}",
                                what(Op::Store)
                            );
                        }
                        codes[k] = e.0;
                    }
                }
            }
            // Only the retries of loads that have not failed go again.
            again.retain(|q| codes[q.job] == 0);
            reqs = again;
        }
        codes
    }

    fn run(mut self, shared: Arc<Shared>) {
        let mut last_ping = attune_sys::os::now_ns();
        let mut last_rejoin = last_ping;
        loop {
            let bell = shared.doorbell.load(Acquire);
            let mut ops = [None; JOBS];
            for (k, j) in shared.jobs.iter().enumerate() {
                if j.state.load(Acquire) == POSTED {
                    ops[k] = Some(match j.op.load(Relaxed) {
                        2 => Op::Store,
                        3 => Op::Load,
                        _ => Op::Discard,
                    });
                }
            }
            // Every live server is pinged at a quarter of the lease, busy or not (a
            // server whose units are not in use would lose the session otherwise).
            let now = attune_sys::os::now_ns();
            if now.saturating_sub(last_ping) >= self.lease_ns / 4 {
                self.ping(&shared);
                last_ping = now;
            }
            if ops.iter().all(Option::is_none) {
                if now.saturating_sub(last_rejoin) >= REJOIN_NS {
                    self.rejoin();
                    last_rejoin = now;
                }
                attune_sys::os::futex_wait(
                    &shared.doorbell,
                    bell,
                    (self.lease_ns / 4).min(REJOIN_NS),
                );
                continue;
            }
            let codes = self.serve(&shared, &ops);
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
    pub fn new(cfg: &TierConfig, space: u64) -> Result<RemoteTier, String> {
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
        let n = servers.len().max(1);
        let replicas = (cfg.replicas as usize).clamp(1, n);
        let mut c = Client {
            ep,
            seq: 0,
            timeout_ns: cfg.timeout_ms * 1_000_000,
            lease_ns: 60_000_000_000,
            replicas,
            down: vec![false; servers.len()],
            servers,
            secret,
            // Each server holds `replicas` shares of the capacity over n servers.
            ask: cfg.capacity.saturating_mul(replicas as u64) / n as u64 + UNIT,
        };
        let all: Vec<usize> = (0..c.servers.len()).collect();
        for r in c.hello(&all) {
            r.map_err(|e| format!("tier '{}': {e}", cfg.name))?;
        }
        crate::info!(
            "tier '{}': {} memory server(s) over libfabric '{}', {} cop(ies) of each page",
            cfg.name,
            c.servers.len(),
            c.ep.provider(),
            replicas
        );
        let shared = Arc::new(
            Shared::new(space.div_ceil(proto::PAGE) as usize)
                .map_err(|e| format!("tier '{}': its copy table: {e}", cfg.name))?,
        );
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
            // Clean content the servers hold already is not sent again, unless the
            // copies were on servers since lost.
            if already_there(st) && self.shared.held(off, len) {
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
        super::load_bounced(
            io,
            region_uffd,
            dst,
            len,
            &mut |b| self.post(Op::Load, b, off, len, false),
            seen,
        )
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
