//! The HIP simulator: a HIP function table ([`Fns`]) that runs the kernels on
//! this machine's CPU, so the engine's HIP route (MI350's wave64 semantics)
//! runs end to end where no AMD GPU exists: here, in CI, on a laptop.
//! `M3_GPU_RUNTIME=sim` opens it ([`HipGpu::sim`]); `M3_GPU_RUNTIME=sim-cuda`
//! opens its CUDA flavour ([`HipGpu::sim_cuda`]: compat.h's CUDA branch,
//! 32-lane warps, the engine launching as on CUDA), which runs the
//! CUDA-only code paths (PTX replaced by the generic twins compat.h has).
//!
//! - **Compile** (the hiprtc entry points): the kernel source, behind
//!   `kernels/hip_sim.h` (HIP's device API for the host) and followed by
//!   `kernels/hip_sim_rt.h` (the block scheduler) and one launcher a kernel,
//!   is built by the host C++ compiler (`$M3_SIM_CXX`, else `$CXX`, else
//!   `c++`) into a shared library, kept on disk by a hash of everything
//!   that went in (`$M3_SIM_CACHE`, else the kernel cache's `sim/`), and
//!   built once in a process (threads asking for it at once wait). The
//!   "code object" handed back is that library's path.
//! - **Run**: a launch runs every block in order on the calling thread, the
//!   threads of a block as fibers (hip_sim.h says what is modelled, and how
//!   a deadlock or a trap is reported); one launch at a time in the
//!   process. Device memory is host memory;
//!   copies are `memcpy`, checked against the live allocations as a real
//!   runtime would (a copy past an allocation fails, naming it).
//! - **Streams** run their work at once, in issue order, which is one valid
//!   order of any stream graph; a **capture** records the work instead
//!   (kernel arguments copied by the launcher's own signature), including
//!   the work of streams that join it through an event, and a graph replay
//!   runs the record in order.
//!
//! `M3_SIM_TRACE=1` prints every launch (kernel, grid, block);
//! `M3_SIM_POISON=1` fills new device memory with 0xff (NaN in every float
//! format here) instead of zeros, so reads of memory nothing wrote show.
//!
//! Safety: every `extern "C"` entry point below is reached through [`Fns`]
//! by `hip.rs`, under the HIP C API's contract (out-pointers valid, handles
//! ones this table gave out, `kernelParams` matching the kernel); handles
//! it did not give out are refused, and device ranges of copies are
//! checked, as a real runtime would.
//!
//! What it does not model: timing (events measure the simulator), memory
//! bounds inside a kernel, and concurrency between blocks (a kernel whose
//! blocks wait for each other deadlocks here, and fails).

use std::alloc::Layout;
use std::collections::{BTreeMap, HashMap};
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Instant;

use libloading::Library;

use super::cache;
use super::hip::{
    Fns, HipError, HipEventT, HipFunction, HipGraphExecT, HipGraphT, HipModule, HipStreamT,
    HiprtcProgram, HiprtcResult,
};
use crate::kernels::Vendor;

/// HIP's device API for the host (prepended to every source).
pub const SIM_PRELUDE: &str = include_str!("../../kernels/hip_sim.h");
/// The block scheduler and launcher templates (appended).
pub const SIM_RUNTIME: &str = include_str!("../../kernels/hip_sim_rt.h");

/// The architecture the simulator reports (its kernels take the gfx950
/// route of every `#if`).
pub const SIM_ARCH: &str = "gfx950";

const OK: HipError = 0;
const INVALID_VALUE: HipError = 1; // hipErrorInvalidValue
const OUT_OF_MEMORY: HipError = 2; // hipErrorOutOfMemory
const INVALID_HANDLE: HipError = 400; // hipErrorInvalidHandle
const NOT_FOUND: HipError = 500; // hipErrorNotFound
const LAUNCH_FAILURE: HipError = 719; // hipErrorLaunchFailure
const RTC_COMPILE_ERROR: HiprtcResult = 6; // HIPRTC_ERROR_COMPILATION

/// What a "code object" of the simulator holds: this magic, then the path
/// of the built library, NUL-terminated.
const CODE_MAGIC: &[u8] = b"M3SIM-SO\0";
/// Marks a kernel in the scan pass (hip_sim.h defines `__global__` to it
/// under `M3SIM_SCAN`).
const KERNEL_MARK: &str = "__m3sim_kernel__";
/// Device memory the simulator reports (GiB; `$M3_SIM_MEM_GIB`).
const DEFAULT_MEM_GIB: usize = 16;
/// Allocation alignment (hipMalloc gives at least 256 bytes).
const ALIGN: usize = 256;

/// Whether new allocations are filled with 0xff (`M3_SIM_POISON=1`).
fn poison() -> bool {
    static P: OnceLock<bool> = OnceLock::new();
    *P.get_or_init(|| std::env::var("M3_SIM_POISON").is_ok_and(|v| v == "1"))
}

/// Whether kernels are built with AddressSanitizer (`M3_SIM_ASAN=1`): every
/// load and store of a kernel checked against the allocation it falls in
/// (device buffers are host allocations, so a read past one's end is
/// reported with the kernel's stack). The process must start with the ASan
/// runtime: `LD_PRELOAD=$(c++ -print-file-name=libasan.so)` and
/// `ASAN_OPTIONS=detect_leaks=0`.
fn asan() -> bool {
    static A: OnceLock<bool> = OnceLock::new();
    *A.get_or_init(|| std::env::var("M3_SIM_ASAN").is_ok_and(|v| v == "1"))
}

/// Whether every launch is printed (`M3_SIM_TRACE=1`).
fn trace() -> bool {
    static T: OnceLock<bool> = OnceLock::new();
    *T.get_or_init(|| std::env::var("M3_SIM_TRACE").is_ok_and(|v| v == "1"))
}

