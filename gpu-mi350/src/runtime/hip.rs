//! HIP (AMD, MI350 = gfx950) through a small binding loaded at run time with
//! `libloading` (libamdhip64.so + libhiprtc.so), so building needs no ROCm.
//!
//! **Untested on hardware**: no AMD GPU has been available to this project.
//! The binding compiles and its discovery path fails cleanly where ROCm is
//! absent; kernels are checked to compile with hipcc in `cargo xtask kernels`.
//! Bound: init, device count and arch name, the compute units and a
//! function's occupancy (optional symbols: the mono path's grid), hiprtc
//! compile to a code
//! object (cached in memory and on disk like NVRTC's CUBINs), module load,
//! launch (3-D grid, dynamic shared memory, on a stream), malloc, memset,
//! memcpy (and async copies / memset on a stream), free, memory info;
//! streams, timing events and stream capture into graphs ([`HipStream`],
//! [`HipEvent`], [`HipGraph`]). These are the HIP half of the runtime line
//! ([`crate::runtime::api`]): the standard path runs on them through
//! [`HipGpu`]'s `Gpu` implementation. Their call sequences are unit-tested
//! against stub tables that record every call (`tests` below, and
//! `stub`: a table backed by host memory that a whole standard-path step
//! runs on); nothing here has run on AMD hardware.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};
use std::ptr;
use std::sync::{Arc, Mutex};

use libloading::Library;

use crate::cache::{self, DiskCache};
use crate::error::{GpuError, Result};
use crate::kernels::{KernelSource, Vendor};

#[cfg(test)]
#[path = "hip_stub.rs"]
pub(crate) mod stub;

pub(crate) type HipError = c_int;
pub(crate) type HiprtcResult = c_int;
pub(crate) type HipModule = *mut c_void;
pub(crate) type HipFunction = *mut c_void;
pub(crate) type HiprtcProgram = *mut c_void;
pub(crate) type HipStreamT = *mut c_void;
pub(crate) type HipEventT = *mut c_void;
pub(crate) type HipGraphT = *mut c_void;
pub(crate) type HipGraphExecT = *mut c_void;

/// hipMemcpyHostToDevice / DeviceToHost.
pub(crate) const HIP_MEMCPY_H2D: c_int = 1;
pub(crate) const HIP_MEMCPY_D2H: c_int = 2;
/// hipMemcpyDeviceToDevice.
pub(crate) const HIP_MEMCPY_D2D: c_int = 3;
/// hipStreamNonBlocking: no implicit ordering with the null stream.
const HIP_STREAM_NON_BLOCKING: c_uint = 1;
/// hipEventDefault (timing enabled).
const HIP_EVENT_DEFAULT: c_uint = 0;
/// hipEventDisableTiming: an event that only orders streams.
const HIP_EVENT_DISABLE_TIMING: c_uint = 2;
/// hipStreamCaptureModeThreadLocal: other threads' calls are not captured.
pub(crate) const HIP_CAPTURE_MODE_THREAD_LOCAL: c_int = 1;
/// hipDeviceProp_t is large and its layout moves between ROCm versions, so
/// `hipGetDeviceProperties` writes into this generous buffer and the
/// `gcnArchName` string is searched for (see `arch_name`).
const PROPS_BYTES: usize = 4096;
/// Compute units assumed where the query below fails (see
/// [`CuQuery`]): 256 is MI350X's / MI355X's count; the standard path only
/// sizes grid-stride generation launches by it. The mono path needs the
/// true count (its grid is all resident) and is refused without it.
const ASSUMED_CUS: u32 = 256;

/// `hipDeviceAttribute_t` values of ROCm 6 and later (the numbering was
/// reordered in ROCm 6, so they are used only when the runtime reports
/// 6 or later, and checked against two attributes whose values are known
/// before the compute units are believed).
const ATTR_COOPERATIVE_LAUNCH: c_int = 10;
const ATTR_MAX_THREADS_PER_BLOCK: c_int = 56;
const ATTR_MULTIPROCESSOR_COUNT: c_int = 63;
const ATTR_WARP_SIZE: c_int = 87;

/// Optional entry points: the device queries that size the mono path's
/// all-resident grid. A runtime without one still opens (the standard
/// path does not need them); the mono path is then refused, saying why.
#[derive(Default)]
pub(crate) struct Queries {
    /// hipRuntimeGetVersion: HIP_VERSION, major * 10^7 + minor * 10^5 + patch.
    pub runtime_version: Option<unsafe extern "C" fn(*mut c_int) -> HipError>,
    /// hipDeviceGetAttribute(value, attribute, device).
    pub device_attribute: Option<unsafe extern "C" fn(*mut c_int, c_int, c_int) -> HipError>,
    /// hipModuleOccupancyMaxActiveBlocksPerMultiprocessor(blocks, f,
    /// block size, dynamic shared memory bytes).
    pub occupancy: Option<unsafe extern "C" fn(*mut c_int, HipFunction, c_int, usize) -> HipError>,
}

/// The compute units of device 0 (`hipDeviceAttributeMultiprocessorCount`),
/// or why they could not be trusted.
pub(crate) type CuQuery = std::result::Result<u32, String>;

/// Query device 0's compute units through `q` (see [`Queries`]).
fn query_cus(q: &Queries) -> CuQuery {
    let (Some(version), Some(attr)) = (q.runtime_version, q.device_attribute) else {
        return Err("hipRuntimeGetVersion / hipDeviceGetAttribute are not in this runtime".into());
    };
    let mut v = 0;
    // SAFETY: a valid out-pointer.
    let rc = unsafe { version(&mut v) };
    if rc != 0 {
        return Err(format!("hipRuntimeGetVersion failed (error code {rc})"));
    }
    if v / 10_000_000 < 6 {
        return Err(format!(
            "HIP runtime {v}: before ROCm 6 the device attributes are numbered otherwise"
        ));
    }
    let get = |a: c_int, name: &str| -> CuQuery {
        let mut x = 0;
        // SAFETY: a valid out-pointer; device 0 exists (checked at open).
        let rc = unsafe { attr(&mut x, a, 0) };
        if rc != 0 {
            return Err(format!(
                "hipDeviceGetAttribute({name}) failed (error code {rc})"
            ));
        }
        u32::try_from(x).map_err(|_| format!("hipDeviceGetAttribute({name}) gave {x}"))
    };
    let (tpb, warp) = (
        get(ATTR_MAX_THREADS_PER_BLOCK, "MaxThreadsPerBlock")?,
        get(ATTR_WARP_SIZE, "WarpSize")?,
    );
    if tpb != 1024 || !(warp == 32 || warp == 64) {
        return Err(format!(
            "HIP runtime {v}: the attribute numbering check failed (threads a block {tpb}, warp size {warp})"
        ));
    }
    // the mono kernel is launched like any (as on CUDA), its grid sized to
    // be all resident; a device that cannot launch cooperatively gives no
    // promise of co-residency to lean on, so mono is not offered there
    if get(ATTR_COOPERATIVE_LAUNCH, "CooperativeLaunch")? == 0 {
        return Err("the device does not support cooperative launches (hipDeviceAttributeCooperativeLaunch 0)".into());
    }
    match get(ATTR_MULTIPROCESSOR_COUNT, "MultiprocessorCount")? {
        0 => Err("hipDeviceGetAttribute(MultiprocessorCount) gave 0".into()),
        n => Ok(n),
    }
}

