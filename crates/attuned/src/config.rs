//! The daemon's options: a TOML file, overridden by the command line; one row each in
//! [`DAEMON_OPTIONS`] (docs/tuning.md's daemon table is generated from it).

use attune::config::table::{from_toml, row, Base, Kind, Opt, Unset, Value};
use std::path::PathBuf;

#[derive(Clone, Debug)]
pub struct DaemonConfig {
    /// DRAM the daemon divides among workflows and shared regions.
    pub dram: u64,
    /// Smallest grant a registered workflow gets while DRAM lasts.
    pub min_grant: u64,
    /// Most bytes all shared regions together may hold.
    pub shared_max: u64,
    /// Node memory divided among the runtimes' `memory` far tiers (None: not divided).
    pub far_pool: Option<u64>,
    /// Page movement limit (bytes/s) of each non-protected workflow while a LAT/SHL
    /// workflow is on the node; 0: none.
    pub move_limit: u64,
    /// DRAM's share of the node's memory bandwidth, percent: what a BW workflow claims of
    /// its want in the fair-share round (`attune_policy::share`).
    pub bw_dram_pct: u64,
    pub socket: PathBuf,
    /// Prometheus text endpoint (`127.0.0.1:9464`), or None.
    pub metrics: Option<String>,
    /// Most simultaneous connections (beyond: refused at once, logged); root's are
    /// always taken.
    pub max_clients: usize,
    /// Most simultaneous connections of one uid other than root.
    pub max_clients_per_user: usize,
    /// How long a connection may wait before its first request, and between requests
    /// until it registers (a registered runtime's connection has no limit).
    pub idle_timeout_ms: u64,
    /// How long a pipe being staged may bring nothing before the staging fails.
    pub stage_idle_ms: u64,
    /// Nice levels the daemon's threads run above the default (0: none).
    pub raise_priority: u64,
}

/// The daemon's options: one row each; the TOML keys, the command-line flags
/// (`--key-with-dashes`), the checks and the daemon's table in docs/tuning.md
/// (`attuned --options`) come from them.
#[rustfmt::skip]
pub const DAEMON_OPTIONS: &[Opt] = &[
    Opt { key: "dram", kind: Kind::SizeOrPercent { of: Base::Memory, min: 16 << 20 }, default: Unset::Value("80%"), suggested: "the node's memory minus what the OS and unmanaged jobs need", doc: "DRAM divided among workflows and shared regions" },
    Opt { key: "min_grant", kind: Kind::Size { min: 0 }, default: Unset::Value("16M"), suggested: "16M-64M: enough for a runtime's small arenas and headroom", doc: "Smallest grant per workflow while DRAM lasts" },
    Opt { key: "shared_max", kind: Kind::SizeOrPercent { of: Base::Budget, min: 0 }, default: Unset::Value("25%"), suggested: "the largest read-only input staged for several workflows", doc: "Most bytes of all shared regions together (a size or a % of `dram`)" },
    Opt { key: "far_pool", kind: Kind::OrWord { words: &["off"], kind: &Kind::SizeOrPercent { of: Base::Memory, min: 0 } }, default: Unset::Found("15% (less if `dram` leaves less)", ""), suggested: "what the node can give the runtimes' memory tiers beside `dram`; off where far tiers are NUMA nodes or files only", doc: "Node memory divided among the runtimes' `memory` far tiers by weighted fair share (CAP first)" },
    Opt { key: "move_limit", kind: Kind::OrWord { words: &["off", "0"], kind: &Kind::Size { min: 1 << 20 } }, default: Unset::Value("1G"), suggested: "1G on DDR nodes; lower (256M) when LAT jobs are bandwidth-sensitive; off to disable", doc: "Page movement (bytes/s) of each non-LAT/SHL workflow while a LAT/SHL workflow runs" },
    Opt { key: "bw_dram_share", kind: Kind::OrWord { words: &["auto"], kind: &Kind::Percent { min: 1, max: 100 } }, default: Unset::Found("auto (HMAT; 100 without it)", "auto"), suggested: "auto on nodes with HMAT; DRAM bandwidth / (DRAM + far bandwidth) otherwise, e.g. 77 for 100 GB/s DRAM beside 30 GB/s of CXL", doc: "Percent of a BW workflow's want it claims in DRAM before the others are served (the rest is granted only if nobody else claims it)" },
    Opt { key: "socket", kind: Kind::Path, default: Unset::Found("$ATTUNE_SOCKET or /run/attune/attuned.sock", ""), suggested: "the default", doc: "Unix socket (mode 0666; clients are told apart by kernel credentials)" },
    Opt { key: "metrics", kind: Kind::OrWord { words: &["off"], kind: &Kind::Loopback }, default: Unset::Value("127.0.0.1:9464"), suggested: "the default, scraped by a local Prometheus agent", doc: "Prometheus text endpoint on a loopback address, or off" },
    Opt { key: "max_clients", kind: Kind::Int { min: 1, max: 1_000_000 }, default: Unset::Value("4096"), suggested: "4096", doc: "Connections beyond this are refused at once (root's are always taken)" },
    Opt { key: "max_clients_per_user", kind: Kind::Int { min: 1, max: 1_000_000 }, default: Unset::Value("1024"), suggested: "1024; at least the processes of the largest job on a node", doc: "Connections of one user (other than root) beyond this are refused at once, so one user's idle connections cannot lock the others out" },
    Opt { key: "idle_timeout_ms", kind: Kind::Int { min: 100, max: 3_600_000 }, default: Unset::Value("10000"), suggested: "10000", doc: "A connection that sends no request for this long before it registers is closed (a registered runtime's is kept, and one holding a shared region)" },
    Opt { key: "stage_idle_ms", kind: Kind::Int { min: 100, max: 3_600_000 }, default: Unset::Value("60000"), suggested: "60000; longer where inputs are downloads piped in from slow sources", doc: "A pipe being staged that brings nothing for this long fails the staging, and its reservation goes" },
    Opt { key: "raise_priority", kind: Kind::Int { min: 0, max: 20 }, default: Unset::Value("10"), suggested: "10; 0 to run at the jobs' priority", doc: "Nice levels the daemon's threads run above the default (nice -10 at 10), set at start when the daemon may (root or CAP_SYS_NICE; otherwise one log line): among hundreds of starting processes a thread of the daemon preempted while it held the state answered registrations seconds late (docs/design/daemon.md, \"The daemon runs above the jobs\")" },
];

