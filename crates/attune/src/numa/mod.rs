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
//! * Heat: regions are write-tracked (`attune_sys::pagemap`); [`NumaPlacer::heat_round`]
//!   ages each 64 KiB cell's write history and moves what `attune_policy::promote` plans
//!   (the scanner thread is `heat.rs`).

pub mod heat;

use crate::config::{Config, Mode, TierKind};
use crate::topology::Topology;
use attune_policy::numa::{self as pol, Placement, RangePlan, VictimCandidate};
use attune_policy::{Flags, TierView};
use attune_sys::numa::{self as sys, mpol};
use attune_sys::pagemap::WriteTracker;
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
/// Unit of write heat and of promotion: 16 pages, so that a hot set moves in runs and a
/// 1 GiB region keeps 16 Ki history bytes.
pub const HEAT_CELL: u64 = 64 << 10;

/// Write heat of one cell.
#[derive(Clone, Copy, Debug, Default)]
pub struct CellHeat {
    /// `promote::age` history of the rounds it was observed in.
    pub history: u8,
    /// Rounds observed (saturating).
    pub seen: u8,
    /// Armed last round: the next scan tells whether it was written.
    pub armed: bool,
}

/// A region cut into more ranges than this (each is one or two mappings after `mbind`) is
/// not promoted further: scattered promotions must not run the process out of mappings.
pub(crate) const MAX_RANGES: usize = 1024;

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

/// How one range of a region is placed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum How {
    /// Preferred on tier N's nodes.
    Tier(usize),
    /// `MPOL_WEIGHTED_INTERLEAVE` over the tiers it uses.
    WeightedInterleave,
    /// Stripes bound to one tier each (no usable weighted interleave).
    Stripes,
}

impl serde::Serialize for How {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            How::Tier(t) => s.serialize_str(&format!("tier:{t}")),
            How::WeightedInterleave => s.serialize_str("weighted-interleave"),
            How::Stripes => s.serialize_str("stripes"),
        }
    }
}

/// A range of a region as placed: the allocation map is the sum of `bytes` over all
/// ranges of all regions (nothing else stores it, so nothing can drift from it).
#[derive(Clone, Debug, serde::Serialize)]
pub struct AppliedRange {
    pub offset: u64,
    pub len: u64,
    pub flags: u32,
    pub how: How,
    /// Bytes at the start of the range locked in memory (0 when mlock was refused).
    pub pinned: u64,
    /// Bytes of the range counted on each tier.
    pub bytes: Vec<u64>,
}

impl AppliedRange {
    /// Splits at `at` (relative to the region, inside the range): the pinned prefix and
    /// the per-tier bytes go with their part (interleaved bytes in proportion).
    fn split(&self, at: u64) -> (AppliedRange, AppliedRange) {
        let l1 = at - self.offset;
        let b1: Vec<u64> = self
            .bytes
            .iter()
            .map(|&b| (b as u128 * l1 as u128 / self.len as u128) as u64)
            .collect();
        let b2: Vec<u64> = self.bytes.iter().zip(&b1).map(|(b, x)| b - x).collect();
        let first = AppliedRange {
            len: l1,
            pinned: self.pinned.min(l1),
            bytes: b1,
            ..self.clone()
        };
        let second = AppliedRange {
            offset: at,
            len: self.len - l1,
            pinned: self.pinned.saturating_sub(l1),
            bytes: b2,
            ..self.clone()
        };
        (first, second)
    }
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct NumaRegion {
    pub base: usize,
    pub len: usize,
    pub flags: u32,
    pub ranges: Vec<AppliedRange>,
    /// Allocation order: the LRU approximation of Algorithm 2 for mapped pages.
    pub seq: u64,
    /// Write heat per [`HEAT_CELL`].
    #[serde(skip)]
    pub heat: Vec<CellHeat>,
    /// Registered with the write tracker (false without one, or in a forked child).
    #[serde(skip)]
    pub tracked: bool,
}

impl NumaRegion {
    /// Bytes counted on each of `n` tiers (this region's share of the allocation map).
    pub fn planned(&self, n: usize) -> Vec<u64> {
        let mut v = vec![0u64; n];
        for r in &self.ranges {
            for (x, b) in v.iter_mut().zip(&r.bytes) {
                *x += b;
            }
        }
        v
    }

