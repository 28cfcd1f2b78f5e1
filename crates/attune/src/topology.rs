//! Discovery of memory nodes and tiers from sysfs (`/sys/devices/system/node`,
//! `/sys/devices/virtual/memory_tiering`, HMAT `access0/initiators`).
//!
//! Everything reads below a root directory so tests replay captured trees
//! (`tests/fixtures/sysfs/*`), as hwloc does.

use std::path::Path;

#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct NumaNode {
    pub id: u32,
    /// False for a CPU-less node (CXL expander, PMem as kmem DAX).
    pub has_cpus: bool,
    pub mem_total: u64,
    /// Linux memory tier id (lower is faster), if the kernel groups nodes into tiers.
    pub memory_tier: Option<u32>,
    /// HMAT access attributes from the nearest initiator (ns, MB/s).
    pub read_latency_ns: Option<u64>,
    pub write_latency_ns: Option<u64>,
    pub read_bandwidth_mbps: Option<u64>,
    pub write_bandwidth_mbps: Option<u64>,
    /// SLIT distances to every node, in node order.
    pub distance: Vec<u32>,
}

#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Topology {
    pub nodes: Vec<NumaNode>,
    /// Whether the kernel offers weighted interleave (`/sys/kernel/mm/mempolicy/weighted_interleave`).
    pub weighted_interleave: bool,
    /// Whether demotion between tiers is enabled (`/sys/kernel/mm/numa/demotion_enabled`).
    pub demotion_enabled: Option<bool>,
}

impl Topology {
    /// Nodes grouped by memory tier, fastest first; a machine without tier information
    /// orders by HMAT latency, then distance from node 0.
    pub fn tiers(&self) -> Vec<Vec<u32>> {
        let mut nodes = self.nodes.clone();
        nodes.sort_by_key(|n| {
            (
                n.memory_tier.unwrap_or(u32::MAX),
                n.read_latency_ns.unwrap_or(0),
                n.distance.first().copied().unwrap_or(0),
                n.id,
            )
        });
        let mut out: Vec<Vec<u32>> = Vec::new();
        let mut last: Option<(Option<u32>, Option<u64>)> = None;
        for n in nodes {
            let key = (
                n.memory_tier,
                if n.memory_tier.is_some() {
                    None
                } else {
                    n.read_latency_ns
                },
            );
            if last == Some(key) {
                out.last_mut().unwrap().push(n.id);
            } else {
                out.push(vec![n.id]);
                last = Some(key);
            }
        }
        out
    }
}

impl Topology {
    /// DRAM's share of the node's memory read bandwidth, percent: the fastest tier's nodes
    /// against all nodes, from HMAT. None when there is one tier only, or a node without
    /// a bandwidth attribute (mixing HMAT figures with guesses would compare unlike
    /// numbers).
    pub fn dram_bandwidth_pct(&self) -> Option<u64> {
        let tiers = self.tiers();
        if tiers.len() < 2 {
            return None;
        }
        let mut fast = 0u64;
        let mut all = 0u64;
        for n in &self.nodes {
            let bw = n.read_bandwidth_mbps.filter(|&b| b > 0)?;
            all += bw;
            if tiers[0].contains(&n.id) {
                fast += bw;
            }
        }
        Some(((fast as u128 * 100 + all as u128 / 2) / all as u128).clamp(1, 100) as u64)
    }
}

fn read_trim(p: &Path) -> Option<String> {
    std::fs::read_to_string(p)
        .ok()
        .map(|s| s.trim().to_string())
}

fn read_u64(p: &Path) -> Option<u64> {
    read_trim(p)?.parse().ok()
}

/// Parses a kernel list like "0-3,8,10-11".
pub fn parse_list(s: &str) -> Vec<u32> {
    let mut v = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                if let (Ok(a), Ok(b)) = (a.parse::<u32>(), b.parse::<u32>()) {
                    v.extend(a..=b);
                }
            }
            None => {
                if let Ok(a) = part.parse() {
                    v.push(a);
                }
            }
        }
    }
    v
}

