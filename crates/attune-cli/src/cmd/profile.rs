//! `attune profile`: runs a program under `attune run` with the access sampler on, then
//! turns the per-process statistics into the profile: resident bytes per tier over time,
//! the bandwidth-capacity curve (share of accesses against share of pages, hottest first),
//! the share of accesses served by each tier beside the capacity and bandwidth ratios,
//! faults, and flags suggested per region. Output: profile.json, curve.csv, timeline.csv,
//! summary.txt (and PNGs when matplotlib is there) in --out.

use attune_policy::heat;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

#[derive(clap::Args)]
pub struct Args {
    /// Timeline interval in milliseconds.
    #[arg(long, default_value_t = 200)]
    interval: u64,
    /// Access samples per second (chunks parked and timed; cost in docs/benchmarks.md).
    #[arg(long, default_value_t = 1000)]
    rate: u64,
    /// How long a parked sample waits for a touch, in microseconds.
    #[arg(long, default_value_t = 20000)]
    window_us: u64,
    /// Sampling unit: smaller chunks resolve hotter pages (default 4K).
    #[arg(long, default_value = "4K")]
    chunk: String,
    /// DRAM budget (as `attune run --dram`; default: the configuration's).
    #[arg(long)]
    dram: Option<String>,
    /// Attune configuration file.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Output directory.
    #[arg(long, default_value = "attune-profile")]
    out: PathBuf,
    /// Print the profile JSON instead of the summary.
    #[arg(long)]
    json: bool,
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "PROGRAM"
    )]
    command: Vec<String>,
}

pub fn run(a: Args) -> i32 {
    if a.rate == 0 || a.rate > 100_000 {
        eprintln!(
            "attune profile: --rate {}: must be 1..100000 samples a second",
            a.rate
        );
        return 2;
    }
    if a.interval < 10 {
        eprintln!("attune profile: --interval {}: at least 10 ms", a.interval);
        return 2;
    }
    let procs_dir = a.out.join("procs");
    let _ = std::fs::remove_dir_all(&procs_dir);
    if let Err(e) = std::fs::create_dir_all(&procs_dir) {
        eprintln!("attune profile: cannot create {}: {e}", a.out.display());
        return 2;
    }
    let exe = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("attune"));
    let mut cmd = std::process::Command::new(exe);
    cmd.arg("run")
        .arg("-q")
        .arg("--keep-proc-files")
        .arg(&procs_dir);
    cmd.arg("--report")
        .arg(a.out.join("run.json"))
        .arg("--chunk")
        .arg(&a.chunk);
    if let Some(d) = &a.dram {
        cmd.arg("--dram").arg(d);
    }
    if let Some(c) = &a.config {
        cmd.arg("--config").arg(c);
    }
    cmd.arg("--").args(&a.command);
    // The profile learns from the program as it is: no predicted pins in its run.
    cmd.env("ATTUNE_HISTORY", "off");
    cmd.env("ATTUNE_SAMPLE_RATE", a.rate.to_string())
        .env("ATTUNE_SAMPLE_WINDOW_US", a.window_us.to_string())
        .env("ATTUNE_REPORT_INTERVAL_MS", a.interval.to_string());
    // Page faults of everything started below (perf software events, inherited by the
    // children); this process's own are read first and taken off.
    use attune_sys::perf::{sw, SwCounter};
    let perf = SwCounter::open(sw::PAGE_FAULTS_MIN)
        .and_then(|mi| Ok((mi, SwCounter::open(sw::PAGE_FAULTS_MAJ)?)));
    let own = perf
        .as_ref()
        .ok()
        .map(|(mi, ma)| (mi.read().unwrap_or(0), ma.read().unwrap_or(0)));
    let steal0 = cpu_steal();
    let t0 = std::time::Instant::now();
    let status = match cmd.status() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("attune profile: cannot start attune run: {e}");
            return 2;
        }
    };
    let wall = t0.elapsed().as_secs_f64();
    let code = status.code().unwrap_or(128);
    let procs = read_procs(&procs_dir);
    if procs.is_empty() {
        eprintln!("attune profile: no statistics were written (the program did not start, or is not managed); exit {code}");
        return if code == 0 { 2 } else { code };
    }
    let mut profile = analyze(&procs, wall, code, &a);
    let steal_share = match (steal0, cpu_steal()) {
        (Some((s0, t0)), Some((s1, t1))) if t1 > t0 => {
            s1.saturating_sub(s0) as f64 / (t1 - t0) as f64
        }
        _ => 0.0,
    };
    profile["cpu"] = contention(&procs, steal_share);
    let contended = profile["cpu"]["contended"] == json!(true);
    if contended {
        eprintln!(
            "attune profile: warning: {}",
            contention_warning(&profile["cpu"])
        );
    }
    match (&perf, own) {
        (Ok((mi, ma)), Some((m0, j0))) => {
            profile["faults"]["perf_minor"] = json!(mi.read().unwrap_or(0).saturating_sub(m0));
            profile["faults"]["perf_major"] = json!(ma.read().unwrap_or(0).saturating_sub(j0));
            profile["sources"]["page_faults"] = json!("perf software events (page-faults-min/maj, inherited by the program's processes); per process: /proc/PID/stat");
        }
        (Err(e), _) => {
            profile["sources"]["page_faults"] = json!(format!(
                "/proc/PID/stat per process (perf_event_open failed: {e:?})"
            ));
        }
        _ => {}
    }
    // A curve read while the hypervisor stole much of the CPUs may have been timed across
    // the stolen slices, and would teach `attune run` a hot part that is not there.
    if code == 0 && !contended {
        remember(&profile, &a.command);
    }
    if let Err(e) = write_outputs(&a.out, &profile) {
        eprintln!("attune profile: cannot write to {}: {e}", a.out.display());
    }
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&profile).unwrap_or_default()
        );
    } else {
        print!("{}", summary(&profile));
    }
    code
}