    /// Bytes locked in memory (never moved by Attune nor demoted by the kernel).
    pub fn pinned(&self) -> u64 {
        self.ranges.iter().map(|r| r.pinned).sum()
    }

    /// Cuts the ranges at `start` and `end` (relative offsets) and gives every range in
    /// between to tier `t`: what a move of those bytes leaves in the map.
    pub(crate) fn retarget(&mut self, start: u64, end: u64, t: usize, ntiers: usize) {
        let mut out = Vec::with_capacity(self.ranges.len() + 2);
        for r in self.ranges.drain(..) {
            let mut pieces = vec![r];
            for cut in [start, end] {
                let last = pieces.pop().unwrap();
                if cut > last.offset && cut < last.offset + last.len {
                    let (a, b) = last.split(cut);
                    pieces.push(a);
                    pieces.push(b);
                } else {
                    pieces.push(last);
                }
            }
            for mut p in pieces {
                if p.offset >= start && p.offset + p.len <= end {
                    p.how = How::Tier(t);
                    p.bytes = vec![0; ntiers];
                    p.bytes[t] = p.len;
                }
                out.push(p);
            }
        }
        self.ranges = out;
        self.coalesce();
    }

    /// Joins neighbouring ranges on the same single tier with the same flags, so that moves
    /// of neighbouring cells leave one range (a pinned prefix stays a prefix).
    fn coalesce(&mut self) {
        let mut out: Vec<AppliedRange> = Vec::with_capacity(self.ranges.len());
        for r in self.ranges.drain(..) {
            if let Some(last) = out.last_mut() {
                let joinable = matches!(last.how, How::Tier(_))
                    && last.how == r.how
                    && last.flags == r.flags
                    && (r.pinned == 0 || last.pinned == last.len);
                if joinable {
                    last.len += r.len;
                    last.pinned += r.pinned;
                    for (a, b) in last.bytes.iter_mut().zip(&r.bytes) {
                        *a += b;
                    }
                    continue;
                }
            }
            out.push(r);
        }
        self.ranges = out;
    }

