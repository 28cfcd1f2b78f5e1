//! The `pool` tier: far memory in the node's pool, which `attuned` holds outside every
//! job's memory cgroup (docs/design/pool.md).
//!
//! The daemon gives each runtime its own segment (a memory file; a descriptor reaches the
//! whole file, so one file per runtime is what keeps one job from reading another's
//! pages) and allocates every page of it itself: a shmem page is charged to the cgroup
//! of the process that allocates it, so the pool never counts against the job. The
//! runtime maps the segment shared and must never write where the daemon has not
//! allocated, or the page would be charged to the job after all: it writes only below
//! the size the daemon granted, taking pages lowest first so that a shrunk grant drains
//! from the top.
//!
//! A region reserves offsets in the tier as in every tier; a table maps each page of that
//! offset space to the pool page holding it (one atomic word; 0: none), so any chunk size
//! packs the pool densely (64 KiB units shared by scattered 4 KiB chunks had filled
//! a 260 MiB segment with 110 MiB of pages and sent the rest to the file tier). A store
//! takes a contiguous run of pool pages where it can (one `pwrite` per run), moving the
//! pages into a staging buffer first and writing them with `pwrite` (a kernel copy, so
//! holes the program discarded fail with EFAULT instead of faulting into our own
//! userfaultfd); a load places each run with one `UFFDIO_COPY` straight from the
//! mapping. No lock: each page's word and each bitmap word change by compare-and-swap;
//! signal-safe.

use crate::config::TierConfig;
use attune_sys::mem::AtomicTable;
use attune_sys::uffd::Uffd;
use attune_sys::{mem, Errno, SysResult};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::*};
use std::sync::OnceLock;

pub struct PoolTier {
    name: String,
    /// Bytes reserved for the segment's mapping (the tier's capacity): the grant may grow
    /// up to it without a new mapping.
    reach: usize,
    /// The segment mapping (0: no segment yet).
    base: AtomicUsize,
    /// The segment's memory file, set once (in a forked child the number is kept but
    /// names an empty file: the parent's segment is not the child's).
    fd: OnceLock<OwnedFd>,
    /// Pool pages below this may be taken (the daemon's segment size, within `reach`).
    limit: AtomicUsize,
    /// Per page of offset space: the pool page holding it, plus one (0: none).
    map: AtomicTable,
    /// Pool pages in use, a bit each.
    used: AtomicTable,
    /// The lowest word of `used` that may have a free bit.
    hint: AtomicUsize,
    in_use: AtomicUsize,
    /// A forked child's private copy (before the fork, parent side; after it, child
    /// side): address and bytes.
    child_copy: AtomicUsize,
    child_len: AtomicUsize,
    /// A forked child: loads from its own copy, stores nothing.
    detached: AtomicBool,
}

fn page() -> usize {
    attune_sys::page_size()
}

impl PoolTier {
    pub fn new(cfg: &TierConfig, space: u64) -> Result<PoolTier, String> {
        let unit = attune_proto::POOL_UNIT as usize;
        let reach = (cfg.capacity as usize).div_ceil(unit) * unit;
        let table = |n| {
            AtomicTable::new(n)
                .map_err(|e| format!("tier '{}': cannot reserve its tables: {e}", cfg.name))
        };
        Ok(PoolTier {
            name: cfg.name.clone(),
            reach,
            base: AtomicUsize::new(0),
            fd: OnceLock::new(),
            limit: AtomicUsize::new(0),
            map: table((space as usize).div_ceil(page()))?,
            used: table((reach / page()).div_ceil(64))?,
            hint: AtomicUsize::new(0),
            in_use: AtomicUsize::new(0),
            child_copy: AtomicUsize::new(0),
            child_len: AtomicUsize::new(0),
            detached: AtomicBool::new(false),
        })
    }

    /// Takes the segment the daemon gave (`size` bytes allocated): maps it and lets stores
    /// use it. A second segment is refused (the first stays in use).
    pub fn attach(&self, fd: OwnedFd, size: u64) -> Result<(), String> {
        if self.fd.get().is_some() || self.detached.load(Relaxed) {
            return Err(format!("tier '{}' has a pool segment already", self.name));
        }
        // Mapped for the whole reach: beyond the file's end nothing is touched (stores stay
        // below `limit`, which follows the size the daemon allocated).
        let addr = attune_sys::unix::map_shared(&fd, self.reach, true)
            .map_err(|e| format!("tier '{}': cannot map the pool segment: {e}", self.name))?;
        let _ = mem::advise(addr, self.reach, libc::MADV_DONTDUMP);
        if self.fd.set(fd).is_err() {
            let _ = mem::unmap(addr, self.reach);
            return Err(format!("tier '{}' has a pool segment already", self.name));
        }
        self.base.store(addr, Release);
        self.set_size(size);
        Ok(())
    }

