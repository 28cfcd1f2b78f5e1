//! The C API's error reporting: an errno for the return code and a readable message per
//! thread (`attune_last_error`), recorded wherever the failure is found.

use attune_sys::Errno;
use std::cell::RefCell;

/// The errno type of the API (re-exported for the C layer).
pub type ErrnoT = Errno;

/// Builds an errno value.
pub fn errno(e: i32) -> Errno {
    Errno(e)
}

thread_local! {
    static LAST_ERROR: RefCell<String> = const { RefCell::new(String::new()) };
}

/// Records a message for `attune_last_error` and returns the errno.
pub fn fail(e: Errno, msg: impl Into<String>) -> Errno {
    let m = msg.into();
    LAST_ERROR.with(|l| *l.borrow_mut() = m);
    e
}

/// The last error message of this thread.
pub fn last_error() -> String {
    LAST_ERROR.with(|l| l.borrow().clone())
}
