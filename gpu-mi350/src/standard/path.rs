//! The standard path: a step is a fixed sequence of kernel launches over
//! device-resident weights, a paged fp8 KV + index cache and preallocated
//! activations. The step's small host arrays (tokens, positions, slots, block
//! tables, logits rows) are uploaded once at its start; nothing returns to
//! the host inside a step. Steps of the same shape (rows, logits rows) are
//! captured once into a CUDA graph and replayed.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::sys::{CUevent_flags, CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{
    CudaContext, CudaEvent, CudaFunction, CudaGraph, CudaStream, LaunchConfig, PushKernelArg,
};
use m3_core::backend::{Path, StepBatch};
use m3_core::config::{AttnKind, IndexSelection};

use super::devmem::DevBuf;
use super::model::{DevFfn, DevLinear, DevModel, WFmt};
use super::STANDARD;
use crate::error::{GpuError, Result};
use crate::CudaGpu;

/// Threads per block of the linear kernel (8 warps = 8 output features).
const LIN_BLOCK: u32 = 256;
/// Rows of x one linear launch block handles (S_MAXG in the kernel).
const LIN_G: usize = 8;
/// Threads per block of the tensor-core linear (S_MMA_WARPS warps).
const MMA_BLOCK: u32 = 256;
/// Output features per tensor-core linear block (one m16n8k16 tile).
const MMA_N: u32 = 16;
/// Most x rows one tensor-core linear block takes (S_MMA_MAXBT * 8).
const MMA_ROWS: usize = 64;
/// Slices of the vocabulary in the first greedy phase.
const ARGMAX_PARTS: usize = 64;

/// Capacities fixed at construction (buffers are never reallocated, so a
/// captured graph's addresses stay valid).
#[derive(Clone, Copy, Debug)]
pub struct Capacity {
    /// Most rows a step may have.
    pub max_rows: usize,
    /// Positions per cache page.
    pub page_size: usize,
    /// Pages in the pool (all sequences).
    pub num_pages: usize,
    /// Longest context (positions) a sequence may reach.
    pub max_context: usize,
    /// Keep a copy of the residual after every layer (tests; a small dtod
    /// copy per layer).
    pub record_residuals: bool,
}

struct Kernels {
    /// One-warp-per-feature kernels (f32 weights, and routed experts when a
    /// step has more rows than the tensor-core kernel's 64).
    lin: HashMap<&'static str, CudaFunction>,
    /// Tensor-core kernels for bf16 / MXFP8 / MXFP4 weights.
    mma: HashMap<&'static str, CudaFunction>,
    route: CudaFunction,
    router_warp: CudaFunction,
    argmax_part: CudaFunction,
    argmax_final: CudaFunction,
    attn: super::attn::AttnKernels,
    embed: CudaFunction,
    rmsnorm: CudaFunction,
    headnorm_rope: CudaFunction,
    cache_write: CudaFunction,
    swiglu: CudaFunction,
    add_bf16: CudaFunction,
    moe_combine: CudaFunction,
}

/// Per-layer cache tensors (fp8 E4M3 codes).
struct LayerCache {
    k: DevBuf,
    v: DevBuf,
    ik: Option<DevBuf>,
}

struct Acts {
    r: DevBuf,
    hn: DevBuf,
    q0: DevBuf,
    k0: DevBuf,
    v: DevBuf,
    q: DevBuf,
    k: DevBuf,
    iq0: DevBuf,
    ik0: DevBuf,
    iq: DevBuf,
    ik: DevBuf,
    scratch: DevBuf,
    /// Attention partials per (row, KV head, chunk, head) (see attn.rs).
    ascratch: DevBuf,
    o: DevBuf,
    ao: DevBuf,
    h2: DevBuf,
    g: DevBuf,
    u: DevBuf,
    a: DevBuf,
    yd: DevBuf,
    z: DevBuf,
    wts: DevBuf,
    eg: DevBuf,
    eu: DevBuf,
    ea: DevBuf,
    ye: DevBuf,
    xn: DevBuf,
    logits: DevBuf,
    tok_out: DevBuf,
    // step inputs
    tokens: DevBuf,
    pos: DevBuf,
    slots: DevBuf,
    row_seq: DevBuf,
    bt: DevBuf,
    bt_off: DevBuf,
    lrows: DevBuf,
    /// Expert route of the current layer (see `m3s_route`).
    route: DevBuf,
    /// Greedy partials: best value / id per (logits row, slice).
    amax_v: DevBuf,
    amax_i: DevBuf,
    // per-layer records (bytes accounting, taps)
    ids: DevBuf,
    sel: DevBuf,
    res: Option<DevBuf>,
}

