//! The allocators the `attune run` interposer stands in front of.
//!
//! The interposer exports `malloc` & co. itself, so whatever it does not manage must go
//! on without passing through those symbols again. Two allocators are reached:
//!
//! * **The program's allocator** ([`malloc`], [`free`], [`realloc`], ... at the top of
//!   this module): the next definition of `malloc` after the interposer in the lookup
//!   order, that is glibc's, or jemalloc's, tcmalloc's or mimalloc's when the program
//!   links one. Every pointer the program gets that the runtime does not manage comes
//!   from it, and goes back to it: asking one allocator about another's pointer crashes
//!   (a jemalloc-linked program died at start when `malloc_usable_size` went to jemalloc
//!   for a glibc block). The whole family is taken from the one library that defines
//!   `malloc` ([`resolve`]): `dlsym(RTLD_NEXT, "pvalloc")` would find glibc's where
//!   jemalloc has none, and mix the two again.
//! * **glibc's own heap under its internal names** (`__libc_malloc`, ...), only for the
//!   interposer's and the runtime's own data ([`LibcAllocator`]); no such block is ever
//!   handed to the program.
//!
//! **The runtime never calls the program's allocator.** jemalloc and tcmalloc call
//! `mmap` (the interposer's) while holding their own locks; a runtime that then called
//! their `malloc` (through `opendir`, `pthread_create`, ...) deadlocked on that lock, and
//! the runtime's threads taking their locks in the other order could too. So on a thread
//! inside the runtime ([`enter_runtime`], [`mark_runtime_thread`]) the family below
//! serves glibc's heap instead and remembers each such block (a fixed table, only while
//! the program's allocator is not glibc's), so that [`free`], [`realloc`] and
//! [`usable_size`] send every pointer back to the heap it came from, on any thread.
//!
//! Contract: addresses are `usize`; a pointer given to [`free`], [`realloc`] or
//! [`usable_size`] must have come from the program's allocator through this module (or
//! from the program itself, not managed by the runtime). `copy` copies between two
//! ranges the caller owns and that do not overlap.

use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering::*};

extern "C" {
    fn __libc_malloc(size: usize) -> *mut libc::c_void;
    fn __libc_calloc(n: usize, size: usize) -> *mut libc::c_void;
    fn __libc_realloc(p: *mut libc::c_void, size: usize) -> *mut libc::c_void;
    fn __libc_memalign(align: usize, size: usize) -> *mut libc::c_void;
    fn __libc_free(p: *mut libc::c_void);
}

// ---- The program's allocator -------------------------------------------------------

const UNRESOLVED: u8 = 0;
const RESOLVING: u8 = 1;
const RESOLVED: u8 = 2;
static STATE: AtomicU8 = AtomicU8::new(UNRESOLVED);
/// The thread running [`resolve`]: its own allocations meanwhile (dlsym may allocate)
/// come from the bootstrap arena; other threads wait the few microseconds it takes.
static RESOLVER: AtomicUsize = AtomicUsize::new(0);

/// The family's entry points, in this order; 0 where the library has none.
const MALLOC: usize = 0;
const FREE: usize = 1;
const CALLOC: usize = 2;
const REALLOC: usize = 3;
const MEMALIGN: usize = 4;
const POSIX_MEMALIGN: usize = 5;
const ALIGNED_ALLOC: usize = 6;
const USABLE: usize = 7;
const NAMES: [&std::ffi::CStr; 8] = [
    c"malloc",
    c"free",
    c"calloc",
    c"realloc",
    c"memalign",
    c"posix_memalign",
    c"aligned_alloc",
    c"malloc_usable_size",
];
static FNS: [AtomicUsize; 8] = [const { AtomicUsize::new(0) }; 8];
/// The path of the library that defines the family (dladdr's `dli_fname`, owned by the
/// dynamic linker for the process's life), 0 for glibc's fallback.
static LIB_NAME: AtomicUsize = AtomicUsize::new(0);

/// Allocations made by the resolving thread while it resolves: a static bump arena, a
/// 16-byte header with the size before each block. Never freed (a few hundred bytes in
/// practice); its blocks are recognised by address in `free`, `realloc`, `usable_size`.
const BOOT_SIZE: usize = 256 << 10;
#[repr(C, align(4096))]
struct Boot(std::cell::UnsafeCell<[u8; BOOT_SIZE]>);
// SAFETY: blocks are carved out by an atomic bump pointer; each is owned by one caller.
unsafe impl Sync for Boot {}
static BOOT: Boot = Boot(std::cell::UnsafeCell::new([0; BOOT_SIZE]));
static BOOT_USED: AtomicUsize = AtomicUsize::new(0);

