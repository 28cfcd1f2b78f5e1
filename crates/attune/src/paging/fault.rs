//! The fault path: a thread touched a managed page that is not mapped.
//!
//! Two deliveries reach the same [`resolve`]:
//! * **thread** regions: the kernel queues a message on the thread-mode userfaultfd and
//!   puts the faulting thread to sleep; [`handler_loop`] reads it and resolves it.
//! * **signal** regions: the kernel raises SIGBUS in the faulting thread and
//!   [`on_sigbus`] resolves the fault right there (no hand-off to another thread).
//!
//! Everything reachable from here is signal-safe: no allocation, no I/O buffering, locks
//! only ones that no thread holds while it could take a SIGBUS (see docs/design.md).
//!
//! Resolution of chunk c:
//! 1. claim c, Fresh/Far -> Fetching (`Region::claim_fetch`; others wait);
//! 2. extend the claim ahead on sequential faults (read-ahead, same source only);
//! 3. reserve DRAM: over the budget, evict synchronously (direct reclaim);
//! 4. place the run: zero-fill (Fresh) or load from its tier (Far), one ioctl per run;
//! 5. publish Resident with the class and credit the replacement policy gives its arrival
//!    (a refault soon after eviction makes a chunk active), and bump the heat of c.

use super::pager::{Pager, MAX_RUN};
use super::sample::Touch;
use crate::region::{Claim, Region, State, Where, HASH_PAGE};
use attune_policy::budget;
use attune_policy::readahead::{self, STREAMS};
use attune_policy::victim::{on_arrival, Arrival};
use attune_sys::uffd::{Delivery, Msg, Uffd, EVENT_PAGEFAULT, EVENT_REMOVE};
use attune_sys::{os, Errno};
use std::sync::atomic::Ordering::*;

/// Resolves a fault at `addr` in region `r`. Returns false when the page cannot be
/// given to the application (its only copy could not be read back): the access must then
/// fail with SIGBUS, never be replayed forever and never read wrong data.
pub fn resolve(e: &Pager, r: &Region, addr: usize) -> bool {
    e.counters.faults.fetch_add(1, Relaxed);
    r.counters.faults.fetch_add(1, Relaxed);
    // Two vDSO clock reads (tens of ns) against a fault of microseconds: the job summary's
    // time in faults (docs/run-report.md).
    let t0 = os::now_ns();
    // A parked chunk's touch is timed by the program's clock; read only for those (one
    // system call per thread). 1: not parked when the touch came, so it is no sample.
    let arrival = if !r.samples.enabled() {
        0
    } else if r.samples.parked_at[r.chunk_of(addr)].load(Acquire) != 0 {
        e.sample_now().max(2)
    } else {
        1
    };
    let placed = resolve_chunk(e, r, addr, arrival);
    e.counters
        .fault_ns
        .fetch_add(os::now_ns().saturating_sub(t0), Relaxed);
    placed
}

/// `arrival_ns`: when the fault reached Attune, before it waited on a chunk being moved,
/// by the program's clock (`progclock`; 0: sampling off, 1: the chunk was not parked
/// then); the access sampler times a parked chunk's touch by it (`sample::on_placed`).
fn resolve_chunk(e: &Pager, r: &Region, addr: usize, arrival_ns: u64) -> bool {
    let c = r.chunk_of(addr);
    loop {
        match r.claim_fetch(c, true) {
            Some(Claim::Owned(src, tier)) => {
                r.counters.demand_chunks.fetch_add(1, Relaxed);
                e.counters.demand_bytes.fetch_add(r.chunk as u64, Relaxed);
                let ra = claim_readahead(e, r, c, src, tier);
                let at = |k: usize| (c as i64 + k as i64 * ra.step) as usize;
                let t = Touch {
                    chunk: c,
                    arrival_ns,
                };
                let placed = match ra.step {
                    // A contiguous run: one move.
                    1 => place_run(e, r, c, 1 + ra.got, t, src, tier),
                    -1 => place_run(e, r, c - ra.got, 1 + ra.got, t, src, tier),
                    // Along a stride: the touched chunk first (under thread delivery its
                    // thread goes on while the others are placed), then one move each.
                    _ => {
                        let placed = place_run(e, r, c, 1, t, src, tier);
                        for k in 1..=ra.got {
                            place_run(e, r, at(k), 1, Touch::NONE, src, tier);
                        }
                        placed
                    }
                };
                if ra.sequential && ra.step == 1 {
                    mark_behind(e, r, c, 1 + ra.got);
                }
                return placed;
            }
            Some(Claim::Resident) => {
                // We believe it is mapped. Either another thread placed it after this fault
                // was raised (the copy below finds the page: EEXIST, wake the sleeper), or
                // the application discarded it with MADV_DONTNEED: then it reads as zero,
                // exactly as the kernel would give it. The chunk is held (Resident ->
                // Fetching) while we look: an eviction that moved its pages out between
                // the check and the copy would leave a zero page mapped over data that
                // lives in a far tier (seen: a whole page read as zero under 48 threads).
                let s = r.state(c);
                if s.place() != Where::Resident || !r.claim_hold(c, s) {
                    continue;
                }
                let ps = attune_sys::page_size();
                let page = addr & !(ps - 1);
                let uffd = e.uffd_for(r.delivery);
                match uffd.copy(page, e.zero_addr(), ps, true) {
                    Ok(_) => {
                        r.counters.discarded.fetch_add(1, Relaxed);
                    }
                    Err(_) => {
                        let _ = uffd.wake(page, ps);
                    }
                }
                r.settle(c, Where::Resident, s.tier(), 0);
                return true;
            }
            None => return true,
        }
    }
}

