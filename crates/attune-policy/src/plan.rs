//! Allocation plan: IMME Algorithm 1 over any number of tiers.
//!
//! Departures from the paper (recorded in docs/design.md): the tiers are a list ordered
//! fastest first instead of three fixed names; the last tier is not assumed unlimited, so
//! a request that no tier set can hold is refused (ENOMEM) instead of over-committing the
//! "CXL" tier; the per-flag split of combined flags takes explicit fractions.

use crate::Flags;

/// What the policy needs to know about one tier.
#[derive(Clone, Debug, PartialEq)]
pub struct TierView {
    /// Bytes that can still be given out (capacity minus what is already planned).
    pub available: u64,
    /// Sustained bandwidth, any unit (only ratios matter).
    pub bandwidth: u64,
}

/// Bytes of the request planned on each tier (same order as the input tiers), and how many
/// bytes of the first tier to pin and pre-fault.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AllocationPlan {
    pub per_tier: Vec<u64>,
    pub pinned: u64,
}

impl AllocationPlan {
    pub fn total(&self) -> u64 {
        self.per_tier.iter().sum()
    }
}

/// Plans `size` bytes with `flags` over `tiers` (fastest first; tier 0 is DRAM).
/// `pin_fraction` (0..=1) of what LAT/SHL get in DRAM is pinned.
/// Returns None when the tiers cannot hold the request.
pub fn plan_allocation(
    size: u64,
    flags: Flags,
    tiers: &[TierView],
    pin_fraction: f64,
) -> Option<AllocationPlan> {
    let total_avail: u64 = tiers.iter().map(|t| t.available).sum();
    if tiers.is_empty() || size > total_avail {
        return None;
    }
    let mut avail: Vec<u64> = tiers.iter().map(|t| t.available).collect();
    let mut per_tier = vec![0u64; tiers.len()];
    let mut pinned = 0u64;
    // Combined flags: split the size evenly between the atoms (Algorithm 1 lines 4-8 with
    // an even predictor); the last atom takes the remainder.
    let atoms: Vec<Flags> = if flags.is_empty() {
        vec![Flags::NONE]
    } else {
        flags.atoms().collect()
    };
    let share = size / atoms.len() as u64;
    for (i, atom) in atoms.iter().enumerate() {
        let s = if i + 1 == atoms.len() {
            size - share * i as u64
        } else {
            share
        };
        let got = plan_atom(s, *atom, tiers, &mut avail, &mut per_tier);
        if atom.is_protected() {
            pinned += (got as f64 * pin_fraction.clamp(0.0, 1.0)) as u64;
        }
    }
    if per_tier.iter().sum::<u64>() < size {
        return None;
    }
    Some(AllocationPlan { per_tier, pinned })
}

/// Plans one atomic flag; returns the bytes placed in tier 0.
fn plan_atom(
    size: u64,
    atom: Flags,
    tiers: &[TierView],
    avail: &mut [u64],
    out: &mut [u64],
) -> u64 {
    let n = tiers.len();
    let before0 = out[0];
    let mut need = size;
    let take = |t: usize, want: u64, avail: &mut [u64], out: &mut [u64]| -> u64 {
        let g = want.min(avail[t]);
        avail[t] -= g;
        out[t] += g;
        g
    };
    if atom == Flags::BW {
        // Lines 22-29: proportional to bandwidth, shortfall cascades to the next tier.
        let bw_total: u64 = tiers.iter().map(|t| t.bandwidth).sum::<u64>().max(1);
        let mut carry = 0u64;
        for t in 0..n {
            let frac =
                (size as u128 * tiers[t].bandwidth as u128 / bw_total as u128) as u64 + carry;
            let g = take(t, frac.min(need), avail, out);
            need -= g;
            carry = frac.saturating_sub(g);
        }
    } else if atom == Flags::CAP {
        // Lines 30-31: from the capacity tier (the last), then upwards if it is short.
        for t in (0..n).rev() {
            need -= take(t, need, avail, out);
        }
    }
    // LAT/SHL/none, and any remainder: greedy from the fastest tier down (lines 15-21).
    for t in 0..n {
        if need == 0 {
            break;
        }
        need -= take(t, need, avail, out);
    }
    out[0] - before0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiers(spec: &[(u64, u64)]) -> Vec<TierView> {
        spec.iter()
            .map(|&(a, b)| TierView {
                available: a,
                bandwidth: b,
            })
            .collect()
    }

    #[test]
    fn table() {
        // (size, flags, tiers (avail, bw), pin fraction) -> per-tier, pinned
        let cases: Vec<(u64, Flags, Vec<(u64, u64)>, f64, Option<(Vec<u64>, u64)>)> = vec![
            // LAT fits in DRAM: all there, half pinned.
            (
                100,
                Flags::LAT,
                vec![(1000, 30), (1000, 10)],
                0.5,
                Some((vec![100, 0], 50)),
            ),
            // LAT cascades when DRAM is short (lines 16-21).
            (
                100,
                Flags::LAT,
                vec![(60, 30), (1000, 10)],
                1.0,
                Some((vec![60, 40], 60)),
            ),
            // SHL behaves like LAT.
            (
                10,
                Flags::SHL,
                vec![(5, 1), (5, 1), (5, 1)],
                0.0,
                Some((vec![5, 5, 0], 0)),
            ),
            // CAP goes to the last tier.
            (
                100,
                Flags::CAP,
                vec![(1000, 30), (1000, 10)],
                0.5,
                Some((vec![0, 100], 0)),
            ),
            // CAP with a short capacity tier spills upwards.
            (
                100,
                Flags::CAP,
                vec![(1000, 30), (30, 10)],
                0.5,
                Some((vec![70, 30], 0)),
            ),
            // BW proportional to bandwidth 3:1.
            (
                400,
                Flags::BW,
                vec![(1000, 30), (1000, 10)],
                0.5,
                Some((vec![300, 100], 0)),
            ),
            // BW with a short fast tier: the remainder cascades down (line 28).
            (
                400,
                Flags::BW,
                vec![(200, 30), (1000, 10)],
                0.5,
                Some((vec![200, 200], 0)),
            ),
            // Combined LAT|CAP: split evenly.
            (
                200,
                Flags(Flags::LAT.0 | Flags::CAP.0),
                vec![(1000, 30), (1000, 10)],
                1.0,
                Some((vec![100, 100], 100)),
            ),
            // Too large for all tiers: refused.
            (5000, Flags::LAT, vec![(1000, 30), (1000, 10)], 0.5, None),
            // No flags: fastest first.
            (
                50,
                Flags::NONE,
                vec![(20, 30), (1000, 10)],
                0.5,
                Some((vec![20, 30], 0)),
            ),
        ];
        for (i, (size, flags, t, pin, want)) in cases.into_iter().enumerate() {
            let got = plan_allocation(size, flags, &tiers(&t), pin).map(|p| (p.per_tier, p.pinned));
            assert_eq!(got, want, "case {i}");
        }
    }

    #[test]
    fn plans_always_sum_to_size() {
        for size in [1u64, 7, 4096, 123_457] {
            for bits in 0..16 {
                let p = plan_allocation(
                    size,
                    Flags(bits),
                    &tiers(&[(size / 3, 7), (size / 2, 3), (size, 1)]),
                    0.3,
                )
                .unwrap();
                assert_eq!(p.total(), size, "size {size} flags {bits}");
            }
        }
    }
}
