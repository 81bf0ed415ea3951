//! `cargo xtask serve-e2e`: `m3 serve` driven by the official `openai`
//! Python package (issue 14's end-to-end test).
//!
//! Starts the debug `m3` binary's server on the synthetic tiny default (in
//! a fresh cache directory, so the checkpoint is made by this run) on a
//! free loopback port (`--port 0`; the bound address is read from its
//! stderr), runs `serve/tests/e2e_openai.py` against it (which also runs
//! `m3 batch` on the same checkpoint to compare greedy outputs), then sends
//! SIGTERM and requires the server to drain and exit 0. Every wait is
//! bounded; the server is killed if anything fails.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};

use crate::venv::{python, workspace_root};

/// The `openai` client the test uses (pinned: the test checks its API).
const OPENAI: &str = "openai==3.57.0";

#[derive(clap::Args)]
pub struct ServeE2eArgs {
    /// Give up on the Python checks after this many seconds.
    #[arg(long, default_value_t = 600)]
    pub timeout_s: u64,
}

/// Kills the server on drop unless it was reaped.
struct Server(Option<Child>);

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(c) = self.0.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn wait_timeout(child: &mut Child, limit: Duration) -> Result<Option<std::process::ExitStatus>> {
    let t0 = Instant::now();
    loop {
        if let Some(s) = child.try_wait().context("waiting for a child")? {
            return Ok(Some(s));
        }
        if t0.elapsed() > limit {
            return Ok(None);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn m3_binary(root: &Path) -> Result<PathBuf> {
    let status = Command::new(env!("CARGO"))
        .args(["build", "-p", "m3-cli", "--bin", "m3"])
        .current_dir(root)
        .status()
        .context("cargo build -p m3-cli")?;
    if !status.success() {
        bail!("cargo build -p m3-cli failed");
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    Ok(target.join("debug").join("m3"))
}

pub fn serve_e2e(args: ServeE2eArgs) -> Result<()> {
    let root = workspace_root();
    let m3 = m3_binary(&root)?;
    let py = python(&[OPENAI])?;
    let cache = std::env::temp_dir().join(format!("m3-serve-e2e-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&cache);
    std::fs::create_dir_all(&cache).with_context(|| format!("creating {}", cache.display()))?;
    let started = Instant::now();
    let mut child = Command::new(&m3)
        .args([
            "serve",
            "--port",
            "0",
            "--backend",
            "cpu",
            "--served-model-name",
            "m3-tiny",
            "--max-model-len",
            "1024",
            "--max-num-seqs",
            "64",
        ])
        .env("XDG_CACHE_HOME", &cache)
        .stdin(Stdio::null())
        .stdout(Stdio::inherit())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {} serve", m3.display()))?;
    let stderr = child
        .stderr
        .take()
        .ok_or_else(|| anyhow!("no stderr pipe"))?;
    let mut server = Server(Some(child));
    // Forward the server's stderr, and pick the bound address out of it.
    let (tx, rx) = mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(|l| l.ok()) {
            eprintln!("[m3 serve] {line}");
            if let Some(rest) = line.split(" on http://").nth(1) {
                let addr = rest.split_whitespace().next().unwrap_or("").to_string();
                let _ = tx.send(addr);
            }
        }
    });
    let addr = rx
        .recv_timeout(Duration::from_secs(300))
        .map_err(|_| anyhow!("m3 serve did not report its address within 300 s"))?;
    let base = format!("http://{addr}");
    eprintln!(
        "xtask serve-e2e: server up at {base} after {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let model_dir = cache.join("m3").join("synthetic-tiny-mxfp4-v2");
    let mut test = Command::new(&py)
        .arg(root.join("serve/tests/e2e_openai.py"))
        .args(["--base-url", &base, "--model", "m3-tiny"])
        .arg("--m3")
        .arg(&m3)
        .arg("--model-dir")
        .arg(&model_dir)
        .arg("--workdir")
        .arg(&cache)
        .env("XDG_CACHE_HOME", &cache)
        .spawn()
        .context("starting the Python e2e test")?;
    let status = wait_timeout(&mut test, Duration::from_secs(args.timeout_s))?;
    let Some(status) = status else {
        let _ = test.kill();
        let _ = test.wait();
        bail!("the Python e2e test ran past {} s", args.timeout_s);
    };
    if !status.success() {
        bail!("serve/tests/e2e_openai.py failed ({status})");
    }
    // SIGTERM: the server drains and exits 0.
    let exit = {
        let child = server.0.as_mut().ok_or_else(|| anyhow!("server gone"))?;
        let pid = child.id().to_string();
        let kill = Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .context("running kill -TERM")?;
        if !kill.success() {
            bail!("kill -TERM {pid} failed");
        }
        wait_timeout(child, Duration::from_secs(60))?
    };
    if exit.is_some() {
        server.0 = None; // reaped
    }
    match exit {
        Some(s) if s.success() => {}
        Some(s) => bail!("m3 serve exited with {s} after SIGTERM (expected 0)"),
        None => bail!("m3 serve did not exit within 60 s of SIGTERM"),
    }
    let _ = std::fs::remove_dir_all(&cache);
    eprintln!(
        "xtask serve-e2e: passed in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
