//! Configuration: one TOML file, every option also an environment variable, and an
//! embedded default that works on any Linux machine with no file at all.
//!
//! Precedence: embedded default < file (`ATTUNE_CONFIG` or `attune_init(path)`) < environment.
//! [`OPTIONS`] is the one table of options; `docs/tuning.md` and `attune config --options`
//! are generated from it.

use crate::size::{parse_size, parse_size_or_percent};
use serde::Deserialize;
use std::path::PathBuf;

/// How a region's faults are delivered (see docs/design.md, "The fault path").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FaultMode {
    /// A handler thread resolves faults; system calls on managed memory work. Default.
    Thread,
    /// The faulting thread resolves its own fault in a SIGBUS handler: no hand-off, 3.2x lower
    /// fault latency in `attune bench` (docs/benchmarks.md), but a system call that touches a non-resident managed page
    /// fails with EFAULT. For regions never passed to system calls (or pinned first).
    Signal,
}

impl std::str::FromStr for FaultMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "thread" => Ok(FaultMode::Thread),
            "signal" => Ok(FaultMode::Signal),
            other => Err(format!(
                "'{other}' is not a fault mode (expected thread or signal)"
            )),
        }
    }
}

/// Kinds of tier (docs/design.md, "Tiers").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TierKind {
    Dram,
    Memory,
    File,
    Numa,
}

/// Replacement policy of the fast tier.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Flags decide (IMME): LAT/SHL protected, plans per flag.
    Attuned,
    /// Ignore flags: temperature only (IMME's "Tiered Memory Environment").
    Temperature,
}

/// Whether the runtime joins the node daemon.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DaemonMode {
    /// Join when the socket exists; alone otherwise.
    Auto,
    /// Fail to start without the daemon.
    Require,
    Off,
}

/// One documented option: the single source for docs, env names and `attune config`.
pub struct OptionDoc {
    pub key: &'static str,
    pub env: &'static str,
    pub default: &'static str,
    pub suggested: &'static str,
    pub doc: &'static str,
}

/// Every global option. Tier options are listed in [`TIER_OPTIONS`].
pub const OPTIONS: &[OptionDoc] = &[
    OptionDoc { key: "dram", env: "ATTUNE_DRAM", default: "25%", suggested: "what the job may keep resident, e.g. its cgroup limit minus 10%", doc: "DRAM budget for managed memory: a size (K/M/G) or a percentage of the machine's memory" },
    OptionDoc { key: "fault_mode", env: "ATTUNE_FAULT_MODE", default: "thread", suggested: "thread; signal for compute kernels whose managed buffers never reach system calls", doc: "How faults are resolved: thread (handler thread) or signal (the faulting thread, SIGBUS)" },
    OptionDoc { key: "handler_spin_us", env: "ATTUNE_HANDLER_SPIN_US", default: "100", suggested: "100; 0 where every core is busy with the application's own threads", doc: "How long the fault-handler thread (thread delivery) polls for the next fault before it sleeps, when the previous fault came sooner than that (microseconds; 0 = always sleep)" },
    OptionDoc { key: "chunk_size", env: "ATTUNE_CHUNK_SIZE", default: "4K", suggested: "4K for random access, 64K-1M for streaming", doc: "Default unit of placement and movement, a power of two from 4K to 2M" },
    OptionDoc { key: "readahead", env: "ATTUNE_READAHEAD", default: "1M", suggested: "1M; 0 disables", doc: "Largest read-ahead window on sequential faults" },
    OptionDoc { key: "headroom", env: "ATTUNE_HEADROOM", default: "2%", suggested: "2%-5% of the budget, at least a few MiB", doc: "Free DRAM the background evictor keeps for faults a handler thread resolves (thread delivery; a thread resolving its own fault evicts for itself), and on NUMA tiers the fast-tier memory kept free for promotions by demoting cold unprotected data, as a size or a percentage of the budget" },
    OptionDoc { key: "evict_batch", env: "ATTUNE_EVICT_BATCH", default: "64", suggested: "64", doc: "Chunks evicted per batch (one move per contiguous run)" },
    OptionDoc { key: "move_limit", env: "ATTUNE_MOVE_LIMIT", default: "0", suggested: "0 (none); 1G a second beside latency-sensitive jobs on a shared node", doc: "Most bytes a second this process moves between tiers (fetches and evictions); the node daemon may set a lower one; 0 = no limit" },
    OptionDoc { key: "inactive_share", env: "ATTUNE_INACTIVE_SHARE", default: "25", suggested: "25; 10 when the working set is known to be stable", doc: "Percent of the pageable budget kept for chunks not (yet) proven hot; the rest may hold chunks that refaulted soon after eviction" },
    OptionDoc { key: "small_threshold", env: "ATTUNE_SMALL_THRESHOLD", default: "1M", suggested: "1M", doc: "Allocations below this size share per-class arenas (mimalloc) instead of getting a region each" },
    OptionDoc { key: "small_arena", env: "ATTUNE_SMALL_ARENA", default: "1G", suggested: "enough for the program's small managed objects per class", doc: "Virtual size of each small-object arena (one per placement class)" },
    OptionDoc { key: "pin_fraction", env: "ATTUNE_PIN_FRACTION", default: "0.25", suggested: "0.1-0.5", doc: "Part of a LAT or SHL region pinned and pre-faulted in DRAM" },
    OptionDoc { key: "sample_rate", env: "ATTUNE_SAMPLE_RATE", default: "0", suggested: "0; 500-2000 under attune profile", doc: "Access samples per second (a resident chunk parked in the far tier; its next touch is timed); 0 = off" },
    OptionDoc { key: "sample_window_us", env: "ATTUNE_SAMPLE_WINDOW_US", default: "20000", suggested: "20000; longer for slow programs", doc: "How long a parked sample waits for a touch before it counts as untouched (microseconds)" },
    OptionDoc { key: "predict_window_ms", env: "ATTUNE_PREDICT_WINDOW_MS", default: "0", suggested: "0; 2000-5000 for programs run without flags or history", doc: "Online flag prediction: regions allocated without flags are access-sampled for this long, then a region whose small part takes most accesses gets that part pinned (LAT) and CAP flags for the rest; 0 = off" },
    OptionDoc { key: "heat_interval_ms", env: "ATTUNE_HEAT_INTERVAL_MS", default: "200", suggested: "200; 1000 for regions of many GiB", doc: "How often regions on NUMA tiers are scanned for written pages (write heat: hot far pages are promoted and cold unprotected ones keep the headroom, within move_limit); 0 = off" },
    OptionDoc { key: "daemon", env: "ATTUNE_DAEMON", default: "auto", suggested: "auto; require on nodes where attuned arbitrates jobs", doc: "Node daemon (attuned): auto (use it when its socket exists), require (fail without it), off" },
    OptionDoc { key: "socket", env: "ATTUNE_SOCKET", default: "/run/attune/attuned.sock", suggested: "the default", doc: "Unix socket of the node daemon" },
    OptionDoc { key: "workflow", env: "ATTUNE_WORKFLOW", default: "$SLURM_JOB_ID, else program.pid", suggested: "one name per job (attune run and the Slurm plugin set it)", doc: "Workflow this process belongs to: the daemon grants DRAM per workflow" },
    OptionDoc { key: "mode", env: "ATTUNE_MODE", default: "attuned", suggested: "attuned", doc: "attuned (flags decide) or temperature (flags ignored: IMME's TME baseline)" },
    OptionDoc { key: "log", env: "ATTUNE_LOG", default: "warn", suggested: "warn", doc: "Messages on stderr: error, warn, info or debug" },
];

