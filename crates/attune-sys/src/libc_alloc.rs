//! glibc's own allocator, reached under its internal names, for the `attune run`
//! interposer: the interposer exports `malloc` & co. itself, so whatever it does not
//! manage (small blocks, the runtime's own bookkeeping) must go to glibc without passing
//! through those symbols again.
//!
//! Contract: addresses are `usize`; a pointer given to `free`, `realloc` or
//! `usable_size` must have come from this module (glibc's heap), which the caller checks
//! first. `copy` copies between two ranges the caller owns and that do not overlap.

use std::sync::atomic::{AtomicUsize, Ordering::*};

extern "C" {
    fn __libc_malloc(size: usize) -> *mut libc::c_void;
    fn __libc_calloc(n: usize, size: usize) -> *mut libc::c_void;
    fn __libc_realloc(p: *mut libc::c_void, size: usize) -> *mut libc::c_void;
    fn __libc_memalign(align: usize, size: usize) -> *mut libc::c_void;
    fn __libc_free(p: *mut libc::c_void);
}

/// glibc's `malloc_usable_size`, found with `dlsym(RTLD_NEXT)` by [`resolve`].
static USABLE: AtomicUsize = AtomicUsize::new(0);

/// Looks up the symbols glibc exports only under their public names. Call once, early
/// (the interposer's constructor), before any other thread exists.
pub fn resolve() {
    // SAFETY: dlsym with a valid NUL-terminated name; the result is a function pointer
    // of the documented signature or null.
    let p = unsafe { libc::dlsym(libc::RTLD_NEXT, c"malloc_usable_size".as_ptr()) };
    USABLE.store(p as usize, Release);
}

pub fn malloc(size: usize) -> usize {
    // SAFETY: glibc's allocator has no preconditions on the size.
    unsafe { __libc_malloc(size) as usize }
}
pub fn calloc(n: usize, size: usize) -> usize {
    // SAFETY: as malloc; glibc checks the multiplication for overflow.
    unsafe { __libc_calloc(n, size) as usize }
}
pub fn memalign(align: usize, size: usize) -> usize {
    // SAFETY: glibc validates the alignment (EINVAL, NULL).
    unsafe { __libc_memalign(align, size) as usize }
}
/// `p` must be null or a live block from this module.
pub fn realloc(p: usize, size: usize) -> usize {
    // SAFETY: contract above.
    unsafe { __libc_realloc(p as *mut libc::c_void, size) as usize }
}
/// `p` must be null or a live block from this module.
pub fn free(p: usize) {
    // SAFETY: contract above.
    unsafe { __libc_free(p as *mut libc::c_void) }
}
/// Usable size of a live glibc block (0 if glibc's symbol could not be found).
pub fn usable_size(p: usize) -> usize {
    let f = USABLE.load(Acquire);
    if f == 0 || p == 0 {
        return 0;
    }
    // SAFETY: f is glibc's malloc_usable_size (resolve); p is a live glibc block.
    let f: extern "C" fn(*mut libc::c_void) -> usize = unsafe { std::mem::transmute(f) };
    f(p as *mut libc::c_void)
}

/// Copies `n` bytes between two non-overlapping ranges the caller owns (realloc).
pub fn copy(dst: usize, src: usize, n: usize) {
    // SAFETY: contract above; both ranges are mapped and writable/readable for n bytes.
    unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst as *mut u8, n) }
}

/// A Rust global allocator over glibc's internal entry points: the interposer's own
/// data structures must not re-enter its exported `malloc`.
pub struct LibcAllocator;

// SAFETY: every method forwards to glibc with the layout's size and alignment.
unsafe impl std::alloc::GlobalAlloc for LibcAllocator {
    unsafe fn alloc(&self, l: std::alloc::Layout) -> *mut u8 {
        if l.align() <= 16 {
            malloc(l.size()) as *mut u8
        } else {
            memalign(l.align(), l.size()) as *mut u8
        }
    }
    unsafe fn alloc_zeroed(&self, l: std::alloc::Layout) -> *mut u8 {
        if l.align() <= 16 {
            calloc(1, l.size()) as *mut u8
        } else {
            let p = memalign(l.align(), l.size());
            if p != 0 {
                std::ptr::write_bytes(p as *mut u8, 0, l.size());
            }
            p as *mut u8
        }
    }
    unsafe fn dealloc(&self, p: *mut u8, _l: std::alloc::Layout) {
        free(p as usize)
    }
    unsafe fn realloc(&self, p: *mut u8, l: std::alloc::Layout, new: usize) -> *mut u8 {
        if l.align() <= 16 {
            realloc(p as usize, new) as *mut u8
        } else {
            let q = memalign(l.align(), new);
            if q != 0 {
                copy(q, p as usize, l.size().min(new));
                free(p as usize);
            }
            q as *mut u8
        }
    }
}

/// Stores `val` at the address `out` (posix_memalign's out-parameter). `out` must be a
/// valid, aligned `void **` from the application.
pub fn write_out(out: usize, val: usize) {
    // SAFETY: contract above.
    unsafe { *(out as *mut usize) = val }
}

/// Sets this thread's errno.
pub fn set_errno(e: i32) {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() = e }
}

/// Zeroes `n` bytes the caller owns (calloc from a reused block).
pub fn zero(p: usize, n: usize) {
    // SAFETY: the caller owns [p, p+n), mapped and writable.
    unsafe { std::ptr::write_bytes(p as *mut u8, 0, n) }
}
