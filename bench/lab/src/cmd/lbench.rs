//! `attune lbench`: the interference generator and probe of the disaggregated-memory
//! profiling paper (§3.2), on a chosen memory node.
//!
//! The generator streams over an array with F flops per element in T threads: fewer flops
//! per element, more memory traffic. Its level of interference (LoI) is its traffic as a
//! percentage of the peak (F = 1 at the same thread count), measured here by calibration,
//! so a configured level maps to the flops that give it. The probe is the same kernel
//! with one thread and F = 1 for a fixed amount of work; its time over its idle time is the
//! interference coefficient (IC). `sweep` runs a program under levels 0..50 and reports its
//! performance relative to level 0 (the paper's Figure 10); `coefficient` runs the probe
//! beside a program (Figure 11, right).

use std::hint::black_box;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    cmd: Sub,
}

#[derive(clap::Args, Clone)]
struct Where {
    /// Memory node of the arrays (the tier under test, e.g. the CXL node); default: local.
    #[arg(long)]
    node: Option<u32>,
    /// Generator threads (default: all CPUs but one, at least one).
    #[arg(long)]
    threads: Option<usize>,
    /// Generator array size.
    #[arg(long, default_value = "256M")]
    size: String,
    /// Probe array size.
    #[arg(long, default_value = "64M")]
    probe_size: String,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Subcommand)]
enum Sub {
    /// Measure traffic per flops/element and the flops that give each level.
    Calibrate {
        #[command(flatten)]
        w: Where,
    },
    /// Generate interference at a level (percent of peak traffic) or flops/element.
    Run {
        #[command(flatten)]
        w: Where,
        #[arg(long, conflicts_with = "flops")]
        level: Option<u32>,
        #[arg(long)]
        flops: Option<u32>,
        /// Seconds to run (default: until interrupted).
        #[arg(long)]
        duration: Option<f64>,
    },
    /// Time the probe (1 thread, 1 flop/element) on an otherwise idle system.
    Probe {
        #[command(flatten)]
        w: Where,
        #[arg(long, default_value_t = 5)]
        reps: usize,
    },
    /// Interference coefficient of a program: probe time beside it over idle probe time.
    Coefficient {
        #[command(flatten)]
        w: Where,
        #[arg(required = true, trailing_var_arg = true)]
        program: Vec<String>,
    },
    /// A program's (or the probe's) performance under interference levels.
    Sweep {
        #[command(flatten)]
        w: Where,
        /// Levels in percent of peak traffic.
        #[arg(long, default_value = "0,10,20,30,40,50", value_delimiter = ',')]
        levels: Vec<u32>,
        #[arg(long, default_value_t = 3)]
        reps: usize,
        /// Also write sweep.json and sweep.png (relative performance against LoI) there.
        #[arg(long)]
        out: Option<std::path::PathBuf>,
        /// Program and arguments; without one, the probe itself is measured.
        #[arg(trailing_var_arg = true)]
        program: Vec<String>,
    },
}

/// Flops/element values the calibration measures (the paper sweeps 1 to 128 and beyond).
const FLOPS: [u32; 18] = [
    1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 24, 32, 48, 64, 128, 256, 1024,
];

/// An array of f64 placed on `node` (MPOL_BIND before first touch) and filled.
fn array(bytes: usize, node: Option<u32>) -> Result<Vec<f64>, String> {
    let n = (bytes / 8).max(1024);
    let mut v: Vec<f64> = Vec::with_capacity(n);
    if let Some(node) = node {
        if node > 63 {
            return Err(format!(
                "--node {node}: node ids above 63 are not supported"
            ));
        }
        // The page-aligned interior of the (not yet touched) buffer; glibc maps large
        // buffers with mmap, so all but the first page are fresh.
        let page = 4096;
        let start = (v.as_ptr() as usize).div_ceil(page) * page;
        let end = (v.as_ptr() as usize + n * 8) / page * page;
        if end > start {
            attune_sys::numa::mbind(
                start,
                end - start,
                attune_sys::numa::mpol::BIND,
                1 << node,
                true,
            )
            .map_err(|e| {
                format!("--node {node}: mbind failed: {e} (is node {node} online with memory?)")
            })?;
        }
    }
    v.extend((0..n).map(|i| (i % 1024) as f64 * 0.5));
    Ok(v)
}