fn boot_base() -> usize {
    BOOT.0.get() as usize
}
fn in_boot(p: usize) -> bool {
    p >= boot_base() && p < boot_base() + BOOT_SIZE
}
fn boot_alloc(align: usize, size: usize) -> usize {
    let align = align.max(16);
    loop {
        let used = BOOT_USED.load(Relaxed);
        let start = (boot_base() + used + 16 + align - 1) & !(align - 1);
        let Some(end) = start.checked_add(size) else {
            return 0;
        };
        if end > boot_base() + BOOT_SIZE {
            return 0;
        }
        if BOOT_USED
            .compare_exchange(used, end - boot_base(), AcqRel, Relaxed)
            .is_ok()
        {
            // SAFETY: [start-16, end) lies inside BOOT and belongs to this call alone.
            unsafe { *((start - 16) as *mut usize) = size };
            return start;
        }
    }
}
fn boot_size(p: usize) -> usize {
    // SAFETY: p is a block of boot_alloc, whose header precedes it.
    unsafe { *((p - 16) as *const usize) }
}

fn this_thread() -> usize {
    // SAFETY: pthread_self has no preconditions.
    unsafe { libc::pthread_self() as usize }
}

/// The base address of the object that defines code address `f` (0 if none).
fn object_of(f: usize) -> (usize, usize) {
    // SAFETY: dladdr only reads the dynamic linker's tables; info is plain data.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    if f == 0 || unsafe { libc::dladdr(f as *const libc::c_void, &mut info) } == 0 {
        return (0, 0);
    }
    (info.dli_fbase as usize, info.dli_fname as usize)
}

/// Finds the program's allocator: `malloc` next in the lookup order after this library,
/// and the rest of the family from the same object only. Called on the first request;
/// idempotent and thread-safe.
pub fn resolve() {
    if STATE.load(Acquire) == RESOLVED {
        return;
    }
    if STATE
        .compare_exchange(UNRESOLVED, RESOLVING, AcqRel, Acquire)
        .is_err()
    {
        if RESOLVER.load(Acquire) == this_thread() {
            return; // re-entered from dlsym: the caller serves from the bootstrap arena
        }
        while STATE.load(Acquire) != RESOLVED {
            std::thread::yield_now();
        }
        return;
    }
    RESOLVER.store(this_thread(), Release);
    let lookup = |name: &std::ffi::CStr| {
        // SAFETY: dlsym with a valid NUL-terminated name; the result is the address of
        // a function of the documented signature, or null.
        unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) as usize }
    };
    let m = lookup(NAMES[MALLOC]);
    let (base, fname) = object_of(m);
    let mut found = [0usize; 8];
    if base != 0 {
        for (i, name) in NAMES.iter().enumerate() {
            let f = lookup(name);
            if f != 0 && object_of(f).0 == base {
                found[i] = f;
            }
        }
    }
    if found[MALLOC] == 0 || found[FREE] == 0 || found[REALLOC] == 0 {
        // No usable family after us (cannot happen with a dynamic glibc): glibc's heap.
        found = [0; 8];
        found[MALLOC] = __libc_malloc as *const () as usize;
        found[FREE] = __libc_free as *const () as usize;
        found[CALLOC] = __libc_calloc as *const () as usize;
        found[REALLOC] = __libc_realloc as *const () as usize;
        found[MEMALIGN] = __libc_memalign as *const () as usize;
        LIB_NAME.store(0, Release);
    } else {
        LIB_NAME.store(fname, Release);
    }
    let same_heap = found[MALLOC] == __libc_malloc as *const () as usize
        || object_of(found[MALLOC]).0 == object_of(__libc_malloc as *const () as usize).0;
    if !same_heap {
        add_heap_code(found[MALLOC]);
    }
    let (_, libc_name) = object_of(__libc_malloc as *const () as usize);
    SAME_HEAP.store(same_heap, Release);
    if libc_name != 0 {
        // SAFETY: libc_name is the loaded libc's path (dladdr); RTLD_NOLOAD only returns
        // a handle to it, and dlsym on that handle searches libc and its dependencies.
        let f = unsafe {
            let h = libc::dlopen(
                libc_name as *const libc::c_char,
                libc::RTLD_LAZY | libc::RTLD_NOLOAD,
            );
            if h.is_null() {
                0
            } else {
                libc::dlsym(h, c"malloc_usable_size".as_ptr()) as usize
            }
        };
        LIBC_USABLE.store(f, Release);
    }
    for (slot, f) in FNS.iter().zip(found) {
        slot.store(f, Release);
    }
    STATE.store(RESOLVED, Release);
}

