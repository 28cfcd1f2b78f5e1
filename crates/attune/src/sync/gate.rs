//! The fork gate: runtime operations run inside it; the fork's prepare handler closes it
//! and waits until none is in flight (the protocol is in `crate::fork`). Below every
//! subsystem that claims chunks or takes engine locks, so that each can enter it without
//! knowing about the fork.

use super::shim::{self, AtomicU64, Ordering::*};

const CLOSED: u64 = 1 << 63;

/// A quiescence gate: operations run inside it (a count), the prepare handler closes it and
/// waits for the count to drain. Signal-safe (atomics and sched_yield).
///
/// Operations inside must never wait for something that needs to enter the gate (a fault
/// on managed memory that the handler thread resolves): such code runs outside, see the
/// small allocator's own gate.
pub struct Gate(AtomicU64);

/// Being inside the gate; leaves it on drop.
pub struct Inside<'a>(&'a Gate);

impl Drop for Inside<'_> {
    fn drop(&mut self) {
        self.0 .0.fetch_sub(1, Release);
    }
}

impl Gate {
    #[cfg(not(loom))]
    pub const fn new() -> Gate {
        Gate(AtomicU64::new(0))
    }

    /// Loom's atomics are not `const`.
    #[cfg(loom)]
    pub fn new() -> Gate {
        Gate(AtomicU64::new(0))
    }

    /// Enters, waiting while a fork is being prepared.
    pub fn enter(&self) -> Inside<'_> {
        let mut spins = 0u32;
        loop {
            let v = self.0.load(Acquire);
            if v & CLOSED == 0 {
                if self
                    .0
                    .compare_exchange_weak(v, v + 1, AcqRel, Relaxed)
                    .is_ok()
                {
                    return Inside(self);
                }
                continue;
            }
            backoff(&mut spins);
        }
    }

    /// Closes the gate and waits until nothing is inside; false if that took longer than
    /// `timeout_ns` (the gate stays closed either way).
    pub fn close(&self, timeout_ns: u64) -> bool {
        self.0.fetch_or(CLOSED, AcqRel);
        let start = shim::now_ns();
        while self.0.load(Acquire) & !CLOSED != 0 {
            if shim::now_ns() - start > timeout_ns {
                return false;
            }
            shim::yield_now();
        }
        true
    }

    pub fn open(&self) {
        self.0.fetch_and(!CLOSED, AcqRel);
    }

    /// In the child: the threads counted inside do not exist there.
    pub fn reset(&self) {
        self.0.store(0, Release);
    }

    /// Operations inside now (tests, diagnostics).
    pub fn inside(&self) -> u64 {
        self.0.load(Acquire) & !CLOSED
    }
}

/// One wait of a thread that found a gate closed: spin a little, then yield. Signal-safe.
pub(crate) fn backoff(spins: &mut u32) {
    *spins += 1;
    if *spins > 64 {
        shim::yield_now();
    } else {
        shim::spin_loop();
    }
}

impl Default for Gate {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn close_waits_for_operations_inside_and_blocks_new_ones() {
        let g = Arc::new(Gate::new());
        let inside = g.enter();
        assert_eq!(g.inside(), 1);
        let g2 = g.clone();
        let closer = std::thread::spawn(move || g2.close(2_000_000_000));
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(
            !closer.is_finished(),
            "close returned while an operation was inside"
        );
        drop(inside);
        assert!(closer.join().unwrap());
        // Closed: a new operation waits until the gate opens.
        let g3 = g.clone();
        let entrant = std::thread::spawn(move || {
            let _in = g3.enter();
        });
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(!entrant.is_finished(), "entered a closed gate");
        g.open();
        entrant.join().unwrap();
        assert_eq!(g.inside(), 0);
    }

    #[test]
    fn close_gives_up_after_its_timeout() {
        let g = Gate::new();
        let _in = g.enter();
        assert!(!g.close(20_000_000));
        g.open();
    }
}