    /// The segment's size now (a grant): stores may use pages below it. A growth is
    /// mapped first (the daemon allocated it before telling), off the fault path, so a
    /// load's copy never faults on its source; the connection thread applies the grant
    /// after it (docs/design/pool.md, "When the segment is full").
    pub fn set_size(&self, size: u64) {
        if self.detached.load(Relaxed) {
            return;
        }
        let pages = (size.min(self.reach as u64) as usize) / page();
        let before = self.limit.load(Acquire);
        let base = self.base.load(Acquire);
        if base != 0 && pages > before {
            let _ = mem::populate_read(base + before * page(), (pages - before) * page());
        }
        self.limit.store(pages, Release);
    }

    /// The segment's file, to hand back to a restarted daemon.
    pub fn segment(&self) -> Option<BorrowedFd<'_>> {
        if self.detached.load(Relaxed) {
            return None;
        }
        self.fd.get().map(|f| f.as_fd())
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// A forked child's tier: it reads its copy and takes no segment.
    pub fn detached(&self) -> bool {
        self.detached.load(Relaxed)
    }

    pub fn attached(&self) -> bool {
        self.base.load(Acquire) != 0
    }

    /// The end of the pages in use, in bytes (0: none).
    fn used_top(&self) -> usize {
        for w in (0..self.used.len()).rev() {
            let bits = self.used.get(w).load(Acquire);
            if bits != 0 {
                return (w * 64 + 64 - bits.leading_zeros() as usize) * page();
            }
        }
        0
    }

    /// Bytes the process may still touch in its segment, in whole pool units: the daemon
    /// shrinks it no lower.
    pub fn top(&self) -> u64 {
        let unit = attune_proto::POOL_UNIT as usize;
        let top = self.used_top().max(self.limit.load(Acquire) * page());
        (top.div_ceil(unit) * unit) as u64
    }

    /// Bytes of pool pages in use.
    pub fn used_bytes(&self) -> u64 {
        (self.in_use.load(Relaxed) * page()) as u64
    }

    /// Bytes of the segment below its size that no page uses (pages in use above a
    /// shrunk size count against it too, so this never says more than stores can take).
    pub fn free_bytes(&self) -> u64 {
        let free = self
            .limit
            .load(Acquire)
            .saturating_sub(self.in_use.load(Relaxed));
        (free * page()) as u64
    }

    /// A free run of `n` (1-64) contiguous pages below the limit, lowest first; its first
    /// page. Signal-safe.
    fn alloc_run(&self, n: usize) -> Option<usize> {
        debug_assert!((1..=64).contains(&n));
        let limit = self.limit.load(Acquire);
        let words = limit.div_ceil(64).min(self.used.len());
        let start = self.hint.load(Relaxed).min(words);
        for w in (start..words).chain(0..start) {
            let word = self.used.get(w);
            let mut cur = word.load(Acquire);
            loop {
                // Bits of the pages in this word that are free and below the limit.
                let free = !cur
                    & if limit >= (w + 1) * 64 {
                        u64::MAX
                    } else {
                        (1u64 << (limit - w * 64)) - 1
                    };
                // Bit i set: pages i..i+n are all free.
                let mut runs = free;
                for k in 1..n {
                    runs &= free >> k;
                }
                if runs == 0 {
                    break;
                }
                let i = runs.trailing_zeros() as usize;
                let bits = if n == 64 {
                    u64::MAX
                } else {
                    ((1u64 << n) - 1) << i
                };
                match word.compare_exchange(cur, cur | bits, AcqRel, Acquire) {
                    Ok(_) => {
                        if w != start && free.count_ones() as usize == n {
                            let _ = self.hint.compare_exchange(start, w, Relaxed, Relaxed);
                        }
                        self.in_use.fetch_add(n, Relaxed);
                        return Some(w * 64 + i);
                    }
                    Err(now) => cur = now,
                }
            }
        }
        None
    }

    fn free_page(&self, p: usize) {
        self.used.get(p / 64).fetch_and(!(1 << (p % 64)), AcqRel);
        self.hint.fetch_min(p / 64, Relaxed);
        self.in_use.fetch_sub(1, Relaxed);
    }

