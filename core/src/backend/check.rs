//! `Op::check`: the argument and shape validation every backend runs before
//! an op (lengths, divisibility, ids in range, block selections, step
//! tables), written once so the backends only keep their own limits.

use alloc::format;
use alloc::string::String;

use crate::config::IndexSelection;
use crate::kv::CacheTensor;
use crate::weights::{LinearWeight, MlpWeights};

use super::{BackendError, Op, StepBatch};

fn shape(op: &'static str, what: String) -> BackendError {
    BackendError::Shape { op, what }
}

/// Every position a row may read (`0..=p`) maps through its sequence's
/// block table to a slot inside a cache of `slots` slots, so no op indexes
/// out of bounds on a malformed step.
fn check_step(
    op: &'static str,
    step: &StepBatch,
    page: usize,
    slots: usize,
) -> Result<(), BackendError> {
    let rows = step.rows();
    if page == 0 || step.positions.len() != rows || step.row_seq.len() != rows {
        return Err(shape(
            op,
            "step arrays do not have one entry per row".into(),
        ));
    }
    for t in 0..rows {
        let Some(seq) = step.seqs.get(step.row_seq[t] as usize) else {
            return Err(shape(op, format!("row {t} names a missing sequence")));
        };
        let p = step.positions[t] as usize;
        let pages = p / page + 1;
        if seq.block_table.len() < pages {
            return Err(shape(
                op,
                format!("row {t} at position {p} is past its block table"),
            ));
        }
        if let Some(&bad) = seq.block_table[..pages]
            .iter()
            .find(|&&pg| (pg as usize + 1) * page > slots)
        {
            return Err(shape(
                op,
                format!("row {t}: page {bad} is outside the cache ({slots} slots)"),
            ));
        }
    }
    Ok(())
}

/// Gate, up and down form an MLP; returns its intermediate width.
fn check_mlp(w: &MlpWeights) -> Result<usize, BackendError> {
    let width = w.gate.rows();
    if w.up.rows() != width || w.down.cols() != width || w.gate.cols() != w.up.cols() {
        return Err(shape(
            "mlp",
            format!(
                "gate {}x{}, up {}x{}, down {}x{} do not form an MLP",
                w.gate.rows(),
                w.gate.cols(),
                w.up.rows(),
                w.up.cols(),
                w.down.rows(),
                w.down.cols()
            ),
        ));
    }
    Ok(width)
}

fn check_embed(table: &LinearWeight, tokens: &[u32], out: &[f32]) -> Result<(), BackendError> {
    let (vocab, h) = (table.rows(), table.cols());
    if out.len() != tokens.len() * h {
        return Err(shape(
            "embed",
            format!(
                "out {} values for {} tokens of width {h}",
                out.len(),
                tokens.len()
            ),
        ));
    }
    if let Some((t, &tok)) = tokens
        .iter()
        .enumerate()
        .find(|(_, &k)| k as usize >= vocab)
    {
        return Err(shape(
            "embed",
            format!("token {tok} at row {t} is outside the vocabulary ({vocab})"),
        ));
    }
    Ok(())
}

fn check_cache_write(cache: &CacheTensor, slots: &[u32], x: &[f32]) -> Result<(), BackendError> {
    let w = cache.width;
    if w == 0 || x.len() != slots.len() * w {
        return Err(shape(
            "cache_write",
            format!("x {} values for {} slots of {w}", x.len(), slots.len()),
        ));
    }
    let n = cache.slots();
    if let Some(&s) = slots.iter().find(|&&s| s as usize >= n) {
        return Err(shape(
            "cache_write",
            format!("slot {s} outside the cache ({n} slots)"),
        ));
    }
    Ok(())
}

