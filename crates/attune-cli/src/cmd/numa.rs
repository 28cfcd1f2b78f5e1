//! `attune numa`: placement on NUMA tiers, seen from the outside.
//!
//! * `attune numa weights [--apply]`: weighted-interleave weights from the tiers'
//!   bandwidth (HMAT or configuration); `--apply` writes them to the kernel (root, a
//!   system-wide setting: an administrator's or the node daemon's act, never the runtime's).
//! * `attune numa place --region SIZE:FLAGS ...`: allocates regions through the runtime
//!   (the path `allocate_TM` takes), writes every page, and reports where the pages are
//!   (move_pages queries) with a checksum check. `--kernel` does the same with plain
//!   memory under the kernel's own policy, for comparison. Used by the QEMU guest tests.

use attune::numa::{self, NumaPlacer};
use attune::Flags;
use attune_sys::mem;
use attune_sys::os::ForkRun;
use serde_json::json;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    cmd: Sub,
}

#[derive(clap::Subcommand)]
enum Sub {
    /// Interleave weights per node from the tiers' bandwidth.
    Weights {
        /// Write them to /sys/kernel/mm/mempolicy/weighted_interleave (root).
        #[arg(long)]
        apply: bool,
        #[arg(long)]
        config: Option<std::path::PathBuf>,
    },
    /// Allocate regions, touch them and report their pages per node.
    Place(PlaceArgs),
}

#[derive(clap::Args)]
struct PlaceArgs {
    /// A region SIZE:FLAGS (FLAGS: LAT, BW, CAP, SHL joined by ',' or '|', or NONE),
    /// allocated in the order given.
    #[arg(long = "region", required = true)]
    regions: Vec<String>,
    #[arg(long)]
    config: Option<std::path::PathBuf>,
    /// Move region I (0-based) to tier T after touching: I:T.
    #[arg(long = "move")]
    moves: Vec<String>,
    /// Change region I's flags after touching: I:FLAGS (attune_set_flags).
    #[arg(long = "reflag")]
    reflags: Vec<String>,
    /// Keep reading the LAT regions for this many seconds before measuring (lets the
    /// kernel's promotion act in --kernel runs).
    #[arg(long, default_value_t = 0.0)]
    hot_secs: f64,
    /// During --hot-secs, also write the first SIZE bytes of region I (a hot set that
    /// starts wherever the region was placed): I:SIZE. The report gives where those pages
    /// are and how long it took until 90% of them were on the fast tier.
    #[arg(long = "write-hot")]
    write_hot: Vec<String>,
    /// During --hot-secs, fork N children evenly spread over the time; each allocates,
    /// writes, checks and frees a NUMA region and reads the statistics, then exits. The
    /// report counts those that finished, failed or hung (killed after 10 s).
    #[arg(long, default_value_t = 0)]
    forks: u32,
    /// Plain memory under the kernel's policy (no Attune), for comparison.
    #[arg(long)]
    kernel: bool,
}

pub fn run(a: Args) -> i32 {
    match a.cmd {
        Sub::Weights { apply, config } => weights(apply, config),
        Sub::Place(p) => match place(p) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("attune numa place: {e}");
                1
            }
        },
    }
}

fn placer(config: Option<&std::path::Path>) -> Result<&'static NumaPlacer, String> {
    let rt = attune::runtime::init(config).map_err(|_| attune::error::last_error())?;
    rt.engine().and_then(|e| e.numa.as_ref()).ok_or_else(|| {
        "no NUMA tier in use: configure a tier with kind = \"numa\" and the node of the \
             slower memory (see docs/tuning.md); `attune topology` lists the nodes"
            .to_string()
    })
}

/// Forked children of `--forks` (a fork while the runtime's threads work must leave the
/// child a runtime that works: no lock held, NUMA allocation and statistics usable).
#[derive(Default, serde::Serialize)]
struct Forks {
    started: u32,
    finished: u32,
    failed: u32,
    hung: u32,
}

