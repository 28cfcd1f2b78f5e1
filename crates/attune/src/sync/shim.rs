//! What the gates and the chunk state words take from the platform: atomics, fences and
//! waiting. One place, so that the loom model (`crates/attune/tests/loom.rs`) compiles the
//! same sources against its own (`tests/loom/shim.rs`).

pub use std::sync::atomic::{
    compiler_fence, fence, AtomicBool, AtomicI32, AtomicU32, AtomicU64, AtomicU8, AtomicUsize,
    Ordering,
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

/// Sleeps while `word` holds `val` (a futex wait without timeout; it may return early,
/// so callers wait in a loop). Signal-safe.
#[inline]
pub fn wait_while(word: &AtomicU32, val: u32) {
    attune_sys::os::futex_wait(word, val, 0)
}

/// Wakes every thread in `wait_while` on `word`. Signal-safe.
#[inline]
pub fn wake_all(word: &AtomicU32) {
    attune_sys::os::futex_wake(word, i32::MAX)
}
