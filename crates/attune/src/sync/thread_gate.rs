//! A quiescence gate whose enter and leave cost no atomic read-modify-write: the small
//! allocator's, on the path of every `allocate_TM`/`free_TM` of a small block.
//!
//! [`super::gate::Gate`] counts operations in one shared word: two locked instructions per
//! operation, measured at half the cost of a 64-byte `allocate_TM`/`free_TM` pair here.
//! This gate gives each thread a flag of its own (a slot, claimed at the thread's first
//! operation and given back when it exits) and makes the rare side pay: to close, the fork
//! prepare handler sets `closed`, runs `membarrier(PRIVATE_EXPEDITED)` (every running
//! thread of the process executes a full barrier) and waits until no slot is inside. The
//! protocol is [`super::flag_gate`]; this file finds a thread's slot and owns the
//! membarrier registration. Where membarrier is refused (a seccomp filter), the fast side
//! uses a full fence instead. Threads beyond the slots use the shared counter gate. A
//! thread finds its slot by its thread pointer in a table of owners (`OWNER_TP`), falling
//! back to a thread-local index.

use super::flag_gate::FlagGate;
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering::*};

/// Threads with a slot of their own; others use the shared counter.
const SLOTS: usize = 256;
const NONE: usize = usize::MAX;

/// Which slot indices belong to a live thread (process-wide; every gate uses the index).
static OWNED: [AtomicBool; SLOTS] = [const { AtomicBool::new(false) }; SLOTS];
/// Whether the process is registered for membarrier (the fast side may skip its fence).
static ASYMMETRIC: AtomicBool = AtomicBool::new(false);
static REGISTERED: std::sync::Once = std::sync::Once::new();

/// The thread pointer of the thread owning each slot, when that slot is the thread's
/// `home` (0 otherwise): it finds a thread's slot without a TLS access, which in a shared
/// library is a call to `__tls_get_addr` (a fifth of a 64-byte `allocate_TM`/`free_TM`
/// pair, measured with perf). Set by the owner, cleared when it exits (before the slot is
/// given back), so a later thread at the same address never finds it set.
static OWNER_TP: [AtomicUsize; SLOTS] = [const { AtomicUsize::new(0) }; SLOTS];

/// The slot a thread tries first: a mix of its thread pointer.
fn home(tp: usize) -> usize {
    ((tp >> 12) ^ (tp >> 21) ^ (tp >> 30)) % SLOTS
}

/// This thread's slot index; given back when the thread exits.
struct Index(Cell<usize>);

impl Drop for Index {
    fn drop(&mut self) {
        let i = self.0.get();
        let _ = MY_SLOT.try_with(|m| m.set(NONE));
        if i < SLOTS {
            OWNER_TP[i].store(0, Relaxed);
            OWNED[i].store(false, Release);
        }
    }
}

thread_local! {
    static INDEX: Index = const { Index(Cell::new(NONE)) };
    /// A copy of `INDEX` without a destructor: reading it never registers one. The first
    /// access to `INDEX` in a thread registers its destructor through glibc, which
    /// allocates; in a forked child that allocation waited forever on the gate `reset`
    /// was about to open (`attune run --small -- /usr/bin/time true` hung).
    static MY_SLOT: Cell<usize> = const { Cell::new(NONE) };
}

/// This thread's slot, claimed on first use; NONE when all are taken or during the
/// thread's own teardown.
#[inline]
fn index() -> usize {
    let tp = attune_sys::os::thread_pointer();
    if tp != 0 {
        let h = home(tp);
        if OWNER_TP[h].load(Relaxed) == tp {
            return h;
        }
    }
    index_slow(tp)
}

/// This thread's slot if it has claimed one, found without claiming one and without
/// touching `INDEX` (whose first access allocates).
fn own_slot() -> usize {
    let tp = attune_sys::os::thread_pointer();
    if tp != 0 && OWNER_TP[home(tp)].load(Relaxed) == tp {
        return home(tp);
    }
    MY_SLOT.try_with(|m| m.get()).unwrap_or(NONE)
}

