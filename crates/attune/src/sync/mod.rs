//! Synchronisation shared by the subsystems: the fork gate every runtime operation runs
//! inside, and the small allocator's per-thread gate. Their protocols (`gate`,
//! `flag_gate`) and the chunk state word (`crate::region`) take atomics from `shim`, and
//! the loom model checks them (`crates/attune/tests/loom.rs`).

pub mod flag_gate;
pub mod gate;
pub mod shim;
pub mod thread_gate;

use std::sync::atomic::{AtomicBool, Ordering::*};

/// Set in a child that could not take the runtime over: mimalloc's thread state there
/// still links heap structures inside the small-object arenas just unmapped, so any
/// mimalloc call would touch them (seen: SIGBUS in the child's first `allocate_TM(64)`).
static ABANDONED: AtomicBool = AtomicBool::new(false);

/// Whether this process is a child that could not take its parent's runtime over.
pub fn abandoned() -> bool {
    ABANDONED.load(Acquire)
}

/// Marks this process as such a child (`crate::fork`).
pub(crate) fn mark_abandoned() {
    ABANDONED.store(true, Release);
}
