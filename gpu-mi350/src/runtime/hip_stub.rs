//! A HIP function table for tests, without ROCm or an AMD GPU: device
//! memory is host memory (`hipMalloc` is a host allocation, copies are
//! `memcpy`), every call is recorded in order, and a launch records its
//! kernel's name, grid, block, dynamic shared memory, stream and argument
//! bytes. What a real runtime would refuse is refused here too and
//! recorded as [`Call::Bad`]: a copy or memset outside a live allocation,
//! a free of an address that is not one, an unknown handle.
//!
//! A kernel's argument sizes come from its signature, which a real runtime
//! reads from the code object's metadata; the stub has no code object, so
//! a test tells it the sizes per kernel name ([`set_signatures`]). The
//! argument count is read from the launch itself: the HIP route ends
//! `kernelParams` with a null entry (`HipStream::launch`).
//!
//! State is per thread (a thread-local), so tests running in parallel do
//! not see each other's calls.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};

use super::*;

/// One recorded call.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Call {
    SetDevice,
    Malloc {
        ptr: u64,
        bytes: usize,
    },
    Free {
        ptr: u64,
    },
    /// Synchronous memset (hipMemsetD8).
    Memset {
        ptr: u64,
        bytes: usize,
    },
    /// Synchronous copy (hipMemcpy); `kind` as HIP's hipMemcpyKind.
    Memcpy {
        dst: u64,
        src: u64,
        bytes: usize,
        kind: c_int,
    },
    MemcpyAsync {
        dst: u64,
        src: u64,
        bytes: usize,
        kind: c_int,
        stream: u64,
    },
    MemsetAsync {
        ptr: u64,
        bytes: usize,
        stream: u64,
    },
    StreamCreate(u64),
    StreamSync(u64),
    StreamDestroy(u64),
    DeviceSync,
    EventCreate(u64),
    EventRecord {
        event: u64,
        stream: u64,
    },
    EventElapsed,
    EventDestroy(u64),
    /// `stream` waits for what `event` last recorded.
    StreamWaitEvent {
        stream: u64,
        event: u64,
    },
    BeginCapture(u64),
    EndCapture {
        stream: u64,
        graph: u64,
    },
    Instantiate {
        graph: u64,
        exec: u64,
    },
    GraphLaunch {
        exec: u64,
        stream: u64,
    },
    ExecDestroy(u64),
    GraphDestroy(u64),
    ModuleLoad(u64),
    GetFunction {
        name: String,
        func: u64,
    },
    Launch(Launch),
    /// hiprtc calls (program create / compile / code / destroy).
    Rtc(&'static str),
    /// hipModuleOccupancyMaxActiveBlocksPerMultiprocessor: the kernel, its
    /// block size and dynamic shared memory.
    Occupancy {
        name: String,
        threads: c_int,
        smem: usize,
    },
    /// A call the stub refused, and why.
    Bad(String),
}

/// One recorded kernel launch.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Launch {
    pub name: String,
    pub func: u64,
    pub grid: (u32, u32, u32),
    pub block: (u32, u32, u32),
    pub smem: u32,
    pub stream: u64,
    /// Each argument's bytes, read with the kernel's signature
    /// ([`set_signatures`]; empty when none was given).
    pub args: Vec<Vec<u8>>,
}

/// A mistake the stub makes on purpose, standing for a bug in the HIP
/// route, so a test can prove its checks catch it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Plant {
    None,
    /// Record every launch with grid x and y swapped.
    SwapGridXY,
    /// Do not record the launch of this index (0-based, counted per thread).
    DropLaunch(usize),
    /// Flip the low bit of the first byte of every launch's first argument.
    FlipFirstArg,
    /// Take every hipStreamWaitEvent without recording it (a fork or join
    /// of two streams that never happened).
    DropWaits,
}

/// What the stub's device queries answer (`hipRuntimeGetVersion`,
/// `hipDeviceGetAttribute` by ROCm 6's numbering, the occupancy query);
/// the defaults are an MI355X's on ROCm 6.4.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Answers {
    pub version: c_int,
    pub cooperative: c_int,
    pub threads_per_block: c_int,
    pub warp: c_int,
    pub cus: c_int,
    pub occupancy: c_int,
}

