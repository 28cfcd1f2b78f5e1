//! `attune bench`: the main job. Runs each scenario in a fresh process (its own runtime,
//! budget and configuration), side by side with its baseline in the same run, and prints
//! a table; `--out` gets JSON and a Markdown section for docs/benchmarks.md.
//!
//! Scenarios of the runtime core (issue "Runtime core"): fault-in latency against a plain
//! handler-thread UFFDIO_COPY design, sequential and random passes over twice the budget,
//! allocate_TM/free_TM against malloc/free, and the overhead when everything fits.
//! Then IMME's evaluation (`bench/imme.py`: nine verified workflows in the environments
//! IE, CBE-mem, CBE-disk, TME and IMME), unless `--core-only`: by default two runs each
//! with runs stopped at 20x their IE time (the default suite stays within 10 minutes on
//! 2 cores), with `--full` three runs, no cut, the Figure 6 and chunk-size sweeps,
//! Figure 7 (`bench/fig7.py`: co-located workflows, DRAM divided by allocation policy) and
//! a small ensemble under Slurm (`bench/ensemble.py`; skipped where Slurm cannot run).

use attune::runtime;
use attune_sys::{mem, os, uffd};
use serde_json::{json, Value};
use std::process::Command;

#[derive(clap::Args)]
pub struct Args {
    /// Also run the longer scenarios: three runs each, no cut, Figure 6 and the chunk-size
    /// sweep, Figure 7 (co-located workflows), a small ensemble under Slurm.
    #[arg(long)]
    full: bool,
    /// Only scenarios whose name contains this text.
    #[arg(long)]
    only: Option<String>,
    /// Directory for bench.json and benchmarks.md.
    #[arg(long, default_value = "results")]
    out: std::path::PathBuf,
    /// Repetitions of each scenario (the median is reported).
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// Only the runtime's own scenarios (no IMME evaluation).
    #[arg(long)]
    core_only: bool,
    /// Only IMME's evaluation (no runtime scenarios).
    #[arg(long, conflicts_with = "core_only")]
    imme_only: bool,
    /// IMME workflows to run (dl,dm,dc,sc,stream,gups,xsbench,bfs,dgemm; default all).
    #[arg(long, value_name = "LIST")]
    workloads: Option<String>,
    /// IMME environments to run (IE,CBE-mem,CBE-disk,TME,IMME; default all).
    #[arg(long, value_name = "LIST")]
    envs: Option<String>,
    /// Size factor of the random-update and file scenarios: 1 (default) is 512 MiB of
    /// updates and a 1 GiB file over a 256 MiB budget; 4 is the full sizes (2 GiB
    /// over 1 GiB, a 4 GiB file over 1 GiB).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=8))]
    scale: u32,
}

/// The size factor in a worker (`--scale`, passed in the environment).
fn scale() -> usize {
    std::env::var(SCALE_VAR)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
}

const SCALE_VAR: &str = "ATTUNE_BENCH_SCALE";

/// Runs IMME's evaluation harness (`imme.py`, staged in share/attune/bench, or the source
/// tree's bench/) with this `attune`, and with `--full` Figure 7 (`fig7.py`: co-located
/// workflows, DRAM by allocation policy). Returns the first failing exit status.
fn imme(a: &Args) -> i32 {
    let mut args: Vec<String> = vec!["--out".into(), a.out.display().to_string()];
    if a.full {
        args.extend(["--reps", "3", "--sweep", "--chunks"].map(String::from));
    } else {
        args.extend(["--reps", "2", "--max-slowdown", "20"].map(String::from));
    }
    if let Some(w) = &a.workloads {
        args.extend(["--only".into(), w.clone()]);
    }
    if let Some(e) = &a.envs {
        args.extend(["--envs".into(), e.clone()]);
    }
    let rc = harness("imme.py", "IMME's evaluation", &args);
    if !a.full {
        return rc;
    }
    let fig7 = harness(
        "fig7.py",
        "Figure 7, co-located workflows",
        &[
            "--out".into(),
            a.out.display().to_string(),
            "--reps".into(),
            "3".into(),
        ],
    );
    // The ensembles under Slurm at their smallest (one emulated node, two tasks of each
    // class); `python3 bench/ensemble.py` with its defaults is the full run.
    let ensemble = match harness(
        "ensemble.py",
        "Ensembles under Slurm, small (bench/ensemble.py --nodes 1 --per-class 2 --quick)",
        &["--nodes", "1", "--per-class", "2", "--quick"].map(String::from),
    ) {
        ENSEMBLE_SKIPPED => 0,
        x => x,
    };
    [rc, fig7, ensemble]
        .into_iter()
        .find(|&x| x != 0)
        .unwrap_or(0)
}