/// The HIP and hiprtc entry points the binding calls (one field a symbol,
/// the C signature as declared by HIP's headers).
pub(crate) struct Fns {
    pub init: unsafe extern "C" fn(c_uint) -> HipError,
    pub get_device_count: unsafe extern "C" fn(*mut c_int) -> HipError,
    pub get_device_properties: unsafe extern "C" fn(*mut c_void, c_int) -> HipError,
    pub set_device: unsafe extern "C" fn(c_int) -> HipError,
    pub mem_get_info: unsafe extern "C" fn(*mut usize, *mut usize) -> HipError,
    pub module_load_data: unsafe extern "C" fn(*mut HipModule, *const c_void) -> HipError,
    pub module_get_function:
        unsafe extern "C" fn(*mut HipFunction, HipModule, *const c_char) -> HipError,
    #[allow(clippy::type_complexity)]
    pub module_launch_kernel: unsafe extern "C" fn(
        HipFunction,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        *mut c_void,
        *mut *mut c_void,
        *mut *mut c_void,
    ) -> HipError,
    pub malloc: unsafe extern "C" fn(*mut *mut c_void, usize) -> HipError,
    pub memcpy: unsafe extern "C" fn(*mut c_void, *const c_void, usize, c_int) -> HipError,
    pub memset_d8: unsafe extern "C" fn(*mut c_void, u8, usize) -> HipError,
    pub free: unsafe extern "C" fn(*mut c_void) -> HipError,
    pub device_synchronize: unsafe extern "C" fn() -> HipError,
    pub stream_create: unsafe extern "C" fn(*mut HipStreamT, c_uint) -> HipError,
    pub stream_synchronize: unsafe extern "C" fn(HipStreamT) -> HipError,
    pub stream_destroy: unsafe extern "C" fn(HipStreamT) -> HipError,
    pub event_create: unsafe extern "C" fn(*mut HipEventT, c_uint) -> HipError,
    pub event_record: unsafe extern "C" fn(HipEventT, HipStreamT) -> HipError,
    pub event_elapsed: unsafe extern "C" fn(*mut f32, HipEventT, HipEventT) -> HipError,
    pub event_destroy: unsafe extern "C" fn(HipEventT) -> HipError,
    pub stream_wait_event: unsafe extern "C" fn(HipStreamT, HipEventT, c_uint) -> HipError,
    pub memcpy_async:
        unsafe extern "C" fn(*mut c_void, *const c_void, usize, c_int, HipStreamT) -> HipError,
    pub memset_d8_async: unsafe extern "C" fn(*mut c_void, u8, usize, HipStreamT) -> HipError,
    pub begin_capture: unsafe extern "C" fn(HipStreamT, c_int) -> HipError,
    pub end_capture: unsafe extern "C" fn(HipStreamT, *mut HipGraphT) -> HipError,
    pub graph_instantiate: unsafe extern "C" fn(
        *mut HipGraphExecT,
        HipGraphT,
        *mut c_void,
        *mut c_char,
        usize,
    ) -> HipError,
    pub graph_launch: unsafe extern "C" fn(HipGraphExecT, HipStreamT) -> HipError,
    pub graph_exec_destroy: unsafe extern "C" fn(HipGraphExecT) -> HipError,
    pub graph_destroy: unsafe extern "C" fn(HipGraphT) -> HipError,
    pub rtc_version: unsafe extern "C" fn(*mut c_int, *mut c_int) -> HiprtcResult,
    pub rtc_create: unsafe extern "C" fn(
        *mut HiprtcProgram,
        *const c_char,
        *const c_char,
        c_int,
        *const *const c_char,
        *const *const c_char,
    ) -> HiprtcResult,
    pub rtc_compile:
        unsafe extern "C" fn(HiprtcProgram, c_int, *const *const c_char) -> HiprtcResult,
    pub rtc_log_size: unsafe extern "C" fn(HiprtcProgram, *mut usize) -> HiprtcResult,
    pub rtc_log: unsafe extern "C" fn(HiprtcProgram, *mut c_char) -> HiprtcResult,
    pub rtc_code_size: unsafe extern "C" fn(HiprtcProgram, *mut usize) -> HiprtcResult,
    pub rtc_code: unsafe extern "C" fn(HiprtcProgram, *mut c_char) -> HiprtcResult,
    pub rtc_destroy: unsafe extern "C" fn(*mut HiprtcProgram) -> HiprtcResult,
    pub queries: Queries,
}

/// The loaded libraries, their function table and the device ordinal: what
/// every buffer, stream, event and graph of one device shares (through an
/// `Arc`, so none outlives the libraries).
pub struct HipApi {
    pub(crate) fns: Fns,
    ordinal: c_int,
    /// Which compiler's semantics the kernels meet: HIP, except on the
    /// simulator's CUDA flavour (`runtime::sim`), whose kernels take
    /// compat.h's CUDA branch and 32-lane warps.
    pub(crate) vendor: Vendor,
    /// The loaded libraries (`None` for a stub table in tests).
    _hip: Option<Library>,
    _rtc: Option<Library>,
}

/// A code object's loaded module; HIP module handles are process-wide.
#[derive(Clone, Copy)]
struct ModuleH(HipModule);
// SAFETY: a hipModule_t is an opaque process-wide handle; HIP's module
// calls are thread-safe, and this binding never unloads a module.
unsafe impl Send for ModuleH {}

/// An open HIP device (untested on hardware; see the module docs).
pub struct HipGpu {
    api: Arc<HipApi>,
    /// e.g. `gfx950` (the part of gcnArchName before any ':' features).
    pub arch: String,
    /// hiprtc (major, minor): part of the module cache key.
    rtc: (i32, i32),
    disk: Option<DiskCache>,
    /// Loaded modules by cache key (never unloaded: few and long-lived).
    modules: Mutex<HashMap<String, ModuleH>>,
    /// This device as the runtime line's handle (`api::Gpu::device`).
    device: crate::runtime::api::Device,
    /// The simulator's table (`runtime::sim`), not a device's.
    sim: bool,
    /// Device 0's compute units, or why they are not known.
    cus: CuQuery,
}

/// The first of `names` that loads, or why none did.
fn open_lib(names: &[&str]) -> std::result::Result<Library, String> {
    let mut last = String::new();
    for n in names {
        // SAFETY: loading a shared library runs its initializers; these are
        // the vendor's runtime libraries.
        match unsafe { Library::new(n) } {
            Ok(l) => return Ok(l),
            Err(e) => last = e.to_string(),
        }
    }
    Err(format!("none of {names:?} could be loaded ({last})"))
}

macro_rules! sym {
    ($lib:expr, $name:literal) => {
        // SAFETY: the symbol's signature is the one declared in `Fns`,
        // matching HIP's C API.
        *unsafe { $lib.get($name.as_bytes()) }
            .map_err(|e| GpuError::NoDriver(format!("symbol {} missing: {e}", $name)))?
    };
}

/// An optional symbol of `lib` (`None` where this runtime lacks it).
fn opt_sym<T: Copy>(lib: &Library, name: &str) -> Option<T> {
    // SAFETY: the caller's `T` is the symbol's signature as HIP declares it
    // (the fields of `Queries`).
    unsafe { lib.get::<T>(name.as_bytes()) }.ok().map(|s| *s)
}

fn check(call: &'static str, rc: c_int) -> Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(GpuError::driver(call, format!("error code {rc}")))
    }
}

/// A device address as the pointer HIP's C API takes.
fn dptr(p: u64) -> *mut c_void {
    p as usize as *mut c_void
}

