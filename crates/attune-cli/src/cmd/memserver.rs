//! `attune memserver`: serves memory to the remote tiers of one job's runtimes on other
//! hosts, over libfabric (docs/design/remote.md; protocol in attune_proto::remote).
//!
//! The server's state and rules are `attune_cli::memstore::Store`, kept apart from the
//! fabric loop so that they are tested and fuzzed without a network. The loop serves one
//! request at a time; receives stay posted meanwhile (clients pipeline), and replies go
//! out without waiting for their completion (8 buffers, more while some hold replies the
//! provider refused), so a client that died with a reply in flight holds one buffer,
//! never the server (seen: a dead client's reply stalled every other client for 10 s).
//!
//! A session ends with its runtime: at its bye (an exiting runtime's: its grace after
//! its last request), 5 s after a reply to it failed or was
//! refused if it sent nothing meanwhile (its runtime is dead, or would have moved to a
//! new endpoint and taken the session over), when a new hello comes from its address (a
//! new runtime on a reused port, or the same one rejoining), or when its lease runs out.
//! Peers' addresses are counted (the provider's address vector counts inserts of one
//! address) and removed when no session answers to them any more.

use attune_cli::memstore::Store;
use attune_proto::remote::{self as proto, Header, Op};
use attune_sys::fabric::{Completion, Endpoint, OpContext};
use clap::Parser;
use std::collections::VecDeque;
use std::path::PathBuf;

#[derive(Parser)]
pub struct Args {
    /// HOST:PORT to serve on (an address of the fabric interface).
    #[arg(long, required_unless_present = "new_secret")]
    pub listen: Option<String>,
    /// Memory to serve, in bytes (64M, 4G).
    #[arg(long, default_value = "1G", value_parser = parse_size)]
    pub size: u64,
    /// Most bytes one session (one runtime) may hold [default: --size].
    #[arg(long, value_parser = parse_size)]
    pub per_session: Option<u64>,
    /// The secret of each job allowed here: a file only its owner can read (repeatable).
    #[arg(long = "secret-file")]
    pub secret_files: Vec<PathBuf>,
    /// A session without a request for this many seconds is dropped with its pages (the
    /// runtime pings at a quarter of it while alive).
    #[arg(long, default_value_t = 30)]
    pub lease: u64,
    /// libfabric provider (tcp here; verbs, efa or cxi on a cluster).
    #[arg(long, default_value = "tcp")]
    pub provider: String,
    /// Write a new random secret to this file (mode 0600) and exit.
    #[arg(long)]
    pub new_secret: Option<PathBuf>,
}

fn parse_size(s: &str) -> Result<u64, String> {
    attune::size::parse_size(s).map_err(|e| e.to_string())
}

/// How long a reply may wait for its send to complete before it is dropped and its
/// session ended: twice a runtime's default timeout (5 s), after which the runtime
/// counts this server as lost.
const UNSENT_NS: u64 = 10_000_000_000;

/// How long the provider may refuse a reply (EAGAIN) before it is dropped, its buffer
/// free for others, and counted against its session (`FAILED_GRACE_NS`). The provider
/// says EAGAIN both to a full connection and to a peer it is connecting to again, and a
/// runtime that exited or was killed is one such peer for ever (its port refuses).
/// Before, such a reply was dropped after 200 ms, so its client, if alive, timed the
/// request out all the same.
const REFUSED_NS: u64 = 1_000_000_000;

/// A session a reply to which failed or was dropped unsent ends when it has sent nothing
/// for this long since (`end_failed`): its runtime is dead, or alive behind a broken
/// connection. A live one finds out when a request goes unanswered for
/// `attune::tier::remote`'s reconnect time (2 s at most) and says hello again from a new
/// endpoint, taking the session over; this must outlast that and its hello. Ending at
/// 1 s lost the pages of a runtime whose connection was reset (docs/design/remote.md).
const FAILED_GRACE_NS: u64 = 5_000_000_000;

