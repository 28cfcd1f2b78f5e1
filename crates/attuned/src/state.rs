//! The daemon's state: connected clients, the workflows they form, budgets, shared
//! regions. One mutex guards it; every handler holds it for a short step that makes no
//! system call on a client's socket: the grants a rebalance computes wait in `outbox`
//! and are sent once the lock is released ([`lock`]). Sent under the lock, each grant
//! woke a runtime that preempted the daemon's thread, so a registration held the lock
//! 36 ms at the median (83 ms at most) through a cold start of 150 instances, and the
//! others waited for it: seconds for a welcome (docs/design/daemon.md, "No socket write
//! under the state lock"). Pushes use a write timeout, so a client that stops reading
//! cannot stall the daemon.

use crate::config::DaemonConfig;
use attune_policy::{share, Flags};
use attune_proto::{Reply, SharedStatus, Status, Usage, WorkflowStatus};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// The write side of one connection (frames from several threads must not interleave).
pub type Writer = Arc<Mutex<UnixStream>>;

/// The state, locked ([`lock`]): the grants its rebalances queued are sent when it is
/// dropped, after the lock is released. Grants sent out of order are harmless: a runtime
/// ignores one older than the last it applied (their `seq`).
pub struct Locked<'a>(Option<std::sync::MutexGuard<'a, State>>);

/// Locks the state (a poisoned lock is taken over: the state is kept consistent step by
/// step).
pub fn lock(s: &Mutex<State>) -> Locked<'_> {
    Locked(Some(s.lock().unwrap_or_else(|p| p.into_inner())))
}

impl std::ops::Deref for Locked<'_> {
    type Target = State;
    fn deref(&self) -> &State {
        self.0.as_ref().expect("held until dropped")
    }
}

impl std::ops::DerefMut for Locked<'_> {
    fn deref_mut(&mut self) -> &mut State {
        self.0.as_mut().expect("held until dropped")
    }
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        let Some(mut g) = self.0.take() else { return };
        let out = std::mem::take(&mut g.outbox);
        drop(g);
        for (w, msg) in out {
            push(&w, &msg);
        }
    }
}

/// Where a client's process runs, as the kernel and slurmd say (not the client).
#[derive(Clone, Debug, PartialEq)]
pub struct Placement {
    /// The Slurm job, from the process's cgroup path (empty: none).
    pub job: String,
    /// The tightest memory limit of its cgroup and their ancestors (u64::MAX: none). A
    /// process cannot keep more DRAM resident than this, so it may not claim more.
    pub mem_limit: u64,
    /// The directory of the cgroup whose limit that is (empty: none): runtimes in one such
    /// group share its limit, and are told what the others hold (`State::tell_peers`).
    /// Read at connection and again about once a second while the process reports
    /// (`State::replace_placement`).
    pub mem_group: String,
}

impl Default for Placement {
    fn default() -> Self {
        Placement {
            job: String::new(),
            mem_limit: u64::MAX,
            mem_group: String::new(),
        }
    }
}

pub struct Client {
    pub pid: i32,
    pub uid: u32,
    pub placement: Placement,
    pub writer: Writer,
    /// Set by `Hello`: the workflow this process belongs to, and its request.
    pub reg: Option<Registration>,
    /// Shared regions this connection holds, with its reference count of each.
    pub shared_refs: HashMap<String, u32>,
}

pub struct Registration {
    pub workflow: String,
    pub flags: Flags,
    pub want: u64,
    pub protected: u64,
    pub usage: Usage,
    pub grant: u64,
    pub seq: u64,
    pub move_limit: u64,
    /// Far memory it wants (its last report) and is granted (None: the daemon does not
    /// divide far memory).
    pub far_want: u64,
    pub far_grant: Option<u64>,
    /// The welcome (with the first grant) is produced: later changes are pushed.
    pub welcomed: bool,
    /// Its segment of the node's far pool, if it has a `pool` tier and the node a pool.
    pub pool: Option<PoolSegment>,
    /// What it was last told its group's other runtimes hold, and their number
    /// (`Reply::Peers`).
    pub peers_told: Option<(u64, u32)>,
    /// Its slot on its group's board (`State::join_board`).
    pub board_slot: Option<u32>,
    /// It reads boards (`Hello { board }`): a move to another group sends it the new one.
    pub board_asked: bool,
    /// `Reply::Board` sent on this connection, and the slots of the boards it left, kept
    /// until its report counts them all (`Usage::boards`): until then it may still write
    /// there, and a newcomer given the slot would read its figure as its own.
    pub boards_sent: u64,
    pub left_boards: Vec<(String, u32)>,
}

/// The board of one memory cgroup's runtimes (`attune_proto::BOARD_WORDS`): the memory
/// file every runtime welcomed in the group maps, each writing its resident bytes in its
/// slot. Word 0 is their number. Only runtimes whose limiting cgroup is this one (read
/// from the kernel at connection) get it: the figures are no secret to them (the group's
/// usage shows their sum), and a runtime that writes false ones can only mislead its own
/// job's runtimes, which share its limit anyway.
pub struct Board {
    words: attune_sys::unix::SharedWords,
    used: Vec<bool>,
    members: u64,
}

/// One runtime's segment of the node's far pool (docs/design/pool.md): a memory file
/// whose pages this daemon allocates, so they are charged to its cgroup, not the job's.
pub struct PoolSegment {
    pub file: OwnedFd,
    /// Bytes allocated (the file's size).
    pub size: u64,
    /// The size granted last: the runtime takes units below it.
    pub target: u64,
    /// The grant sequence number that set `target`.
    pub target_seq: u64,
    /// What the runtime may still touch, by its last report made after it saw `target`.
    pub top: u64,
}

impl PoolSegment {
    /// Grows the file to `target` (allocating now) or shrinks it as far as the runtime
    /// allows; returns the size the runtime is told (less than `target` when the node
    /// could not allocate more).
    fn resize(&mut self, target: u64, seq: u64, who: &str) -> u64 {
        let target = target / attune_proto::POOL_UNIT * attune_proto::POOL_UNIT;
        if target > self.size {
            match attune_sys::unix::resize_allocated(&self.file, self.size, target) {
                Ok(()) => self.size = target,
                Err(e) => crate::log(&format!(
                    "{who}: pool segment not grown from {} to {} bytes: {e}",
                    self.size, target
                )),
            }
        }
        if target != self.target {
            self.target_seq = seq;
        }
        self.target = target.min(self.size);
        self.shrink();
        self.target
    }

