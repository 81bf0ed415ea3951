//! Kernel launches of the standard path: one stream, raw device addresses
//! as arguments (never cudarc slices: slices record events on every launch,
//! which a CUDA graph would capture), programmatic dependent launch (PDL)
//! on sm_90+, and the events of a per-launch profile. Every call goes
//! through the runtime line ([`crate::runtime::api`]), so the same code
//! launches on CUDA and HIP (where PDL does not exist and is not asked for).
//!
//! Every standard-path kernel starts with `M3_PDL_WAIT`, after at most
//! reads of what no kernel of a step writes: weights, and the step's
//! position and cache-slot inputs (copied in before the step's first
//! launch; no kernel writes them). So launching it with programmatic
//! stream serialization lets its CTAs be scheduled while the previous
//! kernel drains without reading anything early.
//!
//! [`Launcher::beside`] runs two chains of launches at once: one on a
//! second stream, forked from and joined back into the first by events
//! (inside a capture: the graph's two branches). A step uses it for work
//! that shares nothing it writes with the other chain (a MoE layer's
//! shared expert beside its router and routed experts).

use std::cell::{Cell, RefCell};

use crate::error::{GpuError, Result};
use crate::runtime::api::{Device, Event, Func, LaunchCfg, Stream};

/// One kernel argument, by value.
pub(crate) enum Arg {
    U64(u64),
    U32(u32),
    F32(f32),
    /// A `#[repr(C)]` struct passed by value (its bytes, 8-byte aligned
    /// storage), e.g. the fused-launch job tables.
    Pod(Vec<u64>),
}

impl Arg {
    /// Append this argument to `out` as the mono interpreter reads
    /// arguments (kernels/mono.cu): a value of at most 4 bytes at a 4-byte
    /// boundary; a u64 or a struct at an 8-byte boundary, taking a multiple
    /// of 8 bytes.
    fn encode(&self, out: &mut Vec<u8>) {
        let wide = |out: &mut Vec<u8>, bytes: &[u8]| {
            out.resize(out.len().next_multiple_of(8), 0);
            out.extend_from_slice(bytes);
        };
        match self {
            Arg::U32(v) => out.extend_from_slice(&v.to_le_bytes()),
            Arg::F32(v) => out.extend_from_slice(&v.to_le_bytes()),
            Arg::U64(v) => wide(out, &v.to_le_bytes()),
            Arg::Pod(w) => wide(out, bytemuck::cast_slice(w)),
        }
    }

    /// [`Arg::encode`] for the mono tests.
    #[cfg(test)]
    pub(crate) fn encode_for_test(&self, out: &mut Vec<u8>) {
        self.encode(out)
    }

    /// A plain-old-data struct argument.
    pub(crate) fn pod<T: bytemuck::Pod>(v: &T) -> Arg {
        let bytes = bytemuck::bytes_of(v);
        let mut words = vec![0u64; bytes.len().div_ceil(8)];
        bytemuck::cast_slice_mut::<u64, u8>(&mut words)[..bytes.len()].copy_from_slice(bytes);
        Arg::Pod(words)
    }

    /// Bytes of the value [`Arg::ptr`] points at.
    fn size(&self) -> usize {
        match self {
            Arg::U64(_) => 8,
            Arg::U32(_) | Arg::F32(_) => 4,
            Arg::Pod(w) => 8 * w.len(),
        }
    }

    fn ptr(&self) -> *mut std::ffi::c_void {
        match self {
            Arg::U64(v) => v as *const u64 as *mut std::ffi::c_void,
            Arg::U32(v) => v as *const u32 as *mut std::ffi::c_void,
            Arg::F32(v) => v as *const f32 as *mut std::ffi::c_void,
            Arg::Pod(w) => w.as_ptr() as *mut std::ffi::c_void,
        }
    }
}

/// A launch taken down instead of made (see [`Launcher::record`]).
pub(crate) struct Recorded {
    pub label: &'static str,
    /// The kernel's function handle (`Func::handle`: `CUfunction` /
    /// `hipFunction_t`), as an address (what it is, not a pointer to
    /// follow).
    pub func: usize,
    pub grid: (u32, u32, u32),
    pub block: u32,
    pub smem: u32,
    /// The arguments in the mono interpreter's layout ([`Arg::encode`]).
    pub args: Vec<u8>,
    /// Each argument's size in bytes, in order (a struct's padded to
    /// whole u64 words, as [`Arg::Pod`] holds it): how the HIP route's
    /// test reads back the values a launch passed.
    #[cfg_attr(not(test), allow(dead_code))]
    pub sizes: Vec<usize>,
    /// Inside [`Launcher::beside`]: which call (numbered from 0 in the
    /// recording) and whether on its side chain. The two chains of one
    /// call are independent by `beside`'s contract, which the mono
    /// program uses to run them in shared phases.
    pub beside: Option<(u32, bool)>,
}

