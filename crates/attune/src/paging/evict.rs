//! Replacement: the CLOCK over all regions' resident chunks, and the background evictor
//! that keeps a free headroom under the DRAM budget so faulting threads rarely evict.
//!
//! Decisions come from `attune_policy::victim::clock_decide` (pinned chunks never,
//! LAT/SHL regions only as a last resort, active chunks only while the active class is
//! over its target); this module only moves pages.
//!
//! The hand is global: each visit to a region looks at a fixed share of its chunks
//! (`scan_quantum`) and moves on to the next region, so every region's chunks age at the
//! same rate. (A hand that stays in one region while it yields victims evicts a hot
//! region over and over while dead chunks of other regions stay resident.)

use super::behind::BEHIND;
use super::pager::{Pager, MAX_RUN};
use crate::region::{Region, State, Where, ACTIVE, CREDIT_MASK, HASH_PAGE, SHARED};
use crate::tier::{Pieces, Staged};
use attune_policy::victim::{capacity_first, clock_decide, scan_quantum, ChunkView, ClockAction};
use attune_policy::writeback;
use attune_sys::os;
use std::sync::atomic::Ordering::*;
use std::sync::Arc;

/// The most chunks of `r` one eviction move takes: `evict_batch` bytes, at most
/// `MAX_RUN`. In bytes, not chunks: counted in chunks, 4 KiB chunks moved 16 times fewer
/// bytes per move than 64 KiB ones, and streams ran 11-51% slower than 64 KiB chunks for it
/// where now they run within 10-20% (`bench/unit.py`, docs/benchmarks.md "Transfer units").
fn max_run(e: &Pager, r: &Region) -> usize {
    (e.cfg.evict_batch.min(MAX_RUN) / r.chunk).max(1)
}

/// The most bytes one store can put in a far tier now: the largest free capacity among
/// the tiers that take pages (0: every tier full or backing off). A sweep builds no run
/// larger than this and ends when it is below a chunk. Before the rule, a memory tier
/// with one page free and a file tier backing off from ENOSPC made every fault's reclaim
/// claim run after run that no tier took, to put each back: 0.7 ms of CPU a fault, 31 s
/// for `file-tier-full` in `scripts/test.sh` (docs/reliability.md, "The full-disk case").
fn room(e: &Pager) -> u64 {
    e.tiers.iter().map(|t| t.room()).max().unwrap_or(0)
}

/// Whether the far tiers can take `bytes` more now (at least one chunk of the
/// configured size): when they cannot, a fault that still needs them may wait for the
/// daemon to grow one (`super::room`).
pub(super) fn has_room_for(e: &Pager, bytes: u64) -> bool {
    room(e) >= bytes.max(e.cfg.chunk_size as u64)
}

/// `max_run(e, r)` cut to what `room` can take now (0: not one chunk of `r`).
fn fitting_run(e: &Pager, r: &Region) -> usize {
    max_run(e, r).min((room(e) / r.chunk as u64) as usize)
}

/// Flushes the run `[c, c+n)` into `freed`; returns the longest run that may be built
/// next, 0 when the sweep must end: every tier refused this one for lack of room, or
/// `room` is below a chunk.
fn flush_and_fit(e: &Pager, r: &Region, c: usize, n: usize, freed: &mut u64) -> usize {
    match flush_run(e, r, c, n) {
        Some(f) => {
            *freed += f;
            fitting_run(e, r)
        }
        None => 0,
    }
}