    /// Per cell: (tier, movable): the tier of the single-tier range holding the whole cell
    /// outside any pinned prefix; not movable when interleaved, pinned or cut.
    pub(crate) fn cell_places(&self) -> Vec<(usize, bool)> {
        let cells = (self.len as u64).div_ceil(HEAT_CELL) as usize;
        let mut out = vec![(0, false); cells];
        for r in &self.ranges {
            let How::Tier(t) = r.how else { continue };
            let (lo, hi) = (r.offset + r.pinned, r.offset + r.len);
            let first = lo.div_ceil(HEAT_CELL);
            let mut c = first;
            while (c + 1) * HEAT_CELL <= hi {
                out[c as usize] = (t, true);
                c += 1;
            }
            // A region's last cell may be short: movable when the range reaches the end.
            if hi == self.len as u64 && c * HEAT_CELL < hi && c * HEAT_CELL >= lo {
                out[c as usize] = (t, true);
            }
        }
        out
    }
}

#[derive(Default, serde::Serialize)]
pub struct NumaCounters {
    pub regions: AtomicU64,
    pub moved_pages: AtomicU64,
    pub move_failures: AtomicU64,
    /// Bytes moved down to make room for a protected region.
    pub demoted_for_room: AtomicU64,
    pub pin_failures: AtomicU64,
    /// Write-heat scans done, and their total time (page-table walks).
    pub heat_scans: AtomicU64,
    pub heat_scan_ns: AtomicU64,
    /// Bytes of hot cells moved to the fast tier, and of cold cells moved down for them.
    pub promoted_bytes: AtomicU64,
    pub demoted_cold_bytes: AtomicU64,
    /// Bytes of cold cells moved down to restore the fast tier's headroom.
    pub demoted_headroom_bytes: AtomicU64,
}

#[derive(Default)]
pub(crate) struct State {
    pub(crate) regions: BTreeMap<usize, NumaRegion>,
    seq: u64,
    /// Where the heat scanner's round-robin arming goes on (`promote::choose_arm`).
    pub(crate) heat_cursor: usize,
}

impl State {
    /// Bytes per tier over all live regions (the allocation map), leaving out `except`.
    pub(crate) fn used(&self, n: usize, except: Option<usize>) -> Vec<u64> {
        let mut v = vec![0u64; n];
        for r in self.regions.values().filter(|r| Some(r.base) != except) {
            for (x, b) in v.iter_mut().zip(r.planned(n)) {
                *x += b;
            }
        }
        v
    }
}

pub struct NumaPlacer {
    pub tiers: Vec<NumaTier>,
    pub interleave: InterleaveMethod,
    pin_fraction: f64,
    pub(crate) state: Mutex<State>,
    pub counters: NumaCounters,
    warned_stripes: AtomicBool,
    /// Written-page tracking for write heat (None: off, or the kernel has none).
    pub(crate) heat: Option<WriteTracker>,
    /// Temperature-only mode: flags are ignored, every region is placed and moved alike.
    pub(crate) temperature: bool,
    /// Fast-tier bytes promotions leave free.
    pub(crate) headroom: u64,
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
        let all = tiers.iter().fold(0u64, |m, t| m | t.mask());
        let interleave = match (topo.weighted_interleave, system_weights(root)) {
            (true, Some(w)) if probe_weighted_interleave(all) => InterleaveMethod::Weighted(w),
            _ => InterleaveMethod::Stripes,
        };
        let heat = if cfg.heat_interval_ms == 0 {
            None
        } else {
            match WriteTracker::open() {
                Ok(t) => {
                    crate::info!("NUMA write heat from {}", t.kind());
                    Some(t)
                }
                Err(e) => {
                    crate::warn!(
                        "no write heat on NUMA tiers ({e}: asynchronous write-protection needs Linux 6.7+, soft-dirty bits a kernel built with CONFIG_MEM_SOFT_DIRTY): hot pages in the far tier stay there and no cold data is demoted to keep the headroom"
                    );
                    None
                }
            }
        };
        Some(NumaPlacer {
            tiers,
            interleave,
            pin_fraction: cfg.pin_fraction,
            state: Mutex::new(State::default()),
            counters: NumaCounters::default(),
            warned_stripes: AtomicBool::new(false),
            heat,
            temperature: cfg.mode == Mode::Temperature,
            headroom: cfg.headroom,
        })
    }

    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Algorithm 1 over what the tiers have left beside `used`.
    fn layout(&self, len: u64, flags: Flags, used: &[u64]) -> Result<Vec<RangePlan>, Errno> {
        let views: Vec<TierView> = self
            .tiers
            .iter()
            .zip(used)
            .map(|(t, &u)| TierView {
                available: t.capacity.saturating_sub(u),
                bandwidth: t.bandwidth,
            })
            .collect();
        attune_policy::place::numa(
            len,
            flags,
            !self.temperature,
            &views,
            self.pin_fraction,
            PAGE,
        )
        .ok_or(Errno(libc::ENOMEM))
    }