    /// Frees what lies above both the granted size and the runtime's last promise.
    fn shrink(&mut self) {
        let keep =
            self.target.max(self.top).div_ceil(attune_proto::POOL_UNIT) * attune_proto::POOL_UNIT;
        if keep < self.size
            && attune_sys::unix::resize_allocated(&self.file, self.size, keep).is_ok()
        {
            self.size = keep;
        }
    }
}

pub struct SharedRegion {
    pub owner: u32,
    pub flags: String,
    /// Bytes it takes from the pool (while being staged: what is reserved so far).
    pub size: u64,
    pub file: OwnedFd,
    pub granted: HashSet<u32>,
    /// False while a staged input is being copied in: nobody may open it yet.
    pub ready: bool,
    /// What keeps a staged input in the daemon (its own reference): the Slurm jobs that
    /// staged or reused it, each with its cgroup directory (gone: the job has ended), and
    /// `by_hand`, staged outside any job (until `attune unstage`).
    pub stagers: Vec<(String, std::path::PathBuf)>,
    pub by_hand: bool,
}

/// Jobs one staged input keeps track of (a job array's tasks each reuse it).
pub const MAX_STAGERS: usize = 1024;

impl SharedRegion {
    /// A region `shared_open` (or a re-registration) creates: writable, no daemon reference.
    pub fn opened(owner: u32, flags: String, size: u64, file: OwnedFd) -> SharedRegion {
        SharedRegion {
            owner,
            flags,
            size,
            file,
            granted: Default::default(),
            ready: true,
            stagers: Vec::new(),
            by_hand: false,
        }
    }

    /// The daemon holds a reference of its own (a staged input not yet unstaged).
    pub fn staged(&self) -> bool {
        self.by_hand || !self.stagers.is_empty()
    }

    /// Takes the daemon's own reference for `stager`'s job (a stage, a reuse, a
    /// re-registration after a restart), or, outside a job, until `attune unstage`. A job
    /// is listed once; past [`MAX_STAGERS`] jobs the earlier ones keep it.
    pub fn hold_for(&mut self, stager: Option<(String, std::path::PathBuf)>) {
        match stager {
            Some(j) if self.stagers.iter().any(|(id, _)| *id == j.0) => {}
            Some(j) if self.stagers.len() < MAX_STAGERS => self.stagers.push(j),
            Some(_) => {}
            None => self.by_hand = true,
        }
    }

    /// The jobs that keep it, as `attune status` shows them.
    pub fn jobs(&self) -> String {
        let ids: Vec<&str> = self.stagers.iter().map(|(j, _)| j.as_str()).collect();
        match ids.len() {
            0..=8 => ids.join(","),
            n => format!("{},... ({n} jobs)", ids[..8].join(",")),
        }
    }
}

/// A shrinking rebalance in progress: clients that must acknowledge, and since when.
struct Reclaim {
    started: Instant,
    waiting: HashMap<u64, u64>,
}

pub struct State {
    pub cfg: DaemonConfig,
    pub started: Instant,
    pub clients: HashMap<u64, Client>,
    pub shared: BTreeMap<String, SharedRegion>,
    next_client: u64,
    pub requests: u64,
    pub rejected: u64,
    pub rebalances: u64,
    /// Grants pushed by rebalances (`Status::grants_pushed`).
    pub grants_pushed: u64,
    /// Grants to send once the lock is released ([`Locked`]).
    outbox: Vec<(Writer, Reply)>,
    reclaim: Option<Reclaim>,
    pub last_reclaim_ms: Option<f64>,
    pub tiers: Vec<attune_proto::TierStatus>,
    /// What `attune_sys::probe` found this node's kernel lacks or refuses (set at start).
    pub kernel_fallbacks: Vec<String>,
    /// The boards of memory cgroups with runtimes, by group directory.
    boards: HashMap<String, Board>,
}

impl State {
    pub fn new(cfg: DaemonConfig, tiers: Vec<attune_proto::TierStatus>) -> State {
        State {
            cfg,
            started: Instant::now(),
            clients: HashMap::new(),
            shared: BTreeMap::new(),
            next_client: 1,
            requests: 0,
            rejected: 0,
            rebalances: 0,
            grants_pushed: 0,
            outbox: Vec::new(),
            reclaim: None,
            last_reclaim_ms: None,
            kernel_fallbacks: Vec::new(),
            tiers,
            boards: HashMap::new(),
        }
    }

    /// Gives the registered client `id` a slot on its memory cgroup's board, creating the
    /// board for the group's first runtime: the slot and the board's file to pass. None
    /// without a limited group, with all 4095 slots taken, or when the file cannot be
    /// made (then `Peers` alone tells it of the others).
    pub fn join_board(&mut self, id: u64) -> Option<(u32, OwnedFd)> {
        let c = self.clients.get(&id)?;
        let group = &c.placement;
        if group.mem_group.is_empty() || group.mem_limit == u64::MAX {
            return None;
        }
        if !self.boards.contains_key(&group.mem_group) {
            let words = match attune_sys::unix::SharedWords::create(
                "attune-board",
                attune_proto::BOARD_WORDS,
            ) {
                Ok(w) => w,
                Err(e) => {
                    crate::log(&format!(
                        "no board for memory cgroup {}: {e:?}",
                        group.mem_group
                    ));
                    return None;
                }
            };
            let board = Board {
                words,
                used: vec![false; attune_proto::BOARD_WORDS],
                members: 0,
            };
            self.boards.insert(group.mem_group.clone(), board);
        }
        let key = group.mem_group.clone();
        let b = self.boards.get_mut(&key)?;
        let slot = (1..attune_proto::BOARD_WORDS).find(|&i| !b.used[i])?;
        let fd = attune_sys::unix::dup(b.words.fd()).ok()?;
        b.used[slot] = true;
        b.members += 1;
        b.words.words()[slot].store(0, std::sync::atomic::Ordering::Relaxed);
        b.words.words()[0].store(b.members, std::sync::atomic::Ordering::Relaxed);
        if let Some(r) = self.clients.get_mut(&id).and_then(|c| c.reg.as_mut()) {
            r.board_slot = Some(slot as u32);
        }
        Some((slot as u32, fd))
    }