    /// Gives pool pages to the `pages` pages of offset space from page `first`, in runs as
    /// long as the free space allows; on ENOSPC nothing is kept.
    fn claim(&self, first: usize, pages: usize) -> SysResult<()> {
        let mut i = 0;
        while i < pages {
            let mut n = (pages - i).min(64);
            let start = loop {
                if let Some(s) = self.alloc_run(n) {
                    break s;
                }
                if n == 1 {
                    self.unclaim(first, i);
                    return Err(Errno(libc::ENOSPC));
                }
                n /= 2;
            };
            for k in 0..n {
                let old = self
                    .map
                    .get(first + i + k)
                    .swap(start as u64 + k as u64 + 1, AcqRel);
                if old != 0 {
                    // A stale page (never expected): freed, not leaked.
                    self.free_page(old as usize - 1);
                }
            }
            i += n;
        }
        Ok(())
    }

    /// Frees the pool pages of `pages` pages of offset space from page `first`.
    fn unclaim(&self, first: usize, pages: usize) {
        for k in 0..pages {
            let old = self.map.get(first + k).swap(0, AcqRel);
            if old != 0 {
                self.free_page(old as usize - 1);
            }
        }
    }

    /// The runs of `[first, first+pages)`: (offset in the range, the pool page it starts
    /// at, pages), each contiguous in the pool; a run of pages that are not stored
    /// (discarded while far) has no pool page.
    fn runs(
        &self,
        first: usize,
        pages: usize,
    ) -> impl Iterator<Item = (usize, Option<usize>, usize)> + '_ {
        let mut i = 0;
        std::iter::from_fn(move || {
            if i >= pages {
                return None;
            }
            let at = self.map.get(first + i).load(Acquire);
            let start = i;
            if at == 0 {
                while i < pages && self.map.get(first + i).load(Acquire) == 0 {
                    i += 1;
                }
                return Some((start, None, i - start));
            }
            let p = at as usize - 1;
            let mut n = 1;
            while i + n < pages && self.map.get(first + i + n).load(Acquire) == (p + n + 1) as u64 {
                n += 1;
            }
            i += n;
            Some((start, Some(p), n))
        })
    }
}

impl super::Medium for PoolTier {
    fn store(
        &self,
        io: &super::IoContext,
        region_uffd: &Uffd,
        src: usize,
        off: u64,
        len: usize,
        dirty: &mut dyn FnMut(usize, bool) -> super::Staged,
    ) -> SysResult<()> {
        let base = self.base.load(Acquire);
        let Some(fd) = self.fd.get() else {
            return Err(Errno(libc::ENOSPC));
        };
        if base == 0 || self.detached.load(Relaxed) {
            return Err(Errno(libc::ENOSPC));
        }
        let ps = page();
        let (first, pages) = (off as usize / ps, len / ps);
        // Pool pages first: with no room, nothing leaves the region.
        self.claim(first, pages)?;
        let mut filled = false;
        let r = super::store_staged(io, region_uffd, src, len, &mut |st| {
            // A fill is not copied into the pool: its pages go back to it.
            if dirty(st, true) == super::Staged::Filled {
                filled = true;
                return Ok(());
            }
            for (i, at, n) in self.runs(first, pages) {
                // Every page was claimed above.
                let at = at.ok_or(Errno(libc::EIO))?;
                mem::pwrite_raw(fd, st + i * ps, n * ps, (at * ps) as u64)?;
            }
            Ok(())
        });
        if r.is_err() || filled {
            self.unclaim(first, pages);
        }
        r
    }

    fn load(
        &self,
        _io: &super::IoContext,
        region_uffd: &Uffd,
        dst: usize,
        off: u64,
        len: usize,
        _seen: &mut dyn FnMut(usize) -> bool,
    ) -> SysResult<()> {
        let base = self.base.load(Acquire);
        if base == 0 {
            return Err(Errno(libc::EIO));
        }
        let ps = page();
        let (first, pages) = (off as usize / ps, len / ps);
        for (i, at, n) in self.runs(first, pages) {
            // A run the program split (mprotect, mlock of a part) is placed page by page
            // past the boundary (`place_copy`). No wake: the fault path wakes the whole
            // run once placed. On an error nothing is released: the chunk stays far, a
            // later fetch copies again.
            match at {
                Some(at) => region_uffd.place_copy(dst + i * ps, base + at * ps, n * ps, false)?,
                // Pages the program discarded while they were far (`discard`): they read
                // as zeros, as a discarded page does in every tier.
                None => region_uffd.place_zeros(dst + i * ps, n * ps, false)?,
            }
        }
        self.unclaim(first, pages);
        Ok(())
    }

