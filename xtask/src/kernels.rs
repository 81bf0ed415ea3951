//! `cargo xtask kernels`: compile every GPU kernel source for NVIDIA (NVRTC,
//! `sm_90`) and AMD (Debian's clang 22 for gfx950 and gfx942, Debian's hipcc
//! for gfx940), so a kernel that does not compile fails CI, which has no GPU.
//!
//! - NVRTC comes from the PyPI wheel `nvidia-cuda-nvrtc` (CUDA 13) installed
//!   into the project venv. cudarc loads libnvrtc with dlopen by name, so the
//!   compile runs in a child process (this binary again, `--nvrtc-child`)
//!   whose `LD_LIBRARY_PATH` holds the wheel's lib directory.
//! - clang 22 comes from Debian 12's security suite (`clang-22`, `lld-22`,
//!   installed with apt-get when missing and running as root). It knows
//!   gfx950 (MI350) and gfx942 (MI300). Debian's ROCm device libraries stop
//!   before those targets, so the kernels are compiled without the HIP
//!   headers and without device libraries (`-nogpuinc -nogpulib`), with
//!   `kernels/hip_freestanding.h` in front of the prelude supplying the HIP
//!   device API from clang builtins. Each target yields one code object per
//!   source, linked with `--no-undefined` (an unresolved call fails).
//! - hipcc comes from Debian 12's `hipcc` package (same installation). Its
//!   clang 15 stops at gfx940; it compiles with the real HIP headers, the
//!   route hiprtc takes at run time, so that route keeps compiling too.
//!
//! - gfx950 alone also gets `mfma_mx` (CDNA4 scaled MFMA: the native MX
//!   linears), disassembled with `llvm-objdump-22` and checked
//!   ([`isa::mfma_violations`]); the listing goes to
//!   `target/kernels/gfx950/mfma_mx.s`.
//!
//! - NVRTC and clang 22 for gfx950 also build the mono kernel
//!   (`standard_mono`: the small-step standard bodies behind
//!   `kernels/mono_prelude.h`; the host launches it on CUDA only). gfx942
//!   (clang 22, ~90 s of one core) and gfx940 (hipcc, 95 s here in session
//!   21) compile it too, left out of this gate for CI's time.
//!
//! None of these code objects has run on AMD hardware.
//!
//! `--seed-cache DIR` (not part of CI) compiles instead the CUDA units a
//! default GPU runner loads into DIR under the engine's disk-cache names;
//! `bench/device/pack.sh` carries that cache, built by the device's NVRTC
//! (13.0), so a fresh card skips ~6 minutes of one core's compiling.
//!
//! The NVRTC child runs beside clang and hipcc (cold on two cores, CI's
//! count, the step took 249 s in series, NVRTC 141 s of it); its per-kernel
//! lines print after theirs. Outputs go to `target/kernels/<arch>/`
//! (written to temp names, then renamed).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use m3_gpu::cuda::{compile_units, nvrtc, CubinUnit};
use m3_gpu::kernels::{self, KernelSource};
use m3_gpu::mfma_mx;

use crate::{isa, venv};

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
    /// AMD targets for clang 22 without ROCm (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "gfx950,gfx942")]
    pub clang_arch: Vec<String>,
    /// Skip the NVRTC compile.
    #[arg(long)]
    pub no_cuda: bool,
    /// Skip the hipcc compile (gfx940, HIP headers).
    #[arg(long)]
    pub no_hip: bool,
    /// Skip the clang 22 compile (gfx950 / gfx942, freestanding).
    #[arg(long)]
    pub no_clang: bool,
    /// Print the clang 22 compile warnings (they are counted either way).
    #[arg(long)]
    pub warnings: bool,
    /// Compile only these sources (comma-separated names, e.g.
    /// `standard_mono,linear`; default: all of them).
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// Instead of the CI compile: fill DIR as the engine's kernel disk
    /// cache (`M3_KERNEL_CACHE=DIR`) with the CUDA translation units a GPU
    /// runner compiles under its default options, for `--cuda-arch` and
    /// this NVRTC's major.minor (a card with that NVRTC then loads them
    /// instead of compiling: the mono kernel alone is ~3 minutes of one
    /// core). Units already in DIR are kept; other files in it removed.
    #[arg(long, value_name = "DIR")]
    pub seed_cache: Option<PathBuf>,
    /// The directory holding the libnvrtc.so to use (default: the PyPI
    /// wheel's, installed into the project venv).
    #[arg(long, value_name = "DIR")]
    pub nvrtc_lib: Option<PathBuf>,
    /// Internal: compile with NVRTC in this process (the parent has set
    /// LD_LIBRARY_PATH to the wheel's lib directory).
    #[arg(long, hide = true)]
    pub nvrtc_child: bool,
}

