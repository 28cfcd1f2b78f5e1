//! The memory server's state and rules, apart from its fabric loop (`attune memserver`,
//! crates/attune-cli/src/cmd/memserver.rs) so that they are tested and fuzzed without a
//! network: sessions, whose pages only their token reaches; the server's and each
//! session's bounds (a store that does not fit is refused whole); leases.

use attune_proto::remote::{self as proto, Header};
use std::collections::HashMap;

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
    pub lease_ns: u64,
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
