//! Access heat from samples: per-chunk rates, the bandwidth-capacity curve (share of
//! accesses against share of pages, hottest first), and flags suggested per region.
//! Pure functions of sample counts; the sampler itself is `attune::sample`.

use crate::Flags;

/// Accesses per second of a chunk: hits over exposure (the maximum-likelihood rate of a
/// Poisson process whose first touch after each park is timed, censored at the window).
/// None when the chunk was never sampled to the end.
pub fn rate(hits: u32, exposure_ns: u64) -> Option<f64> {
    if exposure_ns == 0 {
        return None;
    }
    Some(hits as f64 / (exposure_ns as f64 / 1e9))
}

/// The delivery floor from a histogram of hit delays in 1 us buckets, in ns: the bucket
/// that holds the first percent of the hits (the first hit itself below 100). One odd
/// delay far below the rest (a touch that raced with the park) would otherwise set the
/// floor at 0, and with it the grid's top rate at 10^7/s, where a tiny weight took most of
/// the accesses (an online split of tests/c/predict_online.c read its hot share as 0.01
/// of the region instead of 0.09).
pub fn delay_floor_ns(hist_us: &[u64]) -> u64 {
    let total: u64 = hist_us.iter().sum();
    let need = (total / 100).max(1);
    let mut seen = 0;
    hist_us
        .iter()
        .position(|&n| {
            seen += n;
            seen >= need
        })
        .unwrap_or(0) as u64
        * 1000
}

/// The share of the node's CPU time the hypervisor may steal while a program is profiled
/// before `attune profile` warns and records nothing. Samples are timed by the program's
/// own CPU clock (`paging/progclock.rs`), which stops while a thread waits on a run queue:
/// beside two to four busy loops on its two CPUs a uniform program read 0.12-0.19 of its
/// touches in its hottest tenth (truth 0.1), as alone, where wall time read 0.25-0.52
/// (docs/design/prediction.md, "A program that waits for a CPU"). Whether a thread's
/// clock also stops while the hypervisor runs another guest depends on the guest kernel
/// (`CONFIG_PARAVIRT_TIME_ACCOUNTING` takes steal out of the scheduler's task clock) and
/// is not measured here, so steal keeps the rule wall time needed for both.
pub const STOLEN_SHARE: f64 = 0.10;

/// The share of its time a program may wait on run queues before `attune profile`'s
/// summary says so. A note, not a warning: the samples are timed by the program's clock.
pub const NOTED_WAIT_SHARE: f64 = 0.10;

/// The share of its time a program waited for a CPU: `waited` of `waited + ran` on run
/// queues, plus the share of all CPUs' time the hypervisor stole meanwhile.
pub fn waited_share(ran_ns: u64, waited_ns: u64, steal_share: f64) -> f64 {
    let all = ran_ns.saturating_add(waited_ns);
    let queued = if all == 0 {
        0.0
    } else {
        waited_ns as f64 / all as f64
    };
    (queued + steal_share.max(0.0)).min(1.0)
}