impl HipGpu {
    /// Load the HIP runtime and hiprtc and open device 0. Fails cleanly
    /// (never panics) where ROCm or an AMD GPU is absent.
    pub fn open() -> Result<Self> {
        let hip = open_lib(&["libamdhip64.so", "libamdhip64.so.6", "libamdhip64.so.5"])
            .map_err(GpuError::NoDriver)?;
        let rtc = open_lib(&["libhiprtc.so", "libhiprtc.so.6", "libhiprtc.so.5"])
            .map_err(GpuError::NoCompiler)?;
        let fns = Fns {
            init: sym!(hip, "hipInit"),
            get_device_count: sym!(hip, "hipGetDeviceCount"),
            get_device_properties: sym!(hip, "hipGetDeviceProperties"),
            set_device: sym!(hip, "hipSetDevice"),
            mem_get_info: sym!(hip, "hipMemGetInfo"),
            module_load_data: sym!(hip, "hipModuleLoadData"),
            module_get_function: sym!(hip, "hipModuleGetFunction"),
            module_launch_kernel: sym!(hip, "hipModuleLaunchKernel"),
            malloc: sym!(hip, "hipMalloc"),
            memcpy: sym!(hip, "hipMemcpy"),
            memset_d8: sym!(hip, "hipMemsetD8"),
            free: sym!(hip, "hipFree"),
            device_synchronize: sym!(hip, "hipDeviceSynchronize"),
            stream_create: sym!(hip, "hipStreamCreateWithFlags"),
            stream_synchronize: sym!(hip, "hipStreamSynchronize"),
            stream_destroy: sym!(hip, "hipStreamDestroy"),
            event_create: sym!(hip, "hipEventCreateWithFlags"),
            event_record: sym!(hip, "hipEventRecord"),
            event_elapsed: sym!(hip, "hipEventElapsedTime"),
            event_destroy: sym!(hip, "hipEventDestroy"),
            stream_wait_event: sym!(hip, "hipStreamWaitEvent"),
            memcpy_async: sym!(hip, "hipMemcpyAsync"),
            memset_d8_async: sym!(hip, "hipMemsetD8Async"),
            begin_capture: sym!(hip, "hipStreamBeginCapture"),
            end_capture: sym!(hip, "hipStreamEndCapture"),
            graph_instantiate: sym!(hip, "hipGraphInstantiate"),
            graph_launch: sym!(hip, "hipGraphLaunch"),
            graph_exec_destroy: sym!(hip, "hipGraphExecDestroy"),
            graph_destroy: sym!(hip, "hipGraphDestroy"),
            rtc_version: sym!(rtc, "hiprtcVersion"),
            rtc_create: sym!(rtc, "hiprtcCreateProgram"),
            rtc_compile: sym!(rtc, "hiprtcCompileProgram"),
            rtc_log_size: sym!(rtc, "hiprtcGetProgramLogSize"),
            rtc_log: sym!(rtc, "hiprtcGetProgramLog"),
            rtc_code_size: sym!(rtc, "hiprtcGetCodeSize"),
            rtc_code: sym!(rtc, "hiprtcGetCode"),
            rtc_destroy: sym!(rtc, "hiprtcDestroyProgram"),
            queries: Queries {
                runtime_version: opt_sym(&hip, "hipRuntimeGetVersion"),
                device_attribute: opt_sym(&hip, "hipDeviceGetAttribute"),
                occupancy: opt_sym(&hip, "hipModuleOccupancyMaxActiveBlocksPerMultiprocessor"),
            },
        };
        // SAFETY: plain C calls with valid out-pointers.
        unsafe {
            check("hipInit", (fns.init)(0)).map_err(|e| GpuError::NoDevice(e.to_string()))?;
            let mut n = 0;
            check("hipGetDeviceCount", (fns.get_device_count)(&mut n))
                .map_err(|e| GpuError::NoDevice(e.to_string()))?;
            if n <= 0 {
                return Err(GpuError::NoDevice("HIP reports 0 devices".to_string()));
            }
        }
        let mut gpu = Self::with_table(fns, Some(hip), Some(rtc))?;
        gpu.disk = cache::default_dir().map(|d| DiskCache::new(d, "hsaco"));
        Ok(gpu)
    }

    /// The HIP simulator (`runtime::sim`): the HIP route on this machine's
    /// CPU, a gfx950 whose kernels the host C++ compiler builds. Fails
    /// (never panics) where no compiler runs.
    pub fn sim() -> Result<Self> {
        let mut g = Self::with_table(super::sim::table(Vendor::Hip), None, None)?;
        g.sim = true;
        Ok(g)
    }

    /// The simulator's CUDA flavour: the kernels take compat.h's CUDA
    /// branch (32-lane warps; PTX replaced by its generic twins) and the
    /// engine launches them as it does on CUDA (`Gpu::vendor` is CUDA), so
    /// the CUDA-only code paths run on this CPU. No PDL.
    pub fn sim_cuda() -> Result<Self> {
        let mut g = Self::with_table_as(super::sim::table(Vendor::Cuda), None, None, Vendor::Cuda)?;
        g.sim = true;
        Ok(g)
    }

    /// A device over the function table `fns` (the real libraries, or a
    /// stub's table in tests): device 0, its arch and hiprtc's version
    /// read through the table, no disk cache.
    pub(crate) fn with_table(fns: Fns, hip: Option<Library>, rtc: Option<Library>) -> Result<Self> {
        Self::with_table_as(fns, hip, rtc, Vendor::Hip)
    }

    /// [`with_table`](Self::with_table) whose kernels meet `vendor`'s
    /// compiler semantics (CUDA only for the simulator's CUDA flavour).
    fn with_table_as(
        fns: Fns,
        hip: Option<Library>,
        rtc: Option<Library>,
        vendor: Vendor,
    ) -> Result<Self> {
        let arch = Self::arch_name(&fns)?;
        let (mut ma, mut mi) = (0, 0);
        // SAFETY: two valid out-pointers.
        check("hiprtcVersion", unsafe {
            (fns.rtc_version)(&mut ma, &mut mi)
        })
        .map_err(|e| GpuError::NoCompiler(e.to_string()))?;
        let cus = query_cus(&fns.queries);
        let api = Arc::new(HipApi {
            fns,
            ordinal: 0,
            vendor,
            _hip: hip,
            _rtc: rtc,
        });
        Ok(HipGpu {
            device: crate::runtime::api::Device::hip(api.clone()),
            api,
            arch,
            rtc: (ma, mi),
            disk: None,
            modules: Mutex::new(HashMap::new()),
            sim: false,
            cus,
        })
    }

    /// gcnArchName of device 0: found in the properties struct as the
    /// NUL-terminated string starting with "gfx" (its offset moves between
    /// ROCm versions, so it is searched for rather than hard-coded).
    fn arch_name(fns: &Fns) -> Result<String> {
        let mut buf = vec![0u8; PROPS_BYTES];
        // SAFETY: the buffer is larger than any hipDeviceProp_t.
        check("hipGetDeviceProperties", unsafe {
            (fns.get_device_properties)(buf.as_mut_ptr().cast(), 0)
        })?;
        let pos = buf
            .windows(3)
            .position(|w| w == b"gfx")
            .ok_or_else(|| GpuError::NoDevice("no gfx arch name".into()))?;
        let end = buf[pos..]
            .iter()
            .position(|&b| b == 0)
            .map(|e| pos + e)
            .unwrap_or(buf.len());
        let full = String::from_utf8_lossy(&buf[pos..end]).to_string();
        Ok(full.split(':').next().unwrap_or(&full).to_string())
    }

    /// Use `dir` as the disk cache of code objects (`None`: memory only).
    pub fn set_disk_cache(&mut self, dir: Option<std::path::PathBuf>) {
        self.disk = dir.map(|d| DiskCache::new(d, "hsaco"));
    }

