//! # attune-proto: runtimes, the CLI and `attuned` talk over one Unix socket
//!
//! **Framing.** A frame is a 4-byte little-endian length and that many bytes of JSON (one
//! `Request` or `Reply`). Frames above [`MAX_FRAME`] are refused and the connection
//! closed: a peer cannot make the daemon buffer without bound. Descriptors (the memory
//! files of shared regions) travel with `SCM_RIGHTS` on the first byte of the frame that
//! names them in its `fds` field; the reader queues received descriptors in order and
//! each frame takes its count from the front of the queue.
//!
//! **Flow.** A runtime opens one connection for the life of its process, says `Hello`
//! (workflow, flags, the DRAM it would use alone) and gets `Welcome` with its grant. The
//! daemon pushes `Grant` whenever the node's budgets change; the runtime applies it (its
//! evictor demotes down to the new budget) and acknowledges with `Usage { ack }`. Requests
//! with an `id` (shared regions, status) get one reply with the same id; pushes have no
//! id. The peer's identity is never taken from a message: the daemon reads it from the
//! socket (`SO_PEERCRED`).
#![forbid(unsafe_code)]

use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

/// Protocol version in `Hello`; the daemon refuses others.
pub mod remote;

pub const VERSION: u32 = 1;
/// Largest frame accepted (bytes of JSON).
pub const MAX_FRAME: usize = 64 << 10;
/// Where runtimes and the CLI look for the daemon unless `ATTUNE_SOCKET` says otherwise.
pub const DEFAULT_SOCKET: &str = "/run/attune/attuned.sock";

/// The socket path: `ATTUNE_SOCKET`, else the default.
pub fn socket_path() -> std::path::PathBuf {
    std::env::var_os("ATTUNE_SOCKET")
        .filter(|s| !s.is_empty())
        .map(Into::into)
        .unwrap_or_else(|| DEFAULT_SOCKET.into())
}

/// Client to daemon.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    /// Registers this process in a workflow. `shared` names the shared regions this
    /// process still maps after a daemon restart; their memory files come attached, in
    /// order (`fds` = their count).
    Hello {
        version: u32,
        workflow: String,
        flags: String,
        /// DRAM this process would keep resident alone (its configured budget).
        want: u64,
        /// Bytes of LAT/SHL regions it asks to keep in DRAM.
        protected: u64,
        #[serde(default)]
        shared: Vec<SharedHeld>,
        /// The process has a `pool` far tier and asks for a segment of the node's pool.
        #[serde(default, skip_serializing_if = "is_false")]
        pool: bool,
        /// It still maps a pool segment (the daemon restarted): its memory file comes
        /// attached after the shared regions' files.
        #[serde(default, skip_serializing_if = "is_false")]
        pool_held: bool,
        /// It reads its memory cgroup's board ([`BOARD_WORDS`]) and asks for a slot.
        #[serde(default, skip_serializing_if = "is_false")]
        board: bool,
        #[serde(default)]
        fds: usize,
    },
    /// Periodic report; `ack` is the sequence number of the last grant applied (the
    /// runtime is within it), 0 if none yet.
    Usage(Usage),
    SharedOpen {
        id: u64,
        name: String,
        size: u64,
        flags: String,
    },
    SharedClose {
        id: u64,
        name: String,
    },
    /// Stages a read-only input once for the node: the daemon copies the source the
    /// client opened with its own rights (attached, `fds` = 1: a regular file or a pipe)
    /// into a new shared region `name`, seals it against writes and holds it itself
    /// until [`Request::Unstage`] (or the end of the Slurm job that staged it). `size`:
    /// the most bytes a pipe may bring (0: what is left of `shared_max`); a regular
    /// file's own size is used.
    Stage {
        id: u64,
        name: String,
        flags: String,
        #[serde(default)]
        size: u64,
        /// An input of this name that the caller may open, staged already, is kept for
        /// the caller's job too instead of refused; one being staged answers EAGAIN.
        #[serde(default, skip_serializing_if = "is_false")]
        reuse: bool,
        fds: usize,
    },
    /// Drops the daemon's own reference of a staged region (owner or root); it is freed
    /// when the last process that opened it closes it.
    Unstage {
        id: u64,
        name: String,
    },
    /// Gives back, after a daemon restart, the shared regions a connection held without
    /// a registration (`attune run --staged`: the launcher is the program's reference);
    /// their memory files come attached, in order (`fds` = their count). Each is adopted
    /// as a `Hello`'s `shared` are; a staged input gets the daemon's own reference back,
    /// tied to the caller's Slurm job (or until `attune unstage` outside one).
    Rejoin {
        id: u64,
        shared: Vec<SharedHeld>,
        fds: usize,
    },
    /// Lets `uid` open the caller's shared region `name`.
    SharedGrant {
        id: u64,
        name: String,
        uid: u32,
    },
    /// The node's status as the caller may see it, from item `from` on (the workflows,
    /// then the shared regions): a reply holds what fits in one frame and says where the
    /// next page starts (`Status::next`).
    Status {
        id: u64,
        #[serde(default, skip_serializing_if = "is_zero")]
        from: u64,
    },
    Ping {
        id: u64,
    },
}

