//! The launch sequence of one step (MODEL.md 3 on the device): embedding,
//! per layer the attention block (norm, fused q|k|v|index projections, head
//! norms + RoPE, cache writes, indexer, attention, o-projection + residual)
//! and the FFN (norm, dense MLP or router + routed experts + shared expert,
//! residual), then the head (final norm, LM head, greedy argmax, keyed
//! sampling of stochastic rows).
//!
//! A plain step launches only kernels over fixed buffers (capturable). A
//! step with [`Extras`] (taps, teacher forcing) adds copies to and from
//! per-step buffers and runs with direct launches only.

use std::sync::atomic::{AtomicU64, Ordering};

use m3_core::backend::{ActMode, TapRequest};
use m3_core::config::{AttnKind, IndexSelection};

use super::attn::{self, AttnArgs, IndexArgs, KvKind};
use super::kv::DevCache;
use super::launch::Arg;
use super::linear::{
    linears, prepare_x, LinOut, LinX, PtpcX, Route, SwiGluOut, F16X, F32W_MAX_K, SMALL_STEP_ROWS,
};
use super::pointwise::{self as pw, CombineIn, CwSpec, HnCache, HnCaches, HnSpec};
use super::{route_records, StandardPath, ARGMAX_PARTS};
use crate::error::{GpuError, Result};
use crate::model::{DevBuf, DevFfn, DevLinear, DevMlp, DevNorm, WFmt};

/// Steps of at most this many rows run the router as one launch
/// (`m3s_router_small`: its last CTA takes every row's top-k, a warp a row).
const ROUTER_SMALL_ROWS: usize = SMALL_STEP_ROWS;
/// Threads of `m3s_router_small` (`S_ROUTER_BLOCK`; its rows are
/// `S_ROUTER_ROWS`).
const ROUTER_SMALL_BLOCK: u32 = 256;

/// CTAs of `m3s_l2_prefetch` (128 threads each, a 16 KiB bulk prefetch a
/// thread a round: 64 MiB a round).
const L2_PREFETCH_CTAS: u32 = 32;

/// Per-step capture buffers (`[selected layers][T][H]` f32 each) for the
/// taps a step asked for.
pub(crate) struct TapBufs {
    pub req: TapRequest,
    pub t: usize,
    /// Layer -> its index in the buffers (selected layers only).
    pub slot: Vec<Option<usize>>,
    pub residual: Option<DevBuf>,
    pub attn_out: Option<DevBuf>,
    pub ffn_in: Option<DevBuf>,
    pub ffn_out: Option<DevBuf>,
}

impl TapBufs {
    /// Buffers for `req` on a step of `t` rows of a model of `layers`
    /// layers of width `h`.
    pub fn new(
        ctx: &crate::runtime::api::Device,
        req: TapRequest,
        layers: usize,
        t: usize,
        h: usize,
    ) -> Result<Self> {
        let mut slot = vec![None; layers];
        let mut n = 0;
        for (l, s) in slot.iter_mut().enumerate() {
            if req.layer(l) {
                *s = Some(n);
                n += 1;
            }
        }
        let buf = |on: bool| -> Result<Option<DevBuf>> {
            if on && n > 0 {
                DevBuf::zeroed(ctx, n * t * h * 4)
                    .map(Some)
                    .map_err(|e| GpuError::input("taps", format!("{n} layers x {t} rows: {e}")))
            } else {
                Ok(None)
            }
        };
        Ok(TapBufs {
            req,
            t,
            slot,
            residual: buf(req.residual)?,
            attn_out: buf(req.attn_out)?,
            ffn_in: buf(req.ffn_in)?,
            ffn_out: buf(req.ffn_out)?,
        })
    }

    /// Address of layer `l`'s `[T, H]` slice of `b`, if captured.
    fn at(&self, b: &Option<DevBuf>, l: usize, h: usize) -> Option<u64> {
        let s = self.slot.get(l).copied().flatten()?;
        b.as_ref().map(|b| b.at(s * self.t * h * 4))
    }
}

/// What a direct-launch step adds to the plain launch sequence.
#[derive(Default)]
pub(crate) struct Extras<'a> {
    pub taps: Option<&'a TapBufs>,
    /// Teacher residuals `[L][T][H]` f32 and which layers have one.
    pub teacher: Option<(&'a DevBuf, &'a [bool])>,
}