/// The standard path on one device.
pub struct StandardPath {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    kern: Kernels,
    pub model: DevModel,
    cap: Capacity,
    caches: Vec<LayerCache>,
    acts: Acts,
    maxnb: usize,
    /// Attention chunks per (row, KV head) of a full layer (attn.rs).
    full_chunks: usize,
    graphs: HashMap<(usize, usize, Path), CudaGraph>,
    /// Shape of the uploaded step (rows, logits rows).
    cur: Option<(usize, usize)>,
    /// Events recorded after each launch while [`StandardPath::profile`] runs.
    prof: RefCell<Option<Vec<(&'static str, CudaEvent)>>>,
}

fn bytes_of(n: usize, elem: usize) -> usize {
    n * elem
}

impl StandardPath {
    /// Compile the kernels, allocate caches and activations for `cap`, and
    /// take ownership of the device-resident `model`.
    pub fn new(gpu: &CudaGpu, model: DevModel, cap: Capacity) -> Result<Self> {
        let c = model.config.clone();
        let bad = |why: String| GpuError::input("standard path", why);
        if cap.max_rows == 0 || cap.page_size == 0 || cap.num_pages == 0 {
            return Err(bad(format!("empty capacity {cap:?}")));
        }
        if !c.head_dim.is_multiple_of(32)
            || c.head_dim > 256
            || !c.index_head_dim.is_multiple_of(32)
            || c.index_head_dim > 256
        {
            return Err(bad(format!(
                "head_dim {} / index_head_dim {} must be multiples of 32 up to 256",
                c.head_dim, c.index_head_dim
            )));
        }
        if c.num_local_experts > 1024 {
            return Err(bad(format!(
                "{} routed experts: the device route and router take at most 1024",
                c.num_local_experts
            )));
        }
        if c.num_experts_per_tok > 16 || c.index_topk_blocks > 64 {
            return Err(bad(
                "top-k experts <= 16 and top-k blocks <= 64 required".into()
            ));
        }
        if c.index_selection == IndexSelection::Shared && c.index_n_heads > 4 {
            return Err(bad(
                "shared index selection supports at most 4 index heads".into()
            ));
        }
        if c.index_selection == IndexSelection::PerKvHead
            && c.index_n_heads != c.num_key_value_heads
        {
            return Err(bad(
                "per-KV-head selection needs index heads == KV heads".into()
            ));
        }
        let ctx = gpu.context().clone();
        let stream = ctx
            .new_stream()
            .map_err(|e| GpuError::driver("cuStreamCreate", e))?;
        let f = |n: &str| gpu.function(&STANDARD, n);
        let mut lin = HashMap::new();
        let mut mma = HashMap::new();
        for fm in [WFmt::Bf16, WFmt::Mxfp8, WFmt::Mxfp4, WFmt::F32] {
            lin.insert(fm.kernel(), f(fm.kernel())?);
            if let Some(n) = fm.mma_kernel() {
                mma.insert(n, f(n)?);
            }
        }
        let kern = Kernels {
            lin,
            mma,
            route: f("m3s_route")?,
            router_warp: f("m3s_router_warp")?,
            argmax_part: f("m3s_argmax_part")?,
            argmax_final: f("m3s_argmax_final")?,
            attn: super::attn::AttnKernels::load(gpu)?,
            embed: f("m3s_embed")?,
            rmsnorm: f("m3s_rmsnorm")?,
            headnorm_rope: f("m3s_headnorm_rope")?,
            cache_write: f("m3s_cache_write")?,
            swiglu: f("m3s_swiglu")?,
            add_bf16: f("m3s_add_bf16")?,
            moe_combine: f("m3s_moe_combine")?,
        };
        let slots = cap.page_size * cap.num_pages;
        let (nkv, d, di) = (c.num_key_value_heads, c.head_dim, c.index_head_dim);
        let mut caches = Vec::with_capacity(c.num_hidden_layers);
        for l in 0..c.num_hidden_layers {
            let sparse = c.attn_kinds.get(l) == Some(&AttnKind::Sparse);
            caches.push(LayerCache {
                k: DevBuf::zeroed(&ctx, slots * nkv * d)?,
                v: DevBuf::zeroed(&ctx, slots * nkv * d)?,
                ik: if sparse {
                    Some(DevBuf::zeroed(&ctx, slots * di)?)
                } else {
                    None
                },
            });
        }
        let t = cap.max_rows;
        let h = c.hidden_size;
        let (nh, nih) = (c.num_attention_heads, c.index_n_heads);
        let k = c.num_experts_per_tok;
        let wmax = c
            .dense_intermediate_size
            .max(c.shared_intermediate_size)
            .max(c.intermediate_size);
        let maxnb = cap.max_context.div_ceil(c.index_block_size.max(1)).max(1);
        let full_chunks = super::attn::attn_max_chunks(cap.max_context, c.index_topk_blocks);
        let pages_per_seq = cap.max_context.div_ceil(cap.page_size);
        let nl = c.num_hidden_layers;
        let z = |n: usize| DevBuf::zeroed(&ctx, n);
        let acts = Acts {
            r: z(bytes_of(t * h, 4))?,
            hn: z(bytes_of(t * h, 2))?,
            q0: z(bytes_of(t * nh * d, 2))?,
            k0: z(bytes_of(t * nkv * d, 2))?,
            v: z(bytes_of(t * nkv * d, 2))?,
            q: z(bytes_of(t * nh * d, 2))?,
            k: z(bytes_of(t * nkv * d, 2))?,
            iq0: z(bytes_of(t * nih * di, 2))?,
            ik0: z(bytes_of(t * di, 2))?,
            iq: z(bytes_of(t * nih * di, 2))?,
            ik: z(bytes_of(t * di, 2))?,
            scratch: z(super::attn::index_scratch_bytes(t, nkv, maxnb))?,
            ascratch: z(super::attn::attn_scratch_bytes(
                t,
                nkv,
                full_chunks,
                nh / nkv.max(1),
                d,
            ))?,
            o: z(bytes_of(t * nh * d, 2))?,
            ao: z(bytes_of(t * h, 2))?,
            h2: z(bytes_of(t * h, 2))?,
            g: z(bytes_of(t * wmax, 2))?,
            u: z(bytes_of(t * wmax, 2))?,
            a: z(bytes_of(t * wmax, 2))?,
            yd: z(bytes_of(t * h, 2))?,
            z: z(bytes_of(t * c.num_local_experts.max(1), 4))?,
            wts: z(bytes_of(t * k.max(1), 4))?,
            eg: z(bytes_of(t * k * c.intermediate_size.max(1), 2))?,
            eu: z(bytes_of(t * k * c.intermediate_size.max(1), 2))?,
            ea: z(bytes_of(t * k * c.intermediate_size.max(1), 2))?,
            ye: z(bytes_of(t * k.max(1) * h, 2))?,
            xn: z(bytes_of(t * h, 2))?,
            logits: z(bytes_of(t * c.vocab_size, 4))?,
            tok_out: z(bytes_of(t, 4))?,
            tokens: z(bytes_of(t, 4))?,
            pos: z(bytes_of(t, 4))?,
            slots: z(bytes_of(t, 4))?,
            row_seq: z(bytes_of(t, 4))?,
            bt: z(bytes_of(t * pages_per_seq, 4))?,
            bt_off: z(bytes_of(t, 4))?,
            lrows: z(bytes_of(t, 4))?,
            route: z(bytes_of(2 + 2 * c.num_local_experts + t * k.max(1), 4))?,
            amax_v: z(bytes_of(t * ARGMAX_PARTS, 4))?,
            amax_i: z(bytes_of(t * ARGMAX_PARTS, 4))?,
            ids: z(bytes_of(nl * t * k.max(1), 4))?,
            sel: z(bytes_of(nl * nkv * t * c.index_topk_blocks.max(1), 4))?,
            res: if cap.record_residuals {
                Some(z(bytes_of(nl * t * h, 4))?)
            } else {
                None
            },
        };
        Ok(StandardPath {
            ctx,
            stream,
            kern,
            model,
            cap,
            caches,
            acts,
            maxnb,
            full_chunks,
            graphs: HashMap::new(),
            cur: None,
            prof: RefCell::new(None),
        })
    }

    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
    pub fn capacity(&self) -> Capacity {
        self.cap
    }

