//! `attune stage` and `attune unstage`: a read-only input (a dataset, a container image)
//! copied once into node memory that every instance of an ensemble maps, instead of each
//! reading its own copy (IMME §III-C5; docs/daemon.md, "Staged inputs").
//!
//! The source is opened here, with the caller's rights, and its descriptor passed to
//! attuned: the daemon never opens a path for a user.

use attune_proto::{Reply, Request};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::time::Duration;

#[derive(clap::Args)]
pub struct StageArgs {
    /// Name of the staged input (1-64 of A-Z a-z 0-9 . _ -).
    name: String,
    /// The file to stage, or - for standard input (a pipe: `curl URL | attune stage NAME -`).
    source: PathBuf,
    /// Flags of the region: LAT or SHL fault it in at each open (default CAP).
    #[arg(long, default_value = "CAP")]
    flags: String,
    /// Most bytes a pipe may bring (a regular file's own size is used).
    #[arg(long, value_name = "SIZE")]
    size: Option<String>,
    /// Let this user (uid) open it too; repeatable.
    #[arg(long, value_name = "UID")]
    grant: Vec<u32>,
    /// The daemon's socket [default: $ATTUNE_SOCKET or /run/attune/attuned.sock].
    #[arg(long)]
    socket: Option<PathBuf>,
}

#[derive(clap::Args)]
pub struct UnstageArgs {
    /// Name of the staged input.
    name: String,
    /// The daemon's socket [default: $ATTUNE_SOCKET or /run/attune/attuned.sock].
    #[arg(long)]
    socket: Option<PathBuf>,
}

fn connect(socket: &std::path::Path) -> Result<std::os::unix::net::UnixStream, String> {
    attune_proto::connect(socket, Duration::from_secs(5)).map_err(|e| {
        format!(
            "no attuned answers on {} ({e}); staged inputs live in the node daemon",
            socket.display()
        )
    })
}

fn reply_error(r: Reply) -> String {
    match r {
        Reply::Error { message, .. } => format!("attuned: {message}"),
        other => format!("unexpected reply from attuned: {other:?}"),
    }
}

/// The source's descriptor, opened with this user's rights.
fn open_source(p: &std::path::Path) -> Result<OwnedFd, String> {
    if p.as_os_str() == "-" {
        use std::io::IsTerminal;
        use std::os::fd::AsFd;
        let stdin = std::io::stdin();
        if stdin.is_terminal() {
            return Err("standard input is a terminal: pipe the input in, or name a file".into());
        }
        return stdin
            .as_fd()
            .try_clone_to_owned()
            .map_err(|e| format!("standard input: {e}"));
    }
    let f = std::fs::File::open(p).map_err(|e| format!("{}: {e}", p.display()))?;
    let m = f.metadata().map_err(|e| format!("{}: {e}", p.display()))?;
    if !m.is_file() {
        return Err(format!("{}: not a regular file", p.display()));
    }
    Ok(f.into())
}