/// The second stream of [`Launcher::beside`] and its two events.
struct Side {
    stream: Stream,
    /// Recorded on the main stream, waited for by the side one.
    fork: Event,
    /// Recorded on the side stream, waited for by the main one.
    join: Event,
}

/// How [`Launcher::beside`] runs its two chains.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Beside {
    /// One after the other on the one stream.
    Off,
    /// On two streams at once.
    On,
}

/// The streams every launch of one runner goes to: the main one, and the
/// side one of [`Launcher::beside`].
pub struct Launcher {
    dev: Device,
    stream: Stream,
    side: Option<Side>,
    /// Whether launches go to the side stream now (inside `beside`).
    on_side: Cell<bool>,
    /// Programmatic dependent launch (sm_90+).
    pdl: bool,
    /// Events recorded after each launch while a profile runs.
    prof: RefCell<Option<Vec<(&'static str, Event)>>>,
    /// Launches taken down while [`Launcher::record`] runs.
    rec: RefCell<Option<Vec<Recorded>>>,
    /// While recording inside [`Launcher::beside`]: the call's number and
    /// whether its side chain runs ([`Recorded::beside`]); and the next
    /// call's number.
    rec_beside: Cell<Option<(u32, bool)>>,
    rec_calls: Cell<u32>,
    /// Labels whose launches are left out ([`PathOptions::skip_launches`]:
    /// a timing ablation; the step's results are then wrong).
    skip: Vec<&'static str>,
    /// Labels launched without PDL ([`PathOptions::no_pdl_launches`]: a
    /// timing diagnosis; results unchanged).
    no_pdl: Vec<&'static str>,
    /// Labels launched twice in a row ([`PathOptions::twice_launches`]: a
    /// timing diagnosis; outputs may be wrong).
    twice: Vec<&'static str>,
    /// Whether launches go without PDL now (inside [`Launcher::full_edges`]).
    full_edge: Cell<bool>,
}

impl Launcher {
    /// A launcher on a new stream of `dev`; `pdl` only where the device
    /// supports it (`Gpu::pdl`: CUDA compute capability 9.0+). No side
    /// stream: [`Launcher::beside`] runs its chains one after the other.
    pub fn new(dev: &Device, pdl: bool) -> Result<Self> {
        Self::with_side(dev, pdl, Beside::Off)
    }

    /// [`Launcher::new`] with a side stream as `beside` says.
    pub fn with_side(dev: &Device, pdl: bool, beside: Beside) -> Result<Self> {
        let stream = dev.stream()?;
        let side = match beside {
            Beside::Off => None,
            Beside::On => Some(Side {
                stream: dev.stream()?,
                fork: dev.marker()?,
                join: dev.marker()?,
            }),
        };
        Ok(Launcher {
            dev: dev.clone(),
            stream,
            side,
            on_side: Cell::new(false),
            pdl,
            prof: RefCell::new(None),
            rec: RefCell::new(None),
            rec_beside: Cell::new(None),
            rec_calls: Cell::new(0),
            skip: Vec::new(),
            no_pdl: Vec::new(),
            twice: Vec::new(),
            full_edge: Cell::new(false),
        })
    }

    /// Run `f` with its launches (if `on`) made without PDL: each then
    /// waits for the previous kernel to finish before any of its CTAs
    /// starts (a plain stream order; a full edge in a graph), and its
    /// `M3_PDL_WAIT` returns at once. Results do not change; for launches
    /// whose CTAs, started early, could only hold SM room
    /// ([`PathOptions::routed_pdl_max_rows`]).
    ///
    /// [`PathOptions::routed_pdl_max_rows`]: super::PathOptions::routed_pdl_max_rows
    pub(crate) fn full_edges<R>(&self, on: bool, f: impl FnOnce() -> Result<R>) -> Result<R> {
        let was = self.full_edge.replace(on || self.full_edge.get());
        let r = f();
        self.full_edge.set(was);
        r
    }

    /// Leave out every launch labelled one of `skip`, launch those
    /// labelled one of `no_pdl` without PDL and those labelled one of
    /// `twice` twice (comma-separated lists; [`PathOptions::skip_launches`],
    /// [`PathOptions::no_pdl_launches`], [`PathOptions::twice_launches`]).
    pub(crate) fn diagnose(
        &mut self,
        skip: &'static str,
        no_pdl: &'static str,
        twice: &'static str,
    ) {
        let list = |s: &'static str| -> Vec<&'static str> {
            s.split(',')
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .collect()
        };
        self.skip = list(skip);
        self.no_pdl = list(no_pdl);
        self.twice = list(twice);
    }