impl StandardPath {
    /// Every kernel of a step of `t` rows with `nl` logits rows.
    pub(crate) fn enqueue(&self, t: usize, nl: usize, ex: &Extras<'_>) -> Result<()> {
        let c = &self.model.config;
        let h = c.hidden_size;
        let l = &self.l;
        self.enqueue_embed(t)?;
        // the residual starts in `r`; a folded combine moves it (fold_combine)
        self.reset_residual();
        let teacher_at = |layer: usize| -> Option<u64> {
            let (buf, has) = ex.teacher?;
            has.get(layer)
                .copied()
                .unwrap_or(false)
                .then(|| buf.at(layer * t * h * 4))
        };
        for li in 0..self.model.layers.len() {
            if li > 0 {
                if let Some(src) = teacher_at(li - 1) {
                    l.copy(self.res(), src, t * h * 4)?;
                }
            }
            self.enqueue_attention(li, t, ex)?;
            self.enqueue_ffn(li, t, ex)?;
            if let Some(tb) = ex.taps {
                if let Some(dst) = tb.at(&tb.residual, li, h) {
                    l.copy(dst, self.res(), t * h * 4)?;
                }
            }
        }
        if let Some(src) = self.model.layers.len().checked_sub(1).and_then(teacher_at) {
            l.copy(self.res(), src, t * h * 4)?;
        }
        if nl > 0 {
            self.enqueue_head(nl)?;
        }
        Ok(())
    }

    /// The residual buffer of the layer being enqueued (`acts.r`, or
    /// `acts.r2` after a folded combine: `PathOptions::fold_combine`).
    fn res(&self) -> u64 {
        self.acts.cur_r.load(Ordering::Relaxed)
    }

    /// Start an enqueue of the layers: the residual in `acts.r`, no combine
    /// left over.
    pub(crate) fn reset_residual(&self) {
        self.acts.cur_r.store(self.acts.r.ptr(), Ordering::Relaxed);
        *self.pending_combine() = None;
    }

    /// The combine a MoE layer left to the next RMSNorm (`fold_combine`).
    fn pending_combine(&self) -> std::sync::MutexGuard<'_, Option<CombineIn>> {
        // a poisoned lock only means a panic elsewhere mid-enqueue: the
        // value is still this enqueue's
        self.acts
            .pending_combine
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// The residual rows of the step's tokens (`r[t] = embed[token]`).
    pub(crate) fn enqueue_embed(&self, t: usize) -> Result<()> {
        pw::embed(
            &self.l,
            &self.kern.embed,
            self.inputs.tokens(),
            self.model.embed.ptr(),
            self.model.config.hidden_size,
            self.acts.r.ptr(),
            t,
        )
    }

    /// RMSNorm of rows of `x` (f32, all rows or those listed at `rows`)
    /// into bf16 `out`, and (models with MX linears) the same rows in the
    /// f16 layout into `acts.xh_n`, where the next linear on `out` reads them.
    fn rmsnorm(
        &self,
        x: u64,
        rows: u64,
        w: &DevNorm,
        out: u64,
        nrows: usize,
        combine: Option<CombineIn>,
    ) -> Result<()> {
        let c = &self.model.config;
        let a = &self.acts;
        let xh = if a.xh_fused { a.xh_n.ptr() } else { 0 };
        let row_scaled = self.opts.row_scaled_x;
        pw::rmsnorm(
            &self.l,
            &pw::RmsNormFuncs {
                plain: &self.kern.rmsnorm,
                mix: Some(&self.kern.rmsnorm_mix),
            },
            x,
            rows,
            w.ptr(),
            c.rms_norm_eps,
            c.hidden_size,
            out,
            xh,
            w.xrow_arg(row_scaled && xh != 0),
            nrows,
            combine,
        )?;
        remember(&a.last_n, out, xh, row_scaled);
        Ok(())
    }

    /// `acc[i] += f32(y[i])` for `n` values (`y` bf16).
    fn add_bf16(&self, acc: u64, y: u64, n: usize) -> Result<()> {
        pw::add_bf16(&self.l, &self.kern.add_bf16, acc, y, n)
    }

    /// Store bf16 `y` (`n` values) as f32 into a tap slot.
    fn tap_bf16(&self, dst: u64, y: u64, n: usize) -> Result<()> {
        self.l.zero(dst, n * 4)?;
        self.add_bf16(dst, y, n)
    }

    fn lin(
        &self,
        mats: &[(&DevLinear, LinOut)],
        x: u64,
        m: usize,
        route: Option<Route>,
    ) -> Result<()> {
        // PTPC FP8 weights (online quantization) take x quantized per token
        // once for every matrix of the launch that shares it
        let ptpc = match mats.iter().find(|(w, _)| w.fmt == WFmt::Ptpc) {
            Some((w, _)) => Some(self.act_ptpc(x, m, w.cols)?),
            None => None,
        };
        // MX weights read x (or the PTPC rows) in the f16 layout: the copy
        // its producer wrote (RMSNorm, SwiGLU), else one made here
        let a = &self.acts;
        let f16 = [&a.last_n, &a.last_a].iter().find_map(|p| {
            let (src, xh) = (p[0].load(Ordering::Relaxed), p[1].load(Ordering::Relaxed));
            (src == x && xh != 0).then_some(F16X {
                rows: xh,
                row_scaled: p[2].load(Ordering::Relaxed) != 0,
            })
        });
        let x = prepare_x(
            &self.l,
            &self.kern.lin.x_f16,
            mats,
            LinX { x, ptpc, f16 },
            route.map_or(m, |r| r.x_rows),
            &a.xh,
            Some(&a.ptpc_h),
        )?;
        linears(
            &self.l,
            &self.kern.lin,
            self.variant_for(m.max(1)),
            mats,
            x,
            m,
            route,
            self.cap.max_rows,
        )
    }