/// Evicts chunks from the drop-behind ring, newest first, until `want` bytes are freed or
/// the ring is empty. Caller holds the clock lock (one drainer) and the table's read lock.
fn reclaim_behind(e: &Pager, table: &[Arc<Region>], want: u64) -> u64 {
    let d = &e.drop_behind;
    let head = d.head.load(Acquire);
    if head == d.empty_at.load(Relaxed) {
        return 0;
    }
    let mut freed = 0u64;
    let mut drained = true;
    'entries: for k in 0..BEHIND {
        if freed >= want {
            drained = false;
            break;
        }
        let slot = &d.ring[(head + BEHIND - 1 - k) % BEHIND];
        let v = slot.swap(0, AcqRel);
        if v == 0 {
            continue;
        }
        let (addr, n) = ((v & !0xfff) as usize, (v & 0xfff) as usize);
        let i = table.partition_point(|r| r.base <= addr);
        let Some(r) = i.checked_sub(1).map(|i| &table[i]) else {
            continue;
        };
        if addr >= r.base + r.len || r.freed.load(Acquire) || e.is_protected(r) {
            continue;
        }
        let mut max_run = fitting_run(e, r);
        if max_run == 0 {
            // No tier takes a chunk now: the entry waits for the next drain (unless a
            // push took its slot meanwhile).
            let _ = slot.compare_exchange(0, v, AcqRel, Relaxed);
            drained = false;
            break;
        }
        let c0 = (addr - r.base) / r.chunk;
        let (mut start, mut len) = (c0, 0usize);
        for c in c0..(c0 + n).min(r.chunks()) {
            let s = r.state(c);
            // Inactive resident chunks only: an active one is in the working set the
            // clock keeps (its accounting moves only through a demotion).
            let take = !s.active() && s.0 & SHARED == 0 && r.claim_evict(c, s);
            if take {
                if len == 0 {
                    start = c;
                }
                len += 1;
            }
            if len > 0 && (!take || len == max_run) {
                max_run = flush_and_fit(e, r, start, len, &mut freed);
                len = 0;
                if max_run == 0 {
                    drained = false;
                    break 'entries;
                }
            }
        }
        if len > 0 && flush_and_fit(e, r, start, len, &mut freed) == 0 {
            drained = false;
            break;
        }
    }
    if drained {
        // Every entry taken (or skipped): empty until the next push moves `head`.
        d.empty_at.store(head, Relaxed);
    }
    e.counters.dropped_behind_bytes.fetch_add(freed, Relaxed);
    freed
}

/// Evicts until at least `want` bytes are freed or nothing more can go. Returns bytes
/// freed. Signal-safe (called from the fault path for direct reclaim). Chunks streams
/// have just passed go first (`DropBehind`), then the clock.
pub fn reclaim(e: &Pager, want: u64) -> u64 {
    // Nowhere to put pages (every tier full): do not sweep for nothing.
    if room(e) < 4096 {
        return 0;
    }
    let mut clock = e.clock.lock().unwrap_or_else(|p| p.into_inner());
    let table = e.regions.read().unwrap_or_else(|p| p.into_inner());
    if table.is_empty() {
        return 0;
    }
    let total: usize = table.iter().map(|r| r.chunks()).sum();
    let mut freed = reclaim_behind(e, &table, want);
    if freed >= want {
        return freed;
    }
    // Capacity data gives way first (attuned mode): a clock pass over the CAP regions
    // alone, when there are others to make room for.
    let attuned = e.cfg.mode == crate::config::Mode::Attuned;
    let is_cap = |r: &Region| capacity_first(r.flags(), attuned);
    let (ncap, cap_total) = table
        .iter()
        .filter(|r| is_cap(r))
        .fold((0usize, 0usize), |(n, t), r| (n + 1, t + r.chunks()));
    if ncap > 0 && ncap < table.len() {
        let cursor = &mut clock.cap_cursor;
        freed += sweep_laps(
            e,
            &table,
            cursor,
            is_cap,
            (ncap, cap_total),
            want - freed,
            false,
        );
        if freed >= want {
            return freed;
        }
    }
    // Pass 0: ordinary; pass 1, the last resort: pageable chunks of protected regions and
    // active chunks too. Every region LAT/SHL (a latency-sensitive workflow alone): only
    // the last resort can free anything.
    let first_pass = if table.iter().all(|r| e.is_protected(r)) {
        1
    } else {
        0
    };
    for pass in first_pass..2 {
        let cursor = &mut clock.region_cursor;
        let all = (table.len(), total);
        freed += sweep_laps(e, &table, cursor, |_| true, all, want - freed, pass == 1);
        if freed >= want {
            return freed;
        }
    }
    freed
}