    pub fn stream(&self) -> &Stream {
        &self.stream
    }

    /// The stream launches go to now.
    fn current(&self) -> &Stream {
        match &self.side {
            Some(side) if self.on_side.get() => &side.stream,
            _ => &self.stream,
        }
    }

    /// Whether launches are being recorded for a mono program
    /// ([`Launcher::record`]) rather than made.
    pub(crate) fn recording(&self) -> bool {
        self.rec.borrow().is_some()
    }

    /// Whether [`Launcher::beside`] runs its chains at once now (a side
    /// stream, and neither a recording nor a per-launch profile running:
    /// both read the launches as one sequence).
    pub(crate) fn concurrent(&self) -> bool {
        self.side.is_some() && !self.recording() && self.prof.borrow().is_none()
    }

    /// Launch what `side` launches on the side stream and what `main`
    /// launches on the main stream, at once: both after everything
    /// launched before, and everything launched after waits for both.
    /// The two chains must not write what the other reads or writes.
    /// Without a side stream (or while recording or profiling) `side` runs
    /// first, then `main`, on the one stream.
    pub(crate) fn beside(
        &self,
        side: impl FnOnce() -> Result<()>,
        main: impl FnOnce() -> Result<()>,
    ) -> Result<()> {
        if self.recording() {
            // recording: both chains in order, each launch tagged with its
            // chain (a mono program's shared phases)
            if self.rec_beside.get().is_some() {
                return Err(GpuError::input("launcher", "beside() inside beside()"));
            }
            let call = self.rec_calls.get();
            self.rec_calls.set(call + 1);
            self.rec_beside.set(Some((call, true)));
            let r = side();
            self.rec_beside.set(Some((call, false)));
            let r = r.and_then(|()| main());
            self.rec_beside.set(None);
            return r;
        }
        let Some(s) = self.side.as_ref().filter(|_| self.concurrent()) else {
            side()?;
            return main();
        };
        if self.on_side.get() {
            return Err(GpuError::input("launcher", "beside() inside beside()"));
        }
        self.bind()?;
        s.fork.record(&self.stream)?;
        s.stream.wait(&s.fork)?;
        self.on_side.set(true);
        let r = side();
        self.on_side.set(false);
        // the join is made even when a chain failed, so a capture can end
        let joined = s.join.record(&s.stream);
        let r = r.and(joined).and_then(|()| main());
        self.stream.wait(&s.join)?;
        r
    }

    /// The device this launcher's stream belongs to.
    pub fn device(&self) -> &Device {
        &self.dev
    }

    /// Lanes of a warp on this launcher's device (`M3_WARP`, from the
    /// device's vendor: 32 on CUDA, 64 on HIP): the block of the one-warp
    /// kernels (`m3s_router_warp`, `m3s_headnorm_rope`), which stride by
    /// `M3_WARP` and would skip work with fewer threads.
    pub(crate) fn warp(&self) -> u32 {
        self.dev.vendor().warp()
    }

    /// Make the device current on this thread (driver calls need it).
    pub fn bind(&self) -> Result<()> {
        self.dev.bind()
    }

    /// Launch `f` with a 1-D block of `block` threads; `smem` is dynamic
    /// shared memory in bytes; `label` names it in errors and profiles.
    pub(crate) fn launch(
        &self,
        label: &'static str,
        f: &Func,
        grid: (u32, u32, u32),
        block: u32,
        smem: u32,
        args: &[Arg],
    ) -> Result<()> {
        if grid.0 == 0 || grid.1 == 0 || grid.2 == 0 || self.skip.contains(&label) {
            return Ok(()); // nothing to do (e.g. no logits rows), or ablated
        }
        // (twice: a timing diagnosis, PathOptions::twice_launches)
        let times = if self.twice.contains(&label) { 2 } else { 1 };
        for _ in 0..times {
            if let Some(rec) = self.rec.borrow_mut().as_mut() {
                let mut bytes = Vec::new();
                for a in args {
                    a.encode(&mut bytes);
                }
                rec.push(Recorded {
                    label,
                    func: f.handle(),
                    grid,
                    block,
                    smem,
                    args: bytes,
                    sizes: args.iter().map(Arg::size).collect(),
                    beside: self.rec_beside.get(),
                });
                continue;
            }
            let mut params: Vec<*mut std::ffi::c_void> = args.iter().map(Arg::ptr).collect();
            let cfg = LaunchCfg {
                grid,
                block,
                smem,
                pdl: self.pdl && !self.full_edge.get() && !self.no_pdl.contains(&label),
            };
            self.bind()?;
            // SAFETY: every pointer argument is a live device address sized for
            // the runner's capacity (checked before the step is enqueued);
            // `params` matches the kernel's parameter list in count, order and
            // types (see the kernel sources and each wrapper's argument struct),
            // and every `Arg` outlives the call.
            unsafe { self.current().launch(label, f, &cfg, &mut params) }?;
            self.mark(label)?;
        }
        Ok(())
    }

