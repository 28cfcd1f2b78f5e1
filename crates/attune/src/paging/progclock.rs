//! The program's clock for access samples: the CPU time its threads have run, Attune's own
//! threads left out. A touch rate per second of the program's running is the same whether
//! it ran alone or in slices beside other load; per second of wall time it is not, and a
//! uniform program that waited for a CPU read skewed (docs/design/prediction.md, "A
//! program that waits for a CPU").
//!
//! Each thread's own clock is exact when read (`os::thread_cpu_ns`); a process clock read
//! from another thread moves in scheduler ticks (4 ms here), too coarse for touches tens
//! of µs apart. Reading costs one system call per thread, so it is read only at a park, at
//! the arrival of a touch on a parked chunk, and by the sampler once a loop.
//!
//! Threads are found by the sampler in /proc/self/task, listed again whenever the
//! process's thread count changed (checked each millisecond) and every 10 ms. One present
//! at the first listing counts from its first reading (what it ran before the profile is
//! not the profile's); one born since counts from its start, so the time it ran before it
//! was found is added when it is (a late correction, at most a listing period: until then
//! readings missed it). Threads started by `pthread_create` under the interposer do not
//! wait for a listing: they claim a slot as they begin and are read as they end
//! ([`ProgramClock::begin_thread`], [`ProgramClock::end_thread`], installed through
//! `attune_sys::threads`); without that a program of 10 ms tasks read skewed, the clock
//! standing still between a start and its listing (docs/design/prediction.md, "Threads
//! followed from start to end").
//!
//! At most [`LIVE`] threads are followed at once (a reading costs a system call for each);
//! past that, a thread not followed that ran takes the slot of a followed one that barely
//! did ([`ProgramClock::refresh`]). A thread that ends keeps what it was last read at: the sampler, at its next listing,
//! moves that into `retired` and gives its slot to a thread not followed yet, so a program
//! that starts threads for ever is timed for ever (before 2026-12-07 a slot was never
//! given again, and after 4096 threads the clock stood still and the sampler parked
//! nothing). Two rules make the hand-over safe for readers, which run in fault handlers
//! and never wait:
//! - a slot's reading carries the slot's generation in its top bits, and a reader raises
//!   it only by a compare-and-swap on the generation it loaded: a reader that read the
//!   old thread's clock, stalled, and came back after the hand-over cannot raise the new
//!   thread's reading with it;
//! - the sampler changes slots and `retired` only with `epoch` odd, and a reader whose
//!   sum saw the epoch move (or odd) gives the last reading instead (`high`), so no sum
//!   counts a thread both in its slot and in `retired`, or in neither. The clock never
//!   goes back (`high`).
//!
//! A forked child starts its own clock ([`ProgramClock::reset`]): its parent's threads
//! are not its own, and a clock of only those would stand still.
//! Signal-safe reads: atomics and system calls only.

use crate::sync::shim::{fence, AtomicI32, AtomicU64, AtomicUsize, Ordering::*};
use attune_sys::os;

/// Threads the clock follows at once. Random-access throughput under `attune profile`
/// against `attune run` was 0.95-1.03 with 64 threads following 64
/// (docs/design/prediction.md, "A program that waits for a CPU").
#[cfg(not(loom))]
pub const LIVE: usize = 64;
/// Three slots in the model (crates/attune/tests/loom.rs): enough for two claims of one
/// thread and a third thread, and small enough for every interleaving.
#[cfg(loom)]
pub const LIVE: usize = 3;

/// What a thread not followed must have run since the last listing (10 ms at most) to
/// take a followed thread's slot: a tenth of that period, so threads that wake now and then
/// do not trade slots.
const SWAP_NS: u64 = 1_000_000;

/// A slot's reading: the thread's clock in ns in the low bits (2^52 ns, 52 days of one
/// thread's CPU time), the slot's generation above.
const NS_BITS: u32 = 52;
const NS: u64 = (1 << NS_BITS) - 1;

pub struct ProgramClock {
    /// 0: no thread in the slot.
    tids: [AtomicI32; LIVE],
    /// The thread's clock when it was added.
    base: [AtomicU64; LIVE],
    /// Its highest reading since, under the slot's generation.
    last: [AtomicU64; LIVE],
    /// Slots used so far.
    n: AtomicUsize,
    /// What threads that ended ran while followed.
    retired: AtomicU64,
    /// Odd while the sampler moves threads in or out of slots.
    epoch: AtomicU64,
    /// The highest reading given.
    high: AtomicU64,
}

