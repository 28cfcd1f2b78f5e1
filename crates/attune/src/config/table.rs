//! The options table: one row per option (name, kind and bounds, default, suggested
//! value, meaning). The file format, the environment lookup (`ATTUNE_<KEY>`, and
//! `ATTUNE_TIER_<NAME>_<KEY>` for tiers), the checks and the tables of docs/tuning.md
//! (`attune config --options`) all come from these rows; `load` (in `mod.rs`) only turns
//! checked values into the typed [`Config`](super::Config) and checks what ties two
//! options together (the headroom below the budget, a NUMA tier's node).

use crate::size::{parse_size, parse_size_or_percent};
use serde::Deserialize;

/// Kinds of tier (docs/design/paging.md, "Eviction and the far tiers"; NUMA tiers).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TierKind {
    Dram,
    Memory,
    File,
    Numa,
    /// The node's far pool, held by `attuned` (docs/design/pool.md).
    Pool,
    /// Memory servers on other hosts over libfabric (docs/design/remote.md).
    Remote,
}

impl std::str::FromStr for TierKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "memory" => Ok(TierKind::Memory),
            "file" => Ok(TierKind::File),
            "numa" => Ok(TierKind::Numa),
            "pool" => Ok(TierKind::Pool),
            "remote" => Ok(TierKind::Remote),
            "dram" => Err("the DRAM tier is implicit: set its size with 'dram'".into()),
            o => Err(format!(
                "'{o}' is not a tier kind (expected memory, file, numa, pool or remote)"
            )),
        }
    }
}

/// A chunk size the engine moves: a power of two from 4K to 2M.
pub fn validate_chunk(c: usize) -> Result<(), String> {
    if !c.is_power_of_two() || !(4096..=2 << 20).contains(&c) {
        return Err(format!("{c} is not a power of two between 4K and 2M"));
    }
    Ok(())
}

/// What a percentage is of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Base {
    /// The machine's memory.
    Memory,
    /// The DRAM budget (`dram`).
    Budget,
    /// Memory for a memory tier, free space of the directory for a file tier.
    Medium,
}

/// How a value is written and what it may be.
#[derive(Clone, Copy, Debug)]
pub enum Kind {
    /// Bytes (`4096`, `64K`, `1.5G`), at least `min`.
    Size { min: u64 },
    /// Bytes or a percentage of a base (`25%`), at least `min` bytes.
    SizeOrPercent { of: Base, min: u64 },
    /// A chunk size: a power of two from 4K to 2M.
    Chunk,
    /// A whole number within `[min, max]`.
    Int { min: u64, max: u64 },
    /// A number from 0 to 1.
    Fraction,
    /// One of the words (case ignored); `aliases` name a word otherwise.
    Choice {
        what: &'static str,
        values: &'static [&'static str],
        aliases: &'static [(&'static str, &'static str)],
    },
    /// Printable text without spaces, at most `max` bytes (empty: not set).
    Name { max: usize },
    /// A file or directory.
    Path,
    /// true/false (also 1/0, yes/no, on/off).
    Bool,
    /// One of `words` (case ignored), or a value of `kind`.
    OrWord {
        words: &'static [&'static str],
        kind: &'static Kind,
    },
    /// A percentage within `[min, max]`, with or without `%`.
    Percent { min: u64, max: u64 },
    /// `ADDRESS:PORT` on a loopback address.
    Loopback,
    /// Kernel features turned off: `-move,-poison` (`attune_sys::kernel`).
    KernelMask,
    /// Far tier kinds, comma-separated, each once: `pool,file` (the default tiers).
    TierKinds,
}

/// A checked value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U64(u64),
    F64(f64),
    Bool(bool),
    Text(String),
}

/// The value of an option nobody set.
#[derive(Clone, Copy, Debug)]
pub enum Unset {
    /// A value, written as a user would write it.
    Value(&'static str),
    /// Per tier kind, then the value for every other kind.
    ByKind(&'static [(TierKind, &'static str)], &'static str),
    /// Found when the process starts: what the docs say, and the value that stands for it
    /// in the configuration (`workflow`: empty, named at connection).
    Found(&'static str, &'static str),
    /// Nothing: the option must be given where it applies (a NUMA tier's node).
    Required,
}

