//! The runtime's side of the node daemon (`attuned`, the Tiered Memory Manager).
//!
//! One connection per process, held by the `attune-tmm` thread: it registers the process
//! (`Hello`), applies every grant the daemon pushes to the engine's budget (the evictor
//! then demotes down to it), reports usage every 200 ms and acknowledges a grant once
//! resident memory is within it. Application threads send requests (shared regions)
//! through the same connection and wait for the reply the thread routes to them.
//!
//! When the daemon goes away the runtime keeps its last grant and keeps running; the
//! thread reconnects every half second and registers again, handing back the memory files
//! of the shared regions it still maps so a restarted daemon knows them. Without a
//! daemon (`daemon = auto` and no socket) the runtime works alone on its own budget.

use crate::config::{Config, DaemonMode};
use crate::paging::Pager;
use attune_policy::Flags;
use attune_proto::{FrameReader, ReadError, Reply, Request, SharedHeld, Usage};
use attune_sys::Errno;
use std::collections::{BTreeMap, HashMap};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering::*};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

const REPORT_EVERY: Duration = Duration::from_millis(200);
/// How often the footprint is checked between reports.
const WATCH_EVERY: Duration = Duration::from_millis(20);
const RECONNECT_EVERY: Duration = Duration::from_millis(500);
const REPLY_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a process's start waits for the daemon's welcome: a daemon that has not
/// answered by then must not hold the program up.
const WELCOME_AT_START: Duration = Duration::from_secs(2);

/// Why a registration did not end in a welcome.
enum NotWelcomed {
    /// No answer yet on a connection the daemon took: it may still come.
    Late(UnixStream, FrameReader),
    Failed(String),
}

/// How fast the far tiers' pages grew between reports (`attune_policy::budget::far_want`
/// reaches ahead by it).
struct FarRate {
    at: Instant,
    used: u64,
    rate: u64,
}

impl Default for FarRate {
    fn default() -> Self {
        FarRate {
            at: Instant::now(),
            used: 0,
            rate: 0,
        }
    }
}

impl FarRate {
    /// Takes the far bytes in use now; the rate is measured over at least 20 ms.
    fn update(&mut self, used: u64) {
        let dt = self.at.elapsed().as_nanos() as u64;
        if dt < attune_policy::budget::OWN_RATE_WINDOW_NS {
            return;
        }
        let rise = used.saturating_sub(self.used);
        self.rate = attune_policy::budget::cgroup_rate(self.rate, rise, dt);
        self.at = Instant::now();
        self.used = used;
    }
}

/// A shared region this process maps.
struct Held {
    file: OwnedFd,
    addr: usize,
    size: u64,
    flags: String,
    refs: u32,
}

pub struct Client {
    pid: u32,
    socket: std::path::PathBuf,
    /// How long a registration the daemon has not answered in time is still waited for
    /// before it is dropped (`daemon_wait`). A daemon busy with a cold start of many
    /// instances at once (50 Charliecloud containers on 2 vCPUs: bench/staging.py
    /// --image) answers late; dropping the connection and registering again would give
    /// it the same work twice, where it already has too much.
    late: Duration,
    workflow: String,
    /// Flags from the launcher (`ATTUNE_FLAGS`/`TM_FLAGS`); empty: the regions' union.
    launch_flags: Flags,
    engine: Option<&'static Pager>,
    want: u64,
    writer: Mutex<Option<UnixStream>>,
    replies: Mutex<HashMap<u64, (Reply, Vec<OwnedFd>)>>,
    cv: Condvar,
    next_id: AtomicU64,
    connected: AtomicBool,
    /// Sequence number of the grant applied last, and whether it is met.
    seq: AtomicU64,
    /// Sequence number last acknowledged to the daemon.
    acked: AtomicU64,
    grant: AtomicU64,
    held: Mutex<BTreeMap<String, Held>>,
    /// Connection generation: waiters fail when it changes under them.
    generation: AtomicU64,
}

static CLIENT: Mutex<Option<(u32, Arc<Client>)>> = Mutex::new(None);
/// Raw fd of the connection, closed in a forked child (see `forget_in_child`).
static CONN_FD: AtomicI32 = AtomicI32::new(-1);