/// Reply buffers at the start, and at most (2 MiB each, touched only as far as replies
/// fill them): buffers are added while every one is in flight and some hold replies the
/// provider refused (rMap's Figure 7, 4 servers and 8 runtimes: the replies to runtimes
/// that had just exited held all 8 for a second, and the live ones waited).
const REPLIES: usize = 8;
const MAX_REPLIES: usize = 64;

fn log(msg: &str) {
    eprintln!("attune memserver: {msg}");
}

fn new_secret(path: &std::path::Path) -> Result<(), String> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut b = [0u8; 32];
    attune_sys::os::random_bytes(&mut b).map_err(|e| format!("getrandom: {e}"))?;
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    writeln!(f, "{hex}").map_err(|e| format!("{}: {e}", path.display()))
}

/// A session's token: 16 random bytes (a new session, a clone, a takeover).
fn new_token() -> Result<[u8; 16], String> {
    let mut token = [0u8; 16];
    attune_sys::os::random_bytes(&mut token).map_err(|e| format!("getrandom: {e}"))?;
    Ok(token)
}

/// A posted receive: its buffer and context stay put while posted.
struct RecvSlot {
    ctx: OpContext,
    buf: Vec<u8>,
}

struct Server {
    ep: Endpoint,
    store: Store,
    secrets: Vec<Vec<u8>>,
    slots: Vec<Box<RecvSlot>>,
    ready: VecDeque<(usize, Completion)>,
    replies: Vec<Box<ReplySlot>>,
    /// The reply being made (`take_reply`).
    cur: usize,
    /// Inserts of each peer's address into the address vector, all undone when no
    /// session answers to it any more (`release`).
    refs: std::collections::HashMap<u64, u32>,
    refused: u64,
    /// Replies dropped unsent to sessions that were not ended (`retry_unsent`).
    unsent_dropped: u64,
    /// Sessions a reply to which failed, and when (`end_failed`).
    failed: std::collections::HashMap<u64, u64>,
}

/// A reply buffer: in flight (`busy`) from its send until its completion.
struct ReplySlot {
    ctx: OpContext,
    buf: Vec<u8>,
    busy: bool,
    since: u64,
    /// The peer to release once this reply is out (a refused client, a closed session).
    remove: Option<u64>,
    /// Not posted yet (the provider said EAGAIN): where it goes, its tag and length.
    unsent: Option<(u64, u64, usize)>,
    /// The session it answers (0: none, a refused hello): ended if the provider refuses
    /// the reply for `REFUSED_NS`.
    session: u64,
    /// The address it goes to: a failure counts against its session only while the
    /// session still answers to it (a runtime that reconnected has a new one).
    to: u64,
}

impl ReplySlot {
    fn new() -> Box<ReplySlot> {
        Box::new(ReplySlot {
            ctx: OpContext::default(),
            buf: vec![0u8; proto::HEADER + proto::MAX_PAYLOAD],
            busy: false,
            since: 0,
            remove: None,
            unsent: None,
            session: 0,
            to: 0,
        })
    }
}

impl Server {
    fn post(&mut self, i: usize) -> Result<(), String> {
        let s = &mut *self.slots[i];
        let iov = [(s.buf.as_mut_ptr() as usize, s.buf.len())];
        self.ep.recvv(&iov, None, &mut s.ctx).map_err(|e| {
            format!(
                "cannot post a receive: {}",
                attune_sys::fabric::strerror(e.0)
            )
        })
    }

    fn slot_of(&self, c: &Completion) -> Option<usize> {
        self.slots.iter().position(|s| s.ctx.id() == c.ctx)
    }