/// A fault that continued a forward run in a streamed region marks the `n` chunks as far
/// behind it as the policy says as the first victims (`attune_policy::stream`).
fn mark_behind(e: &Pager, r: &Region, c: usize, n: usize) {
    let attuned = e.cfg.mode == crate::config::Mode::Attuned;
    let ra_max = readahead_max(e, r);
    let pressed = e.resident.load(Relaxed) + (n * r.chunk) as u64 > e.watermarks().1;
    if let Some(d) = attune_policy::stream::drop_behind(r.flags(), attuned, true, pressed, ra_max) {
        if c >= d {
            e.drop_behind.push(r, c - d, n);
        }
    }
}

/// Places chunk `c` if it is not resident (prefetch and pin); whether this call placed it.
pub fn fetch_chunk(e: &Pager, r: &Region, c: usize) -> bool {
    let Some(Claim::Owned(src, tier)) = r.claim_fetch(c, true) else {
        return false;
    };
    // A chunk that cannot be read back stays Far (and poisoned in thread delivery): the
    // application's access reports it. Heated as a touch, but no access: a parked chunk
    // brought back here closes its sample untouched.
    let t = Touch {
        chunk: c,
        arrival_ns: 0,
    };
    place_run(e, r, c, 1, t, src, tier)
}

/// The most chunks one fault of `r` claims beyond its own (0: read-ahead off).
fn readahead_max(e: &Pager, r: &Region) -> usize {
    readahead_within(e, r, MAX_RUN)
}

/// [`readahead_max`] for a run of at most `bytes` (a tier's `run_max`).
fn readahead_within(e: &Pager, r: &Region, bytes: usize) -> usize {
    (e.cfg.readahead.min(MAX_RUN).min(bytes) / r.chunk).max(1) - 1
}

/// What a fault's read-ahead claimed beside its own chunk.
struct ReadAhead {
    /// Chunks claimed `step` apart: `c + step`, `c + 2 step`, ...
    got: usize,
    step: i64,
    /// The fault continued a run of faults (`attune_policy::readahead`).
    sequential: bool,
}

/// Claims the chunks the read-ahead policy asks for beside `c` (same source only, up to
/// the first chunk that is not), and records the fault in the region's stream slots.
fn claim_readahead(e: &Pager, r: &Region, c: usize, src: Where, tier: usize) -> ReadAhead {
    let slots: [u64; STREAMS] = std::array::from_fn(|i| r.streams[i].load(Relaxed));
    let hint = r.stream_hint.fetch_add(1, Relaxed);
    // In DRAM or on its way: a run's last chunk placed by another thread may still be
    // Fetching (signal delivery: each faulting thread places its own).
    let present = |x: usize| matches!(r.state(x).place(), Where::Resident | Where::Fetching);
    // A tier that copies runs into place caps them (`tier::COPIED_RUN`).
    let (run, grid) = match src {
        Where::Far => e
            .tiers
            .get(tier)
            .map_or((None, None), |t| (t.run_max(), t.run_grid())),
        _ => (None, None),
    };
    let max = readahead_within(e, r, run.unwrap_or(MAX_RUN));
    let d = readahead::on_fault(&slots, c, r.chunks(), max, hint, present);
    let mut got = 0;
    while got < d.ahead {
        let n = (c as i64 + (got as i64 + 1) * d.step) as usize;
        // A forward run ends on its tier's grid (regions start 2 MiB-aligned in a tier's
        // offset space, so the region's offsets stand for the tier's).
        if d.step == 1 && grid.is_some_and(|g| (n * r.chunk) % g == 0) {
            break;
        }
        let s = r.state(n);
        let same = s.place() == src && (src == Where::Fresh || s.tier() == tier);
        if !same || !r.claim_hold(n, s) {
            break;
        }
        got += 1;
    }
    r.streams[d.slot].store(d.record(c, got), Relaxed);
    if got > 0 {
        r.counters.readahead_chunks.fetch_add(got as u64, Relaxed);
        e.counters
            .readahead_bytes
            .fetch_add((got * r.chunk) as u64, Relaxed);
    }
    if d.used > 0 {
        e.counters
            .readahead_used_bytes
            .fetch_add((d.used * r.chunk) as u64, Relaxed);
        let touched = d.used_touched();
        r.counters
            .readahead_touched_chunks
            .fetch_add(touched as u64, Relaxed);
        e.counters
            .readahead_touched_bytes
            .fetch_add((touched * r.chunk) as u64, Relaxed);
    }
    ReadAhead {
        got,
        step: d.step,
        sequential: d.sequential,
    }
}