/// Steal and all time of the node's CPUs so far, in ticks (/proc/stat's first line).
fn cpu_steal() -> Option<(u64, u64)> {
    let s = std::fs::read_to_string("/proc/stat").ok()?;
    let f: Vec<u64> = s
        .lines()
        .next()?
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal (guest time is inside user).
    Some((*f.get(7)?, f.iter().take(8).sum()))
}

/// How long the program's threads ran and waited for a CPU, and whether the hypervisor
/// stole enough to distort the curve (`heat::STOLEN_SHARE`). Run-queue waits do not: the
/// samples are timed by the program's own clock.
fn contention(procs: &[Value], steal_share: f64) -> Value {
    let sum = |k: &str| {
        procs
            .iter()
            .map(|p| p["cpu"][k].as_u64().unwrap_or(0))
            .sum::<u64>()
    };
    let (ran, waited) = (sum("ran_ns"), sum("waited_ns"));
    let share = heat::waited_share(ran, waited, steal_share);
    json!({
        "ran_seconds": ran as f64 / 1e9,
        "waited_seconds": waited as f64 / 1e9,
        "steal_share": steal_share,
        "waited_share": share,
        "contended": steal_share >= heat::STOLEN_SHARE,
    })
}

fn contention_warning(cpu: &Value) -> String {
    format!(
        "the hypervisor stole {} of the node's CPU time while the program ran: a thread's \
         clock may run through it (it depends on the guest kernel's steal accounting), so \
         the curve may read more concentrated than the program is, and is not recorded for \
         `attune run`; profile on CPUs the program has to itself",
        pct(&cpu["steal_share"]),
    )
}

/// The run-queue wait, for the summary: it does not distort the curve, but a reader
/// comparing the wall time with a quiet run wants to know.
fn wait_note(cpu: &Value) -> Option<String> {
    let waited = cpu["waited_seconds"].as_f64().unwrap_or(0.0);
    let ran = cpu["ran_seconds"].as_f64().unwrap_or(0.0);
    let share = heat::waited_share((ran * 1e9) as u64, (waited * 1e9) as u64, 0.0);
    (waited > 0.0 && share >= heat::NOTED_WAIT_SHARE).then(|| {
        format!(
            "the program waited for a CPU {:.1}% of the time (run queues {:.2} s against \
             {:.2} s run); samples are timed by its own CPU clock, so the curve holds",
            100.0 * share,
            waited,
            ran
        )
    })
}