    /// Fill every K, V and index-key cache slot with fp8 codes hashed from
    /// `seed` (|v| in [0.5, 1.875], random sign): the bench's stand-in for a
    /// prefill of the context.
    pub fn fill_cache(&self, gpu: &CudaGpu, seed: u64) -> Result<()> {
        let g = crate::benchmodel::Gen::new(gpu)?;
        for (l, lc) in self.caches.iter().enumerate() {
            let tid = 1_000_000 + 4 * l as u32;
            g.bytes(&lc.k, seed, tid, 0x8f, 0x30)?;
            g.bytes(&lc.v, seed, tid + 1, 0x8f, 0x30)?;
            if let Some(ik) = &lc.ik {
                g.bytes(ik, seed, tid + 2, 0x8f, 0x30)?;
            }
        }
        g.sync()
    }

    /// Upload the step's host arrays (the only host-to-device traffic of a
    /// step) and remember its shape.
    pub fn upload_step(&mut self, step: &StepBatch) -> Result<(usize, usize)> {
        let c = &self.model.config;
        let bad = |why: String| GpuError::input("standard path step", why);
        step.validate(self.cap.page_size, self.cap.num_pages, c.vocab_size)
            .map_err(|e| bad(e.to_string()))?;
        let t = step.rows();
        let nl = step.logits_rows.len();
        if t == 0 || t > self.cap.max_rows {
            return Err(bad(format!("{t} rows (capacity {})", self.cap.max_rows)));
        }
        if step.seqs.len() > self.cap.max_rows {
            return Err(bad(format!("{} sequences", step.seqs.len())));
        }
        let mut bt = Vec::new();
        let mut bt_off = Vec::with_capacity(step.seqs.len());
        for s in &step.seqs {
            bt_off.push(bt.len() as u32);
            bt.extend_from_slice(&s.block_table);
        }
        if bt.len() * 4 > self.acts.bt.bytes() {
            return Err(bad(format!(
                "block tables of {} pages exceed capacity",
                bt.len()
            )));
        }
        if let Some(&p) = step.positions.iter().max() {
            if p as usize >= self.cap.max_context {
                return Err(bad(format!(
                    "position {p} past max_context {}",
                    self.cap.max_context
                )));
            }
        }
        let s = &*self.stream;
        let a = &self.acts;
        a.tokens.write_async(s, 0, &step.tokens)?;
        a.pos.write_async(s, 0, &step.positions)?;
        a.slots.write_async(s, 0, &step.slot_mapping)?;
        a.row_seq.write_async(s, 0, &step.row_seq)?;
        a.bt.write_async(s, 0, &bt)?;
        a.bt_off.write_async(s, 0, &bt_off)?;
        a.lrows.write_async(s, 0, &step.logits_rows)?;
        self.cur = Some((t, nl));
        Ok((t, nl))
    }

