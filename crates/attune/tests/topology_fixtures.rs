//! Replays captured /sys trees (tests/fixtures/sysfs/*) against expected topologies.

use attune_core::topology::discover;
use std::path::PathBuf;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/sysfs")
        .join(name)
}

#[test]
fn qemu_two_node_guest_with_hmat() {
    let t = discover(&fixture("qemu-2node-hmat"));
    assert_eq!(t.nodes.len(), 2);
    assert!(
        t.nodes[0].has_cpus && !t.nodes[1].has_cpus,
        "node 1 is CPU-less"
    );
    assert_eq!(t.nodes[1].memory_tier, Some(46));
    assert_eq!(t.nodes[1].read_latency_ns, Some(250));
    assert_eq!(t.nodes[1].read_bandwidth_mbps, Some(30720));
    assert_eq!(t.nodes[0].mem_total, 1015808 * 1024);
    assert_eq!(t.nodes[1].distance, vec![20, 10]);
    assert!(t.weighted_interleave);
    assert_eq!(t.demotion_enabled, Some(false));
    assert_eq!(t.tiers(), vec![vec![0], vec![1]]);
    // 100 GB/s of DRAM beside 30 GB/s of CXL: DRAM serves 77% of the bandwidth.
    assert_eq!(t.dram_bandwidth_pct(), Some(77));
}

#[test]
fn single_node_machine() {
    let t = discover(&fixture("single-node"));
    assert_eq!(t.nodes.len(), 1);
    assert_eq!(t.tiers(), vec![vec![0]]);
    assert!(!t.weighted_interleave);
    assert_eq!(t.demotion_enabled, None);
    assert_eq!(
        t.dram_bandwidth_pct(),
        None,
        "one tier: DRAM is all the bandwidth"
    );
}

#[test]
fn cxl_and_pmem_without_kernel_tiers_ordered_by_hmat() {
    let t = discover(&fixture("cxl-dax-kmem-3node"));
    assert_eq!(t.nodes.len(), 3);
    assert!(t.nodes.iter().all(|n| n.memory_tier.is_none()));
    assert_eq!(
        t.tiers(),
        vec![vec![0], vec![1], vec![2]],
        "fastest first by HMAT latency"
    );
    // 200 GB/s DRAM, 50 GB/s CXL, 20 GB/s PMem.
    assert_eq!(t.dram_bandwidth_pct(), Some(74));
}

#[test]
fn missing_tree_gives_empty_topology() {
    let t = discover(&fixture("does-not-exist"));
    assert!(t.nodes.is_empty());
}

#[test]
fn this_machine_has_at_least_one_node() {
    let t = discover(std::path::Path::new("/"));
    assert!(!t.nodes.is_empty());
}

fn config(toml: &str) -> attune_core::config::Config {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("c.toml");
    std::fs::write(&p, toml).unwrap();
    let m = attune_core::config::Machine {
        total_memory: 2 << 30,
        memory_limit: u64::MAX,
        tmpdir: std::env::temp_dir(),
        far_offer: Some(Default::default()),
    };
    attune_core::config::load(Some(&p), &[], &m).unwrap()
}

const NUMA_CFG: &str =
    "dram = \"512M\"\n[[tier]]\nname = \"cxl\"\nkind = \"numa\"\nnode = 1\ncapacity = \"900M\"\n";

#[test]
fn numa_tiers_from_the_guest_tree_use_hmat_bandwidth() {
    let topo = discover(&fixture("qemu-2node-hmat"));
    let t = attune_core::numa::tiers_for(&config(NUMA_CFG), &topo);
    assert_eq!(t.len(), 2);
    assert_eq!((t[0].nodes.clone(), t[0].capacity), (vec![0], 512 << 20));
    assert_eq!((t[1].nodes.clone(), t[1].capacity), (vec![1], 900 << 20));
    // HMAT: 100 GB/s and 30 GB/s, in MB/s.
    assert_eq!((t[0].bandwidth, t[1].bandwidth), (102400, 30720));
    let w = attune_core::numa::bandwidth_weights(&t);
    assert_eq!(w.into_iter().collect::<Vec<_>>(), vec![(0, 10), (1, 3)]);
}

#[test]
fn numa_tier_on_a_missing_or_fast_node_is_left_out() {
    let topo = discover(&fixture("qemu-2node-hmat"));
    let missing = NUMA_CFG.replace("node = 1", "node = 7");
    assert_eq!(
        attune_core::numa::tiers_for(&config(&missing), &topo).len(),
        1
    );
    let fast = NUMA_CFG.replace("node = 1", "node = 0");
    let t = attune_core::numa::tiers_for(&config(&fast), &topo);
    assert_eq!(t.len(), 1, "node 0 holds the CPUs: it is the fast tier");
    // No HMAT on a single-node machine: configured bandwidth (default 30 GB/s) is used.
    let one = discover(&fixture("single-node"));
    assert_eq!(
        attune_core::numa::tiers_for(&config(NUMA_CFG), &one).len(),
        1
    );
}

#[test]
fn numa_tiers_on_cxl_and_pmem_take_hmat_over_configuration() {
    let topo = discover(&fixture("cxl-dax-kmem-3node"));
    let cfg = "dram = \"1G\"\n[[tier]]\nname = \"cxl\"\nkind = \"numa\"\nnode = 1\nbandwidth = \"25G\"\n[[tier]]\nname = \"pmem\"\nkind = \"numa\"\nnode = 2\nbandwidth = \"5G\"\n";
    let t = attune_core::numa::tiers_for(&config(cfg), &topo);
    let names: Vec<_> = t.iter().map(|x| x.name.as_str()).collect();
    assert_eq!(names, vec!["dram", "cxl", "pmem"]);
    // Every node has HMAT attributes: they win over the configured 25G/5G.
    let bw: Vec<u64> = t.iter().map(|x| x.bandwidth).collect();
    assert_eq!(bw, vec![204800, 51200, 20480]);
}