    /// PTPC-quantize `rows` bf16 rows of `k` values of `x` (per token: the
    /// E4M3 codes' values as bf16 and one f32 scale a row) into the path's
    /// PTPC buffers.
    fn act_ptpc(&self, x: u64, rows: usize, k: usize) -> Result<PtpcX> {
        let a = &self.acts;
        if rows * k * 2 > a.ptpc_x.bytes() || rows * 4 > a.ptpc_s.bytes() {
            return Err(GpuError::input(
                "standard path",
                format!("PTPC input of {rows} x {k} past its buffers (sized at load)"),
            ));
        }
        self.l.launch(
            "act_ptpc",
            &self.kern.act_ptpc,
            (rows as u32, 1, 1),
            super::linear::PTPC_BLOCK,
            0,
            &[
                Arg::U64(x),
                Arg::U32(rows as u32),
                Arg::U32(k as u32),
                Arg::U64(a.ptpc_x.ptr()),
                Arg::U64(a.ptpc_s.ptr()),
            ],
        )?;
        Ok(PtpcX {
            values: a.ptpc_x.ptr(),
            scales: a.ptpc_s.ptr(),
            f16: None,
        })
    }

    /// The routed experts' GEMM input: `x` itself with bf16 activations;
    /// with `--act mxfp4`, `x` quantized into `scratch` (see `act_mxfp4`).
    fn expert_input(&self, x: u64, rows: usize, k: usize, scratch: u64) -> Result<u64> {
        if self.cap.act != ActMode::Mxfp4 {
            return Ok(x);
        }
        self.act_mxfp4(x, rows, k, scratch)?;
        Ok(scratch)
    }

    /// MXFP4-quantize (`even` rule) `rows` bf16 rows of `k` values of `x`
    /// into `out` (bf16 values, each exactly an E2M1 code times its
    /// block's power-of-two scale): the expert input of `--act mxfp4`.
    fn act_mxfp4(&self, x: u64, rows: usize, k: usize, out: u64) -> Result<()> {
        self.l.launch(
            "act_mxfp4",
            &self.kern.act_mxfp4,
            ((k as u32).div_ceil(32 * 8), rows as u32, 1),
            256,
            0,
            &[
                Arg::U64(x),
                Arg::U32(rows as u32),
                Arg::U32(k as u32),
                Arg::U64(out),
            ],
        )
    }

