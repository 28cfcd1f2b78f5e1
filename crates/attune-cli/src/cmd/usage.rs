//! `attune usage`: the Slurm job-record analyzer. It is Python (pandas, matplotlib) in
//! `python/attune_usage`; this sub-command finds that package and hands it the arguments.

use std::os::unix::process::CommandExt;
use std::path::PathBuf;

#[derive(clap::Args)]
#[command(disable_help_flag = true)]
pub struct Args {
    /// Arguments of the analyzer (`attune usage --help` lists them).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    args: Vec<String>,
}

/// Where the package is: ATTUNE_PYTHONPATH, the installed prefix (bin/../share/attune/python),
/// or the source tree this binary was built from.
fn package_dir() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("ATTUNE_PYTHONPATH") {
        return Some(PathBuf::from(p));
    }
    let mut cands = Vec::new();
    if let Ok(exe) = std::env::current_exe() {
        if let Some(bin) = exe.parent() {
            cands.push(bin.join("../share/attune/python"));
        }
    }
    cands.push(PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../python"
    )));
    cands
        .into_iter()
        .find(|d| d.join("attune_usage/__init__.py").is_file())
}

pub fn run(a: Args) -> i32 {
    let Some(dir) = package_dir() else {
        eprintln!(
            "attune usage: the analyzer (python/attune_usage) is not installed next to this binary; \
             set ATTUNE_PYTHONPATH to the folder that holds attune_usage"
        );
        return 2;
    };
    let python = std::env::var("ATTUNE_PYTHON").unwrap_or_else(|_| "python3".into());
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
