//! The provided step: MODEL.md section 3, composed from `Op`s layer by layer.

use alloc::format;
use alloc::vec;
use alloc::vec::Vec;

use crate::config::{AttnKind, ModelConfig};
use crate::formats::convert::PtpcFp8;
use crate::kv::KvCache;
use crate::weights::{FfnWeights, LinearWeight, ModelWeights};

use super::op::zeros;
use super::{
    Backend, BackendError, BlockSelection, LinearInput, Op, Path, RunOptions, StepBatch, Taps,
};

/// Index blocks a step can see: `max position / block_size + 1` (the `nb`
/// of `index_scores` taps and the `IndexScores` op).
pub fn max_blocks(step: &StepBatch, block_size: usize) -> usize {
    step.positions
        .iter()
        .map(|&p| p as usize / block_size.max(1) + 1)
        .max()
        .unwrap_or(0)
}

fn shape_err(what: alloc::string::String) -> BackendError {
    BackendError::Shape {
        op: "forward",
        what,
    }
}

fn check_model(c: &ModelConfig, model: &ModelWeights) -> Result<(), BackendError> {
    if model.layers.len() != c.num_hidden_layers
        || c.attn_kinds.len() != c.num_hidden_layers
        || c.mlp_kinds.len() != c.num_hidden_layers
    {
        return Err(shape_err(format!(
            "model has {} layers, config says {} (attn_kinds {}, mlp_kinds {})",
            model.layers.len(),
            c.num_hidden_layers,
            c.attn_kinds.len(),
            c.mlp_kinds.len()
        )));
    }
    if c.num_key_value_heads == 0 || !c.num_attention_heads.is_multiple_of(c.num_key_value_heads) {
        return Err(shape_err(format!(
            "num_attention_heads {} is not a multiple of num_key_value_heads {}",
            c.num_attention_heads, c.num_key_value_heads
        )));
    }
    Ok(())
}