// ---- Runtime context: glibc's heap, remembered -------------------------------------

thread_local! {
    /// Inside the runtime: 0 no, 1 in an `enter_runtime` section, 2 a runtime thread.
    static IN_RUNTIME: std::cell::Cell<u8> = const { std::cell::Cell::new(0) };
}

/// Marks this thread as inside the runtime until [`leave_runtime`]; false (and nothing
/// changed) if it already was (a re-entry the caller must not serve).
pub fn enter_runtime() -> bool {
    IN_RUNTIME.with(|c| {
        if c.get() != 0 {
            false
        } else {
            c.set(1);
            true
        }
    })
}

/// Ends the section [`enter_runtime`] opened (a runtime thread stays inside).
pub fn leave_runtime() {
    IN_RUNTIME.with(|c| {
        if c.get() == 1 {
            c.set(0)
        }
    })
}

/// Marks this thread as the runtime's own for its whole life (evictor, fault handler,
/// report, daemon client): the first call of its body.
pub fn mark_runtime_thread() {
    IN_RUNTIME.with(|c| c.set(2));
}

/// Whether this thread is inside the runtime.
#[inline]
pub fn in_runtime() -> bool {
    IN_RUNTIME.with(|c| c.get() != 0)
}

/// Whether this request must go to glibc's heap instead of the program's allocator:
/// only when they differ. `SAME_HEAP` is read first so that a program on glibc's
/// allocator pays no thread-local read (a `__tls_get_addr` call in a preloaded library)
/// on every request; the overhead comparison is in docs/benchmarks-history.md, "`attune run`
/// under signal delivery, and the interposer's new layers".
#[inline]
fn runtime_heap() -> bool {
    !SAME_HEAP.load(Relaxed) && in_runtime()
}

/// True when the program's allocator is glibc's own: then no block needs remembering.
static SAME_HEAP: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);
/// glibc's `malloc_usable_size`, from libc's own object (not the program's).
static LIBC_USABLE: AtomicUsize = AtomicUsize::new(0);

/// glibc blocks handed out inside the runtime while the program's allocator is another:
/// open addressing with linear probing, 0 empty, 1 a removed entry. Inserts, removals
/// and compaction (which clears the removed entries once they crowd the table) hold a
/// spin flag; lookups take no lock and retry when a compaction ran meanwhile (`VERSION`
/// odd during one), as a sequence lock's readers do. Only a compaction moves entries,
/// and a live block's address belongs to one heap alone, so a lookup never races with
/// the insertion of the address it looks for. A table still 3/4 full of live blocks
/// remembers no more: the runtime's blocks then come from the program's allocator.
const TRACK_SLOTS: usize = 8192;
static TRACKED: [AtomicUsize; TRACK_SLOTS] = [const { AtomicUsize::new(0) }; TRACK_SLOTS];
static TRACKED_LIVE: AtomicUsize = AtomicUsize::new(0);
/// Slots not empty: live and removed entries.
static TRACKED_USED: AtomicUsize = AtomicUsize::new(0);
static TRACK_LOCK: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
static VERSION: AtomicUsize = AtomicUsize::new(0);

fn slot_of(p: usize) -> usize {
    (p >> 4).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - 13)
}

fn track_lock() {
    while TRACK_LOCK
        .compare_exchange_weak(false, true, Acquire, Relaxed)
        .is_err()
    {
        std::hint::spin_loop();
    }
}

fn track_unlock() {
    TRACK_LOCK.store(false, Release);
}

/// Puts `p` in the first empty or removed slot of its probe (lock held).
fn place(p: usize) {
    let mut i = slot_of(p);
    while TRACKED[i].load(Relaxed) > 1 {
        i = (i + 1) % TRACK_SLOTS;
    }
    if TRACKED[i].load(Relaxed) == 0 {
        TRACKED_USED.fetch_add(1, Relaxed);
    }
    TRACKED[i].store(p, Release);
}

