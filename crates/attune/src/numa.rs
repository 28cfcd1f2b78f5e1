//! NUMA tiers: regions whose pages stay mapped and that the kernel places by memory policy
//! (CXL or PMem seen as a CPU-less node). The mechanism only: ranges come from
//! `attune_policy::numa::layout`, victims from `choose_victims`.
//!
//! * Allocation: an anonymous mapping, one `mbind` per planned range (preferred node, or
//!   interleave for BW), the LAT/SHL pinned part locked (`mlock`: locked pages are not
//!   reclaimed, so the kernel's own demotion cannot move them) and pre-faulted.
//! * BW: `MPOL_WEIGHTED_INTERLEAVE` when the kernel has it and its system-wide weights
//!   give the wanted ratio; otherwise stripes bound to one tier each (exact ratio, a
//!   bounded number of mappings), and the runtime says so once.
//! * Room for protected data (Algorithm 2 across regions): when a LAT/SHL plan wants more
//!   of the fast tier than is free, unprotected regions' fast pages move down first.
//! * Movement: the range's policy is changed, then present pages are moved with
//!   `move_pages` in batches and checked with a second query (the moving call's status
//!   can report -EBUSY for pages that did move).

use crate::config::{Config, TierKind};
use crate::topology::Topology;
use attune_policy::numa::{self as pol, Placement, VictimCandidate};
use attune_policy::{Flags, TierView};
use attune_sys::numa::{self as sys, mpol};
use attune_sys::{mem, Errno};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;

const PAGE: u64 = 4096;
/// Pages per move_pages call: large enough to amortise the call, small enough to keep the
/// status arrays on a few pages.
const MOVE_BATCH: usize = 4096;
/// Most stripe groups in a BW range without weighted interleave (each group is two or
/// more mappings; the kernel's default limit is 65530 per process).
const MAX_STRIPE_GROUPS: u64 = 256;

/// One NUMA tier: tier 0 is the fast tier (the nodes with CPUs).
#[derive(Clone, Debug, serde::Serialize)]
pub struct NumaTier {
    pub name: String,
    pub nodes: Vec<u32>,
    /// Bytes Attune may place here (the DRAM budget for tier 0).
    pub capacity: u64,
    /// MB/s (HMAT where the firmware gives it, the configuration otherwise).
    pub bandwidth: u64,
}

impl NumaTier {
    fn mask(&self) -> u64 {
        self.nodes.iter().fold(0u64, |m, &n| m | (1u64 << n))
    }
}