/// This process's client, if it joined a daemon.
pub fn client() -> Option<Arc<Client>> {
    let g = CLIENT.lock().unwrap_or_else(|p| p.into_inner());
    match &*g {
        Some((pid, c)) if *pid == std::process::id() => Some(c.clone()),
        _ => None,
    }
}

extern "C" fn forget_in_child() {
    let fd = CONN_FD.swap(-1, Relaxed);
    if fd >= 0 {
        attune_sys::unix::close_inherited(fd);
    }
}

/// The workflow name: configured, else the Slurm job, else program and pid.
pub fn workflow_name(cfg: &Config) -> String {
    if !cfg.workflow.is_empty() {
        return cfg.workflow.clone();
    }
    if let Ok(j) = std::env::var("SLURM_JOB_ID") {
        if !j.is_empty() && j.len() < 100 {
            return format!("slurm-{j}");
        }
    }
    let prog = std::fs::read_to_string("/proc/self/comm").unwrap_or_default();
    let prog: String = prog
        .trim()
        .chars()
        .filter(|c| c.is_ascii_graphic())
        .take(64)
        .collect();
    format!(
        "{}.{}",
        if prog.is_empty() { "proc" } else { &prog },
        std::process::id()
    )
}

/// Joins the daemon as the configuration says. `Err` only with `daemon = require`.
pub fn start(cfg: &Config, engine: Option<&'static Pager>) -> Result<(), String> {
    if cfg.daemon == DaemonMode::Off {
        return Ok(());
    }
    let first = attune_proto::connect(&cfg.socket, WELCOME_AT_START);
    let sock = match first {
        Ok(s) => s,
        Err(e) => {
            // Not `{e}`: no strerror on the start path (`attune_sys::errno_text`).
            let e = attune_sys::io_error_text(&e);
            if cfg.daemon == DaemonMode::Require {
                return Err(format!(
                    "daemon = require, but no attuned answers on {} ({e}); start attuned or set ATTUNE_DAEMON=auto",
                    cfg.socket.display()
                ));
            }
            crate::info!(
                "no attuned on {} ({e}): running alone on the local budget",
                cfg.socket.display()
            );
            return Ok(());
        }
    };
    let flags = ["ATTUNE_FLAGS", "TM_FLAGS"]
        .iter()
        .find_map(|k| std::env::var(k).ok().and_then(|v| Flags::parse(&v).ok()))
        .unwrap_or_default();
    let c = Arc::new(Client {
        pid: std::process::id(),
        socket: cfg.socket.clone(),
        late: Duration::from_secs(cfg.daemon_wait),
        workflow: workflow_name(cfg),
        launch_flags: flags,
        engine,
        want: cfg.dram,
        writer: Mutex::new(None),
        replies: Mutex::new(HashMap::new()),
        cv: Condvar::new(),
        next_id: AtomicU64::new(1),
        connected: AtomicBool::new(false),
        seq: AtomicU64::new(0),
        acked: AtomicU64::new(0),
        grant: AtomicU64::new(0),
        held: Mutex::new(BTreeMap::new()),
        generation: AtomicU64::new(0),
    });
    static ATFORK: std::sync::Once = std::sync::Once::new();
    ATFORK.call_once(|| attune_sys::os::atfork(None, None, Some(forget_in_child)));
    *CLIENT.lock().unwrap_or_else(|p| p.into_inner()) = Some((c.pid, c.clone()));
    // Register before returning, so the first allocations already run under the grant.
    // `require` means a process the daemon did not take must not run unaccounted: it
    // waits out a late answer here.
    if cfg.daemon == DaemonMode::Require {
        let session = c.hello_waiting(sock).map_err(|why| {
            *CLIENT.lock().unwrap_or_else(|p| p.into_inner()) = None;
            format!(
                "daemon = require, but attuned on {} did not take this process: {why}",
                cfg.socket.display()
            )
        })?;
        return c.spawn_thread(Some(session), None);
    }
    let mut pending = None;
    let session = match c.hello(sock) {
        Ok(s) => Some(s),
        Err(NotWelcomed::Late(sock, rd)) => {
            crate::info!(
                "attuned on {} has not answered the registration in {} s; running on the local budget until it does",
                cfg.socket.display(),
                WELCOME_AT_START.as_secs()
            );
            pending = Some((sock, rd));
            None
        }
        Err(NotWelcomed::Failed(why)) => {
            crate::warn!("{why}; running alone on the local budget");
            None
        }
    };
    c.spawn_thread(session, pending)
}

