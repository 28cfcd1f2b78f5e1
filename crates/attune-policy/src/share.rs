//! Node-wide DRAM budgets for co-located workflows (the daemon's policy; pure).
//!
//! Every workflow asks for the DRAM it would use alone (`want`) and says how much of it
//! is protected (LAT/SHL regions: `protected`). The pool is granted in four rounds:
//! 1. protected bytes of LAT/SHL workflows, so a latency-sensitive job keeps its pages
//!    when a capacity-hungry neighbour arrives (scaled down together if even these do not
//!    fit). Protection is a claim any user can make, so it is bounded: it never takes the
//!    floors of the unprotected workflows, and one user's protected bytes are at most an
//!    equal share (among the users on the node) of what is left; the rest of its want is
//!    served in the rounds below like any other;
//! 2. a floor for everyone (`min_grant`), so no runtime is starved to zero and stalls
//!    in its own fault handler;
//! 3. weighted fair share (water-filling: nobody gets more than it claims, what one does
//!    not need goes to the others), weights by class; a bandwidth workflow claims only
//!    DRAM's share of the node's memory bandwidth of its want (IMME Algorithm 1 spreads a
//!    BW region over the tiers by bandwidth: the rest of it streams as fast from the
//!    others);
//! 4. what is still left, by the same weights up to each whole want (no DRAM stays idle
//!    while someone could use it).
//!
//! The grants never sum above the pool.

use crate::Flags;

/// Weight of a workflow in the fair-share rounds, by its flags: protected classes first,
/// the others equal (a BW workflow's advantage is not a weight but its claim, see
/// [`Rules::bw_dram_pct`]).
pub fn weight(flags: Flags) -> u64 {
    if flags.is_protected() {
        4
    } else {
        1
    }
}

/// The node's parameters of the division.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rules {
    /// Smallest grant while DRAM lasts.
    pub min_grant: u64,
    /// DRAM's share of the node's memory bandwidth, percent (100: DRAM alone).
    pub bw_dram_pct: u64,
}

/// What a workflow claims in the fair-share round: its want, or for bandwidth data
/// (BW without LAT/SHL) DRAM's bandwidth share of it.
fn claim(d: &Demand, bw_dram_pct: u64) -> u64 {
    if d.flags.contains(Flags::BW) && !d.flags.is_protected() {
        let c = (d.want as u128 * bw_dram_pct.min(100) as u128).div_ceil(100) as u64;
        c.div_ceil(PAGE) * PAGE
    } else {
        d.want
    }
}

/// One workflow's request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Demand {
    /// DRAM it would keep resident alone.
    pub want: u64,
    /// Bytes of LAT/SHL regions it wants kept in DRAM (0 for other classes).
    pub protected: u64,
    pub flags: Flags,
    /// The user it runs as (its processes' kernel credentials): protection is bounded
    /// per user.
    pub owner: u32,
}

const PAGE: u64 = 4096;

