//! Flags predicted from the execution history of the same program (IMME §III-C2: "no
//! flags: the runtime decides"). Pure: the store's file format and I/O live in the CLI
//! (`attune-cli/src/history.rs`); here are the decisions.
//!
//! * A **run record** is what `attune profile` learned about one run: per managed region
//!   in allocation order, its size, the flags suggested for it and, when a small part of
//!   it takes most accesses, where that part lies (fractions of the region).
//! * A new run takes the record whose arguments are **nearest** to its own (exact first;
//!   numbers compared by ratio, so `app 2048` is nearer to `app 1024` than to `app 64`).
//! * Each allocation takes the recorded region of **nearest size** (within a factor 2),
//!   the n-th allocation of a size the n-th such region, so equal-sized arrays keep their
//!   own flags.
//! * A region whose hot part is known is allocated with the flags of the rest (CAP) and
//!   its hot ranges pinned in DRAM: IMME's split into a LAT part and a CAP part.

use crate::Flags;

/// What was learned about one region.
#[derive(Clone, Debug, PartialEq)]
pub struct RegionRecord {
    pub size: u64,
    pub flags: Flags,
    /// Hot ranges `[start, end)` as fractions of the region, sorted, disjoint.
    pub hot: Vec<(f64, f64)>,
}

/// What was learned about one run.
#[derive(Clone, Debug, PartialEq)]
pub struct RunRecord {
    pub args: Vec<String>,
    pub regions: Vec<RegionRecord>,
}

/// Distance between two argument lists of one program, or None when they describe
/// different work (another count of arguments, or a differing argument that is not a
/// number: `python3 a.py` learns nothing from `python3 b.py`). Equal lists are 0; each
/// pair of differing positive numbers adds `min(1, |ln(a/b)| / ln 16)`.
pub fn args_distance(a: &[String], b: &[String]) -> Option<f64> {
    if a.len() != b.len() {
        return None;
    }
    let mut d = 0.0;
    for (x, y) in a.iter().zip(b) {
        if x == y {
            continue;
        }
        d += match (x.parse::<f64>(), y.parse::<f64>()) {
            (Ok(p), Ok(q)) if p > 0.0 && q > 0.0 => ((p / q).ln().abs() / 16f64.ln()).min(1.0),
            _ => return None,
        };
    }
    Some(d)
}

/// The run whose arguments are nearest to `args` (the later one on a tie: newer).
pub fn nearest_run<'a>(runs: &'a [RunRecord], args: &[String]) -> Option<&'a RunRecord> {
    let mut best: Option<(f64, &RunRecord)> = None;
    for r in runs {
        let Some(d) = args_distance(&r.args, args) else {
            continue;
        };
        if best.is_none_or(|(bd, _)| d <= bd) {
            best = Some((d, r));
        }
    }
    best.map(|b| b.1)
}

/// Sizes within this factor of a recorded region may take its flags.
const SIZE_FACTOR: f64 = 2.0;

/// The recorded regions an allocation of `size` may take, in recorded order: those at
/// the nearest size (log scale, 1% slack), none beyond a factor 2. Returns their indices.
pub fn candidates(regions: &[RegionRecord], size: u64) -> Vec<usize> {
    let dist = |r: &RegionRecord| ((size.max(1) as f64) / (r.size.max(1) as f64)).ln().abs();
    let Some(best) = regions.iter().map(dist).min_by(|a, b| a.total_cmp(b)) else {
        return Vec::new();
    };
    if best > SIZE_FACTOR.ln() {
        return Vec::new();
    }
    (0..regions.len())
        .filter(|&i| dist(&regions[i]) <= best + 0.01)
        .collect()
}