/// Sweeps the regions `pick` selects (`picked`: how many, and their chunks), in turn from
/// `cursor`, until `want` bytes are freed, for up to MAX_CREDIT + 2 laps (grace is taken
/// one lap at a time, an active chunk is demoted in one lap and evicted after its grace).
/// A lap in which the hand found nothing to age, demote or evict will not find anything
/// in the next, so it ends there (a process whose memory is all LAT/SHL would otherwise
/// scan every lap on every fault). It ends too where no far tier takes a chunk (`room`).
/// Returns bytes freed. Allocates nothing: reclaim runs in the SIGBUS handler too.
fn sweep_laps(
    e: &Pager,
    table: &[Arc<Region>],
    cursor: &mut usize,
    pick: impl Fn(&Region) -> bool,
    picked: (usize, usize),
    want: u64,
    last_resort: bool,
) -> u64 {
    let (regions, chunks) = picked;
    let laps = attune_policy::victim::MAX_CREDIT as usize + 2;
    let (mut freed, mut scanned, mut lap_scanned, mut lap_acted) = (0u64, 0usize, 0usize, 0usize);
    while scanned < laps * chunks + regions {
        let ri = *cursor % table.len();
        *cursor = ri + 1;
        let r = &table[ri];
        if !pick(r) {
            continue;
        }
        let (f, s, acted, no_room) = sweep_region(e, r, want - freed, last_resort);
        freed += f;
        scanned += s.max(1);
        if freed >= want || no_room {
            return freed;
        }
        lap_scanned += s.max(1);
        lap_acted += acted;
        if lap_scanned >= chunks {
            if lap_acted == 0 {
                break;
            }
            (lap_scanned, lap_acted) = (0, 0);
        }
    }
    freed
}

/// Visits where a region is lapped (see `scan_quantum`).
const LAP_VISITS: usize = 32;

/// Moves one region's hand over its quantum of chunks; returns (bytes evicted, chunks
/// looked at, chunks aged, demoted or claimed for eviction, whether it stopped because no
/// far tier takes a chunk of `r` now: see `room`).
fn sweep_region(e: &Pager, r: &Region, want: u64, last_resort: bool) -> (u64, usize, usize, bool) {
    let n = r.chunks();
    if n == 0 || r.freed.load(Acquire) {
        return (0, 0, 0, false);
    }
    let protected = e.is_protected(r);
    let mut max_run = fitting_run(e, r);
    if max_run == 0 {
        return (0, 0, 0, true);
    }
    let quantum = scan_quantum(n, LAP_VISITS);
    // Read once per visit and again after each demotion (the only thing here that moves
    // it), not for every chunk looked at.
    let mut active_over = e.active_over_target();
    let mut freed = 0u64;
    let mut run_start = 0usize;
    let mut run_len = 0usize;
    let mut acted = 0usize;
    let start = r.hand.load(Relaxed) % n;
    let mut i = 0;
    while i < quantum {
        let c = (start + i) % n;
        i += 1;
        // A run must be contiguous and not wrap around the region's end.
        if run_len > 0 && (c != run_start + run_len || run_len == max_run) {
            max_run = flush_and_fit(e, r, run_start, run_len, &mut freed);
            run_len = 0;
            if freed >= want || max_run == 0 {
                r.hand.store(c, Relaxed);
                return (freed, i - 1, acted, max_run == 0);
            }
        }
        let s = r.state(c);
        if s.0 & SHARED != 0 {
            // Waits for the evictor's un-share pass (a fork left its pages shared).
            continue;
        }
        let view = ChunkView {
            resident: s.place() == Where::Resident,
            pinned: s.pinned(),
            active: s.active(),
            credit: s.credit(),
            protected_region: protected,
        };
        let action = clock_decide(view, last_resort, active_over);
        if action != ClockAction::Skip {
            acted += 1;
        }
        match action {
            ClockAction::Skip => {}
            ClockAction::Age => {
                let credit = State::class_bits(false, s.credit() - 1);
                let _ = r.cas(c, s, s.with_bits(0, CREDIT_MASK).with_bits(credit, 0));
            }
            ClockAction::Demote => {
                if demote(e, r, c, s) {
                    active_over = e.active_over_target();
                }
            }
            ClockAction::Evict => {
                if r.claim_evict(c, s) {
                    if run_len == 0 {
                        run_start = c;
                    }
                    run_len += 1;
                }
            }
        }
    }
    let no_room = run_len > 0 && flush_and_fit(e, r, run_start, run_len, &mut freed) == 0;
    r.hand.store((start + quantum) % n, Relaxed);
    (freed, quantum, acted, no_room)
}

