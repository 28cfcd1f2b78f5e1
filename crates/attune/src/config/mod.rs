//! Configuration: one TOML file, every option also an environment variable, and an
//! embedded default that works on any Linux machine with no file at all.
//!
//! Precedence: embedded default < file (`ATTUNE_CONFIG` or `attune_init(path)`) < environment.
//! [`OPTIONS`] is the one table of options; `docs/tuning.md` and `attune config --options`
//! are generated from it.

pub mod table;

use serde::Deserialize;
use std::path::PathBuf;
use table::{from_toml, Base, Value};
pub use table::{markdown, row, validate_chunk, Opt, TierKind, OPTIONS, TIER_OPTIONS};

/// How a region's faults are delivered (see docs/design/paging.md, "The fault path").
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

/// Whether resident spans may go on 2 MiB pages (`attune_policy::huge`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum HugePages {
    Auto,
    Off,
}

impl std::str::FromStr for HugePages {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(HugePages::Auto),
            "off" => Ok(HugePages::Off),
            other => Err(format!(
                "'{other}' is not a huge-page mode (expected auto or off)"
            )),
        }
    }
}

impl std::str::FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "attuned" => Ok(Mode::Attuned),
            "temperature" => Ok(Mode::Temperature),
            o => Err(format!(
                "'{o}' is not a mode (expected attuned or temperature)"
            )),
        }
    }
}

impl std::str::FromStr for DaemonMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(DaemonMode::Auto),
            "require" => Ok(DaemonMode::Require),
            "off" => Ok(DaemonMode::Off),
            o => Err(format!(
                "'{o}' is not a daemon mode (expected auto, require or off)"
            )),
        }
    }
}

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
    /// A remote tier's servers (`HOST:PORT,...`: [`TierConfig::server_list`]), its
    /// secret file, provider and timeout.
    pub servers: String,
    pub secret_file: Option<PathBuf>,
    pub provider: String,
    pub timeout_ms: u64,
    pub replicas: u64,
    /// A remote server lost this long is given up on: its copies go to the others.
    pub rehome_ms: u64,
    /// A remote tier's jobs (loads and stores) in flight at once.
    pub concurrency: usize,
    /// Windows a remote tier fetches ahead of each stream of loads (0: none).
    pub ahead: usize,
}

impl TierConfig {
    fn split_servers(s: &str) -> Vec<&str> {
        s.split(',').filter(|x| !x.is_empty()).collect()
    }

    /// A remote tier's servers, `HOST:PORT` each.
    pub fn server_list(&self) -> Vec<&str> {
        TierConfig::split_servers(&self.servers)
    }
}

/// The resolved configuration.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Config {
    pub dram: u64,
    pub fault_mode: FaultMode,
    /// Microseconds the handler thread polls before sleeping (`fault::handler_loop`).
    pub handler_spin_us: u64,
    /// `attune_policy::writeback::pieces`'s gap (4 KiB pages).
    pub writeback_gap: usize,
    /// Evicted chunks of one repeated word are kept as that word (`paging::fill`).
    pub fills: bool,
    /// Kernel features masked off (`attune_sys::kernel` bits), so their fallbacks run.
    pub kernel_features: u64,
    pub chunk_size: usize,
    pub readahead: usize,
    pub huge_pages: HugePages,
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
    /// Seconds a registration the daemon took is still waited for after the start's 2 s
    /// (`daemon_wait`).
    pub daemon_wait: u64,
    /// Kinds of the default far tiers (`far`), used when the file lists no tiers.
    pub far: String,
    /// Why these far tiers: the configuration's, or what `far = "auto"` found
    /// (`attune_policy::far::choose`), for the log, the run report and `attune topology`.
    pub far_reason: String,
    /// `far = "auto"` had to keep far pages in RAM (scratch only on tmpfs).
    #[serde(skip)]
    pub far_warning: Option<String>,
    pub socket: std::path::PathBuf,
    /// Empty: derived at connection (`tmm::workflow_name`).
    pub workflow: String,
    pub log: crate::log::Level,
    /// Far tiers, fastest first.
    pub tiers: Vec<TierConfig>,
    /// Room a memory cgroup limit keeps for what Attune does not manage (resolved bytes).
    pub limit_room: u64,
    /// The budget follows the memory cgroup's usage (`paging::limit`).
    pub follow_limit: bool,
    /// What the memory cgroup's limit lowered or left out (`Machine::limit_for_managed`),
    /// for the start's warnings.
    #[serde(skip)]
    pub limit_notes: Vec<String>,
}

impl Config {
    /// The far tiers and why they are these, one line: "file in /tmp, O_DIRECT (auto: ...)".
    pub fn far_summary(&self) -> String {
        let tiers: Vec<String> = self
            .tiers
            .iter()
            .map(|t| match &t.path {
                Some(p) => format!(
                    "{} in {}{}",
                    t.name,
                    p.display(),
                    if t.direct { ", O_DIRECT" } else { "" }
                ),
                None => t.name.clone(),
            })
            .collect();
        format!("{} ({})", tiers.join(", "), self.far_reason)
    }
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

/// Far tiers a configuration may name: the tier indices a chunk's state can hold, less
/// `region::FILLED`.
pub const MAX_FAR_TIERS: usize = crate::region::FILLED;

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
    /// The tightest memory limit of the process's cgroup and its ancestors (u64::MAX: none).
    pub memory_limit: u64,
    pub tmpdir: PathBuf,
    /// What the node offers as far memory, for `far = "auto"`; None: looked up on this
    /// machine when (and only when) a configuration asks for `auto` (the daemon's socket
    /// is looked at then too: it is an option).
    pub far_offer: Option<attune_policy::far::Offer>,
}

impl Machine {
    pub fn this() -> Machine {
        let tmpdir = std::env::var_os("TMPDIR")
            .map(PathBuf::from)
            .filter(|p| p.is_dir())
            .unwrap_or_else(|| PathBuf::from("/tmp"));
        let cgroup = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        Machine {
            total_memory: attune_sys::os::total_memory(),
            memory_limit: crate::topology::cgroup_memory_limit(&cgroup, &|p| {
                std::fs::read_to_string(p).ok()
            }),
            far_offer: None,
            tmpdir,
        }
    }

    /// The memory this process may use: the machine's, or its cgroup's limit if lower.
    pub fn usable_memory(&self) -> u64 {
        self.total_memory.min(self.memory_limit)
    }

    /// The room `limit_room = "auto"` keeps under a cgroup limit for the program's own
    /// memory and the runtime's: the larger of 10% and 32 MiB, as the Slurm plugin leaves
    /// under `--mem` (docs/design/slurm.md), computed as the plugin does (`limit / 100 *
    /// 10`) so its default budget is never lowered by a few bytes with a warning.
    pub fn default_limit_room(&self) -> u64 {
        (self.usable_memory() / 100 * 10).max(32 << 20)
    }

