//! Options of `attune run` and its interposer (environment only: the launcher sets them
//! for the program it starts, and a job script may set them by hand).
//!
//! Parsing is pure (a `getenv` closure in, settings or an error naming the variable out)
//! so it is unit-tested here and shared by the launcher (which validates before it starts
//! anything) and the interposer (which must never fail the program: it falls back to
//! defaults with a warning).

use crate::config::table::{Kind, Opt, Unset, Value};
use crate::size::parse_size;
use attune_policy::predict::{candidates, RegionRecord};
use attune_policy::Flags;

/// The options table of `attune run` (also in `attune config --options` and docs/tuning.md).
/// Environment only: the rows document the variables [`from_env`] reads.
#[rustfmt::skip]
pub const RUN_OPTIONS: &[Opt] = &[
    Opt { key: "flags", kind: Kind::Name { max: 64 }, default: Unset::Found("auto", ""), suggested: "what the workflow is: LAT, BW, CAP, SHL, combined with ','", doc: "Flags of every managed allocation; TM_FLAGS is the name the Slurm plugin sets, ATTUNE_FLAGS wins" },
    Opt { key: "flag_rules", kind: Kind::Name { max: 4096 }, default: Unset::Found("(none)", ""), suggested: "e.g. `..64M:LAT,1G..:CAP`", doc: "Flags by allocation size: comma-separated `MIN..MAX:FLAGS` (either bound may be empty, MAX exclusive); the first match wins over ATTUNE_FLAGS" },
    Opt { key: "predict", kind: Kind::Name { max: 1 << 20 }, default: Unset::Found("(set by attune run from the history)", ""), suggested: "-", doc: "Flags per allocation learned by `attune profile` (`SIZE:FLAGS[@S-E+...]`, hot ranges as fractions, pinned); used when no flags or rule apply" },
    Opt { key: "history", kind: Kind::Path, default: Unset::Found("$XDG_STATE_HOME/attune/history.json (~/.local/state/...)", ""), suggested: "the default; off to neither read nor write it", doc: "Execution history: `attune profile` records what it learned per program, `attune run` without flags predicts from it" },
    Opt { key: "run_threshold", kind: Kind::Size { min: 1 }, default: Unset::Value("1M"), suggested: "1M; 256K for programs with many mid-sized buffers", doc: "malloc-family and anonymous mmap requests of at least this size are managed; smaller ones stay with the system allocator" },
    Opt { key: "run_small", kind: Kind::Bool, default: Unset::Value("0"), suggested: "0; 1 when small objects dominate the footprint", doc: "1: small requests are managed too (per-class arenas, served by the handler thread: small objects are the arguments of unwrapped system calls), so the whole heap is tiered; for a user without kernel faults they stay with the program's allocator" },
    Opt { key: "run_fault_mode", kind: Kind::Choice { what: "fault mode", values: &["auto", "thread", "signal"], aliases: &[] }, default: Unset::Value("auto"), suggested: "auto; thread when the program's I/O reaches the kernel in ways auto cannot see (a raw io_uring system call, a statically linked liburing) or it switches to stacks of its own in code of its own (a statically linked Boost.Context)", doc: "How an unmodified program's faults are resolved: auto (signal delivery unless the program has loaded io_uring, AIO, RDMA, fabric, GPU or user-level thread libraries (Boost.Context, Argobots, Qthreads), carries the Go runtime, or imports POSIX AIO, vmsplice or makecontext: then the handler thread, for regions created from then on; docs/design/run.md, \"Fault delivery\"), thread (a handler thread; every kernel access works) or signal (the faulting thread by SIGBUS: faster; read/write, sockets, stdio and getrandom are retried by the interposer, io_uring, AIO and a peer's process_vm_readv get EFAULT)" },
    Opt { key: "run_children", kind: Kind::Bool, default: Unset::Value("1"), suggested: "1", doc: "1: forked and exec'd children are managed too (each with its own budget); 0: only the first process" },
    Opt { key: "report_dir", kind: Kind::Path, default: Unset::Found("(set by attune run)", ""), suggested: "-", doc: "Where each managed process writes its statistics (proc-PID-START.json), read by `attune run` for the report" },
    Opt { key: "report_interval_ms", kind: Kind::Int { min: 10, max: 3_600_000 }, default: Unset::Value("1000"), suggested: "1000", doc: "How often a process refreshes its statistics file (so a killed program still leaves a report)" },
];

