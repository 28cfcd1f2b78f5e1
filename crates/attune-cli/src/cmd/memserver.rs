//! `attune memserver`: serves memory to the remote tiers of one job's runtimes on other
//! hosts, over libfabric (docs/design/remote.md; protocol in attune_proto::remote).
//!
//! [`Store`] is the server's state and rules (sessions, leases, bounds), kept apart from
//! the fabric loop so that it is tested without a network. The loop serves one request
//! at a time: receives stay posted meanwhile, so clients pipeline.

use attune_proto::remote::{self as proto, Header, Op};
use attune_sys::fabric::{Completion, Endpoint, OpContext};
use clap::Parser;
use std::collections::{HashMap, VecDeque};
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

const PAGE: usize = proto::PAGE as usize;

/// One runtime's pages.
struct Session {
    token: [u8; 16],
    fi: u64,
    pages: HashMap<u64, Box<[u8]>>,
    limit: u64,
    last: u64,
    /// Bytes received in stores (logs).
    stored: u64,
}

/// The server's state: sessions and their pages, within the bounds.
pub struct Store {
    capacity: u64,
    per_session: u64,
    lease_ns: u64,
    used: u64,
    next: u64,
    sessions: HashMap<u64, Session>,
}

impl Store {
    pub fn new(capacity: u64, per_session: u64, lease_ns: u64) -> Store {
        Store {
            capacity: capacity / proto::PAGE,
            per_session: per_session / proto::PAGE,
            lease_ns,
            used: 0,
            next: 1,
            sessions: HashMap::new(),
        }
    }

    /// Opens a session for a client at `fi` asking `ask` bytes: (id, token, bytes granted).
    pub fn open(&mut self, ask: u64, fi: u64, token: [u8; 16], now: u64) -> (u64, u64) {
        let id = self.next;
        self.next += 1;
        let limit = (ask.div_ceil(proto::PAGE)).min(self.per_session);
        self.sessions.insert(
            id,
            Session {
                token,
                fi,
                pages: HashMap::new(),
                limit,
                last: now,
                stored: 0,
            },
        );
        (id, limit * proto::PAGE)
    }

    /// The session a request names, if its token matches; renews its lease.
    fn session(&mut self, h: &Header, now: u64) -> Option<&mut Session> {
        let s = self.sessions.get_mut(&h.session)?;
        if !proto::same_secret(&s.token, &h.token) {
            return None;
        }
        s.last = now;
        Some(s)
    }

    /// Whether the request's session and token are known (renews its lease), and where
    /// its replies go.
    pub fn check(&mut self, h: &Header, now: u64) -> Option<u64> {
        self.session(h, now).map(|s| s.fi)
    }

    /// Keeps the pages of `data` at `off`: all or nothing (ENOSPC when the server or the
    /// session is full).
    pub fn store(&mut self, h: &Header, data: &[u8], now: u64) -> Result<(), i32> {
        let (cap, used) = (self.capacity, self.used);
        let s = self.session(h, now).ok_or(libc::EACCES)?;
        let first = h.off / proto::PAGE;
        let n = data.len() / PAGE;
        let new = (0..n as u64)
            .filter(|p| !s.pages.contains_key(&(first + p)))
            .count() as u64;
        if used + new > cap || s.pages.len() as u64 + new > s.limit {
            return Err(libc::ENOSPC);
        }
        for (i, d) in data.chunks_exact(PAGE).enumerate() {
            let p = s
                .pages
                .entry(first + i as u64)
                .or_insert_with(|| vec![0u8; PAGE].into_boxed_slice());
            p.copy_from_slice(d);
        }
        s.stored += data.len() as u64;
        self.used += new;
        Ok(())
    }

    /// Copies the pages at `off` into `out` (pages never stored read as zeros).
    pub fn load(&mut self, h: &Header, out: &mut [u8], now: u64) -> Result<(), i32> {
        let s = self.session(h, now).ok_or(libc::EACCES)?;
        let first = h.off / proto::PAGE;
        for (i, o) in out.chunks_exact_mut(PAGE).enumerate() {
            match s.pages.get(&(first + i as u64)) {
                Some(p) => o.copy_from_slice(p),
                None => o.fill(0),
            }
        }
        Ok(())
    }

