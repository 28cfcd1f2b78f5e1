//! The remote tier's messages: a runtime and `attune memserver` over libfabric
//! (docs/design/remote.md).
//!
//! **Framing.** Every message is one fabric message: a fixed [`HEADER`]-byte header and
//! `len` bytes of payload (a store's pages, a load's reply, a hello's secret and address).
//! Requests are untagged; each reply is tagged with the request's `seq`, so that a client
//! with several requests in flight to several servers receives each reply into the
//! buffer posted for it. All integers are little-endian.
//!
//! **Flow.** A runtime says `Hello` with the job's secret and its own fabric address, and
//! gets a session number and a random token; every later request carries both, and the
//! server serves a request only when they match one of its sessions. A session's pages
//! are reachable through that session only, and are dropped with it: `Bye`, or no request
//! for the lease (the runtime pings while it holds pages). A runtime that exits says
//! `Bye` with a grace: its pages go that long after its last request, not a lease later.
//!
//! **Fork.** Before a runtime forks, it asks each server to `Clone` its session: a new
//! session (new number and token) whose pages are the parent's, shared on the server
//! until either side writes one. The child opens an endpoint of its own and says `Hello`
//! naming the clone's number and token in the header: the server checks the secret and
//! the token and sends that session's replies to the child's address from then on.

/// "ATRM".
pub const MAGIC: u32 = 0x4d52_5441;
pub const VERSION: u16 = 1;
/// Bytes of the header of every message.
pub const HEADER: usize = 64;
/// Most payload bytes in one message (a store or load of one run of at most 2 MiB).
pub const MAX_PAYLOAD: usize = 2 << 20;
/// Longest job secret, in bytes.
pub const SECRET_MAX: usize = 256;
/// Longest fabric address.
pub const ADDR_MAX: usize = 256;
/// Pages are stored and found by 4 KiB page.
pub const PAGE: u64 = 4096;

/// What a request asks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u16)]
pub enum Op {
    /// Opens a session: payload = secret and the client's address; `off` = bytes asked.
    /// With a session and its token in the header: takes that session over from this
    /// address (a forked runtime and the clone made for it).
    Hello = 1,
    /// Keeps the pages of `[off, off+len)`: payload = the pages.
    Store = 2,
    /// Sends the pages of `[off, off+len)` back (pages never stored read as zeros).
    Load = 3,
    /// Drops the pages of `[off, off+len)`.
    Discard = 4,
    /// Ends the session and drops its pages; with `off` > 0, its runtime is exiting:
    /// the pages are dropped `off` ms after the session's last request (a request made
    /// meanwhile is served).
    Bye = 5,
    /// Keeps the session's lease.
    Ping = 6,
    /// Copies the session for a forked child: the reply names the copy (session, token,
    /// `value` = bytes granted). Pages are shared until written.
    Clone = 7,
}

impl Op {
    pub fn from_u16(v: u16) -> Option<Op> {
        Some(match v {
            1 => Op::Hello,
            2 => Op::Store,
            3 => Op::Load,
            4 => Op::Discard,
            5 => Op::Bye,
            6 => Op::Ping,
            7 => Op::Clone,
            _ => return None,
        })
    }
}

/// The header of a request or reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Header {
    /// The request (a reply repeats its request's).
    pub op: u16,
    /// The request's number; its reply is tagged with it.
    pub seq: u64,
    pub session: u64,
    pub token: [u8; 16],
    /// Byte offset in the session's space (Hello: bytes asked for).
    pub off: u64,
    /// Payload bytes (a request's pages; a load's reply; a hello's payload).
    pub len: u32,
    /// Replies: 0 or an errno value (ENOSPC full, EACCES bad secret or token, ...).
    pub status: i32,
    /// Replies: Hello, the bytes the server grants; others, 0.
    pub value: u64,
}

/// Why a message was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bad {
    Short,
    Magic,
    Version,
    Op,
    Len,
    Unaligned,
}

impl std::fmt::Display for Bad {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Bad::Short => "shorter than a header",
            Bad::Magic => "not an Attune remote-tier message",
            Bad::Version => "another protocol version",
            Bad::Op => "unknown request",
            Bad::Len => "payload length out of bounds",
            Bad::Unaligned => "range not page-aligned",
        })
    }
}

impl Header {
    pub fn encode(&self) -> [u8; HEADER] {
        let mut b = [0u8; HEADER];
        b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        b[4..6].copy_from_slice(&VERSION.to_le_bytes());
        b[6..8].copy_from_slice(&self.op.to_le_bytes());
        b[8..16].copy_from_slice(&self.seq.to_le_bytes());
        b[16..24].copy_from_slice(&self.session.to_le_bytes());
        b[24..40].copy_from_slice(&self.token);
        b[40..48].copy_from_slice(&self.off.to_le_bytes());
        b[48..52].copy_from_slice(&self.len.to_le_bytes());
        b[52..56].copy_from_slice(&self.status.to_le_bytes());
        b[56..64].copy_from_slice(&self.value.to_le_bytes());
        b
    }

