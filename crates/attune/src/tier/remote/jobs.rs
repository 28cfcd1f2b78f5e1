//! The table between the fault path and the remote tier's I/O thread. The fault path is
//! signal-safe and the fabric library is not, so a store or load claims one of the
//! tier's `concurrency` jobs (at most `MAX_JOBS`), fills it, rings the doorbell and
//! sleeps on a futex until the I/O thread has served it (`Shared::post`: atomics and
//! futexes only). The I/O thread takes every job posted (`posted`), serves them together
//! and answers each (`answer`). The table also holds which servers have each page's
//! current content (`valid`), and what a fork needs: the sessions cloned for the child
//! (`clones`) and the I/O thread's park (`park`).

use attune_proto::remote::{self as proto, Op};
use attune_sys::{Errno, SysResult};
use std::sync::atomic::{
    AtomicBool, AtomicI32, AtomicU32, AtomicU64, AtomicUsize,
    Ordering::{AcqRel, Acquire, Relaxed, Release},
};

/// Most jobs posted at once: the `concurrency` option's ceiling (callers beyond the
/// tier's `concurrency` wait for a free job). The table is fixed, so that posting stays
/// signal-safe; only its first `concurrency` jobs are ever claimed, posted or scanned.
pub(super) const MAX_JOBS: usize = 64;
/// The least `concurrency` at which windows are fetched ahead (they hold jobs while on
/// their way).
pub(super) const MIN_JOBS_AHEAD: usize = 4;

/// A posted operation per job, and an answer per job.
pub(super) type Ops = [Option<Op>; MAX_JOBS];
pub(super) type Codes = [i32; MAX_JOBS];

const FREE: u32 = 0;
const CLAIMED: u32 = 1;
const POSTED: u32 = 2;
const DONE: u32 = 3;

#[derive(Default)]
pub(super) struct Job {
    pub(super) state: AtomicU32,
    pub(super) op: AtomicU32,
    pub(super) addr: AtomicUsize,
    pub(super) off: AtomicU64,
    pub(super) len: AtomicUsize,
    pub(super) result: AtomicI32,
    /// Nobody waits: the I/O thread frees the job (discards).
    pub(super) detached: AtomicBool,
    /// A window fetched ahead (its index + 1; 0: none): answered into the window, freed
    /// by the I/O thread, and quiet when it fails (no fault asked for it).
    pub(super) window: AtomicUsize,
    /// When it was posted, among the tier's jobs (`Shared::in_order`).
    pub(super) ticket: AtomicU64,
}

pub(super) struct Shared {
    jobs: [Job; MAX_JOBS],
    /// Jobs that may be posted at once (the tier's `concurrency`, 1..=MAX_JOBS).
    limit: usize,
    /// Bumped at every post; the I/O thread sleeps on it.
    pub(super) doorbell: AtomicU32,
    /// Bumped when a job is freed; callers waiting for a job sleep on it.
    freed: AtomicU32,
    /// The next job's ticket.
    tickets: AtomicU64,
    /// Per page of the offset space: bit r set when copy r (on the server `Client::place`
    /// gives it for the owner of the page's unit) holds the page's current content. Per page, not per
    /// unit: the pages of one unit are stored, discarded and refused apart, and a unit's
    /// bit once cleared by one page's discard lost its other pages (seen in
    /// bench/remote.py's random updates). Written by the I/O thread; read by stores, which
    /// must not skip writing content no server holds any more. Zero pages mapped on
    /// demand (`AtomicTable`): only the offsets in use cost memory.
    pub(super) valid: attune_sys::mem::AtomicTable,
    /// 1 from a `Clone` job's answer until the fork is over in the parent: the I/O thread
    /// waits on it, outside the fabric library, so that no lock of the library is held
    /// at the instant of the fork (the child opens an endpoint of its own with it).
    pub(super) park: AtomicU32,
    /// Per server, the session cloned for the child of the fork under way (number and
    /// token), or none (no data, or the server did not clone it).
    pub(super) clones: std::sync::Mutex<Vec<Option<(u64, [u8; 16])>>>,
    /// Where each unit's copies are once a lost server was given up on (the I/O
    /// thread's `place`, written when it changes; empty: where they start), for a forked
    /// child, whose bits name those places.
    pub(super) place: std::sync::Mutex<Vec<usize>>,
    /// A forked child's I/O thread has begun (1).
    pub(super) started: AtomicU32,
    /// Some store has succeeded: copies may exist, and a fork clones the sessions.
    /// (Not the tier's `stored` bytes: pages loaded back keep their copies, which the
    /// child's clean evictions rely on.)
    pub(super) ever_stored: AtomicBool,
    /// The I/O thread has told the servers that this process is exiting (1).
    pub(super) left: AtomicU32,
    /// Windows fetched ahead of streams (`ahead`).
    pub(super) ahead: super::ahead::Ahead,
}