/// One pass: each element gets `flops` floating-point operations (F/2 multiply-adds, and
/// one add when F is odd), read and written once: 16 bytes of traffic per element.
fn pass(x: &mut [f64], flops: u32) {
    let a = black_box(0.999_999_f64);
    let c = black_box(1e-9_f64);
    if flops <= 1 {
        for v in x.iter_mut() {
            *v += c;
        }
        return;
    }
    let k = flops / 2;
    let odd = flops % 2 == 1;
    for v in x.iter_mut() {
        let mut y = *v;
        for _ in 0..k {
            y = y * a + c;
        }
        if odd {
            y += c;
        }
        *v = y;
    }
}

/// Runs `threads` threads over `x` at `flops` until `stop`; counts bytes moved.
fn generate(x: &mut [f64], flops: u32, threads: usize, stop: &AtomicBool, bytes: &AtomicU64) {
    let chunk = x.len().div_ceil(threads);
    std::thread::scope(|s| {
        for part in x.chunks_mut(chunk) {
            s.spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    // Slices of 1 MiB so a stop is seen quickly.
                    for sl in part.chunks_mut(1 << 17) {
                        pass(sl, flops);
                        bytes.fetch_add(sl.len() as u64 * 16, Ordering::Relaxed);
                        if stop.load(Ordering::Relaxed) {
                            break;
                        }
                    }
                }
            });
        }
    });
}

/// Traffic in bytes/s of the generator at `flops` over `secs`.
fn measure(x: &mut [f64], flops: u32, threads: usize, secs: f64) -> f64 {
    let stop = AtomicBool::new(false);
    let bytes = AtomicU64::new(0);
    let t0 = Instant::now();
    std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_secs_f64(secs));
            stop.store(true, Ordering::Relaxed);
        });
        generate(x, flops, threads, &stop, &bytes);
    });
    bytes.load(Ordering::Relaxed) as f64 / t0.elapsed().as_secs_f64()
}

#[derive(Serialize, Clone)]
struct Point {
    flops: u32,
    bytes_per_s: f64,
    level: f64,
}

#[derive(Serialize)]
struct Calibration {
    threads: usize,
    node: Option<u32>,
    peak_bytes_per_s: f64,
    points: Vec<Point>,
}

fn calibrate(x: &mut [f64], threads: usize, node: Option<u32>) -> Calibration {
    let _ = measure(x, 1, threads, 0.1); // warm up (page faults, frequency)
    let mut pts: Vec<Point> = FLOPS
        .iter()
        .map(|&f| Point {
            flops: f,
            bytes_per_s: measure(x, f, threads, 0.25),
            level: 0.0,
        })
        .collect();
    let peak = pts.iter().map(|p| p.bytes_per_s).fold(0.0, f64::max);
    for p in &mut pts {
        p.level = 100.0 * p.bytes_per_s / peak;
    }
    Calibration {
        threads,
        node,
        peak_bytes_per_s: peak,
        points: pts,
    }
}

/// The flops/element whose measured level is closest to `level` (percent of peak), from
/// a calibration's (flops, level) points; 0 means no generator. Pure, unit-tested.
pub fn flops_for_level(points: &[(u32, f64)], level: u32) -> u32 {
    if level == 0 {
        return 0;
    }
    points
        .iter()
        .min_by(|a, b| {
            let da = (a.1 - level as f64).abs();
            let db = (b.1 - level as f64).abs();
            da.partial_cmp(&db).unwrap_or(std::cmp::Ordering::Equal)
        })
        .map(|p| p.0)
        .unwrap_or(1)
}

/// The probe: one thread, 1 flop/element, `passes` passes over `x`; seconds.
fn probe_once(x: &mut [f64], passes: usize) -> f64 {
    let t0 = Instant::now();
    for _ in 0..passes {
        pass(x, 1);
    }
    black_box(&x[0]);
    t0.elapsed().as_secs_f64()
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    if v.is_empty() {
        return f64::NAN;
    }
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    }
}

/// A generator in the background at `flops` (0: none), stopped on drop.
struct Background {
    stop: Arc<AtomicBool>,
    bytes: Arc<AtomicU64>,
    started: Instant,
    bytes_at_start: u64,
    handle: Option<std::thread::JoinHandle<Vec<f64>>>,
}