    /// A runtime left its group's board: its slot reads 0 and is free again; the board
    /// goes with the group's last runtime.
    fn leave_board(&mut self, group: &str, slot: u32) {
        let Some(b) = self.boards.get_mut(group) else {
            return;
        };
        let slot = slot as usize;
        if slot == 0 || slot >= b.used.len() || !b.used[slot] {
            return;
        }
        b.used[slot] = false;
        b.members -= 1;
        b.words.words()[slot].store(0, std::sync::atomic::Ordering::Relaxed);
        b.words.words()[0].store(b.members, std::sync::atomic::Ordering::Relaxed);
        if b.members == 0 {
            self.boards.remove(group);
        }
    }

    pub fn add_client(&mut self, pid: i32, uid: u32, placement: Placement, writer: Writer) -> u64 {
        let id = self.next_client;
        self.next_client += 1;
        self.clients.insert(
            id,
            Client {
                pid,
                uid,
                placement,
                writer,
                reg: None,
                shared_refs: HashMap::new(),
            },
        );
        id
    }

    /// A connection ended (exit, SIGKILL, dropped for misbehaving): its references and
    /// its budget return to the pool.
    pub fn remove_client(&mut self, id: u64) {
        if let Some(c) = self.clients.remove(&id) {
            if let Some(p) = c.reg.as_ref().and_then(|r| r.pool.as_ref()) {
                // The daemon's reference goes now; the pages go with the process's mapping.
                crate::log_user(
                    c.uid,
                    &format!(
                        "client {id} uid {}: pool segment of {} MiB released",
                        c.uid,
                        p.size >> 20
                    ),
                );
            }
            for (name, _) in c.shared_refs {
                self.release_if_unused(&name);
            }
            if let Some(r) = &c.reg {
                if let Some(slot) = r.board_slot {
                    self.leave_board(&c.placement.mem_group, slot);
                }
                for (group, slot) in &r.left_boards {
                    self.leave_board(group, *slot);
                }
            }
            if c.reg.is_some() {
                request_rebalance();
                self.tell_peers(&c.placement);
            }
        }
    }

    /// Client `id`'s process is now in `now` (its cgroup, read again from the kernel):
    /// if that changed, it counts in the new group from here on. Its claim is capped by
    /// the new limit at the next rebalance; the old group's runtimes are told it left and
    /// the new group's that it came; it is told it has no peers, then the new group's
    /// (a runtime reads them from its board when it has one). A registered runtime that
    /// reads boards gets the reply to send: its slot on the new group's board, or none.
    /// Its old slot stays reserved until its report counts that reply (`Usage::boards`).
    pub fn replace_placement(&mut self, id: u64, now: Placement) -> Option<(Reply, Vec<OwnedFd>)> {
        let c = self.clients.get_mut(&id)?;
        if c.placement == now {
            return None;
        }
        let old = std::mem::replace(&mut c.placement, now.clone());
        crate::log_user(
            c.uid,
            &format!(
                "client {id} pid {} uid {}: memory cgroup {:?} (limit {}) -> {:?} (limit {}), job {:?} -> {:?}",
                c.pid,
                c.uid,
                old.mem_group,
                show_limit(old.mem_limit),
                now.mem_group,
                show_limit(now.mem_limit),
                old.job,
                now.job
            ),
        );
        let writer = c.writer.clone();
        let r = c.reg.as_mut()?;
        request_rebalance();
        if old.mem_group == now.mem_group {
            // The same group, another limit: its runtimes' step changes, nothing else.
            self.tell_peers(&now);
            return None;
        }
        if let Some(slot) = r.board_slot.take() {
            r.left_boards.push((old.mem_group.clone(), slot));
        }
        // Reports come after the welcome (a `Hello` is answered in one step).
        r.peers_told = Some((0, 0));
        let asked = r.board_asked;
        self.outbox.push((
            writer,
            Reply::Peers {
                resident: 0,
                runtimes: 0,
            },
        ));
        self.tell_peers(&old);
        self.tell_peers(&now);
        if !asked {
            return None;
        }
        let joined = self.join_board(id);
        let r = self.clients.get_mut(&id)?.reg.as_mut()?;
        r.boards_sent += 1;
        let (board, fds) = match joined {
            Some((slot, fd)) => (Some(slot), vec![fd]),
            None => (None, Vec::new()),
        };
        Some((
            Reply::Board {
                board,
                fds: fds.len(),
            },
            fds,
        ))
    }

    /// Tells each welcomed runtime of `group`'s memory cgroup what the other runtimes
    /// there hold resident, when that moved by a step (a 64th of the limit, 4-64 MiB)
    /// since it was last told, and how many they are, when that moved by an eighth (at
    /// least one): the runtimes' `follow_limit` then divides an excess over the limit
    /// among them and the free room below it (`attune_policy::budget::cgroup_cap`)
    /// instead of each giving back or taking all of it. The eighth bounds the pushes of a
    /// cold start of n runtimes in one group to O(n log n), not n²; a count told 12% low
    /// over-commits a twelfth of the free room at most, which the next readings give back
    /// as an excess. Only the sum and the count are told: the group's usage and its
    /// `cgroup.procs` show them anyway.
    pub fn tell_peers(&mut self, group: &Placement) {
        if group.mem_group.is_empty() || group.mem_limit == u64::MAX {
            return;
        }
        let step = (group.mem_limit / 64).clamp(4 << 20, 64 << 20);
        let member = |c: &Client| c.placement.mem_group == group.mem_group;
        let (total, count) = self
            .clients
            .values()
            .filter(|c| member(c))
            .filter_map(|c| c.reg.as_ref())
            .fold((0u64, 0u32), |(t, n), r| (t + r.usage.resident, n + 1));
        for c in self.clients.values_mut() {
            if !member(c) {
                continue;
            }
            let Some(r) = c.reg.as_mut().filter(|r| r.welcomed) else {
                continue;
            };
            let peers = (total - r.usage.resident, count - 1);
            let due = match r.peers_told {
                None => peers != (0, 0),
                Some((t, n)) => {
                    t.abs_diff(peers.0) >= step
                        || (peers.0 == 0 && t != 0)
                        || n.abs_diff(peers.1) >= (n / 8).max(1)
                        || (peers.1 == 0 && n != 0)
                }
            };
            if due {
                r.peers_told = Some(peers);
                self.outbox.push((
                    c.writer.clone(),
                    Reply::Peers {
                        resident: peers.0,
                        runtimes: peers.1,
                    },
                ));
            }
        }
    }

