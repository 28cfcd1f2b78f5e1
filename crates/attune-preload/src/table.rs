//! Which addresses the interposer handed out from the runtime, with a lock that stays
//! usable across fork.
//!
//! The map is behind a `Mutex` that is only ever taken while holding `GATE`, a spin bit;
//! `fork` takes the gate in its prepare handler, so the child never inherits the mutex
//! held by a thread that does not exist there. A forked child takes the parent's runtime
//! over and its entries stay live; if it could not, the parent's managed memory is gone
//! from the child, and its entries are kept as *inherited* so that freeing such a pointer
//! is a harmless no-op instead of reaching glibc with a foreign pointer.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::*};
use std::sync::Mutex;

#[derive(Clone, Copy, Debug)]
pub struct Entry {
    /// Bytes the program asked for.
    pub size: usize,
    /// Bytes of the region behind it (>= size when reused from the cache).
    pub cap: usize,
    /// Bytes of an mmap'ed entry not yet munmap'ed (partial munmap keeps the region).
    pub live: usize,
    /// From the parent, before fork: not mapped in this process.
    pub inherited: bool,
    /// Handed out by `mmap`, not by the malloc family. An allocator that maps its arenas
    /// through `mmap` (jemalloc, tcmalloc) hands out blocks at a mapping's first byte:
    /// `free` of such a block is the allocator's, never the end of the mapping.
    pub mapped: bool,
}

static GATE: AtomicBool = AtomicBool::new(false);
static MAP: Mutex<BTreeMap<usize, Entry>> = Mutex::new(BTreeMap::new());
/// Freed malloc regions kept for reuse (base, bytes), newest last. Programs that
/// allocate, fill and free same-sized buffers in a loop would otherwise pay a new region
/// and a first-touch fault per page each time, where glibc reuses its heap.
static CACHE: Mutex<Vec<(usize, usize)>> = Mutex::new(Vec::new());
const CACHE_ENTRIES: usize = 16;
/// Lowest base and highest end ever managed: most glibc pointers fail this test at once.
static LO: AtomicUsize = AtomicUsize::new(usize::MAX);
static HI: AtomicUsize = AtomicUsize::new(0);

fn with_both<R>(f: impl FnOnce(&mut BTreeMap<usize, Entry>, &mut Vec<(usize, usize)>) -> R) -> R {
    while GATE
        .compare_exchange_weak(false, true, Acquire, Relaxed)
        .is_err()
    {
        std::hint::spin_loop();
        std::thread::yield_now();
    }
    let r = {
        let mut m = MAP.lock().unwrap_or_else(|p| p.into_inner());
        let mut c = CACHE.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut m, &mut c)
    };
    GATE.store(false, Release);
    r
}

fn with<R>(f: impl FnOnce(&mut BTreeMap<usize, Entry>) -> R) -> R {
    with_both(|m, _| f(m))
}

/// Keeps a freed region for reuse; returns regions that must now really be freed
/// (the oldest, beyond `limit` bytes or the entry cap).
pub fn cache_put(base: usize, size: usize, limit: usize) -> Vec<usize> {
    with_both(|_, c| {
        let mut out = Vec::new();
        if size > limit {
            out.push(base);
            return out;
        }
        c.push((base, size));
        let mut total: usize = c.iter().map(|x| x.1).sum();
        while total > limit || c.len() > CACHE_ENTRIES {
            let (b, s) = c.remove(0);
            total -= s;
            out.push(b);
        }
        out
    })
}

/// Takes a cached region of at least `size` bytes and at most twice that, newest first,
/// and records it as live with `size`.
pub fn cache_take(size: usize) -> Option<usize> {
    with_both(|m, c| {
        let i = c.iter().rposition(|&(_, s)| s >= size && s / 2 <= size)?;
        let (b, cap) = c.remove(i);
        m.insert(
            b,
            Entry {
                size,
                cap,
                live: size,
                inherited: false,
                mapped: false,
            },
        );
        Some(b)
    })
}

/// Quick test: could `p` be (inside) a managed allocation?
pub fn maybe_managed(p: usize) -> bool {
    p >= LO.load(Relaxed) && p < HI.load(Relaxed)
}

pub fn insert(base: usize, size: usize, mapped: bool) {
    LO.fetch_min(base, Relaxed);
    HI.fetch_max(base + size, Relaxed);
    with(|m| {
        m.insert(
            base,
            Entry {
                size,
                cap: size,
                live: size,
                inherited: false,
                mapped,
            },
        )
    });
}