impl Forks {
    /// Forks one child and waits for it (10 s at most).
    fn run_one(&mut self) {
        self.started += 1;
        let child = || {
            let size = 1 << 20;
            let ok = attune::runtime::alloc(size, Flags::CAP.0, None).is_ok_and(|b| {
                touch(b, size);
                let good = verify(b, size);
                attune::runtime::free(b).is_ok() && good
            }) && attune::runtime::numa_stats().is_some();
            if ok {
                0
            } else {
                1
            }
        };
        match attune_sys::os::fork_run(child, Duration::from_secs(10)) {
            ForkRun::Exited(0) => self.finished += 1,
            ForkRun::Hung => self.hung += 1,
            _ => self.failed += 1,
        }
    }
}

fn weights(apply: bool, config: Option<std::path::PathBuf>) -> i32 {
    let p = match placer(config.as_deref()) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("attune numa weights: {e}");
            return 1;
        }
    };
    let w = numa::bandwidth_weights(&p.tiers);
    for t in &p.tiers {
        println!(
            "tier {:<8} nodes {:?} bandwidth {} MB/s",
            t.name, t.nodes, t.bandwidth
        );
    }
    for (n, x) in &w {
        println!("node{n} weight {x}");
    }
    if !apply {
        return 0;
    }
    let dir = std::path::Path::new("/sys/kernel/mm/mempolicy/weighted_interleave");
    if !dir.is_dir() {
        eprintln!("attune numa weights: this kernel has no weighted interleave (Linux 6.9+); BW regions are striped instead");
        return 1;
    }
    for (n, x) in &w {
        if let Err(e) = std::fs::write(dir.join(format!("node{n}")), x.to_string()) {
            eprintln!("attune numa weights: cannot write node{n}: {e} (root is needed)");
            return 1;
        }
    }
    println!("applied");
    0
}

struct Req {
    size: usize,
    flags: Flags,
    label: String,
}

/// FLAGS of `--region` and `--reflag`: LAT, BW, CAP, SHL joined by ',' or '|', or NONE.
fn parse_flags(s: &str) -> Result<Flags, String> {
    if s.eq_ignore_ascii_case("none") {
        Ok(Flags::NONE)
    } else {
        Flags::parse(&s.replace(',', "|"))
    }
}

/// `I:VALUE` of `--move` and `--reflag`: a region index (checked) and its value.
fn region_arg<T>(
    arg: &str,
    opt: &str,
    regions: usize,
    value: impl Fn(&str) -> Result<T, String>,
) -> Result<(usize, T), String> {
    let (i, v) = arg
        .split_once(':')
        .ok_or_else(|| format!("{opt} '{arg}': expected REGION:VALUE"))?;
    let i: usize = i
        .parse()
        .map_err(|_| format!("{opt} '{arg}': bad region index"))?;
    if i >= regions {
        return Err(format!("{opt} '{arg}': there are {regions} regions"));
    }
    Ok((i, value(v).map_err(|e| format!("{opt} '{arg}': {e}"))?))
}

fn parse_region(s: &str) -> Result<Req, String> {
    let (sz, fl) = s
        .split_once(':')
        .ok_or_else(|| format!("--region '{s}': expected SIZE:FLAGS, e.g. 64M:LAT"))?;
    let size = attune::size::parse_size(sz).map_err(|e| format!("--region '{s}': {e}"))? as usize;
    if size == 0 {
        return Err(format!("--region '{s}': size 0"));
    }
    let flags = parse_flags(fl).map_err(|e| format!("--region '{s}': {e}"))?;
    Ok(Req {
        size,
        flags,
        label: fl.to_string(),
    })
}

/// Writes a pattern derived from the page address into every page (first word), so
/// that a page that moved is checked for its content afterwards. [base, base+len) is a
/// live allocation this command owns.
fn touch(base: usize, len: usize) {
    for off in (0..len).step_by(4096) {
        mem::write_word(base + off, (base + off) as u64 ^ 0x5a5a_5a5a);
    }
}

/// The word at `addr`, inside an allocation of this command.
fn read_word(addr: usize) -> u64 {
    mem::read_word(addr)
}

fn verify(base: usize, len: usize) -> bool {
    (0..len)
        .step_by(4096)
        .all(|off| read_word(base + off) == (base + off) as u64 ^ 0x5a5a_5a5a)
}

