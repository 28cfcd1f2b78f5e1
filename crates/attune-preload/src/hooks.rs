//! The exported allocation and mapping symbols. Each decides in a few comparisons
//! whether a request is the runtime's (large enough, runtime ready, not re-entered) and
//! otherwise hands it unchanged to the program's allocator (glibc's, or the jemalloc,
//! tcmalloc or mimalloc it links: `attune_sys::libc_alloc`) or to the kernel.
//!
//! Why each symbol is here:
//! * malloc, calloc, realloc, reallocarray, free, posix_memalign, aligned_alloc,
//!   memalign, valloc, pvalloc, malloc_usable_size: glibc's replaceable set; all of them
//!   must agree on which pointers are whose. Other allocators' own entry points that
//!   take a pointer (jemalloc's `sdallocx`, tcmalloc's `tc_free`, mimalloc's `mi_free`,
//!   ...) are in `foreign.rs`.
//! * mmap/mmap64, munmap, mremap: large anonymous private mappings are managed too
//!   (Python's arenas, allocators that map directly); munmap and mremap must then know them.
//! * madvise: MADV_DONTNEED, MADV_FREE and MADV_REMOVE inside one managed mapping drop its
//!   content through the runtime (`attune_discard`: pages in a far tier too).
//! * madvise: MADV_HUGEPAGE on managed memory is ignored (the runtime decides which
//!   resident spans go on huge pages, `attune::paging::huge`; numpy asks for huge pages on
//!   every large array). MADV_NOHUGEPAGE reaches the kernel, and the runtime then never
//!   collapses that memory.

use crate::{ready, settings, table, Busy, SMALL, THRESHOLD};
use attune::paging::AllocOptions;
use attune_sys::libc_alloc as alloc;
use attune_sys::mem;
use libc::{c_int, c_void, off_t};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};

const PAGE: usize = 4096;

/// Managed requests served, and those that fell back to the program's allocator (tiers
/// full).
pub static SERVED: AtomicU64 = AtomicU64::new(0);
pub static FELL_BACK: AtomicU64 = AtomicU64::new(0);

fn round_page(n: usize) -> Option<usize> {
    n.checked_add(PAGE - 1).map(|v| v & !(PAGE - 1))
}

/// Serves `size` bytes from the runtime, or returns 0 (not managed: the program's allocator
/// serves it). With
/// `region`, the result is a page-aligned region of its own (mmap, large alignments).
fn managed(size: usize, region: bool) -> usize {
    managed_fresh(size, region, None).0
}

/// As `managed`, and whether the memory is fresh (reads as zeros). `mapping`: an `mmap`
/// request, with its caller's return address (0 unknown).
#[inline]
fn managed_fresh(size: usize, region: bool, mapping: Option<usize>) -> (usize, bool) {
    // THRESHOLD is 0 in small mode (everything managed) and usize::MAX before start.
    if size < THRESHOLD.load(Relaxed) {
        return (0, false);
    }
    managed_slow(size, region, mapping)
}

#[inline(never)]
fn managed_slow(size: usize, region: bool, mapping: Option<usize>) -> (usize, bool) {
    let mapped = mapping.is_some();
    let s = settings();
    if size < s.threshold && (region || !s.small) {
        return (0, false);
    }
    let Some(_b) = Busy::enter() else {
        return (0, false);
    };
    if !ready() {
        return (0, false);
    }
    let rt = match attune::runtime::runtime() {
        Ok(rt) => rt,
        Err(_) => return (0, false),
    };
    let is_region = region || size >= rt.config().small_threshold;
    if !is_region && !rt.small_enabled() {
        // A child that could not take its parent's runtime over: no shared arenas; a
        // region per small request would cost a page each, so the program's allocator
        // serves them.
        return (0, false);
    }
    let fault_mode = if is_region {
        match region_delivery(mapping) {
            Some(m) => m,
            None => return (0, false),
        }
    } else if crate::delivery::kept_out() {
        return (0, false);
    } else {
        None
    };
    let (flags, hot) = match predicted(size) {
        Some(r) => (r.flags, r.hot.as_slice()),
        None => (s.flags_for(size), &[][..]),
    };
    if is_region && !region {
        if let Some(b) = table::cache_take(size) {
            // A reused region takes the flags of its new request (size rules may differ).
            let _ = attune::runtime::set_flags(b, flags.0);
            pin_hot(b, size, hot);
            SERVED.fetch_add(1, Relaxed);
            return (b, false);
        }
    }
    let opts = region.then(|| AllocOptions {
        own_region: true,
        fault_mode,
        ..Default::default()
    });
    let len = if region {
        round_page(size).unwrap_or(size)
    } else {
        size
    };
    match attune::runtime::alloc(len, flags.0, opts) {
        Ok(p) => {
            if is_region {
                table::insert(p, len, mapped);
                pin_hot(p, size, hot);
            }
            SERVED.fetch_add(1, Relaxed);
            (p, is_region)
        }
        Err(_) => {
            FELL_BACK.fetch_add(1, Relaxed);
            (0, false)
        }
    }
}

