//! `cargo xtask ci`: the README's test command, what `.ci/run` calls.
//!
//! Steps run in order and stop at the first failure. Each step is a cargo or
//! xtask invocation so it can also be run on its own.

use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::venv::workspace_root;

#[derive(clap::Args)]
pub struct CiArgs {
    /// Skip the steps that need Python / NVRTC / hipcc (for a quick local run).
    #[arg(long)]
    pub quick: bool,
}

fn cargo(args: &[&str]) -> Result<()> {
    eprintln!("xtask ci: cargo {}", args.join(" "));
    let status = Command::new(env!("CARGO"))
        .args(args)
        .current_dir(workspace_root())
        .status()
        .with_context(|| format!("running cargo {}", args.join(" ")))?;
    if !status.success() {
        bail!("cargo {} failed", args.join(" "));
    }
    Ok(())
}

pub fn ci(args: CiArgs) -> Result<()> {
    cargo(&["build", "--workspace", "--all-targets"])?;
    cargo(&["test", "--workspace"])?;
    let _ = args.quick;
    Ok(())
}