impl Default for Answers {
    fn default() -> Self {
        Answers {
            version: 60_443_483,
            cooperative: 1,
            threads_per_block: 1024,
            warp: 64,
            cus: 256,
            occupancy: 2,
        }
    }
}

struct State {
    calls: Vec<Call>,
    answers: Answers,
    /// Live allocations: base address -> bytes (the storage is a leaked
    /// `Box<[u64]>` of at least that many bytes, reclaimed by hipFree).
    live: BTreeMap<u64, usize>,
    /// Loaded functions: handle -> kernel name, and (module, name) -> handle.
    names: HashMap<u64, String>,
    by_name: HashMap<(u64, String), u64>,
    /// Argument sizes per kernel name.
    signatures: HashMap<String, Vec<usize>>,
    /// Next opaque handle (streams, events, graphs, modules, functions).
    next: u64,
    launches: usize,
    plant: Plant,
}

thread_local! {
    static ST: RefCell<State> = RefCell::new(State {
        calls: Vec::new(),
        answers: Answers::default(),
        live: BTreeMap::new(),
        names: HashMap::new(),
        by_name: HashMap::new(),
        signatures: HashMap::new(),
        next: 0x1000,
        launches: 0,
        plant: Plant::None,
    });
}

/// hipErrorInvalidValue, the stub's answer to a refused call.
const INVALID: HipError = 1;

fn with<R>(f: impl FnOnce(&mut State) -> R) -> R {
    ST.with(|s| f(&mut s.borrow_mut()))
}

fn push(c: Call) -> HipError {
    with(|s| s.calls.push(c));
    0
}

fn bad(why: String) -> HipError {
    with(|s| s.calls.push(Call::Bad(why)));
    INVALID
}

fn handle() -> u64 {
    with(|s| {
        s.next += 0x10;
        s.next
    })
}

/// Whether `[p, p + n)` lies inside one live allocation.
fn inside(p: u64, n: usize) -> bool {
    with(|s| {
        s.live
            .range(..=p)
            .next_back()
            .is_some_and(|(&base, &len)| p + n as u64 <= base + len as u64)
    })
}

/// Every call so far, taken out of the log.
pub(crate) fn take_calls() -> Vec<Call> {
    with(|s| std::mem::take(&mut s.calls))
}

/// Kernel argument sizes by kernel name (what the code object's metadata
/// would tell a real runtime).
pub(crate) fn set_signatures(sig: HashMap<String, Vec<usize>>) {
    with(|s| s.signatures = sig);
}

/// The kernel name of function handle `f`, if the stub gave it out.
pub(crate) fn name_of(f: u64) -> Option<String> {
    with(|s| s.names.get(&f).cloned())
}

/// Make the stub plant `p` from now on (counting launches from zero).
pub(crate) fn plant(p: Plant) {
    with(|s| {
        s.plant = p;
        s.launches = 0;
    });
}

/// Live allocations (address, bytes).
pub(crate) fn live() -> Vec<(u64, usize)> {
    with(|s| s.live.iter().map(|(&a, &b)| (a, b)).collect())
}