/// bench/ensemble.py's exit status when the machine cannot run it (no Slurm, not root).
const ENSEMBLE_SKIPPED: i32 = 77;

/// Runs one script of the harness (share/attune/bench, or the source tree's bench/).
fn harness(name: &str, what: &str, args: &[String]) -> i32 {
    let Some(script) = attune_cli::python::dir()
        .map(|d| d.join("../bench").join(name))
        .filter(|p| p.is_file())
    else {
        eprintln!("attune bench: {what} (bench/{name}) is not installed next to this attune");
        return 2;
    };
    let mut cmd = Command::new(attune_cli::python::interpreter());
    cmd.arg(&script).args(args);
    cmd.env("ATTUNE_BIN", crate::attune_cli());
    eprintln!("\n{what}: {}", script.display());
    match cmd.status() {
        Ok(s) => s.code().unwrap_or(1),
        Err(e) => {
            eprintln!("attune bench: cannot run {}: {e}", script.display());
            2
        }
    }
}

const CGROUP_VAR: &str = "ATTUNE_BENCH_CGROUP";
/// Budget of the random-update scenarios (the array is twice this).
const RAND_BUDGET_MB: usize = 256;

fn kswap_medium(name: &str) -> Option<crate::kernel_env::Medium> {
    match name {
        "rand-kswap-memory" => crate::kernel_env::Medium::parse("memory").ok(),
        "rand-kswap-disk" => Some(crate::kernel_env::Medium::Disk),
        _ => None,
    }
}

/// (name, environment) of each scenario.
fn scenarios(full: bool) -> Vec<(&'static str, Vec<(&'static str, &'static str)>)> {
    let mut v = vec![
        ("fault-plain-copy", vec![]),
        (
            "fault-attune-thread",
            vec![
                ("ATTUNE_FAULT_MODE", "thread"),
                ("ATTUNE_DRAM", "64M"),
                ("ATTUNE_READAHEAD", "0"),
            ],
        ),
        (
            "fault-attune-signal",
            vec![
                ("ATTUNE_FAULT_MODE", "signal"),
                ("ATTUNE_DRAM", "64M"),
                ("ATTUNE_READAHEAD", "0"),
            ],
        ),
        (
            "seq-attune-thread",
            vec![("ATTUNE_FAULT_MODE", "thread"), ("ATTUNE_DRAM", "256M")],
        ),
        (
            "seq-attune-signal",
            vec![("ATTUNE_FAULT_MODE", "signal"), ("ATTUNE_DRAM", "256M")],
        ),
        ("rand-dram", vec![]),
        (
            "rand-attune-thread",
            vec![
                ("ATTUNE_FAULT_MODE", "thread"),
                ("ATTUNE_DRAM", "256M"),
                ("ATTUNE_READAHEAD", "0"),
            ],
        ),
        (
            "rand-attune-signal",
            vec![
                ("ATTUNE_FAULT_MODE", "signal"),
                ("ATTUNE_DRAM", "256M"),
                ("ATTUNE_READAHEAD", "0"),
            ],
        ),
        // The kernel's path at the same budget: a cgroup memory limit with swap on a
        // memory-backed loop device and on disk (kernel_env.rs; needs root).
        ("rand-kswap-memory", vec![]),
        ("rand-kswap-disk", vec![]),
        // The file tier against the kernel's mmap of a file, same budget (1 GiB, 256 MiB).
        ("file-attune", vec![("ATTUNE_DRAM", "256M")]),
        ("file-kmmap", vec![]),
        ("alloc-small", vec![]),
        ("fit-overhead", vec![("ATTUNE_DRAM", "1G")]),
    ];
    if full {
        v.push((
            "seq-attune-64K",
            vec![
                ("ATTUNE_FAULT_MODE", "signal"),
                ("ATTUNE_DRAM", "256M"),
                ("ATTUNE_CHUNK_SIZE", "64K"),
            ],
        ));
    }
    v
}

pub fn run(a: Args) -> i32 {
    if a.imme_only {
        return imme(&a);
    }
    let core = core(&a);
    if a.core_only || (a.only.is_some() && a.workloads.is_none() && a.envs.is_none()) {
        return core;
    }
    let workflows = imme(&a);
    if core != 0 {
        core
    } else {
        workflows
    }
}

