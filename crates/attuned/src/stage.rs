//! Staged inputs: a read-only file copied once into a shared region that every instance
//! of a node's ensemble maps (IMME §III-C5; docs/design/daemon.md, "Staged inputs").
//!
//! The client opens the source with its own rights and passes the descriptor; the daemon
//! never opens a path for a user. The copy runs in the requesting connection's thread
//! without the state lock ([`run`]: [`begin`] reserves under it, [`copy`] runs outside
//! it, [`finish`] commits under it), so staging a large input holds up nobody else. The pages
//! are written by the daemon, so they are charged to its memory cgroup, not the job's,
//! and they count against `shared_max` and the DRAM pool like any shared region.

use crate::state::{request_rebalance, valid_name, SharedRegion, State};
use attune_policy::Flags;
use attune_proto::Reply;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::time::Instant;

/// A pipe's reservation grows by this much at a time (a regular file's is its size).
pub const STEP: u64 = 64 << 20;
/// Bytes copied per read.
const BUF: usize = 1 << 20;

/// A staging in progress: the source, the memory file, what is reserved.
pub struct Staging {
    pub name: String,
    rid: u64,
    uid: u32,
    src: std::fs::File,
    pipe: bool,
    dst: std::fs::File,
    /// Bytes reserved in the region's entry so far (its `size`).
    reserved: u64,
    /// The most a pipe may bring (0: up to `shared_max`).
    limit: u64,
    /// A pipe that brings nothing for this long fails the staging (`stage_idle_ms`): its
    /// reservation must not stay held by a writer that stopped.
    idle_ms: i32,
    started: Instant,
}

fn error(rid: u64, errno: i32, message: String) -> Reply {
    Reply::Error {
        id: rid,
        errno,
        message,
    }
}

/// Access to the daemon's state for one step of a staging: the connection thread locks
/// it for each step, so the copy between them holds up no other client; the fuzz target
/// and tests, which hold the state throughout, pass it through.
pub type With<'a> = dyn FnMut(&mut dyn FnMut(&mut State)) + 'a;

/// A stage request of client `cid` (user `uid`), whole: [`begin`] and [`finish`] under
/// `with`, the [`copy`] between them outside it. `client`: the requester's socket, watched
/// while copying (None when there is none). The reply to send.
pub fn run(
    with: &mut With,
    cid: u64,
    uid: u32,
    req: attune_proto::Request,
    fds: Vec<OwnedFd>,
    client: Option<RawFd>,
) -> Reply {
    let attune_proto::Request::Stage {
        id: rid,
        name,
        flags,
        size,
        reuse,
        fds: _,
    } = req
    else {
        return error(0, libc::EPROTO, "not a stage request".into());
    };
    let mut args = Some((name, flags, fds));
    let mut begun = None;
    with(&mut |st| {
        let (name, flags, fds) = args.take().expect("begun once");
        begun = Some(begin(st, cid, uid, rid, name, flags, size, reuse, fds));
    });
    let mut sg = match begun.expect("with calls its step") {
        Ok(sg) => sg,
        Err(reply) => return reply,
    };
    let copied = copy(&mut sg, client, &mut |name, need| {
        let mut r = Err("the daemon's state was not reached".to_string());
        with(&mut |st| r = reserve(st, name, need));
        r
    });
    let alive = client.is_none_or(peer_waits);
    let mut sg = Some(sg);
    let mut copied = Some(copied);
    let mut reply = None;
    with(&mut |st| {
        reply = Some(finish(
            st,
            sg.take().unwrap(),
            copied.take().unwrap(),
            alive,
        ));
    });
    reply.expect("with calls its step")
}

/// Whether the client of a staging still waits for its answer: it sends nothing while
/// it waits, so readable here means it closed the connection (or broke the protocol).
fn peer_waits(sock: RawFd) -> bool {
    !attune_sys::os::poll_readable(&[sock], 0)
        .first()
        .copied()
        .unwrap_or(true)
}

