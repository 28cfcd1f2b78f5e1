//! The `pool` tier: far memory in the node's pool, which `attuned` holds outside every
//! job's memory cgroup (docs/design/pool.md).
//!
//! The daemon gives each runtime its own segment (a memory file; a descriptor reaches the
//! whole file, so one file per runtime is what keeps one job from reading another's
//! pages) and allocates every page of it itself: a shmem page is charged to the cgroup
//! of the process that allocates it, so the pool never counts against the job. The
//! runtime maps the segment shared and must never write where the daemon has not
//! allocated, or the page would be charged to the job after all: it writes only into
//! *units* (64 KiB) below the size the daemon granted, allocated lowest first so that a
//! shrunk grant drains from the top.
//!
//! A region reserves offsets in the tier as in every tier; a table maps each 64 KiB of
//! that offset space to a pool unit and the pages of it stored there, in one atomic word,
//! so a unit is taken by the first store into it and freed by the load or discard that
//! empties it (no lock; signal-safe). A store moves the pages into a staging buffer and
//! writes them with `pwrite` (a kernel copy, so holes the program discarded fail with
//! EFAULT instead of faulting into our own userfaultfd); a load places them with one
//! `UFFDIO_COPY` per unit straight from the mapping.

use crate::config::TierConfig;
use attune_sys::mem::AtomicTable;
use attune_sys::uffd::Uffd;
use attune_sys::{mem, Errno, SysResult};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::*};
use std::sync::OnceLock;

/// Bytes of one pool unit: the default transfer unit of `attune run` (one unit per chunk
/// there), and at most 16 pages a unit so its page mask fits the table word's low half.
/// Smaller chunks share a unit with their neighbours of the same region; a unit is
/// freed once all its stored pages are gone.
pub const UNIT: usize = attune_proto::POOL_UNIT as usize;
const MASK: u64 = 0xffff_ffff;

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
    /// Units below this may be taken (the daemon's segment size, within `reach`).
    limit: AtomicUsize,
    /// Per 64 KiB of offset space: `(pool unit + 1) << 32 | pages stored` (0: none).
    map: AtomicTable,
    /// Pool units in use, a bit each.
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