/// The runtime's own scenarios.
fn core(a: &Args) -> i32 {
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("attune bench: cannot find own executable: {e}");
            return 2;
        }
    };
    let list: Vec<_> = scenarios(a.full)
        .into_iter()
        .filter(|(n, _)| a.only.as_deref().is_none_or(|o| n.contains(o)))
        .collect();
    if list.is_empty() {
        eprintln!("attune bench: no scenario matches {:?}", a.only);
        return 2;
    }
    let mut results: Vec<Value> = Vec::new();
    let mut failed = 0;
    let swap_dir = std::env::var_os("ATTUNE_BENCH_SWAP_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| "/var/tmp".into());
    if list.iter().any(|(n, _)| n.contains("kswap")) && crate::kernel_env::unavailable().is_none() {
        crate::kernel_env::clean_stale(&swap_dir);
    }
    let budget_bytes = RAND_BUDGET_MB as u64 * MB as u64 * a.scale as u64;
    let budget_env = format!("{}M", RAND_BUDGET_MB * a.scale as usize);
    for (i, (name, env)) in list.iter().enumerate() {
        let mut runs: Vec<Value> = Vec::new();
        // Kernel-swap scenarios: our own swap device and memory cgroup for their runs.
        let mut kernel: Option<(
            Option<crate::kernel_env::Swap>,
            crate::kernel_env::MemCgroup,
        )> = None;
        if *name == "file-kmmap" {
            match crate::kernel_env::unavailable()
                .map_or_else(|| crate::kernel_env::MemCgroup::new(budget_bytes), Err)
            {
                Ok(g) => kernel = Some((None, g)),
                Err(why) => {
                    eprintln!("\n{name}: skipped: {why}");
                    results.push(json!({"scenario": name, "ok": null, "skipped": why}));
                    continue;
                }
            }
        }
        if let Some(medium) = kswap_medium(name) {
            if let Some(why) = crate::kernel_env::unavailable() {
                eprintln!("\n{name}: skipped: {why}");
                results.push(json!({"scenario": name, "ok": null, "skipped": why}));
                continue;
            }
            let set_up =
                crate::kernel_env::Swap::new(medium, &swap_dir, (1 << 30) * a.scale as u64)
                    .and_then(|s| {
                        crate::kernel_env::MemCgroup::new(budget_bytes).map(|g| (Some(s), g))
                    });
            match set_up {
                Ok(k) => kernel = Some(k),
                Err(e) => {
                    eprintln!("\n{name}: cannot set up the kernel baseline: {e}");
                    failed += 1;
                    results.push(json!({"scenario": name, "ok": false, "error": e}));
                    continue;
                }
            }
        }
        for rep in 0..a.reps.max(1) {
            eprint!(
                "\r[{}/{}] {name} (run {}/{})        ",
                i + 1,
                list.len(),
                rep + 1,
                a.reps
            );
            let mut cmd = Command::new(&exe);
            cmd.arg("__worker").arg(name);
            for (k, v) in env {
                cmd.env(k, v);
            }
            // The core figures are the runtime's against the in-process memory tier (far
            // memory emulated, as they always were), unless the caller names other tiers
            // (bench/pool.py, bench/remote.py).
            if std::env::var_os("ATTUNE_CONFIG").is_none()
                && std::env::var_os("ATTUNE_FAR").is_none()
            {
                cmd.env("ATTUNE_FAR", "memory,file");
            }
            // The budget of the scaled scenarios grows with their data.
            if name.starts_with("rand-attune") || *name == "file-attune" {
                cmd.env("ATTUNE_DRAM", &budget_env);
            }
            cmd.env(SCALE_VAR, a.scale.to_string());
            if let Some((_, g)) = &kernel {
                g.reset_peak();
                cmd.env(CGROUP_VAR, g.path());
            }
            match cmd.output() {
                Ok(o) if o.status.success() => match serde_json::from_slice::<Value>(&o.stdout) {
                    Ok(mut v) => {
                        if let Some((_, g)) = &kernel {
                            // The limit held: the cgroup's peak, next to the result.
                            v["metrics"]["cgroup_peak_mib"] =
                                json!(g.max_usage() as f64 / MB as f64);
                        }
                        runs.push(v)
                    }
                    Err(e) => eprintln!("\n{name}: bad output: {e}"),
                },
                Ok(o) => eprintln!(
                    "\n{name}: failed ({}): {}",
                    o.status,
                    String::from_utf8_lossy(&o.stderr)
                ),
                Err(e) => eprintln!("\n{name}: cannot start: {e}"),
            }
        }
        drop(kernel);
        if runs.is_empty() || runs.iter().any(|r| r["ok"] != json!(true)) {
            failed += 1;
            results.push(json!({"scenario": name, "ok": false, "env": env_json(env)}));
            continue;
        }
        results.push(summarize(name, env, &runs));
    }
    eprintln!();
    print_table(&results);
    let cmp = comparisons(&results);
    if !cmp.is_empty() {
        println!("\nside by side (same run):");
        for c in &cmp {
            println!(
                "  {:<58} {:>8.2}x   goal {}",
                c["what"].as_str().unwrap_or(""),
                c["ratio"].as_f64().unwrap_or(0.0),
                c["goal"].as_str().unwrap_or("")
            );
        }
    }
    let doc = json!({"machine": machine(), "results": results, "comparisons": cmp});
    if std::fs::create_dir_all(&a.out).is_ok() {
        let _ = std::fs::write(
            a.out.join("bench.json"),
            serde_json::to_string_pretty(&doc).unwrap_or_default(),
        );
        let mut md = markdown(&results);
        if !cmp.is_empty() {
            md += "\n| comparison (same run) | ratio | goal |\n|---|---|---|\n";
            for c in &cmp {
                md += &format!(
                    "| {} | {:.2}x | {} |\n",
                    c["what"].as_str().unwrap_or(""),
                    c["ratio"].as_f64().unwrap_or(0.0),
                    c["goal"].as_str().unwrap_or("")
                );
            }
        }
        let _ = std::fs::write(a.out.join("benchmarks.md"), md);
        eprintln!(
            "wrote {}/bench.json and {}/benchmarks.md",
            a.out.display(),
            a.out.display()
        );
    }
    if failed > 0 {
        eprintln!("{failed} scenario(s) failed their correctness check or did not run");
        1
    } else {
        0
    }
}