/// The distribution of access rates over chunks, estimated from every sampled chunk at
/// once: a nonparametric maximum-likelihood mixture (EM over a fixed log-spaced grid of
/// rates, plus zero). A chunk with `h` touches over exposure `E` has likelihood
/// `rate^h * exp(-rate * E)` (Poisson touches, censored waits), whatever the number of
/// samples, so chunks sampled once still count at their right weight. Ranking chunks by
/// their own noisy estimate instead would favour lucky short delays (a uniform program
/// looked skewed that way). Returns (rate per second, share of chunks), shares summing to 1.
///
/// Rates faster than the delivery floor cannot be told apart, and the share of accesses
/// is a mean, which a tiny weight at an extreme rate dominates: one touch 18 us after a
/// park made a program under a DRAM budget look 0.99 concentrated instead of 0.9. So the
/// floor is taken off each touch's delay but a touch never counts as faster than two
/// floors, and the grid stops at one touch per floor.
pub fn rate_mixture(cells: &[(u32, u64)], floor_ns: u64) -> Vec<(f64, f64)> {
    // Cells with the same samples have the same likelihoods: each distinct one is
    // weighed by how many cells share it. Most sampled cells of a region were parked
    // and never touched, at a few exposures, so this cuts the EM's work about 3x
    // (`cargo test --release -p attune-policy online_split_locates`, 80 windows of 8192
    // cells: 31.0 s to 9.2 s).
    let mut sampled: Vec<(u32, u64)> = cells.iter().copied().filter(|c| c.1 > 0).collect();
    sampled.sort_unstable();
    let obs: Vec<((f64, f64), f64)> = sampled
        .chunk_by(|a, b| a == b)
        .map(|same| (observed(same[0].0, same[0].1, floor_ns), same.len() as f64))
        .collect();
    if obs.is_empty() {
        return Vec::new();
    }
    let top = if floor_ns > 0 {
        (1e9 / floor_ns as f64).min(1e7)
    } else {
        1e7
    };
    let mut grid = vec![0.0f64];
    let k = 90;
    for i in 0..k {
        // 0.1 per second up to `top`, log-spaced.
        grid.push(0.1 * (top / 0.1).powf(i as f64 / (k - 1) as f64));
    }
    let lik: Vec<(Vec<f64>, f64)> = obs
        .iter()
        .map(|&((h, e), count)| (likelihoods(h, e, &grid), count))
        .collect();
    let n: f64 = obs.iter().map(|o| o.1).sum();
    let mut w = vec![1.0 / grid.len() as f64; grid.len()];
    let mut next = vec![0.0; grid.len()];
    for _ in 0..400 {
        next.iter_mut().for_each(|x| *x = 0.0);
        for (l, count) in &lik {
            let z: f64 = l.iter().zip(&w).map(|(a, b)| a * b).sum();
            if z > 0.0 {
                for j in 0..grid.len() {
                    next[j] += count * w[j] * l[j] / z;
                }
            }
        }
        for j in 0..grid.len() {
            w[j] = next[j] / n;
        }
    }
    grid.into_iter().zip(w).filter(|x| x.1 > 1e-9).collect()
}

/// A sampled chunk's touches and exposure (seconds) as the estimator sees them: the
/// delivery floor taken off each touch, a touch never faster than two floors or 500 ns.
fn observed(hits: u32, exposure_ns: u64, floor_ns: u64) -> (f64, f64) {
    let (h, fl) = (hits as f64, floor_ns as f64);
    let e = (exposure_ns as f64 - h * fl)
        .max(h * 2.0 * fl)
        .max(h * 500.0)
        .max(1.0)
        / 1e9;
    (h, e)
}

/// Poisson likelihoods of `h` touches over `e` seconds at each rate of `grid`, scaled by
/// the largest (stability: only their ratios matter).
fn likelihoods(h: f64, e: f64, grid: &[f64]) -> Vec<f64> {
    let ll: Vec<f64> = grid
        .iter()
        .map(|&r| match (r == 0.0, h == 0.0) {
            (true, true) => 0.0,
            (true, false) => f64::NEG_INFINITY,
            _ => h * r.ln() - r * e,
        })
        .collect();
    let m = ll.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    ll.iter().map(|x| (x - m).exp()).collect()
}

/// Per chunk, the probability that it is one of the hottest `hot_share` of chunks, given
/// its own samples and the region's rate mixture (`None`: not sampled). The mixture's
/// fastest components up to `hot_share` of the weight are the hot class; Bayes' rule
/// weighs each class by its share and by how likely the chunk's touches and waits are
/// under its rates. Unlike ranking chunks by their own estimate and cutting at the
/// share, this uses the waits of untouched parks and the number of touches, and a hot
/// chunk touched a little late still reads hot when the rest of the region is slow.
pub fn hot_posterior(
    cells: &[(u32, u64)],
    mix: &[(f64, f64)],
    hot_share: f64,
    floor_ns: u64,
) -> Vec<Option<f64>> {
    let mut m: Vec<(f64, f64)> = mix.to_vec();
    m.sort_by(|a, b| b.0.total_cmp(&a.0));
    let total: f64 = m.iter().map(|x| x.1).sum();
    let mut left = hot_share.clamp(0.0, 1.0) * total;
    // Each component's weight in the hot class (the one across the boundary is split).
    let hot_w: Vec<f64> = m
        .iter()
        .map(|&(_, w)| {
            let take = w.min(left).max(0.0);
            left -= take;
            take
        })
        .collect();
    let grid: Vec<f64> = m.iter().map(|x| x.0).collect();
    cells
        .iter()
        .map(|&(h, e)| {
            if e == 0 || m.is_empty() {
                return None;
            }
            let (h, e) = observed(h, e, floor_ns);
            let l = likelihoods(h, e, &grid);
            let all: f64 = l.iter().zip(&m).map(|(l, x)| l * x.1).sum();
            let hot: f64 = l.iter().zip(&hot_w).map(|(l, w)| l * w).sum();
            Some(if all > 0.0 { hot / all } else { 0.0 })
        })
        .collect()
}