/// Stores chunks `[c, c+n)` (claimed Evicting by this thread) in a far tier: the home
/// tier first, then the others fastest first. On failure they stay resident. Bytes
/// stored; None when every tier refused them for lack of room (full, failing, backing
/// off): the sweep then ends, as the next run would meet the same tiers (a medium whose
/// refusal `room` cannot foresee, a file on a disk fuller than its `capacity` before its
/// first ENOSPC or a pool tier with no free page in its segment, costs one run a sweep).
fn flush_run(e: &Pager, r: &Region, c: usize, n: usize) -> Option<u64> {
    store_run(e, r, c, n, None)
}

/// Whether the staged run of `n` chunks of `r` at `staged` is fills, chunk by chunk, each
/// word in the dictionary: then their indices are in `out`. The run has no hole (a page
/// the program dropped behind the interposer's back): `tier::store_staged` maps them as
/// zeros first, since inside the SIGBUS handler a fault on one could not be served. So no
/// `mincore` vouches for the run (that call made random updates 1.13x slower over the
/// file tier and 1.09x through the pool: docs/benchmarks.md, "filled chunks").
/// Signal-safe.
fn staged_fills(e: &Pager, r: &Region, staged: usize, n: usize, out: &mut [u32]) -> bool {
    if n > out.len() {
        return false;
    }
    for (i, slot) in out.iter_mut().enumerate().take(n) {
        let Some(w) = super::fill::fill_word(staged + i * r.chunk, r.chunk) else {
            return false;
        };
        let Some(k) = e.fills.index(w) else {
            return false;
        };
        *slot = k;
    }
    true
}

/// [`flush_run`] for the access sampler: the same move, counted as a sample, not an
/// eviction. Returns when the chunk left the program's mapping (by the sampler's clock,
/// `Pager::sample_now`): a staging medium then still writes it (a 4 KiB file-tier
/// park took tens of µs), and a touch meanwhile faults and is already a touch of the
/// parked chunk.
pub(crate) fn park_chunk(e: &Pager, r: &Region, c: usize) -> Option<u64> {
    let mut left = 0;
    match store_run(e, r, c, 1, Some(&mut left)) {
        Some(b) if b > 0 => Some(if left == 0 { e.sample_now() } else { left }),
        _ => None,
    }
}

