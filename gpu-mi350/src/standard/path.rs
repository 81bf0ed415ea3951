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
use cudarc::driver::{CudaContext, CudaEvent, CudaFunction, CudaGraph, CudaStream};
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
/// Steps of at most this many rows run the small-step tensor-core variant
/// (4 warps per CTA, 16 rows per CTA: measured faster at batch 1-16 on the
/// H200, bench/NOTES.md session 2).
const SMALL_STEP_ROWS: usize = 16;
/// Its compile-time settings (see standard_decode.cu).
const SMALL_STEP_VARIANT: &str = "S_MMA_WARPS=4 S_MMA_MAXBT=2";
/// Slices of the vocabulary in the first greedy phase.
const ARGMAX_PARTS: usize = 64;

/// The tensor-core linear kernels of one compiled variant.
struct MmaVariant {
    label: String,
    /// Threads per CTA (S_MMA_WARPS * 32 of that compile).
    block: u32,
    /// Most x rows one CTA takes (8 * S_MMA_MAXBT of that compile).
    rows: usize,
    f: HashMap<&'static str, CudaFunction>,
}

impl MmaVariant {
    fn load(
        gpu: &CudaGpu,
        src: &crate::kernels::KernelSource,
        label: &str,
        block: u32,
        rows: usize,
    ) -> Result<Self> {
        let mut f = HashMap::new();
        for fm in [WFmt::Bf16, WFmt::Mxfp8, WFmt::Mxfp4] {
            if let Some(n) = fm.mma_kernel() {
                f.insert(n, gpu.function(src, n)?);
            }
        }
        Ok(MmaVariant {
            label: label.to_string(),
            block,
            rows,
            f,
        })
    }
}

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
    /// One warp per output feature, f32 weights (the router's fallback when
    /// `linear_f32w` does not apply).
    linear_f32: CudaFunction,
    /// Tensor-core kernels for bf16 / MXFP8 / MXFP4 weights, one set per
    /// compiled variant (index 0: the defaults; see `add_variant`).
    mma: Vec<MmaVariant>,
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
    moe_combine: CudaFunction,
    linear_f32w: CudaFunction,
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
    graphs: HashMap<(usize, usize, Path, usize), CudaGraph>,
    /// A tensor-core kernel variant forced by the bench (index into
    /// kern.mma); `None`: chosen per step by its rows (`variant_for`).
    active: Option<usize>,
    /// The variant of the step being enqueued.
    step_variant: std::cell::Cell<usize>,
    /// Launch with programmatic dependent launch (sm_90+, `M3_PDL=0` turns
    /// it off).
    pdl: bool,
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
        let mma = vec![MmaVariant::load(
            gpu, &STANDARD, "default", MMA_BLOCK, MMA_ROWS,
        )?];
        let kern = Kernels {
            linear_f32: f("m3s_linear_f32")?,
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
            moe_combine: f("m3s_moe_combine")?,
            linear_f32w: f("m3s_linear_f32w")?,
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
            route: z(bytes_of(
                (t * k).min(c.num_local_experts).max(1) * (2 + t),
                4,
            ))?,
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
        let mut sp = StandardPath {
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
            active: None,
            step_variant: std::cell::Cell::new(0),
            pdl: gpu.info().cc.0 >= 9 && std::env::var("M3_PDL").map_or(true, |v| v != "0"),
            cur: None,
            prof: RefCell::new(None),
        };
        // the small-step variant (index 1)
        sp.add_variant(gpu, SMALL_STEP_VARIANT)?;
        Ok(sp)
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
        let key = (t, nl, Path::Standard, self.variant_for(t));
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

    /// Compile the tensor-core linear kernels again with `defines`
    /// (`NAME=VALUE` pairs separated by spaces, e.g. `S_MMA_WARPS=4
    /// S_UNROLL_MUL=2`; see standard_decode.cu) as a bench variant; returns
    /// its index for [`StandardPath::set_variant`].
    pub fn add_variant(&mut self, gpu: &CudaGpu, defines: &str) -> Result<usize> {
        let bad = |why: String| GpuError::input("kernel variant", format!("`{defines}`: {why}"));
        let mut prefix = String::new();
        let mut warps = MMA_BLOCK / 32;
        let mut rows = MMA_ROWS;
        for kv in defines.split_whitespace() {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| bad(format!("`{kv}` is not NAME=VALUE")))?;
            let n: u32 = v
                .parse()
                .map_err(|_| bad(format!("`{v}` is not a number")))?;
            match k {
                "S_MMA_WARPS" if [2, 4, 8].contains(&n) => warps = n,
                "S_UNROLL_MUL" if (1..=4).contains(&n) => {}
                "S_MMA_INTERLEAVE" if n <= 1 => {}
                "S_MMA_DBUF" if n <= 1 => {}
                "S_UNROLL_HALF" if n <= 1 => {}
                "S_MMA_MINB" if (1..=16).contains(&n) => {}
                "S_MMA_MAXBT" if [1, 2, 4, 8].contains(&n) => rows = n as usize * 8,
                _ => return Err(bad(format!("unknown or out-of-range `{kv}`"))),
            }
            prefix.push_str(&format!("#define {k} {n}\n"));
        }
        // leaked once per variant: a KernelSource holds &'static text
        let body: &'static str = Box::leak(format!("{prefix}{}", STANDARD.body).into_boxed_str());
        let src = crate::kernels::KernelSource { body, ..STANDARD };
        self.kern
            .mma
            .push(MmaVariant::load(gpu, &src, defines, warps * 32, rows)?);
        Ok(self.kern.mma.len() - 1)
    }

    /// Run later steps with tensor-core variant `v` (an index from
    /// [`StandardPath::add_variant`], 0 = the 64-row default), or `None`:
    /// by the step's rows (the 16-row small-step variant up to 16 rows).
    pub fn set_variant(&mut self, v: Option<usize>) -> Result<()> {
        if let Some(i) = v.filter(|&i| i >= self.kern.mma.len()) {
            return Err(GpuError::input(
                "kernel variant",
                format!("{i} of {}", self.kern.mma.len()),
            ));
        }
        self.active = v;
        Ok(())
    }

    /// The tensor-core variant a step of `t` rows runs with.
    fn variant_for(&self, t: usize) -> usize {
        match self.active {
            Some(i) => i,
            None if t <= SMALL_STEP_ROWS && self.kern.mma.len() > 1 => 1,
            None => 0,
        }
    }

    /// Name of each compiled variant (index = variant).
    pub fn variants(&self) -> Vec<String> {
        self.kern.mma.iter().map(|v| v.label.clone()).collect()
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
    /// in bytes. Every standard-path kernel starts with `M3_PDL_WAIT`, so it
    /// is launched with programmatic stream serialization (PDL, sm_90+): its
    /// CTAs may be scheduled while the previous kernel drains, and it touches
    /// nothing a step writes before that wait (the tensor-core linear
    /// prefetches its first weights, which no step writes, before it).
    pub(super) fn launch_pdl(
        &self,
        label: &'static str,
        f: &CudaFunction,
        grid: (u32, u32, u32),
        block: u32,
        smem: u32,
        args: &[Arg],
    ) -> Result<()> {
        self.launch_ex(label, f, grid, block, smem, args, self.pdl)
    }

    #[allow(clippy::too_many_arguments)]
    fn launch_ex(
        &self,
        label: &'static str,
        f: &CudaFunction,
        grid: (u32, u32, u32),
        block: u32,
        smem: u32,
        args: &[Arg],
        pdl: bool,
    ) -> Result<()> {
        use cudarc::driver::sys;
        // kernel parameters: pointers to the values held by `args`, which
        // outlive the call
        let mut params: Vec<*mut std::ffi::c_void> = args
            .iter()
            .map(|a| match a {
                Arg::U64(v) => v as *const u64 as *mut std::ffi::c_void,
                Arg::U32(v) => v as *const u32 as *mut std::ffi::c_void,
                Arg::F32(v) => v as *const f32 as *mut std::ffi::c_void,
                Arg::Segs(v) => &**v as *const MmaSegs as *mut std::ffi::c_void,
                Arg::Hn(v) => &**v as *const HnJobs as *mut std::ffi::c_void,
                Arg::Cw(v) => &**v as *const CwJobs as *mut std::ffi::c_void,
            })
            .collect();
        // SAFETY: a zeroed union is a valid CUlaunchAttributeValue; only the
        // PDL field is read for this attribute id.
        let mut value: sys::CUlaunchAttributeValue = unsafe { std::mem::zeroed() };
        value.programmaticStreamSerializationAllowed = 1;
        let mut attr = sys::CUlaunchAttribute {
            id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
            pad: [0; 4],
            value,
        };
        let cfg = sys::CUlaunchConfig {
            gridDimX: grid.0,
            gridDimY: grid.1,
            gridDimZ: grid.2,
            blockDimX: block,
            blockDimY: 1,
            blockDimZ: 1,
            sharedMemBytes: smem,
            hStream: self.stream.cu_stream(),
            attrs: &mut attr,
            numAttrs: pdl as u32,
        };
        self.ctx
            .bind_to_thread()
            .map_err(|e| GpuError::driver("cuCtxSetCurrent", e))?;
        // SAFETY: every pointer argument is a live DevBuf address sized for
        // the capacity checked in upload_step; `params` matches the kernel's
        // parameter list (see standard_decode.cu / standard_attention.cu)
        // in count, order and types.
        unsafe {
            sys::cuLaunchKernelEx(
                &cfg,
                f.cu_function(),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        }
        .result()
        .map_err(|e| {
            GpuError::driver("cuLaunchKernelEx (standard path)", format!("{label}: {e}"))
        })?;
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

    /// One matrix of the step: y = x W^T.
    fn linear(&self, w: &DevLinear, x: u64, m: usize, y: LinOut) -> Result<()> {
        self.linears(&[(w, y)], x, m, None)
    }

    /// y_i = x W_i^T for matrices that share x and K, fused into one launch
    /// per weight format (tensor-core kernel; f32 weights run one launch
    /// each on the one-warp-per-feature kernel). `m` rows (plain), or with
    /// `route = Some(xdiv)` the layer's expert pairs grouped by the route
    /// built by `m3s_route` (x row of pair p = p / xdiv; `m` = the step's
    /// rows).
    fn linears(
        &self,
        mats: &[(&DevLinear, LinOut)],
        x: u64,
        m: usize,
        route: Option<usize>,
    ) -> Result<()> {
        let mut done = vec![false; mats.len()];
        for i in 0..mats.len() {
            if done[i] {
                continue;
            }
            let (w0, y0) = mats[i];
            let Some(name) = w0.fmt.mma_kernel() else {
                done[i] = true;
                if route.is_some() {
                    return Err(GpuError::input(
                        "standard path",
                        "f32 routed experts are not supported",
                    ));
                }
                self.linear_f32(w0, x, m, y0)?;
                continue;
            };
            let mut segs = MmaSegs::default();
            let mut tiles = 0u32;
            for j in i..mats.len() {
                let (w, y) = mats[j];
                if done[j] || w.fmt != w0.fmt || w.cols != w0.cols {
                    continue;
                }
                if segs.nseg as usize == MAX_SEGS {
                    break;
                }
                done[j] = true;
                let (w_es, ws_es) = w.strides();
                let (yb, yf, mode) = match y {
                    LinOut::Bf16(p) => (p, 0, 0),
                    LinOut::F32(p) => (0, p, 1),
                    LinOut::AddF32(p) => (0, p, 2),
                };
                segs.s[segs.nseg as usize] = MmaSeg {
                    w: w.codes.ptr(),
                    ws: w.scales.as_ref().map_or(0, |s| s.ptr()),
                    yb,
                    yf,
                    w_es,
                    ws_es,
                    n: w.rows as u32,
                    tile0: tiles,
                    mode,
                    pad: 0,
                };
                segs.nseg += 1;
                tiles += (w.rows as u32).div_ceil(MMA_N);
            }
            let mv = &self.kern.mma[self.step_variant.get()];
            let chunks = m.div_ceil(mv.rows) as u32;
            let (gy, gz, rp) = match route {
                Some(_) => (self.route_slots(m) as u32, chunks, self.acts.route.ptr()),
                None => (chunks, 1, 0),
            };
            self.launch_pdl(
                name,
                &mv.f[name],
                (tiles, gy, gz),
                mv.block,
                0,
                &[
                    Arg::U64(x),
                    Arg::Segs(Box::new(segs)),
                    Arg::U32(w0.cols as u32),
                    Arg::U32(m as u32),
                    Arg::U64(rp),
                    Arg::U32(self.cap.max_rows as u32),
                    Arg::U32(route.unwrap_or(1).max(1) as u32),
                ],
            )?;
        }
        Ok(())
    }

    /// Expert slots of a step of `t` rows (distinct experts at most).
    fn route_slots(&self, t: usize) -> usize {
        let c = &self.model.config;
        (t * c.num_experts_per_tok).min(c.num_local_experts).max(1)
    }

    /// f32 weights (the router): one CTA per output feature, the weight
    /// row in registers and reused for every row (K <= 8192, f32 out);
    /// otherwise one warp per output feature.
    fn linear_f32(&self, w: &DevLinear, x: u64, m: usize, y: LinOut) -> Result<()> {
        if let (LinOut::F32(yf), true) = (y, w.cols <= 32 * 256) {
            return self.launch_pdl(
                "linear_f32",
                &self.kern.linear_f32w,
                (w.rows as u32, 1, 1),
                256,
                0,
                &[
                    Arg::U64(x),
                    Arg::U64(w.codes.ptr()),
                    Arg::U32(w.rows as u32),
                    Arg::U32(w.cols as u32),
                    Arg::U32(m as u32),
                    Arg::U64(yf),
                ],
            );
        }
        let (yb, yf) = match y {
            LinOut::Bf16(p) => (p, 0),
            LinOut::F32(p) => (0, p),
            LinOut::AddF32(_) => {
                return Err(GpuError::input(
                    "standard path",
                    "accumulating f32-weight linear is not supported",
                ))
            }
        };
        if w.fmt != WFmt::F32 {
            return Err(GpuError::input(
                "standard path",
                format!("{:?} weights on the f32 linear kernel", w.fmt),
            ));
        }
        let f = &self.kern.linear_f32;
        let warps = LIN_BLOCK / 32;
        let (ws, ss) = w.strides();
        self.launch_pdl(
            "m3s_linear_f32",
            f,
            ((w.rows as u32).div_ceil(warps), m.div_ceil(LIN_G) as u32, 1),
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
                Arg::U64(0),
                Arg::U64(ws),
                Arg::U64(ss),
                Arg::U32(1),
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
        self.launch_pdl(
            label,
            f,
            ((n as u32).div_ceil(256).max(1), 1, 1),
            256,
            0,
            args,
        )
    }

    /// Per-head norm + RoPE of up to 4 tensors `(x, heads, d, w, rd, out)`
    /// in one launch.
    fn headnorm_rope(&self, jobs: &[(u64, usize, usize, u64, usize, u64)], t: usize) -> Result<()> {
        let c = &self.model.config;
        let mut hj = HnJobs {
            theta: c.rope_theta,
            eps: c.rms_norm_eps,
            ..HnJobs::default()
        };
        let mut h0 = 0u32;
        for (i, &(x, heads, d, w, rd, out)) in jobs.iter().take(4).enumerate() {
            hj.j[i] = HnJob {
                x,
                w,
                out,
                heads: heads as u32,
                d: d as u32,
                rd: rd as u32,
                h0,
            };
            h0 += heads as u32;
            hj.n += 1;
        }
        self.launch_pdl(
            "headnorm_rope",
            &self.kern.headnorm_rope,
            (h0, t as u32, 1),
            32,
            0,
            &[Arg::Hn(Box::new(hj)), Arg::U64(self.acts.pos.ptr())],
        )
    }

    /// Fp8 cache writes of up to 3 tensors `(x, width, scale, cache)` in one
    /// launch.
    fn cache_writes(&self, jobs: &[(u64, usize, f32, u64)], t: usize) -> Result<()> {
        let mut cj = CwJobs::default();
        for (i, &(x, width, scale, cache)) in jobs.iter().take(3).enumerate() {
            cj.j[i] = CwJob {
                x,
                cache,
                width: width as u32,
                scale,
            };
            cj.n += 1;
        }
        self.launch_pdl(
            "cache_write",
            &self.kern.cache_write,
            (t as u32, cj.n, 1),
            128,
            0,
            &[Arg::Cw(Box::new(cj)), Arg::U64(self.acts.slots.ptr())],
        )
    }

    /// Dense MLP (dense layers, shared expert): gate and up in one launch,
    /// SwiGLU, then down into `out`.
    fn mlp_dense(&self, m: &super::model::DevMlp, x: u64, t: usize, out: LinOut) -> Result<()> {
        let c = &self.model.config;
        let a = &self.acts;
        let w = m.gate.rows;
        self.linears(
            &[
                (&m.gate, LinOut::Bf16(a.g.ptr())),
                (&m.up, LinOut::Bf16(a.u.ptr())),
            ],
            x,
            t,
            None,
        )?;
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
        self.linear(&m.down, a.a.ptr(), t, out)
    }

    /// Every kernel of one step of `t` rows with `nl` logits rows.
    fn enqueue(&self, t: usize, nl: usize) -> Result<()> {
        self.step_variant.set(self.variant_for(t));
        let c = &self.model.config;
        let a = &self.acts;
        let h = c.hidden_size;
        let (nh, nkv, d) = (c.num_attention_heads, c.num_key_value_heads, c.head_dim);
        let (nih, di) = (c.index_n_heads, c.index_head_dim);
        let eps = c.rms_norm_eps;
        let cap_t = self.cap.max_rows;
        let k = c.num_experts_per_tok;
        let kb = c.index_topk_blocks;
        self.launch_pdl(
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
            self.launch_pdl(
                "rmsnorm",
                &self.kern.rmsnorm,
                (nrows as u32, 1, 1),
                1024,
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
            // q, k, v (and the indexer's q, k on sparse layers) share x
            let sparse = c.attn_kinds.get(l) == Some(&AttnKind::Sparse);
            let mut qkv = vec![
                (&lw.q, LinOut::Bf16(a.q0.ptr())),
                (&lw.k, LinOut::Bf16(a.k0.ptr())),
                (&lw.v, LinOut::Bf16(a.v.ptr())),
            ];
            if let (true, Some(ix)) = (sparse, &lw.indexer) {
                qkv.push((&ix.q, LinOut::Bf16(a.iq0.ptr())));
                qkv.push((&ix.k, LinOut::Bf16(a.ik0.ptr())));
            }
            self.linears(&qkv, a.hn.ptr(), t, None)?;
            // per-head norm + RoPE of q, k (and the indexer's q, k), then
            // the fp8 cache writes of k, v (and the index key)
            let ix_cache = match (sparse, &lw.indexer, &lc.ik) {
                (true, Some(ix), Some(icache)) => Some((ix, icache)),
                (true, _, _) => {
                    return Err(GpuError::input(
                        "standard path",
                        format!("layer {l} is sparse but has no indexer weights"),
                    ))
                }
                _ => None,
            };
            let mut hn = vec![
                (a.q0.ptr(), nh, d, lw.q_norm.ptr(), c.rotary_dim, a.q.ptr()),
                (a.k0.ptr(), nkv, d, lw.k_norm.ptr(), c.rotary_dim, a.k.ptr()),
            ];
            let mut cws = vec![
                (a.k.ptr(), nkv * d, lw.k_scale, lc.k.ptr()),
                (a.v.ptr(), nkv * d, lw.v_scale, lc.v.ptr()),
            ];
            if let Some((ix, icache)) = ix_cache {
                let rd = c.rotary_dim.min(di);
                hn.push((a.iq0.ptr(), nih, di, ix.q_norm.ptr(), rd, a.iq.ptr()));
                hn.push((a.ik0.ptr(), 1, di, ix.k_norm.ptr(), rd, a.ik.ptr()));
                cws.push((a.ik.ptr(), di, ix.k_scale, icache.ptr()));
            }
            self.headnorm_rope(&hn, t)?;
            self.cache_writes(&cws, t)?;
            let sel_l = a.sel.at(l * nkv * cap_t * kb * 4);
            let mut sel_ptr = 0u64;
            if let Some((ix, icache)) = ix_cache {
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
            // o projection, added into the residual in its epilogue
            self.linear(&lw.o, a.o.ptr(), t, LinOut::AddF32(a.r.ptr()))?;
            rms(a.r.ptr(), 0, lw.post_norm.ptr(), h, a.h2.ptr(), t)?;
            match &lw.ffn {
                DevFfn::Dense(m) => {
                    self.mlp_dense(m, a.h2.ptr(), t, LinOut::AddF32(a.r.ptr()))?;
                }
                DevFfn::Moe {
                    router,
                    bias,
                    experts,
                    shared,
                } => {
                    let ne = router.rows;
                    let ids_l = a.ids.at(l * cap_t * k * 4);
                    self.linear(router, a.h2.ptr(), t, LinOut::F32(a.z.ptr()))?;
                    self.launch_pdl(
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
                    // group the (row, expert) pairs by expert: each chosen
                    // expert is then read once
                    self.launch_pdl(
                        "route",
                        &self.kern.route,
                        (1, 1, 1),
                        256,
                        0,
                        &[
                            Arg::U64(ids_l),
                            Arg::U32((t * k) as u32),
                            Arg::U32(ne as u32),
                            Arg::U32(self.route_slots(t) as u32),
                            Arg::U32(self.cap.max_rows as u32),
                            Arg::U64(a.route.ptr()),
                        ],
                    )?;
                    let pairs = t * k;
                    let wi = experts.gate.rows;
                    self.linears(
                        &[
                            (&experts.gate, LinOut::Bf16(a.eg.ptr())),
                            (&experts.up, LinOut::Bf16(a.eu.ptr())),
                        ],
                        a.h2.ptr(),
                        t,
                        Some(k),
                    )?;
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
                    self.linears(
                        &[(&experts.down, LinOut::Bf16(a.ye.ptr()))],
                        a.ea.ptr(),
                        t,
                        Some(1),
                    )?;
                    let mut sh = 0u64;
                    if let Some(s) = shared {
                        self.mlp_dense(s, a.h2.ptr(), t, LinOut::Bf16(a.yd.ptr()))?;
                        sh = a.yd.ptr();
                    }
                    self.launch_pdl(
                        "moe_combine",
                        &self.kern.moe_combine,
                        (t as u32, (h as u32).div_ceil(256), 1),
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
            self.linear(
                &self.model.lm_head,
                a.xn.ptr(),
                nl,
                LinOut::F32(a.logits.ptr()),
            )?;
            self.launch_pdl(
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
            self.launch_pdl(
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

/// Where a linear layer's output goes.
#[derive(Clone, Copy, Debug)]
pub(super) enum LinOut {
    /// bf16 rows (round to nearest even).
    Bf16(u64),
    /// f32 rows.
    F32(u64),
    /// f32 rows += f32(bf16(y)): MODEL.md's residual add, fused.
    AddF32(u64),
}

/// Matrices one tensor-core launch takes (S_MAX_SEGS in the kernel).
const MAX_SEGS: usize = 5;

/// One matrix of a tensor-core launch (`SSeg1` in standard_decode.cu).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct MmaSeg {
    w: u64,
    ws: u64,
    yb: u64,
    yf: u64,
    w_es: u64,
    ws_es: u64,
    n: u32,
    tile0: u32,
    mode: u32,
    pad: u32,
}

/// The matrices of a tensor-core launch, passed by value (`SSegs`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct MmaSegs {
    s: [MmaSeg; MAX_SEGS],
    nseg: u32,
    pad: u32,
}

/// One tensor of the fused per-head norm + RoPE (`SHnJob`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct HnJob {
    x: u64,
    w: u64,
    out: u64,
    heads: u32,
    d: u32,
    rd: u32,
    h0: u32,
}

/// `SHnJobs`: up to 4 tensors, by value.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct HnJobs {
    j: [HnJob; 4],
    theta: f64,
    eps: f32,
    n: u32,
}

/// One cache write of a fused launch (`SCwJob`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct CwJob {
    x: u64,
    cache: u64,
    width: u32,
    scale: f32,
}

/// `SCwJobs`: up to 3 cache writes, by value.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct CwJobs {
    j: [CwJob; 3],
    n: u32,
    pad: u32,
}

/// A kernel argument by value.
pub(super) enum Arg {
    Segs(Box<MmaSegs>),
    Hn(Box<HnJobs>),
    Cw(Box<CwJobs>),
    U64(u64),
    U32(u32),
    F32(f32),
}