    /// A reply buffer that is not in flight, made the current one. Waits (serving
    /// completions) while all are in flight; one in flight for 10 s (its peer is gone)
    /// is cancelled and replaced, its buffer leaked to the provider.
    fn take_reply(&mut self) -> Result<(), String> {
        loop {
            if let Some(i) = self.replies.iter().position(|r| !r.busy) {
                self.cur = i;
                return Ok(());
            }
            if self.retry_unsent() && self.replies.iter().all(|r| r.busy) {
                // Replies the provider cannot take yet (a dead runtime's, for up to
                // REFUSED_NS) do not hold up the others' requests: one more buffer.
                if self.replies.len() < MAX_REPLIES {
                    self.replies.push(ReplySlot::new());
                    continue;
                }
                // Every buffer holds a reply the provider cannot take yet: progress.
                if let Ok(Some(c)) = self.ep.poll(0) {
                    self.completed(c);
                }
                continue;
            }
            let now = attune_sys::os::now_ns();
            if let Some(i) = self
                .replies
                .iter()
                .position(|r| r.unsent.is_none() && now - r.since > UNSENT_NS)
            {
                let mut old = std::mem::replace(&mut self.replies[i], ReplySlot::new());
                self.ep.cancel(&mut old.ctx);
                let (id, remove) = (old.session, old.remove.take());
                std::mem::forget(old);
                log("a client did not take its reply in 10 s");
                // Its client timed the request out long ago and treats this server as
                // lost: the session is over.
                self.end(id, "its reply was not taken in 10 s");
                if let Some(fi) = remove {
                    self.release(fi);
                }
                self.cur = i;
                return Ok(());
            }
            match self.ep.wait(50_000, 10) {
                Ok(Some(c)) => self.completed(c),
                Ok(None) => {}
                Err(e) => return Err(format!("completion queue: {e}")),
            }
        }
    }

    /// Books a completion: a request received (queued to serve) or a reply sent.
    fn completed(&mut self, c: Completion) {
        if let Some(i) = self.slot_of(&c) {
            self.ready.push_back((i, c));
            return;
        }
        let Some(i) = self
            .replies
            .iter()
            .position(|r| r.busy && r.ctx.id() == c.ctx)
        else {
            return;
        };
        let (session, to) = (self.replies[i].session, self.replies[i].to);
        if c.status != 0 {
            // The reply's connection broke. Its runtime may be dead, or alive and about to
            // send again on a new connection or from a new endpoint: the session ends if
            // it sends nothing for FAILED_GRACE_NS (`end_failed`). Ending it at once made
            // a CI run's live forked program lose its sessions (ofi_rxm's broken
            // connections, docs/design/remote.md); only logging it left a dead runtime's
            // pages to its lease (libfabric's net provider fails a reply to a dead peer
            // where ofi_rxm refused it).
            self.failing(session, to, attune_sys::os::now_ns());
        }
        let r = &mut *self.replies[i];
        r.busy = false;
        if let Some(fi) = r.remove.take() {
            self.release(fi);
        }
    }

    /// A reply to `session` at `to`, made or failed at `when`, was not delivered: the
    /// session ends unless it sends something within FAILED_GRACE_NS (`end_failed`).
    /// Not if the session answers to another address now (its runtime reconnected).
    fn failing(&mut self, session: u64, to: u64, when: u64) {
        if self.store.address(session) == Some(to) {
            self.failed.entry(session).or_insert(when);
        }
    }

    /// Adds a peer's address (counted: `release` undoes every insert).
    fn insert(&mut self, addr: &[u8]) -> Result<u64, attune_sys::Errno> {
        let fi = self.ep.insert(addr)?;
        *self.refs.entry(fi).or_default() += 1;
        Ok(fi)
    }

    /// Forgets a peer's address once no session answers to it and no reply to it is in
    /// flight or waiting (the reply's slot releases it when done). Removed under a
    /// reply, the address's number went to the next peer inserted (a runtime's new
    /// endpoint, at a takeover), and the old reply's send then ran on that number.
    fn release(&mut self, fi: u64) {
        if self.store.addressed(fi) {
            return;
        }
        if let Some(r) = self.replies.iter_mut().find(|r| r.busy && r.to == fi) {
            r.remove = Some(fi);
            return;
        }
        for _ in 0..self.refs.remove(&fi).unwrap_or(0) {
            self.ep.remove(fi);
        }
    }