/// `m3sim::Launch` of hip_sim_rt.h.
#[repr(C)]
struct SimLaunch {
    grid: [c_uint; 3],
    block: c_uint,
    smem: c_uint,
    params: *mut *mut c_void,
    err: [c_char; 512],
}

type LaunchFn = unsafe extern "C" fn(*mut SimLaunch) -> c_int;
type SigFn = unsafe extern "C" fn(*mut u64, c_int) -> c_int;

/// A kernel of a loaded library: its launcher and argument sizes.
struct SimFunc {
    name: String,
    launch: LaunchFn,
    sig: Vec<usize>,
}

/// One unit of stream work, as run or as captured.
enum Op {
    Launch {
        f: Arc<SimFunc>,
        grid: [c_uint; 3],
        block: c_uint,
        smem: c_uint,
        /// Each argument's bytes in 16-byte-aligned storage.
        args: Vec<Vec<u128>>,
    },
    Copy {
        dst: usize,
        src: usize,
        bytes: usize,
    },
    Fill {
        dst: usize,
        value: u8,
        bytes: usize,
    },
}

/// A hiprtc program: its source, and after compiling, the log or the code.
struct Program {
    src: String,
    log: String,
    code: Vec<u8>,
}

#[derive(Default)]
struct State {
    /// Live allocations: base address -> bytes.
    live: BTreeMap<usize, usize>,
    allocated: usize,
    next: usize,
    /// Streams taking part in a capture -> the capture's id.
    capturing: HashMap<usize, usize>,
    /// Work recorded per capture id (the id is the stream that began it).
    captures: HashMap<usize, Vec<Op>>,
    /// Events: when recorded (outside a capture), and the capture they were
    /// recorded in (a stream waiting on one joins that capture).
    events: HashMap<usize, (Option<Instant>, Option<usize>)>,
    graphs: HashMap<usize, Arc<Vec<Op>>>,
    execs: HashMap<usize, Arc<Vec<Op>>>,
    libs: HashMap<usize, Library>,
    funcs: HashMap<usize, Arc<SimFunc>>,
    /// (module, name) -> function handle: two lookups of one entry point
    /// give one handle, as HIP's do (`Func::handle`).
    by_name: HashMap<(usize, String), usize>,
}

// SAFETY: the raw addresses in `Op` are plain integers of host memory the
// simulator owns or the caller promised live; nothing is tied to a thread.
unsafe impl Send for State {}

fn state() -> MutexGuard<'static, State> {
    static S: OnceLock<Mutex<State>> = OnceLock::new();
    let m = S.get_or_init(|| {
        Mutex::new(State {
            next: 0x1000,
            ..State::default()
        })
    });
    // a panic while holding the lock leaves plain data: go on with it
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl State {
    fn handle(&mut self) -> usize {
        self.next += 16;
        self.next
    }

    /// Whether `[p, p + n)` lies inside one live allocation.
    fn inside(&self, p: usize, n: usize) -> bool {
        match self.live.range(..=p).next_back() {
            Some((&base, &len)) => p + n <= base + len,
            None => false,
        }
    }
}

/// Report a refused call on stderr (the HIP route turns the code into an
/// error naming the call; this says what the simulator saw).
fn refuse(code: HipError, call: &str, why: String) -> HipError {
    eprintln!("m3 HIP simulator: {call}: {why}");
    code
}

unsafe fn cstr(p: *const c_char) -> String {
    if p.is_null() {
        String::new()
    } else {
        CStr::from_ptr(p).to_string_lossy().into_owned()
    }
}

// ---- device ---------------------------------------------------------------

unsafe extern "C" fn init(_: c_uint) -> HipError {
    OK
}
unsafe extern "C" fn device_count(n: *mut c_int) -> HipError {
    *n = 1;
    OK
}
unsafe extern "C" fn properties(p: *mut c_void, _: c_int) -> HipError {
    // the arch name is searched for in the buffer (hip.rs `arch_name`)
    let name = format!("{SIM_ARCH}\0");
    std::ptr::copy_nonoverlapping(name.as_ptr(), p.cast::<u8>(), name.len());
    OK
}
unsafe extern "C" fn set_device(_: c_int) -> HipError {
    OK
}
fn memory_bytes() -> usize {
    std::env::var("M3_SIM_MEM_GIB")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .unwrap_or(DEFAULT_MEM_GIB)
        << 30
}
unsafe extern "C" fn mem_info(free: *mut usize, total: *mut usize) -> HipError {
    let t = memory_bytes();
    *total = t;
    *free = t.saturating_sub(state().allocated);
    OK
}
unsafe extern "C" fn synchronize() -> HipError {
    OK
}

// ---- memory -----------------------------------------------------------------

unsafe extern "C" fn malloc(out: *mut *mut c_void, bytes: usize) -> HipError {
    let mut s = state();
    let n = bytes.max(1);
    if s.allocated + n > memory_bytes() {
        return refuse(
            OUT_OF_MEMORY,
            "hipMalloc",
            format!(
                "{bytes} bytes past the simulated {} GiB",
                memory_bytes() >> 30
            ),
        );
    }
    let Ok(layout) = Layout::from_size_align(n, ALIGN) else {
        return INVALID_VALUE;
    };
    // zeroed: untouched pages of a large allocation cost nothing;
    // M3_SIM_POISON=1 fills it with 0xff instead (NaN as f32, bf16 and f16),
    // so a kernel that reads memory nothing wrote shows it
    let p = if poison() {
        std::alloc::alloc(layout)
    } else {
        std::alloc::alloc_zeroed(layout)
    };
    if p.is_null() {
        return refuse(OUT_OF_MEMORY, "hipMalloc", format!("{bytes} bytes"));
    }
    if poison() {
        std::ptr::write_bytes(p, 0xff, n);
    }
    s.live.insert(p as usize, n);
    s.allocated += n;
    *out = p.cast();
    OK
}
unsafe extern "C" fn free(p: *mut c_void) -> HipError {
    if p.is_null() {
        return OK;
    }
    let mut s = state();
    match s.live.remove(&(p as usize)) {
        Some(n) => {
            s.allocated -= n;
            std::alloc::dealloc(p.cast(), Layout::from_size_align_unchecked(n, ALIGN));
            OK
        }
        None => refuse(
            INVALID_VALUE,
            "hipFree",
            format!("{p:?} is not an allocation"),
        ),
    }
}

