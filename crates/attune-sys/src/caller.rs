//! Exported entry points that know who called them. The interposer's `mmap` must tell a
//! heap that an allocator maps (small objects: the arguments of system calls
//! no wrapper covers) from other mappings, and the caller's return address says it
//! (`libc_alloc::is_heap_code`). Rust has no stable way to read a return address, so
//! the entry is a naked trampoline that passes it on as one more argument.
//!
//! Contract: the trampoline keeps the C calling convention of the symbol it defines; the
//! implementation takes the same arguments plus `caller: usize` (0 on architectures
//! without a trampoline here) and returns the same type. Only mmap's six-argument shape
//! is provided; nothing unwinds through the trampoline (the implementation is an
//! `extern "C"` function, which aborts rather than unwind).

/// Defines `#[no_mangle] extern "C" fn $name(addr, len, prot, flags, fd, off) -> *mut
/// c_void` (mmap's signature) that calls `$imp(addr, len, prot, flags, fd, off, caller)`.
#[macro_export]
macro_rules! mmap_entry_with_caller {
    ($name:ident, $imp:path) => {
        // x86-64 SysV: the seventh integer argument goes on the stack, just above the
        // return address at the callee's entry. At our entry [rsp] is the caller's return
        // address and rsp is 8 mod 16: pushing a copy of it aligns the stack to 16 and
        // makes it the seventh argument of the call; the six in registers pass untouched.
        #[cfg(target_arch = "x86_64")]
        #[unsafe(naked)]
        #[no_mangle]
        pub extern "C" fn $name(
            _addr: *mut libc::c_void,
            _len: usize,
            _prot: libc::c_int,
            _flags: libc::c_int,
            _fd: libc::c_int,
            _off: libc::off_t,
        ) -> *mut libc::c_void {
            // The CFI lines let debuggers and profilers unwind through the trampoline.
            core::arch::naked_asm!(
                ".cfi_startproc",
                "push qword ptr [rsp]",
                ".cfi_adjust_cfa_offset 8",
                "call {imp}",
                "add rsp, 8",
                ".cfi_adjust_cfa_offset -8",
                "ret",
                ".cfi_endproc",
                imp = sym $imp,
            )
        }
        // AArch64: the link register holds the return address and x6 is the seventh
        // argument; a tail branch returns from the implementation straight to the caller.
        #[cfg(target_arch = "aarch64")]
        #[unsafe(naked)]
        #[no_mangle]
        pub extern "C" fn $name(
            _addr: *mut libc::c_void,
            _len: usize,
            _prot: libc::c_int,
            _flags: libc::c_int,
            _fd: libc::c_int,
            _off: libc::off_t,
        ) -> *mut libc::c_void {
            core::arch::naked_asm!(
                ".cfi_startproc",
                "mov x6, x30",
                "b {imp}",
                ".cfi_endproc",
                imp = sym $imp,
            )
        }
        #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
        #[no_mangle]
        pub extern "C" fn $name(
            addr: *mut libc::c_void,
            len: usize,
            prot: libc::c_int,
            flags: libc::c_int,
            fd: libc::c_int,
            off: libc::off_t,
        ) -> *mut libc::c_void {
            $imp(addr, len, prot, flags, fd, off, 0)
        }
    };
}
