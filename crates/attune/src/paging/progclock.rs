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
//! readings missed it). One that ends keeps its last reading, and its slot is never given
//! to another thread: a reader may still be raising that reading, and a slot taken over
//! would get it. Between a thread's start and its listing no reading has it: a program of
//! 10 ms tasks read skewed (docs/design/prediction.md, "Threads that come and go").
//! At most [`LIVE`] threads are followed at once (a reading costs a system call for each),
//! and [`SLOTS`] over the run; a program that starts threads past that is timed by the
//! threads it has, whose clock stops when they end (the sampler then parks nothing).
//! A forked child starts its own clock ([`ProgramClock::reset`]): its parent's threads
//! are not its own, and a clock of only those would stand still.
//! Signal-safe reads: atomics and system calls only.

use attune_sys::os;
use std::sync::atomic::{AtomicI32, AtomicU64, AtomicUsize, Ordering::*};

/// Threads the clock follows at once. Random-access throughput under `attune profile`
/// against `attune run` was 0.95-1.03 with 64 threads following 64
/// (docs/design/prediction.md, "A program that waits for a CPU").
pub const LIVE: usize = 64;

/// Threads the clock follows over a run: 96 KiB of slots.
pub const SLOTS: usize = 4096;

pub struct ProgramClock {
    /// 0: the thread ended (or the slot is not used yet).
    tids: [AtomicI32; SLOTS],
    /// The thread's clock when it was added.
    base: [AtomicU64; SLOTS],
    /// Its highest reading since.
    last: [AtomicU64; SLOTS],
    n: AtomicUsize,
}

#[allow(clippy::declare_interior_mutable_const)]
const I0: AtomicI32 = AtomicI32::new(0);
#[allow(clippy::declare_interior_mutable_const)]
const U0: AtomicU64 = AtomicU64::new(0);

impl ProgramClock {
    pub const fn new() -> ProgramClock {
        ProgramClock {
            tids: [I0; SLOTS],
            base: [U0; SLOTS],
            last: [U0; SLOTS],
            n: AtomicUsize::new(0),
        }
    }

    /// Marks the threads that ended and adds the program's threads not yet followed
    /// (sampler thread only; `seen` is its listing of the time before).
    pub fn refresh(&self, seen: &mut Listing) {
        let n = self.n.load(Acquire);
        let mut live = Vec::with_capacity(LIVE);
        for i in 0..n {
            let tid = self.tids[i].load(Relaxed);
            if tid == 0 {
                continue;
            }
            match os::thread_cpu_ns(tid) {
                Some(v) => {
                    self.last[i].fetch_max(v, Relaxed);
                    live.push(tid);
                }
                None => self.tids[i].store(0, Relaxed),
            }
        }
        let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
            return;
        };
        let first = !seen.listed;
        let before = std::mem::take(&mut seen.tids);
        seen.listed = true;
        let mut n = n;
        for t in dir.flatten() {
            let Some(tid) = t.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
                continue;
            };
            seen.tids.push(tid);
            if live.len() >= LIVE || n >= SLOTS || live.contains(&tid) {
                continue;
            }
            let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
            if comm.starts_with("attune-") {
                continue;
            }
            let Some(v) = os::thread_cpu_ns(tid) else {
                continue;
            };
            // Born since the last listing: all it ran is the profile's.
            let base = if first || before.contains(&tid) { v } else { 0 };
            self.tids[n].store(tid, Relaxed);
            self.base[n].store(base, Relaxed);
            self.last[n].store(v, Relaxed);
            n += 1;
            self.n.store(n, Release);
            live.push(tid);
        }
    }

    /// Whether a thread is followed now (a clock that runs).
    pub fn running(&self) -> bool {
        let n = self.n.load(Acquire);
        self.tids[..n].iter().any(|t| t.load(Relaxed) != 0)
    }

    /// The program's run time so far, in ns (0 before any thread is followed).
    pub fn now(&self) -> u64 {
        let n = self.n.load(Acquire);
        let mut sum = 0u64;
        for i in 0..n {
            let last = &self.last[i];
            let tid = self.tids[i].load(Relaxed);
            // An ended thread keeps its last reading and is not asked again.
            let v = match (tid != 0).then(|| os::thread_cpu_ns(tid)).flatten() {
                Some(v) => last.fetch_max(v, Relaxed).max(v),
                None => {
                    if tid != 0 {
                        self.tids[i].store(0, Relaxed);
                    }
                    last.load(Relaxed)
                }
            };
            sum += v.saturating_sub(self.base[i].load(Relaxed));
        }
        sum
    }

    /// Forgets every thread: a forked child's clock is its own (its threads are new; its
    /// parent's cannot be read from it). The child's only thread calls it, before its
    /// sampler starts.
    pub fn reset(&self) {
        self.n.store(0, Release);
    }
}

/// The sampler's view of the process's threads between listings.
#[derive(Default)]
pub struct Listing {
    listed: bool,
    tids: Vec<i32>,
    count: Option<u64>,
}

impl Listing {
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

/// The clock of this process's samples.
pub static CLOCK: ProgramClock = ProgramClock::new();

/// The time samples are timed by: the program's clock under `attune profile`
/// (`sample_rate` set), wall time for the online prediction alone, which pays no
/// system call per thread for it and whose cross-check on even and odd chunks kept a
/// uniform region whole beside two busy loops (3 of 3, `tests/c/predict_online.c`).
pub fn sample_now(e: &super::pager::Pager) -> u64 {
    if e.cfg.sample_rate > 0 {
        CLOCK.now()
    } else {
        os::now_ns()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spinning_thread_advances_the_clock_and_a_sleeping_one_does_not() {
        let c = ProgramClock::new();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let s2 = stop.clone();
        let spinner = std::thread::spawn(move || {
            while !s2.load(Relaxed) {
                std::hint::spin_loop();
            }
        });
        c.refresh(&mut Listing::default());
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
        assert!(c.n.load(Relaxed) <= SLOTS);
    }

    #[test]
    fn a_reset_clock_follows_nothing_until_it_finds_threads_again() {
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