/// Reserves DRAM for `bytes`, evicting synchronously when the budget is exceeded.
///
/// `inline`: the faulting thread resolves its own fault (signal delivery). It then does
/// all the evicting itself and wakes the background evictor only if it could not get
/// under the budget: a woken evictor runs on another CPU, and every move of either one
/// then flushes the other's TLB by IPI, where a lone thread's flushes stay local. A
/// handler thread serves many faulting threads and gains from the evictor working beside
/// it. The rule is `attune_policy::budget::wake_evictor_above`; the measurements are in
/// docs/benchmarks-history.md, "Why eviction stays one move per run".
fn reserve_dram(e: &Pager, bytes: u64, inline: bool) {
    e.reserving.fetch_add(bytes, AcqRel);
    let now = e.resident.fetch_add(bytes, AcqRel) + bytes;
    let (high, _) = e.watermarks();
    let want = budget::overrun(now, e.budget());
    if want > 0 {
        e.counters.direct_reclaims.fetch_add(1, Relaxed);
        let mut freed = super::evict::reclaim(e, want);
        if freed < want && !super::evict::has_room_for(e, want - freed) {
            freed += super::room::wait_for_room(e, want - freed);
        }
        if freed < want {
            e.counters.budget_overruns.fetch_add(1, Relaxed);
        }
    }
    let wake_above = budget::wake_evictor_above(e.budget(), high, inline);
    if e.resident.load(Relaxed) > wake_above {
        e.wake_evictor.notify();
    }
    // The peak after reclaim: what the process really held. The reservation above counts
    // the chunk before its victim has left, and so do the reservations of other threads
    // still reclaiming (signal delivery: each faulting thread places its own chunks);
    // theirs count in their own peak, once their room is made. 4 threads of
    // `cpp_vectors` read 34.5 MiB over a 32 MiB budget with them counted here.
    // The group's other runtimes see this growth now, not at the next reading.
    if let Some(b) = e.cgroup.board() {
        b.publish_moved(e.resident.load(Relaxed));
    }
    let others = e.reserving.fetch_sub(bytes, AcqRel) - bytes;
    e.peak_resident
        .fetch_max(e.resident.load(Relaxed).saturating_sub(others), Relaxed);
}

/// How long a fetch keeps retrying an error that can pass (EAGAIN, ENOMEM, EINTR: every
/// bounce buffer taken by other faulting threads, the kernel short of memory for a
/// moment) before the page is declared unreadable.
const TRANSIENT_RETRY_NS: u64 = 2_000_000_000;

fn transient(e: Errno) -> bool {
    matches!(e.0, libc::EAGAIN | libc::ENOMEM | libc::EINTR)
}

/// Runs `attempt` until it succeeds, fails with an error that is not [`transient`], or has
/// failed transiently for `window_ns`: yields between the first 64 tries, then sleeps
/// 500 µs (the other faulting threads that hold the bounce buffers need the CPU).
fn retry_transient(
    window_ns: u64,
    mut attempt: impl FnMut() -> Result<(), Errno>,
) -> Result<(), Errno> {
    let mut tries = 0u32;
    let mut deadline = 0u64;
    loop {
        let res = attempt();
        match res {
            Err(err) if transient(err) => {
                let now = attune_sys::os::now_ns();
                if deadline == 0 {
                    deadline = now + window_ns;
                }
                if now >= deadline {
                    return res;
                }
                tries += 1;
                if tries < 64 {
                    os::yield_now();
                } else {
                    os::sleep_us(500);
                }
            }
            _ => return res,
        }
    }
}

