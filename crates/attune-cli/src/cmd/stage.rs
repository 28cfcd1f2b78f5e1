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
    /// If an input of this name that this user may open is staged already, keep it for
    /// this job too instead of failing (one being staged is waited for): the tasks of a
    /// job array each run `attune stage --reuse` and only the first copies.
    #[arg(long)]
    reuse: bool,
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
        reuse: a.reuse,
        fds: 1,
    };
    // With --reuse, an input another task is staging now is waited for.
    let t0 = std::time::Instant::now();
    let (size, ms, reused) = loop {
        match attune_proto::call_with(&s, &req, &[src.as_raw_fd()]) {
            Ok((
                Reply::Staged {
                    size, ms, reused, ..
                },
                _,
            )) => break (size, ms, reused),
            Ok((Reply::Error { errno, .. }, _))
                if errno == libc::EAGAIN && a.reuse && t0.elapsed() < STAGING_WAIT =>
            {
                std::thread::sleep(Duration::from_millis(50));
            }
            Ok((r, _)) => return fail(reply_error(r)),
            Err(e) => return fail(format!("attuned on {}: {e}", socket.display())),
        }
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
    if reused {
        println!(
            "staged '{}': {size} bytes, staged already: kept for this job too",
            a.name
        );
        return 0;
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
    format!("{}{n}", attune::config::STAGED_PREFIX)
}

/// The memory files `attune run --staged` holds for its program, inherited by the program
/// at their numbers. The launcher's connection is the daemon's reference of each region
/// (it ends when the launcher does, after the program); a thread watches it and, when the
/// daemon restarts, gives the regions back to the new one ([`rejoin`]).
pub struct Held {
    pub files: Vec<(String, OwnedFd)>,
}

/// How often the launcher tries the socket again after its daemon went away.
const REJOIN_EVERY: Duration = Duration::from_millis(200);

/// Watches connection `s` for its end (the daemon never writes to a connection that only
/// holds regions) and, once it ends, connects again every [`REJOIN_EVERY`] until a new
/// daemon takes the regions back, for as long as the launcher lives: the daemon keeps
/// nothing on disk, and the launcher holds the memory files. `say`: a line on stderr
/// when they are given back.
fn rejoin(
    socket: PathBuf,
    mut s: std::os::unix::net::UnixStream,
    files: Vec<(String, OwnedFd)>,
    say: bool,
) {
    use std::io::Read;
    let held: Vec<attune_proto::SharedHeld> = files
        .iter()
        .map(|(name, _)| attune_proto::SharedHeld {
            name: name.clone(),
            // What the stage gave is not told to openers; a staged input's flags only
            // decide whether an open faults it in (LAT/SHL).
            flags: "CAP".into(),
            refs: 1,
        })
        .collect();
    let fds: Vec<std::os::fd::RawFd> = files.iter().map(|(_, f)| f.as_raw_fd()).collect();
    loop {
        let _ = s.set_read_timeout(None);
        let mut b = [0u8; 64];
        // Anything read is a frame nobody asked for: ignored. 0 or an error: gone.
        while matches!(s.read(&mut b), Ok(n) if n > 0) {}
        s = loop {
            std::thread::sleep(REJOIN_EVERY);
            let Ok(n) = attune_proto::connect(&socket, Duration::from_secs(5)) else {
                continue;
            };
            let req = Request::Rejoin {
                id: 1,
                shared: held.clone(),
                fds: fds.len(),
            };
            if let Ok((Reply::Ok { .. }, _)) = attune_proto::call_with(&n, &req, &fds) {
                break n;
            }
        };
        if say {
            let names: Vec<&str> = files.iter().map(|(n, _)| n.as_str()).collect();
            eprintln!(
                "attune run: attuned restarted; staged input {} given back to it",
                names.join(", ")
            );
        }
    }
}

/// How long an open waits for an input another process is still staging.
const STAGING_WAIT: Duration = Duration::from_secs(600);

/// Opens the region `name` on connection `s`, waiting while another process stages it
/// (EAGAIN): its size and memory file. A reference of this connection.
fn open_when_staged(
    s: &std::os::unix::net::UnixStream,
    name: &str,
) -> Result<(u64, OwnedFd), String> {
    let t0 = std::time::Instant::now();
    let mut id = 0;
    loop {
        id += 1;
        let req = Request::SharedOpen {
            id,
            name: name.into(),
            size: 0,
            flags: String::new(),
        };
        match attune_proto::call(s, &req) {
            Ok((Reply::Shared { size, .. }, mut fds)) => {
                return fds
                    .pop()
                    .map(|f| (size, f))
                    .ok_or_else(|| format!("{name}: attuned sent no memory file"))
            }
            Ok((Reply::Error { errno, .. }, _))
                if errno == libc::EAGAIN && t0.elapsed() < STAGING_WAIT =>
            {
                std::thread::sleep(Duration::from_millis(50));
            }
            Ok((r, _)) => return Err(format!("{name}: {}", reply_error(r))),
            Err(attune_proto::ReadError::Io(e))
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                let waited = s.read_timeout().ok().flatten().unwrap_or_default();
                return Err(format!(
                    "{name}: no answer from attuned in {} s",
                    waited.as_secs()
                ));
            }
            Err(e) => return Err(format!("{name}: attuned: {e}")),
        }
    }
}

/// Opens each staged input (or any shared region this user may open) for a program
/// `attune run` starts, waiting for one that is still being staged, and up to `wait`
/// for the daemon's answer to each open (`attune run --staged-wait`).
pub fn hold(names: &[String], wait: Duration, say: bool) -> Result<Held, String> {
    let socket = attune_proto::socket_path();
    let s = connect(&socket)?;
    // The program cannot start without its input, and a daemon that took the connection is
    // there: a cold start of 100 containers at once on 2 vCPUs had it answer some opens
    // after more than 5 s (docs/design/daemon.md, "A late welcome").
    let _ = s.set_read_timeout(Some(wait));
    let mut files = Vec::new();
    let mut watched = Vec::new();
    for name in names {
        let (_, f) = open_when_staged(&s, name).map_err(|e| format!("--staged {e}"))?;
        let f =
            attune_sys::unix::dup_inheritable(&f).map_err(|e| format!("--staged {name}: {e}"))?;
        watched.push((
            name.clone(),
            f.try_clone().map_err(|e| format!("--staged {name}: {e}"))?,
        ));
        files.push((name.clone(), f));
    }
    std::thread::Builder::new()
        .name("attune-rejoin".into())
        .spawn(move || rejoin(socket, s, watched, say))
        .map_err(|e| format!("--staged: {e}"))?;
    Ok(Held { files })
}

#[cfg(test)]
mod tests {
    #[test]
    fn env_names() {
        assert_eq!(super::env_name("era5-in.v2"), "ATTUNE_STAGED_ERA5_IN_V2");
        assert_eq!(super::env_name("x"), "ATTUNE_STAGED_X");
    }
}