#[cold]
fn index_slow(tp: usize) -> usize {
    INDEX
        .try_with(|ix| {
            let i = ix.0.get();
            if i != NONE {
                return i;
            }
            let h = if tp != 0 { home(tp) } else { 0 };
            let order = std::iter::once(h).chain((0..SLOTS).filter(|&k| k != h));
            for k in order {
                let o = &OWNED[k];
                if !o.load(Relaxed) && o.compare_exchange(false, true, AcqRel, Relaxed).is_ok() {
                    ix.0.set(k);
                    MY_SLOT.with(|m| m.set(k));
                    if tp != 0 && k == h {
                        OWNER_TP[k].store(tp, Relaxed);
                    }
                    return k;
                }
            }
            NONE
        })
        .unwrap_or(NONE)
}

pub struct ThreadGate(FlagGate<SLOTS>);

pub use super::flag_gate::Inside;

/// Whether the fast side may leave its fence to the closer's membarrier.
#[inline(always)]
fn asymmetric() -> bool {
    ASYMMETRIC.load(Relaxed)
}

impl ThreadGate {
    pub fn new() -> ThreadGate {
        REGISTERED.call_once(|| ASYMMETRIC.store(attune_sys::os::membarrier_register(), Release));
        ThreadGate(FlagGate::new())
    }

    /// The fast side alone, for the small allocator's inlined paths: this thread's home
    /// slot (found by its thread pointer), entered while the gate is open. None when the
    /// thread has no home slot, is already inside (a signal handler nesting), or a fork is
    /// closing the gate: the caller then takes its general path, which uses [`Self::enter`].
    #[inline(always)]
    pub fn try_enter(&self) -> Option<&AtomicU32> {
        let tp = attune_sys::os::thread_pointer();
        let h = home(tp);
        if tp == 0 || OWNER_TP[h].load(Relaxed) != tp {
            return None;
        }
        self.0.try_enter(h, asymmetric())
    }

    /// Leaves what [`Self::try_enter`] entered.
    #[inline(always)]
    pub fn leave(slot: &AtomicU32) {
        FlagGate::<SLOTS>::leave(slot)
    }

    /// Enters, waiting while a fork is being prepared.
    #[inline]
    pub fn enter(&self) -> Inside<'_> {
        let i = index();
        self.0.enter((i != NONE).then_some(i), asymmetric)
    }

    /// Closes the gate and waits until nothing is inside; false if that took longer than
    /// `timeout_ns` (the gate stays closed either way).
    pub fn close(&self, timeout_ns: u64) -> bool {
        self.0.close(timeout_ns, || {
            if ASYMMETRIC.load(Acquire) && attune_sys::os::membarrier_private_expedited().is_err() {
                // Registered but refused now (not seen; the child re-registers in `reset`):
                // fast sides fence from here on, and a store still in a store buffer drains
                // within the millisecond waited (a context switch drains it too).
                ASYMMETRIC.store(false, SeqCst);
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        })
    }

    pub fn open(&self) {
        self.0.open()
    }

    /// In the child of a fork (one thread): the threads counted inside do not exist there,
    /// their slots are free again, and the child's mm registers for membarrier anew.
    /// Allocates nothing: the gate is still closed, and an allocation would wait on it.
    pub fn reset(&self) {
        let me = own_slot();
        for (k, o) in OWNED.iter().enumerate() {
            if k != me {
                OWNER_TP[k].store(0, Relaxed);
                o.store(false, Release);
            }
        }
        self.0.reset();
        ASYMMETRIC.store(attune_sys::os::membarrier_register(), Release);
    }

    /// Operations inside now (tests, diagnostics).
    pub fn inside(&self) -> u64 {
        self.0.inside()
    }
}

