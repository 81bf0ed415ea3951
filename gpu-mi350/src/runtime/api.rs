//! The runtime line (issue 16 item 2): every runtime call of the
//! device-resident engine goes through the handles of this module, each an
//! opaque value over the two vendors' runtimes, so the code above it (the
//! standard path, the runner, the draft, device buffers and weights) is one
//! code path for CUDA and HIP and names neither.
//!
//! - [`Gpu`]: an open device, the one trait: kernels by source and entry
//!   point (compiled at run time for the device's arch and cached: NVRTC to
//!   CUBIN, hiprtc to a code object), its vendor, whether it takes
//!   programmatic dependent launch, its multiprocessor count, and its
//!   [`Device`].
//! - [`Device`]: what every buffer, stream and event of a device keeps:
//!   binding to the calling thread, allocation, synchronous copies and
//!   memset, memory info, new streams and events.
//! - [`Stream`] (asynchronous copies, memset, launches, waits on another
//!   stream's event, capture into a [`Graph`]), [`Event`] (timing, or
//!   ordering only), [`Graph`] (replay), [`Func`] (a kernel).
//!
//! Each handle is a small enum matched in one place per call, so a call's
//! CUDA arm is the exact driver call the engine made before the line
//! existed (through cudarc's safe wrappers where it used them), and errors
//! name the vendor's call (`cuMemAlloc` / `hipMalloc`). Enums rather than
//! a trait with associated types: the handles would make every struct of
//! the standard path generic, for two implementations known in advance.
//!
//! Vendor differences the line absorbs: programmatic dependent launch is
//! CUDA only ([`LaunchCfg::pdl`] is ignored on HIP, whose kernels'
//! `M3_PDL_WAIT` is empty); a host-to-device async copy returns once the
//! host bytes are consumed on both (CUDA stages pageable memory, the HIP
//! arm waits); HIP has no graph upload (the first replay uploads). The
//! mono path's occupancy is queried through the device on HIP
//! ([`Gpu::occupancy`]: hipModuleOccupancyMaxActiveBlocksPerMultiprocessor,
//! with the compute units from hipDeviceGetAttribute, checked), its
//! registers and local memory are reported on CUDA only.
//!
//! The HIP arms are exercised in CI by a whole standard-path step on a stub
//! function table backed by host memory (`standard::hip_route_tests`); none
//! has run on AMD hardware.

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::sys::{self, CUevent_flags, CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{result, CudaContext, CudaEvent, CudaFunction, CudaGraph, CudaStream};

use super::cuda::CudaGpu;
use super::hip::{HipApi, HipEvent, HipFunction, HipGpu, HipGraph, HipStream};
use crate::error::{GpuError, Result};
use crate::kernels::{KernelSource, Vendor};

/// An open GPU as the code above the runtime line sees it.
pub trait Gpu {
    /// The device handle buffers, launchers and streams are made from.
    fn device(&self) -> &Device;
    /// Kernel `entry` of `src`, compiled for this device on first use.
    fn kernel(&self, src: &KernelSource, entry: &str) -> Result<Func>;
    /// Compile `srcs` ahead of their [`Gpu::kernel`] calls where this
    /// runtime can compile several at once (CUDA: NVRTC on one thread a
    /// unit); a hint: failures are left to those calls to report.
    fn precompile(&self, srcs: &[KernelSource]) {
        let _ = srcs;
    }
    /// Which compiler the kernels meet (compat.h's `M3_CUDA` / `M3_HIP`).
    fn vendor(&self) -> Vendor;
    /// Whether launches may use programmatic dependent launch (CUDA sm_90+).
    fn pdl(&self) -> bool;
    /// Streaming multiprocessors (CUDA) or compute units (HIP).
    fn multiprocessors(&self) -> u32;
    /// Lanes of a warp or wavefront here (`M3_WARP`).
    fn warp(&self) -> u32 {
        self.vendor().warp()
    }
    /// Whether this is the CPU simulator (`runtime::sim`), which runs the
    /// mono path on either flavour (one persistent CTA).
    fn simulated(&self) -> bool {
        false
    }
    /// Why the mono path cannot size its all-resident grid on this device
    /// (`None`: it can).
    fn mono_unsupported(&self) -> Option<String> {
        None
    }
    /// What a report says about this device.
    fn describe(&self) -> DeviceDesc;
    /// Blocks of `threads` threads and `smem` bytes of dynamic shared
    /// memory of `f` that fit on one multiprocessor (compute unit) at once.
    fn occupancy(&self, f: &Func, threads: u32, smem: usize) -> Result<u32> {
        f.max_blocks_per_multiprocessor(threads, smem)
    }
}

/// A device as reports name it (`m3 bench`'s header and JSON).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceDesc {
    pub name: String,
    /// The compile target, e.g. `sm_90`, `gfx950`.
    pub arch: String,
    /// Multiprocessors (compute units).
    pub units: u32,
    pub total_mem_bytes: usize,
    /// The run-time compiler and its (major, minor) version.
    pub compiler: (&'static str, i32, i32),
}

/// A boxed device is a device (the tests pick CUDA or the HIP simulator at
/// run time).
impl<G: Gpu + ?Sized> Gpu for Box<G> {
    fn device(&self) -> &Device {
        (**self).device()
    }
    fn kernel(&self, src: &KernelSource, entry: &str) -> Result<Func> {
        (**self).kernel(src, entry)
    }
    fn precompile(&self, srcs: &[KernelSource]) {
        (**self).precompile(srcs)
    }
    fn vendor(&self) -> Vendor {
        (**self).vendor()
    }
    fn pdl(&self) -> bool {
        (**self).pdl()
    }
    fn multiprocessors(&self) -> u32 {
        (**self).multiprocessors()
    }
    fn warp(&self) -> u32 {
        (**self).warp()
    }
    fn simulated(&self) -> bool {
        (**self).simulated()
    }
    fn mono_unsupported(&self) -> Option<String> {
        (**self).mono_unsupported()
    }
    fn describe(&self) -> DeviceDesc {
        (**self).describe()
    }
    fn occupancy(&self, f: &Func, threads: u32, smem: usize) -> Result<u32> {
        (**self).occupancy(f, threads, smem)
    }
}

impl Gpu for CudaGpu {
    fn device(&self) -> &Device {
        self.device_handle()
    }
    fn kernel(&self, src: &KernelSource, entry: &str) -> Result<Func> {
        self.function(src, entry).map(|f| Func(Fun::Cuda(f)))
    }
    fn precompile(&self, srcs: &[KernelSource]) {
        CudaGpu::precompile(self, srcs)
    }
    fn vendor(&self) -> Vendor {
        Vendor::Cuda
    }
    fn pdl(&self) -> bool {
        self.info().cc.0 >= 9
    }
    fn multiprocessors(&self) -> u32 {
        self.info().sm_count.max(1) as u32
    }
    fn describe(&self) -> DeviceDesc {
        let i = self.info();
        DeviceDesc {
            name: i.name.clone(),
            arch: i.arch.clone(),
            units: self.multiprocessors(),
            total_mem_bytes: i.total_mem_bytes,
            compiler: ("nvrtc", i.nvrtc.0, i.nvrtc.1),
        }
    }
}

impl Gpu for HipGpu {
    fn device(&self) -> &Device {
        self.device_handle()
    }
    fn kernel(&self, src: &KernelSource, entry: &str) -> Result<Func> {
        let sim = self.sim_flavour().is_some();
        HipGpu::kernel(self, src, entry).map(|f| Func(Fun::Hip(HipFunc(f), sim)))
    }
    fn vendor(&self) -> Vendor {
        // HIP, or CUDA on the simulator's CUDA flavour
        self.device_handle().vendor()
    }
    fn pdl(&self) -> bool {
        false
    }
    fn multiprocessors(&self) -> u32 {
        self.compute_units()
    }
    fn simulated(&self) -> bool {
        self.sim_flavour().is_some()
    }
    fn mono_unsupported(&self) -> Option<String> {
        HipGpu::mono_unsupported(self)
    }
    fn describe(&self) -> DeviceDesc {
        HipGpu::describe(self)
    }
    fn occupancy(&self, f: &Func, threads: u32, smem: usize) -> Result<u32> {
        match &f.0 {
            Fun::Hip(h, false) => HipGpu::occupancy(self, h.0, threads, smem),
            _ => f.max_blocks_per_multiprocessor(threads, smem),
        }
    }
}

/// A device: a CUDA context, or HIP's function table and device ordinal.
#[derive(Clone)]
pub struct Device(Dev);

#[derive(Clone)]
enum Dev {
    Cuda(Arc<CudaContext>),
    Hip(Arc<HipApi>),
}

impl Device {
    pub(crate) fn cuda(ctx: Arc<CudaContext>) -> Self {
        Device(Dev::Cuda(ctx))
    }

    /// The most shared memory one multiprocessor holds, bytes (the
    /// carve-out's 100%); 0 on HIP and where the driver does not say.
    pub fn shared_per_multiprocessor(&self) -> usize {
        use sys::CUdevice_attribute_enum as A;
        match &self.0 {
            Dev::Cuda(ctx) => ctx
                .attribute(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR)
                .map_or(0, |b| b.max(0) as usize),
            Dev::Hip(_) => 0,
        }
    }

    pub(crate) fn hip(api: Arc<HipApi>) -> Self {
        Device(Dev::Hip(api))
    }

    pub fn vendor(&self) -> Vendor {
        match &self.0 {
            Dev::Cuda(_) => Vendor::Cuda,
            Dev::Hip(h) => h.vendor,
        }
    }

    /// Make the device current on this thread (driver calls need it).
    pub fn bind(&self) -> Result<()> {
        match &self.0 {
            Dev::Cuda(c) => c
                .bind_to_thread()
                .map_err(|e| GpuError::driver("cuCtxSetCurrent", e)),
            Dev::Hip(h) => h.set_device(),
        }
    }

    /// `bytes` of uninitialised device memory (the caller has bound the
    /// device); its address.
    pub fn alloc(&self, bytes: usize) -> Result<u64> {
        match &self.0 {
            // SAFETY: a plain allocation; the caller frees it once.
            Dev::Cuda(_) => unsafe { result::malloc_sync(bytes) }
                .map_err(|e| GpuError::driver("cuMemAlloc", format!("{bytes} bytes: {e}"))),
            Dev::Hip(h) => h.malloc(bytes),
        }
    }

    /// Free an allocation, ignoring failure (drop paths have no one to
    /// tell).
    ///
    /// # Safety
    /// `ptr` came from [`alloc`](Self::alloc) on this device and is freed
    /// once.
    pub unsafe fn free(&self, ptr: u64) {
        match &self.0 {
            Dev::Cuda(_) => {
                let _ = result::free_sync(ptr);
            }
            Dev::Hip(h) => {
                let _ = h.free(ptr);
            }
        }
    }

    /// Zero `bytes` at `ptr`, synchronously: zero on return, as
    /// [`Device::htod`]'s bytes are (`cuMemsetD8` alone is asynchronous to
    /// the host, on the legacy stream).
    ///
    /// # Safety
    /// The range lies inside a live allocation.
    pub unsafe fn zero(&self, ptr: u64, bytes: usize) -> Result<()> {
        match &self.0 {
            Dev::Cuda(_) => {
                result::memset_d8_sync(ptr, 0, bytes)
                    .map_err(|e| GpuError::driver("cuMemsetD8", e))?;
                result::ctx::synchronize().map_err(|e| GpuError::driver("cuCtxSynchronize", e))
            }
            Dev::Hip(h) => h.zero(ptr, bytes),
        }
    }

    /// Copy `src` to device address `dst`, synchronously: the bytes are in
    /// device memory on return, so work on any stream launched after sees
    /// them. (`cuMemcpyHtoD` alone may return once a pageable source is
    /// staged, before the DMA has landed, and the engine's streams do not
    /// wait for the legacy stream it runs on: the context is synchronized
    /// after it. Suspected in session 44: the kernel microbench's NaN
    /// poison, written so, landing after the checked launch had written
    /// its outputs.)
    ///
    /// # Safety
    /// `dst .. dst + src.len()` lies inside a live allocation.
    pub unsafe fn htod(&self, dst: u64, src: &[u8]) -> Result<()> {
        match &self.0 {
            Dev::Cuda(_) => {
                result::memcpy_htod_sync(dst, src)
                    .map_err(|e| GpuError::driver("cuMemcpyHtoD", e))?;
                result::ctx::synchronize().map_err(|e| GpuError::driver("cuCtxSynchronize", e))
            }
            Dev::Hip(h) => h.htod(dst, src),
        }
    }

    /// Copy `dst.len()` bytes from device address `src`, synchronously.
    ///
    /// # Safety
    /// `src .. src + dst.len()` lies inside a live allocation, and no work
    /// writing it is pending.
    pub unsafe fn dtoh(&self, dst: &mut [u8], src: u64) -> Result<()> {
        match &self.0 {
            Dev::Cuda(_) => {
                result::memcpy_dtoh_sync(dst, src).map_err(|e| GpuError::driver("cuMemcpyDtoH", e))
            }
            Dev::Hip(h) => h.dtoh(dst, src),
        }
    }

    /// (free, total) bytes of device memory (the caller has bound it).
    pub fn mem_info(&self) -> Result<(usize, usize)> {
        match &self.0 {
            Dev::Cuda(_) => result::mem_get_info().map_err(|e| GpuError::driver("cuMemGetInfo", e)),
            Dev::Hip(h) => h.mem_info(),
        }
    }

    /// A new non-blocking stream.
    pub fn stream(&self) -> Result<Stream> {
        match &self.0 {
            Dev::Cuda(c) => c
                .new_stream()
                .map(|s| Stream(Str::Cuda(s)))
                .map_err(|e| GpuError::driver("cuStreamCreate", e)),
            Dev::Hip(h) => h.stream().map(|s| Stream(Str::Hip(Arc::new(s)))),
        }
    }

    /// A new event that only orders streams ([`Stream::wait`]): no
    /// timing, so recording it costs less.
    pub fn marker(&self) -> Result<Event> {
        match &self.0 {
            Dev::Cuda(c) => c
                .new_event(Some(CUevent_flags::CU_EVENT_DISABLE_TIMING))
                .map(|e| Event(Ev::Cuda(e)))
                .map_err(|e| GpuError::driver("cuEventCreate", e)),
            Dev::Hip(h) => h.marker().map(|e| Event(Ev::Hip(e))),
        }
    }

    /// A new timing event.
    pub fn event(&self) -> Result<Event> {
        match &self.0 {
            Dev::Cuda(c) => c
                .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
                .map(|e| Event(Ev::Cuda(e)))
                .map_err(|e| GpuError::driver("cuEventCreate", e)),
            Dev::Hip(h) => h.event().map(|e| Event(Ev::Hip(e))),
        }
    }
}

/// A HIP kernel handle (`hipFunction_t`).
#[derive(Clone, Copy)]
struct HipFunc(HipFunction);
// SAFETY: a hipFunction_t is an opaque process-wide handle into a module
// this binding never unloads; launching it from any thread is allowed.
unsafe impl Send for HipFunc {}
// SAFETY: as above; the handle is never written through.
unsafe impl Sync for HipFunc {}

/// A kernel entry point of a loaded module.
#[derive(Clone)]
pub struct Func(Fun);

#[derive(Clone)]
enum Fun {
    Cuda(CudaFunction),
    /// A HIP function; `true` on the simulator (`runtime::sim`), which
    /// answers the mono path's queries for the one CTA it runs at a time.
    Hip(HipFunc, bool),
}

impl Func {
    /// The vendor's function handle as an address: equal for two lookups
    /// of the same entry point of the same module (what it is, not a
    /// pointer to follow).
    pub fn handle(&self) -> usize {
        match &self.0 {
            Fun::Cuda(f) => f.cu_function() as usize,
            Fun::Hip(f, _) => f.0 as usize,
        }
    }

    fn cuda_only(&self, what: &str) -> Result<&CudaFunction> {
        match &self.0 {
            Fun::Cuda(f) => Ok(f),
            Fun::Hip(..) => Err(GpuError::input(
                "mono path",
                format!("{what} of a HIP function is asked of its device (Gpu::occupancy)"),
            )),
        }
    }

    /// Ask for a shared-memory carve-out of `percent` of the most shared
    /// memory a multiprocessor holds (the rest of its unified L1 / shared
    /// store is L1: the mono kernel's stack lives there). A hint the
    /// driver rounds up to a carve-out it supports. HIP: nothing to set (a
    /// compute unit's LDS is its own).
    pub fn set_shared_carveout(&self, percent: u32) -> Result<()> {
        use sys::CUfunction_attribute_enum as A;
        if matches!(self.0, Fun::Hip(..)) {
            return Ok(());
        }
        self.cuda_only("the shared-memory carve-out")?
            .set_attribute(
                A::CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT,
                percent.min(100) as i32,
            )
            .map_err(|e| GpuError::driver("cuFuncSetAttribute", e))
    }

    /// Static shared memory a block, bytes (0 when unknown).
    pub fn shared_bytes(&self) -> usize {
        match &self.0 {
            Fun::Cuda(f) => f.shared_size_bytes().map_or(0, |b| b.max(0) as usize),
            Fun::Hip(..) => 0,
        }
    }

    /// Registers a thread (0 when unknown).
    pub fn registers(&self) -> i32 {
        match &self.0 {
            Fun::Cuda(f) => f.num_regs().unwrap_or(0),
            Fun::Hip(..) => 0,
        }
    }

    /// Local memory bytes a thread (0 when unknown).
    pub fn local_bytes(&self) -> i32 {
        match &self.0 {
            Fun::Cuda(f) => f.local_size_bytes().unwrap_or(0),
            Fun::Hip(..) => 0,
        }
    }

    /// Whether this is a function of the simulator.
    fn on_sim(&self) -> bool {
        matches!(self.0, Fun::Hip(_, true))
    }

    /// Blocks of `threads` threads and `smem` bytes of dynamic shared
    /// memory that fit on one multiprocessor at once.
    /// The simulator: one (it runs a launch's CTAs one after another, and
    /// reports one multiprocessor, so an all-resident grid is one CTA).
    /// HIP devices answer through [`Gpu::occupancy`] (the query needs the
    /// device's function table).
    pub fn max_blocks_per_multiprocessor(&self, threads: u32, smem: usize) -> Result<u32> {
        if self.on_sim() {
            return Ok(1);
        }
        self.cuda_only("occupancy")?
            .occupancy_max_active_blocks_per_multiprocessor(threads, smem, None)
            .map_err(|e| GpuError::driver("cuOccupancyMaxActiveBlocksPerMultiprocessor", e))
    }
}

/// The shape and options of one launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchCfg {
    pub grid: (u32, u32, u32),
    /// Threads of a 1-D block.
    pub block: u32,
    /// Dynamic shared memory, bytes.
    pub smem: u32,
    /// Programmatic dependent launch (CUDA's programmatic stream
    /// serialization attribute; ignored on HIP, which has none).
    pub pdl: bool,
}