fn median_of(results: &[Value], scenario: &str, metric: &str) -> Option<f64> {
    results
        .iter()
        .find(|r| r["scenario"] == json!(scenario) && r["ok"] == json!(true))
        .and_then(|r| r["metrics"][metric]["median"].as_f64())
}

/// Ratios between scenarios of this run, with the goal each is held to.
fn comparisons(results: &[Value]) -> Vec<Value> {
    let mut v = Vec::new();
    let mut add = |what: String, a: Option<f64>, b: Option<f64>, goal: &str| {
        if let (Some(a), Some(b)) = (a, b) {
            if b > 0.0 {
                v.push(json!({"what": what, "ratio": a / b, "goal": goal}));
            }
        }
    };
    for (m, goal) in [("random_reads_per_s", ">= 1x"), ("seq_gbps", ">= 1x")] {
        add(
            format!("file tier / kernel mmap of the file: {m}"),
            median_of(results, "file-attune", m),
            median_of(results, "file-kmmap", m),
            goal,
        );
    }
    for mode in ["signal", "thread"] {
        let att = median_of(results, &format!("rand-attune-{mode}"), "updates_per_s");
        add(
            format!("random updates: attune ({mode}) / kernel swap on memory"),
            att,
            median_of(results, "rand-kswap-memory", "updates_per_s"),
            ">= 2x",
        );
        add(
            format!("random updates: attune ({mode}) / kernel swap on disk"),
            att,
            median_of(results, "rand-kswap-disk", "updates_per_s"),
            ">= 10x",
        );
    }
    v
}

fn env_json(env: &[(&str, &str)]) -> Value {
    Value::Object(env.iter().map(|(k, v)| (k.to_string(), json!(v))).collect())
}

fn machine() -> Value {
    json!({"cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1), "memory": os::total_memory(),
           "kernel": std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim()})
}

/// Median and spread (min, max) of every numeric metric over the runs.
fn summarize(name: &str, env: &[(&str, &str)], runs: &[Value]) -> Value {
    let mut metrics = serde_json::Map::new();
    if let Some(obj) = runs[0]["metrics"].as_object() {
        for k in obj.keys() {
            let mut xs: Vec<f64> = runs
                .iter()
                .filter_map(|r| r["metrics"][k].as_f64())
                .collect();
            xs.sort_by(|a, b| a.partial_cmp(b).unwrap());
            if xs.is_empty() {
                continue;
            }
            metrics.insert(
                k.clone(),
                json!({"median": xs[xs.len() / 2], "min": xs[0], "max": xs[xs.len() - 1]}),
            );
        }
    }
    json!({"scenario": name, "ok": true, "env": env_json(env), "runs": runs.len(), "metrics": metrics})
}

