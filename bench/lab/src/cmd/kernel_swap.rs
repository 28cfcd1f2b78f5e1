//! `attune kernel-swap`: runs a program the kernel's way at a DRAM budget: in a memory
//! cgroup of its own limited to the budget, with a swap device of ours on a memory medium
//! (a zram device of our own, or a loop device over /dev/shm) or on disk. It is IMME's CBE environment and the
//! baseline every "Attune vs kernel swap" figure is measured against. Needs root; the swap
//! device and the cgroup are removed when the program ends.
//!
//! `--swap none` is the same cgroup and limit without kernel swap: how the evaluation runs
//! Attune (issue 25's fair harness), whose far memory lives outside the job's cgroup (the
//! node's pool, a file) as the kernel's lives on its swap device. The cgroup's
//! `memory.swappiness` is 0 then, so no swap device of the host takes the job's pages:
//! the only far memory the program gets is the one Attune gives it.

use crate::kernel_env::{self, Medium, MemCgroup, Swap};
use attune::size::{human, parse_size_or_percent};
use std::os::unix::process::ExitStatusExt;

#[derive(clap::Args)]
pub struct Args {
    /// Memory limit of the program's cgroup: a size or a percentage of machine memory.
    #[arg(long, value_name = "SIZE|PERCENT", required_unless_present = "check")]
    limit: Option<String>,
    /// Where the swap lives: memory (a zram device of ours where the kernel has zram, else
    /// loop), zram, loop (a loop device over a file in /dev/shm) or disk; none: the limit
    /// alone, no kernel swap for the program (swappiness 0 in its cgroup).
    #[arg(long, default_value = "memory", value_parser = ["memory", "zram", "loop", "disk", "none"])]
    swap: String,
    /// Size of the swap device.
    #[arg(long, default_value = "4G")]
    swap_size: String,
    /// Directory of the swap file on disk.
    #[arg(long, default_value = "/var/tmp")]
    swap_dir: std::path::PathBuf,
    /// Only say whether the kernel baseline can run here (exit 0) or why not (exit 1).
    #[arg(long, exclusive = true)]
    check: bool,
    /// The program and its arguments.
    #[arg(
        required_unless_present = "check",
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "PROGRAM"
    )]
    command: Vec<String>,
}

pub fn run(a: Args) -> i32 {
    if a.check {
        return match kernel_env::unavailable() {
            None => {
                println!("attune kernel-swap: available");
                0
            }
            Some(why) => {
                println!("attune kernel-swap: unavailable: {why}");
                1
            }
        };
    }
    let total = attune_sys::os::total_memory();
    let limit_arg = a.limit.clone().unwrap_or_default();
    let limit = match parse_size_or_percent(&limit_arg, total) {
        Ok(l) if l >= 4 << 20 => l,
        Ok(_) => return fail("--limit: at least 4M"),
        Err(e) => return fail(&format!("--limit {limit_arg}: {e}")),
    };
    let swap_size = match attune::size::parse_size(&a.swap_size) {
        Ok(s) if s >= 40 << 10 => s,
        Ok(_) => return fail("--swap-size: at least 40K"),
        Err(e) => return fail(&format!("--swap-size {}: {e}", a.swap_size)),
    };
    if let Some(why) = kernel_env::unavailable() {
        return fail(&format!("cannot set up kernel swap: {why}"));
    }
    kernel_env::clean_stale(&a.swap_dir);
    let medium = match a.swap.as_str() {
        "none" => None,
        s => match Medium::parse(s) {
            Ok(m) => Some(m),
            Err(e) => return fail(&e),
        },
    };
    let swap = match medium {
        None => None,
        Some(m) => match Swap::new(m, &a.swap_dir, swap_size) {
            Ok(s) => Some(s),
            Err(e) => return fail(&format!("swap: {e}")),
        },
    };
    let cg = match MemCgroup::new(limit) {
        Ok(c) => c,
        Err(e) => return fail(&format!("cgroup: {e}")),
    };
    if medium.is_none() {
        if let Err(e) = cg.no_swap() {
            return fail(&format!("cgroup: {e}"));
        }
    }
    // The program joins the cgroup before it starts (a shell writes its own pid, then
    // execs the program), so none of its memory is charged elsewhere.
    let procs = cg.path().join("cgroup.procs");
    // The program's own figures, apart from the set-up (the memory-backed swap file is
    // locked in memory here, a million minor faults for 4 GiB) and the tear-down: the
    // wall time of the program, and its faults from the reaped-children counters.
    let (min0, maj0) = attune_sys::os::children_faults();
    let t0 = std::time::Instant::now();
    let mut cmd = std::process::Command::new("/bin/sh");
    cmd.arg("-c")
        .arg("echo $$ > \"$0\" && exec \"$@\"")
        .arg(&procs)
        .args(&a.command);
    // SIGTERM (a batch system's time limit, the harness cutting a run) goes to the
    // program, whose end this process waits for, then removes its swap device and cgroup;
    // a SIGKILL of this process takes the program with it (the next run cleans up).
    attune_sys::os::die_with_launcher(&mut cmd);
    let status = cmd
        .spawn()
        .and_then(|mut child| attune_sys::os::wait_forwarding(&mut child));
    let wall = t0.elapsed().as_secs_f64();
    let (min1, maj1) = attune_sys::os::children_faults();
    let peak = cg.max_usage();
    drop(cg);
    drop(swap);
    match status {
        Ok(s) => {
            eprintln!(
                "attune kernel-swap: {} — {}, {wall:.3} s wall, cgroup peak {} of a {} limit, {}; program faults: {} minor, {} major",
                a.command[0],
                match (s.code(), s.signal()) {
                    (Some(c), _) => format!("exit {c}"),
                    (_, Some(g)) => format!("killed by signal {g}"),
                    _ => "?".into(),
                },
                human(peak),
                human(limit),
                medium.map_or("no swap".to_string(), |m| format!("swap on {}", m.name())),
                min1 - min0,
                maj1 - maj0
            );
            match (s.code(), s.signal()) {
                (Some(c), _) => c,
                (_, Some(g)) => attune_sys::os::die_by_signal(g),
                _ => 1,
            }
        }
        Err(e) => fail(&format!("{}: {e}", a.command[0])),
    }
}

fn fail(msg: &str) -> i32 {
    eprintln!("attune kernel-swap: {msg}");
    2
}
