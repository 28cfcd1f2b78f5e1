//! Placement on NUMA tiers, where pages stay mapped and the kernel places them by memory
//! policy: which byte ranges of a region go to which tier (IMME Algorithm 1 as ranges),
//! interleave weights from bandwidth, and the victims that make room in the fast tier for
//! a protected region (Algorithm 2 across regions).
//!
//! The mechanism (`attune::numa`) turns a [`RangePlan`] into `mbind` calls and a victim
//! list into `move_pages` batches.

use crate::plan::{plan_allocation, TierView};
use crate::Flags;

/// Where one byte range of a region goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Placement {
    /// One tier (index into the tier list, 0 is the fast tier).
    Tier(usize),
    /// Pages spread over tiers with these weights (same length as the tier list; 0 for a
    /// tier not used): the BW plan.
    Interleave(Vec<u32>),
}

/// A contiguous part of a region with its placement.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RangePlan {
    pub offset: u64,
    pub len: u64,
    pub placement: Placement,
    /// The flag atom this range serves.
    pub flags: Flags,
    /// Bytes at the start of this range to pin and pre-fault (fast tier, LAT/SHL only).
    pub pin: u64,
}

/// Lays out `size` bytes (a multiple of `page`) with `flags` over `tiers`: each flag atom
/// gets an even share (LAT first, so pinned bytes start the region), planned by
/// Algorithm 1; greedy atoms become one range per tier used, BW one interleaved range
/// whose weights are the planned bytes per tier. None when the tiers cannot hold it.
pub fn layout(
    size: u64,
    flags: Flags,
    tiers: &[TierView],
    pin_fraction: f64,
    page: u64,
) -> Option<Vec<RangePlan>> {
    let page = page.max(1);
    if size == 0 || tiers.is_empty() {
        return None;
    }
    let atoms: Vec<Flags> = if flags.is_empty() {
        vec![Flags::NONE]
    } else {
        flags.atoms().collect()
    };
    let pages = size.div_ceil(page);
    let share = pages / atoms.len() as u64;
    let mut views = tiers.to_vec();
    let mut out = Vec::new();
    let mut offset = 0u64;
    for (i, atom) in atoms.iter().enumerate() {
        let n = if i + 1 == atoms.len() {
            pages - share * i as u64
        } else {
            share
        };
        if n == 0 {
            continue;
        }
        // Plan in pages so that every range is page aligned.
        let page_views: Vec<TierView> = views
            .iter()
            .map(|t| TierView {
                available: t.available / page,
                bandwidth: t.bandwidth,
            })
            .collect();
        let p = plan_allocation(n, *atom, &page_views, pin_fraction)?;
        for (t, v) in views.iter_mut().enumerate() {
            v.available -= p.per_tier[t] * page;
        }
        let len = n * page;
        let pin = if atom.is_protected() {
            p.pinned * page
        } else {
            0
        };
        if *atom == Flags::BW && p.per_tier.iter().filter(|&&x| x > 0).count() > 1 {
            out.push(RangePlan {
                offset,
                len,
                placement: Placement::Interleave(reduce_weights(&p.per_tier)),
                flags: *atom,
                pin: 0,
            });
            offset += len;
            continue;
        }
        // Greedy (LAT/SHL/none/CAP, or BW on one tier): a range per tier, in the plan's
        // order of preference so that the pinned part is the fast-tier part.
        let order: Vec<usize> = if *atom == Flags::CAP {
            (0..tiers.len()).rev().collect()
        } else {
            (0..tiers.len()).collect()
        };
        let mut first = true;
        for t in order {
            let b = p.per_tier[t] * page;
            if b == 0 {
                continue;
            }
            out.push(RangePlan {
                offset,
                len: b,
                placement: Placement::Tier(t),
                flags: *atom,
                pin: if first && t == 0 { pin.min(b) } else { 0 },
            });
            first = false;
            offset += b;
        }
    }
    Some(out)
}

/// Small integer weights with the ratios of `amounts` (each at most 100, zero stays zero,
/// any non-zero amount gets at least 1).
pub fn reduce_weights(amounts: &[u64]) -> Vec<u32> {
    let max = amounts.iter().copied().max().unwrap_or(0);
    if max == 0 {
        return vec![0; amounts.len()];
    }
    // The scale that keeps the ratios within 0.2% with the smallest weights (kernel
    // interleave goes round-robin by weight: small weights spread pages more finely).
    let mut best: Option<(f64, Vec<u32>)> = None;
    for scale in 1..=100u64 {
        let w: Vec<u32> = amounts
            .iter()
            .map(|&a| {
                if a == 0 {
                    0
                } else {
                    ((a as f64 * scale as f64 / max as f64).round() as u32).max(1)
                }
            })
            .collect();
        let err = ratio_error(amounts, &w);
        if err <= 0.002 {
            return w;
        }
        if best.as_ref().is_none_or(|(e, _)| err < *e) {
            best = Some((err, w));
        }
    }
    best.map(|b| b.1).unwrap_or_default()
}

