//! Small allocations: one managed arena per placement class, carved by mimalloc.
//!
//! `allocate_TM(64, ATTUNE_LAT)` must not cost a region or a page. Each class (the flag
//! combination) gets one large region of `small_arena` bytes, handed to mimalloc as an
//! exclusive arena (`mi_manage_os_memory_ex`, v3 first-class heaps usable from any
//! thread). Its pages fault, evict and pin like any region's.
//!
//! Each block carries a 16-byte header (a keyed tag and the size) so that `free_TM` can
//! reject pointers it did not hand out, interior pointers and double frees without a
//! lookup table. A double free is detected until the block is handed out again.

use crate::engine::{AllocOptions, Engine};
use crate::region::{Region, RegionKind};
use attune_policy::Flags;
use attune_sys::Errno;
use libmimalloc_sys as mi;
use std::sync::atomic::{AtomicU64, Ordering::*};
use std::sync::{Arc, OnceLock};

const HEADER: usize = 16;
pub(crate) const CLASSES: usize = 16;
const FREED_TAG: u64 = 0xF4EE_D0D0_F4EE_D0D0;

struct Class {
    region: Arc<Region>,
    heap: usize,
}

pub struct SmallAllocator {
    classes: [OnceLock<Result<Class, Errno>>; CLASSES],
    /// Arena ranges, for a lock-free "is this ours" test: (base, end) per class.
    ranges: [(AtomicU64, AtomicU64); CLASSES],
    /// Lowest base and highest end of all arenas: most pointers that are not ours (every
    /// dedicated region's) fail this test without a look at the classes.
    lo: AtomicU64,
    hi: AtomicU64,
    secret: u64,
    /// False in a child that could not take its parent's runtime over: mimalloc's state
    /// there refers to unmapped memory, so small requests get a region each instead.
    pub enabled: bool,
    /// Allocations and frees run inside it (they touch arena pages and mimalloc's state);
    /// a fork closes it before the engine's gate (`crate::fork`). Per-thread flags instead
    /// of a shared count: it is on the path of every small allocation and free.
    pub gate: crate::thread_gate::ThreadGate,
}

impl SmallAllocator {
    pub fn new() -> SmallAllocator {
        let secret = attune_sys::os::now_ns().wrapping_mul(0x9E37_79B9_7F4A_7C15)
            ^ (std::process::id() as u64) << 32;
        SmallAllocator {
            classes: Default::default(),
            ranges: Default::default(),
            lo: AtomicU64::new(u64::MAX),
            hi: AtomicU64::new(0),
            secret: secret | 1,
            enabled: !crate::fork::abandoned(),
            gate: crate::thread_gate::ThreadGate::new(),
        }
    }

    fn tag(&self, block: usize) -> u64 {
        (block as u64).rotate_left(17) ^ self.secret
    }

    fn class(&self, e: &Engine, flags: Flags) -> Result<&Class, Errno> {
        let i = flags.0 as usize % CLASSES;
        let r = self.classes[i].get_or_init(|| {
            let opts = AllocOptions {
                flags,
                pin_bytes: Some(0),
                ..Default::default()
            };
            let region = {
                let _in = e.enter();
                e.alloc_region(e.cfg.small_arena, &opts, RegionKind::SmallArena, 64 << 20)?
            };
            let mut id: mi::mi_arena_id_t = std::ptr::null_mut();
            // SAFETY: the range is a fresh mapping owned by this arena for the life of the
            // process, aligned to 64 MiB; it reads as zero until written.
            let ok = unsafe {
                mi::mi_manage_os_memory_ex(
                    region.base as *const _,
                    region.len,
                    true,
                    true,
                    true,
                    -1,
                    true,
                    &mut id,
                )
            };
            if !ok {
                let _in = e.enter();
                e.free_region(&region);
                return Err(Errno(libc::ENOMEM));
            }
            // SAFETY: id names the arena just created.
            let heap = unsafe { mi::mi_heap_new_in_arena(id) };
            if heap.is_null() {
                return Err(Errno(libc::ENOMEM));
            }
            self.ranges[i].0.store(region.base as u64, Release);
            self.ranges[i]
                .1
                .store((region.base + region.len) as u64, Release);
            self.lo.fetch_min(region.base as u64, AcqRel);
            self.hi.fetch_max((region.base + region.len) as u64, AcqRel);
            Ok(Class {
                region,
                heap: heap as usize,
            })
        });
        r.as_ref().map_err(|e| *e)
    }