    /// Whether this is the simulator (`runtime::sim`), and which flavour:
    /// `Some("HIP")` / `Some("CUDA")`, `None` for a real device or a stub.
    pub fn sim_flavour(&self) -> Option<&'static str> {
        self.sim.then(|| match self.api.vendor {
            Vendor::Hip => "HIP",
            Vendor::Cuda => "CUDA",
        })
    }

    /// This device as the runtime line's handle.
    pub(crate) fn device_handle(&self) -> &crate::runtime::api::Device {
        &self.device
    }

    /// Compute units of this device: queried, else [`ASSUMED_CUS`].
    pub(crate) fn compute_units(&self) -> u32 {
        // the simulator runs one CTA at a time: one "unit" makes the mono
        // path's all-resident grid a single CTA
        if self.sim {
            1
        } else {
            *self.cus.as_ref().unwrap_or(&ASSUMED_CUS)
        }
    }

    /// Why the mono path cannot size its all-resident grid here (`None`:
    /// it can: the compute units were queried and the occupancy query is
    /// bound; always on the simulator).
    pub(crate) fn mono_unsupported(&self) -> Option<String> {
        if self.sim {
            return None;
        }
        if let Err(why) = &self.cus {
            return Some(format!("the compute units are not known: {why}"));
        }
        if self.api.fns.queries.occupancy.is_none() {
            return Some(
                "hipModuleOccupancyMaxActiveBlocksPerMultiprocessor is not in this runtime".into(),
            );
        }
        None
    }

    /// This device for reports: its name (the first field of
    /// hipDeviceProp_t in every ROCm layout), arch, compute units, memory
    /// and hiprtc's version.
    pub(crate) fn describe(&self) -> crate::runtime::api::DeviceDesc {
        let mut buf = vec![0u8; PROPS_BYTES];
        // SAFETY: the buffer is larger than any hipDeviceProp_t.
        let ok = unsafe { (self.api.fns.get_device_properties)(buf.as_mut_ptr().cast(), 0) } == 0;
        let name = if ok && !self.sim {
            let end = buf[..256].iter().position(|&b| b == 0).unwrap_or(256);
            String::from_utf8_lossy(&buf[..end]).trim().to_string()
        } else {
            String::new()
        };
        let name = match (name.is_empty(), self.sim_flavour()) {
            (_, Some(f)) => format!("simulator ({f} flavour, this machine's CPU)"),
            (true, None) => format!("AMD {}", self.arch),
            (false, None) => name,
        };
        let name = match (&self.cus, self.sim) {
            (Err(why), false) => format!("{name} [{ASSUMED_CUS} compute units assumed: {why}]"),
            _ => name,
        };
        crate::runtime::api::DeviceDesc {
            name,
            arch: self.arch.clone(),
            units: self.compute_units(),
            total_mem_bytes: self.api.mem_info().map_or(0, |(_, t)| t),
            compiler: ("hiprtc", self.rtc.0, self.rtc.1),
        }
    }

    /// Blocks of `threads` threads and `smem` bytes of dynamic shared
    /// memory of `f` that fit on one compute unit at once.
    pub(crate) fn occupancy(&self, f: HipFunction, threads: u32, smem: usize) -> Result<u32> {
        self.api.occupancy(f, threads, smem)
    }

    /// hiprtc's options for `src` on this device (hiprtc takes no `-O`).
    fn rtc_options(&self, src: &KernelSource) -> Vec<String> {
        src.hip_options(&self.arch)
            .into_iter()
            .filter(|o| !o.starts_with("-O"))
            .collect()
    }

    /// hiprtc: source to a code object for this device's arch.
    pub fn compile(&self, src: &KernelSource) -> Result<Vec<u8>> {
        let full = CString::new(src.full_source())
            .map_err(|_| GpuError::input("hip compile", "NUL in source"))?;
        let name = CString::new(format!("{}.cu", src.name))
            .map_err(|_| GpuError::input("hip compile", "NUL in name"))?;
        let opts: Vec<CString> = self
            .rtc_options(src)
            .into_iter()
            .map(|o| CString::new(o).map_err(|_| GpuError::input("hip compile", "NUL in option")))
            .collect::<Result<_>>()?;
        let optp: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();
        let f = &self.api.fns;
        let mut prog: HiprtcProgram = ptr::null_mut();
        // SAFETY: valid C strings that outlive the program; prog destroyed once.
        unsafe {
            check(
                "hiprtcCreateProgram",
                (f.rtc_create)(
                    &mut prog,
                    full.as_ptr(),
                    name.as_ptr(),
                    0,
                    ptr::null(),
                    ptr::null(),
                ),
            )?;
            let rc = (f.rtc_compile)(prog, optp.len() as c_int, optp.as_ptr());
            let out = if rc != 0 {
                let mut n = 0usize;
                (f.rtc_log_size)(prog, &mut n);
                let mut log = vec![0 as c_char; n.max(1)];
                (f.rtc_log)(prog, log.as_mut_ptr());
                let log = CStr::from_ptr(log.as_ptr()).to_string_lossy().to_string();
                Err(GpuError::Compile {
                    name: src.name.to_string(),
                    arch: self.arch.clone(),
                    log,
                })
            } else {
                let mut n = 0usize;
                check("hiprtcGetCodeSize", (f.rtc_code_size)(prog, &mut n))?;
                let mut code = vec![0u8; n];
                check(
                    "hiprtcGetCode",
                    (f.rtc_code)(prog, code.as_mut_ptr().cast()),
                )?;
                Ok(code)
            };
            (f.rtc_destroy)(&mut prog);
            out
        }
    }

    /// Load a code object (hipModuleLoadData).
    fn load_code(&self, code: &[u8]) -> Result<HipModule> {
        let mut m: HipModule = ptr::null_mut();
        // SAFETY: code is a complete code object; valid out-pointer.
        check("hipModuleLoadData", unsafe {
            (self.api.fns.module_load_data)(&mut m, code.as_ptr().cast())
        })?;
        Ok(m)
    }

    /// Function `entry` of loaded module `m` (hipModuleGetFunction).
    fn get_function(&self, m: HipModule, what: &str, entry: &str) -> Result<HipFunction> {
        let e = CString::new(entry).map_err(|_| GpuError::input("hip function", "NUL in name"))?;
        let mut func: HipFunction = ptr::null_mut();
        // SAFETY: a loaded module; valid out-pointer and C string.
        check("hipModuleGetFunction", unsafe {
            (self.api.fns.module_get_function)(&mut func, m, e.as_ptr())
        })
        .map_err(|err| {
            GpuError::driver("hipModuleGetFunction", format!("{what}::{entry}: {err}"))
        })?;
        Ok(func)
    }

    /// Load a code object and return the function `entry` (the module is
    /// kept alive for the process: modules are few and long-lived).
    pub fn function(&self, code: &[u8], entry: &str) -> Result<HipFunction> {
        let m = self.load_code(code)?;
        self.get_function(m, "code object", entry)
    }

    /// The module of `src`, compiled by hiprtc for this device's arch on
    /// first use (or read from the disk cache), loaded once per process.
    fn module(&self, src: &KernelSource) -> Result<HipModule> {
        let full = src.full_source();
        let opts = self.rtc_options(src);
        let ver = format!("hiprtc {}.{}", self.rtc.0, self.rtc.1);
        let key = cache::key(&full, &self.arch, &opts, &ver);
        if let Some(m) = self.modules.lock().ok().and_then(|m| m.get(&key).copied()) {
            return Ok(m.0);
        }
        // a corrupt or foreign cached file just falls through to a compile
        let cached = self
            .disk
            .as_ref()
            .and_then(|d| d.get(&key))
            .and_then(|bin| self.load_code(&bin).ok());
        let m = match cached {
            Some(m) => m,
            None => {
                let bin = self.compile(src)?;
                if let Some(d) = &self.disk {
                    if let Err(e) = d.put(&key, &bin) {
                        tracing::warn!("kernel cache not written: {e}");
                    }
                }
                self.load_code(&bin)?
            }
        };
        if let Ok(mut map) = self.modules.lock() {
            map.insert(key, ModuleH(m));
        }
        Ok(m)
    }

    /// Kernel `entry` of module `src` (the runtime line's `Gpu::kernel`).
    pub(crate) fn kernel(&self, src: &KernelSource, entry: &str) -> Result<HipFunction> {
        let m = self.module(src)?;
        self.get_function(m, src.name, entry)
    }

    /// Launch `func` with kernel arguments given as pointers to their values.
    ///
    /// # Safety
    /// `args` must match the kernel's parameter list in number, order and
    /// type, and every device pointer in them must be live.
    pub unsafe fn launch(
        &self,
        func: HipFunction,
        grid: u32,
        block: u32,
        args: &mut [*mut c_void],
    ) -> Result<()> {
        self.launch_grid(func, (grid, 1, 1), block, args)
    }

    /// [`launch`](Self::launch) with a 3-D grid of 1-D blocks (the gfx950
    /// MX linears, `crate::mfma_mx`).
    ///
    /// # Safety
    /// As [`launch`](Self::launch).
    pub unsafe fn launch_grid(
        &self,
        func: HipFunction,
        grid: (u32, u32, u32),
        block: u32,
        args: &mut [*mut c_void],
    ) -> Result<()> {
        let f = &self.api.fns;
        check(
            "hipModuleLaunchKernel",
            (f.module_launch_kernel)(
                func,
                grid.0,
                grid.1,
                grid.2,
                block,
                1,
                1,
                0,
                ptr::null_mut(),
                args.as_mut_ptr(),
                ptr::null_mut(),
            ),
        )?;
        check("hipDeviceSynchronize", (f.device_synchronize)())
    }

    /// Allocate `bytes` of device memory and copy `src` into it.
    pub fn upload(&self, src: &[u8]) -> Result<*mut c_void> {
        let p = dptr(self.api.malloc(src.len().max(1))?);
        // SAFETY: copy of exactly src.len() bytes into the new allocation.
        unsafe { self.api.htod(p as u64, src)? };
        Ok(p)
    }

    /// Copy `dst.len()` bytes back from device pointer `p`.
    ///
    /// # Safety
    /// `p` must hold at least `dst.len()` bytes.
    pub unsafe fn download(&self, p: *const c_void, dst: &mut [u8]) -> Result<()> {
        self.api.dtoh(dst, p as u64)
    }

    /// Free a pointer from [`upload`](Self::upload).
    ///
    /// # Safety
    /// `p` must come from `upload` and not be freed twice.
    pub unsafe fn free(&self, p: *mut c_void) -> Result<()> {
        self.api.free(p as u64)
    }

    /// A new non-blocking stream (the launcher's: every launch, copy and
    /// event of a runner is ordered on it).
    pub fn stream(&self) -> Result<HipStream> {
        self.api.stream()
    }
}