    /// Allocates `size` bytes placed by `flags`. ENOMEM when the tiers cannot hold it.
    pub fn alloc(&self, size: usize, flags: Flags) -> Result<usize, Errno> {
        // Temperature-only mode: every region is placed, recorded and moved as an
        // unflagged one.
        let flags = attune_policy::place::effective_flags(flags, !self.temperature);
        let len = (size as u64).div_ceil(PAGE) * PAGE;
        let n = self.tiers.len();
        let mut st = self.lock();
        let mut plan = self.layout(len, flags, &st.used(n, None))?;
        // Algorithm 2: a protected part that did not get the fast tier makes room there.
        let want_fast: u64 = plan
            .iter()
            .filter(|r| r.flags.is_protected() && r.placement != Placement::Tier(0))
            .map(|r| r.len)
            .sum();
        if want_fast > 0 && self.make_room(&mut st, want_fast) > 0 {
            plan = self.layout(len, flags, &st.used(n, None))?;
        }
        let base = mem::map_anon(len as usize, false)?;
        let _ = mem::advise(base, len as usize, mem::MADV_NOHUGEPAGE);
        let ranges = match self.apply_plan(base, &plan, false) {
            Ok((r, _)) => r,
            Err(e) => {
                let _ = mem::unmap(base, len as usize);
                return Err(e);
            }
        };
        st.seq += 1;
        let seq = st.seq;
        let tracked = self
            .heat
            .as_ref()
            .is_some_and(|t| match t.track(base, len as usize) {
                Ok(()) => true,
                Err(e) => {
                    crate::info!(
                        "region at {base:#x} is not write-tracked ({e}): it is not promoted"
                    );
                    false
                }
            });
        st.regions.insert(
            base,
            NumaRegion {
                base,
                len: len as usize,
                flags: flags.0,
                ranges,
                seq,
                heat: vec![Default::default(); len.div_ceil(HEAT_CELL) as usize],
                tracked,
            },
        );
        self.counters.regions.fetch_add(1, Relaxed);
        Ok(base)
    }

    /// Sets the policies of a plan's ranges on the region at `base`, locks the pinned
    /// parts; with `move_existing`, pages already present move to their new place too.
    /// Returns the ranges as placed and the pages moved.
    fn apply_plan(
        &self,
        base: usize,
        plan: &[RangePlan],
        move_existing: bool,
    ) -> Result<(Vec<AppliedRange>, u64), Errno> {
        let mut out = Vec::with_capacity(plan.len());
        let mut moved = 0;
        for r in plan {
            let a = base + r.offset as usize;
            let mut bytes = vec![0u64; self.tiers.len()];
            let how = match &r.placement {
                Placement::Tier(t) if move_existing => {
                    moved += self.move_range(a, r.len as usize, *t)?;
                    bytes[*t] = r.len;
                    How::Tier(*t)
                }
                Placement::Tier(t) => {
                    self.bind(a, r.len, *t, false)?;
                    bytes[*t] = r.len;
                    How::Tier(*t)
                }
                Placement::Interleave(w) => {
                    let wsum: u64 = w.iter().map(|&x| x as u64).sum::<u64>().max(1);
                    for (b, &x) in bytes.iter_mut().zip(w) {
                        *b = r.len * x as u64 / wsum;
                    }
                    bytes[0] += r.len - bytes.iter().sum::<u64>();
                    self.interleave(a, r.len, w, move_existing)?
                }
            };
            out.push(AppliedRange {
                offset: r.offset,
                len: r.len,
                flags: r.flags.0,
                how,
                pinned: self.lock_pinned(a, r.pin, r.flags),
                bytes,
            });
        }
        Ok((out, moved))
    }

    /// Locks and pre-faults `len` bytes at `addr`; returns the bytes locked (0 when the
    /// kernel refuses: they stay pageable, with a warning and a counter).
    fn lock_pinned(&self, addr: usize, len: u64, flags: Flags) -> u64 {
        if len == 0 {
            return 0;
        }
        let locked = match sys::mlock(addr, len as usize) {
            Ok(()) => len,
            Err(e) => {
                self.counters.pin_failures.fetch_add(1, Relaxed);
                crate::warn!(
                    "cannot pin {len} bytes of a {flags} region ({e}); they stay pageable (raise RLIMIT_MEMLOCK)"
                );
                0
            }
        };
        let _ = sys::populate_write(addr, len as usize);
        locked
    }