/// A shared region a re-registering client holds.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SharedHeld {
    pub name: String,
    pub flags: String,
    /// How many times this process opened it (its references).
    pub refs: u32,
}

#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Usage {
    /// Flags of the process's regions (union), so the daemon weighs it by what it holds.
    #[serde(default)]
    pub flags: String,
    pub resident: u64,
    pub pinned: u64,
    pub protected: u64,
    pub want: u64,
    pub faults: u64,
    pub evictions: u64,
    pub fetched_bytes: u64,
    pub evicted_bytes: u64,
    /// Sampled accesses (the runtime's heat signal): parks and hits since start.
    pub sample_parks: u64,
    pub sample_hits: u64,
    /// Time spent waiting for the movement limit, ns.
    #[serde(default)]
    pub paced_ns: u64,
    /// Bytes in the process's `memory` far tiers (node memory outside DRAM budgets), and
    /// what it wants there: what it holds plus what it may still push out.
    #[serde(default)]
    pub far_used: u64,
    #[serde(default)]
    pub far_want: u64,
    /// Bytes per far tier, `[name, bytes]` (status: resident bytes per tier).
    #[serde(default)]
    pub tiers: Vec<(String, u64)>,
    /// The end of the part of its pool segment the process may still touch: the daemon
    /// shrinks the segment no lower (the units in use, or the size it was granted last).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub pool_top: u64,
    /// Sequence number of the last grant applied, met or not: the daemon trusts
    /// `pool_top` only from a report made after the process saw its latest pool size.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub applied: u64,
    /// How many [`Reply::Board`] this connection applied: the daemon frees the slots of
    /// the boards the process left only once it reports on the new one.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub boards: u64,
    pub ack: u64,
}

/// The board of a memory cgroup's runtimes: a sealed memory file of this many 64-bit
/// words the daemon shares with every runtime it welcomed in that group. Word 0 is how
/// many they are (the daemon writes it); word `slot` is what the runtime given that slot
/// holds resident, in bytes (it writes it, the daemon zeroes it when the runtime goes).
/// Each runtime sums the others' words when it reads its group: what its peers hold,
/// without the report-and-push round trip of `Peers`, which lagged 50-140 MiB behind
/// three programs filling a group at once (docs/design/paging.md, "Several runtimes in
/// one group"). 4095 slots; a runtime beyond them gets none and `Peers` alone.
pub const BOARD_WORDS: usize = 4096;