impl HipApi {
    /// hipModuleOccupancyMaxActiveBlocksPerMultiprocessor for `f`.
    pub(crate) fn occupancy(&self, f: HipFunction, threads: u32, smem: usize) -> Result<u32> {
        let q = self.fns.queries.occupancy.ok_or_else(|| {
            GpuError::driver(
                "hipModuleOccupancyMaxActiveBlocksPerMultiprocessor",
                "not in this runtime",
            )
        })?;
        let threads = c_int::try_from(threads)
            .map_err(|_| GpuError::input("occupancy", format!("{threads} threads a block")))?;
        self.set_device()?;
        let mut n = 0;
        // SAFETY: a valid out-pointer and a function handle of a loaded
        // module (never unloaded).
        check(
            "hipModuleOccupancyMaxActiveBlocksPerMultiprocessor",
            unsafe { q(&mut n, f, threads, smem) },
        )?;
        Ok(n.max(0) as u32)
    }

    /// Make this device current on the calling thread (hipSetDevice: HIP's
    /// current device is per thread, like a CUDA context).
    pub(crate) fn set_device(&self) -> Result<()> {
        // SAFETY: a plain C call.
        check("hipSetDevice", unsafe {
            (self.fns.set_device)(self.ordinal)
        })
    }

    /// `bytes` of device memory (hipMalloc).
    pub(crate) fn malloc(&self, bytes: usize) -> Result<u64> {
        let mut p: *mut c_void = ptr::null_mut();
        // SAFETY: valid out-pointer.
        check("hipMalloc", unsafe { (self.fns.malloc)(&mut p, bytes) })
            .map_err(|e| GpuError::driver("hipMalloc", format!("{bytes} bytes: {e}")))?;
        Ok(p as u64)
    }

    /// Free an allocation (hipFree).
    ///
    /// # Safety
    /// `p` came from [`malloc`](Self::malloc) and is freed once, with no
    /// work using it still pending.
    pub(crate) unsafe fn free(&self, p: u64) -> Result<()> {
        check("hipFree", (self.fns.free)(dptr(p)))
    }

    /// Zero `bytes` at `p`, synchronously (hipMemsetD8).
    ///
    /// # Safety
    /// The range lies inside a live allocation.
    pub(crate) unsafe fn zero(&self, p: u64, bytes: usize) -> Result<()> {
        check("hipMemsetD8", (self.fns.memset_d8)(dptr(p), 0, bytes))?;
        // zero before any stream's later work (runtime/api.rs `Device::zero`)
        check("hipDeviceSynchronize", (self.fns.device_synchronize)())
    }

    /// Host-to-device copy, synchronous (hipMemcpy).
    ///
    /// # Safety
    /// `dst .. dst + src.len()` lies inside a live allocation.
    pub(crate) unsafe fn htod(&self, dst: u64, src: &[u8]) -> Result<()> {
        check(
            "hipMemcpy",
            (self.fns.memcpy)(dptr(dst), src.as_ptr().cast(), src.len(), HIP_MEMCPY_H2D),
        )?;
        // as CUDA's (runtime/api.rs `Device::htod`): the bytes in device
        // memory before any stream's later work, whatever the source
        check("hipDeviceSynchronize", (self.fns.device_synchronize)())
    }

    /// Device-to-host copy, synchronous (hipMemcpy).
    ///
    /// # Safety
    /// `src .. src + dst.len()` lies inside a live allocation.
    pub(crate) unsafe fn dtoh(&self, dst: &mut [u8], src: u64) -> Result<()> {
        check(
            "hipMemcpy",
            (self.fns.memcpy)(
                dst.as_mut_ptr().cast(),
                dptr(src),
                dst.len(),
                HIP_MEMCPY_D2H,
            ),
        )
    }

    /// (free, total) device memory in bytes (hipMemGetInfo).
    pub(crate) fn mem_info(&self) -> Result<(usize, usize)> {
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: two valid out-pointers.
        check("hipMemGetInfo", unsafe {
            (self.fns.mem_get_info)(&mut free, &mut total)
        })?;
        Ok((free, total))
    }

    /// A new non-blocking stream.
    pub(crate) fn stream(self: &Arc<Self>) -> Result<HipStream> {
        let mut s: HipStreamT = ptr::null_mut();
        // SAFETY: valid out-pointer.
        check("hipStreamCreateWithFlags", unsafe {
            (self.fns.stream_create)(&mut s, HIP_STREAM_NON_BLOCKING)
        })?;
        Ok(HipStream {
            api: self.clone(),
            s,
        })
    }

    /// A timing event (not yet recorded).
    pub(crate) fn event(self: &Arc<Self>) -> Result<HipEvent> {
        self.event_with(HIP_EVENT_DEFAULT)
    }

