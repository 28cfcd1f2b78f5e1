//! `attune run`: runs an unmodified, dynamically linked program with its large
//! allocations on Attune's tiers (the interposer `libattune_preload.so` loaded with
//! LD_PRELOAD), then prints a report and writes it as JSON (schema in docs/run-report.md).
//!
//! The launcher itself is not managed: it validates the options, starts the program,
//! passes signals on, waits, gathers each managed process's statistics file and exits
//! with the program's status (or dies by the same signal).

use attune::run_options;
use attune::size::{human, parse_size_or_percent};
use serde_json::{json, Value};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};

#[derive(clap::Args)]
pub struct Args {
    /// Flags of the program's managed memory: LAT, BW, CAP, SHL (comma-separated) or auto.
    #[arg(long, value_name = "FLAGS")]
    flags: Option<String>,
    /// DRAM budget per process: a size (512M, 4G) or a percentage of this machine's memory.
    #[arg(long, value_name = "SIZE|PERCENT")]
    dram: Option<String>,
    /// Far tiers: auto (the default: a CPU-less NUMA node, else attuned's pool and a file,
    /// else a file on local scratch), or pool (the node's pool in attuned), file (local
    /// scratch), memory (in the program's own memory, for experiments), comma-separated;
    /// as ATTUNE_FAR.
    #[arg(long, value_name = "KINDS")]
    far: Option<String>,
    /// Attune configuration file (TOML), as ATTUNE_CONFIG.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Write the report as JSON to FILE (the text report always goes to stderr).
    #[arg(long, value_name = "FILE")]
    report: Option<PathBuf>,
    /// Manage requests of at least this size (default 1M).
    #[arg(long, value_name = "SIZE")]
    threshold: Option<String>,
    /// Flags by allocation size, e.g. "..64M:LAT,1G..:CAP".
    #[arg(long, value_name = "RULES")]
    rules: Option<String>,
    /// Unit of placement and movement (default 4K: read-ahead grows what moves on runs of faults).
    #[arg(long, value_name = "SIZE")]
    chunk: Option<String>,
    /// Manage small requests too (the whole heap).
    #[arg(long)]
    small: bool,
    /// How faults are resolved: auto (default: signal delivery unless the program loads
    /// io_uring, AIO, RDMA, fabric or GPU libraries), thread (every kernel access works) or
    /// signal (faster; docs/design/run.md, "Fault delivery").
    #[arg(long, value_name = "auto|thread|signal")]
    fault_mode: Option<String>,
    /// Do not manage forked or exec'd children.
    #[arg(long)]
    no_children: bool,
    /// Run the program even if LD_PRELOAD cannot work for it (statically linked, setuid).
    #[arg(long)]
    allow_unmanaged: bool,
    /// Give the program the staged input NAME (`attune stage`): its path in
    /// $ATTUNE_STAGED_NAME (upper case, other characters as _), held until the program
    /// ends; repeatable.
    #[arg(long, value_name = "NAME")]
    staged: Vec<String>,
    /// Seconds to wait for attuned's answer to each --staged open before giving up (a
    /// busy daemon answers late: a cold start of 100 instances on 2 vCPUs took over 5 s).
    #[arg(long, value_name = "SECS", default_value_t = 30,
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    staged_wait: u64,
    /// No text report on stderr.
    #[arg(long, short)]
    quiet: bool,
    /// Keep each process's statistics file (proc-PID-START.json) in DIR (used by `attune profile`).
    #[arg(long, value_name = "DIR", hide = true)]
    keep_proc_files: Option<PathBuf>,
    /// The program and its arguments.
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "PROGRAM"
    )]
    command: Vec<String>,
}

fn fail(code: i32, msg: &str) -> i32 {
    eprintln!("attune run: {msg}");
    code
}