type Session = (UnixStream, FrameReader);

impl Client {
    /// Starts the connection thread on `session`, or first on the `pending` registration
    /// that had no answer in time (a late welcome is waited for on the connection that
    /// asked for it).
    fn spawn_thread(
        self: &Arc<Self>,
        session: Option<Session>,
        pending: Option<Session>,
    ) -> Result<(), String> {
        let c = self.clone();
        attune_sys::os::spawn_runtime_thread("attune-tmm", move || {
            let session = session.or_else(|| {
                let (sock, rd) = pending?;
                c.welcome(sock, rd, c.late)
                    .map_err(|why| crate::warn!("{why}; running alone on the local budget"))
                    .ok()
            });
            c.run(session)
        })
        .map(|_| ())
        .map_err(|e| format!("cannot start the daemon thread: {e}"))
    }

    fn flags_now(&self) -> Flags {
        if !self.launch_flags.is_empty() {
            return self.launch_flags;
        }
        let Some(e) = self.engine else {
            return Flags::NONE;
        };
        let _in = e.enter();
        let t = e.regions.read().unwrap_or_else(|p| p.into_inner());
        Flags(t.iter().fold(0, |a, r| a | r.flags().0))
    }

    /// DRAM this process can use now: its managed footprint (dedicated regions, or what
    /// is resident if more: the small-object arenas) plus the evictor's headroom, within
    /// the configured budget. Asking for the configured budget itself would let an idle or
    /// small process hold DRAM its neighbours thrash for.
    fn want_now(&self) -> u64 {
        let Some(e) = self.engine else {
            return self.want;
        };
        attune_policy::budget::daemon_want(
            e.committed.load(Relaxed),
            e.resident.load(Relaxed),
            e.cfg.headroom,
            self.want,
        )
    }

    /// Bytes of LAT/SHL regions (what the daemon protects first), capped by the want.
    fn protected_now(&self) -> u64 {
        let Some(e) = self.engine else { return 0 };
        let from_launch = self.launch_flags.is_protected();
        let _in = e.enter();
        let t = e.regions.read().unwrap_or_else(|p| p.into_inner());
        let b: u64 = t
            .iter()
            .filter(|r| from_launch || r.flags().is_protected())
            .map(|r| r.len as u64)
            .sum();
        b.min(self.want)
    }

    /// Registers this process: sends `Hello` on a fresh connection and waits for
    /// `Welcome` as long as the connection's read timeout; the session, or why not.
    fn hello(&self, sock: UnixStream) -> Result<Session, NotWelcomed> {
        let (held, mut fds): (Vec<SharedHeld>, Vec<i32>) = {
            let h = self.held.lock().unwrap_or_else(|p| p.into_inner());
            h.iter()
                .map(|(n, x)| {
                    (
                        SharedHeld {
                            name: n.clone(),
                            flags: x.flags.clone(),
                            refs: x.refs,
                        },
                        x.file.as_raw_fd(),
                    )
                })
                .unzip()
        };
        // A pool segment this process still maps (the daemon restarted) goes back with it.
        // A forked child's pool tier reads its private copy and takes no segment (its
        // stores go to the next tier; docs/design/pool.md).
        let pool = self
            .engine
            .and_then(|e| e.pool_tier())
            .filter(|p| !p.detached());
        let pool_held = pool.and_then(|p| p.segment()).map(|f| f.as_raw_fd());
        fds.extend(pool_held);
        let req = Request::Hello {
            version: attune_proto::VERSION,
            workflow: self.workflow.clone(),
            flags: self.flags_now().to_string(),
            want: self.want_now(),
            protected: self.protected_now(),
            fds: fds.len(),
            shared: held,
            pool: pool.is_some(),
            pool_held: pool_held.is_some(),
            board: self.engine.is_some(),
        };
        attune_proto::write_frame(&sock, &req, &fds).map_err(|e| {
            NotWelcomed::Failed(format!("the registration could not be sent ({e})"))
        })?;
        self.await_welcome(sock, FrameReader::default())
    }