    /// An event that only orders streams (no timing: cheaper to record).
    pub(crate) fn marker(self: &Arc<Self>) -> Result<HipEvent> {
        self.event_with(HIP_EVENT_DISABLE_TIMING)
    }

    fn event_with(self: &Arc<Self>, flags: c_uint) -> Result<HipEvent> {
        let mut e: HipEventT = ptr::null_mut();
        // SAFETY: valid out-pointer.
        check("hipEventCreateWithFlags", unsafe {
            (self.fns.event_create)(&mut e, flags)
        })?;
        Ok(HipEvent {
            api: self.clone(),
            e,
        })
    }
}

/// A HIP stream, destroyed on drop.
pub struct HipStream {
    api: Arc<HipApi>,
    s: HipStreamT,
}

/// A timing event, destroyed on drop.
pub struct HipEvent {
    api: Arc<HipApi>,
    e: HipEventT,
}

/// An instantiated graph of captured stream work, destroyed on drop.
pub struct HipGraph {
    api: Arc<HipApi>,
    graph: HipGraphT,
    exec: HipGraphExecT,
}

// SAFETY (the three impls below and their Sync twins): HIP stream, event
// and graph handles are opaque process-wide objects that the HIP runtime
// lets any thread use; each wrapper destroys its handle exactly once (Drop)
// and the `Arc<HipApi>` keeps the library loaded until then. A runner uses
// them from one thread at a time anyway (its launcher is not `Sync`).
unsafe impl Send for HipStream {}
unsafe impl Sync for HipStream {}
// SAFETY: as above.
unsafe impl Send for HipEvent {}
unsafe impl Sync for HipEvent {}
// SAFETY: as above.
unsafe impl Send for HipGraph {}
unsafe impl Sync for HipGraph {}

impl HipStream {
    /// Launch `func` on this stream: a 3-D grid of 1-D blocks of `block`
    /// threads, `smem` bytes of dynamic shared memory. Asynchronous.
    ///
    /// `kernelParams` is passed with a null entry after the last argument:
    /// HIP reads as many entries as the kernel declares (from the code
    /// object's metadata) and never the terminator, and the recording stub
    /// (`stub`) counts the arguments up to it.
    ///
    /// # Safety
    /// As [`HipGpu::launch`]: `args` match the kernel's parameters and
    /// every device pointer in them is live until the work has run.
    pub unsafe fn launch(
        &self,
        func: HipFunction,
        grid: (u32, u32, u32),
        block: u32,
        smem: u32,
        args: &mut [*mut c_void],
    ) -> Result<()> {
        let mut params: Vec<*mut c_void> = Vec::with_capacity(args.len() + 1);
        params.extend_from_slice(args);
        params.push(ptr::null_mut());
        check(
            "hipModuleLaunchKernel",
            (self.api.fns.module_launch_kernel)(
                func,
                grid.0,
                grid.1,
                grid.2,
                block,
                1,
                1,
                smem,
                self.s,
                params.as_mut_ptr(),
                ptr::null_mut(),
            ),
        )
    }

    /// Device-to-device copy of `bytes`, ordered on the stream.
    ///
    /// # Safety
    /// Both ranges lie inside live allocations.
    pub unsafe fn copy(&self, dst: *mut c_void, src: *const c_void, bytes: usize) -> Result<()> {
        check(
            "hipMemcpyAsync",
            (self.api.fns.memcpy_async)(dst, src, bytes, HIP_MEMCPY_D2D, self.s),
        )
    }

    /// Host-to-device copy of `src` to `dst`, ordered on the stream, and
    /// complete when this returns: the stream is synchronized after the
    /// copy. CUDA stages a pageable source before `cuMemcpyHtoDAsync`
    /// returns, so its callers reuse the host buffer at once; HIP does not
    /// document that for every ROCm version, so this waits instead (the
    /// standard path calls it outside captures only: one step upload).
    ///
    /// # Safety
    /// `dst .. dst + src.len()` lies inside a live allocation.
    pub unsafe fn upload(&self, dst: *mut c_void, src: &[u8]) -> Result<()> {
        check(
            "hipMemcpyAsync",
            (self.api.fns.memcpy_async)(
                dst,
                src.as_ptr().cast(),
                src.len(),
                HIP_MEMCPY_H2D,
                self.s,
            ),
        )?;
        self.sync()
    }

    /// Zero `bytes` at `dst`, ordered on the stream.
    ///
    /// # Safety
    /// The range lies inside a live allocation.
    pub unsafe fn zero(&self, dst: *mut c_void, bytes: usize) -> Result<()> {
        check(
            "hipMemsetD8Async",
            (self.api.fns.memset_d8_async)(dst, 0, bytes, self.s),
        )
    }

    /// Wait for everything enqueued so far (surfaces asynchronous errors).
    pub fn sync(&self) -> Result<()> {
        // SAFETY: a live stream.
        check("hipStreamSynchronize", unsafe {
            (self.api.fns.stream_synchronize)(self.s)
        })
    }

    /// A timing event recorded on this stream now.
    pub fn record(&self) -> Result<HipEvent> {
        let ev = self.api.event()?;
        ev.record(self)?;
        Ok(ev)
    }

    /// Make work enqueued on this stream from now on wait for what `e`
    /// recorded (inside a capture: a dependency edge of the graph).
    pub fn wait(&self, e: &HipEvent) -> Result<()> {
        // SAFETY: a live stream and event.
        check("hipStreamWaitEvent", unsafe {
            (self.api.fns.stream_wait_event)(self.s, e.e, 0)
        })
    }

    /// Start capturing this stream's work (thread-local capture mode).
    pub fn begin_capture(&self) -> Result<()> {
        // SAFETY: a live stream.
        check("hipStreamBeginCapture", unsafe {
            (self.api.fns.begin_capture)(self.s, HIP_CAPTURE_MODE_THREAD_LOCAL)
        })
    }

    /// End the capture: the captured graph (null when nothing was
    /// captured). The caller destroys or instantiates it.
    fn end_capture_raw(&self) -> Result<HipGraphT> {
        let mut graph: HipGraphT = ptr::null_mut();
        // SAFETY: a live stream; valid out-pointer.
        check("hipStreamEndCapture", unsafe {
            (self.api.fns.end_capture)(self.s, &mut graph)
        })?;
        Ok(graph)
    }

    /// Instantiate `graph` (destroyed here if that fails).
    fn instantiate(&self, graph: HipGraphT) -> Result<HipGraph> {
        let mut exec: HipGraphExecT = ptr::null_mut();
        // SAFETY: a graph from hipStreamEndCapture; out-pointer valid; the
        // graph is destroyed once, here on failure or by HipGraph's drop.
        unsafe {
            if let Err(e) = check(
                "hipGraphInstantiate",
                (self.api.fns.graph_instantiate)(
                    &mut exec,
                    graph,
                    ptr::null_mut(),
                    ptr::null_mut(),
                    0,
                ),
            ) {
                (self.api.fns.graph_destroy)(graph);
                return Err(e);
            }
        }
        Ok(HipGraph {
            api: self.api.clone(),
            graph,
            exec,
        })
    }

    /// End a capture begun by [`begin_capture`](Self::begin_capture) and
    /// instantiate what it captured (`None`: nothing was).
    pub fn end_capture(&self) -> Result<Option<HipGraph>> {
        let graph = self.end_capture_raw()?;
        if graph.is_null() {
            return Ok(None);
        }
        self.instantiate(graph).map(Some)
    }

