//! `__wrap_*`: the library's own mmap family, straight to the kernel (see build.rs).

use attune_sys::libc_alloc::set_errno;
use attune_sys::mem;
use libc::{c_int, c_void, off_t};

fn ptr(r: Result<usize, attune_sys::Errno>) -> *mut c_void {
    r.map(|p| p as *mut c_void).unwrap_or_else(|e| {
        set_errno(e.0);
        libc::MAP_FAILED
    })
}

fn status(r: Result<(), attune_sys::Errno>) -> c_int {
    r.map(|_| 0).unwrap_or_else(|e| {
        set_errno(e.0);
        -1
    })
}

#[no_mangle]
pub extern "C" fn __wrap_mmap(
    a: *mut c_void,
    l: usize,
    p: c_int,
    f: c_int,
    fd: c_int,
    o: off_t,
) -> *mut c_void {
    ptr(mem::raw_mmap(a as usize, l, p, f, fd, o))
}

#[no_mangle]
pub extern "C" fn __wrap_mmap64(
    a: *mut c_void,
    l: usize,
    p: c_int,
    f: c_int,
    fd: c_int,
    o: off_t,
) -> *mut c_void {
    __wrap_mmap(a, l, p, f, fd, o)
}

#[no_mangle]
pub extern "C" fn __wrap_munmap(a: *mut c_void, l: usize) -> c_int {
    status(mem::raw_munmap(a as usize, l))
}

#[no_mangle]
pub extern "C" fn __wrap_madvise(a: *mut c_void, l: usize, adv: c_int) -> c_int {
    status(mem::advise(a as usize, l, adv))
}

#[no_mangle]
pub extern "C" fn __wrap_mremap(
    o: *mut c_void,
    ol: usize,
    nl: usize,
    f: c_int,
    na: *mut c_void,
) -> *mut c_void {
    ptr(mem::raw_mremap(o as usize, ol, nl, f, na as usize))
}