/// Places chunks `[c, c+n)` (all claimed by this thread, same source; the access was to
/// `touch.chunk`, the others came by read-ahead; [`Touch::NONE`] for none) and
/// publishes them. Returns false when
/// their data could not be read back from the tier.
fn place_run(
    e: &Pager,
    r: &Region,
    c: usize,
    n: usize,
    touch: Touch,
    src: Where,
    tier: usize,
) -> bool {
    let len = n * r.chunk;
    reserve_dram(e, len as u64, r.delivery == Delivery::Signal);
    let run = Run {
        c,
        n,
        touch,
        src,
        tier,
        dst: r.chunk_addr(c),
        len,
    };
    let result = retry_transient(TRANSIENT_RETRY_NS, || {
        let res = fetch_run(e, r, &run);
        if res == Err(Errno(libc::EAGAIN)) {
            pump(e);
        }
        res
    });
    publish_run(e, r, &run, result)
}

/// Chunks `[c, c+n)` of a region, claimed by this thread, all from `src` (in far tier
/// `tier` when Far): `len` bytes at `dst`.
#[derive(Clone, Copy)]
struct Run {
    c: usize,
    n: usize,
    /// The chunk the access was to, and when it came.
    touch: Touch,
    src: Where,
    tier: usize,
    dst: usize,
    len: usize,
}

/// One attempt at placing the run's data: zero-fill or a load from its tier.
///
/// No wake before the whole run: every placement below leaves the waiting threads asleep,
/// and the run is woken once, all of it placed (thread delivery; a signal-delivery
/// thread places its own fault). A copy that stops part-way (EAGAIN with progress, a VMA
/// boundary) would otherwise wake the thread whose page it placed, and that thread may
/// free the region while the rest of its read-ahead is still being placed: the soak's
/// "could not be read back (ENOENT)" from a region just freed, and, had another region
/// been mapped there meanwhile, pages of the old one placed into it.
fn fetch_run(e: &Pager, r: &Region, run: &Run) -> Result<(), Errno> {
    if run.n >= 2 && run.src == Where::Far && crate::inject::hit(crate::inject::Point::LoadHalf) {
        // ATTUNE_INJECT=load-fail-half: a medium that fails after part of the run.
        let half = Run {
            n: run.n / 2,
            len: run.n / 2 * r.chunk,
            ..*run
        };
        place_data(e, r, &half)?;
        return Err(Errno(libc::EIO));
    }
    // Discard reports read and not acted on (`super::removes`): the kernel may have dropped
    // the pages they cover already, and the program, back from its `madvise`, may read
    // them while this placement maps them. So what they cover is zeroed before the run
    // is mapped (the handler's own fetch, acting on a report that covers part of a far
    // chunk, comes here too: mapped with the old content, 1-12 of 512 such pages read
    // stale in tests/c/discard.c).
    let reports = run.src == Where::Far && e.sees_removes();
    // `settled` waits while a read is under way, so `seen` misses no report just read.
    let pending = reports && e.removes.settled();
    let seen = e.removes.last_read();
    if pending && e.removes.covers(seen, run.dst, run.dst + run.len) {
        let t0 = os::now_ns();
        let placed = place_zeroing(e, r, run, seen);
        e.counters
            .zeroed_placed_ns
            .fetch_add(os::now_ns().saturating_sub(t0), Relaxed);
        placed?;
        e.counters
            .zeroed_placed_bytes
            .fetch_add(run.len as u64, Relaxed);
    } else {
        place_data(e, r, run)?;
    }
    if reports && e.removes.settled() {
        // A report read while the placement ran: the kernel may have dropped its pages
        // before the placement put their old content back. Dropped again; still claimed,
        // so a touch waits and then maps zeros.
        e.removes
            .overlapping_in(seen, u64::MAX, run.dst, run.dst + run.len, |lo, hi| {
                // Pages this placement made: its own, never shared, so they move.
                let _ = e.drop_pages(lo, hi - lo);
            });
    }
    if r.delivery == Delivery::Thread {
        let _ = e.uffd_for(r.delivery).wake(run.dst, run.len);
    }
    Ok(())
}

/// [`fetch_run`]'s placement, waking no one.
fn place_data(e: &Pager, r: &Region, run: &Run) -> Result<(), Errno> {
    place_data_at(e, r, run, e.uffd_for(r.delivery), run.dst)
}