fn vmstat() -> BTreeMap<String, u64> {
    let keep = [
        "pgpromote_success",
        "pgdemote_kswapd",
        "pgdemote_direct",
        "pgmigrate_success",
        "numa_hint_faults",
    ];
    std::fs::read_to_string("/proc/vmstat")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(' ')?;
            keep.contains(&k)
                .then(|| (k.to_string(), v.trim().parse().unwrap_or(0)))
        })
        .collect()
}

fn per_node(base: usize, len: usize) -> Result<BTreeMap<String, u64>, String> {
    let nodes = numa::node_pages(base, len).map_err(|e| format!("move_pages query: {e}"))?;
    Ok(nodes
        .iter()
        .map(|(k, v)| (k.map(|n| n.to_string()).unwrap_or("absent".into()), *v))
        .collect())
}

fn place(a: PlaceArgs) -> Result<(), String> {
    let reqs: Vec<Req> = a
        .regions
        .iter()
        .map(|s| parse_region(s))
        .collect::<Result<_, _>>()?;
    let moves: Vec<(usize, usize)> = a
        .moves
        .iter()
        .map(|m| {
            region_arg(m, "--move", reqs.len(), |t| {
                t.parse().map_err(|_| "bad tier".into())
            })
        })
        .collect::<Result<_, _>>()?;
    let reflags: Vec<(usize, Flags)> = a
        .reflags
        .iter()
        .map(|m| region_arg(m, "--reflag", reqs.len(), parse_flags))
        .collect::<Result<_, _>>()?;
    let write_hot: Vec<(usize, usize)> = a
        .write_hot
        .iter()
        .map(|m| {
            region_arg(m, "--write-hot", reqs.len(), |v| {
                attune::size::parse_size(v).map(|x| x as usize)
            })
        })
        .collect::<Result<_, _>>()?;
    if let Some(&(i, sz)) = write_hot.iter().find(|&&(i, sz)| sz > reqs[i].size) {
        return Err(format!(
            "--write-hot {i}:{sz}: region {i} has {} bytes",
            reqs[i].size
        ));
    }
    if !write_hot.is_empty() && a.hot_secs <= 0.0 {
        return Err("--write-hot needs --hot-secs".into());
    }
    if a.forks > 0 && (a.hot_secs <= 0.0 || a.kernel) {
        return Err("--forks needs --hot-secs and Attune (not --kernel)".into());
    }
    if a.kernel && !(moves.is_empty() && reflags.is_empty()) {
        return Err("--move and --reflag need Attune (not --kernel)".into());
    }
    let before = vmstat();
    let placer = if a.kernel {
        None
    } else {
        Some(placer(a.config.as_deref())?)
    };
    if let Some(p) = placer {
        if let Some(&(_, t)) = moves.iter().find(|m| m.1 >= p.tiers.len()) {
            return Err(format!(
                "--move: tier {t} does not exist ({} tiers)",
                p.tiers.len()
            ));
        }
    }
    let mut bases = Vec::new();
    for r in &reqs {
        let base = match placer {
            Some(_) => attune::runtime::alloc(r.size, r.flags.0, None).map_err(|e| {
                format!(
                    "allocation of {} bytes ({}) failed: {e}: {}",
                    r.size,
                    r.label,
                    attune::error::last_error()
                )
            })?,
            None => attune_sys::mem::map_anon(r.size, false).map_err(|e| format!("mmap: {e}"))?,
        };
        touch(base, r.size);
        bases.push(base);
    }
    let mut moved = Vec::new();
    for &(i, t) in &moves {
        let p = placer.expect("checked above");
        let t0 = Instant::now();
        let n = p
            .move_to(bases[i], reqs[i].size.div_ceil(4096) * 4096, t)
            .map_err(|e| format!("move: {e}"))?;
        moved.push(
            json!({"region": i, "tier": t, "pages": n, "seconds": t0.elapsed().as_secs_f64()}),
        );
    }
    for &(i, flags) in &reflags {
        attune::runtime::set_flags(bases[i], flags.0)
            .map_err(|e| format!("--reflag {i}: {e}: {}", attune::error::last_error()))?;
    }
    // Where first touch left the pages, before any promotion had time to act.
    let mut first_touch = Vec::new();
    let mut promoted_after: Vec<Option<f64>> = vec![None; write_hot.len()];
    let mut forks = Forks::default();
    if a.hot_secs > 0.0 {
        for (r, &b) in reqs.iter().zip(&bases) {
            first_touch.push(per_node(b, r.size)?);
        }
        let t0 = Instant::now();
        let end = t0 + Duration::from_secs_f64(a.hot_secs);
        let mut sum = 0u64;
        let mut next_poll = t0;
        let fork_every = Duration::from_secs_f64(a.hot_secs / (a.forks as f64 + 1.0));
        let mut next_fork = t0 + fork_every;
        // The hot loop goes on past `end` until every fork asked for has run: each fork
        // waits for its child, and on a loaded host 39 of 40 fitted in 6 s.
        while Instant::now() < end || forks.started < a.forks {
            if a.forks > 0 && forks.started < a.forks && Instant::now() >= next_fork {
                forks.run_one();
                next_fork += fork_every;
            }
            for (k, &(i, sz)) in write_hot.iter().enumerate() {
                // The same value again: a write (the page turns dirty), data unchanged.
                touch(bases[i], sz);
                if Instant::now() >= next_poll && promoted_after[k].is_none() {
                    let on_fast = per_node(bases[i], sz)?.get("0").copied().unwrap_or(0);
                    if on_fast * 10 >= 9 * sz.div_ceil(4096) as u64 {
                        promoted_after[k] = Some(t0.elapsed().as_secs_f64());
                    }
                }
            }
            if Instant::now() >= next_poll {
                next_poll += Duration::from_millis(100);
            }
            for (r, &b) in reqs.iter().zip(&bases) {
                if r.flags.contains(Flags::LAT) {
                    for off in (0..r.size).step_by(4096) {
                        sum = sum.wrapping_add(read_word(b + off));
                    }
                }
            }
        }
        std::hint::black_box(sum);
    }
    let mut out_regions = Vec::new();
    for (i, (r, &b)) in reqs.iter().zip(&bases).enumerate() {
        let per_node_all = per_node(b, r.size)?;
        let info = placer.and_then(|p| p.region(b));
        let hot = match write_hot.iter().position(|w| w.0 == i) {
            Some(k) => {
                let sz = write_hot[k].1;
                json!({
                    "bytes": sz,
                    "pages_per_node": per_node(b, sz)?,
                    "rest_pages_per_node": if sz < r.size { json!(per_node(b + sz, r.size - sz)?) } else { json!({}) },
                    "on_fast_tier_after_s": promoted_after[k],
                })
            }
            None => serde_json::Value::Null,
        };
        let per_node = per_node_all;
        out_regions.push(json!({
            "written_hot": hot,
            "size": r.size,
            "flags": r.label,
            "pages_per_node": per_node,
            "pages_per_node_first_touch": first_touch.get(out_regions.len()),
            "checksum_ok": verify(b, r.size),
            "ranges": info.as_ref().map(|i| json!(i.ranges)),
            "pinned_bytes": info.as_ref().map(|i| i.pinned()),
        }));
    }
    let after = vmstat();
    let delta: BTreeMap<&String, u64> = after
        .iter()
        .map(|(k, v)| (k, v.saturating_sub(*before.get(k).unwrap_or(&0))))
        .collect();
    let report = json!({
        "mode": if a.kernel { "kernel" } else { "attune" },
        "tiers": placer.map(|p| json!(p.tiers)),
        "interleave": placer.map(|p| json!(p.interleave)),
        "planned_per_tier": placer.map(|p| p.used()),
        "counters": placer.map(|p| json!(p.counters)),
        // What an application sees of the same through attune_stats_json's "numa".
        "stats_json_numa": placer.and(attune::runtime::numa_stats()),
        "moves": moved,
        "forks": if a.forks > 0 { json!(forks) } else { serde_json::Value::Null },
        "regions": out_regions,
        "vmstat_delta": delta,
    });
    println!("{}", serde_json::to_string(&report).unwrap_or_default());
    for &b in &bases {
        if placer.is_some() {
            let _ = attune::runtime::free(b);
        }
    }
    Ok(())
}