    /// Run `enqueue` with every kernel launch taken down instead of made
    /// (the mono path's programs are recorded this way from the standard
    /// path's own launch code). A copy or memset while recording is an
    /// error: a program holds kernels only.
    pub(crate) fn record(&self, enqueue: impl FnOnce() -> Result<()>) -> Result<Vec<Recorded>> {
        *self.rec.borrow_mut() = Some(Vec::new());
        self.rec_calls.set(0);
        let r = enqueue();
        let rec = self.rec.borrow_mut().take().unwrap_or_default();
        r.map(|()| rec)
    }

    fn refuse_if_recording(&self, what: &str) -> Result<()> {
        if self.recording() {
            return Err(GpuError::input(
                "mono program",
                format!("a {what} among the recorded launches (a program holds kernels only)"),
            ));
        }
        Ok(())
    }

    /// Device-to-device copy of `bytes` bytes, ordered on the stream.
    pub fn copy(&self, dst: u64, src: u64, bytes: usize) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        self.refuse_if_recording("copy")?;
        self.bind()?;
        // SAFETY: the caller passes ranges inside live allocations.
        unsafe { self.current().dtod(dst, src, bytes) }?;
        self.mark("copy")
    }

    /// Zero `bytes` bytes at `dst`, ordered on the stream.
    pub fn zero(&self, dst: u64, bytes: usize) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        self.refuse_if_recording("memset")?;
        self.bind()?;
        // SAFETY: the caller passes a range inside a live allocation.
        unsafe { self.current().zero(dst, bytes) }?;
        self.mark("zero")
    }

    /// Wait for every launch so far; surfaces asynchronous errors.
    pub fn sync(&self) -> Result<()> {
        self.stream.sync()
    }

    /// A fresh event (timing).
    pub fn event(&self) -> Result<Event> {
        self.dev.event()
    }

    /// Run `enqueue` `iters` times between two recorded events each and
    /// return each run's device time in ms (one sync at the end).
    pub fn time_each(&self, iters: usize, enqueue: impl FnMut() -> Result<()>) -> Result<Vec<f64>> {
        time_each(&self.dev, &self.stream, iters, enqueue)
    }

    /// Start recording an event after every launch.
    pub(crate) fn profile_start(&self) -> Result<()> {
        *self.prof.borrow_mut() = Some(Vec::new());
        self.mark("start")
    }

    /// Stop recording; (label, ms since the previous mark) per launch.
    pub(crate) fn profile_end(&self) -> Result<Vec<(&'static str, f64)>> {
        let marks = self.prof.borrow_mut().take().unwrap_or_default();
        self.sync()?;
        marks
            .windows(2)
            .map(|w| w[0].1.elapsed_ms(&w[1].1).map(|v| (w[1].0, v as f64)))
            .collect()
    }

    /// In a profiled run, record an event after the launch just made.
    fn mark(&self, label: &'static str) -> Result<()> {
        let mut prof = self.prof.borrow_mut();
        if let Some(marks) = prof.as_mut() {
            let ev = self.event()?;
            ev.record(&self.stream)?;
            marks.push((label, ev));
        }
        Ok(())
    }
}

/// [`Launcher::time_each`] on a device and stream of a launcher (for a
/// caller whose `enqueue` borrows the launcher's owner mutably).
pub fn time_each(
    dev: &Device,
    stream: &Stream,
    iters: usize,
    mut enqueue: impl FnMut() -> Result<()>,
) -> Result<Vec<f64>> {
    let mut pairs = Vec::with_capacity(iters);
    for _ in 0..iters {
        let (a, b) = (dev.event()?, dev.event()?);
        a.record(stream)?;
        enqueue()?;
        b.record(stream)?;
        pairs.push((a, b));
    }
    stream.sync()?;
    pairs
        .iter()
        .map(|(a, b)| a.elapsed_ms(b).map(f64::from))
        .collect()
}