    /// References to a shared region over all connections.
    pub fn shared_refs(&self, name: &str) -> u32 {
        self.clients
            .values()
            .map(|c| c.shared_refs.get(name).copied().unwrap_or(0))
            .sum()
    }

    pub fn release_if_unused(&mut self, name: &str) {
        let held = self
            .shared
            .get(name)
            .is_some_and(|s| s.staged() || !s.ready);
        if !held && self.shared_refs(name) == 0 {
            if self.shared.remove(name).is_some() {
                crate::log(&format!(
                    "shared region '{name}' freed (last reference gone)"
                ));
            }
        }
    }

    /// Bytes of the far pool allocated in runtimes' segments.
    pub fn pool_bytes(&self) -> u64 {
        self.clients
            .values()
            .filter_map(|c| c.reg.as_ref()?.pool.as_ref())
            .map(|p| p.size)
            .sum()
    }

    /// Bytes the shared regions hold back from the workflows' pool.
    pub fn shared_bytes(&self) -> u64 {
        self.shared.values().map(|s| s.size).sum()
    }

    fn pool(&self) -> u64 {
        self.cfg.dram.saturating_sub(self.shared_bytes())
    }

    /// Recomputes every grant; pushes the changed ones. Workflows are (uid, name): two
    /// users choosing the same workflow name are still two workflows.
    pub fn rebalance(&mut self) {
        self.rebalances += 1;
        let mut wfs: BTreeMap<(u32, String), (share::Demand, Vec<u64>)> = BTreeMap::new();
        // The most a workflow's processes can keep resident: the largest of their cgroups'
        // limits (one job's processes share one limit).
        let mut limits: BTreeMap<(u32, String), u64> = BTreeMap::new();
        for (&id, c) in &self.clients {
            if let Some(r) = &c.reg {
                let l = limits.entry((c.uid, r.workflow.clone())).or_insert(0);
                *l = (*l).max(c.placement.mem_limit);
                let e = wfs.entry((c.uid, r.workflow.clone())).or_insert((
                    share::Demand {
                        want: 0,
                        protected: 0,
                        flags: Flags::NONE,
                        owner: c.uid,
                    },
                    Vec::new(),
                ));
                e.0.want = e.0.want.saturating_add(r.want);
                e.0.protected = e.0.protected.saturating_add(r.protected);
                e.0.flags = Flags(e.0.flags.0 | r.flags.0);
                e.1.push(id);
            }
        }
        for (k, w) in wfs.iter_mut() {
            w.0.want = w.0.want.min(limits[k]);
            w.0.protected = w.0.protected.min(w.0.want);
        }
        let demands: Vec<share::Demand> = wfs.values().map(|w| w.0).collect();
        let rules = share::Rules {
            min_grant: self.cfg.min_grant,
            bw_dram_pct: self.cfg.bw_dram_pct,
        };
        let grants = share::grant(self.pool(), rules, &demands);
        let limits = share::move_limits(&demands, self.cfg.move_limit);
        // Far memory (the runtimes' memory tiers), by the same workflows.
        let far_wants: Vec<u64> = wfs
            .values()
            .map(|(_, ids)| {
                ids.iter()
                    .map(|i| self.clients[i].reg.as_ref().map_or(0, |r| r.far_want))
                    .sum()
            })
            .collect();
        let far_demands: Vec<(u64, Flags)> = far_wants
            .iter()
            .zip(&demands)
            .map(|(&w, d)| (w, d.flags))
            .collect();
        let far_grants: Vec<Option<u64>> = match self.cfg.far_pool {
            Some(pool) => share::far_grant(pool, self.cfg.min_grant, &far_demands)
                .into_iter()
                .map(Some)
                .collect(),
            None => vec![None; far_demands.len()],
        };
        let mut shrunk = HashMap::new();
        let mut changed = Vec::new();
        for ((((demand, ids), wf_grant), limit), (wf_far, far_want)) in wfs
            .values()
            .zip(grants)
            .zip(limits)
            .zip(far_grants.into_iter().zip(far_wants))
        {
            for id in ids {
                let c = self.clients.get_mut(id).unwrap();
                let r = c.reg.as_mut().unwrap();
                // Processes of one workflow share its grants in proportion to their wants.
                let part = |whole: u64, mine: u64, all: u64| {
                    if all == 0 {
                        0
                    } else {
                        (whole as u128 * mine as u128 / all as u128) as u64 / 4096 * 4096
                    }
                };
                let g = part(wf_grant, r.want, demand.want);
                let fg = wf_far.map(|f| part(f, r.far_want, far_want));
                if g != r.grant || limit != r.move_limit || fg != r.far_grant {
                    r.seq += 1;
                    if g < r.grant && r.usage.resident > g {
                        shrunk.insert(*id, r.seq);
                    }
                    r.grant = g;
                    r.move_limit = limit;
                    r.far_grant = fg;
                    changed.push(*id);
                }
            }
        }
        self.resize_pool_segments(&mut changed);
        for id in changed {
            let c = &self.clients[&id];
            let r = c.reg.as_ref().unwrap();
            if r.welcomed {
                self.grants_pushed += 1;
                self.outbox.push((
                    c.writer.clone(),
                    Reply::Grant {
                        grant: r.grant,
                        seq: r.seq,
                        move_limit: r.move_limit,
                        far_grant: r.far_grant,
                        pool: r.pool.as_ref().map(|p| p.target),
                    },
                ));
            }
        }
        if !shrunk.is_empty() {
            self.reclaim = Some(Reclaim {
                started: Instant::now(),
                waiting: shrunk,
            });
        }
    }

