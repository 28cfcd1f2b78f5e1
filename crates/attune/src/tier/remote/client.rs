//! The remote tier's I/O thread: it owns the libfabric endpoint and every fabric call
//! (the fabric library allocates and locks, which the fault path must not). It turns the
//! posted jobs into requests to the servers that own their units
//! (`attune_policy::spread`), sends them all at once, and keeps each server's session:
//! hello with the job's secret, pings at a quarter of the lease, lost servers asked back.

use super::jobs::{Codes, Ops, Shared, MAX_JOBS};
use crate::config::TierConfig;
use attune_policy::spread;
use attune_proto::remote::{self as proto, Header, Op};
use attune_sys::fabric::{Endpoint, OpContext};
use attune_sys::Errno;
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release};
use std::sync::Arc;

/// Pages are spread over the servers by units of this size (`attune_policy::spread`).
pub const UNIT: u64 = 64 << 10;
/// How long the I/O thread polls for a reply before it sleeps (`Endpoint::wait`).
const SPIN_NS: u64 = 100_000;
/// How often lost servers are asked to rejoin (while the tier is idle).
const REJOIN_NS: u64 = 2_000_000_000;
/// How long a lost server's answer to the hello asking it back is waited for: the
/// I/O thread serves no job meanwhile.
const REJOIN_WAIT_NS: u64 = 500_000_000;
/// How long the exit's bye waits for the servers' answers (it is best effort: a server
/// that misses it frees the session at the end of its lease).
const BYE_WAIT_NS: u64 = 250_000_000;
/// Copies are made again (`rebuild_step`) at most this many bytes at a time, between
/// jobs: a fault waits behind one batch at most (two round trips).
const REBUILD_BATCH: usize = 256 << 10;
/// Pages of the copy table looked at in one step at most (a few hundred µs).
const REBUILD_SCAN: usize = 1 << 16;
/// A request unanswered this long (at most half the timeout) makes the I/O thread move
/// to a new endpoint (`reconnect`) and send it again from there. A reset connection
/// loses the replies that were on it, and libfabric 1.17's net provider did not make
/// that path again within seconds: the runtime lost its only server and died of
/// SIGBUS (docs/design/remote.md, "A reset connection"). A new endpoint is a new peer
/// to the provider on both sides. The server keeps a session whose reply failed for
/// 5 s (memserver's FAILED_GRACE_NS): this, plus a hello, must stay below that.
const RECONNECT_NS: u64 = 2_000_000_000;

/// An error and its message (naming the server).
type Failure = (Errno, String);

/// One request of an exchange.
#[derive(Clone)]
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
pub(super) struct Client {
    ep: Endpoint,
    /// The provider asked for, to open a new endpoint (`reconnect`).
    provider: String,
    /// Within a hello: its exchange does not reconnect (a hello's payload names the
    /// endpoint it was made on; `reconnect` says hello itself).
    no_reconnect: bool,
    /// Servers that did not take their session over from a new endpoint: marked down at
    /// once, their copies forgotten by `settle` (which has the shared state).
    pending_loss: Vec<(usize, String)>,
    servers: Vec<Server>,
    seq: u64,
    timeout_ns: u64,
    lease_ns: u64,
    /// Copies of each unit (at most the number of servers).
    replicas: usize,
    /// Servers that stopped answering: no request goes to them until they rejoin.
    down: Vec<bool>,
    /// When each server was lost (`now_ns`), for `rehome`.
    down_since: Vec<u64>,
    /// The server of copy r of the units server s owns: `place[s * replicas + r]`
    /// (`attune_policy::spread::first_place`, changed by `rehome`).
    place: Vec<usize>,
    /// A server lost this long is given up on (`rehome`; 0: never).
    rehome_ns: u64,
    secret: Vec<u8>,
    /// Bytes asked of each server at hello.
    ask: u64,
    /// The process is exiting and the servers were told (`leave`): no server is asked
    /// back any more.
    leaving: bool,
    /// Copies being made again after a server rejoined (`rebuild_step`).
    rebuild: Option<Rebuild>,
    /// Where the copies being made again pass (REBUILD_BATCH bytes, allocated at first use).
    rebuild_buf: Vec<u8>,
    /// The most jobs found posted at once (said at exit: one at the `concurrency` limit
    /// says that callers waited for a free job).
    peak_jobs: usize,
}

/// A pass over the copy table that makes again the copies of live servers that lack
/// them.
struct Rebuild {
    /// The next page to look at.
    next: usize,
    bytes: u64,
    started: u64,
}

/// Whether an error means the server (or the way to it) is lost, not that it refused.
fn is_loss(e: Errno) -> bool {
    !matches!(e.0, libc::ENOSPC)
}

/// Times a request whose connection broke is sent again (within its timeout).
const RESENDS: usize = 3;

/// Whether a failed transfer may succeed on a new connection: the provider broke or
/// cancelled the connection under it (libfabric 1.17's tcp;ofi_rxm reports a reset
/// socket as ENOTCONN, and cancels what was posted on it). A refused connection (the
/// server's port is closed), a timeout and a server's own status are not.
fn is_transient(e: Errno) -> bool {
    matches!(
        e.0,
        libc::ENOTCONN | libc::ECONNRESET | libc::ECONNABORTED | libc::EPIPE | libc::ECANCELED
    )
}

/// The requests of an exchange sent again (`Client::resend`): to each server, every
/// request from the first one that must be sent again on, in their order, answered or
/// not. A server applies a session's requests in the order they arrive, and the
/// exchange's are in posting order (`Shared::in_order`): one sent again alone after a
/// later one was applied would undo it (a discard sent again after the store that
/// followed it to the same range). Every request may be sent twice (a load reads, a store
/// writes the same bytes at the same place, a discard drops).
fn resent(servers: &[usize], retry: &[bool], n: usize) -> Vec<usize> {
    let mut first = vec![usize::MAX; n];
    for (i, (&s, &r)) in servers.iter().zip(retry).enumerate() {
        if r && first[s] == usize::MAX {
            first[s] = i;
        }
    }
    (0..servers.len())
        .filter(|&i| i >= first[servers[i]])
        .collect()
}