    /// Run the uploaded step: replay its graph (captured on first use) when
    /// `graph`, else launch the kernels directly.
    pub fn run(&mut self, graph: bool) -> Result<()> {
        let (t, nl) = self
            .cur
            .ok_or_else(|| GpuError::input("standard path", "run before upload_step"))?;
        if !graph {
            return self.enqueue(t, nl);
        }
        let key = (t, nl, Path::Standard);
        if !self.graphs.contains_key(&key) {
            self.ctx
                .bind_to_thread()
                .map_err(|e| GpuError::driver("cuCtxSetCurrent", e))?;
            self.stream
                .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
                .map_err(|e| GpuError::driver("cuStreamBeginCapture", e))?;
            let r = self.enqueue(t, nl);
            let g = self
                .stream
                .end_capture(CUgraphInstantiate_flags(0))
                .map_err(|e| GpuError::driver("cuStreamEndCapture", e))?;
            r?;
            let g = g.ok_or_else(|| GpuError::driver("cuStreamEndCapture", "empty graph"))?;
            g.upload()
                .map_err(|e| GpuError::driver("cuGraphUpload", e))?;
            self.graphs.insert(key, g);
        }
        self.graphs[&key]
            .launch()
            .map_err(|e| GpuError::driver("cuGraphLaunch", e))
    }

    /// Graphs captured so far.
    pub fn graph_count(&self) -> usize {
        self.graphs.len()
    }

    /// One step end to end: upload, run, logits `[logits_rows, vocab]`.
    pub fn forward(&mut self, step: &StepBatch, graph: bool) -> Result<Vec<f32>> {
        let (_, nl) = self.upload_step(step)?;
        self.run(graph)?;
        self.logits(nl)
    }

    /// Logits of the last step (`nl` rows).
    pub fn logits(&self, nl: usize) -> Result<Vec<f32>> {
        let mut out = vec![0f32; nl * self.model.config.vocab_size];
        self.acts.logits.read(&self.stream, 0, &mut out)?;
        Ok(out)
    }

    /// Greedy tokens of the last step's logits rows (argmax on the device).
    pub fn greedy(&self, nl: usize) -> Result<Vec<u32>> {
        let mut out = vec![0u32; nl];
        self.acts.tok_out.read(&self.stream, 0, &mut out)?;
        Ok(out)
    }

    /// Residual after each layer of the last step (`[L][t * H]`), when
    /// recorded.
    pub fn residuals(&self, t: usize) -> Result<Vec<Vec<f32>>> {
        let h = self.model.config.hidden_size;
        let res = self
            .acts
            .res
            .as_ref()
            .ok_or_else(|| GpuError::input("standard path", "residuals were not recorded"))?;
        let mut out = Vec::new();
        for l in 0..self.model.layers.len() {
            let mut v = vec![0f32; t * h];
            res.read(&self.stream, l * self.cap.max_rows * h * 4, &mut v)?;
            out.push(v);
        }
        Ok(out)
    }

    /// Experts chosen per layer in the last step (`[L][t * top_k]`; empty
    /// for dense layers).
    pub fn experts_chosen(&self, t: usize) -> Result<Vec<Vec<i32>>> {
        let c = &self.model.config;
        let k = c.num_experts_per_tok;
        let mut out = Vec::new();
        for (l, lw) in self.model.layers.iter().enumerate() {
            let mut v = vec![0i32; t * k];
            if matches!(lw.ffn, DevFfn::Moe { .. }) {
                self.acts
                    .ids
                    .read(&self.stream, l * self.cap.max_rows * k * 4, &mut v)?;
            } else {
                v.clear();
            }
            out.push(v);
        }
        Ok(out)
    }

    /// Blocks selected per layer in the last step (`[L][kv_heads * t * K]`,
    /// -1 padded; empty for full layers).
    pub fn blocks_selected(&self, t: usize) -> Result<Vec<Vec<i32>>> {
        let c = &self.model.config;
        let (nkv, kb) = (c.num_key_value_heads, c.index_topk_blocks);
        let mut out = Vec::new();
        for (l, lw) in self.model.layers.iter().enumerate() {
            if lw.indexer.is_none() {
                out.push(Vec::new());
                continue;
            }
            let mut v = vec![0i32; nkv * t * kb];
            self.acts
                .sel
                .read(&self.stream, l * nkv * self.cap.max_rows * kb * 4, &mut v)?;
            out.push(v);
        }
        Ok(out)
    }

