//! `attuned`: the Tiered Memory Manager, one per node. Grants DRAM budgets to the
//! co-located workflows' runtimes, keeps shared regions, serves status and metrics.
//!
//! Layout: `config.rs` (options), `server.rs` (socket, requests), `state.rs` (clients,
//! workflows, budgets, shared regions), `metrics.rs` (Prometheus endpoint). The budget
//! policy itself is pure: `attune_policy::share`.

#![forbid(unsafe_code)]

mod config;
mod metrics;
mod server;
mod state;

use clap::Parser;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

#[derive(Parser)]
#[command(
    name = "attuned",
    version,
    about = "Attune's node daemon: DRAM budgets for co-located workflows, shared regions, status and metrics"
)]
struct Cli {
    /// TOML file with the options below (the command line wins).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Unix socket to listen on [default: $ATTUNE_SOCKET or /run/attune/attuned.sock].
    #[arg(long)]
    socket: Option<PathBuf>,
    /// DRAM to divide among workflows: a size or a percentage of the machine's [default: 80%].
    #[arg(long)]
    dram: Option<String>,
    /// Smallest grant per workflow [default: 16M].
    #[arg(long)]
    min_grant: Option<String>,
    /// Most bytes of shared regions, a size or a percentage of --dram [default: 25%].
    #[arg(long)]
    shared_max: Option<String>,
    /// Node memory divided among the runtimes' `memory` far tiers (emulated CXL or pooled
    /// memory), a size or a percentage of the machine's, or "off" [default: 15%].
    #[arg(long)]
    far_pool: Option<String>,
    /// Page movement limit, bytes/s, of each non-LAT/SHL workflow while a LAT/SHL one
    /// runs ("off" for none) [default: 1G].
    #[arg(long)]
    move_limit: Option<String>,
    /// DRAM's share of the node's memory bandwidth, percent: what a BW workflow claims of
    /// its want before the others are served; "auto" takes it from HMAT (100 without it)
    /// [default: auto].
    #[arg(long)]
    bw_dram_share: Option<String>,
    /// Prometheus endpoint ADDRESS:PORT on loopback, or "off" [default: 127.0.0.1:9464].
    #[arg(long)]
    metrics: Option<String>,
    /// Most simultaneous client connections [default: 4096].
    #[arg(long)]
    max_clients: Option<usize>,
}

pub fn log(m: &str) {
    eprintln!("attuned: {m}");
}

fn main() {
    let cli = Cli::parse();
    let o = config::Overrides {
        dram: cli.dram,
        min_grant: cli.min_grant,
        shared_max: cli.shared_max,
        far_pool: cli.far_pool,
        move_limit: cli.move_limit,
        bw_dram_share: cli.bw_dram_share,
        socket: cli.socket,
        metrics: cli.metrics,
        max_clients: cli.max_clients,
    };
    let hmat_bw_pct = attune::topology::discover(std::path::Path::new("/")).dram_bandwidth_pct();
    let cfg = match config::load(
        cli.config.as_deref(),
        o,
        attune_sys::os::total_memory(),
        hmat_bw_pct,
    ) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("attuned: configuration: {e}");
            std::process::exit(2);
        }
    };
    let listener = match bind(&cfg.socket) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("attuned: {e}");
            std::process::exit(1);
        }
    };
    let tiers = discover_tiers(cfg.dram);
    let metrics = cfg.metrics.clone();
    log(&format!(
        "listening on {} (DRAM pool {} MiB, {} tier(s){})",
        cfg.socket.display(),
        cfg.dram >> 20,
        tiers.len(),
        metrics
            .as_ref()
            .map(|m| format!(", metrics on http://{m}/metrics"))
            .unwrap_or_default()
    ));
    let state = Arc::new(Mutex::new(state::State::new(cfg, tiers)));
    {
        let st = state.clone();
        if let Err(e) = std::thread::Builder::new()
            .name("attuned-rebalance".into())
            .spawn(move || state::rebalancer(st))
        {
            eprintln!("attuned: cannot start the rebalancer thread: {e}");
            std::process::exit(1);
        }
    }
    if let Some(addr) = metrics {
        if let Err(e) = metrics::serve(&addr, state.clone()) {
            eprintln!("attuned: {e}");
            std::process::exit(1);
        }
    }
    // SIGPIPE cannot kill the daemon: Rust ignores it at start, and frames go out with
    // MSG_NOSIGNAL.
    server::serve(listener, state);
}

/// Binds the socket. A live daemon on the path is an error; a stale socket file (a
/// daemon killed with SIGKILL) is replaced. The socket is 0666: every user's runtime may
/// connect, and the daemon tells them apart by their kernel credentials.
fn bind(path: &std::path::Path) -> Result<std::os::unix::net::UnixListener, String> {
    if let Some(dir) = path.parent() {
        if !dir.as_os_str().is_empty() && !dir.exists() {
            std::fs::create_dir_all(dir)
                .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
            let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755));
        }
    }
    if path.exists() {
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(format!("another attuned is serving {}", path.display()));
        }
        std::fs::remove_file(path)
            .map_err(|e| format!("cannot remove the stale socket {}: {e}", path.display()))?;
    }
    let l = std::os::unix::net::UnixListener::bind(path)
        .map_err(|e| format!("cannot listen on {}: {e}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))
        .map_err(|e| format!("chmod {}: {e}", path.display()))?;
    Ok(l)
}

/// The node's tiers: DRAM (the pool) and any slower NUMA tier found in sysfs.
fn discover_tiers(pool: u64) -> Vec<attune_proto::TierStatus> {
    let topo = attune::topology::discover(std::path::Path::new("/"));
    let groups = topo.tiers();
    let mut out = Vec::new();
    for (i, nodes) in groups.iter().enumerate() {
        let cap: u64 = topo
            .nodes
            .iter()
            .filter(|n| nodes.contains(&n.id))
            .map(|n| n.mem_total)
            .sum();
        out.push(attune_proto::TierStatus {
            name: if i == 0 {
                "dram".into()
            } else {
                format!("numa-tier{i}")
            },
            kind: if i == 0 { "dram".into() } else { "numa".into() },
            nodes: nodes.clone(),
            capacity: if i == 0 { pool } else { cap },
        });
    }
    if out.is_empty() {
        out.push(attune_proto::TierStatus {
            name: "dram".into(),
            kind: "dram".into(),
            nodes: vec![0],
            capacity: pool,
        });
    }
    out
}
