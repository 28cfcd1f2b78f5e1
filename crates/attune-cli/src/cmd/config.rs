//! `attune config`: the configuration in force (as JSON) or the options table.

use attune::config::{load_from_process, OPTIONS, TIER_OPTIONS};

#[derive(clap::Args)]
pub struct Args {
    /// Print the table of options (Markdown) instead of the configuration in force.
    #[arg(long)]
    options: bool,
    /// A configuration file to check and show.
    #[arg(long)]
    file: Option<std::path::PathBuf>,
}

pub fn run(a: Args) -> i32 {
    if a.options {
        println!("| option | environment | default | suggested | meaning |\n|---|---|---|---|---|");
        for o in OPTIONS {
            println!(
                "| `{}` | `{}` | {} | {} | {} |",
                o.key, o.env, o.default, o.suggested, o.doc
            );
        }
        println!("\nTier options (`[[tier]]` tables; environment `ATTUNE_TIER_<NAME>_<KEY>`):\n");
        println!("| option | environment | default | suggested | meaning |\n|---|---|---|---|---|");
        for o in TIER_OPTIONS {
            println!(
                "| `{}` | `{}` | {} | {} | {} |",
                o.key, o.env, o.default, o.suggested, o.doc
            );
        }
        println!(
            "\n`attune run` options (environment only; `attune run` sets them from its flags):\n"
        );
        println!("| option | environment | default | suggested | meaning |\n|---|---|---|---|---|");
        for o in attune::run_options::RUN_OPTIONS {
            println!(
                "| `{}` | `{}` | {} | {} | {} |",
                o.key, o.env, o.default, o.suggested, o.doc
            );
        }
        return 0;
    }
    match load_from_process(a.file.as_deref()) {
        Ok(c) => {
            println!("{}", serde_json::to_string_pretty(&c).unwrap_or_default());
            0
        }
        Err(e) => {
            eprintln!("attune: configuration error: {e}");
            2
        }
    }
}
