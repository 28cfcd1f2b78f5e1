//! What the program's threads ran and waited on a run queue (each thread's
//! /proc/.../schedstat; Attune's own `attune-*` threads left out), for `attune profile`'s
//! "the program waited for a CPU". Read at each report from /proc/self/task, and by each
//! thread that the interposer follows as it ends (the program clock's hooks:
//! [`at_thread_end`]), so a thread that lived between two reports counts. Before
//! (2026-12-07) it did not: a program of 5 ms tasks was reported to have run 0.14 s of
//! its 8 s, its main thread and the few tasks a report happened to see
//! (`tests/python/test_profile.py::test_tasks_of_a_few_milliseconds_are_timed_from_start_to_end`).
//! Threads started otherwise (`clone`) and ended between two reports are still missed.

use std::sync::{Mutex, TryLockError};

/// Run and wait times of the program's threads, in ns.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Times {
    pub ran_ns: u64,
    pub waited_ns: u64,
    /// Threads counted.
    pub threads: u64,
}

#[derive(Default)]
struct Seen {
    /// Per thread listed or ended lately: (tid, ns ran, ns waited) at its last reading.
    live: Vec<(i32, u64, u64)>,
    /// Threads gone from the listing since, summed.
    gone: Times,
}

impl Seen {
    fn note(&mut self, tid: i32, ran: u64, waited: u64) {
        match self.live.iter_mut().find(|s| s.0 == tid) {
            Some(s) => (s.1, s.2) = (ran.max(s.1), waited.max(s.2)),
            None => self.live.push((tid, ran, waited)),
        }
    }

    /// Threads not in `listed` are gone (a thread's own last reading, `at_thread_end`,
    /// comes before it leaves the listing): their last readings move to the sum, so the
    /// list holds live threads only and a tid the kernel gives again is a new thread.
    fn fold(&mut self, listed: &[i32]) {
        let gone = &mut self.gone;
        self.live.retain(|s| {
            let here = listed.contains(&s.0);
            if !here {
                gone.ran_ns += s.1;
                gone.waited_ns += s.2;
                gone.threads += 1;
            }
            here
        });
    }

    fn sum(&self) -> Times {
        let mut t = self.gone;
        for s in &self.live {
            t.ran_ns += s.1;
            t.waited_ns += s.2;
            t.threads += 1;
        }
        t
    }
}

static SEEN: Mutex<Seen> = Mutex::new(Seen {
    live: Vec::new(),
    gone: Times {
        ran_ns: 0,
        waited_ns: 0,
        threads: 0,
    },
});

/// (ns ran, ns waited) from a schedstat file's text.
fn parse(stat: &str) -> Option<(u64, u64)> {
    let mut f = stat.split_whitespace().map(|x| x.parse::<u64>().ok());
    Some((f.next()??, f.next()??))
}

/// Reads every thread of the process now and returns the sum so far; None if another
/// thread holds the list (never waits: a fork while another thread held it leaves the
/// child's copy locked for good, and its reports then say nothing).
pub fn snapshot() -> Option<Times> {
    // Read before the list is locked: a thread that ends meanwhile waits for the lock
    // only while the readings are noted, not while /proc is read (about 10 µs a thread).
    // Its own last reading then wins (`Seen::note` keeps the larger figures).
    let mut listed = Vec::new();
    let mut read = Vec::new();
    for t in std::fs::read_dir("/proc/self/task")
        .into_iter()
        .flatten()
        .flatten()
    {
        let Some(tid) = t.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        listed.push(tid);
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if comm.starts_with("attune-") {
            continue;
        }
        let stat = std::fs::read_to_string(t.path().join("schedstat")).unwrap_or_default();
        if let Some((ran, waited)) = parse(&stat) {
            read.push((tid, ran, waited));
        }
    }
    let mut seen = match SEEN.try_lock() {
        Ok(s) => s,
        Err(TryLockError::Poisoned(p)) => p.into_inner(),
        Err(TryLockError::WouldBlock) => return None,
    };
    for (tid, ran, waited) in read {
        seen.note(tid, ran, waited);
    }
    seen.fold(&listed);
    Some(seen.sum())
}

/// The calling thread's last reading, as it ends. Waits for a report that holds the list
/// (it holds it only to note what it read) up to about 10 ms, then gives up (the thread's
/// time then counts as of the last report): in a forked child whose parent's report held
/// the list at the fork, it stays held.
pub fn at_thread_end() {
    let Some((ran, waited)) = std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| parse(&s))
    else {
        return;
    };
    let tid = attune_sys::os::gettid();
    for i in 0..200 {
        match SEEN.try_lock() {
            Ok(mut s) => return s.note(tid, ran, waited),
            Err(TryLockError::Poisoned(p)) => return p.into_inner().note(tid, ran, waited),
            Err(TryLockError::WouldBlock) if i < 100 => attune_sys::os::yield_now(),
            Err(TryLockError::WouldBlock) => attune_sys::os::sleep_us(100),
        }
    }
}

/// Forgets every thread: a forked child's threads are its own.
pub fn forget() {
    if let Ok(mut s) = SEEN.try_lock() {
        *s = Seen::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_schedstat_line_gives_its_first_two_fields() {
        assert_eq!(parse("123 456 7\n"), Some((123, 456)));
        assert_eq!(parse("123"), None);
        assert_eq!(parse("x 1 2"), None);
    }

    fn times(ran_ns: u64, waited_ns: u64, threads: u64) -> Times {
        Times {
            ran_ns,
            waited_ns,
            threads,
        }
    }

    #[test]
    fn readings_rise_per_thread_and_a_thread_gone_from_the_listing_is_summed_once() {
        let mut s = Seen::default();
        s.note(1, 10, 1);
        s.note(2, 20, 2);
        // A later reading replaces; a lower one (read before, noted after) does not.
        s.note(1, 15, 3);
        s.note(1, 12, 1);
        assert_eq!(s.sum(), times(35, 5, 2));
        s.fold(&[2]);
        assert_eq!((s.live.len(), s.gone.threads), (1, 1));
        assert_eq!(s.sum(), times(35, 5, 2));
        // Its tid given again: a new thread.
        s.note(1, 4, 0);
        assert_eq!(s.sum(), times(39, 5, 3));
    }

    #[test]
    fn a_thread_that_ended_between_two_snapshots_counts_by_its_own_last_reading() {
        // The only test that reads the process-wide list.
        let tid = std::thread::spawn(|| {
            let end = attune_sys::os::now_ns() + 30_000_000;
            while attune_sys::os::now_ns() < end {
                std::hint::spin_loop();
            }
            at_thread_end();
            attune_sys::os::gettid()
        })
        .join()
        .unwrap();
        let ran = |s: &Seen| s.live.iter().find(|t| t.0 == tid).map(|t| t.1);
        let mine = ran(&SEEN.lock().unwrap()).expect("its reading at its end");
        assert!(mine >= 25_000_000, "ran {mine} ns");
        let before = SEEN.lock().unwrap().gone;
        snapshot().unwrap();
        let s = SEEN.lock().unwrap();
        assert_eq!(ran(&s), None, "gone from the listing");
        assert!(s.gone.ran_ns - before.ran_ns >= mine);
    }
}