/// The fault delivery of a new region (None inside: the configured one), or None where
/// it stays unmanaged. A library loaded since the last region may hand memory to the
/// kernel; a mapping (`mapping`: its caller) may be a heap whose objects reach system
/// calls no wrapper covers.
fn region_delivery(mapping: Option<usize>) -> Option<Option<attune::config::FaultMode>> {
    crate::delivery::check(false);
    if crate::delivery::kept_out() {
        return None;
    }
    match mapping {
        None => Some(None),
        Some(caller) => crate::delivery::for_mapping(caller).map(Some),
    }
}

/// Requests that took the history's prediction, and bytes pinned for their hot ranges.
pub static PREDICTED: AtomicU64 = AtomicU64::new(0);
pub static PREDICTED_PINNED: AtomicU64 = AtomicU64::new(0);

/// The recorded region a request of `size` takes from the history's prediction, if no
/// flags or rule decide it: the n-th request of a size takes the n-th region recorded at
/// that size.
fn predicted(size: usize) -> Option<&'static attune_policy::predict::RegionRecord> {
    static TAKEN: std::sync::OnceLock<Vec<AtomicUsize>> = std::sync::OnceLock::new();
    let s = settings();
    if s.predicted.is_empty() {
        return None;
    }
    let cands = s.predicted_for(size);
    let first = *cands.first()?;
    let taken = TAKEN.get_or_init(|| {
        (0..s.predicted.len())
            .map(|_| AtomicUsize::new(0))
            .collect()
    });
    let n = taken[first].fetch_add(1, Relaxed);
    PREDICTED.fetch_add(1, Relaxed);
    Some(&s.predicted[cands[n % cands.len()]])
}

/// Pins the predicted hot ranges of a new region (its LAT part). A pin the budget cannot
/// hold is refused by the runtime; the region then simply stays pageable.
fn pin_hot(p: usize, size: usize, hot: &[(f64, f64)]) {
    for &(a, b) in hot {
        let start = ((a * size as f64) as usize) & !(PAGE - 1);
        let end = (((b * size as f64) as usize) + PAGE - 1) & !(PAGE - 1);
        let end = end.min(round_page(size).unwrap_or(size));
        if end > start && attune::runtime::pin(p + start, end - start, true).is_ok() {
            PREDICTED_PINNED.fetch_add((end - start) as u64, Relaxed);
        }
    }
}

/// Bytes of freed regions kept for reuse: 1/8 of the budget, at most 64 MiB.
fn cache_limit() -> usize {
    attune::runtime::engine_if_started()
        .map(|e| attune_policy::budget::reuse_cache(e.pager.budget()) as usize)
        .unwrap_or(0)
}

/// Frees `p` if it is managed (or inherited from the parent); false if it is the
/// program's allocator's.
/// `reuse`: a malloc'ed region may be kept for the next request of a similar size.
#[inline]
pub(crate) fn free_managed(p: usize, reuse: bool) -> bool {
    if p % PAGE == 0 {
        if let Some(e) = table::remove_block(p) {
            if e.inherited {
                let _ = mem::raw_munmap(p, round_page(e.cap).unwrap_or(e.cap));
            } else {
                let doomed = if reuse {
                    table::cache_put(p, e.cap, cache_limit())
                } else {
                    vec![p]
                };
                let _b = Busy::enter();
                for d in doomed {
                    let _ = attune::runtime::free(d);
                }
            }
            return true;
        }
    }
    if SMALL.load(Relaxed) && attune::runtime::in_small_arena(p) {
        let _b = Busy::enter();
        let _ = attune::runtime::free(p);
        return true;
    }
    false
}

