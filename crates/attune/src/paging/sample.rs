//! Access samples: what the fault path records when a parked chunk is touched, and the
//! per-chunk cells reports read. The sampler thread that parks chunks is `sampler.rs`.

use super::pager::Pager;
use crate::region::Region;
use std::sync::atomic::Ordering::*;

/// The chunk of a run an access asked for, and when that access reached Attune, before
/// it waited on a chunk being moved (`fault::resolve`).
#[derive(Clone, Copy)]
pub struct Touch {
    /// `usize::MAX`: no chunk.
    pub chunk: usize,
    /// By the sampler's clock (`Pager::sample_now`); 0: no access, as for a prefetch
    /// or a pin.
    pub arrival_ns: u64,
}

impl Touch {
    /// A run that no access asked for (read-ahead on a stride).
    pub const NONE: Touch = Touch {
        chunk: usize::MAX,
        arrival_ns: 0,
    };
}

/// Called by the fault path when chunks `[c, c+n)` were placed: the touch of a parked
/// chunk is a hit after `arrival - parked` of the program's run time (`progclock`); the
/// run's other chunks (read-ahead) are closed untouched. Signal-safe: atomics only.
///
/// A touch that reached Attune before the park's clock started is not a sample of this
/// park, and is dropped without exposure: it faulted before the note (it waited on a far
/// chunk the sampler held to note it), or while the chunk was being moved out and then
/// waited for the move. Timed from when it was served, the second kind read as hits
/// after under a microsecond: with the file tier, whose moves are slow, 14% of a uniform
/// program's hits, which made it look 95% concentrated in its top tenth. Dropping them
/// biases nothing: whether a touch came before the clock started says nothing of the
/// touches after it (Poisson increments are independent).
pub fn on_placed(e: &Pager, r: &Region, c: usize, n: usize, touch: Touch) {
    let window = e.cfg.sample_window_us * 1000;
    // The end of the untouched chunks' exposure: read once, and only if one was parked
    // (most placements in a sampled region close no sample).
    let mut now = 0;
    for i in 0..n {
        let t = r.samples.parked_at[c + i].swap(0, AcqRel);
        if t == 0 {
            continue;
        }
        if c + i == touch.chunk && touch.arrival_ns != 0 {
            if touch.arrival_ns < t {
                continue;
            }
            let d = touch.arrival_ns - t;
            if d <= window {
                r.samples.hits[c + i].fetch_add(1, Relaxed);
                r.samples.exposure_ns[c + i].fetch_add(d.max(1), Relaxed);
                e.counters.sample_hits.fetch_add(1, Relaxed);
                e.counters.sample_delay_us[((d / 1000) as usize).min(31)].fetch_add(1, Relaxed);
                continue;
            }
        }
        if now == 0 {
            now = e.sample_now().max(1);
        }
        r.samples.exposure_ns[c + i].fetch_add(now.saturating_sub(t).min(window), Relaxed);
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