/// Checks a stage request of client `cid` (user `uid`), reserves the bytes it needs and
/// enters the region, not yet openable; or the reply to send at once: a refusal, or
/// (`reuse`) the input staged already, now kept for the caller's job too.
#[allow(clippy::too_many_arguments)]
pub fn begin(
    st: &mut State,
    cid: u64,
    uid: u32,
    rid: u64,
    name: String,
    flags: String,
    limit: u64,
    reuse: bool,
    mut fds: Vec<OwnedFd>,
) -> Result<Staging, Reply> {
    if !valid_name(&name) {
        return Err(error(
            rid,
            libc::EINVAL,
            format!("staged input name {name:?}: 1-64 characters of A-Z a-z 0-9 . _ -"),
        ));
    }
    let Ok(f) = Flags::parse(&flags) else {
        return Err(error(rid, libc::EINVAL, format!("flags {flags:?}")));
    };
    if fds.len() != 1 {
        return Err(error(
            rid,
            libc::EINVAL,
            "a stage request carries exactly one descriptor: the source".into(),
        ));
    }
    let stager = stager_of(st, cid);
    if let Some(r) = st.shared.get_mut(&name) {
        if !reuse {
            return Err(error(
                rid,
                libc::EEXIST,
                format!("a shared region '{name}' exists already (unstage it, reuse it with --reuse, or choose another name)"),
            ));
        }
        if !(uid == 0 || r.owner == uid || r.granted.contains(&uid)) {
            st.rejected += 1;
            return Err(error(
                rid,
                libc::EACCES,
                format!(
                    "staged input '{name}' belongs to another user, who has not granted uid {uid}"
                ),
            ));
        }
        // Being copied: not sealed yet.
        if !r.ready {
            return Err(error(
                rid,
                libc::EAGAIN,
                format!("'{name}' is being staged by another process"),
            ));
        }
        if !attune_sys::unix::is_write_sealed(&r.file) {
            return Err(error(
                rid,
                libc::EEXIST,
                format!("'{name}' is a writable shared region, not a staged input"),
            ));
        }
        r.hold_for(stager);
        return Err(Reply::Staged {
            id: rid,
            name,
            size: r.size,
            ms: 0,
            reused: true,
        });
    }
    let src = std::fs::File::from(fds.pop().unwrap());
    let meta = match src.metadata() {
        Ok(m) => m,
        Err(e) => return Err(error(rid, libc::EBADF, format!("the source: {e}"))),
    };
    use std::os::unix::fs::FileTypeExt;
    let t = meta.file_type();
    let pipe = t.is_fifo();
    if !t.is_file() && !pipe {
        return Err(error(
            rid,
            libc::EINVAL,
            "the source must be a regular file or a pipe".into(),
        ));
    }
    let room = st.cfg.shared_max.saturating_sub(st.shared_bytes());
    let want = if pipe {
        match limit {
            0 => STEP.min(room),
            l => STEP.min(l),
        }
    } else {
        meta.len()
    };
    if !pipe && want == 0 {
        return Err(error(rid, libc::EINVAL, "the source file is empty".into()));
    }
    if want > room || room == 0 {
        return Err(error(
            rid,
            libc::ENOMEM,
            format!("staged input '{name}' of {want} bytes: only {room} bytes left of shared_max"),
        ));
    }
    let file = match attune_sys::unix::memfd_growable(&format!("attune-staged:{name}")) {
        Ok(f) => f,
        Err(e) => return Err(error(rid, e.0, format!("cannot create '{name}': {e}"))),
    };
    let dst = match attune_sys::unix::dup(&file) {
        Ok(d) => std::fs::File::from(d),
        Err(e) => return Err(error(rid, e.0, format!("cannot create '{name}': {e}"))),
    };
    let mut region = SharedRegion::opened(uid, f.to_string(), want, file);
    region.ready = false;
    region.hold_for(stager);
    st.shared.insert(name.clone(), region);
    request_rebalance();
    Ok(Staging {
        name,
        rid,
        uid,
        src,
        pipe,
        dst,
        reserved: want,
        limit,
        idle_ms: st.cfg.stage_idle_ms.min(i32::MAX as u64) as i32,
        started: Instant::now(),
    })
}

/// The Slurm job client `cid` runs in and its cgroup directory (None: not in a job, or
/// its cgroup cannot be found: then only `attune unstage` ends what it stages).
pub(crate) fn stager_of(st: &State, cid: u64) -> Option<(String, std::path::PathBuf)> {
    let c = st.clients.get(&cid)?;
    if c.placement.job.is_empty() {
        return None;
    }
    let cgroup = std::fs::read_to_string(format!("/proc/{}/cgroup", c.pid)).ok()?;
    let dir = job_cgroup_dir(&cgroup, &|p| p.is_dir())?;
    Some((c.placement.job.clone(), dir))
}