fn read_procs(dir: &Path) -> Vec<Value> {
    let mut v: Vec<Value> = std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .filter_map(|f| std::fs::read(f.path()).ok())
                .filter_map(|b| serde_json::from_slice(&b).ok())
                .collect()
        })
        .unwrap_or_default();
    v.sort_by_key(|p| p["pid"].as_u64().unwrap_or(0));
    v
}

fn u64s(v: &Value) -> Vec<u64> {
    v.as_array()
        .map(|a| a.iter().map(|x| x.as_u64().unwrap_or(0)).collect())
        .unwrap_or_default()
}

/// One sampled region's record (a process snapshot's `sampling.regions[i]`, or a phase's):
/// its rate mixture and what it weighs.
struct RegionMix {
    /// Rates per chunk with shares of the region's chunks (heat::rate_mixture).
    mix: Vec<(f64, f64)>,
    chunks: f64,
    /// 4 KiB pages per chunk.
    pages_per_chunk: f64,
    sampled: usize,
    hits: u64,
    /// Per chunk (touches, exposure in ns), and the delivery floor they were read with.
    cells: Vec<(u32, u64)>,
    floor_ns: u64,
}

impl RegionMix {
    fn of(r: &Value, floor_ns: u64) -> RegionMix {
        let h = u64s(&r["hits"]);
        let e = u64s(&r["exposure_us"]);
        let cells: Vec<(u32, u64)> = h
            .iter()
            .zip(&e)
            .map(|(&h, &e)| (h as u32, e * 1000))
            .collect();
        RegionMix {
            mix: heat::rate_mixture(&cells, floor_ns),
            floor_ns,
            chunks: h.len() as f64,
            pages_per_chunk: (r["chunk_size"].as_u64().unwrap_or(4096).max(4096) / 4096) as f64,
            sampled: cells.iter().filter(|c| c.1 > 0).count(),
            hits: h.iter().sum(),
            cells,
        }
    }
    /// The mixture per 4 KiB page, weighted by pages: a chunk of k pages at rate r is k
    /// pages at r / k. Mixtures of several regions concatenate into one footprint.
    fn pages(&self) -> impl Iterator<Item = (f64, f64)> + '_ {
        let (k, n) = (self.pages_per_chunk, self.chunks);
        self.mix.iter().map(move |&(rate, w)| (rate / k, w * n * k))
    }
    /// Accesses per second to the whole region: mean chunk rate x chunks.
    fn accesses(&self) -> f64 {
        self.mix.iter().map(|m| m.0 * m.1).sum::<f64>() * self.chunks
    }
}

/// Hot ranges of a sampled region (fractions), from its chunks' samples.
fn hot_ranges_of(m: &RegionMix, hot_share: f64) -> Vec<(f64, f64)> {
    let p_hot = heat::hot_posterior(&m.cells, &m.mix, hot_share, m.floor_ns);
    attune_policy::predict::hot_ranges(&p_hot, hot_share, 16)
}

/// What this profile teaches `attune run` about the program: the regions of its first
/// process in allocation order, with their suggested flags and hot ranges.
fn learned(profile: &Value, args: &[String]) -> attune_policy::predict::RunRecord {
    let regions = profile["regions"].as_array().cloned().unwrap_or_default();
    let first = regions.first().map(|r| r["pid"].clone());
    let regions = regions
        .iter()
        .filter(|r| Some(&r["pid"]) == first.as_ref())
        .map(|r| {
            let flags = attune::Flags::parse(r["suggested_flags"].as_str().unwrap_or(""))
                .unwrap_or_default();
            let hot = r["hot_ranges"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|h| Some((h[0].as_f64()?, h[1].as_f64()?)))
                .collect();
            attune_policy::predict::record_region(r["size"].as_u64().unwrap_or(0), flags, hot)
        })
        .collect();
    attune_policy::predict::RunRecord {
        args: args.to_vec(),
        regions,
    }
}

fn floor_of(p: &Value) -> u64 {
    heat::delay_floor_ns(&u64s(&p["sampling"]["delay_hist_us"]))
}

fn share(part: f64, whole: f64) -> f64 {
    if whole > 0.0 {
        part / whole
    } else {
        0.0
    }
}

