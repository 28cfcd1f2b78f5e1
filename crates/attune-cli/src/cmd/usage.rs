//! `attune usage`: the Slurm job-record analyzer. It is Python (pandas, matplotlib) in
//! `python/attune_usage`; this sub-command finds that package and hands it the arguments.

use std::os::unix::process::CommandExt;

#[derive(clap::Args)]
#[command(disable_help_flag = true)]
pub struct Args {
    /// Arguments of the analyzer (`attune usage --help` lists them).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    args: Vec<String>,
}

pub fn run(a: Args) -> i32 {
    let Some(dir) = attune_cli::python::dir() else {
        eprintln!(
            "attune usage: the analyzer (python/attune_usage) is not installed next to this binary; \
             set ATTUNE_PYTHONPATH to the folder that holds attune_usage"
        );
        return 2;
    };
    let python = attune_cli::python::interpreter();
    let mut path = dir.into_os_string();
    if let Some(old) = std::env::var_os("PYTHONPATH") {
        path.push(":");
        path.push(old);
    }
    let err = std::process::Command::new(&python)
        .args(["-m", "attune_usage"])
        .args(&a.args)
        .env("PYTHONPATH", path)
        .exec();
    eprintln!(
        "attune usage: cannot run {python}: {err} (needs Python 3 with pandas and matplotlib)"
    );
    127
}