/// The first discard of an exchange that its server answered and that a store to the
/// same server and overlapping offsets follows: where `ATTUNE_INJECT=discard-reply-lost`
/// takes the reply for lost, the case `resent` exists for.
fn discard_then_store(reqs: &[Req], out: &[Result<Header, Failure>]) -> Option<usize> {
    let overlap =
        |a: &Header, b: &Header| a.off < b.off + b.len as u64 && b.off < a.off + a.len as u64;
    (0..reqs.len()).find(|&i| {
        reqs[i].head.op == Op::Discard as u16
            && out[i].is_ok()
            && reqs[i + 1..].iter().any(|q| {
                q.server == reqs[i].server
                    && q.head.op == Op::Store as u16
                    && overlap(&q.head, &reqs[i].head)
            })
    })
}

/// Whether a store among the posted jobs `ops` overlaps a posted discard's offsets.
fn store_over_discard(sh: &Shared, ops: &Ops) -> bool {
    let range = |k: usize| {
        let (_, off, len) = sh.job(k);
        (off, off + len as u64)
    };
    let of = |op: Op| (0..ops.len()).filter(move |&k| ops[k] == Some(op));
    of(Op::Discard).any(|d| {
        let (a, b) = range(d);
        of(Op::Store).any(|st| {
            let (c, e) = range(st);
            a < e && c < b
        })
    })
}

/// Server `name` (HOST:PORT) in `ep`'s address vector: its address there, or an error
/// naming it.
fn resolve(ep: &mut Endpoint, name: &str) -> Result<u64, String> {
    let (h, p) = name
        .rsplit_once(':')
        .ok_or_else(|| format!("'{name}' is not HOST:PORT"))?;
    ep.resolve(h, p).map_err(|e| format!("server {name}: {e}"))
}

impl Client {
    /// Opens the endpoint, resolves every server of `cfg` and says hello to each: an
    /// error names the tier and the server.
    pub(super) fn connect(cfg: &TierConfig, secret: Vec<u8>) -> Result<Client, String> {
        let mut c = Client::open(cfg, secret)?;
        let all: Vec<usize> = (0..c.servers.len()).collect();
        for r in c.hello(&all, c.timeout_ns) {
            r.map_err(|e| format!("tier '{}': {e}", cfg.name))?;
        }
        crate::info!(
            "tier '{}': {} memory server(s) over libfabric '{}', {} cop(ies) of each page",
            cfg.name,
            c.servers.len(),
            c.ep.provider(),
            c.replicas
        );
        Ok(c)
    }

    /// In a forked child: an endpoint of its own, and on each server the session cloned
    /// for it before the fork (`clones`), taken over by a hello that names it. A server
    /// without a clone (the parent held no pages, or it did not answer the clone) gets a
    /// new session, and its copies do not count; one that does not answer is lost (its
    /// copies then come from the others, or a load of a page only it held fails loudly).
    /// Err only when the endpoint cannot be opened.
    pub(super) fn resume(
        cfg: &TierConfig,
        secret: Vec<u8>,
        clones: &[Option<(u64, [u8; 16])>],
        sh: &Shared,
    ) -> Result<Client, String> {
        let mut c = Client::open(cfg, secret)?;
        let place = sh.place.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if place.len() == c.place.len() {
            c.place = place;
        }
        let (mut attach, mut fresh) = (Vec::new(), Vec::new());
        for s in 0..c.servers.len() {
            match clones.get(s).copied().flatten() {
                Some((id, token)) => {
                    c.servers[s].session = id;
                    c.servers[s].token = token;
                    attach.push(s);
                }
                None => {
                    c.forget(sh, s);
                    fresh.push(s);
                }
            }
        }
        let hellos = c.hello(&attach, c.timeout_ns);
        for (s, r) in attach.clone().into_iter().zip(hellos) {
            if let Err(m) = r {
                crate::warn!(
                    "remote tier: server {} did not give this forked child its pages ({m})",
                    c.servers[s].name
                );
                c.servers[s].session = 0;
                c.servers[s].token = [0; 16];
                c.forget(sh, s);
                fresh.push(s);
            }
        }
        let hellos = c.hello(&fresh, c.timeout_ns);
        for (s, r) in fresh.clone().into_iter().zip(hellos) {
            if let Err(m) = r {
                c.lose(sh, s, &m);
            }
        }
        Ok(c)
    }

    /// The endpoint and the servers resolved, no session yet.
    fn open(cfg: &TierConfig, secret: Vec<u8>) -> Result<Client, String> {
        let mut ep = Endpoint::open(&cfg.provider, None).map_err(|e| {
            format!(
                "tier '{}': libfabric provider '{}': {e}",
                cfg.name, cfg.provider
            )
        })?;
        let mut servers = Vec::new();
        for s in cfg.server_list() {
            let fi = resolve(&mut ep, s).map_err(|e| format!("tier '{}': {e}", cfg.name))?;
            servers.push(Server {
                name: s.to_string(),
                fi,
                session: 0,
                token: [0; 16],
            });
        }
        let n = servers.len().max(1);
        let replicas = (cfg.replicas as usize).clamp(1, n);
        // Each server holds `replicas` shares of the capacity over n servers; over n - 1
        // once a lost one's copies are placed on the others (`rehome`). The ask is a
        // bound, not a reservation (memserver's `Store::open`).
        let over = if cfg.rehome_ms > 0 && replicas < n {
            n - 1
        } else {
            n
        };
        // Requests are numbered from a random start, and a reply's tag is its request's
        // number: replies a server still sends to a dead runtime whose address (a reused
        // port) this endpoint now has match none of this endpoint's receives. Numbered
        // from 1 in every runtime, they would land in the buffers of its requests.
        let mut start = [0u8; 8];
        attune_sys::os::random_bytes(&mut start)
            .map_err(|e| format!("tier '{}': getrandom: {e}", cfg.name))?;
        Ok(Client {
            ep,
            provider: cfg.provider.clone(),
            no_reconnect: false,
            pending_loss: Vec::new(),
            seq: u64::from_ne_bytes(start) >> 1,
            timeout_ns: cfg.timeout_ms * 1_000_000,
            lease_ns: 60_000_000_000,
            replicas,
            down: vec![false; servers.len()],
            down_since: vec![0; servers.len()],
            place: spread::first_place(servers.len(), replicas),
            rehome_ns: cfg.rehome_ms.saturating_mul(1_000_000),
            servers,
            secret,
            ask: cfg.capacity.saturating_mul(replicas as u64) / over as u64 + UNIT,
            leaving: false,
            rebuild: None,
            rebuild_buf: Vec::new(),
            peak_jobs: 0,
        })
    }

