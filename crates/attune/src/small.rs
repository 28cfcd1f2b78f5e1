//! Small allocations: one managed arena per placement class, carved by mimalloc.
//!
//! `allocate_TM(64, ATTUNE_LAT)` must not cost a region or a page. Each class (the flag
//! combination) gets one large region of `small_arena` bytes, handed to mimalloc as an
//! exclusive arena (`mi_manage_os_memory_ex`, v3 first-class heaps usable from any
//! thread). Its pages fault, evict and pin like any region's.
//!
//! **Which pointers are live blocks.** Behind each arena, in the same region, a map holds
//! one byte per 16 bytes of arena: `LIVE` where a block handed out starts, 0 elsewhere.
//! `free_TM` rejects pointers it did not hand out, interior pointers and double frees by
//! that byte (a double free is detected until the block is handed out again). The map
//! lives outside the blocks, so a request keeps mimalloc's own size class (1 KiB stays a
//! small block; an in-band header pushed it into the next, slower, class) and costs
//! 1/16 of the arena's used extent, paged like the arena. Requests are rounded up to 16
//! bytes, so every block starts on a map entry.
//!
//! **The fast path** ([`alloc_fast`], [`free_fast`]): a request without options for a
//! class that exists takes a few inlined loads, this thread's slot of the fork gate
//! ([`crate::sync::thread_gate::ThreadGate::try_enter`]), mimalloc and the map byte. Anything
//! else (first request of a class, size 0, unknown flags, a fork closing the gate, a bad
//! pointer to report) goes to the general path, which re-checks everything and reports.

use crate::config::FaultMode;
use crate::paging::{AllocOptions, Pager};
use crate::region::{Region, RegionKind};
use attune_policy::Flags;
use attune_sys::Errno;
use attune_sys::{mem, small_heap};
use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering::*};
use std::sync::{Arc, OnceLock};

/// Block alignment and the arena bytes one map byte stands for.
const GRAIN: usize = 16;
pub(crate) const CLASSES: usize = 16;
/// Map byte of a block start handed out and not yet freed.
const LIVE: u8 = 0xA5;

struct Class {
    region: Arc<Region>,
}

/// What the fast path needs of a class, published once the class exists (heap 0 before).
#[derive(Default)]
struct Ready {
    heap: AtomicUsize,
    /// The arena is base..end; its map starts at end.
    base: AtomicUsize,
    end: AtomicUsize,
}

impl Ready {
    /// The address of the map byte of the block starting at `p` (inside base..end): the
    /// map is arena/GRAIN bytes right behind the arena, in the class's region (mapped for
    /// the life of the process), as `mem::load_u8` asks. Touching it may fault it in,
    /// which the fault path resolves.
    #[inline(always)]
    fn mark(&self, p: usize) -> usize {
        let base = self.base.load(Relaxed);
        self.end.load(Relaxed) + (p - base) / GRAIN
    }

    /// Carves a block of `size` (> 0) bytes and marks it live; 0 when mimalloc has none.
    #[inline(always)]
    fn place(&self, size: usize) -> usize {
        let Some(n) = size.checked_add(GRAIN - 1).map(|s| s & !(GRAIN - 1)) else {
            return 0;
        };
        let p = small_heap::malloc(self.heap.load(Acquire), n);
        if p == 0 {
            return 0;
        }
        if p % GRAIN != 0 {
            // Not expected (sizes are multiples of 16), but a block the map cannot name
            // must not be handed out.
            small_heap::free(p);
            return 0;
        }
        mem::store_u8(self.mark(p), LIVE);
        p
    }

    /// Frees the live block starting at `p`; false (nothing done) when `p` is not one.
    #[inline(always)]
    fn release(&self, p: usize) -> bool {
        let m = self.mark(p);
        if mem::load_u8(m) != LIVE {
            return false;
        }
        mem::store_u8(m, 0);
        // The map proved p is the start of a live block of this arena.
        small_heap::free(p);
        true
    }

