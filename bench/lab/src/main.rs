//! `attune-lab`: the benchmark lab, apart from the product. `attune bench`, `attune
//! lbench`, `attune kernel-swap` and `attune daemon-bench` run this program (the `attune`
//! command finds it beside itself), so the lab's code and its kernel-baseline set-up (swap
//! devices, memory cgroups) are not in the binary users run their programs with.
//!
//! The scenarios touch managed memory through raw addresses (the runtime hands out
//! addresses, not slices); each such access says why it is in bounds.

mod cmd;
mod kernel_env;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "attune",
    bin_name = "attune",
    version,
    about = "The benchmark lab of Attune (run as `attune bench`, `attune lbench`, ...)"
)]
struct Lab {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the benchmark suite (the main job) and print a table; JSON goes to --out.
    Bench(cmd::bench::Args),
    /// Run a program the kernel's way at a budget: cgroup memory limit + swap (needs root).
    KernelSwap(cmd::kernel_swap::Args),
    /// Interference generator and probe (LoI, interference coefficient, sensitivity sweep).
    Lbench(cmd::lbench::Args),
    /// Load the node daemon's control plane and report requests per second.
    DaemonBench(cmd::daemon_bench::Args),
    /// Internal: one benchmark scenario in a fresh process (used by `bench`).
    #[command(hide = true, name = "__worker")]
    Worker { scenario: String },
}

/// The `attune` command the harness scripts run programs with: the one that started
/// this lab (`ATTUNE_CLI`), else the one beside it.
pub fn attune_cli() -> std::path::PathBuf {
    if let Some(p) = std::env::var_os("ATTUNE_CLI") {
        return p.into();
    }
    std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(|d| d.join("attune")))
        .unwrap_or_else(|| "attune".into())
}

fn main() {
    let code = match Lab::parse().command {
        Command::Bench(a) => cmd::bench::run(a),
        Command::KernelSwap(a) => cmd::kernel_swap::run(a),
        Command::Lbench(a) => cmd::lbench::run(a),
        Command::DaemonBench(a) => cmd::daemon_bench::run(a),
        Command::Worker { scenario } => cmd::bench::worker(&scenario),
    };
    std::process::exit(code);
}
