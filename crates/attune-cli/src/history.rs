//! The execution history: what `attune profile` learned about each program, kept for
//! `attune run` to predict flags when none are given (decisions in
//! `attune_policy::predict`; the store is described in docs/design.md).
//!
//! One JSON file per user (`ATTUNE_HISTORY`, default
//! `$XDG_STATE_HOME/attune/history.json`, else `~/.local/state/attune/history.json`), mode
//! 0600 in a 0700 directory, replaced atomically (written aside, renamed). Keyed by the
//! program's canonical path; the last [`RUNS_KEPT`] runs per program, the
//! [`PROGRAMS_KEPT`] most recently profiled programs. A file that cannot be read, is not
//! JSON, or is of another schema is ignored with a warning (and set aside when a new
//! record is written); it never stops a run.

use attune_policy::predict::{RegionRecord, RunRecord};
use attune_policy::Flags;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

pub const SCHEMA: &str = "attune-history/1";
pub const RUNS_KEPT: usize = 8;
pub const PROGRAMS_KEPT: usize = 256;

#[derive(Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct Store {
    schema: String,
    programs: BTreeMap<String, Vec<StoredRun>>,
}

#[derive(Serialize, Deserialize, Clone)]
#[serde(deny_unknown_fields)]
struct StoredRun {
    args: Vec<String>,
    /// Unix seconds.
    recorded: u64,
    regions: Vec<StoredRegion>,
}

#[derive(Serialize, Deserialize, Clone)]
#[serde(deny_unknown_fields)]
struct StoredRegion {
    size: u64,
    flags: String,
    /// Hot ranges as fractions of the region, pinned at allocation.
    #[serde(default)]
    hot: Vec<[f64; 2]>,
}

/// Where the history is, or None when it is turned off (`ATTUNE_HISTORY=off`).
pub fn path() -> Option<PathBuf> {
    match std::env::var("ATTUNE_HISTORY") {
        Ok(v) if v == "off" || v == "0" => None,
        Ok(v) if !v.is_empty() => Some(PathBuf::from(v)),
        _ => {
            let base = std::env::var_os("XDG_STATE_HOME")
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
                .or_else(|| {
                    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/state"))
                })?;
            Some(base.join("attune/history.json"))
        }
    }
}

/// The key of a program: its canonical path.
pub fn key(program: &Path) -> String {
    std::fs::canonicalize(program)
        .unwrap_or_else(|_| program.to_path_buf())
        .display()
        .to_string()
}

fn load(path: &Path) -> Result<Option<Store>, String> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
    };
    parse(&text)
        .map(Some)
        .map_err(|e| format!("{} {e}", path.display()))
}

/// A store from its text; the error follows the file's name in a message.
fn parse(text: &str) -> Result<Store, String> {
    let store: Store =
        serde_json::from_str(text).map_err(|e| format!("is not a history file ({e})"))?;
    if store.schema != SCHEMA {
        return Err(format!(
            "is of schema '{}', this attune reads '{SCHEMA}'",
            store.schema
        ));
    }
    Ok(store)
}