/// Grows the reservation of the region being staged as `name` to at least `need` bytes
/// (a pipe that brings more): the new reservation, or why not.
pub fn reserve(st: &mut State, name: &str, need: u64) -> Result<u64, String> {
    let used = st.shared_bytes();
    let max = st.cfg.shared_max;
    let Some(r) = st.shared.get_mut(name) else {
        return Err("the region went away".into());
    };
    let room = max.saturating_sub(used) + r.size;
    if need > room {
        return Err(format!(
            "more than {room} bytes: shared_max ({max} bytes) reached"
        ));
    }
    r.size = need.max(r.size.saturating_add(STEP)).min(room);
    request_rebalance();
    Ok(r.size)
}

/// Copies the source into the memory file: the bytes copied, or why it failed (errno and
/// message). `grow(name, need)` enlarges the reservation of a pipe. `client`: the
/// requester's socket, which sends nothing while it waits: readable means it left
/// (Ctrl-C of `attune stage`), and the staging stops rather than hold its reservation.
pub fn copy(
    sg: &mut Staging,
    client: Option<RawFd>,
    grow: &mut dyn FnMut(&str, u64) -> Result<u64, String>,
) -> Result<u64, (i32, String)> {
    let mut buf = vec![0u8; BUF];
    let mut done: u64 = 0;
    let left = || {
        (
            libc::ECONNRESET,
            "the client left before it ended".to_string(),
        )
    };
    loop {
        let src = sg.src.as_raw_fd();
        match (sg.pipe, client) {
            (true, c) => {
                let fds: Vec<RawFd> = std::iter::once(src).chain(c).collect();
                let ready = attune_sys::os::poll_readable(&fds, sg.idle_ms);
                if ready.get(1).copied().unwrap_or(false) {
                    return Err(left());
                }
                if !ready[0] {
                    return Err((
                        libc::ETIMEDOUT,
                        format!("the pipe brought nothing for {} ms", sg.idle_ms),
                    ));
                }
            }
            (false, Some(c)) => {
                if attune_sys::os::poll_readable(&[c], 0)[0] {
                    return Err(left());
                }
            }
            (false, None) => {}
        }
        let n = match sg.src.read(&mut buf) {
            Ok(0) => return Ok(done),
            Ok(n) => n as u64,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                return Err((
                    e.raw_os_error().unwrap_or(libc::EIO),
                    format!("reading the source: {e}"),
                ))
            }
        };
        let need = done + n;
        if need > sg.reserved {
            if !sg.pipe {
                return Err((
                    libc::EINVAL,
                    "the source file grew while it was staged".into(),
                ));
            }
            if sg.limit != 0 && need > sg.limit {
                return Err((
                    libc::EFBIG,
                    format!(
                        "the pipe brought more than the {} bytes announced",
                        sg.limit
                    ),
                ));
            }
            sg.reserved = grow(&sg.name, need).map_err(|m| (libc::ENOMEM, m))?;
        }
        if let Err(e) = sg.dst.write_all(&buf[..n as usize]) {
            return Err((
                e.raw_os_error().unwrap_or(libc::EIO),
                format!("writing the staged copy: {e}"),
            ));
        }
        done = need;
    }
}

/// Commits a staging (`copied`: what [`copy`] returned; `alive`: the client still waits
/// for the answer): the region gets its real size, is sealed read-only and may be opened.
/// On any failure, or if the client left, the region goes.
pub fn finish(
    st: &mut State,
    sg: Staging,
    copied: Result<u64, (i32, String)>,
    alive: bool,
) -> Reply {
    let name = sg.name.clone();
    let result = copied.and_then(|n| {
        if n == 0 {
            return Err((libc::EINVAL, "the source brought no bytes".into()));
        }
        if !alive {
            return Err((libc::ECONNRESET, "the client left before it ended".into()));
        }
        sg.dst
            .set_len(n)
            .map_err(|e| (libc::EIO, format!("sizing the staged copy: {e}")))?;
        let r = st
            .shared
            .get(&name)
            .ok_or((libc::ENOENT, "the region went away".to_string()))?;
        attune_sys::unix::seal_read_only(&r.file)
            .map_err(|e| (e.0, format!("sealing the staged copy: {e}")))?;
        Ok(n)
    });
    request_rebalance();
    match result {
        Ok(n) => {
            let r = st
                .shared
                .get_mut(&name)
                .expect("a staging region stays until finish");
            r.size = n;
            r.ready = true;
            let ms = sg.started.elapsed().as_millis() as u64;
            crate::log_user(
                sg.uid,
                &format!(
                    "staged input '{name}' of uid {}: {n} bytes in {ms} ms{}",
                    sg.uid,
                    if r.stagers.is_empty() {
                        String::new()
                    } else {
                        format!(", until job {} ends", r.jobs())
                    }
                ),
            );
            Reply::Staged {
                id: sg.rid,
                name,
                size: n,
                ms,
                reused: false,
            }
        }
        Err((errno, m)) => {
            st.shared.remove(&name);
            crate::log_user(
                sg.uid,
                &format!("staging '{name}' of uid {} failed: {m}", sg.uid),
            );
            error(sg.rid, errno, format!("staging '{name}': {m}"))
        }
    }
}

