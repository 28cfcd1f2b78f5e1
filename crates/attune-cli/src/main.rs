//! `attune`: the command-line front end. One module per sub-command in `cmd/`.

mod cmd;
mod history;
mod kernel_env;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "attune",
    version,
    about = "Application-attuned tiered memory for HPC workflows"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the benchmark suite (the main job) and print a table; JSON goes to --out.
    Bench(cmd::bench::Args),
    /// Run an unmodified program with its large allocations on tiered memory; report at exit.
    Run(cmd::run::Args),
    /// Run a program the kernel's way at a budget: cgroup memory limit + swap (needs root).
    KernelSwap(cmd::kernel_swap::Args),
    /// Show the configuration in force, or the table of options.
    Config(cmd::config::Args),
    /// Show the memory nodes and tiers of this machine (or of a captured /sys tree).
    Topology(cmd::topology::Args),
    /// Placement on NUMA tiers: interleave weights, and where a region's pages land.
    Numa(cmd::numa::Args),
    /// Profile a program's memory: access curve, tiers over time, faults, suggested flags.
    Profile(cmd::profile::Args),
    /// Interference generator and probe (LoI, interference coefficient, sensitivity sweep).
    Lbench(cmd::lbench::Args),
    /// Memory under-use of a cluster from Slurm job records (and node samples).
    Usage(cmd::usage::Args),
    /// What the node daemon (attuned) knows: tiers, workflows, budgets, shared regions.
    Status(cmd::status::Args),
    /// Load the node daemon's control plane and report requests per second.
    DaemonBench(cmd::daemon_bench::Args),
    /// Internal: one benchmark scenario in a fresh process (used by `bench`).
    #[command(hide = true, name = "__worker")]
    Worker { scenario: String },
}

fn main() {
    let cli = Cli::parse();
    let code = match cli.command {
        Command::Bench(a) => cmd::bench::run(a),
        Command::Run(a) => cmd::run::run(a),
        Command::KernelSwap(a) => cmd::kernel_swap::run(a),
        Command::Config(a) => cmd::config::run(a),
        Command::Topology(a) => cmd::topology::run(a),
        Command::Numa(a) => cmd::numa::run(a),
        Command::Usage(a) => cmd::usage::run(a),
        Command::Lbench(a) => cmd::lbench::run(a),
        Command::Profile(a) => cmd::profile::run(a),
        Command::Status(a) => cmd::status::run(a),
        Command::DaemonBench(a) => cmd::daemon_bench::run(a),
        Command::Worker { scenario } => cmd::bench::worker(&scenario),
    };
    std::process::exit(code);
}
