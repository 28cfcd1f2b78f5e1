//! The budget follows the memory cgroup's usage (`follow_limit`). At start the budget is
//! held under the limit less `limit_room` (`config::Machine`); a program that then holds
//! more outside Attune's pages (an interpreter's heap, its libraries, another process of
//! the job) would reach the limit, where the kernel reclaims cache and then kills. The
//! background evictor reads the group on its tick and caps the budget at what is left
//! (`attune_policy::budget::cgroup_cap`); the evictor then moves the difference out.
//! Found with bench/ensemble.py: DM at half its peak under the Slurm plugin's default
//! budget was OOM-killed (docs/design/paging.md, "Budgets under a memory cgroup").

use super::Pager;
use crate::config::TierKind;
use crate::topology::{limiting_cgroup, CgroupMemory};
use attune_policy::budget::{self, CgroupReading};
use std::sync::atomic::Ordering::Relaxed;

fn read(p: &str) -> Option<String> {
    std::fs::read_to_string(p).ok()
}

/// This process's resident set (bytes), from `/proc/self/statm`.
fn own_rss() -> Option<u64> {
    let s = read("/proc/self/statm")?;
    let pages: u64 = s.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * attune_sys::page_size() as u64)
}

/// The evictor's view of the group: where it is, what was held
/// outside at the last reading, and the limit its wake-up thresholds were set for.
pub(crate) struct LimitWatch {
    group: Option<CgroupMemory>,
    /// `/proc/self/cgroup` when the group was found, and when it was last read (ns): a
    /// process moved to another group (a job's step, an admin's `cgclassify`) follows the
    /// new one's limit within a second.
    path: String,
    path_read: u64,
    /// The last reading: when (ns), outside and ours; and the growth rate.
    last: Option<(u64, u64, u64)>,
    /// The last rate's basis was this process's own memory (it had peers), and the
    /// growth figures of the recent readings (ns, bytes; a ring, `hist_at` the next
    /// slot): each reading measures the growth since the newest of them 20 ms old or
    /// more (`budget::OWN_RATE_WINDOW_NS`).
    own_basis: bool,
    hist: [(u64, u64); 16],
    hist_at: usize,
    rate: u64,
    thresholds_for: u64,
    near: bool,
    warned: bool,
}

impl LimitWatch {
    /// A watch with its first reading done, and how long it may wait before the next.
    /// `Engine::start` reads before any page is placed (after the daemon's welcome, which
    /// tells of the group's other runtimes) and hands the watch to the evictor
    /// (`evictor_loop`), so the cap holds from the first fault: the evictor's
    /// first reading came 50 ms later (its first wait), and programs starting together
    /// in one group filled their grants before it: 1-5 of six or eight were killed by
    /// its limit in every run (docs/design/paging.md, "Several runtimes in one group").
    /// A forked child's evictor reads at once.
    pub(crate) fn read(e: &Pager) -> (LimitWatch, i32) {
        let mut w = LimitWatch::new(e);
        let wait = w.tick(e);
        (w, wait)
    }

    /// The group whose limit is the tightest on this process's path; none without a limit
    /// or with `follow_limit` off.
    pub(crate) fn new(e: &Pager) -> LimitWatch {
        let mut w = LimitWatch {
            group: None,
            path: String::new(),
            path_read: 0,
            last: None,
            own_basis: false,
            hist: [(0, 0); 16],
            hist_at: 0,
            rate: 0,
            thresholds_for: 0,
            near: false,
            warned: false,
        };
        w.find(e);
        w
    }

    /// Reads which groups the process is in and, when that changed since the last look,
    /// finds the one whose limit is the tightest again (None: no limit, no cap).
    fn find(&mut self, e: &Pager) {
        if !e.cfg.follow_limit {
            return;
        }
        self.path_read = attune_sys::os::now_ns();
        let cgroup = read("/proc/self/cgroup").unwrap_or_default();
        if !self.path.is_empty() && cgroup == self.path {
            return;
        }
        let moved = !self.path.is_empty();
        self.path = cgroup;
        let found = limiting_cgroup(&self.path, &read);
        if moved {
            crate::info!(
                "the process moved to another memory cgroup: the budget follows {}",
                found
                    .as_ref()
                    .map_or("no limit".to_string(), |(l, g)| format!(
                        "{} ({} MiB)",
                        g.dir,
                        l >> 20
                    ))
            );
            self.last = None;
            self.rate = 0;
            self.near = false;
            self.thresholds_for = 0;
        }
        match found {
            Some((limit, g)) => {
                e.cgroup.limit.store(limit, Relaxed);
                self.group = Some(g);
            }
            None => {
                self.group = None;
                e.cgroup.limit.store(0, Relaxed);
                e.set_cgroup_cap(u64::MAX);
            }
        }
    }