pub fn stage(a: StageArgs) -> i32 {
    let fail = |m: String| {
        eprintln!("attune stage: {m}");
        1
    };
    if let Err(e) = attune_policy::Flags::parse(&a.flags) {
        return fail(format!("--flags: {e}"));
    }
    let size = match a.size.as_deref().map(attune::size::parse_size) {
        None => 0,
        Some(Ok(s)) => s,
        Some(Err(e)) => return fail(format!("--size: {e}")),
    };
    let src = match open_source(&a.source) {
        Ok(f) => f,
        Err(e) => return fail(e),
    };
    let socket = a.socket.unwrap_or_else(attune_proto::socket_path);
    let s = match connect(&socket) {
        Ok(s) => s,
        Err(e) => return fail(e),
    };
    // The copy takes as long as the source takes to read (a pipe from the network).
    let _ = s.set_read_timeout(None);
    let req = Request::Stage {
        id: 1,
        name: a.name.clone(),
        flags: a.flags.clone(),
        size,
        fds: 1,
    };
    let (size, ms) = match attune_proto::call_with(&s, &req, &[src.as_raw_fd()]) {
        Ok((Reply::Staged { size, ms, .. }, _)) => (size, ms),
        Ok((r, _)) => return fail(reply_error(r)),
        Err(e) => return fail(format!("attuned on {}: {e}", socket.display())),
    };
    drop(src);
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    for uid in &a.grant {
        let req = Request::SharedGrant {
            id: 2,
            name: a.name.clone(),
            uid: *uid,
        };
        match attune_proto::call(&s, &req) {
            Ok((Reply::Ok { .. }, _)) => {}
            Ok((r, _)) => return fail(format!("--grant {uid}: {}", reply_error(r))),
            Err(e) => return fail(format!("--grant {uid}: {e}")),
        }
    }
    println!(
        "staged '{}': {} bytes in {ms} ms; `attune run --staged {}` gives a program its path, attune_shared_open(\"{}\", 0, 0) maps it; `attune unstage {}` ends it",
        a.name, size, a.name, a.name, a.name
    );
    0
}

pub fn unstage(a: UnstageArgs) -> i32 {
    let socket = a.socket.unwrap_or_else(attune_proto::socket_path);
    let s = match connect(&socket) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("attune unstage: {e}");
            return 1;
        }
    };
    match attune_proto::call(
        &s,
        &Request::Unstage {
            id: 1,
            name: a.name.clone(),
        },
    ) {
        Ok((Reply::Ok { .. }, _)) => 0,
        Ok((r, _)) => {
            eprintln!("attune unstage: {}", reply_error(r));
            1
        }
        Err(e) => {
            eprintln!("attune unstage: attuned on {}: {e}", socket.display());
            1
        }
    }
}

/// The environment variable `attune run --staged NAME` sets to the input's path: NAME in
/// upper case with every character outside A-Z 0-9 made `_` (`era5-in.v2` →
/// `ATTUNE_STAGED_ERA5_IN_V2`).
pub fn env_name(name: &str) -> String {
    let n: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_uppercase()
            } else {
                '_'
            }
        })
        .collect();
    format!("ATTUNE_STAGED_{n}")
}

/// The connection and memory files `attune run --staged` holds for its program: the
/// connection is the daemon's reference of each region (it ends when the launcher does,
/// after the program), the files are inherited by the program at their numbers.
pub struct Held {
    _conn: std::os::unix::net::UnixStream,
    pub files: Vec<(String, OwnedFd)>,
}

/// Opens each staged input (or any shared region this user may open) for a program
/// `attune run` starts.
pub fn hold(names: &[String]) -> Result<Held, String> {
    let socket = attune_proto::socket_path();
    let s = connect(&socket)?;
    let mut files = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let req = Request::SharedOpen {
            id: i as u64 + 1,
            name: name.clone(),
            size: 0,
            flags: String::new(),
        };
        match attune_proto::call(&s, &req) {
            Ok((Reply::Shared { .. }, mut fds)) => match fds.pop() {
                Some(f) => {
                    let f = attune_sys::unix::dup_inheritable(&f)
                        .map_err(|e| format!("--staged {name}: {e}"))?;
                    files.push((name.clone(), f));
                }
                None => return Err(format!("--staged {name}: attuned sent no memory file")),
            },
            Ok((r, _)) => return Err(format!("--staged {name}: {}", reply_error(r))),
            Err(e) => {
                return Err(format!(
                    "--staged {name}: attuned on {}: {e}",
                    socket.display()
                ))
            }
        }
    }
    Ok(Held { _conn: s, files })
}

#[cfg(test)]
mod tests {
    #[test]
    fn env_names() {
        assert_eq!(super::env_name("era5-in.v2"), "ATTUNE_STAGED_ERA5_IN_V2");
        assert_eq!(super::env_name("x"), "ATTUNE_STAGED_X");
    }
}