    /// Ends session `id` (if it still exists) and logs why; its replies not sent yet are
    /// dropped.
    fn end(&mut self, id: u64, why: &str) {
        if id == 0 {
            return;
        }
        for i in 0..self.replies.len() {
            if self.replies[i].unsent.is_some() && self.replies[i].session == id {
                self.free_unsent(i);
            }
        }
        if let Some((b, fi, stored)) = self.store.close(id) {
            log(&format!(
                "session {id} ended ({why}): {} MiB freed, {} MiB stored",
                b >> 20,
                stored >> 20
            ));
            self.release(fi);
        }
    }

    /// Frees reply buffer `i`, whose reply was never posted, releasing its peer if the
    /// reply was to release it; returns the session the reply answered.
    fn free_unsent(&mut self, i: usize) -> u64 {
        let r = &mut *self.replies[i];
        r.unsent = None;
        r.busy = false;
        let (session, remove) = (r.session, r.remove.take());
        if let Some(fi) = remove {
            self.release(fi);
        }
        session
    }

    /// A hello from `fi` opened or took over session `keep`: the sessions its address
    /// served before are over (`Store::superseded`).
    fn supersede(&mut self, fi: u64, keep: u64) {
        for id in self.store.superseded(fi, keep) {
            self.end(id, "a new hello came from its address");
        }
    }

    /// Sends the current reply (header and `len` payload bytes) to `fi` without waiting
    /// for it: a client that is gone holds one reply buffer, not the server. `session`:
    /// the session it answers (ended if the reply is refused for good); `remove`: release
    /// the peer once the reply is out. A reply the provider cannot take now (EAGAIN: that
    /// client's connection is full, or being made) waits in its buffer and is sent again
    /// between requests (`retry_unsent`), so the other clients are served meanwhile:
    /// waiting for it here stalled every client behind one, and dropping it after 200 ms
    /// made a live client time out (rMap's Figure 7 at 8 clients on 4 servers).
    fn send(
        &mut self,
        fi: u64,
        session: u64,
        tag: u64,
        len: usize,
        remove: bool,
    ) -> Result<(), String> {
        let r = &mut *self.replies[self.cur];
        r.busy = true;
        r.since = attune_sys::os::now_ns();
        r.remove = remove.then_some(fi);
        r.session = session;
        r.to = fi;
        r.unsent = Some((fi, tag, len));
        self.post_reply(self.cur)
    }

    /// Posts reply `i` if it is unsent: Ok when posted or left for later (EAGAIN); Err
    /// when the provider refused it (its session ended, its buffer free again).
    fn post_reply(&mut self, i: usize) -> Result<(), String> {
        let r = &mut *self.replies[i];
        let Some((fi, tag, len)) = r.unsent else {
            return Ok(());
        };
        let iov = [(r.buf.as_ptr() as usize, proto::HEADER + len)];
        match self.ep.sendv(&iov, fi, Some(tag), &mut r.ctx) {
            Ok(()) => {
                r.unsent = None;
                Ok(())
            }
            Err(attune_sys::Errno(libc::EAGAIN)) => Ok(()),
            Err(e) => {
                let why = attune_sys::fabric::strerror(e.0);
                let session = self.free_unsent(i);
                self.end(session, &format!("its reply could not be sent: {why}"));
                Err(format!("send: {why}"))
            }
        }
    }

