//! What write heat costs (docs/benchmarks-history.md, "Write heat and promotion on NUMA tiers"):
//! `cargo run --release -p attune-sys --example write_heat_cost [MiB] [rounds]`.
//!
//! A populated region of MiB (default 1024): per round, the time to arm it all, of one
//! PAGEMAP_SCAN when nothing was written and when every page was, and the application's
//! cost of writing one word per page armed and not tracked, side by side in one run.
use attune_sys::{mem, pagemap::WriteTracker};
use std::time::Instant;

fn write_pages(base: usize, len: usize, v: u64) -> f64 {
    let t = Instant::now();
    for off in (0..len).step_by(4096) {
        // SAFETY: inside a live mapping this program owns.
        unsafe { ((base + off) as *mut u64).write_volatile(v) };
    }
    t.elapsed().as_nanos() as f64 / (len / 4096) as f64
}

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let mib = args.first().copied().unwrap_or(1024);
    let rounds = args.get(1).copied().unwrap_or(3);
    let len = mib << 20;
    let t = WriteTracker::open().expect("asynchronous write-protection (Linux 6.7+)");
    let plain = mem::map_anon(len, false).unwrap();
    let tracked = mem::map_anon(len, false).unwrap();
    for b in [plain, tracked] {
        mem::advise(b, len, mem::MADV_NOHUGEPAGE).unwrap();
        write_pages(b, len, 1);
    }
    t.track(tracked, len).unwrap();
    let mut out = Vec::new();
    println!("region {mib} MiB, {} pages", len / 4096);
    for round in 0..rounds {
        let s = Instant::now();
        t.arm(tracked, len).unwrap();
        let arm = s.elapsed().as_secs_f64() * 1e3;
        out.clear();
        let s = Instant::now();
        t.written(tracked, len, &mut out).unwrap();
        let idle = s.elapsed().as_secs_f64() * 1e3;
        assert!(out.is_empty(), "nothing was written");
        let w_plain = write_pages(plain, len, round as u64);
        let w_tracked = write_pages(tracked, len, round as u64);
        let s = Instant::now();
        t.written(tracked, len, &mut out).unwrap();
        let full = s.elapsed().as_secs_f64() * 1e3;
        let pages: usize = out.iter().map(|r| r.1 / 4096).sum();
        assert_eq!(pages, len / 4096, "every page was written");
        println!(
            "round {round}: arm {arm:.2} ms; scan, nothing written {idle:.2} ms; scan, all written {full:.2} ms; \
             write one word per page: untracked {w_plain:.0} ns, armed {w_tracked:.0} ns (+{:.2} us)",
            (w_tracked - w_plain) / 1e3
        );
    }
}
