//! `attune status`: what the node daemon (attuned) knows: tiers, workflows, budgets,
//! resident bytes, heat, shared regions. A table, or JSON with `--json`.

use attune_proto::{Reply, Request, Status};
use clap::Parser;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Parser)]
pub struct Args {
    /// The daemon's socket [default: $ATTUNE_SOCKET or /run/attune/attuned.sock].
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// Print the status as JSON (schema: docs/daemon.md).
    #[arg(long)]
    pub json: bool,
}

pub fn fetch(socket: &std::path::Path) -> Result<Status, String> {
    let s = attune_proto::connect(socket, Duration::from_secs(5)).map_err(|e| {
        format!(
            "no attuned answers on {} ({e}); start it with `attuned --socket {}`",
            socket.display(),
            socket.display()
        )
    })?;
    // Pages until the daemon says there are no more (each reply fits in one frame).
    let mut all: Option<Status> = None;
    let mut from = 0;
    loop {
        let page = match attune_proto::call(&s, &Request::Status { id: 1, from }) {
            Ok((Reply::Status { status, .. }, _)) => *status,
            Ok((other, _)) => return Err(format!("unexpected reply from attuned: {other:?}")),
            Err(e) => return Err(format!("attuned on {}: {e}", socket.display())),
        };
        let next = page.next;
        match &mut all {
            None => all = Some(page),
            Some(a) => {
                a.workflows.extend(page.workflows);
                a.shared.extend(page.shared);
            }
        }
        match next {
            Some(n) if n > from => from = n,
            Some(_) => {
                return Err(format!(
                    "attuned on {}: a status page did not advance",
                    socket.display()
                ))
            }
            None => break,
        }
    }
    let mut all = all.expect("one page at least");
    all.next = None;
    Ok(all)
}

fn mib(b: u64) -> String {
    format!("{:.1}", b as f64 / (1u64 << 20) as f64)
}

pub fn render(s: &Status) -> String {
    let mut o = String::new();
    o += &format!(
        "attuned {} (pid {}, up {:.0} s): DRAM pool {} MiB, granted {} MiB, shared {} MiB; {} requests, {} rejected, {} rebalances",
        s.version, s.pid, s.uptime_s, mib(s.dram_pool), mib(s.granted), mib(s.shared_bytes), s.requests, s.rejected, s.rebalances
    );
    if let Some(ms) = s.last_reclaim_ms {
        o += &format!("; last reclaim {ms:.1} ms");
    }
    if !s.kernel_fallbacks.is_empty() {
        o += &format!(
            "\nkernel: without {} (the runtimes here run their fallbacks; `attune doctor`)",
            s.kernel_fallbacks.join(", ")
        );
    }
    if s.far_pool > 0 {
        o += &format!(
            "\nfar memory (the runtimes' memory and pool tiers): pool {} MiB, granted {} MiB, held here {} MiB",
            mib(s.far_pool),
            mib(s.far_granted),
            mib(s.pool_bytes)
        );
    }
    o += "\n\ntiers\n";
    o += &format!(
        "  {:<12} {:<6} {:<8} {:>12}\n",
        "name", "kind", "nodes", "capacity MiB"
    );
    for t in &s.tiers {
        let nodes: Vec<String> = t.nodes.iter().map(|n| n.to_string()).collect();
        o += &format!(
            "  {:<12} {:<6} {:<8} {:>12}\n",
            t.name,
            t.kind,
            nodes.join(","),
            mib(t.capacity)
        );
    }
    o += "\nworkflows\n";
    if s.workflows.is_empty() {
        o += "  (none)\n";
    } else {
        o += &format!(
            "  {:<24} {:>6} {:<8} {:>5} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>6}\n",
            "workflow",
            "uid",
            "flags",
            "procs",
            "want MiB",
            "grant MiB",
            "DRAM MiB",
            "far MiB",
            "faults",
            "evictions",
            "heat"
        );
        for w in &s.workflows {
            let far = if s.far_pool > 0 {
                format!("{}/{}", mib(w.far_used), mib(w.far_grant))
            } else {
                mib(w.far_used)
            };
            o += &format!(
                "  {:<24} {:>6} {:<8} {:>5} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>6}\n",
                w.name,
                w.uid,
                if w.flags.is_empty() { "-" } else { &w.flags },
                w.processes.max(w.pids.len() as u64),
                mib(w.want),
                mib(w.grant),
                mib(w.resident),
                far,
                w.faults,
                w.evictions,
                w.heat
                    .map(|h| format!("{h:.2}"))
                    .unwrap_or_else(|| "-".into())
            );
        }
    }
    if let Some(x) = s.others.as_ref().filter(|x| x.workflows > 0) {
        o += &format!(
            "  other users: {} workflows ({} processes), want {} MiB, grant {} MiB, resident {} MiB\n",
            x.workflows,
            x.processes,
            mib(x.want),
            mib(x.grant),
            mib(x.resident)
        );
    }
    o += "\nshared regions\n";
    if let Some(x) = s.others.as_ref().filter(|x| x.shared_regions > 0) {
        o += &format!(
            "  other users: {} regions of {} MiB\n",
            x.shared_regions,
            mib(x.shared_bytes)
        );
    }
    if s.shared.is_empty() {
        o += "  (none)\n";
    } else {
        o += &format!(
            "  {:<24} {:>6} {:<8} {:>10} {:>10} {:>5}  granted\n",
            "name", "owner", "flags", "size MiB", "DRAM MiB", "refs"
        );
        for r in &s.shared {
            let mut g: Vec<String> = r.granted_uids.iter().map(|u| u.to_string()).collect();
            if r.granted_count > g.len() as u64 && !g.is_empty() {
                g.push(format!("... ({} in all)", r.granted_count));
            }
            // A staged input: the daemon holds it too (until `attune unstage`, or its
            // job's end).
            let staged = match (r.staged, r.job.is_empty()) {
                (false, _) => String::new(),
                (true, true) => "  (staged)".into(),
                (true, false) => format!("  (staged by job {})", r.job),
            };
            o += &format!(
                "  {:<24} {:>6} {:<8} {:>10} {:>10} {:>5}  {}{staged}\n",
                r.name,
                r.owner,
                if r.flags.is_empty() { "-" } else { &r.flags },
                mib(r.size),
                mib(r.resident),
                r.refs,
                if g.is_empty() {
                    "-".into()
                } else {
                    g.join(",")
                }
            );
        }
    }
    o
}

pub fn run(a: Args) -> i32 {
    let socket = a.socket.unwrap_or_else(attune_proto::socket_path);
    match fetch(&socket) {
        Ok(s) => {
            if a.json {
                println!("{}", serde_json::to_string_pretty(&s).unwrap());
            } else {
                print!("{}", render(&s));
            }
            0
        }
        Err(e) => {
            eprintln!("attune status: {e}");
            1
        }
    }
}
