//! The socket side: one thread per connection reads frames, checks them and applies them
//! to the shared state. Identity comes from `SO_PEERCRED`, never from a message.

use crate::state::{lock, push, valid_name, State, Writer};
use attune_policy::Flags;
use attune_proto::{FrameReader, ReadError, Reply, Request};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub type Shared = Arc<Mutex<State>>;

pub fn serve(listener: UnixListener, state: Shared) {
    for conn in listener.incoming() {
        let Ok(conn) = conn else { continue };
        let st = state.clone();
        let _ = std::thread::Builder::new()
            .name("attuned-conn".into())
            .stack_size(256 << 10)
            .spawn(move || connection(conn, st));
    }
}

fn connection(sock: UnixStream, state: Shared) {
    let Ok(cred) = attune_sys::unix::peer_cred(&sock) else {
        return;
    };
    // Connections are counted per uid: one user's (idle) connections must not lock the
    // others out, and root (the operator, `attune status` in an emergency) always gets in.
    {
        let mut st = lock(&state);
        let all = st.clients.len();
        let mine = st.clients.values().filter(|c| c.uid == cred.uid).count();
        let why = if cred.uid == 0 {
            None
        } else if all >= st.cfg.max_clients {
            Some(format!("{all} clients already (max_clients)"))
        } else if mine >= st.cfg.max_clients_per_user {
            Some(format!(
                "{mine} connections of this user already (max_clients_per_user)"
            ))
        } else {
            None
        };
        if let Some(why) = why {
            st.rejected += 1;
            crate::log_user(
                cred.uid,
                &format!(
                    "refusing a connection of pid {} uid {}: {why}",
                    cred.pid, cred.uid
                ),
            );
            return;
        }
    }
    let idle = Duration::from_millis(lock(&state).cfg.idle_timeout_ms);
    let _ = sock.set_read_timeout(Some(idle));
    let _ = sock.set_write_timeout(Some(Duration::from_millis(500)));
    let Ok(w) = sock.try_clone() else { return };
    let writer: Writer = Arc::new(Mutex::new(w));
    // The process's /proc directory, held: its cgroup is read through it, so a pid the
    // kernel gives to another process after this one ends never lends its cgroup.
    let proc_dir = std::fs::File::open(format!("/proc/{}", cred.pid)).ok();
    let first = placement(proc_dir.as_ref()).unwrap_or_default();
    let id = lock(&state).add_client(cred.pid, cred.uid, first, writer.clone());
    let mut placed = Instant::now();
    let mut rd = FrameReader::default();
    loop {
        match rd.read(&sock, Request::fds) {
            Ok((req @ Request::Stage { .. }, fds)) => {
                lock(&state).requests += 1;
                let reply = crate::stage::run(
                    &mut |step| step(&mut lock(&state)),
                    id,
                    cred.uid,
                    req,
                    fds,
                    Some(sock.as_raw_fd()),
                );
                let s = writer.lock().unwrap_or_else(|p| p.into_inner());
                if attune_proto::write_frame(&s, &reply, &[]).is_err() {
                    break;
                }
            }
            Ok((req, fds)) => {
                // A process may be moved to another memory cgroup (a Slurm step, an
                // administrator's `cgclassify`): its group is read again at a report once
                // a second, outside the lock, so its claim and its board follow it. A
                // report has no reply of its own: the reply is the new board, if any.
                let moved = match &req {
                    Request::Usage(_) if placed.elapsed() >= PLACEMENT_EVERY => {
                        placed = Instant::now();
                        placement(proc_dir.as_ref())
                    }
                    _ => None,
                };
                let (reply, registered) = {
                    let mut st = lock(&state);
                    st.requests += 1;
                    let reply = handle(&mut st, id, cred.uid, req, fds);
                    let reply = match moved {
                        Some(now) => st.replace_placement(id, now),
                        None => reply,
                    };
                    let c = st.clients.get(&id);
                    (
                        reply,
                        c.is_some_and(|c| c.reg.is_some() || !c.shared_refs.is_empty()),
                    )
                };
                if registered {
                    // A runtime: it reports on its own schedule for its whole life. A
                    // launcher holding a region for its program (`attune run --staged`)
                    // sends nothing more until the program ends.
                    let _ = sock.set_read_timeout(None);
                }
                if let Some((reply, fd)) = reply {
                    let raw: Vec<i32> = fd.iter().map(|f| f.as_raw_fd()).collect();
                    let s = writer.lock().unwrap_or_else(|p| p.into_inner());
                    if attune_proto::write_frame(&s, &reply, &raw).is_err() {
                        break;
                    }
                }
            }
            Err(ReadError::Closed) => break,
            Err(ReadError::Io(_)) => break,
            Err(ReadError::Malformed(m)) => {
                crate::log_user(
                    cred.uid,
                    &format!("pid {} uid {}: {m}; connection closed", cred.pid, cred.uid),
                );
                let mut st = lock(&state);
                st.rejected += 1;
                let c = st.clients.get(&id).map(|c| c.writer.clone());
                drop(st);
                if let Some(w) = c {
                    push(
                        &w,
                        &Reply::Error {
                            id: 0,
                            errno: libc::EPROTO,
                            message: m,
                        },
                    );
                }
                break;
            }
        }
    }
    lock(&state).remove_client(id);
}

