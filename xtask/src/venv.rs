//! The project's Python virtual environment (`.venv` at the workspace root),
//! created on first use with the packages the independent generators need.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

/// Packages every generator may import, pinned loosely.
const PACKAGES: &[&str] = &["numpy>=1.26", "ml_dtypes>=0.4", "safetensors>=0.4"];

/// The workspace root (the parent of `xtask/`), or `$M3_ROOT` when set (a
/// carried xtask binary runs from a checkout at another path).
pub fn workspace_root() -> PathBuf {
    if let Some(r) = std::env::var_os("M3_ROOT").filter(|v| !v.is_empty()) {
        return PathBuf::from(r);
    }
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives one level below the workspace root")
        .to_path_buf()
}

/// Path of the venv's python, creating the venv and installing `PACKAGES`
/// (plus `extra`) when missing.
#[allow(dead_code)]
pub fn python(extra: &[&str]) -> Result<PathBuf> {
    let root = workspace_root();
    let venv = root.join(".venv");
    let py = venv.join("bin").join("python");
    if !py.exists() {
        eprintln!("xtask: creating {}", venv.display());
        let status = Command::new("python3")
            .args(["-m", "venv"])
            .arg(&venv)
            .status()
            .context("running python3 -m venv (is python3 installed?)")?;
        if !status.success() {
            bail!("python3 -m venv {} failed", venv.display());
        }
    }
    let mut want: Vec<&str> = PACKAGES.to_vec();
    want.extend_from_slice(extra);
    let stamp = venv.join(format!("m3-packages-{}.stamp", stamp_key(&want)));
    if !stamp.exists() {
        eprintln!("xtask: installing {} into .venv", want.join(" "));
        let status = Command::new(&py)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
            ])
            .args(&want)
            .status()
            .context("running pip in .venv")?;
        if !status.success() {
            bail!("pip install {} failed", want.join(" "));
        }
        std::fs::write(&stamp, want.join("\n")).context("writing the venv stamp")?;
    }
    Ok(py)
}

fn stamp_key(pkgs: &[&str]) -> u64 {
    // FNV-1a: a stable key for the package list.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in pkgs.join(",").bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}