/// [`place_data`] for a run part of which discard reports numbered up to `upto` cover:
/// placed in a staging buffer first, where those pages are zeroed, then copied into the
/// region. Their old content is never mapped where the program can read it. Costs one
/// more copy of the run, on a path only a program's discard of part of a far chunk takes.
/// Once loaded, the buffer holds the only copy: a copy into the region that fails for
/// good (the region unmapped meanwhile) loses it, as it loses the region.
fn place_zeroing(e: &Pager, r: &Region, run: &Run, upto: u64) -> Result<(), Errno> {
    let io = e.io();
    let slot = io.staging.claim(run.len).ok_or(Errno(libc::EAGAIN))?;
    let st = slot.fresh(run.len);
    let placed = place_data_at(e, r, run, io.internal, st).and_then(|()| {
        // Holes (a memory tier's pages discarded while far) read as zeros; mapped, so the
        // copy below reads no missing page of the staging buffer (a SIGBUS inside a
        // resolver kills the program).
        crate::tier::fill_holes(io.internal, st, run.len);
        e.removes
            .overlapping_in(0, upto, run.dst, run.dst + run.len, |lo, hi| {
                super::fill::fill(st + (lo - run.dst), hi - lo, 0)
            });
        // The tier gave its copy up with the load (a memory slot is released, a pool's
        // pages unclaimed): from here the buffer holds the only one. So a transient
        // failure (EAGAIN while the program's next discard waits to be read) is retried
        // from the buffer, never by loading again: retried by the caller, the load read
        // a released slot, and a whole chunk came back as zeros (tests/c/discard.c, 1 run
        // in 60 under load).
        retry_transient(TRANSIENT_RETRY_NS, || {
            let res = e
                .uffd_for(r.delivery)
                .place_copy(run.dst, st, run.len, false);
            if res == Err(Errno(libc::EAGAIN)) {
                pump(e);
            }
            res
        })
    });
    // Dropped with the buffer's next pages, whatever was placed in it.
    slot.keep(run.len);
    placed
}

/// [`place_data`] at `dst` through `uffd` (the run's own address, or a staging buffer).
fn place_data_at(e: &Pager, r: &Region, run: &Run, uffd: &Uffd, dst: usize) -> Result<(), Errno> {
    let len = run.len;
    match run.src {
        Where::Far if run.tier == crate::region::FILLED => {
            place_fills(e, uffd, r, run.c, dst, len)?;
            e.counters.fill_placed_bytes.fetch_add(len as u64, Relaxed);
            Ok(())
        }
        Where::Far => match e.tiers.get(run.tier) {
            Some(t) => {
                e.pace(len as u64);
                let off = r.slots[run.tier] + (run.c * r.chunk) as u64;
                let keeps = t.keeps_copy();
                let mut seen =
                    |data: usize| !keeps || check_hashes(r, run.c, run.n, run.tier, data);
                let res = t.load(&e.io(), uffd, dst, off, len, &mut seen);
                if res.is_ok() {
                    e.counters.fetched_bytes.fetch_add(len as u64, Relaxed);
                    r.counters.fetched_bytes.fetch_add(len as u64, Relaxed);
                }
                res
            }
            None => Err(Errno(libc::EINVAL)),
        },
        _ => {
            r.counters.zero_fills.fetch_add(run.n as u64, Relaxed);
            // Page by page where one copy stops: a page of the run already mapped
            // (EEXIST: the chunks were Fresh, so no data of the program's is there), or a
            // boundary the program's mprotect made inside the run (ENOENT: one
            // UFFDIO_COPY fills one VMA; docs/design/run.md, "Protection changes").
            uffd.place_copy(dst, e.zero_addr(), len, false)
        }
    }
}

/// Places the run `[dst, dst+len)` of chunks `c..` of `r`, all Far in no tier (claimed by
/// this thread, each with its fill index in its state word), from a buffer filled with
/// their words; all zero: from the zero buffer. Wakes no one. Signal-safe.
fn place_fills(
    e: &Pager,
    uffd: &Uffd,
    r: &Region,
    c: usize,
    dst: usize,
    len: usize,
) -> Result<(), Errno> {
    let n = len / r.chunk;
    if (0..n).all(|i| r.state(c + i).fill_index() == 0) {
        uffd.place_copy(dst, e.zero_addr(), len, false)
    } else {
        let io = e.io();
        let slot = io.bounce.claim(len).ok_or(Errno(libc::EAGAIN))?;
        let b = slot.addr();
        for i in 0..n {
            super::fill::fill(
                b + i * r.chunk,
                r.chunk,
                e.fills.word(r.state(c + i).fill_index()),
            );
        }
        uffd.place_copy(dst, b, len, false)
    }
}