/// Size of a managed allocation at `p`.
pub(crate) fn managed_size(p: usize) -> Option<usize> {
    if p % PAGE == 0 {
        if let Some(e) = table::get_block(p) {
            return Some(e.size);
        }
    }
    if SMALL.load(Relaxed) {
        return attune::runtime::small_block_size(p);
    }
    None
}

#[no_mangle]
pub extern "C" fn malloc(size: usize) -> *mut c_void {
    let p = managed(size, false);
    if p != 0 {
        return p as *mut c_void;
    }
    alloc::malloc(size) as *mut c_void
}

#[no_mangle]
pub extern "C" fn free(p: *mut c_void) {
    let p = p as usize;
    if p == 0 || free_managed(p, true) {
        return;
    }
    alloc::free(p)
}

#[no_mangle]
pub extern "C" fn calloc(n: usize, size: usize) -> *mut c_void {
    let Some(total) = n.checked_mul(size) else {
        alloc::set_errno(libc::ENOMEM);
        return std::ptr::null_mut();
    };
    let (p, fresh) = managed_fresh(total, false, None);
    if p != 0 {
        // Fresh regions read as zeros (first touch is zero-filled); reused memory does not.
        if !fresh {
            alloc::zero(p, total);
        }
        return p as *mut c_void;
    }
    alloc::calloc(n, size) as *mut c_void
}

#[no_mangle]
pub extern "C" fn realloc(p: *mut c_void, n: usize) -> *mut c_void {
    let p = p as usize;
    if p == 0 {
        return malloc(n);
    }
    if n == 0 {
        free(p as *mut c_void);
        return std::ptr::null_mut();
    }
    if let Some(old) = managed_size(p) {
        if n <= old {
            return p as *mut c_void;
        }
        let q = malloc(n) as usize;
        if q == 0 {
            return std::ptr::null_mut(); // errno from malloc; p is untouched
        }
        alloc::copy(q, p, old);
        free(p as *mut c_void);
        return q as *mut c_void;
    }
    // A block of the program's allocator grows past the threshold: it moves to managed
    // memory (when that allocator can tell its block's size).
    if let Some(old) = (n >= THRESHOLD.load(Relaxed))
        .then(|| alloc::usable_size(p))
        .flatten()
    {
        let q = managed(n, false);
        if q != 0 {
            alloc::copy(q, p, old.min(n));
            alloc::free(p);
            return q as *mut c_void;
        }
    }
    alloc::realloc(p, n) as *mut c_void
}

#[no_mangle]
pub extern "C" fn reallocarray(p: *mut c_void, n: usize, size: usize) -> *mut c_void {
    match n.checked_mul(size) {
        Some(t) => realloc(p, t),
        None => {
            alloc::set_errno(libc::ENOMEM);
            std::ptr::null_mut()
        }
    }
}

fn aligned(align: usize, size: usize) -> usize {
    // Regions are at least page-aligned; arena blocks 16-byte aligned.
    let p = managed(size, align > 16);
    if p != 0 && p % align == 0 {
        return p;
    }
    if p != 0 {
        free_managed(p, false);
    }
    alloc::memalign(align, size)
}

#[no_mangle]
pub extern "C" fn posix_memalign(out: *mut *mut c_void, align: usize, size: usize) -> c_int {
    if !align.is_power_of_two() || align < std::mem::size_of::<usize>() {
        return libc::EINVAL;
    }
    let p = aligned(align, size);
    if p == 0 {
        return libc::ENOMEM;
    }
    alloc::write_out(out as usize, p);
    0
}

#[no_mangle]
pub extern "C" fn aligned_alloc(align: usize, size: usize) -> *mut c_void {
    if !align.is_power_of_two() {
        alloc::set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    }
    aligned(align, size) as *mut c_void
}

#[no_mangle]
pub extern "C" fn memalign(align: usize, size: usize) -> *mut c_void {
    aligned_alloc(align.next_power_of_two(), size)
}