/// How often a reporting client's memory cgroup is read again: a move is followed within
/// a second, as the runtime follows its own limit (`paging::limit`); a reading costs three
/// to five small files.
const PLACEMENT_EVERY: Duration = Duration::from_secs(1);

/// Where the process of `proc_dir` (its /proc directory) runs, as the kernel says. None
/// when its cgroup cannot be read (it ended: its connection is about to close).
fn placement(proc_dir: Option<&std::fs::File>) -> Option<crate::state::Placement> {
    let path = format!("/proc/self/fd/{}/cgroup", proc_dir?.as_raw_fd());
    let cgroup = std::fs::read_to_string(path).ok()?;
    let read = |p: &str| std::fs::read_to_string(p).ok();
    Some(crate::state::Placement {
        job: slurm_job(&cgroup),
        mem_limit: memory_limit(&cgroup, &read),
        mem_group: attune::topology::limiting_cgroup(&cgroup, &read)
            .map(|(_, g)| g.dir)
            .unwrap_or_default(),
    })
}

fn err(id: u64, errno: i32, message: impl Into<String>) -> Option<(Reply, Vec<OwnedFd>)> {
    Some((
        Reply::Error {
            id,
            errno,
            message: message.into(),
        },
        Vec::new(),
    ))
}

/// Most users a shared region may be granted to (each grant is kept and shown).
pub const MAX_GRANTS: usize = 4096;

/// Most bytes of a status reply's body: a frame, less room for the reply around it.
const STATUS_BODY: usize = attune_proto::MAX_FRAME - 1024;

/// The status user `uid` may see, from item `from` on, as much as fits in one frame.
///
/// Root (the operator) sees every workflow and shared region. Another user sees its own
/// workflows, and the shared regions it may open (their granted users only if it owns
/// them); other users' workflows and regions are summed in `others`: names, uids and
/// pids of other users' jobs are theirs (as Slurm's `PrivateData=jobs` keeps them), while
/// the totals still tell a user why its grant is what it is.
pub fn status_for(st: &State, uid: u32, from: u64) -> attune_proto::Status {
    let mut s = st.status();
    if uid != 0 {
        let mut o = attune_proto::OthersStatus::default();
        s.workflows.retain(|w| {
            if w.uid == uid {
                return true;
            }
            o.workflows += 1;
            o.processes += w.processes;
            o.want += w.want;
            o.grant += w.grant;
            o.resident += w.resident;
            false
        });
        s.shared.retain_mut(|r| {
            if !st.shared.contains_key(&r.name) || !may_open(st, &r.name, uid) {
                o.shared_regions += 1;
                o.shared_bytes += r.size;
                return false;
            }
            if r.owner != uid {
                r.granted_uids.clear();
            }
            true
        });
        s.others = Some(o);
    }
    page(s, from)
}

