//! The protocol of the small allocator's gate, apart from how a thread finds its slot
//! (`super::thread_gate`): a flag per slot, a `closed` flag, and a counter gate for the
//! threads without a slot.
//!
//! The fast side is an asymmetric Dekker: store "inside" in the thread's own slot, a
//! barrier, load `closed`. The closing side stores `closed`, a barrier, then waits for
//! every slot to read 0. With a full fence on both sides (the `symmetric` case), one of
//! the two always sees the other's store; the loom model checks it
//! (`crates/attune/tests/loom.rs`). The asymmetric case leaves the fast side's fence out
//! and has the closer run `membarrier(PRIVATE_EXPEDITED)` in its place, which loom cannot
//! model: that half rests on the kernel's contract (membarrier(2)).
//!
//! A slot's count is written only by its own thread (plain load and store: a signal
//! handler that nests an operation on the same thread finishes before the thread goes on),
//! and read by the closing thread.

use super::gate::{backoff, Gate, Inside as GateInside};
use super::shim::{compiler_fence, fence, AtomicBool, AtomicU32, Ordering::*};

#[repr(align(64))]
struct Slot(AtomicU32);

pub struct FlagGate<const N: usize> {
    closed: AtomicBool,
    slots: Box<[Slot; N]>,
    /// For threads without a slot.
    overflow: Gate,
}

/// Being inside the gate; leaves it on drop.
pub enum Inside<'a> {
    Slot(&'a AtomicU32),
    Overflow(#[allow(dead_code)] GateInside<'a>),
}

impl Drop for Inside<'_> {
    #[inline]
    fn drop(&mut self) {
        if let Inside::Slot(s) = self {
            // Everything done inside happens before the slot reads as out.
            compiler_fence(SeqCst);
            s.store(s.load(Relaxed) - 1, Release);
        }
    }
}

/// The fast side's barrier between its store and its load.
#[inline(always)]
fn fast_barrier(asymmetric: bool) {
    if asymmetric {
        compiler_fence(SeqCst);
    } else {
        fence(SeqCst);
    }
}

impl<const N: usize> FlagGate<N> {
    pub fn new() -> Self {
        let slots: Box<[Slot]> = (0..N).map(|_| Slot(AtomicU32::new(0))).collect();
        FlagGate {
            closed: AtomicBool::new(false),
            slots: slots.try_into().unwrap_or_else(|_| unreachable!()),
            overflow: Gate::new(),
        }
    }

    /// Enters slot `i` while the gate is open and the slot is out (0); None otherwise (a
    /// signal handler nesting, or a fork closing the gate). `asymmetric`: the closer runs
    /// membarrier, so this side needs only a compiler barrier.
    #[inline(always)]
    pub fn try_enter(&self, i: usize, asymmetric: bool) -> Option<&AtomicU32> {
        let s = &self.slots[i].0;
        if s.load(Relaxed) != 0 {
            return None;
        }
        s.store(1, Relaxed);
        fast_barrier(asymmetric);
        // Acquire: an operation that gets in after a close sees what the closer did
        // (loom finds the gap with Relaxed; the same plain load on x86).
        if self.closed.load(Acquire) {
            s.store(0, Release);
            return None;
        }
        Some(s)
    }

    /// Leaves what [`Self::try_enter`] entered.
    #[inline(always)]
    pub fn leave(slot: &AtomicU32) {
        // Everything done inside happens before the slot reads as out. A signal handler
        // that nested an operation meanwhile has left again, so the count is 1.
        compiler_fence(SeqCst);
        slot.store(0, Release);
    }

    /// Enters through slot `i` (the counter gate when None), waiting while the gate is
    /// closed. `asymmetric` is asked on every try: a closer may turn it off.
    #[inline]
    pub fn enter(&self, i: Option<usize>, asymmetric: impl Fn() -> bool) -> Inside<'_> {
        let Some(i) = i else {
            return Inside::Overflow(self.overflow.enter());
        };
        let s = &self.slots[i].0;
        let mut spins = 0u32;
        loop {
            let n = s.load(Relaxed);
            s.store(n + 1, Relaxed);
            fast_barrier(asymmetric());
            if !self.closed.load(Acquire) || n > 0 {
                // Open, or nested in an operation this thread is already inside (a close
                // waits for the outer one anyway).
                return Inside::Slot(s);
            }
            s.store(n, Release);
            while self.closed.load(Acquire) {
                backoff(&mut spins);
            }
        }
    }

    /// Closes the gate and waits until nothing is inside; false if that took longer than
    /// `timeout_ns` (the gate stays closed either way). `barrier` runs between the store
    /// of `closed` and the full fence: the asymmetric case's membarrier.
    pub fn close(&self, timeout_ns: u64, barrier: impl FnOnce()) -> bool {
        self.closed.store(true, SeqCst);
        barrier();
        // Without membarrier every fast side fenced for itself: this fence pairs with it.
        fence(SeqCst);
        let start = super::shim::now_ns();
        if !self.overflow.close(timeout_ns) {
            return false;
        }
        while self.inside() != 0 {
            if super::shim::now_ns() - start > timeout_ns {
                return false;
            }
            super::shim::yield_now();
        }
        true
    }

    pub fn open(&self) {
        self.overflow.open();
        self.closed.store(false, Release);
    }

    /// In the child of a fork (one thread): the threads counted inside do not exist there.
    pub fn reset(&self) {
        for s in self.slots.iter() {
            s.0.store(0, Release);
        }
        self.overflow.reset();
        self.closed.store(false, Release);
    }

    /// Operations inside now (tests, diagnostics).
    pub fn inside(&self) -> u64 {
        self.slots
            .iter()
            .map(|s| s.0.load(Acquire) as u64)
            .sum::<u64>()
            + self.overflow.inside()
    }
}

impl<const N: usize> Default for FlagGate<N> {
    fn default() -> Self {
        Self::new()
    }
}