/// Publishes the run's outcome: Resident with its replacement class, or (its data could
/// not be read back) back to Far with the access failing loudly.
fn publish_run(e: &Pager, r: &Region, run: &Run, result: Result<(), Errno>) -> bool {
    let Run {
        c,
        n,
        touch,
        src,
        tier,
        dst,
        len,
    } = *run;
    let touched = touch.chunk;
    let uffd = e.uffd_for(r.delivery);
    match result {
        Ok(()) => {
            if r.samples.enabled() {
                super::sample::on_placed(e, r, c, n, touch);
            }
            let now = e.eviction_clock();
            let budget = e.budget();
            let target = e.active_target();
            let mut active = 0u64;
            for i in 0..n {
                let arrival = match src {
                    Where::Far => Arrival::Refault {
                        distance: (now.wrapping_sub(r.evicted_at[c + i].load(Relaxed)) as u64)
                            << 12,
                    },
                    _ => Arrival::First,
                };
                let room = e.active.load(Relaxed) + active + r.chunk as u64 <= target;
                let placed = on_arrival(arrival, budget, room);
                if placed.active {
                    active += r.chunk as u64;
                }
                if placed.denied {
                    e.counters.denied_activations.fetch_add(1, Relaxed);
                }
                let bits = State::class_bits(placed.active, placed.credit);
                if c + i == touched {
                    r.settle_heated(c + i, Where::Resident, 0, bits);
                } else {
                    r.settle(c + i, Where::Resident, 0, bits);
                }
            }
            if active > 0 {
                e.active.fetch_add(active, Relaxed);
            }
            true
        }
        Err(err) => {
            // Chunks the failed attempt placed whole, from the run's start, are the tier's
            // data, checked before they were placed: they are published as placed (and
            // woken), and only the rest fails. Published as Far, they stayed mapped but
            // out of the budget and of the evictor's reach, and a touched chunk among
            // them failed an access whose page was there.
            let whole = placed_whole(r, dst, n);
            if whole > 0 {
                let head = Run {
                    n: whole,
                    len: whole * r.chunk,
                    ..*run
                };
                publish_run(e, r, &head, Ok(()));
                if r.delivery == Delivery::Thread {
                    let _ = uffd.wake(dst, head.len);
                }
                let tail = Run {
                    c: c + whole,
                    n: n - whole,
                    dst: dst + head.len,
                    len: len - head.len,
                    ..*run
                };
                let touched_placed = (c..c + whole).contains(&touched);
                return whole == n || publish_run(e, r, &tail, result) || touched_placed;
            }
            // The only copy cannot be read back. Never hand the application wrong data and
            // never replay the access forever: it fails loudly with SIGBUS, and we say why.
            // Thread delivery: the range is poisoned, so the woken thread's access raises
            // SIGBUS (without UFFDIO_POISON the handler sends it, `handler_loop`). Signal
            // delivery: the caller declines the fault, and the replayed access takes the
            // process's own SIGBUS disposition.
            e.counters.load_errors.fetch_add(1, Relaxed);
            let _ = e
                .resident
                .fetch_update(AcqRel, Acquire, |v| Some(v.saturating_sub(len as u64)));
            crate::log::emit_static("attune: error: a page could not be read back from its tier (");
            crate::log::emit_static(errno_name(err));
            crate::log::emit_static("); the access fails with SIGBUS\n");
            if r.delivery == Delivery::Thread && !e.serving_inline.load(Acquire) {
                // One poison covers one VMA, as one copy does: where the run crosses a
                // boundary of the program's mprotect, page by page, or the woken thread
                // would wait for ever.
                if uffd.poison(dst, len).is_err() && e.poisons() {
                    let ps = attune_sys::page_size();
                    for k in (0..len).step_by(ps) {
                        let _ = uffd.poison(dst + k, ps);
                    }
                }
                // Pages the failed attempt had placed were placed without a wake, and a
                // poison does not cover them: a thread waiting on one goes on with it.
                let _ = uffd.wake(dst, len);
            }
            // A zero-fill that failed leaves its chunks Fresh: no tier holds them.
            let back = if src == Where::Fresh {
                Where::Fresh
            } else {
                Where::Far
            };
            for i in 0..n {
                r.settle(c + i, back, tier, 0);
            }
            false
        }
    }
}

/// The chunks of the run at `dst` whose every page is mapped, counted from its start: what
/// a placement that failed part-way had placed (one copy places in address order).
/// Signal-safe: `mincore` page by page; it runs only on a failed placement.
fn placed_whole(r: &Region, dst: usize, n: usize) -> usize {
    let ps = attune_sys::page_size();
    (0..n)
        .take_while(|&i| {
            let at = dst + i * r.chunk;
            (0..r.chunk)
                .step_by(ps)
                .all(|k| attune_sys::mem::page_present(at + k))
        })
        .count()
}

