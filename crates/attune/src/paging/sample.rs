//! Access samples: what the fault path records when a parked chunk is touched, and the
//! per-chunk cells reports read. The sampler thread that parks chunks is `sampler.rs`.

use super::pager::Pager;
use crate::region::Region;
use std::sync::atomic::Ordering::*;

/// Called by the fault path when chunks `[c, c+n)` were placed: a parked chunk's touch
/// (only `touched` was touched; the others came by read-ahead and are closed untouched).
/// `fault_ns` is when the fault path took the fault (before reclaim and the load, which
/// are not the application's delay). Signal-safe: atomics only.
pub fn on_placed(e: &Pager, r: &Region, c: usize, n: usize, touched: usize, fault_ns: u64) {
    let window = e.cfg.sample_window_us * 1000;
    let now = fault_ns;
    for i in 0..n {
        let t = r.samples.parked_at[c + i].swap(0, AcqRel);
        // No note, or a touch that faulted before the park was noted (it waited on a far
        // chunk the sampler held to note it): not a sample of this park. Counted, it was a
        // hit after 0 ns, which set the delivery floor to 0.
        if t == 0 || now < t {
            continue;
        }
        let d = now - t;
        if c + i == touched && d <= window {
            r.samples.hits[c + i].fetch_add(1, Relaxed);
            r.samples.exposure_ns[c + i].fetch_add(d.max(1), Relaxed);
            e.counters.sample_hits.fetch_add(1, Relaxed);
            e.counters.sample_delay_us[((d / 1000) as usize).min(31)].fetch_add(1, Relaxed);
        } else {
            r.samples.exposure_ns[c + i].fetch_add(d.min(window), Relaxed);
        }
    }
}

/// Per-chunk (hits, exposure in ns, parks) of a region, for reports.
pub fn cells(r: &Region) -> Vec<(u32, u64, u32)> {
    (0..r.samples.hits.len())
        .map(|c| {
            (
                r.samples.hits[c].load(Relaxed),
                r.samples.exposure_ns[c].load(Relaxed),
                r.samples.parks[c].load(Relaxed),
            )
        })
        .collect()
}
