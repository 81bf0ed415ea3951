//! `cargo xtask gen-spec [--write]` and `cargo xtask conform`.
//!
//! `gen-spec` runs the independent Python generator (`spec/gen/gen_vectors.py`,
//! numpy + ml_dtypes in `.venv`) into a scratch directory and compares its
//! output with the committed `spec/vectors` byte for byte: any drift is a
//! non-zero exit naming the files; `--write` replaces the committed files
//! (each through a temp name + rename). `conform` runs every vector on the
//! CPU codecs and prints the per-group table.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::venv;

#[derive(clap::Args)]
pub struct GenSpecArgs {
    /// Replace the committed vectors in spec/vectors with the fresh output
    /// (otherwise only compare and fail on drift).
    #[arg(long)]
    write: bool,
}

#[derive(clap::Args)]
pub struct ConformArgs {
    /// Vector directory (default: spec/vectors of this checkout).
    #[arg(long)]
    dir: Option<PathBuf>,
}

/// The generated files in a vector directory: the manifest and the group
/// files (anything else there is not ours and is left alone).
fn vector_files(dir: &Path) -> Result<BTreeSet<String>> {
    let mut out = BTreeSet::new();
    if !dir.exists() {
        return Ok(out);
    }
    for e in fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let e = e.with_context(|| format!("listing {}", dir.display()))?;
        let name = e.file_name().to_string_lossy().into_owned();
        if name == "manifest.json" || name.ends_with(".safetensors") {
            out.insert(name);
        }
    }
    Ok(out)
}

/// Scratch directory under `target/` (removed when dropped).
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

pub fn gen_spec(args: GenSpecArgs) -> Result<()> {
    let root = venv::workspace_root();
    let py = venv::python(&[])?;
    let script = root.join("spec/gen/gen_vectors.py");
    let committed = root.join("spec/vectors");
    let scratch = Scratch(root.join(format!("target/gen-spec-{}", std::process::id())));
    let _ = fs::remove_dir_all(&scratch.0);
    fs::create_dir_all(&scratch.0).with_context(|| format!("creating {}", scratch.0.display()))?;

    let status = Command::new(&py)
        .arg(&script)
        .arg(&scratch.0)
        .status()
        .with_context(|| format!("running {} {}", py.display(), script.display()))?;
    if !status.success() {
        bail!("{} failed ({status})", script.display());
    }

    let fresh = vector_files(&scratch.0)?;
    if !fresh.contains("manifest.json") {
        bail!("{} wrote no manifest.json", script.display());
    }
    let old = vector_files(&committed)?;
    let mut drift = Vec::new();
    for name in fresh.union(&old) {
        let a = fs::read(scratch.0.join(name)).ok();
        let b = fs::read(committed.join(name)).ok();
        match (a, b) {
            (Some(a), Some(b)) if a == b => {}
            (Some(_), Some(_)) => drift.push(format!("{name} (differs)")),
            (Some(_), None) => drift.push(format!("{name} (not committed)")),
            (None, _) => drift.push(format!("{name} (no longer generated)")),
        }
    }

    if args.write {
        fs::create_dir_all(&committed)
            .with_context(|| format!("creating {}", committed.display()))?;
        for name in &fresh {
            let dst = committed.join(name);
            let tmp = committed.join(format!("{name}.tmp"));
            fs::copy(scratch.0.join(name), &tmp)
                .with_context(|| format!("writing {}", tmp.display()))?;
            fs::rename(&tmp, &dst).with_context(|| format!("renaming to {}", dst.display()))?;
        }
        for name in old.difference(&fresh) {
            let p = committed.join(name);
            fs::remove_file(&p).with_context(|| format!("removing stale {}", p.display()))?;
        }
        println!(
            "gen-spec: wrote {} files to {} ({} changed)",
            fresh.len(),
            committed.display(),
            drift.len()
        );
        for d in &drift {
            println!("  {d}");
        }
        return Ok(());
    }

    if drift.is_empty() {
        println!(
            "gen-spec: {} files in {} match the generator byte for byte",
            fresh.len(),
            committed.display()
        );
        Ok(())
    } else {
        for d in &drift {
            eprintln!("  drift: spec/vectors/{d}");
        }
        bail!(
            "{} of the committed vector files drift from the generator (rerun with --write to replace them)",
            drift.len()
        )
    }
}

pub fn conform(args: ConformArgs) -> Result<()> {
    let dir = args.dir.unwrap_or_else(m3_spec::default_dir);
    let set = m3_spec::VectorSet::load(&dir)
        .with_context(|| format!("loading the vectors in {}", dir.display()))?;
    let report = m3_spec::run(&m3_spec::CpuOps, &set);
    print!("{}", report.table());
    if report.all_passed() {
        println!("conform: all {} vectors pass", set.total());
        Ok(())
    } else {
        eprint!("{}", report.details());
        bail!(
            "conformance failures in: {}",
            report.failed_groups().join(", ")
        )
    }
}