/// Keeps the items (workflows, then shared regions) from `from` on that fit in
/// [`STATUS_BODY`], at least one; `next` says where the rest starts.
fn page(mut s: attune_proto::Status, from: u64) -> attune_proto::Status {
    let wf = std::mem::take(&mut s.workflows);
    let sh = std::mem::take(&mut s.shared);
    // The rest of the reply, and room for `next`.
    let mut size = json_len(&s) + 32;
    let nw = wf.len();
    let total = nw + sh.len();
    let mut i = (from as usize).min(total);
    let first = i;
    while i < total {
        let add = 1 + if i < nw {
            json_len(&wf[i])
        } else {
            json_len(&sh[i - nw])
        };
        if size + add > STATUS_BODY && i > first {
            break;
        }
        size += add;
        if i < nw {
            s.workflows.push(wf[i].clone());
        } else {
            s.shared.push(sh[i - nw].clone());
        }
        i += 1;
    }
    s.next = (i < total).then_some(i as u64);
    s
}

/// Bytes of a value's JSON (a value that cannot be encoded counts as too large).
fn json_len<T: serde::Serialize>(v: &T) -> usize {
    serde_json::to_vec(v).map_or(usize::MAX / 4, |v| v.len())
}

/// The Slurm job a process runs in, from its `/proc/PID/cgroup`: the `job_N` component
/// slurmd gives its cgroups (v1 `/slurm_NODE/uid_U/job_N/step_S/task_T`, v2
/// `/system.slice/slurmstepd.scope/job_N/...`). Set by slurmd, not by the user, so the
/// metrics' job label cannot be forged with a workflow name.
pub fn slurm_job(cgroup: &str) -> String {
    cgroup
        .lines()
        .filter_map(|l| l.splitn(3, ':').nth(2))
        .flat_map(|path| path.split('/'))
        .filter_map(|c| c.strip_prefix("job_"))
        .find(|n| !n.is_empty() && n.len() <= 20 && n.bytes().all(|b| b.is_ascii_digit()))
        .unwrap_or_default()
        .to_string()
}

pub use attune::topology::cgroup_memory_limit as memory_limit;

fn valid_workflow(n: &str) -> bool {
    !n.is_empty() && n.len() <= 128 && n.bytes().all(|b| b.is_ascii_graphic())
}

fn may_open(st: &State, name: &str, uid: u32) -> bool {
    let s = &st.shared[name];
    uid == s.owner || uid == 0 || s.granted.contains(&uid)
}

