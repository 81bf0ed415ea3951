//! A CUDA device: discovery that never panics, and kernel modules compiled
//! by NVRTC for the device's own `sm_XX`, cached in memory and on disk.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use cudarc::driver::sys::CUdevice_attribute as Attr;
use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream};
use cudarc::nvrtc::Ptx;

use super::nvrtc::{self, guard_as};
use crate::cache::{self, DiskCache};
use crate::error::{GpuError, Result};
use crate::kernels::{KernelSource, Vendor};

/// What the device reports about itself (for logs and bench notes).
#[derive(Clone, Debug)]
pub struct DeviceInfo {
    pub ordinal: usize,
    pub name: String,
    /// Compute capability (major, minor).
    pub cc: (i32, i32),
    /// The NVRTC target, e.g. `sm_90`.
    pub arch: String,
    pub sm_count: i32,
    /// Peak SM clock, kHz (driver attribute, not the current clock).
    pub sm_clock_khz: i32,
    /// Peak memory clock, kHz.
    pub mem_clock_khz: i32,
    pub bus_width_bits: i32,
    pub l2_bytes: i32,
    pub total_mem_bytes: usize,
    /// NVRTC (major, minor).
    pub nvrtc: (i32, i32),
}

/// How a module got loaded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LoadedFrom {
    /// Compiled now by NVRTC.
    Compiled,
    /// Read from the on-disk cache.
    Disk,
}

/// One module load, for compile-time reporting.
#[derive(Clone, Debug)]
pub struct ModuleLoad {
    pub name: &'static str,
    pub from: LoadedFrom,
    /// Wall time of compile (or disk read) plus module load, ms.
    pub ms: f64,
    pub cubin_bytes: usize,
}

/// An open CUDA device with its stream and module cache.
pub struct CudaGpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    info: DeviceInfo,
    disk: Option<DiskCache>,
    modules: Mutex<HashMap<String, Arc<CudaModule>>>,
    /// CUBINs [`CudaGpu::precompile`] made and no module has loaded yet
    /// (by cache key; memory only where the disk cache is off).
    compiled: Mutex<HashMap<String, Vec<u8>>>,
    loads: Mutex<Vec<ModuleLoad>>,
    /// The context as the runtime line's handle (`api::Gpu::device`).
    device: crate::runtime::api::Device,
}

