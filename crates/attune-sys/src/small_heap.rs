//! mimalloc heaps inside memory the runtime manages: the small allocator's classes
//! (`attune::small`). Each class hands mimalloc the arena part of one of its regions and
//! carves blocks from a heap made in it.
//!
//! Under the crate's address contract: `base` ranges are the caller's for the life of
//! the process, an arena or heap is one [`arena_in`] or [`heap_in`] returned, and a pointer given back to [`free`]
//! or [`usable_size`] is a live block of such a heap (the small allocator proves it with
//! its map byte before it calls).

use libmimalloc_sys as mi;

/// Hands `[base, base+len)` to mimalloc as an arena of its own (committed, zeroed, no
/// large pages, exclusive): its id, or None (the range is then still the caller's).
pub fn arena_in(base: usize, len: usize) -> Option<usize> {
    let mut id: mi::mi_arena_id_t = std::ptr::null_mut();
    // SAFETY: by the contract the range is the caller's for the life of the process, and
    // reads as zero until written (a fresh mapping).
    let ok = unsafe {
        mi::mi_manage_os_memory_ex(base as *const _, len, true, true, true, -1, true, &mut id)
    };
    ok.then_some(id as usize)
}

/// A heap in the arena `arena_in` made: its address (never 0), or None.
pub fn heap_in(arena: usize) -> Option<usize> {
    // SAFETY: `arena` names an arena `arena_in` created (contract).
    let heap = unsafe { mi::mi_heap_new_in_arena(arena as mi::mi_arena_id_t) };
    (!heap.is_null()).then_some(heap as usize)
}

/// A block of `n` bytes from `heap`; 0 when it has none. mimalloc 3's heaps may be used
/// from any thread.
#[inline(always)]
pub fn malloc(heap: usize, n: usize) -> usize {
    // SAFETY: heap is one `heap_in` made (contract).
    unsafe { mi::mi_heap_malloc(heap as *mut mi::mi_heap_t, n) as usize }
}

/// Gives a block back.
#[inline(always)]
pub fn free(p: usize) {
    // SAFETY: p is a live block of a heap of ours (contract).
    unsafe { mi::mi_free(p as *mut _) }
}

/// The usable size of a live block.
#[inline]
pub fn usable_size(p: usize) -> usize {
    // SAFETY: p is a live block of a heap of ours (contract).
    unsafe { mi::mi_usable_size(p as *const _) }
}
