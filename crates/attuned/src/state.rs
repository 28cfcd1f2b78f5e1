//! The daemon's state: connected clients, the workflows they form, budgets, shared
//! regions. One mutex guards it; every handler holds it for a short, non-blocking step
//! (pushes to clients use a write timeout, so a client that stops reading cannot stall
//! the daemon).

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

pub struct Client {
    pub pid: i32,
    pub uid: u32,
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
    /// The welcome (with the first grant) is produced: later changes are pushed.
    pub welcomed: bool,
}

pub struct SharedRegion {
    pub owner: u32,
    pub flags: String,
    pub size: u64,
    pub file: OwnedFd,
    pub granted: HashSet<u32>,
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
    reclaim: Option<Reclaim>,
    pub last_reclaim_ms: Option<f64>,
    pub tiers: Vec<attune_proto::TierStatus>,
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
            reclaim: None,
            last_reclaim_ms: None,
            tiers,
        }
    }

    pub fn add_client(&mut self, pid: i32, uid: u32, writer: Writer) -> u64 {
        let id = self.next_client;
        self.next_client += 1;
        self.clients.insert(
            id,
            Client {
                pid,
                uid,
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
            for (name, _) in c.shared_refs {
                self.release_if_unused(&name);
            }
            if c.reg.is_some() {
                request_rebalance();
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
        if self.shared_refs(name) == 0 {
            if self.shared.remove(name).is_some() {
                crate::log(&format!(
                    "shared region '{name}' freed (last reference gone)"
                ));
            }
        }
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
        for (&id, c) in &self.clients {
            if let Some(r) = &c.reg {
                let e = wfs.entry((c.uid, r.workflow.clone())).or_insert((
                    share::Demand {
                        want: 0,
                        protected: 0,
                        flags: Flags::NONE,
                    },
                    Vec::new(),
                ));
                e.0.want = e.0.want.saturating_add(r.want);
                e.0.protected = e.0.protected.saturating_add(r.protected);
                e.0.flags = Flags(e.0.flags.0 | r.flags.0);
                e.1.push(id);
            }
        }
        let demands: Vec<share::Demand> = wfs.values().map(|w| w.0).collect();
        let grants = share::grant(self.pool(), self.cfg.min_grant, &demands);
        let limits = share::move_limits(&demands, self.cfg.move_limit);
        let mut shrunk = HashMap::new();
        for (((demand, ids), wf_grant), limit) in wfs.values().zip(grants).zip(limits) {
            for id in ids {
                let c = self.clients.get_mut(id).unwrap();
                let r = c.reg.as_mut().unwrap();
                // Processes of one workflow share its grant in proportion to their wants.
                let g = if demand.want == 0 {
                    0
                } else {
                    (wf_grant as u128 * r.want as u128 / demand.want as u128) as u64 / 4096 * 4096
                };
                if g != r.grant || limit != r.move_limit {
                    r.seq += 1;
                    if g < r.grant && r.usage.resident > g {
                        shrunk.insert(*id, r.seq);
                    }
                    r.grant = g;
                    r.move_limit = limit;
                    if r.welcomed {
                        push(
                            &c.writer,
                            &Reply::Grant {
                                grant: g,
                                seq: r.seq,
                                move_limit: limit,
                            },
                        );
                    }
                }
            }
        }
        if !shrunk.is_empty() {
            self.reclaim = Some(Reclaim {
                started: Instant::now(),
                waiting: shrunk,
            });
        }
    }

    /// A client's report; completes a reclaim when the last shrunk client acknowledges.
    pub fn usage(&mut self, id: u64, u: Usage) {
        let Some(r) = self.clients.get_mut(&id).and_then(|c| c.reg.as_mut()) else {
            return;
        };
        let ack = u.ack;
        let flags = Flags::parse(&u.flags).unwrap_or(r.flags);
        let want = if u.want == 0 {
            r.want
        } else {
            u.want.min(self.cfg.dram)
        };
        let protected = u.protected.min(want);
        let want_changed = want != r.want || protected != r.protected || flags != r.flags;
        if want_changed {
            r.want = want;
            r.protected = protected;
            r.flags = flags;
        }
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
        if want_changed {
            request_rebalance();
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
            let s = samples.entry((c.uid, r.workflow.clone())).or_default();
            s.0 += r.usage.sample_parks;
            s.1 += r.usage.sample_hits;
        }
        let mut workflows: Vec<WorkflowStatus> = Vec::new();
        for (k, mut w) in wfs {
            w.pids.sort();
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
            shared_bytes: self.shared_bytes(),
            granted: workflows.iter().map(|w| w.grant).sum(),
            tiers: self.tiers.clone(),
            workflows,
            shared,
            requests: self.requests,
            rejected: self.rejected,
            rebalances: self.rebalances,
            last_reclaim_ms: self.last_reclaim_ms,
        }
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
        state.lock().unwrap_or_else(|p| p.into_inner()).rebalance();
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