    #[inline(always)]
    fn holds(&self, p: usize) -> bool {
        let b = self.base.load(Acquire);
        b != 0 && p >= b && p < self.end.load(Acquire)
    }
}

pub struct SmallAllocator {
    classes: [OnceLock<Result<Class, Errno>>; CLASSES],
    ready: [Ready; CLASSES],
    /// Lowest base and highest end of all arenas: most pointers that are not ours (every
    /// dedicated region's) fail this test without a look at the classes.
    lo: AtomicU64,
    hi: AtomicU64,
    /// Requests below it are served here (`small_threshold`).
    threshold: usize,
    /// False in a child that could not take its parent's runtime over: mimalloc's state
    /// there refers to unmapped memory, so small requests get a region each instead.
    pub enabled: bool,
    /// Allocations and frees run inside it (they touch arena pages and mimalloc's state);
    /// a fork closes it before the engine's gate (`crate::fork`). Per-thread flags instead
    /// of a shared count: it is on the path of every small allocation and free.
    pub gate: crate::sync::thread_gate::ThreadGate,
}

/// The delivery of arenas made from now on: 0 the configured one, 1 the handler thread,
/// 2 signal. Set by the `attune run` interposer (`attune_policy::delivery::small_arenas`).
static ARENA_FAULT_MODE: AtomicU8 = AtomicU8::new(0);

/// Sets the delivery of the arenas made from now on (None: the configured one).
pub fn set_arena_fault_mode(m: Option<FaultMode>) {
    let v = match m {
        None => 0,
        Some(FaultMode::Thread) => 1,
        Some(FaultMode::Signal) => 2,
    };
    ARENA_FAULT_MODE.store(v, Relaxed);
}

fn arena_fault_mode() -> Option<FaultMode> {
    match ARENA_FAULT_MODE.load(Relaxed) {
        1 => Some(FaultMode::Thread),
        2 => Some(FaultMode::Signal),
        _ => None,
    }
}

/// The started runtime's small allocator, for the fast path: 0 before the runtime starts,
/// without tiering, and in a forked child that gave its parent's runtime up.
static FAST: attune_sys::global::Published<SmallAllocator> = attune_sys::global::Published::new();

/// Makes `s` the fast path's allocator (None: no fast path).
pub(crate) fn publish(s: Option<&'static SmallAllocator>) {
    FAST.set(s.filter(|s| s.enabled));
}

#[inline(always)]
fn fast() -> Option<&'static SmallAllocator> {
    FAST.get()
}

/// `allocate_TM(size, flags)` without options, when the class already exists and the fork
/// gate is open; None sends the request to the general path.
#[inline(always)]
pub fn alloc_fast(size: usize, flag_bits: u32) -> Option<usize> {
    let s = fast()?;
    if size == 0 || size >= s.threshold || flag_bits as usize >= CLASSES {
        return None;
    }
    let r = &s.ready[flag_bits as usize];
    if r.heap.load(Acquire) == 0 {
        return None;
    }
    let slot = s.gate.try_enter()?;
    let p = r.place(size);
    crate::sync::thread_gate::ThreadGate::leave(slot);
    (p != 0).then_some(p)
}

/// `free_TM(ptr)` of a live small block while the fork gate is open: true when freed;
/// false sends the pointer to the general path (not an arena's, or to be reported).
#[inline(always)]
pub fn free_fast(ptr: usize) -> bool {
    let Some(s) = fast() else {
        return false;
    };
    if ptr % GRAIN != 0 {
        return false;
    }
    let Some(r) = s.ready_of(ptr) else {
        return false;
    };
    let Some(slot) = s.gate.try_enter() else {
        return false;
    };
    let done = r.release(ptr);
    crate::sync::thread_gate::ThreadGate::leave(slot);
    done
}

impl SmallAllocator {
    pub fn new(threshold: usize) -> SmallAllocator {
        SmallAllocator {
            classes: Default::default(),
            ready: Default::default(),
            lo: AtomicU64::new(u64::MAX),
            hi: AtomicU64::new(0),
            threshold,
            enabled: !crate::sync::abandoned(),
            gate: crate::sync::thread_gate::ThreadGate::new(),
        }
    }