#[cfg(not(loom))]
#[allow(clippy::declare_interior_mutable_const)]
const I0: AtomicI32 = AtomicI32::new(0);
#[cfg(not(loom))]
#[allow(clippy::declare_interior_mutable_const)]
const U0: AtomicU64 = AtomicU64::new(0);

impl ProgramClock {
    #[cfg(not(loom))]
    pub const fn new() -> ProgramClock {
        ProgramClock {
            tids: [I0; LIVE],
            base: [U0; LIVE],
            last: [U0; LIVE],
            n: AtomicUsize::new(0),
            retired: AtomicU64::new(0),
            epoch: AtomicU64::new(0),
            high: AtomicU64::new(0),
        }
    }

    /// Loom's atomics are not `const`.
    #[cfg(loom)]
    pub fn new() -> ProgramClock {
        ProgramClock {
            tids: std::array::from_fn(|_| AtomicI32::new(0)),
            base: std::array::from_fn(|_| AtomicU64::new(0)),
            last: std::array::from_fn(|_| AtomicU64::new(0)),
            n: AtomicUsize::new(0),
            retired: AtomicU64::new(0),
            epoch: AtomicU64::new(0),
            high: AtomicU64::new(0),
        }
    }

    /// Raises slot `i`'s reading to `v` if it still has generation `gen` (the slot's
    /// reading as its reader loaded it); returns the slot's reading in ns.
    fn raise(&self, i: usize, mut cur: u64, v: u64) -> u64 {
        let gen = cur & !NS;
        loop {
            if cur & !NS != gen || cur & NS >= v {
                return cur & NS;
            }
            match self.last[i].compare_exchange_weak(cur, gen | (v & NS), Relaxed, Relaxed) {
                Ok(_) => return v & NS,
                Err(now) => cur = now,
            }
        }
    }