/// A stream: every launch, copy and event of one launcher is ordered on it.
#[derive(Clone)]
pub struct Stream(Str);

#[derive(Clone)]
enum Str {
    Cuda(Arc<CudaStream>),
    Hip(Arc<HipStream>),
}

impl Stream {
    /// Wait for everything enqueued so far; surfaces asynchronous errors.
    pub fn sync(&self) -> Result<()> {
        match &self.0 {
            Str::Cuda(s) => s
                .synchronize()
                .map_err(|e| GpuError::driver("cuStreamSynchronize", e)),
            Str::Hip(s) => s.sync(),
        }
    }

    /// Copy `src` to device address `dst`, ordered on the stream; `src`
    /// may be reused when this returns (see the module doc).
    ///
    /// # Safety
    /// `dst .. dst + src.len()` lies inside a live allocation.
    pub unsafe fn htod(&self, dst: u64, src: &[u8]) -> Result<()> {
        match &self.0 {
            Str::Cuda(s) => result::memcpy_htod_async(dst, src, s.cu_stream())
                .map_err(|e| GpuError::driver("cuMemcpyHtoDAsync", e)),
            Str::Hip(s) => s.upload(dst as usize as *mut c_void, src),
        }
    }

    /// Device-to-device copy of `bytes`, ordered on the stream.
    ///
    /// # Safety
    /// Both ranges lie inside live allocations.
    pub unsafe fn dtod(&self, dst: u64, src: u64, bytes: usize) -> Result<()> {
        match &self.0 {
            Str::Cuda(s) => result::memcpy_dtod_async(dst, src, bytes, s.cu_stream())
                .map_err(|e| GpuError::driver("cuMemcpyDtoDAsync", e)),
            Str::Hip(s) => s.copy(
                dst as usize as *mut c_void,
                src as usize as *const c_void,
                bytes,
            ),
        }
    }