    /// Sizes every pool segment to its far grant before the grants go out: shrinking
    /// ones first (down to what their runtime still uses), then growing ones within what
    /// is left of `far_pool`, so the segments never hold more than the pool however
    /// slowly a runtime gives units back. A segment whose size changes gets a new grant
    /// (`changed`) even if nothing else did. A segment grows by `POOL_GROW_STEP` a pass at
    /// most.
    fn resize_pool_segments(&mut self, changed: &mut Vec<u64>) {
        let Some(far_pool) = self.cfg.far_pool else {
            return;
        };
        let mut ids: Vec<(i128, u64)> = self
            .clients
            .iter()
            .filter_map(|(&id, c)| {
                let r = c.reg.as_ref()?;
                let p = r.pool.as_ref()?;
                Some((r.far_grant.unwrap_or(0) as i128 - p.size as i128, id))
            })
            .collect();
        ids.sort();
        // One running total: each resize changes it by its own difference.
        let mut total = self.pool_bytes();
        for (_, id) in ids {
            let c = self.clients.get_mut(&id).unwrap();
            let who = format!("client {id} uid {}", c.uid);
            let r = c.reg.as_mut().unwrap();
            let fresh = changed.contains(&id);
            let seq = if fresh { r.seq } else { r.seq + 1 };
            let p = r.pool.as_mut().unwrap();
            let others = total - p.size;
            let mut want = r
                .far_grant
                .unwrap_or(0)
                .min(far_pool.saturating_sub(others));
            if want > p.size + POOL_GROW_STEP {
                // A step now, the rest at the next passes (5 ms apart).
                want = p.size + POOL_GROW_STEP;
                request_rebalance();
            }
            let before = p.target;
            // The segment grows before the runtime hears of it.
            let told = p.resize(want, seq, &who);
            total = others + p.size;
            if told != before && !fresh {
                r.seq = seq;
                changed.push(id);
            }
        }
    }

    /// A client's report; completes a reclaim when the last shrunk client acknowledges.
    pub fn usage(&mut self, id: u64, u: Usage) {
        let Some(limit) = self.clients.get(&id).map(|c| c.placement.mem_limit) else {
            return;
        };
        let Some(r) = self.clients.get_mut(&id).and_then(|c| c.reg.as_mut()) else {
            return;
        };
        let ack = u.ack;
        let flags = Flags::parse(&u.flags).unwrap_or(r.flags);
        let want = if u.want == 0 {
            r.want
        } else {
            u.want.min(self.cfg.dram).min(limit)
        };
        let protected = u.protected.min(want);
        // Far wants follow utilization; a change under a MiB is not worth a rebalance.
        let far_want = u.far_want.min(self.cfg.far_pool.unwrap_or(u64::MAX));
        let far_changed = far_want.abs_diff(r.far_want) >= 1 << 20;
        let want_changed =
            want != r.want || protected != r.protected || flags != r.flags || far_changed;
        if want_changed {
            r.want = want;
            r.protected = protected;
            r.flags = flags;
            r.far_want = far_want;
        }
        // Tier names are shown by `attune status` and label metrics: a few short names
        // of the region-name alphabet, else a report could outgrow a status frame.
        let mut freed = false;
        if let Some(p) = r.pool.as_mut() {
            if u.applied >= p.target_seq {
                let before = p.size;
                p.top = u.pool_top.min(p.size);
                p.shrink();
                // Room for a segment that was held below its grant.
                freed = p.size < before;
            }
        }
        // It writes its new board's slot only now: the old ones are free for others.
        let left = if u.boards >= r.boards_sent {
            std::mem::take(&mut r.left_boards)
        } else {
            Vec::new()
        };
        let mut u = u;
        u.tiers
            .retain(|(name, _)| name.len() <= 32 && valid_name(name));
        u.tiers.truncate(attune_proto::USAGE_TIERS_MAX);
        r.usage = u;
        if let Some(rc) = &mut self.reclaim {
            if rc.waiting.get(&id).is_some_and(|&s| ack >= s) {
                rc.waiting.remove(&id);
            }
            rc.waiting.retain(|cid, _| self.clients.contains_key(cid));
            if rc.waiting.is_empty() {
                self.last_reclaim_ms = Some(rc.started.elapsed().as_secs_f64() * 1e3);
                self.reclaim = None;
            }
        }
        for (group, slot) in left {
            self.leave_board(&group, slot);
        }
        if want_changed || freed {
            request_rebalance();
        }
        if let Some(c) = self.clients.get(&id) {
            let group = c.placement.clone();
            self.tell_peers(&group);
        }
    }

    pub fn status(&self) -> Status {
        let mut wfs: BTreeMap<(u32, String), WorkflowStatus> = BTreeMap::new();
        let mut samples: BTreeMap<(u32, String), (u64, u64)> = BTreeMap::new();
        for c in self.clients.values() {
            let Some(r) = &c.reg else { continue };
            let w = wfs
                .entry((c.uid, r.workflow.clone()))
                .or_insert_with(|| WorkflowStatus {
                    name: r.workflow.clone(),
                    uid: c.uid,
                    ..Default::default()
                });
            w.pids.push(c.pid);
            if w.job.is_empty() {
                w.job = c.placement.job.clone();
            }
            w.flags = Flags(Flags::parse(&w.flags).unwrap_or_default().0 | r.flags.0).to_string();
            w.want += r.want;
            w.protected += r.protected;
            w.grant += r.grant;
            w.move_limit = r.move_limit;
            w.resident += r.usage.resident;
            w.pinned += r.usage.pinned;
            w.faults += r.usage.faults;
            w.evictions += r.usage.evictions;
            w.fetched_bytes += r.usage.fetched_bytes;
            w.evicted_bytes += r.usage.evicted_bytes;
            w.far_used += r.usage.far_used;
            w.far_want += r.far_want;
            w.far_grant += r.far_grant.unwrap_or(0);
            w.pool += r.pool.as_ref().map_or(0, |p| p.size);
            add_tier(&mut w.tiers, "dram", r.usage.resident);
            for (name, b) in &r.usage.tiers {
                add_tier(&mut w.tiers, name, *b);
            }
            let s = samples.entry((c.uid, r.workflow.clone())).or_default();
            s.0 += r.usage.sample_parks;
            s.1 += r.usage.sample_hits;
        }
        let mut workflows: Vec<WorkflowStatus> = Vec::new();
        for (k, mut w) in wfs {
            w.pids.sort();
            w.processes = w.pids.len() as u64;
            w.pids.truncate(attune_proto::STATUS_PIDS_SHOWN);
            let (parks, hits) = samples[&k];
            w.heat = (parks > 0).then(|| hits as f64 / parks as f64);
            workflows.push(w);
        }
        let shared = self
            .shared
            .iter()
            .map(|(name, s)| {
                let mut granted: Vec<u32> = s.granted.iter().copied().collect();
                granted.sort();
                let granted_count = granted.len() as u64;
                granted.truncate(attune_proto::STATUS_GRANTED_SHOWN);
                SharedStatus {
                    name: name.clone(),
                    owner: s.owner,
                    flags: s.flags.clone(),
                    size: s.size,
                    resident: attune_sys::unix::fd_allocated(&s.file)
                        .unwrap_or(0)
                        .min(s.size),
                    refs: self.shared_refs(name),
                    granted_uids: granted,
                    granted_count,
                    staged: s.staged(),
                    job: s.jobs(),
                }
            })
            .collect();
        Status {
            version: env!("CARGO_PKG_VERSION").into(),
            pid: std::process::id(),
            uptime_s: self.started.elapsed().as_secs_f64(),
            dram_pool: self.cfg.dram,
            min_grant: self.cfg.min_grant,
            move_limit: self.cfg.move_limit,
            bw_dram_pct: self.cfg.bw_dram_pct,
            shared_bytes: self.shared_bytes(),
            granted: workflows.iter().map(|w| w.grant).sum(),
            far_pool: self.cfg.far_pool.unwrap_or(0),
            far_granted: workflows.iter().map(|w| w.far_grant).sum(),
            pool_bytes: self.pool_bytes(),
            tiers: self.tiers.clone(),
            workflows,
            shared,
            requests: self.requests,
            rejected: self.rejected,
            rebalances: self.rebalances,
            grants_pushed: self.grants_pushed,
            last_reclaim_ms: self.last_reclaim_ms,
            kernel_fallbacks: self.kernel_fallbacks.clone(),
            others: None,
            next: None,
        }
    }
}