/// Largest difference between the share of each tier under `weights` and under `amounts`.
pub fn ratio_error(amounts: &[u64], weights: &[u32]) -> f64 {
    let ta: f64 = amounts.iter().map(|&x| x as f64).sum();
    let tw: f64 = weights.iter().map(|&x| x as f64).sum();
    if ta == 0.0 || tw == 0.0 {
        return if ta == tw { 0.0 } else { 1.0 };
    }
    amounts
        .iter()
        .zip(weights)
        .map(|(&a, &w)| (a as f64 / ta - w as f64 / tw).abs())
        .fold(0.0, f64::max)
}

/// Splits an interleaved range into stripes bound to one tier each, for kernels without
/// weighted interleave (or whose system-wide weights differ from the wanted ratio):
/// groups of `weights[t]` units per tier, at most `max_groups` groups so that the number
/// of mappings the kernel splits the range into stays bounded. Returns (offset, len, tier)
/// relative to the range.
pub fn stripes(len: u64, weights: &[u32], page: u64, max_groups: u64) -> Vec<(u64, u64, usize)> {
    let wsum: u64 = weights.iter().map(|&w| w as u64).sum();
    let page = page.max(1);
    if wsum == 0 || len == 0 {
        return Vec::new();
    }
    let pages = len / page;
    // Unit: pages per weight point, large enough for at most max_groups groups.
    let unit = pages.div_ceil(wsum * max_groups.max(1)).max(1);
    let mut out: Vec<(u64, u64, usize)> = Vec::new();
    let mut off = 0u64;
    let end = len;
    while off < end {
        for (t, &w) in weights.iter().enumerate() {
            if w == 0 || off >= end {
                continue;
            }
            let l = (w as u64 * unit * page).min(end - off);
            match out.last_mut() {
                Some(last) if last.2 == t => last.1 += l,
                _ => out.push((off, l, t)),
            }
            off += l;
        }
    }
    out
}

/// A region that could give up fast-tier bytes to a newcomer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VictimCandidate {
    /// Bytes of the region on the fast tier that are not pinned.
    pub pageable_fast: u64,
    /// LAT or SHL: moved only after every other region.
    pub protected: bool,
    /// Lower is colder (last use or allocation order: the LRU approximation).
    pub recency: u64,
}