#[no_mangle]
pub extern "C" fn valloc(size: usize) -> *mut c_void {
    aligned(PAGE, size) as *mut c_void
}

#[no_mangle]
pub extern "C" fn pvalloc(size: usize) -> *mut c_void {
    match round_page(size.max(1)) {
        Some(s) => aligned(PAGE, s) as *mut c_void,
        None => {
            alloc::set_errno(libc::ENOMEM);
            std::ptr::null_mut()
        }
    }
}

#[no_mangle]
pub extern "C" fn malloc_usable_size(p: *mut c_void) -> usize {
    let p = p as usize;
    if p == 0 {
        return 0;
    }
    managed_size(p).unwrap_or_else(|| alloc::usable_size(p).unwrap_or(0))
}

static WARNED_FIXED: AtomicBool = AtomicBool::new(false);
static WARNED_RELEASE: AtomicBool = AtomicBool::new(false);

fn warn_once(flag: &AtomicBool, msg: &str) {
    if !flag.swap(true, Relaxed) {
        attune::log::emit(attune::log::Level::Warn, msg);
    }
}

fn map_failed(e: i32) -> *mut c_void {
    alloc::set_errno(e);
    libc::MAP_FAILED
}

// `mmap` and `mmap64` pass on their caller's return address: a mapping the program's
// allocator asks for is its heap (`attune_policy::delivery::mapping`).
attune_sys::mmap_entry_with_caller!(mmap, mmap_from);
attune_sys::mmap_entry_with_caller!(mmap64, mmap_from);

extern "C" fn mmap_from(
    addr: *mut c_void,
    len: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: off_t,
    caller: usize,
) -> *mut c_void {
    let addr = addr as usize;
    let plain = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
    let allowed = plain | libc::MAP_NORESERVE;
    if addr == 0
        && flags & plain == plain
        && flags & !allowed == 0
        && prot == libc::PROT_READ | libc::PROT_WRITE
        && len > 0
    {
        let p = managed_fresh(len, true, Some(caller)).0;
        if p != 0 {
            return p as *mut c_void;
        }
    }
    if flags & libc::MAP_FIXED != 0 && len > 0 {
        if table::overlaps(addr, len) {
            return fixed_over_managed(addr, len, prot, flags, fd, off);
        }
        if fresh_anon(flags)
            && prot == libc::PROT_READ | libc::PROT_WRITE
            && addr % PAGE == 0
            && managed_at(addr, len, caller)
        {
            return addr as *mut c_void;
        }
    }
    match mem::raw_mmap(addr, len, prot, flags, fd, off) {
        Ok(p) => p as *mut c_void,
        Err(e) => map_failed(e.0),
    }
}

/// `MAP_FIXED` flags that ask for nothing but fresh private anonymous memory (what the
/// runtime's regions are): a heap committed or decommitted in place.
fn fresh_anon(flags: c_int) -> bool {
    let plain = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
    flags & plain == plain && flags & !(plain | libc::MAP_FIXED | libc::MAP_NORESERVE) == 0
}

/// Requests of fresh memory at a fixed address that became regions (`ADOPTED`).
pub static ADOPTED: AtomicU64 = AtomicU64::new(0);

/// A heap reserved `PROT_NONE` and committed in place with `MAP_FIXED` (the JVM's: each
/// expansion maps fresh memory over part of its reservation) becomes a region at that
/// address, under the same rules as any large mapping. False: the kernel maps it.
fn managed_at(addr: usize, len: usize, caller: usize) -> bool {
    let Some(len) = round_page(len) else {
        return false;
    };
    let s = settings();
    if len < THRESHOLD.load(Relaxed) || len < s.threshold {
        return false;
    }
    let Some(_b) = Busy::enter() else {
        return false;
    };
    if !ready() || attune::runtime::runtime().is_err() {
        return false;
    }
    let Some(fault_mode) = region_delivery(Some(caller)) else {
        return false;
    };
    let opts = AllocOptions {
        own_region: true,
        fault_mode,
        ..Default::default()
    };
    match attune::runtime::adopt(addr, len, s.flags_for(len).0, opts) {
        Ok(()) => {
            table::insert(addr, len, true);
            SERVED.fetch_add(1, Relaxed);
            ADOPTED.fetch_add(1, Relaxed);
            true
        }
        Err(_) => false,
    }
}