    pub fn discard(&mut self, h: &Header, now: u64) -> Result<(), i32> {
        let s = self.session(h, now).ok_or(libc::EACCES)?;
        let first = h.off / proto::PAGE;
        let mut freed = 0;
        for p in first..first + h.len as u64 / proto::PAGE {
            freed += s.pages.remove(&p).is_some() as u64;
        }
        self.used -= freed;
        Ok(())
    }

    /// Ends a session: the bytes it held, its address, the bytes it stored in all.
    pub fn close(&mut self, id: u64) -> Option<(u64, u64, u64)> {
        let s = self.sessions.remove(&id)?;
        let n = s.pages.len() as u64;
        self.used -= n;
        Some((n * proto::PAGE, s.fi, s.stored))
    }

    /// Ends the sessions whose lease ran out: (id, (held, address, stored)) of each.
    pub fn expire(&mut self, now: u64) -> Vec<(u64, (u64, u64, u64))> {
        let old: Vec<u64> = self
            .sessions
            .iter()
            .filter(|(_, s)| now.saturating_sub(s.last) > self.lease_ns)
            .map(|(&id, _)| id)
            .collect();
        old.into_iter()
            .filter_map(|id| self.close(id).map(|c| (id, c)))
            .collect()
    }

    pub fn used_bytes(&self) -> u64 {
        self.used * proto::PAGE
    }

