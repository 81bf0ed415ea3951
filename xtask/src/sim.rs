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
//! The test binaries are the ones `cargo test --workspace` builds, run
//! directly (`cargo test -p m3-gpu` would rebuild the engine with the
//! smaller package set's features).
//! `--full` adds the runner suite (the GPU runner against the CPU runner,
//! and the bitwise A/B tests of every fold and fusion) and the golden
//! cases through `m3 forward --backend gpu`: tens of minutes.

use std::path::{Path, PathBuf};
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

/// The engine's package directory (m3-gpu): its test binaries are the
/// ones run (cpu-ref has a `runner` test too).
const ENGINE_DIR: &str = "gpu-mi350";

/// Environment for the test runs, the checks asked for: `cargo` for the
/// ones cargo starts (AddressSanitizer's runtime preloaded through cargo's
/// runner, so into the binaries it runs, not into cargo or rustc), `direct`
/// for the test binaries started here (preloaded into them).
struct CheckEnv {
    cargo: Vec<(String, String)>,
    direct: Vec<(String, String)>,
}

fn check_env(args: &SimArgs) -> Result<CheckEnv> {
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
        let (mut cargo, mut direct) = (env.clone(), env);
        cargo.push((
            "CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER".into(),
            format!("env LD_PRELOAD={lib}"),
        ));
        direct.push(("LD_PRELOAD".into(), lib));
        return Ok(CheckEnv { cargo, direct });
    }
    Ok(CheckEnv {
        cargo: env.clone(),
        direct: env,
    })
}

/// Run `program args` in `dir` with `M3_GPU_RUNTIME=flavour`, its output
/// into `log`.
fn spawn(
    flavour: &str,
    env: &[(String, String)],
    (program, dir): (&Path, &Path),
    args: &[&str],
    log: &Path,
) -> Result<std::process::Child> {
    let out = std::fs::File::create(log).with_context(|| format!("{}", log.display()))?;
    let err = out.try_clone()?;
    Command::new(program)
        .args(args)
        .env("M3_GPU_RUNTIME", flavour)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .current_dir(dir)
        .stdout(out)
        .stderr(err)
        .spawn()
        .with_context(|| format!("running {} {}", program.display(), args.join(" ")))
}

/// One test binary `cargo test --workspace --no-run` built.
struct TestBin {
    /// The target's name (`m3_gpu` for a library's unit tests, `runner`).
    name: String,
    /// A library's unit tests (not an integration test).
    lib: bool,
    /// Its package's directory, where `cargo test` runs it.
    dir: PathBuf,
    exe: PathBuf,
}

/// The test binaries `cargo test --workspace --no-run` builds. Run
/// directly rather than through `cargo test -p m3-gpu`, which resolves the
/// smaller package set's features and rebuilds the engine and its
/// dependencies (67 s of the step's 229, cold on two cores): after CI's `cargo test
/// --workspace` this build compiles nothing.
fn workspace_test_binaries() -> Result<Vec<TestBin>> {
    let out = Command::new(env!("CARGO"))
        .args([
            "test",
            "--workspace",
            "--no-run",
            "--message-format=json-render-diagnostics",
        ])
        .current_dir(workspace_root())
        .stderr(std::process::Stdio::inherit())
        .output()
        .context("running cargo test --workspace --no-run")?;
    if !out.status.success() {
        bail!("cargo test --workspace --no-run failed");
    }
    let mut bins = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if msg["reason"] != "compiler-artifact" || msg["profile"]["test"] != true {
            continue;
        }
        let name = msg["target"]["name"].as_str();
        let exe = msg["executable"].as_str();
        let dir = msg["manifest_path"]
            .as_str()
            .map(Path::new)
            .and_then(Path::parent);
        if let (Some(name), Some(exe), Some(dir)) = (name, exe, dir) {
            let lib = msg["target"]["kind"]
                .as_array()
                .is_some_and(|k| k.iter().any(|k| k == "lib"));
            bins.push(TestBin {
                name: name.to_string(),
                lib,
                dir: dir.to_path_buf(),
                exe: PathBuf::from(exe),
            });
        }
    }
    Ok(bins)
}

/// The engine's test binary of target `name` (its unit tests when `lib`),
/// with the directory to run it in.
fn engine_test(bins: &[TestBin], name: &str, lib: bool) -> Result<(PathBuf, PathBuf)> {
    bins.iter()
        .find(|b| b.name == name && b.lib == lib && b.dir.ends_with(ENGINE_DIR))
        .map(|b| (b.exe.clone(), b.dir.clone()))
        .with_context(|| {
            format!("cargo test --workspace --no-run built no test binary `{name}` in {ENGINE_DIR}")
        })
}

