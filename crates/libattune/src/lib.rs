//! C ABI for `include/attune.h`. Every function catches panics and reports errors as a
//! return code plus errno, with a readable message from `attune_last_error()`; nothing
//! here aborts the application.

pub mod io;

use attune::paging::AllocOptions;
use attune::runtime;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

pub const ATTUNE_MAX_TIERS: usize = 16;

fn set_errno(e: i32) {
    // SAFETY: __errno_location returns this thread's errno.
    unsafe { *libc::__errno_location() = e };
}

/// Runs `f`, turning a panic into EIO (a bug in Attune must not take the application down).
fn guard<T>(fallback: T, f: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(_) => {
            attune::error::fail(
                attune_sys_errno(libc::EIO),
                "internal error in Attune (please report it)",
            );
            set_errno(libc::EIO);
            fallback
        }
    }
}

fn attune_sys_errno(e: i32) -> attune::error::ErrnoT {
    attune::error::errno(e)
}

fn rc(r: Result<(), attune::error::ErrnoT>) -> c_int {
    match r {
        Ok(()) => 0,
        Err(e) => {
            set_errno(e.0);
            -1
        }
    }
}

/// IMME Table I: allocates tiered memory placed by `flags`.
#[no_mangle]
pub extern "C" fn allocate_TM(size: usize, flags: c_int) -> *mut c_void {
    guard(std::ptr::null_mut(), || {
        match runtime::alloc(size, flags as u32, None) {
            Ok(p) => p as *mut c_void,
            Err(e) => {
                set_errno(e.0);
                std::ptr::null_mut()
            }
        }
    })
}

/// IMME Table I: releases tiered memory. A bad pointer sets errno to EINVAL and is
/// otherwise ignored.
#[no_mangle]
pub extern "C" fn free_TM(ptr: *mut c_void) {
    guard((), || {
        if let Err(e) = runtime::free(ptr as usize) {
            attune::log::emit(
                attune::log::Level::Warn,
                &format!("free_TM: {}", attune::error::last_error()),
            );
            set_errno(e.0);
        }
    })
}

#[repr(C)]
pub struct AttuneAllocOpts {
    pub struct_size: usize,
    pub flags: c_int,
    pub preferred_tier: c_int,
    pub pin_bytes: i64,
    pub prefault: c_int,
    pub chunk_size: usize,
    pub fault_mode: c_int,
}

#[no_mangle]
pub extern "C" fn attune_alloc_opts_init(o: *mut AttuneAllocOpts) {
    if o.is_null() {
        return;
    }
    // SAFETY: the caller passes a writable struct of this layout.
    unsafe {
        *o = AttuneAllocOpts {
            struct_size: std::mem::size_of::<AttuneAllocOpts>(),
            flags: 0,
            preferred_tier: -1,
            pin_bytes: -1,
            prefault: 0,
            chunk_size: 0,
            fault_mode: 0,
        };
    }
}

/// Marks the start of a phase of the program (`attune profile` reports each phase's
/// access curve); ends the open phase, if any.
#[no_mangle]
pub extern "C" fn attune_phase_begin(name: *const c_char) -> c_int {
    guard(-1, || {
        if name.is_null() {
            set_errno(libc::EINVAL);
            return -1;
        }
        // SAFETY: a NUL-terminated string from the caller.
        let n = unsafe { CStr::from_ptr(name) }.to_string_lossy();
        rc(runtime::phase_begin(&n))
    })
}

/// Ends the open phase; -1 with errno EINVAL when none is open.
#[no_mangle]
pub extern "C" fn attune_phase_end() -> c_int {
    guard(-1, || rc(runtime::phase_end()))
}

/// Maps the shared region `name` (held by the node daemon), creating it with `size`
/// bytes if it does not exist (`size` 0: open an existing one only).
#[no_mangle]
pub extern "C" fn attune_shared_open(
    name: *const c_char,
    size: usize,
    flags: c_int,
) -> *mut c_void {
    guard(std::ptr::null_mut(), || {
        if name.is_null() {
            attune::error::fail(
                attune_sys_errno(libc::EINVAL),
                "attune_shared_open: no name",
            );
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        }
        // SAFETY: a NUL-terminated string from the caller.
        let n = unsafe { CStr::from_ptr(name) }.to_string_lossy();
        let Some(f) = attune::Flags::from_bits(flags as u32) else {
            attune::error::fail(
                attune_sys_errno(libc::EINVAL),
                format!("unknown flag bits {flags:#x}"),
            );
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        };
        // The runtime (and its daemon connection) starts on first use.
        if let Err(e) = runtime::init(None) {
            set_errno(e.0);
            return std::ptr::null_mut();
        }
        match attune::daemon_client::shared_open(&n, size as u64, f) {
            Ok(p) => p as *mut c_void,
            Err(e) => {
                set_errno(e.0);
                std::ptr::null_mut()
            }
        }
    })
}