    /// Sends every request of `reqs` at once and waits for their replies, up to `wait_ns`
    /// (the timeout, or less for a hello: `hello`). Each request's payload goes out of
    /// (store, hello) or comes back into (load) its buffer. Returns each request's reply
    /// header or error.
    ///
    /// A request whose connection broke under it (`is_transient`), or unanswered for
    /// RECONNECT_NS (half the timeout at most), is sent again from a new endpoint
    /// (`reconnect`), with the later requests to its server (`resent`), with a new
    /// number (at most `RESENDS` times): the server, which
    /// keeps the session, hands it to the new endpoint with a new token, so that what
    /// the old one sent and is still on its way is refused (a late store of a page's
    /// older contents; memserver's `Store::attach`). Every request may be sent twice (a load reads, a store writes the same bytes at the same place, a
    /// discard drops). Before, a broken connection lost the server (with one copy, the
    /// program's pages there: docs/design/remote.md, "TCP without ofi_rxm"), and a resend
    /// from the old endpoint let a late store overwrite newer contents ("Requests from an
    /// old endpoint"). A hello's own exchange resends from the same endpoint (its payload
    /// names it; a takeover's hello sent twice gets the same token). The hello and, once
    /// a server took its session over, the resends each wait up to the timeout: a server
    /// is lost after min(2 s, timeout/2) without an answer and then a timeout without an
    /// answer to its hello.
    fn exchange(&mut self, reqs: &mut [Req], wait_ns: u64) -> Vec<Result<Header, Failure>> {
        let start = attune_sys::os::now_ns();
        let mut deadline = start + wait_ns;
        let silent = if self.no_reconnect {
            deadline
        } else {
            start + (wait_ns / 2).min(RECONNECT_NS)
        };
        let mut out = self.exchange_once(reqs, silent);
        if crate::inject::armed(crate::inject::Point::DiscardReplyLost) {
            let i = discard_then_store(reqs, &out);
            if let Some(i) =
                i.filter(|_| crate::inject::from(crate::inject::Point::DiscardReplyLost))
            {
                crate::info!("remote tier: a discard's reply taken for a broken connection (ATTUNE_INJECT=discard-reply-lost)");
                out[i] = Err((
                    Errno(libc::ECONNRESET),
                    "injected (discard-reply-lost)".into(),
                ));
            }
        }
        for _ in 0..RESENDS {
            let late =
                |r: &Result<Header, Failure>| matches!(r, Err((e, _)) if e.0 == libc::ETIMEDOUT);
            let retry: Vec<bool> = out
                .iter()
                .map(|r| match r {
                    Err((e, _)) => is_transient(*e) || (late(r) && !self.no_reconnect),
                    Ok(_) => false,
                })
                .collect();
            let servers: Vec<usize> = reqs.iter().map(|q| q.server).collect();
            let again: Vec<usize> = resent(&servers, &retry, self.servers.len())
                .into_iter()
                .filter(|&i| !self.down[reqs[i].server])
                .collect();
            if again.is_empty() || attune_sys::os::now_ns() >= deadline {
                break;
            }
            if !self.no_reconnect {
                // Each wait for a server is a timeout long: the takeover's hello's, and
                // after a server took the session over (it is alive), the resends'. A
                // server paused for 2.6 s (less than the timeout) was lost when the hello
                // and the resends shared what was left of the first one
                // (`test_a_paused_server_loses_nothing`).
                let now = attune_sys::os::now_ns();
                if self.reconnect(now + self.timeout_ns) {
                    deadline = attune_sys::os::now_ns() + self.timeout_ns;
                }
            }
            // Not to the servers that did not take their session over.
            let again: Vec<usize> = again
                .into_iter()
                .filter(|&i| !self.down[reqs[i].server])
                .collect();
            // Sent with the session's token now (a new one after a takeover).
            let mut sub: Vec<Req> = again.iter().map(|&i| reqs[i].clone()).collect();
            for q in sub.iter_mut().filter(|q| q.head.op != Op::Hello as u16) {
                q.head.token = self.servers[q.server].token;
            }
            let res = self.exchange_once(&mut sub, deadline);
            for (i, r) in again.into_iter().zip(res) {
                out[i] = r;
            }
        }
        out
    }

