//! `attune`: the command-line front end. One module per sub-command in `cmd/`.

// No unsafe code: memory this command allocated is read and written through attune-sys
// (its contract, attune-sys/src/lib.rs).
#![forbid(unsafe_code)]

mod cmd;

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
    #[command(disable_help_flag = true)]
    Bench(LabArgs),
    /// Run an unmodified program with its large allocations on tiered memory; report at exit.
    Run(cmd::run::Args),
    /// The report of managed processes from their statistics files (the Slurm plugin's jobs).
    Report(cmd::report::Args),
    /// Run a program the kernel's way at a budget: cgroup memory limit + swap (needs root).
    #[command(disable_help_flag = true)]
    KernelSwap(LabArgs),
    /// Show the configuration in force, or the table of options.
    Config(cmd::config::Args),
    /// Show the memory nodes and tiers of this machine (or of a captured /sys tree).
    Topology(cmd::topology::Args),
    /// What this kernel offers Attune: features, the paths in use, what each missing one costs.
    Doctor(cmd::doctor::Args),
    /// Placement on NUMA tiers: interleave weights, and where a region's pages land.
    Numa(cmd::numa::Args),
    /// Profile a program's memory: access curve, tiers over time, faults, suggested flags.
    Profile(cmd::profile::Args),
    /// Interference generator and probe (LoI, interference coefficient, sensitivity sweep).
    #[command(disable_help_flag = true)]
    Lbench(LabArgs),
    /// Memory under-use of a cluster from Slurm job records (and node samples).
    Usage(cmd::usage::Args),
    /// What the node daemon (attuned) knows: tiers, workflows, budgets, shared regions.
    Status(cmd::status::Args),
    /// Copy a read-only input into node memory once, for every instance to map.
    Stage(cmd::stage::StageArgs),
    /// Drop a staged input (freed when its last user closes it).
    Unstage(cmd::stage::UnstageArgs),
    /// Serve memory to the remote tiers of a job's runtimes on other hosts (libfabric).
    Memserver(cmd::memserver::Args),
    /// Load the node daemon's control plane and report requests per second.
    #[command(disable_help_flag = true)]
    DaemonBench(LabArgs),
}

/// The arguments of a lab command, passed on as they are.
#[derive(clap::Args)]
struct LabArgs {
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, num_args = 0..)]
    args: Vec<String>,
}

/// Runs a command of the benchmark lab: `attune-lab` beside this program (bench/lab), with
/// the arguments as given. The lab is its own program so that the binary users run their
/// programs with holds none of it.
fn lab(name: &str, a: LabArgs) -> i32 {
    use std::os::unix::process::CommandExt;
    let me = std::env::current_exe().unwrap_or_else(|_| "attune".into());
    let lab = me
        .parent()
        .map(|d| d.join("attune-lab"))
        .filter(|p| p.is_file())
        .unwrap_or_else(|| "attune-lab".into());
    let e = std::process::Command::new(&lab)
        .arg(name)
        .args(&a.args)
        .env("ATTUNE_CLI", &me)
        .exec();
    eprintln!(
        "attune {name}: the benchmark lab ({}) cannot start: {e}",
        lab.display()
    );
    2
}

fn main() {
    let cli = Cli::parse();
    let code = match cli.command {
        Command::Bench(a) => lab("bench", a),
        Command::Run(a) => cmd::run::run(a),
        Command::Report(a) => cmd::report::run(a),
        Command::KernelSwap(a) => lab("kernel-swap", a),
        Command::Config(a) => cmd::config::run(a),
        Command::Topology(a) => cmd::topology::run(a),
        Command::Doctor(a) => cmd::doctor::run(a),
        Command::Numa(a) => cmd::numa::run(a),
        Command::Usage(a) => cmd::usage::run(a),
        Command::Lbench(a) => lab("lbench", a),
        Command::Profile(a) => cmd::profile::run(a),
        Command::Status(a) => cmd::status::run(a),
        Command::Memserver(a) => cmd::memserver::run(a),
        Command::Stage(a) => cmd::stage::stage(a),
        Command::Unstage(a) => cmd::stage::unstage(a),
        Command::DaemonBench(a) => lab("daemon-bench", a),
    };
    std::process::exit(code);
}