    /// Zero `bytes` at `dst`, ordered on the stream.
    ///
    /// # Safety
    /// The range lies inside a live allocation.
    pub unsafe fn zero(&self, dst: u64, bytes: usize) -> Result<()> {
        match &self.0 {
            Str::Cuda(s) => result::memset_d8_async(dst, 0, bytes, s.cu_stream())
                .map_err(|e| GpuError::driver("cuMemsetD8Async", e)),
            Str::Hip(s) => s.zero(dst as usize as *mut c_void, bytes),
        }
    }

    /// Launch `f` on this stream; `label` names the launch in errors.
    ///
    /// # Safety
    /// `params` holds one pointer to each kernel argument's value, matching
    /// the kernel's parameter list in count, order and types; every value
    /// outlives the call and every device address in them is live until
    /// the work has run.
    pub unsafe fn launch(
        &self,
        label: &str,
        f: &Func,
        cfg: &LaunchCfg,
        params: &mut [*mut c_void],
    ) -> Result<()> {
        match (&self.0, &f.0) {
            (Str::Cuda(s), Fun::Cuda(f)) => {
                // SAFETY: a zeroed union is a valid CUlaunchAttributeValue;
                // only the PDL field is read for this attribute id
                let mut value: sys::CUlaunchAttributeValue = std::mem::zeroed();
                value.programmaticStreamSerializationAllowed = 1;
                let mut attr = sys::CUlaunchAttribute {
                    id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
                    pad: [0; 4],
                    value,
                };
                let lc = sys::CUlaunchConfig {
                    gridDimX: cfg.grid.0,
                    gridDimY: cfg.grid.1,
                    gridDimZ: cfg.grid.2,
                    blockDimX: cfg.block,
                    blockDimY: 1,
                    blockDimZ: 1,
                    sharedMemBytes: cfg.smem,
                    hStream: s.cu_stream(),
                    attrs: &mut attr,
                    numAttrs: cfg.pdl as u32,
                };
                // SAFETY: the caller's contract (see `# Safety`); `lc` and
                // `attr` outlive the call
                sys::cuLaunchKernelEx(
                    &lc,
                    f.cu_function(),
                    params.as_mut_ptr(),
                    std::ptr::null_mut(),
                )
                .result()
                .map_err(|e| GpuError::driver("cuLaunchKernelEx", format!("{label}: {e}")))
            }
            (Str::Hip(s), Fun::Hip(f, _)) => s
                .launch(f.0, cfg.grid, cfg.block, cfg.smem, params)
                .map_err(|e| GpuError::driver("hipModuleLaunchKernel", format!("{label}: {e}"))),
            _ => Err(GpuError::input(
                "launch",
                format!("{label}: a kernel of one vendor on a stream of the other"),
            )),
        }
    }