impl CudaGpu {
    /// Open device `ordinal`. Every failure (no libcuda, no device, no
    /// libnvrtc, an arch NVRTC cannot target) is a `GpuError`, never a panic,
    /// so the caller can fall back to the CPU backend.
    pub fn open(ordinal: usize) -> Result<Self> {
        // SAFETY: only tries to dlopen libcuda's candidate names.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err(GpuError::NoDriver(
                "libcuda.so not found (no NVIDIA driver on this machine)".to_string(),
            ));
        }
        let (ctx, cc) = guard_as("CUDA driver", GpuError::NoDriver, || {
            cudarc::driver::result::init()
                .map_err(|e| GpuError::NoDriver(format!("cuInit: {e}")))?;
            let n = cudarc::driver::result::device::get_count()
                .map_err(|e| GpuError::NoDevice(format!("cuDeviceGetCount: {e}")))?;
            if n <= 0 {
                return Err(GpuError::NoDevice(
                    "the driver reports 0 CUDA devices".to_string(),
                ));
            }
            if ordinal >= n as usize {
                return Err(GpuError::NoDevice(format!(
                    "device {ordinal} requested, {n} present"
                )));
            }
            let ctx = CudaContext::new(ordinal)
                .map_err(|e| GpuError::NoDevice(format!("context on device {ordinal}: {e}")))?;
            let cc = ctx
                .compute_capability()
                .map_err(|e| GpuError::driver("cuDeviceGetAttribute", e))?;
            Ok((ctx, cc))
        })?;
        let arch = format!("sm_{}{}", cc.0, cc.1);
        let nv = nvrtc::version()?;
        let archs = nvrtc::supported_archs()?;
        if !archs.contains(&(cc.0 * 10 + cc.1)) {
            return Err(GpuError::UnsupportedArch {
                arch,
                why: format!("NVRTC {}.{} supports {archs:?}", nv.0, nv.1),
            });
        }
        let attr = |a: Attr| ctx.attribute(a).unwrap_or(-1);
        let info = DeviceInfo {
            ordinal,
            name: ctx.name().unwrap_or_else(|_| "?".to_string()),
            cc,
            arch,
            sm_count: attr(Attr::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT),
            sm_clock_khz: attr(Attr::CU_DEVICE_ATTRIBUTE_CLOCK_RATE),
            mem_clock_khz: attr(Attr::CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE),
            bus_width_bits: attr(Attr::CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH),
            l2_bytes: attr(Attr::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE),
            total_mem_bytes: ctx.total_mem().unwrap_or(0),
            nvrtc: nv,
        };
        let stream = ctx.default_stream();
        Ok(CudaGpu {
            device: crate::runtime::api::Device::cuda(ctx.clone()),
            ctx,
            stream,
            info,
            disk: cache::default_dir().map(|d| DiskCache::new(d, "cubin")),
            modules: Mutex::new(HashMap::new()),
            compiled: Mutex::new(HashMap::new()),
            loads: Mutex::new(Vec::new()),
        })
    }

    /// Use `dir` as the disk cache (`None`: memory only).
    pub fn set_disk_cache(&mut self, dir: Option<std::path::PathBuf>) {
        self.disk = dir.map(|d| DiskCache::new(d, "cubin"));
    }

    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }
    /// The kernels' vendor on this device (compat.h's `M3_CUDA`).
    pub fn vendor(&self) -> Vendor {
        Vendor::Cuda
    }
    /// Lanes of a warp here (`M3_WARP`): what launches that size blocks by
    /// warps divide by.
    pub fn warp(&self) -> u32 {
        self.vendor().warp()
    }
    /// The cudarc context (the op harness's launches; the engine goes
    /// through [`crate::runtime::api::Gpu::device`]).
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }
    /// This context as the runtime line's handle.
    pub(crate) fn device_handle(&self) -> &crate::runtime::api::Device {
        &self.device
    }
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
    /// Every module load so far (compile times).
    pub fn loads(&self) -> Vec<ModuleLoad> {
        self.loads.lock().map(|l| l.clone()).unwrap_or_default()
    }

    /// The module for `src`, compiled for this device's arch on first use.
    pub fn module(&self, src: &KernelSource) -> Result<Arc<CudaModule>> {
        let CubinUnit {
            full, opts, key, ..
        } = CubinUnit::new(*src, &self.info.arch, self.info.nvrtc);
        if let Some(m) = self.modules.lock().ok().and_then(|m| m.get(&key).cloned()) {
            return Ok(m);
        }
        let t0 = Instant::now();
        let mut from = LoadedFrom::Disk;
        let mut module = None;
        let mut bytes = 0;
        let ready = self.compiled.lock().ok().and_then(|mut c| c.remove(&key));
        if let Some(bin) = ready.or_else(|| self.disk.as_ref().and_then(|d| d.get(&key))) {
            bytes = bin.len();
            // a corrupt or foreign file just falls through to a compile
            module = self.ctx.load_module(Ptx::from_binary(bin)).ok();
        }
        let module = match module {
            Some(m) => m,
            None => {
                from = LoadedFrom::Compiled;
                self.say_compiling(&[src.name]);
                let bin = nvrtc::compile_cubin(src.name, &full, &self.info.arch, &opts)?;
                tracing::info!(
                    "compiled {} in {:.1} s",
                    src.name,
                    t0.elapsed().as_secs_f64()
                );
                bytes = bin.len();
                if let Some(d) = &self.disk {
                    if let Err(e) = d.put(&key, &bin) {
                        tracing::warn!("kernel cache not written: {e}");
                    }
                }
                self.ctx
                    .load_module(Ptx::from_binary(bin))
                    .map_err(|e| GpuError::driver("cuModuleLoadData", e))?
            }
        };
        let ms = t0.elapsed().as_secs_f64() * 1e3;
        if let Ok(mut l) = self.loads.lock() {
            l.push(ModuleLoad {
                name: src.name,
                from,
                ms,
                cubin_bytes: bytes,
            });
        }
        if let Ok(mut m) = self.modules.lock() {
            m.insert(key, module.clone());
        }
        Ok(module)
    }

    /// Compile those of `srcs` that neither memory nor the disk cache
    /// holds, all at once on up to one thread each
    /// ([`nvrtc::compile_many`]), so the [`CudaGpu::module`] calls that
    /// follow load them: a fresh machine's first load then waits for its
    /// slowest unit, not their sum. A unit that fails here is left for
    /// `module` to compile again and report where it is used.
    pub fn precompile(&self, srcs: &[KernelSource]) {
        let arch = self.info.arch.as_str();
        let mut todo: Vec<CubinUnit> = Vec::new();
        for src in srcs {
            let u = CubinUnit::new(*src, arch, self.info.nvrtc);
            let have = self.modules.lock().is_ok_and(|m| m.contains_key(&u.key))
                || self.compiled.lock().is_ok_and(|c| c.contains_key(&u.key))
                || self.disk.as_ref().is_some_and(|d| d.contains(&u.key))
                || todo.iter().any(|t| t.key == u.key);
            if !have {
                todo.push(u);
            }
        }
        if todo.is_empty() {
            return;
        }
        let names: Vec<&str> = todo.iter().map(|u| u.src.name).collect();
        self.say_compiling(&names);
        let t0 = Instant::now();
        let bins = compile_units(&todo, arch);
        let mut ok = 0;
        for (u, bin) in todo.iter().zip(bins) {
            match bin {
                Ok(bin) => {
                    ok += 1;
                    if let Some(d) = &self.disk {
                        if let Err(e) = d.put(&u.key, &bin) {
                            tracing::warn!("kernel cache not written: {e}");
                        }
                    }
                    if let Ok(mut c) = self.compiled.lock() {
                        c.insert(u.key.clone(), bin);
                    }
                }
                Err(e) => {
                    tracing::debug!(
                        "precompile of {} failed (left to its load): {e}",
                        u.src.name
                    )
                }
            }
        }
        tracing::info!(
            "compiled {ok} of {} kernel modules in {:.1} s",
            todo.len(),
            t0.elapsed().as_secs_f64()
        );
    }

    /// Say on stderr (tracing, info) that `names` compile now: the first
    /// use on a machine takes minutes (the mono unit alone ~3.4 minutes of
    /// one core), so a silent wait would look like a hang.
    fn say_compiling(&self, names: &[&str]) {
        let cache = match &self.disk {
            Some(d) => format!("cached in {} for the next run", d.dir().display()),
            None => "the disk cache is off (M3_KERNEL_CACHE=off): every run compiles".to_string(),
        };
        tracing::info!(
            "compiling GPU kernels {} for {} with NVRTC {}.{} (once a machine; the largest take minutes; {cache})",
            names.join(", "),
            self.info.arch,
            self.info.nvrtc.0,
            self.info.nvrtc.1
        );
    }

    /// Kernel `entry` of module `src`.
    pub fn function(&self, src: &KernelSource, entry: &str) -> Result<CudaFunction> {
        let m = self.module(src)?;
        m.load_function(entry).map_err(|e| {
            GpuError::driver("cuModuleGetFunction", format!("{}::{entry}: {e}", src.name))
        })
    }

    /// Wait for the stream and surface any asynchronous launch error.
    pub fn sync(&self) -> Result<()> {
        self.stream
            .synchronize()
            .map_err(|e| GpuError::driver("cuStreamSynchronize", e))
    }
}