fn print_table(results: &[Value]) {
    println!(
        "{:<22} {:<24} {:>14} {:>22}",
        "scenario", "metric", "median", "spread (min-max)"
    );
    for r in results {
        let name = r["scenario"].as_str().unwrap_or("");
        if let Some(why) = r["skipped"].as_str() {
            println!("{name:<22} skipped: {why}");
            continue;
        }
        if r["ok"] != json!(true) {
            println!("{name:<22} FAILED");
            continue;
        }
        if let Some(m) = r["metrics"].as_object() {
            for (k, v) in m {
                println!(
                    "{:<22} {:<24} {:>14.3} {:>10.3}-{:<11.3}",
                    name,
                    k,
                    v["median"].as_f64().unwrap_or(0.0),
                    v["min"].as_f64().unwrap_or(0.0),
                    v["max"].as_f64().unwrap_or(0.0)
                );
            }
        }
    }
}

fn markdown(results: &[Value]) -> String {
    let mut s = String::from("| scenario | metric | median | min | max |\n|---|---|---|---|---|\n");
    for r in results {
        let name = r["scenario"].as_str().unwrap_or("");
        if let Some(m) = r["metrics"].as_object() {
            for (k, v) in m {
                s += &format!(
                    "| {name} | {k} | {:.3} | {:.3} | {:.3} |\n",
                    v["median"].as_f64().unwrap_or(0.0),
                    v["min"].as_f64().unwrap_or(0.0),
                    v["max"].as_f64().unwrap_or(0.0)
                );
            }
        } else {
            s += &format!("| {name} | FAILED | | | |\n");
        }
    }
    s
}

// ---------------------------------------------------------------- workers

const MB: usize = 1 << 20;