    /// Make work enqueued on this stream from now on wait for the work `e`
    /// last recorded (on any stream of the device). Inside a capture this
    /// is how a second stream joins it (a fork) and how the capturing
    /// stream takes it back (a join): dependency edges of the graph.
    pub fn wait(&self, e: &Event) -> Result<()> {
        match (&self.0, &e.0) {
            (Str::Cuda(s), Ev::Cuda(e)) => s
                .wait(e)
                .map_err(|e| GpuError::driver("cuStreamWaitEvent", e)),
            (Str::Hip(s), Ev::Hip(e)) => s.wait(e),
            _ => Err(GpuError::input(
                "event",
                "a stream of one vendor waiting for an event of the other",
            )),
        }
    }

    /// Begin capturing this stream's work into a graph (thread-local mode:
    /// other threads' calls are not captured).
    pub fn begin_capture(&self) -> Result<()> {
        match &self.0 {
            Str::Cuda(s) => s
                .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
                .map_err(|e| GpuError::driver("cuStreamBeginCapture", e)),
            Str::Hip(s) => s.begin_capture(),
        }
    }

    /// End the capture and instantiate what it holds (`None`: nothing).
    pub fn end_capture(&self) -> Result<Option<Graph>> {
        match &self.0 {
            Str::Cuda(s) => s
                .end_capture(CUgraphInstantiate_flags(0))
                .map(|g| g.map(|g| Graph(Gr::Cuda(g))))
                .map_err(|e| GpuError::driver("cuStreamEndCapture", e)),
            Str::Hip(s) => s
                .end_capture()
                .map(|g| g.map(|g| Graph(Gr::Hip(g, s.clone())))),
        }
    }
}