    /// Time `iters` replays of the uploaded step's graph, each bracketed by
    /// its own device event pair (ms per step).
    pub fn time_replays(&mut self, iters: usize) -> Result<Vec<f64>> {
        self.run(true)?;
        let ctx = self.ctx.clone();
        let ev = || {
            ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(|e| GpuError::driver("cuEventCreate", e))
        };
        let mut pairs = Vec::with_capacity(iters);
        for _ in 0..iters {
            let (a, b) = (ev()?, ev()?);
            a.record(&self.stream)
                .map_err(|e| GpuError::driver("cuEventRecord", e))?;
            self.run(true)?;
            b.record(&self.stream)
                .map_err(|e| GpuError::driver("cuEventRecord", e))?;
            pairs.push((a, b));
        }
        self.stream
            .synchronize()
            .map_err(|e| GpuError::driver("cuStreamSynchronize", e))?;
        pairs
            .iter()
            .map(|(a, b)| {
                a.elapsed_ms(b)
                    .map(|v| v as f64)
                    .map_err(|e| GpuError::driver("cuEventElapsedTime", e))
            })
            .collect()
    }

    /// Launch `f` on the path's stream. `label` names the launch in a
    /// profile ([`StandardPath::profile`]); `smem` is dynamic shared memory
    /// in bytes.
    pub(super) fn launch(
        &self,
        label: &'static str,
        f: &CudaFunction,
        grid: (u32, u32, u32),
        block: u32,
        smem: u32,
        args: &[Arg],
    ) -> Result<()> {
        let mut b = self.stream.launch_builder(f);
        for a in args {
            match a {
                Arg::U64(v) => b.arg(v),
                Arg::U32(v) => b.arg(v),
                Arg::F32(v) => b.arg(v),
                Arg::F64(v) => b.arg(v),
            };
        }
        let cfg = LaunchConfig {
            grid_dim: grid,
            block_dim: (block, 1, 1),
            shared_mem_bytes: smem,
        };
        // SAFETY: every pointer argument is a live DevBuf address sized for
        // the capacity checked in upload_step; scalars match the kernel's
        // parameter list (see standard_decode.cu).
        unsafe { b.launch(cfg) }
            .map(|_| ())
            .map_err(|e| GpuError::driver("cuLaunchKernel (standard path)", e))?;
        self.mark(label)
    }

    /// In a profiled run, record an event after the launch just made.
    fn mark(&self, label: &'static str) -> Result<()> {
        let mut prof = self.prof.borrow_mut();
        if let Some(marks) = prof.as_mut() {
            let ev = self
                .ctx
                .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(|e| GpuError::driver("cuEventCreate", e))?;
            ev.record(&self.stream)
                .map_err(|e| GpuError::driver("cuEventRecord", e))?;
            marks.push((label, ev));
        }
        Ok(())
    }

    /// Run the uploaded step once with direct launches and an event after
    /// every launch: (label, ms) per launch in order. The gaps between
    /// launches (launch latency, not hidden here as in a graph) are included
    /// in each launch's time, so the sum exceeds a graph replay's time.
    pub fn profile(&mut self) -> Result<Vec<(&'static str, f64)>> {
        let (t, nl) = self
            .cur
            .ok_or_else(|| GpuError::input("standard path", "profile before upload_step"))?;
        // warm: the first direct run may page in code and data
        self.enqueue(t, nl)?;
        *self.prof.borrow_mut() = Some(Vec::new());
        let r = self.mark("start").and_then(|_| self.enqueue(t, nl));
        let marks = self.prof.borrow_mut().take().unwrap_or_default();
        r?;
        self.stream
            .synchronize()
            .map_err(|e| GpuError::driver("cuStreamSynchronize", e))?;
        marks
            .windows(2)
            .map(|w| {
                w[0].1
                    .elapsed_ms(&w[1].1)
                    .map(|v| (w[1].0, v as f64))
                    .map_err(|e| GpuError::driver("cuEventElapsedTime", e))
            })
            .collect()
    }