fn xorshift(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

fn pct(v: &mut [u64], p: f64) -> f64 {
    v.sort_unstable();
    v[((v.len() - 1) as f64 * p) as usize] as f64
}

/// Runs one scenario and prints {"ok": bool, "metrics": {...}} on stdout.
pub fn worker(scenario: &str) -> i32 {
    let out = match scenario {
        "fault-plain-copy" => fault_plain(),
        "fault-attune-thread" | "fault-attune-signal" => fault_attune(),
        s if s.starts_with("seq-attune") => seq_attune(),
        "rand-dram" => rand_dram(),
        s if s.starts_with("rand-attune") => rand_attune(),
        s if s.starts_with("rand-kswap") => rand_kswap(),
        "file-attune" => file_attune(),
        "file-kmmap" => file_kmmap(),
        "alloc-small" => alloc_small(),
        "fit-overhead" => fit_overhead(),
        _ => Err(format!("unknown scenario {scenario}")),
    };
    match out {
        Ok(m) => {
            println!("{}", json!({"ok": true, "metrics": m}));
            0
        }
        Err(e) => {
            println!("{}", json!({"ok": false, "error": e}));
            eprintln!("{scenario}: {e}");
            1
        }
    }
}

// All managed-memory accesses below go through raw pointers: the memory comes from the
// runtime (or a mapping of this benchmark) and is valid for the range used.
fn rd(p: usize, i: usize) -> u64 {
    // SAFETY: callers index within a live allocation of 8-byte words.
    unsafe { std::ptr::read_volatile((p as *const u64).add(i)) }
}
fn wr(p: usize, i: usize, v: u64) {
    // SAFETY: as for rd.
    unsafe { std::ptr::write_volatile((p as *mut u64).add(i), v) }
}

/// The reference design: one handler thread, read(2) of the message, UFFDIO_COPY of 4 KiB.
fn fault_plain() -> Result<Value, String> {
    let pages = 20000usize;
    let ps = 4096;
    let len = pages * ps;
    let u = uffd::Uffd::open(uffd::Delivery::Thread, 0)
        .map_err(|e| format!("userfaultfd: {:?}", e.errno))?;
    let base = mem::map_anon(len, true).map_err(|e| e.to_string())?;
    u.register(base, len, uffd::mode::MISSING)
        .map_err(|e| e.to_string())?;
    let src = mem::map_anon(ps, false).map_err(|e| e.to_string())?;
    wr(src, 0, 42);
    let u = std::sync::Arc::new(u);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (u2, stop2) = (u.clone(), stop.clone());
    let h = std::thread::spawn(move || {
        let mut msgs = [uffd::Msg::default(); 16];
        while !stop2.load(std::sync::atomic::Ordering::Relaxed) {
            if !os::poll_readable(&[u2.raw_fd()], 100)[0] {
                continue;
            }
            let n = u2.read_msgs(&mut msgs).unwrap_or(0);
            for m in &msgs[..n] {
                if m.event == uffd::EVENT_PAGEFAULT {
                    let _ = u2.copy((m.arg[1] as usize) & !(ps - 1), src, ps, true);
                }
            }
        }
    });
    let mut order: Vec<usize> = (0..pages).collect();
    let mut x = 7u64;
    for i in (1..pages).rev() {
        order.swap(i, (xorshift(&mut x) % (i as u64 + 1)) as usize);
    }
    let mut lat = Vec::with_capacity(pages);
    let mut bad = 0;
    for &p in &order {
        let t = os::now_ns();
        let v = rd(base, p * ps / 8);
        lat.push(os::now_ns() - t);
        bad += (v != 42) as u64;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = h.join();
    if bad > 0 {
        return Err(format!("{bad} pages with wrong content"));
    }
    Ok(
        json!({"fault_median_us": pct(&mut lat.clone(), 0.5) / 1000.0, "fault_p99_us": pct(&mut lat, 0.99) / 1000.0}),
    )
}

fn alloc_managed(bytes: usize, flags: u32) -> Result<usize, String> {
    runtime::alloc(bytes, flags, None)
        .map_err(|e| format!("allocate_TM({bytes}): {e}: {}", attune::error::last_error()))
}

/// Fault-in latency of 4 KiB pages that were evicted to the memory tier.
fn fault_attune() -> Result<Value, String> {
    let len = 256 * MB;
    let p = alloc_managed(len, 0)?;
    let words = len / 8;
    let per_page = 512;
    for i in (0..words).step_by(per_page) {
        wr(p, i, i as u64);
    }
    // The first 150 MiB are evicted now (the budget is 64 MiB): fault them back at random.
    let pages = 150 * MB / 4096;
    let mut order: Vec<usize> = (0..pages).collect();
    let mut x = 11u64;
    for i in (1..pages).rev() {
        order.swap(i, (xorshift(&mut x) % (i as u64 + 1)) as usize);
    }
    let n = 20000.min(pages);
    let mut lat = Vec::with_capacity(n);
    let mut bad = 0;
    for &pg in &order[..n] {
        let i = pg * per_page;
        let t = os::now_ns();
        let v = rd(p, i);
        lat.push(os::now_ns() - t);
        bad += (v != i as u64) as u64;
    }
    if bad > 0 {
        return Err(format!("{bad} pages with wrong content"));
    }
    let _ = runtime::free(p);
    Ok(
        json!({"fault_median_us": pct(&mut lat.clone(), 0.5) / 1000.0, "fault_p99_us": pct(&mut lat, 0.99) / 1000.0}),
    )
}

/// Sequential read passes over twice the budget.
fn seq_attune() -> Result<Value, String> {
    let len = 512 * MB;
    let p = alloc_managed(len, 0)?;
    let words = len / 8;
    // The second half is written past the 256 MiB budget: each new page displaces one, so
    // its rate is the eviction throughput (what issue 29 compares per kernel feature).
    fill_index(p, words / 2);
    let t = os::now_ns();
    for i in words / 2..words {
        wr(p, i, i as u64);
    }
    let fill_evict_gbps = (len / 2) as f64 / ((os::now_ns() - t) as f64 / 1e9) / 1e9;
    let mut best = 0f64;
    for _ in 0..2 {
        let t = os::now_ns();
        let mut sum = 0u64;
        for i in 0..words {
            sum = sum.wrapping_add(rd(p, i));
        }
        let dt = (os::now_ns() - t) as f64 / 1e9;
        let want = (words as u64 - 1) * words as u64 / 2;
        if sum != want {
            return Err(format!("checksum {sum} != {want}"));
        }
        best = best.max(len as f64 / dt / 1e9);
    }
    let _ = runtime::free(p);
    Ok(json!({"seq_read_gbps": best, "fill_evict_gbps": fill_evict_gbps}))
}

/// Writes word i = i over the whole range (the content every check expects).
fn fill_index(p: usize, words: usize) {
    for i in 0..words {
        wr(p, i, i as u64);
    }
}

/// Longest a random-update pass runs: the rate is what is measured, and a slow pager
/// (thread hand-offs on a host with costly IPIs: 21 k updates/s on 2026-11-24) would
/// otherwise take most of the default suite's 10 minutes.
const RAND_MAX_NS: u64 = 10_000_000_000;

/// Random read-modify-write of 8-byte words, `n` of them or for `RAND_MAX_NS`; returns
/// (updates done, updates per second).
fn rand_updates(p: usize, words: usize, n: usize) -> (usize, f64) {
    let mut x = 99u64;
    let t = os::now_ns();
    let mut done = 0;
    while done < n {
        let i = (xorshift(&mut x) % words as u64) as usize;
        wr(p, i, rd(p, i) ^ 0x5555);
        done += 1;
        if done % 4096 == 0 && os::now_ns() - t > RAND_MAX_NS {
            break;
        }
    }
    let dt = (os::now_ns() - t) as f64 / 1e9;
    (done, done as f64 / dt)
}

fn check_rand(p: usize, words: usize, n: usize) -> Result<(), String> {
    let mut flips = std::collections::HashMap::new();
    let mut x = 99u64;
    for _ in 0..n {
        let i = (xorshift(&mut x) % words as u64) as usize;
        *flips.entry(i).or_insert(0u32) += 1;
    }
    for (i, c) in flips.iter().take(100_000) {
        let want = (*i as u64) ^ if c % 2 == 1 { 0x5555 } else { 0 };
        if rd(p, *i) != want {
            return Err(format!("word {i} wrong after random updates"));
        }
    }
    Ok(())
}

/// Bytes of the random-update array (twice the budget).
fn rand_len() -> usize {
    2 * RAND_BUDGET_MB * MB * scale()
}

/// Random updates over `rand_len()` bytes at `p`, filled and verified; `n` updates.
fn rand_scenario(p: usize, n: usize) -> Result<Value, String> {
    let words = rand_len() / 8;
    fill_index(p, words);
    let (done, ops) = rand_updates(p, words, n);
    check_rand(p, words, done)?;
    Ok(json!({"updates_per_s": ops}))
}

/// Reference: the same updates on plain memory that fits in DRAM.
fn rand_dram() -> Result<Value, String> {
    rand_scenario(
        mem::map_anon(rand_len(), false).map_err(|e| e.to_string())?,
        4_000_000,
    )
}

/// Random 8-byte updates over twice the budget.
fn rand_attune() -> Result<Value, String> {
    let p = alloc_managed(rand_len(), 0)?;
    let r = rand_scenario(p, 1_000_000);
    let _ = runtime::free(p);
    r
}

/// The same updates on plain memory in a cgroup limited to the budget, with kernel swap.
fn rand_kswap() -> Result<Value, String> {
    crate::kernel_env::join_cgroup_from_env(CGROUP_VAR)?;
    let p = mem::map_anon(rand_len(), false).map_err(|e| e.to_string())?;
    let r = rand_scenario(p, 200_000);
    let _ = mem::unmap(p, rand_len());
    r
}

/// The file scenarios' data: 1 GiB times `--scale`.
fn file_mb() -> usize {
    1024 * scale()
}
const FILE_READS: usize = 300_000;

fn bench_dir() -> std::path::PathBuf {
    std::env::var_os("ATTUNE_BENCH_SWAP_DIR")
        .map(Into::into)
        .unwrap_or_else(|| "/var/tmp".into())
}

/// 1 GiB in Attune's file tier alone (a directory on disk), 256 MiB budget.
fn file_attune() -> Result<Value, String> {
    let words = file_mb() * MB / 8;
    let opts = attune::paging::AllocOptions {
        preferred_tier: Some(file_tier_index()?),
        ..Default::default()
    };
    let p = runtime::alloc(file_mb() * MB, 0, Some(opts))
        .map_err(|e| format!("{e}: {}", attune::error::last_error()))?;
    fill_index(p, words);
    let r = file_reads(p, words, false);
    let _ = runtime::free(p);
    r
}

fn file_tier_index() -> Result<usize, String> {
    let rt = runtime::runtime().map_err(|e| e.to_string())?;
    rt.config()
        .tiers
        .iter()
        .position(|t| t.kind == attune::config::TierKind::File)
        .ok_or_else(|| "no file tier configured".into())
}

/// The kernel's way: the same 1 GiB as a file mapped shared, in a 256 MiB cgroup limit,
/// MADV_RANDOM for the random reads (page cache dropped before).
fn file_kmmap() -> Result<Value, String> {
    use std::os::unix::fs::FileExt;
    let path = bench_dir().join(format!("attune-kmmap-{}", std::process::id()));
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let _ = std::fs::remove_file(&path); // unnamed from here on
    let mut buf = vec![0u8; MB];
    for m in 0..file_mb() {
        for (k, c) in buf.chunks_exact_mut(8).enumerate() {
            c.copy_from_slice(&((m * MB / 8 + k) as u64).to_ne_bytes());
        }
        f.write_all_at(&buf, (m * MB) as u64)
            .map_err(|e| e.to_string())?;
    }
    let fd: std::os::fd::OwnedFd = f.into();
    mem::drop_file_cache(&fd).map_err(|e| e.to_string())?;
    crate::kernel_env::join_cgroup_from_env(CGROUP_VAR)?;
    let p = mem::map_file_shared_ro(&fd, file_mb() * MB).map_err(|e| e.to_string())?;
    let _ = mem::advise(p, file_mb() * MB, libc::MADV_RANDOM);
    let r = file_reads(p, file_mb() * MB / 8, true);
    let _ = mem::unmap(p, file_mb() * MB);
    r
}

/// Random 8-byte reads, then one sequential pass, over `words` at `p` (word i holds i).
/// `kernel`: a kernel mapping, advised MADV_SEQUENTIAL for the pass (its best case).
fn file_reads(p: usize, words: usize, kernel: bool) -> Result<Value, String> {
    let mut x = 77u64;
    let t = os::now_ns();
    for _ in 0..FILE_READS {
        let i = (xorshift(&mut x) % words as u64) as usize;
        if rd(p, i) != i as u64 {
            return Err(format!("word {i} wrong"));
        }
    }
    let rand = FILE_READS as f64 / ((os::now_ns() - t) as f64 / 1e9);
    if kernel {
        let _ = mem::advise(p, words * 8, libc::MADV_SEQUENTIAL);
    }
    let t = os::now_ns();
    let mut sum = 0u64;
    for i in 0..words {
        sum = sum.wrapping_add(rd(p, i));
    }
    let gbps = (words * 8) as f64 / ((os::now_ns() - t) as f64 / 1e9) / 1e9;
    if sum != (words as u64 - 1) * words as u64 / 2 {
        return Err("sequential checksum wrong".into());
    }
    Ok(json!({"random_reads_per_s": rand, "seq_gbps": gbps}))
}

/// allocate_TM/free_TM pairs against malloc/free, 64 B to 1 MiB.
fn alloc_small() -> Result<Value, String> {
    let mut m = serde_json::Map::new();
    for &size in &[64usize, 1024, 16384, 262144, 1 << 20] {
        let n = if size >= 262144 { 2000 } else { 200_000 };
        // Steady state, as for malloc: the first small request of a class creates its
        // arena (a 1 GiB reservation registered with userfaultfd) and faults its pages in,
        // which 200,000 pairs would otherwise carry (seen as 2x at 64 B).
        for _ in 0..n / 100 {
            let p = alloc_managed(size, 0)?;
            wr(p, 0, 1);
            runtime::free(p).map_err(|e| e.to_string())?;
        }
        let t = os::now_ns();
        for _ in 0..n {
            let p = alloc_managed(size, 0)?;
            wr(p, 0, 1);
            runtime::free(p).map_err(|e| e.to_string())?;
        }
        let attune_ns = (os::now_ns() - t) as f64 / n as f64;
        let t = os::now_ns();
        for _ in 0..n {
            // SAFETY: plain malloc/free pair; the first word is written like above.
            unsafe {
                let p = libc::malloc(size) as usize;
                wr(p, 0, 1);
                libc::free(p as *mut _);
            }
        }
        let malloc_ns = (os::now_ns() - t) as f64 / n as f64;
        m.insert(format!("ratio_{size}B"), json!(attune_ns / malloc_ns));
        m.insert(format!("attune_ns_{size}B"), json!(attune_ns));
    }
    Ok(Value::Object(m))
}

/// Everything fits: managed memory against malloc'ed memory, sequential and random.
fn fit_overhead() -> Result<Value, String> {
    let len = 256 * MB;
    let words = len / 8;
    let a = alloc_managed(len, 0)?;
    let b = mem::map_anon(len, false).map_err(|e| e.to_string())?;
    for p in [a, b] {
        fill_index(p, words);
    }
    let seq = |p: usize| {
        let t = os::now_ns();
        let mut s = 0u64;
        for _ in 0..4 {
            for i in 0..words {
                s = s.wrapping_add(rd(p, i));
            }
        }
        std::hint::black_box(s);
        (os::now_ns() - t) as f64
    };
    let (mut sa, mut sb) = (f64::MAX, f64::MAX);
    for _ in 0..3 {
        sa = sa.min(seq(a));
        sb = sb.min(seq(b));
    }
    let (_, ra) = rand_updates(a, words, 4_000_000);
    let (_, rb) = rand_updates(b, words, 4_000_000);
    let _ = runtime::free(a);
    Ok(json!({"seq_slowdown": sa / sb, "rand_slowdown": rb / ra}))
}