/// One option.
pub struct Opt {
    pub key: &'static str,
    pub kind: Kind,
    pub default: Unset,
    pub suggested: &'static str,
    pub doc: &'static str,
}

impl Opt {
    /// Its environment variable.
    pub fn env(&self) -> String {
        format!("ATTUNE_{}", self.key.to_ascii_uppercase())
    }

    /// Its environment variable in tier `name`.
    pub fn tier_env(&self, name: &str) -> String {
        format!(
            "ATTUNE_TIER_{}_{}",
            name.to_ascii_uppercase(),
            self.key.to_ascii_uppercase()
        )
    }

    /// The default as written, for a tier of `kind` (None: no default).
    pub fn default_for(&self, kind: Option<TierKind>) -> Option<&'static str> {
        match self.default {
            Unset::Value(v) => Some(v),
            Unset::ByKind(list, other) => Some(
                kind.and_then(|k| list.iter().find(|(t, _)| *t == k).map(|(_, v)| *v))
                    .unwrap_or(other),
            ),
            Unset::Found(_, v) => Some(v),
            Unset::Required => None,
        }
    }

    /// Checks `raw` (as written in the file or the environment); `base` is what a
    /// percentage is of.
    pub fn parse(&self, raw: &str, base: u64) -> Result<Value, String> {
        parse_kind(&self.kind, raw, base)
    }

    /// What a percentage is of, if the option takes one.
    pub fn base(&self) -> Option<Base> {
        match self.kind {
            Kind::SizeOrPercent { of, .. } => Some(of),
            Kind::OrWord {
                kind: Kind::SizeOrPercent { of, .. },
                ..
            } => Some(*of),
            _ => None,
        }
    }
}

fn parse_kind(kind: &Kind, raw: &str, base: u64) -> Result<Value, String> {
    {
        match *kind {
            Kind::Size { min } => {
                let v = parse_size(raw)?;
                at_least(v, min)
            }
            Kind::SizeOrPercent { min, .. } => {
                let v = parse_size_or_percent(raw, base)?;
                at_least(v, min)
            }
            Kind::Chunk => {
                let v = parse_size(raw)?;
                validate_chunk(v as usize)?;
                Ok(Value::U64(v))
            }
            Kind::Int { min, max } => {
                let v: u64 = raw
                    .trim()
                    .parse()
                    .map_err(|_| format!("'{raw}' is not a whole number"))?;
                if !(min..=max).contains(&v) {
                    return Err(format!("must be between {min} and {max}"));
                }
                Ok(Value::U64(v))
            }
            Kind::Fraction => {
                let v: f64 = raw
                    .trim()
                    .parse()
                    .map_err(|_| format!("'{raw}' is not a number"))?;
                if !(0.0..=1.0).contains(&v) {
                    return Err("must be between 0 and 1".into());
                }
                Ok(Value::F64(v))
            }
            Kind::Choice {
                what,
                values,
                aliases,
            } => {
                let w = raw.trim().to_ascii_lowercase();
                let w = aliases
                    .iter()
                    .find(|(a, _)| *a == w)
                    .map(|(_, v)| v.to_string())
                    .unwrap_or(w);
                if values.contains(&w.as_str()) {
                    Ok(Value::Text(w))
                } else {
                    Err(format!(
                        "'{raw}' is not a {what} (expected {})",
                        or_list(values)
                    ))
                }
            }
            Kind::Name { max } => {
                if raw.len() > max || raw.bytes().any(|b| !b.is_ascii_graphic()) {
                    return Err(format!("at most {max} printable characters, no spaces"));
                }
                Ok(Value::Text(raw.to_string()))
            }
            Kind::Path => {
                if raw.is_empty() {
                    return Err("an empty path".into());
                }
                Ok(Value::Text(raw.to_string()))
            }
            Kind::Bool => match raw.trim().to_ascii_lowercase().as_str() {
                "1" | "true" | "yes" | "on" => Ok(Value::Bool(true)),
                "0" | "false" | "no" | "off" => Ok(Value::Bool(false)),
                o => Err(format!("'{o}' is not true or false")),
            },
            Kind::OrWord { words, kind } => {
                let w = raw.trim().to_ascii_lowercase();
                match words.iter().find(|x| **x == w) {
                    Some(x) => Ok(Value::Text(x.to_string())),
                    None => parse_kind(kind, raw, base)
                        .map_err(|e| format!("{e} (or {})", or_list(words))),
                }
            }
            Kind::Percent { min, max } => {
                let v: u64 = raw
                    .trim()
                    .trim_end_matches('%')
                    .trim()
                    .parse()
                    .map_err(|_| format!("'{raw}' is not a percentage"))?;
                if !(min..=max).contains(&v) {
                    return Err(format!("a percentage from {min} to {max}"));
                }
                Ok(Value::U64(v))
            }
            Kind::Loopback => {
                let a: std::net::SocketAddr = raw
                    .trim()
                    .parse()
                    .map_err(|_| format!("'{raw}': expected ADDRESS:PORT"))?;
                if !a.ip().is_loopback() {
                    return Err(format!("'{raw}': only a loopback address is served"));
                }
                Ok(Value::Text(raw.trim().to_string()))
            }
            Kind::KernelMask => Ok(Value::U64(attune_sys::kernel::parse_mask(raw)?)),
            Kind::TierKinds => {
                if raw.trim() == "auto" {
                    return Ok(Value::Text("auto".into()));
                }
                let mut kinds: Vec<&str> = Vec::new();
                for k in raw.split(',').map(str::trim) {
                    if !DEFAULT_TIER_KINDS.contains(&k) {
                        return Err(format!(
                            "'{k}' is not a far tier kind here (expected auto, or {}; other kinds need [[tier]] tables)",
                            or_list(DEFAULT_TIER_KINDS)
                        ));
                    }
                    if kinds.contains(&k) {
                        return Err(format!("'{k}' is named twice"));
                    }
                    kinds.push(k);
                }
                Ok(Value::Text(kinds.join(",")))
            }
        }
    }
}