    /// The class of `flags`, made on its first request.
    fn class(&self, e: &Pager, flags: Flags) -> Result<&Ready, Errno> {
        let i = flags.0 as usize % CLASSES;
        let r = self.classes[i].get_or_init(|| {
            let opts = AllocOptions {
                flags,
                pin_bytes: Some(0),
                fault_mode: arena_fault_mode(),
                ..Default::default()
            };
            let arena = e.cfg.small_arena;
            let region = {
                let _in = e.enter();
                e.alloc_region(
                    arena + arena / GRAIN,
                    &opts,
                    RegionKind::SmallArena,
                    64 << 20,
                )?
            };
            // The first `arena` bytes of a fresh mapping owned by this class for the life
            // of the process, aligned to 64 MiB; they read as zero until written.
            let Some(id) = small_heap::arena_in(region.base, arena) else {
                let _in = e.enter();
                e.free_region(&region);
                return Err(Errno(libc::ENOMEM));
            };
            let Some(heap) = small_heap::heap_in(id) else {
                return Err(Errno(libc::ENOMEM));
            };
            let ready = &self.ready[i];
            ready.base.store(region.base, Release);
            ready.end.store(region.base + arena, Release);
            ready.heap.store(heap, Release);
            self.lo.fetch_min(region.base as u64, AcqRel);
            self.hi.fetch_max((region.base + arena) as u64, AcqRel);
            Ok(Class { region })
        });
        r.as_ref().map(|_| &self.ready[i]).map_err(|e| *e)
    }

    /// Allocates `size` (> 0) bytes in the class of `flags`.
    pub fn alloc(&self, e: &Pager, size: usize, flags: Flags) -> Result<usize, Errno> {
        let _in = self.gate.enter();
        let p = self.class(e, flags)?.place(size);
        if p == 0 {
            return Err(Errno(libc::ENOMEM));
        }
        Ok(p)
    }

    /// The class whose arena holds `ptr`, if it is in one.
    #[inline(always)]
    fn ready_of(&self, ptr: usize) -> Option<&Ready> {
        let p = ptr as u64;
        if p < self.lo.load(Relaxed) || p >= self.hi.load(Relaxed) {
            return None;
        }
        self.ready.iter().find(|r| r.holds(ptr))
    }

    /// Whether `ptr` lies in one of the arenas.
    pub fn owns(&self, ptr: usize) -> bool {
        self.ready_of(ptr).is_some()
    }

    /// Frees a block: None when `ptr` is not in the arenas at all (someone else's to
    /// judge), EINVAL for anything in them that is not a live block start.
    pub fn free_if_owned(&self, ptr: usize) -> Option<Result<(), Errno>> {
        let r = self.ready_of(ptr)?;
        if ptr % GRAIN != 0 {
            return Some(Err(Errno(libc::EINVAL)));
        }
        let _in = self.gate.enter();
        if r.release(ptr) {
            Some(Ok(()))
        } else {
            Some(Err(Errno(libc::EINVAL)))
        }
    }

    /// The block's usable size (at least what was asked for), if `ptr` is a live block.
    pub fn size_of(&self, ptr: usize) -> Option<usize> {
        let r = self.ready_of(ptr)?;
        if ptr % GRAIN != 0 {
            return None;
        }
        let _in = self.gate.enter();
        if mem::load_u8(r.mark(ptr)) != LIVE {
            return None;
        }
        // The map proved ptr is the start of a live block.
        Some(small_heap::usable_size(ptr))
    }

    /// The arena region of the class holding `ptr`.
    pub fn region_of(&self, ptr: usize) -> Option<Arc<Region>> {
        let i = self.ready.iter().position(|r| r.holds(ptr))?;
        match self.classes[i].get() {
            Some(Ok(c)) => Some(c.region.clone()),
            _ => None,
        }
    }
}