/// Drops this process's reference to a shared region (unmapped at its last close here;
/// freed by the daemon when no process holds it).
#[no_mangle]
pub extern "C" fn attune_shared_close(ptr: *mut c_void) -> c_int {
    guard(-1, || rc(attune::daemon_client::shared_close(ptr as usize)))
}

/// Lets `uid` open the caller's shared region `name`.
#[no_mangle]
pub extern "C" fn attune_shared_grant(name: *const c_char, uid: u32) -> c_int {
    guard(-1, || {
        if name.is_null() {
            set_errno(libc::EINVAL);
            return -1;
        }
        // SAFETY: a NUL-terminated string from the caller.
        let n = unsafe { CStr::from_ptr(name) }.to_string_lossy();
        rc(attune::daemon_client::shared_grant(&n, uid))
    })
}

/// 1 when this process is registered with the node daemon now, else 0.
#[no_mangle]
pub extern "C" fn attune_daemon_connected() -> c_int {
    guard(0, || attune::daemon_client::connected() as c_int)
}

#[no_mangle]
pub extern "C" fn attune_init(config_path: *const c_char) -> c_int {
    guard(-1, || {
        let path = if config_path.is_null() {
            None
        } else {
            // SAFETY: a NUL-terminated string from the caller.
            match unsafe { CStr::from_ptr(config_path) }.to_str() {
                Ok(s) => Some(std::path::PathBuf::from(s)),
                Err(_) => {
                    set_errno(libc::EINVAL);
                    return -1;
                }
            }
        };
        rc(runtime::init(path.as_deref()).map(|_| ()))
    })
}

#[no_mangle]
pub extern "C" fn attune_alloc(size: usize, opts: *const AttuneAllocOpts) -> *mut c_void {
    guard(std::ptr::null_mut(), || {
        let (flags, o) = if opts.is_null() {
            (0, None)
        } else {
            // SAFETY: the caller passes an initialised struct (attune_alloc_opts_init).
            let o = unsafe { &*opts };
            if o.struct_size < std::mem::size_of::<AttuneAllocOpts>() {
                attune::error::fail(
                    attune_sys_errno(libc::EINVAL),
                    "attune_alloc_opts not initialised: call attune_alloc_opts_init first",
                );
                set_errno(libc::EINVAL);
                return std::ptr::null_mut();
            }
            let fault_mode = match o.fault_mode {
                1 => Some(attune::config::FaultMode::Thread),
                2 => Some(attune::config::FaultMode::Signal),
                _ => None,
            };
            let ao = AllocOptions {
                flags: attune::Flags(0),
                preferred_tier: if o.preferred_tier >= 1 {
                    Some(o.preferred_tier as usize - 1)
                } else {
                    None
                },
                pin_bytes: if o.pin_bytes >= 0 {
                    Some(o.pin_bytes as usize)
                } else {
                    None
                },
                prefault: o.prefault != 0,
                chunk_size: if o.chunk_size > 0 {
                    Some(o.chunk_size)
                } else {
                    None
                },
                fault_mode,
                own_region: false,
            };
            (o.flags as u32, Some(ao))
        };
        match runtime::alloc(size, flags, o) {
            Ok(p) => p as *mut c_void,
            Err(e) => {
                set_errno(e.0);
                std::ptr::null_mut()
            }
        }
    })
}

#[no_mangle]
pub extern "C" fn attune_free(ptr: *mut c_void) -> c_int {
    guard(-1, || rc(runtime::free(ptr as usize)))
}

#[no_mangle]
pub extern "C" fn attune_set_flags(ptr: *mut c_void, flags: c_int) -> c_int {
    guard(-1, || rc(runtime::set_flags(ptr as usize, flags as u32)))
}

#[no_mangle]
pub extern "C" fn attune_pin(ptr: *mut c_void, len: usize) -> c_int {
    guard(-1, || rc(runtime::pin(ptr as usize, len, true)))
}

#[no_mangle]
pub extern "C" fn attune_unpin(ptr: *mut c_void, len: usize) -> c_int {
    guard(-1, || rc(runtime::pin(ptr as usize, len, false)))
}

#[no_mangle]
pub extern "C" fn attune_discard(ptr: *mut c_void, len: usize) -> c_int {
    guard(-1, || rc(runtime::discard(ptr as usize, len)))
}

#[no_mangle]
pub extern "C" fn attune_prefetch(ptr: *mut c_void, len: usize) -> c_int {
    guard(-1, || rc(runtime::prefetch(ptr as usize, len)))
}

