//! `cargo xtask sim`: the GPU test suites on the simulator
//! (gpu-mi350/src/runtime/sim.rs), in both flavours: `M3_GPU_RUNTIME=sim`
//! (the engine's HIP route, MI350's wave64 semantics) and `sim-cuda`
//! (compat.h's CUDA branch and the CUDA-only code paths the H200 runs),
//! on this machine's CPU, the host C++ compiler building the kernels. No
//! GPU, no ROCm.
//!
//! The default is CI's selection: every GPU unit test of the engine's
//! kernels (linears of every format and row class, producers, attention
//! and the indexer, cache writes) against its reference, in each flavour.
//! `--full` adds the runner suite (the GPU runner against the CPU runner,
//! and the bitwise A/B tests of every fold and fusion) and the golden
//! cases through `m3 forward --backend gpu`: tens of minutes.

use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};

use crate::venv::workspace_root;

#[derive(clap::Args)]
pub struct SimArgs {
    /// Also the runner suite and the golden cases (slow).
    #[arg(long)]
    pub full: bool,
}

/// Run `cargo args` with `M3_GPU_RUNTIME=flavour`, its output into `log`.
fn spawn(flavour: &str, args: &[&str], log: &std::path::Path) -> Result<std::process::Child> {
    let out = std::fs::File::create(log).with_context(|| format!("{}", log.display()))?;
    let err = out.try_clone()?;
    Command::new(env!("CARGO"))
        .args(args)
        .env("M3_GPU_RUNTIME", flavour)
        .current_dir(workspace_root())
        .stdout(out)
        .stderr(err)
        .spawn()
        .with_context(|| format!("running cargo {}", args.join(" ")))
}

/// One step in both flavours at once (the simulator runs one launch at a
/// time a process, so two processes use two cores); each log is printed
/// when it ends, the whole of it on a failure, else its summary lines.
fn both(tag: &str, what: &str, args: &[&str]) -> Result<()> {
    let dir = workspace_root().join("target").join("sim-logs");
    std::fs::create_dir_all(&dir)?;
    eprintln!(
        "\n=== xtask sim: {what}: cargo {} (sim-cuda and sim)",
        args.join(" ")
    );
    let start = Instant::now();
    let mut runs = Vec::new();
    for flavour in ["sim-cuda", "sim"] {
        let log = dir.join(format!("{tag}-{flavour}.log"));
        runs.push((flavour, spawn(flavour, args, &log)?, log));
    }
    let mut failed = Vec::new();
    for (flavour, mut child, log) in runs {
        let ok = child.wait()?.success();
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        for line in text.lines() {
            if !ok || line.starts_with("test result") || line.contains("FAILED") {
                eprintln!("[{flavour}] {line}");
            }
        }
        eprintln!(
            "=== xtask sim: {what} (M3_GPU_RUNTIME={flavour}): {} ({:.1} s since the start; log {})",
            if ok { "ok" } else { "FAILED" },
            start.elapsed().as_secs_f64(),
            log.display()
        );
        if !ok {
            failed.push(flavour);
        }
    }
    if !failed.is_empty() {
        bail!("{what} failed on the simulator ({})", failed.join(", "));
    }
    Ok(())
}

pub fn sim(args: SimArgs) -> Result<()> {
    // build once before the two runs share the target directory
    let status = Command::new(env!("CARGO"))
        .args(["test", "-p", "m3-gpu", "--no-run"])
        .current_dir(workspace_root())
        .status()?;
    if !status.success() {
        bail!("cargo test -p m3-gpu --no-run failed");
    }
    both(
        "unit",
        "the engine's GPU unit tests",
        &["test", "-p", "m3-gpu", "--lib"],
    )?;
    if args.full {
        both(
            "runner",
            "the runner suite",
            &["test", "-p", "m3-gpu", "--test", "runner"],
        )?;
        // one flavour at a time: the golden runs share their work directory
        for flavour in ["sim-cuda", "sim"] {
            let log = workspace_root()
                .join("target")
                .join("sim-logs")
                .join(format!("golden-{flavour}.log"));
            let ok = spawn(flavour, &["xtask", "golden", "--backend", "gpu"], &log)?
                .wait()?
                .success();
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            for line in text.lines().filter(|l| !ok || l.starts_with("golden:")) {
                eprintln!("[{flavour}] {line}");
            }
            if !ok {
                bail!(
                    "the golden cases failed on the simulator ({flavour}): {}",
                    log.display()
                );
            }
        }
    }
    Ok(())
}