    /// Capture what `enqueue` puts on this stream (thread-local capture
    /// mode) into an instantiated graph; the work itself does not run. A
    /// failing `enqueue` still ends the capture, and its error is returned.
    pub fn capture(&self, enqueue: impl FnOnce(&Self) -> Result<()>) -> Result<HipGraph> {
        self.begin_capture()?;
        let body = enqueue(self);
        let graph = match (body, self.end_capture_raw()) {
            (Ok(()), Ok(g)) => g,
            (Ok(()), Err(e)) => return Err(e),
            (Err(e), ended) => {
                if let Some(g) = ended.ok().filter(|g| !g.is_null()) {
                    // SAFETY: a graph from hipStreamEndCapture, destroyed once.
                    unsafe { (self.api.fns.graph_destroy)(g) };
                }
                return Err(e);
            }
        };
        if graph.is_null() {
            return Err(GpuError::driver("hipStreamEndCapture", "empty graph"));
        }
        self.instantiate(graph)
    }

    /// Launch an instantiated graph on this stream.
    pub fn replay(&self, g: &HipGraph) -> Result<()> {
        // SAFETY: a live graph exec and stream.
        check("hipGraphLaunch", unsafe {
            (self.api.fns.graph_launch)(g.exec, self.s)
        })
    }
}

impl HipEvent {
    /// Record this event on `s` now.
    pub fn record(&self, s: &HipStream) -> Result<()> {
        // SAFETY: a live event and stream.
        check("hipEventRecord", unsafe {
            (self.api.fns.event_record)(self.e, s.s)
        })
    }

    /// Milliseconds from `self` to `later` (both recorded and complete).
    pub fn elapsed_ms(&self, later: &HipEvent) -> Result<f32> {
        let mut ms = 0f32;
        // SAFETY: valid out-pointer; live events.
        check("hipEventElapsedTime", unsafe {
            (self.api.fns.event_elapsed)(&mut ms, self.e, later.e)
        })?;
        Ok(ms)
    }
}

impl Drop for HipStream {
    fn drop(&mut self) {
        // SAFETY: created by hipStreamCreateWithFlags, destroyed once.
        unsafe { (self.api.fns.stream_destroy)(self.s) };
    }
}

impl Drop for HipEvent {
    fn drop(&mut self) {
        // SAFETY: created by hipEventCreateWithFlags, destroyed once.
        unsafe { (self.api.fns.event_destroy)(self.e) };
    }
}