/// Everything the profile reports, from the processes' statistics files.
fn analyze(procs: &[Value], wall: f64, code: i32, a: &Args) -> Value {
    let mut regions: Vec<(&Value, RegionMix)> = Vec::new();
    let mut pids: Vec<&Value> = Vec::new();
    let mut floor_ns = 0;
    for p in procs {
        let floor = floor_of(p);
        floor_ns = floor_ns.max(floor);
        for r in p["sampling"]["regions"].as_array().into_iter().flatten() {
            regions.push((r, RegionMix::of(r, floor)));
            pids.push(&p["pid"]);
        }
    }
    let all: Vec<(f64, f64)> = regions.iter().flat_map(|(_, m)| m.pages()).collect();
    let curve = heat::mixture_curve(&all, 100);
    let acc_total: f64 = regions.iter().map(|(_, m)| m.accesses()).sum();
    let bytes_total: u64 = regions
        .iter()
        .map(|(r, _)| r["size"].as_u64().unwrap_or(0))
        .sum();
    let parks: u64 = regions
        .iter()
        .map(|(r, _)| u64s(&r["parks"]).iter().sum::<u64>())
        .sum();
    let hits: u64 = regions.iter().map(|(_, m)| m.hits).sum();
    let regions_out: Vec<Value> = regions
        .iter()
        .zip(&pids)
        .map(|((r, m), pid)| {
            let size = r["size"].as_u64().unwrap_or(0);
            let (a_share, b_share) = (share(m.accesses(), acc_total), share(size as f64, bytes_total as f64));
            let c = heat::mixture_curve(&m.mix, 100);
            let sg = heat::suggest(&c, a_share, b_share);
            // Where the hot part lies, for a split: pinned as the LAT part by `attune run`.
            let hot = sg.hot_share.map(|h| hot_ranges_of(m, h)).unwrap_or_default();
            json!({
                "pid": pid, "address": r["address"], "size": size, "chunk_size": r["chunk_size"], "flags": r["flags"],
                "sampled_chunks": m.sampled, "chunks": m.chunks,
                "access_share": a_share, "byte_share": b_share,
                "top10_share": heat::accesses_at(&c, 0.1), "top20_share": heat::accesses_at(&c, 0.2),
                "suggested_flags": sg.flags.to_string(), "suggested_hot_share": sg.hot_share, "why": sg.why,
                "hot_ranges": hot.iter().map(|(a, b)| json!([a, b])).collect::<Vec<_>>(),
            })
        })
        .collect();
    // Accesses served by the far tiers: their loads (each one a touch of a chunk that was
    // out of DRAM), less the loads the sampler caused (its touched parks). Faults are not
    // the measure: first touches of fresh memory fault without any far tier.
    let (mut loads, mut cap_far, mut cap_total) = (0u64, 0.0, 0.0);
    for p in procs {
        for (i, t) in p["tiers"].as_array().into_iter().flatten().enumerate() {
            let peak = t["peak_used_bytes"].as_f64().unwrap_or(0.0);
            cap_total += peak;
            if i > 0 {
                loads += t["faults"].as_u64().unwrap_or(0);
                cap_far += peak;
            }
        }
    }
    let far = loads.saturating_sub(hits) as f64;
    json!({
        "schema": "attune-profile/1",
        "command": a.command, "exit": code, "wall_seconds": wall,
        "sources": {
            "accesses": "Attune's access sampler: resident chunks parked in the far tier, the next touch timed (no hardware counters used)",
            "page_faults": "kernel counts per process (/proc/PID/stat minflt, majflt)",
            "hardware_counters": "not used: perf hardware events are not available on this machine kind; software sources only",
        },
        "sampling": {"rate_per_s": a.rate, "window_us": a.window_us, "chunk": a.chunk, "parks": parks,
                      "hits": hits, "delivery_floor_us": floor_ns as f64 / 1000.0, "estimator": "rate mixture (EM, Poisson touches with censored waits)"},
        "curve": curve.iter().map(|c| json!([c.pages, c.accesses])).collect::<Vec<_>>(),
        "top10_share": heat::accesses_at(&curve, 0.1),
        "top20_share": heat::accesses_at(&curve, 0.2),
        "top50_share": heat::accesses_at(&curve, 0.5),
        "tier_access_share": {
            "far_estimated": share(far, acc_total * wall).min(1.0),
            "far_loads": loads,
            "capacity_ratio": share(cap_far, cap_total),
            // The DRAM tier has no declared bandwidth (the runtime does not measure it),
            // so the bandwidth ratio is unknown: null rather than a made-up number.
            "bandwidth_ratio": Value::Null,
            "reading": "below the capacity ratio: hot data is kept near; above the bandwidth ratio: the far tier is the bottleneck",
        },
        "faults": {"attune": super::run::sum(procs, "faults"), "os_minor": super::run::sum(procs, "os_minor_faults"),
                   "os_major": super::run::sum(procs, "os_major_faults")},
        "regions": regions_out,
        "phases": phase_curves(procs),
        "timeline": super::run::with_pid(procs, "timeline"),
    })
}