/// Finds `prog` as execvp would: a path if it has a slash, else along $PATH.
pub fn locate(prog: &str) -> Result<PathBuf, (i32, String)> {
    let candidates: Vec<PathBuf> = if prog.contains('/') {
        vec![PathBuf::from(prog)]
    } else {
        std::env::var("PATH")
            .unwrap_or_else(|_| "/usr/local/bin:/usr/bin:/bin".into())
            .split(':')
            .map(|d| Path::new(if d.is_empty() { "." } else { d }).join(prog))
            .collect()
    };
    let mut found_not_exec = None;
    for c in candidates {
        if let Ok(m) = std::fs::metadata(&c) {
            if m.is_file() && m.permissions().mode() & 0o111 != 0 {
                return Ok(c);
            }
            found_not_exec.get_or_insert(c);
        }
    }
    match found_not_exec {
        Some(c) => Err((
            126,
            format!(
                "{}: permission denied (not an executable file)",
                c.display()
            ),
        )),
        None => Err((127, format!("{prog}: command not found"))),
    }
}

/// Why LD_PRELOAD cannot work for this program, if it cannot.
fn preload_obstacle(path: &Path) -> Option<String> {
    let meta = std::fs::metadata(path).ok()?;
    if attune_sys::os::is_secure_exec(&meta) {
        return Some(format!(
            "{} is set-user-ID or set-group-ID to another user: the dynamic loader ignores LD_PRELOAD for it (secure-execution mode). Run a copy without the setuid bit, or as its owner",
            path.display()
        ));
    }
    let bytes = std::fs::read(path).ok()?;
    if !bytes.starts_with(b"\x7fELF") {
        return None; // a script: its interpreter is dynamically linked (checked when it runs)
    }
    match goblin::elf::Elf::parse(&bytes) {
        Ok(elf) if elf.interpreter.is_none() => Some(format!(
            "{} is statically linked: LD_PRELOAD cannot replace its allocator. Relink it dynamically, or link it with libattune and use allocate_TM (README, \"Using the library\")",
            path.display()
        )),
        _ => None,
    }
}

/// The interposer library: $ATTUNE_PRELOAD_LIB, or next to this executable (build tree
/// and install tree layouts). A library that does not exist would make the loader print
/// a warning and run the program unmanaged, so it is an error here.
fn preload_library() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("ATTUNE_PRELOAD_LIB") {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(format!("ATTUNE_PRELOAD_LIB={}: no such file", p.display()))
        };
    }
    let exe = std::env::current_exe().map_err(|e| format!("cannot find own executable: {e}"))?;
    let dir = exe.parent().unwrap_or(Path::new("/"));
    [
        dir.join("libattune_preload.so"),
        dir.join("../lib/libattune_preload.so"),
        dir.join("../lib/attune/libattune_preload.so"),
    ]
    .into_iter()
    .find(|p| p.is_file())
    .and_then(|p| p.canonicalize().ok())
    .ok_or_else(|| {
        "cannot find libattune_preload.so next to the attune executable (set ATTUNE_PRELOAD_LIB)"
            .into()
    })
}

