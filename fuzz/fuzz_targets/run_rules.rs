//! `attune run`'s settings from the environment: flags, the size rules
//! (`--rules "..64M:LAT,1G..:CAP"`), threshold, chunk, fault mode, as the interposer reads
//! them in every process it starts.
//!
//! Input: lines of `NAME=value`. Checked: no panic; accepted rules are non-empty ranges
//! and the flags for any size come from them or the defaults; sizes print and parse back.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    // Sizes alone: what parses prints and parses back to within the unit it printed.
    if let Ok(n) = attune::size::parse_size(text) {
        let again = attune::size::parse_size(&n.to_string()).expect("a number parses");
        assert_eq!(again, n);
    }
    let _ = attune::size::parse_size_or_percent(text, 1 << 40);
    if let Ok(rules) = attune::run_options::parse_rules(text) {
        for r in &rules {
            assert!(r.min < r.max, "empty range accepted: {text:?}");
        }
    }
    let env: Vec<(&str, &str)> = text.lines().filter_map(|l| l.split_once('=')).collect();
    let getenv = |k: &str| {
        env.iter()
            .find(|(n, _)| *n == k)
            .map(|(_, v)| v.to_string())
    };
    if let Ok(s) = attune::run_options::from_env(getenv) {
        for shift in [0u32, 12, 20, 26, 30, 40, 63] {
            let size = 1usize.checked_shl(shift).unwrap_or(usize::MAX);
            let _ = s.flags_for(size);
            let _ = s.predicted_for(size);
        }
    }
});