    /// [`Client::hello`], then up to `late` more for a late answer.
    fn hello_waiting(&self, sock: UnixStream) -> Result<Session, String> {
        match self.hello(sock) {
            Ok(s) => Ok(s),
            Err(NotWelcomed::Late(sock, rd)) => self.welcome(sock, rd, self.late),
            Err(NotWelcomed::Failed(why)) => Err(why),
        }
    }

    /// [`Client::await_welcome`] for up to `wait` more on a registration that had no
    /// answer in time.
    fn welcome(
        &self,
        sock: UnixStream,
        rd: FrameReader,
        wait: Duration,
    ) -> Result<Session, String> {
        sock.set_read_timeout(Some(wait))
            .map_err(|e| format!("no answer to the registration ({e})"))?;
        self.await_welcome(sock, rd).map_err(|e| match e {
            NotWelcomed::Late(..) => format!(
                "no answer to the registration in {} s",
                (WELCOME_AT_START + wait).as_secs()
            ),
            NotWelcomed::Failed(why) => why,
        })
    }

    /// Reads the daemon's answers to a sent `Hello` until its `Welcome`, applying the grants
    /// that overtake it.
    fn await_welcome(&self, sock: UnixStream, mut rd: FrameReader) -> Result<Session, NotWelcomed> {
        let pool = self
            .engine
            .and_then(|e| e.pool_tier())
            .filter(|p| !p.detached());
        loop {
            match rd.read(&sock, Reply::fds) {
                // A grant computed for a later rebalance may overtake the welcome.
                Ok((
                    Reply::Grant {
                        grant,
                        seq,
                        move_limit,
                        far_grant,
                        pool,
                    },
                    _,
                )) => self.apply(grant, seq, move_limit, far_grant, pool),
                Ok((Reply::Peers { resident, runtimes }, _)) => self.set_peers(resident, runtimes),
                Ok((
                    Reply::Welcome {
                        grant,
                        seq,
                        move_limit,
                        far_grant,
                        pool: segment,
                        board,
                        ..
                    },
                    mut got,
                )) => {
                    // The board's file comes last, after the segment's.
                    let board_fd = board.and_then(|_| got.pop());
                    self.take_board(board, board_fd);
                    if let Some(p) = pool {
                        self.take_segment(p, segment, got.pop());
                    }
                    self.apply(grant, seq, move_limit, far_grant, segment);
                    CONN_FD.store(sock.as_raw_fd(), Relaxed);
                    *self.writer.lock().unwrap_or_else(|p| p.into_inner()) = sock.try_clone().ok();
                    self.connected.store(true, Release);
                    if let Some(e) = self.engine {
                        e.far_growth.set_daemon(true);
                    }
                    crate::info!(
                        "joined attuned on {} as workflow '{}': {} MiB granted",
                        self.socket.display(),
                        self.workflow,
                        self.grant.load(Relaxed) >> 20
                    );
                    return Ok((sock, rd));
                }
                Ok((Reply::Error { message, .. }, _)) => {
                    return Err(NotWelcomed::Failed(format!(
                        "attuned refused this process: {message}"
                    )));
                }
                Err(ReadError::Io(e))
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    return Err(NotWelcomed::Late(sock, rd));
                }
                // A daemon at max_clients closes the connection without a word.
                other => {
                    return Err(NotWelcomed::Failed(format!(
                        "no answer to the registration ({})",
                        match other {
                            Ok((r, _)) => format!("{r:?}"),
                            Err(e) => e.to_string(),
                        }
                    )));
                }
            }
        }
    }

    /// The pool segment of the welcome: a new one is mapped; a held one the daemon took
    /// back keeps its mapping; without one (no far pool on the node, or a held segment
    /// refused) stores go to the next tier while what is stored stays readable.
    fn take_segment(
        &self,
        p: &crate::tier::pool::PoolTier,
        size: Option<u64>,
        fd: Option<OwnedFd>,
    ) {
        match (size, fd) {
            (Some(size), Some(fd)) => match p.attach(fd, size) {
                Ok(()) => crate::info!(
                    "tier '{}': {} MiB segment of the node's far pool attached",
                    p.name(),
                    size >> 20
                ),
                Err(e) => crate::warn!("{e}"),
            },
            (Some(_), None) => {}
            (None, _) => {
                p.set_size(0);
                crate::warn!(
                    "tier '{}': attuned on {} gives this process no segment of a far pool \
                     (its far_pool is off, or a held segment was refused); the next tier takes \
                     what leaves DRAM",
                    p.name(),
                    self.socket.display()
                );
            }
        }
    }

    /// Applies a grant unless a later one was applied already (pushes may overtake).
    fn apply(
        &self,
        grant: u64,
        seq: u64,
        move_limit: u64,
        far_grant: Option<u64>,
        pool: Option<u64>,
    ) {
        if seq < self.seq.load(Relaxed) {
            return;
        }
        // The segment's growth is mapped before the grant is applied, as it always was:
        // applying the budget before the mapping (150 ms for 512 MiB) got three runtimes
        // filling one 256 MiB cgroup killed by its limit in 6-7 runs of 10: each took all
        // the free room at once (docs/design/pool.md, "When the segment is full").
        if let (Some(size), Some(p)) = (pool, self.engine.and_then(|e| e.pool_tier())) {
            p.set_size(size);
        }
        self.grant.store(grant, Relaxed);
        self.seq.store(seq, Relaxed);
        if let Some(e) = self.engine {
            e.set_move_limit(move_limit);
            e.set_far_grant(far_grant);
            let b = e.set_budget(grant);
            crate::info!(
                "attuned grant {seq}: {} MiB (budget {} MiB)",
                grant >> 20,
                b >> 20
            );
        }
    }

    /// What the other runtimes in this process's memory cgroup hold resident, and how
    /// many they are, as the daemon says (`paging::limit`).
    /// The board of this process's memory cgroup's runtimes and its slot there
    /// (`attune_proto::BOARD_WORDS`): the evictor publishes its resident pages there and
    /// reads the others' at each reading of the group. None: the peers' figures come
    /// from `Peers` alone.
    fn take_board(&self, slot: Option<u32>, fd: Option<OwnedFd>) {
        let Some(e) = self.engine else { return };
        let board = match (slot, fd) {
            (Some(slot), Some(fd)) if (1..attune_proto::BOARD_WORDS).contains(&(slot as usize)) => {
                match attune_sys::unix::SharedWords::attach(fd, attune_proto::BOARD_WORDS) {
                    Ok(words) => Some(crate::paging::Board {
                        words,
                        slot: slot as usize,
                    }),
                    Err(err) => {
                        crate::info!("the board of this memory cgroup cannot be mapped ({err:?}): peers from attuned's reports");
                        None
                    }
                }
            }
            _ => None,
        };
        if let Some(b) = &board {
            b.publish(e.resident.load(Relaxed));
        }
        e.cgroup.set_board(board);
    }

    /// The process moved to another memory cgroup: the daemon gives the new group's board
    /// (or none). The old slot reads 0 from here on; a fault that read the old board
    /// before the switch may still write it once, which is harmless: the daemon frees
    /// the slot for another runtime only at the next report, after this.
    fn moved_board(&self, slot: Option<u32>, fd: Option<OwnedFd>) {
        let Some(e) = self.engine else { return };
        // Boards stay mapped for the process's life (`CgroupStats::set_board`).
        let old = e.cgroup.board();
        self.take_board(slot, fd);
        if let Some(b) = old {
            b.publish(0);
        }
        crate::info!(
            "memory cgroup changed: {}",
            match e.cgroup.board() {
                Some(b) => format!("slot {} on the new group's board", b.slot),
                None => "no board in the new group (peers from attuned's reports)".into(),
            }
        );
    }

    fn set_peers(&self, resident: u64, runtimes: u32) {
        if let Some(e) = self.engine {
            e.cgroup.peers.store(resident, Relaxed);
            e.cgroup.peer_runtimes.store(runtimes as u64, Relaxed);
        }
    }

    /// Resident memory is within the grant (or at the pinned floor nothing goes below).
    fn within_grant(&self) -> bool {
        match self.engine {
            Some(e) => e.resident.load(Relaxed) <= e.budget().max(e.pinned_bytes()),
            None => true,
        }
    }

    /// Sends a usage report; returns false when the connection is gone.
    fn usage(&self, sock: &UnixStream, far: &mut FarRate, boards: u64) -> bool {
        let mut u = Usage {
            flags: self.flags_now().to_string(),
            want: self.want_now(),
            boards,
            ..Default::default()
        };
        if let Some(e) = self.engine {
            let c = &e.counters;
            u.resident = e.resident.load(Relaxed);
            u.pinned = e.pinned_bytes();
            u.protected = self.protected_now();
            u.faults = c.faults.load(Relaxed);
            u.evictions = c.evictions.load(Relaxed);
            u.fetched_bytes = c.fetched_bytes.load(Relaxed);
            u.evicted_bytes = c.evicted_bytes.load(Relaxed);
            u.sample_parks = c.sample_parks.load(Relaxed);
            u.sample_hits = c.sample_hits.load(Relaxed);
            u.paced_ns = c.paced_ns.load(Relaxed);
            (u.far_used, u.far_want) = e.far_memory(far.rate);
            far.update(u.far_used);
            u.tiers = e
                .tiers
                .iter()
                .map(|t| (t.name().to_string(), t.used()))
                .collect();
            u.pool_top = e
                .pool_tier()
                .filter(|p| p.attached())
                .map_or(0, |p| p.top());
            u.applied = self.seq.load(Relaxed);
        }
        if self.within_grant() {
            u.ack = self.seq.load(Relaxed);
            self.acked.store(u.ack, Relaxed);
        }
        let w = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        let _ = sock;
        match &*w {
            Some(s) => attune_proto::write_frame(s, &Request::Usage(u), &[]).is_ok(),
            None => false,
        }
    }

    /// The connection thread: serve a session, then reconnect for ever.
    fn run(self: Arc<Self>, mut session: Option<Session>) {
        loop {
            if let Some((sock, rd)) = session.take() {
                self.serve(sock, rd);
                // Without the daemon nothing says what the peers hold: the limit's whole
                // excess is this runtime's again.
                self.set_peers(0, 0);
                if let Some(e) = self.engine {
                    e.cgroup.set_board(None);
                }
                // Nothing grows the far grant now: a fault with no room does not wait.
                if let Some(e) = self.engine {
                    e.far_growth.set_daemon(false);
                }
                self.connected.store(false, Release);
                self.generation.fetch_add(1, AcqRel);
                *self.writer.lock().unwrap_or_else(|p| p.into_inner()) = None;
                CONN_FD.store(-1, Relaxed);
                self.cv.notify_all();
                crate::warn!(
                    "lost attuned on {}; keeping the last grant ({} MiB) and reconnecting",
                    self.socket.display(),
                    self.grant.load(Relaxed) >> 20
                );
            }
            std::thread::sleep(RECONNECT_EVERY);
            if let Ok(s) = attune_proto::connect(&self.socket, WELCOME_AT_START) {
                session = self
                    .hello_waiting(s)
                    .map_err(|why| crate::warn!("{why}; running alone on the local budget"))
                    .ok();
            }
        }
    }

    fn serve(&self, sock: UnixStream, mut rd: FrameReader) {
        let _ = sock.set_read_timeout(Some(WATCH_EVERY));
        let mut last = Instant::now() - REPORT_EVERY;
        let mut last_want = 0u64;
        let mut last_resident = 0u64;
        let mut last_asks = 0u64;
        let mut far = FarRate::default();
        // `Reply::Board` applied on this connection (`Usage::boards`).
        let mut boards = 0u64;
        loop {
            // Report every 200 ms, and at once when the footprint moved by a MiB or more
            // (a big allocation should not run 200 ms on a budget sized for less).
            let want = self.want_now();
            // A shrunk grant is acknowledged as soon as it is met: the daemon times how long
            // neighbours take to give DRAM back to a newcomer.
            let ack_due = self.seq.load(Relaxed) > self.acked.load(Relaxed) && self.within_grant();
            // Under a memory limit, resident pages that moved by a 64th of it are reported
            // within the 20 ms watch: the group's other runtimes learn of them from the
            // daemon (`Reply::Peers`) instead of reading them as their programs' growth.
            let resident = self.engine.map_or(0, |e| e.resident.load(Relaxed));
            let moved = self.engine.is_some_and(|e| {
                let limit = e.cgroup.limit.load(Relaxed);
                limit > 0 && resident.abs_diff(last_resident) >= (limit / 64).max(4 << 20)
            });
            // A fault waits for the far grant to grow (`paging::room`): report at once.
            let asks = self.engine.map_or(0, |e| e.far_growth.asks());
            if ack_due
                || moved
                || asks != last_asks
                || last.elapsed() >= REPORT_EVERY
                || want.abs_diff(last_want) >= 1 << 20
            {
                if !self.usage(&sock, &mut far, boards) {
                    return;
                }
                last = Instant::now();
                last_want = want;
                last_resident = resident;
                last_asks = asks;
            }
            match rd.read(&sock, Reply::fds) {
                Ok((
                    Reply::Grant {
                        grant,
                        seq,
                        move_limit,
                        far_grant,
                        pool,
                    },
                    _,
                )) => self.apply(grant, seq, move_limit, far_grant, pool),
                Ok((Reply::Peers { resident, runtimes }, _)) => self.set_peers(resident, runtimes),
                Ok((Reply::Board { board, .. }, mut fds)) => {
                    self.moved_board(board, fds.pop());
                    boards += 1;
                    // Reported at once: the daemon frees the old slot on this report.
                    last = Instant::now() - REPORT_EVERY;
                }
                Ok((r, fds)) => {
                    let id = match &r {
                        Reply::Shared { id, .. }
                        | Reply::Ok { id }
                        | Reply::Error { id, .. }
                        | Reply::Status { id, .. }
                        | Reply::Pong { id } => *id,
                        _ => 0,
                    };
                    if let Reply::Error { id: 0, message, .. } = &r {
                        crate::warn!("attuned: {message}");
                    }
                    self.replies
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(id, (r, fds));
                    self.cv.notify_all();
                }
                Err(ReadError::Io(e))
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(_) => return,
            }
        }
    }

    /// One request, waiting for its reply.
    fn call(&self, make: impl FnOnce(u64) -> Request) -> Result<(Reply, Vec<OwnedFd>), Errno> {
        let id = self.next_id.fetch_add(1, Relaxed);
        let gen = self.generation.load(Acquire);
        {
            let w = self.writer.lock().unwrap_or_else(|p| p.into_inner());
            let Some(s) = &*w else {
                return Err(crate::error::fail(
                    Errno(libc::ENOTCONN),
                    format!(
                        "attuned on {} is not reachable (reconnecting)",
                        self.socket.display()
                    ),
                ));
            };
            attune_proto::write_frame(s, &make(id), &[]).map_err(|e| {
                crate::error::fail(Errno(libc::ECONNRESET), format!("attuned: {e}"))
            })?;
        }
        let deadline = Instant::now() + REPLY_TIMEOUT;
        let mut r = self.replies.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(x) = r.remove(&id) {
                return Ok(x);
            }
            if self.generation.load(Acquire) != gen {
                return Err(crate::error::fail(
                    Errno(libc::ECONNRESET),
                    "attuned went away before answering",
                ));
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(crate::error::fail(
                    Errno(libc::ETIMEDOUT),
                    "attuned did not answer within 5 s",
                ));
            }
            r = self
                .cv
                .wait_timeout(r, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    pub fn is_connected(&self) -> bool {
        self.connected.load(Acquire)
    }
}

fn no_daemon() -> Errno {
    crate::error::fail(
        Errno(libc::ENOTCONN),
        "shared regions need the node daemon (attuned); none joined (see ATTUNE_SOCKET and ATTUNE_DAEMON)",
    )
}

fn reply_error(r: Reply) -> Errno {
    match r {
        Reply::Error { errno, message, .. } => {
            crate::error::fail(Errno(errno), format!("attuned: {message}"))
        }
        other => crate::error::fail(
            Errno(libc::EPROTO),
            format!("attuned: unexpected reply {other:?}"),
        ),
    }
}

/// `attune_shared_open`: maps the shared region `name` (created with `size` bytes if it
/// does not exist; `size` 0 opens an existing one). Opening it again in the same process
/// returns the same address and takes one more reference.
pub fn shared_open(name: &str, size: u64, flags: Flags) -> Result<usize, Errno> {
    let c = client().ok_or_else(no_daemon)?;
    let (r, mut fds) = c.call(|id| Request::SharedOpen {
        id,
        name: name.into(),
        size,
        flags: flags.to_string(),
    })?;
    let Reply::Shared {
        size, read_only, ..
    } = r
    else {
        return Err(reply_error(r));
    };
    let Some(fd) = fds.pop() else {
        return Err(crate::error::fail(
            Errno(libc::EPROTO),
            "attuned sent no memory file",
        ));
    };
    let mut h = c.held.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(x) = h.get_mut(name) {
        x.refs += 1;
        return Ok(x.addr);
    }
    // A staged input is sealed against writes: it maps read-only, and a store into it
    // faults (SIGSEGV) as into any read-only mapping.
    let addr = match attune_sys::unix::map_shared(&fd, size as usize, !read_only) {
        Ok(a) => a,
        Err(e) => {
            drop(h);
            let _ = c.call(|id| Request::SharedClose {
                id,
                name: name.into(),
            });
            return Err(crate::error::fail(
                e,
                format!("cannot map shared region '{name}' ({size} bytes): {e}"),
            ));
        }
    };
    if flags.is_protected() {
        // LAT/SHL: fault it in now, on this process's node, rather than on first touch.
        let _ = attune_sys::mem::advise(addr, size as usize, libc::MADV_WILLNEED);
    }
    h.insert(
        name.into(),
        Held {
            file: fd,
            addr,
            size,
            flags: flags.to_string(),
            refs: 1,
        },
    );
    Ok(addr)
}

/// `attune_shared_close`: drops one reference of the region mapped at `ptr`; the last
/// one in this process unmaps it. The daemon frees it when no process holds it.
pub fn shared_close(ptr: usize) -> Result<(), Errno> {
    let c = client().ok_or_else(no_daemon)?;
    let name = {
        let h = c.held.lock().unwrap_or_else(|p| p.into_inner());
        h.iter()
            .find(|(_, x)| x.addr == ptr)
            .map(|(n, _)| n.clone())
            .ok_or_else(|| {
                crate::error::fail(
                    Errno(libc::EINVAL),
                    format!("{ptr:#x} is not a shared region opened by attune_shared_open"),
                )
            })?
    };
    // Drop the local reference first: even when the daemon is away, the process stops
    // mapping what it closed (a restarted daemon learns the rest at re-registration).
    {
        let mut h = c.held.lock().unwrap_or_else(|p| p.into_inner());
        let x = h.get_mut(&name).unwrap();
        x.refs -= 1;
        if x.refs == 0 {
            let x = h.remove(&name).unwrap();
            let _ = attune_sys::mem::unmap(x.addr, x.size as usize);
        }
    }
    match c.call(|id| Request::SharedClose {
        id,
        name: name.clone(),
    }) {
        Ok((Reply::Ok { .. }, _)) => Ok(()),
        Ok((r, _)) => Err(reply_error(r)),
        Err(e) => Err(e),
    }
}

/// `attune_shared_grant`: lets `uid` open this user's shared region `name`.
pub fn shared_grant(name: &str, uid: u32) -> Result<(), Errno> {
    let c = client().ok_or_else(no_daemon)?;
    match c.call(|id| Request::SharedGrant {
        id,
        name: name.into(),
        uid,
    })? {
        (Reply::Ok { .. }, _) => Ok(()),
        (r, _) => Err(reply_error(r)),
    }
}

/// Whether this process is registered with a daemon now.
pub fn connected() -> bool {
    client().is_some_and(|c| c.is_connected())
}