/// Each marked phase's curve, from the samples taken during it (same estimator).
fn phase_curves(procs: &[Value]) -> Vec<Value> {
    let mut out = Vec::new();
    for p in procs {
        let floor = floor_of(p);
        for ph in p["phases"].as_array().into_iter().flatten() {
            let mixes: Vec<RegionMix> = ph["regions"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|r| RegionMix::of(r, floor))
                .collect();
            let all: Vec<(f64, f64)> = mixes.iter().flat_map(|m| m.pages()).collect();
            let c = heat::mixture_curve(&all, 100);
            out.push(json!({
                "pid": p["pid"], "name": ph["name"], "begin_s": ph["begin_s"],
                "seconds": ph["active_s"], "count": ph["count"],
                "sampled_chunks": mixes.iter().map(|m| m.sampled).sum::<usize>(),
                "top10_share": heat::accesses_at(&c, 0.1), "top20_share": heat::accesses_at(&c, 0.2),
                "curve": c.iter().map(|c| json!([c.pages, c.accesses])).collect::<Vec<_>>(),
            }));
        }
    }
    out
}

/// Records what was learned in the execution history (a run that failed teaches nothing).
fn remember(profile: &Value, command: &[String]) {
    let Some(store) = attune_cli::history::path() else {
        return;
    };
    let Ok(program) = super::run::locate(&command[0]) else {
        return;
    };
    let run = learned(profile, &command[1..]);
    if run.regions.is_empty() {
        return;
    }
    match attune_cli::history::record(&store, &program, &run) {
        Ok(()) => eprintln!(
            "attune profile: recorded in {} for `attune run` without flags: {}",
            store.display(),
            attune_cli::history::describe(&run.regions).join("; ")
        ),
        Err(e) => eprintln!("attune profile: warning: {e}"),
    }
}

fn write_outputs(out: &Path, p: &Value) -> std::io::Result<()> {
    std::fs::write(
        out.join("profile.json"),
        serde_json::to_vec_pretty(p).unwrap_or_default(),
    )?;
    let mut c = String::from("page_share,access_share\n");
    for pt in p["curve"].as_array().into_iter().flatten() {
        c += &format!("{},{}\n", pt[0], pt[1]);
    }
    std::fs::write(out.join("curve.csv"), c)?;
    let mut t = String::from("pid,t,tier,bytes,faults,evictions,sample_parks\n");
    for x in p["timeline"].as_array().into_iter().flatten() {
        for tier in x["tiers"].as_array().into_iter().flatten() {
            t += &format!(
                "{},{},{},{},{},{},{}\n",
                x["pid"],
                x["t"],
                tier[0].as_str().unwrap_or(""),
                tier[1],
                x["faults"],
                x["evictions"],
                x["sample_parks"]
            );
        }
    }
    std::fs::write(out.join("timeline.csv"), t)?;
    std::fs::write(out.join("summary.txt"), summary(p))?;
    attune_cli::python::plot("profile", "profile", out);
    Ok(())
}

fn pct(v: &Value) -> String {
    v.as_f64()
        .map(|x| format!("{:.1}%", 100.0 * x))
        .unwrap_or("-".into())
}