/// Where the hot part of a region lies, from the probability of each chunk being hot
/// (`heat::hot_posterior`; `None`: chunk not sampled) and the share of the region the hot
/// part takes. Samples are few and single delays noisy (a cold chunk is sometimes touched
/// at once), so:
/// 1. the sampled chunks most likely hot, as many as the posteriors expect (their sum,
///    ties at the cut left out), are hot, and so is any chunk more likely hot than not.
///    A 0.5 cut alone found nothing when the mixture gave the hot class two components
///    (each hot chunk then read 0.3 to 0.5 hot): an online split confirmed by its
///    cross-check was dropped as "could not be located" (1 run in 6 of
///    tests/python/test_predict.py, 2026-11-27);
/// 2. each sampled chunk takes the majority class of itself and two sampled neighbours
///    on each side (a median filter: lone hot chunks in a cold area and lone cold ones in
///    a hot area are noise);
/// 3. an unsampled chunk is hot when the sampled chunks on both sides are (one side at the
///    region's ends);
/// 4. the longest ranges are kept until they cover the share, at most `max_ranges`.
pub fn hot_ranges(p_hot: &[Option<f64>], hot_share: f64, max_ranges: usize) -> Vec<(f64, f64)> {
    let n = p_hot.len();
    let sampled: Vec<(usize, f64)> = p_hot
        .iter()
        .enumerate()
        .filter_map(|(c, p)| p.map(|p| (c, p)))
        .collect();
    if n == 0 || sampled.is_empty() || hot_share <= 0.0 {
        return Vec::new();
    }
    let m = sampled.len();
    let expect = (sampled.iter().map(|s| s.1).sum::<f64>().round() as usize).min(m);
    let mut order: Vec<f64> = sampled.iter().map(|s| s.1).collect();
    order.sort_by(|a, b| b.total_cmp(a));
    // The first probability left out: chunks above it are the `expect` most likely.
    let cut = order.get(expect).copied().unwrap_or(f64::NEG_INFINITY);
    let raw: Vec<bool> = sampled
        .iter()
        .map(|s| s.1 > 0.5 || (expect > 0 && s.1 > cut))
        .collect();
    let smooth: Vec<bool> = (0..m)
        .map(|i| {
            let w = &raw[i.saturating_sub(2)..(i + 3).min(m)];
            2 * w.iter().filter(|&&h| h).count() > w.len()
        })
        .collect();
    let mut hot = vec![false; n];
    for (i, &(c, _)) in sampled.iter().enumerate() {
        hot[c] = smooth[i];
        // The unsampled chunks up to the next sample (or the end).
        let next = sampled.get(i + 1).map(|s| s.0).unwrap_or(n);
        let fill = smooth[i] && smooth.get(i + 1).copied().unwrap_or(true);
        hot[c + 1..next].iter_mut().for_each(|h| *h = fill);
    }
    // Before the first sample: as the first sample.
    let first = sampled[0].0;
    hot[..first].iter_mut().for_each(|h| *h = smooth[0]);
    let mut ranges: Vec<(usize, usize)> = Vec::new();
    for (c, &h) in hot.iter().enumerate() {
        if !h {
            continue;
        }
        match ranges.last_mut() {
            Some(last) if last.1 == c => last.1 = c + 1,
            _ => ranges.push((c, c + 1)),
        }
    }
    ranges.sort_by_key(|r| std::cmp::Reverse(r.1 - r.0));
    let want = (hot_share.min(1.0) * n as f64).ceil() as usize;
    let mut kept = Vec::new();
    let mut covered = 0;
    for r in ranges {
        if covered >= want || kept.len() >= max_ranges.max(1) {
            break;
        }
        covered += r.1 - r.0;
        kept.push(r);
    }
    kept.sort();
    kept.into_iter()
        .map(|(s, e)| (s as f64 / n as f64, e as f64 / n as f64))
        .collect()
}

/// Samples (touched parks) a region needs before an online decision: with fewer, one or
/// two lucky delays decide the curve.
pub const ONLINE_MIN_HITS: u64 = 100;

/// The flags of a region the online prediction split: its hot part is pinned (LAT's
/// protection, within the pin room) and the rest is capacity data, the first to go.
pub const ONLINE_SPLIT_FLAGS: Flags = Flags::CAP;