/// Options of each `[[tier]]`; as environment variables `ATTUNE_TIER_<NAME>_<KEY>`.
pub const TIER_OPTIONS: &[OptionDoc] = &[
    OptionDoc {
        key: "name",
        env: "-",
        default: "-",
        suggested: "-",
        doc: "Unique name (letters, digits, _)",
    },
    OptionDoc {
        key: "kind",
        env: "-",
        default: "-",
        suggested: "-",
        doc: "memory, file, numa (the DRAM tier is implicit)",
    },
    OptionDoc {
        key: "capacity",
        env: "ATTUNE_TIER_<NAME>_CAPACITY",
        default: "memory: 50%, file: 50%",
        suggested: "what the medium can spare",
        doc: "Size, or percentage of machine memory (memory) or of free space (file)",
    },
    OptionDoc {
        key: "path",
        env: "ATTUNE_TIER_<NAME>_PATH",
        default: "$TMPDIR or /tmp",
        suggested: "a local NVMe or Lustre directory",
        doc: "Directory of a file tier (files are private and unnamed)",
    },
    OptionDoc {
        key: "direct",
        env: "ATTUNE_TIER_<NAME>_DIRECT",
        default: "false",
        suggested: "true on NVMe/Lustre with chunks of 64K or more",
        doc: "Use O_DIRECT for a file tier",
    },
    OptionDoc {
        key: "latency_ns",
        env: "ATTUNE_TIER_<NAME>_LATENCY_NS",
        default: "memory: 300, file: 25000",
        suggested: "measured",
        doc: "Declared access latency (orders tiers)",
    },
    OptionDoc {
        key: "bandwidth",
        env: "ATTUNE_TIER_<NAME>_BANDWIDTH",
        default: "memory: 10G, file: 1G",
        suggested: "measured, bytes/s",
        doc: "Declared bandwidth in bytes per second (BW plans)",
    },
    OptionDoc {
        key: "emulate_delay_ns",
        env: "ATTUNE_TIER_<NAME>_EMULATE_DELAY_NS",
        default: "0",
        suggested: "0; 2000-5000 to model a remote pool",
        doc: "Extra delay added to every fetch from a memory tier",
    },
    OptionDoc {
        key: "emulate_bandwidth",
        env: "ATTUNE_TIER_<NAME>_EMULATE_BANDWIDTH",
        default: "0",
        suggested: "0 (off); e.g. 2G to model a slower link",
        doc: "Bandwidth cap of fetches from a memory tier, bytes/s",
    },
    OptionDoc {
        key: "min_chunk",
        env: "ATTUNE_TIER_<NAME>_MIN_CHUNK",
        default: "file: 16K, others: 4K",
        suggested: "16K for a file tier; 64K if the tier is only streamed",
        doc: "Least chunk size of regions whose home is this tier (one I/O costs about as much for 16K as for 4K)",
    },
    OptionDoc {
        key: "node",
        env: "ATTUNE_TIER_<NAME>_NODE",
        default: "-",
        suggested: "the CPU-less node of the CXL device",
        doc: "NUMA node of a numa tier",
    },
];