/// Stores the run in the first tier that takes it. `sample`: a park of the access
/// sampler, not an eviction; it receives when a staging medium took the run out of the
/// mapping (0: the medium moved it without staging).
fn store_run(
    e: &Pager,
    r: &Region,
    c: usize,
    n: usize,
    mut sample: Option<&mut u64>,
) -> Option<u64> {
    let len = n * r.chunk;
    let src = r.chunk_addr(c);
    let home = r.home_tier.load(Relaxed);
    let order = std::iter::once(home).chain((0..e.tiers.len()).filter(move |&t| t != home));
    let uffd = e.uffd_for(r.delivery);
    if sample.is_none() {
        e.pace(len as u64);
    }
    // Content hashes by page: a tier that keeps copies is written only the pages that
    // changed since it last took or gave them (`attune_policy::writeback`).
    let known = r.page_hashes(c, n);
    let pages = known.len();
    let per_chunk = pages / n.max(1);
    let mut hashes = [0u64; MAX_RUN / HASH_PAGE];
    // Fill words by chunk, when the staged run turns out to be fills (`super::fill`).
    let mut fills = [0u32; MAX_RUN / HASH_PAGE];
    // Every tier passed the run on for being full or failing: no room anywhere.
    let mut refused_for_room = true;
    for t in order {
        let Some(tier) = e.tiers.get(t) else { continue };
        if !tier.is_pageable() {
            continue;
        }
        let off = r.slots[t] + (c * r.chunk) as u64;
        let keeps = tier.keeps_copy();
        let mut written = pages;
        let mut filled = false;
        let mut pieces_to_write = |staged: usize, all: bool| -> Pieces {
            if !keeps {
                return Pieces::whole(pages);
            }
            let mut mask = [0u64; writeback::MASK_WORDS];
            for (j, h) in hashes.iter_mut().enumerate().take(pages) {
                *h = crate::hash::chunk_hash(staged + j * HASH_PAGE, HASH_PAGE, t);
                if known[j].load(Relaxed) != *h {
                    writeback::set(&mut mask, j);
                }
            }
            if all {
                // The hashes still describe what the tier will hold.
                return Pieces::whole(pages);
            }
            let p = writeback::pieces(&mask, pages, e.cfg.writeback_gap);
            written = p.pages();
            p
        };
        let mut dirty = |staged: usize, all: bool| -> Staged {
            if let Some(left) = sample.as_deref_mut() {
                *left = e.sample_now();
            }
            if e.cfg.fills && staged_fills(e, r, staged, n, &mut fills) {
                filled = true;
                return Staged::Filled;
            }
            Staged::Write(pieces_to_write(staged, all))
        };
        match tier.store(&e.io(), uffd, src, off, len, &mut dirty) {
            Ok(()) => {
                // Refault distances count from the bytes evicted before this run.
                let clock = e.eviction_clock();
                if filled {
                    // No tier took the content: the copies tiers hold are older, so the
                    // next store of these pages writes them whole.
                    for k in known {
                        k.store(0, Relaxed);
                    }
                    for (i, &w) in fills.iter().enumerate().take(n) {
                        r.settle_filled(c + i, w);
                    }
                    e.counters.filled_bytes.fetch_add(len as u64, Relaxed);
                } else if keeps {
                    for i in 0..n {
                        let page = |k: usize| i * per_chunk + k;
                        if (0..per_chunk).all(|k| known[page(k)].load(Relaxed) == hashes[page(k)]) {
                            r.counters.clean_skips.fetch_add(1, Relaxed);
                        }
                    }
                    for (k, h) in known.iter().zip(hashes) {
                        k.store(h, Relaxed);
                    }
                    e.counters
                        .clean_bytes
                        .fetch_add(((pages - written) * HASH_PAGE) as u64, Relaxed);
                }
                for i in 0..n {
                    if !filled {
                        r.settle(c + i, Where::Far, t, 0);
                    }
                    r.evicted_at[c + i].store(clock, Relaxed);
                    if r.set_bits(c + i, 0, ACTIVE | CREDIT_MASK).active() {
                        e.deactivate(r.chunk as u64);
                    }
                }
                let _ = e
                    .resident
                    .fetch_update(AcqRel, Acquire, |v| Some(v.saturating_sub(len as u64)));
                super::huge::split(e, r, c, n);
                if sample.is_some() {
                    e.counters.sample_parks.fetch_add(n as u64, Relaxed);
                } else {
                    e.counters.evictions.fetch_add(n as u64, Relaxed);
                    e.counters.evicted_bytes.fetch_add(len as u64, Relaxed);
                    r.counters.evictions.fetch_add(n as u64, Relaxed);
                    r.counters.evicted_bytes.fetch_add(len as u64, Relaxed);
                }
                return Some(len as u64);
            }
            Err(err) if crate::tier::passes_on(err.0) => {
                // A medium that cannot hold this run (EOPNOTSUPP) says nothing of room.
                if err.0 == libc::EOPNOTSUPP {
                    refused_for_room = false;
                }
                continue;
            }
            Err(err) if err.0 == libc::EINVAL => {
                // The program made these pages read-only or inaccessible (mprotect): a move
                // needs the same protection on both sides, and copying out then dropping
                // could lose a write made after a later mprotect back. They stay in DRAM
                // while so protected, as mlocked pages would (docs/design/run.md, "Protection
                // changes").
                e.counters.protected_skips.fetch_add(n as u64, Relaxed);
                refused_for_room = false;
                break;
            }
            Err(err) => {
                if err.0 == libc::EBUSY && e.forks.load(Acquire) > 0 {
                    // Pages shared with another process since a fork: the evictor makes
                    // them this process's own first (`super::unshare`).
                    for i in 0..n {
                        r.settle(c + i, Where::Resident, 0, SHARED);
                    }
                    e.unshare_pending.fetch_add(n as u64, AcqRel);
                    e.wake_evictor.notify();
                    return Some(0);
                }
                refused_for_room = false;
                break;
            }
        }
    }
    for i in 0..n {
        r.settle(c + i, Where::Resident, 0, 0);
    }
    if !refused_for_room {
        return Some(0);
    }
    if sample.is_none() {
        e.counters.unplaced_runs.fetch_add(1, Relaxed);
    }
    None
}

/// Moves chunk `c` (seen in state `s`) from the active class back to inactive with a lap
/// of grace; false if its state changed meanwhile.
fn demote(e: &Pager, r: &Region, c: usize, s: State) -> bool {
    let grace = State::class_bits(false, 1);
    let done = r.cas(
        c,
        s,
        s.with_bits(0, ACTIVE | CREDIT_MASK).with_bits(grace, 0),
    );
    if done {
        e.deactivate(r.chunk as u64);
    }
    done
}