/// One size rule: allocations in `[min, max)` get `flags`.
#[derive(Clone, Debug, PartialEq)]
pub struct FlagRule {
    pub min: u64,
    pub max: u64,
    pub flags: Flags,
}

/// Resolved settings of the interposer.
#[derive(Clone, Debug, PartialEq)]
pub struct RunSettings {
    pub flags: Flags,
    pub rules: Vec<FlagRule>,
    pub threshold: usize,
    pub small: bool,
    pub children: bool,
    /// Fault delivery of the program's regions: "auto", "thread" or "signal".
    pub fault_mode: &'static str,
    pub report_dir: Option<std::path::PathBuf>,
    pub report_interval_ms: u64,
    /// Regions learned from the history (`ATTUNE_PREDICT`), in allocation order.
    pub predicted: Vec<RegionRecord>,
}

impl Default for RunSettings {
    fn default() -> Self {
        RunSettings {
            flags: Flags(0),
            rules: Vec::new(),
            threshold: 1 << 20,
            small: false,
            children: true,
            fault_mode: "auto",
            report_dir: None,
            report_interval_ms: 1000,
            predicted: Vec::new(),
        }
    }
}

impl RunSettings {
    /// Flags for an allocation of `size` bytes.
    pub fn flags_for(&self, size: usize) -> Flags {
        let s = size as u64;
        self.rules
            .iter()
            .find(|r| s >= r.min && s < r.max)
            .map(|r| r.flags)
            .unwrap_or(self.flags)
    }

    /// Whether a request of `size` is left to the prediction: no rule matches and no
    /// flags were given. Returns the recorded regions it may take (see
    /// `attune_policy::predict::candidates`).
    pub fn predicted_for(&self, size: usize) -> Vec<usize> {
        let s = size as u64;
        if !self.flags.is_empty() || self.rules.iter().any(|r| s >= r.min && s < r.max) {
            return Vec::new();
        }
        candidates(&self.predicted, s)
    }
}

/// Parses `..64M:LAT,64M..1G:BW,1G..:CAP`.
pub fn parse_rules(s: &str) -> Result<Vec<FlagRule>, String> {
    let mut v = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (range, flags) = part
            .rsplit_once(':')
            .ok_or_else(|| format!("rule '{part}': expected MIN..MAX:FLAGS"))?;
        let (lo, hi) = range
            .split_once("..")
            .ok_or_else(|| format!("rule '{part}': expected MIN..MAX before ':'"))?;
        let min = if lo.trim().is_empty() {
            0
        } else {
            parse_size(lo).map_err(|e| format!("rule '{part}': {e}"))?
        };
        let max = if hi.trim().is_empty() {
            u64::MAX
        } else {
            parse_size(hi).map_err(|e| format!("rule '{part}': {e}"))?
        };
        if max <= min {
            return Err(format!("rule '{part}': the range is empty"));
        }
        let flags = Flags::parse(flags).map_err(|e| format!("rule '{part}': {e}"))?;
        v.push(FlagRule { min, max, flags });
    }
    Ok(v)
}

