//! Per-process statistics for `attune run`'s report: `$ATTUNE_REPORT_DIR/proc-PID-START.json`,
//! refreshed every `ATTUNE_REPORT_INTERVAL_MS` by a thread (so a program killed by a
//! signal still leaves its last snapshot) and once more at exit. The file is written to a
//! temporary name and renamed, so a reader never sees half of one; one write at a time
//! ([`write_now`]), so two writers never share the temporary file. Schema: docs/run-report.md.

use crate::{hooks, settings, table};
use serde_json::json;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};

static STARTED: AtomicBool = AtomicBool::new(false);
/// One writer at a time: the report thread and the exit handler wrote the same temporary
/// file, and two writes interleaved there leave a file that is not JSON (then renamed
/// over the good one). A spin flag, not a mutex: a fork can happen while the report
/// thread holds it, and the child (which has no such thread) resets it.
static WRITING: AtomicBool = AtomicBool::new(false);
/// The final snapshot is written: a report-thread write after it would replace it with an
/// older, non-final one.
static FINAL_WRITTEN: AtomicBool = AtomicBool::new(false);
static START_NS: AtomicU64 = AtomicU64::new(0);

pub fn start() {
    start_with(false);
}

/// In a forked child that took the runtime over. Pool workers may live for milliseconds
/// and end by the pool's SIGTERM or by `_exit`, both of which skip exit handlers (seen: a
/// 3-worker numpy pool whose workers were all gone within 100 ms, absent from the report);
/// so the first snapshot is taken at once and then every 10 ms for the first 200 ms.
pub fn start_in_child() {
    start_with(true);
}

/// How long a forked child's snapshots come every `CHILD_EARLY_MS`.
const CHILD_EARLY_SPAN_MS: u64 = 200;
const CHILD_EARLY_MS: u64 = 10;

fn start_with(child: bool) {
    START_NS.store(attune_sys::os::now_ns(), Relaxed);
    if settings().report_dir.is_none() || STARTED.swap(true, AcqRel) {
        return;
    }
    let every = settings().report_interval_ms.max(10);
    let _ = attune_sys::os::spawn_runtime_thread("attune-report", move || {
        // A first snapshot soon: short-lived processes (forked pool workers that end
        // with _exit, skipping exit handlers) still leave their statistics.
        let t0 = std::time::Instant::now();
        if !child {
            std::thread::sleep(std::time::Duration::from_millis(every.min(100)));
        }
        loop {
            write_now(false);
            let early = child && t0.elapsed().as_millis() < CHILD_EARLY_SPAN_MS as u128;
            let next = if early {
                CHILD_EARLY_MS.min(every)
            } else {
                every
            };
            std::thread::sleep(std::time::Duration::from_millis(next));
        }
    });
}

