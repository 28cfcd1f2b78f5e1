//! A process-wide pointer to something that lives for the rest of the process, read with
//! one load: the started runtime, its engine and its small allocator, which the fault
//! path, the fork handlers and the interposer's every call must find without a lock or
//! an initialisation check (signal-safe).
//!
//! Safe to use: only `&'static T` goes in, so whatever a load returns is still alive.

use std::sync::atomic::{AtomicPtr, Ordering::*};

pub struct Published<T: Sync + 'static>(AtomicPtr<T>);

impl<T: Sync + 'static> Published<T> {
    pub const fn new() -> Self {
        Published(AtomicPtr::new(std::ptr::null_mut()))
    }

    /// What was published last (None before, or after `set(None)`). Signal-safe.
    #[inline(always)]
    pub fn get(&self) -> Option<&'static T> {
        let p = self.0.load(Acquire);
        // SAFETY: `set` stores only null or a `&'static T`, never freed.
        unsafe { p.as_ref() }
    }

    /// Publishes `v` (None: nothing); a reader sees all that was written to it before.
    pub fn set(&self, v: Option<&'static T>) {
        self.0.store(
            v.map_or(std::ptr::null_mut(), |r| r as *const T as *mut T),
            Release,
        );
    }
}

impl<T: Sync + 'static> Default for Published<T> {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_what_was_set_last() {
        static P: Published<u64> = Published::new();
        assert!(P.get().is_none());
        let v: &'static u64 = Box::leak(Box::new(7));
        P.set(Some(v));
        assert_eq!(P.get(), Some(&7));
        P.set(None);
        assert!(P.get().is_none());
    }
}
