//! `attune topology`: memory nodes and tiers from /sys.

#[derive(clap::Args)]
pub struct Args {
    /// Root of a captured tree (default: this machine).
    #[arg(long, default_value = "/")]
    root: std::path::PathBuf,
    #[arg(long)]
    json: bool,
}

pub fn run(a: Args) -> i32 {
    let t = attune::topology::discover(&a.root);
    if a.json {
        println!("{}", serde_json::to_string_pretty(&t).unwrap_or_default());
        return 0;
    }
    println!(
        "{:<5} {:<5} {:>10} {:>5} {:>9} {:>10}",
        "node", "cpus", "memory", "tier", "lat(ns)", "bw(MB/s)"
    );
    for n in &t.nodes {
        println!(
            "{:<5} {:<5} {:>10} {:>5} {:>9} {:>10}",
            n.id,
            if n.has_cpus { "yes" } else { "no" },
            attune::size::human(n.mem_total),
            n.memory_tier.map(|x| x.to_string()).unwrap_or("-".into()),
            n.read_latency_ns
                .map(|x| x.to_string())
                .unwrap_or("-".into()),
            n.read_bandwidth_mbps
                .map(|x| x.to_string())
                .unwrap_or("-".into())
        );
    }
    println!("tiers (fastest first): {:?}", t.tiers());
    println!(
        "weighted interleave: {}",
        if t.weighted_interleave { "yes" } else { "no" }
    );
    // The far tiers a process started here gets, and why (this machine only: the choice
    // looks at its scratch directories and attuned's socket, not at a captured tree).
    if a.root == std::path::Path::new("/") {
        match attune::config::load_from_process(None) {
            Ok(c) => println!("far tiers: {}", c.far_summary()),
            Err(e) => println!("far tiers: the configuration is refused: {e}"),
        }
    }
    0
}