/// `mmap` with `MAP_FIXED` over managed memory (docs/design/run.md, "Heaps committed in
/// place"). Fresh private anonymous memory keeps the region: the range is dropped (it
/// reads as zero) and takes the protection asked for, as the kernel's new mapping
/// would (a JVM decommits and commits its heap so). Any other mapping (a file, shared
/// memory) first gives each region it touches back to the kernel in place, since the
/// runtime must never move pages into a mapping it does not own. A region partly
/// unmapped before is refused (EINVAL): which of its bytes the program still holds is
/// not known here.
fn fixed_over_managed(
    addr: usize,
    len: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: off_t,
) -> *mut c_void {
    let refuse = || {
        warn_once(
            &WARNED_FIXED,
            "attune run: MAP_FIXED over a managed mapping that was partly unmapped before refused (EINVAL); set ATTUNE_RUN_THRESHOLD above this program's mapping sizes",
        );
        map_failed(libc::EINVAL)
    };
    let Some(rlen) = round_page(len) else {
        return map_failed(libc::ENOMEM);
    };
    if addr % PAGE != 0 {
        return map_failed(libc::EINVAL);
    }
    let pieces = table::pieces(addr, rlen);
    if pieces.iter().any(|p| p.base.is_some() && !p.whole) {
        return refuse();
    }
    if fresh_anon(flags) {
        for p in &pieces {
            let done = match p.base {
                Some(_) => {
                    let _b = Busy::enter();
                    mem::protect(p.start, p.len, libc::PROT_READ | libc::PROT_WRITE)
                        .and_then(|()| attune::runtime::discard(p.start, p.len))
                        .and_then(|()| mem::protect(p.start, p.len, prot))
                }
                None => mem::raw_mmap(p.start, p.len, prot, flags, fd, 0).map(|_| ()),
            };
            if let Err(e) = done {
                return map_failed(e.0);
            }
        }
        return addr as *mut c_void;
    }
    for p in &pieces {
        if let Some(b) = p.base {
            let _b = Busy::enter();
            if attune::runtime::release(b).is_err() {
                warn_once(
                    &WARNED_RELEASE,
                    "attune run: MAP_FIXED over managed memory refused (EINVAL): a page of it could not be brought back to give the region to the kernel",
                );
                return map_failed(libc::EINVAL);
            }
            table::forget(b);
            RELEASED.fetch_add(1, Relaxed);
        }
    }
    match mem::raw_mmap(addr, len, prot, flags, fd, off) {
        Ok(p) => p as *mut c_void,
        Err(e) => map_failed(e.0),
    }
}

/// Regions given back to the kernel in place for another mapping over them.
pub static RELEASED: AtomicU64 = AtomicU64::new(0);

fn status(r: Result<(), attune_sys::Errno>) -> c_int {
    match r {
        Ok(()) => 0,
        Err(e) => {
            alloc::set_errno(e.0);
            -1
        }
    }
}

#[no_mangle]
pub extern "C" fn munmap(addr: *mut c_void, len: usize) -> c_int {
    unmap(addr, len)
}

/// `munmap`'s work, called by name from `mremap`: a call to the exported `munmap` from
/// inside this library is bound to the raw `__wrap_munmap` at link time (build.rs's
/// `--wrap`), which unmapped a managed region behind the runtime's back.
fn unmap(addr: *mut c_void, len: usize) -> c_int {
    let addr = addr as usize;
    if addr % PAGE != 0 || len == 0 {
        return status(mem::raw_munmap(addr, len));
    }
    let u = table::unmap(addr, round_page(len).unwrap_or(len));
    if !u.touched_managed {
        return status(mem::raw_munmap(addr, len));
    }
    // A partly unmapped managed mapping stays reserved until its last byte goes (its
    // address range cannot be reused meanwhile; docs/design/run.md).
    for (b, inherited) in u.free {
        if inherited {
            // The parent's range, reserved in this child (table::after_fork_in_child).
            let _ = mem::raw_munmap(b.max(addr), len);
        } else {
            let _b = Busy::enter();
            let _ = attune::runtime::free(b);
        }
    }
    // The unmapped part of a mapping that stays: its content goes now (DRAM and far-tier
    // space), though its addresses stay reserved until the last byte goes.
    for (a, l) in u.parts {
        let _b = Busy::enter();
        let _ = attune::runtime::discard(a, l);
    }
    let mut r = Ok(());
    for (a, l) in u.gaps {
        r = r.and(mem::raw_munmap(a, l));
    }
    status(r)
}

