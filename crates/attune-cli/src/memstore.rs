//! The memory server's state and rules, apart from its fabric loop (`attune memserver`,
//! crates/attune-cli/src/cmd/memserver.rs) so that they are tested and fuzzed without a
//! network: sessions, whose pages only their token reaches; the server's and each
//! session's bounds (a store that does not fit is refused whole); leases; clones for a
//! forked runtime, which share their pages with the session they came from until either
//! writes one.

use attune_proto::remote::{self as proto, Header};
use std::collections::HashMap;
use std::sync::Arc;

const PAGE: usize = proto::PAGE as usize;

/// One runtime's pages.
struct Session {
    token: [u8; 16],
    /// The token before the last takeover (`attach`), good for a takeover only: the
    /// hello that made it again, if its reply was lost. Requests sent before a takeover
    /// carry it and are refused.
    prev: Option<[u8; 16]>,
    fi: u64,
    /// The job whose secret opened it (the server's index of the secret).
    job: usize,
    /// Its runtime said hello from `fi` (false: a clone its forked runtime has not taken
    /// over yet, which answers to the parent's address meanwhile).
    attached: bool,
    /// Shared with the clones of this session (and the session it was cloned from) until
    /// one of them writes the page: `Arc::make_mut` copies it then.
    pages: HashMap<u64, Arc<Box<[u8]>>>,
    limit: u64,
    last: u64,
    /// Its own lease, shorter than the server's: its runtime is exiting (`Bye` with a
    /// grace, `Store::shorten`).
    lease_ns: Option<u64>,
    /// Bytes received in stores (logs).
    stored: u64,
}

/// A takeover (`Store::attach`).
#[derive(Debug, PartialEq, Eq)]
pub struct Attached {
    /// Bytes granted to the session.
    pub granted: u64,
    /// The address its replies went to before.
    pub old_fi: u64,
    /// It was a clone not taken over yet (a forked runtime's).
    pub clone: bool,
    /// Its token from now on.
    pub token: [u8; 16],
}

/// The server's state: sessions and their pages, within the bounds.
pub struct Store {
    capacity: u64,
    per_session: u64,
    pub lease_ns: u64,
    /// Pages held in memory: a page shared by a session and its clones counts once.
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