    fn run_max(&self) -> Option<usize> {
        Some(super::COPIED_RUN)
    }

    fn discard(&self, off: u64, len: usize) {
        let ps = page();
        let first = off as usize / ps;
        let pages = (len / ps).min(self.map.len().saturating_sub(first));
        self.unclaim(first, pages);
    }

    fn keeps_copy(&self) -> bool {
        false
    }

    fn is_node_memory(&self) -> bool {
        true
    }

    /// Out of units is found without a system call, and the daemon's next grant may
    /// add units at any time: no back-off (with one, a job's first second spilled most
    /// of its pages to the next tier while its grant caught up).
    fn refuses_cheaply(&self) -> bool {
        true
    }

    fn as_pool(&self) -> Option<&PoolTier> {
        Some(self)
    }

    /// Before a fork: the child must not share the parent's segment (both would write
    /// the same units), so it gets a private copy of the units in use, made now while
    /// the runtime is quiesced (after the fork the parent changes its segment).
    fn prepare_fork(
        &self,
        _: &TierConfig,
        has_data: bool,
        _: usize,
        _: usize,
    ) -> Result<bool, String> {
        let base = self.base.load(Acquire);
        if base == 0 || !has_data || self.detached.load(Relaxed) {
            return Ok(true);
        }
        let used_top = self.used_top().min(self.reach);
        if used_top == 0 {
            return Ok(true);
        }
        let copy = mem::private_copy(base, used_top).map_err(|e| {
            format!(
                "tier '{}': cannot copy the pool segment for the child: {e}",
                self.name
            )
        })?;
        self.child_copy.store(copy, Release);
        self.child_len.store(used_top, Release);
        Ok(true)
    }

    fn after_fork_in_parent(&self) {
        let copy = self.child_copy.swap(0, AcqRel);
        if copy != 0 {
            let _ = mem::unmap(copy, self.child_len.swap(0, AcqRel));
        }
    }

