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
    let (base, file, path) = match (v1, v2) {
        (Some(p), _) => ("/sys/fs/cgroup/memory", "memory.limit_in_bytes", p),
        (None, Some(p)) => ("/sys/fs/cgroup", "memory.max", p),
        _ => return u64::MAX,
    };
    let mut best = u64::MAX;
    let mut p = path.trim_end_matches('/');
    loop {
        if let Some(v) = read(&format!("{base}{p}/{file}")) {
            // v1 writes "no limit" as a page-rounded i64::MAX, v2 as "max".
            if let Ok(x) = v.trim().parse::<u64>() {
                if x > 0 && x < 1 << 62 {
                    best = best.min(x);
                }
            }
        }
        match p.rfind('/') {
            Some(i) => p = &p[..i],
            None => break,
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists() {
        assert_eq!(parse_list("0-2,5,7-8"), vec![0, 1, 2, 5, 7, 8]);
        assert_eq!(parse_list(""), Vec::<u32>::new());
    }
}