/// Tests up to `max` active chunks of unprotected regions: moves them back to the
/// inactive class with a lap of grace. One still in use is evicted by the hand in time,
/// refaults close and becomes active again (the room it left is there for it or for the
/// chunk that was denied); a stale one is evicted and stays out. No page moves here: the
/// hand's eviction path does that. Returns how many were tested.
pub fn test_active(e: &Pager, max: usize) -> usize {
    let mut clock = e.clock.lock().unwrap_or_else(|p| p.into_inner());
    let table = e.regions.read().unwrap_or_else(|p| p.into_inner());
    let mut tested = 0;
    for _ in 0..table.len() {
        if tested >= max {
            break;
        }
        let ri = clock.test_cursor % table.len();
        clock.test_cursor = ri + 1;
        let r = &table[ri];
        let n = r.chunks();
        if n == 0 || r.freed.load(Acquire) || e.is_protected(r) {
            continue;
        }
        let start = r.test_hand.load(Relaxed) % n;
        let mut i = 0;
        while i < n && tested < max {
            let c = (start + i) % n;
            i += 1;
            let s = r.state(c);
            if s.active() && !s.pinned() && s.place() == Where::Resident && demote(e, r, c, s) {
                tested += 1;
            }
        }
        r.test_hand.store((start + i) % n, Relaxed);
    }
    e.counters.active_tests.fetch_add(tested as u64, Relaxed);
    tested
}

/// Longest the evictor collapses huge pages in one tick.
const HUGE_SLICE_NS: u64 = 10_000_000;

/// The background evictor: keeps `headroom` free below the budget, and tests active
/// chunks while activations are denied (paced to `ACTIVE_TESTS_PER_S`).
/// `first`: the watch of the memory cgroup `Engine::start` read (None in a forked child).
pub(crate) fn evictor_loop(e: &'static Pager, first: Option<(super::limit::LimitWatch, i32)>) {
    os::block_all_signals();
    let mut denied_seen = 0u64;
    let mut test_credit = 0f64;
    let mut last = os::now_ns();
    let mut full = FullWarning::default();
    let mut huge_due = 0u64;
    let mut huge_left = 0usize;
    let (mut limit, mut wait_ms) = first.unwrap_or_else(|| super::limit::LimitWatch::read(e));
    while !e.shutdown.load(Relaxed) {
        let notified = e.wake_evictor.wait(wait_ms);
        wait_ms = limit.tick(e);
        // Outside the gate: a hole in an un-shared range faults into the fault path.
        super::unshare::unshare_pass(e);
        let _in = e.enter();
        drop_retired(e);
        // Staged pages a buffer kept for its next batch go within a tick.
        e.staging.drop_kept();
        let now = os::now_ns();
        // A second's collapses go in slices of at most 10 ms a tick, so the evictor reads
        // the memory cgroup and serves wake-ups between them; none near the cgroup's limit
        // (a collapse allocates its 2 MiB page first).
        if now >= huge_due {
            huge_left = attune_policy::huge::MAX_BYTES_PER_PASS;
            huge_due = now + attune_policy::huge::PASS_EVERY_NS;
        }
        if huge_left > 0 && !limit.near() {
            let (done, more) = super::huge::pass(e, huge_left, now + HUGE_SLICE_NS);
            huge_left = if more { huge_left - done } else { 0 };
        }
        let rate = attune_policy::victim::ACTIVE_TESTS_PER_S as f64;
        test_credit = (test_credit + (now - last) as f64 * 1e-9 * rate).min(rate / 10.0);
        last = now;
        let denied = e.counters.denied_activations.load(Relaxed);
        let want = (denied - denied_seen).min(test_credit as u64) as usize;
        if want > 0 {
            test_credit -= test_active(e, want) as f64;
            denied_seen = denied;
        } else if denied == denied_seen {
            // Nothing asked for a test: no credit piles up for a later burst.
            test_credit = test_credit.min(1.0);
        }
        let (high, low) = e.watermarks();
        // The headroom is kept for whoever asks (a fault resolved by a handler thread
        // wakes the evictor above the high watermark); a timed wake-up evicts only an
        // overrun. Otherwise it would keep the headroom for threads that resolve their
        // own faults and evict for themselves, and its moves on the other CPU would
        // interrupt theirs (see `fault::reserve_dram`).
        let keep_below = attune_policy::budget::evictor_keep_below(e.budget(), high, notified);
        if e.resident.load(Acquire) <= keep_below {
            continue;
        }
        loop {
            let cur = e.resident.load(Acquire);
            if cur <= low {
                break;
            }
            let want = (cur - low).min(e.cfg.evict_batch as u64);
            crate::inject::at(crate::inject::Point::Evictor);
            let freed = reclaim(e, want);
            if freed == 0 {
                break;
            }
            e.counters.evictor_evicted_bytes.fetch_add(freed, Relaxed);
        }
        full.check(e);
    }
}