    /// Allocates `size` bytes in the class of `flags`.
    pub fn alloc(&self, e: &Engine, size: usize, flags: Flags) -> Result<usize, Errno> {
        let _in = self.gate.enter();
        let class = self.class(e, flags)?;
        let total = size.checked_add(HEADER).ok_or(Errno(libc::ENOMEM))?;
        // SAFETY: heap is a live mimalloc heap; v3 heaps may be used from any thread.
        let p = unsafe { mi::mi_heap_malloc(class.heap as *mut mi::mi_heap_t, total) } as usize;
        if p == 0 {
            return Err(Errno(libc::ENOMEM));
        }
        // SAFETY: p..p+total was just allocated for us; writing may fault it in, which the
        // fault path resolves (no runtime lock is held here).
        unsafe {
            *(p as *mut u64) = self.tag(p);
            *((p + 8) as *mut u64) = size as u64;
        }
        Ok(p + HEADER)
    }

    /// Whether `ptr` lies in one of the arenas.
    pub fn owns(&self, ptr: usize) -> bool {
        let p = ptr as u64;
        if p < self.lo.load(Relaxed) || p >= self.hi.load(Relaxed) {
            return false;
        }
        self.ranges.iter().any(|(b, e)| {
            let b = b.load(Acquire) as usize;
            b != 0 && ptr >= b + HEADER && ptr < e.load(Acquire) as usize
        })
    }

    /// Frees a block: None when `ptr` is not in the arenas at all (someone else's to
    /// judge), EINVAL for anything in them that is not a live block start.
    pub fn free_if_owned(&self, ptr: usize) -> Option<Result<(), Errno>> {
        if !self.owns(ptr) {
            return None;
        }
        if ptr % 16 != 0 {
            return Some(Err(Errno(libc::EINVAL)));
        }
        let block = ptr - HEADER;
        let _in = self.gate.enter();
        // SAFETY: block lies inside an arena we manage (checked above); reading it may
        // fault it in.
        let tag = unsafe { *(block as *const u64) };
        if tag != self.tag(block) {
            return Some(Err(Errno(libc::EINVAL)));
        }
        // SAFETY: as above; the tag proved this is the start of a live block.
        unsafe {
            *(block as *mut u64) = FREED_TAG;
            mi::mi_free(block as *mut _);
        }
        Some(Ok(()))
    }

    /// Size the application asked for, if `ptr` is a live small block.
    pub fn size_of(&self, ptr: usize) -> Option<usize> {
        if !self.owns(ptr) || ptr % 16 != 0 {
            return None;
        }
        let block = ptr - HEADER;
        let _in = self.gate.enter();
        // SAFETY: inside a managed arena (checked above).
        unsafe {
            if *(block as *const u64) != self.tag(block) {
                return None;
            }
            Some(*((block + 8) as *const u64) as usize)
        }
    }

    /// The arena region of the class holding `ptr`.
    pub fn region_of(&self, ptr: usize) -> Option<Arc<Region>> {
        for (i, (b, e)) in self.ranges.iter().enumerate() {
            let b = b.load(Acquire) as usize;
            if b != 0 && ptr >= b && ptr < e.load(Acquire) as usize {
                if let Some(Ok(c)) = self.classes[i].get() {
                    return Some(c.region.clone());
                }
            }
        }
        None
    }
}

impl Default for SmallAllocator {
    fn default() -> Self {
        Self::new()
    }
}