/// One request of client `id` (registered with [`State::add_client`], user `uid` by its
/// kernel credentials): the reply to send, if any, with its descriptor. No socket is read
/// here, so the daemon's fuzz target and tests drive it directly.
pub fn handle(
    st: &mut State,
    id: u64,
    uid: u32,
    req: Request,
    fds: Vec<OwnedFd>,
) -> Option<(Reply, Vec<OwnedFd>)> {
    match req {
        Request::Ping { id: rid } => Some((Reply::Pong { id: rid }, Vec::new())),
        Request::Status { id: rid, from } => Some((
            Reply::Status {
                id: rid,
                status: Box::new(status_for(st, uid, from)),
            },
            Vec::new(),
        )),
        Request::Hello {
            version,
            workflow,
            flags,
            want,
            protected,
            shared,
            pool,
            pool_held,
            board,
            fds: _,
        } => {
            let refuse = |st: &mut State, m: String| {
                st.rejected += 1;
                crate::log_user(uid, &format!("client {id} uid {uid}: hello refused: {m}"));
                err(0, libc::EINVAL, m)
            };
            if version != attune_proto::VERSION {
                return refuse(
                    st,
                    format!(
                        "protocol version {version}, this daemon speaks {}",
                        attune_proto::VERSION
                    ),
                );
            }
            if !valid_workflow(&workflow) {
                return refuse(
                    st,
                    format!("workflow name {workflow:?}: 1-128 printable characters"),
                );
            }
            let Ok(f) = Flags::parse(&flags) else {
                return refuse(st, format!("flags {flags:?}"));
            };
            if st.clients[&id].reg.is_some() {
                return refuse(st, "hello twice on one connection".into());
            }
            if shared.len() + pool_held as usize != fds.len() || (pool_held && !pool) {
                return refuse(st, "shared regions and descriptors do not match".into());
            }
            let mut fds = fds;
            let held = if pool_held { fds.pop() } else { None };
            // Re-registration after a daemon restart: the client still maps these regions.
            for (h, fd) in shared.into_iter().zip(fds) {
                readopt(st, id, uid, h, fd);
            }
            let (segment, new_segment) = match (pool, held) {
                (false, _) => (None, false),
                (true, Some(fd)) => (readopt_pool(st, id, uid, fd), false),
                (true, None) => (new_pool_segment(st, id, uid), true),
            };
            let want = want
                .min(st.cfg.dram)
                .min(st.clients[&id].placement.mem_limit);
            let c = st.clients.get_mut(&id).unwrap();
            c.reg = Some(crate::state::Registration {
                workflow,
                flags: f,
                want,
                protected: protected.min(want),
                usage: Default::default(),
                grant: 0,
                seq: 0,
                move_limit: 0,
                // Until its first report, a newcomer is assumed to want the floor.
                far_want: st.cfg.min_grant,
                far_grant: None,
                welcomed: false,
                pool: segment,
                peers_told: None,
                board_slot: None,
                board_asked: board,
                boards_sent: 0,
                left_boards: Vec::new(),
            });
            st.rebalance();
            st.clients
                .get_mut(&id)
                .unwrap()
                .reg
                .as_mut()
                .unwrap()
                .welcomed = true;
            // The group's runtimes hear of the newcomer, and it of them, at once: they
            // divide the free room below its limit by their number. (The client takes a
            // `Peers` sent before its welcome too.)
            let group = st.clients[&id].placement.clone();
            st.tell_peers(&group);
            let r = st.clients.get_mut(&id).unwrap().reg.as_mut().unwrap();
            let size = r.pool.as_ref().map(|p| p.target);
            // A new segment's file goes with the welcome (the client maps it).
            let fd = match r.pool.as_ref().filter(|_| new_segment) {
                Some(p) => match attune_sys::unix::dup(&p.file) {
                    Ok(f) => Some(f),
                    Err(e) => {
                        crate::log(&format!("client {id}: cannot pass its pool segment: {e}"));
                        r.pool = None;
                        None
                    }
                },
                None => None,
            };
            let size = size.filter(|_| r.pool.is_some());
            let (grant, seq, move_limit, far_grant) = (r.grant, r.seq, r.move_limit, r.far_grant);
            // The group's board goes after the segment (the client takes the last first).
            let (slot, board_fd) = match board.then(|| st.join_board(id)).flatten() {
                Some((slot, f)) => (Some(slot), Some(f)),
                None => (None, None),
            };
            let fds: Vec<OwnedFd> = fd.into_iter().chain(board_fd).collect();
            Some((
                Reply::Welcome {
                    client: id,
                    grant,
                    seq,
                    move_limit,
                    far_grant,
                    pool: size,
                    board: slot,
                    fds: fds.len(),
                },
                fds,
            ))
        }
        Request::Usage(u) => {
            st.usage(id, u);
            None
        }
        Request::SharedOpen {
            id: rid,
            name,
            size,
            flags,
        } => shared_open(st, id, uid, rid, name, size, flags),
        Request::SharedClose { id: rid, name } => {
            let c = st.clients.get_mut(&id).unwrap();
            match c.shared_refs.get_mut(&name) {
                Some(n) => {
                    *n -= 1;
                    if *n == 0 {
                        c.shared_refs.remove(&name);
                    }
                    st.release_if_unused(&name);
                    crate::state::request_rebalance();
                    Some((Reply::Ok { id: rid }, Vec::new()))
                }
                None => err(
                    rid,
                    libc::ENOENT,
                    format!("shared region '{name}' is not open in this process"),
                ),
            }
        }
        req @ Request::Stage { .. } => Some((
            crate::stage::run(&mut |step| step(st), id, uid, req, fds, None),
            Vec::new(),
        )),
        Request::Unstage { id: rid, name } => {
            Some((crate::stage::unstage(st, uid, rid, &name), Vec::new()))
        }
        Request::Rejoin {
            id: rid,
            shared,
            fds: _,
        } => {
            if shared.len() != fds.len() {
                st.rejected += 1;
                return err(
                    rid,
                    libc::EINVAL,
                    "shared regions and descriptors do not match",
                );
            }
            for (h, fd) in shared.into_iter().zip(fds) {
                readopt(st, id, uid, h, fd);
            }
            crate::state::request_rebalance();
            Some((Reply::Ok { id: rid }, Vec::new()))
        }
        Request::SharedGrant {
            id: rid,
            name,
            uid: to,
        } => {
            match st.shared.get_mut(&name) {
                None => err(rid, libc::ENOENT, format!("no shared region '{name}'")),
                Some(s) if s.owner != uid => {
                    st.rejected += 1;
                    err(rid, libc::EPERM, format!("shared region '{name}' belongs to uid {}; only its owner grants access", s.owner))
                }
                Some(s) if s.granted.len() >= MAX_GRANTS && !s.granted.contains(&to) => err(
                    rid,
                    libc::ENOSPC,
                    format!("shared region '{name}' is granted to {MAX_GRANTS} users already"),
                ),
                Some(s) => {
                    s.granted.insert(to);
                    crate::log_user(
                        uid,
                        &format!("shared region '{name}': uid {uid} granted uid {to}"),
                    );
                    Some((Reply::Ok { id: rid }, Vec::new()))
                }
            }
        }
    }
}

