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
        let full = src.full_source();
        let opts = src.nvrtc_options(&self.info.arch);
        let key = cubin_key(&full, &self.info.arch, &opts, self.info.nvrtc);
        if let Some(m) = self.modules.lock().ok().and_then(|m| m.get(&key).cloned()) {
            return Ok(m);
        }
        let t0 = Instant::now();
        let mut from = LoadedFrom::Disk;
        let mut module = None;
        let mut bytes = 0;
        if let Some(bin) = self.disk.as_ref().and_then(|d| d.get(&key)) {
            bytes = bin.len();
            // a corrupt or foreign file just falls through to a compile
            module = self.ctx.load_module(Ptx::from_binary(bin)).ok();
        }
        let module = match module {
            Some(m) => m,
            None => {
                from = LoadedFrom::Compiled;
                let bin = nvrtc::compile_cubin(src.name, &full, &self.info.arch, &opts)?;
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

/// The disk-cache key of a translation unit (`full_source`, `opts`:
/// [`KernelSource::full_source`] and [`KernelSource::nvrtc_options`])
/// compiled by NVRTC `nvrtc` (major, minor) for `arch`: what
/// [`CudaGpu::module`] looks up, so a cache filled on another machine
/// (`cargo xtask kernels --cache-dir`: the device scripts' seeded cache)
/// is found under the same name.
pub fn cubin_key(full_source: &str, arch: &str, opts: &[String], nvrtc: (i32, i32)) -> String {
    let ver = format!("nvrtc {}.{}", nvrtc.0, nvrtc.1);
    cache::key(full_source, arch, opts, &ver)
}
