//! The daemon's request handling, driven by several clients of several users.
//!
//! Input: records of (client, frame bytes): client = first byte % 4 (clients 0-3 are
//! uids 0, 1000, 1001, 65534); the frame is a length byte then that many bytes of JSON,
//! decoded with the daemon's own reader and handled as its connection thread would.
//! Checked after each request: no panic; shared regions within `shared_max`; grants
//! within the pool; pool segments within the far pool; every reply (the status reply above all, which any user may ask for)
//! fits in one frame; a client's departure releases what it held. A stage request gets a
//! pipe of the next bytes of the input as its source; staged inputs are the only regions
//! left when every client has gone, and root unstages them.
#![no_main]

use attune_proto::{FrameReader, Reply, Request};
use attuned::state::{Placement, State, Writer};
use libfuzzer_sys::fuzz_target;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};

const UIDS: [u32; 4] = [0, 1000, 1001, 65534];

fn config() -> attuned::config::DaemonConfig {
    let o = |k: &'static str, v: &str| (k, v.to_string());
    attuned::config::load(
        None,
        &[
            o("dram", "1G"),
            o("min_grant", "16M"),
            o("shared_max", "64M"),
            o("far_pool", "8M"),
            o("socket", "/nonexistent/attuned.sock"),
            o("metrics", "off"),
        ],
        4 << 30,
        None,
    )
    .expect("the fuzz target's configuration")
}

fuzz_target!(|data: &[u8]| {
    let mut st = State::new(config(), Vec::new());
    // Each client's socket pair: pushes go to a non-blocking end nobody reads (a full one
    // is shut down, as the daemon does with a client that stops reading).
    let mut keep = Vec::new();
    let mut ids = Vec::new();
    for (i, uid) in UIDS.iter().enumerate() {
        let (a, b) = UnixStream::pair().unwrap();
        a.set_nonblocking(true).unwrap();
        let w: Writer = Arc::new(Mutex::new(a));
        ids.push(st.add_client(1000 + i as i32, *uid, Default::default(), w));
        keep.push(b);
    }
    let mut readers: Vec<FrameReader> = (0..UIDS.len()).map(|_| FrameReader::default()).collect();
    let mut rest = data;
    while rest.len() >= 2 {
        let who = rest[0] as usize % UIDS.len();
        let len = (rest[1] as usize).min(rest.len() - 2);
        let body = &rest[2..2 + len];
        rest = &rest[2 + len..];
        if rest.first() == Some(&0xff) {
            // A departure: the client goes, and a new one of the same user comes.
            rest = &rest[1..];
            st.remove_client(ids[who]);
            let (a, b) = UnixStream::pair().unwrap();
            a.set_nonblocking(true).unwrap();
            ids[who] = st.add_client(
                2000 + who as i32,
                UIDS[who],
                Placement {
                    job: format!("{who}"),
                    mem_limit: 64 << 20,
                    // Two groups, so the peers' sums are told (`State::tell_peers`).
                    mem_group: format!("/sys/fs/cgroup/memory/fuzz{}", who % 2),
                },
                Arc::new(Mutex::new(a)),
            );
            keep.push(b);
            readers[who] = FrameReader::default();
            continue;
        }
        readers[who].feed(&(body.len() as u32).to_le_bytes());
        readers[who].feed(body);
        let mut req = match readers[who].next::<Request>(Request::fds) {
            Some(Ok((req, fds))) => (req, fds),
            // A malformed frame closes the connection.
            Some(Err(_)) | None => {
                readers[who] = FrameReader::default();
                continue;
            }
        };
        if let (Request::Stage { fds: 0, .. }, true) = (&req.0, req.1.is_empty()) {
            // A stage request's source: a pipe with the next record's bytes, then its end.
            let n = rest
                .first()
                .map_or(0, |&n| n as usize)
                .min(rest.len().saturating_sub(1));
            let (r, mut w) = std::io::pipe().unwrap();
            // (From the start of an empty rest: `1..1` would be out of it.)
            let from = 1.min(rest.len());
            std::io::Write::write_all(&mut w, &rest[from..from + n]).unwrap();
            drop(w);
            rest = &rest[from + n..];
            req.1.push(std::os::fd::OwnedFd::from(r));
        }
        st.requests += 1;
        if let Some((reply, _fd)) =
            attuned::server::handle(&mut st, ids[who], UIDS[who], req.0, req.1)
        {
            check_reply(&reply);
        }
        st.rebalance();
        check(&st);
    }
    for id in ids {
        st.remove_client(id);
    }
    // Only staged inputs outlive their clients, and root's unstage frees each.
    let staged: Vec<String> = st.shared.keys().cloned().collect();
    for name in staged {
        assert!(
            st.shared[&name].staged(),
            "region '{name}' outlives every client"
        );
        attuned::stage::unstage(&mut st, 0, 1, &name);
    }
    assert!(st.shared.is_empty(), "regions outlive every client");
});

fn check_reply(r: &Reply) {
    let frame = attune_proto::encode(r);
    assert!(
        frame.is_ok(),
        "a reply does not fit in a frame: {:?}",
        frame.err()
    );
}

fn check(st: &State) {
    assert!(
        st.shared_bytes() <= st.cfg.shared_max,
        "shared regions beyond shared_max"
    );
    let pool = st.cfg.dram.saturating_sub(st.shared_bytes());
    let granted: u64 = st
        .clients
        .values()
        .filter_map(|c| c.reg.as_ref())
        .map(|r| r.grant)
        .sum();
    assert!(granted <= pool, "{granted} granted of a pool of {pool}");
    // The pool segments (allocated memory) never hold more than the far pool.
    let far_pool = st.cfg.far_pool.unwrap_or(0);
    assert!(
        st.pool_bytes() <= far_pool,
        "{} bytes of pool segments in a far pool of {far_pool}",
        st.pool_bytes()
    );
    // Every user's status, page by page: each page fits, pages advance, and a user
    // other than root sees no other user's workflow.
    for uid in UIDS {
        let mut from = 0;
        loop {
            let status = attuned::server::status_for(st, uid, from);
            if uid != 0 {
                assert!(
                    status.workflows.iter().all(|w| w.uid == uid),
                    "uid {uid} sees another's workflow"
                );
            }
            let next = status.next;
            check_reply(&Reply::Status {
                id: 1,
                status: Box::new(status),
            });
            match next {
                Some(n) => {
                    assert!(n > from, "a status page did not advance");
                    from = n;
                }
                None => break,
            }
        }
    }
}