pub fn after_fork_in_child() {
    STARTED.store(false, Release);
    WRITING.store(false, Release);
    FINAL_WRITTEN.store(false, Release);
    // The parent's threads are not this process's.
    attune::paging::cputimes::forget();
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
    let huge_bytes: u64 = regions.iter().map(|(_, s)| s.huge_bytes).sum();
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
    let delivery = crate::delivery::current();
    let mut v = json!({
        "pid": std::process::id(),
        "ppid": std::os::unix::process::parent_id(),
        "command": cmdline(),
        "final": final_,
        "elapsed_seconds": elapsed_s(),
        "budget_bytes": e.map(|e| e.pager.budget()).unwrap_or(0),
        "peak_resident_bytes": e.map(|e| e.pager.peak_resident.load(Relaxed)).unwrap_or(0),
        "cgroup_limit_bytes": e.map(|e| e.pager.cgroup.limit.load(Relaxed)).unwrap_or(0),
        "cgroup_lowered": e.map(|e| e.pager.cgroup.lowered.load(Relaxed)).unwrap_or(0),
        "cgroup_lowest_budget_bytes": e.map(|e| e.pager.cgroup.lowest_budget.load(Relaxed)).unwrap_or(0),
        "cgroup_outside_peak_bytes": e.map(|e| e.pager.cgroup.outside_peak.load(Relaxed)).unwrap_or(0),
        "os_minor_faults": minflt,
        "os_major_faults": majflt,
        "managed_requests": hooks::SERVED.load(Relaxed),
        "fallback_requests": hooks::FELL_BACK.load(Relaxed),
        "live_allocations": live_n,
        "live_bytes": live_b,
        "threshold_bytes": settings().threshold,
        "allocator": attune_sys::libc_alloc::program_allocator(),
        "fault_mode": settings().fault_mode,
        "delivery": delivery.0,
        "delivery_reason": delivery.1,
        "kept_out": crate::delivery::kept_out(),
        "kept_out_reason": crate::delivery::kept_out_reason(),
        "mappings_kept_out": crate::delivery::MAPPINGS_KEPT_OUT.load(Relaxed),
        "huge_bytes": huge_bytes,
        "uffd_user_mode_only": attune::runtime::engine_if_started().map(|e| e.pager.user_mode_only()),
        "kernel_fallbacks": e.map(|e| e.pager.kernel_fallbacks()),
        "far_reason": e.map(|e| e.pager.cfg.far_reason.clone()),
        "io_retried_calls": capi::io::RETRIED.load(Relaxed),
        "io_held_bytes": capi::io::HELD_BYTES.load(Relaxed),
        "io_unretried_calls": capi::io::UNRETRIED.load(Relaxed),
        "flags": settings().flags.to_string(),
        "predicted_requests": hooks::PREDICTED.load(Relaxed),
        "predicted_pinned_bytes": hooks::PREDICTED_PINNED.load(Relaxed),
        "tiers": tiers,
        "top_regions": top,
        "timeline": TIMELINE.lock().map(|t| t.clone()).unwrap_or_default(),
        "sampling": sampling(),
        "phases": phases(),
        "numa": attune::runtime::numa_stats(),
    });
    // Heaps committed in place (docs/design/run.md, "Heaps committed in place").
    v["fixed_adopted"] = json!(hooks::ADOPTED.load(Relaxed));
    v["fixed_released"] = json!(hooks::RELEASED.load(Relaxed));
    v["cpu"] = program_cpu();
    // The engine's movement counters, 0 before the engine starts.
    let none = attune::paging::Counters::default();
    let counters = e.map_or(&none, |e| &e.pager.counters);
    for (k, a) in counters.statistics() {
        v[k] = json!(a.load(Relaxed));
    }
    v
}

/// The process's timeline: one point per report interval (resident bytes per tier and the
/// counters), for `attune profile`. At 4096 points every other one is dropped, so a long
/// run keeps its whole span at half the resolution.
static TIMELINE: std::sync::Mutex<Vec<serde_json::Value>> = std::sync::Mutex::new(Vec::new());

/// One of the engine's counters (0 before the engine starts).
fn counter(pick: fn(&attune::paging::Counters) -> &AtomicU64) -> u64 {
    attune::runtime::engine_if_started()
        .map(|e| pick(&e.pager.counters).load(Relaxed))
        .unwrap_or(0)
}

fn elapsed_s() -> f64 {
    (attune_sys::os::now_ns().saturating_sub(START_NS.load(Relaxed))) as f64 / 1e9
}

fn timeline_point() -> serde_json::Value {
    let tiers: Vec<serde_json::Value> = attune::runtime::tier_stats()
        .unwrap_or_default()
        .iter()
        .map(|t| json!([t.name, t.used_bytes]))
        .collect();
    let (minflt, majflt) = os_faults();
    json!({
        "t": elapsed_s(),
        "tiers": tiers,
        "faults": counter(|c| &c.faults),
        "evictions": counter(|c| &c.evictions),
        "sample_parks": counter(|c| &c.sample_parks),
        "sample_hits": counter(|c| &c.sample_hits),
        "os_minor_faults": minflt,
        "os_major_faults": majflt,
    })
}