/// Grants of `pool` bytes to `demands`, in order. Each is a multiple of 4 KiB.
pub fn grant(pool: u64, rules: Rules, demands: &[Demand]) -> Vec<u64> {
    let min_grant = rules.min_grant;
    let n = demands.len();
    let mut g = vec![0u64; n];
    let mut left = pool;
    // Round 1: protected bytes of protected workflows, within what the floors of the
    // others leave, and at most an equal share of that per user.
    let floors_of_others: u64 = demands
        .iter()
        .filter(|d| !d.flags.is_protected())
        .map(|d| d.want.min(min_grant))
        .fold(0u64, u64::saturating_add);
    let room = left.saturating_sub(floors_of_others);
    let mut prot: Vec<u64> = demands
        .iter()
        .map(|d| {
            if d.flags.is_protected() {
                d.protected.min(d.want)
            } else {
                0
            }
        })
        .collect();
    let mut owners: Vec<u32> = demands.iter().map(|d| d.owner).collect();
    owners.sort_unstable();
    owners.dedup();
    let per_user = room / owners.len().max(1) as u64;
    for &u in &owners {
        let mine: u128 = (0..n)
            .filter(|&i| demands[i].owner == u)
            .map(|i| prot[i] as u128)
            .sum();
        if mine > per_user as u128 {
            for i in (0..n).filter(|&i| demands[i].owner == u) {
                prot[i] = (prot[i] as u128 * per_user as u128 / mine) as u64;
            }
        }
    }
    left -= give_scaled(&mut g, &prot, room);
    // Round 2: the floor.
    let floor: Vec<u64> = demands
        .iter()
        .zip(&g)
        .map(|(d, &have)| d.want.min(min_grant).saturating_sub(have))
        .collect();
    left -= give_scaled(&mut g, &floor, left);
    // Round 3: weighted water-filling up to each claim.
    let claims: Vec<u64> = demands
        .iter()
        .map(|d| claim(d, rules.bw_dram_pct).min(d.want))
        .collect();
    let weights: Vec<u64> = demands.iter().map(|d| weight(d.flags)).collect();
    left -= water_fill(&mut g, &claims, &weights, left);
    // Round 4: the rest up to each want.
    let wants: Vec<u64> = demands.iter().map(|d| d.want).collect();
    water_fill(&mut g, &wants, &weights, left);
    g
}

/// Gives `left` bytes to `g` by weight, nobody above its want (what one does not need goes
/// to the others), in whole pages. Returns the bytes given.
fn water_fill(g: &mut [u64], wants: &[u64], weights: &[u64], mut left: u64) -> u64 {
    let n = g.len();
    let start = left;
    loop {
        let active: Vec<usize> = (0..n).filter(|&i| g[i] + PAGE <= wants[i]).collect();
        if active.is_empty() || left < PAGE {
            break;
        }
        let total_w: u128 = active.iter().map(|&i| weights[i].max(1) as u128).sum();
        let mut given = 0;
        for &i in &active {
            let share = (left as u128 * weights[i].max(1) as u128 / total_w) as u64;
            let add = round(share.min(wants[i] - g[i]));
            g[i] += add;
            given += add;
        }
        if given == 0 {
            // Shares rounded to zero pages: hand out page by page, heaviest first.
            let i = *active.iter().max_by_key(|&&i| weights[i]).unwrap();
            g[i] += PAGE;
            given = PAGE;
        }
        left -= given;
    }
    start - left
}

/// Weight of a workflow when the node's far memory (the runtimes' `memory` tiers:
/// emulated CXL or pooled memory) is divided: the inverse of the DRAM order, since
/// capacity workflows are the ones whose data belongs there.
pub fn far_weight(flags: Flags) -> u64 {
    if flags.contains(Flags::CAP) {
        4
    } else if flags.contains(Flags::BW) {
        2
    } else {
        1
    }
}

/// Far-memory grants ("staging buffers" of the far tier, IMME §III-B): `pool` bytes of
/// node memory for the runtimes' memory tiers, by weighted fair share of what each
/// workflow wants there (what it holds now plus what it may still push out, so the
/// grants follow utilization), a floor of `min_grant` each while it lasts. A runtime
/// over its grant stores new evictions in its next tier (a file); none is lost.
pub fn far_grant(pool: u64, min_grant: u64, demands: &[(u64, Flags)]) -> Vec<u64> {
    let mut g = vec![0u64; demands.len()];
    let floor: Vec<u64> = demands.iter().map(|d| d.0.min(min_grant)).collect();
    let left = pool - give_scaled(&mut g, &floor, pool);
    let wants: Vec<u64> = demands.iter().map(|d| d.0).collect();
    let weights: Vec<u64> = demands.iter().map(|d| far_weight(d.1)).collect();
    water_fill(&mut g, &wants, &weights, left);
    g
}