/// One translation unit as NVRTC takes it for `arch`: its full text,
/// options and disk-cache key (source, arch, flags, "nvrtc MAJOR.MINOR"),
/// the name [`CudaGpu::module`] looks up, so a cache filled on another
/// machine (`cargo xtask kernels --seed-cache`: the device scripts' seeded
/// cache) is found under the same name.
pub struct CubinUnit {
    pub src: KernelSource,
    pub full: String,
    pub opts: Vec<String>,
    pub key: String,
}

impl CubinUnit {
    pub fn new(src: KernelSource, arch: &str, nvrtc: (i32, i32)) -> Self {
        let (full, opts) = (src.full_source(), src.nvrtc_options(arch));
        let ver = format!("nvrtc {}.{}", nvrtc.0, nvrtc.1);
        let key = cache::key(&full, arch, &opts, &ver);
        CubinUnit {
            src,
            full,
            opts,
            key,
        }
    }
}

/// `units` compiled for `arch`, each on a thread of its own up to the
/// machine's cores ([`nvrtc::compile_many`]); results in their order.
pub fn compile_units(units: &[CubinUnit], arch: &str) -> Vec<Result<Vec<u8>>> {
    let jobs: Vec<nvrtc::CompileJob<'_>> = units
        .iter()
        .map(|u| nvrtc::CompileJob {
            name: u.src.name,
            src: &u.full,
            opts: &u.opts,
        })
        .collect();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    nvrtc::compile_many(&jobs, arch, threads)
}