/// The entry starting exactly at `p`.
pub fn get(p: usize) -> Option<Entry> {
    if !maybe_managed(p) {
        return None;
    }
    with(|m| m.get(&p).copied())
}

/// The malloc-family block starting exactly at `p` (not a mapping).
pub fn get_block(p: usize) -> Option<Entry> {
    get(p).filter(|e| !e.mapped)
}

/// Removes and returns the malloc-family block starting exactly at `p` (a mapping that
/// starts there stays).
pub fn remove_block(p: usize) -> Option<Entry> {
    if !maybe_managed(p) {
        return None;
    }
    with(|m| match m.get(&p) {
        Some(e) if !e.mapped => m.remove(&p),
        _ => None,
    })
}

/// Whether `[addr, addr+len)` lies inside one managed mapping of this process (not one
/// inherited from the parent).
pub fn within_one(addr: usize, len: usize) -> bool {
    if !maybe_managed(addr) {
        return false;
    }
    let end = addr.saturating_add(len);
    with(|m| {
        m.range(..=addr)
            .next_back()
            .is_some_and(|(b, e)| !e.inherited && b + e.size >= end)
    })
}

/// Whether `[addr, addr+len)` overlaps managed memory.
pub fn overlaps(addr: usize, len: usize) -> bool {
    let end = addr.saturating_add(len);
    if end <= LO.load(Relaxed) || addr >= HI.load(Relaxed) {
        return false;
    }
    with(|m| {
        m.range(..end)
            .next_back()
            .is_some_and(|(b, e)| b + e.size > addr)
    })
}

/// A part of a range: inside the managed entry starting at `base`, or outside managed
/// memory (`base` None).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    pub start: usize,
    pub len: usize,
    pub base: Option<usize>,
    /// The entry is mapped whole (never partly unmapped) and this process's own.
    pub whole: bool,
}

/// Where a walk of the entries that may overlap a range from `addr` starts: the entry at
/// or below `addr`, else `addr`.
fn first_key(m: &BTreeMap<usize, Entry>, addr: usize) -> usize {
    m.range(..=addr)
        .next_back()
        .map(|(b, _)| *b)
        .unwrap_or(addr)
}

/// `[addr, addr+len)` cut at the edges of the managed entries it overlaps, in order.
pub fn pieces(addr: usize, len: usize) -> Vec<Piece> {
    let end = addr.saturating_add(len);
    let mut out = Vec::new();
    let mut cursor = addr;
    if end > LO.load(Relaxed) && addr < HI.load(Relaxed) {
        with(|m| {
            let first = first_key(m, addr);
            for (&b, e) in m.range(first..end) {
                let (s, t) = (b.max(addr), (b + e.size).min(end));
                if t <= s {
                    continue;
                }
                if s > cursor {
                    out.push(Piece {
                        start: cursor,
                        len: s - cursor,
                        base: None,
                        whole: false,
                    });
                }
                out.push(Piece {
                    start: s,
                    len: t - s,
                    base: Some(b),
                    whole: !e.inherited && e.live == e.size,
                });
                cursor = t;
            }
        });
    }
    if cursor < end {
        out.push(Piece {
            start: cursor,
            len: end - cursor,
            base: None,
            whole: false,
        });
    }
    out
}

/// Removes the entry starting at `base` (a region given back to the kernel in place).
pub fn forget(base: usize) -> Option<Entry> {
    with(|m| m.remove(&base))
}

/// What an munmap of `[addr, addr+len)` means for managed memory.
#[derive(Debug, Default)]
pub struct Unmap {
    /// Managed entries now wholly unmapped (removed from the table): base and whether
    /// inherited (nothing to free in this process).
    pub free: Vec<(usize, bool)>,
    /// Parts of the range outside managed memory, for the kernel.
    pub gaps: Vec<(usize, usize)>,
    /// Parts of managed entries of this process that stay (others of their bytes are
    /// still mapped): start and length, for the runtime to drop their content.
    pub parts: Vec<(usize, usize)>,
    pub touched_managed: bool,
}