    /// Interleaves `[addr, addr+len)` over the tiers with weights `w`: the kernel's
    /// weighted interleave when its system-wide weights give this ratio, stripes otherwise.
    fn interleave(
        &self,
        addr: usize,
        len: u64,
        w: &[u32],
        move_existing: bool,
    ) -> Result<How, Errno> {
        if let InterleaveMethod::Weighted(sw) = &self.interleave {
            // The kernel's weights are per node and system wide: usable when they give our
            // ratio over the tiers' first nodes.
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
                sys::mbind(
                    addr,
                    len as usize,
                    mpol::WEIGHTED_INTERLEAVE,
                    mask,
                    move_existing,
                )?;
                return Ok(How::WeightedInterleave);
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
            self.bind(addr + off as usize, l, t, move_existing)?;
        }
        Ok(How::Stripes)
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
        let bases: Vec<usize> = st.regions.keys().copied().collect();
        let cands: Vec<VictimCandidate> = bases
            .iter()
            .map(|b| {
                let r = &st.regions[b];
                VictimCandidate {
                    // What `demote_tail` can take: unpinned bytes of fast-tier ranges.
                    pageable_fast: r
                        .ranges
                        .iter()
                        .filter(|a| a.how == How::Tier(0))
                        .map(|a| a.len - a.pinned)
                        .sum(),
                    protected: Flags(r.flags).is_protected(),
                    recency: r.seq,
                }
            })
            .collect();
        let mut freed = 0;
        for (i, bytes) in pol::choose_victims(need, &cands) {
            let r = st.regions.get_mut(&bases[i]).unwrap();
            freed += self.demote_tail(r, bytes);
        }
        self.counters.demoted_for_room.fetch_add(freed, Relaxed);
        freed
    }

    /// Moves the last `bytes` of a region's fast-tier ranges to tier 1 (the next lower
    /// tier, not the bottom); pinned bytes are at the start of a range and stay.
    fn demote_tail(&self, r: &mut NumaRegion, bytes: u64) -> u64 {
        let mut left = bytes / PAGE * PAGE;
        let mut moved = 0;
        // Newest ranges first; each move re-cuts the ranges, so find the next one anew.
        while left > 0 {
            let Some(a) = r
                .ranges
                .iter()
                .rev()
                .find(|a| a.how == How::Tier(0) && a.len > a.pinned)
            else {
                break;
            };
            let take = left.min(a.len - a.pinned);
            let (start, end) = (a.offset + a.len - take, a.offset + a.len);
            if self
                .move_range(r.base + start as usize, take as usize, 1)
                .is_err()
            {
                break;
            }
            r.retarget(start, end, 1, self.tiers.len());
            left -= take;
            moved += take;
        }
        moved
    }

    /// Sets tier `t` as the policy of `[addr, addr+len)` and moves its present pages
    /// there in batches. Returns pages moved (checked by a second query).
    pub(crate) fn move_range(&self, addr: usize, len: usize, t: usize) -> Result<u64, Errno> {
        self.bind(addr, len as u64, t, false)?;
        let target = &self.tiers[t].nodes;
        let on_target = |s: i32| s >= 0 && target.contains(&(s as u32));
        let pages: Vec<usize> = (addr..addr + len).step_by(PAGE as usize).collect();
        let mut status = vec![0i32; MOVE_BATCH];
        let mut moved = 0u64;
        for batch in pages.chunks(MOVE_BATCH) {
            let st = &mut status[..batch.len()];
            sys::query_pages(batch, st)?;
            let todo: Vec<usize> = batch
                .iter()
                .zip(st.iter())
                .filter(|(_, &s)| s >= 0 && !on_target(s))
                .map(|(&p, _)| p)
                .collect();
            if todo.is_empty() {
                continue;
            }
            let nodes = vec![target[0] as i32; todo.len()];
            let mut st2 = vec![0i32; todo.len()];
            sys::move_pages(&todo, &nodes, &mut st2)?;
            sys::query_pages(&todo, &mut st2)?;
            let ok = st2.iter().filter(|&&s| on_target(s)).count() as u64;
            moved += ok;
            self.counters
                .move_failures
                .fetch_add(todo.len() as u64 - ok, Relaxed);
        }
        self.counters.moved_pages.fetch_add(moved, Relaxed);
        Ok(moved)
    }

    /// Moves `[addr, addr+len)` (inside one region) to tier `t` on request, keeping the
    /// allocation map right. Locked (pinned) pages move too: the caller asked.
    pub fn move_to(&self, addr: usize, len: usize, t: usize) -> Result<u64, Errno> {
        if t >= self.tiers.len() || len == 0 {
            return Err(Errno(libc::EINVAL));
        }
        let mut st = self.lock();
        let r = st
            .regions
            .range_mut(..=addr)
            .next_back()
            .map(|(_, r)| r)
            .filter(|r| addr.checked_add(len).is_some_and(|e| e <= r.base + r.len))
            .ok_or(Errno(libc::EINVAL))?;
        let moved = self.move_range(addr, len, t)?;
        let start = (addr - r.base) as u64;
        r.retarget(start, start + len as u64, t, self.tiers.len());
        Ok(moved)
    }

