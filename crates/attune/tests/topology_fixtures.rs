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
}

#[test]
fn single_node_machine() {
    let t = discover(&fixture("single-node"));
    assert_eq!(t.nodes.len(), 1);
    assert_eq!(t.tiers(), vec![vec![0]]);
    assert!(!t.weighted_interleave);
    assert_eq!(t.demotion_enabled, None);
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
