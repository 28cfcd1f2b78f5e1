//! `attune config`: the configuration in force (as JSON) or the options table.

use attune::config::{load_from_process, markdown, OPTIONS, TIER_OPTIONS};
use attune::run_options::RUN_OPTIONS;

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
        print!("{}", tuning_tables());
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

/// The option tables of docs/tuning.md, as `attune config --options` prints them.
pub fn tuning_tables() -> String {
    format!(
        "{}\nTier options (`[[tier]]` tables; environment `ATTUNE_TIER_<NAME>_<KEY>`):\n\n{}\n`attune run` options (environment only; `attune run` sets them from its flags):\n\n{}",
        markdown(OPTIONS, "environment", |o| o.env()),
        markdown(TIER_OPTIONS, "environment", |o| match o.default {
            attune::config::table::Unset::Required => "-".into(),
            _ => o.tier_env("<NAME>"),
        }),
        markdown(RUN_OPTIONS, "environment", |o| o.env()),
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn docs_tuning_md_holds_the_tables_as_generated() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/tuning.md");
        let doc = std::fs::read_to_string(path).unwrap();
        assert!(
            doc.contains(&super::tuning_tables()),
            "docs/tuning.md is out of date: replace its option tables with `attune config --options`"
        );
    }
}