    /// Sends again the replies the provider could not take; one still not sent
    /// `REFUSED_NS` after it was made is dropped (its buffer serves others), and its
    /// session ended FAILED_GRACE_NS later if it sent nothing meanwhile (`failing`: its
    /// runtime is gone; ending a session whose requests still arrive would drop them
    /// unanswered). Returns whether some still wait.
    fn retry_unsent(&mut self) -> bool {
        let now = attune_sys::os::now_ns();
        let mut waiting = false;
        for i in 0..self.replies.len() {
            if self.replies[i].unsent.is_none() {
                continue;
            }
            let r = &self.replies[i];
            let (since, session, to) = (r.since, r.session, r.to);
            if now.saturating_sub(since) > REFUSED_NS {
                self.free_unsent(i);
                self.failing(session, to, since);
                // Counted, not a line each (a dead runtime's last replies, or a live
                // one's behind a broken connection).
                self.unsent_dropped += 1;
                if self.unsent_dropped.is_power_of_two() {
                    log(&format!(
                        "{} repl(ies) not sent in 1 s dropped",
                        self.unsent_dropped
                    ));
                }
                continue;
            }
            if let Err(e) = self.post_reply(i) {
                log(&e);
            }
            waiting |= self.replies[i].unsent.is_some();
        }
        waiting
    }

    /// Ends the sessions a reply to which failed `FAILED_GRACE_NS` ago and that sent
    /// nothing since (their runtime is gone); forgets the failure of those that did.
    fn end_failed(&mut self) {
        let now = attune_sys::os::now_ns();
        let due: Vec<(u64, u64)> = self
            .failed
            .iter()
            .filter(|(_, &t)| now.saturating_sub(t) > FAILED_GRACE_NS)
            .map(|(&id, &t)| (id, t))
            .collect();
        for (id, t) in due {
            self.failed.remove(&id);
            if self.store.last_request(id).is_some_and(|l| l <= t) {
                self.end(id, "a reply to it failed and it sent nothing for 5 s");
            }
        }
    }

    fn reply_header(&mut self, h: Header) {
        self.replies[self.cur].buf[..proto::HEADER].copy_from_slice(&h.encode());
    }

    /// Serves the request in slot `i` (`got` bytes arrived).
    fn serve(&mut self, i: usize, got: usize) -> Result<(), String> {
        self.take_reply()?;
        let now = attune_sys::os::now_ns();
        let buf = std::mem::take(&mut self.slots[i].buf);
        let r = self.serve_buf(&buf, got, now);
        self.slots[i].buf = buf;
        r
    }