    /// Marks the threads that ended, hands their slots to threads not followed yet, and
    /// adds the program's threads while slots are free (sampler thread only; `seen` is its
    /// listing of the time before). With every slot taken, the followed thread that ran
    /// least since the last listing gives its slot to one not followed that ran more than
    /// twice as much (and at least [`SWAP_NS`]): a program with more than [`LIVE`] threads
    /// is timed by those that run. A pool of threads that wake now and then, found first,
    /// would otherwise hold a clock that barely moves (`progclock::tests`: 8-11 ms in
    /// 100 ms of two spinning threads).
    pub fn refresh(&self, seen: &mut Listing) {
        let n = self.n.load(Acquire);
        let mut live = Vec::with_capacity(LIVE);
        let mut ended = Vec::new();
        let mut idle = Vec::new();
        let mut readings = Vec::with_capacity(seen.readings.len());
        for i in 0..n {
            let tid = self.tids[i].load(Acquire);
            if tid <= 0 {
                continue;
            }
            match os::thread_cpu_ns(tid) {
                Some(v) => {
                    self.raise(i, self.last[i].load(Relaxed), v);
                    live.push(tid);
                    if let Some(was) = seen.reading(tid) {
                        idle.push((v.saturating_sub(was), i));
                    }
                    readings.push((tid, v));
                }
                None => ended.push(i),
            }
        }
        let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
            if !ended.is_empty() {
                self.change(|| self.retire(&ended));
            }
            return;
        };
        let first = !seen.listed;
        let before = std::mem::take(&mut seen.tids);
        seen.listed = true;
        // Threads not followed are read only while a slot is free or a followed thread ran
        // less than SWAP_NS (a system call each): with every slot running, listing costs no
        // reading.
        let wanted = live.len() < LIVE || idle.iter().any(|&(ran, _)| ran < SWAP_NS);
        // (tid, base, reading, what it ran since the last listing)
        let mut candidates = Vec::new();
        for t in dir.flatten() {
            let Some(tid) = t.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
                continue;
            };
            seen.tids.push(tid);
            if !wanted || live.contains(&tid) || seen.ours.contains(&tid) {
                continue;
            }
            if seen.reading(tid).is_none() {
                let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
                if comm.starts_with("attune-") {
                    seen.ours.push(tid);
                    continue;
                }
            }
            let Some(v) = os::thread_cpu_ns(tid) else {
                continue;
            };
            // Born since the last listing: all it ran is the profile's.
            let born = !first && before.binary_search(&tid).is_err();
            let base = if born { 0 } else { v };
            let ran = match seen.reading(tid) {
                Some(was) => v.saturating_sub(was),
                None if born => v,
                None => 0,
            };
            candidates.push((tid, base, v, ran));
            readings.push((tid, v));
        }
        readings.sort_unstable();
        seen.readings = readings;
        seen.tids.sort_unstable();
        seen.ours.retain(|t| seen.tids.binary_search(t).is_ok());
        // Those that ran most first; each takes a free slot, or the slot of the followed
        // thread that ran least if it ran more than twice as much.
        candidates.sort_by_key(|c| std::cmp::Reverse(c.3));
        idle.sort_unstable_by_key(|&(ran, _)| std::cmp::Reverse(ran));
        let mut free = LIVE - live.len();
        let mut new = Vec::new();
        for (tid, base, v, ran) in candidates {
            if free > 0 {
                free -= 1;
            } else if let Some(&(_, i)) = idle.last().filter(|l| ran >= SWAP_NS.max(2 * l.0)) {
                idle.pop();
                ended.push(i);
            } else {
                break;
            }
            new.push((tid, base, v));
        }
        if ended.is_empty() && new.is_empty() {
            return;
        }
        self.change(|| {
            self.retire(&ended);
            for (tid, base, v) in new {
                // None: every slot taken (by threads that began since the listing), or
                // the thread took one itself.
                self.claim(tid, base, v);
            }
        });
    }

    /// Puts thread `tid` in a free slot, counted from `base`, read at `v`; false if every
    /// slot is taken or another slot has it. The sampler (for threads its listing found)
    /// and a program thread as it begins (`begin_thread`) both claim, without waiting for
    /// each other: a slot is taken by a compare-and-swap to `-tid` (readers skip it),
    /// filled, and then published as `tid`; a claimer that then sees `±tid` in another
    /// slot gives its own back. Of two claims of one thread at once, at least one sees the
    /// other (both swap, then look, all sequentially consistent): a thread is never in
    /// two slots, and if both give way the next listing adds it.
    pub(crate) fn claim(&self, tid: i32, base: u64, v: u64) -> bool {
        for i in 0..LIVE {
            if self.tids[i]
                .compare_exchange(0, -tid, SeqCst, SeqCst)
                .is_err()
            {
                continue;
            }
            let twice = (0..LIVE).any(|j| j != i && self.tids[j].load(SeqCst).abs() == tid);
            if twice {
                self.tids[i].store(0, Release);
                return false;
            }
            // The generation a retired slot got stays; a reader of the one before cannot
            // raise this reading.
            let gen = self.last[i].load(Relaxed) & !NS;
            self.base[i].store(base, Relaxed);
            self.last[i].store(gen | (v & NS), Relaxed);
            self.n.fetch_max(i + 1, SeqCst);
            self.tids[i].store(tid, Release);
            return true;
        }
        false
    }

    /// Called by a program thread first thing (the interposer's `pthread_create`:
    /// `attune_sys::threads`): followed from its start, not from the sampler's next
    /// listing. Born during the profile, so all it runs is the profile's.
    pub fn begin_thread(&self) {
        let tid = os::gettid();
        let v = os::thread_cpu_ns(tid).unwrap_or(0);
        self.claim(tid, 0, v);
    }

    /// Called by a program thread as it ends: its slot keeps what it ran to its end, not
    /// only to its last reading (the sampler's, up to a loop before).
    pub fn end_thread(&self) {
        let tid = os::gettid();
        let Some(v) = os::thread_cpu_ns(tid) else {
            return;
        };
        let n = self.n.load(Acquire);
        for i in 0..n {
            // The reading first: if the slot changed hands after it, its generation did
            // too, and `raise` does nothing.
            let cur = self.last[i].load(Acquire);
            if self.tids[i].load(Acquire) == tid {
                self.raise(i, cur, v);
                return;
            }
        }
    }

    /// Moves the slots' last readings into `retired` and frees them (inside `change`).
    pub(crate) fn retire(&self, slots: &[usize]) {
        for &i in slots {
            // A new generation first: a reader still raising the old one fails.
            let last = self.last[i].fetch_add(1 << NS_BITS, Relaxed) & NS;
            let ran = last.saturating_sub(self.base[i].load(Relaxed));
            self.retired.fetch_add(ran, Relaxed);
            // Release: a claimer that sees the slot free sees its new generation.
            self.tids[i].store(0, Release);
        }
    }

    /// Runs the sampler's change of slots and `retired` with the epoch odd.
    pub(crate) fn change(&self, f: impl FnOnce()) {
        let e = self.epoch.load(Relaxed);
        self.epoch.store(e + 1, Relaxed);
        fence(Release);
        f();
        self.epoch.store(e + 2, Release);
    }

    /// The slots that hold thread `tid`, published or being claimed (the model's check:
    /// crates/attune/tests/loom.rs).
    #[cfg(all(test, loom))]
    pub(crate) fn slots_of(&self, tid: i32) -> usize {
        self.tids
            .iter()
            .filter(|t| t.load(SeqCst).abs() == tid)
            .count()
    }

    /// Whether a thread is followed now (a clock that runs).
    pub fn running(&self) -> bool {
        let n = self.n.load(Acquire);
        self.tids[..n].iter().any(|t| t.load(Relaxed) > 0)
    }

    /// The program's run time so far, in ns (0 before any thread is followed). Never goes
    /// back; stands still while the sampler hands slots over.
    pub fn now(&self) -> u64 {
        let e = self.epoch.load(Acquire);
        if e & 1 == 0 {
            let mut sum = self.retired.load(Relaxed);
            let n = self.n.load(Acquire);
            for i in 0..n {
                let tid = self.tids[i].load(Acquire);
                if tid <= 0 {
                    continue;
                }
                let cur = self.last[i].load(Relaxed);
                // An ended thread keeps its last reading until the sampler retires it.
                let v = match os::thread_cpu_ns(tid) {
                    Some(v) => self.raise(i, cur, v),
                    None => cur & NS,
                };
                sum += v.saturating_sub(self.base[i].load(Relaxed));
            }
            fence(Acquire);
            if self.epoch.load(Relaxed) == e {
                return self.high.fetch_max(sum, Relaxed).max(sum);
            }
        }
        self.high.load(Relaxed)
    }

    /// Forgets every thread: a forked child's clock is its own (its threads are new; its
    /// parent's cannot be read from it). The child's only thread calls it, before its
    /// sampler starts.
    pub fn reset(&self) {
        for t in &self.tids {
            t.store(0, Relaxed);
        }
        self.retired.store(0, Relaxed);
        self.high.store(0, Relaxed);
        // Even: the parent's sampler may have forked mid-change, and no sampler of the
        // child's would end it.
        self.epoch.store(0, Relaxed);
        self.n.store(0, Release);
    }
}