/// A far tier as configured.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct TierConfig {
    pub name: String,
    pub kind: TierKind,
    pub capacity: u64,
    pub path: Option<PathBuf>,
    pub direct: bool,
    pub latency_ns: u64,
    pub bandwidth: u64,
    pub emulate_delay_ns: u64,
    pub emulate_bandwidth: u64,
    /// Least chunk size of regions whose home is this tier.
    pub min_chunk: usize,
    pub node: Option<u32>,
}

/// The resolved configuration.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Config {
    pub dram: u64,
    pub fault_mode: FaultMode,
    /// Microseconds the handler thread polls before sleeping (`fault::handler_loop`).
    pub handler_spin_us: u64,
    pub chunk_size: usize,
    pub readahead: usize,
    pub headroom: u64,
    pub evict_batch: usize,
    /// Bytes a second moved between tiers at most (0: none).
    pub move_limit: u64,
    /// Percent of the pageable budget kept for inactive chunks (`attune_policy::victim`).
    pub inactive_share: u64,
    pub small_threshold: usize,
    pub small_arena: usize,
    pub pin_fraction: f64,
    /// Access samples per second (0: no sampler thread).
    pub sample_rate: u64,
    pub sample_window_us: u64,
    pub heat_interval_ms: u64,
    pub predict_window_ms: u64,
    pub mode: Mode,
    pub daemon: DaemonMode,
    pub socket: std::path::PathBuf,
    /// Empty: derived at connection (`tmm::workflow_name`).
    pub workflow: String,
    pub log: crate::log::Level,
    /// Far tiers, fastest first.
    pub tiers: Vec<TierConfig>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    dram: Option<String>,
    fault_mode: Option<FaultMode>,
    handler_spin_us: Option<u64>,
    chunk_size: Option<String>,
    readahead: Option<String>,
    headroom: Option<String>,
    evict_batch: Option<u64>,
    inactive_share: Option<u64>,
    move_limit: Option<String>,
    small_threshold: Option<String>,
    small_arena: Option<String>,
    pin_fraction: Option<f64>,
    sample_rate: Option<u64>,
    sample_window_us: Option<u64>,
    heat_interval_ms: Option<u64>,
    predict_window_ms: Option<u64>,
    mode: Option<Mode>,
    daemon: Option<DaemonMode>,
    socket: Option<String>,
    workflow: Option<String>,
    log: Option<crate::log::Level>,
    tier: Option<Vec<FileTier>>,
}

#[derive(Deserialize, Clone)]
#[serde(deny_unknown_fields)]
struct FileTier {
    name: String,
    kind: TierKind,
    capacity: Option<String>,
    path: Option<String>,
    direct: Option<bool>,
    latency_ns: Option<u64>,
    bandwidth: Option<String>,
    emulate_delay_ns: Option<u64>,
    emulate_bandwidth: Option<String>,
    min_chunk: Option<String>,
    node: Option<u32>,
}

/// Where a configuration value came from, for error messages.
#[derive(Clone, Debug)]
enum Origin {
    File { path: String, line: usize },
    Env(String),
    Default,
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Origin::File { path, line } => write!(f, "{path}:{line}"),
            Origin::Env(v) => write!(f, "environment variable {v}"),
            Origin::Default => write!(f, "embedded default"),
        }
    }
}

/// A configuration error naming the key and where it was set.
#[derive(Debug, Clone, PartialEq)]
pub struct ConfigError(pub String);

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for ConfigError {}

fn line_of(text: &str, key: &str, occurrence_hint: Option<&str>) -> usize {
    // The line where `key =` first appears (after the `name = "<hint>"` line for tiers).
    let mut start = 0;
    if let Some(h) = occurrence_hint {
        if let Some(p) = text.lines().position(|l| l.contains(&format!("\"{h}\""))) {
            start = p;
        }
    }
    for (i, l) in text.lines().enumerate().skip(start) {
        let t = l.trim_start();
        if t.starts_with(key) && t[key.len()..].trim_start().starts_with('=') {
            return i + 1;
        }
    }
    0
}

