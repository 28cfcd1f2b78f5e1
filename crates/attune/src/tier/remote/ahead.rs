//! Windows fetched ahead of a stream's faults (`attune_policy::ahead` decides which):
//! a few buffers of the tier's own, each holding one window's pages as the servers had
//! them when it was asked for. A load that a window holds is placed from it, without a
//! round trip; one on its way is waited for (the remainder of its transfer only).
//!
//! Signal-safe, like the job table: the fault path takes, fills and gives back windows
//! with atomics and futexes. A window's job is posted like a load but answered into the
//! window (`arrived`, `result`) and freed by the I/O thread, so a window nobody comes for
//! holds no job.
//!
//! A window is only as good as the servers' content when it was read. Every store and
//! discard the I/O thread serves marks the windows it overlaps `stale` before its
//! requests go out (`Ahead::overlaps`), and the I/O thread serves jobs in batches, one
//! after the other: a store served before a window's batch has its reply, so the window
//! reads it; one served in the same batch or after marks it. A stale window is dropped
//! when taken, and the fault path's content hashes check whatever is placed from a
//! window as they check any load (a mismatch loads the run again, from the servers).

// Atomics and waits from the shim: the loom model (crates/attune/tests/loom.rs) checks
// this protocol on its own source.
use crate::sync::shim::{
    self, AtomicBool, AtomicI32, AtomicU32, AtomicU64, AtomicUsize,
    Ordering::{AcqRel, Acquire, Relaxed, Release},
};

use attune_policy::ahead::{self, Trail, TRAIL};

/// Windows a tier holds at most: `WINDOWS_PER_DEPTH * depth` (at the default depth of 2,
/// 8 windows of 256 KiB: 2 MiB of buffers, as much as four streams keep on their way).
pub(super) const MAX_WINDOWS: usize = WINDOWS_PER_DEPTH * ahead::MAX_DEPTH;
const WINDOWS_PER_DEPTH: usize = 4;
/// Loads after which a window nobody placed from may be taken for another stream's (a
/// stream that stopped). Younger ones are not: four streams on six windows took each
/// other's before use, and fetched 2.3x what they placed (`unit_patterns threads`).
const STALE_AFTER_LOADS: u64 = 64;

const FREE: u32 = 0;
/// One thread fills it, posts it, or places from it.
const BUSY: u32 = 1;
/// Posted (`arrived` says whether its answer came) or filled.
const HELD: u32 = 2;

#[derive(Default)]
struct Window {
    state: AtomicU32,
    start: AtomicU64,
    len: AtomicU64,
    /// 1 once the I/O thread answered its job (`result`).
    arrived: AtomicU32,
    result: AtomicI32,
    /// A store or discard overlapped it after it was asked for.
    stale: AtomicBool,
    /// The tier's load count when it was asked for.
    stamp: AtomicU64,
}

/// What the tier fetched ahead (said at exit).
#[derive(Default)]
pub(super) struct Counts {
    pub(super) fetched: AtomicU64,
    pub(super) used: AtomicU64,
    /// Windows dropped because a store or discard overlapped them, or their load failed.
    pub(super) stale: AtomicU64,
    /// Windows whose pages did not match the content hashes (stale but not marked: a
    /// rule of the module broken, the load done again from the servers).
    pub(super) mismatched: AtomicU64,
}

pub(super) struct Ahead {
    windows: [Window; MAX_WINDOWS],
    /// Windows in use (0: read-ahead by the tier is off).
    usable: usize,
    depth: usize,
    /// Each window's buffer: `buf + i * window`.
    buf: usize,
    window: u64,
    /// The tier's offset space (no window is fetched past it).
    space: u64,
    trail: [AtomicU64; TRAIL],
    next: AtomicUsize,
    /// Loads served (the windows' clock).
    loads: AtomicU64,
    pub(super) counts: Counts,
}

/// A window taken by a load: placed from `addr`, then given back.
pub(super) struct Taken {
    i: usize,
    pub(super) addr: usize,
    /// Where the window ends (the stream's next windows follow it).
    pub(super) end: u64,
    /// The load ended where the window ends (nothing more to place from it).
    last: bool,
}