/// Reads the topology below `root` (use "/" for the running machine).
pub fn discover(root: &Path) -> Topology {
    let node_dir = root.join("sys/devices/system/node");
    let mut ids: Vec<u32> = match read_trim(&node_dir.join("online")) {
        Some(s) => parse_list(&s),
        None => Vec::new(),
    };
    if ids.is_empty() {
        if let Ok(rd) = std::fs::read_dir(&node_dir) {
            ids = rd
                .flatten()
                .filter_map(|e| e.file_name().to_str()?.strip_prefix("node")?.parse().ok())
                .collect();
            ids.sort();
        }
    }
    // memory_tierN/nodelist
    let mut tier_of = std::collections::HashMap::new();
    if let Ok(rd) = std::fs::read_dir(root.join("sys/devices/virtual/memory_tiering")) {
        for e in rd.flatten() {
            let name = e.file_name();
            let Some(t) = name
                .to_str()
                .and_then(|n| n.strip_prefix("memory_tier"))
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            let list = read_trim(&e.path().join("nodelist"))
                .or_else(|| read_trim(&e.path().join("nodes")))
                .unwrap_or_default();
            for n in parse_list(&list) {
                tier_of.insert(n, t);
            }
        }
    }
    let mut nodes = Vec::new();
    for id in ids {
        let d = node_dir.join(format!("node{id}"));
        if !d.is_dir() {
            continue;
        }
        let has_cpus = read_trim(&d.join("cpulist"))
            .map(|s| !parse_list(&s).is_empty())
            .unwrap_or(false);
        let mem_total = read_trim(&d.join("meminfo"))
            .and_then(|m| {
                m.lines().find(|l| l.contains("MemTotal:")).and_then(|l| {
                    l.split_whitespace()
                        .rev()
                        .nth(1)
                        .and_then(|v| v.parse::<u64>().ok())
                })
            })
            .map(|kb| kb * 1024)
            .unwrap_or(0);
        let acc = d.join("access0/initiators");
        let distance = read_trim(&d.join("distance"))
            .map(|s| {
                s.split_whitespace()
                    .filter_map(|x| x.parse().ok())
                    .collect()
            })
            .unwrap_or_default();
        nodes.push(NumaNode {
            id,
            has_cpus,
            mem_total,
            memory_tier: tier_of.get(&id).copied(),
            read_latency_ns: read_u64(&acc.join("read_latency")),
            write_latency_ns: read_u64(&acc.join("write_latency")),
            read_bandwidth_mbps: read_u64(&acc.join("read_bandwidth")),
            write_bandwidth_mbps: read_u64(&acc.join("write_bandwidth")),
            distance,
        });
    }
    let weighted_interleave = root
        .join("sys/kernel/mm/mempolicy/weighted_interleave")
        .is_dir()
        && !attune_sys::kernel::masked(attune_sys::kernel::WEIGHTED_INTERLEAVE);
    let demotion_enabled = read_trim(&root.join("sys/kernel/mm/numa/demotion_enabled"))
        .map(|s| s == "1" || s == "true" || s == "Y");
    Topology {
        nodes,
        weighted_interleave,
        demotion_enabled,
    }
}

/// The tightest memory limit on the cgroup path of a process (its `/proc/PID/cgroup`) and
/// its ancestors: cgroup v1's `memory.limit_in_bytes` under `/sys/fs/cgroup/memory`, else
/// v2's `memory.max`; u64::MAX when none is set. `read` reads a file (injected for tests).
/// The daemon bounds each claim by it (a job's processes cannot keep more DRAM than their
/// limit); the runtime keeps its budget and memory tier under it (`config::Machine`).
pub fn cgroup_memory_limit(cgroup: &str, read: &dyn Fn(&str) -> Option<String>) -> u64 {
    limiting_cgroup(cgroup, read).map_or(u64::MAX, |(l, _)| l)
}