/// Inputs the configuration depends on (machine facts), injectable for tests.
#[derive(Clone, Debug)]
pub struct Machine {
    pub total_memory: u64,
    pub tmpdir: PathBuf,
}

impl Machine {
    pub fn this() -> Machine {
        let tmpdir = std::env::var_os("TMPDIR")
            .map(PathBuf::from)
            .filter(|p| p.is_dir())
            .unwrap_or_else(|| PathBuf::from("/tmp"));
        Machine {
            total_memory: attune_sys::os::total_memory(),
            tmpdir,
        }
    }
}

/// Loads the configuration: embedded default, then `path` (or `$ATTUNE_CONFIG`), then the
/// environment `env` (a snapshot of variables, so tests need not touch the process's).
pub fn load(
    path: Option<&std::path::Path>,
    env: &[(String, String)],
    m: &Machine,
) -> Result<Config, ConfigError> {
    let getenv = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    let file_path: Option<PathBuf> = path.map(PathBuf::from).or_else(|| {
        getenv("ATTUNE_CONFIG")
            .filter(|s| !s.is_empty())
            .map(PathBuf::from)
    });
    let (fc, text, pname) = match &file_path {
        Some(p) => {
            let text = std::fs::read_to_string(p).map_err(|e| {
                ConfigError(format!(
                    "cannot read configuration file {}: {e}",
                    p.display()
                ))
            })?;
            let fc: FileConfig = toml::from_str(&text).map_err(|e| {
                let line = e
                    .span()
                    .map(|s| text[..s.start.min(text.len())].matches('\n').count() + 1)
                    .unwrap_or(0);
                ConfigError(format!("{}:{line}: {}", p.display(), e.message()))
            })?;
            (fc, text, p.display().to_string())
        }
        None => (FileConfig::default(), String::new(), String::new()),
    };
    let origin = |key: &str, env_name: &str, tier: Option<&str>| -> Origin {
        if getenv(env_name).is_some() {
            Origin::Env(env_name.to_string())
        } else if !pname.is_empty() {
            Origin::File {
                path: pname.clone(),
                line: line_of(&text, key, tier),
            }
        } else {
            Origin::Default
        }
    };
    // Pick env over file over default, as a string.
    let pick = |_key: &str, env_name: &str, file: Option<String>, default: &str| -> String {
        getenv(env_name)
            .or(file)
            .unwrap_or_else(|| default.to_string())
    };
    let err = |key: &str, env_name: &str, tier: Option<&str>, msg: String| -> ConfigError {
        let what = match tier {
            Some(t) => format!("tier '{t}' key '{key}'"),
            None => format!("key '{key}'"),
        };
        ConfigError(format!("{}: {what}: {msg}", origin(key, env_name, tier)))
    };

    let dram_s = pick("dram", "ATTUNE_DRAM", fc.dram.clone(), "25%");
    let dram = parse_size_or_percent(&dram_s, m.total_memory)
        .map_err(|e| err("dram", "ATTUNE_DRAM", None, e))?;
    if dram < 1 << 20 {
        return Err(err(
            "dram",
            "ATTUNE_DRAM",
            None,
            format!("a DRAM budget of {dram} bytes is too small (at least 1M)"),
        ));
    }
    let fault_mode = match getenv("ATTUNE_FAULT_MODE") {
        Some(v) => v
            .parse()
            .map_err(|e| err("fault_mode", "ATTUNE_FAULT_MODE", None, e))?,
        None => fc.fault_mode.unwrap_or(FaultMode::Thread),
    };
    let size_opt = |key: &str,
                    env_name: &str,
                    file: Option<String>,
                    default: &str|
     -> Result<u64, ConfigError> {
        parse_size(&pick(key, env_name, file, default)).map_err(|e| err(key, env_name, None, e))
    };
    let chunk_size = size_opt(
        "chunk_size",
        "ATTUNE_CHUNK_SIZE",
        fc.chunk_size.clone(),
        "4K",
    )? as usize;
    validate_chunk(chunk_size).map_err(|e| err("chunk_size", "ATTUNE_CHUNK_SIZE", None, e))?;
    let readahead = size_opt("readahead", "ATTUNE_READAHEAD", fc.readahead.clone(), "1M")? as usize;
    let move_limit = size_opt(
        "move_limit",
        "ATTUNE_MOVE_LIMIT",
        fc.move_limit.clone(),
        "0",
    )?;
    let headroom_s = pick("headroom", "ATTUNE_HEADROOM", fc.headroom.clone(), "2%");
    let headroom = parse_size_or_percent(&headroom_s, dram)
        .map_err(|e| err("headroom", "ATTUNE_HEADROOM", None, e))?;
    if headroom >= dram {
        return Err(err(
            "headroom",
            "ATTUNE_HEADROOM",
            None,
            "must be smaller than the DRAM budget".into(),
        ));
    }
    let int_opt = |key: &str, env_name: &str, file: Option<u64>, default: u64, lo: u64, hi: u64| {
        let v = match getenv(env_name) {
            Some(v) => v
                .trim()
                .parse::<u64>()
                .map_err(|_| err(key, env_name, None, format!("'{v}' is not a whole number")))?,
            None => file.unwrap_or(default),
        };
        if !(lo..=hi).contains(&v) {
            return Err(err(
                key,
                env_name,
                None,
                format!("must be between {lo} and {hi}"),
            ));
        }
        Ok(v)
    };
    let evict_batch = int_opt(
        "evict_batch",
        "ATTUNE_EVICT_BATCH",
        fc.evict_batch,
        64,
        1,
        4096,
    )?;
    let inactive_share = int_opt(
        "inactive_share",
        "ATTUNE_INACTIVE_SHARE",
        fc.inactive_share,
        25,
        0,
        90,
    )?;
    let small_threshold = size_opt(
        "small_threshold",
        "ATTUNE_SMALL_THRESHOLD",
        fc.small_threshold.clone(),
        "1M",
    )? as usize;
    let small_arena = size_opt(
        "small_arena",
        "ATTUNE_SMALL_ARENA",
        fc.small_arena.clone(),
        "1G",
    )? as usize;
    if small_arena < 64 << 20 {
        return Err(err(
            "small_arena",
            "ATTUNE_SMALL_ARENA",
            None,
            "must be at least 64M".into(),
        ));
    }
    let pin_fraction = match getenv("ATTUNE_PIN_FRACTION") {
        Some(v) => v.trim().parse::<f64>().map_err(|_| {
            err(
                "pin_fraction",
                "ATTUNE_PIN_FRACTION",
                None,
                format!("'{v}' is not a number"),
            )
        })?,
        None => fc.pin_fraction.unwrap_or(0.25),
    };
    if !(0.0..=1.0).contains(&pin_fraction) {
        return Err(err(
            "pin_fraction",
            "ATTUNE_PIN_FRACTION",
            None,
            "must be between 0 and 1".into(),
        ));
    }
    // A whole-number option from the environment or the file, within [lo, hi].
    let sample_rate = int_opt(
        "sample_rate",
        "ATTUNE_SAMPLE_RATE",
        fc.sample_rate,
        0,
        0,
        100_000,
    )?;
    let handler_spin_us = int_opt(
        "handler_spin_us",
        "ATTUNE_HANDLER_SPIN_US",
        fc.handler_spin_us,
        100,
        0,
        10_000,
    )?;
    let heat_interval_ms = int_opt(
        "heat_interval_ms",
        "ATTUNE_HEAT_INTERVAL_MS",
        fc.heat_interval_ms,
        200,
        0,
        60_000,
    )?;
    let predict_window_ms = int_opt(
        "predict_window_ms",
        "ATTUNE_PREDICT_WINDOW_MS",
        fc.predict_window_ms,
        0,
        0,
        3_600_000,
    )?;
    let sample_window_us = int_opt(
        "sample_window_us",
        "ATTUNE_SAMPLE_WINDOW_US",
        fc.sample_window_us,
        20_000,
        100,
        10_000_000,
    )?;
    let mode = match getenv("ATTUNE_MODE") {
        Some(v) => match v.trim().to_ascii_lowercase().as_str() {
            "attuned" => Mode::Attuned,
            "temperature" => Mode::Temperature,
            o => {
                return Err(err(
                    "mode",
                    "ATTUNE_MODE",
                    None,
                    format!("'{o}' is not a mode (expected attuned or temperature)"),
                ))
            }
        },
        None => fc.mode.unwrap_or(Mode::Attuned),
    };
    let log = match getenv("ATTUNE_LOG") {
        Some(v) => v.parse().map_err(|e| err("log", "ATTUNE_LOG", None, e))?,
        None => fc.log.unwrap_or(crate::log::Level::Warn),
    };

    // Tiers: the file's list, or the embedded default (a memory tier and a file tier).
    let file_tiers = fc.tier.clone().unwrap_or_else(|| {
        vec![
            FileTier {
                name: "memory".into(),
                kind: TierKind::Memory,
                capacity: None,
                path: None,
                direct: None,
                latency_ns: None,
                bandwidth: None,
                emulate_delay_ns: None,
                emulate_bandwidth: None,
                min_chunk: None,
                node: None,
            },
            FileTier {
                name: "file".into(),
                kind: TierKind::File,
                capacity: None,
                path: None,
                direct: None,
                latency_ns: None,
                bandwidth: None,
                emulate_delay_ns: None,
                emulate_bandwidth: None,
                min_chunk: None,
                node: None,
            },
        ]
    });
    let mut tiers = Vec::new();
    for ft in &file_tiers {
        let name = ft.name.clone();
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(err(
                "name",
                "-",
                None,
                format!("'{name}' is not a tier name (letters, digits, _)"),
            ));
        }
        if tiers.iter().any(|t: &TierConfig| t.name == name) {
            return Err(err(
                "name",
                "-",
                Some(&name),
                "tier names must be unique".into(),
            ));
        }
        let up = name.to_ascii_uppercase();
        let tenv = |k: &str| format!("ATTUNE_TIER_{up}_{}", k.to_ascii_uppercase());
        let tget = |k: &str, f: Option<String>| getenv(&tenv(k)).or(f);
        let terr = |k: &str, msg: String| err(k, &tenv(k), Some(&name), msg);
        let path = match ft.kind {
            TierKind::File => {
                let p = tget("path", ft.path.clone())
                    .map(|s| expand_vars(&s, m))
                    .map(PathBuf::from)
                    .unwrap_or_else(|| m.tmpdir.clone());
                if !p.is_dir() {
                    return Err(terr(
                        "path",
                        format!("'{}' is not a directory", p.display()),
                    ));
                }
                Some(p)
            }
            _ => None,
        };
        let cap_total = match ft.kind {
            TierKind::File => attune_sys::os::fs_available(path.as_deref().unwrap()).unwrap_or(0),
            _ => m.total_memory,
        };
        let cap_s = tget("capacity", ft.capacity.clone()).unwrap_or_else(|| "50%".into());
        let capacity = parse_size_or_percent(&cap_s, cap_total).map_err(|e| terr("capacity", e))?;
        let num = |k: &str, f: Option<u64>, d: u64| -> Result<u64, ConfigError> {
            match getenv(&tenv(k)) {
                Some(v) => v
                    .trim()
                    .parse()
                    .map_err(|_| terr(k, format!("'{v}' is not a whole number"))),
                None => Ok(f.unwrap_or(d)),
            }
        };
        let (dl, db) = match ft.kind {
            TierKind::File => (25_000, 1u64 << 30),
            TierKind::Numa => (250, 30u64 << 30),
            _ => (300, 10u64 << 30),
        };
        let latency_ns = num("latency_ns", ft.latency_ns, dl)?;
        let bandwidth = match tget("bandwidth", ft.bandwidth.clone()) {
            Some(s) => parse_size(&s).map_err(|e| terr("bandwidth", e))?,
            None => db,
        };
        let emulate_delay_ns = num("emulate_delay_ns", ft.emulate_delay_ns, 0)?;
        let emulate_bandwidth = match tget("emulate_bandwidth", ft.emulate_bandwidth.clone()) {
            Some(s) => parse_size(&s).map_err(|e| terr("emulate_bandwidth", e))?,
            None => 0,
        };
        let min_chunk = match tget("min_chunk", ft.min_chunk.clone()) {
            Some(v) => {
                let c = parse_size(&v).map_err(|e| terr("min_chunk", e))? as usize;
                validate_chunk(c).map_err(|e| terr("min_chunk", e))?;
                c
            }
            None if ft.kind == TierKind::File => 16 << 10,
            None => 4096,
        };
        let direct = match getenv(&tenv("direct")) {
            Some(v) => parse_bool(&v).map_err(|e| terr("direct", e))?,
            None => ft.direct.unwrap_or(false),
        };
        let node = match getenv(&tenv("node")) {
            Some(v) => Some(
                v.trim()
                    .parse()
                    .map_err(|_| terr("node", format!("'{v}' is not a node number")))?,
            ),
            None => ft.node,
        };
        if ft.kind == TierKind::Numa && node.is_none() {
            return Err(terr("node", "a numa tier needs a node".into()));
        }
        if ft.kind == TierKind::Dram {
            return Err(terr(
                "kind",
                "the DRAM tier is implicit: set its size with 'dram'".into(),
            ));
        }
        tiers.push(TierConfig {
            name,
            kind: ft.kind,
            capacity,
            path,
            direct,
            latency_ns,
            bandwidth,
            emulate_delay_ns,
            emulate_bandwidth,
            min_chunk,
            node,
        });
    }
    tiers.sort_by_key(|t| t.latency_ns);
    let daemon = match getenv("ATTUNE_DAEMON") {
        Some(v) => match v.trim().to_ascii_lowercase().as_str() {
            "auto" => DaemonMode::Auto,
            "require" => DaemonMode::Require,
            "off" => DaemonMode::Off,
            o => {
                return Err(err(
                    "daemon",
                    "ATTUNE_DAEMON",
                    None,
                    format!("'{o}' (expected auto, require or off)"),
                ))
            }
        },
        None => fc.daemon.unwrap_or(DaemonMode::Auto),
    };
    let socket: std::path::PathBuf = pick(
        "socket",
        "ATTUNE_SOCKET",
        fc.socket.clone(),
        "/run/attune/attuned.sock",
    )
    .into();
    let workflow = pick("workflow", "ATTUNE_WORKFLOW", fc.workflow.clone(), "");
    if workflow.len() > 128 || workflow.bytes().any(|b| !b.is_ascii_graphic()) {
        return Err(err(
            "workflow",
            "ATTUNE_WORKFLOW",
            None,
            "at most 128 printable characters, no spaces".into(),
        ));
    }
    Ok(Config {
        daemon,
        socket,
        workflow,
        dram,
        fault_mode,
        handler_spin_us,
        chunk_size,
        readahead,
        headroom,
        evict_batch: evict_batch as usize,
        inactive_share,
        move_limit,
        small_threshold,
        small_arena,
        pin_fraction,
        sample_rate,
        sample_window_us,
        heat_interval_ms,
        predict_window_ms,
        mode,
        log,
        tiers,
    })
}