/// Daemon to client.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Reply {
    Welcome {
        client: u64,
        grant: u64,
        seq: u64,
        #[serde(default)]
        move_limit: u64,
        /// Bytes of the node's far memory the process may hold in its `memory` tiers
        /// (None: no limit from the daemon).
        #[serde(default)]
        far_grant: Option<u64>,
        /// The size of its segment of the node's far pool (None: no segment). A new
        /// segment's memory file is attached (`fds` = 1).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pool: Option<u64>,
        /// Its slot on the board of its memory cgroup's runtimes (None: no board; the
        /// group has no limit, or its board is full). The board's memory file is
        /// attached after the segment's (`fds` counts both). Layout: [`BOARD_WORDS`].
        #[serde(default, skip_serializing_if = "Option::is_none")]
        board: Option<u32>,
        #[serde(default, skip_serializing_if = "is_zero_usize")]
        fds: usize,
    },
    /// A new DRAM budget for this process (pushed, no id), and the limit on its page
    /// movement in bytes/s (0: none).
    Grant {
        grant: u64,
        seq: u64,
        #[serde(default)]
        move_limit: u64,
        #[serde(default)]
        far_grant: Option<u64>,
        /// The size of its pool segment now: grown before this grant is sent.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pool: Option<u64>,
    },
    /// Resident managed bytes of the other runtimes in this process's memory cgroup (the
    /// one whose limit binds it) and how many they are, pushed when that sum moves by more
    /// than the group's step or their number by an eighth (docs/design/daemon.md). The
    /// runtime's `follow_limit` divides an excess over the limit among them by what each
    /// holds, and the free room below it by their number.
    Peers {
        resident: u64,
        /// 0 from a daemon before this field: the room is then not divided.
        #[serde(default)]
        runtimes: u32,
    },
    /// The process moved to another memory cgroup (the daemon reads its cgroup again
    /// about once a second): its slot on the new group's board (None: the new group has
    /// no limit, or its board is full), the board's memory file attached (`fds` = 1).
    /// The process stops writing its old slot; the daemon frees that slot at its first
    /// report that counts this reply (`Usage::boards`). Pushed, no id.
    Board {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        board: Option<u32>,
        #[serde(default, skip_serializing_if = "is_zero_usize")]
        fds: usize,
    },
    /// A shared region: its memory file is attached (`fds` = 1).
    Shared {
        id: u64,
        name: String,
        size: u64,
        created: bool,
        owner: u32,
        /// The region is staged input, sealed against writes: map it read-only.
        #[serde(default, skip_serializing_if = "is_false")]
        read_only: bool,
        fds: usize,
    },
    /// A staged input is in place: its size and how long the copy took.
    Staged {
        id: u64,
        name: String,
        size: u64,
        ms: u64,
        /// It was staged already (`reuse`): nothing was copied.
        #[serde(default, skip_serializing_if = "is_false")]
        reused: bool,
    },
    Ok {
        id: u64,
    },
    Error {
        id: u64,
        errno: i32,
        message: String,
    },
    Status {
        id: u64,
        status: Box<Status>,
    },
    Pong {
        id: u64,
    },
}

/// What `attune status` shows.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq)]
pub struct Status {
    pub version: String,
    pub pid: u32,
    pub uptime_s: f64,
    /// DRAM the daemon divides among workflows (before shared regions).
    pub dram_pool: u64,
    pub min_grant: u64,
    pub move_limit: u64,
    /// DRAM's share of the node's memory bandwidth (percent) a BW workflow claims by.
    #[serde(default)]
    pub bw_dram_pct: u64,
    pub shared_bytes: u64,
    pub granted: u64,
    /// Node memory the daemon divides among the runtimes' `memory` far tiers, and the sum
    /// of those grants.
    #[serde(default)]
    pub far_pool: u64,
    #[serde(default)]
    pub far_granted: u64,
    /// Bytes of the node's far pool allocated in the daemon (the runtimes' segments):
    /// charged to the daemon's memory cgroup, not to the jobs'.
    #[serde(default)]
    pub pool_bytes: u64,
    pub tiers: Vec<TierStatus>,
    pub workflows: Vec<WorkflowStatus>,
    pub shared: Vec<SharedStatus>,
    pub requests: u64,
    pub rejected: u64,
    pub rebalances: u64,
    /// Grants sent to runtimes by rebalances (each wakes the runtime's connection thread).
    #[serde(default)]
    pub grants_pushed: u64,
    /// Time from the last shrinking rebalance to every shrunk client's acknowledgement.
    pub last_reclaim_ms: Option<f64>,
    /// Kernel features this node's kernel lacks or refuses, whose fallbacks the runtimes
    /// here run (`attune_sys::kernel::FEATURES` names; docs/design/kernels.md).
    #[serde(default)]
    pub kernel_fallbacks: Vec<String>,
    /// Other users' workflows and shared regions, summed, for a caller who may not see
    /// them one by one (a user other than root).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub others: Option<OthersStatus>,
    /// The item the next page starts from, when this reply did not hold them all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<u64>,
}