fn at_least(v: u64, min: u64) -> Result<Value, String> {
    if v < min {
        return Err(format!(
            "{v} bytes is too small (at least {})",
            crate::size::human(min)
        ));
    }
    Ok(Value::U64(v))
}

fn or_list(values: &[&str]) -> String {
    match values {
        [] => String::new(),
        [one] => one.to_string(),
        [rest @ .., last] => format!("{} or {last}", rest.join(", ")),
    }
}

/// A value as written in the TOML file, as the environment would give it.
pub fn from_toml(v: &toml::Value) -> Result<String, String> {
    match v {
        toml::Value::String(s) => Ok(s.clone()),
        toml::Value::Integer(i) => Ok(i.to_string()),
        toml::Value::Float(f) => Ok(f.to_string()),
        toml::Value::Boolean(b) => Ok(b.to_string()),
        _ => Err("expected a string, a number or true/false".into()),
    }
}

const fn size(min: u64) -> Kind {
    Kind::Size { min }
}
const fn int(min: u64, max: u64) -> Kind {
    Kind::Int { min, max }
}

/// Tier kinds that need no settings of their own, so `far` can name them.
pub const DEFAULT_TIER_KINDS: &[&str] = &["pool", "file", "memory"];

/// Every global option.
#[rustfmt::skip]
pub const OPTIONS: &[Opt] = &[
    Opt { key: "dram", kind: Kind::SizeOrPercent { of: Base::Memory, min: 1 << 20 }, default: Unset::Value("25%"), suggested: "what the job may keep resident, e.g. its cgroup limit minus 10%", doc: "DRAM budget for managed memory: a size (K/M/G) or a percentage of the machine's memory (of the memory cgroup's limit when lower; lowered to that limit less `limit_room`)" },
    Opt { key: "fault_mode", kind: Kind::Choice { what: "fault mode", values: &["thread", "signal"], aliases: &[] }, default: Unset::Value("thread"), suggested: "thread; signal for compute kernels whose managed buffers never reach system calls", doc: "How faults are resolved: thread (handler thread) or signal (the faulting thread, SIGBUS)" },
    Opt { key: "kernel_features", kind: Kind::KernelMask, default: Unset::Value(""), suggested: "empty; -move,-poison to run as on a kernel before 6.6, -all as on 5.10", doc: "Kernel features not to use even where the kernel has them, so their fallbacks run (`attune doctor` lists them and what each costs)" },
    Opt { key: "writeback_gap", kind: int(1, 512), default: Unset::Value("8"), suggested: "8; 512 for devices that take one large write better than several (one piece from the first changed page to the last)", doc: "Clean 4 KiB pages between two changed ones that an eviction to a tier keeping copies (file, remote) writes with them instead of in two pieces" },
    Opt { key: "fills", kind: Kind::Bool, default: Unset::Value("true"), suggested: "true; false to compare", doc: "An evicted chunk whose every 8-byte word is the same (zeros, an array's fill value) is kept as that word instead of being written to a tier that copies (file, pool, remote), and a fault fills it back: nothing written, read or sent (docs/design/paging.md, \"Filled chunks\"). The memory tier moves pages and keeps them" },
    Opt { key: "handler_spin_us", kind: int(0, 10_000), default: Unset::Value("100"), suggested: "100; 0 where every core is busy with the application's own threads", doc: "How long the fault-handler thread (thread delivery) polls for the next fault before it sleeps, when the previous fault came sooner than that (microseconds; 0 = always sleep)" },
    Opt { key: "chunk_size", kind: Kind::Chunk, default: Unset::Value("4K"), suggested: "4K (read-ahead grows what moves on runs of faults); 64K or more only for a tier whose every move costs much", doc: "Default unit of placement and movement, a power of two from 4K to 2M" },
    Opt { key: "readahead", kind: size(0), default: Unset::Value("1M"), suggested: "1M; 0 disables", doc: "Largest read-ahead of one fault on a run of faults (sequential, backward or strided); a fault loads at most 256 KiB from a tier that copies it into place (file, pool, remote)" },
    Opt { key: "huge_pages", kind: Kind::Choice { what: "huge-page mode", values: &["auto", "off"], aliases: &[] }, default: Unset::Value("auto"), suggested: "auto; off to compare, or when the node's memory is too fragmented for 2 MiB pages", doc: "auto: LAT, BW and unflagged regions' 2 MiB spans that are wholly in DRAM go on huge pages while the region gives nothing to the far tiers (up to 256 MiB a second; a move out splits a span again; docs/design/paging.md, \"Huge pages\"); off: 4 KiB pages only" },
    Opt { key: "limit_room", kind: Kind::OrWord { words: &["auto"], kind: &Kind::SizeOrPercent { of: Base::Memory, min: 0 } }, default: Unset::Value("auto"), suggested: "auto; what the program holds outside Attune plus a few MiB, when measured (bench/imme.py does)", doc: "Room a memory cgroup limit keeps for the program's memory Attune does not manage and the runtime's own: the DRAM budget (and in-process far tiers) are lowered to the limit less this; auto = 10% of the limit, at least 32 MiB; a size or a percentage of the limit; no effect without a limit" },
    Opt { key: "follow_limit", kind: Kind::Bool, default: Unset::Value("true"), suggested: "true; false to measure a fixed budget", doc: "Under a memory cgroup limit, read the group's usage every 50 ms (10 ms near the limit) and lower the DRAM budget while what the job holds outside Attune's pages (less reclaimable cache) leaves less than the budget under the limit less a margin (a 32nd of it, 4-64 MiB); raise it back as room returns, never above `dram` or the daemon's grant (docs/design/paging.md, \"Budgets under a memory cgroup\")" },
    Opt { key: "headroom", kind: Kind::SizeOrPercent { of: Base::Budget, min: 0 }, default: Unset::Value("2%"), suggested: "2%-5% of the budget, at least a few MiB", doc: "Free DRAM the background evictor keeps for faults a handler thread resolves (thread delivery; a thread resolving its own fault evicts for itself), and on NUMA tiers the fast-tier memory kept free for promotions by demoting cold unprotected data, as a size or a percentage of the budget" },
    Opt { key: "evict_batch", kind: size(4096), default: Unset::Value("4M"), suggested: "4M", doc: "Bytes evicted per batch, in moves of contiguous runs of at most 2M (a size, not a chunk count: small chunks evict as much per batch as large ones)" },
    Opt { key: "move_limit", kind: size(0), default: Unset::Value("0"), suggested: "0 (none); 1G a second beside latency-sensitive jobs on a shared node", doc: "Most bytes a second this process moves between tiers (fetches and evictions); the node daemon may set a lower one; 0 = no limit" },
    Opt { key: "inactive_share", kind: int(0, 90), default: Unset::Value("25"), suggested: "25; 10 when the working set is known to be stable", doc: "Percent of the pageable budget kept for chunks not (yet) proven hot; the rest may hold chunks that refaulted soon after eviction" },
    Opt { key: "small_threshold", kind: size(0), default: Unset::Value("1M"), suggested: "1M", doc: "Allocations below this size share per-class arenas (mimalloc) instead of getting a region each" },
    Opt { key: "small_arena", kind: size(64 << 20), default: Unset::Value("1G"), suggested: "enough for the program's small managed objects per class", doc: "Virtual size of each small-object arena (one per placement class)" },
    Opt { key: "pin_fraction", kind: Kind::Fraction, default: Unset::Value("0.25"), suggested: "0.1-0.5", doc: "Part of a LAT or SHL region pinned and pre-faulted in DRAM" },
    Opt { key: "sample_rate", kind: int(0, 100_000), default: Unset::Value("0"), suggested: "0; 500-2000 under attune profile", doc: "Access samples per second (a resident chunk parked in the far tier; its next touch is timed); 0 = off" },
    Opt { key: "sample_window_us", kind: int(100, 10_000_000), default: Unset::Value("20000"), suggested: "20000; longer for slow programs", doc: "How long a parked sample waits for a touch before it counts as untouched (microseconds)" },
    Opt { key: "predict_window_ms", kind: int(0, 3_600_000), default: Unset::Value("0"), suggested: "0; 2000-5000 for programs run without flags or history", doc: "Online flag prediction: regions allocated without flags are access-sampled for this long, then a region whose small part takes most accesses gets that part pinned (LAT) and CAP flags for the rest; 0 = off" },
    Opt { key: "heat_interval_ms", kind: int(0, 60_000), default: Unset::Value("200"), suggested: "200; 1000 for regions of many GiB", doc: "How often regions on NUMA tiers are scanned for written pages (write heat: hot far pages are promoted and cold unprotected ones keep the headroom, within move_limit); 0 = off" },
    Opt { key: "daemon", kind: Kind::Choice { what: "daemon mode", values: &["auto", "require", "off"], aliases: &[] }, default: Unset::Value("auto"), suggested: "auto; require on nodes where attuned arbitrates jobs", doc: "Node daemon (attuned): auto (use it when its socket exists), require (fail without it), off" },
    Opt { key: "daemon_wait", kind: int(1, 3600), default: Unset::Value("30"), suggested: "30; more on nodes that start hundreds of instances at once", doc: "Seconds a registration attuned has taken but not answered in its first 2 s is still waited for, on the same connection: meanwhile the program runs on its local budget (daemon = auto) or its start waits (require); then a warning, and a new registration every 0.5 s (docs/design/daemon.md, \"A late welcome\")" },
    Opt { key: "socket", kind: Kind::Path, default: Unset::Value("/run/attune/attuned.sock"), suggested: "the default", doc: "Unix socket of the node daemon" },
    Opt { key: "workflow", kind: Kind::Name { max: 128 }, default: Unset::Found("$SLURM_JOB_ID, else program.pid", ""), suggested: "one name per job (attune run and the Slurm plugin set it)", doc: "Workflow this process belongs to: the daemon grants DRAM per workflow" },
    Opt { key: "far", kind: Kind::TierKinds, default: Unset::Value("auto"), suggested: "auto; memory,file only to emulate far memory in experiments (it stays in the job's RAM)", doc: "Far tiers when the file has no [[tier]] tables: auto (a CPU-less NUMA node, else attuned's pool then a file, else a file on local scratch, O_DIRECT under a memory cgroup limit; never the process's own RAM), or kinds from pool, file, memory, one tier each (with their defaults and ATTUNE_TIER_<KIND>_* variables), used fastest first" },
    Opt { key: "mode", kind: Kind::Choice { what: "mode", values: &["attuned", "temperature"], aliases: &[] }, default: Unset::Value("attuned"), suggested: "attuned", doc: "attuned (flags decide) or temperature (flags ignored: IMME's TME baseline)" },
    Opt { key: "log", kind: Kind::Choice { what: "log level", values: &["error", "warn", "info", "debug"], aliases: &[("warning", "warn")] }, default: Unset::Value("warn"), suggested: "warn", doc: "Messages on stderr: error, warn, info or debug" },
];