/// `attune unstage`: drops the daemon's reference of staged input `name` (its owner or
/// root); it is freed when the last process that opened it closes it.
pub fn unstage(st: &mut State, uid: u32, rid: u64, name: &str) -> Reply {
    let Some(r) = st.shared.get_mut(name) else {
        return error(rid, libc::ENOENT, format!("no staged input '{name}'"));
    };
    if r.owner != uid && uid != 0 {
        st.rejected += 1;
        return error(
            rid,
            libc::EPERM,
            format!(
                "staged input '{name}' belongs to uid {}; only its owner or root unstages it",
                r.owner
            ),
        );
    }
    if !r.ready {
        return error(rid, libc::EBUSY, format!("'{name}' is still being staged"));
    }
    if !r.staged() {
        return error(
            rid,
            libc::EINVAL,
            format!("'{name}' is not staged (a region opened with attune_shared_open goes when its last user closes it)"),
        );
    }
    r.stagers.clear();
    r.by_hand = false;
    crate::log_user(uid, &format!("staged input '{name}' unstaged by uid {uid}"));
    st.release_if_unused(name);
    request_rebalance();
    Reply::Ok { id: rid }
}

/// The directory of the Slurm job's cgroup a process runs in, from its
/// `/proc/PID/cgroup`: the memory controller's hierarchy (v1) or the unified one (v2),
/// cut after the `job_N` component slurmd names. `is_dir` checks a candidate (the v2
/// hierarchy is mounted at /sys/fs/cgroup or, on hybrid nodes, /sys/fs/cgroup/unified).
pub fn job_cgroup_dir(
    cgroup: &str,
    is_dir: &dyn Fn(&std::path::Path) -> bool,
) -> Option<std::path::PathBuf> {
    let mut v2 = None;
    for line in cgroup.lines() {
        let mut it = line.splitn(3, ':');
        let (Some(_), Some(ctl), Some(path)) = (it.next(), it.next(), it.next()) else {
            continue;
        };
        let mut keep = Vec::new();
        let mut found = false;
        for c in path.split('/').filter(|c| !c.is_empty()) {
            keep.push(c);
            if c.strip_prefix("job_")
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
            {
                found = true;
                break;
            }
        }
        if !found || keep.iter().any(|c| *c == "..") {
            continue;
        }
        let rel = keep.join("/");
        if ctl.split(',').any(|c| c == "memory") {
            return Some(std::path::Path::new("/sys/fs/cgroup/memory").join(rel));
        }
        if ctl.is_empty() {
            v2 = ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]
                .iter()
                .map(|b| std::path::Path::new(b).join(&rel))
                .find(|p| is_dir(p));
        }
    }
    v2
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_cgroup_from_v1_and_v2() {
        let v1 = "12:memory:/slurm_n1/uid_1000/job_42/step_0/task_0\n0::/system.slice/x\n";
        assert_eq!(
            job_cgroup_dir(v1, &|_| true).unwrap(),
            std::path::Path::new("/sys/fs/cgroup/memory/slurm_n1/uid_1000/job_42")
        );
        let v2 = "0::/system.slice/slurmstepd.scope/job_7/step_batch/user/task_0\n";
        assert_eq!(
            job_cgroup_dir(v2, &|p| p.starts_with("/sys/fs/cgroup/unified")).unwrap(),
            std::path::Path::new("/sys/fs/cgroup/unified/system.slice/slurmstepd.scope/job_7")
        );
        assert_eq!(job_cgroup_dir("12:memory:/user.slice\n", &|_| true), None);
        assert_eq!(job_cgroup_dir("12:memory:/job_x/job_\n", &|_| true), None);
        assert_eq!(job_cgroup_dir("garbage", &|_| true), None);
    }
}