fn shared_open(
    st: &mut State,
    cid: u64,
    uid: u32,
    rid: u64,
    name: String,
    size: u64,
    flags: String,
) -> Option<(Reply, Vec<OwnedFd>)> {
    if !valid_name(&name) {
        return err(
            rid,
            libc::EINVAL,
            format!("shared region name {name:?}: 1-64 characters of A-Z a-z 0-9 . _ -"),
        );
    }
    if Flags::parse(&flags).is_err() {
        return err(rid, libc::EINVAL, format!("flags {flags:?}"));
    }
    let created = if let Some(s) = st.shared.get(&name) {
        if !s.ready {
            return err(
                rid,
                libc::EAGAIN,
                format!("shared region '{name}' is still being staged; open it once `attune stage` has returned"),
            );
        }
        if !may_open(st, &name, uid) {
            st.rejected += 1;
            crate::log_user(
                uid,
                &format!(
                    "uid {uid} refused shared region '{name}' of uid {}",
                    s.owner
                ),
            );
            return err(
                rid,
                libc::EACCES,
                format!(
                    "shared region '{name}' belongs to another user, who has not granted uid {uid}"
                ),
            );
        }
        if size != 0 && size != s.size {
            return err(
                rid,
                libc::EINVAL,
                format!(
                    "shared region '{name}' exists with {} bytes, not {size}",
                    s.size
                ),
            );
        }
        false
    } else {
        if size == 0 {
            return err(
                rid,
                libc::ENOENT,
                format!("no shared region '{name}' (give a size to create it)"),
            );
        }
        let room = st.cfg.shared_max.saturating_sub(st.shared_bytes());
        if size > room {
            return err(
                rid,
                libc::ENOMEM,
                format!(
                    "shared region '{name}' of {size} bytes: only {room} bytes left of shared_max"
                ),
            );
        }
        let file = match attune_sys::unix::memfd_sized(&format!("attune-shared:{name}"), size) {
            Ok(f) => f,
            Err(e) => {
                return err(
                    rid,
                    e.0,
                    format!("cannot create shared region '{name}': {e}"),
                )
            }
        };
        crate::log_user(
            uid,
            &format!("shared region '{name}' created by uid {uid}: {size} bytes, flags {flags}"),
        );
        st.shared.insert(
            name.clone(),
            crate::state::SharedRegion::opened(uid, flags, size, file),
        );
        true
    };
    let s = &st.shared[&name];
    let (size, owner) = (s.size, s.owner);
    // A staged input is sealed against writes: its openers map it read-only.
    let read_only = attune_sys::unix::is_write_sealed(&s.file);
    let fd = match attune_sys::unix::dup(&s.file) {
        Ok(f) => f,
        Err(e) => {
            st.release_if_unused(&name);
            return err(rid, e.0, format!("cannot pass shared region '{name}': {e}"));
        }
    };
    *st.clients
        .get_mut(&cid)
        .unwrap()
        .shared_refs
        .entry(name.clone())
        .or_default() += 1;
    if created {
        crate::state::request_rebalance();
    }
    Some((
        Reply::Shared {
            id: rid,
            name,
            size,
            created,
            owner,
            read_only,
            fds: 1,
        },
        vec![fd],
    ))
}