/// Movement limits (bytes/s, 0 = none) per workflow: while a LAT/SHL workflow is on the
/// node, the others move pages between tiers at most `limit` bytes/s each, so their
/// thrashing does not take the memory bandwidth a latency-sensitive neighbour runs on.
pub fn move_limits(demands: &[Demand], limit: u64) -> Vec<u64> {
    let protected_present = demands.iter().any(|d| d.flags.is_protected());
    demands
        .iter()
        .map(|d| {
            if protected_present && !d.flags.is_protected() {
                limit
            } else {
                0
            }
        })
        .collect()
}

/// Pacing of page movement at `rate` bytes/s with a burst allowance: `next` is the
/// virtual time (ns) at which the mover's budget is spent. Returns the new `next` and how
/// long to wait before moving `bytes` now.
pub fn pace(now: u64, next: u64, bytes: u64, rate: u64, burst_ns: u64) -> (u64, u64) {
    if rate == 0 {
        return (next, 0);
    }
    let start = next.max(now.saturating_sub(burst_ns));
    let cost = (bytes as u128 * 1_000_000_000 / rate as u128) as u64;
    let new_next = start + cost;
    (new_next, new_next.saturating_sub(now + burst_ns))
}

fn round(b: u64) -> u64 {
    b / PAGE * PAGE
}

/// Adds `asks` to `g`, all of them if they fit in `avail`, else scaled down together.
/// Returns the bytes given.
fn give_scaled(g: &mut [u64], asks: &[u64], avail: u64) -> u64 {
    let total: u128 = asks.iter().map(|&a| a as u128).sum();
    let mut given = 0;
    for (gi, &a) in g.iter_mut().zip(asks) {
        let add = if total <= avail as u128 {
            round(a)
        } else {
            round((a as u128 * avail as u128 / total) as u64)
        };
        *gi += add;
        given += add;
    }
    given
}

#[cfg(test)]
mod tests {
    use super::*;
    const M: u64 = 1 << 20;

    fn d(want: u64, protected: u64, flags: Flags) -> Demand {
        Demand {
            want: want * M,
            protected: protected * M,
            flags,
            owner: 0,
        }
    }

    #[test]
    fn table() {
        // (pool MiB, min MiB, DRAM's share of the bandwidth %, demands, expected grants MiB)
        let cases: &[(u64, u64, u64, Vec<Demand>, Vec<u64>)] = &[
            // Everyone fits: each gets what it wants.
            (
                1024,
                16,
                100,
                vec![d(100, 0, Flags::CAP), d(200, 50, Flags::LAT)],
                vec![100, 200],
            ),
            // LAT's protected part first, the rest 4:1 LAT:CAP, LAT capped at its want.
            (
                256,
                16,
                100,
                vec![d(128, 96, Flags::LAT), d(512, 0, Flags::CAP)],
                vec![128, 128],
            ),
            // Weighted shares when all want everything: LAT 4, BW 1, CAP 1 over 600.
            (
                600,
                0,
                100,
                vec![
                    d(1000, 0, Flags::LAT),
                    d(1000, 0, Flags::BW),
                    d(1000, 0, Flags::CAP),
                ],
                vec![400, 100, 100],
            ),
            // Protected bytes above the pool: scaled into what the floor of the
            // unprotected neighbour leaves (84 MiB, 3:1), the neighbour keeps its floor.
            (
                100,
                16,
                100,
                vec![
                    d(300, 150, Flags::LAT),
                    d(300, 50, Flags::SHL),
                    d(300, 0, Flags::CAP),
                ],
                vec![63, 21, 16],
            ),
            // A small CAP want leaves its unused share to the BW neighbour.
            (
                512,
                16,
                100,
                vec![d(32, 0, Flags::CAP), d(1024, 0, Flags::BW)],
                vec![32, 480],
            ),
            // A stream claims DRAM by DRAM's bandwidth share, 75% here: 300 of its 400
            // MiB; the capacity neighbour takes the rest.
            (
                1000,
                0,
                75,
                vec![d(400, 0, Flags::BW), d(1000, 0, Flags::CAP)],
                vec![300, 700],
            ),
            // The same with DRAM alone: equal weights, the stream gets its whole want.
            (
                1000,
                0,
                100,
                vec![d(400, 0, Flags::BW), d(1000, 0, Flags::CAP)],
                vec![400, 600],
            ),
            // Nobody else wants the DRAM: the stream gets its whole want after all.
            (
                1000,
                0,
                75,
                vec![d(400, 0, Flags::BW), d(100, 0, Flags::CAP)],
                vec![400, 100],
            ),
            // BW with LAT is protected data: its claim is its want.
            (
                1000,
                0,
                50,
                vec![
                    d(400, 0, Flags(Flags::BW.0 | Flags::LAT.0)),
                    d(1000, 0, Flags::CAP),
                ],
                vec![400, 600],
            ),
            // Two streams over a short pool: each claims half of its want (50%), then
            // shares what the capacity workflow leaves equally.
            (
                600,
                0,
                50,
                vec![
                    d(400, 0, Flags::BW),
                    d(400, 0, Flags::BW),
                    d(1000, 0, Flags::CAP),
                ],
                vec![200, 200, 200],
            ),
        ];
        for (pool, min, pct, ds, want) in cases {
            let g = grant(pool * M, rules(*min, *pct), ds);
            let got: Vec<u64> = g.iter().map(|b| (b + M / 2) / M).collect();
            assert_eq!(&got, want, "pool {pool} share {pct}% demands {ds:?}");
            assert!(g.iter().sum::<u64>() <= pool * M);
        }
    }