impl Shared {
    /// `pages` pages of offset space; `depth` windows of `window` bytes fetched ahead of
    /// each stream (0: none).
    pub(super) fn new(
        pages: usize,
        concurrency: usize,
        depth: usize,
        window: usize,
    ) -> Result<Shared, String> {
        let limit = concurrency.clamp(1, MAX_JOBS);
        // Windows take jobs the faults would otherwise have: at a small `concurrency`,
        // none are fetched ahead.
        let depth = if limit < MIN_JOBS_AHEAD { 0 } else { depth };
        Ok(Shared {
            jobs: std::array::from_fn(|_| Job::default()),
            limit,
            doorbell: AtomicU32::new(0),
            freed: AtomicU32::new(0),
            tickets: AtomicU64::new(0),
            valid: attune_sys::mem::AtomicTable::new(pages)
                .map_err(|e| format!("its copy table: {e}"))?,
            park: AtomicU32::new(0),
            clones: Default::default(),
            place: Default::default(),
            started: AtomicU32::new(0),
            ever_stored: AtomicBool::new(false),
            left: AtomicU32::new(0),
            ahead: super::ahead::Ahead::new(depth, window, pages as u64 * proto::PAGE)?,
        })
    }

    /// Jobs that may be posted at once (the tier's `concurrency`).
    pub(super) fn limit(&self) -> usize {
        self.limit
    }

    fn word(&self, page: u64) -> Option<&AtomicU64> {
        ((page as usize) < self.valid.len()).then(|| self.valid.get(page as usize))
    }

    /// The copies of the page at byte offset `at`.
    pub(super) fn bits(&self, at: u64) -> u8 {
        self.word(at / proto::PAGE)
            .map_or(0, |v| v.load(Acquire) as u8)
    }

    /// The copies every page of `[off, off+len)` has.
    pub(super) fn common(&self, off: u64, len: u64) -> u8 {
        (off / proto::PAGE..(off + len).div_ceil(proto::PAGE))
            .fold(0xff, |m, p| m & self.bits(p * proto::PAGE))
    }

    /// Whether every page of `[off, off+len)` has a copy on some server.
    pub(super) fn held(&self, off: u64, len: usize) -> bool {
        (off / proto::PAGE..(off + len as u64).div_ceil(proto::PAGE))
            .all(|p| self.bits(p * proto::PAGE) != 0)
    }

    /// Applies `f` to the copy bits of every page of `[off, off+len)`.
    pub(super) fn update(&self, off: u64, len: u64, f: impl Fn(&AtomicU64)) {
        for p in off / proto::PAGE..(off + len).div_ceil(proto::PAGE) {
            if let Some(v) = self.word(p) {
                f(v);
            }
        }
    }

    /// Posts a job to the I/O thread and (unless `detached`) waits for its answer.
    /// Signal-safe: atomics and futexes only.
    pub(super) fn post(
        &self,
        op: Op,
        addr: usize,
        off: u64,
        len: usize,
        detached: bool,
    ) -> SysResult<()> {
        let job = self.claim();
        self.start(job, op, addr, off, len, detached);
        if detached {
            return Ok(());
        }
        self.finish(job)
    }

    /// Posts the load of window `w` (`ahead`) into `addr` if a job is free (a window
    /// never waits for one). Signal-safe.
    pub(super) fn post_window(&self, w: usize, addr: usize, off: u64, len: usize) -> bool {
        let Some(job) = self.try_claim() else {
            return false;
        };
        job.window.store(w + 1, Relaxed);
        self.start(job, Op::Load, addr, off, len, true);
        true
    }

    /// Whether job `k` loads a window fetched ahead (its failure is nobody's fault).
    pub(super) fn is_window(&self, k: usize) -> bool {
        self.jobs[k].window.load(Relaxed) != 0
    }

    /// Posts `op` for every `(addr, off, len)` of `parts` and waits for them all, several
    /// in flight at once (a store written in pieces: `attune_policy::writeback`). Returns
    /// the first error. It never waits for a free job while holding one: two callers
    /// that each held some and waited for more would wait for ever.
    pub(super) fn post_each(&self, op: Op, parts: &[(usize, u64, usize)]) -> SysResult<()> {
        // Half the jobs, so that a fault's load finds one free while a store is written.
        const MOST: usize = MAX_JOBS / 2;
        let in_flight = (self.limit / 2).max(1);
        let mut held: [Option<&Job>; MOST] = [None; MOST];
        let mut n = 0;
        let mut result = Ok(());
        let mut drain = |held: &mut [Option<&Job>; MOST], n: &mut usize| {
            for j in held.iter_mut().take(*n) {
                if let Some(j) = j.take() {
                    let r = self.finish(j);
                    if result.is_ok() {
                        result = r;
                    }
                }
            }
            *n = 0;
        };
        for &(addr, off, len) in parts {
            let job = loop {
                if n < in_flight {
                    if let Some(j) = self.try_claim() {
                        break j;
                    }
                }
                if n == 0 {
                    break self.claim();
                }
                drain(&mut held, &mut n);
            };
            self.start(job, op, addr, off, len, false);
            held[n] = Some(job);
            n += 1;
        }
        drain(&mut held, &mut n);
        result
    }