/// The online variant of the split (IMME's early-sampling example): from a region's own
/// samples in the first moments of its life (per chunk: touched parks and exposure in ns,
/// `attune::sample::cells`), the hot ranges to pin as its LAT part (the rest becomes CAP),
/// or why the region is left as it is. The same estimator and rules as `attune profile`
/// (`heat::rate_mixture`, `heat::suggest`'s split rule, `hot_ranges`), applied to the
/// region alone: its share of the whole footprint is not known yet, so only the split,
/// which depends on the region's own curve, is decided online.
///
/// A window's samples are few (about one park per chunk or less), and with them a uniform
/// region was read as split in 2 of 8 trials: the ranges are chosen from the chunks that
/// happened to be touched, so the same samples always confirm them. So the decision is
/// cross-validated: ranges found from the even chunks' samples must show, on the odd
/// chunks' samples (which did not choose them), at least [`ONLINE_MIN_RATIO`] times the
/// access rate of the rest of the region, and then the ranges are found again from all
/// samples.
pub fn online_split(
    cells: &[(u32, u64)],
    floor_ns: u64,
    min_hits: u64,
) -> Result<Vec<(f64, f64)>, &'static str> {
    let hits: u64 = cells.iter().map(|c| c.0 as u64).sum();
    if hits < min_hits {
        return Err("too few samples to decide");
    }
    let half = |keep: usize| -> Vec<(u32, u64)> {
        cells
            .iter()
            .enumerate()
            .map(|(c, &x)| if c % 2 == keep { x } else { (0, 0) })
            .collect()
    };
    let chosen = split_ranges(&half(0), floor_ns)?;
    // The odd chunks' access rate inside the chosen ranges against outside them.
    let n = cells.len() as f64;
    let (mut hin, mut ein, mut hout, mut eout) = (0u64, 0u64, 0u64, 0u64);
    for (c, &(h, e)) in cells.iter().enumerate().filter(|(c, _)| c % 2 == 1) {
        let x = (c as f64 + 0.5) / n;
        if chosen.iter().any(|&(a, b)| x >= a && x < b) {
            (hin, ein) = (hin + h as u64, ein + e);
        } else {
            (hout, eout) = (hout + h as u64, eout + e);
        }
    }
    let rate = |h: u64, e: u64| if e > 0 { h as f64 / e as f64 } else { 0.0 };
    if hin < ONLINE_MIN_CONFIRM || rate(hin, ein) < ONLINE_MIN_RATIO * rate(hout, eout) {
        return Err("the hot part did not hold up on the samples that did not choose it");
    }
    split_ranges(cells, floor_ns)
}

/// Touched samples the confirming half must have inside the chosen ranges.
pub const ONLINE_MIN_CONFIRM: u64 = 10;
/// How much hotter (access rate) the chosen ranges must be on the confirming half.
pub const ONLINE_MIN_RATIO: f64 = 4.0;

/// The split rule on one set of samples: the hot ranges, or why there are none.
fn split_ranges(cells: &[(u32, u64)], floor_ns: u64) -> Result<Vec<(f64, f64)>, &'static str> {
    let mix = crate::heat::rate_mixture(cells, floor_ns);
    let curve = crate::heat::mixture_curve(&mix, 100);
    let Some(share) = crate::heat::suggest(&curve, 1.0, 1.0).hot_share else {
        return Err("no small part takes most of the accesses");
    };
    let p_hot = crate::heat::hot_posterior(cells, &mix, share, floor_ns);
    let hot = hot_ranges(&p_hot, share, 16);
    if hot.is_empty() {
        return Err("the hot part could not be located");
    }
    Ok(hot)
}

/// The record kept for a region the profiler suggested `flags` for: a split (LAT with
/// CAP and a hot share) becomes CAP flags with the hot ranges pinned.
pub fn record_region(size: u64, flags: Flags, hot: Vec<(f64, f64)>) -> RegionRecord {
    let split = flags.0 & Flags::LAT.0 != 0 && flags.0 & Flags::CAP.0 != 0 && !hot.is_empty();
    RegionRecord {
        size,
        flags: if split { Flags::CAP } else { flags },
        hot: if split { hot } else { Vec::new() },
    }
}