#[repr(C)]
pub struct AttuneRegionStats {
    pub size: u64,
    pub chunk_size: u64,
    pub flags: u32,
    pub ntiers: u32,
    pub resident_bytes: u64,
    pub tier_bytes: [u64; ATTUNE_MAX_TIERS],
    pub pinned_bytes: u64,
    pub faults: u64,
    pub evictions: u64,
    pub fetched_bytes: u64,
    pub evicted_bytes: u64,
    pub zero_fills: u64,
    pub readahead_chunks: u64,
    pub clean_skips: u64,
    pub heat: u64,
}

#[no_mangle]
pub extern "C" fn attune_region_stats(ptr: *const c_void, out: *mut AttuneRegionStats) -> c_int {
    guard(-1, || {
        if out.is_null() {
            set_errno(libc::EINVAL);
            return -1;
        }
        match runtime::region_stats(ptr as usize) {
            Ok(s) => {
                let mut tb = [0u64; ATTUNE_MAX_TIERS];
                // tier_bytes[0] is DRAM, then far tiers in attune_tier_stats order.
                tb[0] = s.resident_bytes;
                for (i, b) in s.tier_bytes.iter().enumerate().take(ATTUNE_MAX_TIERS - 1) {
                    tb[i + 1] = *b;
                }
                // SAFETY: out is a writable struct of this layout.
                unsafe {
                    *out = AttuneRegionStats {
                        size: s.size,
                        chunk_size: s.chunk_size,
                        flags: s.flags,
                        ntiers: (s.tier_bytes.len() + 1) as u32,
                        resident_bytes: s.resident_bytes,
                        tier_bytes: tb,
                        pinned_bytes: s.pinned_bytes,
                        faults: s.faults,
                        evictions: s.evictions,
                        fetched_bytes: s.fetched_bytes,
                        evicted_bytes: s.evicted_bytes,
                        zero_fills: s.zero_fills,
                        readahead_chunks: s.readahead_chunks,
                        clean_skips: s.clean_skips,
                        heat: s.heat,
                    }
                };
                0
            }
            Err(e) => {
                set_errno(e.0);
                -1
            }
        }
    })
}

#[repr(C)]
pub struct AttuneTierStats {
    pub name: [c_char; 32],
    pub kind: [c_char; 16],
    pub capacity: u64,
    pub used_bytes: u64,
    pub latency_ns: u64,
    pub bandwidth: u64,
    pub faults: u64,
    pub evictions: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub errors: u64,
}

fn fill(dst: &mut [c_char], s: &str) {
    for (i, b) in s.bytes().take(dst.len() - 1).enumerate() {
        dst[i] = b as c_char;
    }
}

#[no_mangle]
pub extern "C" fn attune_tier_count() -> c_int {
    guard(-1, || match runtime::tier_stats() {
        Ok(v) => v.len() as c_int,
        Err(e) => {
            set_errno(e.0);
            -1
        }
    })
}

#[no_mangle]
pub extern "C" fn attune_tier_stats(index: c_int, out: *mut AttuneTierStats) -> c_int {
    guard(-1, || {
        let v = match runtime::tier_stats() {
            Ok(v) => v,
            Err(e) => {
                set_errno(e.0);
                return -1;
            }
        };
        if out.is_null() || index < 0 || index as usize >= v.len() {
            set_errno(libc::EINVAL);
            return -1;
        }
        let t = &v[index as usize];
        let mut s = AttuneTierStats {
            name: [0; 32],
            kind: [0; 16],
            capacity: t.capacity,
            used_bytes: t.used_bytes,
            latency_ns: t.latency_ns,
            bandwidth: t.bandwidth,
            faults: t.faults,
            evictions: t.evictions,
            bytes_in: t.bytes_in,
            bytes_out: t.bytes_out,
            errors: t.errors,
        };
        fill(&mut s.name, &t.name);
        fill(&mut s.kind, &t.kind);
        // SAFETY: out is a writable struct of this layout.
        unsafe { *out = s };
        0
    })
}

/// Writes the statistics of all tiers as JSON into `buf`; returns the length needed
/// (excluding NUL), like snprintf.
#[no_mangle]
pub extern "C" fn attune_stats_json(buf: *mut c_char, len: usize) -> c_int {
    guard(-1, || {
        let v = match runtime::tier_stats() {
            Ok(v) => v,
            Err(e) => {
                set_errno(e.0);
                return -1;
            }
        };
        let engine = runtime::runtime().ok().and_then(|rt| rt.engine()).map(|e| {
            let counters = e.pager.counters.statistics().map(|(k, a)| {
                (
                    k.to_string(),
                    serde_json::json!(a.load(std::sync::atomic::Ordering::Relaxed)),
                )
            });
            serde_json::Value::Object(counters.into_iter().collect())
        });
        let numa = runtime::numa_stats();
        let s = serde_json::json!({ "tiers": v, "engine": engine, "numa": numa }).to_string();
        if !buf.is_null() && len > 0 {
            let n = s.len().min(len - 1);
            // SAFETY: buf has len bytes.
            unsafe {
                std::ptr::copy_nonoverlapping(s.as_ptr(), buf as *mut u8, n);
                *buf.add(n) = 0;
            }
        }
        s.len() as c_int
    })
}