/// A static name for the errors a load can end with (signal-safe: no formatting).
fn errno_name(e: Errno) -> &'static str {
    match e.0 {
        libc::EIO => "EIO",
        libc::EAGAIN => "EAGAIN",
        libc::ENOMEM => "ENOMEM",
        libc::EINTR => "EINTR",
        libc::EFAULT => "EFAULT",
        libc::EBUSY => "EBUSY",
        libc::EINVAL => "EINVAL",
        libc::ENOENT => "ENOENT",
        libc::EEXIST => "EEXIST",
        libc::EBADMSG => "its checksum does not match what was written",
        _ => "an I/O error",
    }
}

/// Checks the run read from a file tier against the hashes recorded when it was written
/// (0: not known, as in a forked child) and records them. False when a chunk's data is not
/// what was written (the file was truncated, punched or overwritten behind the runtime's
/// back; a hole reads as zeros, which no read error reports): the page must not be given
/// to the application.
fn check_hashes(r: &Region, c: usize, n: usize, tier: usize, data: usize) -> bool {
    let known = r.page_hashes(c, n);
    let mut hashes = [0u64; MAX_RUN / HASH_PAGE];
    for (i, h) in hashes.iter_mut().enumerate().take(known.len()) {
        *h = crate::hash::chunk_hash(data + i * HASH_PAGE, HASH_PAGE, tier);
        let k = known[i].load(Relaxed);
        if k != 0 && k != *h {
            return false;
        }
    }
    for (k, h) in known.iter().zip(hashes) {
        k.store(h, Relaxed);
    }
    true
}

/// The fault-handler thread for thread-delivery regions.
///
/// Waits spin, then sleep. A handler asleep in `poll` must be woken for every fault, and
/// on a virtual machine a halted vCPU takes tens of microseconds to wake (measured in
/// docs/benchmarks-history.md, "The fault-handler thread polls before it sleeps"). So while
/// faults come closer together than `handler_spin_us`, the handler polls the descriptor
/// without sleeping; the first wait that outlasts the window puts it back to sleep until
/// a fault again follows its predecessor within the window. A program that faults rarely
/// pays at most one window of one core per burst.
///
/// It also reads the discard reports of both descriptors (`super::removes`) and acts on
/// them in order with the faults around it: a fault raised after the program's `madvise`
/// returned is read after its report, and served after the report is acted on.
pub fn handler_loop(e: &'static Pager) {
    os::block_all_signals();
    HANDLER.with(|h| h.set(true));
    let removes = e.sees_removes();
    let fds = [e.uffd_thread.raw_fd(), e.uffd_signal.raw_fd()];
    // The signal descriptor carries discard reports only (its faults raise SIGBUS).
    let fds = if removes { &fds[..] } else { &fds[..1] };
    let spin_ns = e.cfg.handler_spin_us.saturating_mul(1000);
    let mut idle_since = 0u64;
    let mut spin = false;
    let mut empty = 0u32;
    while !e.shutdown.load(Relaxed) {
        // While spinning, the signal descriptor is read every 16th empty turn: a read
        // each turn would slow the thread descriptor's own reads, and a program's
        // `madvise` waits only until its report is read.
        empty = empty.wrapping_add(1);
        if read_queue(e, removes && (!spin || empty % 16 == 0)) == 0 {
            if spin && os::now_ns().saturating_sub(idle_since) < spin_ns {
                std::hint::spin_loop();
            } else {
                spin = false;
                os::poll_readable(fds, 200);
            }
            continue;
        }
        spin = os::now_ns().saturating_sub(idle_since) < spin_ns;
        while let Some((event, arg, seq)) = e.handler_queue.pop() {
            act(e, event, arg, seq);
        }
        idle_since = os::now_ns();
    }
}