/// The memory cgroup whose limit is the tightest on a process's path, and that limit.
pub fn limiting_cgroup(
    cgroup: &str,
    read: &dyn Fn(&str) -> Option<String>,
) -> Option<(u64, CgroupMemory)> {
    let mut v1 = None;
    let mut v2 = None;
    for l in cgroup.lines() {
        let mut f = l.splitn(3, ':');
        let (_, ctrls, path) = (f.next(), f.next().unwrap_or(""), f.next().unwrap_or(""));
        if ctrls.split(',').any(|c| c == "memory") {
            v1 = Some(path);
        } else if ctrls.is_empty() && l.starts_with("0::") {
            v2 = Some(path);
        }
    }
    let (base, v1, path) = match (v1, v2) {
        (Some(p), _) => ("/sys/fs/cgroup/memory", true, p),
        (None, Some(p)) => ("/sys/fs/cgroup", false, p),
        _ => return None,
    };
    let mut best: Option<(u64, CgroupMemory)> = None;
    let mut p = path.trim_end_matches('/');
    loop {
        let dir = format!("{base}{p}");
        let limit =
            read(&format!("{dir}/{}", CgroupMemory::limit_file(v1))).and_then(|v| parse_limit(&v));
        if let Some(x) = limit {
            if best.as_ref().map_or(true, |(b, _)| x < *b) {
                best = Some((x, CgroupMemory { dir, v1 }));
            }
        }
        match p.rfind('/') {
            Some(i) => p = &p[..i],
            None => break,
        }
    }
    best
}

/// A limit file's value; None for "no limit" (v1 writes a page-rounded i64::MAX, v2
/// "max") and for what does not parse.
fn parse_limit(v: &str) -> Option<u64> {
    v.trim()
        .parse::<u64>()
        .ok()
        .filter(|x| *x > 0 && *x < 1 << 62)
}

/// A memory cgroup directory (v1 or v2), read while a job runs: its limit may change, and
/// what the job holds beside the runtime's pages is what the budget must leave room for.
#[derive(Clone, Debug, PartialEq)]
pub struct CgroupMemory {
    pub dir: String,
    pub v1: bool,
}

/// One reading of a memory cgroup.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CgroupSample {
    /// u64::MAX: the limit was lifted.
    pub limit: u64,
    pub usage: u64,
    /// Page cache the kernel reclaims before it kills: file pages neither mapped by a
    /// process (programs' text and data: reclaiming them thrashes) nor dirty.
    pub reclaimable: u64,
    /// File pages dirty or under write-back: not reclaimable until written, and gone
    /// again once they are (a buffered file tier's stores come and go by MiBs).
    pub dirty: u64,
}

impl CgroupMemory {
    fn limit_file(v1: bool) -> &'static str {
        if v1 {
            "memory.limit_in_bytes"
        } else {
            "memory.max"
        }
    }

    /// Reads the limit, the usage and the reclaimable cache; None when the group is gone.
    pub fn sample(&self, read: &dyn Fn(&str) -> Option<String>) -> Option<CgroupSample> {
        let f = |name: &str| read(&format!("{}/{name}", self.dir));
        let usage_file = if self.v1 {
            "memory.usage_in_bytes"
        } else {
            "memory.current"
        };
        let usage = f(usage_file)?.trim().parse::<u64>().ok()?;
        let limit = f(Self::limit_file(self.v1))
            .and_then(|v| parse_limit(&v))
            .unwrap_or(u64::MAX);
        let (reclaimable, dirty) = f("memory.stat").map_or((0, 0), |s| file_pages(&s, self.v1));
        Some(CgroupSample {
            limit,
            usage,
            reclaimable,
            dirty,
        })
    }
}