    fn serve_buf(&mut self, buf: &[u8], got: usize, now: u64) -> Result<(), String> {
        let h = match Header::decode(buf, got) {
            Ok(h) => h,
            Err(e) => {
                self.refused += 1;
                log(&format!("dropped a message: {e}"));
                return Ok(());
            }
        };
        let payload = &buf[proto::HEADER..got];
        let op = Op::from_u16(h.op).expect("decode checked the op");
        let mut rep = Header {
            op: h.op,
            seq: h.seq,
            session: h.session,
            ..Default::default()
        };
        if op == Op::Hello {
            let Ok((secret, addr)) = proto::decode_hello(payload) else {
                log("dropped a hello with a bad payload");
                return Ok(());
            };
            let fi = match self.insert(addr) {
                Ok(fi) => fi,
                Err(e) => {
                    log(&format!(
                        "dropped a hello with an address the provider refuses: {e}"
                    ));
                    return Ok(());
                }
            };
            let Some(job) = self
                .secrets
                .iter()
                .position(|s| proto::same_secret(s, secret))
            else {
                self.refused += 1;
                log("refused a client: wrong secret");
                rep.status = libc::EACCES;
                self.reply_header(rep);
                return self.send(fi, 0, h.seq, 0, true);
            };
            if h.session != 0 {
                // A forked runtime takes over the clone made for it, or a runtime whose
                // connection broke its own session, from a new endpoint, with a new
                // token (requests from before carry the old one: `Store::attach`).
                let token = new_token()?;
                return match self.store.attach(&h, fi, token, now) {
                    Ok(t) => {
                        log(&format!(
                            "session {} taken over by {}",
                            h.session,
                            if t.clone {
                                "a forked runtime"
                            } else {
                                "its runtime from a new endpoint"
                            }
                        ));
                        self.failed.remove(&h.session);
                        self.supersede(fi, h.session);
                        self.release(t.old_fi);
                        rep.token = t.token;
                        rep.value = t.granted;
                        rep.off = self.store.lease_ns / 1_000_000;
                        self.reply_header(rep);
                        self.send(fi, h.session, h.seq, 0, false)
                    }
                    Err(e) => {
                        self.refused += 1;
                        log("refused a client: unknown session or token in a hello");
                        rep.status = e;
                        self.reply_header(rep);
                        self.send(fi, 0, h.seq, 0, true)
                    }
                };
            }
            let token = new_token()?;
            let (id, granted) = self.store.open(h.off, fi, job, token, now);
            self.supersede(fi, id);
            log(&format!(
                "session {id} opened: {} MiB granted ({} sessions, {} MiB held)",
                granted >> 20,
                self.store.sessions(),
                self.store.used_bytes() >> 20
            ));
            rep.session = id;
            rep.token = token;
            rep.value = granted;
            rep.off = self.store.lease_ns / 1_000_000;
            self.reply_header(rep);
            return self.send(fi, id, h.seq, 0, false);
        }
        // Every other request names a session and proves it with the token; one that
        // does not is dropped unanswered (its sender is not known to be who it claims).
        let Some(fi) = self.store.check(&h, now) else {
            self.refused += 1;
            if self.refused.is_power_of_two() {
                log(&format!(
                    "dropped {} request(s) with an unknown session or token",
                    self.refused
                ));
            }
            return Ok(());
        };
        let mut len = 0;
        let status = match op {
            Op::Store if payload.len() != h.len as usize => libc::EPROTO,
            Op::Store => self.store.store(&h, payload, now).err().unwrap_or(0),
            Op::Load => {
                len = h.len as usize;
                let out = &mut self.replies[self.cur].buf[proto::HEADER..proto::HEADER + len];
                self.store.load(&h, out, now).err().unwrap_or(0)
            }
            Op::Discard => self.store.discard(&h, now).err().unwrap_or(0),
            Op::Clone => {
                let token = new_token()?;
                match self.store.clone_session(&h, token, now) {
                    Ok((id, granted)) => {
                        log(&format!(
                            "session {id} cloned from {} for a forked runtime ({} MiB shared)",
                            h.session,
                            self.store.held_bytes(id) >> 20
                        ));
                        rep.session = id;
                        rep.token = token;
                        rep.value = granted;
                        0
                    }
                    Err(e) => e,
                }
            }
            Op::Bye if h.off > 0 => match self.store.shorten(&h, now) {
                Ok(held) => {
                    log(&format!(
                        "session {}: its runtime is exiting; {} MiB freed {} ms after its last request",
                        h.session,
                        held >> 20,
                        h.off
                    ));
                    rep.value = held;
                    0
                }
                Err(e) => e,
            },
            Op::Bye => {
                if let Some((b, fi, stored)) = self.store.close(h.session) {
                    log(&format!(
                        "session {} closed: {} MiB freed, {} MiB stored",
                        h.session,
                        b >> 20,
                        stored >> 20
                    ));
                    rep.value = b;
                    self.reply_header(rep);
                    // Released once out, unless another session (a clone not yet taken
                    // over) still answers to this address.
                    return self.send(fi, 0, h.seq, 0, true);
                }
                0
            }
            Op::Ping | Op::Hello => 0,
        };
        if status != 0 {
            len = 0;
        }
        rep.status = status;
        rep.len = len as u32;
        self.reply_header(rep);
        self.send(fi, h.session, h.seq, len, false)
    }
}