/// How BW ranges are interleaved on this machine.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub enum InterleaveMethod {
    /// The kernel's weighted interleave; its per-node weights.
    Weighted(BTreeMap<u32, u32>),
    /// No weighted interleave in the kernel: stripes.
    Stripes,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct AppliedRange {
    pub offset: u64,
    pub len: u64,
    pub flags: u32,
    /// "tier:N", "weighted-interleave" or "stripes".
    pub how: String,
    pub pinned: u64,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct NumaRegion {
    pub base: usize,
    pub len: usize,
    pub flags: u32,
    pub ranges: Vec<AppliedRange>,
    /// Bytes planned on each tier (the allocation map's share of this region).
    pub planned: Vec<u64>,
    /// Bytes locked on the fast tier (never moved by Attune nor demoted by the kernel).
    pub pinned: u64,
    /// Allocation order: the LRU approximation of Algorithm 2 for mapped pages.
    pub seq: u64,
}

#[derive(Default, serde::Serialize)]
pub struct NumaCounters {
    pub regions: AtomicU64,
    pub moved_pages: AtomicU64,
    pub move_failures: AtomicU64,
    /// Bytes moved down to make room for a protected region.
    pub demoted_for_room: AtomicU64,
    pub pin_failures: AtomicU64,
}

#[derive(Default)]
struct State {
    /// Planned bytes per tier over all live regions (the allocation map).
    used: Vec<u64>,
    regions: BTreeMap<usize, NumaRegion>,
    seq: u64,
}

pub struct NumaPlacer {
    pub tiers: Vec<NumaTier>,
    pub interleave: InterleaveMethod,
    pin_fraction: f64,
    state: Mutex<State>,
    pub counters: NumaCounters,
    warned_stripes: AtomicBool,
}

/// Weighted-interleave weights the kernel uses now (sysfs, one file per node).
pub fn system_weights(root: &std::path::Path) -> Option<BTreeMap<u32, u32>> {
    let dir = root.join("sys/kernel/mm/mempolicy/weighted_interleave");
    let mut w = BTreeMap::new();
    for e in std::fs::read_dir(dir).ok()?.flatten() {
        let name = e.file_name();
        let Some(n) = name.to_str().and_then(|s| s.strip_prefix("node")) else {
            continue;
        };
        if let (Ok(n), Some(v)) = (
            n.parse::<u32>(),
            std::fs::read_to_string(e.path())
                .ok()
                .and_then(|s| s.trim().parse::<u32>().ok()),
        ) {
            w.insert(n, v);
        }
    }
    Some(w)
}

/// The tiers for `cfg` on a machine with `topo`: tier 0 is the fast memory tier's nodes
/// with the DRAM budget, then each configured `numa` tier whose node is online. Errors
/// name what is wrong; a missing node is left out with a warning (a node taken offline
/// must not stop the application).
pub fn tiers_for(cfg: &Config, topo: &Topology) -> Vec<NumaTier> {
    let online = |n: u32| topo.nodes.iter().find(|x| x.id == n);
    let far: Vec<_> = cfg
        .tiers
        .iter()
        .filter(|t| t.kind == TierKind::Numa)
        .collect();
    let far_nodes: Vec<u32> = far.iter().filter_map(|t| t.node).collect();
    // Fast nodes: the fastest memory tier's nodes that are not configured as far tiers.
    let mut fast: Vec<u32> = topo
        .tiers()
        .into_iter()
        .flatten()
        .filter(|n| !far_nodes.contains(n))
        .filter(|&n| online(n).is_some_and(|x| x.has_cpus))
        .collect();
    if fast.is_empty() {
        fast.push(0);
    }
    let hmat = |n: u32| online(n).and_then(|x| x.read_bandwidth_mbps);
    let all_hmat = hmat(fast[0]).is_some() && far_nodes.iter().all(|&n| hmat(n).is_some());
    let mut v = vec![NumaTier {
        name: "dram".into(),
        nodes: fast.clone(),
        capacity: cfg.dram,
        bandwidth: if all_hmat {
            hmat(fast[0]).unwrap()
        } else {
            100_000
        },
    }];
    for t in far {
        let node = t.node.unwrap_or(0);
        if fast.contains(&node) {
            crate::warn!(
                "tier '{}': NUMA node {node} holds the CPUs and is the fast tier; tier left out",
                t.name
            );
            continue;
        }
        if node > 63 || online(node).is_none() {
            crate::warn!(
                "tier '{}': NUMA node {node} is not online on this machine; tier left out",
                t.name
            );
            continue;
        }
        v.push(NumaTier {
            name: t.name.clone(),
            nodes: vec![node],
            capacity: t.capacity,
            bandwidth: if all_hmat {
                hmat(node).unwrap()
            } else {
                (t.bandwidth / 1_000_000).max(1)
            },
        });
    }
    v
}

impl NumaPlacer {
    /// A placer when the configuration names at least one usable `numa` tier.
    pub fn new(cfg: &Config, root: &std::path::Path) -> Option<NumaPlacer> {
        if !cfg.tiers.iter().any(|t| t.kind == TierKind::Numa) {
            return None;
        }
        let topo = crate::topology::discover(root);
        let tiers = tiers_for(cfg, &topo);
        if tiers.len() < 2 {
            crate::warn!("no usable NUMA tier: regions stay in DRAM under the fault engine");
            return None;
        }
        let interleave = match (topo.weighted_interleave, system_weights(root)) {
            (true, Some(w)) if probe_weighted_interleave() => InterleaveMethod::Weighted(w),
            _ => InterleaveMethod::Stripes,
        };
        let n = tiers.len();
        Some(NumaPlacer {
            tiers,
            interleave,
            pin_fraction: cfg.pin_fraction,
            state: Mutex::new(State {
                used: vec![0; n],
                ..Default::default()
            }),
            counters: NumaCounters::default(),
            warned_stripes: AtomicBool::new(false),
        })
    }

    fn views(&self, used: &[u64]) -> Vec<TierView> {
        self.tiers
            .iter()
            .zip(used)
            .map(|(t, &u)| TierView {
                available: t.capacity.saturating_sub(u),
                bandwidth: t.bandwidth,
            })
            .collect()
    }

    /// Allocates `size` bytes placed by `flags`. ENOMEM when the tiers cannot hold it.
    pub fn alloc(&self, size: usize, flags: Flags) -> Result<usize, Errno> {
        let len = (size as u64).div_ceil(PAGE) * PAGE;
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let mut plan = pol::layout(len, flags, &self.views(&st.used), self.pin_fraction, PAGE)
            .ok_or(Errno(libc::ENOMEM))?;
        // Algorithm 2: a protected part that did not get the fast tier makes room there.
        let want_fast: u64 = plan
            .iter()
            .filter(|r| r.flags.is_protected() && r.placement != Placement::Tier(0))
            .map(|r| r.len)
            .sum();
        if want_fast > 0 {
            let freed = self.make_room(&mut st, want_fast);
            if freed > 0 {
                plan = pol::layout(len, flags, &self.views(&st.used), self.pin_fraction, PAGE)
                    .ok_or(Errno(libc::ENOMEM))?;
            }
        }
        let base = mem::map_anon(len as usize, false)?;
        let _ = mem::advise(base, len as usize, mem::MADV_NOHUGEPAGE);
        let mut applied = Vec::new();
        let mut planned = vec![0u64; self.tiers.len()];
        let mut pinned = 0u64;
        for r in &plan {
            let a = base + r.offset as usize;
            let how = match self.apply(a, r.len, &r.placement, &mut planned) {
                Ok(h) => h,
                Err(e) => {
                    let _ = mem::unmap(base, len as usize);
                    return Err(e);
                }
            };
            if r.pin > 0 {
                match sys::mlock(a, r.pin as usize) {
                    Ok(()) => pinned += r.pin,
                    Err(e) => {
                        self.counters.pin_failures.fetch_add(1, Relaxed);
                        crate::warn!(
                            "cannot pin {} bytes of a {} region ({e}); they stay pageable (raise RLIMIT_MEMLOCK)",
                            r.pin,
                            r.flags
                        );
                    }
                }
                let _ = sys::populate_write(a, r.pin as usize);
            }
            applied.push(AppliedRange {
                offset: r.offset,
                len: r.len,
                flags: r.flags.0,
                how,
                pinned: r.pin,
            });
        }
        for (u, p) in st.used.iter_mut().zip(&planned) {
            *u += p;
        }
        st.seq += 1;
        let seq = st.seq;
        st.regions.insert(
            base,
            NumaRegion {
                base,
                len: len as usize,
                flags: flags.0,
                ranges: applied,
                planned,
                pinned,
                seq,
            },
        );
        self.counters.regions.fetch_add(1, Relaxed);
        Ok(base)
    }

    /// Sets the policy of one planned range; adds its bytes per tier to `planned`.
    fn apply(
        &self,
        addr: usize,
        len: u64,
        p: &Placement,
        planned: &mut [u64],
    ) -> Result<String, Errno> {
        match p {
            Placement::Tier(t) => {
                self.bind(addr, len, *t, false)?;
                planned[*t] += len;
                Ok(format!("tier:{t}"))
            }
            Placement::Interleave(w) => {
                let wsum: u64 = w.iter().map(|&x| x as u64).sum::<u64>().max(1);
                let mut given = 0;
                for (t, &x) in w.iter().enumerate() {
                    planned[t] += len * x as u64 / wsum;
                    given += len * x as u64 / wsum;
                }
                planned[0] += len - given;
                if let InterleaveMethod::Weighted(sw) = &self.interleave {
                    // The kernel's weights are per node and system wide: usable when they
                    // give our ratio over the tiers' first nodes.
                    let have: Vec<u32> = self
                        .tiers
                        .iter()
                        .zip(w)
                        .map(|(t, &x)| {
                            if x == 0 {
                                0
                            } else {
                                *sw.get(&t.nodes[0]).unwrap_or(&1)
                            }
                        })
                        .collect();
                    let amounts: Vec<u64> = w.iter().map(|&x| x as u64).collect();
                    if pol::ratio_error(&amounts, &have) <= 0.02 {
                        let mask = self
                            .tiers
                            .iter()
                            .zip(w)
                            .filter(|(_, &x)| x > 0)
                            .fold(0u64, |m, (t, _)| m | (1u64 << t.nodes[0]));
                        sys::mbind(addr, len as usize, mpol::WEIGHTED_INTERLEAVE, mask, false)?;
                        return Ok("weighted-interleave".into());
                    }
                }
                if !self.warned_stripes.swap(true, Relaxed) {
                    crate::info!(
                        "BW ranges are striped per tier: {}",
                        match &self.interleave {
                            InterleaveMethod::Stripes =>
                                "the kernel has no weighted interleave (Linux 6.9+ with memory tiers)",
                            InterleaveMethod::Weighted(_) =>
                                "the kernel's weighted-interleave weights differ from the tiers' bandwidth ratio (set them with `attune numa weights --apply`)",
                        }
                    );
                }
                for (off, l, t) in pol::stripes(len, w, PAGE, MAX_STRIPE_GROUPS) {
                    self.bind(addr + off as usize, l, t, false)?;
                }
                Ok("stripes".into())
            }
        }
    }

    /// Prefers tier `t`'s nodes for `[addr, addr+len)`: preferred, not bound, so a full
    /// node degrades to another instead of failing the application.
    fn bind(&self, addr: usize, len: u64, t: usize, move_existing: bool) -> Result<(), Errno> {
        let tier = &self.tiers[t];
        let mode = if tier.nodes.len() > 1 {
            mpol::PREFERRED_MANY
        } else {
            mpol::PREFERRED
        };
        sys::mbind(addr, len as usize, mode, tier.mask(), move_existing)
    }

    /// Moves other regions' fast pages down to free `need` more bytes of the fast tier
    /// (the plan already used what was free), unprotected regions first, protected
    /// pageable pages last. Returns bytes freed.
    fn make_room(&self, st: &mut State, need: u64) -> u64 {
        if need == 0 || self.tiers.len() < 2 {
            return 0;
        }
        let bases: Vec<usize> = st.regions.keys().copied().collect();
        let cands: Vec<VictimCandidate> = bases
            .iter()
            .map(|b| {
                let r = &st.regions[b];
                VictimCandidate {
                    pageable_fast: r.planned[0].saturating_sub(r.pinned),
                    protected: Flags(r.flags).is_protected(),
                    recency: r.seq,
                }
            })
            .collect();
        let mut freed = 0;
        for (i, bytes) in pol::choose_victims(need, &cands) {
            let base = bases[i];
            let r = st.regions.get_mut(&base).unwrap();
            let moved = self.demote_tail(r, bytes);
            st.used[0] -= moved;
            st.used[1] += moved;
            freed += moved;
        }
        self.counters.demoted_for_room.fetch_add(freed, Relaxed);
        freed
    }

    /// Moves the last `bytes` of a region's fast-tier ranges to tier 1 (the next lower
    /// tier, not the bottom); pinned bytes are at the start of a range and stay.
    fn demote_tail(&self, r: &mut NumaRegion, bytes: u64) -> u64 {
        let mut left = bytes / PAGE * PAGE;
        let mut moved = 0;
        for i in (0..r.ranges.len()).rev() {
            if left == 0 {
                break;
            }
            let a = &r.ranges[i];
            if a.how != "tier:0" {
                continue;
            }
            let take = left.min(a.len - a.pinned);
            if take == 0 {
                continue;
            }
            let start = r.base + (a.offset + a.len - take) as usize;
            if self.move_range(start, take as usize, 1).is_err() {
                continue;
            }
            let (off, len, flags) = (a.offset, a.len, a.flags);
            r.ranges[i].len = len - take;
            r.ranges.insert(
                i + 1,
                AppliedRange {
                    offset: off + len - take,
                    len: take,
                    flags,
                    how: "tier:1".into(),
                    pinned: 0,
                },
            );
            r.planned[0] -= take;
            r.planned[1] += take;
            left -= take;
            moved += take;
        }
        r.ranges.retain(|a| a.len > 0);
        moved
    }

    /// Sets tier `t` as the policy of `[addr, addr+len)` and moves its present pages
    /// there in batches. Returns pages moved (checked by a second query).
    pub fn move_range(&self, addr: usize, len: usize, t: usize) -> Result<u64, Errno> {
        if t >= self.tiers.len() {
            return Err(Errno(libc::EINVAL));
        }
        self.bind(addr, len as u64, t, false)?;
        let target = self.tiers[t].nodes[0] as i32;
        let pages: Vec<usize> = (addr..addr + len).step_by(PAGE as usize).collect();
        let mut status = vec![0i32; MOVE_BATCH];
        let mut moved = 0u64;
        for batch in pages.chunks(MOVE_BATCH) {
            let st = &mut status[..batch.len()];
            sys::query_pages(batch, st)?;
            let todo: Vec<usize> = batch
                .iter()
                .zip(st.iter())
                .filter(|(_, &s)| s >= 0 && !self.tiers[t].nodes.contains(&(s as u32)))
                .map(|(&p, _)| p)
                .collect();
            if todo.is_empty() {
                continue;
            }
            let nodes = vec![target; todo.len()];
            let mut st2 = vec![0i32; todo.len()];
            sys::move_pages(&todo, &nodes, &mut st2)?;
            sys::query_pages(&todo, &mut st2)?;
            for &s in &st2 {
                if s >= 0 && self.tiers[t].nodes.contains(&(s as u32)) {
                    moved += 1;
                } else {
                    self.counters.move_failures.fetch_add(1, Relaxed);
                }
            }
        }
        self.counters.moved_pages.fetch_add(moved, Relaxed);
        Ok(moved)
    }

    /// Moves a whole or part of a region to tier `t` on request (`attune_move`), keeping
    /// the allocation map right. Locked (pinned) pages move too: the caller asked.
    pub fn move_to(&self, addr: usize, len: usize, t: usize) -> Result<u64, Errno> {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let (&base, r) = st
            .regions
            .range_mut(..=addr)
            .next_back()
            .filter(|(b, r)| addr + len <= **b + r.len)
            .ok_or(Errno(libc::EINVAL))?;
        let _ = base;
        let moved = self.move_range(addr, len, t)?;
        // The range's planned bytes now count on tier t.
        let mut delta = vec![0u64; self.tiers.len()];
        let end = (addr + len - r.base) as u64;
        let start = (addr - r.base) as u64;
        for a in r.ranges.iter_mut() {
            let (s, e) = (a.offset.max(start), (a.offset + a.len).min(end));
            if s >= e {
                continue;
            }
            if let Some(from) = a
                .how
                .strip_prefix("tier:")
                .and_then(|x| x.parse::<usize>().ok())
            {
                delta[from] += e - s;
            } else {
                delta[0] += e - s; // interleaved: accounted on the fast tier
            }
            if s == a.offset && e == a.offset + a.len {
                a.how = format!("tier:{t}");
            }
        }
        let total: u64 = delta.iter().sum();
        for (i, d) in delta.iter().enumerate() {
            r.planned[i] = r.planned[i].saturating_sub(*d);
        }
        r.planned[t] += total;
        for (i, d) in delta.iter().enumerate() {
            st.used[i] = st.used[i].saturating_sub(*d);
        }
        st.used[t] += total;
        Ok(moved)
    }

    /// Changes a region's flags later (`attune_set_flags`): plans it again as if it were
    /// new (its own bytes count as available), sets the new policies and moves the pages
    /// that are present to where the new plan puts them. Returns pages moved.
    pub fn set_flags(&self, addr: usize, flags: Flags) -> Result<u64, Errno> {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let Some(old) = st.regions.get(&addr).cloned() else {
            return Err(Errno(libc::EINVAL));
        };
        let mut used = st.used.clone();
        for (u, p) in used.iter_mut().zip(&old.planned) {
            *u = u.saturating_sub(*p);
        }
        let plan = pol::layout(
            old.len as u64,
            flags,
            &self.views(&used),
            self.pin_fraction,
            PAGE,
        )
        .ok_or(Errno(libc::ENOMEM))?;
        if old.pinned > 0 {
            let _ = sys::munlock(addr, old.len);
        }
        let mut planned = vec![0u64; self.tiers.len()];
        let mut applied = Vec::new();
        let mut pinned = 0;
        let mut moved = 0;
        for r in &plan {
            let a = addr + r.offset as usize;
            let how = self.apply(a, r.len, &r.placement, &mut planned)?;
            // The policy applies to new faults; present pages move now.
            moved += match &r.placement {
                Placement::Tier(t) => self.move_range(a, r.len as usize, *t)?,
                Placement::Interleave(_) => {
                    // Re-applying the interleave with MPOL_MF_MOVE lets the kernel lay
                    // out the present pages by the new policy.
                    if how == "weighted-interleave" {
                        let _ = self.rebind_moving(a, r.len);
                    }
                    0
                }
            };
            if r.pin > 0 && sys::mlock(a, r.pin as usize).is_ok() {
                pinned += r.pin;
            }
            applied.push(AppliedRange {
                offset: r.offset,
                len: r.len,
                flags: r.flags.0,
                how,
                pinned: r.pin,
            });
        }
        st.used = used.iter().zip(&planned).map(|(u, p)| u + p).collect();
        let reg = st.regions.get_mut(&addr).unwrap();
        reg.flags = flags.0;
        reg.ranges = applied;
        reg.planned = planned;
        reg.pinned = pinned;
        Ok(moved)
    }

    /// Applies a range's current policy to its present pages (mbind with MPOL_MF_MOVE).
    fn rebind_moving(&self, addr: usize, len: u64) -> Result<(), Errno> {
        let (mode, mask) = sys::get_mempolicy(addr)?;
        sys::mbind(addr, len as usize, mode, mask, true)
    }

    pub fn owns(&self, addr: usize) -> bool {
        self.state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .regions
            .contains_key(&addr)
    }

    /// Frees a region that starts at `addr`; false when it is not one of ours.
    pub fn free(&self, addr: usize) -> bool {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let Some(r) = st.regions.remove(&addr) else {
            return false;
        };
        for (u, p) in st.used.iter_mut().zip(&r.planned) {
            *u = u.saturating_sub(*p);
        }
        let _ = mem::unmap(r.base, r.len);
        true
    }

    pub fn region(&self, addr: usize) -> Option<NumaRegion> {
        let st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        st.regions
            .range(..=addr)
            .next_back()
            .filter(|(b, r)| addr < **b + r.len)
            .map(|(_, r)| r.clone())
    }

    pub fn regions(&self) -> Vec<NumaRegion> {
        let st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        st.regions.values().cloned().collect()
    }

    /// Planned bytes per tier over all regions (the allocation map).
    pub fn used(&self) -> Vec<u64> {
        self.state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .used
            .clone()
    }

    /// Present pages of `[addr, addr+len)` per tier, and pages not present.
    pub fn residency(&self, addr: usize, len: usize) -> Result<(Vec<u64>, u64), Errno> {
        let counts = node_pages(addr, len)?;
        let mut per_tier = vec![0u64; self.tiers.len()];
        let mut absent = 0;
        for (node, n) in counts {
            match node.and_then(|nd| self.tiers.iter().position(|t| t.nodes.contains(&nd))) {
                Some(t) => per_tier[t] += n,
                None if node.is_none() => absent += n,
                None => per_tier[0] += n,
            }
        }
        Ok((per_tier, absent))
    }
}

/// Present pages of `[addr, addr+len)` per node (None: not present).
pub fn node_pages(addr: usize, len: usize) -> Result<BTreeMap<Option<u32>, u64>, Errno> {
    let mut out = BTreeMap::new();
    let pages: Vec<usize> = (addr..addr + len).step_by(PAGE as usize).collect();
    let mut status = vec![0i32; MOVE_BATCH];
    for batch in pages.chunks(MOVE_BATCH) {
        let st = &mut status[..batch.len()];
        sys::query_pages(batch, st)?;
        for &s in st.iter() {
            *out.entry(if s >= 0 { Some(s as u32) } else { None })
                .or_insert(0) += 1;
        }
    }
    Ok(out)
}

/// Whether `set_mempolicy(MPOL_WEIGHTED_INTERLEAVE)` is accepted (it is not on kernels
/// before 6.9, nor where all nodes share one memory tier). Restores the default.
pub fn probe_weighted_interleave() -> bool {
    let ok = sys::set_mempolicy(mpol::WEIGHTED_INTERLEAVE, 1).is_ok();
    let _ = sys::set_mempolicy(mpol::DEFAULT, 0);
    ok
}

/// Weights that give interleave the tiers' bandwidth ratio, per node.
pub fn bandwidth_weights(tiers: &[NumaTier]) -> BTreeMap<u32, u32> {
    let w = pol::reduce_weights(&tiers.iter().map(|t| t.bandwidth).collect::<Vec<_>>());
    let mut out = BTreeMap::new();
    for (t, x) in tiers.iter().zip(w) {
        for &n in &t.nodes {
            out.insert(n, x.max(1));
        }
    }
    out
}