    fn rules(min_mib: u64, bw_dram_pct: u64) -> Rules {
        Rules {
            min_grant: min_mib * M,
            bw_dram_pct,
        }
    }

    #[test]
    fn never_above_pool_nor_want() {
        use rand::{Rng, SeedableRng};
        let mut r = rand::rngs::StdRng::seed_from_u64(7);
        let all = [
            Flags::LAT,
            Flags::SHL,
            Flags::BW,
            Flags::CAP,
            Flags::NONE,
            Flags(5),
        ];
        for _ in 0..2000 {
            let n = r.random_range(0..12);
            let ds: Vec<Demand> = (0..n)
                .map(|_| {
                    let want = r.random_range(0..4096) * 4096 * 16;
                    Demand {
                        want,
                        protected: r.random_range(0..=want),
                        flags: all[r.random_range(0..all.len())],
                        owner: r.random_range(0..3),
                    }
                })
                .collect();
            let pool = r.random_range(0..1u64 << 34);
            let g = grant(pool, rules(16, r.random_range(1..=100)), &ds);
            assert!(g.iter().sum::<u64>() <= pool);
            for (gi, d) in g.iter().zip(&ds) {
                assert!(*gi <= d.want, "granted above the want");
            }
            // Nothing is left idle while someone still wants more (within a page each).
            let wanted_more = g
                .iter()
                .zip(&ds)
                .any(|(gi, d)| gi + PAGE * (n as u64 + 1) < d.want);
            if wanted_more {
                assert!(
                    pool - g.iter().sum::<u64>() < PAGE * (n as u64 + 1) * 2,
                    "idle DRAM left"
                );
            }
        }
    }

    #[test]
    fn movement_limited_only_next_to_protected_workflows() {
        let cap = d(100, 0, Flags::CAP);
        let bw = d(100, 0, Flags::BW);
        assert_eq!(move_limits(&[cap, bw], 5), vec![0, 0]);
        assert_eq!(
            move_limits(&[cap, d(10, 10, Flags::LAT), bw], 5),
            vec![5, 0, 5]
        );
    }