/// The default `Backend::forward`: every layer through `run_op`.
pub fn forward_by_ops<B: Backend + ?Sized>(
    be: &B,
    model: &ModelWeights,
    cache: &mut KvCache,
    step: &StepBatch,
    path: Path,
    opts: &RunOptions,
    taps: &mut Taps,
) -> Result<Vec<f32>, BackendError> {
    let c = &model.config;
    check_model(c, model)?;
    let page = cache.layout.page_size;
    step.validate(page, cache.layout.num_pages, c.vocab_size)?;
    if !path.allows(step) {
        return Err(BackendError::IllegalPath {
            path,
            rows: step.rows(),
            pure: step.is_pure_decode(),
        });
    }
    if cache.layers.len() != model.layers.len() {
        return Err(shape_err(format!(
            "cache has {} layers, model {}",
            cache.layers.len(),
            model.layers.len()
        )));
    }
    let t = step.rows();
    let h = c.hidden_size;
    let tp = opts.tensor_parallel.max(1);
    let (nh, nkv, d) = (c.num_attention_heads, c.num_key_value_heads, c.head_dim);
    let (nih, di) = (c.index_n_heads, c.index_head_dim);
    let eps = c.rms_norm_eps;

    let mut r = zeros(t * h);
    be.run_op(Op::Embed {
        table: &model.embed,
        tokens: &step.tokens,
        out: &mut r,
    })?;

    for (l, lw) in model.layers.iter().enumerate() {
        if l > 0 {
            if let Some(tr) = taps.teacher.get(&(l - 1)) {
                if tr.len() != t * h {
                    return Err(shape_err(format!(
                        "teacher residual.{} has {} values, expected {}",
                        l - 1,
                        tr.len(),
                        t * h
                    )));
                }
                r.copy_from_slice(tr);
            }
        }
        let lc = &mut cache.layers[l];
        let a = &lw.attn;
        // 1. h = bf16(RMSNorm(r))
        let mut hn = zeros(t * h);
        be.run_op(Op::RmsNorm {
            x: &r,
            width: h,
            weight: &lw.input_norm,
            eps,
            round_out: true,
            out: &mut hn,
        })?;
        // 2. q, k, v
        let pt = &lw.ptpc;
        let lin = |w, p: &Option<PtpcFp8>, n: usize| -> Result<Vec<f32>, BackendError> {
            let mut o = zeros(t * n);
            linear_bf16(be, &hn, t, w, p.as_ref(), &mut o)?;
            Ok(o)
        };
        let q0 = lin(&a.q, &pt.q, nh * d)?;
        let k0 = lin(&a.k, &pt.k, nkv * d)?;
        let v = lin(&a.v, &pt.v, nkv * d)?;
        // 3-4. per-head norms, RoPE, bf16
        let mut q = zeros(t * nh * d);
        be.run_op(Op::RmsNorm {
            x: &q0,
            width: d,
            weight: &a.q_norm,
            eps,
            round_out: false,
            out: &mut q,
        })?;
        let mut k = zeros(t * nkv * d);
        be.run_op(Op::RmsNorm {
            x: &k0,
            width: d,
            weight: &a.k_norm,
            eps,
            round_out: false,
            out: &mut k,
        })?;
        for (x, heads) in [(&mut q, nh), (&mut k, nkv)] {
            be.run_op(Op::Rope {
                x,
                heads,
                head_dim: d,
                rotary_dim: c.rotary_dim,
                theta: c.rope_theta,
                positions: &step.positions,
                round_out: true,
            })?;
        }
        // 5. cache write
        be.run_op(Op::CacheWrite {
            cache: &mut lc.k,
            slots: &step.slot_mapping,
            x: &k,
        })?;
        be.run_op(Op::CacheWrite {
            cache: &mut lc.v,
            slots: &step.slot_mapping,
            x: &v,
        })?;
        // 6. indexer
        let sparse = c.attn_kinds[l] == AttnKind::Sparse;
        let mut sel: Vec<i32> = Vec::new();
        if sparse {
            let (Some(ix), Some(icache)) = (&a.indexer, lc.index_k.as_mut()) else {
                return Err(shape_err(format!(
                    "layer {l} is sparse but has no indexer weights or index cache"
                )));
            };
            let iq0 = lin(&ix.q, &pt.index_q, nih * di)?;
            let ik0 = lin(&ix.k, &pt.index_k, di)?;
            let mut iq = zeros(t * nih * di);
            be.run_op(Op::RmsNorm {
                x: &iq0,
                width: di,
                weight: &ix.q_norm,
                eps,
                round_out: false,
                out: &mut iq,
            })?;
            let mut ik = zeros(t * di);
            be.run_op(Op::RmsNorm {
                x: &ik0,
                width: di,
                weight: &ix.k_norm,
                eps,
                round_out: false,
                out: &mut ik,
            })?;
            for (x, heads) in [(&mut iq, nih), (&mut ik, 1)] {
                be.run_op(Op::Rope {
                    x,
                    heads,
                    head_dim: di,
                    rotary_dim: c.rotary_dim.min(di),
                    theta: c.rope_theta,
                    positions: &step.positions,
                    round_out: true,
                })?;
            }
            be.run_op(Op::CacheWrite {
                cache: icache,
                slots: &step.slot_mapping,
                x: &ik,
            })?;
            let bs = c.index_block_size;
            let nb = max_blocks(step, bs);
            let mut scores = zeros(nih * t * nb);
            be.run_op(Op::IndexScores {
                q: &iq,
                heads: nih,
                dim: di,
                cache: icache,
                step,
                page_size: page,
                block_size: bs,
                nb,
                out: &mut scores,
            })?;
            sel = vec![-1; nkv * t * c.index_topk_blocks];
            be.run_op(Op::BlockTopK {
                scores: &scores,
                heads: nih,
                nb,
                positions: &step.positions,
                block_size: bs,
                topk: c.index_topk_blocks,
                init_blocks: c.index_init_blocks,
                local_blocks: c.index_local_blocks,
                selection: c.index_selection,
                kv_heads: nkv,
                out: &mut sel,
            })?;
            if taps.request.index_scores && taps.request.layer(l) {
                taps.put_f32(format!("index_scores.{l}"), vec![nih, t, nb], scores);
            }
            if taps.request.topk_blocks && taps.request.layer(l) {
                taps.put_i32(
                    format!("topk_blocks.{l}"),
                    vec![nkv, t, c.index_topk_blocks],
                    sel.clone(),
                );
            }
        }
        // 7. attention
        let mut o = zeros(t * nh * d);
        let lc = &cache.layers[l];
        be.run_op(Op::Attention {
            q: &q,
            heads: nh,
            kv_heads: nkv,
            head_dim: d,
            k: &lc.k,
            v: &lc.v,
            step,
            page_size: page,
            blocks: if sparse {
                Some(BlockSelection {
                    blocks: &sel,
                    topk: c.index_topk_blocks,
                    block_size: c.index_block_size,
                })
            } else {
                None
            },
            out: &mut o,
        })?;
        // 8. r' = r + o Wo^T (row-parallel under tensor parallel: each
        // rank's heads' slice of the input)
        let mut ao = zeros(t * h);
        if tp > 1 {
            no_ptpc(pt.o.is_some(), "o_proj")?;
            row_parallel(be, &o, t, &a.o, tp, &mut ao)?;
        } else {
            linear_bf16(be, &o, t, &a.o, pt.o.as_ref(), &mut ao)?;
        }
        be.run_op(Op::Add {
            acc: &mut r,
            x: &ao,
        })?;
        let tap_l = taps.request.layer(l);
        if taps.request.attn_out && tap_l {
            taps.put_f32(format!("attn_out.{l}"), vec![t, h], ao);
        }
        // 9. h2
        let mut h2 = zeros(t * h);
        be.run_op(Op::RmsNorm {
            x: &r,
            width: h,
            weight: &lw.post_attn_norm,
            eps,
            round_out: true,
            out: &mut h2,
        })?;
        if taps.request.ffn_in && tap_l {
            taps.put_f32(format!("ffn_in.{l}"), vec![t, h], h2.clone());
        }
        // 10. FFN
        let mut y = zeros(t * h);
        match &lw.ffn {
            FfnWeights::Dense(m)
                if tp > 1 || pt.gate.is_some() || pt.up.is_some() || pt.down.is_some() =>
            {
                // The dense MLP op by op, so each linear can take its PTPC
                // form, or the down its row-parallel form (the same steps as
                // `Op::Mlp`: bf16 gate and up, SwiGLU-OAI, bf16 down).
                let ptpc = [pt.gate.as_ref(), pt.up.as_ref(), pt.down.as_ref()];
                if tp > 1 {
                    no_ptpc(ptpc.iter().any(Option::is_some), "the dense MLP")?;
                }
                mlp_by_ops(be, &h2, t, m, c, ptpc, tp, &mut y)?;
            }
            FfnWeights::Dense(m) => {
                be.run_op(Op::Mlp {
                    x: &h2,
                    rows: t,
                    w: m,
                    alpha: c.swiglu_alpha,
                    limit: c.swiglu_limit,
                    out: &mut y,
                })?;
            }
            FfnWeights::Moe(moe) => {
                let k = c.num_experts_per_tok;
                let mut ids = vec![0i32; t * k];
                let mut wts = zeros(t * k);
                be.run_op(Op::Router {
                    x: &h2,
                    rows: t,
                    router: &moe.router,
                    bias: &moe.correction_bias,
                    top_k: k,
                    scaling: c.routed_scaling_factor,
                    ids: &mut ids,
                    weights: &mut wts,
                })?;
                if tp > 1 {
                    if opts.act != super::ActMode::Bf16 {
                        return Err(shape_err(format!(
                            "tensor parallel {tp}: modelled with bf16 expert inputs only (--act bf16)"
                        )));
                    }
                    experts_ep(be, &h2, t, moe, &ids, &wts, k, c, tp, &mut y)?;
                } else {
                    be.run_op(Op::Experts {
                        x: &h2,
                        rows: t,
                        moe,
                        ids: &ids,
                        weights: &wts,
                        top_k: k,
                        act: opts.act,
                        alpha: c.swiglu_alpha,
                        limit: c.swiglu_limit,
                        out: &mut y,
                    })?;
                }
                if taps.request.experts && tap_l {
                    taps.put_i32(format!("experts.{l}"), vec![t, k], ids);
                }
            }
        }
        // 11. r'' = r' + y
        be.run_op(Op::Add { acc: &mut r, x: &y })?;
        if taps.request.ffn_out && tap_l {
            taps.put_f32(format!("ffn_out.{l}"), vec![t, h], y);
        }
        if taps.request.residual && tap_l {
            taps.put_f32(format!("residual.{l}"), vec![t, h], r.clone());
        }
    }
    if let Some(tr) = model
        .layers
        .len()
        .checked_sub(1)
        .and_then(|last| taps.teacher.get(&last))
    {
        if tr.len() != t * h {
            return Err(shape_err(format!(
                "teacher final residual has {} values, expected {}",
                tr.len(),
                t * h
            )));
        }
        r.copy_from_slice(tr);
    }
    // logits = bf16(RMSNorm(r_L)) . lm_head^T in f32, for logits_rows only.
    let nl = step.logits_rows.len();
    let mut xs = zeros(nl * h);
    for (i, &row) in step.logits_rows.iter().enumerate() {
        let row = row as usize;
        xs[i * h..(i + 1) * h].copy_from_slice(&r[row * h..(row + 1) * h]);
    }
    let mut xn = zeros(nl * h);
    be.run_op(Op::RmsNorm {
        x: &xs,
        width: h,
        weight: &model.final_norm,
        eps,
        round_out: true,
        out: &mut xn,
    })?;
    let mut logits = zeros(nl * c.vocab_size);
    if nl > 0 {
        be.run_op(Op::Linear {
            x: &xn,
            rows: nl,
            w: &model.lm_head,
            input: LinearInput::Bf16,
            round_out: false,
            out: &mut logits,
        })?;
    }
    if taps.request.logits {
        taps.put_f32("logits".into(), vec![nl, c.vocab_size], logits.clone());
    }
    Ok(logits)
}