/// A new, empty segment of the node's far pool for client `cid` (None: the node has no
/// far pool, or no memory file could be made). Its size follows the client's far grant
/// from the next rebalance on.
fn new_pool_segment(st: &mut State, cid: u64, uid: u32) -> Option<crate::state::PoolSegment> {
    st.cfg.far_pool?;
    match attune_sys::unix::pool_memfd(&format!("attune-pool:{uid}:{cid}")) {
        Ok(file) => Some(crate::state::PoolSegment {
            file,
            size: 0,
            target: 0,
            target_seq: 0,
            top: 0,
        }),
        Err(e) => {
            crate::log(&format!("client {cid} uid {uid}: no pool segment: {e}"));
            None
        }
    }
}

/// A pool segment a client still maps, brought back after a daemon restart: its pages
/// hold the client's data, so it is kept whole (never shrunk below what the client
/// reports it uses). It is a claim on the far pool like a new grant, and any local user
/// can make one: it must be a memory file, and its real size must fit what is left of
/// the far pool; otherwise it is not adopted (the client keeps its mapping and its data,
/// and stores to the next tier).
fn readopt_pool(
    st: &mut State,
    cid: u64,
    uid: u32,
    fd: OwnedFd,
) -> Option<crate::state::PoolSegment> {
    let far_pool = st.cfg.far_pool?;
    let refuse = |st: &mut State, why: String| {
        st.rejected += 1;
        crate::log_user(
            uid,
            &format!("client {cid} uid {uid}: re-registered pool segment not adopted: {why}"),
        );
        None
    };
    if !attune_sys::unix::is_memfd(&fd) {
        return refuse(st, "not a memory file".into());
    }
    let Ok(size) = attune_sys::unix::fd_size(&fd) else {
        return refuse(st, "its size cannot be read".into());
    };
    let room = far_pool.saturating_sub(st.pool_bytes());
    if size > room || size % attune_proto::POOL_UNIT != 0 {
        return refuse(st, format!("{size} bytes, {room} bytes left of far_pool"));
    }
    crate::log_user(
        uid,
        &format!("client {cid} uid {uid}: pool segment re-adopted ({size} bytes)"),
    );
    Some(crate::state::PoolSegment {
        file: fd,
        size,
        target: size,
        target_seq: 0,
        top: size,
    })
}

/// Most references one process may declare for a re-registered region (its opens of it).
const MAX_READOPT_REFS: u32 = 1 << 16;

