//! `cargo xtask <task>`: project chores that need more than cargo.

use clap::{Parser, Subcommand};

mod venv;

#[derive(Parser)]
#[command(name = "xtask", about = "m3 project tasks")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Regenerate the format conformance vectors with the Python generator
    /// (numpy + ml_dtypes in .venv); fails if the committed ones drift.
    GenSpec {
        /// Overwrite the committed vectors instead of failing on drift.
        #[arg(long)]
        write: bool,
    },
    /// Run every conformance vector on the CPU codecs.
    Conform,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.task {
        Task::GenSpec { .. } | Task::Conform => anyhow::bail!("not implemented yet"),
    }
}