/// Check a copy's device side(s) by its kind (H2D 1, D2H 2, D2D 3; 0 and
/// 4 are host-to-host and default: nothing to check).
fn check_copy(s: &State, call: &str, dst: usize, src: usize, n: usize, kind: c_int) -> HipError {
    let dst_dev = kind == 1 || kind == 3;
    let src_dev = kind == 2 || kind == 3;
    if dst_dev && !s.inside(dst, n) {
        return refuse(
            INVALID_VALUE,
            call,
            format!("destination {dst:#x} + {n} bytes is not inside an allocation"),
        );
    }
    if src_dev && !s.inside(src, n) {
        return refuse(
            INVALID_VALUE,
            call,
            format!("source {src:#x} + {n} bytes is not inside an allocation"),
        );
    }
    OK
}

unsafe extern "C" fn memcpy(
    dst: *mut c_void,
    src: *const c_void,
    n: usize,
    kind: c_int,
) -> HipError {
    let rc = check_copy(&state(), "hipMemcpy", dst as usize, src as usize, n, kind);
    if rc == OK && n > 0 {
        std::ptr::copy(src.cast::<u8>(), dst.cast::<u8>(), n);
    }
    rc
}
unsafe extern "C" fn memset(dst: *mut c_void, v: u8, n: usize) -> HipError {
    if !state().inside(dst as usize, n) {
        return refuse(
            INVALID_VALUE,
            "hipMemsetD8",
            format!("{dst:?} + {n} bytes is not inside an allocation"),
        );
    }
    std::ptr::write_bytes(dst.cast::<u8>(), v, n);
    OK
}

// ---- streams, events, graphs -------------------------------------------------

unsafe extern "C" fn stream_create(out: *mut HipStreamT, _: c_uint) -> HipError {
    *out = state().handle() as HipStreamT;
    OK
}
unsafe extern "C" fn stream_sync(_: HipStreamT) -> HipError {
    OK
}
unsafe extern "C" fn stream_destroy(_: HipStreamT) -> HipError {
    OK
}

/// Run `op` now, or record it when `stream` takes part in a capture.
fn submit(stream: HipStreamT, op: Op) -> HipError {
    let mut s = state();
    if let Some(&id) = s.capturing.get(&(stream as usize)) {
        if let Some(list) = s.captures.get_mut(&id) {
            list.push(op);
        }
        return OK;
    }
    drop(s);
    run(&op)
}

/// Run one unit of work.
fn run(op: &Op) -> HipError {
    match op {
        Op::Copy { dst, src, bytes } => {
            // SAFETY: checked against the live allocations when submitted
            // (a captured copy's ranges were live then and the graph's
            // owner keeps them so)
            unsafe { std::ptr::copy(*src as *const u8, *dst as *mut u8, *bytes) };
            OK
        }
        Op::Fill { dst, value, bytes } => {
            // SAFETY: as above
            unsafe { std::ptr::write_bytes(*dst as *mut u8, *value, *bytes) };
            OK
        }
        Op::Launch {
            f,
            grid,
            block,
            smem,
            args,
        } => {
            let mut ptrs: Vec<*mut c_void> =
                args.iter().map(|a| a.as_ptr() as *mut c_void).collect();
            // SAFETY: the arguments were copied with the kernel's own sizes
            launch_now(f, *grid, *block, *smem, ptrs.as_mut_ptr())
        }
    }
}

fn launch_now(
    f: &SimFunc,
    grid: [c_uint; 3],
    block: c_uint,
    smem: c_uint,
    params: *mut *mut c_void,
) -> HipError {
    // one launch at a time in the process: the scheduler's state and the
    // kernels' shared memory are statics of each built library
    static RUN: Mutex<()> = Mutex::new(());
    let _one = RUN.lock().unwrap_or_else(|p| p.into_inner());
    if trace() {
        eprintln!(
            "m3 HIP simulator: launch {} grid {grid:?} block {block} smem {smem}",
            f.name
        );
    }
    let mut l = SimLaunch {
        grid,
        block,
        smem,
        params,
        err: [0; 512],
    };
    // SAFETY: the launcher reads `sig.len()` argument pointers, which the
    // caller provides (HIP's contract for kernelParams)
    let rc = unsafe { (f.launch)(&mut l) };
    if rc == 0 {
        OK
    } else {
        // SAFETY: the launcher NUL-terminates its message
        let why = unsafe { cstr(l.err.as_ptr()) };
        refuse(
            LAUNCH_FAILURE,
            "hipModuleLaunchKernel",
            format!("{} failed: {why}", f.name),
        )
    }
}

unsafe extern "C" fn memcpy_async(
    dst: *mut c_void,
    src: *const c_void,
    n: usize,
    kind: c_int,
    stream: HipStreamT,
) -> HipError {
    let rc = check_copy(
        &state(),
        "hipMemcpyAsync",
        dst as usize,
        src as usize,
        n,
        kind,
    );
    if rc != OK || n == 0 {
        return rc;
    }
    submit(
        stream,
        Op::Copy {
            dst: dst as usize,
            src: src as usize,
            bytes: n,
        },
    )
}
unsafe extern "C" fn memset_async(
    dst: *mut c_void,
    v: u8,
    n: usize,
    stream: HipStreamT,
) -> HipError {
    if !state().inside(dst as usize, n) {
        return refuse(
            INVALID_VALUE,
            "hipMemsetD8Async",
            format!("{dst:?} + {n} bytes is not inside an allocation"),
        );
    }
    submit(
        stream,
        Op::Fill {
            dst: dst as usize,
            value: v,
            bytes: n,
        },
    )
}