impl Ahead {
    /// `depth` windows of `window` bytes ahead of each stream (0: off, no buffers), in
    /// an offset space of `space` bytes.
    pub(super) fn new(depth: usize, window: usize, space: u64) -> Result<Ahead, String> {
        let depth = depth.min(ahead::MAX_DEPTH);
        let usable = WINDOWS_PER_DEPTH * depth;
        let buf = if usable == 0 {
            0
        } else {
            attune_sys::mem::map_anon(usable * window, true)
                .map_err(|e| format!("its read-ahead buffers: {e}"))?
        };
        Ok(Ahead {
            windows: std::array::from_fn(|_| Window::default()),
            usable,
            depth,
            buf,
            window: window as u64,
            space,
            trail: std::array::from_fn(|_| AtomicU64::new(0)),
            next: AtomicUsize::new(0),
            loads: AtomicU64::new(0),
            counts: Counts::default(),
        })
    }

    pub(super) fn on(&self) -> bool {
        self.usable > 0
    }

    fn used(&self) -> &[Window] {
        &self.windows[..self.usable]
    }

    fn addr(&self, i: usize) -> usize {
        self.buf + i * self.window as usize
    }

    /// A window that holds (or will hold) all of `[off, off+len)`, taken: waits for its
    /// pages if they are on their way. None: no such window, or its pages failed to
    /// arrive or went stale (dropped).
    pub(super) fn take(&self, off: u64, len: usize) -> Option<Taken> {
        let end = off + len as u64;
        for (i, w) in self.used().iter().enumerate() {
            if w.state.load(Acquire) != HELD {
                continue;
            }
            let (s, l) = (w.start.load(Relaxed), w.len.load(Relaxed));
            if off < s || end > s + l {
                continue;
            }
            if w.state
                .compare_exchange(HELD, BUSY, AcqRel, Relaxed)
                .is_err()
            {
                continue;
            }
            // The range is written only by a thread that holds the window BUSY: read it
            // again now that this one does.
            let (s, l) = (w.start.load(Relaxed), w.len.load(Relaxed));
            if off < s || end > s + l {
                w.state.store(HELD, Release);
                continue;
            }
            while w.arrived.load(Acquire) == 0 {
                shim::wait_while(&w.arrived, 0);
            }
            if w.result.load(Relaxed) != 0 || w.stale.load(Acquire) {
                self.counts.stale.fetch_add(1, Relaxed);
                w.state.store(FREE, Release);
                return None;
            }
            return Some(Taken {
                i,
                addr: self.addr(i) + (off - s) as usize,
                end: s + l,
                last: end == s + l,
            });
        }
        None
    }

    /// Gives a taken window back: kept for the rest of its pages, or freed once the load
    /// reached its end. `good` false: what it held did not check, dropped.
    pub(super) fn give_back(&self, t: Taken, good: bool, len: usize) {
        if !good {
            self.counts.mismatched.fetch_add(1, Relaxed);
            self.windows[t.i].state.store(FREE, Release);
            return;
        }
        self.counts.used.fetch_add(len as u64, Relaxed);
        let w = &self.windows[t.i];
        // In use: young again.
        w.stamp.store(self.loads.load(Relaxed), Relaxed);
        w.state.store(if t.last { FREE } else { HELD }, Release);
    }