    /// Changes a region's flags later (`attune_set_flags`): plans it again as if it were
    /// new (its own bytes count as available), sets the new policies and moves the pages
    /// that are present to where the new plan puts them. Returns pages moved.
    pub fn set_flags(&self, addr: usize, flags: Flags) -> Result<u64, Errno> {
        let mut st = self.lock();
        if self.temperature {
            // Flags are ignored in this mode; the region stays as placed.
            return if st.regions.contains_key(&addr) {
                Ok(0)
            } else {
                Err(Errno(libc::EINVAL))
            };
        }
        let Some(old) = st.regions.get(&addr) else {
            return Err(Errno(libc::EINVAL));
        };
        let (len, had_pins) = (old.len, old.pinned() > 0);
        let plan = self.layout(len as u64, flags, &st.used(self.tiers.len(), Some(addr)))?;
        if had_pins {
            let _ = sys::munlock(addr, len);
        }
        let (ranges, moved) = self.apply_plan(addr, &plan, true)?;
        let r = st.regions.get_mut(&addr).unwrap();
        r.flags = flags.0;
        r.ranges = ranges;
        Ok(moved)
    }

    pub fn owns(&self, addr: usize) -> bool {
        self.lock().regions.contains_key(&addr)
    }

    /// Frees a region that starts at `addr`; false when it is not one of ours.
    pub fn free(&self, addr: usize) -> bool {
        let Some(r) = self.lock().regions.remove(&addr) else {
            return false;
        };
        let _ = mem::unmap(r.base, r.len);
        true
    }

    /// The region containing `addr`.
    pub fn region(&self, addr: usize) -> Option<NumaRegion> {
        self.lock()
            .regions
            .range(..=addr)
            .next_back()
            .filter(|(b, r)| addr < **b + r.len)
            .map(|(_, r)| r.clone())
    }

    /// Bytes per tier over all regions (the allocation map).
    pub fn used(&self) -> Vec<u64> {
        self.lock().used(self.tiers.len(), None)
    }