    /// What managed memory may take under the cgroup limit (u64::MAX: no limit): the limit
    /// less `room` (None: the default room). Past the limit the kernel reclaims the job's
    /// page cache, then kills it, before the evictor acts.
    pub fn limit_for_managed(&self, room: Option<u64>) -> u64 {
        if self.memory_limit == u64::MAX {
            return u64::MAX;
        }
        let room = room.unwrap_or_else(|| self.default_limit_room());
        self.memory_limit.saturating_sub(room).max(1 << 20)
    }
}

/// The file system class of `magic` (`statfs`'s `f_type`): RAM, network or local.
pub fn fs_class(magic: u64) -> attune_policy::far::FsClass {
    use attune_policy::far::FsClass;
    const TMPFS: u64 = 0x0102_1994;
    const RAMFS: u64 = 0x8584_58f6;
    const NFS: u64 = 0x6969;
    const SMB2: u64 = 0xfe53_4d42;
    const CIFS: u64 = 0xff53_4d42;
    const LUSTRE: u64 = 0x0bd0_0bd0;
    const GPFS: u64 = 0x4750_4653;
    const BEEGFS: u64 = 0x1996_0209;
    const CEPH: u64 = 0x00c3_6400;
    const FUSE: u64 = 0x6573_5546;
    match magic {
        TMPFS | RAMFS => FsClass::Memory,
        NFS | SMB2 | CIFS | LUSTRE | GPFS | BEEGFS | CEPH | FUSE => FsClass::Network,
        _ => FsClass::Local,
    }
}

/// Where a process's scratch files may go, in the order they are tried: $TMPDIR (`tmpdir`),
/// then /tmp and /var/tmp. The far tier's scratch (`far = "auto"`) and `attune run`'s
/// statistics directory both take the first that serves.
pub fn scratch_dirs(tmpdir: &std::path::Path) -> [PathBuf; 3] {
    [tmpdir.to_path_buf(), "/tmp".into(), "/var/tmp".into()]
}

/// The node's far memory as `far = "auto"` weighs it: CPU-less NUMA nodes with memory,
/// and the scratch directories ($TMPDIR, then /tmp and /var/tmp) by file system class.
fn far_offer(tmpdir: &std::path::Path) -> attune_policy::far::Offer {
    let topo = crate::topology::discover(std::path::Path::new("/"));
    let cpuless_nodes = topo
        .nodes
        .iter()
        .filter(|n| !n.has_cpus && n.mem_total > 0)
        .map(|n| n.id)
        .collect();
    let mut scratch: Vec<attune_policy::far::Scratch> = Vec::new();
    for d in scratch_dirs(tmpdir) {
        let d = d.as_path();
        let path = d.display().to_string();
        if !d.is_dir() || scratch.iter().any(|s| s.path == path) {
            continue;
        }
        // Only a directory where this user can make the tier's file (a $TMPDIR of another
        // user, a read-only mount, /proc): the file tier would fail at its first store.
        if attune_sys::mem::open_private_file(d, false).is_err() {
            continue;
        }
        if let Ok(magic) = attune_sys::os::fs_magic(d) {
            scratch.push(attune_policy::far::Scratch {
                path,
                fs: fs_class(magic),
            });
        }
    }
    attune_policy::far::Offer {
        cpuless_nodes,
        daemon: false,
        scratch,
        memory_limit: false,
    }
}

/// The checked values of one table (global options, or one tier's), by key.
struct Values {
    table: &'static [Opt],
    values: Vec<(&'static str, Value)>,
}

impl Values {
    fn get(&self, key: &str) -> Option<&Value> {
        debug_assert!(row(self.table, key).is_some(), "no option {key}");
        self.values.iter().find(|(k, _)| *k == key).map(|(_, v)| v)
    }
    fn u64(&self, key: &str) -> u64 {
        match self.get(key) {
            Some(Value::U64(v)) => *v,
            _ => 0,
        }
    }
    fn f64(&self, key: &str) -> f64 {
        match self.get(key) {
            Some(Value::F64(v)) => *v,
            _ => 0.0,
        }
    }
    fn bool(&self, key: &str) -> bool {
        matches!(self.get(key), Some(Value::Bool(true)))
    }
    fn text(&self, key: &str) -> &str {
        match self.get(key) {
            Some(Value::Text(v)) => v,
            _ => "",
        }
    }
    /// A choice turned into its enum (the table checked the word already).
    fn choice<T: std::str::FromStr>(&self, key: &str) -> Result<T, ConfigError> {
        self.text(key)
            .parse()
            .map_err(|_| ConfigError(format!("key '{key}': '{}' is not handled", self.text(key))))
    }
}

/// Loads the configuration: embedded default, then `path` (or `$ATTUNE_CONFIG`), then the
/// environment `env` (a snapshot of variables, so tests need not touch the process's).
/// Every option is read through its row of [`OPTIONS`] or [`TIER_OPTIONS`].
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
    match &file_path {
        Some(p) => {
            let text = std::fs::read_to_string(p).map_err(|e| {
                ConfigError(format!(
                    "cannot read configuration file {}: {}",
                    p.display(),
                    attune_sys::io_error_text(&e)
                ))
            })?;
            load_text(Some((&p.display().to_string(), &text)), env, m)
        }
        None => load_text(None, env, m),
    }
}

