//! The daemon's options: a TOML file, overridden by the command line. Each option in one
//! table (docs/tuning.md lists them with a suggested value).

use attune::size::{parse_size, parse_size_or_percent};
use serde::Deserialize;
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
    /// Most simultaneous connections (beyond: refused at once, logged).
    pub max_clients: usize,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct File {
    dram: Option<String>,
    min_grant: Option<String>,
    shared_max: Option<String>,
    far_pool: Option<String>,
    move_limit: Option<String>,
    bw_dram_share: Option<String>,
    socket: Option<PathBuf>,
    metrics: Option<String>,
    max_clients: Option<usize>,
}

/// Command-line values (None: the file's, then the default).
#[derive(Default)]
pub struct Overrides {
    pub dram: Option<String>,
    pub min_grant: Option<String>,
    pub shared_max: Option<String>,
    pub far_pool: Option<String>,
    pub move_limit: Option<String>,
    pub bw_dram_share: Option<String>,
    pub socket: Option<PathBuf>,
    pub metrics: Option<String>,
    pub max_clients: Option<usize>,
}

/// `hmat_bw_pct`: DRAM's share of the node's bandwidth from HMAT, if the node has the
/// figures (`Topology::dram_bandwidth_pct`); what `bw_dram_share = "auto"` means.
pub fn load(
    path: Option<&std::path::Path>,
    o: Overrides,
    total_memory: u64,
    hmat_bw_pct: Option<u64>,
) -> Result<DaemonConfig, String> {
    let f: File = match path {
        Some(p) => {
            let text = std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))?;
            toml::from_str(&text).map_err(|e| format!("{}: {}", p.display(), e.message()))?
        }
        None => File::default(),
    };
    let dram_s = o.dram.or(f.dram).unwrap_or_else(|| "80%".into());
    let dram = parse_size_or_percent(&dram_s, total_memory)
        .map_err(|e| format!("dram '{dram_s}': {e}"))?;
    if dram < 16 << 20 {
        return Err(format!(
            "dram '{dram_s}': at least 16M is needed to divide among workflows"
        ));
    }
    let min_s = o.min_grant.or(f.min_grant).unwrap_or_else(|| "16M".into());
    let min_grant = parse_size(&min_s).map_err(|e| format!("min_grant '{min_s}': {e}"))?;
    let sm_s = o
        .shared_max
        .or(f.shared_max)
        .unwrap_or_else(|| "25%".into());
    let shared_max =
        parse_size_or_percent(&sm_s, dram).map_err(|e| format!("shared_max '{sm_s}': {e}"))?;
    if shared_max > dram {
        return Err(format!(
            "shared_max '{sm_s}' is above the DRAM pool ({dram} bytes)"
        ));
    }
    // Default: 15% of the node's memory, less if the DRAM pool leaves less; a pool
    // given explicitly must fit beside the DRAM pool.
    let fp_given = o.far_pool.or(f.far_pool);
    let far_pool = match fp_given.as_deref() {
        Some("off") => None,
        None => Some((total_memory / 100 * 15).min(total_memory.saturating_sub(dram))),
        Some(fp_s) => {
            let v = parse_size_or_percent(fp_s, total_memory).map_err(|e| {
                format!(
                    "far_pool '{fp_s}': {e} (a size, a percentage of the node's memory, or off)"
                )
            })?;
            if v.saturating_add(dram) > total_memory {
                return Err(format!(
                    "far_pool '{fp_s}': with the DRAM pool ({dram} bytes) it is above the node's memory ({total_memory} bytes)"
                ));
            }
            Some(v)
        }
    };
    let socket = o
        .socket
        .or(f.socket)
        .unwrap_or_else(attune_proto::socket_path);
    let metrics = match o.metrics.or(f.metrics) {
        None => Some("127.0.0.1:9464".to_string()),
        Some(m) if m == "off" || m.is_empty() => None,
        Some(m) => {
            let a: std::net::SocketAddr = m
                .parse()
                .map_err(|_| format!("metrics '{m}': expected ADDRESS:PORT or off"))?;
            if !a.ip().is_loopback() {
                return Err(format!("metrics '{m}': only a loopback address is served (the metrics name users' workflows)"));
            }
            Some(m)
        }
    };
    let ml_s = o.move_limit.or(f.move_limit).unwrap_or_else(|| "1G".into());
    let move_limit = if ml_s == "0" || ml_s == "off" {
        0
    } else {
        let v = parse_size(&ml_s)
            .map_err(|e| format!("move_limit '{ml_s}': {e} (bytes per second, or off)"))?;
        if v < 1 << 20 {
            return Err(format!(
                "move_limit '{ml_s}': at least 1M per second (or off)"
            ));
        }
        v
    };
    let bw_s = o
        .bw_dram_share
        .or(f.bw_dram_share)
        .unwrap_or_else(|| "auto".into());
    let bw_dram_pct = if bw_s == "auto" {
        hmat_bw_pct.unwrap_or(100)
    } else {
        match bw_s.trim_end_matches('%').parse::<u64>() {
            Ok(v) if (1..=100).contains(&v) => v,
            _ => {
                return Err(format!(
                    "bw_dram_share '{bw_s}': a percentage from 1 to 100 (DRAM's share of the node's memory bandwidth), or auto"
                ))
            }
        }
    };
    let max_clients = o.max_clients.or(f.max_clients).unwrap_or(4096);
    if max_clients == 0 {
        return Err("max_clients: at least 1".into());
    }
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
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_errors() {
        let c = load(
            None,
            Overrides {
                socket: Some("/tmp/x".into()),
                ..Default::default()
            },
            10 << 30,
            None,
        )
        .unwrap();
        assert_eq!(c.dram, 8 << 30);
        assert_eq!(c.shared_max, 2 << 30);
        assert_eq!(c.metrics.as_deref(), Some("127.0.0.1:9464"));
        let e = load(
            None,
            Overrides {
                dram: Some("lots".into()),
                ..Default::default()
            },
            1 << 30,
            None,
        )
        .unwrap_err();
        assert!(e.contains("dram 'lots'"), "{e}");
        let e = load(
            None,
            Overrides {
                metrics: Some("0.0.0.0:80".into()),
                ..Default::default()
            },
            1 << 30,
            None,
        )
        .unwrap_err();
        assert!(e.contains("loopback"), "{e}");
        let d = std::env::temp_dir().join(format!("attuned-cfg-{}", std::process::id()));
        std::fs::write(&d, "dram = \"1G\"\nbogus = 1\n").unwrap();
        let e = load(Some(&d), Overrides::default(), 1 << 34, None).unwrap_err();
        assert!(e.contains("bogus"), "{e}");
        std::fs::write(&d, "dram = \"1G\"\nmetrics = \"off\"\n").unwrap();
        let c = load(Some(&d), Overrides::default(), 1 << 34, None).unwrap();
        assert_eq!((c.dram, c.metrics), (1 << 30, None));
        std::fs::remove_file(d).unwrap();
    }

    #[test]
    fn far_pool_default_fits_beside_the_dram_pool() {
        let with = |dram: &str, far: Option<&str>| {
            load(
                None,
                Overrides {
                    dram: Some(dram.into()),
                    far_pool: far.map(Into::into),
                    ..Default::default()
                },
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
            load(
                None,
                Overrides {
                    bw_dram_share: v.map(Into::into),
                    ..Default::default()
                },
                8 << 30,
                hmat,
            )
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