    pub(crate) fn enqueue_attention(&self, li: usize, t: usize, ex: &Extras<'_>) -> Result<()> {
        let c = &self.model.config;
        let a = &self.acts;
        let inp = &self.inputs;
        let lw = &self.model.layers[li];
        let lc = &self.kv.layers[li];
        let h = c.hidden_size;
        let (nh, nkv, d) = (c.num_attention_heads, c.num_key_value_heads, c.head_dim);
        let (nih, di) = (c.index_n_heads, c.index_head_dim);
        let kb = c.index_topk_blocks;
        let cap_t = self.cap.max_rows;
        let kind = KvKind::of(self.cap.cache_dtype);
        // a MoE layer's combine left here (fold_combine): added in, the new
        // residual written to the other buffer, which the layer then uses
        let res = self.res();
        let combine = self.pending_combine().take().map(|c| CombineIn {
            out: if res == a.r.ptr() {
                a.r2.ptr()
            } else {
                a.r.ptr()
            },
            ..c
        });
        self.rmsnorm(res, 0, &lw.input_norm, a.hn.ptr(), t, combine)?;
        if let Some(c) = combine {
            a.cur_r.store(c.out, Ordering::Relaxed);
        }
        // q, k, v (and the indexer's q, k on sparse layers) share x
        let sparse = c.attn_kinds.get(li) == Some(&AttnKind::Sparse);
        let ix = match (sparse, &lw.indexer, &lc.ik) {
            (true, Some(ix), Some(icache)) => Some((ix, icache)),
            (true, _, _) => {
                return Err(GpuError::input(
                    "standard path",
                    format!("layer {li} is sparse but has no indexer weights or index cache"),
                ))
            }
            _ => None,
        };
        let mut qkv = vec![
            (&lw.q, LinOut::Bf16(a.q0.ptr())),
            (&lw.k, LinOut::Bf16(a.k0.ptr())),
            (&lw.v, LinOut::Bf16(a.v.ptr())),
        ];
        if let Some((x, _)) = ix {
            qkv.push((&x.q, LinOut::Bf16(a.iq0.ptr())));
            qkv.push((&x.k, LinOut::Bf16(a.ik0.ptr())));
        }
        self.lin(&qkv, a.hn.ptr(), t, None)?;
        // per-head norm + RoPE of q, k (and the indexer's q, k), and the
        // cache writes of k, v (and the index key): in the same launch
        // (`PathOptions::fuse_cache_writes`; V as a job without a norm) or
        // after it
        let mut hn = vec![
            (a.q0.ptr(), nh, d, lw.q_norm.ptr(), c.rotary_dim, a.q.ptr()),
            (a.k0.ptr(), nkv, d, lw.k_norm.ptr(), c.rotary_dim, a.k.ptr()),
        ];
        let hc = |scale: f32, cache: &DevCache| HnCache {
            cache: cache.ptr(),
            scales: cache.scales_ptr(),
            scale,
        };
        let mut hcs = vec![None, Some(hc(lw.k_scale, &lc.k))];
        let cw = |x: u64, width: usize, scale: f32, cache: &DevCache| CwSpec {
            x,
            width,
            scale,
            cache: cache.ptr(),
            scales: cache.scales_ptr(),
        };
        let mut cws = vec![
            cw(a.k.ptr(), nkv * d, lw.k_scale, &lc.k),
            cw(a.v.ptr(), nkv * d, lw.v_scale, &lc.v),
        ];
        // (NVFP4 heads are whole blocks, as the fused store needs: DevKv
        // refuses other head dims)
        let fuse = self.opts.fuse_cache_writes;
        if fuse {
            hn.push((a.v.ptr(), nkv, d, 0, 0, 0));
            hcs.push(Some(hc(lw.v_scale, &lc.v)));
        }
        if let Some((x, icache)) = ix {
            let rd = c.rotary_dim.min(di);
            hn.push((a.iq0.ptr(), nih, di, x.q_norm.ptr(), rd, a.iq.ptr()));
            hn.push((a.ik0.ptr(), 1, di, x.k_norm.ptr(), rd, a.ik.ptr()));
            hcs.extend([None, Some(hc(x.k_scale, icache))]);
            cws.push(cw(a.ik.ptr(), di, x.k_scale, icache));
        }
        let sel_l = a.sel.at(li * nkv * cap_t * kb.max(1) * 4);
        let sel_ptr = if ix.is_some() { sel_l } else { 0 };
        // the o projection's x in the f16 layout, written by the merge
        // (MX o weights; the buffer SwiGLU's rows use later)
        let o_xh = if a.xh_fused && lw.o.fmt.f16_x() {
            a.xh_a.ptr()
        } else {
            0
        };
        // head norms + RoPE, cache writes, indexer and attention: latency-
        // bound launches, beside which the o projection's weights may be
        // brought into L2
        let heads = || -> Result<()> {
            if fuse {
                self.headnorm_rope(&hn, Some(&hcs), t, kind)?;
            } else {
                self.headnorm_rope(&hn, None, t, kind)?;
                self.cache_writes(&cws, t, kind)?;
            }
            if let Some((x, icache)) = ix {
                attn::index_select(
                    &self.l,
                    &self.kern.attn,
                    &IndexArgs {
                        iq: a.iq.ptr(),
                        nih,
                        di,
                        icache: icache.ptr(),
                        iscales: icache.scales_ptr(),
                        iscale: kind.scale(x.k_scale),
                        cache: kind,
                        pos: inp.pos(),
                        row_seq: inp.row_seq(),
                        bt: inp.bt(),
                        bt_off: inp.bt_off(),
                        page: self.cap.page_size,
                        block: c.index_block_size,
                        topk: kb,
                        init_b: c.index_init_blocks,
                        local_b: c.index_local_blocks,
                        shared: c.index_selection == IndexSelection::Shared,
                        nkv,
                        t,
                        scratch: a.scratch.ptr(),
                        maxnb: self.maxnb,
                        sel: sel_l,
                        prewait: self.opts.index_prewait,
                        grid_x: attn::index_grid_x(self.opts.index_grid_x, t),
                    },
                )?;
            }
            attn::attention(
                &self.l,
                &self.kern.attn,
                &AttnArgs {
                    q: a.q.ptr(),
                    nh,
                    nkv,
                    d,
                    kc: lc.k.ptr(),
                    vc: lc.v.ptr(),
                    ksc: lc.k.scales_ptr(),
                    vsc: lc.v.scales_ptr(),
                    ks: kind.scale(lw.k_scale),
                    vs: kind.scale(lw.v_scale),
                    cache: kind,
                    pos: inp.pos(),
                    row_seq: inp.row_seq(),
                    bt: inp.bt(),
                    bt_off: inp.bt_off(),
                    page: self.cap.page_size,
                    sel: sel_ptr,
                    topk: kb,
                    block: c.index_block_size,
                    t,
                    out: a.o.ptr(),
                    xh: o_xh,
                    scratch: a.ascratch.ptr(),
                    max_chunks: if sparse {
                        self.sparse_chunks
                    } else {
                        self.full_chunks
                    },
                    split: if t <= self.options().attn_split_max_rows
                        && self.options().small_step_attn_split
                    {
                        attn::SPARSE_SPLIT
                    } else {
                        1
                    },
                },
            )
        };
        // joined before the o projection: measured faster than leaving the
        // prefetch unjoined until the step's end (bench/NOTES.md session 14);
        // recorded for a mono program, the prefetch ops share their phases
        // with the attention chain's first ops (mono's own size)
        let pf = if self.l.recording() {
            self.opts.mono_l2_prefetch_mib
        } else {
            self.opts.l2_prefetch_mib
        };
        if (self.l.concurrent() || self.l.recording()) && pf > 0 {
            self.l.beside(|| self.l2_prefetch(&lw.o, pf), heads)?;
        } else {
            heads()?;
        }
        remember(&a.last_a, a.o.ptr(), o_xh, false);
        // o projection, added into the residual in its epilogue (or, to tap
        // it, stored and added by a kernel: the same f32 += bf16(y))
        match ex.taps.and_then(|tb| tb.at(&tb.attn_out, li, h)) {
            None => self.l.full_edges(self.opts.o_full_edge, || {
                self.lin(&[(&lw.o, LinOut::AddF32(self.res()))], a.o.ptr(), t, None)
            }),
            Some(dst) => {
                self.lin(&[(&lw.o, LinOut::Bf16(a.yd.ptr()))], a.o.ptr(), t, None)?;
                self.tap_bf16(dst, a.yd.ptr(), t * h)?;
                self.add_bf16(self.res(), a.yd.ptr(), t * h)
            }
        }
    }