    #[test]
    fn pacing_holds_the_rate() {
        // 1 MB/s, 10 ms burst: 100 moves of 100 KB take 10 s of virtual time.
        let (mut next, mut now, mut waited) = (0u64, 1_000_000_000u64, 0u64);
        for _ in 0..100 {
            let (n, w) = pace(now, next, 100_000, 1_000_000, 10_000_000);
            next = n;
            now += w; // the mover sleeps
            waited += w;
        }
        let secs = (now - 1_000_000_000) as f64 / 1e9;
        assert!((9.8..=10.0).contains(&secs), "{secs}");
        assert!(waited > 0);
        // Idle time is not banked beyond the burst.
        let (_, w) = pace(now + 60_000_000_000, next, 100_000, 1_000_000, 10_000_000);
        assert_eq!(w, 80_000_000); // 100 ms of work, 10 banked, 10 allowed ahead
        assert_eq!(pace(5, 7, 1 << 30, 0, 0), (7, 0));
    }

    #[test]
    fn one_users_protection_does_not_starve_another_user() {
        let of = |owner, want, prot, flags| Demand {
            owner,
            ..d(want, prot, flags)
        };
        // Before the per-user bound, both were scaled together: B kept 15 of its 64 MiB.
        let g = grant(
            256 * M,
            rules(16, 100),
            &[
                of(1000, 1024, 1024, Flags::LAT),
                of(1001, 64, 64, Flags::LAT),
            ],
        );
        assert!(g[1] >= 64 * M, "B lost its protected bytes: {g:?}");
        // A CAP workflow of another user keeps its floor and its weighted share.
        let g = grant(
            256 * M,
            rules(16, 100),
            &[of(1000, 1024, 1024, Flags::LAT), of(0, 200, 0, Flags::CAP)],
        );
        assert!(g[1] >= 16 * M && g[0] <= 240 * M, "{g:?}");
        // The floors of unprotected workflows are never protection's, whoever asks.
        for n in 1..20 {
            let mut ds = vec![of(7, 1 << 20, 1 << 20, Flags::LAT)];
            ds.extend((0..n).map(|u| of(100 + u, 64, 0, Flags::CAP)));
            let g = grant(512 * M, rules(16, 100), &ds);
            assert!(g[1..].iter().all(|&x| x >= 16 * M), "n {n}: {g:?}");
        }
    }

    #[test]
    fn lat_protected_part_survives_newcomers() {
        let lat = d(64, 48, Flags::LAT);
        let mut ds = vec![lat];
        for _ in 0..10 {
            ds.push(d(1024, 0, Flags::CAP));
            let g = grant(256 * M, rules(8, 50), &ds);
            assert!(g[0] >= 48 * M, "LAT lost its protected pages: {:?}", g);
        }
    }

    #[test]
    fn far_grants_follow_want_and_capacity_first() {
        let cap = (100 * M, Flags::CAP);
        let lat = (100 * M, Flags::LAT);
        // Enough for everyone: each gets what it wants.
        assert_eq!(
            far_grant(400 * M, 8 * M, &[cap, lat]),
            vec![100 * M, 100 * M]
        );
        // Short: the floor each, then 4:1 for the capacity workflow.
        let g = far_grant(108 * M, 4 * M, &[cap, lat]);
        assert_eq!(g.iter().sum::<u64>(), 108 * M);
        assert_eq!(g, vec![84 * M, 24 * M]);
        // What one does not want goes to the other; nobody above its want.
        let g = far_grant(
            200 * M,
            8 * M,
            &[(10 * M, Flags::CAP), (500 * M, Flags::NONE)],
        );
        assert_eq!(g, vec![10 * M, 190 * M]);
        // Nothing wanted: nothing given; an empty node.
        assert_eq!(far_grant(100 * M, 8 * M, &[(0, Flags::CAP)]), vec![0]);
        assert!(far_grant(100 * M, 8 * M, &[]).is_empty());
        // Floors scaled down together when even they do not fit; never above the pool.
        let g = far_grant(8 * M, 8 * M, &[cap, lat, cap]);
        assert!(g.iter().sum::<u64>() <= 8 * M, "{g:?}");
    }
}
