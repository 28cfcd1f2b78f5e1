//! Access sampling of resident pages (mechanism; estimates in `attune_policy::heat`).
//!
//! Faults only show accesses to pages that are not resident. To see the rest, the sampler
//! thread parks a random unpinned chunk at a steady rate (one already out of DRAM needs no
//! move): it moves the chunk to
//! the far tier exactly as an eviction would and notes the time. The application's next
//! touch faults it back (the ordinary fault path); `sample::on_placed` times that touch. A chunk
//! not touched within the window is a censored sample. Per chunk, hits / exposure is the
//! maximum-likelihood rate of a Poisson access process observed that way, and unlike a
//! referenced bit it does not saturate for hot pages: a hot chunk's touch comes after
//! microseconds, a cold one's after the window or never.
//!
//! Cost: one chunk move out and (if touched) one fault back per sample; at 1000 samples
//! a second and 4 KiB chunks a random-access program lost 3-9% of its accesses
//! (`bench/profile_overhead.sh`, docs/benchmarks.md).
//! A parked chunk that is not touched again stays in the far tier, as an evicted one would.
//!
//! The same thread makes the online flag prediction (`predict_window_ms`): a region that
//! came without flags is sampled from its allocation for the window; then its own samples
//! decide (`attune_policy::predict::online_split`) whether a small part takes most of its
//! accesses, and if so that part is pinned (its LAT part) and the region gets CAP flags
//! (IMME's early-sampling example). Either way its sampling stops there, unless
//! `sample_rate` asks for sampling all along (`attune profile`).

use super::pager::Pager;
use super::progclock::{Listing, CLOCK};
use super::sample::cells;
use crate::region::{Region, Where};
use attune_sys::os::now_ns;
use std::collections::VecDeque;
use std::sync::atomic::Ordering::*;
use std::sync::Arc;
use std::time::Duration;

/// Samples a second while only the online prediction samples (`sample_rate` 0): the rate
/// `attune profile` uses; a region's window then gathers about this many parks a second,
/// spread over the regions being predicted.
pub const ONLINE_RATE: u64 = 1000;

/// The cell the online prediction decides on, in bytes (see `predict`).
const CELL_BYTES: usize = 64 << 10;

/// Under `attune profile` (`sample_rate` set): threads the program starts from now on are
/// followed from their start to their end; the sampler's listing finds the others
/// (docs/design/prediction.md, "Threads that come and go"). Called by the thread that
/// starts the sampler, before it goes on: installed by the sampler thread itself, the
/// hooks missed the first threads a program started while that thread waited for a CPU
/// (2 of 801 in `profile-thread-ends`, once in a CI run).
pub fn follow_threads(e: &Pager) {
    if all(e) {
        attune_sys::threads::follow(
            || CLOCK.begin_thread(),
            || {
                CLOCK.end_thread();
                super::cputimes::at_thread_end();
            },
        );
    }
}

/// The sampler thread: parks `sample_rate` chunks a second, closes expired samples, and
/// decides the flags of regions whose prediction window is over.
pub fn sampler_loop(e: &'static Pager) {
    let all = all(e);
    let rate = if all { e.cfg.sample_rate } else { ONLINE_RATE } as f64;
    let window = e.cfg.sample_window_us * 1000;
    let mut rng = now_ns() | 1;
    let mut credit = 0.0f64;
    let mut last = now_ns();
    let mut pending: VecDeque<(Arc<Region>, usize, u64)> = VecDeque::new();
    let mut loops = 0u64;
    let mut threads = Listing::default();
    loop {
        std::thread::sleep(Duration::from_millis(1));
        // New threads are found within a loop of their start, ended ones within 10 ms.
        if all && (threads.count_moved() || loops % 10 == 0) {
            CLOCK.refresh(&mut threads);
        }
        loops += 1;
        let now = now_ns();
        // Up to 100 ms of parks owed are made up: beside 64 busy program threads on two
        // CPUs the sampler ran late and parked 866 chunks in 3 s with 10 ms made up,
        // 1037-1284 with 100 ms, of 3000 asked: it waits for a CPU, and of its own CPU
        // time the program's clock took about a fifth, the parks' file I/O most of the rest
        // (docs/design/prediction.md, "A program that waits for a CPU").
        credit = (credit + rate * now.saturating_sub(last) as f64 / 1e9).min(rate / 10.0 + 1.0);
        last = now;
        expire(&mut pending, e.sample_now(), window);
        let _in = e.enter();
        let regions: Vec<Arc<Region>> = {
            let t = e.regions.read().unwrap_or_else(|p| p.into_inner());
            t.iter()
                .filter(|r| r.samples.enabled() && !r.freed.load(Acquire))
                .filter(|r| all || r.predict_due.load(Relaxed) != 0)
                .cloned()
                .collect()
        };
        for r in &regions {
            let due = r.predict_due.load(Relaxed);
            if due != 0 && now >= due && r.predict_due.swap(0, Relaxed) != 0 {
                predict(e, r);
            }
        }
        let total: usize = regions.iter().map(|r| r.chunks()).sum();
        if total == 0 {
            credit = 0.0;
            continue;
        }
        while credit >= 1.0 {
            credit -= 1.0;
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let mut k = (rng % total as u64) as usize;
            let Some(r) = regions.iter().find(|r| {
                if k < r.chunks() {
                    true
                } else {
                    k -= r.chunks();
                    false
                }
            }) else {
                continue;
            };
            if let Some(t) = park(e, r, k) {
                pending.push_back((r.clone(), k, t));
            }
        }
    }
}