/// Phases marked by the program, with the samples taken during each.
fn phases() -> serde_json::Value {
    let start = START_NS.load(Relaxed);
    attune::runtime::phases()
        .into_iter()
        .map(|p| {
            let regions: Vec<serde_json::Value> = p
                .regions
                .iter()
                .map(|(base, chunk, cells)| {
                    json!({
                        "address": format!("{base:#x}"),
                        "chunk_size": chunk,
                        "hits": cells.iter().map(|c| c.0).collect::<Vec<_>>(),
                        "exposure_us": cells.iter().map(|c| c.1 / 1000).collect::<Vec<_>>(),
                    })
                })
                .collect();
            json!({
                "name": p.name,
                "begin_s": p.begin_ns.saturating_sub(start) as f64 / 1e9,
                "end_s": p.end_ns.saturating_sub(start) as f64 / 1e9,
                "active_s": p.active_ns as f64 / 1e9,
                "count": p.count,
                "regions": regions,
            })
        })
        .collect()
}

/// Time the program's threads ran and waited on a run queue (`attune::paging::cputimes`):
/// `attune profile` says how long a program waited (its samples are timed by the
/// program's clock, so the wait does not skew them). Null if a report on another thread
/// holds the list.
fn program_cpu() -> serde_json::Value {
    match attune::paging::cputimes::snapshot() {
        Some(t) => json!({
            "ran_ns": t.ran_ns,
            "waited_ns": t.waited_ns,
            "threads": t.threads,
        }),
        None => serde_json::Value::Null,
    }
}

/// Per-chunk sample counts of each sampled region (compact arrays).
fn sampling() -> serde_json::Value {
    let regions: Vec<serde_json::Value> = attune::runtime::sampling_cells()
        .into_iter()
        .map(|(base, size, chunk, flags, cells)| {
            json!({
                "address": format!("{base:#x}"),
                "size": size,
                "chunk_size": chunk,
                "flags": attune::Flags(flags).to_string(),
                "hits": cells.iter().map(|c| c.0).collect::<Vec<_>>(),
                "exposure_us": cells.iter().map(|c| c.1 / 1000).collect::<Vec<_>>(),
                "parks": cells.iter().map(|c| c.2).collect::<Vec<_>>(),
            })
        })
        .collect();
    let cfg = attune::runtime::engine_if_started()
        .map(|e| (e.pager.cfg.sample_rate, e.pager.cfg.sample_window_us));
    let hist: Vec<u64> = attune::runtime::engine_if_started()
        .map(|e| {
            e.pager
                .counters
                .sample_delay_us
                .iter()
                .map(|a| a.load(Relaxed))
                .collect()
        })
        .unwrap_or_default();
    json!({
        "delay_hist_us": hist,
        "rate_per_s": cfg.map(|c| c.0).unwrap_or(0),
        "window_us": cfg.map(|c| c.1).unwrap_or(0),
        "regions": regions,
    })
}

/// Writes the snapshot file now (no-op without a report directory). The report thread
/// skips a round while another write is on; the final write waits for it (up to 2 s).
pub fn write_now(final_: bool) {
    let Some(dir) = settings().report_dir.as_ref() else {
        return;
    };
    let take = || {
        WRITING
            .compare_exchange(false, true, Acquire, Relaxed)
            .is_ok()
    };
    if final_ {
        let start = attune_sys::os::now_ns();
        while !take() {
            if attune_sys::os::now_ns() - start > 2_000_000_000 {
                return;
            }
            attune_sys::os::yield_now();
        }
    } else if !take() {
        return;
    }
    if !final_ && FINAL_WRITTEN.load(Acquire) {
        WRITING.store(false, Release);
        return;
    }
    write_snapshot(dir, final_);
    if final_ {
        FINAL_WRITTEN.store(true, Release);
    }
    WRITING.store(false, Release);
}

fn write_snapshot(dir: &std::path::Path, final_: bool) {
    // pid and start time: a process that execs keeps its pid, and each image reports.
    if let Ok(mut t) = TIMELINE.lock() {
        if t.len() >= 4096 {
            let kept: Vec<_> = t.iter().step_by(2).cloned().collect();
            *t = kept;
        }
        t.push(timeline_point());
    }
    let pid = std::process::id();
    let t = START_NS.load(Relaxed);
    let tmp = dir.join(format!(".proc-{pid}-{t}.json.tmp"));
    let dst = dir.join(format!("proc-{pid}-{t}.json"));
    let body = serde_json::to_vec_pretty(&snapshot(final_)).unwrap_or_default();
    if std::fs::write(&tmp, body).is_ok() {
        let _ = std::fs::rename(&tmp, &dst);
    }
}