fn summary(p: &Value) -> String {
    let mut s = String::new();
    let sm = &p["sampling"];
    s += &format!(
        "profile of {}: exit {}, {:.2} s\n",
        p["command"]
            .as_array()
            .map(|c| c
                .iter()
                .filter_map(|x| x.as_str())
                .collect::<Vec<_>>()
                .join(" "))
            .unwrap_or_default(),
        p["exit"],
        p["wall_seconds"].as_f64().unwrap_or(0.0)
    );
    s += &format!(
        "accesses (sampled: {} parks, {} touched, delivery floor {} us): hottest 10% of pages take {}, 20% take {}, 50% take {}\n",
        sm["parks"], sm["hits"], sm["delivery_floor_us"], pct(&p["top10_share"]), pct(&p["top20_share"]), pct(&p["top50_share"])
    );
    let t = &p["tier_access_share"];
    s += &format!(
        "far tier: about {} of accesses; capacity ratio {}, bandwidth ratio {}\n",
        pct(&t["far_estimated"]),
        pct(&t["capacity_ratio"]),
        pct(&t["bandwidth_ratio"])
    );
    s += &format!(
        "page faults: {} by Attune, {} minor and {} major in the kernel ({})\n",
        p["faults"]["attune"],
        p["faults"]
            .get("perf_minor")
            .unwrap_or(&p["faults"]["os_minor"]),
        p["faults"]
            .get("perf_major")
            .unwrap_or(&p["faults"]["os_major"]),
        if p["faults"].get("perf_minor").is_some() {
            "perf software events"
        } else {
            "/proc counts"
        }
    );
    for r in p["regions"].as_array().into_iter().flatten() {
        s += &format!(
            "region {} {} MiB ({}): {} of accesses, top 10% of it {} -> suggest {}{} ({})\n",
            r["address"].as_str().unwrap_or("?"),
            r["size"].as_u64().unwrap_or(0) >> 20,
            r["flags"].as_str().unwrap_or(""),
            pct(&r["access_share"]),
            pct(&r["top10_share"]),
            r["suggested_flags"].as_str().unwrap_or(""),
            r["suggested_hot_share"]
                .as_f64()
                .map(|h| format!(" (hot part {:.0}%)", 100.0 * h))
                .unwrap_or_default(),
            r["why"].as_str().unwrap_or("")
        );
    }
    for ph in p["phases"].as_array().into_iter().flatten() {
        s += &format!(
            "phase {} ({:.2} s, {} chunks sampled): hottest 10% of pages take {}, 20% take {}\n",
            ph["name"].as_str().unwrap_or("?"),
            ph["seconds"].as_f64().unwrap_or(0.0),
            ph["sampled_chunks"],
            pct(&ph["top10_share"]),
            pct(&ph["top20_share"])
        );
    }
    if let Some(n) = wait_note(&p["cpu"]) {
        s += &format!("cpu: {n}\n");
    }
    if p["cpu"]["contended"] == json!(true) {
        s += &format!("warning: {}\n", contention_warning(&p["cpu"]));
    }
    s += "sources: accesses from Attune's sampler; no hardware counters\n";
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contention_sums_processes_and_takes_a_missing_reading_as_none() {
        // A forked child whose reading was null, a process without one (an older
        // runtime), and two that ran 0.9 s and waited 0.1 s each.
        let ran = json!({"cpu": {"ran_ns": 900_000_000u64, "waited_ns": 100_000_000u64}});
        let procs = [json!({"cpu": null}), json!({}), ran.clone(), ran];
        let c = contention(&procs, 0.0);
        assert_eq!(c["ran_seconds"], json!(1.8));
        assert!(
            (c["waited_share"].as_f64().unwrap() - 0.1).abs() < 1e-9,
            "{c}"
        );
        // Run-queue waits: noted, not a distortion (the program's clock stops).
        assert_eq!(c["contended"], json!(false));
        assert!(wait_note(&c).unwrap().contains("10.0% of the time"));
        // Nothing read at all: nothing to note, no division by zero.
        let c = contention(&[json!({"cpu": null})], 0.0);
        assert_eq!(
            (c["waited_share"].as_f64(), c["contended"].as_bool()),
            (Some(0.0), Some(false))
        );
        assert_eq!(wait_note(&c), None);
        // Steal counts, from 10%.
        let c = contention(&[json!({})], 0.2);
        assert_eq!(c["contended"], json!(true));
        assert!(contention_warning(&c).contains("stole 20.0%"));
        assert_eq!(contention(&[json!({})], 0.09)["contended"], json!(false));
    }
}