    /// In the child: its copy replaces the segment's mapping, the rest of the reach
    /// becomes inaccessible, the parent's file is closed; stores go to the next tier.
    fn reopen_in_child(&self, _internal: &Uffd) -> Result<(), String> {
        let base = self.base.load(Acquire);
        self.detached.store(true, Relaxed);
        self.limit.store(0, Release);
        if let Some(f) = self.fd.get() {
            let blank = attune_sys::unix::pool_memfd("attune-pool-detached")
                .map_err(|e| format!("tier '{}': {e}", self.name))?;
            attune_sys::os::replace_fd(blank, f.as_raw_fd()).map_err(|e| {
                format!(
                    "tier '{}': cannot close the parent's segment: {e}",
                    self.name
                )
            })?;
        }
        if base == 0 {
            return Ok(());
        }
        let copy = self.child_copy.swap(0, AcqRel);
        let len = self.child_len.swap(0, AcqRel);
        if copy != 0 {
            mem::move_mapping(copy, len, base)
                .map_err(|e| format!("tier '{}': cannot place the child's copy: {e}", self.name))?;
        }
        if self.reach > len {
            mem::map_none_at(base + len, self.reach - len).map_err(|e| {
                format!(
                    "tier '{}': cannot unmap the parent's segment: {e}",
                    self.name
                )
            })?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::TierKind;

    fn tier(capacity: u64, space: u64) -> PoolTier {
        let cfg = TierConfig {
            name: "pool".into(),
            kind: TierKind::Pool,
            capacity,
            path: None,
            direct: false,
            latency_ns: 0,
            bandwidth: 0,
            emulate_delay_ns: 0,
            emulate_bandwidth: 0,
            min_chunk: 4096,
            node: None,
            servers: String::new(),
            secret_file: None,
            provider: "tcp".into(),
            timeout_ms: 5000,
            replicas: 1,
            rehome_ms: 0,
            concurrency: 8,
            ahead: 0,
        };
        PoolTier::new(&cfg, space).unwrap()
    }

    fn runs(t: &PoolTier, first: usize, pages: usize) -> Vec<(usize, Option<usize>, usize)> {
        t.runs(first, pages).collect()
    }

    #[test]
    fn pages_are_taken_in_runs_lowest_first_within_the_limit() {
        let t = tier(1 << 20, 1 << 30); // 256 pages
        assert_eq!(
            t.claim(5, 1),
            Err(Errno(libc::ENOSPC)),
            "no segment: no page"
        );
        t.set_size(8 * 4096);
        t.claim(100, 4).unwrap();
        assert_eq!(runs(&t, 100, 4), vec![(0, Some(0), 4)]);
        t.claim(7, 1).unwrap();
        assert_eq!(runs(&t, 7, 1), vec![(0, Some(4), 1)]);
        assert_eq!(t.claim(200, 4), Err(Errno(libc::ENOSPC)), "3 pages left");
        assert_eq!(t.used_bytes(), 5 * 4096, "a refused claim keeps nothing");
        assert_eq!(runs(&t, 200, 4), vec![(0, None, 4)]);
        // A hole in the free space: a run is split where it must be.
        t.unclaim(101, 1);
        t.claim(300, 4).unwrap();
        // Free: 1, 5, 6, 7. Four pages: no run of 4, a run of 2 (5-6), then single pages.
        assert_eq!(
            runs(&t, 300, 4),
            vec![(0, Some(5), 2), (2, Some(1), 1), (3, Some(7), 1)]
        );
        assert_eq!(
            t.top(),
            64 << 10,
            "pages in use and the limit, in whole units"
        );
        // A shrunk grant: no page above it, pages in use still count in `top`.
        t.set_size(4 * 4096);
        t.unclaim(300, 4);
        t.claim(400, 1).unwrap();
        assert_eq!(runs(&t, 400, 1), vec![(0, Some(1), 1)], "below the limit");
        assert_eq!(
            t.claim(401, 1),
            Err(Errno(libc::ENOSPC)),
            "0-3 taken, limit 4"
        );
        assert_eq!(t.top(), 64 << 10, "page 4 is still in use above the limit");
        t.unclaim(400, 1);
        t.unclaim(100, 4);
        t.unclaim(7, 1);
        assert_eq!((t.used_bytes(), t.used_top()), (0, 0));
    }

    #[test]
    fn scattered_small_chunks_pack_the_pool_densely() {
        // Every 16th page of the offset space stored: 64 KiB units had needed a unit each.
        let t = tier(1 << 20, 1 << 30);
        t.set_size(1 << 20);
        for i in 0..256 {
            t.claim(i * 16, 1).unwrap();
        }
        assert_eq!(t.used_bytes(), 1 << 20);
        assert_eq!(t.claim(5000, 1), Err(Errno(libc::ENOSPC)));
        for i in 0..256 {
            t.unclaim(i * 16, 1);
        }
        assert_eq!(t.used_bytes(), 0);
    }

    #[test]
    fn pages_discarded_while_far_are_holes_in_the_runs() {
        let t = tier(1 << 20, 1 << 30);
        t.set_size(1 << 20);
        t.claim(10, 8).unwrap();
        t.unclaim(12, 3);
        assert_eq!(
            runs(&t, 10, 8),
            vec![(0, Some(0), 2), (2, None, 3), (5, Some(5), 3)]
        );
    }

    #[test]
    fn a_chunk_longer_than_a_word_takes_several_runs() {
        let t = tier(4 << 20, 1 << 30);
        t.set_size(4 << 20);
        t.claim(0, 512).unwrap(); // 2 MiB
        let r = runs(&t, 0, 512);
        assert_eq!(r, vec![(0, Some(0), 512)], "consecutive runs coalesce");
        t.unclaim(0, 512);
        assert_eq!(t.used_bytes(), 0);
    }

    #[test]
    fn concurrent_claims_never_share_a_page() {
        let t = std::sync::Arc::new(tier(4 << 20, 1 << 30));
        t.set_size(4 << 20);
        let hs: Vec<_> = (0..8)
            .map(|i| {
                let t = t.clone();
                std::thread::spawn(move || {
                    for round in 0..2000 {
                        let first = i * 1000 + (round % 7) * 16;
                        t.claim(first, 1 + round % 16).unwrap();
                        t.unclaim(first, 1 + round % 16);
                    }
                    let first = i * 1000;
                    t.claim(first, 16).unwrap();
                    first
                })
            })
            .collect();
        let mut seen = std::collections::HashSet::new();
        for h in hs {
            let first = h.join().unwrap();
            for k in 0..16 {
                let p = t.map.get(first + k).load(Relaxed);
                assert!(p != 0 && seen.insert(p), "page {p} given twice");
            }
        }
        assert_eq!(t.used_bytes(), 8 * 16 * 4096);
    }
}