#[no_mangle]
pub extern "C" fn mremap(
    old: *mut c_void,
    old_len: usize,
    new_len: usize,
    flags: c_int,
    new_addr: *mut c_void,
) -> *mut c_void {
    // mremap is variadic in C; on x86-64 and aarch64 the optional fifth argument arrives
    // in the fifth argument register, read only with MREMAP_FIXED (as the kernel does).
    let old = old as usize;
    let Some(e) = (old % PAGE == 0).then(|| table::get(old)).flatten() else {
        return match mem::raw_mremap(old, old_len, new_len, flags, new_addr as usize) {
            Ok(p) => p as *mut c_void,
            Err(e) => map_failed(e.0),
        };
    };
    if flags & !libc::MREMAP_MAYMOVE != 0 || new_len == 0 || e.inherited {
        return map_failed(libc::EINVAL);
    }
    let Some(new_len) = round_page(new_len) else {
        return map_failed(libc::ENOMEM);
    };
    if new_len <= e.size {
        if new_len < e.size {
            // The cut-off tail's content goes (a later growth in place reads zeros there,
            // as the kernel's would).
            let u = table::unmap(old + new_len, e.size - new_len);
            for (a, l) in u.parts {
                let _b = Busy::enter();
                let _ = attune::runtime::discard(a, l);
            }
        }
        return old as *mut c_void;
    }
    if flags & libc::MREMAP_MAYMOVE == 0 {
        return map_failed(libc::ENOMEM);
    }
    // The moved mapping's caller is unknown here (0): the program's own mapping, whose
    // rule under kernel faults is the allocator's too; the allocator's mappings where
    // kernel faults are not served were never managed, so never reach this.
    let q = mmap_from(
        std::ptr::null_mut(),
        new_len,
        libc::PROT_READ | libc::PROT_WRITE,
        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
        -1,
        0,
        0,
    );
    if q == libc::MAP_FAILED {
        return q;
    }
    alloc::copy(q as usize, old, e.size);
    unmap(old as *mut c_void, e.size);
    q
}

#[no_mangle]
pub extern "C" fn madvise(addr: *mut c_void, len: usize, advice: c_int) -> c_int {
    let addr = addr as usize;
    if advice == libc::MADV_HUGEPAGE && table::overlaps(addr, len) {
        return 0;
    }
    let drops = matches!(
        advice,
        libc::MADV_DONTNEED | libc::MADV_FREE | libc::MADV_REMOVE
    );
    if drops && addr % PAGE == 0 && len > 0 && table::within_one(addr, len) {
        // The kernel's advice cannot reach pages held in a far tier (not mapped): their
        // old content would come back. The runtime drops them (they read as zero).
        if let (Some(l), Some(_b)) = (round_page(len), Busy::enter()) {
            if attune::runtime::discard(addr, l).is_ok() {
                return 0;
            }
        }
    }
    status(mem::advise(addr, len, advice))
}

/// The program's threads run behind the runtime's hooks once it installs them (the
/// program clock of `attune profile`: `attune_sys::threads`); until then libc's.
#[no_mangle]
pub extern "C" fn pthread_create(
    thread: *mut libc::pthread_t,
    attr: *const libc::pthread_attr_t,
    start: attune_sys::threads::StartRoutine,
    arg: *mut c_void,
) -> c_int {
    attune_sys::threads::create(thread, attr, start, arg)
}

// The C API (allocate_TM, attune_*, the phase marks) is libattune's, linked into this
// library: a program linked against libattune.so binds to these definitions first (the
// preload comes first in the lookup order), so its own calls and its large mallocs share
// one runtime, one budget and one statistics file (`attune run`, `attune profile`).
#[allow(unused_imports)]
use capi as _;