unsafe extern "C" fn init(_: c_uint) -> HipError {
    0
}
unsafe extern "C" fn count(n: *mut c_int) -> HipError {
    *n = 1;
    0
}
unsafe extern "C" fn props(p: *mut c_void, _: c_int) -> HipError {
    let name = b"gfx950:sramecc+:xnack-\0";
    // SAFETY: the caller's buffer is PROPS_BYTES long.
    ptr::copy_nonoverlapping(name.as_ptr(), p.cast::<u8>().add(396), name.len());
    0
}
unsafe extern "C" fn set_device(_: c_int) -> HipError {
    push(Call::SetDevice)
}
unsafe extern "C" fn mem_info(free: *mut usize, total: *mut usize) -> HipError {
    (*free, *total) = (1 << 30, 1 << 31);
    0
}
unsafe extern "C" fn module_load(m: *mut HipModule, _: *const c_void) -> HipError {
    let h = handle();
    *m = h as HipModule;
    push(Call::ModuleLoad(h))
}
unsafe extern "C" fn get_function(
    f: *mut HipFunction,
    m: HipModule,
    name: *const c_char,
) -> HipError {
    let name = CStr::from_ptr(name).to_string_lossy().to_string();
    let key = (m as u64, name.clone());
    let h = match with(|s| s.by_name.get(&key).copied()) {
        Some(h) => h,
        None => {
            let h = handle();
            with(|s| {
                s.by_name.insert(key, h);
                s.names.insert(h, name.clone());
            });
            h
        }
    };
    *f = h as HipFunction;
    push(Call::GetFunction { name, func: h })
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
    stream: HipStreamT,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> HipError {
    let Some(name) = name_of(f as u64) else {
        return bad(format!("launch of unknown function {:#x}", f as u64));
    };
    if !extra.is_null() {
        return bad(format!("{name}: `extra` is not used by the route"));
    }
    // count the arguments up to the null terminator (at most 64)
    let mut n = 0;
    while n < 64 && !(*params.add(n)).is_null() {
        n += 1;
    }
    if n == 64 {
        return bad(format!("{name}: kernelParams has no null terminator"));
    }
    let sig = with(|s| s.signatures.get(&name).cloned());
    let mut args = Vec::new();
    if let Some(sig) = sig {
        if sig.len() != n {
            return bad(format!(
                "{name}: {n} arguments, its signature has {}",
                sig.len()
            ));
        }
        for (i, &bytes) in sig.iter().enumerate() {
            // SAFETY: entry i points at a value of the kernel's i-th
            // parameter type, `bytes` long (the signature).
            let p = *params.add(i) as *const u8;
            args.push(std::slice::from_raw_parts(p, bytes).to_vec());
        }
    }
    let (plant, index) = with(|s| {
        s.launches += 1;
        (s.plant, s.launches - 1)
    });
    let mut grid = (gx, gy, gz);
    match plant {
        Plant::None | Plant::DropWaits => {}
        Plant::SwapGridXY => grid = (gy, gx, gz),
        Plant::DropLaunch(i) if i == index => return 0,
        Plant::DropLaunch(_) => {}
        Plant::FlipFirstArg => {
            if let Some(b) = args.first_mut().and_then(|a| a.first_mut()) {
                *b ^= 1;
            }
        }
    }
    push(Call::Launch(Launch {
        name,
        func: f as u64,
        grid,
        block: (bx, by, bz),
        smem,
        stream: stream as u64,
        args,
    }))
}
unsafe extern "C" fn malloc(p: *mut *mut c_void, bytes: usize) -> HipError {
    let words = vec![0u64; bytes.div_ceil(8).max(1)].into_boxed_slice();
    let base = Box::into_raw(words) as *mut u64 as u64;
    with(|s| s.live.insert(base, bytes));
    *p = base as *mut c_void;
    push(Call::Malloc { ptr: base, bytes })
}
unsafe extern "C" fn free(p: *mut c_void) -> HipError {
    let ptr = p as u64;
    let Some(bytes) = with(|s| s.live.remove(&ptr)) else {
        return bad(format!("free of {ptr:#x}, not a live allocation"));
    };
    // SAFETY: the storage malloc leaked for this base, reclaimed once.
    drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(
        ptr as *mut u64,
        bytes.div_ceil(8).max(1),
    )));
    push(Call::Free { ptr })
}
/// Copy `n` bytes after checking both sides (device sides must lie in a
/// live allocation).
unsafe fn copy(
    dst: *mut c_void,
    src: *const c_void,
    n: usize,
    kind: c_int,
) -> std::result::Result<(), HipError> {
    let (d, s) = (dst as u64, src as u64);
    let dev_dst = kind == HIP_MEMCPY_H2D || kind == HIP_MEMCPY_D2D;
    let dev_src = kind == HIP_MEMCPY_D2H || kind == HIP_MEMCPY_D2D;
    if (dev_dst && !inside(d, n)) || (dev_src && !inside(s, n)) {
        return Err(bad(format!(
            "copy of {n} bytes {s:#x} -> {d:#x} (kind {kind}) outside a live allocation"
        )));
    }
    // SAFETY: device sides checked above; host sides are the caller's.
    ptr::copy(src.cast::<u8>(), dst.cast::<u8>(), n);
    Ok(())
}
unsafe extern "C" fn memcpy(
    dst: *mut c_void,
    src: *const c_void,
    n: usize,
    kind: c_int,
) -> HipError {
    if let Err(e) = copy(dst, src, n, kind) {
        return e;
    }
    push(Call::Memcpy {
        dst: dst as u64,
        src: src as u64,
        bytes: n,
        kind,
    })
}
unsafe extern "C" fn memcpy_async(
    dst: *mut c_void,
    src: *const c_void,
    n: usize,
    kind: c_int,
    stream: HipStreamT,
) -> HipError {
    if let Err(e) = copy(dst, src, n, kind) {
        return e;
    }
    push(Call::MemcpyAsync {
        dst: dst as u64,
        src: src as u64,
        bytes: n,
        kind,
        stream: stream as u64,
    })
}
unsafe extern "C" fn memset(p: *mut c_void, v: u8, n: usize) -> HipError {
    if !inside(p as u64, n) {
        return bad(format!(
            "memset of {n} bytes at {:#x} outside a live allocation",
            p as u64
        ));
    }
    ptr::write_bytes(p.cast::<u8>(), v, n);
    push(Call::Memset {
        ptr: p as u64,
        bytes: n,
    })
}
unsafe extern "C" fn memset_async(p: *mut c_void, v: u8, n: usize, stream: HipStreamT) -> HipError {
    if !inside(p as u64, n) {
        return bad(format!(
            "memset of {n} bytes at {:#x} outside a live allocation",
            p as u64
        ));
    }
    ptr::write_bytes(p.cast::<u8>(), v, n);
    push(Call::MemsetAsync {
        ptr: p as u64,
        bytes: n,
        stream: stream as u64,
    })
}
unsafe extern "C" fn device_sync() -> HipError {
    push(Call::DeviceSync)
}
unsafe extern "C" fn stream_create(s: *mut HipStreamT, _: c_uint) -> HipError {
    let h = handle();
    *s = h as HipStreamT;
    push(Call::StreamCreate(h))
}
unsafe extern "C" fn stream_sync(s: HipStreamT) -> HipError {
    push(Call::StreamSync(s as u64))
}
unsafe extern "C" fn stream_destroy(s: HipStreamT) -> HipError {
    push(Call::StreamDestroy(s as u64))
}
unsafe extern "C" fn event_create(e: *mut HipEventT, _: c_uint) -> HipError {
    let h = handle();
    *e = h as HipEventT;
    push(Call::EventCreate(h))
}
unsafe extern "C" fn event_record(e: HipEventT, s: HipStreamT) -> HipError {
    push(Call::EventRecord {
        event: e as u64,
        stream: s as u64,
    })
}
unsafe extern "C" fn event_elapsed(ms: *mut f32, _: HipEventT, _: HipEventT) -> HipError {
    *ms = 0.25;
    push(Call::EventElapsed)
}
unsafe extern "C" fn event_destroy(e: HipEventT) -> HipError {
    push(Call::EventDestroy(e as u64))
}
unsafe extern "C" fn stream_wait_event(s: HipStreamT, e: HipEventT, flags: c_uint) -> HipError {
    if flags != 0 {
        return bad(format!("hipStreamWaitEvent flags {flags}, not 0"));
    }
    if ST.with(|st| st.borrow().plant) == Plant::DropWaits {
        return 0;
    }
    push(Call::StreamWaitEvent {
        stream: s as u64,
        event: e as u64,
    })
}
unsafe extern "C" fn begin_capture(s: HipStreamT, mode: c_int) -> HipError {
    if mode != HIP_CAPTURE_MODE_THREAD_LOCAL {
        return bad(format!("capture mode {mode}, not thread-local"));
    }
    push(Call::BeginCapture(s as u64))
}
unsafe extern "C" fn end_capture(s: HipStreamT, g: *mut HipGraphT) -> HipError {
    let h = handle();
    *g = h as HipGraphT;
    push(Call::EndCapture {
        stream: s as u64,
        graph: h,
    })
}
unsafe extern "C" fn instantiate(
    x: *mut HipGraphExecT,
    g: HipGraphT,
    _: *mut c_void,
    _: *mut c_char,
    _: usize,
) -> HipError {
    let h = handle();
    *x = h as HipGraphExecT;
    push(Call::Instantiate {
        graph: g as u64,
        exec: h,
    })
}
unsafe extern "C" fn graph_launch(x: HipGraphExecT, s: HipStreamT) -> HipError {
    push(Call::GraphLaunch {
        exec: x as u64,
        stream: s as u64,
    })
}
unsafe extern "C" fn exec_destroy(x: HipGraphExecT) -> HipError {
    push(Call::ExecDestroy(x as u64))
}
unsafe extern "C" fn graph_destroy(g: HipGraphT) -> HipError {
    push(Call::GraphDestroy(g as u64))
}
unsafe extern "C" fn rtc_version(a: *mut c_int, b: *mut c_int) -> HiprtcResult {
    (*a, *b) = (6, 4);
    0
}
unsafe extern "C" fn rtc_create(
    p: *mut HiprtcProgram,
    _: *const c_char,
    _: *const c_char,
    _: c_int,
    _: *const *const c_char,
    _: *const *const c_char,
) -> HiprtcResult {
    *p = handle() as HiprtcProgram;
    push(Call::Rtc("create"))
}
unsafe extern "C" fn rtc_compile(
    _: HiprtcProgram,
    _: c_int,
    _: *const *const c_char,
) -> HiprtcResult {
    push(Call::Rtc("compile"))
}
unsafe extern "C" fn rtc_log_size(_: HiprtcProgram, n: *mut usize) -> HiprtcResult {
    *n = 1;
    0
}
unsafe extern "C" fn rtc_log(_: HiprtcProgram, log: *mut c_char) -> HiprtcResult {
    *log = 0;
    0
}
/// The stub's "code object".
const CODE: &[u8] = b"stub code object";
unsafe extern "C" fn rtc_code_size(_: HiprtcProgram, n: *mut usize) -> HiprtcResult {
    *n = CODE.len();
    0
}
unsafe extern "C" fn rtc_code(_: HiprtcProgram, out: *mut c_char) -> HiprtcResult {
    ptr::copy_nonoverlapping(CODE.as_ptr(), out.cast::<u8>(), CODE.len());
    push(Call::Rtc("code"))
}
unsafe extern "C" fn rtc_destroy(_: *mut HiprtcProgram) -> HiprtcResult {
    push(Call::Rtc("destroy"))
}