unsafe extern "C" fn event_create(out: *mut HipEventT, _: c_uint) -> HipError {
    let mut s = state();
    let h = s.handle();
    s.events.insert(h, (None, None));
    *out = h as HipEventT;
    OK
}
unsafe extern "C" fn event_record(e: HipEventT, stream: HipStreamT) -> HipError {
    let mut s = state();
    let cap = s.capturing.get(&(stream as usize)).copied();
    match s.events.get_mut(&(e as usize)) {
        Some(ev) => {
            *ev = match cap {
                Some(id) => (ev.0, Some(id)),
                None => (Some(Instant::now()), None),
            };
            OK
        }
        None => refuse(
            INVALID_HANDLE,
            "hipEventRecord",
            format!("{e:?} is not an event"),
        ),
    }
}
unsafe extern "C" fn event_elapsed(ms: *mut f32, a: HipEventT, b: HipEventT) -> HipError {
    let s = state();
    match (s.events.get(&(a as usize)), s.events.get(&(b as usize))) {
        (Some((Some(t0), _)), Some((Some(t1), _))) => {
            *ms = t1.saturating_duration_since(*t0).as_secs_f32() * 1e3;
            OK
        }
        _ => refuse(
            INVALID_HANDLE,
            "hipEventElapsedTime",
            "an event never recorded".into(),
        ),
    }
}
unsafe extern "C" fn event_destroy(e: HipEventT) -> HipError {
    state().events.remove(&(e as usize));
    OK
}
unsafe extern "C" fn stream_wait_event(stream: HipStreamT, e: HipEventT, _: c_uint) -> HipError {
    let mut s = state();
    let cap = match s.events.get(&(e as usize)) {
        Some((_, cap)) => *cap,
        None => {
            return refuse(
                INVALID_HANDLE,
                "hipStreamWaitEvent",
                format!("{e:?} is not an event"),
            )
        }
    };
    // waiting on an event of a live capture makes this stream join it
    if let Some(id) = cap.filter(|id| s.captures.contains_key(id)) {
        s.capturing.insert(stream as usize, id);
    }
    OK
}
unsafe extern "C" fn begin_capture(stream: HipStreamT, _: c_int) -> HipError {
    let mut s = state();
    let id = stream as usize;
    if s.capturing.contains_key(&id) {
        return refuse(
            INVALID_VALUE,
            "hipStreamBeginCapture",
            "the stream is capturing already".into(),
        );
    }
    s.capturing.insert(id, id);
    s.captures.insert(id, Vec::new());
    OK
}
unsafe extern "C" fn end_capture(stream: HipStreamT, out: *mut HipGraphT) -> HipError {
    let mut s = state();
    let id = stream as usize;
    let Some(ops) = s.captures.remove(&id) else {
        return refuse(
            INVALID_VALUE,
            "hipStreamEndCapture",
            "the stream began no capture".into(),
        );
    };
    s.capturing.retain(|_, c| *c != id);
    let h = s.handle();
    s.graphs.insert(h, Arc::new(ops));
    *out = h as HipGraphT;
    OK
}
unsafe extern "C" fn graph_instantiate(
    out: *mut HipGraphExecT,
    g: HipGraphT,
    _: *mut c_void,
    _: *mut c_char,
    _: usize,
) -> HipError {
    let mut s = state();
    let Some(ops) = s.graphs.get(&(g as usize)).cloned() else {
        return refuse(
            INVALID_HANDLE,
            "hipGraphInstantiate",
            format!("{g:?} is not a graph"),
        );
    };
    let h = s.handle();
    s.execs.insert(h, ops);
    *out = h as HipGraphExecT;
    OK
}
unsafe extern "C" fn graph_launch(x: HipGraphExecT, _: HipStreamT) -> HipError {
    let Some(ops) = state().execs.get(&(x as usize)).cloned() else {
        return refuse(
            INVALID_HANDLE,
            "hipGraphLaunch",
            format!("{x:?} is not an instantiated graph"),
        );
    };
    for op in ops.iter() {
        let rc = run(op);
        if rc != OK {
            return rc;
        }
    }
    OK
}
unsafe extern "C" fn graph_exec_destroy(x: HipGraphExecT) -> HipError {
    state().execs.remove(&(x as usize));
    OK
}
unsafe extern "C" fn graph_destroy(g: HipGraphT) -> HipError {
    state().graphs.remove(&(g as usize));
    OK
}

// ---- modules and launches ---------------------------------------------------