impl Drop for HipGraph {
    fn drop(&mut self) {
        // SAFETY: instantiated from this graph, each destroyed once.
        unsafe {
            (self.api.fns.graph_exec_destroy)(self.exec);
            (self.api.fns.graph_destroy)(self.graph);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    thread_local! {
        static LOG: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
        /// The stub that returns an error (code 98) instead of 0.
        static FAIL: RefCell<Option<&'static str>> = const { RefCell::new(None) };
    }

    fn log(call: &'static str, what: String) -> HipError {
        LOG.with(|l| l.borrow_mut().push(format!("{call}{what}")));
        if FAIL.with(|f| *f.borrow() == Some(call)) {
            98
        } else {
            0
        }
    }

    fn h(p: *const c_void) -> usize {
        p as usize
    }

    unsafe extern "C" fn init(_: c_uint) -> HipError {
        log("init", String::new())
    }
    unsafe extern "C" fn count(n: *mut c_int) -> HipError {
        *n = 1;
        log("count", String::new())
    }
    unsafe extern "C" fn props(p: *mut c_void, _: c_int) -> HipError {
        let name = b"gfx950:sramecc+:xnack-\0";
        ptr::copy_nonoverlapping(name.as_ptr(), p.cast::<u8>().add(100), name.len());
        log("props", String::new())
    }
    unsafe extern "C" fn set_device(_: c_int) -> HipError {
        log("set_device", String::new())
    }
    unsafe extern "C" fn mem_info(f: *mut usize, t: *mut usize) -> HipError {
        (*f, *t) = (1, 2);
        log("mem_info", String::new())
    }
    unsafe extern "C" fn memset_d8(_: *mut c_void, _: u8, _: usize) -> HipError {
        log("memset", String::new())
    }
    unsafe extern "C" fn rtc_version(a: *mut c_int, b: *mut c_int) -> HiprtcResult {
        (*a, *b) = (6, 4);
        log("rtc_version", String::new())
    }
    unsafe extern "C" fn load(_: *mut HipModule, _: *const c_void) -> HipError {
        log("load", String::new())
    }
    unsafe extern "C" fn get_fn(_: *mut HipFunction, _: HipModule, _: *const c_char) -> HipError {
        log("get_fn", String::new())
    }
    #[allow(clippy::too_many_arguments)]
    unsafe extern "C" fn launch(
        f: HipFunction,
        gx: c_uint,
        gy: c_uint,
        gz: c_uint,
        bx: c_uint,
        by: c_uint,
        bz: c_uint,
        smem: c_uint,
        s: *mut c_void,
        params: *mut *mut c_void,
        extra: *mut *mut c_void,
    ) -> HipError {
        // the first parameter's value (a u32 here) proves the array reached it
        let p0 = *(*params as *const u32);
        log(
            "launch",
            format!(
                " f={:#x} grid={gx}x{gy}x{gz} block={bx}x{by}x{bz} smem={smem} stream={:#x} p0={p0} extra={}",
                h(f),
                h(s),
                h(extra.cast())
            ),
        )
    }
    unsafe extern "C" fn malloc(_: *mut *mut c_void, _: usize) -> HipError {
        log("malloc", String::new())
    }
    unsafe extern "C" fn memcpy(_: *mut c_void, _: *const c_void, _: usize, _: c_int) -> HipError {
        log("memcpy", String::new())
    }
    unsafe extern "C" fn free(_: *mut c_void) -> HipError {
        log("free", String::new())
    }
    unsafe extern "C" fn dev_sync() -> HipError {
        log("device_sync", String::new())
    }
    unsafe extern "C" fn stream_create(s: *mut HipStreamT, flags: c_uint) -> HipError {
        *s = 0x51 as HipStreamT;
        log("stream_create", format!(" flags={flags}"))
    }
    unsafe extern "C" fn stream_sync(s: HipStreamT) -> HipError {
        log("stream_sync", format!(" {:#x}", h(s)))
    }
    unsafe extern "C" fn stream_destroy(s: HipStreamT) -> HipError {
        log("stream_destroy", format!(" {:#x}", h(s)))
    }
    unsafe extern "C" fn event_create(e: *mut HipEventT, flags: c_uint) -> HipError {
        let n = LOG.with(|l| {
            l.borrow()
                .iter()
                .filter(|c| c.starts_with("event_create"))
                .count()
        });
        *e = (0xe1 + n) as HipEventT;
        log("event_create", format!(" flags={flags}"))
    }
    unsafe extern "C" fn event_record(e: HipEventT, s: HipStreamT) -> HipError {
        log("event_record", format!(" {:#x} on {:#x}", h(e), h(s)))
    }
    unsafe extern "C" fn event_elapsed(ms: *mut f32, a: HipEventT, b: HipEventT) -> HipError {
        *ms = 1.5;
        log("event_elapsed", format!(" {:#x}..{:#x}", h(a), h(b)))
    }
    unsafe extern "C" fn event_destroy(e: HipEventT) -> HipError {
        log("event_destroy", format!(" {:#x}", h(e)))
    }
    unsafe extern "C" fn stream_wait_event(s: HipStreamT, e: HipEventT, f: c_uint) -> HipError {
        log(
            "stream_wait_event",
            format!(" {:#x} waits {:#x} flags={f}", h(s), h(e)),
        )
    }
    unsafe extern "C" fn memcpy_async(
        d: *mut c_void,
        src: *const c_void,
        n: usize,
        kind: c_int,
        s: HipStreamT,
    ) -> HipError {
        log(
            "memcpy_async",
            format!(" {:#x}<-{:#x} {n} kind={kind} on {:#x}", h(d), h(src), h(s)),
        )
    }
    unsafe extern "C" fn memset_async(d: *mut c_void, v: u8, n: usize, s: HipStreamT) -> HipError {
        log(
            "memset_async",
            format!(" {:#x}={v} {n} on {:#x}", h(d), h(s)),
        )
    }
    unsafe extern "C" fn begin(s: HipStreamT, mode: c_int) -> HipError {
        log("begin_capture", format!(" {:#x} mode={mode}", h(s)))
    }
    unsafe extern "C" fn end(s: HipStreamT, g: *mut HipGraphT) -> HipError {
        *g = 0x61 as HipGraphT;
        log("end_capture", format!(" {:#x}", h(s)))
    }
    unsafe extern "C" fn instantiate(
        x: *mut HipGraphExecT,
        g: HipGraphT,
        _: *mut c_void,
        _: *mut c_char,
        _: usize,
    ) -> HipError {
        *x = 0x71 as HipGraphExecT;
        log("instantiate", format!(" {:#x}", h(g)))
    }
    unsafe extern "C" fn graph_launch(x: HipGraphExecT, s: HipStreamT) -> HipError {
        log("graph_launch", format!(" {:#x} on {:#x}", h(x), h(s)))
    }
    unsafe extern "C" fn exec_destroy(x: HipGraphExecT) -> HipError {
        log("exec_destroy", format!(" {:#x}", h(x)))
    }
    unsafe extern "C" fn graph_destroy(g: HipGraphT) -> HipError {
        log("graph_destroy", format!(" {:#x}", h(g)))
    }
    unsafe extern "C" fn rtc_create(
        _: *mut HiprtcProgram,
        _: *const c_char,
        _: *const c_char,
        _: c_int,
        _: *const *const c_char,
        _: *const *const c_char,
    ) -> HiprtcResult {
        log("rtc_create", String::new())
    }
    unsafe extern "C" fn rtc_compile(
        _: HiprtcProgram,
        _: c_int,
        _: *const *const c_char,
    ) -> HiprtcResult {
        log("rtc_compile", String::new())
    }
    unsafe extern "C" fn rtc_size(_: HiprtcProgram, n: *mut usize) -> HiprtcResult {
        *n = 0;
        log("rtc_size", String::new())
    }
    unsafe extern "C" fn rtc_buf(_: HiprtcProgram, _: *mut c_char) -> HiprtcResult {
        log("rtc_buf", String::new())
    }
    unsafe extern "C" fn rtc_destroy(_: *mut HiprtcProgram) -> HiprtcResult {
        log("rtc_destroy", String::new())
    }

    fn stub_gpu() -> HipGpu {
        LOG.with(|l| l.borrow_mut().clear());
        FAIL.with(|f| *f.borrow_mut() = None);
        let gpu = HipGpu::with_table(
            Fns {
                init,
                get_device_count: count,
                get_device_properties: props,
                set_device,
                mem_get_info: mem_info,
                memset_d8,
                rtc_version,
                module_load_data: load,
                module_get_function: get_fn,
                module_launch_kernel: launch,
                malloc,
                memcpy,
                free,
                device_synchronize: dev_sync,
                stream_create,
                stream_synchronize: stream_sync,
                stream_destroy,
                event_create,
                event_record,
                stream_wait_event,
                event_elapsed,
                event_destroy,
                memcpy_async,
                memset_d8_async: memset_async,
                begin_capture: begin,
                end_capture: end,
                graph_instantiate: instantiate,
                graph_launch,
                graph_exec_destroy: exec_destroy,
                graph_destroy,
                rtc_create,
                rtc_compile,
                rtc_log_size: rtc_size,
                rtc_log: rtc_buf,
                rtc_code_size: rtc_size,
                rtc_code: rtc_buf,
                rtc_destroy,
                queries: Queries::default(),
            },
            None,
            None,
        )
        .expect("the stub table opens");
        assert_eq!(gpu.arch, "gfx950");
        assert_eq!(taken(), ["props", "rtc_version"]);
        gpu
    }

    fn taken() -> Vec<String> {
        LOG.with(|l| std::mem::take(&mut *l.borrow_mut()))
    }

    #[test]
    fn stream_launch_copy_events_and_graph_in_order() {
        let gpu = stub_gpu();
        let f = 0xf00 as HipFunction;
        let mut v = 7u32;
        {
            let s = gpu.stream().unwrap();
            let mut args = [(&mut v as *mut u32).cast::<c_void>()];
            // SAFETY: the stub reads the one u32 argument.
            unsafe {
                s.launch(f, (3, 4, 5), 128, 4096, &mut args).unwrap();
                s.copy(0xd0 as *mut c_void, 0x50 as *const c_void, 64)
                    .unwrap();
                s.zero(0xd0 as *mut c_void, 32).unwrap();
            }
            let a = s.record().unwrap();
            let b = s.record().unwrap();
            assert_eq!(a.elapsed_ms(&b).unwrap(), 1.5);
            let g = s
                // SAFETY: as above.
                .capture(|s| unsafe { s.launch(f, (1, 1, 1), 64, 0, &mut args) })
                .unwrap();
            s.replay(&g).unwrap();
            s.sync().unwrap();
        }
        let want = [
            "stream_create flags=1",
            "launch f=0xf00 grid=3x4x5 block=128x1x1 smem=4096 stream=0x51 p0=7 extra=0",
            "memcpy_async 0xd0<-0x50 64 kind=3 on 0x51",
            "memset_async 0xd0=0 32 on 0x51",
            "event_create flags=0",
            "event_record 0xe1 on 0x51",
            "event_create flags=0",
            "event_record 0xe2 on 0x51",
            "event_elapsed 0xe1..0xe2",
            "begin_capture 0x51 mode=1",
            "launch f=0xf00 grid=1x1x1 block=64x1x1 smem=0 stream=0x51 p0=7 extra=0",
            "end_capture 0x51",
            "instantiate 0x61",
            "graph_launch 0x71 on 0x51",
            "stream_sync 0x51",
            // drops in reverse order of creation: graph, events, stream
            "exec_destroy 0x71",
            "graph_destroy 0x61",
            "event_destroy 0xe2",
            "event_destroy 0xe1",
            "stream_destroy 0x51",
        ];
        assert_eq!(taken(), want);
    }

    #[test]
    fn a_failure_inside_a_capture_ends_it_and_names_the_call() {
        let gpu = stub_gpu();
        let s = gpu.stream().unwrap();
        assert_eq!(taken(), ["stream_create flags=1"]);
        FAIL.with(|x| *x.borrow_mut() = Some("launch"));
        let mut v = 1u32;
        let mut args = [(&mut v as *mut u32).cast::<c_void>()];
        let e = s
            // SAFETY: the stub reads the one u32 argument.
            .capture(|s| unsafe { s.launch(0xf00 as HipFunction, (2, 1, 1), 32, 0, &mut args) })
            .err()
            .expect("the launch fails")
            .to_string();
        assert!(
            e.contains("hipModuleLaunchKernel") && e.contains("98"),
            "{e}"
        );
        let log = taken();
        // the capture is ended and its graph destroyed; nothing instantiated
        assert_eq!(log[0], "begin_capture 0x51 mode=1");
        assert!(log[1].starts_with("launch "));
        assert_eq!(log[2..], ["end_capture 0x51", "graph_destroy 0x61"]);
        // a failing call outside a capture names itself too
        FAIL.with(|x| *x.borrow_mut() = Some("memset_async"));
        // SAFETY: the stub touches no memory.
        let e = unsafe { s.zero(0xd0 as *mut c_void, 8) }
            .unwrap_err()
            .to_string();
        assert!(e.contains("hipMemsetD8Async"), "{e}");
    }
}