/// The curve of a rate mixture (rates with shares of chunks), as [`access_curve`].
pub fn mixture_curve(mix: &[(f64, f64)], points: usize) -> Vec<CurvePoint> {
    let points = points.max(1);
    let mut m: Vec<(f64, f64)> = mix.to_vec();
    m.sort_by(|a, b| b.0.partial_cmp(&a.0).unwrap_or(std::cmp::Ordering::Equal));
    let wsum: f64 = m.iter().map(|x| x.1).sum();
    let total: f64 = m.iter().map(|x| x.0 * x.1).sum();
    (0..=points)
        .map(|i| {
            let p = i as f64 / points as f64;
            if total <= 0.0 || wsum <= 0.0 {
                return CurvePoint {
                    pages: p,
                    accesses: p,
                };
            }
            let mut left = p * wsum;
            let mut acc = 0.0;
            for &(r, w) in &m {
                let take = w.min(left);
                acc += r * take;
                left -= take;
                if left <= 0.0 {
                    break;
                }
            }
            CurvePoint {
                pages: p,
                accesses: (acc / total).min(1.0),
            }
        })
        .collect()
}

/// A point of the curve: the hottest `pages` share of the footprint takes `accesses`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CurvePoint {
    pub pages: f64,
    pub accesses: f64,
}

/// The curve over chunks of equal weight (`rates` in any order), at `points` + 1 evenly
/// spaced page shares from 0 to 1. Empty input or no accesses: the diagonal.
pub fn access_curve(rates: &[f64], points: usize) -> Vec<CurvePoint> {
    let points = points.max(1);
    let mut r: Vec<f64> = rates
        .iter()
        .copied()
        .filter(|x| x.is_finite() && *x >= 0.0)
        .collect();
    r.sort_by(|a, b| b.partial_cmp(a).unwrap_or(std::cmp::Ordering::Equal));
    let total: f64 = r.iter().sum();
    (0..=points)
        .map(|i| {
            let p = i as f64 / points as f64;
            let a = if r.is_empty() || total <= 0.0 {
                p
            } else {
                share_of_top(&r, total, p)
            };
            CurvePoint {
                pages: p,
                accesses: a,
            }
        })
        .collect()
}

/// Share of `total` in the hottest `p` of `sorted` (descending), counting a fractional
/// last chunk.
fn share_of_top(sorted: &[f64], total: f64, p: f64) -> f64 {
    let x = p * sorted.len() as f64;
    let whole = x.floor() as usize;
    let mut s: f64 = sorted[..whole.min(sorted.len())].iter().sum();
    if whole < sorted.len() {
        s += sorted[whole] * (x - whole as f64);
    }
    (s / total).min(1.0)
}

/// Share of accesses taken by the hottest `p` of the pages, read off a curve.
pub fn accesses_at(curve: &[CurvePoint], p: f64) -> f64 {
    for w in curve.windows(2) {
        if p <= w[1].pages {
            let f = if w[1].pages > w[0].pages {
                (p - w[0].pages) / (w[1].pages - w[0].pages)
            } else {
                0.0
            };
            return w[0].accesses + f * (w[1].accesses - w[0].accesses);
        }
    }
    curve.last().map(|c| c.accesses).unwrap_or(p)
}

/// What the profiler suggests for one region.
#[derive(Clone, Debug, PartialEq)]
pub struct Suggestion {
    pub flags: Flags,
    /// For a split: the hot part's share of the region (LAT) and the rest (CAP).
    pub hot_share: Option<f64>,
    pub why: &'static str,
}