/// Loads from the real environment and machine.
///
/// Under secure execution (a set-user-ID program started by another user) the `ATTUNE_*`
/// environment is ignored, with a warning: `ATTUNE_CONFIG` made the program read a file
/// with its own rights (and show it in error messages), `ATTUNE_TIER_FILE_PATH` create and
/// delete files in a directory the user could not write. The program's own `path` and the
/// defaults apply.
pub fn load_from_process(path: Option<&std::path::Path>) -> Result<Config, ConfigError> {
    let secure = attune_sys::os::secure_execution();
    let env: Vec<(String, String)> = std::env::vars()
        .filter(|(k, _)| k.starts_with("ATTUNE_"))
        .collect();
    if secure && !env.is_empty() {
        crate::log::emit(
            crate::log::Level::Warn,
            "set-user-ID or set-group-ID program: the ATTUNE_* environment is ignored \
             (its paths would act with the program's rights); the defaults apply",
        );
        return load(path, &[], &Machine::this());
    }
    load(path, &env, &Machine::this())
}

pub fn validate_chunk(c: usize) -> Result<(), String> {
    if !c.is_power_of_two() || !(4096..=2 << 20).contains(&c) {
        return Err(format!("{c} is not a power of two between 4K and 2M"));
    }
    Ok(())
}