/// The interposer's form of a run record (`ATTUNE_PREDICT`): regions separated by `;`,
/// each `SIZE:FLAGS` with optional hot ranges `@S-E+S-E` (fractions).
pub fn encode(regions: &[RegionRecord]) -> String {
    regions
        .iter()
        .map(|r| {
            let mut s = format!("{}:{}", r.size, r.flags.to_string().replace(',', "|"));
            if !r.hot.is_empty() {
                let hot: Vec<String> = r
                    .hot
                    .iter()
                    // Shortest exact form: a fixed precision rounded (0.9999999, 1) to an
                    // empty range, which `decode` refused, stopping the run's interposer
                    // (found by the history fuzz target).
                    // -0.0 is within [0, 1] but prints as "-0", whose '-' the decoder
                    // took for the separator (found by the same target): written as 0.
                    .map(|(a, b)| format!("{}-{}", a + 0.0, b + 0.0))
                    .collect();
                s.push('@');
                s.push_str(&hot.join("+"));
            }
            s
        })
        .collect::<Vec<_>>()
        .join(";")
}

/// Parses [`encode`]'s form; an error names the bad entry.
pub fn decode(s: &str) -> Result<Vec<RegionRecord>, String> {
    let mut out = Vec::new();
    for entry in s.split(';').map(str::trim).filter(|e| !e.is_empty()) {
        let bad = |why: &str| format!("'{entry}': {why}");
        let (head, hot) = match entry.split_once('@') {
            Some((h, r)) => (h, Some(r)),
            None => (entry, None),
        };
        let (size, flags) = head
            .split_once(':')
            .ok_or_else(|| bad("expected SIZE:FLAGS"))?;
        let size: u64 = size
            .parse()
            .map_err(|_| bad("size is not a number of bytes"))?;
        let flags = Flags::parse(flags).map_err(|e| bad(&e))?;
        let mut ranges = Vec::new();
        for r in hot.into_iter().flat_map(|h| h.split('+')) {
            let (a, b) = r
                .split_once('-')
                .ok_or_else(|| bad("hot range is not S-E"))?;
            let (a, b): (f64, f64) = (
                a.parse().map_err(|_| bad("hot range start"))?,
                b.parse().map_err(|_| bad("hot range end"))?,
            );
            if !(0.0..=1.0).contains(&a) || !(0.0..=1.0).contains(&b) || a >= b {
                return Err(bad("hot range outside [0, 1]"));
            }
            ranges.push((a, b));
        }
        out.push(RegionRecord {
            size,
            flags,
            hot: ranges,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn args_distance_table() {
        let cases: &[(&[&str], &[&str], Option<f64>)] = &[
            (&["64", "3"], &["64", "3"], Some(0.0)),
            (&["64"], &["64", "3"], None),
            (&["in.nml"], &["out.nml"], None),
            (&["1024"], &["2048"], Some(0.25)),
            (&["1024", "x"], &["2048", "x"], Some(0.25)),
            (&["1024"], &["16384"], Some(1.0)),
            (&["1024"], &["1e9"], Some(1.0)),
            (&["-1"], &["1"], None),
        ];
        for (i, (a, b, want)) in cases.iter().enumerate() {
            let got = args_distance(&s(a), &s(b));
            assert_eq!(got.is_some(), want.is_some(), "case {i}");
            if let (Some(g), Some(w)) = (got, want) {
                assert!((g - w).abs() < 1e-9, "case {i}: {g}");
            }
        }
    }

    #[test]
    fn nearest_run_prefers_exact_then_ratio_then_newest() {
        let run = |a: &[&str], size| RunRecord {
            args: s(a),
            regions: vec![RegionRecord {
                size,
                flags: Flags::CAP,
                hot: vec![],
            }],
        };
        let runs = vec![
            run(&["64"], 1),
            run(&["1024"], 2),
            run(&["2048"], 3),
            run(&["1024"], 4),
        ];
        assert_eq!(
            nearest_run(&runs, &s(&["1024"])).unwrap().regions[0].size,
            4
        );
        assert_eq!(
            nearest_run(&runs, &s(&["1200"])).unwrap().regions[0].size,
            4
        );
        assert_eq!(
            nearest_run(&runs, &s(&["1800"])).unwrap().regions[0].size,
            3
        );
        assert_eq!(nearest_run(&runs, &s(&["70"])).unwrap().regions[0].size, 1);
        assert!(nearest_run(&runs, &s(&["big"])).is_none(), "other work");
        assert!(nearest_run(&runs, &s(&["64", "1"])).is_none(), "other work");
        assert!(nearest_run(&[], &s(&["1"])).is_none());
    }

    #[test]
    fn candidates_by_nearest_size() {
        let r = |size| RegionRecord {
            size,
            flags: Flags::BW,
            hot: vec![],
        };
        let regions = vec![r(100 << 20), r(8 << 20), r(100 << 20), r(400 << 20)];
        assert_eq!(candidates(&regions, 100 << 20), vec![0, 2]);
        assert_eq!(candidates(&regions, 120 << 20), vec![0, 2]);
        assert_eq!(candidates(&regions, 9 << 20), vec![1]);
        assert_eq!(candidates(&regions, 300 << 20), vec![3]);
        assert!(
            candidates(&regions, 1 << 20).is_empty(),
            "beyond a factor 2"
        );
        assert!(candidates(&[], 1 << 20).is_empty());
    }

    #[test]
    fn hot_ranges_find_a_hot_prefix_with_gaps_in_sampling() {
        // 100 chunks, the first 10 hot (rate 80), the rest cold (rate 1); every third
        // chunk unsampled.
        let p: Vec<Option<f64>> = (0..100)
            .map(|c| (c % 3 != 1).then_some(if c < 10 { 0.9 } else { 0.1 }))
            .collect();
        assert_eq!(hot_ranges(&p, 0.1, 8), vec![(0.0, 0.1)]);
    }

    #[test]
    fn hot_ranges_drop_noise_and_keep_the_longest() {
        // Hot blocks of 6 and 4 chunks and a lone hot chunk (noise) in a cold region.
        let mut rates = vec![Some(0.0); 40];
        for c in (4..10).chain(20..24).chain([32]) {
            rates[c] = Some(1.0);
        }
        assert_eq!(hot_ranges(&rates, 0.25, 8), vec![(0.1, 0.25), (0.5, 0.6)]);
        assert_eq!(hot_ranges(&rates, 0.25, 1), vec![(0.1, 0.25)]);
        assert_eq!(
            hot_ranges(&rates, 0.1, 8),
            vec![(0.1, 0.25)],
            "the share is covered by the longest"
        );
        // A cold chunk inside the hot block is noise too (the block's edge next to it
        // erodes by one chunk).
        rates[6] = Some(0.0);
        assert_eq!(hot_ranges(&rates, 0.25, 8), vec![(0.125, 0.25), (0.5, 0.6)]);
        // Every hot chunk below even odds (a hot class split over two components of the
        // mixture) still locates the hot part: as many chunks as the posteriors expect.
        let p: Vec<Option<f64>> = (0..100)
            .map(|c| {
                Some(if (30..40).contains(&c) {
                    0.3 + 0.02 * (c - 30) as f64
                } else {
                    0.06
                })
            })
            .collect();
        // (Their sum expects 9.3 hot chunks: the least likely of the ten is left out.)
        assert_eq!(hot_ranges(&p, 0.1, 8), vec![(0.31, 0.4)]);
        // Exactly even odds are not hot.
        assert!(hot_ranges(&[Some(0.5); 10], 0.2, 4).is_empty());
        // Nothing accessed at all: no hot part.
        assert!(hot_ranges(&[Some(0.0); 10], 0.2, 4).is_empty());
        assert!(hot_ranges(&[None; 10], 0.2, 4).is_empty());
        assert!(hot_ranges(&[], 0.2, 4).is_empty());
    }

    /// Single-delay samples as the sampler gives them: one exponential delay per sampled
    /// chunk, an eighth of the chunks sampled, hot chunks 81 times as fast (10% of pages
    /// take 90% of accesses).
    #[test]
    fn hot_ranges_from_noisy_single_samples() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let n = 8192;
        let cells: Vec<(u32, u64)> = (0..n)
            .map(|c| {
                if !rng.random_bool(0.125) {
                    return (0, 0);
                }
                let lambda = if c < n / 10 { 81.0 } else { 1.0 };
                let delay = -(1.0 - rng.random::<f64>()).ln() / lambda;
                (1, (delay * 1e9) as u64 + 1)
            })
            .collect();
        let mix = crate::heat::rate_mixture(&cells, 0);
        let p = crate::heat::hot_posterior(&cells, &mix, 0.1, 0);
        let r = hot_ranges(&p, 0.1, 16);
        let covered: f64 = r.iter().map(|(a, b)| b - a).sum();
        let inside: f64 = r.iter().map(|&(a, b)| (b.min(0.1) - a).max(0.0)).sum();
        assert!(covered < 0.15, "{r:?}");
        assert!(
            inside > 0.08,
            "most of the hot 10% found: {inside} in {r:?}"
        );
    }

    /// Cells as tests/c/predict_online.c gives the sampler in a 5 s window (measured there,
    /// 2026-11-26): 8192 chunks, 5000 parks at random, a 20 ms window; the hot tenth at
    /// 25% of the region touched about 1300 times a second, the rest 11 times. `racy`
    /// adds one touch noted 1 ns after its park.
    fn window_cells(seed: u64, racy: bool) -> Vec<(u32, u64)> {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let n = 8192;
        let mut cells = vec![(0u32, 0u64); n];
        for _ in 0..5000 {
            let c = rng.random_range(0..n);
            let lambda = if (2048..2867).contains(&c) {
                1300.0
            } else {
                11.0
            };
            let delay = -(1.0 - rng.random::<f64>()).ln() / lambda;
            // A touch is seen after the fault's delivery (about 20 us here).
            let d = (delay * 1e9) as u64 + 20_000;
            if d < 20_000_000 {
                cells[c] = (cells[c].0 + 1, cells[c].1 + d);
            } else {
                cells[c].1 += 20_000_000;
            }
        }
        if racy {
            cells[5000] = (1, 1);
        }
        cells
    }

    #[test]
    fn online_split_locates_the_hot_part_in_every_window() {
        for seed in 0..40 {
            for racy in [false, true] {
                let cells = window_cells(seed, racy);
                // The floor as the sampler takes it: 1 us buckets of the hits' delays.
                let mut hist = vec![0u64; 32];
                for &(h, e) in &cells {
                    if h > 0 {
                        hist[((e / h as u64 / 1000) as usize).min(31)] += 1;
                    }
                }
                let floor = crate::heat::delay_floor_ns(&hist);
                let hot = online_split(&cells, floor, ONLINE_MIN_HITS)
                    .unwrap_or_else(|e| panic!("seed {seed} racy {racy}: {e}"));
                let covered: f64 = hot.iter().map(|(a, b)| b - a).sum();
                let inside: f64 = hot
                    .iter()
                    .map(|&(a, b)| (b.min(0.35) - a.max(0.25)).max(0.0))
                    .sum();
                assert!(
                    inside >= 0.9 * covered && inside > 0.05,
                    "seed {seed} racy {racy}: {inside:.3} of {covered:.3} in the hot part: {hot:?}"
                );
            }
        }
    }

    #[test]
    fn a_split_suggestion_becomes_cap_with_pinned_hot_ranges() {
        let lat_cap = Flags(Flags::LAT.0 | Flags::CAP.0);
        let r = record_region(64 << 20, lat_cap, vec![(0.0, 0.1)]);
        assert_eq!(r.flags, Flags::CAP);
        assert_eq!(r.hot, vec![(0.0, 0.1)]);
        let r = record_region(64 << 20, lat_cap, vec![]);
        assert_eq!(
            r.flags, lat_cap,
            "no known hot part: the combined flags as they are"
        );
        let r = record_region(64 << 20, Flags::BW, vec![(0.0, 0.1)]);
        assert_eq!((r.flags, r.hot.len()), (Flags::BW, 0));
    }

    #[test]
    fn encode_decode_round_trip_and_errors() {
        let regions = vec![
            RegionRecord {
                size: 67108864,
                flags: Flags::CAP,
                hot: vec![(0.0, 0.1), (0.5, 0.625), (0.9999999, 1.0)],
            },
            RegionRecord {
                size: 4096,
                flags: Flags(Flags::LAT.0 | Flags::BW.0),
                hot: vec![],
            },
            RegionRecord {
                size: 1 << 20,
                flags: Flags(0),
                hot: vec![],
            },
        ];
        let text = encode(&regions);
        assert_eq!(decode(&text).unwrap(), regions);
        let negative_zero = vec![RegionRecord {
            size: 4096,
            flags: Flags::CAP,
            hot: vec![(-0.0, 0.5)],
        }];
        assert_eq!(
            decode(&encode(&negative_zero)).unwrap()[0].hot,
            vec![(0.0, 0.5)]
        );
        assert_eq!(decode("").unwrap(), vec![]);
        for bad in [
            "64",
            "x:CAP",
            "64:NOPE",
            "64:CAP@0.5",
            "64:CAP@0.5-0.2",
            "64:CAP@0-2",
        ] {
            let e = decode(bad).unwrap_err();
            assert!(e.contains(bad.split('@').next().unwrap()), "{bad}: {e}");
        }
    }

    /// Cells of a sampled region: `hot` chunks touched within microseconds of each park,
    /// the others rarely (one touch in a few windows), every chunk parked `parks` times.
    fn sampled(n: usize, hot: std::ops::Range<usize>, parks: u32) -> Vec<(u32, u64)> {
        (0..n)
            .map(|c| {
                if hot.contains(&c) {
                    (parks, parks as u64 * 30_000)
                } else {
                    // One touch 15 ms into a park, the other parks censored at 20 ms.
                    (1, 15_000_000 + (parks as u64 - 1) * 20_000_000)
                }
            })
            .collect()
    }

    #[test]
    fn online_split_finds_the_small_hot_part() {
        let cells = sampled(200, 20..40, 3);
        let hot = online_split(&cells, 10_000, ONLINE_MIN_HITS).unwrap();
        assert_eq!(hot.len(), 1, "{hot:?}");
        let (a, b) = hot[0];
        assert!(
            (a - 0.10).abs() < 0.02 && (b - 0.20).abs() < 0.02,
            "{hot:?}"
        );
        // At the region's end too.
        let hot = online_split(&sampled(200, 180..200, 3), 10_000, ONLINE_MIN_HITS).unwrap();
        assert!(hot.last().unwrap().1 > 0.99, "{hot:?}");
    }

    #[test]
    fn online_split_refuses_uniform_regions_and_thin_evidence() {
        // Every chunk alike: no split.
        let uniform: Vec<(u32, u64)> = (0..200).map(|_| (3, 90_000)).collect();
        assert!(online_split(&uniform, 10_000, ONLINE_MIN_HITS).is_err());
        // Skewed but with 60 hits in all: not enough to decide.
        let thin = sampled(40, 0..20, 3);
        let hits: u64 = thin.iter().map(|c| c.0 as u64).sum();
        assert!(hits < ONLINE_MIN_HITS);
        assert_eq!(
            online_split(&thin, 10_000, ONLINE_MIN_HITS),
            Err("too few samples to decide")
        );
        // Half the region hot is not a small part.
        assert!(online_split(&sampled(200, 0..100, 3), 10_000, ONLINE_MIN_HITS).is_err());
    }

    #[test]
    fn online_split_is_not_fooled_by_lucky_chunks() {
        // A uniform region sampled sparsely (what a short window gives): each chunk parked
        // once or not at all, one park in ten touched quickly, at random places. Ranges
        // chosen from those touches would always confirm themselves; the other half's
        // samples do not.
        let mut rng = 7u64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let mut splits = 0;
        for _ in 0..10 {
            let cells: Vec<(u32, u64)> = (0..2048)
                .map(|_| match next() % 10 {
                    0..=4 => (0, 0),
                    5 => (1, 20_000 + next() % 2_000_000),
                    _ => (0, 20_000_000),
                })
                .collect();
            splits += online_split(&cells, 10_000, ONLINE_MIN_HITS).is_ok() as u32;
        }
        assert_eq!(splits, 0);
        // The same sparsity with a real hot tenth (every park there touched) splits.
        let cells: Vec<(u32, u64)> = (0..2048)
            .map(|c| match ((512..717).contains(&c), next() % 10) {
                (_, 0..=4) => (0, 0),
                (true, _) => (1, 30_000),
                (false, 5) => (1, 20_000 + next() % 2_000_000),
                (false, _) => (0, 20_000_000),
            })
            .collect();
        let hot = online_split(&cells, 10_000, ONLINE_MIN_HITS).unwrap();
        let covered: f64 = hot.iter().map(|(a, b)| b - a).sum();
        assert!(hot[0].0 >= 0.24 && covered > 0.05, "{hot:?}");
    }
}