/// Options of each `[[tier]]` table.
#[rustfmt::skip]
pub const TIER_OPTIONS: &[Opt] = &[
    Opt { key: "name", kind: Kind::Name { max: 64 }, default: Unset::Required, suggested: "-", doc: "Unique name (letters, digits, _)" },
    Opt { key: "kind", kind: Kind::Choice { what: "tier kind", values: &["memory", "file", "numa", "pool", "remote"], aliases: &[] }, default: Unset::Required, suggested: "-", doc: "memory, file, numa, pool (the node's far pool in attuned), remote (attune memserver on other hosts); the DRAM tier is implicit" },
    Opt { key: "capacity", kind: Kind::SizeOrPercent { of: Base::Medium, min: 0 }, default: Unset::Value("50%"), suggested: "what the medium can spare", doc: "Size, or percentage of machine memory (memory; under a memory cgroup limit, of it, and a memory or numa tier holds at most what the budget leaves of it) or of free space (file)" },
    Opt { key: "path", kind: Kind::Path, default: Unset::Found("$TMPDIR or /tmp", "$TMPDIR"), suggested: "a local NVMe or Lustre directory", doc: "Directory of a file tier (files are private and unnamed)" },
    Opt { key: "direct", kind: Kind::Bool, default: Unset::Value("false"), suggested: "true on NVMe/Lustre with chunks of 64K or more", doc: "Use O_DIRECT for a file tier" },
    Opt { key: "latency_ns", kind: int(0, u64::MAX), default: Unset::ByKind(&[(TierKind::File, "25000"), (TierKind::Numa, "250"), (TierKind::Remote, "15000")], "300"), suggested: "measured", doc: "Declared access latency (orders tiers)" },
    Opt { key: "bandwidth", kind: size(0), default: Unset::ByKind(&[(TierKind::File, "1G"), (TierKind::Numa, "30G"), (TierKind::Remote, "1G")], "10G"), suggested: "measured, bytes/s", doc: "Declared bandwidth in bytes per second (BW plans)" },
    Opt { key: "emulate_delay_ns", kind: int(0, u64::MAX), default: Unset::Value("0"), suggested: "0; 2000-5000 to model a remote pool", doc: "Extra delay added to every fetch from a memory tier" },
    Opt { key: "emulate_bandwidth", kind: size(0), default: Unset::Value("0"), suggested: "0 (off); e.g. 2G to model a slower link", doc: "Bandwidth cap of fetches from a memory tier, bytes/s" },
    Opt { key: "min_chunk", kind: Kind::Chunk, default: Unset::ByKind(&[(TierKind::File, "16K")], "4K"), suggested: "16K for a file tier; 64K if the tier is only streamed", doc: "Least chunk size of regions whose home is this tier (one I/O costs about as much for 16K as for 4K); the file tier that far = auto makes keeps 4K (read-ahead grows what sequential faults move)" },
    Opt { key: "node", kind: int(0, 4095), default: Unset::Required, suggested: "the CPU-less node of the CXL device", doc: "NUMA node of a numa tier" },
    Opt { key: "servers", kind: Kind::Name { max: 4096 }, default: Unset::Required, suggested: "the job's memory servers", doc: "Memory servers of a remote tier: HOST:PORT,HOST:PORT,... (pages are spread over them by 64 KiB unit)" },
    Opt { key: "secret_file", kind: Kind::Path, default: Unset::Required, suggested: "a 0600 file the job made (attune memserver --new-secret)", doc: "The job's secret for a remote tier: a file only its owner can read" },
    Opt { key: "provider", kind: Kind::Name { max: 64 }, default: Unset::Value("tcp"), suggested: "verbs, efa or cxi on a cluster; tcp elsewhere", doc: "libfabric provider of a remote tier; tcp opens libfabric 1.17's net provider (native RDM over TCP, tcp from 1.18), tcp;ofi_rxm the layered one" },
    Opt { key: "concurrency", kind: int(1, 64), default: Unset::Value("32"), suggested: "32; 64 where more threads fault at once (`python3 bench/rmap.py --only concurrency`)", doc: "Loads and stores of a remote tier in flight at once (each cut into requests to the servers that own its units, all sent together); more wait for one to end. Under thread delivery the handler thread has one fault in flight at a time; under signal delivery each faulting thread has its own" },
    Opt { key: "ahead", kind: int(0, 4), default: Unset::Value("2"), suggested: "2; 0 where loads are seldom sequential", doc: "Windows of 256 KiB a remote tier fetches ahead of each stream of loads (a load that starts where an earlier one ended), so that the next fault finds its pages arrived or on their way; 0: none. Off below a concurrency of 4" },
    Opt { key: "replicas", kind: int(1, 8), default: Unset::Value("2"), suggested: "2 (a server may die); 1 to halve what the servers hold", doc: "Copies of each page of a remote tier, each on another server (at most the number of servers)" },
    Opt { key: "rehome_ms", kind: int(0, 86_400_000), default: Unset::Value("10000"), suggested: "10000; 0 where a lost server always comes back", doc: "A remote server lost this long is given up on: its copies are placed on the other live servers (one holding no other copy of the same pages) and made there from the live copies; one back sooner keeps its place (0: they always wait for it)" },
    Opt { key: "timeout_ms", kind: int(10, 3_600_000), default: Unset::Value("5000"), suggested: "5000", doc: "A remote request unanswered for 2 s (half this at most) is sent again from a new endpoint; a server that then leaves its hello there unanswered this long is lost (a dead server or a cut link)" },
];