pub fn kernels(args: KernelsArgs) -> Result<()> {
    let out = venv::workspace_root().join("target").join("kernels");
    if args.nvrtc_child {
        return match &args.seed_cache {
            Some(dir) => nvrtc_seed(&args.cuda_arch, dir, &args.only),
            None => nvrtc_compile_all(&args.cuda_arch, &out.join(&args.cuda_arch), &args.only),
        };
    }
    check_only(&args.only)?;
    if args.seed_cache.is_some() {
        let t0 = Instant::now();
        NvrtcChild::spawn(&args)?.finish()?;
        eprintln!(
            "xtask kernels: cache seeded in {:.1} s",
            t0.elapsed().as_secs_f64()
        );
        return Ok(());
    }
    let t0 = Instant::now();
    // NVRTC is one thread and the slowest tool (the mono source alone took
    // 92 of its 141 s on two cores), so its child runs beside clang and
    // hipcc rather than before them (249 -> 181 s, bench/NOTES.md session 40).
    let nvrtc = if args.no_cuda {
        None
    } else {
        Some(NvrtcChild::spawn(&args)?)
    };
    // an AMD failure returns here, dropping (stopping) the NVRTC child
    compile_amd(&args, &out)?;
    if let Some(child) = nvrtc {
        child.finish()?;
    }
    eprintln!(
        "xtask kernels: all {} kernel sources (+ the small-step standard_decode, + {} gfx950-only) compiled in {:.1} s",
        kernels::ALL.len(),
        mfma_mx::GFX950_ONLY.len(),
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The NVRTC compile in its child process (this binary again, with the
/// wheel's lib directory on `LD_LIBRARY_PATH`), its stderr collected so the
/// per-kernel lines print as one block after the AMD ones.
struct NvrtcChild {
    arch: String,
    /// `--seed-cache` (no AMD compiles beside it).
    seeding: bool,
    start: Instant,
    child: std::process::Child,
    /// The stderr reader; taken by `finish` (None: the child was waited
    /// for, so dropping has nothing to stop).
    log: Option<std::thread::JoinHandle<std::io::Result<String>>>,
}

impl NvrtcChild {
    fn spawn(args: &KernelsArgs) -> Result<Self> {
        let start = Instant::now();
        let arch = args.cuda_arch.as_str();
        let lib = match &args.nvrtc_lib {
            Some(d) => d.clone(),
            None => nvrtc_lib_dir()?,
        };
        let old = std::env::var("LD_LIBRARY_PATH").unwrap_or_default();
        let ld = if old.is_empty() {
            lib.display().to_string()
        } else {
            format!("{}:{old}", lib.display())
        };
        let exe = std::env::current_exe().context("locating the xtask binary")?;
        let mut cmd = Command::new(exe);
        cmd.args(["kernels", "--nvrtc-child", "--cuda-arch", arch]);
        if !args.only.is_empty() {
            cmd.arg("--only").arg(args.only.join(","));
        }
        if let Some(d) = &args.seed_cache {
            cmd.arg("--seed-cache").arg(d);
        }
        let mut child = cmd
            .env("LD_LIBRARY_PATH", ld)
            .stderr(Stdio::piped())
            .spawn()
            .context("running the NVRTC compile child")?;
        let mut pipe = child.stderr.take().context("the NVRTC child's stderr")?;
        let log = std::thread::spawn(move || {
            let mut s = String::new();
            pipe.read_to_string(&mut s).map(|_| s)
        });
        Ok(Self {
            arch: arch.to_string(),
            seeding: args.seed_cache.is_some(),
            start,
            child,
            log: Some(log),
        })
    }

    /// Wait for the child, print its log, fail if it failed.
    fn finish(mut self) -> Result<()> {
        let log = self.log.take();
        let status = self
            .child
            .wait()
            .context("waiting for the NVRTC compile child")?;
        let log = log
            .context("the NVRTC log reader")?
            .join()
            .map_err(|_| anyhow::anyhow!("the NVRTC log reader panicked"))?
            .context("reading the NVRTC child's stderr")?;
        eprint!("{log}");
        if !status.success() {
            bail!("NVRTC compile for {} failed", self.arch);
        }
        eprintln!(
            "xtask kernels: NVRTC {} done in {:.1} s ({})",
            self.arch,
            self.start.elapsed().as_secs_f64(),
            if self.seeding {
                "cache seeding"
            } else {
                "wheel install included, beside the AMD compiles"
            }
        );
        Ok(())
    }
}

/// Dropped before `finish` (the AMD compiles failed or panicked): stop the
/// child, whose log would only bury that error.
impl Drop for NvrtcChild {
    fn drop(&mut self) {
        if self.log.is_some() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// clang 22 (gfx950, gfx942), then hipcc (gfx940), as `args` asks.
fn compile_amd(args: &KernelsArgs, out: &Path) -> Result<()> {
    if !args.no_clang {
        let t = Instant::now();
        let tools = ensure_tools(
            &[
                "clang-22",
                "ld.lld-22",
                "llvm-readelf-22",
                "llvm-objdump-22",
            ],
            &["clang-22", "lld-22", "llvm-22"],
        )?;
        let llvm = Llvm {
            clang: &tools[0],
            readelf: &tools[2],
            objdump: &tools[3],
        };
        clang_compile_archs(&llvm, &args.clang_arch, out, args.warnings, &args.only)?;
        eprintln!(
            "xtask kernels: clang 22 {} done in {:.1} s (install included)",
            args.clang_arch.join(", "),
            t.elapsed().as_secs_f64()
        );
    }
    if !args.no_hip {
        let t = Instant::now();
        let hipcc = ensure_tools(&["hipcc"], &["hipcc"])?.remove(0);
        hip_compile_all(
            &hipcc,
            &args.hip_arch,
            &out.join(&args.hip_arch),
            &args.only,
        )?;
        eprintln!(
            "xtask kernels: hipcc {} done in {:.1} s (install included)",
            args.hip_arch,
            t.elapsed().as_secs_f64()
        );
    }
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

fn nvrtc_compile_all(arch: &str, out: &Path, only: &[String]) -> Result<()> {
    nvrtc::available()?;
    let (ma, mi) = nvrtc::version()?;
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    eprintln!("xtask kernels: NVRTC {ma}.{mi} -> {arch}");
    let small = m3_gpu::standard::small_step_source()?;
    // the mono kernel (its HIP build: clang_compile_all)
    let mono = m3_gpu::standard::mono_step_source()?;
    // the small-step build's CUDA-only entry points (not in its HIP builds)
    let small_cuda = KernelSource {
        entries: Box::leak(
            small
                .entries
                .iter()
                .copied()
                .chain(m3_gpu::standard::small_step_cuda_entries())
                .collect::<Vec<_>>()
                .into_boxed_slice(),
        ),
        ..small
    };
    // the slowest first (mono 92 s, the small-step build 25 s on two cores), so
    // the short ones fill the end while the AMD compiles run beside
    for k in [&mono, &small_cuda].into_iter().chain(kernels::ALL.iter()) {
        if !selected(only, k.name) {
            continue;
        }
        let t = Instant::now();
        let bin = nvrtc::compile_cubin(k.name, &k.full_source(), arch, &k.nvrtc_options(arch))?;
        check_entries(k, &bin)?;
        write_atomic(&out.join(format!("{}.cubin", k.name)), &bin)?;
        eprintln!(
            "  {:16} {:>8} B CUBIN in {:6.0} ms",
            k.name,
            bin.len(),
            t.elapsed().as_secs_f64() * 1e3
        );
    }
    Ok(())
}

/// `--seed-cache`: [`m3_gpu::standard::runner_cuda_sources`] compiled into
/// `dir` under the engine's cache names ([`m3_gpu::cuda::CubinUnit`]).
fn nvrtc_seed(arch: &str, dir: &Path, only: &[String]) -> Result<()> {
    nvrtc::available()?;
    let ver = nvrtc::version()?;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    eprintln!(
        "xtask kernels: NVRTC {}.{} -> {arch}, seeding {}",
        ver.0,
        ver.1,
        dir.display()
    );
    let mut keep = Vec::new();
    let mut todo = Vec::new();
    for k in m3_gpu::standard::runner_cuda_sources()? {
        if !selected(only, k.name) {
            continue;
        }
        let u = CubinUnit::new(k, arch, ver);
        let file = format!("{}.cubin", u.key);
        if dir.join(&file).is_file() {
            eprintln!("  {:16} already in the cache", k.name);
        } else {
            todo.push(u);
        }
        keep.push(file);
    }
    if keep.is_empty() {
        // (the runner's small-step unit is named standard_decode)
        bail!(
            "--seed-cache: --only {} names none of the runner's units",
            only.join(",")
        );
    }
    // every unit on a thread of its own (the mono unit sets the time)
    let t = Instant::now();
    for (u, bin) in todo.iter().zip(compile_units(&todo, arch)) {
        let bin = bin?;
        check_entries(&u.src, &bin)?;
        write_atomic(&dir.join(format!("{}.cubin", u.key)), &bin)?;
        eprintln!("  {:16} {:>8} B CUBIN", u.src.name, bin.len());
    }
    if !todo.is_empty() {
        eprintln!(
            "  {} units in {:.1} s",
            todo.len(),
            t.elapsed().as_secs_f64()
        );
    }
    if only.is_empty() {
        for e in std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
            let e = e?;
            let name = e.file_name().to_string_lossy().to_string();
            if name.ends_with(".cubin") && !keep.contains(&name) {
                std::fs::remove_file(e.path())
                    .with_context(|| format!("removing the stale {}", e.path().display()))?;
            }
        }
    }
    Ok(())
}

/// Every `--only` name must be a kernel source (a typo would compile
/// nothing and pass).
fn check_only(only: &[String]) -> Result<()> {
    let (small, mono) = (
        m3_gpu::standard::small_step_source()?,
        m3_gpu::standard::mono_step_source()?,
    );
    let known: Vec<&str> = kernels::ALL
        .iter()
        .chain(mfma_mx::GFX950_ONLY)
        .chain([&small, &mono])
        .map(|k| k.name)
        .collect();
    for o in only {
        if !known.contains(&o.as_str()) {
            bail!(
                "--only {o}: no such kernel source (known: {})",
                known.join(", ")
            );
        }
    }
    Ok(())
}

/// Whether `--only` (empty: everything) takes the source `name`.
fn selected(only: &[String], name: &str) -> bool {
    only.is_empty() || only.iter().any(|o| o == name)
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

/// `bins` on PATH, in order, installing Debian's `packages` with apt-get
/// when any is missing.
fn ensure_tools(bins: &[&str], packages: &[&str]) -> Result<Vec<PathBuf>> {
    let have = || bins.iter().map(|b| which(b)).collect::<Option<Vec<_>>>();
    if let Some(p) = have() {
        return Ok(p);
    }
    eprintln!(
        "xtask kernels: {} missing, installing Debian's {} with apt-get",
        bins.join(" / "),
        packages.join(" ")
    );
    let mut install = vec!["install", "-y", "--no-install-recommends"];
    install.extend_from_slice(packages);
    for args in [&["update"][..], &install[..]] {
        let st = Command::new("apt-get")
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .context("running apt-get (is this Debian, running as root?)")?;
        if !st.success() {
            bail!(
                "apt-get {} failed (needs root and network to Debian 12 with bookworm-security \
                 enabled for clang-22 / lld-22)",
                args.join(" ")
            );
        }
    }
    match have() {
        Some(p) => Ok(p),
        None => bail!(
            "{} still not on PATH after apt-get install {}",
            bins.join(" / "),
            packages.join(" ")
        ),
    }
}

fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join(name))
            .find(|c| c.is_file())
    })
}

fn hip_compile_all(hipcc: &Path, arch: &str, out: &Path, only: &[String]) -> Result<()> {
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    eprintln!("xtask kernels: hipcc (HIP headers, ROCm 5.2 device libs) -> {arch}");
    for k in kernels::ALL.iter().filter(|k| selected(only, k.name)) {
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
            "  {:16} {:>8} B code object ({arch}) in {:6.0} ms",
            k.name,
            bin.len(),
            t.elapsed().as_secs_f64() * 1e3
        );
    }
    Ok(())
}

/// The clang 22 / LLVM 22 tools.
struct Llvm<'a> {
    clang: &'a Path,
    readelf: &'a Path,
    objdump: &'a Path,
}