    pub(crate) fn enqueue_ffn(&self, li: usize, t: usize, ex: &Extras<'_>) -> Result<()> {
        let c = &self.model.config;
        let a = &self.acts;
        let lw = &self.model.layers[li];
        let h = c.hidden_size;
        let k = c.num_experts_per_tok;
        let cap_t = self.cap.max_rows;
        let tb = ex.taps;
        self.rmsnorm(self.res(), 0, &lw.post_norm, a.h2.ptr(), t, None)?;
        if let Some(dst) = tb.and_then(|tb| tb.at(&tb.ffn_in, li, h)) {
            self.tap_bf16(dst, a.h2.ptr(), t * h)?;
        }
        let ffn_out = tb.and_then(|tb| tb.at(&tb.ffn_out, li, h));
        match &lw.ffn {
            DevFfn::Dense(m) => match ffn_out {
                None => self.mlp_dense(m, a.h2.ptr(), t, LinOut::AddF32(self.res()), &a.xh_a),
                Some(dst) => {
                    self.mlp_dense(m, a.h2.ptr(), t, LinOut::Bf16(a.yd.ptr()), &a.xh_a)?;
                    self.tap_bf16(dst, a.yd.ptr(), t * h)?;
                    self.add_bf16(self.res(), a.yd.ptr(), t * h)
                }
            },
            DevFfn::Moe {
                router,
                bias,
                experts,
                shared,
                folded,
            } => {
                let ne = router.rows;
                // pairs per row: the router's k, plus the folded shared expert
                let fold = usize::from(*folded);
                let kk = k + fold;
                let ids_l = a.ids.at(li * cap_t * k * 4);
                // group the (row, expert) pairs by expert: each chosen
                // expert is then read once
                let pairs = t * kk;
                let shape = self.route_shape(t, kk, ne + fold);
                let (slots, chunk) = shape;
                let route = |xdiv: usize| Route {
                    table: a.route.ptr(),
                    slots,
                    xdiv,
                    x_rows: pairs.div_ceil(xdiv.max(1)),
                    chunk,
                };
                // past a few rows the expert launches go without PDL: their
                // CTAs cannot load weights before the route exists
                let full = t > self.opts.routed_pdl_max_rows;
                let wi = experts.gate.rows;
                // the routed experts: router, gate + up, SwiGLU, down
                let routed = || -> Result<()> {
                    self.router(router, bias, ids_l, t, fold, shape)?;
                    let x_in = self.expert_input(a.h2.ptr(), t, h, a.xq.ptr())?;
                    match self.fused_swiglu(experts, a.ea.ptr(), &a.xh_a) {
                        Some(o) => {
                            self.l.full_edges(full, || {
                                self.lin(
                                    &[(&experts.gate, LinOut::SwiGlu(o))],
                                    x_in,
                                    t,
                                    Some(route(kk)),
                                )
                            })?;
                            remember(&a.last_a, a.ea.ptr(), a.xh_a.ptr(), true);
                        }
                        None => {
                            self.l.full_edges(full, || {
                                self.lin(
                                    &[
                                        (&experts.gate, LinOut::Bf16(a.eg.ptr())),
                                        (&experts.up, LinOut::Bf16(a.eu.ptr())),
                                    ],
                                    x_in,
                                    t,
                                    Some(route(kk)),
                                )
                            })?;
                            self.swiglu(
                                a.eg.ptr(),
                                a.eu.ptr(),
                                a.ea.ptr(),
                                pairs * wi,
                                wi,
                                &a.xh_a,
                            )?;
                        }
                    }
                    let a_in = self.expert_input(a.ea.ptr(), pairs, wi, a.xq.ptr())?;
                    self.l.full_edges(full, || {
                        self.lin(
                            &[(&experts.down, LinOut::Bf16(a.ye.ptr()))],
                            a_in,
                            t,
                            Some(route(1)),
                        )
                    })
                };
                // the shared expert's output (0: none)
                let sh = match shared {
                    Some(s) => {
                        let shared_mlp =
                            || self.mlp_dense(s, a.h2.ptr(), t, LinOut::Bf16(a.yd.ptr()), &a.xh_s);
                        if self.shared_beside_ok(s) {
                            // its own stream: it writes g, u, a, xh_s, yd only
                            self.l.beside(shared_mlp, routed)?;
                        } else {
                            routed()?;
                            shared_mlp()?;
                        }
                        a.yd.ptr()
                    }
                    None => {
                        routed()?;
                        0
                    }
                };
                // left to the next layer's input RMSNorm (fold_combine):
                // not under taps or teacher rows, nor after the last layer
                let fold_c = self.opts.fold_combine
                    && ex.taps.is_none()
                    && ex.teacher.is_none()
                    && li + 1 < self.model.layers.len();
                if fold_c {
                    *self.pending_combine() = Some(CombineIn {
                        ye: a.ye.ptr(),
                        w: a.wts.ptr(),
                        k: k as u32,
                        fold: fold as u32,
                        shared: sh,
                        out: 0,
                    });
                    return Ok(());
                }
                self.l.launch(
                    "moe_combine",
                    &self.kern.moe_combine,
                    (t as u32, (h as u32).div_ceil(256), 1),
                    256,
                    0,
                    &[
                        Arg::U64(self.res()),
                        Arg::U64(a.ye.ptr()),
                        Arg::U64(a.wts.ptr()),
                        Arg::U32(k as u32),
                        Arg::U32(fold as u32),
                        Arg::U64(sh),
                        Arg::U32(h as u32),
                        Arg::U64(ffn_out.unwrap_or(0)),
                    ],
                )
            }
        }
    }