    /// The jobs this tier may use.
    fn usable(&self) -> &[Job] {
        &self.jobs[..self.limit]
    }

    /// A free job, claimed. Busy jobs are passed over by a load, not a failed
    /// compare-exchange: with up to 64 jobs, a fault would otherwise write to the cache
    /// line of every busy one on its way to a free one.
    fn try_claim(&self) -> Option<&Job> {
        self.usable().iter().find(|j| {
            j.state.load(Relaxed) == FREE
                && j.state
                    .compare_exchange(FREE, CLAIMED, AcqRel, Relaxed)
                    .is_ok()
        })
    }

    fn claim(&self) -> &Job {
        loop {
            let seen = self.freed.load(Acquire);
            if let Some(j) = self.try_claim() {
                return j;
            }
            attune_sys::os::futex_wait(&self.freed, seen, 10_000_000);
        }
    }

    fn start(&self, job: &Job, op: Op, addr: usize, off: u64, len: usize, detached: bool) {
        job.op.store(op as u32, Relaxed);
        job.addr.store(addr, Relaxed);
        job.off.store(off, Relaxed);
        job.len.store(len, Relaxed);
        job.detached.store(detached, Relaxed);
        job.ticket
            .store(self.tickets.fetch_add(1, Relaxed), Relaxed);
        job.state.store(POSTED, Release);
        self.doorbell.fetch_add(1, Release);
        attune_sys::os::futex_wake(&self.doorbell, 1);
    }

    /// Waits for a posted job's answer and frees it.
    fn finish(&self, job: &Job) -> SysResult<()> {
        loop {
            let s = job.state.load(Acquire);
            if s == DONE {
                break;
            }
            attune_sys::os::futex_wait(&job.state, s, 0);
        }
        let r = job.result.load(Relaxed);
        job.state.store(FREE, Release);
        self.freed.fetch_add(1, Release);
        attune_sys::os::futex_wake(&self.freed, i32::MAX);
        if r == 0 {
            Ok(())
        } else {
            Err(Errno(r))
        }
    }

    /// The process is exiting: asks the I/O thread to tell the servers (`Client::leave`)
    /// and waits for it up to `wait_ns` (an exit is not held up by a stalled server).
    pub(super) fn leave(&self, wait_ns: u64) {
        self.post(Op::Bye, 0, 0, 0, true).ok();
        let deadline = attune_sys::os::now_ns() + wait_ns;
        while self.left.load(Acquire) == 0 {
            let now = attune_sys::os::now_ns();
            if now >= deadline {
                return;
            }
            attune_sys::os::futex_wait(&self.left, 0, deadline - now);
        }
    }

    /// The I/O thread has said what `leave` asked for.
    pub(super) fn mark_left(&self) {
        self.left.store(1, Release);
        attune_sys::os::futex_wake(&self.left, i32::MAX);
    }

    /// Parks the calling thread (the I/O thread) until `unpark`.
    pub(super) fn wait_parked(&self) {
        while self.park.load(Acquire) != 0 {
            attune_sys::os::futex_wait(&self.park, 1, 0);
        }
    }

    pub(super) fn unpark(&self) {
        self.park.store(0, Release);
        attune_sys::os::futex_wake(&self.park, i32::MAX);
    }

    /// A posted job's buffer, tier offset and length.
    pub(super) fn job(&self, k: usize) -> (usize, u64, usize) {
        let j = &self.jobs[k];
        (
            j.addr.load(Relaxed),
            j.off.load(Relaxed),
            j.len.load(Relaxed),
        )
    }

    /// The operation of each job posted now (the I/O thread's side).
    pub(super) fn posted(&self) -> Ops {
        let mut ops = [None; MAX_JOBS];
        for (k, j) in self.usable().iter().enumerate() {
            if j.state.load(Acquire) == POSTED {
                ops[k] = Some(match j.op.load(Relaxed) {
                    2 => Op::Store,
                    3 => Op::Load,
                    5 => Op::Bye,
                    7 => Op::Clone,
                    _ => Op::Discard,
                });
            }
        }
        ops
    }