    /// Opens a new endpoint and says hello from it to every live server, naming its
    /// session: the server sends the session's replies there from now on, its pages kept,
    /// under a new token (memserver's `Store::attach`). A server that does not take it over
    /// before `deadline` is lost (`pending_loss`). The old endpoint is closed, and with
    /// it what a timed-out exchange left posted there. Where no new endpoint can be
    /// had, the old one stays. Returns whether some server took its session over.
    fn reconnect(&mut self, deadline: u64) -> bool {
        let mut ep = match Endpoint::open(&self.provider, None) {
            Ok(ep) => ep,
            Err(e) => {
                crate::warn!("remote tier: no new endpoint for unanswered requests ({e})");
                return false;
            }
        };
        let fis: Result<Vec<u64>, String> = self
            .servers
            .iter()
            .map(|s| resolve(&mut ep, &s.name))
            .collect();
        let fis = match fis {
            Ok(fis) => fis,
            Err(e) => {
                crate::warn!("remote tier: no new endpoint for unanswered requests ({e})");
                return false;
            }
        };
        self.ep = ep;
        for (s, fi) in self.servers.iter_mut().zip(fis) {
            s.fi = fi;
        }
        let live: Vec<usize> = (0..self.servers.len())
            .filter(|&s| !self.down[s] && self.servers[s].session != 0)
            .collect();
        let left = deadline.saturating_sub(attune_sys::os::now_ns());
        let res = self.hello(&live, left.max(1_000_000));
        let mut moved = 0;
        for (s, r) in live.into_iter().zip(res) {
            match r {
                Ok(()) => moved += 1,
                Err(m) => {
                    self.mark_down(s);
                    self.pending_loss.push((
                        s,
                        format!("its session could not be taken over from a new endpoint: {m}"),
                    ));
                }
            }
        }
        crate::info!("remote tier: requests unanswered; moved to a new endpoint ({moved} session(s) taken over)");
        moved > 0
    }

    /// Forgets the copies of the servers `reconnect` lost (already down), and says so.
    fn settle(&mut self, sh: &Shared) {
        for (t, why) in std::mem::take(&mut self.pending_loss) {
            self.drop_copies(sh, t, &why);
        }
    }