    /// Final norm of the logits rows, LM head, greedy argmax of every
    /// logits row, then keyed sampling of the stochastic ones (it
    /// overwrites their tokens; greedy rows keep the argmax).
    pub(crate) fn enqueue_head(&self, nl: usize) -> Result<()> {
        let c = &self.model.config;
        let a = &self.acts;
        let inp = &self.inputs;
        self.rmsnorm(
            self.res(),
            inp.lrows(),
            &self.model.final_norm,
            a.xn.ptr(),
            nl,
            None,
        )?;
        self.lin(
            &[(&self.model.lm_head, LinOut::F32(a.logits.ptr()))],
            a.xn.ptr(),
            nl,
            None,
        )?;
        self.l.launch(
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
        self.l.launch(
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
        self.l.launch(
            "sample_keyed",
            &self.kern.sample_keyed,
            (nl as u32, 1, 1),
            crate::sampling::SAMPLE_KEYED_THREADS,
            0,
            &[
                Arg::U64(a.logits.ptr()),
                Arg::U32(c.vocab_size as u32),
                Arg::U64(inp.sample()),
                Arg::U32(nl as u32),
                // no per-element weights wanted back (a test-only output)
                Arg::U64(0),
                Arg::U64(a.tok_out.ptr()),
            ],
        )
    }

    /// The route of a `t`-row step's pairs (`kk` a row) over `experts`:
    /// (records, pairs a record, 0 = one record an expert). Records of at
    /// most a CTA's rows ([`PathOptions::route_chunk`](super::PathOptions))
    /// where the step has more rows than one CTA of its linears takes.
    fn route_shape(&self, t: usize, kk: usize, experts: usize) -> (usize, usize) {
        let cta_rows = self.kern.lin.mma[self.variant_for(t)].rows;
        let chunk = if self.opts.route_chunk && t > cta_rows {
            cta_rows
        } else {
            0
        };
        (route_records(t * kk, experts, chunk), chunk)
    }

    /// The router of the rows of `h2`: logits into `z`, the top-k ids and
    /// weights into `ids_l` / `wts`, the route table into `route`. Small
    /// steps with f32 router weights take one launch (`m3s_router_small`),
    /// others the linear, the top-k and the grouping launched apart; both
    /// compute the same bits. `(slots, chunk)`: the route's shape
    /// ([`StandardPath::route_shape`]), which the step's routed linears
    /// launch by.
    fn router(
        &self,
        router: &DevLinear,
        bias: &DevBuf,
        ids_l: u64,
        t: usize,
        fold: usize,
        (slots, chunk): (usize, usize),
    ) -> Result<()> {
        let c = &self.model.config;
        let a = &self.acts;
        let (ne, k) = (router.rows, c.num_experts_per_tok);
        let cap_t = self.cap.max_rows;
        // (a mono program may take the three launches' form instead:
        // PathOptions::mono_router_split)
        let split = self.l.recording() && self.opts.mono_router_split;
        // (m3s_router_small writes one record an expert: chunk 0 only)
        if t <= ROUTER_SMALL_ROWS
            && router.fmt == WFmt::F32
            && router.cols <= F32W_MAX_K
            && !split
            && chunk == 0
        {
            return self.l.launch(
                "router_small",
                &self.kern.router_small,
                (ne as u32, 1, 1),
                ROUTER_SMALL_BLOCK,
                0,
                &[
                    Arg::U64(a.h2.ptr()),
                    Arg::U64(router.codes.ptr()),
                    Arg::U32(ne as u32),
                    Arg::U32(router.cols as u32),
                    Arg::U32(t as u32),
                    Arg::U64(a.z.ptr()),
                    Arg::U64(bias.ptr()),
                    Arg::U32(k as u32),
                    Arg::F32(c.routed_scaling_factor),
                    Arg::U64(ids_l),
                    Arg::U64(a.wts.ptr()),
                    Arg::U32(fold as u32),
                    Arg::U32(slots as u32),
                    Arg::U32(cap_t as u32),
                    Arg::U64(a.route.ptr()),
                    Arg::U64(a.router_done.ptr()),
                ],
            );
        }
        self.lin(&[(router, LinOut::F32(a.z.ptr()))], a.h2.ptr(), t, None)?;
        self.l.launch(
            "router",
            &self.kern.router_warp,
            (t as u32, 1, 1),
            self.l.warp(),
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
        self.l.launch(
            "route",
            &self.kern.route,
            (1, 1, 1),
            256,
            0,
            &[
                Arg::U64(ids_l),
                Arg::U32(t as u32),
                Arg::U32(k as u32),
                Arg::U32(fold as u32),
                Arg::U32(ne as u32),
                Arg::U32(slots as u32),
                // a record's pairs at most: its stride (Route::chunk)
                Arg::U32(if chunk > 0 { chunk } else { cap_t } as u32),
                Arg::U32(chunk as u32),
                Arg::U64(a.route.ptr()),
            ],
        )
    }

    /// SwiGLU of `n` pairs (rows of `k`) into bf16 `out`, and (models with
    /// MX linears, `k` a multiple of 32) the rows in the f16 layout into
    /// `xh` (`acts.xh_a`, or the shared expert's `acts.xh_s`), where the
    /// next linear on `out` reads them.
    fn swiglu(&self, g: u64, u: u64, out: u64, n: usize, k: usize, xh: &DevBuf) -> Result<()> {
        let c = &self.model.config;
        let a = &self.acts;
        let xh = if a.xh_fused && k.is_multiple_of(32) && k > 0 {
            xh.ptr()
        } else {
            0
        };
        // row-scaled only where the clamp bounds the output
        let xpe = if self.opts.row_scaled_x {
            pw::swiglu_row_pe(c.swiglu_alpha, c.swiglu_limit)
        } else {
            None
        };
        pw::swiglu(
            &self.l,
            &self.kern.swiglu,
            g,
            u,
            c.swiglu_alpha,
            c.swiglu_limit,
            out,
            n,
            xh,
            k.max(1),
            xpe.unwrap_or(0),
        )?;
        remember(&a.last_a, out, xh, xpe.is_some());
        Ok(())
    }

    /// Dense MLP (dense layers, shared expert): gate and up in one launch,
    /// SwiGLU (its f16 rows into `xh`), then down into `out`.
    fn mlp_dense(&self, m: &DevMlp, x: u64, t: usize, out: LinOut, xh: &DevBuf) -> Result<()> {
        let a = &self.acts;
        let w = m.gate.rows;
        match self.fused_swiglu(m, a.a.ptr(), xh) {
            Some(o) => {
                self.lin(&[(&m.gate, LinOut::SwiGlu(o))], x, t, None)?;
                remember(&a.last_a, a.a.ptr(), xh.ptr(), true);
            }
            None => {
                self.lin(
                    &[
                        (&m.gate, LinOut::Bf16(a.g.ptr())),
                        (&m.up, LinOut::Bf16(a.u.ptr())),
                    ],
                    x,
                    t,
                    None,
                )?;
                self.swiglu(a.g.ptr(), a.u.ptr(), a.a.ptr(), t * w, w, xh)?;
            }
        }
        self.lin(&[(&m.down, out)], a.a.ptr(), t, None)
    }

    /// Gate + up of `m` with SwiGLU in their launch's epilogue, writing
    /// `out` (bf16) and its row-scaled f16 rows into `xh`
    /// ([`PathOptions::fuse_swiglu`]), where that runs: the option on, the
    /// f16 copies fused and row-scaled, no MXFP4 activations (their
    /// input is quantized by a launch of its own), and a pair that
    /// [`SwiGluOut::new`] takes. `None`: gate + up, then `m3s_swiglu`.
    fn fused_swiglu(&self, m: &DevMlp, out: u64, xh: &DevBuf) -> Option<SwiGluOut> {
        let c = &self.model.config;
        let on = self.opts.fuse_swiglu
            && self.opts.row_scaled_x
            && self.acts.xh_fused
            && self.cap.act != ActMode::Mxfp4;
        if !on {
            return None;
        }
        SwiGluOut::new(
            &m.gate,
            &m.up,
            out,
            xh.ptr(),
            c.swiglu_alpha,
            c.swiglu_limit,
        )
    }

    /// Whether the shared expert `m` may run beside the routed experts:
    /// its launches then touch no buffer theirs do. Its linears must read
    /// x in the f16 layout from the copies its producers wrote (RMSNorm's
    /// `xh_n`, its SwiGLU's `xh_s`), not from `acts.xh`, which the routed
    /// experts' `--act mxfp4` inputs use, and take no PTPC rows (the PTPC
    /// buffers are one set).
    fn shared_beside_ok(&self, m: &DevMlp) -> bool {
        let mats = [&m.gate, &m.up, &m.down];
        let f16_ok = !mats.iter().any(|w| w.fmt.f16_x())
            || (self.acts.xh_fused && m.gate.rows.is_multiple_of(32));
        f16_ok && !mats.iter().any(|w| w.fmt == WFmt::Ptpc)
    }

    /// Bring up to `mib` MiB of `w`'s codes (and all its block scales)
    /// into L2 (`m3s_l2_prefetch`, a hint).
    fn l2_prefetch(&self, w: &DevLinear, mib: usize) -> Result<()> {
        let most = mib.saturating_mul(1 << 20);
        let mut ranges = vec![(w.codes.ptr(), w.codes.bytes().min(most))];
        if let Some(s) = &w.scales {
            ranges.insert(0, (s.ptr(), s.bytes()));
        }
        for (p, n) in ranges {
            let n = n / 16 * 16;
            self.l.launch(
                "l2_prefetch",
                &self.kern.l2_prefetch,
                (L2_PREFETCH_CTAS, 1, 1),
                128,
                0,
                &[Arg::U64(p), Arg::U64(n as u64)],
            )?;
        }
        Ok(())
    }

    /// Per-head norm + RoPE of up to 6 tensors `(x, heads, d, w, rd, out)`
    /// in one launch, with their rows also written to the caches of
    /// `caches` (one entry a tensor) when given.
    fn headnorm_rope(
        &self,
        jobs: &[HnSpec],
        caches: Option<&[Option<HnCache>]>,
        t: usize,
        kind: KvKind,
    ) -> Result<()> {
        let c = &self.model.config;
        pw::headnorm_rope(
            &self.l,
            &self.kern.headnorm_rope,
            jobs,
            caches.map(|of| HnCaches {
                of,
                kind,
                slots: self.inputs.slots(),
            }),
            t,
            self.inputs.pos(),
            c.rope_theta,
            c.rms_norm_eps,
        )
    }

    /// Cache writes of up to 3 tensors `(x, width, scale, cache)` in one
    /// launch.
    fn cache_writes(&self, jobs: &[CwSpec], t: usize, kind: KvKind) -> Result<()> {
        pw::cache_writes(
            &self.l,
            &self.kern.cache_write,
            jobs,
            t,
            self.inputs.slots(),
            kind,
        )
    }
}

/// Note that bf16 buffer `out` now has its rows in the f16 layout at `xh`
/// (0: it has none).
fn remember(slot: &[AtomicU64; 3], out: u64, xh: u64, row_scaled: bool) {
    slot[0].store(if xh != 0 { out } else { 0 }, Ordering::Relaxed);
    slot[1].store(xh, Ordering::Relaxed);
    slot[2].store(u64::from(xh != 0 && row_scaled), Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn router_block_is_the_kernels() {
        for want in [
            format!("#define S_ROUTER_BLOCK {ROUTER_SMALL_BLOCK}\n"),
            format!("#define S_ROUTER_ROWS {ROUTER_SMALL_ROWS}\n"),
            // (the kernel asserts S_ROUTER_BLOCK == S_F32W_BLOCK)
            format!(
                "#define S_F32W_BLOCK {}u\n",
                super::super::linear::F32W_BLOCK
            ),
        ] {
            assert!(super::super::STANDARD.body.contains(&want), "{want}");
        }
    }
}
