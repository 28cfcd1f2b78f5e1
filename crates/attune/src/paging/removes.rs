//! Discards the kernel reported (`UFFD_EVENT_REMOVE`) and that are not acted on yet.
//!
//! A program's own `madvise(MADV_DONTNEED)` (made without libc, which the interposer does
//! not see: Go's scavenger) is reported on the region's userfaultfd; the program goes on
//! as soon as the report is read, and the kernel then drops the mapped pages. A chunk in
//! a far tier is not mapped, so the handler thread acts on each report
//! (`Pager::removed`). Between the read and that act, a fault's placement (or the act's
//! own fetch of a chunk the report covers part of) would load such a chunk's old content,
//! after the kernel's drop, where the program may read it at once: [`Removes`] lets the
//! placement see the reports read but not acted on, and zero what they cover before it
//! maps the run (`super::fault::fetch_run`). What reports read while the placement ran
//! cover is dropped after it.
//!
//! Each report read gets the next sequence number (`read`); the handler acts on them in
//! that order and advances `done`. Signal-safe for the placements' side (atomics only).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::*};

/// Reports the ring holds: read and not acted on. A reader that finds it full reads no
/// more until the handler catches up (`waiting`).
pub const RING: usize = 256;

pub struct Removes {
    /// Reports read so far (the last one's sequence number).
    read: AtomicU64,
    /// Reports acted on (every one up to this number).
    done: AtomicU64,
    /// A read is under way: its reports may not be in the ring yet.
    reading: AtomicBool,
    start: Box<[AtomicUsize]>,
    end: Box<[AtomicUsize]>,
}

impl Default for Removes {
    fn default() -> Removes {
        Removes {
            read: AtomicU64::new(0),
            done: AtomicU64::new(0),
            reading: AtomicBool::new(false),
            start: (0..RING).map(|_| AtomicUsize::new(0)).collect(),
            end: (0..RING).map(|_| AtomicUsize::new(0)).collect(),
        }
    }
}

impl Removes {
    /// Before a read of a userfaultfd that may carry reports: from here until
    /// [`Removes::end_read`], placements wait for the ring ([`Removes::settled`]).
    pub fn begin_read(&self) {
        self.reading.store(true, SeqCst);
    }

    pub fn end_read(&self) {
        self.reading.store(false, Release);
    }

    /// Reports read and not acted on yet (a reader reads at most [`RING`] less this).
    pub fn waiting(&self) -> usize {
        (self.read.load(Acquire) - self.done.load(Acquire)) as usize
    }

    /// Records a report read (between `begin_read` and `end_read`, one reader at a time);
    /// returns its sequence number.
    pub fn record(&self, start: usize, end: usize) -> u64 {
        let n = self.read.load(Relaxed) + 1;
        let i = (n % RING as u64) as usize;
        self.start[i].store(start, Relaxed);
        self.end[i].store(end, Relaxed);
        self.read.store(n, Release);
        n
    }

    /// Forgets every report (a forked child: they were its parent's).
    pub fn clear(&self) {
        self.done.store(self.read.load(Acquire), Release);
        self.reading.store(false, Release);
    }

    /// The handler acted on report `n` (and every one before it).
    pub fn acted(&self, n: u64) {
        self.done.fetch_max(n, Release);
    }

    /// Waits while a read is under way; then whether a report is waiting to be acted on.
    /// Signal-safe.
    pub fn settled(&self) -> bool {
        let mut spins = 0u32;
        while self.reading.load(Acquire) {
            crate::sync::gate::backoff(&mut spins);
        }
        self.read.load(Acquire) != self.done.load(Acquire)
    }

    /// The last report's sequence number (after [`Removes::settled`]: every report up to
    /// it is in the ring).
    pub fn last_read(&self) -> u64 {
        self.read.load(Acquire)
    }

    /// Whether a report numbered up to `upto`, read and not acted on, covers part of
    /// `[a, b)` (after [`Removes::settled`]). Signal-safe.
    pub fn covers(&self, upto: u64, a: usize, b: usize) -> bool {
        let mut covered = false;
        self.overlapping_in(0, upto, a, b, |_, _| covered = true);
        covered
    }

    /// Calls `f(lo, hi)` for the part of `[a, b)` each report read and not acted on
    /// covers (after [`Removes::settled`]), of the reports numbered `(after, upto]`.
    /// Signal-safe.
    pub fn overlapping_in(
        &self,
        after: u64,
        upto: u64,
        a: usize,
        b: usize,
        mut f: impl FnMut(usize, usize),
    ) {
        let read = self.read.load(Acquire).min(upto);
        let done = self.done.load(Acquire).max(after);
        for n in done + 1..=read {
            let i = (n % RING as u64) as usize;
            let (s, t) = (self.start[i].load(Relaxed), self.end[i].load(Relaxed));
            let (lo, hi) = (s.max(a), t.min(b));
            if lo < hi {
                f(lo, hi);
            }
        }
    }
}

/// Messages the handler thread read and has not acted on, in order: its faults, and its
/// reports with their sequence numbers. One thread pushes and pops (the handler; `pump`
/// runs on it too), so plain atomics in a ring suffice: no lock a fork could copy held,
/// and no thread-local, whose destructor's registration takes the loader's lock.
pub struct Queue {
    head: AtomicUsize,
    tail: AtomicUsize,
    slots: Box<[[AtomicU64; 5]]>,
}