    pub fn sessions(&self) -> usize {
        self.sessions.len()
    }
}

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
    reply: Vec<u8>,
    send_ctx: Box<OpContext>,
    refused: u64,
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

    /// Sends the reply in `self.reply` (header and `len` payload bytes) to `fi` and waits
    /// for its completion; receives that complete meanwhile are queued.
    fn send(&mut self, fi: u64, tag: u64, len: usize) -> Result<(), String> {
        let iov = [(self.reply.as_ptr() as usize, proto::HEADER + len)];
        let deadline = attune_sys::os::now_ns() + 10_000_000_000;
        loop {
            match self.ep.sendv(&iov, fi, Some(tag), &mut self.send_ctx) {
                Ok(()) => break,
                Err(attune_sys::Errno(libc::EAGAIN)) if attune_sys::os::now_ns() < deadline => {
                    self.progress_once()?;
                }
                Err(e) => return Err(format!("send: {}", attune_sys::fabric::strerror(e.0))),
            }
        }
        loop {
            match self.ep.wait(50_000, 10) {
                Ok(Some(c)) if c.ctx == self.send_ctx.id() => {
                    if c.status != 0 {
                        return Err(format!(
                            "reply lost: {}",
                            attune_sys::fabric::strerror(c.status)
                        ));
                    }
                    return Ok(());
                }
                Ok(Some(c)) => {
                    if let Some(i) = self.slot_of(&c) {
                        self.ready.push_back((i, c));
                    }
                }
                Ok(None) if attune_sys::os::now_ns() > deadline => {
                    // The peer is gone: the send cannot be reused until it completes or
                    // is cancelled; a fresh context takes its place.
                    self.ep.cancel(&mut self.send_ctx);
                    std::mem::forget(std::mem::take(&mut self.send_ctx));
                    return Err("the client did not take its reply in 10 s".into());
                }
                Ok(None) => {}
                Err(e) => return Err(format!("completion queue: {e}")),
            }
        }
    }

    fn progress_once(&mut self) -> Result<(), String> {
        match self.ep.poll(0) {
            Ok(Some(c)) => {
                if let Some(i) = self.slot_of(&c) {
                    self.ready.push_back((i, c));
                }
                Ok(())
            }
            Ok(None) => Ok(()),
            Err(e) => Err(format!("completion queue: {e}")),
        }
    }

    fn reply_header(&mut self, h: Header) {
        self.reply[..proto::HEADER].copy_from_slice(&h.encode());
    }

    /// Serves the request in slot `i` (`got` bytes arrived).
    fn serve(&mut self, i: usize, got: usize) -> Result<(), String> {
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
            let fi = match self.ep.insert(addr) {
                Ok(fi) => fi,
                Err(e) => {
                    log(&format!(
                        "dropped a hello with an address the provider refuses: {e}"
                    ));
                    return Ok(());
                }
            };
            if !self.secrets.iter().any(|s| proto::same_secret(s, secret)) {
                self.refused += 1;
                log("refused a client: wrong secret");
                rep.status = libc::EACCES;
                self.reply_header(rep);
                let r = self.send(fi, h.seq, 0);
                self.ep.remove(fi);
                return r;
            }
            let mut token = [0u8; 16];
            attune_sys::os::random_bytes(&mut token).map_err(|e| format!("getrandom: {e}"))?;
            let (id, granted) = self.store.open(h.off, fi, token, now);
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
            return self.send(fi, h.seq, 0);
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
                let mut out = std::mem::take(&mut self.reply);
                let r = self
                    .store
                    .load(&h, &mut out[proto::HEADER..proto::HEADER + len], now);
                self.reply = out;
                r.err().unwrap_or(0)
            }
            Op::Discard => self.store.discard(&h, now).err().unwrap_or(0),
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
                    let r = self.send(fi, h.seq, 0);
                    self.ep.remove(fi);
                    return r;
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
        self.send(fi, h.seq, len)
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
        reply: vec![0u8; proto::HEADER + proto::MAX_PAYLOAD],
        send_ctx: Box::default(),
        refused: 0,
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
        let next = match s.ready.pop_front() {
            Some(x) => Some(x),
            // Requests come in bursts (a fault's read-ahead, an eviction batch): poll a
            // little before sleeping.
            None => match s.ep.wait(200_000, 100) {
                Ok(Some(c)) => s.slot_of(&c).map(|i| (i, c)),
                Ok(None) => None,
                Err(e) => return Err(format!("completion queue: {e}")),
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
                s.ep.remove(fi);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn hdr(session: u64, token: [u8; 16], off: u64, len: u32) -> Header {
        Header {
            op: Op::Store as u16,
            session,
            token,
            off,
            len,
            ..Default::default()
        }
    }

    #[test]
    fn pages_are_reached_through_their_session_and_token_only() {
        let mut st = Store::new(1 << 20, 1 << 20, 1000);
        let (a, _) = st.open(1 << 20, 1, [1; 16], 0);
        let (b, _) = st.open(1 << 20, 2, [2; 16], 0);
        let data = vec![7u8; 8192];
        st.store(&hdr(a, [1; 16], 4096, 8192), &data, 0).unwrap();
        let mut out = vec![0u8; 8192];
        // Another session's token, a wrong token: refused, nothing read.
        assert_eq!(
            st.load(&hdr(a, [2; 16], 4096, 8192), &mut out, 0),
            Err(libc::EACCES)
        );
        st.load(&hdr(b, [2; 16], 4096, 8192), &mut out, 0).unwrap();
        assert!(
            out.iter().all(|&x| x == 0),
            "session b sees none of a's pages"
        );
        st.load(&hdr(a, [1; 16], 4096, 8192), &mut out, 0).unwrap();
        assert_eq!(out, data);
        assert_eq!(st.used_bytes(), 8192);
    }

    #[test]
    fn bounds_refuse_whole_stores_and_leases_free_pages() {
        let mut st = Store::new(16 << 10, 8 << 10, 1000);
        let (a, granted) = st.open(1 << 20, 1, [1; 16], 0);
        assert_eq!(granted, 8 << 10, "per-session bound");
        assert_eq!(
            st.store(&hdr(a, [1; 16], 0, 12288), &[1; 12288], 0),
            Err(libc::ENOSPC)
        );
        assert_eq!(st.used_bytes(), 0, "all or nothing");
        st.store(&hdr(a, [1; 16], 0, 8192), &[1; 8192], 0).unwrap();
        // Rewriting held pages needs no new room.
        st.store(&hdr(a, [1; 16], 0, 8192), &[2; 8192], 500)
            .unwrap();
        let (b, _) = st.open(1 << 20, 2, [2; 16], 0);
        st.store(&hdr(b, [2; 16], 0, 8192), &[3; 8192], 0).unwrap();
        assert_eq!(
            st.store(&hdr(b, [2; 16], 8192, 4096), &[3; 4096], 0),
            Err(libc::ENOSPC),
            "server full"
        );
        st.discard(&hdr(b, [2; 16], 0, 4096), 0).unwrap();
        assert_eq!(st.used_bytes(), 12288);
        // b was last seen at 0, a at 500: at 1200 only b's lease has run out.
        let gone = st.expire(1200);
        assert_eq!(gone, vec![(b, (4096, 2, 8192))]);
        assert_eq!((st.sessions(), st.used_bytes()), (1, 8192));
        assert_eq!(st.close(a), Some((8192, 1, 16384)));
        assert_eq!(st.used_bytes(), 0);
    }
}