/// Accounts an munmap against the managed entries it overlaps.
pub fn unmap(addr: usize, len: usize) -> Unmap {
    let end = addr.saturating_add(len);
    let mut u = Unmap::default();
    if end <= LO.load(Relaxed) || addr >= HI.load(Relaxed) {
        u.gaps.push((addr, len));
        return u;
    }
    with(|m| {
        let first = first_key(m, addr);
        let keys: Vec<usize> = m.range(first..end).map(|(b, _)| *b).collect();
        let mut cursor = addr;
        for b in keys {
            let e = m.get_mut(&b).expect("key from range");
            let e_end = b + e.size;
            if e_end <= addr {
                continue;
            }
            let (s, t) = (b.max(addr), e_end.min(end));
            if s > cursor {
                u.gaps.push((cursor, s - cursor));
            }
            cursor = cursor.max(t);
            u.touched_managed = true;
            e.live = e.live.saturating_sub(t - s);
            if e.live == 0 {
                let inh = e.inherited;
                m.remove(&b);
                u.free.push((b, inh));
            } else if !e.inherited {
                u.parts.push((s, t - s));
            }
        }
        if cursor < end {
            u.gaps.push((cursor, end - cursor));
        }
    });
    u
}

/// Number of live managed allocations and their bytes.
pub fn totals() -> (usize, usize) {
    with(|m| {
        m.values()
            .filter(|e| !e.inherited)
            .fold((0, 0), |(n, b), e| (n + 1, b + e.size))
    })
}

pub extern "C" fn before_fork() {
    while GATE
        .compare_exchange_weak(false, true, Acquire, Relaxed)
        .is_err()
    {
        std::hint::spin_loop();
    }
}

pub extern "C" fn after_fork_in_parent() {
    GATE.store(false, Release);
}

/// In a forked child. `adopted`: the runtime took the parent's over (crate::fork), so the
/// parent's allocations are this process's too and stay live. Otherwise their memory is
/// gone from the child: the entries are kept as *inherited* and their ranges reserved.
pub fn after_fork_in_child(adopted: bool) {
    GATE.store(false, Release);
    if adopted {
        return;
    }
    with_both(|m, c| {
        // Cached regions of the parent are gone too.
        c.clear();
        for (b, e) in m.iter_mut() {
            e.inherited = true;
            // Keep the parent's ranges reserved (PROT_NONE): the child's own allocations
            // must not land where the program still holds the parent's pointers, and a
            // touch there must fault loudly rather than read someone else's data.
            let len = (e.cap + 4095) & !4095;
            let _ = attune_sys::mem::raw_mmap(
                *b,
                len,
                libc::PROT_NONE,
                libc::MAP_PRIVATE
                    | libc::MAP_ANONYMOUS
                    | libc::MAP_NORESERVE
                    | libc::MAP_FIXED_NOREPLACE,
                -1,
                0,
            );
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partial_unmaps_free_the_entry_when_all_bytes_are_gone() {
        let b = 0x7000_0000_0000;
        insert(b, 0x10_0000, true);
        let u = unmap(b, 0x1000);
        assert!(u.touched_managed && u.free.is_empty() && u.gaps.is_empty());
        assert!(overlaps(b + 0x5000, 1));
        let u = unmap(b + 0x1000, 0x10_0000 - 0x1000);
        assert_eq!(u.free, vec![(b, false)]);
        assert!(get(b).is_none());
    }

    #[test]
    fn unmap_reports_the_gaps_around_managed_memory() {
        let b = 0x6000_0000_0000;
        insert(b, 0x2000, false);
        let u = unmap(b - 0x1000, 0x4000);
        assert_eq!(u.free, vec![(b, false)]);
        assert_eq!(u.gaps, vec![(b - 0x1000, 0x1000), (b + 0x2000, 0x1000)]);
    }

    /// A mapping and a malloc block at the same kind of address: `free` (remove_block)
    /// takes the block only; the mapping is the allocator's arena, freed by munmap.
    #[test]
    fn free_takes_malloc_blocks_never_mappings() {
        let m = 0x5000_0000_0000;
        let b = 0x5100_0000_0000;
        insert(m, 0x20_0000, true);
        insert(b, 0x20_0000, false);
        assert!(get_block(m).is_none() && get(m).is_some());
        assert!(
            remove_block(m).is_none(),
            "an arena's first object is not the arena"
        );
        assert!(get(m).is_some());
        assert_eq!(remove_block(b).map(|e| e.size), Some(0x20_0000));
        assert!(get(b).is_none());
        assert_eq!(unmap(m, 0x20_0000).free, vec![(m, false)]);
    }
}