/// Messages the queue holds.
pub const QUEUE: usize = 1024;

impl Default for Queue {
    fn default() -> Queue {
        Queue {
            head: AtomicUsize::new(0),
            tail: AtomicUsize::new(0),
            slots: (0..QUEUE)
                .map(|_| std::array::from_fn(|_| AtomicU64::new(0)))
                .collect(),
        }
    }
}

impl Queue {
    /// Room for this many more messages.
    pub fn room(&self) -> usize {
        QUEUE - (self.tail.load(Relaxed) - self.head.load(Relaxed))
    }

    /// Appends a message (`event`, its three arguments, a report's number); false when full.
    pub fn push(&self, event: u8, arg: [u64; 3], seq: u64) -> bool {
        let t = self.tail.load(Relaxed);
        if t - self.head.load(Relaxed) >= QUEUE {
            return false;
        }
        let s = &self.slots[t % QUEUE];
        for (w, v) in s.iter().zip([event as u64, arg[0], arg[1], arg[2], seq]) {
            w.store(v, Relaxed);
        }
        self.tail.store(t + 1, Release);
        true
    }

    /// The oldest message: (event, arguments, report number).
    pub fn pop(&self) -> Option<(u8, [u64; 3], u64)> {
        let h = self.head.load(Relaxed);
        if h == self.tail.load(Acquire) {
            return None;
        }
        let s = &self.slots[h % QUEUE];
        let v: [u64; 5] = std::array::from_fn(|i| s[i].load(Relaxed));
        self.head.store(h + 1, Release);
        Some((v[0] as u8, [v[1], v[2], v[3]], v[4]))
    }

    /// Empties it (a forked child: the messages were its parent's).
    pub fn clear(&self) {
        self.head.store(self.tail.load(Acquire), Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_placement_sees_the_reports_not_acted_on_that_cover_it() {
        let r = Removes::default();
        assert!(!r.settled());
        let a = r.record(0x10000, 0x20000);
        let b = r.record(0x30000, 0x31000);
        assert!(r.settled());
        let mut seen = Vec::new();
        r.overlapping_in(0, u64::MAX, 0x18000, 0x38000, |lo, hi| seen.push((lo, hi)));
        assert_eq!(seen, [(0x18000, 0x20000), (0x30000, 0x31000)]);
        r.acted(a);
        seen.clear();
        r.overlapping_in(0, u64::MAX, 0, usize::MAX, |lo, hi| seen.push((lo, hi)));
        assert_eq!(seen, [(0x30000, 0x31000)]);
        r.acted(b);
        assert!(!r.settled());
        seen.clear();
        r.overlapping_in(0, u64::MAX, 0, usize::MAX, |lo, hi| seen.push((lo, hi)));
        assert!(seen.is_empty());
    }

    #[test]
    fn a_placement_splits_the_reports_it_saw_before_from_those_read_after() {
        let r = Removes::default();
        let a = r.record(0x10000, 0x11000);
        assert!(r.settled());
        let upto = r.last_read();
        let b = r.record(0x12000, 0x13000);
        let mut before = Vec::new();
        r.overlapping_in(0, upto, 0, usize::MAX, |lo, hi| before.push((lo, hi)));
        assert_eq!(before, [(0x10000, 0x11000)]);
        // The range the first covers, not the one only the later report does.
        assert!(r.covers(upto, 0x10800, 0x20000));
        assert!(!r.covers(upto, 0x11000, 0x20000));
        assert!(r.covers(u64::MAX, 0x11000, 0x20000));
        let mut after = Vec::new();
        r.overlapping_in(upto, u64::MAX, 0, usize::MAX, |lo, hi| after.push((lo, hi)));
        assert_eq!(after, [(0x12000, 0x13000)]);
        // Acted on: neither half sees them any more.
        r.acted(b.max(a));
        after.clear();
        r.overlapping_in(0, u64::MAX, 0, usize::MAX, |lo, hi| after.push((lo, hi)));
        assert!(after.is_empty());
    }

    #[test]
    fn the_queue_gives_messages_back_in_order_and_refuses_when_full() {
        let q = Queue::default();
        assert_eq!(q.pop(), None);
        for k in 0..QUEUE as u64 {
            assert!(q.push(0x12, [k, k + 1, k + 2], k), "{k}");
        }
        assert!(!q.push(0x15, [0; 3], 0));
        assert_eq!(q.room(), 0);
        for k in 0..QUEUE as u64 {
            assert_eq!(q.pop(), Some((0x12, [k, k + 1, k + 2], k)));
        }
        assert_eq!(q.pop(), None);
        q.push(0x15, [1, 2, 0], 7);
        q.clear();
        assert_eq!((q.pop(), q.room()), (None, QUEUE));
    }

    #[test]
    fn the_reports_waiting_are_counted_until_acted_on() {
        let r = Removes::default();
        for k in 0..RING {
            assert_eq!(r.waiting(), k);
            r.record(k << 12, (k + 1) << 12);
        }
        assert_eq!(r.waiting(), RING);
        r.acted(1);
        assert_eq!(r.waiting(), RING - 1);
    }
}
