//! `cargo xtask kernels`: compile every GPU kernel source for NVIDIA (NVRTC,
//! `sm_90`) and AMD (Debian's hipcc, one gfx9 target), so a kernel that does
//! not compile fails CI, which has no GPU.
//!
//! - NVRTC comes from the PyPI wheel `nvidia-cuda-nvrtc` (CUDA 13) installed
//!   into the project venv. cudarc loads libnvrtc with dlopen by name, so the
//!   compile runs in a child process (this binary again, `--nvrtc-child`)
//!   whose `LD_LIBRARY_PATH` holds the wheel's lib directory.
//! - hipcc comes from Debian 12's `hipcc` package (installed with apt-get
//!   when missing and running as root). Its clang 15 does not know gfx950
//!   (MI350, ROCm >= 6.3's LLVM); the default target is gfx940, the newest
//!   gfx9 (CDNA3) it knows, which shares the wave64 ISA family.
//!
//! Outputs go to `target/kernels/` (written to temp names, then renamed).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use m3_gpu::cuda::nvrtc;
use m3_gpu::kernels::{self, KernelSource};

use crate::venv;

/// The PyPI package that carries libnvrtc.so.13.
const NVRTC_WHEEL: &str = "nvidia-cuda-nvrtc>=13,<14";

#[derive(clap::Args)]
pub struct KernelsArgs {
    /// NVIDIA target for NVRTC (a real architecture: CUBIN is emitted).
    #[arg(long, default_value = "sm_90")]
    pub cuda_arch: String,
    /// AMD target for hipcc (Debian 12's hipcc knows up to gfx940).
    #[arg(long, default_value = "gfx940")]
    pub hip_arch: String,
    /// Skip the NVRTC compile.
    #[arg(long)]
    pub no_cuda: bool,
    /// Skip the hipcc compile.
    #[arg(long)]
    pub no_hip: bool,
    /// Internal: compile with NVRTC in this process (the parent has set
    /// LD_LIBRARY_PATH to the wheel's lib directory).
    #[arg(long, hide = true)]
    pub nvrtc_child: bool,
}