    /// What `attune_stats_json` and the `attune run` report show of the NUMA tiers: each
    /// tier with its nodes, capacity and the bytes the allocation map places there, and
    /// the movement counters.
    pub fn stats(&self) -> serde_json::Value {
        let used = self.used();
        let tiers: Vec<serde_json::Value> = self
            .tiers
            .iter()
            .zip(&used)
            .map(|(t, u)| {
                serde_json::json!({
                    "name": t.name, "nodes": t.nodes, "capacity": t.capacity, "used_bytes": u,
                })
            })
            .collect();
        serde_json::json!({
            "tiers": tiers,
            "interleave": self.interleave,
            "write_heat": self.heat.is_some(),
            "counters": self.counters,
        })
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

/// Whether the kernel accepts `MPOL_WEIGHTED_INTERLEAVE` over `nodes` (not before 6.9,
/// nor where all nodes share one memory tier). Probed with `mbind` on a scratch page, so
/// the calling thread's own policy (e.g. from `numactl`) is left alone.
pub fn probe_weighted_interleave(nodes: u64) -> bool {
    use attune_sys::kernel;
    if kernel::masked(kernel::WEIGHTED_INTERLEAVE) {
        return false;
    }
    let Ok(p) = mem::map_anon(PAGE as usize, false) else {
        return false;
    };
    let ok = sys::mbind(p, PAGE as usize, mpol::WEIGHTED_INTERLEAVE, nodes, false).is_ok();
    let _ = mem::unmap(p, PAGE as usize);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn range(offset: u64, len: u64, how: How, pinned: u64, bytes: Vec<u64>) -> AppliedRange {
        AppliedRange {
            offset,
            len,
            flags: 0,
            how,
            pinned,
            bytes,
        }
    }

    #[test]
    fn retarget_cuts_ranges_and_keeps_the_map_whole() {
        let mut r = NumaRegion {
            base: 0,
            len: 230,
            flags: 0,
            // 100 on tier 0 (first 40 pinned), then 130 interleaved 100:30.
            ranges: vec![
                range(0, 100, How::Tier(0), 40, vec![100, 0]),
                range(100, 130, How::Stripes, 0, vec![100, 30]),
            ],
            seq: 1,
            heat: Vec::new(),
            tracked: false,
        };
        r.retarget(60, 165, 1, 2);
        let hows: Vec<(u64, u64, How)> =
            r.ranges.iter().map(|a| (a.offset, a.len, a.how)).collect();
        assert_eq!(
            hows,
            vec![
                (0, 60, How::Tier(0)),
                // Cut at 100, then joined again: both pieces are on tier 1 now.
                (60, 105, How::Tier(1)),
                (165, 65, How::Stripes)
            ]
        );
        // 60 stay on tier 0, 105 moved to tier 1, the interleaved rest split 50:15.
        assert_eq!(r.planned(2), vec![60 + 50, 105 + 15]);
        assert_eq!(r.planned(2).iter().sum::<u64>(), 230);
        assert_eq!(r.pinned(), 40, "the pinned prefix stays with its piece");
    }

    #[test]
    fn retarget_of_a_whole_range_does_not_cut() {
        let mut r = NumaRegion {
            base: 0,
            len: 100,
            flags: 0,
            ranges: vec![range(0, 100, How::Tier(1), 0, vec![0, 100])],
            seq: 1,
            heat: Vec::new(),
            tracked: false,
        };
        r.retarget(0, 100, 0, 2);
        assert_eq!(r.ranges.len(), 1);
        assert_eq!(r.planned(2), vec![100, 0]);
    }

    #[test]
    fn promoted_cells_join_their_neighbours_and_cells_know_their_place() {
        const C: u64 = HEAT_CELL;
        let mut r = NumaRegion {
            base: 0,
            len: (10 * C + 4096) as usize,
            flags: 0,
            // 2.5 cells pinned on tier 0, then tier 1 to 6 cells, then interleaved.
            ranges: vec![
                range(0, 3 * C, How::Tier(0), 5 * C / 2, vec![3 * C, 0]),
                range(3 * C, 3 * C, How::Tier(1), 0, vec![0, 3 * C]),
                range(6 * C, 4 * C + 4096, How::Stripes, 0, vec![3 * C, C + 4096]),
            ],
            seq: 1,
            heat: Vec::new(),
            tracked: false,
        };
        let places = r.cell_places();
        assert_eq!(places.len(), 11);
        // Cells 0-2 hold pinned pages; 3-5 are on tier 1; the interleaved ones do not move.
        let movable: Vec<usize> = (0..11).filter(|&c| places[c].1).collect();
        assert_eq!(movable, vec![3, 4, 5]);
        assert!(places[3..6].iter().all(|p| p.0 == 1));
        // Promote cells 4 and then 3, one at a time as the scanner does: the ranges first
        // cut, then join the tier-0 range (the pinned prefix stays a prefix).
        r.retarget(4 * C, 5 * C, 0, 2);
        assert_eq!(r.ranges.len(), 5);
        r.retarget(3 * C, 4 * C, 0, 2);
        let hows: Vec<(u64, u64, How, u64)> = r
            .ranges
            .iter()
            .map(|a| (a.offset / C, a.len / C, a.how, a.pinned))
            .collect();
        assert_eq!(
            hows,
            vec![
                (0, 5, How::Tier(0), 5 * C / 2),
                (5, 1, How::Tier(1), 0),
                (6, 4, How::Stripes, 0)
            ]
        );
        assert_eq!(r.planned(2), vec![5 * C + 3 * C, C + C + 4096]);
        // The region's short last cell is movable once the range reaching the end is on
        // one tier.
        r.retarget(6 * C, 10 * C + 4096, 1, 2);
        assert!(r.cell_places()[10].1 && r.cell_places()[10].0 == 1);
    }
}