    /// The jobs of `ops` in the order they were posted. Their requests go out in that
    /// order, and a server applies a session's requests in the order they arrive: a
    /// detached discard of an offset range and a store posted after it to the same range
    /// (the range freed and given to a new region, or a chunk discarded and written
    /// again) must not reach the server the other way round, which would drop the
    /// store's pages while their copy bits say they are held.
    pub(super) fn in_order(&self, ops: &Ops) -> Vec<usize> {
        let mut ks: Vec<usize> = (0..MAX_JOBS).filter(|&k| ops[k].is_some()).collect();
        ks.sort_by_key(|&k| self.jobs[k].ticket.load(Relaxed));
        ks
    }

    /// Answers each job of `ops` with its code (0 or an errno): a waiting caller is
    /// woken, a detached job is freed.
    pub(super) fn answer(&self, ops: &Ops, codes: &Codes) {
        for (k, j) in self.usable().iter().enumerate() {
            if ops[k].is_none() {
                continue;
            }
            j.result.store(codes[k], Relaxed);
            let w = j.window.swap(0, Relaxed);
            if w != 0 {
                self.ahead.arrive(w - 1, codes[k]);
            }
            if j.detached.load(Relaxed) {
                j.state.store(FREE, Release);
                self.freed.fetch_add(1, Release);
                attune_sys::os::futex_wake(&self.freed, i32::MAX);
            } else {
                j.state.store(DONE, Release);
                attune_sys::os::futex_wake(&j.state, 1);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_most_the_tiers_concurrency_is_claimed_at_once() {
        for (asked, limit) in [(1, 1), (3, 3), (32, 32), (0, 1), (1000, MAX_JOBS)] {
            let s = Shared::new(16, asked, 0, 0).unwrap();
            let held: Vec<&Job> = std::iter::from_fn(|| s.try_claim()).collect();
            assert_eq!(held.len(), limit, "concurrency {asked}");
            // A job freed is claimed again, and only it.
            s.start(held[0], Op::Load, 0, 0, 4096, false);
            s.answer(&s.posted(), &[0; MAX_JOBS]);
            assert!(s.finish(held[0]).is_ok());
            assert!(s.try_claim().is_some() && s.try_claim().is_none());
        }
    }

    #[test]
    fn jobs_are_served_in_the_order_they_were_posted() {
        let s = Shared::new(16, 8, 0, 0).unwrap();
        // Jobs 0-2 claimed; job 2 posted first (a detached discard), then job 0 (a store
        // of the same range), then job 1: the table's order is not the posting order.
        let held: Vec<&Job> = (0..3).map(|_| s.try_claim().unwrap()).collect();
        s.start(held[2], Op::Discard, 0, 0, 8192, true);
        s.start(held[0], Op::Store, 0x1000, 0, 4096, false);
        s.start(held[1], Op::Load, 0x2000, 4096, 4096, false);
        assert_eq!(s.in_order(&s.posted()), [2, 0, 1]);
        // Only the jobs asked about.
        let mut some = s.posted();
        some[2] = None;
        assert_eq!(s.in_order(&some), [0, 1]);
    }

    #[test]
    fn a_window_is_answered_into_itself_and_holds_no_job() {
        const W: usize = 64 << 10;
        let s = Shared::new(1024, 8, 2, W).unwrap();
        let mut posted = Vec::new();
        // A stream of loads: the second continues the first, so windows are posted.
        for off in [0u64, W as u64] {
            s.ahead.after_load(
                off,
                W,
                None,
                |_, _| true,
                |a, o, l, w| {
                    let ok = s.post_window(w, a, o, l);
                    posted.push((o, l));
                    ok
                },
            );
        }
        assert_eq!(posted, [(2 * W as u64, W), (3 * W as u64, W)]);
        let ops = s.posted();
        assert_eq!(ops.iter().flatten().count(), 2);
        let k: Vec<usize> = (0..MAX_JOBS).filter(|&k| ops[k].is_some()).collect();
        assert!(k.iter().all(|&k| s.is_window(k)));
        // The I/O thread fills the windows and answers: the jobs are free again.
        for &k in &k {
            let (addr, off, len) = s.job(k);
            attune_sys::mem::with_words_mut(addr, len, |w| w.fill(off / W as u64 + 1));
        }
        s.answer(&ops, &[0; MAX_JOBS]);
        assert_eq!(std::iter::from_fn(|| s.try_claim()).count(), 8);
        // A load inside the second window is placed from it, at its offset.
        let t = s.ahead.take(3 * W as u64 + 4096, 4096).expect("held");
        assert_eq!(attune_sys::mem::load_u8(t.addr), 4);
        s.ahead.give_back(t, true, 4096);
        // A store over the first window makes it stale: taken, it is dropped.
        s.ahead.overlaps(2 * W as u64 + 8192, 4096);
        assert!(s.ahead.take(2 * W as u64, W).is_none());
        assert!(s.ahead.take(3 * W as u64 + 8192, 4096).is_some());
    }
}