    /// y = x W^T for `m` rows (plain, `ids` == 0) or `m` expert pairs
    /// (`ids` = the layer's chosen ids, `m` = rows * top_k; x row of pair p
    /// = p / `xdiv`). bf16 / MXFP8 / MXFP4 weights run on the tensor-core
    /// kernel (experts grouped by the route built from `ids`, when the step
    /// has at most 64 rows); f32 weights on the one-warp-per-feature kernel.
    #[allow(clippy::too_many_arguments)]
    fn linear(
        &self,
        w: &DevLinear,
        x: u64,
        m: usize,
        ids: u64,
        xdiv: usize,
        yb: u64,
        yf: u64,
    ) -> Result<()> {
        let (ws, ss) = w.strides();
        let t_rows = m / xdiv.max(1);
        let grouped = ids != 0 && t_rows <= MMA_ROWS;
        if let (Some(name), true) = (w.fmt.mma_kernel(), ids == 0 || grouped) {
            let f = &self.kern.mma[name];
            let ne = self.model.config.num_local_experts;
            let gy = if ids != 0 {
                m.min(ne)
            } else {
                m.div_ceil(MMA_ROWS)
            } as u32;
            return self.launch(
                name,
                f,
                ((w.rows as u32).div_ceil(MMA_N), gy, 1),
                MMA_BLOCK,
                0,
                &[
                    Arg::U64(x),
                    Arg::U64(w.codes.ptr()),
                    Arg::U64(w.scales.as_ref().map_or(0, |s| s.ptr())),
                    Arg::U32(w.rows as u32),
                    Arg::U32(w.cols as u32),
                    Arg::U32(m as u32),
                    Arg::U64(if ids != 0 { self.acts.route.ptr() } else { 0 }),
                    Arg::U32(ne as u32),
                    Arg::U64(ws),
                    Arg::U64(ss),
                    Arg::U32(xdiv.max(1) as u32),
                    Arg::U64(yb),
                    Arg::U64(yf),
                ],
            );
        }
        let f = &self.kern.lin[w.fmt.kernel()];
        let warps = LIN_BLOCK / 32;
        let gx = (w.rows as u32).div_ceil(warps);
        let gy = if ids != 0 { m } else { m.div_ceil(LIN_G) } as u32;
        self.launch(
            w.fmt.kernel(),
            f,
            (gx, gy, 1),
            LIN_BLOCK,
            0,
            &[
                Arg::U64(x),
                Arg::U64(w.codes.ptr()),
                Arg::U64(w.scales.as_ref().map_or(0, |s| s.ptr())),
                Arg::U32(w.rows as u32),
                Arg::U32(w.cols as u32),
                Arg::U32(m as u32),
                Arg::U32(LIN_G as u32),
                Arg::U64(ids),
                Arg::U64(ws),
                Arg::U64(ss),
                Arg::U32(xdiv.max(1) as u32),
                Arg::U64(yb),
                Arg::U64(yf),
            ],
        )
    }

