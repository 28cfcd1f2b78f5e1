//! `attune config`: the configuration in force (as JSON) or the options table.

use attune::config::{load_from_process, tuning_tables};

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
