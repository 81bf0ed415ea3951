//! HIP (AMD, MI350 = gfx950) through a small binding loaded at run time with
//! `libloading` (libamdhip64.so + libhiprtc.so), so building needs no ROCm.
//!
//! **Untested on hardware**: no AMD GPU has been available to this project.
//! The binding compiles and its discovery path fails cleanly where ROCm is
//! absent; kernels are checked to compile with hipcc in `cargo xtask kernels`.
//! Only what the first kernels need is bound: init, device count and arch
//! name, hiprtc compile to a code object, module load, launch, malloc,
//! memcpy, free.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};
use std::ptr;

use libloading::Library;

use crate::error::{GpuError, Result};
use crate::kernels::KernelSource;

type HipError = c_int;
type HiprtcResult = c_int;
type HipModule = *mut c_void;
type HipFunction = *mut c_void;
type HiprtcProgram = *mut c_void;

/// hipMemcpyHostToDevice / DeviceToHost.
const HIP_MEMCPY_H2D: c_int = 1;
const HIP_MEMCPY_D2H: c_int = 2;
/// hipDeviceProp_t is large and its layout moves between ROCm versions, so
/// `hipGetDeviceProperties` writes into this generous buffer and the
/// `gcnArchName` string is searched for (see `arch_name`).
const PROPS_BYTES: usize = 4096;