/// Rebuilds the table without its removed entries (lock held; live <= 1/4 of the slots,
/// so they fit on the stack: this runs inside malloc, where nothing may be allocated).
fn compact() {
    let mut live = [0usize; TRACK_SLOTS / 4];
    let mut n = 0;
    for s in TRACKED.iter() {
        let v = s.load(Relaxed);
        if v > 1 && n < live.len() {
            live[n] = v;
            n += 1;
        }
    }
    VERSION.fetch_add(1, AcqRel); // odd: lookups wait
    for s in TRACKED.iter() {
        s.store(0, Relaxed);
    }
    TRACKED_USED.store(0, Relaxed);
    for &v in &live[..n] {
        place(v);
    }
    VERSION.fetch_add(1, AcqRel); // even again
}

fn track(p: usize) -> bool {
    track_lock();
    if TRACKED_USED.load(Relaxed) >= TRACK_SLOTS * 3 / 4
        && TRACKED_LIVE.load(Relaxed) <= TRACK_SLOTS / 4
    {
        compact();
    }
    let ok = TRACKED_USED.load(Relaxed) < TRACK_SLOTS * 3 / 4;
    if ok {
        place(p);
        TRACKED_LIVE.fetch_add(1, Release);
    }
    track_unlock();
    ok
}

/// The slot of `p` as the table is now (callers hold the lock, or check `VERSION`).
fn probe(p: usize) -> Option<usize> {
    let mut i = slot_of(p);
    for _ in 0..TRACK_SLOTS {
        match TRACKED[i].load(Acquire) {
            0 => return None,
            v if v == p => return Some(i),
            _ => i = (i + 1) % TRACK_SLOTS,
        }
    }
    None
}

/// Whether `p` is a remembered glibc block; removes it when `take`.
#[inline]
fn tracked(p: usize, take: bool) -> bool {
    if p < 2 || TRACKED_LIVE.load(Acquire) == 0 {
        return false;
    }
    if take {
        // A lookup without the lock first: frees of the program's own blocks never
        // take it.
        if !tracked(p, false) {
            return false;
        }
        track_lock();
        let i = probe(p);
        if let Some(i) = i {
            TRACKED[i].store(1, Release);
            TRACKED_LIVE.fetch_sub(1, Release);
        }
        track_unlock();
        return i.is_some();
    }
    loop {
        let v = VERSION.load(Acquire);
        if v & 1 == 1 {
            std::hint::spin_loop();
            continue;
        }
        let found = probe(p).is_some();
        std::sync::atomic::fence(Acquire);
        if VERSION.load(Relaxed) == v {
            return found;
        }
    }
}

/// A block of glibc's heap for code inside the runtime, remembered if needed; 0 when
/// the table is full (the caller then uses the program's allocator).
fn runtime_block(p: usize) -> usize {
    if p == 0 || SAME_HEAP.load(Relaxed) || track(p) {
        return p;
    }
    libc_free(p);
    0
}

/// The entry point `i`, resolving first; None while this thread is resolving.
#[inline]
fn entry(i: usize) -> Option<usize> {
    if STATE.load(Acquire) != RESOLVED {
        resolve();
        if STATE.load(Acquire) != RESOLVED {
            return None;
        }
    }
    Some(FNS[i].load(Relaxed))
}

/// Code spans of the objects that map heaps of small objects through `mmap` (start, end;
/// 0 and 0 free): the program's allocator when it is not glibc's (jemalloc's, tcmalloc's,
/// mimalloc's library, or the executable that defines `malloc`; set when resolved), and
/// the objects that define the symbols `add_heap_owner` was given (CPython's arenas).
/// glibc's own arenas use its internal `mmap` and never reach the interposer.
static HEAP_CODE: [(AtomicUsize, AtomicUsize); 4] =
    [const { (AtomicUsize::new(0), AtomicUsize::new(0)) }; 4];

/// Records the code span of the object that holds code address `f`, once.
fn add_heap_code(f: usize) {
    let Some((lo, hi)) = crate::elf::code_span(f) else {
        return;
    };
    for (a, b) in &HEAP_CODE {
        if a.load(Acquire) == lo {
            return;
        }
        if a.compare_exchange(0, lo, AcqRel, Acquire).is_ok() {
            b.store(hi, Release);
            return;
        }
    }
}

/// Records the object that defines `name` (looked up from the program's scope) as one
/// that maps heaps; nothing when no object defines it. Takes the loader's lock.
pub fn add_heap_owner(name: &std::ffi::CStr) {
    // SAFETY: dlsym with a valid NUL-terminated name only reads the loader's tables.
    let f = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) } as usize;
    if f != 0 {
        add_heap_code(f);
    }
}

