//! `attune report DIR`: the report of processes that wrote their statistics files
//! (proc-PID-START.json, docs/run-report.md) into DIR, for programs started without
//! `attune run` (the Slurm plugin sets `ATTUNE_REPORT_DIR` per job). `--oneline` prints
//! the one-line summary the plugin puts in the job's comment.

use super::run::{build_report, gather, text_report};
use attune::size::human;
use serde_json::Value;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// Directory of the statistics files.
    dir: PathBuf,
    /// One line: processes, peak DRAM, far bytes, faults and time in faults.
    #[arg(long)]
    oneline: bool,
    /// Write the report as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
}

pub fn run(a: Args) -> i32 {
    // The directory's own error (missing, not permitted, not a directory), not a guess.
    if let Err(e) = std::fs::read_dir(&a.dir) {
        eprintln!("attune report: cannot read {}: {e}", a.dir.display());
        return 2;
    }
    let procs = gather(&a.dir);
    let report = build_report(
        &[a.dir.display().to_string()],
        &a.dir,
        true,
        0.0,
        std::process::ExitStatus::from_raw(0),
        procs,
    );
    if let Some(f) = &a.json {
        let b = serde_json::to_vec_pretty(&report).unwrap_or_default();
        if let Err(e) = std::fs::write(f, b) {
            eprintln!("attune report: cannot write {}: {e}", f.display());
            return 2;
        }
    }
    if a.oneline {
        println!("{}", oneline(&report));
    } else {
        print!("{}", text_report(&report));
    }
    0
}

/// "attune: 2 process(es), peak DRAM 168.0 MiB, far 264.0 MiB (file), 86017 faults,
/// 3.10 s in faults, 1.2 GiB moved": the highest DRAM peak of one process, the sum of the
/// far tiers' peaks. (No budget: under a node daemon it is the grant of the moment.)
pub fn oneline(r: &Value) -> String {
    let t = &r["totals"];
    let n = |v: &Value| v.as_u64().unwrap_or(0);
    if n(&r["processes"]) == 0 {
        return "attune: no managed process".into();
    }
    let far: Vec<&Value> = r["tiers"]
        .as_array()
        .map(|a| {
            a.iter()
                .skip(1)
                .filter(|t| n(&t["peak_used_bytes"]) > 0)
                .collect()
        })
        .unwrap_or_default();
    let far_bytes: u64 = far.iter().map(|t| n(&t["peak_used_bytes"])).sum();
    let kinds: Vec<&str> = far.iter().filter_map(|t| t["kind"].as_str()).collect();
    format!(
        "attune: {} process(es), peak DRAM {}, far {}{}, {} faults, {:.2} s in faults, {} moved{}",
        n(&r["processes"]),
        human(n(&t["peak_resident_bytes_max"])),
        human(far_bytes),
        if kinds.is_empty() {
            String::new()
        } else {
            format!(" ({})", kinds.join(", "))
        },
        n(&t["faults"]),
        n(&t["fault_ns"]) as f64 / 1e9,
        human(n(&t["moved_bytes"])),
        if r["complete"].as_bool() == Some(false) {
            " (some processes were killed)"
        } else {
            ""
        }
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn one_line_sums_the_far_tiers_and_says_when_processes_were_killed() {
        let r = json!({
            "processes": 2, "complete": false,
            "totals": {"peak_resident_bytes_max": 168u64 << 20, "budget_bytes": 168u64 << 20,
                       "faults": 86017, "fault_ns": 3_100_000_000u64, "moved_bytes": 3u64 << 30},
            "tiers": [{"kind": "dram", "peak_used_bytes": 168u64 << 20},
                      {"kind": "pool", "peak_used_bytes": 200u64 << 20},
                      {"kind": "file", "peak_used_bytes": 64u64 << 20},
                      {"kind": "memory", "peak_used_bytes": 0}],
        });
        assert_eq!(
            oneline(&r),
            "attune: 2 process(es), peak DRAM 168.0 MiB, far 264.0 MiB (pool, file), \
             86017 faults, 3.10 s in faults, 3.0 GiB moved (some processes were killed)"
        );
        assert_eq!(
            oneline(&json!({"processes": 0})),
            "attune: no managed process"
        );
    }
}
