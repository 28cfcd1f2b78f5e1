//! `attuned`: the Tiered Memory Manager, one per node. Grants DRAM budgets to the
//! co-located workflows' runtimes, keeps shared regions, serves status and metrics.
//!
//! The daemon is a library (`lib.rs`: options, socket, state, metrics) and this start-up:
//! command line, socket, threads.

#![forbid(unsafe_code)]

use attune::config::table::{default_doc, markdown};
use attuned::{config, log, metrics, server, state};
use clap::{Arg, ArgAction, Command};
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// The command line: `--config`, `--options`, and one flag per row of the options table.
fn cli() -> Command {
    let mut c = Command::new("attuned")
        .version(env!("CARGO_PKG_VERSION"))
        .about("Attune's node daemon: DRAM budgets for co-located workflows, shared regions, status and metrics")
        .arg(
            Arg::new("config")
                .long("config")
                .value_name("FILE")
                .value_parser(clap::value_parser!(PathBuf))
                .help("TOML file with the options below (the command line wins)"),
        )
        .arg(
            Arg::new("options")
                .long("options")
                .action(ArgAction::SetTrue)
                .help("Print the table of options (Markdown) and exit"),
        );
    for o in config::DAEMON_OPTIONS {
        c = c.arg(
            Arg::new(o.key)
                .long(o.key.replace('_', "-"))
                .value_name("VALUE")
                .help(format!("{} [default: {}]", o.doc, default_doc(o))),
        );
    }
    c
}

/// The daemon's table of docs/tuning.md.
fn options_table() -> String {
    markdown(config::DAEMON_OPTIONS, "flag", config::flag)
}

fn main() {
    let m = cli().get_matches();
    if m.get_flag("options") {
        print!("{}", options_table());
        return;
    }
    let overrides: Vec<(&str, String)> = config::DAEMON_OPTIONS
        .iter()
        .filter_map(|o| m.get_one::<String>(o.key).map(|v| (o.key, v.clone())))
        .collect();
    let hmat_bw_pct = attune::topology::discover(std::path::Path::new("/")).dram_bandwidth_pct();
    let cfg = match config::load(
        m.get_one::<PathBuf>("config").map(PathBuf::as_path),
        &overrides,
        attune_sys::os::total_memory(),
        hmat_bw_pct,
    ) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("attuned: configuration: {e}");
            std::process::exit(2);
        }
    };
    // Before any thread starts: they all inherit it (docs/design/daemon.md, "The daemon
    // runs above the jobs").
    if cfg.raise_priority > 0 {
        if let Err(e) = attune_sys::os::raise_priority(cfg.raise_priority as u32) {
            log(&format!(
                "running at the jobs' priority: raise_priority {} needs root or CAP_SYS_NICE ({e})",
                cfg.raise_priority
            ));
        }
    }
    let listener = match bind(&cfg.socket) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("attuned: {e}");
            std::process::exit(1);
        }
    };
    remove_socket_when_stopped(&cfg.socket);
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
    let mut st = state::State::new(cfg, tiers);
    // What the runtimes on this node will do without (the node's kernel, not a mask).
    let refused = attune_sys::probe::broken()
        .iter()
        .fold(0, |m, (b, _)| m | b);
    st.kernel_fallbacks = attune_sys::kernel::fallbacks(attune_sys::probe::offered() & !refused)
        .into_iter()
        .map(String::from)
        .collect();
    let state = Arc::new(Mutex::new(st));
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
    {
        // Staged inputs of Slurm jobs go with their job: slurmd removes the job's cgroup
        // when the job ends, however it ends (scancel, OOM, time limit).
        let st = state.clone();
        if let Err(e) = std::thread::Builder::new()
            .name("attuned-jobs".into())
            .spawn(move || loop {
                std::thread::sleep(std::time::Duration::from_secs(1));
                attuned::state::lock(&st).unstage_ended_jobs(|p| !p.is_dir());
            })
        {
            eprintln!("attuned: cannot start the job watcher thread: {e}");
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
    if let Ok(m) = std::fs::symlink_metadata(path) {
        // Only a socket is ever replaced: `--socket` pointed at another file by mistake
        // must not delete it.
        use std::os::unix::fs::FileTypeExt;
        if !m.file_type().is_socket() {
            return Err(format!(
                "{} exists and is not a socket; it is left as it is (choose another --socket)",
                path.display()
            ));
        }
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

/// On SIGTERM, SIGINT or SIGHUP the daemon removes its socket (if it is still the one it
/// bound: a newer daemon may have replaced it) and exits; clients see the connection
/// close and carry on alone, as after a crash. SIGKILL leaves the socket, which the next
/// start replaces.
fn remove_socket_when_stopped(path: &std::path::Path) {
    use std::os::unix::fs::MetadataExt;
    let ino = std::fs::symlink_metadata(path).map(|m| m.ino()).ok();
    let path = path.to_path_buf();
    let sigs = [
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGHUP,
    ];
    let mut signals = match signal_hook::iterator::Signals::new(sigs) {
        Ok(s) => s,
        Err(e) => {
            log(&format!(
                "cannot watch for SIGTERM ({e}); the socket stays after a stop"
            ));
            return;
        }
    };
    let _ = std::thread::Builder::new()
        .name("attuned-signals".into())
        .spawn(move || {
            if let Some(sig) = signals.forever().next() {
                if std::fs::symlink_metadata(&path).map(|m| m.ino()).ok() == ino {
                    let _ = std::fs::remove_file(&path);
                }
                log(&format!(
                    "stopped by signal {sig}; {} removed",
                    path.display()
                ));
                std::process::exit(0);
            }
        });
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

#[cfg(test)]
mod tests {
    #[test]
    fn docs_tuning_md_holds_the_daemon_table_as_generated() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/tuning.md");
        let doc = std::fs::read_to_string(path).unwrap();
        assert!(
            doc.contains(&super::options_table()),
            "docs/tuning.md is out of date: replace the daemon's table with `attuned --options`"
        );
    }

    #[test]
    fn every_option_has_its_flag() {
        let c = super::cli();
        for o in attuned::config::DAEMON_OPTIONS {
            let long = o.key.replace('_', "-");
            assert!(
                c.get_arguments()
                    .any(|a| a.get_long() == Some(long.as_str())),
                "--{long}"
            );
        }
    }
}