/// Shared-region and tier names: short, printable, no path separators (they name memfds
/// and appear in logs and metrics labels).
pub fn valid_name(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= 64
        && n.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

/// Adds `bytes` to the tier `name` of a per-tier list.
fn add_tier(tiers: &mut Vec<(String, u64)>, name: &str, bytes: u64) {
    match tiers.iter_mut().find(|t| t.0 == name) {
        Some(t) => t.1 += bytes,
        None => tiers.push((name.to_string(), bytes)),
    }
}

/// Changes of demand (usage reports, departures) are coalesced: the rebalancer thread
/// recomputes at most once per `COALESCE`, so a burst of reports from many clients costs
/// one pass over the workflows and one push per changed grant, not one per report.
/// Registrations and shared regions rebalance at once (the caller needs the grant).
const COALESCE: std::time::Duration = std::time::Duration::from_millis(5);
static DIRTY: (Mutex<bool>, std::sync::Condvar) = (Mutex::new(false), std::sync::Condvar::new());

pub fn request_rebalance() {
    *DIRTY.0.lock().unwrap_or_else(|p| p.into_inner()) = true;
    DIRTY.1.notify_one();
}

/// The most a pool segment grows by in one rebalance: the growth is allocated under the
/// state lock before its grant goes out, and a fault of that runtime may be waiting for
/// room (`paging::room`). Grown from 16 MiB to 637 MiB in one pass, a fill's segment
/// came 221 ms after its fault began to wait, and the lock was held for the allocation;
/// in steps the wait is 37-53 ms (docs/design/pool.md, "When the segment is full").
const POOL_GROW_STEP: u64 = 64 << 20;

/// The rebalancer thread's loop.
pub fn rebalancer(state: Arc<Mutex<State>>) {
    loop {
        {
            let mut d = DIRTY.0.lock().unwrap_or_else(|p| p.into_inner());
            while !*d {
                d = DIRTY.1.wait(d).unwrap_or_else(|p| p.into_inner());
            }
        }
        std::thread::sleep(COALESCE);
        *DIRTY.0.lock().unwrap_or_else(|p| p.into_inner()) = false;
        lock(&state).rebalance();
    }
}

impl State {
    /// Staged inputs whose Slurm job has ended (`gone` says its cgroup directory no longer
    /// exists) lose the daemon's reference; each is freed once its last opener closes it.
    /// Called every second by the daemon's job watcher.
    pub fn unstage_ended_jobs(&mut self, gone: impl Fn(&std::path::Path) -> bool) {
        let mut ended = Vec::new();
        for (name, s) in self.shared.iter_mut().filter(|(_, s)| s.ready) {
            let before = s.stagers.len();
            s.stagers.retain(|(job, dir)| {
                let g = gone(dir);
                if g {
                    crate::log(&format!("staged input '{name}': job {job} has ended"));
                }
                !g
            });
            if before > 0 && !s.staged() {
                ended.push(name.clone());
            }
        }
        for name in ended {
            crate::log(&format!(
                "staged input '{name}' unstaged: its last job has ended"
            ));
            self.release_if_unused(&name);
            request_rebalance();
        }
    }
}

/// A limit for the log: bytes in MiB, or "none".
fn show_limit(l: u64) -> String {
    if l == u64::MAX {
        "none".into()
    } else {
        format!("{} MiB", l >> 20)
    }
}

/// Sends a frame to a client; a client that cannot take it within the write timeout is
/// shut down (its reader thread then cleans up).
pub fn push(w: &Writer, msg: &Reply) {
    let s = w.lock().unwrap_or_else(|p| p.into_inner());
    if attune_proto::write_frame(&s, msg, &[]).is_err() {
        let _ = s.shutdown(std::net::Shutdown::Both);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;

    const M: u64 = 1 << 20;

    /// A registered, welcomed client in memory cgroup `group` (limit 256 MiB), with the
    /// other end of its socket kept open.
    fn member(st: &mut State, group: &str, keep: &mut Vec<UnixStream>) -> u64 {
        let (a, b) = UnixStream::pair().unwrap();
        keep.push(b);
        let placement = Placement {
            job: String::new(),
            mem_limit: 256 * M,
            mem_group: group.to_string(),
        };
        let id = st.add_client(1, 1000, placement, Arc::new(Mutex::new(a)));
        st.clients.get_mut(&id).unwrap().reg = Some(Registration {
            workflow: format!("w{id}"),
            flags: Flags::NONE,
            want: 64 * M,
            protected: 0,
            usage: Usage::default(),
            grant: 64 * M,
            seq: 1,
            move_limit: 0,
            far_want: 0,
            far_grant: None,
            welcomed: true,
            pool: None,
            peers_told: None,
            board_slot: None,
            board_asked: true,
            boards_sent: 0,
            left_boards: Vec::new(),
        });
        id
    }

    fn report(st: &mut State, id: u64, resident: u64) -> Vec<(u64, u64, u32)> {
        st.usage(
            id,
            Usage {
                resident,
                want: 64 * M,
                ..Usage::default()
            },
        );
        told(st)
    }

    /// The `Peers` pushes queued, by client: (client, resident told, runtimes told).
    fn told(st: &mut State) -> Vec<(u64, u64, u32)> {
        let out = std::mem::take(&mut st.outbox);
        let mut v: Vec<_> = out
            .into_iter()
            .filter_map(|(w, m)| {
                let Reply::Peers { resident, runtimes } = m else {
                    return None;
                };
                let id = st
                    .clients
                    .iter()
                    .find(|(_, c)| Arc::ptr_eq(&c.writer, &w))
                    .map(|(&id, _)| id)?;
                Some((id, resident, runtimes))
            })
            .collect();
        v.sort();
        v
    }

    /// A daemon of 1 GiB of DRAM, no client yet.
    fn state() -> State {
        let cfg = crate::config::load(None, &[("dram", "1G".into())], 4 << 30, None).unwrap();
        State::new(cfg, Vec::new())
    }

    #[test]
    fn each_runtime_is_told_what_the_others_in_its_group_hold() {
        let mut st = state();
        let mut keep = Vec::new();
        let (a, b) = (
            member(&mut st, "/g1", &mut keep),
            member(&mut st, "/g1", &mut keep),
        );
        let other = member(&mut st, "/g2", &mut keep);
        // a's pages are told to b only: `other` is in another group, a is not told its own
        // (but that it has one peer).
        assert_eq!(report(&mut st, a, 100 * M), [(a, 0, 1), (b, 100 * M, 1)]);
        assert_eq!(report(&mut st, b, 60 * M), [(a, 60 * M, 1)]);
        assert_eq!(report(&mut st, other, 80 * M), []);
        // A move under the step (a 64th of 256 MiB: 4 MiB) is not told; a larger one is.
        assert_eq!(report(&mut st, a, 103 * M), []);
        assert_eq!(report(&mut st, a, 110 * M), [(b, 110 * M, 1)]);
        // A runtime that goes takes its pages with it: the other is told 0, and alone.
        st.remove_client(a);
        assert_eq!(told(&mut st), [(b, 0, 0)]);
        // Not welcomed yet: told nothing (its welcome is not out; `Peers` would pass it),
        // but counted for the others.
        let late = member(&mut st, "/g1", &mut keep);
        st.clients
            .get_mut(&late)
            .unwrap()
            .reg
            .as_mut()
            .unwrap()
            .welcomed = false;
        assert_eq!(report(&mut st, b, 90 * M), [(b, 0, 1)]);
    }

    fn map(fd: OwnedFd) -> attune_sys::unix::SharedWords {
        attune_sys::unix::SharedWords::attach(fd, attune_proto::BOARD_WORDS).unwrap()
    }

    /// Runtimes a and b in /g1 and c in /g2, each on its group's board: (client, slot,
    /// the board as it maps it).
    fn on_boards(
        st: &mut State,
        keep: &mut Vec<UnixStream>,
    ) -> [(u64, u32, attune_sys::unix::SharedWords); 3] {
        ["/g1", "/g1", "/g2"].map(|g| {
            let id = member(st, g, keep);
            let (slot, fd) = st.join_board(id).unwrap();
            (id, slot, map(fd))
        })
    }

    #[test]
    fn runtimes_of_one_group_share_a_board_and_see_each_other_on_it() {
        use std::sync::atomic::Ordering::Relaxed;
        let mut st = state();
        let mut keep = Vec::new();
        let [(a, sa, wa), (b, sb, wb), (_, _, wo)] = on_boards(&mut st, &mut keep);
        assert!(sa != sb && sa >= 1 && sb >= 1, "{sa} {sb}");
        // One file for the group: what a writes, b reads; two runtimes counted.
        wa.words()[sa as usize].store(40 * M, Relaxed);
        assert_eq!(wb.words()[sa as usize].load(Relaxed), 40 * M);
        assert_eq!(wb.words()[0].load(Relaxed), 2);
        // Another group's board is another file.
        assert_eq!(wo.words()[0].load(Relaxed), 1);
        assert_eq!(wo.words()[sa as usize].load(Relaxed), 0);
        // A runtime that goes reads 0 at once and its slot is taken again.
        st.remove_client(a);
        assert_eq!(wb.words()[sa as usize].load(Relaxed), 0);
        assert_eq!(wb.words()[0].load(Relaxed), 1);
        let c = member(&mut st, "/g1", &mut keep);
        assert_eq!(st.join_board(c).unwrap().0, sa);
        // A process with no limited group gets no board.
        let free = st.add_client(
            1,
            1000,
            Placement::default(),
            Arc::new(Mutex::new(UnixStream::pair().unwrap().0)),
        );
        assert!(st.join_board(free).is_none());
        // The group's last runtime takes the board with it.
        st.remove_client(b);
        st.remove_client(c);
        assert!(!st.boards.contains_key("/g1") && st.boards.contains_key("/g2"));
    }

    #[test]
    fn a_runtime_moved_to_another_group_joins_its_board_and_frees_the_old_slot_on_report() {
        use std::sync::atomic::Ordering::Relaxed;
        let mut st = state();
        let mut keep = Vec::new();
        let [(a, sa, g1), (b, sb, old_b), (c, sc, g2)] = on_boards(&mut st, &mut keep);
        report(&mut st, a, 50 * M);
        report(&mut st, c, 30 * M);
        report(&mut st, b, 70 * M);
        old_b.words()[sb as usize].store(70 * M, Relaxed);
        let g1_placement = st.clients[&b].placement.clone();
        // The same placement read again: nothing happens.
        assert!(st.replace_placement(b, g1_placement.clone()).is_none());
        assert!(told(&mut st).is_empty());
        // b is moved to /g2, of 512 MiB.
        let moved = Placement {
            job: "42".into(),
            mem_limit: 512 * M,
            mem_group: "/g2".into(),
        };
        let (reply, mut fds) = st.replace_placement(b, moved.clone()).unwrap();
        let Reply::Board {
            board: Some(nb),
            fds: 1,
        } = reply
        else {
            panic!("{reply:?}");
        };
        assert!(nb != sc && nb >= 1);
        // b forgets its old peers, then hears of c; a hears it is alone; c hears of b.
        assert_eq!(
            told(&mut st),
            [(a, 0, 0), (b, 0, 0), (b, 30 * M, 1), (c, 70 * M, 1)]
        );
        let new_b = map(fds.pop().unwrap());
        assert_eq!(new_b.words()[0].load(Relaxed), 2);
        new_b.words()[nb as usize].store(70 * M, Relaxed);
        assert_eq!(g2.words()[nb as usize].load(Relaxed), 70 * M);
        // Until b reports on its new board, its old slot stays its own: a newcomer to /g1
        // gets another one.
        let d = member(&mut st, "/g1", &mut keep);
        let (sd, _) = st.join_board(d).unwrap();
        assert!(sd != sb && sd != sa);
        assert_eq!(g1.words()[0].load(Relaxed), 3);
        // A report that has not seen the reply keeps the slot; one that has frees it.
        report(&mut st, b, 70 * M);
        assert_eq!(g1.words()[0].load(Relaxed), 3);
        st.usage(
            b,
            Usage {
                resident: 70 * M,
                want: 1 << 40,
                boards: 1,
                ..Usage::default()
            },
        );
        assert_eq!(g1.words()[sb as usize].load(Relaxed), 0);
        assert_eq!(g1.words()[0].load(Relaxed), 2);
        // Its claim is capped by the new limit (the old one was 256 MiB), its job is the
        // new one's.
        assert_eq!(st.clients[&b].reg.as_ref().unwrap().want, 512 * M);
        assert_eq!(st.clients[&b].placement, moved);
        // Moved out of any limited group: no board, and c is alone again.
        let _ = told(&mut st);
        let (reply, fds) = st.replace_placement(b, Placement::default()).unwrap();
        assert!(
            matches!(
                reply,
                Reply::Board {
                    board: None,
                    fds: 0
                }
            ) && fds.is_empty()
        );
        assert_eq!(told(&mut st), [(b, 0, 0), (c, 0, 0)]);
        assert_eq!(g2.words()[0].load(Relaxed), 2, "kept until b's report");
        // A client that goes frees the slots it left unreported too.
        st.remove_client(b);
        assert_eq!(g2.words()[0].load(Relaxed), 1);
        assert_eq!(g2.words()[nb as usize].load(Relaxed), 0);
        // An unregistered connection (a launcher) follows its group, told nothing.
        let free = st.add_client(
            1,
            1000,
            Placement::default(),
            Arc::new(Mutex::new(UnixStream::pair().unwrap().0)),
        );
        assert!(st.replace_placement(free, g1_placement.clone()).is_none());
        assert_eq!(st.clients[&free].placement, g1_placement);
    }

    #[test]
    fn a_cold_start_tells_each_runtime_its_peers_number_within_an_eighth() {
        let mut st = state();
        let mut keep = Vec::new();
        let mut ids = Vec::new();
        let mut pushes = 0;
        for n in 1..=200u32 {
            let id = member(&mut st, "/g1", &mut keep);
            ids.push(id);
            let group = st.clients[&id].placement.clone();
            st.tell_peers(&group);
            pushes += told(&mut st).len();
            // Every runtime's count is within an eighth of its n - 1 peers (at least 1).
            for &c in &ids {
                let (_, told) = st.clients[&c]
                    .reg
                    .as_ref()
                    .unwrap()
                    .peers_told
                    .unwrap_or_default();
                let off = told.abs_diff(n - 1);
                assert!(off < (told / 8).max(1), "{n} runtimes: one told {told}");
            }
        }
        // O(n log n), not the n²/2 = 20000 of a push per arrival.
        assert!(pushes < 2500, "{pushes} pushes");
        // Departures are told the same way, and the last one left is told it is alone.
        for (k, id) in ids.iter().enumerate().take(199) {
            st.remove_client(*id);
            let _ = told(&mut st);
            let left = 199 - k as u32 - 1;
            let (_, n) = st.clients[&ids[199]]
                .reg
                .as_ref()
                .unwrap()
                .peers_told
                .unwrap();
            assert!(n.abs_diff(left) < (n / 8).max(1), "{left} left: told {n}");
        }
        assert_eq!(
            st.clients[&ids[199]].reg.as_ref().unwrap().peers_told,
            Some((0, 0))
        );
    }

    #[test]
    fn a_pool_segment_grows_a_step_a_pass() {
        let cfg = crate::config::load(
            None,
            &[("dram", "1G".into()), ("far_pool", "2G".into())],
            8 << 30,
            None,
        )
        .unwrap();
        let mut st = State::new(cfg, Vec::new());
        let mut keep = Vec::new();
        let id = member(&mut st, "", &mut keep);
        let file = attune_sys::unix::memfd_growable("seg").unwrap();
        attune_sys::unix::resize_allocated(&file, 0, 16 * M).unwrap();
        let r = st.clients.get_mut(&id).unwrap().reg.as_mut().unwrap();
        r.far_grant = Some(200 * M);
        r.pool = Some(PoolSegment {
            file,
            size: 16 * M,
            target: 16 * M,
            target_seq: 0,
            top: 0,
        });
        // 16 -> 80 -> 144 -> 200 MiB, a grant each (the runtime hears of each step).
        let mut sizes = Vec::new();
        for _ in 0..4 {
            let mut changed = Vec::new();
            st.resize_pool_segments(&mut changed);
            let r = st.clients[&id].reg.as_ref().unwrap();
            sizes.push((r.pool.as_ref().unwrap().target / M, changed == [id]));
        }
        assert_eq!(sizes, [(80, true), (144, true), (200, true), (200, false)]);
    }

    #[test]
    fn runtimes_without_a_limited_group_are_told_nothing() {
        let mut st = state();
        let mut keep = Vec::new();
        let (a, _b) = (
            member(&mut st, "", &mut keep),
            member(&mut st, "", &mut keep),
        );
        assert_eq!(report(&mut st, a, 100 * M), []);
    }
}