/// An event: timing ([`Device::event`]) or ordering ([`Device::marker`]).
pub struct Event(Ev);

enum Ev {
    Cuda(CudaEvent),
    Hip(HipEvent),
}

impl Event {
    /// Record the event on `s` now.
    pub fn record(&self, s: &Stream) -> Result<()> {
        match (&self.0, &s.0) {
            (Ev::Cuda(e), Str::Cuda(s)) => e
                .record(s)
                .map_err(|e| GpuError::driver("cuEventRecord", e)),
            (Ev::Hip(e), Str::Hip(s)) => e.record(s),
            _ => Err(GpuError::input(
                "event",
                "an event of one vendor on a stream of the other",
            )),
        }
    }

    /// Milliseconds from `self` to `later` (waits for both).
    pub fn elapsed_ms(&self, later: &Event) -> Result<f32> {
        match (&self.0, &later.0) {
            (Ev::Cuda(a), Ev::Cuda(b)) => a
                .elapsed_ms(b)
                .map_err(|e| GpuError::driver("cuEventElapsedTime", e)),
            (Ev::Hip(a), Ev::Hip(b)) => a.elapsed_ms(b),
            _ => Err(GpuError::input("event", "events of two vendors")),
        }
    }
}

/// An instantiated graph, replayed on the stream it was captured on.
pub struct Graph(Gr);