/// A region a client still maps, brought back after a daemon restart. The first
/// re-registrant's file is kept; a name held by another owner is not taken over (the
/// client keeps its own mapping; new opens see the first owner's region).
///
/// A staged input (its file sealed against writes) gets the daemon's own reference back
/// from its first re-registrant, as `attune stage` gave it: tied to the re-registrant's
/// Slurm job, or, outside a job, until `attune unstage`; each later re-registrant's job
/// keeps it too, as a reuse does. One the daemon no longer holds (unstaged since the
/// restart) is not held again.
///
/// A re-registration is a claim like `shared_open`, and any local user can make one: the
/// file must be a sealed memory file, its real size (not a declared one) must fit what is
/// left of `shared_max` (else one claim of a sparse 1 TiB file took every workflow's
/// grant), the flags must parse (they are shown by `attune status`, so they are stored in
/// their canonical form), and the references are bounded.
fn readopt(st: &mut State, cid: u64, uid: u32, h: attune_proto::SharedHeld, fd: OwnedFd) {
    let ignore = |st: &mut State, why: String| {
        st.rejected += 1;
        crate::log_user(
            uid,
            &format!(
                "client {cid} uid {uid}: re-registered shared region {:?} not adopted: {why}",
                h.name
            ),
        );
    };
    if !valid_name(&h.name) {
        return ignore(st, "not a region name".into());
    }
    let Ok(flags) = Flags::parse(&h.flags) else {
        return ignore(st, "unknown flags".into());
    };
    if h.refs == 0 || h.refs > MAX_READOPT_REFS {
        return ignore(st, format!("{} references (1-{MAX_READOPT_REFS})", h.refs));
    }
    if !attune_sys::unix::is_sealed_memfd(&fd) {
        return ignore(st, "not a sealed memory file".into());
    }
    let mut new_staged = false;
    match st.shared.get(&h.name) {
        Some(s) if s.owner != uid && !s.granted.contains(&uid) => {
            let owner = s.owner;
            return ignore(st, format!("held by uid {owner}"));
        }
        Some(_) => {}
        None => {
            let Ok(size) = attune_sys::unix::fd_size(&fd) else {
                return ignore(st, "its size cannot be read".into());
            };
            let room = st.cfg.shared_max.saturating_sub(st.shared_bytes());
            if size == 0 || size > room {
                return ignore(st, format!("{size} bytes, {room} bytes left of shared_max"));
            }
            crate::log_user(
                uid,
                &format!(
                    "shared region '{}' re-adopted from uid {uid} ({size} bytes)",
                    h.name
                ),
            );
            new_staged = attune_sys::unix::is_write_sealed(&fd);
            st.shared.insert(
                h.name.clone(),
                crate::state::SharedRegion::opened(uid, flags.to_string(), size, fd),
            );
        }
    }
    // The first re-registrant's job keeps it (outside a job: `unstage`); a later one's job
    // keeps it too, as a reuse does.
    let stager = crate::stage::stager_of(st, cid);
    let r = st.shared.get_mut(&h.name).unwrap();
    if new_staged || (r.staged() && stager.is_some()) {
        r.hold_for(stager);
    }
    let refs = st
        .clients
        .get_mut(&cid)
        .unwrap()
        .shared_refs
        .entry(h.name)
        .or_default();
    *refs = refs.saturating_add(h.refs).min(MAX_READOPT_REFS);
}

#[cfg(test)]
mod tests {
    use super::*;
    use attune_proto::SharedHeld;
    use std::os::unix::net::UnixStream;
    use std::sync::{Arc, Mutex};

    #[test]
    fn a_process_that_ended_lends_no_cgroup_through_its_proc_directory() {
        let mut child = std::process::Command::new("sleep")
            .arg("100")
            .spawn()
            .unwrap();
        let dir = std::fs::File::open(format!("/proc/{}", child.id())).unwrap();
        let mine = std::fs::read_to_string("/proc/self/cgroup").unwrap();
        let alive = placement(Some(&dir)).expect("a live process has a cgroup");
        assert_eq!(alive.job, slurm_job(&mine));
        child.kill().unwrap();
        child.wait().unwrap();
        // Its pid may be given to another process now; the directory held is its own.
        assert!(placement(Some(&dir)).is_none());
        assert!(placement(None).is_none());
    }

    fn state() -> (State, Vec<UnixStream>) {
        let o = |k: &'static str, v: &str| (k, v.to_string());
        let cfg = crate::config::load(
            None,
            &[
                o("dram", "1G"),
                o("shared_max", "8M"),
                o("socket", "/nonexistent/attuned.sock"),
                o("metrics", "off"),
            ],
            4 << 30,
            None,
        )
        .unwrap();
        (State::new(cfg, Vec::new()), Vec::new())
    }