/// A linear on a bf16-rounded input with a bf16 output (MODEL.md 2): the
/// PTPC FP8 form when the layer has one, else the stored weight.
fn linear_bf16<B: Backend + ?Sized>(
    be: &B,
    x: &[f32],
    rows: usize,
    w: &LinearWeight,
    ptpc: Option<&PtpcFp8>,
    out: &mut [f32],
) -> Result<(), BackendError> {
    match ptpc {
        Some(p) => be.ptpc_linear(x, rows, p, true, out),
        None => be.run_op(Op::Linear {
            x,
            rows,
            w,
            input: LinearInput::Bf16,
            round_out: true,
            out,
        }),
    }
}

// ---- tensor / expert parallel, as the CPU proves its math ------------------
//
// A step sharded over `tp` ranks (ARCHITECTURE.md, *Tensor parallel*):
// column-parallel linears (q, k, v, the indexer's, gate, up, the LM head
// by vocabulary) give each rank whole output features, each the same dot
// product as unsharded, so they are computed here unsharded (the same
// numbers by construction); attention is per head. What sharding changes
// is where partial sums meet: the row-parallel linears (o_proj; the dense
// MLP's and the shared expert's down) sum each rank's f32 partial over its
// slice of the input in rank order before the one bf16 rounding, and the
// routed experts (expert parallel: rank r owns the contiguous ids
// r*E/tp..(r+1)*E/tp) sum each rank's weighted outputs in rank order.