/// The sampler's view of the process's threads between listings.
#[derive(Default)]
pub struct Listing {
    listed: bool,
    tids: Vec<i32>,
    count: Option<u64>,
    /// The program's threads as read at the last listing (followed, and those not
    /// followed where they were read).
    readings: Vec<(i32, u64)>,
    /// Attune's own threads, left out.
    ours: Vec<i32>,
}

impl Listing {
    fn reading(&self, tid: i32) -> Option<u64> {
        let i = self.readings.binary_search_by_key(&tid, |r| r.0).ok()?;
        Some(self.readings[i].1)
    }

    /// Whether the process's thread count moved since the last call (/proc/self/stat:
    /// one read, where listing the threads reads a file per thread).
    pub fn count_moved(&mut self) -> bool {
        let count = std::fs::read_to_string("/proc/self/stat")
            .ok()
            .and_then(|s| {
                let after = &s[s.rfind(')')? + 1..];
                // Fields from the third (state): num_threads is the 20th.
                after.split_whitespace().nth(17)?.parse().ok()
            });
        let moved = count != self.count;
        self.count = count;
        moved
    }
}

impl Default for ProgramClock {
    fn default() -> Self {
        Self::new()
    }
}

/// The clock of this process's samples ([`super::pager::Pager::sample_now`]). Loom's
/// model compiles this crate with its own atomics, which are not `const`.
#[cfg(not(loom))]
pub static CLOCK: ProgramClock = ProgramClock::new();
#[cfg(loom)]
pub static CLOCK: std::sync::LazyLock<ProgramClock> = std::sync::LazyLock::new(ProgramClock::new);

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// The tests that start threads run one at a time: the clock follows LIVE threads of
    /// the whole test process, and one test starts LIVE threads that sleep.
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

    fn serial() -> std::sync::MutexGuard<'static, ()> {
        SERIAL.lock().unwrap_or_else(|p| p.into_inner())
    }

    #[test]
    fn a_spinning_thread_advances_the_clock_and_a_sleeping_one_does_not() {
        let _serial = serial();
        let c = ProgramClock::new();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let s2 = stop.clone();
        let spinner = std::thread::spawn(move || {
            while !s2.load(Relaxed) {
                std::hint::spin_loop();
            }
        });
        // Listed as the sampler lists: other tests' threads (64 that sleep, in one) may
        // take the slots first, and the spinner then takes one of theirs.
        let mut listing = Listing::default();
        for _ in 0..3 {
            c.refresh(&mut listing);
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let t0 = (c.now(), os::now_ns());
        std::thread::sleep(std::time::Duration::from_millis(100));
        let t1 = (c.now(), os::now_ns());
        stop.store(true, Relaxed);
        spinner.join().unwrap();
        let (ran, wall) = (t1.0 - t0.0, t1.1 - t0.1);
        // The spinner ran most of the 100 ms (the test thread slept; other tests' threads
        // may add theirs).
        assert!(ran > wall / 4, "ran {ran} of {wall}");
        // Ended: its last reading stays, the clock does not go back.
        let after = c.now();
        assert!(after >= t1.0);
    }

    #[test]
    fn threads_that_come_and_go_past_the_live_count_are_followed() {
        let _serial = serial();
        // A thread per task, one at a time: 3 * LIVE of them, each found while it spins.
        let c = ProgramClock::new();
        let spin = |ms: u64| {
            std::thread::spawn(move || {
                let end = os::now_ns() + ms * 1_000_000;
                while os::now_ns() < end {
                    std::hint::spin_loop();
                }
            })
        };
        let mut before = c.now();
        let mut grew = 0;
        for _ in 0..3 * LIVE {
            let t = spin(3);
            c.refresh(&mut Listing::default());
            std::thread::sleep(std::time::Duration::from_millis(1));
            let now = c.now();
            assert!(now >= before, "the clock went back: {now} < {before}");
            grew += (now > before) as usize;
            before = now;
            t.join().unwrap();
            // Ended: what it was last read at stays.
            assert!(c.now() >= before);
        }
        // Each task's thread spun while the clock was read; had the ended ones kept their
        // slots from new threads, the last two thirds would have added nothing.
        assert!(
            grew > 2 * LIVE,
            "the clock moved for {grew} of {} tasks",
            3 * LIVE
        );
        assert!(c.n.load(Relaxed) <= LIVE);
    }

    #[test]
    fn threads_that_run_take_the_slots_of_idle_ones_past_the_live_count() {
        let _serial = serial();
        // LIVE threads that sleep are found first and take every slot; then two spin.
        let c = ProgramClock::new();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let sleepers: Vec<_> = (0..LIVE)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    while !stop.load(Relaxed) {
                        std::thread::sleep(std::time::Duration::from_millis(5));
                    }
                })
            })
            .collect();
        let mut listing = Listing::default();
        c.refresh(&mut listing);
        assert_eq!(c.n.load(Relaxed), LIVE);
        let spinners: Vec<_> = (0..2)
            .map(|_| {
                std::thread::spawn(|| {
                    let end = os::now_ns() + 300_000_000;
                    while os::now_ns() < end {
                        std::hint::spin_loop();
                    }
                    os::thread_cpu_ns(os::gettid()).unwrap_or(0)
                })
            })
            .collect();
        // Listed as the sampler lists: the spinners, born since, get slots of threads that
        // did not run.
        for _ in 0..4 {
            std::thread::sleep(std::time::Duration::from_millis(10));
            c.refresh(&mut listing);
        }
        let t0 = c.now();
        std::thread::sleep(std::time::Duration::from_millis(100));
        let ran = c.now() - t0;
        let spun: u64 = spinners.into_iter().map(|t| t.join().unwrap()).sum();
        stop.store(true, Relaxed);
        for t in sleepers {
            t.join().unwrap();
        }
        // The spinners ran up to 200 ms of CPU in those 100 ms (two CPUs), less what other
        // tests took; the sleepers' slots alone would have read almost nothing.
        assert!(
            ran > 30_000_000,
            "the clock moved {ran} ns in 100 ms; the spinners ran {spun} ns in 300 ms"
        );
        assert!(c.n.load(Relaxed) <= LIVE);
    }

    #[test]
    fn readers_during_hand_overs_count_each_thread_once_and_never_go_back() {
        let _serial = serial();
        // Tasks of 10 ms, two at a time, 2 * LIVE of them, found and retired by a sampler
        // with its own listing while two readers read the clock without pause. The clock
        // then holds at most what the process ran (a thread counted twice, in its slot and
        // as retired, would pass it by 10 ms each), and most of what the tasks ran.
        let c: &'static ProgramClock = Box::leak(Box::new(ProgramClock::new()));
        let process = os::process_cpu_ns;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let readers: Vec<_> = (0..2)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let (mut last, mut reads) = (0u64, 0u64);
                    while !stop.load(Relaxed) {
                        let now = c.now();
                        assert!(now >= last, "the clock went back: {now} < {last}");
                        last = now;
                        reads += 1;
                        std::thread::sleep(std::time::Duration::from_micros(200));
                    }
                    reads
                })
            })
            .collect();
        let task = || {
            std::thread::spawn(|| {
                let end = os::now_ns() + 10_000_000;
                while os::now_ns() < end {
                    std::hint::spin_loop();
                }
                os::thread_cpu_ns(os::gettid()).unwrap_or(0)
            })
        };
        let mut listing = Listing::default();
        c.refresh(&mut listing);
        let (cpu0, clock0) = (process(), c.now());
        let mut tasks_ran = 0;
        for _ in 0..LIVE {
            let pair = [task(), task()];
            c.refresh(&mut listing);
            for t in pair {
                tasks_ran += t.join().unwrap();
            }
        }
        c.refresh(&mut listing);
        stop.store(true, Relaxed);
        for r in readers {
            assert!(r.join().unwrap() > 0);
        }
        let (ran, clock) = (process() - cpu0, c.now() - clock0);
        // The process clock sums the other threads' times as of their last tick (4 ms).
        assert!(
            clock <= ran + 40_000_000,
            "the clock read {clock} ns where the process ran {ran}"
        );
        assert!(
            clock >= tasks_ran / 2,
            "the clock read {clock} ns where the tasks ran {tasks_ran}"
        );
        assert!(c.n.load(Relaxed) <= LIVE);
    }

    #[test]
    fn threads_that_claim_their_slot_as_the_sampler_lists_are_each_in_one_and_timed_whole() {
        let _serial = serial();
        // Tasks of 5 ms, two at a time, 2 * LIVE of them, each claiming its slot as it
        // begins and reading its clock as it ends (the interposer's hooks), while a sampler
        // lists every 2 ms and checks that no thread is in two slots. The clock then
        // holds nearly all the tasks ran (what the sampler's listing alone missed: from a
        // start to the next listing, from a last reading to the end: 0.81-0.83 of it with
        // the hooks left out) and no more than the process did.
        let c: &'static ProgramClock = Box::leak(Box::new(ProgramClock::new()));
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let sampler = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut listing = Listing::default();
                let mut lists = 0;
                while !stop.load(Relaxed) {
                    c.refresh(&mut listing);
                    let mut held: Vec<i32> = c
                        .tids
                        .iter()
                        .map(|t| t.load(SeqCst))
                        .filter(|&t| t > 0)
                        .collect();
                    held.sort_unstable();
                    let n = held.len();
                    held.dedup();
                    assert_eq!(held.len(), n, "a thread in two slots");
                    lists += 1;
                    // Every 2 ms, as the sampler's loop (1 ms, and its parks) does.
                    std::thread::sleep(std::time::Duration::from_millis(2));
                }
                lists
            })
        };
        let task = || {
            std::thread::spawn(|| {
                c.begin_thread();
                let end = os::now_ns() + 5_000_000;
                while os::now_ns() < end {
                    std::hint::spin_loop();
                }
                c.end_thread();
                os::thread_cpu_ns(os::gettid()).unwrap_or(0)
            })
        };
        let (cpu0, clock0) = (os::process_cpu_ns(), c.now());
        let mut tasks_ran = 0;
        for _ in 0..LIVE {
            let pair = [task(), task()];
            for t in pair {
                tasks_ran += t.join().unwrap();
            }
        }
        stop.store(true, Relaxed);
        assert!(sampler.join().unwrap() > 0);
        let (ran, clock) = (os::process_cpu_ns() - cpu0, c.now() - clock0);
        assert!(
            clock <= ran + 40_000_000,
            "the clock read {clock} ns where the process ran {ran}"
        );
        // The sampler's own thread may be followed too (it is not named `attune-`).
        assert!(
            clock >= tasks_ran * 9 / 10,
            "the clock read {clock} ns where the tasks ran {tasks_ran}"
        );
    }

    #[test]
    fn a_thread_claims_one_slot_however_many_times_it_is_claimed() {
        let c = ProgramClock::new();
        assert!(c.claim(100, 0, 10));
        assert!(!c.claim(100, 0, 20), "claimed twice");
        // A claim in progress (the slot taken, not yet published) counts as the thread's.
        c.tids[5].store(-200, Relaxed);
        assert!(!c.claim(200, 0, 30));
        assert!(c.claim(300, 0, 40));
        let held: Vec<i32> = c
            .tids
            .iter()
            .map(|t| t.load(Relaxed))
            .filter(|&t| t != 0)
            .collect();
        assert_eq!(held, vec![100, 300, -200]);
        assert_eq!(c.n.load(Relaxed), 2);
        // Full: no slot, no claim.
        for (i, t) in c.tids.iter().enumerate() {
            if t.load(Relaxed) == 0 {
                t.store(1000 + i as i32, Relaxed);
            }
        }
        assert!(!c.claim(400, 0, 50));
    }

    #[test]
    fn a_reading_from_a_slot_handed_over_is_not_raised_into_the_new_thread() {
        // A reader loaded slot 0's reading of the thread before, then the slot changed
        // hands (a new generation): its raise fails and leaves the new reading.
        let c = ProgramClock::new();
        c.last[0].store(5_000, Relaxed);
        let old = c.last[0].load(Relaxed);
        c.retire(&[0]);
        assert_eq!(c.retired.load(Relaxed), 5_000);
        let gen = c.last[0].load(Relaxed) & !NS;
        assert_ne!(gen, old & !NS);
        c.last[0].store(gen | 100, Relaxed);
        // (What it returns is the slot's reading; its sum saw the epoch move and is not
        // given.)
        assert_eq!(c.raise(0, old, 9_000), 100);
        assert_eq!(c.last[0].load(Relaxed), gen | 100);
        // Its own generation's reader raises it.
        let cur = c.last[0].load(Relaxed);
        assert_eq!(c.raise(0, cur, 9_000), 9_000);
        assert_eq!(c.last[0].load(Relaxed), gen | 9_000);
        // Lower readings leave it.
        assert_eq!(c.raise(0, c.last[0].load(Relaxed), 50), 9_000);
    }

    #[test]
    fn a_sum_that_saw_a_hand_over_gives_the_last_reading() {
        let c = ProgramClock::new();
        c.high.store(777, Relaxed);
        c.epoch.store(1, Relaxed);
        assert_eq!(c.now(), 777);
        c.epoch.store(2, Relaxed);
        c.retired.store(1_000, Relaxed);
        assert_eq!(c.now(), 1_000);
        // Lower sums do not take it back.
        c.retired.store(10, Relaxed);
        assert_eq!(c.now(), 1_000);
        c.reset();
        assert_eq!(c.now(), 0);
    }

    #[test]
    fn a_reset_clock_follows_nothing_until_it_finds_threads_again() {
        let _serial = serial();
        let c = ProgramClock::new();
        c.refresh(&mut Listing::default());
        assert!(c.running());
        c.reset();
        assert!(!c.running());
        assert_eq!(c.now(), 0);
        c.refresh(&mut Listing::default());
        assert!(c.running());
    }
}