    fn client(st: &mut State, keep: &mut Vec<UnixStream>, uid: u32) -> u64 {
        let (a, b) = UnixStream::pair().unwrap();
        a.set_nonblocking(true).unwrap();
        keep.push(b);
        let pid = std::process::id() as i32;
        st.add_client(pid, uid, Default::default(), Arc::new(Mutex::new(a)))
    }

    /// A memory file as `attune stage` leaves one (`staged`) or as `shared_open` makes one.
    fn file(staged: bool) -> OwnedFd {
        if staged {
            let f = attune_sys::unix::memfd_growable("t").unwrap();
            let mut w = std::fs::File::from(attune_sys::unix::dup(&f).unwrap());
            std::io::Write::write_all(&mut w, &[7u8; 1 << 20]).unwrap();
            drop(w);
            attune_sys::unix::seal_read_only(&f).unwrap();
            f
        } else {
            attune_sys::unix::memfd_sized("t", 1 << 20).unwrap()
        }
    }

    fn rejoin(st: &mut State, cid: u64, uid: u32, name: &str, fds: Vec<OwnedFd>) -> Reply {
        let shared = vec![SharedHeld {
            name: name.into(),
            flags: "CAP".into(),
            refs: 1,
        }];
        let req = Request::Rejoin {
            id: 9,
            shared,
            fds: fds.len(),
        };
        handle(st, cid, uid, req, fds).unwrap().0
    }

    fn assert_ok(r: Reply) {
        assert!(matches!(r, Reply::Ok { id: 9 }), "{r:?}");
    }

    #[test]
    fn a_rejoin_gives_a_staged_input_its_daemon_reference_back() {
        let (mut st, mut keep) = state();
        let a = client(&mut st, &mut keep, 1000);
        assert_ok(rejoin(&mut st, a, 1000, "in", vec![file(true)]));
        let r = &st.shared["in"];
        // Outside a Slurm job: held until `attune unstage`, as a stage by hand is.
        assert!(r.staged() && r.by_hand && r.owner == 1000 && r.size == 1 << 20);
        assert_eq!(st.clients[&a].shared_refs["in"], 1);
        // Another user's file under the same name is not taken, nor referenced.
        let b = client(&mut st, &mut keep, 1001);
        assert_ok(rejoin(&mut st, b, 1001, "in", vec![file(true)]));
        assert!(!st.clients[&b].shared_refs.contains_key("in"));
        assert_eq!(st.shared["in"].owner, 1000);
        // Unstaged since the restart: a later re-registration does not hold it again.
        st.shared.get_mut("in").unwrap().by_hand = false;
        assert_ok(rejoin(&mut st, a, 1000, "in", vec![file(true)]));
        assert!(!st.shared["in"].staged());
        assert_eq!(st.clients[&a].shared_refs["in"], 2);
    }

    #[test]
    fn a_rejoin_of_a_writable_region_takes_no_daemon_reference() {
        let (mut st, mut keep) = state();
        let a = client(&mut st, &mut keep, 1000);
        assert_ok(rejoin(&mut st, a, 1000, "rw", vec![file(false)]));
        assert!(!st.shared["rw"].staged());
        // Nothing beyond shared_max (8 MiB) is adopted: a sparse claim takes nothing.
        let big = attune_sys::unix::memfd_sized("t", 64 << 20).unwrap();
        assert_ok(rejoin(&mut st, a, 1000, "big", vec![big]));
        assert!(!st.shared.contains_key("big"));
    }

    #[test]
    fn a_rejoin_whose_descriptors_do_not_match_is_refused() {
        let (mut st, mut keep) = state();
        let a = client(&mut st, &mut keep, 1000);
        match rejoin(&mut st, a, 1000, "in", Vec::new()) {
            Reply::Error { errno, .. } => assert_eq!(errno, libc::EINVAL),
            r => panic!("{r:?}"),
        }
        assert!(st.shared.is_empty());
    }
}