fn to_record(r: &StoredRun) -> Result<RunRecord, String> {
    let regions = r
        .regions
        .iter()
        .map(|g| {
            // Hot ranges go to every process of the run (`ATTUNE_PREDICT`), which refuses
            // ranges outside the region: a hand-edited or damaged file must fail here,
            // as a warning, not there, where it would stop the interposer.
            if let Some(h) = g.hot.iter().find(|h| {
                !(0.0..=1.0).contains(&h[0]) || !(0.0..=1.0).contains(&h[1]) || h[0] >= h[1]
            }) {
                return Err(format!("hot range {:?} is not within [0, 1]", h));
            }
            Ok(RegionRecord {
                size: g.size,
                flags: Flags::parse(&g.flags)?,
                hot: g.hot.iter().map(|h| (h[0], h[1])).collect(),
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    Ok(RunRecord {
        args: r.args.clone(),
        regions,
    })
}

/// The recorded run nearest to `args` for `program`, and how many runs were recorded.
/// Err: a warning to print (the history is then not used).
pub fn lookup(
    path: &Path,
    program: &Path,
    args: &[String],
) -> Result<Option<(RunRecord, usize)>, String> {
    let Some(store) = load(path)? else {
        return Ok(None);
    };
    nearest(&store, &key(program), args).map_err(|e| format!("{}: {e}", path.display()))
}

/// [`lookup`] in a history's text, for the program whose key is `key`: reads no file (the
/// history's fuzz target drives it with any text).
pub fn lookup_text(
    text: &str,
    key: &str,
    args: &[String],
) -> Result<Option<(RunRecord, usize)>, String> {
    nearest(&parse(text)?, key, args)
}

fn nearest(
    store: &Store,
    key: &str,
    args: &[String],
) -> Result<Option<(RunRecord, usize)>, String> {
    let Some(runs) = store.programs.get(key) else {
        return Ok(None);
    };
    let records = runs
        .iter()
        .map(to_record)
        .collect::<Result<Vec<_>, String>>()?;
    Ok(attune_policy::predict::nearest_run(&records, args).map(|r| (r.clone(), runs.len())))
}

/// Adds a run to the history. A history that cannot be read is set aside
/// (`history.json.bad`) with a warning and a new one started.
pub fn record(path: &Path, program: &Path, run: &RunRecord) -> Result<(), String> {
    let mut store = match load(path) {
        Ok(Some(s)) => s,
        Ok(None) => Store {
            schema: SCHEMA.into(),
            ..Default::default()
        },
        Err(e) => {
            let aside = path.with_extension("json.bad");
            eprintln!(
                "attune: warning: {e}; set aside as {} and started anew",
                aside.display()
            );
            let _ = std::fs::rename(path, &aside);
            Store {
                schema: SCHEMA.into(),
                ..Default::default()
            }
        }
    };
    let wall = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    add(&mut store, key(program), run, wall);
    write(path, &store)
}

/// The stamp of a run recorded now: the wall clock, but never at or before a run already
/// kept. Programs are dropped oldest stamp first; after the clock is set back (an NTP
/// step, a node booted with a wrong clock) the run just recorded would otherwise look the
/// oldest, and be the one dropped. The wall clock is read here only: everything else in
/// Attune times intervals on the monotonic clock, which no clock setting moves.
fn stamp(store: &Store, wall: u64) -> u64 {
    let newest = store.programs.values().flatten().map(|r| r.recorded).max();
    match newest {
        Some(n) if wall <= n => n.saturating_add(1),
        _ => wall,
    }
}

/// Adds `run` of the program keyed `program` to `store`, stamped at `wall` (Unix seconds)
/// or later ([`stamp`]), and drops what is over the limits.
fn add(store: &mut Store, program: String, run: &RunRecord, wall: u64) {
    let now = stamp(store, wall);
    let stored = StoredRun {
        args: run.args.clone(),
        recorded: now,
        regions: run
            .regions
            .iter()
            .map(|g| StoredRegion {
                size: g.size,
                flags: g.flags.to_string(),
                hot: g.hot.iter().map(|&(a, b)| [a, b]).collect(),
            })
            .collect(),
    };
    let runs = store.programs.entry(program).or_default();
    runs.retain(|r| r.args != run.args);
    runs.push(stored);
    if runs.len() > RUNS_KEPT {
        let extra = runs.len() - RUNS_KEPT;
        runs.drain(..extra);
    }
    while store.programs.len() > PROGRAMS_KEPT {
        let oldest = store
            .programs
            .iter()
            .min_by_key(|(_, r)| r.iter().map(|x| x.recorded).max().unwrap_or(0))
            .map(|(k, _)| k.clone());
        match oldest {
            Some(k) => store.programs.remove(&k),
            None => break,
        };
    }
}

fn write(path: &Path, store: &Store) -> Result<(), String> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
    let body = serde_json::to_vec_pretty(store).map_err(|e| e.to_string())?;
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .and_then(|mut f| f.write_all(&body).and_then(|_| f.sync_all()))
        .and_then(|_| std::fs::rename(&tmp, path));
    written.map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        format!("cannot write {}: {e}", path.display())
    })
}

/// One line per recorded region, for the launcher's message and the report.
pub fn describe(regions: &[RegionRecord]) -> Vec<String> {
    regions
        .iter()
        .map(|r| {
            let hot: f64 = r.hot.iter().map(|(a, b)| b - a).sum();
            if r.hot.is_empty() {
                format!("{} {}", attune::size::human(r.size), r.flags)
            } else {
                format!(
                    "{} {}, hot {:.0}% pinned (LAT) in {} range(s)",
                    attune::size::human(r.size),
                    r.flags,
                    hot * 100.0,
                    r.hot.len()
                )
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(args: &[&str], size: u64) -> RunRecord {
        RunRecord {
            args: args.iter().map(|s| s.to_string()).collect(),
            regions: vec![RegionRecord {
                size,
                flags: Flags::CAP,
                hot: vec![(0.0, 0.1)],
            }],
        }
    }

    #[test]
    fn record_then_lookup_nearest_and_private() {
        let d = std::env::temp_dir().join(format!("attune-hist-{}", std::process::id()));
        let p = d.join("sub/history.json");
        let prog = Path::new("/bin/true");
        record(&p, prog, &run(&["64"], 64 << 20)).unwrap();
        record(&p, prog, &run(&["1024"], 1 << 30)).unwrap();
        let (r, n) = lookup(&p, prog, &["80".to_string()]).unwrap().unwrap();
        assert_eq!((r.regions[0].size, n), (64 << 20, 2));
        assert_eq!(r.regions[0].hot, vec![(0.0, 0.1)]);
        assert!(lookup(&p, Path::new("/bin/false"), &[]).unwrap().is_none());
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        // The same arguments replace their older record; at most RUNS_KEPT per program.
        for i in 0..20 {
            record(&p, prog, &run(&[&i.to_string()], 1 << 20)).unwrap();
        }
        record(&p, prog, &run(&["19"], 2 << 20)).unwrap();
        let (r, n) = lookup(&p, prog, &["19".to_string()]).unwrap().unwrap();
        assert_eq!((r.regions[0].size, n), (2 << 20, RUNS_KEPT));
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_clock_set_back_never_drops_the_run_just_recorded() {
        let mut store = Store::default();
        let t0 = 1_800_000_000;
        for i in 0..PROGRAMS_KEPT as u64 {
            add(&mut store, format!("/p{i}"), &run(&[], 1 << 20), t0 + i);
        }
        // The clock goes back a year: the new program is the newest all the same, and
        // the program recorded first is the one dropped.
        add(
            &mut store,
            "/new".into(),
            &run(&[], 1 << 20),
            t0 - 365 * 86400,
        );
        assert!(store.programs.contains_key("/new"));
        assert!(!store.programs.contains_key("/p0"));
        assert_eq!(store.programs.len(), PROGRAMS_KEPT);
        assert_eq!(
            store.programs["/new"][0].recorded,
            t0 + PROGRAMS_KEPT as u64
        );
        // And forward again (the clock put right): stamps follow the clock.
        add(&mut store, "/later".into(), &run(&[], 1 << 20), t0 + 86400);
        assert_eq!(store.programs["/later"][0].recorded, t0 + 86400);
        assert!(!store.programs.contains_key("/p1") && store.programs.contains_key("/new"));
    }

    #[test]
    fn a_corrupt_or_foreign_history_is_a_warning_and_set_aside() {
        let d = std::env::temp_dir().join(format!("attune-hist-bad-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let p = d.join("history.json");
        let prog = Path::new("/bin/true");
        let bad_flag = format!(
            r#"{{"schema":"attune-history/1","programs":{{"{}":[{{"args":[],"recorded":1,"regions":[{{"size":1,"flags":"FAST"}}]}}]}}}}"#,
            key(prog)
        );
        for bad in [
            "{not json",
            r#"{"schema":"attune-history/9","programs":{}}"#,
            bad_flag.as_str(),
        ] {
            std::fs::write(&p, bad).unwrap();
            let e = lookup(&p, prog, &[]).unwrap_err();
            assert!(e.contains("history.json"), "{e}");
            record(&p, prog, &run(&[], 1 << 20)).unwrap();
            assert!(d.join("history.json.bad").exists());
            assert!(lookup(&p, prog, &[]).unwrap().is_some());
        }
        let _ = std::fs::remove_dir_all(&d);
    }
}