unsafe extern "C" fn module_load(out: *mut HipModule, image: *const c_void) -> HipError {
    let head = std::slice::from_raw_parts(image.cast::<u8>(), CODE_MAGIC.len());
    if head != CODE_MAGIC {
        return refuse(
            INVALID_VALUE,
            "hipModuleLoadData",
            "not a simulator code object".into(),
        );
    }
    let path = cstr(image.cast::<c_char>().add(CODE_MAGIC.len()));
    // SAFETY: a library this simulator built from kernel source; its
    // initializers are the C++ runtime's
    match Library::new(&path) {
        Ok(lib) => {
            let mut s = state();
            let h = s.handle();
            s.libs.insert(h, lib);
            *out = h as HipModule;
            OK
        }
        Err(e) => refuse(NOT_FOUND, "hipModuleLoadData", format!("{path}: {e}")),
    }
}
unsafe extern "C" fn get_function(
    out: *mut HipFunction,
    m: HipModule,
    name: *const c_char,
) -> HipError {
    let name = cstr(name);
    let mut s = state();
    if let Some(&h) = s.by_name.get(&(m as usize, name.clone())) {
        *out = h as HipFunction;
        return OK;
    }
    let Some(lib) = s.libs.get(&(m as usize)) else {
        return refuse(
            INVALID_HANDLE,
            "hipModuleGetFunction",
            format!("{m:?} is not a module"),
        );
    };
    let launch: Result<libloading::Symbol<LaunchFn>, _> =
        lib.get(format!("m3sim_launch_{name}\0").as_bytes());
    let sig: Result<libloading::Symbol<SigFn>, _> =
        lib.get(format!("m3sim_sig_{name}\0").as_bytes());
    let (Ok(launch), Ok(sig)) = (launch, sig) else {
        return refuse(
            NOT_FOUND,
            "hipModuleGetFunction",
            format!("no kernel {name}"),
        );
    };
    let mut sizes = [0u64; 64];
    let n = (sig)(sizes.as_mut_ptr(), sizes.len() as c_int).max(0) as usize;
    if n > sizes.len() {
        return refuse(
            INVALID_VALUE,
            "hipModuleGetFunction",
            format!("{name}: {n} arguments"),
        );
    }
    let f = Arc::new(SimFunc {
        name,
        launch: *launch,
        sig: sizes[..n].iter().map(|&b| b as usize).collect(),
    });
    let h = s.handle();
    s.by_name.insert((m as usize, f.name.clone()), h);
    s.funcs.insert(h, f);
    *out = h as HipFunction;
    OK
}
#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn launch_kernel(
    f: HipFunction,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    smem: c_uint,
    stream: HipStreamT,
    params: *mut *mut c_void,
    _extra: *mut *mut c_void,
) -> HipError {
    let Some(func) = state().funcs.get(&(f as usize)).cloned() else {
        return refuse(
            INVALID_HANDLE,
            "hipModuleLaunchKernel",
            format!("{f:?} is not a function"),
        );
    };
    if by != 1 || bz != 1 || gx == 0 || gy == 0 || gz == 0 {
        return refuse(
            INVALID_VALUE,
            "hipModuleLaunchKernel",
            format!(
                "{}: grid ({gx},{gy},{gz}), block ({bx},{by},{bz})",
                func.name
            ),
        );
    }
    let grid = [gx, gy, gz];
    let capturing = state().capturing.contains_key(&(stream as usize));
    if !capturing {
        return launch_now(&func, grid, bx, smem, params);
    }
    // a captured launch keeps copies of its arguments (HIP copies them too)
    let args = func
        .sig
        .iter()
        .enumerate()
        .map(|(i, &bytes)| {
            let mut v = vec![0u128; bytes.div_ceil(16).max(1)];
            std::ptr::copy_nonoverlapping(
                (*params.add(i)).cast::<u8>(),
                v.as_mut_ptr().cast::<u8>(),
                bytes,
            );
            v
        })
        .collect();
    submit(
        stream,
        Op::Launch {
            f: func,
            grid,
            block: bx,
            smem,
            args,
        },
    )
}

// ---- the compiler (hiprtc's entry points) ------------------------------------

unsafe extern "C" fn rtc_version(major: *mut c_int, minor: *mut c_int) -> HiprtcResult {
    *major = 0;
    *minor = 1;
    0
}
unsafe extern "C" fn rtc_create(
    out: *mut HiprtcProgram,
    src: *const c_char,
    _name: *const c_char,
    _: c_int,
    _: *const *const c_char,
    _: *const *const c_char,
) -> HiprtcResult {
    let p = Box::new(Program {
        src: cstr(src),
        log: String::new(),
        code: Vec::new(),
    });
    *out = Box::into_raw(p).cast();
    0
}
unsafe extern "C" fn rtc_compile(
    p: HiprtcProgram,
    n: c_int,
    opts: *const *const c_char,
) -> HiprtcResult {
    compile_program(p, n, opts, None)
}

/// hiprtcCompileProgram with the flavour's own definition (`flavour`).
unsafe fn compile_program(
    p: HiprtcProgram,
    n: c_int,
    opts: *const *const c_char,
    flavour: Option<&str>,
) -> HiprtcResult {
    let prog = &mut *p.cast::<Program>();
    // the macro definitions are what changes a kernel; arch and -O are ours
    let mut defines: Vec<String> = (0..n.max(0) as usize)
        .map(|i| cstr(*opts.add(i)))
        .filter(|o| o.starts_with("-D") || o.starts_with("-U"))
        .collect();
    defines.extend(flavour.map(str::to_string));
    match build(&prog.src, &defines) {
        Ok(path) => {
            let mut code = CODE_MAGIC.to_vec();
            code.extend_from_slice(path.to_string_lossy().as_bytes());
            code.push(0);
            prog.code = code;
            0
        }
        Err(log) => {
            prog.log = log;
            RTC_COMPILE_ERROR
        }
    }
}
unsafe extern "C" fn rtc_log_size(p: HiprtcProgram, n: *mut usize) -> HiprtcResult {
    let prog = &*p.cast::<Program>();
    *n = prog.log.len() + 1;
    0
}
unsafe extern "C" fn rtc_log(p: HiprtcProgram, out: *mut c_char) -> HiprtcResult {
    let log = &(*p.cast::<Program>()).log;
    std::ptr::copy_nonoverlapping(log.as_ptr(), out.cast::<u8>(), log.len());
    *out.add(log.len()) = 0;
    0
}
unsafe extern "C" fn rtc_code_size(p: HiprtcProgram, n: *mut usize) -> HiprtcResult {
    let prog = &*p.cast::<Program>();
    *n = prog.code.len();
    0
}
unsafe extern "C" fn rtc_code(p: HiprtcProgram, out: *mut c_char) -> HiprtcResult {
    let code = &(*p.cast::<Program>()).code;
    std::ptr::copy_nonoverlapping(code.as_ptr(), out.cast::<u8>(), code.len());
    0
}
unsafe extern "C" fn rtc_destroy(p: *mut HiprtcProgram) -> HiprtcResult {
    if !p.is_null() && !(*p).is_null() {
        drop(Box::from_raw((*p).cast::<Program>()));
        *p = std::ptr::null_mut();
    }
    0
}