struct Fns {
    init: unsafe extern "C" fn(c_uint) -> HipError,
    get_device_count: unsafe extern "C" fn(*mut c_int) -> HipError,
    get_device_properties: unsafe extern "C" fn(*mut c_void, c_int) -> HipError,
    module_load_data: unsafe extern "C" fn(*mut HipModule, *const c_void) -> HipError,
    module_get_function:
        unsafe extern "C" fn(*mut HipFunction, HipModule, *const c_char) -> HipError,
    #[allow(clippy::type_complexity)]
    module_launch_kernel: unsafe extern "C" fn(
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
    malloc: unsafe extern "C" fn(*mut *mut c_void, usize) -> HipError,
    memcpy: unsafe extern "C" fn(*mut c_void, *const c_void, usize, c_int) -> HipError,
    free: unsafe extern "C" fn(*mut c_void) -> HipError,
    device_synchronize: unsafe extern "C" fn() -> HipError,
    rtc_create: unsafe extern "C" fn(
        *mut HiprtcProgram,
        *const c_char,
        *const c_char,
        c_int,
        *const *const c_char,
        *const *const c_char,
    ) -> HiprtcResult,
    rtc_compile: unsafe extern "C" fn(HiprtcProgram, c_int, *const *const c_char) -> HiprtcResult,
    rtc_log_size: unsafe extern "C" fn(HiprtcProgram, *mut usize) -> HiprtcResult,
    rtc_log: unsafe extern "C" fn(HiprtcProgram, *mut c_char) -> HiprtcResult,
    rtc_code_size: unsafe extern "C" fn(HiprtcProgram, *mut usize) -> HiprtcResult,
    rtc_code: unsafe extern "C" fn(HiprtcProgram, *mut c_char) -> HiprtcResult,
    rtc_destroy: unsafe extern "C" fn(*mut HiprtcProgram) -> HiprtcResult,
}

/// An open HIP device (untested on hardware; see the module docs).
pub struct HipGpu {
    fns: Fns,
    /// e.g. `gfx950` (the part of gcnArchName before any ':' features).
    pub arch: String,
    _hip: Library,
    _rtc: Library,
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

fn check(call: &'static str, rc: c_int) -> Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(GpuError::driver(call, format!("error code {rc}")))
    }
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
            module_load_data: sym!(hip, "hipModuleLoadData"),
            module_get_function: sym!(hip, "hipModuleGetFunction"),
            module_launch_kernel: sym!(hip, "hipModuleLaunchKernel"),
            malloc: sym!(hip, "hipMalloc"),
            memcpy: sym!(hip, "hipMemcpy"),
            free: sym!(hip, "hipFree"),
            device_synchronize: sym!(hip, "hipDeviceSynchronize"),
            rtc_create: sym!(rtc, "hiprtcCreateProgram"),
            rtc_compile: sym!(rtc, "hiprtcCompileProgram"),
            rtc_log_size: sym!(rtc, "hiprtcGetProgramLogSize"),
            rtc_log: sym!(rtc, "hiprtcGetProgramLog"),
            rtc_code_size: sym!(rtc, "hiprtcGetCodeSize"),
            rtc_code: sym!(rtc, "hiprtcGetCode"),
            rtc_destroy: sym!(rtc, "hiprtcDestroyProgram"),
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
        let arch = Self::arch_name(&fns)?;
        Ok(HipGpu {
            fns,
            arch,
            _hip: hip,
            _rtc: rtc,
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

    /// hiprtc: source to a code object for this device's arch.
    pub fn compile(&self, src: &KernelSource) -> Result<Vec<u8>> {
        let full = CString::new(src.full_source())
            .map_err(|_| GpuError::input("hip compile", "NUL in source"))?;
        let name = CString::new(format!("{}.cu", src.name))
            .map_err(|_| GpuError::input("hip compile", "NUL in name"))?;
        let opts: Vec<CString> = src
            .hip_options(&self.arch)
            .into_iter()
            .filter(|o| !o.starts_with("-O"))
            .map(|o| CString::new(o).map_err(|_| GpuError::input("hip compile", "NUL in option")))
            .collect::<Result<_>>()?;
        let optp: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();
        let f = &self.fns;
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

    /// Load a code object and return the function `entry` (the module is
    /// kept alive for the process: modules are few and long-lived).
    pub fn function(&self, code: &[u8], entry: &str) -> Result<HipFunction> {
        let e = CString::new(entry).map_err(|_| GpuError::input("hip function", "NUL in name"))?;
        let mut m: HipModule = ptr::null_mut();
        let mut func: HipFunction = ptr::null_mut();
        // SAFETY: code is a complete code object; out-pointers are valid.
        unsafe {
            check(
                "hipModuleLoadData",
                (self.fns.module_load_data)(&mut m, code.as_ptr().cast()),
            )?;
            check(
                "hipModuleGetFunction",
                (self.fns.module_get_function)(&mut func, m, e.as_ptr()),
            )?;
        }
        Ok(func)
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
        check(
            "hipModuleLaunchKernel",
            (self.fns.module_launch_kernel)(
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
        check("hipDeviceSynchronize", (self.fns.device_synchronize)())
    }

    /// Allocate `bytes` of device memory and copy `src` into it.
    pub fn upload(&self, src: &[u8]) -> Result<*mut c_void> {
        let mut p: *mut c_void = ptr::null_mut();
        // SAFETY: valid out-pointer; copy of exactly src.len() bytes.
        unsafe {
            check("hipMalloc", (self.fns.malloc)(&mut p, src.len().max(1)))?;
            check(
                "hipMemcpy",
                (self.fns.memcpy)(p, src.as_ptr().cast(), src.len(), HIP_MEMCPY_H2D),
            )?;
        }
        Ok(p)
    }

    /// Copy `dst.len()` bytes back from device pointer `p`.
    ///
    /// # Safety
    /// `p` must hold at least `dst.len()` bytes.
    pub unsafe fn download(&self, p: *const c_void, dst: &mut [u8]) -> Result<()> {
        check(
            "hipMemcpy",
            (self.fns.memcpy)(dst.as_mut_ptr().cast(), p, dst.len(), HIP_MEMCPY_D2H),
        )
    }

    /// Free a pointer from [`upload`](Self::upload).
    ///
    /// # Safety
    /// `p` must come from `upload` and not be freed twice.
    pub unsafe fn free(&self, p: *mut c_void) -> Result<()> {
        check("hipFree", (self.fns.free)(p))
    }
}
