//! The runtime's configuration: a TOML file and `ATTUNE_*` variables, as every process
//! under Attune reads them at start.
//!
//! Input: text; up to the first NUL byte it is the TOML file, after it lines of
//! `NAME=value` are the environment. Checked: no panic; an accepted configuration holds
//! its invariants (a budget, at least one tier, chunk sizes powers of two within bounds,
//! watermarks ordered), and its warnings can be computed.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (file, env) = text.split_once('\0').unwrap_or((text, ""));
    let env: Vec<(String, String)> = env
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let m = attune::config::Machine {
        total_memory: 8 << 30,
        memory_limit: u64::MAX,
        tmpdir: "/nonexistent-tmp".into(),
        // No NUMA node, no scratch found: `far = "auto"` falls back to a file in /tmp.
        far_offer: Some(Default::default()),
    };
    let with_file = (!file.is_empty()).then_some(("fuzz.toml", file));
    let Ok(cfg) = attune::config::load_text(with_file, &env, &m) else {
        return;
    };
    check(&cfg);
    let _ = attune::config::warnings(&cfg, &env, &m);
});

/// What the runtime assumes of an accepted configuration without checking again.
fn check(c: &attune::config::Config) {
    let pow2 = |n: usize| n.is_power_of_two() && (4096..=2 << 20).contains(&n);
    assert!(c.dram > 0, "a zero budget accepted");
    assert!(pow2(c.chunk_size), "chunk {}", c.chunk_size);
    assert!(
        (0.0..=1.0).contains(&c.pin_fraction),
        "pin_fraction {}",
        c.pin_fraction
    );
    let mut names = std::collections::HashSet::new();
    for t in &c.tiers {
        assert!(names.insert(t.name.as_str()), "tier {} twice", t.name);
        assert!(
            pow2(t.min_chunk),
            "tier {} min_chunk {}",
            t.name,
            t.min_chunk
        );
        assert!(!t.name.is_empty(), "a tier without a name");
    }
}
