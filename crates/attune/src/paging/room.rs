//! Waiting for room in a far tier the node daemon grows.
//!
//! A `pool` tier (and a `memory` tier under a daemon's far pool) holds at most the far
//! grant, and the daemon sizes the grant from the runtime's reports. A program that fills
//! memory faster than a report and a grant go round finds every far tier full; placing
//! its chunks over the DRAM budget then runs the job into its memory cgroup's limit, and
//! the kernel kills it. So a fault that found no room waits, while a grant can still
//! bring it (`attune_policy::budget::waits_for_room`): it asks the daemon client to
//! report at once and retries its reclaim until room comes or `ROOM_WAIT_NS` passes. The
//! wait is backpressure: the program slows to the pace its far memory grows at.

use super::pager::Pager;
use attune_policy::budget;
use attune_sys::os;
use std::sync::atomic::Ordering::*;

/// Bytes the daemon-sized tiers may hold now, and whether one of them can still grow:
/// below its configured capacity, and (a pool tier) with a segment of this process's own.
fn grantable(e: &Pager) -> (u64, bool) {
    let mut granted = 0;
    let mut growable = false;
    for t in e.tiers.iter().filter(|t| t.is_memory() && t.is_pageable()) {
        granted += t.capacity();
        let own_segment = t.as_pool().is_none_or(|p| p.attached() && !p.detached());
        growable |= own_segment && t.capacity() < t.cfg.capacity;
    }
    (granted, growable)
}

/// Called when reclaim freed less than `want` bytes and no far tier has room: waits for
/// a grant to make room and reclaims into it. Returns the bytes freed (0 at once when no
/// grant can bring room). Signal-safe: atomics, `nanosleep` and reclaim.
pub fn wait_for_room(e: &Pager, want: u64) -> u64 {
    let g = &e.far_growth;
    let (granted, growable) = grantable(e);
    let gave_up = g.gave_up_at.load(Relaxed);
    let connected = g.daemon.load(Acquire);
    if !budget::waits_for_room(
        connected && growable,
        granted,
        (gave_up != u64::MAX).then_some(gave_up),
    ) {
        return 0;
    }
    g.asks.fetch_add(1, AcqRel);
    e.counters.room_waits.fetch_add(1, Relaxed);
    let start = os::now_ns();
    let mut freed = 0;
    loop {
        os::sleep_us(200);
        let got = super::evict::reclaim(e, want - freed);
        freed += got;
        // Done; or room came and still nothing could go (pins, protected pages): what
        // stands in the way is not room.
        if freed >= want || (got == 0 && super::evict::has_room_for(e, want - freed)) {
            break;
        }
        let (granted, growable) = grantable(e);
        if !(g.daemon.load(Acquire) && growable) {
            break;
        }
        if os::now_ns() - start >= budget::ROOM_WAIT_NS {
            g.gave_up_at.store(granted, Relaxed);
            break;
        }
    }
    e.counters
        .room_wait_ns
        .fetch_add(os::now_ns() - start, Relaxed);
    freed
}