/// Reclaimable page cache from a `memory.stat` (active and inactive file pages less the
/// mapped, dirty and writeback ones), and the dirty and writeback ones (v1's hierarchical
/// `total_*` rows; v2's rows are hierarchical already).
pub fn file_pages(stat: &str, v1: bool) -> (u64, u64) {
    let row = |key: &str| -> u64 {
        let key = if v1 {
            format!("total_{key}")
        } else {
            key.to_string()
        };
        stat.lines()
            .find_map(|l| {
                let (k, v) = l.split_once(' ')?;
                (k == key).then(|| v.trim().parse::<u64>().ok()).flatten()
            })
            .unwrap_or(0)
    };
    // Dirty and writeback pages wait for the disk before the kernel can take them (a
    // buffered file tier's stores are such pages).
    let (mapped, dirty) = if v1 {
        (row("mapped_file"), row("dirty") + row("writeback"))
    } else {
        (
            row("file_mapped"),
            row("file_dirty") + row("file_writeback"),
        )
    };
    let file = row("active_file") + row("inactive_file");
    (file.saturating_sub(mapped + dirty), dirty.min(file))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists() {
        assert_eq!(parse_list("0-2,5,7-8"), vec![0, 1, 2, 5, 7, 8]);
        assert_eq!(parse_list(""), Vec::<u32>::new());
    }

    #[test]
    fn the_limiting_cgroup_is_where_the_tightest_limit_is_and_is_read_there() {
        use std::collections::HashMap;
        let files: HashMap<&str, &str> = [
            ("/sys/fs/cgroup/memory/slurm/job_7/step_0/memory.limit_in_bytes", "209715200\n"),
            ("/sys/fs/cgroup/memory/slurm/job_7/memory.limit_in_bytes", "104857600\n"),
            ("/sys/fs/cgroup/memory/slurm/job_7/memory.usage_in_bytes", "73400320\n"),
            (
                "/sys/fs/cgroup/memory/slurm/job_7/memory.stat",
                "cache 1\nmapped_file 2\ntotal_cache 9\ntotal_mapped_file 3145728\ntotal_inactive_file 8388608\ntotal_active_file 2097152\n",
            ),
            ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n"),
        ]
        .into_iter()
        .collect();
        let read = |p: &str| files.get(p).map(|s| s.to_string());
        let (limit, cg) = limiting_cgroup("4:memory:/slurm/job_7/step_0\n", &read).unwrap();
        assert_eq!(limit, 100 << 20);
        assert_eq!(cg.dir, "/sys/fs/cgroup/memory/slurm/job_7");
        let s = cg.sample(&read).unwrap();
        // 8 + 2 MiB of file pages, 3 MiB of them mapped.
        assert_eq!(
            (s.limit, s.usage, s.reclaimable),
            (100 << 20, 70 << 20, 7 << 20)
        );
        // A group gone (the job ended) reads as None; a lifted limit as u64::MAX.
        let gone = CgroupMemory {
            dir: "/nowhere".into(),
            v1: true,
        };
        assert_eq!(gone.sample(&read), None);
        let lifted = |p: &str| {
            if p.ends_with("limit_in_bytes") {
                Some("9223372036854771712".into())
            } else {
                read(p)
            }
        };
        assert_eq!(cg.sample(&lifted).unwrap().limit, u64::MAX);
        // No limit anywhere: no limiting group.
        assert_eq!(limiting_cgroup("4:memory:/other\n", &read), None);
    }

    #[test]
    fn reclaimable_cache_is_unmapped_file_pages_in_both_versions() {
        let v2 = "anon 100\nfile 9\nactive_file 4096\ninactive_file 8192\nfile_mapped 1024\nfile_dirty 512\nfile_writeback 256\nshmem 77\n";
        assert_eq!(file_pages(v2, false), (10496, 768));
        // Mapped shared memory can count more mapped than file pages: never below zero.
        assert_eq!(
            file_pages("total_active_file 1\ntotal_mapped_file 5\n", true).0,
            0
        );
        assert_eq!(file_pages("garbage", true), (0, 0));
        // v1's own-group rows are not the hierarchy's.
        assert_eq!(file_pages("active_file 4096\n", true).0, 0);
    }
}
