//! `cargo xtask sim`: the GPU test suites on the simulator
//! (gpu-mi350/src/runtime/sim.rs), in both flavours: `M3_GPU_RUNTIME=sim`
//! (the engine's HIP route, MI350's wave64 semantics) and `sim-cuda`
//! (compat.h's CUDA branch and the CUDA-only code paths the H200 runs),
//! on this machine's CPU, the host C++ compiler building the kernels. No
//! GPU, no ROCm.
//!
//! The default is CI's selection (CI adds `--poison`): every GPU unit test
//! of the engine's kernels (linears of every format and row class,
//! producers, attention and the indexer, cache writes) against its
//! reference, in each flavour; then `m3 bench --backend gpu` on `tiny`,
//! standard and mono paths, end to end (it must run; its times are the
//! simulator's).
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
    /// Build the kernels with AddressSanitizer (the test binaries run with
    /// its runtime preloaded): any kernel load or store outside the
    /// allocation it aims at stops the run with the kernel's stack. The
    /// golden cases run without it.
    #[arg(long)]
    pub asan: bool,
    /// Fill new device memory with 0xff (NaN in every float format) rather
    /// than zeros, so results that read memory nothing wrote go wrong.
    #[arg(long)]
    pub poison: bool,
}

/// Environment for the test runs: the flavour, and the checks asked for.
fn check_env(args: &SimArgs) -> Result<Vec<(String, String)>> {
    let mut env = Vec::new();
    if args.poison {
        env.push(("M3_SIM_POISON".to_string(), "1".to_string()));
    }
    if args.asan {
        let cxx = ["M3_SIM_CXX", "CXX"]
            .iter()
            .find_map(|v| std::env::var(v).ok().filter(|s| !s.trim().is_empty()))
            .unwrap_or_else(|| "c++".to_string());
        let out = Command::new(&cxx)
            .arg("-print-file-name=libasan.so")
            .output()
            .with_context(|| format!("{cxx} -print-file-name=libasan.so"))?;
        let lib = String::from_utf8_lossy(&out.stdout).trim().to_string();
        if !std::path::Path::new(&lib).is_file() {
            bail!("--asan: {cxx} has no libasan.so ({lib:?})");
        }
        env.push(("M3_SIM_ASAN".into(), "1".into()));
        env.push(("ASAN_OPTIONS".into(), "detect_leaks=0".into()));
        // the runtime preloaded into the test binaries only (not cargo,
        // not rustc)
        env.push((
            "CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER".into(),
            format!("env LD_PRELOAD={lib}"),
        ));
    }
    Ok(env)
}

/// Run `cargo args` with `M3_GPU_RUNTIME=flavour`, its output into `log`.
fn spawn(
    flavour: &str,
    env: &[(String, String)],
    args: &[&str],
    log: &std::path::Path,
) -> Result<std::process::Child> {
    let out = std::fs::File::create(log).with_context(|| format!("{}", log.display()))?;
    let err = out.try_clone()?;
    Command::new(env!("CARGO"))
        .args(args)
        .env("M3_GPU_RUNTIME", flavour)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .current_dir(workspace_root())
        .stdout(out)
        .stderr(err)
        .spawn()
        .with_context(|| format!("running cargo {}", args.join(" ")))
}

/// One step in both flavours at once (the simulator runs one launch at a
/// time a process, so two processes use two cores); each log is printed
/// when it ends, the whole of it on a failure, else its summary lines.
fn both(tag: &str, what: &str, env: &[(String, String)], args: &[&str]) -> Result<()> {
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
        // `{flavour}` in an argument: this run's flavour (output paths)
        let args: Vec<String> = args
            .iter()
            .map(|a| a.replace("{flavour}", flavour))
            .collect();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        runs.push((flavour, spawn(flavour, env, &args, &log)?, log));
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
    for build in [
        &["test", "-p", "m3-gpu", "--no-run"][..],
        &["build", "-p", "m3-cli"],
    ] {
        let status = Command::new(env!("CARGO"))
            .args(build)
            .current_dir(workspace_root())
            .status()?;
        if !status.success() {
            bail!("cargo {} failed", build.join(" "));
        }
    }
    let env = check_env(&args)?;
    both(
        "unit",
        "the engine's GPU unit tests",
        &env,
        &["test", "-p", "m3-gpu", "--lib"],
    )?;
    // `m3 bench --backend gpu` end to end on the device line (the HIP
    // route in the `sim` flavour): ceiling probes, the bench model, graph
    // capture and replays, standard and mono paths; times are not speeds.
    // The standard path takes the d <= 128 attention partials (the
    // default); mono's parity gate, which runs the plain bodies, holds them
    // to the same bits.
    both(
        "bench",
        "m3 bench --backend gpu (tiny, both paths)",
        &env,
        &[
            "run",
            "-q",
            "-p",
            "m3-cli",
            "--",
            "bench",
            "--backend",
            "gpu",
            "--preset",
            "tiny",
            "--batch",
            "1,2",
            "--iters",
            "1",
            "--rounds",
            "1",
            "--warmup",
            "1",
            "--ceiling-mib",
            "4",
            "--path",
            "both",
            "--out",
            "target/sim-logs/bench-{flavour}.json",
        ],
    )?;
    if args.full {
        both(
            "runner",
            "the runner suite",
            &env,
            &["test", "-p", "m3-gpu", "--test", "runner"],
        )?;
        // one flavour at a time: the golden runs share their work directory
        for flavour in ["sim-cuda", "sim"] {
            let log = workspace_root()
                .join("target")
                .join("sim-logs")
                .join(format!("golden-{flavour}.log"));
            let ok = spawn(flavour, &[], &["xtask", "golden", "--backend", "gpu"], &log)?
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