fn parse_bool(s: &str) -> Result<bool, String> {
    match s.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        o => Err(format!("'{o}' is not true or false")),
    }
}

fn expand_vars(s: &str, m: &Machine) -> String {
    s.replace("$TMPDIR", &m.tmpdir.display().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn machine() -> Machine {
        Machine {
            total_memory: 16 << 30,
            tmpdir: std::env::temp_dir(),
        }
    }

    /// The message of the error one environment variable causes.
    fn env_error(file: Option<&std::path::Path>, key: &str, value: &str) -> String {
        load(file, &env(&[(key, value)]), &machine()).unwrap_err().0
    }

    fn env(v: &[(&str, &str)]) -> Vec<(String, String)> {
        v.iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    }

    #[test]
    fn embedded_default_works_with_nothing() {
        let c = load(None, &[], &machine()).unwrap();
        assert_eq!(c.dram, 4 << 30);
        assert_eq!(c.fault_mode, FaultMode::Thread);
        assert_eq!(c.tiers.len(), 2);
        assert_eq!(c.tiers[0].kind, TierKind::Memory);
        assert_eq!(c.tiers[1].kind, TierKind::File);
    }

    #[test]
    fn a_file_tier_moves_16k_chunks_at_least_unless_told_otherwise() {
        let c = load(None, &[], &machine()).unwrap();
        assert_eq!(
            (c.tiers[0].min_chunk, c.tiers[1].min_chunk),
            (4096, 16 << 10)
        );
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.toml");
        let toml = format!(
            "[[tier]]\nname = \"ssd\"\nkind = \"file\"\npath = \"{}\"\nmin_chunk = \"64K\"\n",
            dir.path().display()
        );
        std::fs::write(&p, toml).unwrap();
        let c = load(Some(&p), &[], &machine()).unwrap();
        assert_eq!(c.tiers[0].min_chunk, 64 << 10);
        let c = load(
            Some(&p),
            &env(&[("ATTUNE_TIER_SSD_MIN_CHUNK", "4K")]),
            &machine(),
        )
        .unwrap();
        assert_eq!(c.tiers[0].min_chunk, 4096);
        for bad in ["5K", "4M", "lots"] {
            let e = env_error(Some(&p), "ATTUNE_TIER_SSD_MIN_CHUNK", bad);
            assert!(
                e.contains("ATTUNE_TIER_SSD_MIN_CHUNK") && e.contains("min_chunk"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn env_overrides_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.toml");
        std::fs::write(&p, "dram = \"1G\"\nchunk_size = \"64K\"\n").unwrap();
        let c = load(
            Some(&p),
            &env(&[("ATTUNE_DRAM", "2G"), ("ATTUNE_TIER_MEMORY_CAPACITY", "3G")]),
            &machine(),
        )
        .unwrap();
        assert_eq!(c.dram, 2 << 30);
        assert_eq!(c.chunk_size, 64 << 10);
        assert_eq!(c.tiers[0].capacity, 3 << 30);
    }

    #[test]
    fn sampling_options_are_checked() {
        let ok = load(None, &env(&[("ATTUNE_SAMPLE_RATE", "500")]), &machine()).unwrap();
        assert_eq!((ok.sample_rate, ok.sample_window_us), (500, 20_000));
        for (k, v, want) in [
            ("ATTUNE_SAMPLE_RATE", "fast", "not a whole number"),
            ("ATTUNE_SAMPLE_RATE", "200000", "between 0 and 100000"),
            ("ATTUNE_SAMPLE_WINDOW_US", "10", "between 100 and 10000000"),
            ("ATTUNE_HEAT_INTERVAL_MS", "-5", "not a whole number"),
            ("ATTUNE_HEAT_INTERVAL_MS", "100000", "between 0 and 60000"),
            ("ATTUNE_PREDICT_WINDOW_MS", "soon", "not a whole number"),
            (
                "ATTUNE_PREDICT_WINDOW_MS",
                "4000000",
                "between 0 and 3600000",
            ),
        ] {
            let e = env_error(None, k, v);
            assert!(e.contains(k) && e.contains(want), "{e}");
        }
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("s.toml");
        std::fs::write(&p, "sample_window_us = 50\n").unwrap();
        let e = load(Some(&p), &[], &machine()).unwrap_err().0;
        assert!(
            e.contains("sample_window_us") && e.contains("between"),
            "{e}"
        );
    }

    #[test]
    fn handler_spin_is_checked() {
        assert_eq!(load(None, &[], &machine()).unwrap().handler_spin_us, 100);
        let off = load(None, &env(&[("ATTUNE_HANDLER_SPIN_US", "0")]), &machine()).unwrap();
        assert_eq!(off.handler_spin_us, 0);
        let e = env_error(None, "ATTUNE_HANDLER_SPIN_US", "20000");
        assert!(
            e.contains("ATTUNE_HANDLER_SPIN_US") && e.contains("between 0 and 10000"),
            "{e}"
        );
    }

    #[test]
    fn errors_name_key_and_line() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("bad.toml");
        std::fs::write(&p, "# comment\nchunk_size = \"3K\"\n").unwrap();
        let e = load(Some(&p), &[], &machine()).unwrap_err().0;
        assert!(e.contains("bad.toml:2") && e.contains("chunk_size"), "{e}");

        std::fs::write(&p, "dram = \"1G\"\nbogus = 3\n").unwrap();
        let e = load(Some(&p), &[], &machine()).unwrap_err().0;
        assert!(e.contains("bad.toml:2") && e.contains("bogus"), "{e}");

        std::fs::write(
            &p,
            "[[tier]]\nname = \"fast\"\nkind = \"memory\"\ncapacity = \"12Q\"\n",
        )
        .unwrap();
        let e = load(Some(&p), &[], &machine()).unwrap_err().0;
        assert!(
            e.contains("bad.toml:4") && e.contains("capacity") && e.contains("fast"),
            "{e}"
        );

        let e = load(None, &env(&[("ATTUNE_DRAM", "lots")]), &machine())
            .unwrap_err()
            .0;
        assert!(e.contains("ATTUNE_DRAM"), "{e}");
        let e = load(None, &env(&[("ATTUNE_DRAM", "120%")]), &machine())
            .unwrap_err()
            .0;
        assert!(e.contains("ATTUNE_DRAM"), "{e}");
    }

    #[test]
    fn replacement_and_movement_options() {
        let ok = load(
            None,
            &env(&[
                ("ATTUNE_INACTIVE_SHARE", "10"),
                ("ATTUNE_MOVE_LIMIT", "512M"),
            ]),
            &machine(),
        )
        .unwrap();
        assert_eq!((ok.inactive_share, ok.move_limit), (10, 512 << 20));
        let d = load(None, &[], &machine()).unwrap();
        assert_eq!((d.inactive_share, d.move_limit), (25, 0));
        for (k, v, want) in [
            ("ATTUNE_INACTIVE_SHARE", "95", "between 0 and 90"),
            ("ATTUNE_INACTIVE_SHARE", "a quarter", "not a whole number"),
            ("ATTUNE_MOVE_LIMIT", "fast", "ATTUNE_MOVE_LIMIT"),
        ] {
            let e = env_error(None, k, v);
            assert!(e.contains(k) && e.contains(want), "{k}={v}: {e}");
        }
    }

    #[test]
    fn every_option_is_documented_and_in_env() {
        for o in OPTIONS {
            assert!(o.env.starts_with("ATTUNE_"), "{}", o.key);
            assert!(!o.doc.is_empty() && !o.suggested.is_empty());
        }
    }
}