/// Flags for a region from its curve (fine-grained: 100 points) and its share of the whole footprint's
/// accesses and bytes. The rules (docs/design/prediction.md, "Access sampling and `attune profile`"):
/// * a small hot part (20% of the region or less takes 80% of its accesses): split, LAT
///   for that part and CAP for the rest (IMME's early-sampling example);
/// * accessed far more than its size (density 2x or more): LAT when it is small (under
///   10% of the footprint), BW otherwise;
/// * accessed far less than its size (density 0.25x or less): CAP;
/// * spread evenly and accessed about as much as its size: BW.
pub fn suggest(curve: &[CurvePoint], access_share: f64, byte_share: f64) -> Suggestion {
    let top20 = accesses_at(curve, 0.2);
    let density = if byte_share > 0.0 {
        access_share / byte_share
    } else {
        0.0
    };
    if top20 >= 0.8 && access_share > 0.0 {
        // The smallest share taking 80% of accesses, rounded up to a percent.
        let hot = curve
            .iter()
            .find(|c| c.accesses >= 0.8)
            .map(|c| c.pages)
            .unwrap_or(0.2);
        return Suggestion {
            flags: Flags(Flags::LAT.0 | Flags::CAP.0),
            hot_share: Some(hot),
            why: "a small part takes most accesses: LAT for it, CAP for the rest",
        };
    }
    if density >= 2.0 {
        if byte_share < 0.1 {
            return Suggestion {
                flags: Flags::LAT,
                hot_share: None,
                why: "hot and small",
            };
        }
        return Suggestion {
            flags: Flags::BW,
            hot_share: None,
            why: "hot and large: spread over tiers by bandwidth",
        };
    }
    if density <= 0.25 {
        return Suggestion {
            flags: Flags::CAP,
            hot_share: None,
            why: "cold: the capacity tier",
        };
    }
    Suggestion {
        flags: Flags::BW,
        hot_share: None,
        why: "accessed evenly, in proportion to its size",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waited_share_adds_queue_wait_and_steal() {
        // (ran, waited, steal) -> share
        let rows = [
            (0, 0, 0.0, 0.0),
            (900, 100, 0.0, 0.1),
            (500, 500, 0.0, 0.5),
            (1000, 0, 0.05, 0.05),
            (500, 500, 0.7, 1.0),
            (1000, 0, -0.2, 0.0),
        ];
        for (ran, waited, steal, want) in rows {
            let got = waited_share(ran, waited, steal);
            assert!(
                (got - want).abs() < 1e-9,
                "{ran} {waited} {steal}: {got} != {want}"
            );
        }
    }

    #[test]
    fn rate_is_hits_over_exposure() {
        assert_eq!(rate(0, 0), None);
        assert_eq!(rate(10, 1_000_000_000), Some(10.0));
        assert_eq!(rate(0, 20_000_000), Some(0.0));
    }

    #[test]
    fn curve_of_known_distributions() {
        // 10 chunks, one takes 90%.
        let mut r = vec![1.0; 9];
        r.push(81.0);
        let c = access_curve(&r, 10);
        assert_eq!(
            c[0],
            CurvePoint {
                pages: 0.0,
                accesses: 0.0
            }
        );
        assert!((c[1].accesses - 0.9).abs() < 1e-9);
        assert!((c[10].accesses - 1.0).abs() < 1e-9);
        // Uniform: the diagonal.
        let u = access_curve(&[5.0; 8], 4);
        for p in u {
            assert!((p.accesses - p.pages).abs() < 1e-9);
        }
        // Nothing sampled: the diagonal too.
        assert_eq!(access_curve(&[], 2)[1].accesses, 0.5);
        // Fractional chunk at the boundary.
        assert!((accesses_at(&access_curve(&[3.0, 1.0], 2), 0.25) - 0.375).abs() < 1e-9);
    }

    #[test]
    fn delay_floor_is_the_first_bucket_with_a_hit() {
        assert_eq!(delay_floor_ns(&[0, 0, 3, 1]), 2000);
        assert_eq!(delay_floor_ns(&[]), 0);
        // One outlier among 500 delays does not move the floor; five (1%) do.
        assert_eq!(delay_floor_ns(&[1, 0, 0, 499]), 3000);
        assert_eq!(delay_floor_ns(&[5, 0, 0, 495]), 0);
    }

    /// Cells of chunks with the given rates, `samples` parks each, window 20 ms, delays
    /// drawn from a fixed generator (the test cannot flake).
    fn simulate(rates: &[f64], samples: usize) -> Vec<(u32, u64)> {
        simulate_in(rates, samples, 0.02)
    }

    fn simulate_in(rates: &[f64], samples: usize, window: f64) -> Vec<(u32, u64)> {
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        rates
            .iter()
            .map(|&r| {
                let (mut h, mut e) = (0u32, 0.0f64);
                for _ in 0..samples {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let u = ((x >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
                    let d = if r > 0.0 { -u.ln() / r } else { f64::INFINITY };
                    if d <= window {
                        h += 1;
                        e += d;
                    } else {
                        e += window;
                    }
                }
                (h, (e * 1e9) as u64)
            })
            .collect()
    }

    #[test]
    fn mixture_recovers_skewed_and_uniform_curves_from_single_samples() {
        // 10% of chunks at 10k/s, 90% at 123/s: the hot 10% take 90%.
        let mut rates = vec![10_000.0; 400];
        rates.extend(vec![10_000.0 / 81.0; 3600]);
        let c = mixture_curve(&rate_mixture(&simulate(&rates, 1), 0), 100);
        assert!(
            (accesses_at(&c, 0.1) - 0.9).abs() < 0.05,
            "{:?}",
            accesses_at(&c, 0.1)
        );
        // Uniform at 2k/s: the diagonal (ranking by own estimate gave ~0.5 at 10% here).
        let u = mixture_curve(&rate_mixture(&simulate(&[2_000.0; 4000], 1), 0), 100);
        assert!(accesses_at(&u, 0.1) < 0.2, "{:?}", accesses_at(&u, 0.1));
        assert!((accesses_at(&u, 0.5) - 0.5).abs() < 0.1);
        // Untouched chunks are a zero-rate component.
        let mut z = vec![1_000.0; 500];
        z.extend(vec![0.0; 500]);
        let zc = mixture_curve(&rate_mixture(&simulate(&z, 2), 0), 100);
        assert!(accesses_at(&zc, 0.5) > 0.95);
        assert!(rate_mixture(&[], 0).is_empty());
    }

    #[test]
    fn a_touch_at_the_floor_is_not_an_extreme_rate() {
        // Hot 10% at 200/s, the rest at 2/s, through 0.5 s windows (truth: 0.917 at 10%),
        // plus one touch 18.5 us after its park with an 18 us floor. Taking the floor off
        // without a lower bound made that touch a 2M/s chunk and the curve 0.99 at 10%.
        let mut rates = vec![200.0; 400];
        rates.extend(vec![2.0; 3600]);
        let mut cells = simulate_in(&rates, 1, 0.5);
        cells.push((1, 18_500));
        let c = mixture_curve(&rate_mixture(&cells, 18_000), 100);
        let top = accesses_at(&c, 0.1);
        assert!((0.87..0.96).contains(&top), "{top}");
    }

    #[test]
    fn suggestions_table() {
        let mut skewed = vec![1.0; 90];
        skewed.extend(vec![81.0; 10]);
        let cases: Vec<(Vec<f64>, f64, f64, Flags)> = vec![
            (skewed, 0.5, 0.5, Flags(Flags::LAT.0 | Flags::CAP.0)),
            (vec![10.0; 50], 0.5, 0.05, Flags::LAT),
            (vec![10.0; 50], 0.8, 0.3, Flags::BW),
            (vec![10.0; 50], 0.05, 0.5, Flags::CAP),
            (vec![10.0; 50], 0.4, 0.4, Flags::BW),
        ];
        for (rates, a, b, want) in cases {
            assert_eq!(
                suggest(&access_curve(&rates, 100), a, b).flags,
                want,
                "{a} {b}"
            );
        }
        let hot_one = [100.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0];
        let s = suggest(&access_curve(&hot_one, 100), 0.5, 0.5);
        let h = s.hot_share.unwrap();
        assert!(h > 0.05 && h <= 0.1, "{h}");
    }
}