/// Whether code address `pc` (a caller's return address) lies in an object that maps
/// heaps of small objects: a mapping it asks for is such a heap.
#[inline]
pub fn is_heap_code(pc: usize) -> bool {
    HEAP_CODE.iter().any(|(a, b)| {
        let lo = a.load(Relaxed);
        lo != 0 && pc >= lo && pc < b.load(Relaxed)
    })
}

/// The file name of the library whose allocator serves the program's unmanaged blocks
/// (`libc.so.6` for glibc, `libjemalloc.so.2`, ...), once resolved.
pub fn program_allocator() -> Option<String> {
    if STATE.load(Acquire) != RESOLVED {
        return None;
    }
    let p = LIB_NAME.load(Acquire);
    if p == 0 {
        return Some("glibc (internal)".into());
    }
    // SAFETY: dli_fname points to a NUL-terminated string the dynamic linker keeps for
    // the object's life; the allocator's library is never unloaded.
    let s = unsafe { std::ffi::CStr::from_ptr(p as *const libc::c_char) };
    let s = s.to_string_lossy();
    Some(s.rsplit('/').next().unwrap_or(&s).to_string())
}

pub fn malloc(size: usize) -> usize {
    if runtime_heap() {
        let p = runtime_block(libc_malloc(size));
        if p != 0 {
            return p;
        }
    }
    let Some(f) = entry(MALLOC) else {
        return boot_alloc(16, size);
    };
    // SAFETY: f is the family's malloc (resolve).
    let f: extern "C" fn(usize) -> *mut libc::c_void = unsafe { std::mem::transmute(f) };
    f(size) as usize
}

pub fn calloc(n: usize, size: usize) -> usize {
    if runtime_heap() {
        // SAFETY: glibc checks the multiplication for overflow.
        let p = runtime_block(unsafe { __libc_calloc(n, size) as usize });
        if p != 0 {
            return p;
        }
    }
    let Some(f) = entry(CALLOC) else {
        // The arena is static and never reused: its bytes are still zero.
        return n.checked_mul(size).map_or(0, |t| boot_alloc(16, t));
    };
    if f == 0 {
        let Some(t) = n.checked_mul(size) else {
            return 0;
        };
        let p = malloc(t);
        if p != 0 {
            zero(p, t);
        }
        return p;
    }
    // SAFETY: f is the family's calloc (resolve).
    let f: extern "C" fn(usize, usize) -> *mut libc::c_void = unsafe { std::mem::transmute(f) };
    f(n, size) as usize
}

/// A block aligned to `align` (a power of two), from the program's allocator.
pub fn memalign(align: usize, size: usize) -> usize {
    if runtime_heap() {
        let p = runtime_block(libc_memalign(align, size));
        if p != 0 {
            return p;
        }
    }
    let Some(f) = entry(MEMALIGN) else {
        return boot_alloc(align, size);
    };
    if f != 0 {
        // SAFETY: f is the family's memalign (resolve).
        let f: extern "C" fn(usize, usize) -> *mut libc::c_void = unsafe { std::mem::transmute(f) };
        return f(align, size) as usize;
    }
    let pm = FNS[POSIX_MEMALIGN].load(Relaxed);
    if pm != 0 {
        let mut out: *mut libc::c_void = std::ptr::null_mut();
        // SAFETY: pm is the family's posix_memalign; out is a valid out-parameter.
        let f: extern "C" fn(*mut *mut libc::c_void, usize, usize) -> i32 =
            unsafe { std::mem::transmute(pm) };
        let e = f(&mut out, align.max(std::mem::size_of::<usize>()), size);
        if e != 0 {
            set_errno(e);
        }
        return out as usize;
    }
    let aa = FNS[ALIGNED_ALLOC].load(Relaxed);
    if aa != 0 {
        // SAFETY: aa is the family's aligned_alloc; the size is a multiple of align (C11).
        let f: extern "C" fn(usize, usize) -> *mut libc::c_void =
            unsafe { std::mem::transmute(aa) };
        return match size.checked_add(align - 1) {
            Some(s) => f(align, s & !(align - 1)) as usize,
            None => 0,
        };
    }
    set_errno(libc::ENOMEM);
    0
}