impl Background {
    fn start(mut x: Vec<f64>, flops: u32, threads: usize) -> Background {
        let stop = Arc::new(AtomicBool::new(flops == 0));
        let bytes = Arc::new(AtomicU64::new(0));
        let (s2, b2) = (stop.clone(), bytes.clone());
        let handle = std::thread::spawn(move || {
            if flops > 0 {
                generate(&mut x, flops, threads, &s2, &b2);
            }
            x
        });
        std::thread::sleep(Duration::from_millis(if flops > 0 { 100 } else { 0 }));
        let bytes_at_start = bytes.load(Ordering::Relaxed);
        Background {
            stop,
            bytes,
            started: Instant::now(),
            bytes_at_start,
            handle: Some(handle),
        }
    }
    fn finish(mut self) -> (Vec<f64>, f64) {
        let secs = self.started.elapsed().as_secs_f64();
        let moved = self.bytes.load(Ordering::Relaxed) - self.bytes_at_start;
        self.stop.store(true, Ordering::Relaxed);
        let x = self
            .handle
            .take()
            .and_then(|h| h.join().ok())
            .unwrap_or_default();
        (x, moved as f64 / secs.max(1e-9))
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// Runs the program once and times it; with `quiet_stdout` (JSON mode) its output goes to
/// our standard error so standard output stays one JSON document.
fn run_program(argv: &[String], quiet_stdout: bool) -> Result<f64, String> {
    let t0 = Instant::now();
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..]);
    if quiet_stdout {
        use std::os::fd::AsFd;
        if let Ok(fd) = std::io::stderr().as_fd().try_clone_to_owned() {
            cmd.stdout(std::process::Stdio::from(fd));
        }
    }
    let st = cmd
        .status()
        .map_err(|e| format!("cannot run {}: {e}", argv[0]))?;
    if !st.success() {
        return Err(format!("{} failed: {st}", argv[0]));
    }
    Ok(t0.elapsed().as_secs_f64())
}

struct Setup {
    threads: usize,
    gen: Vec<f64>,
    probe: Vec<f64>,
    passes: usize,
}

fn setup(w: &Where) -> Result<Setup, String> {
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let threads = w.threads.unwrap_or((cpus.saturating_sub(1)).max(1));
    if threads == 0 || threads > 1024 {
        return Err(format!("--threads {threads}: must be 1..1024"));
    }
    let size =
        attune::size::parse_size(&w.size).map_err(|e| format!("--size {}: {e}", w.size))? as usize;
    let psize = attune::size::parse_size(&w.probe_size)
        .map_err(|e| format!("--probe-size {}: {e}", w.probe_size))? as usize;
    if size < (1 << 20) || psize < (1 << 20) {
        return Err(
            "--size and --probe-size must be at least 1M (the arrays must not fit in cache)".into(),
        );
    }
    let gen = array(size, w.node)?;
    let probe = array(psize, w.node)?;
    // About 0.2 s of probe work at a few GB/s, whatever the probe size.
    let passes = ((1usize << 30) / psize).clamp(1, 64);
    Ok(Setup {
        threads,
        gen,
        probe,
        passes,
    })
}

pub fn run(a: Args) -> i32 {
    match run_inner(a) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("attune lbench: {e}");
            2
        }
    }
}

fn gbs(b: f64) -> String {
    format!("{:.2} GB/s", b / 1e9)
}

