//! What the gates and the chunk state words take from the platform: atomics, fences and
//! waiting. One place, so that the loom model (`crates/attune/tests/loom.rs`) compiles the
//! same sources against its own (`tests/loom/shim.rs`).

pub use std::sync::atomic::{
    compiler_fence, fence, AtomicBool, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering,
};

/// Gives the CPU away (a waiter that spun long enough). Signal-safe.
#[inline]
pub fn yield_now() {
    attune_sys::os::yield_now()
}

/// One short spin of a waiter.
#[inline]
pub fn spin_loop() {
    std::hint::spin_loop()
}

/// Monotonic nanoseconds, for timeouts. Signal-safe.
#[inline]
pub fn now_ns() -> u64 {
    attune_sys::os::now_ns()
}