    fn elementwise(
        &self,
        label: &'static str,
        f: &CudaFunction,
        n: usize,
        args: &[Arg],
    ) -> Result<()> {
        self.launch(
            label,
            f,
            ((n as u32).div_ceil(256).max(1), 1, 1),
            256,
            0,
            args,
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn headnorm_rope(
        &self,
        x: u64,
        heads: usize,
        d: usize,
        w: u64,
        rd: usize,
        out: u64,
        t: usize,
    ) -> Result<()> {
        let c = &self.model.config;
        self.launch(
            "headnorm_rope",
            &self.kern.headnorm_rope,
            (heads as u32, t as u32, 1),
            32,
            0,
            &[
                Arg::U64(x),
                Arg::U32(heads as u32),
                Arg::U32(d as u32),
                Arg::U64(w),
                Arg::F32(c.rms_norm_eps),
                Arg::U64(self.acts.pos.ptr()),
                Arg::F64(c.rope_theta),
                Arg::U32(rd as u32),
                Arg::U64(out),
            ],
        )
    }

    fn mlp_dense(&self, m: &super::model::DevMlp, x: u64, t: usize, out: u64) -> Result<()> {
        let c = &self.model.config;
        let a = &self.acts;
        let w = m.gate.rows;
        self.linear(&m.gate, x, t, 0, 1, a.g.ptr(), 0)?;
        self.linear(&m.up, x, t, 0, 1, a.u.ptr(), 0)?;
        self.elementwise(
            "swiglu",
            &self.kern.swiglu,
            t * w,
            &[
                Arg::U64(a.g.ptr()),
                Arg::U64(a.u.ptr()),
                Arg::F32(c.swiglu_alpha),
                Arg::F32(c.swiglu_limit),
                Arg::U64(a.a.ptr()),
                Arg::U32((t * w) as u32),
            ],
        )?;
        self.linear(&m.down, a.a.ptr(), t, 0, 1, out, 0)
    }

    /// Every kernel of one step of `t` rows with `nl` logits rows.
    fn enqueue(&self, t: usize, nl: usize) -> Result<()> {
        let c = &self.model.config;
        let a = &self.acts;
        let h = c.hidden_size;
        let (nh, nkv, d) = (c.num_attention_heads, c.num_key_value_heads, c.head_dim);
        let (nih, di) = (c.index_n_heads, c.index_head_dim);
        let eps = c.rms_norm_eps;
        let cap_t = self.cap.max_rows;
        let k = c.num_experts_per_tok;
        let kb = c.index_topk_blocks;
        self.launch(
            "embed",
            &self.kern.embed,
            (t as u32, 1, 1),
            256,
            0,
            &[
                Arg::U64(a.tokens.ptr()),
                Arg::U64(self.model.embed.ptr()),
                Arg::U32(h as u32),
                Arg::U64(a.r.ptr()),
            ],
        )?;
        let rms = |x: u64, rows: u64, w: u64, n: usize, out: u64, nrows: usize| {
            self.launch(
                "rmsnorm",
                &self.kern.rmsnorm,
                (nrows as u32, 1, 1),
                256,
                0,
                &[
                    Arg::U64(x),
                    Arg::U64(rows),
                    Arg::U64(w),
                    Arg::F32(eps),
                    Arg::U32(n as u32),
                    Arg::U64(out),
                ],
            )
        };
        for (l, lw) in self.model.layers.iter().enumerate() {
            let lc = &self.caches[l];
            rms(a.r.ptr(), 0, lw.input_norm.ptr(), h, a.hn.ptr(), t)?;
            self.linear(&lw.q, a.hn.ptr(), t, 0, 1, a.q0.ptr(), 0)?;
            self.linear(&lw.k, a.hn.ptr(), t, 0, 1, a.k0.ptr(), 0)?;
            self.linear(&lw.v, a.hn.ptr(), t, 0, 1, a.v.ptr(), 0)?;
            self.headnorm_rope(
                a.q0.ptr(),
                nh,
                d,
                lw.q_norm.ptr(),
                c.rotary_dim,
                a.q.ptr(),
                t,
            )?;
            self.headnorm_rope(
                a.k0.ptr(),
                nkv,
                d,
                lw.k_norm.ptr(),
                c.rotary_dim,
                a.k.ptr(),
                t,
            )?;
            let cw = |x: u64, width: usize, scale: f32, cache: u64| {
                self.launch(
                    "cache_write",
                    &self.kern.cache_write,
                    (t as u32, 1, 1),
                    128,
                    0,
                    &[
                        Arg::U64(x),
                        Arg::U32(width as u32),
                        Arg::U64(a.slots.ptr()),
                        Arg::F32(scale),
                        Arg::U64(cache),
                    ],
                )
            };
            cw(a.k.ptr(), nkv * d, lw.k_scale, lc.k.ptr())?;
            cw(a.v.ptr(), nkv * d, lw.v_scale, lc.v.ptr())?;
            let sparse = c.attn_kinds.get(l) == Some(&AttnKind::Sparse);
            let sel_l = a.sel.at(l * nkv * cap_t * kb * 4);
            let mut sel_ptr = 0u64;
            if sparse {
                let (Some(ix), Some(icache)) = (&lw.indexer, &lc.ik) else {
                    return Err(GpuError::input(
                        "standard path",
                        format!("layer {l} is sparse but has no indexer weights"),
                    ));
                };
                self.linear(&ix.q, a.hn.ptr(), t, 0, 1, a.iq0.ptr(), 0)?;
                self.linear(&ix.k, a.hn.ptr(), t, 0, 1, a.ik0.ptr(), 0)?;
                let rd = c.rotary_dim.min(di);
                self.headnorm_rope(a.iq0.ptr(), nih, di, ix.q_norm.ptr(), rd, a.iq.ptr(), t)?;
                self.headnorm_rope(a.ik0.ptr(), 1, di, ix.k_norm.ptr(), rd, a.ik.ptr(), t)?;
                cw(a.ik.ptr(), di, ix.k_scale, icache.ptr())?;
                let shared = c.index_selection == IndexSelection::Shared;
                super::attn::index_select(
                    self,
                    &self.kern.attn,
                    &super::attn::IndexArgs {
                        iq: a.iq.ptr(),
                        nih,
                        di,
                        icache: icache.ptr(),
                        iscale: ix.k_scale,
                        pos: a.pos.ptr(),
                        row_seq: a.row_seq.ptr(),
                        bt: a.bt.ptr(),
                        bt_off: a.bt_off.ptr(),
                        page: self.cap.page_size,
                        block: c.index_block_size,
                        topk: kb,
                        init_b: c.index_init_blocks,
                        local_b: c.index_local_blocks,
                        shared,
                        nkv,
                        t,
                        scratch: a.scratch.ptr(),
                        maxnb: self.maxnb,
                        sel: sel_l,
                    },
                )?;
                sel_ptr = sel_l;
            }
            super::attn::attention(
                self,
                &self.kern.attn,
                &super::attn::AttnArgs {
                    q: a.q.ptr(),
                    nh,
                    nkv,
                    d,
                    kc: lc.k.ptr(),
                    vc: lc.v.ptr(),
                    ks: lw.k_scale,
                    vs: lw.v_scale,
                    pos: a.pos.ptr(),
                    row_seq: a.row_seq.ptr(),
                    bt: a.bt.ptr(),
                    bt_off: a.bt_off.ptr(),
                    page: self.cap.page_size,
                    sel: sel_ptr,
                    topk: kb,
                    block: c.index_block_size,
                    t,
                    out: a.o.ptr(),
                    scratch: a.ascratch.ptr(),
                    max_chunks: if sparse { kb } else { self.full_chunks },
                },
            )?;
            self.linear(&lw.o, a.o.ptr(), t, 0, 1, a.ao.ptr(), 0)?;
            self.elementwise(
                "add_bf16",
                &self.kern.add_bf16,
                t * h,
                &[
                    Arg::U64(a.r.ptr()),
                    Arg::U64(a.ao.ptr()),
                    Arg::U32((t * h) as u32),
                ],
            )?;
            rms(a.r.ptr(), 0, lw.post_norm.ptr(), h, a.h2.ptr(), t)?;
            match &lw.ffn {
                DevFfn::Dense(m) => {
                    self.mlp_dense(m, a.h2.ptr(), t, a.yd.ptr())?;
                    self.elementwise(
                        "add_bf16",
                        &self.kern.add_bf16,
                        t * h,
                        &[
                            Arg::U64(a.r.ptr()),
                            Arg::U64(a.yd.ptr()),
                            Arg::U32((t * h) as u32),
                        ],
                    )?;
                }
                DevFfn::Moe {
                    router,
                    bias,
                    experts,
                    shared,
                } => {
                    let ne = router.rows;
                    let ids_l = a.ids.at(l * cap_t * k * 4);
                    self.linear(router, a.h2.ptr(), t, 0, 1, 0, a.z.ptr())?;
                    self.launch(
                        "router",
                        &self.kern.router_warp,
                        (t as u32, 1, 1),
                        32,
                        0,
                        &[
                            Arg::U64(a.z.ptr()),
                            Arg::U64(bias.ptr()),
                            Arg::U32(ne as u32),
                            Arg::U32(k as u32),
                            Arg::F32(c.routed_scaling_factor),
                            Arg::U64(ids_l),
                            Arg::U64(a.wts.ptr()),
                        ],
                    )?;
                    if t <= MMA_ROWS {
                        // group the (row, expert) pairs by expert: each
                        // chosen expert is then read once
                        self.launch(
                            "route",
                            &self.kern.route,
                            (1, 1, 1),
                            256,
                            0,
                            &[
                                Arg::U64(ids_l),
                                Arg::U32((t * k) as u32),
                                Arg::U32(ne as u32),
                                Arg::U64(a.route.ptr()),
                            ],
                        )?;
                    }
                    let pairs = t * k;
                    let wi = experts.gate.rows;
                    self.linear(&experts.gate, a.h2.ptr(), pairs, ids_l, k, a.eg.ptr(), 0)?;
                    self.linear(&experts.up, a.h2.ptr(), pairs, ids_l, k, a.eu.ptr(), 0)?;
                    self.elementwise(
                        "swiglu",
                        &self.kern.swiglu,
                        pairs * wi,
                        &[
                            Arg::U64(a.eg.ptr()),
                            Arg::U64(a.eu.ptr()),
                            Arg::F32(c.swiglu_alpha),
                            Arg::F32(c.swiglu_limit),
                            Arg::U64(a.ea.ptr()),
                            Arg::U32((pairs * wi) as u32),
                        ],
                    )?;
                    self.linear(&experts.down, a.ea.ptr(), pairs, ids_l, 1, a.ye.ptr(), 0)?;
                    let mut sh = 0u64;
                    if let Some(s) = shared {
                        self.mlp_dense(s, a.h2.ptr(), t, a.yd.ptr())?;
                        sh = a.yd.ptr();
                    }
                    self.launch(
                        "moe_combine",
                        &self.kern.moe_combine,
                        (t as u32, 1, 1),
                        256,
                        0,
                        &[
                            Arg::U64(a.r.ptr()),
                            Arg::U64(a.ye.ptr()),
                            Arg::U64(a.wts.ptr()),
                            Arg::U32(k as u32),
                            Arg::U64(sh),
                            Arg::U32(h as u32),
                        ],
                    )?;
                }
            }
            if let Some(res) = &a.res {
                // SAFETY: both ranges lie inside their allocations.
                unsafe {
                    cudarc::driver::result::memcpy_dtod_async(
                        res.at(l * cap_t * h * 4),
                        a.r.ptr(),
                        t * h * 4,
                        self.stream.cu_stream(),
                    )
                }
                .map_err(|e| GpuError::driver("cuMemcpyDtoDAsync", e))?;
            }
        }
        if nl > 0 {
            rms(
                a.r.ptr(),
                a.lrows.ptr(),
                self.model.final_norm.ptr(),
                h,
                a.xn.ptr(),
                nl,
            )?;
            self.linear(&self.model.lm_head, a.xn.ptr(), nl, 0, 1, 0, a.logits.ptr())?;
            self.launch(
                "argmax_part",
                &self.kern.argmax_part,
                (nl as u32, ARGMAX_PARTS as u32, 1),
                256,
                0,
                &[
                    Arg::U64(a.logits.ptr()),
                    Arg::U32(c.vocab_size as u32),
                    Arg::U64(a.amax_v.ptr()),
                    Arg::U64(a.amax_i.ptr()),
                ],
            )?;
            self.launch(
                "argmax_final",
                &self.kern.argmax_final,
                (nl as u32, 1, 1),
                1,
                0,
                &[
                    Arg::U64(a.amax_v.ptr()),
                    Arg::U64(a.amax_i.ptr()),
                    Arg::U32(ARGMAX_PARTS as u32),
                    Arg::U64(a.tok_out.ptr()),
                ],
            )?;
            if nl == t {
                // decode: feed the greedy tokens back as the next step's input
                // (a caller's upload_step overwrites them)
                // SAFETY: t u32 values in both buffers.
                unsafe {
                    cudarc::driver::result::memcpy_dtod_async(
                        a.tokens.ptr(),
                        a.tok_out.ptr(),
                        t * 4,
                        self.stream.cu_stream(),
                    )
                }
                .map_err(|e| GpuError::driver("cuMemcpyDtoDAsync", e))?;
            }
        }
        Ok(())
    }
}

/// A kernel argument by value.
pub(super) enum Arg {
    U64(u64),
    U32(u32),
    F32(f32),
    F64(f64),
}