/// The row of `key` in `table`.
pub fn row(table: &'static [Opt], key: &str) -> Option<&'static Opt> {
    table.iter().find(|o| o.key == key)
}

/// The default as the docs give it.
pub fn default_doc(o: &Opt) -> String {
    match o.default {
        Unset::Value(v) => v.to_string(),
        Unset::ByKind(list, other) => {
            let mut parts: Vec<String> = list
                .iter()
                .map(|(k, v)| format!("{}: {v}", kind_name(*k)))
                .collect();
            parts.push(format!("others: {other}"));
            parts.join(", ")
        }
        Unset::Found(doc, _) => doc.to_string(),
        Unset::Required => "-".into(),
    }
}

fn kind_name(k: TierKind) -> &'static str {
    match k {
        TierKind::Dram => "dram",
        TierKind::Memory => "memory",
        TierKind::File => "file",
        TierKind::Numa => "numa",
        TierKind::Pool => "pool",
        TierKind::Remote => "remote",
    }
}

/// What a value may be, for the docs.
fn kind_doc(o: &Opt) -> String {
    doc_of(&o.kind)
}

fn doc_of(kind: &Kind) -> String {
    match *kind {
        Kind::Size { min: 0 } => "size".into(),
        Kind::Size { min } => format!("size, at least {}", crate::size::human(min)),
        Kind::SizeOrPercent { of, .. } => format!(
            "size or % of {}",
            match of {
                Base::Memory => "memory",
                Base::Budget => "`dram`",
                Base::Medium => "the medium",
            }
        ),
        Kind::Chunk => "power of two, 4K-2M".into(),
        Kind::Int { min, max: u64::MAX } => format!("integer ≥ {min}"),
        Kind::Int { min, max } => format!("integer {min}-{max}"),
        Kind::Fraction => "0-1".into(),
        Kind::Choice { values, .. } => values.join(" \\| "),
        Kind::Name { max } => format!("name, ≤ {max} characters"),
        Kind::Path => "path".into(),
        Kind::Bool => "true/false".into(),
        Kind::OrWord { words, kind } => format!("{} or {}", doc_of(kind), words.join(", ")),
        Kind::Percent { min, max } => format!("percent {min}-{max}"),
        Kind::Loopback => "loopback ADDRESS:PORT".into(),
        Kind::KernelMask => {
            "-feature,... (move, poison, wp_async, pagemap_scan, weighted_interleave, soft_dirty, all)".into()
        }
        Kind::TierKinds => format!(
            "auto, or kinds from {}, comma-separated",
            DEFAULT_TIER_KINDS.join(", ")
        ),
    }
}

/// One Markdown table of options; `how` names the column (environment, flag) and `env`
/// fills it for each row.
pub fn markdown(table: &[Opt], how: &str, env: impl Fn(&Opt) -> String) -> String {
    let mut s = format!(
        "| option | {how} | value | default | suggested | meaning |\n|---|---|---|---|---|---|\n",
    );
    for o in table {
        s += &format!(
            "| `{}` | `{}` | {} | {} | {} | {} |\n",
            o.key,
            env(o),
            kind_doc(o),
            default_doc(o),
            o.suggested,
            o.doc
        );
    }
    s
}
