//! `attune doctor`: what this kernel offers Attune, which paths run, and what each
//! missing feature costs (docs/design/kernels.md; figures in docs/benchmarks.md).

use attune_sys::kernel::{self, FEATURES};
use attune_sys::uffd::Uffd;
use serde_json::json;

#[derive(clap::Args)]
pub struct Args {
    #[arg(long)]
    json: bool,
}

pub fn run(a: Args) -> i32 {
    // The mask in force, as the runtime would read it (a bad one is the same error).
    let mask = match attune::config::load_from_process(None) {
        Ok(c) => c.kernel_features,
        Err(e) => {
            eprintln!("attune: configuration error: {e}");
            return 2;
        }
    };
    kernel::set_mask(mask);
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    let uffd = Uffd::open_exact(0);
    let (uffd_ok, user_mode_only, uffd_err) = match &uffd {
        Ok(u) => (true, u.user_mode_only, String::new()),
        Err(e) => (false, false, e.errno.to_string()),
    };
    let raw = Uffd::probe_features_unmasked().unwrap_or(0);
    // Tried as the engine tries it (a seccomp profile can refuse what the kernel has).
    let write_protect = uffd
        .as_ref()
        .is_ok_and(|u| attune_sys::probe::write_protect_works(u).is_ok());
    let offered = attune_sys::probe::offered_from(raw);
    // Offered but refused when used (a seccomp profile): the runtime masks them at start.
    let refused = attune_sys::probe::broken();
    let refused_bits = refused.iter().fold(0, |m, (b, _)| m | b);
    let in_use = offered & !mask & !refused_bits;
    let engine = uffd_ok && (in_use & kernel::MOVE != 0 || write_protect);
    let rows: Vec<_> = FEATURES
        .iter()
        .map(|f| {
            let state = if in_use & f.bit != 0 {
                "used"
            } else if refused_bits & f.bit != 0 {
                "refused"
            } else if offered & f.bit != 0 {
                "masked"
            } else {
                "absent"
            };
            json!({
                "feature": f.name, "since": f.since, "state": state,
                "path": if state == "used" { f.gives } else { f.fallback },
                "cost": if state == "used" { "" } else { f.cost },
            })
        })
        .collect();
    if a.json {
        let v = json!({
            "kernel": release,
            "userfaultfd": uffd_ok,
            "userfaultfd_error": uffd_err,
            "user_mode_only": user_mode_only,
            "write_protect": write_protect,
            "mask": kernel::mask_string(mask),
            "refused": refused.iter().map(|(b, e)| json!({
                "feature": FEATURES.iter().find(|f| f.bit == *b).map_or("?", |f| f.name),
                "error": e.to_string(),
            })).collect::<Vec<_>>(),
            "fault_engine": engine,
            "features": rows,
            "fallbacks": kernel::fallbacks(in_use),
        });
        println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
        return 0;
    }
    println!("kernel {release}");
    match (uffd_ok, user_mode_only) {
        (false, _) => println!(
            "userfaultfd: not available ({uffd_err}): no tiering; the runtime runs on plain DRAM"
        ),
        (true, true) => println!(
            "userfaultfd: user-mode faults only (vm.unprivileged_userfaultfd=0): system calls on \
             far memory are held and retried by the interposer"
        ),
        (true, false) => println!("userfaultfd: yes, kernel-mode faults too"),
    }
    println!(
        "write-protect of anonymous memory (5.7): {}",
        if write_protect { "yes" } else { "no" }
    );
    if mask != 0 {
        println!("mask (kernel_features): {}", kernel::mask_string(mask));
    }
    for (bit, errno) in &refused {
        let name = FEATURES
            .iter()
            .find(|f| f.bit == *bit)
            .map_or("?", |f| f.name);
        println!(
            "{name}: offered by the kernel but refused when used ({errno}); its fallback runs"
        );
    }
    println!();
    println!(
        "{:<20} {:<6} {:<7} path in use",
        "feature", "since", "state"
    );
    for (f, r) in FEATURES.iter().zip(&rows) {
        println!(
            "{:<20} {:<6} {:<7} {}",
            f.name,
            f.since,
            r["state"].as_str().unwrap_or(""),
            r["path"].as_str().unwrap_or("")
        );
        if let Some(c) = r["cost"].as_str().filter(|c| !c.is_empty()) {
            println!("{:<35}cost: {c}", "");
        }
    }
    println!();
    println!(
        "fault engine: {}",
        if engine {
            "runs"
        } else if uffd_ok {
            "cannot run: neither UFFDIO_MOVE nor anonymous write-protect (Linux 5.10 or newer is needed)"
        } else {
            "cannot run (no userfaultfd)"
        }
    );
    0
}