/// Algorithm 2 across regions: which regions give how many fast-tier bytes so that
/// `need` bytes become free. Unprotected regions first, coldest first; protected regions'
/// pageable bytes only when that is not enough; pinned bytes never. Returns (candidate
/// index, bytes); the sum is less than `need` when not enough can move.
pub fn choose_victims(need: u64, cands: &[VictimCandidate]) -> Vec<(usize, u64)> {
    let mut order: Vec<usize> = (0..cands.len()).collect();
    order.sort_by_key(|&i| (cands[i].protected, cands[i].recency));
    let mut left = need;
    let mut out = Vec::new();
    for i in order {
        if left == 0 {
            break;
        }
        let take = cands[i].pageable_fast.min(left);
        if take > 0 {
            out.push((i, take));
            left -= take;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: u64 = 4096;

    fn tv(spec: &[(u64, u64)]) -> Vec<TierView> {
        spec.iter()
            .map(|&(a, b)| TierView {
                available: a * P,
                bandwidth: b,
            })
            .collect()
    }

    fn r(offset: u64, len: u64, placement: Placement, flags: Flags, pin: u64) -> RangePlan {
        RangePlan {
            offset: offset * P,
            len: len * P,
            placement,
            flags,
            pin: pin * P,
        }
    }

    #[test]
    fn layouts() {
        use Placement::*;
        let lat_cap = Flags(Flags::LAT.0 | Flags::CAP.0);
        // (pages, flags, tiers (pages avail, bw), pin) -> ranges (in pages)
        let cases: Vec<(u64, Flags, Vec<(u64, u64)>, f64, Option<Vec<RangePlan>>)> = vec![
            // LAT in the fast tier, a quarter pinned.
            (
                100,
                Flags::LAT,
                vec![(1000, 100), (1000, 30)],
                0.25,
                Some(vec![r(0, 100, Tier(0), Flags::LAT, 25)]),
            ),
            // LAT cascades when the fast tier is short; only the fast part is pinned.
            (
                100,
                Flags::LAT,
                vec![(60, 100), (1000, 30)],
                1.0,
                Some(vec![
                    r(0, 60, Tier(0), Flags::LAT, 60),
                    r(60, 40, Tier(1), Flags::LAT, 0),
                ]),
            ),
            // CAP on the capacity tier.
            (
                100,
                Flags::CAP,
                vec![(1000, 100), (1000, 30)],
                0.5,
                Some(vec![r(0, 100, Tier(1), Flags::CAP, 0)]),
            ),
            // BW interleaved 10:3.
            (
                130,
                Flags::BW,
                vec![(1000, 100), (1000, 30)],
                0.5,
                Some(vec![r(0, 130, Interleave(vec![10, 3]), Flags::BW, 0)]),
            ),
            // BW on a machine with one tier: a plain range.
            (
                130,
                Flags::BW,
                vec![(1000, 100)],
                0.5,
                Some(vec![r(0, 130, Tier(0), Flags::BW, 0)]),
            ),
            // LAT|CAP: the LAT half first (pinned part at the start), the CAP half far.
            (
                200,
                lat_cap,
                vec![(1000, 100), (1000, 30)],
                0.5,
                Some(vec![
                    r(0, 100, Tier(0), Flags::LAT, 50),
                    r(100, 100, Tier(1), Flags::CAP, 0),
                ]),
            ),
            // Too big.
            (3000, Flags::LAT, vec![(1000, 100), (1000, 30)], 0.5, None),
        ];
        for (i, (pages, flags, t, pin, want)) in cases.into_iter().enumerate() {
            assert_eq!(layout(pages * P, flags, &tv(&t), pin, P), want, "case {i}");
        }
    }

    #[test]
    fn layouts_cover_the_region_exactly() {
        for pages in [1u64, 3, 77, 1000] {
            for bits in 0..16 {
                let l = layout(
                    pages * P,
                    Flags(bits),
                    &tv(&[(400, 100), (300, 30), (5000, 5)]),
                    0.3,
                    P,
                )
                .unwrap();
                let mut off = 0;
                for x in &l {
                    assert_eq!(x.offset, off);
                    assert_eq!(x.len % P, 0);
                    off += x.len;
                }
                assert_eq!(off, pages * P, "pages {pages} flags {bits}");
            }
        }
    }

    #[test]
    fn weights() {
        assert_eq!(reduce_weights(&[100, 30]), vec![10, 3]);
        assert_eq!(reduce_weights(&[102400, 30720]), vec![10, 3]);
        assert_eq!(reduce_weights(&[5, 5]), vec![1, 1]);
        assert_eq!(reduce_weights(&[7, 0]), vec![1, 0]);
        assert_eq!(reduce_weights(&[0, 0]), vec![0, 0]);
        assert!(ratio_error(&[1000, 1], &reduce_weights(&[1000, 1])) < 0.01);
    }

    #[test]
    fn stripes_follow_weights() {
        let s = stripes(130 * P, &[10, 3], P, 1000);
        assert_eq!(s[0], (0, 10 * P, 0));
        assert_eq!(s[1], (10 * P, 3 * P, 1));
        let on = |t| s.iter().filter(|x| x.2 == t).map(|x| x.1).sum::<u64>();
        assert_eq!(on(0), 100 * P);
        assert_eq!(on(1), 30 * P);
        // Bounded number of stripes for a large range.
        let big = stripes(1 << 30, &[10, 3], P, 256);
        assert!(big.len() <= 2 * 256 + 2, "{}", big.len());
        let on0: u64 = big.iter().filter(|x| x.2 == 0).map(|x| x.1).sum();
        assert!((on0 as f64 / (1u64 << 30) as f64 - 10.0 / 13.0).abs() < 0.01);
    }

    #[test]
    fn victims_table() {
        let c = |pageable_fast, protected, recency| VictimCandidate {
            pageable_fast,
            protected,
            recency,
        };
        let cases: Vec<(u64, Vec<VictimCandidate>, Vec<(usize, u64)>)> = vec![
            // Coldest unprotected first.
            (50, vec![c(100, false, 5), c(100, false, 1)], vec![(1, 50)]),
            // Spans several regions.
            (
                150,
                vec![c(100, false, 5), c(100, false, 1)],
                vec![(1, 100), (0, 50)],
            ),
            // Protected only after every unprotected region, even if colder.
            (
                150,
                vec![c(100, true, 0), c(100, false, 9)],
                vec![(1, 100), (0, 50)],
            ),
            // Not enough: everything movable, less than asked.
            (500, vec![c(100, true, 0), c(0, false, 1)], vec![(0, 100)]),
            (0, vec![c(100, false, 0)], vec![]),
        ];
        for (i, (need, cands, want)) in cases.into_iter().enumerate() {
            assert_eq!(choose_victims(need, &cands), want, "case {i}");
        }
    }
}
