//! Operations on regions off the fault path: allocate, free, pin, hold, discard,
//! prefetch. They ask `attune_policy` for the unit of movement and the home tier and use
//! the fault path (`fault.rs`) to bring chunks in.

use super::pager::{
    chunk_span, AllocOptions, Pager, KERNEL_ACCESS_MAY_FAIL, THREAD_FOR_NEW_REGIONS,
};
use crate::config::{FaultMode, Mode};
use crate::region::{Region, RegionKind, Where, ACTIVE, CREDIT_MASK};
use attune_policy::place;
use attune_sys::uffd::Delivery;
use attune_sys::{mem, os, Errno};
use std::sync::atomic::Ordering::*;
use std::sync::Arc;

/// How long acting on a discard report waits for the kernel to drop the pages it covers
/// (the program's thread drops them as soon as it runs again after the report's read),
/// for the whole report: a report of `MADV_FREE` pays it once.
const REPORTED_DROP_NS: u64 = 200_000;

/// The managed part of a range, placed in DRAM and pinned until dropped
/// ([`Pager::hold_range`]).
pub struct HeldRange<'a> {
    p: &'a Pager,
    parts: Vec<(Arc<Region>, Vec<usize>)>,
    bytes: usize,
}

impl HeldRange<'_> {
    /// Bytes of managed memory the hold covers.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for HeldRange<'_> {
    fn drop(&mut self) {
        let _in = self.p.enter();
        for (r, held) in &self.parts {
            self.p.release(r, held);
        }
    }
}