pub fn run(a: Args) -> i32 {
    // Validate everything before starting anything.
    let mut env: Vec<(String, String)> = Vec::new();
    if let Some(f) = &a.flags {
        if let Err(e) = attune::Flags::parse(f) {
            return fail(2, &format!("--flags {f}: {e}"));
        }
        env.push(("ATTUNE_FLAGS".into(), f.clone()));
    }
    if let Some(d) = &a.dram {
        match parse_size_or_percent(d, attune_sys::os::total_memory()) {
            Ok(0) => {
                return fail(
                    2,
                    &format!("--dram {d}: the budget must be more than 0 bytes"),
                )
            }
            Ok(b) => env.push(("ATTUNE_DRAM".into(), b.to_string())),
            Err(e) => {
                return fail(
                    2,
                    &format!(
                    "--dram {d}: {e} (expected a size like 512M or 4G, or a percentage like 25%)"
                ),
                )
            }
        }
    }
    if let Some(f) = &a.far {
        env.push(("ATTUNE_FAR".into(), f.clone()));
    }
    if let Some(c) = &a.config {
        let abs = std::path::absolute(c).unwrap_or_else(|_| c.clone());
        env.push(("ATTUNE_CONFIG".into(), abs.display().to_string()));
    }
    if let Some(t) = &a.threshold {
        env.push(("ATTUNE_RUN_THRESHOLD".into(), t.clone()));
    }
    if let Some(r) = &a.rules {
        env.push(("ATTUNE_FLAG_RULES".into(), r.clone()));
    }
    if a.small {
        env.push(("ATTUNE_RUN_SMALL".into(), "1".into()));
    }
    if a.no_children {
        env.push(("ATTUNE_RUN_CHILDREN".into(), "0".into()));
    }
    if let Some(m) = &a.fault_mode {
        env.push(("ATTUNE_RUN_FAULT_MODE".into(), m.clone()));
    }
    // No chunk size of our own: the runtime's 4 KiB with read-ahead that grows on runs of
    // faults moves streams as fast as 64 KiB chunks did and scattered reads at a page
    // each (docs/design/paging.md, "Transfer unit").
    if let Some(c) = &a.chunk {
        env.push(("ATTUNE_CHUNK_SIZE".into(), c.clone()));
    }
    // What the program will see: this process's ATTUNE_* (and TM_FLAGS) overlaid by ours.
    let mut seen: Vec<(String, String)> = std::env::vars()
        .filter(|(k, _)| k.starts_with("ATTUNE_") || k == "TM_FLAGS")
        .filter(|(k, _)| !env.iter().any(|(n, _)| n == k))
        .collect();
    seen.extend(env.iter().cloned());
    let get = |k: &str| seen.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    if let Err(e) = run_options::from_env(get) {
        return fail(2, &e);
    }
    let temperature_only =
        match attune::config::load(a.config.as_deref(), &seen, &attune::config::Machine::this()) {
            Ok(c) => c.mode == attune::config::Mode::Temperature,
            Err(e) => return fail(2, &format!("configuration: {e}")),
        };

    let prog = &a.command[0];
    let path = match locate(prog) {
        Ok(p) => p,
        Err((code, msg)) => return fail(code, &msg),
    };
    let mut managed = true;
    if let Some(why) = preload_obstacle(&path) {
        if !a.allow_unmanaged {
            return fail(
                2,
                &format!("{why}.\n  (--allow-unmanaged runs it anyway, without tiering)"),
            );
        }
        eprintln!("attune run: warning: {why}; running it unmanaged");
        managed = false;
    }
    // No flags given: predict them from what `attune profile` learned about this program.
    // (Not in temperature-only mode: it ignores what the workflow is, by definition.)
    let prediction = if temperature_only {
        None
    } else {
        predict(&path, &a, &get)
    };
    if let Some((regions, runs)) = &prediction {
        env.push((
            "ATTUNE_PREDICT".into(),
            attune_policy::predict::encode(regions),
        ));
        if !a.quiet {
            eprintln!(
                "attune run: flags from the history ({runs} profiled run(s) of {}): {}",
                path.display(),
                attune_cli::history::describe(regions).join("; ")
            );
        }
    }
    let lib = match preload_library() {
        Ok(l) => l,
        Err(e) => return fail(2, &e),
    };
    // Check the report path now: a path that cannot be written is a warning, not a reason
    // to lose the run.
    let mut report_path = a.report.clone();
    if let Some(r) = &report_path {
        if let Err(e) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(r)
        {
            eprintln!(
                "attune run: warning: cannot write the report to {}: {e}; running without it",
                r.display()
            );
            report_path = None;
        }
    }
    let dir = match tempdir() {
        Ok(d) => d,
        Err(e) => return fail(2, &format!("cannot create a directory for statistics: {e}")),
    };

    let preload = match std::env::var("LD_PRELOAD") {
        Ok(p) if !p.is_empty() => format!("{} {p}", lib.display()),
        _ => lib.display().to_string(),
    };
    let mut cmd = std::process::Command::new(&path);
    cmd.arg0(prog).args(&a.command[1..]);
    for (k, v) in &env {
        cmd.env(k, v);
    }
    // Where the kernel cannot fault managed pages in (signal delivery, auto included, or a userfaultfd
    // limited to user-mode faults, as users who are not root get), a peer rank's
    // process_vm_readv of our buffers fails: Open MPI's single-copy transport printed
    // "Read -1, expected 8388608, errno = 14" and fell back. Copying through its shared
    // segment in user space is served like any access (docs/design/run.md, "System calls on
    // managed memory"). The user's own choice wins.
    let signal = get("ATTUNE_RUN_FAULT_MODE").is_none_or(|m| m.trim() != "thread");
    if managed
        && std::env::var_os("OMPI_MCA_btl_vader_single_copy_mechanism").is_none()
        && (signal || attune_sys::uffd::Uffd::user_mode_only_here())
    {
        cmd.env("OMPI_MCA_btl_vader_single_copy_mechanism", "none");
    }
    if managed {
        cmd.env("LD_PRELOAD", preload);
    }
    cmd.env("ATTUNE_REPORT_DIR", &dir);
    // Every process of this run (children, MPI ranks) is one workflow for the node daemon.
    if std::env::var_os("ATTUNE_WORKFLOW").is_none() && std::env::var_os("SLURM_JOB_ID").is_none() {
        let base: String = std::path::Path::new(prog)
            .file_name()
            .map(|f| {
                f.to_string_lossy()
                    .chars()
                    .filter(|c| c.is_ascii_graphic())
                    .take(64)
                    .collect()
            })
            .unwrap_or_default();
        cmd.env(
            "ATTUNE_WORKFLOW",
            format!(
                "{}.{}",
                if base.is_empty() { "run" } else { &base },
                std::process::id()
            ),
        );
    }
    // Staged inputs: the launcher's connection is the daemon's reference of each for as
    // long as the program runs; the program inherits each memory file at its number.
    let _held = if a.staged.is_empty() {
        None
    } else {
        match super::stage::hold(
            &a.staged,
            std::time::Duration::from_secs(a.staged_wait),
            !a.quiet,
        ) {
            Ok(h) => {
                for (name, f) in &h.files {
                    use std::os::fd::AsRawFd;
                    cmd.env(
                        super::stage::env_name(name),
                        format!("/proc/self/fd/{}", f.as_raw_fd()),
                    );
                }
                Some(h)
            }
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                return fail(2, &e);
            }
        }
    };
    // SIGKILL of `attune run` cannot be passed on: the kernel ends the program with it.
    attune_sys::os::die_with_launcher(&mut cmd);
    let t0 = std::time::Instant::now();
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&dir);
            let code = if e.kind() == std::io::ErrorKind::NotFound {
                127
            } else {
                126
            };
            return fail(code, &format!("{}: {e}", path.display()));
        }
    };
    let status = match attune_sys::os::wait_forwarding(&mut child) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("attune run: waiting for the program failed: {e}");
            return 2;
        }
    };
    let wall = t0.elapsed().as_secs_f64();
    let procs = gather(&dir);
    if let Some(keep) = &a.keep_proc_files {
        let copied = std::fs::create_dir_all(keep).and_then(|_| {
            for f in std::fs::read_dir(&dir)?.flatten() {
                if f.file_name().to_string_lossy().starts_with("proc-") {
                    std::fs::copy(f.path(), keep.join(f.file_name()))?;
                }
            }
            Ok(())
        });
        if let Err(e) = copied {
            eprintln!(
                "attune run: warning: cannot keep statistics in {}: {e}",
                keep.display()
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    let mut report = build_report(&a.command, &path, managed, wall, status, procs);
    report["prediction"] = match &prediction {
        Some((regions, runs)) => json!({
            "runs": runs,
            "regions": attune_cli::history::describe(regions),
            "encoded": attune_policy::predict::encode(regions),
        }),
        None => Value::Null,
    };
    if !a.quiet {
        eprint!("{}", text_report(&report));
    }
    if let Some(r) = report_path {
        match serde_json::to_vec_pretty(&report) {
            Ok(b) => {
                if let Err(e) = std::fs::write(&r, b) {
                    eprintln!(
                        "attune run: warning: cannot write the report to {}: {e}",
                        r.display()
                    );
                }
            }
            Err(e) => eprintln!("attune run: warning: cannot encode the report: {e}"),
        }
    }
    match (status.code(), status.signal()) {
        (Some(c), _) => c,
        (None, Some(sig)) => attune_sys::os::die_by_signal(sig),
        _ => 1,
    }
}

/// The history's prediction for this program, when no flags, rules or prediction were
/// given (`--flags auto` counts as none). A history that cannot be used is a warning.
fn predict(
    path: &Path,
    a: &Args,
    get: &dyn Fn(&str) -> Option<String>,
) -> Option<(Vec<attune_policy::predict::RegionRecord>, usize)> {
    let given =
        |k: &str| get(k).is_some_and(|v| !attune::Flags::parse(&v).is_ok_and(|f| f.is_empty()));
    if given("ATTUNE_FLAGS")
        || given("TM_FLAGS")
        || get("ATTUNE_FLAG_RULES").is_some()
        || get("ATTUNE_PREDICT").is_some()
    {
        return None;
    }
    let store = attune_cli::history::path()?;
    match attune_cli::history::lookup(&store, path, &a.command[1..]) {
        Ok(Some((run, n))) if !run.regions.is_empty() => Some((run.regions, n)),
        Ok(_) => None,
        Err(w) => {
            eprintln!("attune run: warning: {w}; the history is not used");
            None
        }
    }
}

/// The statistics directory of this run (`$TMPDIR/attune-run-<pid>-<i>`, mode 0700). A
/// run killed with SIGKILL leaves its directory; the next run of the same user removes
/// those whose `attune run` is gone (owned by this user: the directory is shared). In the
/// first scratch directory this user can write, in the order the far tier's scratch is
/// chosen: a $TMPDIR of another user or a read-only mount does not lose the run.
fn tempdir() -> std::io::Result<PathBuf> {
    let mut last = std::io::Error::other("no directory to write in");
    for base in attune::config::scratch_dirs(&std::env::temp_dir()) {
        match make_tempdir(&base) {
            Ok(made) => {
                attune_sys::mem::remove_stale(&base, "attune-run-", true);
                return Ok(made);
            }
            Err(e) => last = e,
        }
    }
    Err(last)
}

fn make_tempdir(base: &Path) -> std::io::Result<PathBuf> {
    for i in 0..100u32 {
        let d = base.join(format!("attune-run-{}-{}", std::process::id(), i));
        match std::fs::DirBuilder::new().mode(0o700).create(&d) {
            Ok(()) => return Ok(d),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
    Err(std::io::Error::other("no free name"))
}

use std::os::unix::fs::DirBuilderExt;

pub fn gather(dir: &Path) -> Vec<Value> {
    let mut v: Vec<Value> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| {
            let n = e.file_name();
            let n = n.to_string_lossy();
            n.starts_with("proc-") && n.ends_with(".json")
        })
        .filter_map(|e| std::fs::read(e.path()).ok())
        .filter_map(|b| serde_json::from_slice(&b).ok())
        .collect();
    v.sort_by_key(|p: &Value| p["pid"].as_u64().unwrap_or(0));
    v
}

/// The entries of each process's array `key`, each tagged with the process's pid.
pub fn with_pid(procs: &[Value], key: &str) -> Vec<Value> {
    procs
        .iter()
        .flat_map(|p| {
            let pid = p["pid"].clone();
            p[key]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .map(move |mut r| {
                    r["pid"] = pid.clone();
                    r
                })
        })
        .collect()
}

pub fn sum(procs: &[Value], key: &str) -> u64 {
    procs.iter().map(|p| p[key].as_u64().unwrap_or(0)).sum()
}

/// Schema "attune-run-report/1" (docs/run-report.md).
pub fn build_report(
    argv: &[String],
    path: &Path,
    managed: bool,
    wall: f64,
    status: std::process::ExitStatus,
    procs: Vec<Value>,
) -> Value {
    let mut tiers: Vec<Value> = Vec::new();
    for p in &procs {
        for (i, t) in p["tiers"].as_array().into_iter().flatten().enumerate() {
            if tiers.len() <= i {
                tiers.push(
                    json!({"name": t["name"], "kind": t["kind"], "peak_used_bytes": 0,
                    "bytes_in": 0, "bytes_out": 0, "faults": 0, "evictions": 0, "errors": 0}),
                );
            }
            for k in [
                "peak_used_bytes",
                "bytes_in",
                "bytes_out",
                "faults",
                "evictions",
                "errors",
            ] {
                let v = tiers[i][k].as_u64().unwrap_or(0) + t[k].as_u64().unwrap_or(0);
                tiers[i][k] = json!(v);
            }
        }
    }
    let mut top: Vec<Value> = with_pid(&procs, "top_regions");
    top.sort_by_key(|r| {
        std::cmp::Reverse((
            r["heat"].as_u64().unwrap_or(0),
            r["faults"].as_u64().unwrap_or(0),
        ))
    });
    top.truncate(10);
    let complete = procs.iter().all(|p| p["final"].as_bool().unwrap_or(false));
    // The runtime's own counters, summed under the names its snapshots use (one list).
    let counters: Vec<(&str, u64)> = attune::paging::Counters::default()
        .statistics()
        .iter()
        .map(|&(k, _)| (k, sum(&procs, k)))
        .collect();
    let mut report = json!({
        "schema": "attune-run-report/1",
        "command": argv,
        "program": path.display().to_string(),
        "managed": managed,
        "wall_seconds": wall,
        "exit_code": status.code(),
        "signal": status.signal(),
        "complete": complete,
        "processes": procs.len(),
        "totals": {
            "peak_resident_bytes_max": procs.iter().map(|p| p["peak_resident_bytes"].as_u64().unwrap_or(0)).max().unwrap_or(0),
            "budget_bytes": procs.first().map(|p| p["budget_bytes"].clone()).unwrap_or(json!(0)),
            "moved_bytes": sum(&procs, "fetched_bytes") + sum(&procs, "evicted_bytes"),
            "os_minor_faults": sum(&procs, "os_minor_faults"),
            "os_major_faults": sum(&procs, "os_major_faults"),
            "managed_requests": sum(&procs, "managed_requests"),
            "huge_bytes": sum(&procs, "huge_bytes"),
            "fallback_requests": sum(&procs, "fallback_requests"),
            "fixed_adopted": sum(&procs, "fixed_adopted"),
            "fixed_released": sum(&procs, "fixed_released"),
            "predicted_requests": sum(&procs, "predicted_requests"),
            "predicted_pinned_bytes": sum(&procs, "predicted_pinned_bytes"),
        },
        "tiers": tiers,
        "hottest_regions": top,
        "per_process": procs,
    });
    for (k, v) in counters {
        report["totals"][k] = json!(v);
    }
    report["totals"]["amplification"] = json!(amplification(&report["totals"]));
    report
}

/// Bytes faults moved into DRAM (their chunks and read-ahead) over the bytes the faults
/// show the program touched; 1.0 before any fault (docs/design/paging.md, "Amplification").
fn amplification(t: &Value) -> f64 {
    let n = |k: &str| t[k].as_u64().unwrap_or(0);
    attune_policy::readahead::amplification(
        n("demand_bytes"),
        n("readahead_bytes"),
        n("readahead_touched_bytes"),
    )
}

/// Which fault delivery the program's regions used, and why the handler thread where
/// `auto` chose it (docs/design/run.md, "Fault delivery").
/// The processes' distinct texts under `key`, sorted.
fn distinct<'a>(procs: &'a [Value], key: &str) -> Vec<&'a str> {
    let mut v: Vec<&str> = procs.iter().filter_map(|p| p[key].as_str()).collect();
    v.sort_unstable();
    v.dedup();
    v
}

fn delivery_line(procs: &[Value]) -> String {
    let n = |k: &str| {
        procs
            .iter()
            .map(|p| p[k].as_u64().unwrap_or(0))
            .sum::<u64>()
    };
    let (signal, thread) = (n("regions_signal"), n("regions_thread"));
    let kept_out = procs
        .iter()
        .filter(|p| p["kept_out"] == json!(true))
        .count();
    let heap_kept = n("mappings_kept_out");
    if signal + thread == 0 && kept_out == 0 && heap_kept == 0 {
        return String::new();
    }
    let reasons = distinct(procs, "delivery_reason");
    let asked: Vec<&str> = procs
        .iter()
        .filter_map(|p| p["fault_mode"].as_str())
        .collect();
    let how = if asked.iter().all(|m| *m == "auto") {
        "auto: "
    } else {
        ""
    };
    let mut s = format!(
        "  fault delivery: {how}{signal} region(s) by signal, {thread} by the handler thread\n"
    );
    for r in reasons.iter().take(3) {
        s += &format!("    handler thread because {r}\n");
    }
    if kept_out > 0 {
        s += &format!("    {kept_out} process(es) left new allocations untiered\n");
        for r in distinct(procs, "kept_out_reason").iter().take(3) {
            s += &format!("      because {r}\n");
        }
    }
    if heap_kept > 0 {
        s += &format!(
            "    {heap_kept} mapping(s) of an allocator's heap left untiered (the program's malloc, CPython's arenas): they hold system-call arguments, and the userfaultfd sees user-mode faults only\n"
        );
    }
    s
}

/// Where the memory cgroup's usage lowered a process's budget (`follow_limit`): the
/// limit, the most held outside Attune's pages, and the lowest budget it left.
fn cgroup_line(procs: &[Value]) -> String {
    let n = |p: &Value, k: &str| p[k].as_u64().unwrap_or(0);
    let lowered: Vec<&Value> = procs
        .iter()
        .filter(|p| n(p, "cgroup_lowered") > 0)
        .collect();
    let Some(limit) = lowered.iter().map(|p| n(p, "cgroup_limit_bytes")).max() else {
        return String::new();
    };
    let outside = lowered
        .iter()
        .map(|p| n(p, "cgroup_outside_peak_bytes"))
        .max()
        .unwrap_or(0);
    let lowest = lowered
        .iter()
        .map(|p| n(p, "cgroup_lowest_budget_bytes"))
        .min()
        .unwrap_or(0);
    format!(
        "  memory cgroup: limit {}, up to {} held outside Attune's pages; the budget followed it down to {} in {} process(es)\n",
        human(limit),
        human(outside),
        human(lowest),
        lowered.len()
    )
}

pub fn text_report(r: &Value) -> String {
    let mut s = String::new();
    let t = &r["totals"];
    let u = |v: &Value| human(v.as_u64().unwrap_or(0));
    let status = match (r["exit_code"].as_i64(), r["signal"].as_i64()) {
        (Some(c), _) => format!("exit {c}"),
        (_, Some(sig)) => format!("killed by signal {sig}"),
        _ => "unknown".into(),
    };
    s += &format!(
        "attune run: {} — {status}, {:.2} s wall, {} managed process(es){}\n",
        r["command"]
            .as_array()
            .and_then(|a| a.first())
            .and_then(|v| v.as_str())
            .unwrap_or("?"),
        r["wall_seconds"].as_f64().unwrap_or(0.0),
        r["processes"],
        if r["complete"].as_bool() == Some(false) {
            " (last snapshot of some: killed before exit)"
        } else {
            ""
        }
    );
    if r["managed"] == json!(false) {
        s += "  not managed: LD_PRELOAD could not apply\n";
        return s;
    }
    if r["processes"].as_u64() == Some(0) {
        s += "  no managed memory: no request reached the threshold (--threshold)\n";
        return s;
    }
    s += &format!(
        "  DRAM: peak {} of a {} budget per process; faults {} ({:.2} s resolving), evictions {}, moved {} (in {}, out {})\n",
        u(&t["peak_resident_bytes_max"]), u(&t["budget_bytes"]), t["faults"],
        t["fault_ns"].as_u64().unwrap_or(0) as f64 / 1e9, t["evictions"],
        u(&t["moved_bytes"]), u(&t["fetched_bytes"]), u(&t["evicted_bytes"])
    );
    s += &format!(
        "  kernel page faults: {} minor, {} major; managed requests {}, fell back to malloc {}\n",
        t["os_minor_faults"], t["os_major_faults"], t["managed_requests"], t["fallback_requests"]
    );
    if t["fixed_adopted"].as_u64().unwrap_or(0) + t["fixed_released"].as_u64().unwrap_or(0) > 0 {
        s += &format!(
            "  heaps committed in place (MAP_FIXED): {} managed, {} given back to the kernel for a file or shared mapping over them\n",
            t["fixed_adopted"], t["fixed_released"]
        );
    }
    // Which allocator served the program's unmanaged blocks, where it is not glibc's.
    let mut others: Vec<&str> = r["per_process"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p["allocator"].as_str())
        .filter(|a| !a.starts_with("libc.so"))
        .collect();
    others.sort_unstable();
    others.dedup();
    if !others.is_empty() {
        s += &format!(
            "  small objects: the program's own allocator ({}); its API keeps working\n",
            others.join(", ")
        );
    }
    let procs = r["per_process"].as_array().cloned().unwrap_or_default();
    s += &delivery_line(&procs);
    // Why the far tiers are these (the configuration's, or what `far = "auto"` found).
    for w in distinct(&procs, "far_reason").iter().take(2) {
        s += &format!("  far tiers: {w}\n");
    }
    if t["demand_bytes"].as_u64().unwrap_or(0) > 0 {
        s += &format!(
            "  moved in by faults: {} asked for, {} read ahead of which {} shown touched: amplification {:.2}\n",
            u(&t["demand_bytes"]), u(&t["readahead_bytes"]), u(&t["readahead_touched_bytes"]),
            t["amplification"].as_f64().unwrap_or(1.0)
        );
    }
    if t["clean_bytes"].as_u64().unwrap_or(0) > 0 {
        s += &format!(
            "  write-back: {} of evicted pages not written again (their tier held them)\n",
            u(&t["clean_bytes"])
        );
    }
    if t["filled_bytes"].as_u64().unwrap_or(0) > 0 {
        s += &format!(
            "  filled chunks: {} of evicted pages were one word repeated, kept as that word (no tier wrote them); {} placed back by filling\n",
            u(&t["filled_bytes"]),
            u(&t["fill_placed_bytes"])
        );
    }
    if t["zeroed_placed_bytes"].as_u64().unwrap_or(0) > 0 {
        s += &format!(
            "  discards while far: {} placed through a staging buffer that zeroed what the program discarded, in {:.1} ms\n",
            u(&t["zeroed_placed_bytes"]),
            t["zeroed_placed_ns"].as_u64().unwrap_or(0) as f64 / 1e6
        );
    }
    if t["huge_collapses"].as_u64().unwrap_or(0) > 0 {
        s += &format!(
            "  huge pages: {} spans of 2 MiB collapsed ({} split again by moves out); {} on huge pages at the last snapshot\n",
            t["huge_collapses"], t["huge_splits"], u(&t["huge_bytes"])
        );
    }
    s += &cgroup_line(&procs);
    // User-mode-only userfaultfd: system calls on managed memory were retried.
    if procs
        .iter()
        .any(|p| p["uffd_user_mode_only"] == json!(true))
    {
        let n: u64 = procs
            .iter()
            .map(|p| p["io_retried_calls"].as_u64().unwrap_or(0))
            .sum();
        let left: u64 = procs
            .iter()
            .map(|p| p["io_unretried_calls"].as_u64().unwrap_or(0))
            .sum();
        s += &format!(
            "  userfaultfd sees user-mode faults only (vm.unprivileged_userfaultfd=0): {n} system call(s) on managed memory held and retried{}\n",
            if left > 0 { format!(", {left} too large to hold (EFAULT)") } else { String::new() }
        );
    }
    // Kernel features the runtime did without (older kernel, or kernel_features masked).
    let mut fallbacks: Vec<String> = procs
        .iter()
        .flat_map(|p| {
            p["kernel_fallbacks"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .filter_map(|f| f.as_str().map(String::from))
        .collect();
    fallbacks.dedup();
    let order = |n: &String| {
        attune_sys::kernel::FEATURES
            .iter()
            .position(|f| f.name == n)
    };
    fallbacks.sort_by_key(order);
    fallbacks.dedup();
    if !fallbacks.is_empty() {
        s += &format!(
            "  kernel: without {} (their fallbacks ran; `attune doctor` says what each costs)\n",
            fallbacks.join(", ")
        );
    }
    if t["predicted_requests"].as_u64().unwrap_or(0) > 0 {
        s += &format!(
            "  flags from the history: {} request(s), {} pinned as their hot part\n",
            t["predicted_requests"],
            u(&t["predicted_pinned_bytes"])
        );
    }
    for tier in r["tiers"].as_array().into_iter().flatten() {
        s += &format!(
            "  tier {:<8} {:<7} peak {:>10}  in {:>10}  out {:>10}\n",
            tier["name"].as_str().unwrap_or("?"),
            tier["kind"].as_str().unwrap_or("?"),
            u(&tier["peak_used_bytes"]),
            u(&tier["bytes_in"]),
            u(&tier["bytes_out"])
        );
    }
    for (i, reg) in r["hottest_regions"]
        .as_array()
        .into_iter()
        .flatten()
        .take(5)
        .enumerate()
    {
        s += &format!(
            "  hot #{}: pid {} {} {} flags {} faults {} evictions {} resident {}\n",
            i + 1,
            reg["pid"],
            reg["address"].as_str().unwrap_or("?"),
            u(&reg["size"]),
            reg["flags_text"].as_str().unwrap_or("?"),
            reg["faults"],
            reg["evictions"],
            u(&reg["resident_bytes"])
        );
    }
    s
}