/// Reads the settings; the error names the variable.
pub fn from_env(getenv: impl Fn(&str) -> Option<String>) -> Result<RunSettings, String> {
    let mut s = RunSettings::default();
    let flags = getenv("ATTUNE_FLAGS").or_else(|| getenv("TM_FLAGS"));
    if let Some(f) = flags {
        let name = if getenv("ATTUNE_FLAGS").is_some() {
            "ATTUNE_FLAGS"
        } else {
            "TM_FLAGS"
        };
        s.flags = Flags::parse(&f).map_err(|e| format!("{name}={f}: {e}"))?;
    }
    if let Some(r) = getenv("ATTUNE_FLAG_RULES") {
        s.rules = parse_rules(&r).map_err(|e| format!("ATTUNE_FLAG_RULES: {e}"))?;
    }
    if let Some(p) = getenv("ATTUNE_PREDICT") {
        s.predicted =
            attune_policy::predict::decode(&p).map_err(|e| format!("ATTUNE_PREDICT: {e}"))?;
    }
    // The plain values, each checked by its row of RUN_OPTIONS.
    let value = |key: &str| -> Result<Option<Value>, String> {
        let o = crate::config::table::row(RUN_OPTIONS, key).expect("a run option");
        let name = o.env();
        match getenv(&name) {
            None => Ok(None),
            Some(v) => o
                .parse(&v, 0)
                .map(Some)
                .map_err(|e| format!("{name}={v}: {e}")),
        }
    };
    if let Some(Value::U64(v)) = value("run_threshold")? {
        s.threshold = v as usize;
    }
    if let Some(Value::Bool(v)) = value("run_small")? {
        s.small = v;
    }
    if let Some(Value::Bool(v)) = value("run_children")? {
        s.children = v;
    }
    if let Some(Value::Text(v)) = value("run_fault_mode")? {
        s.fault_mode = match v.as_str() {
            "signal" => "signal",
            "thread" => "thread",
            _ => "auto",
        };
    }
    if let Some(Value::U64(v)) = value("report_interval_ms")? {
        s.report_interval_ms = v;
    }
    s.report_dir = getenv("ATTUNE_REPORT_DIR")
        .filter(|d| !d.is_empty())
        .map(Into::into);
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn defaults_without_variables() {
        assert_eq!(from_env(env(&[])).unwrap(), RunSettings::default());
    }

    #[test]
    fn attune_flags_win_over_tm_flags() {
        let s = from_env(env(&[("TM_FLAGS", "CAP"), ("ATTUNE_FLAGS", "LAT")])).unwrap();
        assert_eq!(s.flags, Flags::LAT);
        let s = from_env(env(&[("TM_FLAGS", "bw")])).unwrap();
        assert_eq!(s.flags, Flags::BW);
    }

    #[test]
    fn rules_pick_by_size_first_match() {
        let s = from_env(env(&[
            ("ATTUNE_FLAGS", "BW"),
            ("ATTUNE_FLAG_RULES", "..64M:LAT, 1G..:CAP"),
        ]))
        .unwrap();
        assert_eq!(s.flags_for(1 << 20), Flags::LAT);
        assert_eq!(s.flags_for(128 << 20), Flags::BW);
        assert_eq!(s.flags_for(1 << 30), Flags::CAP);
    }

    #[test]
    fn prediction_applies_only_without_flags_or_rule() {
        let p = ("ATTUNE_PREDICT", "67108864:CAP@0-0.1;8388608:LAT");
        let s = from_env(env(&[p])).unwrap();
        assert_eq!(s.predicted_for(64 << 20), vec![0]);
        assert_eq!(s.predicted_for(8 << 20), vec![1]);
        assert!(s.predicted_for(1 << 20).is_empty());
        let s = from_env(env(&[p, ("ATTUNE_FLAGS", "BW")])).unwrap();
        assert!(s.predicted_for(64 << 20).is_empty(), "explicit flags win");
        let s = from_env(env(&[p, ("ATTUNE_FLAG_RULES", "32M..:BW")])).unwrap();
        assert!(s.predicted_for(64 << 20).is_empty(), "a matching rule wins");
        assert_eq!(s.predicted_for(8 << 20), vec![1]);
    }

    #[test]
    fn errors_name_the_variable() {
        for (k, v) in [
            ("ATTUNE_FLAGS", "FAST"),
            ("TM_FLAGS", "LAT,XX"),
            ("ATTUNE_FLAG_RULES", "64M:LAT"),
            ("ATTUNE_FLAG_RULES", "1G..64M:LAT"),
            ("ATTUNE_RUN_THRESHOLD", "0"),
            ("ATTUNE_RUN_THRESHOLD", "lots"),
            ("ATTUNE_RUN_SMALL", "maybe"),
            ("ATTUNE_RUN_FAULT_MODE", "fast"),
            ("ATTUNE_REPORT_INTERVAL_MS", "1"),
            ("ATTUNE_PREDICT", "64M:CAP"),
        ] {
            let e = from_env(env(&[(k, v)])).unwrap_err();
            assert!(e.starts_with(k), "{k}={v}: {e}");
        }
    }
}
