//! Other allocators' own entry points that take a pointer. A program linked with
//! jemalloc, tcmalloc or mimalloc may hand a block it got from `malloc` (so perhaps
//! managed by the runtime) to its allocator's own API; that allocator would then look up
//! a pointer it never made (jemalloc and mimalloc crash). Each entry here serves managed
//! pointers itself and forwards every other call unchanged to the allocator's definition
//! (next in the lookup order). A program that does not link the allocator never calls
//! these names.
//!
//! mimalloc's `mi_free`, `mi_realloc` and `mi_usable_size` are not here: the runtime
//! links mimalloc itself (its small-object arenas), so this library cannot export those
//! names. A mimalloc-linked program that hands a block from `malloc` of at least the
//! threshold to `mi_free` is a documented limit (docs/design/run.md, "Programs with their
//! own allocator"); `mi_malloc`'s own blocks and `free` of any block work.
//!
//! Which calls: those that free, resize or measure a block. Allocating calls (`mallocx`,
//! `tc_malloc`, `mi_malloc`) and statistics (`mallctl`, `MallocExtension`, `mi_stats_*`)
//! go to the allocator directly and stay correct: their blocks are never managed, and
//! their statistics count the blocks the allocator serves (the program's small objects;
//! the runtime's regions are in the run report).

use crate::hooks::{free_managed, managed_size, realloc};
use attune_sys::libc_alloc::NextFn;
use libc::c_void;

static MALLOCX: NextFn = NextFn::new(c"mallocx");
static DALLOCX: NextFn = NextFn::new(c"dallocx");
static SDALLOCX: NextFn = NextFn::new(c"sdallocx");
static SALLOCX: NextFn = NextFn::new(c"sallocx");
static RALLOCX: NextFn = NextFn::new(c"rallocx");
static XALLOCX: NextFn = NextFn::new(c"xallocx");
static TC_FREE: NextFn = NextFn::new(c"tc_free");
static TC_CFREE: NextFn = NextFn::new(c"tc_cfree");
static TC_FREE_SIZED: NextFn = NextFn::new(c"tc_free_sized");
static TC_REALLOC: NextFn = NextFn::new(c"tc_realloc");
static TC_MALLOC_SIZE: NextFn = NextFn::new(c"tc_malloc_size");

fn managed(p: *mut c_void) -> bool {
    !p.is_null() && managed_size(p as usize).is_some()
}

// ---- jemalloc (`man 3 jemalloc`, the non-standard API) ----

#[no_mangle]
pub extern "C" fn dallocx(p: *mut c_void, flags: i32) {
    if !free_managed(p as usize, true) {
        DALLOCX.void_pi(p as usize, flags)
    }
}

#[no_mangle]
pub extern "C" fn sdallocx(p: *mut c_void, size: usize, flags: i32) {
    if !free_managed(p as usize, true) {
        SDALLOCX.void_pzi(p as usize, size, flags)
    }
}

#[no_mangle]
pub extern "C" fn sallocx(p: *const c_void, flags: i32) -> usize {
    match managed_size(p as usize) {
        Some(n) => n,
        None => SALLOCX.size_pi(p as usize, flags),
    }
}

#[no_mangle]
pub extern "C" fn rallocx(p: *mut c_void, size: usize, flags: i32) -> *mut c_void {
    let Some(old) = (!p.is_null()).then(|| managed_size(p as usize)).flatten() else {
        return RALLOCX.ptr_pzi(p as usize, size, flags) as *mut c_void;
    };
    // The new block is jemalloc's, so that the flags (alignment, zeroing, arena) keep
    // their meaning; the managed block's content moves there.
    let q = MALLOCX.ptr_zi(size, flags);
    if q != 0 {
        attune_sys::libc_alloc::copy(q, p as usize, old.min(size));
        free_managed(p as usize, true);
    }
    q as *mut c_void
}

#[no_mangle]
pub extern "C" fn xallocx(p: *mut c_void, size: usize, extra: usize, flags: i32) -> usize {
    // A managed block is not resized in place: its size stays what it is.
    match managed_size(p as usize) {
        Some(n) => n,
        None => XALLOCX.size_pzzi(p as usize, size, extra, flags),
    }
}

// ---- tcmalloc (gperftools' `tc_*` entry points) ----

#[no_mangle]
pub extern "C" fn tc_free(p: *mut c_void) {
    if !free_managed(p as usize, true) {
        TC_FREE.void_p(p as usize)
    }
}

#[no_mangle]
pub extern "C" fn tc_cfree(p: *mut c_void) {
    if !free_managed(p as usize, true) {
        TC_CFREE.void_p(p as usize)
    }
}

#[no_mangle]
pub extern "C" fn tc_free_sized(p: *mut c_void, size: usize) {
    if !free_managed(p as usize, true) {
        TC_FREE_SIZED.void_pz(p as usize, size)
    }
}

#[no_mangle]
pub extern "C" fn tc_realloc(p: *mut c_void, size: usize) -> *mut c_void {
    if managed(p) {
        return realloc(p, size);
    }
    TC_REALLOC.ptr_pz(p as usize, size) as *mut c_void
}

#[no_mangle]
pub extern "C" fn tc_malloc_size(p: *mut c_void) -> usize {
    match managed_size(p as usize) {
        Some(n) => n,
        None => TC_MALLOC_SIZE.size_p(p as usize),
    }
}
