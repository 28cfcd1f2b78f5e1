//! The Python side of the CLI and the lab: where its package is, and the plots.
//!
//! `attune usage` is Python (pandas), and the plots of `attune profile` and `attune lbench`
//! are matplotlib; they live in `python/` and are installed in `share/attune/python`.

use std::path::{Path, PathBuf};

/// The folder that holds `attune_usage/` and `attune_plots.py`: ATTUNE_PYTHONPATH, the
/// installed prefix (bin/../share/attune/python), or the source tree this binary was
/// built from.
pub fn dir() -> Option<PathBuf> {
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
        .find(|d| d.join("attune_plots.py").is_file())
}

/// The interpreter: ATTUNE_PYTHON or python3.
pub fn interpreter() -> String {
    std::env::var("ATTUNE_PYTHON").unwrap_or_else(|_| "python3".into())
}

/// Draws the plots of `what` ("profile" or "lbench") from the files in `out`; says so
/// on stderr when it cannot (no Python, no matplotlib). The data files are written
/// before and do not depend on it.
pub fn plot(who: &str, what: &str, out: &Path) {
    let ok = dir()
        .map(|d| {
            std::process::Command::new(interpreter())
                .arg(d.join("attune_plots.py"))
                .arg(what)
                .arg(out)
                .status()
                .map(|s| s.success())
                .unwrap_or(false)
        })
        .unwrap_or(false);
    if !ok {
        eprintln!("attune {who}: plots skipped (python3 with matplotlib not available)");
    }
}