/// The command-line flag of a row.
pub fn flag(o: &Opt) -> String {
    format!("--{}", o.key.replace('_', "-"))
}

/// Loads the options: each row from `overrides` (the command line, by key), else the
/// file, else its default. `total_memory` is what percentages of memory are of;
/// `hmat_bw_pct` is DRAM's share of the node's bandwidth from HMAT, if the node has the
/// figures (`Topology::dram_bandwidth_pct`): what `bw_dram_share = "auto"` means.
pub fn load(
    path: Option<&std::path::Path>,
    overrides: &[(&str, String)],
    total_memory: u64,
    hmat_bw_pct: Option<u64>,
) -> Result<DaemonConfig, String> {
    let file: toml::Table = match path {
        Some(p) => {
            let text = std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))?;
            text.parse()
                .map_err(|e: toml::de::Error| format!("{}: {}", p.display(), e.message()))?
        }
        None => toml::Table::new(),
    };
    if let Some(k) = file.keys().find(|k| row(DAEMON_OPTIONS, k).is_none()) {
        let known: Vec<&str> = DAEMON_OPTIONS.iter().map(|o| o.key).collect();
        return Err(format!(
            "{}: unknown option `{k}` (options: {})",
            path.map(|p| p.display().to_string()).unwrap_or_default(),
            known.join(", ")
        ));
    }
    // The raw value of a row as set (None: its default is found here).
    let raw = |key: &str| -> Result<Option<String>, String> {
        let o = row(DAEMON_OPTIONS, key).expect("a daemon option");
        if let Some((_, v)) = overrides.iter().find(|(k, _)| *k == key) {
            return Ok(Some(v.clone()));
        }
        if let Some(v) = file.get(key) {
            return from_toml(v).map(Some).map_err(|e| format!("{key}: {e}"));
        }
        Ok(o.default_for(None)
            .filter(|d| !d.is_empty())
            .map(str::to_string))
    };
    let value = |key: &str, base: u64| -> Result<Option<Value>, String> {
        let o = row(DAEMON_OPTIONS, key).expect("a daemon option");
        match raw(key)? {
            None => Ok(None),
            Some(r) if r.is_empty() && key == "metrics" => Ok(Some(Value::Text("off".into()))),
            Some(r) => o.parse(&r, base).map(Some).map_err(|e| {
                // A value from the file names the file.
                let from_file = !overrides.iter().any(|(k, _)| *k == key) && file.contains_key(key);
                match path.filter(|_| from_file) {
                    Some(p) => format!("{}: {key} '{r}': {e}", p.display()),
                    None => format!("{key} '{r}': {e}"),
                }
            }),
        }
    };
    let bytes = |v: Option<Value>| match v {
        Some(Value::U64(b)) => Some(b),
        _ => None,
    };
    let dram = bytes(value("dram", total_memory)?).unwrap_or(0);
    let min_grant = bytes(value("min_grant", 0)?).unwrap_or(0);
    if min_grant > dram {
        // Every workflow's floor above the whole pool: the first one would take it all.
        return Err(format!(
            "min_grant '{}' is above the DRAM pool ({dram} bytes)",
            raw("min_grant")?.unwrap_or_default()
        ));
    }
    let shared_max = bytes(value("shared_max", dram)?).unwrap_or(0);
    if shared_max > dram {
        return Err(format!(
            "shared_max '{}' is above the DRAM pool ({dram} bytes)",
            raw("shared_max")?.unwrap_or_default()
        ));
    }
    // Default: 15% of the node's memory, less if the DRAM pool leaves less; a pool
    // given explicitly must fit beside the DRAM pool.
    let far_pool = match value("far_pool", total_memory)? {
        None => Some((total_memory / 100 * 15).min(total_memory.saturating_sub(dram))),
        Some(Value::U64(v)) => {
            if v.saturating_add(dram) > total_memory {
                return Err(format!(
                    "far_pool '{}': with the DRAM pool ({dram} bytes) it is above the node's memory ({total_memory} bytes)",
                    raw("far_pool")?.unwrap_or_default()
                ));
            }
            Some(v)
        }
        Some(_) => None,
    };
    let move_limit = bytes(value("move_limit", 0)?).unwrap_or(0);
    let bw_dram_pct = match value("bw_dram_share", 0)? {
        Some(Value::U64(v)) => v,
        _ => hmat_bw_pct.unwrap_or(100),
    };
    let socket = match value("socket", 0)? {
        Some(Value::Text(s)) => PathBuf::from(s),
        _ => attune_proto::socket_path(),
    };
    let metrics = match value("metrics", 0)? {
        Some(Value::Text(m)) if m != "off" => Some(m),
        _ => None,
    };
    let max_clients = bytes(value("max_clients", 0)?).unwrap_or(4096) as usize;
    let max_clients_per_user = bytes(value("max_clients_per_user", 0)?).unwrap_or(1024) as usize;
    let idle_timeout_ms = bytes(value("idle_timeout_ms", 0)?).unwrap_or(10_000);
    let stage_idle_ms = bytes(value("stage_idle_ms", 0)?).unwrap_or(60_000);
    let raise_priority = bytes(value("raise_priority", 0)?).unwrap_or(10);
    Ok(DaemonConfig {
        dram,
        min_grant,
        shared_max,
        far_pool,
        move_limit,
        bw_dram_pct,
        socket,
        metrics,
        max_clients,
        max_clients_per_user,
        idle_timeout_ms,
        stage_idle_ms,
        raise_priority,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn over<'a>(v: &[(&'a str, Option<&str>)]) -> Vec<(&'a str, String)> {
        v.iter()
            .filter_map(|(k, x)| x.map(|x| (*k, x.to_string())))
            .collect()
    }

    #[test]
    fn the_tables_defaults_are_what_no_setting_gives() {
        let total = 64u64 << 30;
        let c = load(None, &[], total, None).unwrap();
        for o in DAEMON_OPTIONS {
            let Some(d) = o.default_for(None).filter(|d| !d.is_empty()) else {
                continue;
            };
            let base = match o.base() {
                Some(Base::Budget) => c.dram,
                _ => total,
            };
            let want = o.parse(d, base).unwrap();
            let got = match o.key {
                "dram" => Value::U64(c.dram),
                "min_grant" => Value::U64(c.min_grant),
                "shared_max" => Value::U64(c.shared_max),
                "move_limit" => Value::U64(c.move_limit),
                "bw_dram_share" => Value::Text("auto".into()),
                "metrics" => Value::Text(c.metrics.clone().unwrap_or_default()),
                "max_clients" => Value::U64(c.max_clients as u64),
                "max_clients_per_user" => Value::U64(c.max_clients_per_user as u64),
                "idle_timeout_ms" => Value::U64(c.idle_timeout_ms),
                "stage_idle_ms" => Value::U64(c.stage_idle_ms),
                "raise_priority" => Value::U64(c.raise_priority),
                k => panic!("no default check for {k}"),
            };
            assert_eq!(got, want, "{}", o.key);
        }
        assert_eq!(c.bw_dram_pct, 100, "auto without HMAT");
        assert_eq!(c.socket, attune_proto::socket_path());
    }

    #[test]
    fn defaults_and_errors() {
        let c = load(None, &[("socket", "/tmp/x".to_string())], 10 << 30, None).unwrap();
        assert_eq!(c.dram, 8 << 30);
        assert_eq!(c.shared_max, 2 << 30);
        assert_eq!(c.metrics.as_deref(), Some("127.0.0.1:9464"));
        let e = load(None, &[("dram", "lots".to_string())], 1 << 30, None).unwrap_err();
        assert!(e.contains("dram 'lots'"), "{e}");
        let e = load(
            None,
            &[("metrics", "0.0.0.0:80".to_string())],
            1 << 30,
            None,
        )
        .unwrap_err();
        assert!(e.contains("loopback"), "{e}");
        let d = std::env::temp_dir().join(format!("attuned-cfg-{}", std::process::id()));
        std::fs::write(&d, "dram = \"1G\"\nbogus = 1\n").unwrap();
        let e = load(Some(&d), &[], 1 << 34, None).unwrap_err();
        assert!(e.contains("bogus"), "{e}");
        std::fs::write(&d, "dram = \"1G\"\nmetrics = \"off\"\n").unwrap();
        let c = load(Some(&d), &[], 1 << 34, None).unwrap();
        assert_eq!((c.dram, c.metrics), (1 << 30, None));
        std::fs::remove_file(d).unwrap();
    }

    #[test]
    fn far_pool_default_fits_beside_the_dram_pool() {
        let with = |dram: &str, far: Option<&str>| {
            load(
                None,
                &over(&[("dram", Some(dram)), ("far_pool", far)]),
                100 << 30,
                None,
            )
        };
        assert_eq!(with("80%", None).unwrap().far_pool, Some(15 << 30));
        assert_eq!(
            with("90%", None).unwrap().far_pool,
            Some(10 << 30),
            "the default shrinks"
        );
        assert_eq!(with("80%", Some("off")).unwrap().far_pool, None);
        assert_eq!(with("80%", Some("10G")).unwrap().far_pool, Some(10 << 30));
        let e = with("90%", Some("15%")).unwrap_err();
        assert!(
            e.contains("far_pool '15%'") && e.contains("above the node's memory"),
            "{e}"
        );
        let e = with("80%", Some("much")).unwrap_err();
        assert!(e.contains("far_pool 'much'"), "{e}");
    }

    #[test]
    fn bw_dram_share_auto_from_hmat_or_given() {
        let with = |v: Option<&str>, hmat: Option<u64>| {
            load(None, &over(&[("bw_dram_share", v)]), 8 << 30, hmat)
        };
        assert_eq!(
            with(None, None).unwrap().bw_dram_pct,
            100,
            "no HMAT: DRAM alone"
        );
        assert_eq!(with(None, Some(77)).unwrap().bw_dram_pct, 77);
        assert_eq!(
            with(Some("60%"), Some(77)).unwrap().bw_dram_pct,
            60,
            "given wins"
        );
        assert_eq!(with(Some("auto"), Some(77)).unwrap().bw_dram_pct, 77);
        for bad in ["0", "101", "fast"] {
            let e = with(Some(bad), None).unwrap_err();
            assert!(e.contains(&format!("bw_dram_share '{bad}'")), "{e}");
        }
    }
}