impl Default for ThreadGate {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn close_waits_for_an_operation_inside_and_blocks_new_ones() {
        let g = Arc::new(ThreadGate::new());
        let (tx, rx) = std::sync::mpsc::channel();
        let (g2, release) = (g.clone(), Arc::new(AtomicBool::new(false)));
        let r2 = release.clone();
        let t = std::thread::spawn(move || {
            let _in = g2.enter();
            tx.send(()).unwrap();
            while !r2.load(Acquire) {
                std::thread::sleep(Duration::from_millis(1));
            }
        });
        rx.recv().unwrap();
        assert_eq!(g.inside(), 1);
        assert!(!g.close(20_000_000), "closed while a thread was inside");
        release.store(true, Release);
        t.join().unwrap();
        assert!(g.close(1_000_000_000));
        // Closed: a new operation waits until the gate opens.
        let entered = Arc::new(AtomicU64::new(0));
        let (g3, e3) = (g.clone(), entered.clone());
        let t = std::thread::spawn(move || {
            let _in = g3.enter();
            e3.store(1, Release);
        });
        std::thread::sleep(Duration::from_millis(30));
        assert_eq!(entered.load(Acquire), 0, "entered a closed gate");
        g.open();
        t.join().unwrap();
        assert_eq!(entered.load(Acquire), 1);
        assert_eq!(g.inside(), 0);
    }

    #[test]
    fn live_threads_find_their_own_slots_and_never_share_one() {
        let barrier = Arc::new(std::sync::Barrier::new(8));
        let ts: Vec<_> = (0..8)
            .map(|_| {
                let barrier = barrier.clone();
                std::thread::spawn(move || {
                    let i = index();
                    let again = index();
                    let tp = attune_sys::os::thread_pointer();
                    let owned = i != NONE && OWNED[i].load(Acquire);
                    let named = i != NONE && OWNER_TP[i].load(Acquire) == tp;
                    // All eight alive at once when the slots are compared (asserts after
                    // the barrier: a failing thread must not leave the others waiting).
                    barrier.wait();
                    if i == NONE {
                        // Every slot taken (another test's threads at the same time).
                        return None;
                    }
                    assert_eq!(again, i, "the fast path finds the slot the slow one took");
                    assert!(owned);
                    if tp != 0 && i == home(tp) {
                        assert!(named, "a thread in its home slot is found by its pointer");
                    }
                    Some(i)
                })
            })
            .collect();
        let mut slots: Vec<usize> = ts.into_iter().filter_map(|t| t.join().unwrap()).collect();
        let n = slots.len();
        slots.sort();
        slots.dedup();
        assert_eq!(slots.len(), n, "two live threads shared a slot");
    }

    #[test]
    fn nested_operations_on_one_thread_count_once_each() {
        let g = ThreadGate::new();
        let a = g.enter();
        let b = g.enter();
        assert_eq!(g.inside(), 2);
        drop(b);
        assert_eq!(g.inside(), 1);
        drop(a);
        assert_eq!(g.inside(), 0);
        assert!(g.close(1_000_000));
        g.open();
    }

    #[test]
    fn many_threads_more_than_the_slots_all_get_in_and_out() {
        let g = Arc::new(ThreadGate::new());
        let count = Arc::new(AtomicU64::new(0));
        let ts: Vec<_> = (0..SLOTS + 40)
            .map(|_| {
                let (g, c) = (g.clone(), count.clone());
                std::thread::spawn(move || {
                    for _ in 0..100 {
                        let _in = g.enter();
                        c.fetch_add(1, Relaxed);
                    }
                })
            })
            .collect();
        // Closing and opening while they run never loses one inside.
        for _ in 0..20 {
            assert!(g.close(5_000_000_000));
            let before = count.load(Acquire);
            std::thread::sleep(Duration::from_millis(1));
            assert_eq!(count.load(Acquire), before, "an operation ran while closed");
            g.open();
        }
        for t in ts {
            t.join().unwrap();
        }
        assert_eq!(count.load(Acquire), (SLOTS as u64 + 40) * 100);
        assert_eq!(g.inside(), 0);
    }
}