/// [`load`] with the file's text given (`(name, text)`, the name for messages): reads no
/// file, so the configuration fuzz target and tests drive it with any text.
pub fn load_text(
    file: Option<(&str, &str)>,
    env: &[(String, String)],
    m: &Machine,
) -> Result<Config, ConfigError> {
    let getenv = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    let (file, text, pname) = match file {
        Some((name, text)) => {
            let table: toml::Table = text.parse().map_err(|e: toml::de::Error| {
                let line = e
                    .span()
                    .map(|s| text[..s.start.min(text.len())].matches('\n').count() + 1)
                    .unwrap_or(0);
                ConfigError(format!("{name}:{line}: {}", e.message()))
            })?;
            (table, text.to_string(), name.to_string())
        }
        None => (toml::Table::new(), String::new(), String::new()),
    };
    let origin = |key: &str, env_name: &str, tier: Option<&str>| -> Origin {
        if getenv(env_name).is_some() {
            Origin::Env(env_name.to_string())
        } else if !pname.is_empty() && line_of(&text, key, tier) > 0 {
            Origin::File {
                path: pname.clone(),
                line: line_of(&text, key, tier),
            }
        } else {
            Origin::Default
        }
    };
    let err = |key: &str, env_name: &str, tier: Option<&str>, msg: String| -> ConfigError {
        let what = match tier {
            Some(t) => format!("tier '{t}' key '{key}'"),
            None => format!("key '{key}'"),
        };
        ConfigError(format!("{}: {what}: {msg}", origin(key, env_name, tier)))
    };
    // Keys the table does not know are refused, with their line.
    let unknown = |key: &str, tier: Option<&str>, table: &[Opt]| -> ConfigError {
        let known: Vec<&str> = table.iter().map(|o| o.key).collect();
        ConfigError(format!(
            "{}:{}: unknown option `{key}`{} (options: {})",
            pname,
            line_of(&text, key, tier),
            tier.map(|t| format!(" in tier '{t}'")).unwrap_or_default(),
            known.join(", ")
        ))
    };
    for key in file.keys() {
        if key != "tier" && row(OPTIONS, key).is_none() {
            return Err(unknown(key, None, OPTIONS));
        }
    }

    // One table's values: environment over file over default, each checked by its row.
    // `base` says what a percentage is of (for each base the row may name).
    let read = |table: &'static [Opt],
                file: &toml::Table,
                tier: Option<(&str, TierKind)>,
                base: &dyn Fn(Base) -> u64|
     -> Result<Values, ConfigError> {
        let mut values = Vec::new();
        for o in table {
            let env_name = match tier {
                Some((name, _)) => o.tier_env(name),
                None => o.env(),
            };
            let tname = tier.map(|t| t.0);
            let raw = match (getenv(&env_name), file.get(o.key)) {
                (Some(v), _) if tier.is_none() || !matches!(o.key, "name" | "kind") => Some(v),
                (_, Some(v)) => Some(from_toml(v).map_err(|e| err(o.key, &env_name, tname, e))?),
                _ => o.default_for(tier.map(|t| t.1)).map(|s| s.to_string()),
            };
            let Some(raw) = raw else { continue };
            let raw = expand_vars(&raw, m);
            let b = o.base().map(base).unwrap_or(0);
            let v = o
                .parse(&raw, b)
                .map_err(|e| err(o.key, &env_name, tname, e))?;
            values.push((o.key, v));
        }
        Ok(Values { table, values })
    };
    // `dram` first: the headroom's percentage is of it. Percentages of "the machine's
    // memory" are of what this process may use (its cgroup's limit when lower), and
    // managed memory that the process's own pages hold (the budget, memory and NUMA tiers)
    // stays under the limit: past it the kernel kills the program before the evictor acts.
    let usable = m.usable_memory();
    let room_row = row(OPTIONS, "limit_room").expect("limit_room is an option");
    let room =
        match read(std::slice::from_ref(room_row), &file, None, &|_| usable)?.get("limit_room") {
            Some(Value::U64(r)) => Some(*r),
            _ => None,
        };
    let cap = m.limit_for_managed(room);
    let mut limit_notes = Vec::new();
    let dram_row = row(OPTIONS, "dram").expect("dram is an option");
    let dram_only = read(std::slice::from_ref(dram_row), &file, None, &|_| usable)?;
    let mut dram = dram_only.u64("dram");
    if dram > cap {
        limit_notes.push(format!(
            "the DRAM budget ({dram} bytes) does not fit this process's memory cgroup limit \
             ({} bytes, less room for the program's own memory): lowered to {cap} bytes",
            m.memory_limit
        ));
        dram = cap;
    }
    let mut charged = dram;
    let g = read(OPTIONS, &file, None, &|b| match b {
        Base::Budget => dram,
        _ => usable,
    })?;
    let headroom = g.u64("headroom");
    if headroom >= dram {
        let lowered = if limit_notes.is_empty() {
            String::new()
        } else {
            format!(" ({dram} bytes, lowered by the memory cgroup's limit)")
        };
        return Err(err(
            "headroom",
            "ATTUNE_HEADROOM",
            None,
            format!("must be smaller than the DRAM budget{lowered}"),
        ));
    }

    // Tiers: the file's list, or one of each kind `far` names (by default a memory tier and
    // a file tier). Both at once would leave one of them ignored: refused.
    let far_set = !matches!(origin("far", "ATTUNE_FAR", None), Origin::Default);
    if far_set && file.contains_key("tier") {
        return Err(err(
            "far",
            "ATTUNE_FAR",
            None,
            format!(
                "{pname} lists [[tier]] tables: name the far tiers in one place, either there or in `far`"
            ),
        ));
    }
    let mut far_reason = format!("named in {pname}");
    let mut far_warning = None;
    let kind_table = |k: &str| {
        let mut t = toml::Table::new();
        t.insert("name".into(), toml::Value::String(k.to_string()));
        t.insert("kind".into(), toml::Value::String(k.to_string()));
        t
    };
    let file_tiers: Vec<toml::Table> = match file.get("tier") {
        None if g.text("far") == "auto" => {
            let daemon: DaemonMode = g.choice("daemon")?;
            let socket = std::path::Path::new(g.text("socket"));
            let offer = attune_policy::far::Offer {
                daemon: daemon != DaemonMode::Off && is_socket(socket),
                memory_limit: m.memory_limit != u64::MAX,
                ..m.far_offer.clone().unwrap_or_else(|| far_offer(&m.tmpdir))
            };
            let choice = attune_policy::far::choose(&offer);
            far_reason = format!("auto: {}", choice.reason);
            far_warning = choice.warning;
            choice
                .tiers
                .iter()
                .map(|ft| {
                    let mut t = kind_table(ft.kind());
                    match ft {
                        attune_policy::far::FarTier::Numa { node } => {
                            t.insert("node".into(), toml::Value::Integer(i64::from(*node)));
                        }
                        attune_policy::far::FarTier::File { path, direct } => {
                            t.insert("path".into(), toml::Value::String(path.clone()));
                            t.insert("direct".into(), toml::Value::Boolean(*direct));
                            // The default's unit stays 4 KiB with read-ahead learned per
                            // stream: the file kind's 16 KiB floor predates that read-ahead
                            // (docs/design/paging.md, "The default far tier").
                            t.insert("min_chunk".into(), toml::Value::String("4K".into()));
                        }
                        attune_policy::far::FarTier::Pool => {}
                    }
                    t
                })
                .collect()
        }
        None => {
            far_reason = format!("far = \"{}\"", g.text("far"));
            g.text("far").split(',').map(kind_table).collect()
        }
        Some(toml::Value::Array(a)) => a
            .iter()
            .map(|t| match t {
                toml::Value::Table(t) => Ok(t.clone()),
                _ => Err(ConfigError(format!(
                    "{pname}:{}: each tier is a [[tier]] table",
                    line_of(&text, "tier", None)
                ))),
            })
            .collect::<Result<_, _>>()?,
        Some(_) => {
            return Err(ConfigError(format!(
                "{pname}:{}: `tier` is a list of [[tier]] tables",
                line_of(&text, "tier", None)
            )))
        }
    };
    let mut tiers: Vec<TierConfig> = Vec::new();
    for ft in &file_tiers {
        let name = match ft.get("name") {
            Some(toml::Value::String(s)) => s.clone(),
            _ => String::new(),
        };
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(err(
                "name",
                "-",
                None,
                format!("'{name}' is not a tier name (letters, digits, _)"),
            ));
        }
        if tiers.iter().any(|t| t.name == name) {
            return Err(err(
                "name",
                "-",
                Some(&name),
                "tier names must be unique".into(),
            ));
        }
        if let Some(k) = ft.keys().find(|k| row(TIER_OPTIONS, k).is_none()) {
            return Err(unknown(k, Some(&name), TIER_OPTIONS));
        }
        let kind: TierKind = match ft.get("kind").map(from_toml) {
            Some(Ok(k)) => k.parse().map_err(|e| err("kind", "-", Some(&name), e))?,
            _ => return Err(err("kind", "-", Some(&name), "a tier needs a kind".into())),
        };
        // The path first: a file tier's capacity percentage is of its free space.
        let path_row = row(TIER_OPTIONS, "path").expect("path is a tier option");
        let t0 = read(
            std::slice::from_ref(path_row),
            ft,
            Some((&name, kind)),
            &|_| 0,
        )?;
        let path = match kind {
            TierKind::File => {
                let p = PathBuf::from(t0.text("path"));
                if !p.is_dir() {
                    return Err(err(
                        "path",
                        &path_row.tier_env(&name),
                        Some(&name),
                        format!("'{}' is not a directory", p.display()),
                    ));
                }
                Some(p)
            }
            _ => None,
        };
        let medium = match kind {
            TierKind::File => attune_sys::os::fs_available(path.as_deref().unwrap()).unwrap_or(0),
            _ => usable,
        };
        let t = read(TIER_OPTIONS, ft, Some((&name, kind)), &|_| medium)?;
        let node = t.get("node").map(|_| t.u64("node") as u32);
        if kind == TierKind::Numa && node.is_none() {
            return Err(err(
                "node",
                &row(TIER_OPTIONS, "node").unwrap().tier_env(&name),
                Some(&name),
                "a numa tier needs a node".into(),
            ));
        }
        let servers = t
            .get("servers")
            .map_or(String::new(), |_| t.text("servers").to_string());
        let secret_file = t
            .get("secret_file")
            .map(|_| PathBuf::from(t.text("secret_file")));
        if kind == TierKind::Remote {
            let need = |key: &str, what: &str| {
                err(
                    key,
                    &row(TIER_OPTIONS, key).unwrap().tier_env(&name),
                    Some(&name),
                    what.into(),
                )
            };
            let list = TierConfig::split_servers(&servers);
            if list.is_empty() {
                return Err(need(
                    "servers",
                    "a remote tier needs its servers (HOST:PORT,...)",
                ));
            }
            if let Some(s) = list.iter().find(|s| {
                s.rsplit_once(':')
                    .map_or(true, |(h, p)| h.is_empty() || p.parse::<u16>().is_err())
            }) {
                return Err(need("servers", &format!("'{s}' is not HOST:PORT")));
            }
            if secret_file.is_none() {
                return Err(need(
                    "secret_file",
                    "a remote tier needs the job's secret file",
                ));
            }
        }
        let mut capacity = t.u64("capacity");
        if matches!(kind, TierKind::Memory | TierKind::Numa) {
            // Its pages are the process's own, charged to its cgroup like the budget's.
            let left = cap.saturating_sub(charged);
            if capacity > left && left < (1 << 20) {
                limit_notes.push(format!(
                    "far tier '{name}' is left out: its pages count against this process's \
                     memory cgroup limit ({} bytes), which the DRAM budget fills",
                    m.memory_limit
                ));
                continue;
            }
            if capacity > left {
                limit_notes.push(format!(
                    "far tier '{name}' holds at most {left} bytes, not {capacity}: its pages \
                     count against this process's memory cgroup limit ({} bytes) with the \
                     DRAM budget's",
                    m.memory_limit
                ));
                capacity = left;
            }
            charged = charged.saturating_add(capacity);
        }
        tiers.push(TierConfig {
            name,
            kind,
            capacity,
            path,
            direct: t.bool("direct"),
            latency_ns: t.u64("latency_ns"),
            bandwidth: t.u64("bandwidth"),
            emulate_delay_ns: t.u64("emulate_delay_ns"),
            emulate_bandwidth: t.u64("emulate_bandwidth"),
            min_chunk: t.u64("min_chunk") as usize,
            node,
            servers,
            secret_file,
            provider: t.text("provider").to_string(),
            timeout_ms: t.u64("timeout_ms"),
            replicas: t.u64("replicas"),
            rehome_ms: t.u64("rehome_ms"),
            concurrency: t.u64("concurrency") as usize,
            ahead: t.u64("ahead") as usize,
        });
    }
    tiers.sort_by_key(|t| t.latency_ns);
    let far = tiers
        .iter()
        .filter(|t| !matches!(t.kind, TierKind::Numa | TierKind::Dram))
        .count();
    if far > MAX_FAR_TIERS {
        return Err(ConfigError(format!(
            "{far} far tiers: at most {MAX_FAR_TIERS} (a chunk's state names its tier in 4 bits, one of which values says no tier holds it)"
        )));
    }
    Ok(Config {
        dram,
        fills: g.bool("fills"),
        fault_mode: g.choice("fault_mode")?,
        handler_spin_us: g.u64("handler_spin_us"),
        writeback_gap: g.u64("writeback_gap") as usize,
        kernel_features: g.u64("kernel_features"),
        chunk_size: g.u64("chunk_size") as usize,
        readahead: g.u64("readahead") as usize,
        huge_pages: g.choice("huge_pages")?,
        headroom,
        evict_batch: g.u64("evict_batch") as usize,
        move_limit: g.u64("move_limit"),
        inactive_share: g.u64("inactive_share"),
        small_threshold: g.u64("small_threshold") as usize,
        small_arena: g.u64("small_arena") as usize,
        pin_fraction: g.f64("pin_fraction"),
        sample_rate: g.u64("sample_rate"),
        sample_window_us: g.u64("sample_window_us"),
        heat_interval_ms: g.u64("heat_interval_ms"),
        predict_window_ms: g.u64("predict_window_ms"),
        mode: g.choice("mode")?,
        daemon: g.choice("daemon")?,
        daemon_wait: g.u64("daemon_wait"),
        far: g.text("far").to_string(),
        far_reason,
        far_warning,
        socket: g.text("socket").into(),
        workflow: g.text("workflow").to_string(),
        log: g.choice("log")?,
        tiers,
        limit_room: room.unwrap_or_else(|| m.default_limit_room()),
        follow_limit: g.bool("follow_limit"),
        limit_notes,
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
    let m = Machine::this();
    let cfg = load(path, &env, &m)?;
    for w in warnings(&cfg, &env, &m) {
        crate::log::emit(crate::log::Level::Warn, &w);
    }
    Ok(cfg)
}

/// `attune run --staged NAME` gives each staged input's path in `ATTUNE_STAGED_<NAME>`
/// (`attune stage`'s `env_name`): the launcher's own variables, never warned about.
pub const STAGED_PREFIX: &str = "ATTUNE_STAGED_";

/// `ATTUNE_*` variables that are not options: the launcher's, the lab's and the tests'.
const OTHER_VARIABLES: &[&str] = &[
    "ATTUNE_CONFIG",
    "ATTUNE_DISABLE_UFFD",
    "ATTUNE_USERFAULTFD_FD",
    "ATTUNE_INJECT",
    "ATTUNE_CLI",
    "ATTUNE_BIN",
    "ATTUNE_PYTHON",
    "ATTUNE_PYTHONPATH",
    "ATTUNE_PRELOAD_LIB",
    "ATTUNE_BENCH_CGROUP",
    "ATTUNE_BENCH_SCALE",
    "ATTUNE_BENCH_SWAP_DIR",
    "ATTUNE_BENCH_FAR",
    "ATTUNE_GUEST_CACHE",
];

/// What a loaded configuration should be warned about, but still runs with: `ATTUNE_*`
/// variables that name no option (a misspelling would otherwise be ignored without a
/// word), and a DRAM budget above the machine's memory.
pub fn warnings(cfg: &Config, env: &[(String, String)], m: &Machine) -> Vec<String> {
    let mut known: Vec<String> = OPTIONS
        .iter()
        .chain(crate::run_options::RUN_OPTIONS)
        .map(|o| o.env())
        .chain(OTHER_VARIABLES.iter().map(|v| v.to_string()))
        .collect();
    known.push("TM_FLAGS".into());
    let mut out = Vec::new();
    for (k, _) in env {
        if known.contains(k) || k.strip_prefix(STAGED_PREFIX).is_some_and(|n| !n.is_empty()) {
            continue;
        }
        if let Some(rest) = k.strip_prefix("ATTUNE_TIER_") {
            let key_ok = TIER_OPTIONS.iter().any(|o| {
                let up = o.key.to_ascii_uppercase();
                rest.len() > up.len() + 1 && rest.ends_with(&format!("_{up}"))
            });
            if key_ok {
                continue;
            }
            out.push(format!(
                "{k} names no tier option (ATTUNE_TIER_<NAME>_<KEY>, KEY one of {}); it is ignored",
                TIER_OPTIONS
                    .iter()
                    .map(|o| o.key)
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
            continue;
        }
        let near = known
            .iter()
            .map(|n| (distance(k, n), n))
            .filter(|(d, _)| *d <= 2)
            .min();
        out.push(match near {
            Some((_, n)) => {
                format!("{k} is not an Attune variable (did you mean {n}?); it is ignored")
            }
            None => format!("{k} is not an Attune variable; it is ignored"),
        });
    }
    out.extend(cfg.limit_notes.iter().cloned());
    out.extend(cfg.far_warning.iter().cloned());
    if cfg.dram > m.total_memory {
        out.push(format!(
            "the DRAM budget ({} bytes) is above this machine's memory ({} bytes): the kernel will reclaim before Attune does",
            cfg.dram, m.total_memory
        ));
    }
    out
}

/// Edit distance (insertions, deletions, substitutions) between two short names.
fn distance(a: &str, b: &str) -> usize {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.iter().enumerate() {
        let mut cur = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != cb);
            cur.push(sub.min(prev[j + 1] + 1).min(cur[j] + 1));
        }
        prev = cur;
    }
    prev[b.len()]
}

/// Whether `p` is a Unix socket (the daemon's, for `far = "auto"`).
fn is_socket(p: &std::path::Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::metadata(p).is_ok_and(|m| m.file_type().is_socket())
}

fn expand_vars(s: &str, m: &Machine) -> String {
    s.replace("$TMPDIR", &m.tmpdir.display().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn more_far_tiers_than_a_chunk_state_can_name_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("many.toml");
        let tiers = |n: usize| -> String {
            (0..n)
                .map(|i| {
                    format!("[[tier]]\nname = \"m{i}\"\nkind = \"memory\"\ncapacity = \"64M\"\n")
                })
                .collect()
        };
        std::fs::write(&p, tiers(MAX_FAR_TIERS)).unwrap();
        assert_eq!(
            load(Some(&p), &[], &machine()).unwrap().tiers.len(),
            MAX_FAR_TIERS
        );
        std::fs::write(&p, tiers(MAX_FAR_TIERS + 1)).unwrap();
        let e = load(Some(&p), &[], &machine()).unwrap_err().0;
        assert!(e.contains("16 far tiers: at most 15"), "{e}");
    }

    fn machine() -> Machine {
        Machine {
            total_memory: 16 << 30,
            memory_limit: u64::MAX,
            tmpdir: std::env::temp_dir(),
            far_offer: Some(attune_policy::far::Offer {
                scratch: vec![attune_policy::far::Scratch {
                    path: std::env::temp_dir().display().to_string(),
                    fs: attune_policy::far::FsClass::Local,
                }],
                ..Default::default()
            }),
        }
    }

    /// `vars` with the in-process memory tier in front of a file tier (`far`), as the
    /// experiments that emulate far memory name it.
    fn emulated(vars: &[(&str, &str)]) -> Vec<(String, String)> {
        let mut v = env(vars);
        v.push(("ATTUNE_FAR".into(), "memory,file".into()));
        v
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
    fn a_remote_tier_needs_well_formed_servers_and_a_secret() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("r.toml");
        let cases = [
            ("", "needs its servers"),
            (
                "servers = \"host\"\nsecret_file = \"/s\"",
                "'host' is not HOST:PORT",
            ),
            (
                "servers = \"a:1,:2\"\nsecret_file = \"/s\"",
                "':2' is not HOST:PORT",
            ),
            (
                "servers = \"a:99999\"\nsecret_file = \"/s\"",
                "'a:99999' is not HOST:PORT",
            ),
            ("servers = \"a:1\"", "secret file"),
        ];
        for (extra, want) in cases {
            std::fs::write(
                &p,
                format!("[[tier]]\nname = \"r\"\nkind = \"remote\"\n{extra}\n"),
            )
            .unwrap();
            let e = load(Some(&p), &[], &machine()).unwrap_err().0;
            assert!(e.contains(want) && e.contains("'r'"), "{extra}: {e}");
        }
        std::fs::write(
            &p,
            "[[tier]]\nname = \"r\"\nkind = \"remote\"\nservers = \"n1:7700,n2:7700\"\nsecret_file = \"/s\"\n",
        )
        .unwrap();
        let c = load(Some(&p), &[], &machine()).unwrap();
        let t = &c.tiers[0];
        assert_eq!(t.server_list(), ["n1:7700", "n2:7700"]);
        assert_eq!(
            (t.provider.as_str(), t.timeout_ms, t.latency_ns),
            ("tcp", 5000, 15000)
        );
    }

    #[test]
    fn embedded_default_works_with_nothing() {
        let c = load(None, &[], &machine()).unwrap();
        assert_eq!(c.dram, 4 << 30);
        assert_eq!(c.fault_mode, FaultMode::Thread);
        // No far device, no daemon: a file on scratch, buffered without a cgroup limit.
        assert_eq!(c.tiers.len(), 1);
        assert_eq!(c.tiers[0].kind, TierKind::File);
        assert_eq!(
            c.tiers[0].path.as_deref(),
            Some(std::env::temp_dir().as_path())
        );
        assert!(!c.tiers[0].direct);
        assert_eq!(c.tiers[0].min_chunk, 4096);
        assert!(c.far_reason.starts_with("auto: "), "{}", c.far_reason);
        // Named: the emulator.
        let c = load(None, &emulated(&[]), &machine()).unwrap();
        assert_eq!(c.tiers[0].kind, TierKind::Memory);
        assert_eq!(c.tiers[1].kind, TierKind::File);
        assert_eq!(c.far_reason, "far = \"memory,file\"");
    }

    #[test]
    fn auto_takes_a_cpuless_node_then_the_daemons_pool_then_a_file() {
        let kinds = |c: &Config| c.tiers.iter().map(|t| t.kind).collect::<Vec<_>>();
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("attuned.sock");
        let _listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        let with_socket = env(&[("ATTUNE_SOCKET", sock.to_str().unwrap())]);
        let c = load(None, &with_socket, &machine()).unwrap();
        assert_eq!(kinds(&c), [TierKind::Pool, TierKind::File]);
        assert!(c.far_reason.contains("far pool"), "{}", c.far_reason);
        // The daemon switched off, or a path that is not a socket: no pool.
        let mut off = with_socket.clone();
        off.push(("ATTUNE_DAEMON".into(), "off".into()));
        assert_eq!(
            kinds(&load(None, &off, &machine()).unwrap()),
            [TierKind::File]
        );
        let not_socket = env(&[("ATTUNE_SOCKET", dir.path().to_str().unwrap())]);
        assert_eq!(
            kinds(&load(None, &not_socket, &machine()).unwrap()),
            [TierKind::File]
        );
        // Under a memory cgroup limit the file tier is O_DIRECT; its variables still win.
        let limited = Machine {
            memory_limit: 1 << 30,
            ..machine()
        };
        assert!(load(None, &[], &limited).unwrap().tiers[0].direct);
        let c = load(
            None,
            &env(&[("ATTUNE_TIER_FILE_DIRECT", "false")]),
            &limited,
        )
        .unwrap();
        assert!(!c.tiers[0].direct);
        let other = tempfile::tempdir().unwrap();
        let c = load(
            None,
            &env(&[("ATTUNE_TIER_FILE_PATH", other.path().to_str().unwrap())]),
            &limited,
        )
        .unwrap();
        assert_eq!(c.tiers[0].path.as_deref(), Some(other.path()));
        // A CPU-less node: a numa tier on it.
        let cxl = Machine {
            far_offer: Some(attune_policy::far::Offer {
                cpuless_nodes: vec![1],
                ..machine().far_offer.unwrap()
            }),
            ..machine()
        };
        let c = load(None, &with_socket, &cxl).unwrap();
        assert_eq!(kinds(&c), [TierKind::Numa]);
        assert_eq!(c.tiers[0].node, Some(1));
        // Scratch only in RAM: a warning at start.
        let ram = Machine {
            far_offer: Some(attune_policy::far::Offer {
                scratch: vec![attune_policy::far::Scratch {
                    path: std::env::temp_dir().display().to_string(),
                    fs: attune_policy::far::FsClass::Memory,
                }],
                ..Default::default()
            }),
            ..machine()
        };
        let c = load(None, &[], &ram).unwrap();
        assert!(warnings(&c, &[], &ram).iter().any(|w| w.contains("tmpfs")));
        assert!(warnings(&load(None, &[], &machine()).unwrap(), &[], &machine()).is_empty());
        // `auto` said out loud is the default; other words are refused.
        assert_eq!(
            load(None, &env(&[("ATTUNE_FAR", "auto")]), &machine())
                .unwrap()
                .tiers
                .len(),
            1
        );
        let e = env_error(None, "ATTUNE_FAR", "auto,file");
        assert!(e.contains("expected auto"), "{e}");
    }

    #[test]
    fn file_systems_are_classed_by_their_magic() {
        use attune_policy::far::FsClass;
        assert_eq!(fs_class(0x0102_1994), FsClass::Memory);
        assert_eq!(fs_class(0x0bd0_0bd0), FsClass::Network);
        assert_eq!(fs_class(0x6969), FsClass::Network);
        assert_eq!(fs_class(0xef53), FsClass::Local);
        // This machine's /dev/shm is tmpfs wherever it exists.
        if let Ok(m) = attune_sys::os::fs_magic(std::path::Path::new("/dev/shm")) {
            assert_eq!(fs_class(m), FsClass::Memory);
        }
    }

    #[test]
    fn far_names_the_default_tiers_and_never_competes_with_a_tier_list() {
        let m = machine();
        let kinds = |c: &Config| c.tiers.iter().map(|t| t.kind).collect::<Vec<_>>();
        let c = load(None, &env(&[("ATTUNE_FAR", "pool,file")]), &m).unwrap();
        assert_eq!(kinds(&c), [TierKind::Pool, TierKind::File]);
        assert_eq!(c.far, "pool,file");
        // Each tier keeps its kind's variables.
        let c = load(
            None,
            &env(&[("ATTUNE_FAR", "file"), ("ATTUNE_TIER_FILE_DIRECT", "true")]),
            &m,
        )
        .unwrap();
        assert_eq!(kinds(&c), [TierKind::File]);
        assert!(c.tiers[0].direct);
        for (bad, says) in [
            ("remote", "other kinds need [[tier]] tables"),
            ("numa", "other kinds need [[tier]] tables"),
            ("file,file", "named twice"),
            ("", "is not a far tier kind"),
            ("pool,,file", "is not a far tier kind"),
        ] {
            let e = env_error(None, "ATTUNE_FAR", bad);
            assert!(e.contains("ATTUNE_FAR") && e.contains(says), "{bad:?}: {e}");
        }
        // A file with tiers and `far` from the environment or the file: refused.
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.toml");
        std::fs::write(&p, "[[tier]]\nname = \"m\"\nkind = \"memory\"\n").unwrap();
        let e = env_error(Some(&p), "ATTUNE_FAR", "file");
        assert!(e.contains("name the far tiers in one place"), "{e}");
        std::fs::write(
            &p,
            "far = \"file\"\n[[tier]]\nname = \"m\"\nkind = \"memory\"\n",
        )
        .unwrap();
        let e = load(Some(&p), &[], &m).unwrap_err().0;
        assert!(e.contains("t.toml:1") && e.contains("in one place"), "{e}");
    }

    #[test]
    fn a_file_tier_moves_16k_chunks_at_least_unless_told_otherwise() {
        let c = load(None, &emulated(&[]), &machine()).unwrap();
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
            &emulated(&[("ATTUNE_DRAM", "2G"), ("ATTUNE_TIER_MEMORY_CAPACITY", "3G")]),
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
    fn every_integer_row_refuses_a_value_outside_its_bounds() {
        let m = machine();
        for o in OPTIONS {
            let table::Kind::Int { min, max } = o.kind else {
                continue;
            };
            let mut outside = vec![max as u128 + 1];
            if min > 0 {
                outside.push(min as u128 - 1);
            }
            for v in outside {
                let v = v.to_string();
                let e = load(None, &env(&[(&o.env(), &v)]), &m)
                    .expect_err(&format!("{}={v} accepted", o.env()))
                    .0;
                assert!(e.contains(&o.env()) && e.contains("must be between"), "{e}");
            }
        }
    }

    #[test]
    fn every_integer_tier_row_refuses_a_value_outside_its_bounds() {
        let m = machine();
        // `node` is a numa tier's (a memory tier has none to refuse).
        for o in TIER_OPTIONS.iter().filter(|o| o.key != "node") {
            let table::Kind::Int { min, max } = o.kind else {
                continue;
            };
            // A row whose bound is u64::MAX has no whole number above it.
            let mut outside = Vec::new();
            if max < u64::MAX {
                outside.push(max + 1);
            }
            if min > 0 {
                outside.push(min - 1);
            }
            for v in outside {
                let (k, v) = (o.tier_env("memory"), v.to_string());
                let e = load(None, &emulated(&[(&k, &v)]), &m)
                    .expect_err(&format!("{k}={v} accepted"))
                    .0;
                assert!(e.contains(&k) && e.contains("must be between"), "{e}");
            }
        }
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

    /// A value as `Config` serializes it.
    fn json(v: &Value) -> serde_json::Value {
        match v {
            Value::U64(x) => serde_json::json!(x),
            Value::F64(x) => serde_json::json!(x),
            Value::Bool(x) => serde_json::json!(x),
            Value::Text(x) => serde_json::json!(x),
        }
    }

    #[test]
    fn the_tables_defaults_are_what_an_empty_configuration_gives() {
        let m = machine();
        let c = load(None, &[], &m).unwrap();
        let got = serde_json::to_value(&c).unwrap();
        for o in OPTIONS {
            let base = match o.base() {
                Some(Base::Budget) => c.dram,
                _ => m.total_memory,
            };
            let want = match o.key {
                // `auto` is resolved for this machine.
                "limit_room" => Value::U64(m.default_limit_room()),
                _ => o.parse(o.default_for(None).unwrap(), base).unwrap(),
            };
            assert_eq!(got[o.key], json(&want), "option {}", o.key);
        }
        assert_eq!(c.tiers.len(), 1);
        for (t, tj) in c.tiers.iter().zip(got["tiers"].as_array().unwrap()) {
            for o in TIER_OPTIONS {
                let Some(d) = o.default_for(Some(t.kind)) else {
                    continue;
                };
                let want = match o.key {
                    // A memory tier has no directory; a file tier's free space moves.
                    "path" if t.kind != TierKind::File => continue,
                    "path" => json(&Value::Text(expand_vars(d, &m))),
                    "capacity" if t.kind == TierKind::File => continue,
                    // `far = "auto"` sets its file tier's floor (embedded_default_works_with_nothing).
                    "min_chunk" if t.kind == TierKind::File => continue,
                    _ => json(&o.parse(d, m.total_memory).unwrap()),
                };
                assert_eq!(tj[o.key], want, "tier {} option {}", t.name, o.key);
            }
        }
    }

    /// A valid value other than the default, as a user would write it.
    fn other_value(o: &Opt) -> String {
        match o.kind {
            table::Kind::Size { min } => ((min.max(8 << 20)) * 2).to_string(),
            table::Kind::SizeOrPercent { .. } => "3%".into(),
            table::Kind::Chunk => "64K".into(),
            table::Kind::Int { min, max } => (min + (max.min(1 << 40) - min) / 2 + 1).to_string(),
            table::Kind::Fraction => "0.5".into(),
            table::Kind::Choice { values, .. } => values.last().unwrap().to_string(),
            table::Kind::Name { .. } => "job42".into(),
            table::Kind::Path => "/tmp/other.sock".into(),
            // The opposite of the default (`direct` is off, `follow_limit` on).
            table::Kind::Bool if o.default_for(None) == Some("true") => "false".into(),
            table::Kind::Bool => "true".into(),
            // The word is the default where one is (`auto`): a value of the kind differs.
            table::Kind::OrWord { kind, .. } => other_value(&Opt { kind: *kind, ..*o }),
            table::Kind::Percent { max, .. } => max.to_string(),
            table::Kind::Loopback => "127.0.0.1:1".into(),
            table::Kind::KernelMask => "-move".into(),
            table::Kind::TierKinds => "file".into(),
        }
    }

    #[test]
    fn every_row_is_read_from_its_variable_and_from_the_file() {
        let m = machine();
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("all.toml");
        let mut toml = String::new();
        for o in OPTIONS {
            toml += &format!("{} = \"{}\"\n", o.key, other_value(o));
        }
        std::fs::write(&p, &toml).unwrap();
        let from_file = serde_json::to_value(load(Some(&p), &[], &m).unwrap()).unwrap();
        for o in OPTIONS {
            let v = other_value(o);
            assert_ne!(Some(v.as_str()), o.default_for(None), "{}", o.key);
            let c = load(None, &env(&[(&o.env(), &v)]), &m)
                .unwrap_or_else(|e| panic!("{}={v}: {e}", o.env()));
            let base = match o.base() {
                Some(Base::Budget) => c.dram,
                _ => m.total_memory,
            };
            let want = json(&o.parse(&v, base).unwrap());
            let got = serde_json::to_value(&c).unwrap();
            assert_eq!(got[o.key], want, "{}={v}", o.env());
            if o.base() != Some(Base::Budget) {
                assert_eq!(from_file[o.key], want, "{} = {v} in the file", o.key);
            }
            // And a bad value is refused, naming the variable.
            if !matches!(o.kind, table::Kind::Name { .. } | table::Kind::Path) {
                let e = env_error(None, &o.env(), "0.5.x");
                assert!(e.contains(&o.env()) && e.contains(o.key), "{e}");
            }
        }
        for o in TIER_OPTIONS
            .iter()
            .filter(|o| !matches!(o.key, "name" | "kind" | "path" | "node"))
        {
            let v = other_value(o);
            let c = load(None, &emulated(&[(&o.tier_env("memory"), &v)]), &m).unwrap();
            let got = serde_json::to_value(&c).unwrap();
            let want = json(&o.parse(&v, m.total_memory).unwrap());
            let t = got["tiers"]
                .as_array()
                .unwrap()
                .iter()
                .find(|t| t["name"] == "memory")
                .unwrap();
            assert_eq!(t[o.key], want, "{}={v}", o.tier_env("memory"));
        }
    }

    #[test]
    fn misspelled_variables_and_oversized_budgets_are_warned_about() {
        let m = machine();
        let e = env(&[
            ("ATTUNE_DRAMM", "1G"),
            ("ATTUNE_TIER_MEMORY_CAPACTY", "1G"),
            ("ATTUNE_TIER_MY_SSD_MIN_CHUNK", "64K"),
            ("ATTUNE_CONFIG", ""),
            ("ATTUNE_REPORT_DIR", "/tmp"),
            ("ATTUNE_STAGED_ERA5_IN", "/proc/self/fd/9"),
            ("ATTUNE_WHATEVER_ELSE", "1"),
        ]);
        let c = load(None, &e, &m).unwrap();
        let w = warnings(&c, &e, &m);
        assert_eq!(w.len(), 3, "{w:?}");
        assert!(
            w[0].contains("ATTUNE_DRAMM") && w[0].contains("did you mean ATTUNE_DRAM?"),
            "{w:?}"
        );
        assert!(
            w[1].contains("ATTUNE_TIER_MEMORY_CAPACTY") && w[1].contains("capacity"),
            "{w:?}"
        );
        assert!(
            w[2].contains("ATTUNE_WHATEVER_ELSE") && !w[2].contains("did you mean"),
            "{w:?}"
        );
        // Every option's own variable is known.
        let all: Vec<(String, String)> = OPTIONS.iter().map(|o| (o.env(), String::new())).collect();
        assert!(warnings(&c, &all, &m).is_empty());
        let big = load(None, &env(&[("ATTUNE_DRAM", "99999T")]), &m).unwrap();
        let w = warnings(&big, &[], &m);
        assert!(
            w.len() == 1 && w[0].contains("above this machine's memory"),
            "{w:?}"
        );
        assert_eq!(distance("ATTUNE_DRAMM", "ATTUNE_DRAM"), 1);
        assert_eq!(distance("kitten", "sitting"), 3);
    }

    #[test]
    fn managed_memory_stays_under_the_cgroup_limit() {
        // A job given 512 MiB on a 16 GiB node (Slurm's --mem, a container's limit).
        let m = Machine {
            memory_limit: 512 << 20,
            ..machine()
        };
        let cap = (512u64 << 20) - (512u64 << 20) / 100 * 10;
        assert_eq!(m.limit_for_managed(None), cap);
        let tier = |c: &Config, kind: TierKind| c.tiers.iter().find(|t| t.kind == kind).cloned();
        // Defaults: percentages of the limit, not of the node; nothing lowered.
        let c = load(None, &emulated(&[]), &m).unwrap();
        assert_eq!(c.dram, 128 << 20);
        assert_eq!(tier(&c, TierKind::Memory).unwrap().capacity, 256 << 20);
        assert!(c.limit_notes.is_empty(), "{:?}", c.limit_notes);
        assert_eq!(
            load(None, &env(&[("ATTUNE_DRAM", "50%")]), &m)
                .unwrap()
                .dram,
            256 << 20
        );
        // A budget above the limit is lowered, with a warning naming both.
        let c = load(None, &env(&[("ATTUNE_DRAM", "1G")]), &m).unwrap();
        assert_eq!(c.dram, cap);
        let w = warnings(&c, &[], &m);
        assert!(
            w[0].contains("1073741824") && w[0].contains("536870912") && w[0].contains("lowered"),
            "{w:?}"
        );
        // The memory tier's pages count too: it gets what the budget leaves, then nothing
        // (left out: the file tier serves).
        let c = load(None, &emulated(&[("ATTUNE_DRAM", "400M")]), &m).unwrap();
        assert_eq!(
            tier(&c, TierKind::Memory).unwrap().capacity,
            cap - (400 << 20)
        );
        assert!(
            c.limit_notes[0].contains("holds at most"),
            "{:?}",
            c.limit_notes
        );
        let c = load(None, &emulated(&[("ATTUNE_DRAM", "1G")]), &m).unwrap();
        assert!(tier(&c, TierKind::Memory).is_none(), "{:?}", c.tiers);
        assert!(tier(&c, TierKind::File).is_some());
        assert!(c.limit_notes[1].contains("left out"), "{:?}", c.limit_notes);
        // A headroom the lowered budget cannot hold: refused, naming the lowering.
        let e = load(
            None,
            &env(&[("ATTUNE_DRAM", "1G"), ("ATTUNE_HEADROOM", "500M")]),
            &m,
        )
        .unwrap_err()
        .0;
        assert!(
            e.contains("ATTUNE_HEADROOM") && e.contains(&format!("{cap} bytes, lowered")),
            "{e}"
        );
        // A measured room (the evaluation harness's): the budget may come closer to the
        // limit; a size, a percentage of the limit; too large a room leaves 1 MiB.
        for (room, want) in [
            ("8M", (504u64) << 20),
            ("50%", 256 << 20),
            ("0", 512 << 20),
            ("2G", 1 << 20),
        ] {
            let c = load(
                None,
                &env(&[("ATTUNE_DRAM", "1G"), ("ATTUNE_LIMIT_ROOM", room)]),
                &m,
            )
            .unwrap();
            assert_eq!(c.dram, want, "limit_room {room}");
        }
        let c = load(
            None,
            &env(&[("ATTUNE_DRAM", "500M"), ("ATTUNE_LIMIT_ROOM", "8M")]),
            &m,
        )
        .unwrap();
        assert!(
            c.dram == 500 << 20 && c.limit_notes.is_empty(),
            "{:?}",
            c.limit_notes
        );
        let e = env_error(None, "ATTUNE_LIMIT_ROOM", "lots");
        assert!(e.contains("ATTUNE_LIMIT_ROOM") && e.contains("auto"), "{e}");
        // No limit: as before, whatever the room.
        let c = load(
            None,
            &env(&[("ATTUNE_DRAM", "15G"), ("ATTUNE_LIMIT_ROOM", "1G")]),
            &machine(),
        )
        .unwrap();
        assert_eq!(c.dram, 15 << 30);
        assert!(c.limit_notes.is_empty());
    }

    #[test]
    fn auto_offers_only_scratch_where_a_file_can_be_made() {
        // /proc is a directory no file can be made in (as is another user's $TMPDIR or a
        // read-only mount): never offered, whatever $TMPDIR says.
        let o = far_offer(std::path::Path::new("/proc"));
        assert!(
            o.scratch.iter().all(|s| s.path != "/proc"),
            "{:?}",
            o.scratch
        );
        assert!(!o.scratch.is_empty(), "/tmp or /var/tmp");
        let tmp = tempfile::tempdir().unwrap();
        let o = far_offer(tmp.path());
        assert_eq!(o.scratch[0].path, tmp.path().display().to_string());
        // Probing leaves nothing behind.
        assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0);
    }

    #[test]
    fn a_broken_tier_list_is_refused_with_its_line() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.toml");
        for (toml, want) in [
            ("dram = \"1G\"\ntier = 3\n", "t.toml:2: `tier` is a list"),
            ("tier = [1]\n", "each tier is a [[tier]] table"),
            ("[[tier]]\nname = \"fast\"\n", "a tier needs a kind"),
            ("[[tier]]\nname = \"fast\"\nkind = \"tape\"\n", "not a tier kind"),
            ("[[tier]]\nkind = \"memory\"\n", "not a tier name"),
            ("[[tier]]\nname = \"a\"\nkind = \"memory\"\n[[tier]]\nname = \"a\"\nkind = \"memory\"\n", "must be unique"),
            ("[[tier]]\nname = \"cxl\"\nkind = \"numa\"\n", "needs a node"),
        ] {
            std::fs::write(&p, toml).unwrap();
            let e = load(Some(&p), &[], &machine()).unwrap_err().0;
            assert!(e.contains(want), "{toml:?}: {e}");
        }
    }

    #[test]
    fn an_unknown_key_is_refused_with_its_line() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("u.toml");
        std::fs::write(
            &p,
            "dram = \"1G\"\n[[tier]]\nname = \"fast\"\nkind = \"memory\"\nspeed = 3\n",
        )
        .unwrap();
        let e = load(Some(&p), &[], &machine()).unwrap_err().0;
        assert!(
            e.contains("u.toml:5") && e.contains("speed") && e.contains("fast"),
            "{e}"
        );
        std::fs::write(&p, "[[tier]]\nname = \"d\"\nkind = \"dram\"\n").unwrap();
        let e = load(Some(&p), &[], &machine()).unwrap_err().0;
        assert!(e.contains("implicit"), "{e}");
    }
}