impl Pager {
    /// Brings the managed part of `[ptr, ptr+len)` into DRAM and keeps it there until the
    /// returned hold is dropped ([`Pager::hold`] on every region it overlaps). Parts that
    /// are not managed are left as they are.
    pub fn hold_range(&self, ptr: usize, len: usize) -> HeldRange<'_> {
        let mut h = HeldRange {
            p: self,
            parts: Vec::new(),
            bytes: 0,
        };
        let end = ptr.saturating_add(len);
        let _in = self.enter();
        for r in self.overlapping(ptr, len) {
            let a = ptr.max(r.base);
            let b = end.min(r.base + r.len);
            let mut held = Vec::new();
            self.hold(&r, a, b - a, &mut held);
            h.bytes += b - a;
            h.parts.push((r, held));
        }
        h
    }

    /// Makes `[addr, addr+len)` (inside `r`) resident and keeps it so: pins the chunks
    /// that were not pinned and pushes them on `held`, for [`Pager::release`]. For a
    /// kernel access that cannot fault (see `kernel_access_fails`). Chunks pinned already
    /// (by the program, or by another thread's hold) are left to their owner.
    pub fn hold(&self, r: &Region, addr: usize, len: usize, held: &mut Vec<usize>) {
        let (c0, c1) = chunk_span(r, addr, len);
        for c in c0..c1 {
            if r.pin(c) {
                self.pinned.fetch_add(r.chunk as u64, Relaxed);
                held.push(c);
            }
        }
        self.prefetch(r, addr, len);
    }

    /// Unpins the chunks a [`Pager::hold`] pinned.
    pub fn release(&self, r: &Region, held: &[usize]) {
        for &c in held {
            if r.unpin(c) {
                self.pinned.fetch_sub(r.chunk as u64, Relaxed);
            }
        }
    }

    /// Creates a region of at least `size` bytes.
    pub fn alloc_region(
        &self,
        size: usize,
        opts: &AllocOptions,
        kind: RegionKind,
        align: usize,
    ) -> Result<Arc<Region>, Errno> {
        self.make_region(size, opts, kind, align, None)
    }

    /// Makes `[at, at+len)` a region in place: the program asked for fresh anonymous
    /// memory there with `MAP_FIXED` (a runtime that reserves its heap and commits it in
    /// place: the JVM). `at` and `len` must be multiples of the chunk the policy gives
    /// this region, or EINVAL before anything is mapped. On any error after the mapping
    /// the range is left as the plain anonymous memory the program asked for.
    pub fn adopt_region(
        &self,
        at: usize,
        len: usize,
        opts: &AllocOptions,
    ) -> Result<Arc<Region>, Errno> {
        self.make_region(len, opts, RegionKind::Dedicated, 0, Some(at))
    }

    fn make_region(
        &self,
        size: usize,
        opts: &AllocOptions,
        kind: RegionKind,
        align: usize,
        at: Option<usize>,
    ) -> Result<Arc<Region>, Errno> {
        let attuned = self.cfg.mode == Mode::Attuned;
        let views: Vec<place::FarTierView> = self
            .tiers
            .iter()
            .map(|t| place::FarTierView {
                node_memory: t.is_memory(),
                capacity: t.cfg.capacity,
                min_chunk: t.cfg.min_chunk,
            })
            .collect();
        let request = place::Request {
            flags: opts.flags,
            attuned,
            preferred_tier: opts.preferred_tier,
            chunk: opts.chunk_size,
        };
        let place::Placement { home, chunk } = place::place(request, self.cfg.chunk_size, &views);
        if crate::config::validate_chunk(chunk).is_err() {
            return Err(Errno(libc::EINVAL));
        }
        if size == 0 {
            return Err(Errno(libc::EINVAL));
        }
        if at.is_some_and(|a| a % chunk != 0 || size % chunk != 0) {
            return Err(Errno(libc::EINVAL));
        }
        let len = size.checked_add(chunk - 1).ok_or(Errno(libc::ENOMEM))? / chunk * chunk;
        if kind == RegionKind::Dedicated {
            let prev = self.committed.fetch_add(len as u64, AcqRel);
            if prev + len as u64 > self.capacity {
                self.committed.fetch_sub(len as u64, AcqRel);
                return Err(Errno(libc::ENOMEM));
            }
        }
        let undo_commit = || {
            if kind == RegionKind::Dedicated {
                self.committed.fetch_sub(len as u64, AcqRel);
            }
        };
        let align = align.max(if len >= 2 << 20 { 2 << 20 } else { chunk });
        let mapped = match at {
            Some(a) => mem::map_anon_at(a, len).map(|()| a),
            None => mem::map_anon_aligned(len, align, true),
        };
        let base = match mapped {
            Ok(b) => b,
            Err(e) => {
                undo_commit();
                return Err(e);
            }
        };
        // Undoes the mapping on a later error: an adopted range stays mapped, as the
        // program asked (plain memory, no longer ours).
        let unmap = |b: usize, l: usize| {
            if at.is_none() {
                let _ = mem::unmap(b, l);
            }
        };
        // Regions never put on huge pages say so to the kernel too, so that its khugepaged
        // (transparent_hugepage/enabled = always) leaves them alone; the others are left
        // to `super::huge`, whose spans are 2 MiB-aligned (an adopted range may not be).
        // Inherited by a forked child, which takes the runtime over (`crate::fork`).
        let huge = kind == RegionKind::Dedicated
            && base % (2 << 20) == 0
            && super::huge::eligible(self, opts.flags, len);
        if !huge {
            let _ = mem::advise(base, len, mem::MADV_NOHUGEPAGE);
        }
        let delivery = match opts.fault_mode {
            Some(FaultMode::Signal) => Delivery::Signal,
            Some(FaultMode::Thread) => Delivery::Thread,
            None if THREAD_FOR_NEW_REGIONS.load(Relaxed) => Delivery::Thread,
            None => match self.cfg.fault_mode {
                FaultMode::Thread => Delivery::Thread,
                FaultMode::Signal => Delivery::Signal,
            },
        };
        if delivery == Delivery::Signal {
            KERNEL_ACCESS_MAY_FAIL.store(true, Relaxed);
            self.counters.regions_signal.fetch_add(1, Relaxed);
        } else {
            self.counters.regions_thread.fetch_add(1, Relaxed);
        }
        if let Err(e) = self
            .uffd_for(delivery)
            .register(base, len, self.region_mode())
        {
            unmap(base, len);
            undo_commit();
            return Err(e);
        }
        let mut slots = Vec::with_capacity(self.tiers.len());
        for t in &self.tiers {
            match t.reserve(len as u64) {
                Some(o) => slots.push(o),
                None => {
                    for (i, o) in slots.iter().enumerate() {
                        self.tiers[i].release(*o, len as u64);
                    }
                    let _ = self.uffd_for(delivery).unregister(base, len);
                    unmap(base, len);
                    undo_commit();
                    return Err(Errno(libc::ENOMEM));
                }
            }
        }
        let id = self.next_id.fetch_add(1, Relaxed);
        // Online prediction samples the regions that come without flags (and without a
        // pin of their own) for `predict_window_ms`; `attune profile` samples every region.
        let predicting = place::predicts(
            opts.flags,
            attuned,
            opts.pin_bytes.is_some(),
            self.cfg.predict_window_ms,
        );
        let sampling = self.cfg.sample_rate > 0 || predicting;
        let r = Arc::new(Region::new(
            id,
            base,
            len,
            size,
            chunk,
            opts.flags,
            delivery,
            kind,
            slots,
            home,
            sampling && kind == RegionKind::Dedicated,
            huge,
        ));
        if predicting && kind == RegionKind::Dedicated {
            r.predict_due.store(
                os::now_ns() + self.cfg.predict_window_ms * 1_000_000,
                Relaxed,
            );
        }
        {
            let _g = os::SignalGuard::new();
            let mut t = self.regions.write().unwrap_or_else(|p| p.into_inner());
            let i = t.partition_point(|x| x.base < base);
            t.insert(i, r.clone());
        }
        let pin = place::initial_pin(
            opts.pin_bytes,
            len,
            opts.flags,
            attuned,
            self.cfg.pin_fraction,
            self.policy_pin_room(),
            r.chunk,
        );
        if pin > 0 {
            self.pin(&r, base, pin, true);
        }
        if opts.prefault {
            let room =
                attune_policy::budget::prefault_room(self.budget(), self.resident.load(Relaxed))
                    as usize;
            self.prefetch(&r, base, len.min(room));
        }
        Ok(r)
    }

    /// Frees a dedicated region that starts exactly at `ptr`.
    pub fn free_region(&self, r: &Arc<Region>) {
        // The clock lock keeps the evictor out of this region while it goes away.
        let _g = os::SignalGuard::new();
        let _clock = self.clock.lock().unwrap_or_else(|p| p.into_inner());
        self.retire(r, true);
    }

    /// Gives region `r` back to the kernel in place: its pages stay mapped as plain
    /// anonymous memory, with the content they have, and the runtime forgets them (the
    /// program maps something else over part of it with `MAP_FIXED`, which the kernel
    /// must do on memory that is no longer ours). Chunks in a far tier are brought back
    /// first, pinned so that no eviction takes them out again meanwhile. False, and the
    /// region kept, when a chunk is still on its way in or out (another thread touches
    /// the range while it is being replaced) or could not be read back.
    pub fn release_region(&self, r: &Arc<Region>) -> bool {
        let mut pinned_here = Vec::with_capacity(r.chunks());
        for c in 0..r.chunks() {
            let new = r.pin(c);
            if new {
                self.pinned.fetch_add(r.chunk as u64, Relaxed);
            }
            pinned_here.push(new);
            if r.state(c).place() == Where::Far {
                super::fault::fetch_chunk(self, r, c);
                // A chunk still far could not be read back, which fails the release:
                // the rest are not read for nothing (a lost tier file printed one error
                // per chunk, 384 for a 24 MiB heap, tests/run/fixed_lost.c).
                if r.state(c).place() == Where::Far {
                    break;
                }
            }
        }
        let _g = os::SignalGuard::new();
        let _clock = self.clock.lock().unwrap_or_else(|p| p.into_inner());
        let settled =
            (0..r.chunks()).all(|c| matches!(r.state(c).place(), Where::Fresh | Where::Resident));
        if !settled {
            for (c, _) in pinned_here.iter().enumerate().filter(|(_, p)| **p) {
                if r.unpin(c) {
                    self.pinned.fetch_sub(r.chunk as u64, Relaxed);
                }
            }
            return false;
        }
        self.retire(r, false);
        true
    }

    /// Takes `r` out of the runtime (the caller holds the clock lock): out of the region
    /// table, unregistered, its counters and far-tier space given back, and, with `unmap`,
    /// its range unmapped.
    fn retire(&self, r: &Arc<Region>, unmap: bool) {
        {
            let mut t = self.regions.write().unwrap_or_else(|p| p.into_inner());
            t.retain(|x| !Arc::ptr_eq(x, r));
        }
        r.freed.store(true, Release);
        self.drop_behind.forget(r.base, r.len);
        let _ = self.uffd_for(r.delivery).unregister(r.base, r.len);
        if unmap {
            let _ = mem::unmap(r.base, r.len);
        }
        let mut resident = 0u64;
        let mut pinned = 0u64;
        let mut active = 0u64;
        for c in 0..r.chunks() {
            let s = r.state(c);
            if s.pinned() {
                pinned += r.chunk as u64;
            }
            match s.place() {
                Where::Resident | Where::Fetching | Where::Evicting => {
                    resident += r.chunk as u64;
                    if s.active() {
                        active += r.chunk as u64;
                    }
                }
                Where::Far => {
                    if let Some(t) = self.tiers.get(s.tier()) {
                        t.forget(r.chunk as u64);
                    }
                }
                Where::Fresh => {}
            }
        }
        let _ = self
            .resident
            .fetch_update(AcqRel, Acquire, |v| Some(v.saturating_sub(resident)));
        let _ = self
            .pinned
            .fetch_update(AcqRel, Acquire, |v| Some(v.saturating_sub(pinned)));
        self.deactivate(active);
        // The stored content goes now; the offsets return in `evict::drop_retired`, once
        // no fetch of this region is in flight (a use after free by another thread must
        // not release a new owner's slot).
        for (i, o) in r.slots.iter().enumerate() {
            self.tiers[i].discard(*o, r.len as usize);
        }
        if r.kind == RegionKind::Dedicated {
            self.committed.fetch_sub(r.len as u64, AcqRel);
        }
        self.retired
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(r.clone());
        if r.samples.enabled() {
            let mut h = self
                .sampled_history
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            if h.len() >= 1024 {
                h.remove(0);
            }
            h.push(r.clone());
        }
    }

    /// Makes `[addr, addr+len)` resident and, with `pin`, never evicted.
    pub fn pin(&self, r: &Region, addr: usize, len: usize, pin: bool) {
        let (c0, c1) = chunk_span(r, addr, len);
        for c in c0..c1 {
            if pin {
                if r.pin(c) {
                    self.pinned.fetch_add(r.chunk as u64, Relaxed);
                }
            } else if r.unpin(c) {
                self.pinned.fetch_sub(r.chunk as u64, Relaxed);
            }
        }
        if pin {
            self.prefetch(r, addr, len);
        }
    }

    /// Drops the content of `[addr, addr+len)` (page-aligned, inside `r`): it reads as zero
    /// afterwards. Whole chunks go back to Fresh, their DRAM and far-tier space released
    /// (the application's `MADV_DONTNEED` cannot do that for a chunk in a far tier: its
    /// pages are not mapped, so its old content would come back). The parts of chunks at
    /// the edges, and pinned chunks (they stay resident), must be written with zeros: they
    /// are returned, for the caller to zero with [`zero_discarded`] once it has left the
    /// fork gate. Writing them here, inside it, faulted on a non-resident edge while a
    /// fork closed the gate: the handler thread could not enter to serve the fault, the
    /// fork waited its 5 s and its child lost its managed memory (found by the soak,
    /// tests/stress/soak.c).
    pub fn discard(&self, r: &Region, addr: usize, len: usize) -> Vec<(usize, usize)> {
        self.discard_as(r, addr, len, None)
    }

    /// [`Pager::discard`]; `reported`: the kernel reported the program's own discard and
    /// drops the mapped pages itself, right after the report was read: the time until
    /// which that drop is waited for ([`Pager::let_go`]).
    fn discard_as(
        &self,
        r: &Region,
        addr: usize,
        len: usize,
        reported: Option<u64>,
    ) -> Vec<(usize, usize)> {
        let end = addr + len;
        let lo = (addr - r.base).div_ceil(r.chunk);
        let hi = (end - r.base) / r.chunk;
        let mut zero: Vec<(usize, usize)> = Vec::new();
        let mut add = |a: usize, b: usize| {
            if b > a {
                match zero.last_mut() {
                    Some(last) if last.1 == a => last.1 = b,
                    _ => zero.push((a, b)),
                }
            }
        };
        if lo >= hi {
            add(addr, end);
            return zero;
        }
        add(addr, r.chunk_addr(lo));
        for c in lo..hi {
            if !self.discard_chunk(r, c, reported) {
                add(r.chunk_addr(c), r.chunk_addr(c) + r.chunk);
            }
        }
        add(r.chunk_addr(hi), end);
        zero
    }

    /// Drops chunk `c`'s content and space; false for a pinned resident chunk (the caller
    /// zeroes it in place).
    fn discard_chunk(&self, r: &Region, c: usize, reported: Option<u64>) -> bool {
        let mut spins = 0u32;
        loop {
            let s = r.state(c);
            match s.place() {
                Where::Fresh => return true,
                Where::Fetching | Where::Evicting => crate::sync::gate::backoff(&mut spins),
                Where::Resident if s.pinned() => return false,
                Where::Resident | Where::Far => {
                    // Held while its content goes: no fetch or eviction runs meanwhile.
                    if !r.claim_hold(c, s) {
                        continue;
                    }
                    if s.place() == Where::Resident {
                        if !self.let_go(r.chunk_addr(c), r.chunk, reported) {
                            // A page a fork left shared cannot move: the chunk stays
                            // resident and the caller writes zeros over it, as over a
                            // pinned one (`tests/stress/soak.c` found such pages not zero).
                            // After a report: pages placed again since (`let_go`), left.
                            r.settle(c, Where::Resident, s.tier(), 0);
                            return false;
                        }
                        super::huge::split(self, r, c, 1);
                        let _ = self.resident.fetch_update(AcqRel, Acquire, |v| {
                            Some(v.saturating_sub(r.chunk as u64))
                        });
                        if s.active() {
                            self.deactivate(r.chunk as u64);
                        }
                    } else if let Some(t) = self.tiers.get(s.tier()) {
                        t.discard(r.slots[s.tier()] + (c * r.chunk) as u64, r.chunk);
                        t.forget(r.chunk as u64);
                    }
                    for h in r.page_hashes(c, 1) {
                        h.store(0, Relaxed);
                    }
                    r.counters.discarded.fetch_add(1, Relaxed);
                    r.set_bits(c, 0, ACTIVE | CREDIT_MASK);
                    r.settle(c, Where::Fresh, 0, 0);
                    return true;
                }
            }
        }
    }

    /// The kernel reported a discard of `[start, end)` (`EVENT_REMOVE`: the program's own
    /// `MADV_DONTNEED` or `MADV_FREE`, without libc, which the interposer does not see).
    /// The kernel drops the mapped pages once the report is read, but a chunk held in a far
    /// tier is not mapped, and its old content would come back where Linux promises zeros:
    /// Go's allocator then used such memory as zeroed and its collector found stale
    /// pointers (docs/design/run.md, "Discards the interposer does not see"). So whole
    /// chunks go back to Fresh, as a discard through the interposer does, and the
    /// covered pages of a chunk at an edge are dropped now, a far one fetched first: none
    /// may be evicted with its old content between this and the kernel's own drop.
    /// Pinned chunks stay (no eviction moves them; the kernel's drop leaves zeros), and so
    /// do chunks the program placed pages in again since its `madvise` (`let_go`).
    pub fn removed(&self, start: usize, end: usize) {
        let ps = attune_sys::page_size();
        let mut a = start & !(ps - 1);
        while a < end {
            let Some(r) = self.find(a) else {
                return;
            };
            let b = end.min(r.base + r.len);
            // What `discard` leaves: the parts of chunks at the edges, and pinned chunks.
            let deadline = os::now_ns() + REPORTED_DROP_NS;
            for (x, y) in self.discard_as(&r, a, b - a, Some(deadline)) {
                let mut p = x;
                while p < y {
                    let c = r.chunk_of(p);
                    let q = y.min(r.chunk_addr(c) + r.chunk);
                    if q - p < r.chunk {
                        self.drop_part(&r, c, p, q, deadline);
                    }
                    p = q;
                }
            }
            a = b;
        }
    }

    /// Drops the pages `[a, b)` of chunk `c` of `r` (part of it), which stays resident with
    /// those pages missing (a touch maps zeros): a far chunk is fetched first. Called while
    /// the report of `[a, b)` is read and not acted on, so a fetch here maps zeros there
    /// (`super::fault::fetch_run`).
    fn drop_part(&self, r: &Region, c: usize, a: usize, b: usize, deadline: u64) {
        let mut spins = 0u32;
        let mut fetched = false;
        let mut zeroed = false;
        loop {
            let s = r.state(c);
            match s.place() {
                Where::Fresh => return,
                Where::Fetching | Where::Evicting => crate::sync::gate::backoff(&mut spins),
                Where::Far if fetched => return, // could not be read back: stays poisoned
                Where::Far => {
                    zeroed = super::fault::fetch_chunk(self, r, c);
                    fetched = true;
                }
                Where::Resident => {
                    if !r.claim_hold(c, s) {
                        continue;
                    }
                    // Placed before the report was read (by a fault, or resident all along):
                    // the kernel's drop follows the read, and the chunk is held until then,
                    // so no eviction takes the old content to a far tier meanwhile.
                    if !zeroed {
                        self.let_go(a, b - a, Some(deadline));
                    }
                    super::huge::split(self, r, c, 1);
                    r.counters.discarded.fetch_add(1, Relaxed);
                    r.settle(c, Where::Resident, s.tier(), 0);
                    return;
                }
            }
        }
    }

    /// Makes the pages of `[addr, addr+len)` (of chunks the caller holds) go; whether
    /// every page went. Where the kernel reported the program's discard, its own drop
    /// follows the report's read at once: this waits for it until `reported` (ns), and
    /// moves nothing. On 6.18 a `UFFDIO_MOVE` of a range while the program's
    /// `MADV_DONTNEED` was dropping it looped in the kernel for good
    /// (tests/run/raw_madvise.c, 6 runs in 60). Pages still there at the deadline stay,
    /// and so does their chunk: the program touched them again after its `madvise`
    /// returned (placed before this caller held the chunk; they are its content now, and a
    /// chunk called Fresh over them lost a later `attune_discard`, tests/c/discard.c), or
    /// a report of `MADV_FREE` kept them (either content is right after it). Otherwise
    /// [`Pager::drop_pages`].
    fn let_go(&self, addr: usize, len: usize, reported: Option<u64>) -> bool {
        let Some(deadline) = reported else {
            return self.drop_pages(addr, len);
        };
        let mut spins = 0u32;
        while mem::any_present(addr, len) && os::now_ns() < deadline {
            crate::sync::gate::backoff(&mut spins);
        }
        !mem::any_present(addr, len)
    }

    /// Brings `[addr, addr+len)` into DRAM now (as if faulted), within the budget.
    pub fn prefetch(&self, r: &Region, addr: usize, len: usize) {
        let (c0, c1) = chunk_span(r, addr, len);
        for c in c0..c1 {
            super::fault::fetch_chunk(self, r, c);
        }
    }
}

/// Writes zeros over the ranges [`Pager::discard`] returned. Outside the fork gate: a
/// non-resident page faults here, and the fault path must be free to enter the gate.
/// The ranges come from `discard` on a region the caller still holds (the application
/// asked for the discard and owns the memory until it frees it): `zero_managed`'s
/// contract.
pub fn zero_discarded(ranges: &[(usize, usize)]) {
    for &(a, b) in ranges {
        mem::zero_managed(a, b - a);
    }
}