/// `p` must be null or a live block of the program's allocator.
pub fn realloc(p: usize, size: usize) -> usize {
    if in_boot(p) {
        let q = malloc(size);
        if q != 0 {
            copy(q, p, boot_size(p).min(size));
        }
        return q;
    }
    if tracked(p, false) {
        // Rare (a runtime block grown): a new block from the heap this context uses.
        let old = usable_size(p).unwrap_or(0);
        let q = malloc(size);
        if q != 0 {
            copy(q, p, old.min(size));
            free(p);
        }
        return q;
    }
    if p == 0 && runtime_heap() {
        return malloc(size);
    }
    let Some(f) = entry(REALLOC) else {
        return 0;
    };
    // SAFETY: contract above; f is the family's realloc.
    let f: extern "C" fn(*mut libc::c_void, usize) -> *mut libc::c_void =
        unsafe { std::mem::transmute(f) };
    f(p as *mut libc::c_void, size) as usize
}

/// `p` must be null or a live block of the program's allocator.
pub fn free(p: usize) {
    if p == 0 || in_boot(p) {
        return;
    }
    if tracked(p, true) {
        libc_free(p);
        return;
    }
    let Some(f) = entry(FREE) else {
        return;
    };
    // SAFETY: contract above; f is the family's free.
    let f: extern "C" fn(*mut libc::c_void) = unsafe { std::mem::transmute(f) };
    f(p as *mut libc::c_void)
}

/// Usable size of a live block of the program's allocator; None where its library has
/// no `malloc_usable_size`.
pub fn usable_size(p: usize) -> Option<usize> {
    if p == 0 {
        return Some(0);
    }
    if in_boot(p) {
        return Some(boot_size(p));
    }
    if tracked(p, false) {
        let f = LIBC_USABLE.load(Acquire);
        if f == 0 {
            return None;
        }
        // SAFETY: f is glibc's malloc_usable_size; p is a live block of glibc's heap.
        let f: extern "C" fn(*mut libc::c_void) -> usize = unsafe { std::mem::transmute(f) };
        return Some(f(p as *mut libc::c_void));
    }
    let f = entry(USABLE)?;
    if f == 0 {
        return None;
    }
    // SAFETY: contract above; f is the family's malloc_usable_size.
    let f: extern "C" fn(*mut libc::c_void) -> usize = unsafe { std::mem::transmute(f) };
    Some(f(p as *mut libc::c_void))
}

// ---- glibc's heap, for the interposer's own data ------------------------------------

fn libc_malloc(size: usize) -> usize {
    // SAFETY: glibc's allocator has no preconditions on the size.
    unsafe { __libc_malloc(size) as usize }
}
fn libc_memalign(align: usize, size: usize) -> usize {
    // SAFETY: glibc validates the alignment (EINVAL, NULL).
    unsafe { __libc_memalign(align, size) as usize }
}
fn libc_free(p: usize) {
    // SAFETY: p is null or a block of glibc's heap (LibcAllocator's own).
    unsafe { __libc_free(p as *mut libc::c_void) }
}

/// Copies `n` bytes between two non-overlapping ranges the caller owns (realloc).
pub fn copy(dst: usize, src: usize, n: usize) {
    // SAFETY: contract above; both ranges are mapped and writable/readable for n bytes.
    unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst as *mut u8, n) }
}

/// A Rust global allocator over glibc's internal entry points: the interposer's own
/// data structures must not re-enter its exported `malloc`, nor depend on the program's
/// allocator (which may itself call `mmap`, and so the interposer).
pub struct LibcAllocator;