/// What a user is shown of other users' use of the node: totals only.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq)]
pub struct OthersStatus {
    pub workflows: u64,
    pub processes: u64,
    pub want: u64,
    pub grant: u64,
    pub resident: u64,
    pub shared_regions: u64,
    pub shared_bytes: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

fn is_zero_usize(n: &usize) -> bool {
    *n == 0
}

fn is_false(b: &bool) -> bool {
    !*b
}

#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq)]
pub struct TierStatus {
    pub name: String,
    pub kind: String,
    pub nodes: Vec<u32>,
    pub capacity: u64,
}

#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq)]
pub struct WorkflowStatus {
    pub name: String,
    pub uid: u32,
    /// The Slurm job of its processes, from their memory cgroup (empty: none).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub job: String,
    pub flags: String,
    /// Its processes (at most the first [`STATUS_PIDS_SHOWN`]), and how many there are.
    pub pids: Vec<i32>,
    #[serde(default)]
    pub processes: u64,
    pub want: u64,
    pub protected: u64,
    pub grant: u64,
    /// Page movement limit of each process, bytes/s (0: none).
    pub move_limit: u64,
    pub resident: u64,
    pub pinned: u64,
    pub faults: u64,
    pub evictions: u64,
    pub fetched_bytes: u64,
    pub evicted_bytes: u64,
    /// Share of sampled pages touched again within the window (0-1): a heat summary.
    pub heat: Option<f64>,
    /// Far memory (`memory` tiers): held, wanted, granted.
    #[serde(default)]
    pub far_used: u64,
    #[serde(default)]
    pub far_want: u64,
    #[serde(default)]
    pub far_grant: u64,
    /// Bytes of its segments of the node's far pool.
    #[serde(default)]
    pub pool: u64,
    /// Bytes per tier: `dram` first (resident), then each far tier by name.
    #[serde(default)]
    pub tiers: Vec<(String, u64)>,
}

#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq)]
pub struct SharedStatus {
    pub name: String,
    pub owner: u32,
    pub flags: String,
    pub size: u64,
    pub resident: u64,
    pub refs: u32,
    /// Users the owner let open it (shown to the owner and root; at most the first
    /// [`STATUS_GRANTED_SHOWN`]).
    pub granted_uids: Vec<u32>,
    /// How many users it is granted to.
    #[serde(default)]
    pub granted_count: u64,
    /// Staged input (read-only), held by the daemon until unstaged; `job`: the Slurm job
    /// that staged it, whose end unstages it (empty: none).
    #[serde(default, skip_serializing_if = "is_false")]
    pub staged: bool,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub job: String,
}

/// The pool unit: a runtime takes its pool segment in units of this size, and the
/// daemon sizes segments in multiples of it.
pub const POOL_UNIT: u64 = 64 << 10;

/// Processes listed per workflow in a status reply.
pub const STATUS_PIDS_SHOWN: usize = 256;
/// Tiers a process may report in `Usage::tiers` (more are dropped).
pub const USAGE_TIERS_MAX: usize = 8;

/// Granted users listed per shared region in a status reply.
pub const STATUS_GRANTED_SHOWN: usize = 64;

/// One frame: the length and the JSON body. A message above [`MAX_FRAME`] is refused
/// here, on the sender's side, as the reader would refuse it.
pub fn encode<T: Serialize>(msg: &T) -> io::Result<Vec<u8>> {
    let body = serde_json::to_vec(msg).map_err(io::Error::other)?;
    if body.len() > MAX_FRAME {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("frame of {} bytes (at most {MAX_FRAME})", body.len()),
        ));
    }
    let mut buf = Vec::with_capacity(4 + body.len());
    buf.extend_from_slice(&(body.len() as u32).to_le_bytes());
    buf.extend_from_slice(&body);
    Ok(buf)
}

/// Writes one frame (and descriptors with it).
pub fn write_frame<T: Serialize>(sock: &UnixStream, msg: &T, fds: &[RawFd]) -> io::Result<()> {
    let buf = encode(msg)?;
    attune_sys::unix::send_with_fds(sock, &buf, fds).map_err(io::Error::from)
}