/// The host C++ compiler the simulator builds with.
fn compiler() -> String {
    ["M3_SIM_CXX", "CXX"]
        .iter()
        .find_map(|v| std::env::var(v).ok().filter(|s| !s.trim().is_empty()))
        .unwrap_or_else(|| "c++".to_string())
}

/// The compiler's `--version` first line (part of the library's key).
fn compiler_version(cxx: &str) -> Result<String, String> {
    static V: OnceLock<Mutex<HashMap<String, String>>> = OnceLock::new();
    let map = V.get_or_init(|| Mutex::new(HashMap::new()));
    if let Some(v) = map.lock().ok().and_then(|m| m.get(cxx).cloned()) {
        return Ok(v);
    }
    let out = Command::new(cxx).arg("--version").output().map_err(|e| {
        format!("the HIP simulator needs a C++ compiler: `{cxx} --version`: {e} (set M3_SIM_CXX)")
    })?;
    let v = String::from_utf8_lossy(&out.stdout)
        .lines()
        .next()
        .unwrap_or("")
        .to_string();
    if let Ok(mut m) = map.lock() {
        m.insert(cxx.to_string(), v.clone());
    }
    Ok(v)
}

/// Run the compiler on `input` (stdin), returning stdout, or the log.
fn run_compiler(cxx: &str, args: &[String], input: &str) -> Result<Vec<u8>, String> {
    let mut child = Command::new(cxx)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("`{cxx}`: {e}"))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(input.as_bytes())
            .map_err(|e| format!("`{cxx}` stdin: {e}"))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| format!("`{cxx}`: {e}"))?;
    if out.status.success() {
        Ok(out.stdout)
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// The kernels `src` defines (the names after the scan pass's marks).
fn kernel_names(cxx: &str, src: &str, defines: &[String]) -> Result<Vec<String>, String> {
    let mut args = vec![
        "-std=c++17".to_string(),
        "-E".into(),
        "-P".into(),
        "-DM3SIM_SCAN".into(),
    ];
    args.extend(defines.iter().cloned());
    args.extend(["-x".into(), "c++".into(), "-".into()]);
    let text = run_compiler(cxx, &args, &format!("{SIM_PRELUDE}\n{src}"))?;
    let text = String::from_utf8_lossy(&text);
    let mut names = Vec::new();
    for (at, _) in text.match_indices(KERNEL_MARK) {
        let rest = text[at + KERNEL_MARK.len()..].trim_start();
        let Some(mut rest) = rest.strip_prefix("void") else {
            continue;
        };
        // attributes between the return type and the name (launch bounds)
        while let Some(attr) = rest.trim_start().strip_prefix("__attribute__") {
            let mut depth = 0usize;
            let mut end = attr.len();
            for (i, c) in attr.char_indices() {
                match c {
                    '(' => depth += 1,
                    ')' => {
                        depth = depth.saturating_sub(1);
                        if depth == 0 {
                            end = i + 1;
                            break;
                        }
                    }
                    _ => {}
                }
            }
            rest = &attr[end..];
        }
        let name: String = rest
            .trim_start()
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        if !name.is_empty() && !names.contains(&name) {
            names.push(name);
        }
    }
    Ok(names)
}

/// Where built libraries are kept.
fn cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("M3_SIM_CACHE").filter(|v| !v.is_empty()) {
        return PathBuf::from(d);
    }
    cache::default_dir()
        .map(|d| d.join("sim"))
        .unwrap_or_else(|| std::env::temp_dir().join("m3-sim"))
}