impl Op<'_> {
    /// Check every argument of the op against the shapes and ranges its
    /// variant documents (the same errors for every backend). Backends call
    /// it first in `run_op` and then check only their own limits.
    pub fn check(&self) -> Result<(), BackendError> {
        match self {
            Op::Embed { table, tokens, out } => check_embed(table, tokens, out),
            Op::Linear {
                x, rows, w, out, ..
            } => {
                let (rows, n, k) = (*rows, w.rows(), w.cols());
                if x.len() != rows * k || out.len() != rows * n {
                    return Err(shape(
                        "linear",
                        format!(
                            "x has {} values, out {}; expected [{rows}, {k}] and [{rows}, {n}]",
                            x.len(),
                            out.len()
                        ),
                    ));
                }
                Ok(())
            }
            Op::RmsNorm {
                x,
                width,
                weight,
                out,
                ..
            } => {
                let width = *width;
                if width == 0
                    || weight.len() != width
                    || !x.len().is_multiple_of(width)
                    || out.len() != x.len()
                {
                    return Err(shape(
                        "rmsnorm",
                        format!(
                            "x {} / out {} values, weight {} for width {width}",
                            x.len(),
                            out.len(),
                            weight.len()
                        ),
                    ));
                }
                Ok(())
            }
            Op::Rope {
                x,
                heads,
                head_dim,
                rotary_dim,
                positions,
                ..
            } => {
                let (heads, head_dim, rotary_dim) = (*heads, *head_dim, *rotary_dim);
                if !rotary_dim.is_multiple_of(2)
                    || rotary_dim > head_dim
                    || x.len() != positions.len() * heads * head_dim
                {
                    return Err(shape(
                        "rope",
                        format!(
                            "x {} values for {} rows of {heads}x{head_dim}, rotary_dim {rotary_dim}",
                            x.len(),
                            positions.len()
                        ),
                    ));
                }
                Ok(())
            }
            Op::CacheWrite { cache, slots, x } => check_cache_write(cache, slots, x),
            Op::IndexScores {
                q,
                heads,
                dim,
                cache,
                step,
                page_size,
                block_size,
                nb,
                out,
            } => {
                let (t_rows, heads, dim, nb) = (step.rows(), *heads, *dim, *nb);
                if q.len() != t_rows * heads * dim
                    || out.len() != heads * t_rows * nb
                    || cache.width != dim
                    || *block_size == 0
                {
                    return Err(shape(
                        "index_scores",
                        format!(
                            "q {} / out {} values for T {t_rows}, heads {heads}, dim {dim}, nb {nb}",
                            q.len(),
                            out.len()
                        ),
                    ));
                }
                check_step("index_scores", step, *page_size, cache.slots())
            }
            Op::BlockTopK {
                scores,
                heads,
                nb,
                positions,
                block_size,
                topk,
                selection,
                kv_heads,
                out,
                ..
            } => {
                let (t_rows, heads, nb, bs) = (positions.len(), *heads, *nb, *block_size);
                let kv_heads = *kv_heads;
                if scores.len() != heads * t_rows * nb
                    || out.len() != kv_heads * t_rows * topk
                    || bs == 0
                {
                    return Err(shape(
                        "block_topk",
                        format!("scores {} / out {} values", scores.len(), out.len()),
                    ));
                }
                if positions.iter().any(|&p| p as usize / bs >= nb) {
                    return Err(shape(
                        "block_topk",
                        format!("a position is past the {nb} scored blocks"),
                    ));
                }
                if *selection == IndexSelection::PerKvHead && heads != kv_heads {
                    return Err(shape(
                        "block_topk",
                        format!("per-KV-head selection needs index_n_heads ({heads}) == num_key_value_heads ({kv_heads})"),
                    ));
                }
                Ok(())
            }
            Op::Attention {
                q,
                heads,
                kv_heads,
                head_dim,
                k,
                v,
                step,
                page_size,
                blocks,
                out,
            } => {
                let (t_rows, heads, kv_heads, d) = (step.rows(), *heads, *kv_heads, *head_dim);
                if kv_heads == 0
                    || !heads.is_multiple_of(kv_heads)
                    || q.len() != t_rows * heads * d
                    || out.len() != q.len()
                    || k.width != kv_heads * d
                    || v.width != kv_heads * d
                {
                    return Err(shape(
                        "attention",
                        format!(
                            "q {} / out {} values, cache width {}",
                            q.len(),
                            out.len(),
                            k.width
                        ),
                    ));
                }
                if let Some(bsel) = blocks {
                    if bsel.blocks.len() != kv_heads * t_rows * bsel.topk || bsel.block_size == 0 {
                        return Err(shape(
                            "attention",
                            format!("block selection has {} ids", bsel.blocks.len()),
                        ));
                    }
                }
                check_step("attention", step, *page_size, k.slots().min(v.slots()))
            }
            Op::Router {
                x,
                rows,
                router,
                bias,
                top_k,
                ids,
                weights,
                ..
            } => {
                let (rows, top_k, ne) = (*rows, *top_k, router.rows());
                if bias.len() != ne
                    || top_k == 0
                    || top_k > ne
                    || ids.len() != rows * top_k
                    || weights.len() != rows * top_k
                    || x.len() != rows * router.cols()
                {
                    return Err(shape(
                        "router",
                        format!(
                            "{ne} experts, bias {}, top_k {top_k}, ids {} for {rows} rows",
                            bias.len(),
                            ids.len()
                        ),
                    ));
                }
                Ok(())
            }
            Op::SwiGlu { gate, up, out, .. } => {
                if gate.len() != up.len() || out.len() != gate.len() {
                    return Err(shape(
                        "swiglu",
                        format!("gate {} up {} out {}", gate.len(), up.len(), out.len()),
                    ));
                }
                Ok(())
            }
            Op::Mlp {
                x, rows, w, out, ..
            } => {
                check_mlp(w)?;
                if x.len() != rows * w.gate.cols() || out.len() != rows * w.down.rows() {
                    return Err(shape(
                        "mlp",
                        format!("x {} / out {} values for {rows} rows", x.len(), out.len()),
                    ));
                }
                Ok(())
            }
            Op::Experts {
                x,
                rows,
                moe,
                ids,
                weights,
                top_k,
                out,
                ..
            } => {
                let (rows, top_k, ne) = (*rows, *top_k, moe.experts.len());
                if rows == 0 {
                    return Ok(());
                }
                let h = x.len() / rows;
                if x.len() != rows * h
                    || out.len() != rows * h
                    || ids.len() != rows * top_k
                    || weights.len() != rows * top_k
                {
                    return Err(shape(
                        "experts",
                        format!(
                            "x {} out {} ids {} for {rows} rows",
                            x.len(),
                            out.len(),
                            ids.len()
                        ),
                    ));
                }
                if let Some(&bad) = ids.iter().find(|&&e| e < 0 || e as usize >= ne) {
                    return Err(shape("experts", format!("expert id {bad} outside 0..{ne}")));
                }
                for e in moe.experts.iter().chain(moe.shared.iter()) {
                    check_mlp(e)?;
                    if e.gate.cols() != h || e.down.rows() != h {
                        return Err(shape(
                            "experts",
                            format!(
                                "expert of width {}x{} for hidden size {h}",
                                e.gate.cols(),
                                e.down.rows()
                            ),
                        ));
                    }
                }
                Ok(())
            }
            Op::Add { acc, x } => {
                if acc.len() != x.len() {
                    return Err(shape("add", format!("{} += {} values", acc.len(), x.len())));
                }
                Ok(())
            }
            Op::Sample {
                logits,
                vocab,
                params,
                positions,
                out,
            } => {
                let (rows, vocab) = (out.len(), *vocab);
                if vocab == 0
                    || logits.len() != rows * vocab
                    || params.len() != rows
                    || positions.len() != rows
                {
                    return Err(shape(
                        "sample",
                        format!("logits {} values, {rows} rows of {vocab}", logits.len()),
                    ));
                }
                Ok(())
            }
            Op::Dequantize { w, out } => {
                let (n, k) = (w.rows(), w.cols());
                if out.len() != n * k {
                    return Err(shape(
                        "dequantize",
                        format!("out has {} values, expected {n} x {k}", out.len()),
                    ));
                }
                Ok(())
            }
            Op::ActQuantMxfp4 { x, out } => {
                if out.len() != x.len() {
                    return Err(shape(
                        "act_quant_mxfp4",
                        format!("out {} for {} values", out.len(), x.len()),
                    ));
                }
                Ok(())
            }
            // The format constructors validate these.
            Op::QuantizeMx { .. } | Op::QuantizeNvfp4 { .. } | Op::ConvertNvfp4ToMxfp4 { .. } => {
                Ok(())
            }
        }
    }
}