// SAFETY: every method forwards to glibc with the layout's size and alignment.
unsafe impl std::alloc::GlobalAlloc for LibcAllocator {
    unsafe fn alloc(&self, l: std::alloc::Layout) -> *mut u8 {
        if l.align() <= 16 {
            libc_malloc(l.size()) as *mut u8
        } else {
            libc_memalign(l.align(), l.size()) as *mut u8
        }
    }
    unsafe fn alloc_zeroed(&self, l: std::alloc::Layout) -> *mut u8 {
        if l.align() <= 16 {
            __libc_calloc(1, l.size()) as *mut u8
        } else {
            let p = libc_memalign(l.align(), l.size());
            if p != 0 {
                std::ptr::write_bytes(p as *mut u8, 0, l.size());
            }
            p as *mut u8
        }
    }
    unsafe fn dealloc(&self, p: *mut u8, _l: std::alloc::Layout) {
        libc_free(p as usize)
    }
    unsafe fn realloc(&self, p: *mut u8, l: std::alloc::Layout, new: usize) -> *mut u8 {
        if l.align() <= 16 {
            __libc_realloc(p as *mut libc::c_void, new) as *mut u8
        } else {
            let q = libc_memalign(l.align(), new);
            if q != 0 {
                copy(q, p as usize, l.size().min(new));
                libc_free(p as usize);
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

/// A function defined after the interposer in the lookup order, looked up by name on
/// first use: the program's allocator's own API (jemalloc's `sdallocx`, tcmalloc's
/// `tc_free`, ...), which the interposer exports too so that pointers the runtime
/// manages never reach that allocator. A call of a name nothing else defines cannot
/// happen (the program linked it); if it does, the process aborts with the name.
pub struct NextFn {
    name: &'static std::ffi::CStr,
    addr: AtomicUsize,
}

macro_rules! next_calls {
    ($($fn_name:ident($($arg:ident: $ty:ty),*) -> $ret:ty;)*) => {
        impl NextFn {
            $(
                /// Calls the function with this signature (the caller names the right one).
                pub fn $fn_name(&self, $($arg: $ty),*) -> $ret {
                    let f = self.get();
                    // SAFETY: f is the address of the named function, whose C signature
                    // is the one this method is named for (the caller's contract).
                    let f: extern "C" fn($($ty),*) -> $ret = unsafe { std::mem::transmute(f) };
                    f($($arg),*)
                }
            )*
        }
    };
}

impl NextFn {
    pub const fn new(name: &'static std::ffi::CStr) -> NextFn {
        NextFn {
            name,
            addr: AtomicUsize::new(0),
        }
    }
    /// Looks the definition up now (`dlsym`, the loader's lock), so that the first call
    /// later does not: see `resolve_at_load` in libattune's io.rs.
    pub fn resolve(&self) {
        self.get();
    }
    /// The definition's address (looked up now if it was not yet), for a caller that
    /// calls it with a signature no method here has.
    pub fn addr(&self) -> usize {
        self.get()
    }
    fn get(&self) -> usize {
        let f = self.addr.load(Acquire);
        if f != 0 {
            return f;
        }
        // SAFETY: dlsym with a valid NUL-terminated name.
        let f = unsafe { libc::dlsym(libc::RTLD_NEXT, self.name.as_ptr()) as usize };
        if f == 0 {
            let msg = format!(
                "attune: {} is called but no library defines it\n",
                self.name.to_string_lossy()
            );
            // SAFETY: write(2) of a valid buffer; abort has no preconditions.
            unsafe {
                crate::raw::write(2, msg.as_ptr().cast(), msg.len());
                libc::abort();
            }
        }
        self.addr.store(f, Release);
        f
    }
}

next_calls! {
    void_p(p: usize) -> ();
    void_pi(p: usize, i: i32) -> ();
    void_pz(p: usize, z: usize) -> ();
    void_pzi(p: usize, z: usize, i: i32) -> ();
    size_p(p: usize) -> usize;
    size_pi(p: usize, i: i32) -> usize;
    size_pzzi(p: usize, a: usize, b: usize, i: i32) -> usize;
    ptr_pz(p: usize, z: usize) -> usize;
    ptr_pzi(p: usize, z: usize, i: i32) -> usize;
    ptr_zi(z: usize, i: i32) -> usize;
    isize_ipz(a: i32, p: usize, z: usize) -> isize;
    isize_pzu(p: usize, z: usize, u: u32) -> isize;
    isize_ipzo(a: i32, p: usize, z: usize, o: i64) -> isize;
    isize_ipi(a: i32, p: usize, i: i32) -> isize;
    isize_ipio(a: i32, p: usize, i: i32, o: i64) -> isize;
    isize_ipioi(a: i32, p: usize, i: i32, o: i64, f: i32) -> isize;
    isize_ipzi(a: i32, p: usize, z: usize, i: i32) -> isize;
    isize_ipzipz(a: i32, p: usize, z: usize, i: i32, q: usize, r: usize) -> isize;
    isize_ipzpzz(a: i32, p: usize, z: usize, q: usize, y: usize, f: usize) -> isize;
    i32_ipuip(a: i32, p: usize, u: u32, i: i32, q: usize) -> i32;
    i32_ipui(a: i32, p: usize, u: u32, i: i32) -> i32;
    size_pzzp(p: usize, a: usize, b: usize, f: usize) -> usize;
    int_ipp(a: i32, p: usize, q: usize) -> i32;
    ptr_ip(a: i32, p: usize) -> usize;
}

/// This thread's errno.
pub fn errno() -> i32 {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() }
}

/// Reads the `i`-th `iovec` of the array at `iov` (the program's, as it gave it to a
/// system call): base and length.
pub fn iovec_at(iov: usize, i: usize) -> (usize, usize) {
    // SAFETY: the caller passes the array and count the program gave to the call, which
    // the kernel reads the same way; an invalid one would fail the call itself first.
    let v = unsafe { *(iov as *const libc::iovec).add(i) };
    (v.iov_base as usize, v.iov_len)
}

/// The fields of a `msghdr` at `m` that name memory the kernel reads or writes: its
/// name, iovec array and count, and control buffer, as (address, length) pairs.
pub fn msghdr_parts(m: usize) -> (usize, usize, (usize, usize), (usize, usize)) {
    // SAFETY: as for iovec_at: the program's own msghdr, given to the call.
    let h = unsafe { &*(m as *const libc::msghdr) };
    (
        h.msg_iov as usize,
        h.msg_iovlen,
        (h.msg_name as usize, h.msg_namelen as usize),
        (h.msg_control as usize, h.msg_controllen),
    )
}

/// The `i`-th `mmsghdr` of the array at `m` (its `msghdr`'s address).
pub fn mmsghdr_at(m: usize, i: usize) -> usize {
    // SAFETY: as above; only the address is computed.
    unsafe { (m as *const libc::mmsghdr).add(i) as usize }
}

/// The file type bits of descriptor `fd` (`S_IFREG`, `S_IFSOCK`, ...), 0 if unknown.
pub fn fd_type(fd: i32) -> u32 {
    // SAFETY: fstat writes a stat the caller owns.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return 0;
    }
    st.st_mode & libc::S_IFMT
}

/// The socket type of `fd` (`SOCK_STREAM`, `SOCK_DGRAM`, ...), -1 if not a socket.
pub fn socket_type(fd: i32) -> i32 {
    let mut t: i32 = 0;
    let mut l = std::mem::size_of::<i32>() as libc::socklen_t;
    // SAFETY: getsockopt writes an int into t, its length into l.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_TYPE,
            (&mut t as *mut i32).cast(),
            &mut l,
        )
    };
    if r != 0 {
        -1
    } else {
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The remembered-block table: found until taken, removed slots reused, and full at
    /// three quarters (then nothing more is remembered, and nothing remembered is lost).
    /// One test, as the table is global.
    #[test]
    fn remembered_blocks_are_found_until_taken_and_the_table_bounds_itself() {
        let base = 0x7000_0000_0000usize;
        assert!(!tracked(base, false));
        assert!(track(base) && track(base + 16));
        assert!(tracked(base, false) && tracked(base + 16, false));
        assert!(!tracked(base + 32, false), "a block never remembered");
        assert!(tracked(base, true), "taken once");
        assert!(
            !tracked(base, false) && !tracked(base, true),
            "gone after it was taken"
        );
        assert!(tracked(base + 16, false), "its neighbour stays");
        assert!(tracked(base + 16, true));
        // Removed slots are reused: many more inserts and removals than slots.
        for i in 0..(TRACK_SLOTS * 4) {
            let p = base + 0x10_0000 + i * 16;
            assert!(track(p), "insert {i}");
            assert!(tracked(p, true), "take {i}");
        }
        assert_eq!(TRACKED_LIVE.load(Relaxed), 0);
        // Fill up: refused past 3/4, all that was taken in still found.
        let mut n = 0;
        while track(base + 0x100_0000 + n * 16) {
            n += 1;
        }
        assert!(n > 0 && n <= TRACK_SLOTS * 3 / 4);
        for i in 0..n {
            assert!(
                tracked(base + 0x100_0000 + i * 16, true),
                "block {i} of {n}"
            );
        }
    }

    /// Inside the runtime, a section is entered once; a runtime thread stays inside.
    #[test]
    fn runtime_sections_do_not_nest_and_runtime_threads_stay_inside() {
        std::thread::spawn(|| {
            assert!(!in_runtime());
            assert!(enter_runtime());
            assert!(!enter_runtime(), "a re-entry is refused");
            leave_runtime();
            assert!(!in_runtime());
            mark_runtime_thread();
            assert!(in_runtime() && !enter_runtime());
            leave_runtime();
            assert!(in_runtime(), "a runtime thread stays inside");
        })
        .join()
        .unwrap();
    }
}