    /// Opens a session of job `job` for a client at `fi` asking `ask` bytes: (id, bytes
    /// granted).
    pub fn open(&mut self, ask: u64, fi: u64, job: usize, token: [u8; 16], now: u64) -> (u64, u64) {
        let id = self.next;
        self.next += 1;
        let limit = (ask.div_ceil(proto::PAGE)).min(self.per_session);
        self.sessions.insert(
            id,
            Session {
                token,
                prev: None,
                fi,
                job,
                attached: true,
                pages: HashMap::new(),
                limit,
                last: now,
                lease_ns: None,
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
        // Pages new to the session, and pages it shares with a clone (writing one makes
        // a copy): both take room on the server.
        let (mut absent, mut shared) = (0u64, 0u64);
        for p in 0..n as u64 {
            match s.pages.get(&(first + p)) {
                None => absent += 1,
                Some(a) if Arc::strong_count(a) > 1 => shared += 1,
                Some(_) => {}
            }
        }
        if used + absent + shared > cap || s.pages.len() as u64 + absent > s.limit {
            return Err(libc::ENOSPC);
        }
        for (i, d) in data.chunks_exact(PAGE).enumerate() {
            let p = s
                .pages
                .entry(first + i as u64)
                .or_insert_with(|| Arc::new(vec![0u8; PAGE].into_boxed_slice()));
            Arc::make_mut(p).copy_from_slice(d);
        }
        s.stored += data.len() as u64;
        self.used += absent + shared;
        Ok(())
    }

    /// Copies the pages at `off` into `out` (pages never stored read as zeros).
    pub fn load(&mut self, h: &Header, out: &mut [u8], now: u64) -> Result<(), i32> {
        let s = self.session(h, now).ok_or(libc::EACCES)?;
        let first = h.off / proto::PAGE;
        for (i, o) in out.chunks_exact_mut(PAGE).enumerate() {
            match s.pages.get(&(first + i as u64)) {
                Some(p) => o.copy_from_slice(&p[..]),
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
            freed += s
                .pages
                .remove(&p)
                .is_some_and(|a| Arc::strong_count(&a) == 1) as u64;
        }
        self.used -= freed;
        Ok(())
    }

    /// A copy of the session a request names (its token checked), for a forked runtime:
    /// a new session with `token`, the same grant and address, and the same pages,
    /// shared until either side writes one (so a clone takes no room until then). Its
    /// lease starts now; its runtime takes it over with a hello that names it (`attach`).
    /// Returns (id, bytes granted).
    pub fn clone_session(
        &mut self,
        h: &Header,
        token: [u8; 16],
        now: u64,
    ) -> Result<(u64, u64), i32> {
        let s = self.session(h, now).ok_or(libc::EACCES)?;
        let copy = Session {
            token,
            prev: None,
            fi: s.fi,
            job: s.job,
            attached: false,
            pages: s.pages.clone(),
            limit: s.limit,
            last: now,
            lease_ns: None,
            stored: 0,
        };
        let limit = copy.limit;
        let id = self.next;
        self.next += 1;
        self.sessions.insert(id, copy);
        Ok((id, limit * proto::PAGE))
    }

    /// A runtime takes over the session a hello names (a clone made for it before its
    /// fork, or its own from a new endpoint), its replies going to `fi` from now on, and
    /// the session's token becomes `token`.
    ///
    /// The new token fences the old endpoint: a request the runtime sent from there
    /// before it moved may still arrive after the ones it sent again from the new one
    /// (another connection, read in any order), and a store of a page's older contents
    /// over its newer ones is a wrong byte the runtime only finds at the next load (a
    /// checksum failure in CI's remote soak, docs/design/remote.md, "Requests from an
    /// old endpoint"). The hello itself may come twice (sent again after its reply was
    /// lost): the token it names is the one before the takeover, and it gets the
    /// current one, nothing rotated.
    pub fn attach(
        &mut self,
        h: &Header,
        fi: u64,
        token: [u8; 16],
        now: u64,
    ) -> Result<Attached, i32> {
        let s = self.sessions.get_mut(&h.session).ok_or(libc::EACCES)?;
        if proto::same_secret(&s.token, &h.token) {
            s.prev = Some(std::mem::replace(&mut s.token, token));
        } else if !s.prev.is_some_and(|p| proto::same_secret(&p, &h.token)) {
            return Err(libc::EACCES);
        }
        s.last = now;
        let old_fi = std::mem::replace(&mut s.fi, fi);
        let clone = !std::mem::replace(&mut s.attached, true);
        Ok(Attached {
            granted: s.limit * proto::PAGE,
            old_fi,
            clone,
            token: s.token,
        })
    }

    /// The address session `id`'s replies go to (None: no such session).
    pub fn address(&self, id: u64) -> Option<u64> {
        self.sessions.get(&id).map(|s| s.fi)
    }

    /// The sessions of `keep`'s job whose runtime said hello from `fi`, but `keep`: a
    /// hello from `fi` means their runtime is gone. An address names one endpoint at a
    /// time, and a runtime keeps one session per server: a new hello from its address
    /// comes from a new runtime on a reused port, or from the same one rejoining, which
    /// has given its old session up. Clones not yet taken over are not among them (their
    /// runtime says hello from an address of its own), nor are other jobs' sessions: a
    /// hello names its address itself, and one job must not end another's sessions by
    /// naming their address.
    pub fn superseded(&self, fi: u64, keep: u64) -> Vec<u64> {
        let Some(job) = self.sessions.get(&keep).map(|s| s.job) else {
            return Vec::new();
        };
        self.sessions
            .iter()
            .filter(|(&id, s)| s.fi == fi && s.attached && s.job == job && id != keep)
            .map(|(&id, _)| id)
            .collect()
    }

    /// When session `id` last made a request that proved its token (None: no such session).
    pub fn last_request(&self, id: u64) -> Option<u64> {
        self.sessions.get(&id).map(|s| s.last)
    }

    /// Whether a session's replies go to `fi` (an address still in use is not removed).
    pub fn addressed(&self, fi: u64) -> bool {
        self.sessions.values().any(|s| s.fi == fi)
    }

    /// Ends a session: the bytes it held, its address, the bytes it stored in all.
    pub fn close(&mut self, id: u64) -> Option<(u64, u64, u64)> {
        let s = self.sessions.remove(&id)?;
        let n = s.pages.len() as u64;
        self.used -= s
            .pages
            .values()
            .filter(|a| Arc::strong_count(a) == 1)
            .count() as u64;
        Some((n * proto::PAGE, s.fi, s.stored))
    }

    /// The session's runtime is exiting (a `Bye` whose offset is a grace in ms): its
    /// lease becomes the grace (never longer than the server's), so that its pages are
    /// freed that long after its last request rather than a whole lease later, while a
    /// request still made during the exit is served (and renews it). Returns the bytes it
    /// holds, or EACCES.
    pub fn shorten(&mut self, h: &Header, now: u64) -> Result<u64, i32> {
        let grace = h.off.saturating_mul(1_000_000).min(self.lease_ns);
        let s = self.session(h, now).ok_or(libc::EACCES)?;
        s.lease_ns = Some(grace);
        Ok(s.pages.len() as u64 * proto::PAGE)
    }

    /// Ends the sessions whose lease ran out: (id, (held, address, stored)) of each.
    pub fn expire(&mut self, now: u64) -> Vec<(u64, (u64, u64, u64))> {
        let old: Vec<u64> = self
            .sessions
            .iter()
            .filter(|(_, s)| now.saturating_sub(s.last) > s.lease_ns.unwrap_or(self.lease_ns))
            .map(|(&id, _)| id)
            .collect();
        old.into_iter()
            .filter_map(|id| self.close(id).map(|c| (id, c)))
            .collect()
    }

    /// Bytes session `id` holds (0: no such session).
    pub fn held_bytes(&self, id: u64) -> u64 {
        self.sessions
            .get(&id)
            .map_or(0, |s| s.pages.len() as u64 * proto::PAGE)
    }

    pub fn used_bytes(&self) -> u64 {
        self.used * proto::PAGE
    }

    pub fn sessions(&self) -> usize {
        self.sessions.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use attune_proto::remote::Op;

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
        let (a, _) = st.open(1 << 20, 1, 0, [1; 16], 0);
        let (b, _) = st.open(1 << 20, 2, 0, [2; 16], 0);
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
        let (a, granted) = st.open(1 << 20, 1, 0, [1; 16], 0);
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
        let (b, _) = st.open(1 << 20, 2, 0, [2; 16], 0);
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

    #[test]
    fn an_exiting_runtimes_session_lasts_its_grace_after_its_last_request() {
        // Lease 1000 ns; times in ns, graces in ms.
        let mut st = Store::new(1 << 20, 1 << 20, 1000);
        let (a, _) = st.open(1 << 20, 1, 0, [1; 16], 0);
        let (b, _) = st.open(1 << 20, 2, 0, [2; 16], 0);
        st.store(&hdr(a, [1; 16], 0, 4096), &[1; 4096], 0).unwrap();
        let mut bye = hdr(a, [9; 16], 0, 0);
        bye.op = Op::Bye as u16;
        // Only the session's token shortens it.
        assert_eq!(st.shorten(&bye, 0), Err(libc::EACCES));
        // A grace that would overflow in ns is the server's lease at most; 0 ms: freed
        // at the next expiry after the last request.
        bye.token = [1; 16];
        bye.off = u64::MAX;
        assert_eq!(st.shorten(&bye, 0), Ok(4096));
        bye.off = 0;
        assert_eq!(st.shorten(&bye, 10), Ok(4096));
        // A request during the exit is served and renews it.
        let mut out = [0u8; 4096];
        st.load(&hdr(a, [1; 16], 0, 4096), &mut out, 20).unwrap();
        assert_eq!(out, [1; 4096]);
        assert!(st.expire(20).is_empty());
        assert_eq!(st.expire(21), vec![(a, (4096, 1, 4096))]);
        // The other session keeps the server's lease.
        assert!(st.expire(1000).is_empty());
        assert_eq!(st.expire(1001), vec![(b, (0, 2, 0))]);
    }

    #[test]
    fn a_hello_from_an_address_supersedes_its_attached_sessions_only() {
        let mut st = Store::new(1 << 20, 1 << 20, 1000);
        let (a, _) = st.open(1 << 20, 1, 0, [1; 16], 0);
        let (other, _) = st.open(1 << 20, 2, 0, [2; 16], 0);
        // A clone of a answers to a's address until its runtime takes it over.
        let (c, _) = st
            .clone_session(&hdr(a, [1; 16], 0, 0), [3; 16], 0)
            .unwrap();
        // Another job's runtime that names a's address in its hello ends nothing.
        let (x, _) = st.open(1 << 20, 1, 1, [6; 16], 0);
        assert!(st.superseded(1, x).is_empty());
        // A new runtime on a's address (a reused port): a is over, the clone and the
        // other address's session are not.
        let (b, _) = st.open(1 << 20, 1, 0, [4; 16], 0);
        assert_eq!(st.superseded(1, b), vec![a]);
        assert!(st.superseded(2, other).is_empty());
        // The forked runtime takes the clone over from its own address, where a dead
        // runtime's session was: that one is over, the clone is kept.
        let (dead, _) = st.open(1 << 20, 9, 0, [5; 16], 0);
        st.attach(&hdr(c, [3; 16], 0, 0), 9, [7; 16], 0).unwrap();
        assert_eq!(st.superseded(9, c), vec![dead]);
        assert!(st.superseded(1, b).contains(&a) && !st.superseded(1, b).contains(&c));
    }

    #[test]
    fn a_clone_shares_pages_until_either_side_writes_and_is_bounded_as_they_are() {
        let mut st = Store::new(16 << 10, 16 << 10, 1000);
        let (a, _) = st.open(1 << 20, 1, 0, [1; 16], 0);
        st.store(&hdr(a, [1; 16], 0, 8192), &[1; 8192], 0).unwrap();
        // Only the session's own token clones it.
        assert_eq!(
            st.clone_session(&hdr(a, [2; 16], 0, 0), [3; 16], 0),
            Err(libc::EACCES)
        );
        let (c, granted) = st
            .clone_session(&hdr(a, [1; 16], 0, 0), [3; 16], 0)
            .unwrap();
        assert_eq!(granted, 16 << 10);
        assert_eq!(st.used_bytes(), 8192, "a clone takes no room until written");
        let mut out = vec![0u8; 8192];
        st.load(&hdr(c, [3; 16], 0, 8192), &mut out, 0).unwrap();
        assert!(
            out.iter().all(|&b| b == 1),
            "the clone reads the pages as they were"
        );
        // Writes on either side stay on that side, and a shared page written takes room.
        st.store(&hdr(c, [3; 16], 0, 4096), &[7; 4096], 0).unwrap();
        st.store(&hdr(a, [1; 16], 4096, 4096), &[8; 4096], 0)
            .unwrap();
        assert_eq!(st.used_bytes(), 16384);
        st.load(&hdr(a, [1; 16], 0, 8192), &mut out, 0).unwrap();
        assert!(out[..4096].iter().all(|&b| b == 1) && out[4096..].iter().all(|&b| b == 8));
        st.load(&hdr(c, [3; 16], 0, 8192), &mut out, 0).unwrap();
        assert!(out[..4096].iter().all(|&b| b == 7) && out[4096..].iter().all(|&b| b == 1));
        // The server is full: writing a page still shared would need room there is not.
        let (d, _) = st
            .clone_session(&hdr(c, [3; 16], 0, 0), [4; 16], 0)
            .unwrap();
        assert_eq!(
            st.store(&hdr(d, [4; 16], 0, 4096), &[9; 4096], 0),
            Err(libc::ENOSPC)
        );
        assert_eq!(st.close(d), Some((8192, 1, 0)));
        assert_eq!(
            st.used_bytes(),
            16384,
            "closing a clone frees only what it alone held"
        );
        // Attaching moves replies to the runtime's own address; the old one stays in use
        // by the session the clone came from.
        assert_eq!(
            st.attach(&hdr(c, [1; 16], 0, 0), 9, [5; 16], 0),
            Err(libc::EACCES)
        );
        let took = |old_fi, clone, token| Attached {
            granted: 16 << 10,
            old_fi,
            clone,
            token,
        };
        assert_eq!(
            st.attach(&hdr(c, [3; 16], 0, 0), 9, [5; 16], 0),
            Ok(took(1, true, [5; 16]))
        );
        assert!(st.addressed(1) && st.addressed(9));
        // The same runtime again from a new endpoint (its connection broke): not a clone
        // any more, and its replies go to the new address.
        assert_eq!(
            st.attach(&hdr(c, [5; 16], 0, 0), 11, [6; 16], 0),
            Ok(took(9, false, [6; 16]))
        );
        assert_eq!(st.address(c), Some(11));
        assert!(!st.addressed(9));
        assert_eq!(
            st.attach(&hdr(c, [6; 16], 0, 0), 9, [3; 16], 0),
            Ok(took(11, false, [3; 16]))
        );
        st.discard(&hdr(c, [3; 16], 0, 8192), 0).unwrap();
        assert_eq!(st.used_bytes(), 8192, "a's two pages");
        assert_eq!(st.close(a), Some((8192, 1, 12288)));
        assert_eq!(st.used_bytes(), 0);
        assert!(!st.addressed(1));
    }

    #[test]
    fn a_takeover_fences_requests_sent_before_it() {
        let mut st = Store::new(1 << 20, 1 << 20, 1000);
        let (a, _) = st.open(1 << 20, 1, 0, [1; 16], 0);
        st.store(&hdr(a, [1; 16], 0, 4096), &[1; 4096], 0).unwrap();
        // The runtime moves to a new endpoint: its session gets a new token.
        let t = st.attach(&hdr(a, [1; 16], 0, 0), 2, [2; 16], 0).unwrap();
        assert_eq!((t.old_fi, t.clone, t.token), (1, false, [2; 16]));
        // It stores the page again from there, then newer contents.
        st.store(&hdr(a, [2; 16], 0, 4096), &[1; 4096], 0).unwrap();
        st.store(&hdr(a, [2; 16], 0, 4096), &[3; 4096], 0).unwrap();
        // The first store, sent from the old endpoint, arrives late: refused, and so is
        // every other request made with the old token.
        assert_eq!(
            st.store(&hdr(a, [1; 16], 0, 4096), &[1; 4096], 0),
            Err(libc::EACCES)
        );
        let mut out = vec![0u8; 4096];
        assert_eq!(
            st.load(&hdr(a, [1; 16], 0, 4096), &mut out, 0),
            Err(libc::EACCES)
        );
        assert_eq!(st.discard(&hdr(a, [1; 16], 0, 4096), 0), Err(libc::EACCES));
        assert_eq!(st.check(&hdr(a, [1; 16], 0, 0), 0), None);
        st.load(&hdr(a, [2; 16], 0, 4096), &mut out, 0).unwrap();
        assert!(out.iter().all(|&b| b == 3), "the newest contents");
        // The takeover's hello again (its reply was lost): the current token, unchanged.
        let again = st.attach(&hdr(a, [1; 16], 0, 0), 2, [9; 16], 0).unwrap();
        assert_eq!((again.old_fi, again.token), (2, [2; 16]));
        // A second move: the first token is good for nothing now.
        st.attach(&hdr(a, [2; 16], 0, 0), 3, [4; 16], 0).unwrap();
        assert_eq!(
            st.attach(&hdr(a, [1; 16], 0, 0), 1, [8; 16], 0),
            Err(libc::EACCES)
        );
        assert_eq!(st.address(a), Some(3));
    }
}