fn run_inner(a: Args) -> Result<(), String> {
    match a.cmd {
        Sub::Calibrate { w } => {
            let mut s = setup(&w)?;
            let c = calibrate(&mut s.gen, s.threads, w.node);
            if w.json {
                println!("{}", serde_json::to_string_pretty(&c).unwrap_or_default());
            } else {
                println!(
                    "threads {}, peak {} (1 flop/element)",
                    c.threads,
                    gbs(c.peak_bytes_per_s)
                );
                println!("{:>12} {:>12} {:>8}", "flops/elem", "traffic", "LoI %");
                for p in &c.points {
                    println!(
                        "{:>12} {:>12} {:>8.1}",
                        p.flops,
                        gbs(p.bytes_per_s),
                        p.level
                    );
                }
            }
        }
        Sub::Run {
            w,
            level,
            flops,
            duration,
        } => {
            let mut s = setup(&w)?;
            let f = match (level, flops) {
                (_, Some(0)) => return Err("--flops must be at least 1".into()),
                (_, Some(f)) => f,
                (Some(l), None) if l <= 100 => {
                    let c = calibrate(&mut s.gen, s.threads, w.node);
                    let pts: Vec<(u32, f64)> =
                        c.points.iter().map(|p| (p.flops, p.level)).collect();
                    flops_for_level(&pts, l)
                }
                (Some(l), None) => return Err(format!("--level {l}: must be 0..100")),
                (None, None) => 1,
            };
            if f == 0 {
                eprintln!("attune lbench: level 0: nothing to generate");
                return Ok(());
            }
            let stop = Arc::new(AtomicBool::new(false));
            let bytes = AtomicU64::new(0);
            if let Some(d) = duration {
                if d.is_nan() || d <= 0.0 {
                    return Err(format!("--duration {d}: must be above 0"));
                }
                let st = stop.clone();
                std::thread::spawn(move || {
                    std::thread::sleep(Duration::from_secs_f64(d));
                    st.store(true, Ordering::Relaxed);
                });
            }
            eprintln!(
                "attune lbench: generating at {f} flops/element in {} threads",
                s.threads
            );
            let t0 = Instant::now();
            generate(&mut s.gen, f, s.threads, &stop, &bytes);
            let bps = bytes.load(Ordering::Relaxed) as f64 / t0.elapsed().as_secs_f64();
            println!("flops/element {f}, traffic {}", gbs(bps));
        }
        Sub::Probe { w, reps } => {
            let mut s = setup(&w)?;
            probe_once(&mut s.probe, 1);
            let mut t: Vec<f64> = (0..reps.max(1))
                .map(|_| probe_once(&mut s.probe, s.passes))
                .collect();
            let m = median(&mut t);
            if w.json {
                println!(
                    "{}",
                    serde_json::json!({"probe_seconds": m, "passes": s.passes, "reps": reps})
                );
            } else {
                println!("probe: {m:.4} s (median of {reps}, {} passes)", s.passes);
            }
        }
        Sub::Coefficient { w, program } => {
            let mut s = setup(&w)?;
            probe_once(&mut s.probe, 1);
            let mut idle: Vec<f64> = (0..5).map(|_| probe_once(&mut s.probe, s.passes)).collect();
            let t_idle = median(&mut idle);
            let mut child = Command::new(&program[0])
                .args(&program[1..])
                .spawn()
                .map_err(|e| format!("cannot run {}: {e}", program[0]))?;
            let mut ics = Vec::new();
            loop {
                if child.try_wait().map_err(|e| e.to_string())?.is_some() {
                    break;
                }
                ics.push(probe_once(&mut s.probe, s.passes) / t_idle);
            }
            let status = child.wait().map_err(|e| e.to_string())?;
            // The idle time is taken before and after the program (5 probes each), so a
            // machine whose speed drifts during the run (a shared host) biases neither way.
            idle.extend((0..5).map(|_| probe_once(&mut s.probe, s.passes)));
            let t_idle2 = median(&mut idle);
            for ic in ics.iter_mut() {
                *ic *= t_idle / t_idle2;
            }
            let t_idle = t_idle2;
            if ics.is_empty() {
                return Err(format!(
                    "{} ended before the first probe; give it more work",
                    program[0]
                ));
            }
            let mut sorted = ics.clone();
            let ic = median(&mut sorted);
            let (lo, hi) = (sorted[0], sorted[sorted.len() - 1]);
            if w.json {
                println!(
                    "{}",
                    serde_json::json!({"ic": ic, "min": lo, "max": hi, "probes": ics,
                                       "idle_probe_seconds": t_idle, "program_status": status.code()})
                );
            } else {
                println!(
                    "interference coefficient {ic:.3} (min {lo:.3}, max {hi:.3}, {} probes; idle probe {t_idle:.4} s)",
                    ics.len()
                );
            }
            if !status.success() {
                return Err(format!("{} failed: {status}", program[0]));
            }
        }
        Sub::Sweep {
            w,
            levels,
            reps,
            out,
            program,
        } => sweep(&w, &levels, reps.max(1), &program, out.as_deref())?,
    }
    Ok(())
}

#[derive(Serialize)]
struct SweepRow {
    level: u32,
    flops: u32,
    generated_level: f64,
    seconds: f64,
    spread: (f64, f64),
    relative_performance: f64,
}