/// Starts a sample on chunk `c` (not pinned, not already a sample); its start time.
/// A resident chunk is parked first; a chunk already out of DRAM (in a far tier, or never
/// touched) is a sample as it stands: its next touch faults all the same. Leaving those
/// out would confine the curve to what happens to be resident, which under a budget is
/// the hot part only.
fn park(e: &Pager, r: &Region, c: usize) -> Option<u64> {
    let s = r.state(c);
    // No program thread followed (none found yet, or all ended): no clock to time a
    // sample by.
    if s.pinned() || r.samples.parked_at[c].load(Relaxed) != 0 || (all(e) && !CLOCK.running()) {
        return None;
    }
    match s.place() {
        Where::Resident => {}
        Where::Far | Where::Fresh => {
            // Held as Fetching while the note is made, so a touch that races with us
            // waits and then finds the note.
            if !r.claim_hold(c, s) {
                return None;
            }
            let t = e.sample_now().max(2);
            r.samples.parked_at[c].store(t, Release);
            r.samples.parks[c].fetch_add(1, Relaxed);
            let restored = r.cas(c, s.with(Where::Fetching, s.tier()), s);
            debug_assert!(restored, "only the sampler holds a chunk it claimed");
            return Some(t);
        }
        Where::Fetching | Where::Evicting => return None,
    }
    if !r.claim_evict(c, s) {
        return None;
    }
    // Noted before the move: while the chunk is Evicting a touch waits, so the fault that
    // follows always finds the note.
    let t = e.sample_now().max(2);
    r.samples.parked_at[c].store(t, Release);
    if let Some(out) = super::evict::park_chunk(e, r, c) {
        let out = out.max(t);
        r.samples.parks[c].fetch_add(1, Relaxed);
        // The clock starts when the chunk left the mapping: a touch before could not
        // fault, one after is a touch of the parked chunk even while a staging medium
        // still writes it (it waits, and `sample::on_placed` times it by its arrival).
        // If a touch already took the note, the sample is its.
        match r.samples.parked_at[c].compare_exchange(t, out, AcqRel, Relaxed) {
            Ok(_) => Some(out),
            Err(_) => None,
        }
    } else {
        r.samples.parked_at[c].store(0, Release);
        None
    }
}

/// Sampling all along (`attune profile`), not only for the online prediction.
fn all(e: &Pager) -> bool {
    e.cfg.sample_rate > 0
}

/// Samples older than the window (in the program's run time) that no touch closed:
/// censored, exposure = window.
fn expire(pending: &mut VecDeque<(Arc<Region>, usize, u64)>, now: u64, window: u64) {
    while let Some((r, c, t)) = pending.front() {
        if now.saturating_sub(*t) < window {
            break;
        }
        if r.samples.parked_at[*c]
            .compare_exchange(*t, 0, AcqRel, Relaxed)
            .is_ok()
        {
            r.samples.exposure_ns[*c].fetch_add(window, Relaxed);
        }
        pending.pop_front();
    }
}

/// The online prediction for region `r`, its window over: split it (pin the hot part, CAP
/// for the rest) when its samples show a small part taking most accesses.
fn predict(e: &Pager, r: &Region) {
    let all = cells(r);
    let parks: u64 = all.iter().map(|c| c.2 as u64).sum();
    // Decided on 64 KiB cells whatever the chunk size: the window parks about a thousand
    // chunks a second, and spread over 4 KiB chunks a 64 MiB region got 0.1 samples per
    // chunk in 2 s, too few to confirm its hot part (kept 2 times in 16 under `attune
    // run`, tests/python/test_predict.py, 2026-11-26; at 64 KiB chunks it got 2). A cell's
    // touches and exposure are its chunks' sums: the group's mean rate per chunk.
    let group = (CELL_BYTES / r.chunk).max(1);
    let cells: Vec<(u32, u64)> = all
        .chunks(group)
        .map(|g| g.iter().fold((0u32, 0u64), |a, c| (a.0 + c.0, a.1 + c.1)))
        .collect();
    let hits: u64 = cells.iter().map(|c| c.0 as u64).sum();
    let hist: Vec<u64> = e
        .counters
        .sample_delay_us
        .iter()
        .map(|a| a.load(Relaxed))
        .collect();
    let floor = attune_policy::heat::delay_floor_ns(&hist);
    let hot = match attune_policy::predict::online_split(
        &cells,
        floor,
        attune_policy::predict::ONLINE_MIN_HITS,
    ) {
        Ok(hot) => hot,
        Err(why) => {
            e.counters.online_kept_regions.fetch_add(1, Relaxed);
            crate::info!(
                "online prediction: region of {} bytes at {:#x} keeps its flags ({why}; {hits} of {parks} samples touched)",
                r.requested,
                r.base
            );
            return;
        }
    };
    // The flags first: from now on the hand treats the rest as capacity data.
    r.flags
        .store(attune_policy::predict::ONLINE_SPLIT_FLAGS.0, Relaxed);
    let mut pinned = 0u64;
    for (a, b) in hot {
        let start = ((a * r.len as f64) as usize) / r.chunk * r.chunk;
        let end = (((b * r.len as f64) as usize).div_ceil(r.chunk) * r.chunk).min(r.len);
        let room = e.policy_pin_room() / r.chunk * r.chunk;
        let len = (end - start).min(room);
        if len == 0 {
            break;
        }
        e.pin(r, r.base + start, len, true);
        pinned += len as u64;
    }
    e.counters.online_split_regions.fetch_add(1, Relaxed);
    e.counters.online_pinned_bytes.fetch_add(pinned, Relaxed);
    crate::info!(
        "online prediction: region of {} bytes at {:#x}: {pinned} hot bytes pinned (LAT), the rest CAP",
        r.requested,
        r.base
    );
}
