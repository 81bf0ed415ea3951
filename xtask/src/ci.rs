//! `cargo xtask ci`: the README's test command, what `.ci/run` calls.
//!
//! Steps run in order and stop at the first failure; each is a cargo or
//! xtask invocation that can also be run on its own. The whole run is sized
//! for CI's 2 cores and no GPU (well under 20 minutes once dependencies are
//! built): GPU tests skip with a printed reason unless `REQUIRE_GPU=1`.

use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};

use crate::venv::workspace_root;

#[derive(clap::Args)]
pub struct CiArgs {
    /// Only the cargo steps (fmt, clippy, tests): skip the steps that need
    /// Python, NVRTC, clang 22 or hipcc.
    #[arg(long)]
    pub quick: bool,
}

/// Run `cargo <args>` at the workspace root, timing it.
fn cargo(args: &[&str]) -> Result<()> {
    let line = args.join(" ");
    eprintln!("\n=== xtask ci: cargo {line}");
    let start = Instant::now();
    let status = Command::new(env!("CARGO"))
        .args(args)
        .current_dir(workspace_root())
        .status()
        .with_context(|| format!("running cargo {line}"))?;
    eprintln!(
        "=== xtask ci: cargo {line}: {} in {:.1} s",
        if status.success() { "ok" } else { "FAILED" },
        start.elapsed().as_secs_f64()
    );
    if !status.success() {
        bail!("cargo {line} failed");
    }
    Ok(())
}

pub fn ci(args: CiArgs) -> Result<()> {
    let start = Instant::now();
    cargo(&["fmt", "--all", "--", "--check"])?;
    cargo(&[
        "clippy",
        "--workspace",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ])?;
    // The core must stay no_std + alloc.
    cargo(&["check", "-p", "m3-core", "--no-default-features"])?;
    cargo(&["test", "--workspace"])?;
    if !args.quick {
        // Format conformance: every vector on the CPU codecs, then the
        // independent generator rerun to prove the committed vectors are
        // what it makes.
        cargo(&["xtask", "conform"])?;
        cargo(&["xtask", "gen-spec"])?;
        // `m3 serve` end to end with the official `openai` client.
        cargo(&["xtask", "serve-e2e"])?;
        // Golden parity of the CPU backend against the numpy reference.
        cargo(&["xtask", "golden", "--backend", "cpu"])?;
        // Every GPU kernel compiles for NVIDIA sm_90 (NVRTC) and AMD gfx950 +
        // gfx942 (clang 22, no ROCm; no VGPR spill in any kernel, SGPR spills
        // within isa::SGPR_SPILL_CEILINGS) and gfx940 (hipcc).
        cargo(&["xtask", "kernels"])?;
        cargo(&["xtask", "sim", "--poison"])?;
        // The safetensors header / index parser under fuzzing, briefly.
        cargo(&["xtask", "fuzz", "--seconds", "20"])?;
    }
    eprintln!(
        "\n=== xtask ci: all steps passed in {:.0} s",
        start.elapsed().as_secs_f64()
    );
    Ok(())
}