pub fn run(a: Args) -> i32 {
    match serve(a) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("attune memserver: error: {e}");
            1
        }
    }
}

fn serve(a: Args) -> Result<(), String> {
    if let Some(p) = &a.new_secret {
        new_secret(p)?;
        println!("{}", p.display());
        return Ok(());
    }
    let listen = a.listen.as_deref().expect("clap requires --listen");
    let (host, port) = listen
        .rsplit_once(':')
        .filter(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok())
        .ok_or_else(|| format!("--listen '{listen}' is not HOST:PORT"))?;
    if a.secret_files.is_empty() {
        return Err(
            "give the job's secret with --secret-file (make one with --new-secret FILE)".into(),
        );
    }
    let secrets = a
        .secret_files
        .iter()
        .map(|p| attune::tier::remote::read_secret(p))
        .collect::<Result<Vec<_>, _>>()?;
    if a.size < proto::PAGE || a.lease == 0 {
        return Err("--size must be at least 4K and --lease at least 1 s".into());
    }
    let ep = Endpoint::open(&a.provider, Some((host, port))).map_err(|e| {
        format!(
            "cannot serve on {listen} with provider '{}': {e}",
            a.provider
        )
    })?;
    let per = a.per_session.unwrap_or(a.size).min(a.size);
    let mut s = Server {
        ep,
        store: Store::new(a.size, per, a.lease * 1_000_000_000),
        secrets,
        slots: (0..4)
            .map(|_| {
                Box::new(RecvSlot {
                    ctx: OpContext::default(),
                    buf: vec![0u8; proto::HEADER + proto::MAX_PAYLOAD],
                })
            })
            .collect(),
        ready: VecDeque::new(),
        replies: (0..REPLIES).map(|_| ReplySlot::new()).collect(),
        cur: 0,
        refs: std::collections::HashMap::new(),
        refused: 0,
        unsent_dropped: 0,
        failed: std::collections::HashMap::new(),
    };
    for i in 0..s.slots.len() {
        s.post(i)?;
    }
    log(&format!(
        "serving {} MiB on {listen} over libfabric '{}' ({} secret(s), lease {} s)",
        a.size >> 20,
        s.ep.provider(),
        s.secrets.len(),
        a.lease
    ));
    let mut last_expiry = attune_sys::os::now_ns();
    loop {
        // Replies the provider could not take go out as soon as it can.
        let unsent = s.retry_unsent();
        if !s.failed.is_empty() {
            s.end_failed();
        }
        let next = match s.ready.pop_front() {
            Some(x) => Some(x),
            // Requests come in bursts (a fault's read-ahead, an eviction batch): poll a
            // little before sleeping (1 ms while replies wait to be sent).
            None => match s.ep.wait(200_000, if unsent { 1 } else { 100 }) {
                Ok(Some(c)) => {
                    s.completed(c);
                    s.ready.pop_front()
                }
                Ok(None) => None,
                Err(e) => {
                    // The queue's errors are the provider's, not a request's: logged, the
                    // loop goes on (a server must outlive any one client).
                    log(&format!("completion queue: {e}"));
                    std::thread::sleep(std::time::Duration::from_millis(10));
                    None
                }
            },
        };
        if let Some((i, c)) = next {
            if c.status != 0 {
                log(&format!(
                    "a receive failed: {}",
                    attune_sys::fabric::strerror(c.status)
                ));
            } else if let Err(e) = s.serve(i, c.len) {
                log(&e);
            }
            s.post(i)?;
        }
        let now = attune_sys::os::now_ns();
        if now - last_expiry > 1_000_000_000 {
            for (id, (b, fi, stored)) in s.store.expire(now) {
                s.release(fi);
                log(&format!(
                    "session {id} expired (no request for {} s): {} MiB freed, {} MiB stored",
                    a.lease,
                    b >> 20,
                    stored >> 20
                ));
            }
            last_expiry = now;
        }
    }
}