fn sweep(
    w: &Where,
    levels: &[u32],
    reps: usize,
    program: &[String],
    out: Option<&std::path::Path>,
) -> Result<(), String> {
    if let Some(l) = levels.iter().find(|&&l| l > 100) {
        return Err(format!("--levels: {l} is not a percentage"));
    }
    if let Some(o) = out {
        std::fs::create_dir_all(o).map_err(|e| format!("--out {}: {e}", o.display()))?;
    }
    let mut s = setup(w)?;
    let c = calibrate(&mut s.gen, s.threads, w.node);
    let pts: Vec<(u32, f64)> = c.points.iter().map(|p| (p.flops, p.level)).collect();
    // Rounds: every level once per round, so drift on a shared machine hits all levels
    // alike instead of the last ones.
    let flops: Vec<u32> = levels.iter().map(|&l| flops_for_level(&pts, l)).collect();
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); levels.len()];
    // Per-rep traffic, summarised by its median like the times: one rep in which the host
    // held the generator's vCPU off must not move a level's figure below the next lower
    // level's (a CI run on 2026-11-27 read a mean of 27.9% at level 20 and 20.6% at 50).
    let mut traffic: Vec<Vec<f64>> = vec![Vec::new(); levels.len()];
    let mut gen = std::mem::take(&mut s.gen);
    probe_once(&mut s.probe, 1);
    for _ in 0..reps {
        for (i, &f) in flops.iter().enumerate() {
            let bg = Background::start(gen, f, s.threads);
            let t = if program.is_empty() {
                Ok(probe_once(&mut s.probe, s.passes))
            } else {
                run_program(program, w.json)
            };
            let (back, bps) = bg.finish();
            gen = back;
            times[i].push(t?);
            traffic[i].push(bps);
        }
    }
    let mut rows: Vec<SweepRow> = Vec::new();
    for (i, &l) in levels.iter().enumerate() {
        let t = &mut times[i];
        let spread = (
            t.iter().cloned().fold(f64::INFINITY, f64::min),
            t.iter().cloned().fold(0.0, f64::max),
        );
        rows.push(SweepRow {
            level: l,
            flops: flops[i],
            generated_level: if flops[i] == 0 {
                0.0
            } else {
                100.0 * median(&mut traffic[i]) / c.peak_bytes_per_s
            },
            seconds: median(t),
            spread,
            relative_performance: 0.0,
        });
    }
    let base = rows
        .iter()
        .find(|r| r.level == 0)
        .map(|r| r.seconds)
        .unwrap_or(rows[0].seconds);
    for r in &mut rows {
        r.relative_performance = base / r.seconds;
    }
    let what = if program.is_empty() {
        "probe".to_string()
    } else {
        program.join(" ")
    };
    let doc = serde_json::to_string_pretty(&serde_json::json!({
        "program": what, "threads": s.threads, "node": w.node,
        "peak_bytes_per_s": c.peak_bytes_per_s, "rows": rows, "calibration": c.points}))
    .unwrap_or_default();
    if let Some(o) = out {
        std::fs::write(o.join("sweep.json"), &doc)
            .map_err(|e| format!("--out {}: {e}", o.display()))?;
        attune_cli::python::plot("lbench", "lbench", o);
    }
    if w.json {
        println!("{doc}");
    } else {
        println!(
            "{what}: generator {} threads, peak {}",
            s.threads,
            gbs(c.peak_bytes_per_s)
        );
        println!(
            "{:>5} {:>6} {:>10} {:>10} {:>10}",
            "LoI", "flops", "generated", "seconds", "rel.perf"
        );
        for r in &rows {
            println!(
                "{:>5} {:>6} {:>9.1}% {:>10.4} {:>10.3}",
                r.level, r.flops, r.generated_level, r.seconds, r.relative_performance
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn level_maps_to_nearest_calibrated_flops() {
        let pts = [
            (1, 100.0),
            (2, 98.0),
            (4, 90.0),
            (8, 60.0),
            (16, 35.0),
            (32, 18.0),
            (64, 9.0),
            (128, 4.5),
        ];
        let cases = [
            (0, 0),
            (100, 1),
            (50, 8),
            (40, 16),
            (30, 16),
            (20, 32),
            (10, 64),
            (1, 128),
        ];
        for (level, flops) in cases {
            assert_eq!(flops_for_level(&pts, level), flops, "level {level}");
        }
    }

    #[test]
    fn pass_does_the_flops_it_says() {
        let mut x = vec![1.0f64; 4];
        pass(&mut x, 1);
        assert!((x[0] - (1.0 + 1e-9)).abs() < 1e-15);
        let mut y = vec![1.0f64; 4];
        pass(&mut y, 4); // two multiply-adds
        let e = (1.0 * 0.999_999 + 1e-9) * 0.999_999 + 1e-9;
        assert!((y[0] - e).abs() < 1e-15);
    }

    #[test]
    fn median_of_odd_and_even() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 2.0, 3.0]), 2.5);
    }
}