/// Reads frames from one socket, keeping partial frames and received descriptors.
#[derive(Default)]
pub struct FrameReader {
    buf: Vec<u8>,
    fds: VecDeque<OwnedFd>,
}

/// Why a frame could not be read.
#[derive(Debug)]
pub enum ReadError {
    /// The peer closed the connection between frames.
    Closed,
    Io(io::Error),
    /// Not a frame of this protocol (too large, bad JSON, unknown op, descriptors
    /// missing or in excess): the connection should be dropped.
    Malformed(String),
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadError::Closed => write!(f, "connection closed"),
            ReadError::Io(e) => write!(f, "{e}"),
            ReadError::Malformed(m) => write!(f, "malformed message: {m}"),
        }
    }
}

impl FrameReader {
    /// The next message and its descriptors (`fds_of` says how many it claims).
    pub fn read<T: for<'de> Deserialize<'de>>(
        &mut self,
        sock: &UnixStream,
        fds_of: impl Fn(&T) -> usize,
    ) -> Result<(T, Vec<OwnedFd>), ReadError> {
        loop {
            if let Some(r) = self.next(&fds_of) {
                return r;
            }
            let mut chunk = [0u8; 16 << 10];
            let mut got = Vec::new();
            let n = attune_sys::unix::recv_with_fds(sock, &mut chunk, &mut got)
                .map_err(|e| ReadError::Io(e.into()))?;
            if self.fds.len() + got.len() > attune_sys::unix::MAX_FDS {
                return Err(ReadError::Malformed("too many descriptors".into()));
            }
            self.fds.extend(got);
            if n == 0 {
                return Err(if self.buf.is_empty() {
                    ReadError::Closed
                } else {
                    ReadError::Malformed("connection closed inside a frame".into())
                });
            }
            self.feed(&chunk[..n]);
        }
    }