fn no_ptpc(ptpc: bool, what: &str) -> Result<(), BackendError> {
    if ptpc {
        return Err(shape_err(format!(
            "tensor parallel with an online-quantized (PTPC FP8) {what} is not modelled"
        )));
    }
    Ok(())
}

/// `out = bf16(sum over ranks r, in order, of x[:, K_r] . W[:, K_r]^T)`
/// with K split into `tp` equal, block-aligned slices; each partial in f32.
fn row_parallel<B: Backend + ?Sized>(
    be: &B,
    x: &[f32],
    rows: usize,
    w: &LinearWeight,
    tp: usize,
    out: &mut [f32],
) -> Result<(), BackendError> {
    let (n, k, blk) = (w.rows(), w.cols(), w.col_block());
    if !k.is_multiple_of(tp) || !(k / tp).is_multiple_of(blk) {
        return Err(shape_err(format!(
            "tensor parallel {tp}: {k} input features do not split into {tp} slices of whole {blk}-value blocks"
        )));
    }
    let ks = k / tp;
    let mut acc = zeros(rows * n);
    for r in 0..tp {
        let wr = w
            .cols_range(r * ks, (r + 1) * ks)
            .map_err(|e| shape_err(format!("tensor parallel {tp}, rank {r}: {e}")))?;
        let mut xr = Vec::with_capacity(rows * ks);
        for row in x.chunks(k).take(rows) {
            xr.extend_from_slice(&row[r * ks..(r + 1) * ks]);
        }
        let mut part = zeros(rows * n);
        be.run_op(Op::Linear {
            x: &xr,
            rows,
            w: &wr,
            input: LinearInput::Bf16,
            round_out: false,
            out: &mut part,
        })?;
        // the all-reduce, in rank order
        for (a, p) in acc.iter_mut().zip(&part) {
            *a += p;
        }
    }
    for (o, a) in out.iter_mut().zip(&acc) {
        *o = crate::formats::bf16::round(*a);
    }
    Ok(())
}

