//! The memory server's requests (`attune memserver`), as its loop reads them: headers,
//! hellos, and the store's rules behind them.
//!
//! Input: a sequence of messages, each a length byte (in 64-byte steps, so payloads reach
//! whole pages), a selector byte and that many bytes. Two sessions are open; a `Clone` of
//! the first makes a third (a forked runtime's). The selector may put a session's real
//! token in the header, so requests get past the check, or its token from before its last
//! takeover (a hello naming the session gives it a new token), which only a takeover's
//! hello may name again. Checked: no panic; a message that
//! decodes encodes to the same bytes; the server never holds more than its capacity nor a
//! session more than its grant, and holds a page shared by a session and its clone once;
//! a load returns only zeros or the bytes its own session stored (a session's stores are
//! tagged with its number), or for the clone what the first session stored, never
//! another session's.
#![no_main]

use attune_cli::memstore::Store;
use attune_proto::remote::{self as proto, Header, Op};
use libfuzzer_sys::fuzz_target;

const CAP: u64 = 64 << 10;
const PER: u64 = 40 << 10;

fuzz_target!(|data: &[u8]| {
    let mut st = Store::new(CAP, PER, 1000);
    let mut tokens = [[0xa1u8; 16], [0xb2u8; 16], [0xc3u8; 16]];
    // Each session's token before its last takeover (good for the takeover's hello only).
    let mut prev: [Option<[u8; 16]>; 3] = [None; 3];
    let mut ids = vec![
        st.open(1 << 30, 1, 0, tokens[0], 0).0,
        st.open(PER / 2, 2, 1, tokens[1], 0).0,
    ];
    let grants = [PER, PER / 2, PER];
    let mut held = [0u64; 3];
    let mut i = 0;
    let mut now = 0;
    while i + 2 <= data.len() {
        let len = (data[i] as usize * 64).min(data.len() - i - 2);
        let sel = data[i + 1];
        let mut msg = data[i + 2..i + 2 + len].to_vec();
        i += 2 + len;
        now += 1;
        let Ok(mut h) = Header::decode(&msg, msg.len()) else {
            continue;
        };
        assert_eq!(&h.encode()[..], &msg[..proto::HEADER]);
        let payload_len = msg.len() - proto::HEADER;
        let who = if sel & 4 != 0 && ids.len() > 2 {
            2
        } else {
            (sel & 1) as usize
        };
        if h.op == Op::Hello as u16 {
            if let Ok((s, a)) = proto::decode_hello(&msg[proto::HEADER..]) {
                assert!(
                    s.len() <= proto::SECRET_MAX && !a.is_empty() && a.len() <= proto::ADDR_MAX
                );
            }
            // A takeover (the session named, with its token, the one before, or any other):
            // a new token with the current one, the current token with the one before.
            if sel & 2 != 0 {
                h.session = ids[who];
                h.token = if sel & 8 != 0 {
                    prev[who].unwrap_or(tokens[who])
                } else {
                    tokens[who]
                };
            }
            let fresh = [now as u8 ^ 0x5a; 16];
            let r = st.attach(&h, 7, fresh, now);
            match ids.iter().position(|&id| id == h.session) {
                Some(k) if h.token == tokens[k] => {
                    assert_eq!(r.map(|t| t.token), Ok(fresh));
                    prev[k] = Some(tokens[k]);
                    tokens[k] = fresh;
                }
                Some(k) if Some(h.token) == prev[k] => {
                    assert_eq!(r.map(|t| t.token), Ok(tokens[k]))
                }
                _ => assert_eq!(r, Err(libc::EACCES)),
            }
            continue;
        }
        if sel & 2 != 0 {
            h.session = ids[who];
            h.token = if sel & 8 != 0 {
                prev[who].unwrap_or(tokens[who])
            } else {
                tokens[who]
            };
        }
        let known = ids
            .iter()
            .zip(&tokens)
            .position(|(&id, t)| id == h.session && *t == h.token);
        // Payloads within the header's length, page-aligned, as the loop passes them.
        let n = (h.len as usize).min(payload_len) / 4096 * 4096;
        match Op::from_u16(h.op).unwrap() {
            Op::Store => {
                let tag = known.map_or(0xee, |k| k as u8 + 1);
                msg[proto::HEADER..proto::HEADER + n].fill(tag);
                let r = st.store(&h, &msg[proto::HEADER..proto::HEADER + n], now);
                assert!(known.is_some() || r == Err(libc::EACCES));
            }
            Op::Load => {
                let mut out = vec![0x55u8; n];
                let r = st.load(&h, &mut out, now);
                match known {
                    Some(k) => {
                        assert_eq!(r, Ok(()));
                        // The clone (2) also reads what session 0 stored before it.
                        let ok = |b: u8| b == 0 || b == k as u8 + 1 || (k == 2 && b == 1);
                        assert!(out.iter().all(|&b| ok(b)), "another session's bytes");
                    }
                    None => assert_eq!(r, Err(libc::EACCES)),
                }
            }
            Op::Discard => {
                let r = st.discard(&h, now);
                assert!(known.is_some() || r == Err(libc::EACCES));
            }
            // An exiting runtime's bye shortens the lease (any grace, even one that would
            // overflow in ns); its pages stay until it runs out.
            Op::Bye if h.off > 0 => {
                let r = st.shorten(&h, now);
                match known {
                    Some(k) => assert_eq!(r, Ok(st.held_bytes(ids[k]))),
                    None => assert_eq!(r, Err(libc::EACCES)),
                }
            }
            // One clone, of the first session (more would be sessions nobody tracks).
            Op::Clone => match known {
                None => assert_eq!(st.clone_session(&h, tokens[2], now), Err(libc::EACCES)),
                Some(0) if ids.len() == 2 => {
                    ids.push(st.clone_session(&h, tokens[2], now).unwrap().0)
                }
                Some(_) => {}
            },
            _ => {}
        }
        assert!(st.used_bytes() <= CAP, "over capacity");
        for k in 0..ids.len() {
            held[k] = st.held_bytes(ids[k]);
            assert!(held[k] <= grants[k], "session {k} over its grant");
        }
        // Without clones every page is held once; shared pages count once.
        let (sum, max) = (held.iter().sum::<u64>(), *held.iter().max().unwrap());
        assert!(
            st.used_bytes() <= sum && st.used_bytes() >= max,
            "{held:?} {}",
            st.used_bytes()
        );
        if ids.len() == 2 {
            assert_eq!(sum, st.used_bytes());
        }
    }
});
