//! `attune daemon-bench`: the node daemon's control plane under load. N clients, each
//! on its own connection, send requests back to back for a while; the result is
//! completed requests per second for three kinds:
//! * `ping`: the protocol's round trip (framing, credentials, the state lock);
//! * `shared`: open and close of an existing shared region (a memory file passed each
//!   time): the allocation path;
//! * `budget`: a usage report that changes the client's demand, so the daemon recomputes
//!   every grant and pushes the changed ones (a ping after each keeps it synchronous).

use attune_proto::{FrameReader, Reply, Request, Usage};
use clap::Parser;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Parser)]
pub struct Args {
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// Concurrent clients.
    #[arg(long, default_value_t = 4)]
    pub clients: usize,
    /// Seconds per kind.
    #[arg(long, default_value_t = 2.0)]
    pub seconds: f64,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// Reads until the reply with `id` (grants pushed meanwhile are skipped).
fn wait(s: &UnixStream, rd: &mut FrameReader, id: u64) -> Result<Reply, String> {
    loop {
        let (r, _fds) = rd.read(s, Reply::fds).map_err(|e| e.to_string())?;
        match &r {
            Reply::Grant { .. } => continue,
            Reply::Pong { id: i }
            | Reply::Ok { id: i }
            | Reply::Shared { id: i, .. }
            | Reply::Error { id: i, .. }
                if *i == id =>
            {
                return Ok(r)
            }
            _ => continue,
        }
    }
}

fn client(
    socket: &std::path::Path,
    k: usize,
    kind: &str,
    stop: &AtomicBool,
    done: &AtomicU64,
) -> Result<(), String> {
    let s = attune_proto::connect(socket, Duration::from_secs(10)).map_err(|e| e.to_string())?;
    let mut rd = FrameReader::default();
    let hello = Request::Hello {
        version: attune_proto::VERSION,
        workflow: format!("bench-{k}"),
        flags: "CAP".into(),
        want: 64 << 20,
        protected: 0,
        shared: vec![],
        pool: false,
        pool_held: false,
        board: false,
        fds: 0,
    };
    attune_proto::write_frame(&s, &hello, &[]).map_err(|e| e.to_string())?;
    loop {
        match rd.read(&s, Reply::fds).map_err(|e| e.to_string())?.0 {
            Reply::Welcome { .. } => break,
            Reply::Grant { .. } => continue,
            w => return Err(format!("hello refused: {w:?}")),
        }
    }
    let name = format!("bench-{k}");
    let mut id = 1u64;
    if kind == "shared" {
        attune_proto::write_frame(
            &s,
            &Request::SharedOpen {
                id,
                name: name.clone(),
                size: 1 << 20,
                flags: String::new(),
            },
            &[],
        )
        .map_err(|e| e.to_string())?;
        wait(&s, &mut rd, id)?;
    }
    let mut n = 0u64;
    while !stop.load(Relaxed) {
        id += 1;
        match kind {
            "ping" => {
                attune_proto::write_frame(&s, &Request::Ping { id }, &[])
                    .map_err(|e| e.to_string())?;
                wait(&s, &mut rd, id)?;
                n += 1;
            }
            "shared" => {
                attune_proto::write_frame(
                    &s,
                    &Request::SharedOpen {
                        id,
                        name: name.clone(),
                        size: 0,
                        flags: String::new(),
                    },
                    &[],
                )
                .map_err(|e| e.to_string())?;
                wait(&s, &mut rd, id)?;
                id += 1;
                attune_proto::write_frame(
                    &s,
                    &Request::SharedClose {
                        id,
                        name: name.clone(),
                    },
                    &[],
                )
                .map_err(|e| e.to_string())?;
                wait(&s, &mut rd, id)?;
                n += 2;
            }
            _ => {
                let u = Usage {
                    want: (32 + (id % 64)) << 20,
                    flags: "CAP".into(),
                    ..Default::default()
                };
                attune_proto::write_frame(&s, &Request::Usage(u), &[])
                    .map_err(|e| e.to_string())?;
                attune_proto::write_frame(&s, &Request::Ping { id }, &[])
                    .map_err(|e| e.to_string())?;
                wait(&s, &mut rd, id)?;
                n += 1;
            }
        }
    }
    done.fetch_add(n, Relaxed);
    Ok(())
}

pub fn run(a: Args) -> i32 {
    let socket = a.socket.unwrap_or_else(attune_proto::socket_path);
    if a.clients == 0 || !(a.seconds > 0.0) {
        eprintln!("attune daemon-bench: --clients and --seconds must be positive");
        return 2;
    }
    let mut results = serde_json::Map::new();
    for kind in ["ping", "shared", "budget"] {
        let stop = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicU64::new(0));
        let t0 = Instant::now();
        let hs: Vec<_> = (0..a.clients)
            .map(|k| {
                let (socket, stop, done) = (socket.clone(), stop.clone(), done.clone());
                std::thread::spawn(move || client(&socket, k, kind, &stop, &done))
            })
            .collect();
        std::thread::sleep(Duration::from_secs_f64(a.seconds));
        stop.store(true, Relaxed);
        for h in hs {
            if let Err(e) = h.join().unwrap() {
                eprintln!("attune daemon-bench: {kind}: {e}");
                return 1;
            }
        }
        let rate = done.load(Relaxed) as f64 / t0.elapsed().as_secs_f64();
        results.insert(kind.into(), serde_json::json!(rate.round()));
        if !a.json {
            println!(
                "{kind:<7} {:>10.0} requests/s ({} clients)",
                rate, a.clients
            );
        }
    }
    if a.json {
        println!("{}", serde_json::Value::Object(results));
    }
    0
}