/// Build `src` with `defines` into a shared library (or find it built);
/// its path, or the compiler's log.
fn build(src: &str, defines: &[String]) -> Result<PathBuf, String> {
    let cxx = compiler();
    let version = compiler_version(&cxx)?;
    let mut flags: Vec<String> = [
        "-std=c++17",
        "-O1",
        "-fPIC",
        "-shared",
        "-ffp-contract=off",
        "-fvisibility=hidden",
        "-w",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    if std::arch::is_x86_feature_detected!("f16c") {
        // f16 conversions as one instruction, not a libgcc call
        flags.push("-mf16c".into());
    }
    if asan() {
        // every kernel access checked against the allocation it falls in
        // (the process must have the ASan runtime: see `asan`)
        flags.extend([
            "-fsanitize=address".into(),
            "-fno-omit-frame-pointer".into(),
        ]);
    }
    flags.extend(defines.iter().cloned());
    // the key from what the library is made of (the launchers appended
    // follow from it), so a built one is found without the scan pass
    let key = cache::key(
        &format!("{SIM_PRELUDE}\n{src}\n{SIM_RUNTIME}"),
        "host-sim",
        &flags,
        &format!("{cxx} {version}"),
    );
    let dir = cache_dir();
    let path = dir.join(format!("{key}.so"));
    if path.is_file() {
        return Ok(path);
    }
    // one build a library in this process: test threads asking for the
    // same unit at once wait for the first build (on a cold cache the
    // CUDA flavour's unit tests compiled 3 of their 13 libraries twice)
    let building = {
        static BUILDING: OnceLock<Mutex<HashMap<String, Arc<Mutex<()>>>>> = OnceLock::new();
        let mut map = BUILDING
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        Arc::clone(map.entry(key.clone()).or_default())
    };
    let _one = building.lock().unwrap_or_else(|e| e.into_inner());
    if path.is_file() {
        return Ok(path);
    }
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let names = kernel_names(&cxx, src, defines)?;
    let mut text =
        String::with_capacity(SIM_PRELUDE.len() + src.len() + SIM_RUNTIME.len() + 64 * names.len());
    text.push_str(SIM_PRELUDE);
    text.push('\n');
    text.push_str(src);
    text.push_str("\n#line 1 \"hip_sim_rt.h\"\n");
    text.push_str(SIM_RUNTIME);
    for n in &names {
        text.push_str(&format!("M3SIM_EXPORT({n})\n"));
    }
    // a unique temporary name, renamed into place: a reader never sees half
    static SEQ: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = dir.join(format!("{key}.{}.{seq}.tmp", std::process::id()));
    let mut args = flags;
    args.extend([
        "-x".into(),
        "c++".into(),
        "-".into(),
        "-o".into(),
        tmp.to_string_lossy().into_owned(),
    ]);
    let built = run_compiler(&cxx, &args, &text);
    if let Err(log) = built {
        let _ = std::fs::remove_file(&tmp);
        return Err(log);
    }
    std::fs::rename(&tmp, &path).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(path)
}

/// The simulator `M3_GPU_RUNTIME` asks for: `sim` (the HIP flavour) or
/// `sim-cuda` (the CUDA flavour) opened, `None` for anything else.
pub fn from_env() -> Option<crate::Result<super::hip::HipGpu>> {
    let v = std::env::var("M3_GPU_RUNTIME").ok()?;
    match v.trim().to_ascii_lowercase().as_str() {
        "sim" => Some(super::hip::HipGpu::sim()),
        "sim-cuda" => Some(super::hip::HipGpu::sim_cuda()),
        _ => None,
    }
}

/// `rtc_compile` for the CUDA flavour (hip_sim.h's `M3_SIM_CUDA`).
unsafe extern "C" fn rtc_compile_cuda(
    p: HiprtcProgram,
    n: c_int,
    opts: *const *const c_char,
) -> HiprtcResult {
    compile_program(p, n, opts, Some("-DM3_SIM_CUDA"))
}

/// The simulator's function table; `vendor` picks the flavour its kernels
/// are built in (HIP: wave64, compat.h's HIP branch; CUDA: warps of 32,
/// its CUDA branch).
pub(crate) fn table(vendor: Vendor) -> Fns {
    Fns {
        rtc_compile: match vendor {
            Vendor::Hip => rtc_compile,
            Vendor::Cuda => rtc_compile_cuda,
        },
        init,
        get_device_count: device_count,
        get_device_properties: properties,
        set_device,
        mem_get_info: mem_info,
        module_load_data: module_load,
        module_get_function: get_function,
        module_launch_kernel: launch_kernel,
        malloc,
        memcpy,
        memset_d8: memset,
        free,
        device_synchronize: synchronize,
        stream_create,
        stream_synchronize: stream_sync,
        stream_destroy,
        event_create,
        event_record,
        event_elapsed,
        event_destroy,
        stream_wait_event,
        memcpy_async,
        memset_d8_async: memset_async,
        begin_capture,
        end_capture,
        graph_instantiate,
        graph_launch,
        graph_exec_destroy,
        graph_destroy,
        rtc_version,
        rtc_create,
        rtc_log_size,
        rtc_log,
        rtc_code_size,
        rtc_code,
        rtc_destroy,
        queries: Default::default(),
    }
}

#[cfg(test)]
mod tests {
    //! The simulator against what it models, each check with a case that
    //! must fail: wavefront collectives against their definition, block
    //! barriers and shared memory, a stream capture replayed, and a
    //! deadlock, a trap and a copy past an allocation reported as errors.
    use crate::kernels::KernelSource;
    use crate::model::DevBuf;
    use crate::runtime::api::Gpu;
    use crate::standard::launch::Arg;
    use crate::standard::Launcher;
    use crate::HipGpu;

    const PROBE: KernelSource = KernelSource {
        name: "sim_probe",
        body: r#"
// y[i] = the wavefront's sum (width 64) and lane (i ^ 5)'s value within
// each 32-lane half, and lane 3's value of the half (width 32)
M3_KERNEL void p_collectives(const float* x, float* y, u32* z) {
  const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
  const float v = x[i];
  y[i] = m3_warp_sum(v);
  z[2 * i] = __float_as_uint(M3_SHFL_XOR32(v, 5));
  z[2 * i + 1] = __float_as_uint(M3_SHFL32(v, 3));
}
// the block's values reversed through shared memory
M3_KERNEL void p_reverse(const u32* x, u32* y) {
  __shared__ u32 buf[1024];
  buf[threadIdx.x] = x[blockIdx.x * blockDim.x + threadIdx.x];
  __syncthreads();
  y[blockIdx.x * blockDim.x + threadIdx.x] = buf[blockDim.x - 1u - threadIdx.x];
}
// y[i] += 1 (a graph replays it)
M3_KERNEL void p_bump(u32* y) { y[threadIdx.x] += 1u; }
// half of wavefront 0 waits at the block barrier, the other half meets at
// a wavefront barrier: lanes at __syncthreads are inactive for the
// wavefront (as outside the EXEC mask on hardware), so both go on
M3_KERNEL void p_divergent(u32* y) {
  if (threadIdx.x < 32u) __syncthreads();
  else M3_SYNC_WARP();
  y[threadIdx.x] = 1u;
}
// 32 threads at a named barrier of 64 (the simulator's bar.sync): no
// thread can go on
M3_KERNEL void p_deadlock(u32* y) {
  if (threadIdx.x < 32u) m3sim::named_barrier(1u, 64u);
  y[threadIdx.x] = 1u;
}
// threads that return early do not hold a barrier (as on hardware)
M3_KERNEL void p_early_return(u32* y) {
  if (threadIdx.x >= 40u) return;
  __syncthreads();
  y[threadIdx.x] = 7u;
}
M3_KERNEL void p_trap(u32* y) {
  if (threadIdx.x == 77u) __builtin_trap();
  y[threadIdx.x] = 1u;
}
"#,
        exact: false,
        entries: &[],
    };

    fn sim() -> (HipGpu, Launcher) {
        let g = HipGpu::sim().expect("the simulator opens (needs a C++ compiler)");
        let l = Launcher::new(g.device(), false).unwrap();
        (g, l)
    }

    fn read_u32(l: &Launcher, b: &DevBuf, n: usize) -> Vec<u32> {
        l.sync().unwrap();
        let mut v = vec![0u32; n];
        b.read(l.stream(), 0, &mut v).unwrap();
        v
    }

    #[test]
    fn collectives_follow_their_definition() {
        let (g, l) = sim();
        let f = Gpu::kernel(&g, &PROBE, "p_collectives").unwrap();
        let n = 256usize;
        // small integers: every sum exact in any order
        let x: Vec<f32> = (0..n).map(|i| ((i * 37) % 101) as f32 - 50.0).collect();
        let xd = DevBuf::from_slice(g.device(), &x).unwrap();
        let y = DevBuf::zeroed(g.device(), 4 * n).unwrap();
        let z = DevBuf::zeroed(g.device(), 8 * n).unwrap();
        l.launch(
            "p_collectives",
            &f,
            (2, 1, 1),
            128,
            0,
            &[Arg::U64(xd.ptr()), Arg::U64(y.ptr()), Arg::U64(z.ptr())],
        )
        .unwrap();
        let (ys, zs) = (read_u32(&l, &y, n), read_u32(&l, &z, 2 * n));
        // values off against the definition, with the xor mask given
        let off = |mask: usize| {
            let mut off = 0;
            for i in 0..n {
                let wave: f32 = x[i / 64 * 64..i / 64 * 64 + 64].iter().sum();
                let half = i / 32 * 32;
                off += usize::from(f32::from_bits(ys[i]) != wave);
                off += usize::from(f32::from_bits(zs[2 * i]) != x[half + ((i % 32) ^ mask)]);
                off += usize::from(f32::from_bits(zs[2 * i + 1]) != x[half + 3]);
            }
            off
        };
        assert_eq!(off(5), 0);
        // the comparison sees lanes swapped wrongly
        assert!(off(4) > 0, "a wrong xor mask went unseen");
    }

    #[test]
    fn barriers_order_shared_memory_and_captures_replay() {
        let (g, l) = sim();
        let f = Gpu::kernel(&g, &PROBE, "p_reverse").unwrap();
        let n = 3 * 192usize;
        let x: Vec<u32> = (0..n as u32).map(|i| i * 7 + 1).collect();
        let xd = DevBuf::from_slice(g.device(), &x).unwrap();
        let y = DevBuf::zeroed(g.device(), 4 * n).unwrap();
        l.launch(
            "p_reverse",
            &f,
            (3, 1, 1),
            192,
            0,
            &[Arg::U64(xd.ptr()), Arg::U64(y.ptr())],
        )
        .unwrap();
        let ys = read_u32(&l, &y, n);
        let want: Vec<u32> = (0..n).map(|i| x[i / 192 * 192 + 191 - i % 192]).collect();
        assert_eq!(ys, want);
        // early returns do not hold the barrier
        let f = Gpu::kernel(&g, &PROBE, "p_early_return").unwrap();
        let z = DevBuf::zeroed(g.device(), 4 * 128).unwrap();
        l.launch(
            "p_early_return",
            &f,
            (1, 1, 1),
            128,
            0,
            &[Arg::U64(z.ptr())],
        )
        .unwrap();
        let zs = read_u32(&l, &z, 128);
        assert!(zs[..40].iter().all(|&v| v == 7) && zs[40..].iter().all(|&v| v == 0));
        // a captured launch runs only when the graph is replayed, each time
        let f = Gpu::kernel(&g, &PROBE, "p_bump").unwrap();
        let b = DevBuf::zeroed(g.device(), 4 * 64).unwrap();
        let s = l.stream();
        s.begin_capture().unwrap();
        l.launch("p_bump", &f, (1, 1, 1), 64, 0, &[Arg::U64(b.ptr())])
            .unwrap();
        let graph = s.end_capture().unwrap().expect("one launch captured");
        assert!(
            read_u32(&l, &b, 64).iter().all(|&v| v == 0),
            "capture ran the launch"
        );
        graph.launch().unwrap();
        graph.launch().unwrap();
        assert!(read_u32(&l, &b, 64).iter().all(|&v| v == 2));
    }

    #[test]
    fn deadlocks_traps_and_stray_copies_are_errors() {
        let (g, l) = sim();
        let y = DevBuf::zeroed(g.device(), 4 * 128).unwrap();
        let f = Gpu::kernel(&g, &PROBE, "p_divergent").unwrap();
        l.launch("p_divergent", &f, (1, 1, 1), 128, 0, &[Arg::U64(y.ptr())])
            .unwrap();
        assert!(read_u32(&l, &y, 128).iter().all(|&v| v == 1));
        for k in ["p_deadlock", "p_trap"] {
            let f = Gpu::kernel(&g, &PROBE, k).unwrap();
            let r = l.launch(k, &f, (1, 1, 1), 128, 0, &[Arg::U64(y.ptr())]);
            assert!(r.is_err(), "{k} launched without an error");
        }
        // a copy past the end of an allocation is refused
        let mut out = vec![0u8; 4 * 128 + 1];
        // SAFETY: the simulator checks the range and refuses it
        let r = unsafe { g.device().dtoh(&mut out, y.ptr()) };
        assert!(r.is_err(), "a read past the allocation went through");
        // and one inside it goes through
        // SAFETY: inside the allocation
        unsafe { g.device().dtoh(&mut out[..512], y.ptr()) }.unwrap();
    }
}