pub fn kernels(args: KernelsArgs) -> Result<()> {
    let out = venv::workspace_root().join("target").join("kernels");
    if args.nvrtc_child {
        return nvrtc_compile_all(&args.cuda_arch, &out.join(&args.cuda_arch));
    }
    let t0 = Instant::now();
    if !args.no_cuda {
        let t = Instant::now();
        let lib = nvrtc_lib_dir()?;
        let old = std::env::var("LD_LIBRARY_PATH").unwrap_or_default();
        let ld = if old.is_empty() {
            lib.display().to_string()
        } else {
            format!("{}:{old}", lib.display())
        };
        let exe = std::env::current_exe().context("locating the xtask binary")?;
        let status = Command::new(exe)
            .args(["kernels", "--nvrtc-child", "--cuda-arch", &args.cuda_arch])
            .env("LD_LIBRARY_PATH", ld)
            .status()
            .context("running the NVRTC compile child")?;
        if !status.success() {
            bail!("NVRTC compile for {} failed", args.cuda_arch);
        }
        eprintln!(
            "xtask kernels: NVRTC {} done in {:.1} s (wheel install included)",
            args.cuda_arch,
            t.elapsed().as_secs_f64()
        );
    }
    if !args.no_hip {
        let t = Instant::now();
        let hipcc = ensure_hipcc()?;
        hip_compile_all(&hipcc, &args.hip_arch, &out.join(&args.hip_arch))?;
        eprintln!(
            "xtask kernels: hipcc {} done in {:.1} s (install included)",
            args.hip_arch,
            t.elapsed().as_secs_f64()
        );
    }
    eprintln!(
        "xtask kernels: all {} kernel sources compiled in {:.1} s",
        kernels::ALL.len(),
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Install the NVRTC wheel into the venv and return the directory that
/// holds libnvrtc.so.*.
fn nvrtc_lib_dir() -> Result<PathBuf> {
    let py = venv::python(&[NVRTC_WHEEL])?;
    let o = Command::new(&py)
        .args([
            "-c",
            "import sysconfig; print(sysconfig.get_paths()['purelib'])",
        ])
        .output()
        .context("asking the venv python for site-packages")?;
    if !o.status.success() {
        bail!("{} could not report its site-packages", py.display());
    }
    let site = PathBuf::from(String::from_utf8_lossy(&o.stdout).trim());
    find_lib(&site.join("nvidia"), 3).with_context(|| {
        format!(
            "libnvrtc.so.* not found under {} after installing {NVRTC_WHEEL}",
            site.join("nvidia").display()
        )
    })
}

fn find_lib(dir: &Path, depth: u32) -> Option<PathBuf> {
    let entries = std::fs::read_dir(dir).ok()?;
    let mut subdirs = Vec::new();
    for e in entries.flatten() {
        let p = e.path();
        let name = e.file_name().to_string_lossy().to_string();
        if name.starts_with("libnvrtc.so.") {
            return Some(dir.to_path_buf());
        }
        if p.is_dir() {
            subdirs.push(p);
        }
    }
    if depth == 0 {
        return None;
    }
    subdirs.iter().find_map(|d| find_lib(d, depth - 1))
}

/// Write `bytes` to `path` through a temp name in the same directory.
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming to {}", path.display()))
}

fn nvrtc_compile_all(arch: &str, out: &Path) -> Result<()> {
    nvrtc::available()?;
    let (ma, mi) = nvrtc::version()?;
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    eprintln!("xtask kernels: NVRTC {ma}.{mi} -> {arch}");
    for k in kernels::ALL {
        let t = Instant::now();
        let bin = nvrtc::compile_cubin(k.name, &k.full_source(), arch, &k.nvrtc_options(arch))?;
        check_entries(k, &bin)?;
        write_atomic(&out.join(format!("{}.cubin", k.name)), &bin)?;
        eprintln!(
            "  {:8} {:>8} B CUBIN in {:6.0} ms",
            k.name,
            bin.len(),
            t.elapsed().as_secs_f64() * 1e3
        );
    }
    Ok(())
}

/// Every declared entry point must be in the binary (catches a kernel that
/// was renamed or lost its `extern "C"`).
fn check_entries(k: &KernelSource, bin: &[u8]) -> Result<()> {
    for e in k.entries {
        if !bin.windows(e.len()).any(|w| w == e.as_bytes()) {
            bail!(
                "{}: entry point {e} missing from the compiled binary",
                k.name
            );
        }
    }
    Ok(())
}

/// hipcc on PATH, installing Debian's package when missing.
fn ensure_hipcc() -> Result<PathBuf> {
    if let Some(p) = which("hipcc") {
        return Ok(p);
    }
    eprintln!("xtask kernels: hipcc missing, installing Debian's hipcc with apt-get");
    for args in [
        &["update"][..],
        &["install", "-y", "--no-install-recommends", "hipcc"][..],
    ] {
        let st = Command::new("apt-get")
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .context("running apt-get (is this Debian, running as root?)")?;
        if !st.success() {
            bail!(
                "apt-get {} failed (needs root and network to Debian)",
                args.join(" ")
            );
        }
    }
    which("hipcc").context("hipcc still not on PATH after apt-get install hipcc")
}

fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join(name))
            .find(|c| c.is_file())
    })
}

fn hip_compile_all(hipcc: &Path, arch: &str, out: &Path) -> Result<()> {
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    for k in kernels::ALL {
        let t = Instant::now();
        let src = out.join(format!("{}.hip", k.name));
        write_atomic(&src, k.full_source().as_bytes())?;
        let obj = out.join(format!("{}.co", k.name));
        let tmp = out.join(format!("{}.co.tmp", k.name));
        let o = Command::new(hipcc)
            .args(["-x", "hip"])
            .args(k.hip_options(arch))
            .arg("--genco")
            .arg(&src)
            .arg("-o")
            .arg(&tmp)
            .output()
            .with_context(|| format!("running {}", hipcc.display()))?;
        if !o.status.success() {
            bail!(
                "hipcc {arch} failed on {}:\n{}",
                k.name,
                String::from_utf8_lossy(&o.stderr)
            );
        }
        let bin = std::fs::read(&tmp).with_context(|| format!("reading {}", tmp.display()))?;
        check_entries(k, &bin)?;
        std::fs::rename(&tmp, &obj).with_context(|| format!("renaming to {}", obj.display()))?;
        eprintln!(
            "  {:8} {:>8} B code object ({arch}) in {:6.0} ms",
            k.name,
            bin.len(),
            t.elapsed().as_secs_f64() * 1e3
        );
    }
    Ok(())
}