unsafe extern "C" fn runtime_version(v: *mut c_int) -> HipError {
    *v = with(|s| s.answers.version);
    0
}
unsafe extern "C" fn device_attribute(v: *mut c_int, attr: c_int, dev: c_int) -> HipError {
    let a = with(|s| s.answers);
    *v = match (attr, dev) {
        (10, 0) => a.cooperative,
        (56, 0) => a.threads_per_block,
        (63, 0) => a.cus,
        (87, 0) => a.warp,
        _ => return bad(format!("hipDeviceGetAttribute({attr}, device {dev})")),
    };
    0
}
unsafe extern "C" fn occupancy(
    n: *mut c_int,
    f: HipFunction,
    threads: c_int,
    smem: usize,
) -> HipError {
    let Some(name) = name_of(f as u64).filter(|_| threads > 0) else {
        return bad(format!("occupancy of {f:?} at {threads} threads"));
    };
    *n = with(|s| s.answers.occupancy);
    push(Call::Occupancy {
        name,
        threads,
        smem,
    })
}

/// A [`HipGpu`] on the stub table (a gfx950 with no disk cache), with this
/// thread's log cleared and no plant.
pub(crate) fn gpu() -> HipGpu {
    gpu_answering(Answers::default())
}

/// [`gpu`] whose device queries answer `a`.
pub(crate) fn gpu_answering(a: Answers) -> HipGpu {
    with(|s| s.answers = a);
    let g = HipGpu::with_table(
        Fns {
            init,
            get_device_count: count,
            get_device_properties: props,
            set_device,
            mem_get_info: mem_info,
            module_load_data: module_load,
            module_get_function: get_function,
            module_launch_kernel: launch,
            malloc,
            memcpy,
            memset_d8: memset,
            free,
            device_synchronize: device_sync,
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
            graph_instantiate: instantiate,
            graph_launch,
            graph_exec_destroy: exec_destroy,
            graph_destroy,
            rtc_version,
            rtc_create,
            rtc_compile,
            rtc_log_size,
            rtc_log,
            rtc_code_size,
            rtc_code,
            rtc_destroy,
            queries: Queries {
                runtime_version: Some(runtime_version),
                device_attribute: Some(device_attribute),
                occupancy: Some(occupancy),
            },
        },
        None,
        None,
    )
    .expect("the stub table opens");
    take_calls();
    plant(Plant::None);
    g
}