impl PoolTier {
    pub fn new(cfg: &TierConfig, space: u64) -> Result<PoolTier, String> {
        let reach = (cfg.capacity as usize).div_ceil(UNIT) * UNIT;
        let units = reach / UNIT;
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
            map: table((space as usize).div_ceil(UNIT))?,
            used: table(units.div_ceil(64))?,
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

    /// The segment's size now (a grant): stores may use units below it.
    pub fn set_size(&self, size: u64) {
        if self.detached.load(Relaxed) {
            return;
        }
        let units = (size.min(self.reach as u64) as usize) / UNIT;
        self.limit.store(units, Release);
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

    /// Bytes the process may still touch in its segment: the daemon shrinks it no lower.
    pub fn top(&self) -> u64 {
        let limit = self.limit.load(Acquire);
        let mut top = 0;
        for w in (0..self.used.len()).rev() {
            let bits = self.used.get(w).load(Acquire);
            if bits != 0 {
                top = w * 64 + 64 - bits.leading_zeros() as usize;
                break;
            }
        }
        (top.max(limit) * UNIT) as u64
    }

    /// Bytes of units in use (stored pages and the rest of their units).
    pub fn units_bytes(&self) -> u64 {
        (self.in_use.load(Relaxed) * UNIT) as u64
    }

    /// A free unit below the limit, lowest first. Signal-safe.
    fn alloc_unit(&self) -> Option<usize> {
        let limit = self.limit.load(Acquire);
        let words = limit.div_ceil(64).min(self.used.len());
        let start = self.hint.load(Relaxed).min(words);
        for w in (start..words).chain(0..start) {
            let word = self.used.get(w);
            let mut cur = word.load(Acquire);
            while cur != u64::MAX {
                let bit = (!cur).trailing_zeros() as usize;
                if w * 64 + bit >= limit {
                    break;
                }
                match word.compare_exchange(cur, cur | 1 << bit, AcqRel, Acquire) {
                    Ok(_) => {
                        if w != start {
                            let _ = self.hint.compare_exchange(start, w, Relaxed, Relaxed);
                        }
                        self.in_use.fetch_add(1, Relaxed);
                        return Some(w * 64 + bit);
                    }
                    Err(now) => cur = now,
                }
            }
        }
        None
    }

    fn free_unit(&self, u: usize) {
        self.used.get(u / 64).fetch_and(!(1 << (u % 64)), AcqRel);
        self.hint.fetch_min(u / 64, Relaxed);
        self.in_use.fetch_sub(1, Relaxed);
    }

    /// Marks `bits` of table entry `e` stored, taking a unit if the entry has none.
    fn claim(&self, e: usize, bits: u64) -> SysResult<usize> {
        let word = self.map.get(e);
        loop {
            let cur = word.load(Acquire);
            if cur == 0 {
                let u = self.alloc_unit().ok_or(Errno(libc::ENOSPC))?;
                if word
                    .compare_exchange(0, ((u as u64 + 1) << 32) | bits, AcqRel, Acquire)
                    .is_ok()
                {
                    return Ok(u);
                }
                self.free_unit(u);
                continue;
            }
            if word
                .compare_exchange(cur, cur | bits, AcqRel, Acquire)
                .is_ok()
            {
                return Ok((cur >> 32) as usize - 1);
            }
        }
    }

    /// Clears `bits` of entry `e`; the last pages gone free the unit.
    fn unclaim(&self, e: usize, bits: u64) {
        let word = self.map.get(e);
        let mut cur = word.load(Acquire);
        while cur != 0 {
            let rest = cur & MASK & !bits;
            let new = if rest == 0 { 0 } else { (cur & !MASK) | rest };
            match word.compare_exchange(cur, new, AcqRel, Acquire) {
                Ok(_) => {
                    if new == 0 {
                        self.free_unit((cur >> 32) as usize - 1);
                    }
                    return;
                }
                Err(now) => cur = now,
            }
        }
    }

    /// The unit of entry `e` if every page of `bits` is stored there.
    fn stored(&self, e: usize, bits: u64) -> Option<usize> {
        let cur = self.map.get(e).load(Acquire);
        (cur != 0 && cur & bits == bits).then(|| (cur >> 32) as usize - 1)
    }
}

/// The pieces of `[off, off+len)` by table entry: (entry, offset in the unit, length,
/// page bits, offset from `off`).
fn pieces(off: u64, len: usize) -> impl Iterator<Item = (usize, usize, usize, u64, usize)> {
    let ps = attune_sys::page_size();
    let end = off as usize + len;
    let mut p = off as usize;
    std::iter::from_fn(move || {
        if p >= end {
            return None;
        }
        let (e, intra) = (p / UNIT, p % UNIT);
        let plen = (UNIT - intra).min(end - p);
        let bits = ((1u64 << (plen / ps)) - 1) << (intra / ps);
        let r = (e, intra, plen, bits, p - off as usize);
        p += plen;
        Some(r)
    })
}

impl Drop for PoolTier {
    fn drop(&mut self) {
        let base = self.base.load(Acquire);
        if base != 0 {
            let _ = mem::unmap(base, self.reach);
        }
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
        _already_there: &mut dyn FnMut(usize) -> bool,
    ) -> SysResult<()> {
        let base = self.base.load(Acquire);
        let Some(fd) = self.fd.get() else {
            return Err(Errno(libc::ENOSPC));
        };
        if base == 0 || self.detached.load(Relaxed) {
            return Err(Errno(libc::ENOSPC));
        }
        // Units first: with no room, nothing leaves the region.
        let mut claimed = 0;
        for (e, _, _, bits, rel) in pieces(off, len) {
            if let Err(err) = self.claim(e, bits) {
                for (e, _, _, bits, _) in pieces(off, rel) {
                    self.unclaim(e, bits);
                }
                return Err(err);
            }
            claimed += 1;
        }
        let undo = || {
            for (e, _, _, bits, _) in pieces(off, len).take(claimed) {
                self.unclaim(e, bits);
            }
        };
        let Some(slot) = io.staging.claim(len) else {
            undo();
            return Err(Errno(libc::EAGAIN));
        };
        let st = slot.addr();
        let moved = match super::take_out(io.internal, region_uffd, st, src, len) {
            Ok(m) => m,
            Err(e) => {
                undo();
                return Err(e);
            }
        };
        if moved < len {
            let back = super::give_back(region_uffd, src, st, moved);
            let _ = mem::advise(st, len, mem::MADV_DONTNEED);
            undo();
            return Err(Errno(if back { libc::EBUSY } else { libc::EIO }));
        }
        let mut filled = false;
        let mut result = Ok(());
        for (e, intra, plen, bits, rel) in pieces(off, len) {
            let u = self.stored(e, bits).ok_or(Errno(libc::EIO));
            let mut r =
                u.and_then(|u| mem::pwrite_raw(fd, st + rel, plen, (u * UNIT + intra) as u64));
            if matches!(r, Err(Errno(libc::EFAULT))) && !filled {
                // Holes in the staged run (pages the program discarded): zeros, as it
                // would read them.
                super::file::fill_holes(io.internal, st, len);
                filled = true;
                r = u.and_then(|u| mem::pwrite_raw(fd, st + rel, plen, (u * UNIT + intra) as u64));
            }
            if r.is_err() {
                result = r;
                break;
            }
        }
        if let Err(e) = result {
            let back = super::give_back(region_uffd, src, st, len);
            let _ = mem::advise(st, len, mem::MADV_DONTNEED);
            undo();
            return Err(if back { e } else { Errno(libc::EIO) });
        }
        let _ = mem::advise(st, len, mem::MADV_DONTNEED);
        Ok(())
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
        for (e, intra, plen, bits, rel) in pieces(off, len) {
            // Every chunk loaded from here was stored here: pages missing from the table
            // are a runtime bug, reported, never read as zeros.
            let u = self.stored(e, bits).ok_or(Errno(libc::EIO))?;
            match region_uffd.copy(dst + rel, base + u * UNIT + intra, plen, true) {
                Ok(_) => {}
                Err(Errno(libc::EEXIST)) => {
                    let _ = region_uffd.wake(dst + rel, plen);
                }
                // Nothing released: the chunk stays far, and a later fetch copies again
                // (pages placed already answer EEXIST).
                Err(err) => return Err(err),
            }
        }
        for (e, _, _, bits, _) in pieces(off, len) {
            self.unclaim(e, bits);
        }
        Ok(())
    }

    fn discard(&self, off: u64, len: usize) {
        for (e, _, _, bits, _) in pieces(off, len) {
            if e < self.map.len() {
                self.unclaim(e, bits);
            }
        }
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
        let top = (self.top() as usize).min(self.reach);
        let used_top = {
            let mut t = 0;
            for w in (0..self.used.len()).rev() {
                let bits = self.used.get(w).load(Acquire);
                if bits != 0 {
                    t = (w * 64 + 64 - bits.leading_zeros() as usize) * UNIT;
                    break;
                }
            }
            t.min(top)
        };
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
        };
        PoolTier::new(&cfg, space).unwrap()
    }

    #[test]
    fn pieces_split_runs_at_unit_boundaries() {
        let v: Vec<_> = pieces(60 << 10, 72 << 10).collect();
        assert_eq!(
            v,
            vec![
                (0, 60 << 10, 4 << 10, 1 << 15, 0),
                (1, 0, 64 << 10, 0xffff, 4 << 10),
                (2, 0, 4 << 10, 1, 68 << 10),
            ]
        );
    }

    #[test]
    fn units_are_taken_lowest_first_within_the_limit_and_freed_by_the_last_page() {
        let t = tier(1 << 20, 1 << 30); // 16 units
        assert_eq!(
            t.claim(5, 1),
            Err(Errno(libc::ENOSPC)),
            "no segment: no unit"
        );
        t.set_size(2 * UNIT as u64);
        assert_eq!(t.claim(100, 0b11), Ok(0));
        assert_eq!(t.claim(100, 0b100), Ok(0), "same entry, same unit");
        assert_eq!(t.claim(7, 1), Ok(1));
        assert_eq!(t.claim(8, 1), Err(Errno(libc::ENOSPC)), "limit reached");
        assert_eq!(t.top(), 2 * UNIT as u64);
        t.unclaim(100, 0b1);
        assert_eq!(t.stored(100, 0b110), Some(0));
        assert_eq!(t.stored(100, 0b1), None, "that page is gone");
        t.unclaim(100, 0b110);
        assert_eq!(t.map.get(100).load(Relaxed), 0);
        assert_eq!(t.claim(8, 1), Ok(0), "the freed unit is taken again");
        // A shrunk grant: no new unit above it, units in use still count in `top`.
        t.set_size(UNIT as u64);
        t.unclaim(8, 1);
        assert_eq!(t.top(), 2 * UNIT as u64, "unit 1 still holds entry 7");
        assert_eq!(t.claim(9, 1), Ok(0));
        assert_eq!(t.claim(10, 1), Err(Errno(libc::ENOSPC)));
        t.unclaim(7, 1);
        t.unclaim(9, 1);
        assert_eq!((t.top(), t.units_bytes()), (UNIT as u64, 0));
    }

    #[test]
    fn concurrent_claims_of_one_entry_share_one_unit() {
        let t = std::sync::Arc::new(tier(4 << 20, 1 << 30));
        t.set_size(4 << 20);
        let hs: Vec<_> = (0..8)
            .map(|i| {
                let t = t.clone();
                std::thread::spawn(move || {
                    let mut units = Vec::new();
                    for round in 0..2000 {
                        let e = round % 3;
                        let bit = 1u64 << i;
                        units.push(t.claim(e, bit).unwrap());
                        assert!(t.stored(e, bit).is_some());
                        t.unclaim(e, bit);
                    }
                    units
                })
            })
            .collect();
        for h in hs {
            assert!(h.join().unwrap().iter().all(|&u| u < 64));
        }
        assert_eq!(t.units_bytes(), 0, "every unit freed");
        for e in 0..3 {
            assert_eq!(t.map.get(e).load(Relaxed), 0);
        }
    }
}