/// How often a budget the far tiers cannot keep is reported.
const FULL_WARNING_EVERY_NS: u64 = 30_000_000_000;

/// Says so, at most every 30 s, when the process holds well above its DRAM budget (an
/// eighth) because its far tiers refuse what it would evict (a full disk, tiers at their
/// capacity). Before, residency ran at 8x the budget without a word. Not when the cause
/// is pins or protected pages alone: then no tier refused a store.
#[derive(Default)]
struct FullWarning {
    refused_seen: u64,
    last_ns: u64,
}

impl FullWarning {
    fn check(&mut self, e: &Pager) {
        for t in &e.tiers {
            let err = t.take_failure();
            if err != 0 {
                crate::warn!(
                    "far tier '{}' failed a write ({}): it takes no pages for {} s, then is tried again; what it holds is still read, and other tiers take its share",
                    t.cfg.name,
                    std::io::Error::from_raw_os_error(err),
                    crate::tier::FAILED_BACKOFF_NS / 1_000_000_000
                );
            }
        }
        let refused: u64 = e.tiers.iter().map(|t| t.counters.full.load(Relaxed)).sum();
        let chunk = e.cfg.chunk_size as u64;
        // No far tier at all (NUMA tiers only): nothing refuses, there is nowhere to evict.
        let refusing = !e.tiers.is_empty()
            && (refused > self.refused_seen || e.tiers.iter().all(|t| !t.accepts(chunk)));
        self.refused_seen = refused;
        let (resident, budget) = (e.resident.load(Relaxed), e.budget());
        if !refusing || resident <= budget + budget / 8 {
            return;
        }
        let now = os::now_ns();
        if self.last_ns != 0 && now - self.last_ns < FULL_WARNING_EVERY_NS {
            return;
        }
        self.last_ns = now;
        let tiers: Vec<String> = e
            .tiers
            .iter()
            .map(|t| {
                format!(
                    "'{}' holds {} of {} MiB, {} stores refused as full, {} failed",
                    t.cfg.name,
                    t.counters.stored.load(Relaxed) >> 20,
                    t.capacity() >> 20,
                    t.counters.full.load(Relaxed),
                    t.counters.errors.load(Relaxed)
                )
            })
            .collect();
        crate::warn!(
            "resident {} MiB, above the DRAM budget of {} MiB: the far tiers take no more ({}); give them capacity or room (docs/tuning.md)",
            resident >> 20,
            budget >> 20,
            tiers.join("; ")
        );
    }
}

/// Returns freed regions' far-tier offsets once no fetch of theirs is in flight, frees
/// regions that no fault handler references any more, and releases the slot ranges the
/// memory tiers' fetches copied out (so an idle process does not keep them).
///
/// Why the wait: a fetch queues its slot range after it copied and before it leaves
/// `Fetching`. Once no chunk is `Fetching`, every range of this region is queued or
/// released, and a new owner's store into the offsets releases the queue first when a
/// queued range overlaps its slot (`MemoryTier::store`), so no release can reach the new
/// owner's pages.
fn drop_retired(e: &Pager) {
    let mut ret = e.retired.lock().unwrap_or_else(|p| p.into_inner());
    for r in ret.iter().filter(|r| !r.slots_returned.load(Relaxed)) {
        if (0..r.chunks()).all(|c| r.state(c).place() != Where::Fetching) {
            for (i, o) in r.slots.iter().enumerate() {
                e.tiers[i].free_space(*o, r.len as u64);
            }
            r.slots_returned.store(true, Relaxed);
        }
    }
    ret.retain(|r| Arc::strong_count(r) > 1 || !r.slots_returned.load(Relaxed));
    drop(ret);
    for t in &e.tiers {
        t.release_pending();
    }
}