/// One source compiled by clang 22 for one target.
struct ClangObject {
    name: &'static str,
    bytes: usize,
    ms: f64,
    warnings: usize,
    /// Registers and scratch per kernel, from the code object's metadata.
    kernels: Vec<isa::KernelResources>,
}

/// clang 22 for every target in `archs`, one thread per target (CI has two
/// cores); the report is printed per target once all are done: sizes and
/// times, then register / scratch use (the whole table for the first
/// target, a summary for the others; every table is also written to
/// `<arch>/resources.txt`). Fails on a compile error, on a VGPR spill in
/// any kernel, or on SGPR spills past a kernel's ceiling
/// ([`isa::SGPR_SPILL_CEILINGS`]).
fn clang_compile_archs(
    llvm: &Llvm<'_>,
    archs: &[String],
    out: &Path,
    show_warnings: bool,
    only: &[String],
) -> Result<()> {
    if archs.is_empty() {
        bail!("--clang-arch: no target given");
    }
    let results: Vec<Result<Vec<ClangObject>>> = std::thread::scope(|s| {
        let handles: Vec<_> = archs
            .iter()
            .map(|a| s.spawn(move || clang_compile_all(llvm, a, &out.join(a), show_warnings, only)))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("compile thread panicked")))
            })
            .collect()
    });
    let mut first_err = None;
    for (i, (arch, r)) in archs.iter().zip(results).enumerate() {
        let r = r.and_then(|objs| {
            eprintln!("xtask kernels: clang 22 (no ROCm headers or device libs) -> {arch}");
            for o in &objs {
                let w = match o.warnings {
                    0 => String::new(),
                    1 => ", 1 warning".to_string(),
                    n => format!(", {n} warnings"),
                };
                eprintln!(
                    "  {:16} {:>8} B code object ({arch}) in {:6.0} ms{w}",
                    o.name, o.bytes, o.ms
                );
            }
            report_resources(arch, &out.join(arch), &objs, i == 0)
        });
        if let Err(e) = r {
            eprintln!("xtask kernels: clang 22 {arch} FAILED: {e:#}");
            first_err.get_or_insert(e);
        }
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Every source for `arch`: [`kernels::ALL`], and on gfx950 also
/// [`mfma_mx::GFX950_ONLY`] (CDNA4 matrix instructions), whose code object
/// must then pass [`isa::mfma_violations`]: the required MFMA instruction in
/// each entry point, no scratch, VGPRs under [`mfma_mx::VGPR_CEILING`].
fn clang_compile_all(
    llvm: &Llvm<'_>,
    arch: &str,
    out: &Path,
    show_warnings: bool,
    only: &[String],
) -> Result<Vec<ClangObject>> {
    let (clang, readelf) = (llvm.clang, llvm.readelf);
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let extra: &[KernelSource] = if arch == mfma_mx::ARCH {
        mfma_mx::GFX950_ONLY
    } else {
        &[]
    };
    let small = m3_gpu::standard::small_step_source()?;
    // The mono kernel for gfx950 (MI350) alone: no HIP route launches it,
    // and a third of the AMD side's CPU went to it (90 s a target, CI's 2
    // cores: bench/NOTES.md session 50); gfx942 builds every other source.
    let mono = (arch == mfma_mx::ARCH)
        .then(m3_gpu::standard::mono_step_source)
        .transpose()?;
    let mut objs = Vec::new();
    for k in kernels::ALL
        .iter()
        .chain([&small])
        .chain(&mono)
        .chain(extra)
    {
        if !selected(only, k.name) {
            continue;
        }
        let t = Instant::now();
        let src = out.join(format!("{}.hip", k.name));
        write_atomic(&src, k.hip_freestanding_source().as_bytes())?;
        let obj = out.join(format!("{}.co", k.name));
        let tmp = out.join(format!("{}.co.tmp", k.name));
        let o = Command::new(clang)
            .args(["-x", "hip"])
            .args(k.hip_freestanding_options(arch))
            .arg(&src)
            .arg("-o")
            .arg(&tmp)
            .output()
            .with_context(|| format!("running {}", clang.display()))?;
        let stderr = String::from_utf8_lossy(&o.stderr);
        if !o.status.success() {
            bail!("clang 22 {arch} failed on {}:\n{stderr}", k.name);
        }
        if show_warnings && !stderr.trim().is_empty() {
            eprintln!("xtask kernels: clang 22 {arch} {}:\n{stderr}", k.name);
        }
        let bin = std::fs::read(&tmp).with_context(|| format!("reading {}", tmp.display()))?;
        check_entries(k, &bin)?;
        std::fs::rename(&tmp, &obj).with_context(|| format!("renaming to {}", obj.display()))?;
        let ms = t.elapsed().as_secs_f64() * 1e3;
        let kernels = isa::read(readelf, &obj)?;
        for e in k.entries {
            if !kernels.iter().any(|r| r.name == *e) {
                bail!(
                    "{} ({arch}): entry point {e} missing from the code object's metadata",
                    k.name
                );
            }
        }
        if extra.iter().any(|e| e.name == k.name) {
            let disasm = isa::disassemble(llvm.objdump, arch, &obj)?;
            let bad = isa::mfma_violations(
                &kernels,
                &isa::instructions_by_kernel(&disasm),
                mfma_mx::REQUIRED_INSTRUCTIONS,
                mfma_mx::VGPR_CEILING,
            );
            if !bad.is_empty() {
                bail!(
                    "{} ({arch}) fails the MFMA ISA check:\n  {}",
                    k.name,
                    bad.join("\n  ")
                );
            }
            write_atomic(&out.join(format!("{}.s", k.name)), disasm.as_bytes())?;
            eprintln!(
                "xtask kernels: {arch} {}: {} present, no scratch, VGPRs <= {} (not run on hardware)",
                k.name,
                mfma_mx::REQUIRED_INSTRUCTIONS
                    .iter()
                    .map(|(e, i)| format!("{e}: {i}"))
                    .collect::<Vec<_>>()
                    .join(", "),
                mfma_mx::VGPR_CEILING
            );
        }
        objs.push(ClangObject {
            name: k.name,
            bytes: bin.len(),
            ms,
            warnings: stderr.matches(": warning: ").count(),
            kernels,
        });
    }
    Ok(objs)
}

/// Write `<dir>/resources.txt`, print the table (`full`) or a summary, and
/// fail on a spill that breaks the rule (`isa::violations`).
fn report_resources(arch: &str, dir: &Path, objs: &[ClangObject], full: bool) -> Result<()> {
    let rows: Vec<(&str, isa::KernelResources)> = objs
        .iter()
        .flat_map(|o| o.kernels.iter().map(move |k| (o.name, k.clone())))
        .collect();
    let table = isa::table(&rows);
    write_atomic(&dir.join("resources.txt"), table.as_bytes())?;
    let spilling: Vec<&str> = rows
        .iter()
        .filter(|(_, k)| k.spills())
        .map(|(_, k)| k.name.as_str())
        .collect();
    let scratch = rows.iter().filter(|(_, k)| k.scratch > 0).count();
    eprintln!(
        "xtask kernels: {arch} resources (compiler metadata, {}): {} kernels, {scratch} use scratch, \
         {} spill registers{}{}",
        dir.join("resources.txt").display(),
        rows.len(),
        spilling.len(),
        if spilling.is_empty() { "" } else { ": " },
        spilling.join(", ")
    );
    if full {
        eprint!("{table}");
    }
    for (k, ceiling) in isa::slack(&rows) {
        eprintln!(
            "xtask kernels: {arch} {} spills {} SGPRs, below its ceiling of {ceiling}: \
             lower it in xtask/src/isa.rs",
            k.name, k.sgpr_spill
        );
    }
    let bad = isa::violations(&rows);
    if !bad.is_empty() {
        let names: Vec<String> = bad
            .iter()
            .map(|k| {
                format!(
                    "{} ({} VGPR / {} SGPR spills, SGPR ceiling {})",
                    k.name,
                    k.vgpr_spill,
                    k.sgpr_spill,
                    isa::sgpr_spill_ceiling(&k.name)
                )
            })
            .collect();
        bail!(
            "{arch}: no kernel may spill VGPRs, nor SGPRs past its ceiling \
             (xtask/src/isa.rs): {}",
            names.join(", ")
        );
    }
    Ok(())
}