    /// Under cgroup v1, asks the kernel to wake the evictor (its eventfd) when the group's
    /// usage crosses levels below the limit (`cgroup.event_control`): a program can grow
    /// faster than any polling. The file is root's alone on this machine's kernel (mode
    /// 0200), and v2 has no such thresholds: for a user the 5 ms reading near the limit is
    /// all, which held 50 runs of 50 (docs/design/paging.md). Failures only cost that.
    fn set_thresholds(&mut self, e: &Pager, g: &CgroupMemory, limit: u64) {
        if !g.v1 || limit == u64::MAX || limit == self.thresholds_for {
            return;
        }
        self.thresholds_for = limit;
        let usage = match std::fs::File::open(format!("{}/memory.usage_in_bytes", g.dir)) {
            Ok(f) => f,
            Err(_) => return,
        };
        let ctl = std::fs::OpenOptions::new()
            .write(true)
            .open(format!("{}/cgroup.event_control", g.dir));
        let mut ctl = match ctl {
            Ok(c) => c,
            Err(err) => {
                // Root's only on recent kernels (mode 0200): then polling is all there is.
                crate::info!("memory cgroup thresholds not set ({err}): read every 5 ms near the limit instead");
                return;
            }
        };
        use std::io::Write;
        use std::os::fd::AsRawFd;
        for t in budget::cgroup_thresholds(limit) {
            // One registration per write; the kernel holds the eventfd, not the usage file.
            let line = format!("{} {} {t}", e.wake_evictor.raw_fd(), usage.as_raw_fd());
            if let Err(err) = ctl.write_all(line.as_bytes()) {
                crate::info!("memory cgroup thresholds not set ({err}): read every 5 ms near the limit instead");
                return;
            }
        }
    }