    /// One exchange of `reqs` (`exchange`), until `deadline`.
    fn exchange_once(&mut self, reqs: &mut [Req], deadline: u64) -> Vec<Result<Header, Failure>> {
        let n = reqs.len();
        let began = attune_sys::os::now_ns();
        // The messages say how long this exchange waited (not the configured timeout).
        let waited_ms = || attune_sys::os::now_ns().saturating_sub(began) / 1_000_000;
        let mut send_ctx: Vec<OpContext> = (0..n).map(|_| OpContext::default()).collect();
        let mut recv_ctx: Vec<OpContext> = (0..n).map(|_| OpContext::default()).collect();
        let mut out_hdr: Vec<[u8; proto::HEADER]> = Vec::with_capacity(n);
        let mut in_hdr: Vec<[u8; proto::HEADER]> = vec![[0u8; proto::HEADER]; n];
        for r in reqs.iter_mut() {
            self.seq = self.seq.wrapping_add(1);
            r.head.seq = self.seq;
            out_hdr.push(r.head.encode());
        }
        // Per request: operations still posted (receive and send), and its error.
        let mut posted = vec![0u8; n];
        let mut errs: Vec<Option<Failure>> = (0..n).map(|_| None).collect();
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
            // A server's requests leave in their order: after one the provider could not
            // take, the later ones to that server wait for the next pass too.
            let mut held_back = vec![false; self.servers.len()];
            unsent.retain(|&i| {
                let s = reqs[i].server;
                if held_back[s] && !late {
                    return true;
                }
                let fi = self.servers[s].fi;
                match self.ep.sendv(&iovs[i], fi, None, &mut send_ctx[i]) {
                    Ok(()) => {
                        posted[i] += 1;
                        false
                    }
                    Err(Errno(libc::EAGAIN)) if !late => {
                        held_back[s] = true;
                        true
                    }
                    Err(Errno(libc::EAGAIN)) => {
                        // The provider could not connect within the timeout.
                        let name = &self.servers[reqs[i].server].name;
                        errs[i] = Some((
                            Errno(libc::ETIMEDOUT),
                            format!(
                                "no answer in {} ms from {name} (no connection)",
                                waited_ms()
                            ),
                        ));
                        false
                    }
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
                            format!("no answer in {} ms from {name}", waited_ms()),
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
                // A reply names the session of its request (a hello's and a clone's name
                // the new one).
                Ok(h)
                    if h.session != reqs[i].head.session
                        && !matches!(Op::from_u16(h.op), Some(Op::Hello | Op::Clone)) =>
                {
                    Err((
                        Errno(libc::EPROTO),
                        format!("{name}: reply for another session"),
                    ))
                }
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
        self.place[s * self.replicas + r]
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
        for (s, o, l) in spread::pieces(
            off,
            len as u64,
            self.servers.len(),
            UNIT,
            proto::MAX_PAYLOAD as u64,
        ) {
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
        for (s, po, pl) in spread::pieces(o, l, self.servers.len(), UNIT, proto::MAX_PAYLOAD as u64)
        {
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

    /// Counts the copy a store `q` made, unless its server was lost meanwhile: a server
    /// can answer a store and then fail the exchange's takeover hello (`reconnect`), and
    /// `settle` forgets its copies before the answers are counted. A bit set after that
    /// outlived the loss: the server rejoined empty, the pass of copies made again took
    /// the page for held, and its load read zeros (CI's remote soak, a checksum
    /// mismatch; `test_a_copy_answered_by_a_server_lost_in_the_same_exchange_is_not_counted`).
    /// Returns whether it counted.
    fn mark_copy(&self, sh: &Shared, q: &Req) -> bool {
        if self.down[q.server] {
            return false;
        }
        sh.update(q.head.off, q.head.len as u64, |v| {
            v.fetch_or(1 << q.replica, AcqRel);
        });
        true
    }

    /// A server stopped answering: nothing more goes to it, and its copies no longer
    /// count (it may come back empty, or with a session that expired).
    fn lose(&mut self, sh: &Shared, t: usize, why: &str) {
        if self.down[t] {
            return;
        }
        self.mark_down(t);
        self.drop_copies(sh, t, why);
    }

    /// Server `t`, down, holds no copy that counts any more: says so.
    fn drop_copies(&self, sh: &Shared, t: usize, why: &str) {
        self.forget(sh, t);
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

    /// Server `t`'s copies no longer count.
    fn forget(&self, sh: &Shared, t: usize) {
        self.forget_slots(sh, |s, r| self.slot(s, r) == t);
    }

    /// The copies r of the units of owner s for which `gone(s, r)` no longer count.
    fn forget_slots(&self, sh: &Shared, gone: impl Fn(usize, usize) -> bool) {
        // A page whose copies are gone must fail its load loudly, as without windows.
        sh.ahead.forget();
        let n = self.servers.len();
        for p in 0..sh.valid.len() {
            let v = sh.valid.get(p);
            if v.load(Relaxed) == 0 {
                continue;
            }
            let s = spread::owner(p as u64 * proto::PAGE / UNIT, n);
            for r in 0..self.replicas {
                if gone(s, r) {
                    v.fetch_and(!(1u64 << r), AcqRel);
                }
            }
        }
    }

    /// Servers lost for `rehome_ns` are given up on: the copies placed on them go to
    /// other live servers (`attune_policy::spread::rehome`) and a pass makes them there,
    /// so that a server that does not come back leaves no page with fewer copies than
    /// asked for, and with one copy its units are stored again (on another server, not
    /// the next tier). A server back sooner keeps its place (a restart is the common
    /// loss, and its place keeps the load even); one back later is a spare that the next
    /// loss may use.
    fn rehome(&mut self, sh: &Shared) {
        if self.rehome_ns == 0 {
            return;
        }
        let now = attune_sys::os::now_ns();
        let n = self.servers.len();
        for t in 0..n {
            if !self.down[t]
                || now.saturating_sub(self.down_since[t]) < self.rehome_ns
                || !self.place.contains(&t)
            {
                continue;
            }
            let moved = spread::rehome(&self.place, n, self.replicas, t, |x| !self.down[x]);
            if moved.is_empty() {
                continue;
            }
            for &(i, x) in &moved {
                self.place[i] = x;
            }
            // Cleared when it was lost; a bit must never name a copy its new server lacks.
            self.forget_slots(sh, |s, r| {
                moved.iter().any(|&(i, _)| i == s * self.replicas + r)
            });
            *sh.place.lock().unwrap_or_else(|p| p.into_inner()) = self.place.clone();
            let mut to: Vec<&str> = moved
                .iter()
                .map(|&(_, x)| self.servers[x].name.as_str())
                .collect();
            to.sort_unstable();
            to.dedup();
            let waiting = if self.place.contains(&t) {
                " (the rest wait for it: no other server may take them)"
            } else {
                ""
            };
            crate::warn!(
                "remote tier: server {} lost for {} s: {} of its {} places go to {}{waiting}",
                self.servers[t].name,
                now.saturating_sub(self.down_since[t]) / 1_000_000_000,
                moved.len(),
                moved.len() + self.place.iter().filter(|&&x| x == t).count(),
                to.join(", ")
            );
            if self.replicas > 1 {
                self.rebuild = Some(Rebuild {
                    next: 0,
                    bytes: 0,
                    started: now,
                });
            }
        }
    }

    /// Marks server `t` lost from now.
    fn mark_down(&mut self, t: usize) {
        self.down[t] = true;
        self.down_since[t] = attune_sys::os::now_ns();
    }

    /// Keeps every live server's session: a server that does not answer is lost.
    fn ping(&mut self, sh: &Shared) {
        let mut reqs = self.to_live(Op::Ping);
        let res = self.exchange(&mut reqs, self.timeout_ns);
        self.settle(sh);
        for (q, r) in reqs.iter().zip(res) {
            if let Err((_, m)) = r {
                self.lose(sh, q.server, &m);
            }
        }
    }

    /// One request `op` without payload to every live server.
    fn to_live(&self, op: Op) -> Vec<Req> {
        (0..self.servers.len())
            .filter(|&s| !self.down[s])
            .map(|s| Req {
                job: 0,
                server: s,
                head: self.header(s, op, 0, 0),
                addr: 0,
                len: 0,
                incoming: false,
                replica: 0,
            })
            .collect()
    }

    /// Asks every live server for a copy of the session, for a forked child: per server,
    /// the copy's number and token, or none (the child then reads no page from it).
    fn clone_sessions(&mut self) -> Vec<Option<(u64, [u8; 16])>> {
        let mut reqs = self.to_live(Op::Clone);
        let res = self.exchange(&mut reqs, self.timeout_ns);
        let mut out = vec![None; self.servers.len()];
        for (q, r) in reqs.iter().zip(res) {
            match r {
                Ok(h) => out[q.server] = Some((h.session, h.token)),
                Err((_, m)) => crate::warn!(
                    "remote tier: server {} did not copy the session for a forked child ({m}): the child reads no page from it",
                    self.servers[q.server].name
                ),
            }
        }
        out
    }

    /// Opens a session on each server of `which`, waiting up to `wait_ns` for their
    /// answers; per server, an error message.
    fn hello(&mut self, which: &[usize], wait_ns: u64) -> Vec<Result<(), String>> {
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
                // A session named (a forked child's clone) is taken over; none: a new one.
                head: Header {
                    op: Op::Hello as u16,
                    session: self.servers[s].session,
                    token: self.servers[s].token,
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
        let was = std::mem::replace(&mut self.no_reconnect, true);
        let replies = self.exchange(&mut reqs, wait_ns);
        self.no_reconnect = was;
        which
            .iter()
            .zip(replies)
            .map(|(&s, r)| {
                let h = r.map_err(|(e, m)| match e.0 {
                    libc::EACCES if self.servers[s].session != 0 => {
                        format!("{m}: the server no longer holds the session")
                    }
                    libc::EACCES => format!("{m}: the server refused the job's secret"),
                    _ => m,
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
    fn rejoin(&mut self, sh: &Shared) {
        let lost: Vec<usize> = (0..self.servers.len()).filter(|&s| self.down[s]).collect();
        if lost.is_empty() {
            return;
        }
        for &s in &lost {
            self.servers[s].session = 0;
            self.servers[s].token = [0; 16];
        }
        let res = self.hello(&lost, self.timeout_ns.min(REJOIN_WAIT_NS));
        for (s, r) in lost.into_iter().zip(res) {
            if r.is_ok() {
                // It holds nothing: no bit may say otherwise, whatever set one.
                self.forget(sh, s);
                self.down[s] = false;
                if !self.place.contains(&s) {
                    // Given up on (`rehome`): a spare from now on.
                    crate::warn!("remote tier: server {} rejoined empty; its places went to the others, and it is a spare", self.servers[s].name);
                    continue;
                }
                crate::warn!("remote tier: server {} rejoined empty; its copies are made again in the background", self.servers[s].name);
                if self.replicas > 1 {
                    self.rebuild = Some(Rebuild {
                        next: 0,
                        bytes: 0,
                        started: attune_sys::os::now_ns(),
                    });
                }
            }
        }
    }

    /// Makes again, from a live copy, up to REBUILD_BATCH bytes of the copies that live
    /// servers lack (`attune_policy::spread::repair`): after a server rejoined empty, a
    /// page held by one copy only would be lost with the next server. Loads then stores,
    /// in the I/O thread between jobs: no store of the program's can come between a
    /// page's load and its copy's store, so a copy made is the page's current content.
    /// A copy whose server is down waits for it to rejoin or to be given up on
    /// (`rehome`), either of which starts a new pass.
    fn rebuild_step(&mut self, sh: &Shared) {
        let Some(next) = self.rebuild.as_ref().map(|rb| rb.next) else {
            return;
        };
        let n = self.servers.len();
        let per = proto::PAGE as usize;
        // Runs of consecutive pages with one source and one destination server:
        // (source copy, destination copy, owner, first page, pages).
        let mut runs: Vec<(usize, usize, usize, usize, usize)> = Vec::new();
        let mut taken = 0;
        let mut p = next;
        let end = sh.valid.len().min(p + REBUILD_SCAN);
        while p < end && (taken + 1) * per <= REBUILD_BATCH {
            let bits = sh.valid.get(p).load(Acquire) as u8;
            let s = spread::owner(p as u64 * proto::PAGE / UNIT, n);
            let live = |r: usize| !self.down[self.slot(s, r)];
            if let Some((from, missing)) = spread::repair(bits, self.replicas, live) {
                for to in (0..self.replicas).filter(|&r| missing & (1 << r) != 0) {
                    if (taken + 1) * per > REBUILD_BATCH {
                        break;
                    }
                    match runs.last_mut() {
                        Some(last)
                            if (last.0, last.1, last.2) == (from, to, s)
                                && last.3 + last.4 == p =>
                        {
                            last.4 += 1
                        }
                        _ => runs.push((from, to, s, p, 1)),
                    }
                    taken += 1;
                }
            }
            p += 1;
        }
        if let Some(rb) = self.rebuild.as_mut() {
            rb.next = p;
        }
        if runs.is_empty() && p >= sh.valid.len() {
            let rb = self.rebuild.take().expect("checked above");
            let secs = attune_sys::os::now_ns().saturating_sub(rb.started) as f64 / 1e9;
            crate::warn!(
                "remote tier: copies made again: {} MiB in {secs:.1} s; the live servers hold every copy that is theirs",
                rb.bytes >> 20
            );
            return;
        }
        if self.rebuild_buf.len() < REBUILD_BATCH {
            self.rebuild_buf = vec![0u8; REBUILD_BATCH];
        }
        let buf = self.rebuild_buf.as_mut_ptr() as usize;
        let mut at = 0;
        let mut loads = Vec::with_capacity(runs.len());
        let mut stores = Vec::with_capacity(runs.len());
        for &(from, to, s, first, pages) in &runs {
            let (o, l) = (first as u64 * proto::PAGE, (pages * per) as u64);
            let place = At {
                job: 0,
                addr: buf + at,
                off: o,
            };
            loads.push(self.request(place, self.slot(s, from), from, Op::Load, o, l));
            stores.push(self.request(place, self.slot(s, to), to, Op::Store, o, l));
            at += l as usize;
        }
        let res = self.exchange(&mut loads, self.timeout_ns);
        self.settle(sh);
        let mut copy = Vec::with_capacity(stores.len());
        for ((q, st), r) in loads.iter().zip(stores).zip(res) {
            match r {
                Ok(_) => copy.push(st),
                Err((e, m)) if is_loss(e) => self.lose(sh, q.server, &m),
                Err(_) => {}
            }
        }
        // Not to a server lost meanwhile.
        copy.retain(|q| !self.down[q.server]);
        let res = self.exchange(&mut copy, self.timeout_ns);
        self.settle(sh);
        for (q, r) in copy.iter().zip(res) {
            match r {
                Ok(_) => {
                    if !self.mark_copy(sh, q) {
                        continue;
                    }
                    if let Some(rb) = self.rebuild.as_mut() {
                        rb.bytes += q.head.len as u64;
                    }
                }
                Err((e, m)) if is_loss(e) => self.lose(sh, q.server, &m),
                Err((_, m)) => {
                    // A full server (or a refusal): its copies wait for pages stored anew.
                    crate::warn!(
                        "remote tier: copies not made again on server {} ({m}); they are made as pages are stored",
                        self.servers[q.server].name
                    );
                    self.rebuild = None;
                    return;
                }
            }
        }
    }

    /// Serves the posted jobs `ops`: every request of every job at once (a fault's load
    /// does not wait behind the evictor's stores), loads retried on the next copy when a
    /// server is lost. Returns each job's result (0 or an errno value).
    fn serve(&mut self, sh: &Shared, ops: &Ops) -> Codes {
        let mut codes = [0i32; MAX_JOBS];
        let mut reqs: Vec<Req> = Vec::new();
        let what = |op: Op| match op {
            Op::Store => "a store",
            Op::Load => "a load",
            _ => "a discard",
        };
        // In posting order (`Shared::in_order`): the requests go out in it.
        for k in sh.in_order(ops) {
            let Some(op) = ops[k] else { continue };
            let (addr, off, len) = sh.job(k);
            if op == Op::Load {
                let at = At { job: k, addr, off };
                if let Err(bad) = self.load_requests(sh, at, off, len as u64, &mut reqs) {
                    if !sh.is_window(k) {
                        crate::warn!("remote tier: a load of {len} bytes failed: no live server holds the page at offset {bad:#x}");
                    }
                    codes[k] = libc::EIO;
                }
            } else {
                // Windows fetched ahead that this store or discard overlaps no longer hold
                // the servers' content (docs/design/remote.md, "Windows fetched ahead").
                if !crate::inject::from(crate::inject::Point::WindowUnmarked) {
                    sh.ahead.overlaps(off, len as u64);
                }
                self.write_requests(sh, At { job: k, addr, off }, op, len, &mut reqs);
            }
        }
        // Rounds: a load whose server is lost is asked again of the next copy.
        for _round in 0..=self.replicas {
            if reqs.is_empty() {
                break;
            }
            let results = self.exchange(&mut reqs, self.timeout_ns);
            self.settle(sh);
            let mut again: Vec<Req> = Vec::new();
            let mut first_err: [Option<Failure>; MAX_JOBS] = std::array::from_fn(|_| None);
            for (q, res) in reqs.iter().zip(results) {
                let op = Op::from_u16(q.head.op).unwrap_or(Op::Discard);
                match res {
                    Ok(_) if op == Op::Store => {
                        sh.ever_stored.store(true, Relaxed);
                        self.mark_copy(sh, q);
                    }
                    Ok(_) => {}
                    Err((e, m)) => {
                        if is_loss(e) {
                            self.lose(sh, q.server, &m);
                        }
                        if op == Op::Load && codes[q.job] == 0 {
                            let (addr, off, _) = sh.job(q.job);
                            let at = At {
                                job: q.job,
                                addr,
                                off,
                            };
                            let (o, l) = (q.head.off, q.head.len as u64);
                            if self.load_requests(sh, at, o, l, &mut again).is_err() {
                                if !sh.is_window(q.job) {
                                    crate::warn!(
                                        "remote tier: a load of {} bytes failed: {m}",
                                        q.head.len
                                    );
                                }
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
                    let (_, off, len) = sh.job(k);
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

    /// The I/O thread: serves posted jobs, keeps sessions alive, asks lost servers back.
    pub(super) fn run(mut self, shared: Arc<Shared>) {
        let mut last_ping = attune_sys::os::now_ns();
        let mut last_rejoin = last_ping;
        loop {
            self.settle(&shared);
            let bell = shared.doorbell.load(Acquire);
            let mut ops = shared.posted();
            if crate::inject::armed(crate::inject::Point::DiscardReplyLost)
                && ops.contains(&Some(Op::Discard))
            {
                // Injection only: a batch with a discard waits (200 ms at most) for a
                // store to the same offsets to be posted (a freed region's offsets given
                // to the next), so both go in one exchange: the race a test cannot time.
                let until = attune_sys::os::now_ns() + 200_000_000;
                while !store_over_discard(&shared, &ops) && attune_sys::os::now_ns() < until {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                    ops = shared.posted();
                }
            }
            self.peak_jobs = self.peak_jobs.max(ops.iter().flatten().count());
            // Every live server is pinged at a quarter of the lease, busy or not (a
            // server whose units are not in use would lose the session otherwise).
            let now = attune_sys::os::now_ns();
            if now.saturating_sub(last_ping) >= self.lease_ns / 4 {
                self.ping(&shared);
                last_ping = now;
            }
            if ops.iter().all(Option::is_none) {
                if !self.leaving && now.saturating_sub(last_rejoin) >= REJOIN_NS {
                    self.rejoin(&shared);
                    self.rehome(&shared);
                    last_rejoin = now;
                }
                if self.rebuild.is_some() && !self.leaving {
                    // One batch, then the jobs posted meanwhile.
                    self.rebuild_step(&shared);
                    continue;
                }
                attune_sys::os::futex_wait(
                    &shared.doorbell,
                    bell,
                    (self.lease_ns / 4).min(REJOIN_NS),
                );
                continue;
            }
            let clone = ops.iter().position(|o| *o == Some(Op::Clone));
            let bye = ops.iter().position(|o| *o == Some(Op::Bye));
            let mut rest = ops;
            for k in [clone, bye].into_iter().flatten() {
                rest[k] = None;
            }
            if let Some(k) = bye {
                self.leave(&shared);
                let mut one = [None; MAX_JOBS];
                one[k] = Some(Op::Bye);
                shared.answer(&one, &[0; MAX_JOBS]);
                shared.mark_left();
            }
            if rest.iter().any(Option::is_some) {
                let codes = self.serve(&shared, &rest);
                shared.answer(&rest, &codes);
            }
            if let Some(k) = clone {
                self.fork(&shared, k);
            }
        }
    }

    /// The process is exiting (its last `atexit` handlers run): each live server is told
    /// to free the session's pages a grace after its last request, instead of a whole
    /// lease later, so that a server is not kept full by finished jobs. Not at once: the
    /// exit may still read a far page (a stdio buffer flushed after the handlers, a
    /// thread still running), and such a request is served and renews the session. The
    /// pings go on at a quarter of the grace, which is twice the timeout: a stalled
    /// server holds the I/O thread up to about a timeout (its takeover's hello renews the
    /// others' sessions on the way), so the healthy servers are renewed within it.
    fn leave(&mut self, sh: &Shared) {
        self.settle(sh);
        let grace = (2 * self.timeout_ns).min(self.lease_ns).max(1_000_000);
        let mut reqs = self.to_live(Op::Bye);
        for q in reqs.iter_mut() {
            q.head.off = grace / 1_000_000;
        }
        let was = std::mem::replace(&mut self.no_reconnect, true);
        let res = self.exchange(&mut reqs, self.timeout_ns.min(BYE_WAIT_NS));
        self.no_reconnect = was;
        let told = res.iter().filter(|r| r.is_ok()).count();
        let c = &sh.ahead.counts;
        crate::info!(
            "remote tier: exiting; {told} of {} server(s) free this process's pages {} ms after its last request; at most {} of its {} jobs were in flight at once; {} KiB fetched ahead, {} KiB of it placed, {} window(s) dropped as stale, {} did not match their hashes",
            reqs.len(),
            grace / 1_000_000,
            self.peak_jobs,
            sh.limit(),
            c.fetched.load(Relaxed) >> 10,
            c.used.load(Relaxed) >> 10,
            c.stale.load(Relaxed),
            c.mismatched.load(Relaxed)
        );
        self.lease_ns = grace;
        self.leaving = true;
    }

    /// A fork is about to happen (job `k`, posted by `RemoteTier::prepare_fork` with
    /// the runtime quiesced): the sessions are cloned for the child when the parent
    /// holds pages (the job's buffer is 1), then this thread parks outside the fabric
    /// library until the parent's side of the fork is over.
    fn fork(&mut self, sh: &Shared, k: usize) {
        let clones = if sh.job(k).0 != 0 {
            self.clone_sessions()
        } else {
            vec![None; self.servers.len()]
        };
        *sh.clones.lock().unwrap_or_else(|p| p.into_inner()) = clones;
        // Set before the answer: the parent unparks after the fork, which follows it.
        sh.park.store(1, Release);
        let mut one = [None; MAX_JOBS];
        one[k] = Some(Op::Clone);
        sh.answer(&one, &[0; MAX_JOBS]);
        sh.wait_parked();
    }

    /// A forked child whose endpoint could not be opened: every job is answered with an
    /// error (stores go to the next tier; a load fails its region loudly).
    pub(super) fn refuse_all(sh: &Shared) -> ! {
        loop {
            let bell = sh.doorbell.load(Acquire);
            let ops = sh.posted();
            if ops.iter().all(Option::is_none) {
                attune_sys::os::futex_wait(&sh.doorbell, bell, 0);
                continue;
            }
            if ops.contains(&Some(Op::Bye)) {
                sh.mark_left();
            }
            let codes = ops.map(|o| match o {
                Some(Op::Bye) => 0,
                Some(Op::Load) => libc::EIO,
                Some(_) => libc::ENOSPC,
                None => 0,
            });
            sh.answer(&ops, &codes);
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::tier::remote::client::{discard_then_store, resent, Req};
    use attune_proto::remote::{Header, Op};
    use attune_sys::Errno;

    #[test]
    fn the_injected_lost_reply_is_a_discard_a_store_to_its_offsets_follows() {
        let q = |server: usize, op: Op, off: u64, len: u32| Req {
            job: 0,
            server,
            head: Header {
                op: op as u16,
                off,
                len,
                ..Default::default()
            },
            addr: 0,
            len: 0,
            incoming: false,
            replica: 0,
        };
        let (d, st, l) = (Op::Discard, Op::Store, Op::Load);
        // Every request answered: requests -> the discard whose reply the injection takes.
        let answered: Vec<(Vec<Req>, Option<usize>)> = vec![
            (vec![q(0, d, 0, 8192), q(0, st, 4096, 4096)], Some(0)),
            // The store before the discard, to another server, elsewhere, or a load: none.
            (vec![q(0, st, 0, 4096), q(0, d, 0, 4096)], None),
            (vec![q(0, d, 0, 4096), q(1, st, 0, 4096)], None),
            (vec![q(0, d, 0, 4096), q(0, st, 4096, 4096)], None),
            (vec![q(0, d, 0, 4096), q(0, l, 0, 4096)], None),
        ];
        for (reqs, want) in answered {
            let out: Vec<_> = reqs.iter().map(|_| Ok(Header::default())).collect();
            assert_eq!(discard_then_store(&reqs, &out), want);
        }
        // A discard that failed is sent again anyway: the next one is taken.
        let reqs = [q(0, d, 0, 4096), q(0, d, 8192, 4096), q(0, st, 0, 12288)];
        let out = [
            Err((Errno(libc::ECONNRESET), String::new())),
            Ok(Header::default()),
            Ok(Header::default()),
        ];
        assert_eq!(discard_then_store(&reqs, &out), Some(1));
    }

    #[test]
    fn a_server_gets_again_every_request_from_its_first_failed_one() {
        // (server of each request, whether it must be sent again) -> what is sent again.
        let t: &[(&[usize], &[bool], &[usize])] = &[
            (&[0, 0, 0], &[false, false, false], &[]),
            // A discard that failed before a store that was applied: both again, in order.
            (&[0, 0], &[true, false], &[0, 1]),
            (&[0, 0, 0], &[false, true, false], &[1, 2]),
            // Per server: server 1's failure does not resend server 0's requests.
            (
                &[0, 1, 0, 0, 1],
                &[false, true, true, false, false],
                &[1, 2, 3, 4],
            ),
            (&[0, 1, 0, 1], &[false, false, false, true], &[3]),
        ];
        for &(servers, retry, want) in t {
            assert_eq!(resent(servers, retry, 2), want, "{servers:?} {retry:?}");
        }
    }
}