    /// Adds received bytes (the socket-free half of [`read`](Self::read), which the
    /// protocol's fuzz target drives directly).
    pub fn feed(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// The next complete frame among the bytes fed so far, or None until more arrive.
    /// An error means the peer is not speaking this protocol: drop the connection.
    pub fn next<T: for<'de> Deserialize<'de>>(
        &mut self,
        fds_of: impl Fn(&T) -> usize,
    ) -> Option<Result<(T, Vec<OwnedFd>), ReadError>> {
        if self.buf.len() < 4 {
            return None;
        }
        let len = u32::from_le_bytes(self.buf[..4].try_into().unwrap()) as usize;
        if len > MAX_FRAME {
            return Some(Err(ReadError::Malformed(format!(
                "frame of {len} bytes (at most {MAX_FRAME})"
            ))));
        }
        if self.buf.len() < 4 + len {
            return None;
        }
        let body: Vec<u8> = self.buf.drain(..4 + len).skip(4).collect();
        let msg: T = match serde_json::from_slice(&body) {
            Ok(m) => m,
            Err(e) => return Some(Err(ReadError::Malformed(e.to_string()))),
        };
        let n = fds_of(&msg);
        if n > self.fds.len() {
            return Some(Err(ReadError::Malformed(format!(
                "{n} descriptors announced, {} received",
                self.fds.len()
            ))));
        }
        let fds: Vec<OwnedFd> = self.fds.drain(..n).collect();
        if self.buf.is_empty() && !self.fds.is_empty() {
            // Descriptors nobody announced: a confused or hostile peer.
            self.fds.clear();
            return Some(Err(ReadError::Malformed(
                "descriptors sent without a message naming them".into(),
            )));
        }
        Some(Ok((msg, fds)))
    }
}

impl Request {
    /// Descriptors a request carries.
    pub fn fds(&self) -> usize {
        match self {
            Request::Hello { fds, .. }
            | Request::Stage { fds, .. }
            | Request::Rejoin { fds, .. } => *fds,
            _ => 0,
        }
    }
}

impl Reply {
    pub fn fds(&self) -> usize {
        match self {
            Reply::Shared { fds, .. } | Reply::Welcome { fds, .. } | Reply::Board { fds, .. } => {
                *fds
            }
            _ => 0,
        }
    }
}

/// Connects, with a timeout for replies so a hung daemon cannot hang the caller.
pub fn connect(path: &std::path::Path, timeout: std::time::Duration) -> io::Result<UnixStream> {
    let s = UnixStream::connect(path)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    Ok(s)
}

/// One request and its reply on a connection nobody else reads (the CLI's way).
pub fn call(sock: &UnixStream, req: &Request) -> Result<(Reply, Vec<OwnedFd>), ReadError> {
    call_with(sock, req, &[])
}

/// [`call`] with descriptors attached to the request.
pub fn call_with(
    sock: &UnixStream,
    req: &Request,
    fds: &[RawFd],
) -> Result<(Reply, Vec<OwnedFd>), ReadError> {
    write_frame(sock, req, fds).map_err(ReadError::Io)?;
    FrameReader::default().read(sock, Reply::fds)
}

/// Raw fd of a descriptor, for `write_frame`.
pub fn raw(fd: &OwnedFd) -> RawFd {
    fd.as_raw_fd()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_with_descriptor() {
        let (a, b) = UnixStream::pair().unwrap();
        let m = attune_sys::unix::memfd_sized("x", 4096).unwrap();
        let r = Reply::Shared {
            id: 3,
            name: "in".into(),
            size: 4096,
            created: true,
            owner: 0,
            read_only: false,
            fds: 1,
        };
        write_frame(&a, &r, &[raw(&m)]).unwrap();
        write_frame(&a, &Reply::Pong { id: 4 }, &[]).unwrap();
        let mut rd = FrameReader::default();
        let (got, fds) = rd.read(&b, Reply::fds).unwrap();
        assert_eq!(got, r);
        assert_eq!(fds.len(), 1);
        let (got, fds) = rd.read(&b, Reply::fds).unwrap();
        assert_eq!(got, Reply::Pong { id: 4 });
        assert!(fds.is_empty());
        drop(a);
        assert!(matches!(rd.read(&b, Reply::fds), Err(ReadError::Closed)));
    }

    #[test]
    fn refuses_oversized_and_garbage() {
        use std::io::Write;
        let (mut a, b) = UnixStream::pair().unwrap();
        a.write_all(&(1u32 << 30).to_le_bytes()).unwrap();
        assert!(matches!(
            FrameReader::default().read(&b, Request::fds),
            Err(ReadError::Malformed(_))
        ));
        let (mut a, b) = UnixStream::pair().unwrap();
        a.write_all(&5u32.to_le_bytes()).unwrap();
        a.write_all(b"{op:}").unwrap();
        assert!(matches!(
            FrameReader::default().read(&b, Request::fds),
            Err(ReadError::Malformed(_))
        ));
        // A known op with a field too many.
        let (mut a, b) = UnixStream::pair().unwrap();
        let body = br#"{"op":"ping","id":1,"evil":2}"#;
        a.write_all(&(body.len() as u32).to_le_bytes()).unwrap();
        a.write_all(body).unwrap();
        assert!(matches!(
            FrameReader::default().read(&b, Request::fds),
            Err(ReadError::Malformed(_))
        ));
    }

    #[test]
    fn peers_from_a_daemon_before_their_number_read_as_none() {
        // A daemon before `runtimes` sends the sum alone: the runtime then divides no room.
        let old: Reply = serde_json::from_str(r#"{"op":"peers","resident":7}"#).unwrap();
        assert_eq!(
            old,
            Reply::Peers {
                resident: 7,
                runtimes: 0
            }
        );
        let new = serde_json::to_string(&Reply::Peers {
            resident: 7,
            runtimes: 3,
        })
        .unwrap();
        assert_eq!(new, r#"{"op":"peers","resident":7,"runtimes":3}"#);
    }

    #[test]
    fn unannounced_descriptors_are_refused() {
        let (a, b) = UnixStream::pair().unwrap();
        let m = attune_sys::unix::memfd_sized("x", 4096).unwrap();
        write_frame(&a, &Request::Ping { id: 1 }, &[raw(&m)]).unwrap();
        assert!(matches!(
            FrameReader::default().read(&b, Request::fds),
            Err(ReadError::Malformed(_))
        ));
    }
}