thread_local! {
    /// Set on the handler thread: the one reader of its descriptors. Constant-initialised
    /// and without a destructor: registering one takes the loader's lock, which a `dlopen`
    /// holds while its constructor's faults wait for this thread (`run-dlopen-ctor-auto`
    /// hung when the handler's queue was a thread-local; docs/design/run.md, "The runtime
    /// never waits for the loader").
    static HANDLER: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Reads the thread descriptor (and the signal one's reports, with `signal`) into the
/// handler's queue; returns how many messages were read. Reports are recorded in
/// `Pager::removes` as they are read. No more than the ring has room for.
fn read_queue(e: &Pager, signal: bool) -> usize {
    let mut msgs = [Msg::default(); 64];
    let mut total = 0;
    for (uffd, reports_only) in [(&e.uffd_thread, false), (&e.uffd_signal, true)] {
        if reports_only && !signal {
            break;
        }
        let room = super::removes::RING.saturating_sub(e.removes.waiting());
        let want = room.min(e.handler_queue.room()).min(msgs.len());
        if want == 0 {
            break;
        }
        if reports_only {
            e.removes.begin_read();
        }
        let n = uffd.read_msgs(&mut msgs[..want]).unwrap_or(0);
        for m in &msgs[..n] {
            // Room was made for `n` above: no push fails.
            match m.event {
                EVENT_REMOVE => {
                    let seq = e.removes.record(m.arg[0] as usize, m.arg[1] as usize);
                    e.handler_queue.push(m.event, m.arg, seq);
                }
                EVENT_PAGEFAULT => {
                    e.handler_queue.push(m.event, m.arg, 0);
                }
                _ => {}
            }
        }
        if reports_only {
            e.removes.end_read();
        }
        total += n;
    }
    total
}

/// While a fault the handler thread serves meets EAGAIN: a report of a discard is waiting
/// on one of its descriptors, and until it is read the kernel refuses to place pages
/// there (`mmap_changing`). Only this thread reads them, so it reads them now, into its
/// queue, to act on after this fault. No-op on any other thread.
fn pump(e: &Pager) {
    if e.sees_removes() && HANDLER.with(|h| h.get()) {
        read_queue(e, true);
    }
}

/// Acts on one message the handler thread read: a discard report or a fault (`arg`: the
/// message's arguments, `seq` a report's number).
fn act(e: &Pager, event: u8, arg: [u64; 3], seq: u64) {
    if event == EVENT_REMOVE {
        let _in = e.enter();
        e.removed(arg[0] as usize, arg[1] as usize);
        e.removes.acted(seq);
        return;
    }
    let addr = arg[1] as usize;
    crate::inject::at(crate::inject::Point::Handler);
    let _in = e.enter();
    match e.find(addr) {
        Some(r) => {
            // A failed fetch poisoned the range: the woken thread gets SIGBUS.
            // Without UFFDIO_POISON (before 6.6, or masked) it is sent the
            // signal, then woken: it takes the signal before it retries.
            if !resolve(e, &r, addr) && !e.poisons() {
                os::send_sigbus(arg[2] as u32 as i32);
                let ps = attune_sys::page_size();
                let _ = e.uffd_thread.wake(addr & !(ps - 1), ps);
            }
        }
        None => {
            // The region went away while the fault was queued (freed by another
            // thread): let the thread go; it will see SIGSEGV on the unmapped range.
            let ps = attune_sys::page_size();
            let _ = e.uffd_thread.wake(addr & !(ps - 1), ps);
        }
    }
}

/// SIGBUS resolver for signal-delivery regions (and runtime staging buffers); the
/// handler that finds the engine is `crate::engine::on_sigbus`.
pub fn on_sigbus(e: &Pager, addr: usize) -> bool {
    if e.internal_contains(addr) {
        let ps = attune_sys::page_size();
        let _ = e.uffd_internal.zeropage(addr & !(ps - 1), ps);
        return true;
    }
    let _in = e.enter();
    match e.find(addr) {
        Some(r) if r.delivery == Delivery::Signal || e.serving_inline.load(Acquire) => {
            crate::inject::at(crate::inject::Point::Signal);
            resolve(e, &r, addr)
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_transient_error_is_retried_until_the_fetch_succeeds() {
        for e in [libc::EAGAIN, libc::ENOMEM, libc::EINTR] {
            let mut calls = 0;
            let r = retry_transient(10_000_000_000, || {
                calls += 1;
                if calls < 100 {
                    Err(Errno(e))
                } else {
                    Ok(())
                }
            });
            assert_eq!(r, Ok(()), "errno {e}");
            assert_eq!(calls, 100, "errno {e}");
        }
    }

    #[test]
    fn a_lasting_transient_error_gives_up_after_the_window() {
        let (mut calls, start) = (0u32, attune_sys::os::now_ns());
        let r = retry_transient(50_000_000, || {
            calls += 1;
            Err(Errno(libc::EAGAIN))
        });
        let took = attune_sys::os::now_ns() - start;
        assert_eq!(r, Err(Errno(libc::EAGAIN)));
        assert!(took >= 50_000_000, "gave up after {took} ns");
        assert!(took < 5_000_000_000, "kept trying for {took} ns");
        assert!(
            calls > 64,
            "{calls} tries: the yields come before the sleeps"
        );
    }

    #[test]
    fn any_other_error_is_not_retried() {
        for e in [libc::EIO, libc::EFAULT, libc::ENOSPC, libc::EEXIST] {
            let mut calls = 0;
            let r = retry_transient(10_000_000_000, || {
                calls += 1;
                Err(Errno(e))
            });
            assert_eq!((r, calls), (Err(Errno(e)), 1), "errno {e}");
        }
    }
}