/// A SwiGLU-OAI MLP op by op: gate and up (each in its PTPC form when
/// given), then the down in its PTPC form, or row-parallel over `tp` ranks
/// when `tp > 1` (gate and up are column-parallel: exact as they are).
#[allow(clippy::too_many_arguments)]
fn mlp_by_ops<B: Backend + ?Sized>(
    be: &B,
    x: &[f32],
    rows: usize,
    m: &crate::weights::MlpWeights,
    c: &ModelConfig,
    [pg, pu, pd]: [Option<&PtpcFp8>; 3],
    tp: usize,
    out: &mut [f32],
) -> Result<(), BackendError> {
    let width = m.gate.rows();
    let mut g = zeros(rows * width);
    let mut u = zeros(rows * width);
    linear_bf16(be, x, rows, &m.gate, pg, &mut g)?;
    linear_bf16(be, x, rows, &m.up, pu, &mut u)?;
    let mut act = zeros(rows * width);
    be.run_op(Op::SwiGlu {
        gate: &g,
        up: &u,
        alpha: c.swiglu_alpha,
        limit: c.swiglu_limit,
        out: &mut act,
    })?;
    if tp > 1 {
        row_parallel(be, &act, rows, &m.down, tp, out)
    } else {
        linear_bf16(be, &act, rows, &m.down, pd, out)
    }
}

/// Routed experts by expert parallel plus the shared expert by tensor
/// parallel: `out[t] = (sum over ranks r, in order, of the rank's sum over
/// its chosen experts e ascending of f32(w_e * o_e)) + shared`, each expert
/// run once on the rows that chose it (as `Op::Experts` runs them).
#[allow(clippy::too_many_arguments)]
fn experts_ep<B: Backend + ?Sized>(
    be: &B,
    x: &[f32],
    rows: usize,
    moe: &crate::weights::MoeWeights,
    ids: &[i32],
    wts: &[f32],
    k: usize,
    c: &ModelConfig,
    tp: usize,
    out: &mut [f32],
) -> Result<(), BackendError> {
    let (ne, h) = (moe.experts.len(), c.hidden_size);
    if !ne.is_multiple_of(tp) {
        return Err(shape_err(format!(
            "expert parallel {tp}: {ne} routed experts do not split evenly"
        )));
    }
    let per = ne / tp;
    // each chosen expert once, on its rows (ascending)
    let mut groups: Vec<Vec<usize>> = vec![Vec::new(); ne];
    for t in 0..rows {
        for &e in &ids[t * k..(t + 1) * k] {
            let e = usize::try_from(e)
                .ok()
                .filter(|&e| e < ne)
                .ok_or_else(|| shape_err(format!("router chose expert {e} of {ne}")))?;
            groups[e].push(t);
        }
    }
    let mut outs: Vec<Vec<f32>> = vec![Vec::new(); ne];
    for (e, rs) in groups.iter().enumerate() {
        if rs.is_empty() {
            continue;
        }
        let mut xe = Vec::with_capacity(rs.len() * h);
        for &t in rs {
            xe.extend_from_slice(&x[t * h..(t + 1) * h]);
        }
        let mut ye = zeros(rs.len() * h);
        be.run_op(Op::Mlp {
            x: &xe,
            rows: rs.len(),
            w: &moe.experts[e],
            alpha: c.swiglu_alpha,
            limit: c.swiglu_limit,
            out: &mut ye,
        })?;
        outs[e] = ye;
    }
    let mut cursor = vec![0usize; ne];
    out.fill(0.0);
    let mut part = zeros(h);
    for t in 0..rows {
        let mut chosen: Vec<(usize, f32)> = (0..k)
            .map(|i| (ids[t * k + i] as usize, wts[t * k + i]))
            .collect();
        chosen.sort_by_key(|&(e, _)| e);
        let o = &mut out[t * h..(t + 1) * h];
        for r in 0..tp {
            part.fill(0.0);
            for &(e, we) in chosen.iter().filter(|(e, _)| e / per == r) {
                let i = cursor[e];
                cursor[e] += 1;
                for (a, &v) in part.iter_mut().zip(&outs[e][i * h..(i + 1) * h]) {
                    *a += we * v;
                }
            }
            // the all-reduce, in rank order
            for (a, &p) in o.iter_mut().zip(part.iter()) {
                *a += p;
            }
        }
    }
    if let Some(sw) = &moe.shared {
        let mut sh = zeros(rows * h);
        mlp_by_ops(be, x, rows, sw, c, [None; 3], tp, &mut sh)?;
        for (a, &v) in out.iter_mut().zip(&sh) {
            *a += v;
        }
    }
    Ok(())
}
