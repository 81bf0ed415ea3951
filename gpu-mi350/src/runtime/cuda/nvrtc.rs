//! NVRTC: CUDA C++ source straight to CUBIN for a real `sm_XX`, through
//! cudarc's dynamically loaded libnvrtc (building needs no CUDA at all).
//! Needs no GPU: `cargo xtask kernels` uses it on CI with the PyPI wheel.

use std::ffi::{c_char, CString};

use cudarc::nvrtc::{result, sys};

use crate::error::{GpuError, Result};

/// Run `f`, turning a panic inside cudarc (a missing library or symbol) into
/// a `GpuError` so that discovery never panics.
pub(crate) fn guard<T>(what: &'static str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    guard_as(what, GpuError::NoCompiler, f)
}

/// [`guard`] with the error variant a panic turns into.
pub(crate) fn guard_as<T>(
    what: &'static str,
    mk: fn(String) -> GpuError,
    f: impl FnOnce() -> Result<T>,
) -> Result<T> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(p) => {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "unknown panic".to_string());
            Err(mk(format!("{what}: {msg}")))
        }
    }
}

/// Whether libnvrtc can be loaded (LD_LIBRARY_PATH / the loader's paths).
pub fn available() -> Result<()> {
    // SAFETY: only tries to dlopen the candidate names; no symbol is called.
    if unsafe { sys::is_culib_present() } {
        Ok(())
    } else {
        Err(GpuError::NoCompiler(
            "libnvrtc (e.g. libnvrtc.so.13) not found on the loader path; install CUDA or the \
             nvidia-cuda-nvrtc wheel and add its lib directory to LD_LIBRARY_PATH"
                .to_string(),
        ))
    }
}

/// NVRTC's (major, minor) version; part of the module cache key.
pub fn version() -> Result<(i32, i32)> {
    available()?;
    guard("nvrtcVersion", || {
        let (mut ma, mut mi) = (0, 0);
        // SAFETY: two valid out-pointers.
        unsafe { sys::nvrtcVersion(&mut ma, &mut mi) }
            .result()
            .map_err(|e| GpuError::NoCompiler(format!("nvrtcVersion: {e}")))?;
        Ok((ma, mi))
    })
}

/// The real architectures this NVRTC can emit CUBIN for (e.g. 90 for sm_90).
pub fn supported_archs() -> Result<Vec<i32>> {
    available()?;
    guard("nvrtcGetSupportedArchs", || {
        let mut n = 0;
        // SAFETY: valid out-pointer; then a buffer of exactly n ints.
        unsafe { sys::nvrtcGetNumSupportedArchs(&mut n) }
            .result()
            .map_err(|e| GpuError::NoCompiler(format!("nvrtcGetNumSupportedArchs: {e}")))?;
        let mut v = vec![0i32; n.max(0) as usize];
        unsafe { sys::nvrtcGetSupportedArchs(v.as_mut_ptr()) }
            .result()
            .map_err(|e| GpuError::NoCompiler(format!("nvrtcGetSupportedArchs: {e}")))?;
        Ok(v)
    })
}

/// Compile one translation unit to CUBIN with `opts` (which must name a
/// real `--gpu-architecture=sm_XX`). On failure the error holds NVRTC's log.
pub fn compile_cubin(name: &str, src: &str, arch: &str, opts: &[String]) -> Result<Vec<u8>> {
    available()?;
    let csrc = CString::new(src)
        .map_err(|_| GpuError::input("compile", format!("{name}: source holds a NUL byte")))?;
    let cname = CString::new(format!("{name}.cu"))
        .map_err(|_| GpuError::input("compile", "name holds a NUL byte"))?;
    if let Some(o) = opts.iter().find(|o| o.contains('\0')) {
        return Err(GpuError::input(
            "compile",
            format!("option {o:?} holds a NUL byte"),
        ));
    }
    guard("nvrtc compile", || {
        let prog = result::create_program(&csrc, Some(&cname))
            .map_err(|e| GpuError::NoCompiler(format!("nvrtcCreateProgram: {e}")))?;
        // SAFETY: prog is live until destroy_program below; options hold no NUL.
        let compiled = unsafe { result::compile_program(prog, opts) };
        let out = match compiled {
            Ok(()) => unsafe { get_cubin(prog) },
            Err(e) => {
                let log = unsafe { result::get_program_log(prog) }
                    .map(|l| c_chars_to_string(&l))
                    .unwrap_or_else(|_| "(no log)".to_string());
                Err(GpuError::Compile {
                    name: name.to_string(),
                    arch: arch.to_string(),
                    log: format!("{e}: {log}"),
                })
            }
        };
        // SAFETY: prog came from create_program and is destroyed once.
        let _ = unsafe { result::destroy_program(prog) };
        out
    })
}

/// One translation unit for [`compile_many`].
pub struct CompileJob<'a> {
    pub name: &'a str,
    pub src: &'a str,
    pub opts: &'a [String],
}

/// [`compile_cubin`] over `jobs` on up to `threads` threads at once (NVRTC
/// takes concurrent compiles of distinct programs; one compile is one
/// thread, so a runner's first load of several modules otherwise waits
/// for their sum: ~6 minutes of one core for the default set, the mono
/// unit ~3.4 of it). Results in the order of `jobs`.
pub fn compile_many(jobs: &[CompileJob<'_>], arch: &str, threads: usize) -> Vec<Result<Vec<u8>>> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;
    let next = AtomicUsize::new(0);
    let out: Vec<Mutex<Option<Result<Vec<u8>>>>> = jobs.iter().map(|_| Mutex::new(None)).collect();
    std::thread::scope(|s| {
        for _ in 0..threads.clamp(1, jobs.len().max(1)) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(j) = jobs.get(i) else { break };
                let r = compile_cubin(j.name, j.src, arch, j.opts);
                if let Ok(mut slot) = out[i].lock() {
                    *slot = Some(r);
                }
            });
        }
    });
    out.into_iter()
        .zip(jobs)
        .map(|(m, j)| {
            m.into_inner().ok().flatten().unwrap_or_else(|| {
                Err(GpuError::NoCompiler(format!(
                    "{}: the compile thread stopped without a result",
                    j.name
                )))
            })
        })
        .collect()
}

/// # Safety
/// `prog` must be a live, successfully compiled program.
unsafe fn get_cubin(prog: sys::nvrtcProgram) -> Result<Vec<u8>> {
    let mut size = 0usize;
    sys::nvrtcGetCUBINSize(prog, &mut size)
        .result()
        .map_err(|e| {
            GpuError::NoCompiler(format!(
                "nvrtcGetCUBINSize: {e} (was a real sm_XX requested?)"
            ))
        })?;
    let mut buf = vec![0u8; size];
    sys::nvrtcGetCUBIN(prog, buf.as_mut_ptr() as *mut c_char)
        .result()
        .map_err(|e| GpuError::NoCompiler(format!("nvrtcGetCUBIN: {e}")))?;
    if buf.is_empty() {
        return Err(GpuError::NoCompiler(
            "NVRTC returned an empty CUBIN".to_string(),
        ));
    }
    Ok(buf)
}

fn c_chars_to_string(v: &[c_char]) -> String {
    let bytes: Vec<u8> = v
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).trim().to_string()
}