    /// Reads the group and applies the cap; returns how long the evictor may wait (ms).
    pub(crate) fn tick(&mut self, e: &Pager) -> i32 {
        // This process's pages on its group's board, when attuned gave one (followed
        // limit or not: the group's other runtimes read them).
        if let Some(b) = e.cgroup.board() {
            b.publish(e.resident.load(Relaxed));
        }
        if e.cfg.follow_limit
            && attune_sys::os::now_ns().saturating_sub(self.path_read) >= 1_000_000_000
        {
            self.find(e);
        }
        let Some(g) = self.group.clone() else {
            return 50;
        };
        // Resident bytes before and after the reading, the larger kept: a region freed
        // between them leaves the kernel's usage lower than `resident` read first, and
        // counting it as outside would cut the budget to nothing for one reading.
        let before = e.resident.load(Relaxed);
        let Some(s) = g.sample(&read) else {
            // The group is gone (the job's directory removed): look again at once, and
            // until then no cap.
            self.group = None;
            self.near = false;
            e.set_cgroup_cap(u64::MAX);
            self.path_read = 0;
            return 50;
        };
        let (mut ours, mut reserved) = (before.max(e.resident.load(Relaxed)), 0u64);
        for t in e
            .tiers
            .iter()
            .filter(|t| matches!(t.cfg.kind, TierKind::Memory | TierKind::Numa))
        {
            ours = ours.saturating_add(t.counters.stored.load(Relaxed));
            reserved = reserved.saturating_add(t.capacity());
        }
        let mut r = CgroupReading {
            limit: s.limit,
            usage: s.usage,
            reclaimable: s.reclaimable,
            ours,
            reserved,
            rate: 0,
            peers: e.cgroup.peers.load(Relaxed),
            peer_runtimes: e.cgroup.peer_runtimes.load(Relaxed),
        };
        // The others' pages as they are now, not as the daemon last pushed them.
        if let Some(b) = e.cgroup.board() {
            (r.peers, r.peer_runtimes) = b.peers();
        }
        let now = attune_sys::os::now_ns();
        // The growth the margin must outrun. Alone in its group: the group's outside.
        // With peers: this process's own memory beyond its managed pages (its resident
        // set less `ours`). The group's outside then also moves with every peer's faults
        // and evictions between the daemon's reports: read 5 ms apart, that jitter was
        // taken for 2-16 GB/s of growth and held the margin at a quarter of the limit in
        // `bench/fig7.py --policies pool` (docs/design/paging.md, "Several runtimes in
        // one group"). The level stays the group's: the excess is counted from its usage.
        let own = r.peers > 0;
        // A region just freed whose pages the kernel still counts is ours for this reading,
        // in the level and in the growth: read as growth, a program's free at exit (97 MiB
        // within one reading) made 1 GB/s, and the margin cut its budget by a tenth.
        if let Some((_, outside, prev_ours)) = self.last {
            r.ours += budget::cgroup_lag(outside, r.outside(), prev_ours, ours);
        }
        // Alone, the group's outside less its dirty file pages: a buffered file tier's
        // stores wait for write-back (not reclaimable) and then leave, MiBs up and down
        // between readings 5 ms apart, which read as hundreds of MB/s and held the
        // margin wide (`test_a_budget_above_the_limit_is_lowered_and_the_program_finishes`
        // ended 13-20 MiB under its cap). They count in the level, not in the growth.
        let grows = if own {
            own_rss().map_or(r.outside(), |rss| rss.saturating_sub(ours))
        } else {
            r.outside().saturating_sub(s.dirty)
        };
        if let Some((t, _, _)) = self.last {
            if own != self.own_basis {
                // A change of basis (peers came or went) is not growth. A rate taken from
                // the group's outside before the daemon told of peers was their faults,
                // not this program's: it is dropped, or it held the margin wide for
                // seconds (halved every 500 ms). The own rate is kept when peers go: the
                // group's outside grows at least by it.
                self.hist = [(0, 0); 16];
                if own {
                    self.rate = 0;
                }
            } else if let Some(&(t0, g0)) = self
                .hist
                .iter()
                .filter(|&&(t0, _)| t0 > 0 && now.saturating_sub(t0) >= budget::OWN_RATE_WINDOW_NS)
                .max_by_key(|&&(t0, _)| t0)
            {
                self.rate = budget::cgroup_rate_over(
                    self.rate,
                    grows.saturating_sub(g0),
                    now - t0,
                    now - t,
                );
            }
            r.rate = self.rate;
        }
        self.hist[self.hist_at] = (now, grows);
        self.hist_at = (self.hist_at + 1) % self.hist.len();
        self.last = Some((now, r.outside(), ours));
        self.own_basis = own;
        self.set_thresholds(e, &g, s.limit);
        let st = &e.cgroup;
        st.limit
            .store(if s.limit == u64::MAX { 0 } else { s.limit }, Relaxed);
        st.outside_peak.fetch_max(r.outside(), Relaxed);
        let now_cap = e.cgroup_cap();
        let cap = budget::cgroup_cap(&r, now_cap);
        if cap != now_cap {
            let before = e.budget();
            let after = e.set_cgroup_cap(cap);
            if after < before {
                st.lowered.fetch_add(1, Relaxed);
                let low = st.lowest_budget.load(Relaxed);
                if low == 0 || after < low {
                    st.lowest_budget.store(after, Relaxed);
                }
                self.say(e, &r, before, after);
            }
        }
        self.near = budget::cgroup_near(&r);
        budget::cgroup_check_ms(&r, e.budget()) as i32
    }

    /// Whether the group held within two margins of its limit at the last reading.
    pub(crate) fn near(&self) -> bool {
        self.near
    }

    /// Says once, as a warning, that the cgroup lowered the budget (with the figures a
    /// user needs to size `--mem` or `limit_room`); later changes go to the info log.
    fn say(&mut self, e: &Pager, r: &CgroupReading, before: u64, after: u64) {
        let text = format!(
            "the memory cgroup's limit ({} MiB) leaves less than the budget: {} MiB held outside Attune's pages; DRAM budget lowered from {} to {} MiB (follow_limit)",
            r.limit >> 20,
            r.outside() >> 20,
            before >> 20,
            after >> 20
        );
        if !self.warned && after + (4 << 20) < e.granted_budget() {
            self.warned = true;
            crate::warn!("{text}; a larger --mem or a smaller --dram avoids the moves");
        } else {
            crate::info!("{text}");
        }
    }
}
