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
//! Threads are found by the sampler in /proc/self/task; one that appears counts from its
//! first reading (what it ran before is not counted: a jump would lengthen every pending
//! sample). One that ends keeps its last reading. Only the first [`SLOTS`] threads count,
//! ended ones included.
//! Signal-safe reads: atomics and system calls only.

use attune_sys::os;
use std::sync::atomic::{AtomicI32, AtomicU64, AtomicUsize, Ordering::*};

/// Threads the clock follows.
pub const SLOTS: usize = 64;

pub struct ProgramClock {
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

    /// Adds the program's threads not yet followed (sampler thread only).
    pub fn refresh(&self) {
        let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
            return;
        };
        for t in dir.flatten() {
            let Some(tid) = t.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
                continue;
            };
            let n = self.n.load(Acquire);
            if n >= SLOTS {
                return;
            }
            if self.tids[..n].iter().any(|x| x.load(Relaxed) == tid) {
                continue;
            }
            let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
            if comm.starts_with("attune-") {
                continue;
            }
            let Some(v) = os::thread_cpu_ns(tid) else {
                continue;
            };
            self.tids[n].store(tid, Relaxed);
            self.base[n].store(v, Relaxed);
            self.last[n].store(v, Relaxed);
            self.n.store(n + 1, Release);
        }
    }

    /// How many threads are followed.
    pub fn followed(&self) -> usize {
        self.n.load(Acquire)
    }

    /// The program's run time so far, in ns (0 before any thread is followed).
    pub fn now(&self) -> u64 {
        let n = self.n.load(Acquire);
        let mut sum = 0u64;
        for i in 0..n {
            let last = &self.last[i];
            let tid = self.tids[i].load(Relaxed);
            // An ended thread keeps its last reading and is not asked again (its id
            // may be reused by a new thread, which `refresh` adds as one of its own).
            let v = match (tid != 0).then(|| os::thread_cpu_ns(tid)).flatten() {
                Some(v) => last.fetch_max(v, Relaxed).max(v),
                None => {
                    self.tids[i].store(0, Relaxed);
                    last.load(Relaxed)
                }
            };
            sum += v.saturating_sub(self.base[i].load(Relaxed));
        }
        sum
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
        c.refresh();
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
}