enum Gr {
    Cuda(CudaGraph),
    Hip(HipGraph, Arc<HipStream>),
}

impl Graph {
    /// Upload the graph's resources now, so the first replay does not pay
    /// for it (CUDA; HIP has no separate upload: its first replay does it).
    pub fn upload(&self) -> Result<()> {
        match &self.0 {
            Gr::Cuda(g) => g.upload().map_err(|e| GpuError::driver("cuGraphUpload", e)),
            Gr::Hip(..) => Ok(()),
        }
    }

    /// Replay the graph on its stream.
    pub fn launch(&self) -> Result<()> {
        match &self.0 {
            Gr::Cuda(g) => g.launch().map_err(|e| GpuError::driver("cuGraphLaunch", e)),
            Gr::Hip(g, s) => s.replay(g),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    /// Names only `runtime/` may use (the op harness, CUDA only, and the
    /// gfx950-only `mfma_mx` are the documented exceptions; `lib.rs`
    /// re-exports).
    const VENDOR_NAMES: [&str; 5] = [
        "cudarc",
        "runtime::hip",
        "CudaGpu",
        "CudaFunction",
        "CudaContext",
    ];

    /// Lines of `src` before its first `#[cfg(test)]` (tests may open a
    /// particular vendor's device, and test-only files `*tests.rs` are
    /// skipped) that name a vendor's runtime.
    fn vendor_lines(src: &str) -> Vec<String> {
        src.lines()
            .take_while(|l| !l.trim_start().starts_with("#[cfg(test)]"))
            .filter(|l| !l.trim_start().starts_with("//"))
            .filter(|l| VENDOR_NAMES.iter().any(|n| l.contains(n)))
            .map(str::to_string)
            .collect()
    }

    fn walk(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
        for e in std::fs::read_dir(dir).expect("source directory").flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }

    /// ARCHITECTURE.md's invariant: nothing above `runtime/` names cudarc
    /// or the HIP binding.
    #[test]
    fn nothing_above_the_runtime_line_names_a_vendor() {
        // control: the scan sees a use line
        assert_eq!(vendor_lines("use cudarc::driver::CudaStream;\n").len(), 1);
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = Vec::new();
        walk(&root, &mut files);
        assert!(files.len() > 20, "{} sources", files.len());
        let mut bad = Vec::new();
        for f in files {
            let rel = f.strip_prefix(&root).expect("under src");
            let r = rel.to_string_lossy().replace('\\', "/");
            if r.starts_with("runtime/")
                || r.starts_with("harness/")
                || r == "lib.rs"
                || r == "mfma_mx.rs"
                || r.ends_with("tests.rs")
            {
                continue;
            }
            let src = std::fs::read_to_string(&f).expect("readable source");
            bad.extend(vendor_lines(&src).into_iter().map(|l| format!("{r}: {l}")));
        }
        assert!(
            bad.is_empty(),
            "vendor runtime named above the line:\n{}",
            bad.join("\n")
        );
    }
}