thread_local! {
    static MSG: std::cell::RefCell<CString> = std::cell::RefCell::new(CString::default());
}

/// The last error message of the calling thread (valid until its next Attune call).
#[no_mangle]
pub extern "C" fn attune_last_error() -> *const c_char {
    let s = attune::error::last_error().replace('\0', " ");
    MSG.with(|m| {
        *m.borrow_mut() = CString::new(s).unwrap_or_default();
        m.borrow().as_ptr()
    })
}

/// A description of an errno value as Attune uses it.
#[no_mangle]
pub extern "C" fn attune_strerror(err: c_int) -> *const c_char {
    let s: &'static [u8] = match err {
        0 => b"success\0",
        libc::EINVAL => {
            b"invalid argument: unknown flags, size 0, or a pointer Attune did not hand out\0"
        }
        libc::ENOMEM => b"not enough memory in the tiers for this request\0",
        libc::ENOSPC => b"a file tier is full\0",
        libc::ENOTSUP => b"not supported in this mode (userfaultfd unavailable)\0",
        libc::EIO => b"a tier failed to read or write\0",
        libc::EFAULT => b"bad address\0",
        _ => b"unknown error\0",
    };
    s.as_ptr() as *const c_char
}

/// The C header's structs against the `#[repr(C)]` ones: a C program compiled against
/// include/attune.h prints each struct's size and every field's offset, and they must
/// equal Rust's. A field added, moved or retyped on one side only fails here.
#[cfg(test)]
mod header_layout {
    use super::*;

    /// (C code printing the size and offsets, Rust's size and offsets) of one struct.
    macro_rules! layout {
        ($rust:ty, $c:literal, [$($f:ident),* $(,)?]) => {{
            let mut c = format!("printf(\"%zu\\n\", sizeof({}));\n", $c);
            let mut r = vec![std::mem::size_of::<$rust>()];
            $(
                c += &format!("printf(\"%zu\\n\", offsetof({}, {}));\n", $c, stringify!($f));
                r.push(std::mem::offset_of!($rust, $f));
            )*
            (c, r)
        }};
    }

    #[test]
    fn the_headers_structs_match_the_rust_ones() {
        let parts = [
            layout!(
                AttuneAllocOpts,
                "attune_alloc_opts",
                [
                    struct_size,
                    flags,
                    preferred_tier,
                    pin_bytes,
                    prefault,
                    chunk_size,
                    fault_mode,
                ]
            ),
            layout!(
                AttuneRegionStats,
                "attune_region_stats_t",
                [
                    size,
                    chunk_size,
                    flags,
                    ntiers,
                    resident_bytes,
                    tier_bytes,
                    pinned_bytes,
                    faults,
                    evictions,
                    fetched_bytes,
                    evicted_bytes,
                    zero_fills,
                    readahead_chunks,
                    clean_skips,
                    heat,
                ]
            ),
            layout!(
                AttuneTierStats,
                "attune_tier_stats_t",
                [
                    name, kind, capacity, used_bytes, latency_ns, bandwidth, faults, evictions,
                    bytes_in, bytes_out, errors,
                ]
            ),
        ];
        let mut src = String::from(
            "#include <stddef.h>\n#include <stdio.h>\n#include \"attune.h\"\nint main(void) {\nprintf(\"%d\\n\", ATTUNE_MAX_TIERS);\n",
        );
        let mut want = vec![ATTUNE_MAX_TIERS];
        for (c, r) in &parts {
            src += c;
            want.extend(r);
        }
        src += "return 0;\n}\n";
        let dir = std::env::temp_dir().join(format!("attune-layout-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("layout.c"), src).unwrap();
        let include = concat!(env!("CARGO_MANIFEST_DIR"), "/../../include");
        let cc = std::process::Command::new("cc")
            .args(["-I", include, "-o"])
            .arg(dir.join("layout"))
            .arg(dir.join("layout.c"))
            .status()
            .expect("a C compiler (cc)");
        assert!(cc.success(), "layout.c does not compile against attune.h");
        let out = std::process::Command::new(dir.join("layout"))
            .output()
            .unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        let got: Vec<usize> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| l.parse().unwrap())
            .collect();
        assert_eq!(got, want, "attune.h and the #[repr(C)] structs differ");
    }
}