    /// After a load of `[off, off+len)` (`served`: placed from a window that ends
    /// there): remembers it, and posts the windows the policy asks for. `held` says
    /// whether the servers hold every page of a range (a window of pages never stored is
    /// not asked for); `post` posts a window's load (buffer, offset, length, window
    /// index) and says whether a job was free for it.
    pub(super) fn after_load(
        &self,
        off: u64,
        len: usize,
        served: Option<u64>,
        held: impl Fn(u64, usize) -> bool,
        mut post: impl FnMut(usize, u64, usize, usize) -> bool,
    ) {
        if !self.on() {
            return;
        }
        let trail = Trail(std::array::from_fn(|k| self.trail[k].load(Relaxed)));
        let have = |s: u64| {
            self.used().iter().any(|w| {
                let (ws, wl) = (w.start.load(Relaxed), w.len.load(Relaxed));
                w.state.load(Acquire) != FREE && ws <= s && s < ws + wl
            })
        };
        let a = ahead::Ahead {
            depth: self.depth,
            window: self.window,
            space: self.space,
        };
        let (wins, n) = ahead::windows(a, &trail, off, len as u64, served, have);
        let now = self.loads.fetch_add(1, Relaxed);
        let k = self.next.fetch_add(1, Relaxed) % TRAIL;
        self.trail[k].store(off + len as u64, Relaxed);
        for &(s, l) in &wins[..n] {
            if !held(s, l as usize) {
                break;
            }
            let Some(i) = self.claim_free(now) else { break };
            let w = &self.windows[i];
            w.stamp.store(now, Relaxed);
            w.start.store(s, Relaxed);
            w.len.store(l, Relaxed);
            w.stale.store(false, Relaxed);
            w.result.store(0, Relaxed);
            w.arrived.store(0, Release);
            if !post(self.addr(i), s, l as usize, i) {
                w.state.store(FREE, Release);
                break;
            }
            self.counts.fetched.fetch_add(l, Relaxed);
            w.state.store(HELD, Release);
        }
    }

    /// A window no thread uses, taken BUSY: a free one, else one whose pages arrived and
    /// that no load came for in [`STALE_AFTER_LOADS`] (`now`: the load count).
    fn claim_free(&self, now: u64) -> Option<usize> {
        let ws = self.used();
        let grab = |i: usize, from: u32| {
            ws[i]
                .state
                .compare_exchange(from, BUSY, AcqRel, Relaxed)
                .is_ok()
        };
        if let Some(i) = (0..ws.len()).find(|&i| ws[i].state.load(Relaxed) == FREE && grab(i, FREE))
        {
            return Some(i);
        }
        (0..ws.len()).find(|&i| {
            let w = &ws[i];
            w.state.load(Relaxed) == HELD
                && w.arrived.load(Acquire) == 1
                && now.saturating_sub(w.stamp.load(Relaxed)) > STALE_AFTER_LOADS
                && grab(i, HELD)
        })
    }

    /// The I/O thread answers window `i`'s job.
    pub(super) fn arrive(&self, i: usize, code: i32) {
        let w = &self.windows[i];
        w.result.store(code, Relaxed);
        w.arrived.store(1, Release);
        shim::wake_all(&w.arrived);
    }

    /// A store or discard of `[off, off+len)` is about to be served: the windows it
    /// overlaps no longer hold the servers' content.
    pub(super) fn overlaps(&self, off: u64, len: u64) {
        for w in self.used() {
            if w.state.load(Acquire) == FREE {
                continue;
            }
            let (s, l) = (w.start.load(Relaxed), w.len.load(Relaxed));
            if off < s + l && s < off + len {
                w.stale.store(true, Release);
            }
        }
    }

    /// Every window waited for and freed (a fork: the runtime is quiesced, and the
    /// child's I/O thread answers none of the parent's jobs; a server lost or rehomed).
    pub(super) fn drain(&self) {
        for (i, w) in self.used().iter().enumerate() {
            if w.state.load(Acquire) == FREE {
                continue;
            }
            if w.state
                .compare_exchange(HELD, BUSY, AcqRel, Relaxed)
                .is_err()
            {
                continue;
            }
            while w.arrived.load(Acquire) == 0 {
                shim::wait_while(&w.arrived, 0);
            }
            self.windows[i].state.store(FREE, Release);
        }
    }

    /// Marks every window stale (the I/O thread: copies forgotten, a server lost).
    pub(super) fn forget(&self) {
        for w in self.used() {
            w.stale.store(true, Release);
        }
    }
}

impl Drop for Ahead {
    fn drop(&mut self) {
        if self.buf != 0 {
            let _ = attune_sys::mem::unmap(self.buf, self.usable * self.window as usize);
        }
    }
}
