//! `attuned`: the Tiered Memory Manager, one per node. Grants DRAM budgets to the
//! co-located workflows' runtimes, keeps shared regions, serves status and metrics.
//!
//! Layout: `config.rs` (options), `server.rs` (socket, requests), `state.rs` (clients,
//! workflows, budgets, shared regions), `metrics.rs` (Prometheus endpoint), `stage.rs` (staged inputs); `main.rs`
//! starts them. The budget policy itself is pure: `attune_policy::share`. A library so
//! that the request handling can be driven without a socket (`fuzz/`, tests).

#![forbid(unsafe_code)]

pub mod config;
pub mod metrics;
pub mod server;
pub mod stage;
pub mod state;

/// One line on standard error: the daemon's own events.
pub fn log(m: &str) {
    eprintln!("attuned: {m}");
}

/// Lines a user's requests may log: a burst, then a steady rate per second.
const LOG_BURST: f64 = 50.0;
const LOG_RATE: f64 = 5.0;

/// One line about a request of user `uid`, rate-limited per user: every refused frame and
/// every region a user creates is logged, so without a limit one user could flood the
/// node's log (and hide the others' lines in it). Lines over the limit are counted and
/// the count is logged with the user's next line.
pub fn log_user(uid: u32, m: &str) {
    use std::collections::HashMap;
    use std::sync::Mutex;
    use std::time::Instant;
    // Per uid: tokens, last refill, lines suppressed since the last one logged.
    static BUCKETS: Mutex<Option<HashMap<u32, (f64, Instant, u64)>>> = Mutex::new(None);
    let mut g = BUCKETS.lock().unwrap_or_else(|p| p.into_inner());
    let now = Instant::now();
    let b = g
        .get_or_insert_with(HashMap::new)
        .entry(uid)
        .or_insert((LOG_BURST, now, 0));
    b.0 = (b.0 + now.duration_since(b.1).as_secs_f64() * LOG_RATE).min(LOG_BURST);
    b.1 = now;
    if b.0 < 1.0 {
        b.2 += 1;
        return;
    }
    b.0 -= 1.0;
    let dropped = std::mem::take(&mut b.2);
    drop(g);
    if dropped > 0 {
        log(&format!(
            "{m} ({dropped} earlier lines of uid {uid} not logged: rate limit)"
        ));
    } else {
        log(m);
    }
}