/// One step in both flavours at once (the simulator runs one launch at a
/// time a process, so two processes use two cores); each log is printed
/// when it ends, the whole of it on a failure, else its summary lines.
fn both(
    tag: &str,
    what: &str,
    env: &[(String, String)],
    (program, cwd): (&Path, &Path),
    args: &[&str],
) -> Result<()> {
    let dir = workspace_root().join("target").join("sim-logs");
    std::fs::create_dir_all(&dir)?;
    let shown = if program == Path::new(env!("CARGO")) {
        "cargo".to_string()
    } else {
        program.display().to_string()
    };
    eprintln!(
        "\n=== xtask sim: {what}: {shown} {} (sim-cuda and sim)",
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
        runs.push((
            flavour,
            spawn(flavour, env, (program, cwd), &args, &log)?,
            log,
        ));
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
    // build once before the two runs share the target directory: the
    // workspace's test binaries (their features as CI's test step resolves
    // them) and the m3 binary
    let bins = workspace_test_binaries()?;
    let status = Command::new(env!("CARGO"))
        .args(["build", "-p", "m3-cli"])
        .current_dir(workspace_root())
        .status()?;
    if !status.success() {
        bail!("cargo build -p m3-cli failed");
    }
    let env = check_env(&args)?;
    let root = workspace_root();
    let cargo = (Path::new(env!("CARGO")), root.as_path());
    let (unit, unit_dir) = engine_test(&bins, "m3_gpu", true)?;
    both(
        "unit",
        "the engine's GPU unit tests",
        &env.direct,
        (&unit, &unit_dir),
        &[],
    )?;
    // `m3 bench --backend gpu` end to end on the device line (the HIP
    // route in the `sim` flavour): ceiling probes, the bench model, graph
    // capture and replays, standard and mono paths; times are not speeds.
    // The standard path takes the d <= 128 attention partials (the
    // default); mono's parity gate, which runs the plain bodies, holds them
    // to the same bits. Its chains here are 8 steps, not the bench's 32:
    // a chain keeps its positions (each step feeds its tokens back), so
    // more steps only compare more fed-back tokens, and the simulator takes
    // ~0.6 s a chain step (152 s of this CI step's 280 at 32).
    both(
        "bench",
        "m3 bench --backend gpu (tiny, both paths)",
        &env.cargo,
        cargo,
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
            "--parity-steps",
            "8",
            "--out",
            "target/sim-logs/bench-{flavour}.json",
        ],
    )?;
    if args.full {
        let (runner, runner_dir) = engine_test(&bins, "runner", false)?;
        both(
            "runner",
            "the runner suite",
            &env.direct,
            (&runner, &runner_dir),
            &[],
        )?;
        // one flavour at a time: the golden runs share their work directory
        for flavour in ["sim-cuda", "sim"] {
            let log = workspace_root()
                .join("target")
                .join("sim-logs")
                .join(format!("golden-{flavour}.log"));
            let ok = spawn(
                flavour,
                &[],
                cargo,
                &["xtask", "golden", "--backend", "gpu"],
                &log,
            )?
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

#[cfg(test)]
mod tests {
    use super::*;

    fn bin(name: &str, lib: bool, dir: &str) -> TestBin {
        TestBin {
            name: name.into(),
            lib,
            dir: PathBuf::from(dir),
            exe: PathBuf::from(format!("{dir}/{name}-{lib}")),
        }
    }

    /// cpu-ref's `runner` test comes first in cargo's order; the engine's
    /// is the one taken, and its directory is where it runs.
    #[test]
    fn the_engine_test_is_taken_by_package_not_by_name() {
        let bins = [
            bin("runner", false, "/w/cpu-ref"),
            bin("m3_gpu", false, "/w/gpu-mi350"),
            bin("runner", false, "/w/gpu-mi350"),
            bin("m3_gpu", true, "/w/gpu-mi350"),
        ];
        let (exe, dir) = engine_test(&bins, "runner", false).unwrap();
        assert_eq!(dir, Path::new("/w/gpu-mi350"));
        assert_eq!(exe, Path::new("/w/gpu-mi350/runner-false"));
        let (exe, _) = engine_test(&bins, "m3_gpu", true).unwrap();
        assert_eq!(exe, Path::new("/w/gpu-mi350/m3_gpu-true"));
        assert!(engine_test(&bins[..1], "runner", false).is_err());
    }
}
