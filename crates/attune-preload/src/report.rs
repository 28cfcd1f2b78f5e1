//! Per-process statistics for `attune run`'s report: `$ATTUNE_REPORT_DIR/proc-PID-START.json`,
//! refreshed every `ATTUNE_REPORT_INTERVAL_MS` by a thread (so a program killed by a
//! signal still leaves its last snapshot) and once more at exit. The file is written to a temporary name and renamed, so a reader never sees
//! half of one. Schema: docs/run-report.md.

use crate::{hooks, settings, table};
use serde_json::json;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};

static STARTED: AtomicBool = AtomicBool::new(false);
static START_NS: AtomicU64 = AtomicU64::new(0);

pub fn start() {
    START_NS.store(attune_sys::os::now_ns(), Relaxed);
    if settings().report_dir.is_none() || STARTED.swap(true, AcqRel) {
        return;
    }
    let every = settings().report_interval_ms.max(10);
    let _ = std::thread::Builder::new()
        .name("attune-report".into())
        .spawn(move || loop {
            std::thread::sleep(std::time::Duration::from_millis(every));
            write_now(false);
        });
}

pub fn after_fork_in_child() {
    STARTED.store(false, Release);
}

/// Minor and major page faults of this process so far (/proc/self/stat fields 10 and 12).
fn os_faults() -> (u64, u64) {
    let s = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let rest = s.rsplit_once(')').map(|x| x.1).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let get = |i: usize| f.get(i).and_then(|v| v.parse().ok()).unwrap_or(0);
    // After the command name: state is field 3 (index 0 here), minflt 10, majflt 12.
    (get(7), get(9))
}

fn cmdline() -> Vec<String> {
    std::fs::read("/proc/self/cmdline")
        .unwrap_or_default()
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect()
}

/// Builds this process's snapshot.
pub fn snapshot(final_: bool) -> serde_json::Value {
    let tiers = attune::runtime::tier_stats().unwrap_or_default();
    let mut regions = attune::runtime::all_region_stats();
    regions.sort_by_key(|(_, s)| std::cmp::Reverse((s.heat, s.faults, s.size)));
    let top: Vec<serde_json::Value> = regions
        .iter()
        .take(10)
        .map(|(a, s)| {
            let mut v = serde_json::to_value(s).unwrap_or_default();
            v["address"] = json!(format!("{a:#x}"));
            v["flags_text"] = json!(attune::Flags(s.flags).to_string());
            v
        })
        .collect();
    let (live_n, live_b) = table::totals();
    let (minflt, majflt) = os_faults();
    let e = attune::runtime::engine_if_started();
    let c = e.map(|e| &e.counters);
    let get = |a: Option<&AtomicU64>| a.map(|x| x.load(Relaxed)).unwrap_or(0);
    json!({
        "pid": std::process::id(),
        "ppid": std::os::unix::process::parent_id(),
        "command": cmdline(),
        "final": final_,
        "elapsed_seconds": (attune_sys::os::now_ns().saturating_sub(START_NS.load(Relaxed))) as f64 / 1e9,
        "budget_bytes": e.map(|e| e.budget).unwrap_or(0),
        "peak_resident_bytes": e.map(|e| e.peak_resident.load(Relaxed)).unwrap_or(0),
        "faults": get(c.map(|c| &c.faults)),
        "evictions": get(c.map(|c| &c.evictions)),
        "fetched_bytes": get(c.map(|c| &c.fetched_bytes)),
        "evicted_bytes": get(c.map(|c| &c.evicted_bytes)),
        "budget_overruns": get(c.map(|c| &c.budget_overruns)),
        "os_minor_faults": minflt,
        "os_major_faults": majflt,
        "managed_requests": hooks::SERVED.load(Relaxed),
        "fallback_requests": hooks::FELL_BACK.load(Relaxed),
        "live_allocations": live_n,
        "live_bytes": live_b,
        "threshold_bytes": settings().threshold,
        "flags": settings().flags.to_string(),
        "tiers": tiers,
        "top_regions": top,
    })
}

/// Writes the snapshot file now (no-op without a report directory).
pub fn write_now(final_: bool) {
    let Some(dir) = settings().report_dir.as_ref() else {
        return;
    };
    // pid and start time: a process that execs keeps its pid, and each image reports.
    let pid = std::process::id();
    let t = START_NS.load(Relaxed);
    let tmp = dir.join(format!(".proc-{pid}-{t}.json.tmp"));
    let dst = dir.join(format!("proc-{pid}-{t}.json"));
    let body = serde_json::to_vec_pretty(&snapshot(final_)).unwrap_or_default();
    if std::fs::write(&tmp, body).is_ok() {
        let _ = std::fs::rename(&tmp, &dst);
    }
}