    /// Reads a header and checks what holds for every message: magic, version, a known
    /// request, a payload within bounds, and (stores, loads, discards) a page-aligned
    /// range. `received`: bytes that arrived (header included).
    pub fn decode(b: &[u8], received: usize) -> Result<Header, Bad> {
        if b.len() < HEADER || received < HEADER {
            return Err(Bad::Short);
        }
        let u64at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
        if u32::from_le_bytes(b[0..4].try_into().unwrap()) != MAGIC {
            return Err(Bad::Magic);
        }
        if u16::from_le_bytes(b[4..6].try_into().unwrap()) != VERSION {
            return Err(Bad::Version);
        }
        let op = u16::from_le_bytes(b[6..8].try_into().unwrap());
        let o = Op::from_u16(op).ok_or(Bad::Op)?;
        let h = Header {
            op,
            seq: u64at(8),
            session: u64at(16),
            token: b[24..40].try_into().unwrap(),
            off: u64at(40),
            len: u32::from_le_bytes(b[48..52].try_into().unwrap()),
            status: i32::from_le_bytes(b[52..56].try_into().unwrap()),
            value: u64at(56),
        };
        if h.len as usize > MAX_PAYLOAD {
            return Err(Bad::Len);
        }
        if matches!(o, Op::Store | Op::Load | Op::Discard)
            && (h.off % PAGE != 0
                || h.len as u64 % PAGE != 0
                || h.off.checked_add(h.len as u64).is_none())
        {
            return Err(Bad::Unaligned);
        }
        Ok(h)
    }
}

/// A hello's payload: the secret and the client's fabric address.
pub fn encode_hello(secret: &[u8], addr: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(4 + secret.len() + addr.len());
    v.extend_from_slice(&(secret.len() as u16).to_le_bytes());
    v.extend_from_slice(&(addr.len() as u16).to_le_bytes());
    v.extend_from_slice(secret);
    v.extend_from_slice(addr);
    v
}

/// Splits a hello's payload into (secret, address), within their bounds.
pub fn decode_hello(p: &[u8]) -> Result<(&[u8], &[u8]), Bad> {
    if p.len() < 4 {
        return Err(Bad::Short);
    }
    let s = u16::from_le_bytes([p[0], p[1]]) as usize;
    let a = u16::from_le_bytes([p[2], p[3]]) as usize;
    if s > SECRET_MAX || a > ADDR_MAX || a == 0 || 4 + s + a > p.len() {
        return Err(Bad::Len);
    }
    Ok((&p[4..4 + s], &p[4 + s..4 + s + a]))
}

/// Compares secrets in time that depends on their lengths only.
pub fn same_secret(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_survives_encoding() {
        let h = Header {
            op: Op::Store as u16,
            seq: 7,
            session: 3,
            token: [9; 16],
            off: 8192,
            len: 4096,
            status: -1,
            value: u64::MAX,
        };
        assert_eq!(Header::decode(&h.encode(), HEADER), Ok(h));
    }

    #[test]
    fn bad_headers_are_refused_by_reason() {
        let ok = Header {
            op: Op::Load as u16,
            off: 4096,
            len: 4096,
            ..Default::default()
        };
        let mut b = ok.encode();
        assert_eq!(Header::decode(&b[..10], 10), Err(Bad::Short));
        assert_eq!(Header::decode(&b, 10), Err(Bad::Short));
        b[0] ^= 1;
        assert_eq!(Header::decode(&b, HEADER), Err(Bad::Magic));
        let mut b = ok.encode();
        b[4] = 2;
        assert_eq!(Header::decode(&b, HEADER), Err(Bad::Version));
        let b = Header { op: 99, ..ok }.encode();
        assert_eq!(Header::decode(&b, HEADER), Err(Bad::Op));
        let b = Header {
            len: MAX_PAYLOAD as u32 + 4096,
            ..ok
        }
        .encode();
        assert_eq!(Header::decode(&b, HEADER), Err(Bad::Len));
        let b = Header { off: 100, ..ok }.encode();
        assert_eq!(Header::decode(&b, HEADER), Err(Bad::Unaligned));
        let b = Header {
            off: u64::MAX - 4095,
            ..ok
        }
        .encode();
        assert_eq!(Header::decode(&b, HEADER), Err(Bad::Unaligned));
    }

    #[test]
    fn hello_payloads_are_bounded() {
        let p = encode_hello(b"secret", b"addr");
        assert_eq!(decode_hello(&p), Ok((&b"secret"[..], &b"addr"[..])));
        assert_eq!(decode_hello(&p[..6]), Err(Bad::Len));
        assert_eq!(decode_hello(&encode_hello(b"s", b"")), Err(Bad::Len));
        assert_eq!(decode_hello(&encode_hello(&[1; 300], b"a")), Err(Bad::Len));
        assert!(same_secret(b"abc", b"abc"));
        assert!(!same_secret(b"abc", b"abd"));
        assert!(!same_secret(b"abc", b"ab"));
    }
}
