//! m3 CPU reference backend: MODEL.md implemented literally.
//!
//! Deterministic and bit-reproducible: work is split across rayon threads
//! only over independent outputs (output features, rows, heads, experts),
//! and every reduction has a fixed order (`numerics`), so the same step
//! gives identical bits with any thread count. This crate is the oracle every
//! other backend is compared with, op by op (`Backend::run_op`) and step by
//! step (the provided `Backend::forward`, which composes the ops).

pub mod attn;
pub mod linear;
pub mod moe;
pub mod norm;
pub mod numerics;
pub mod synthetic;

use m3_core::backend::{Backend, BackendError, LinearInput, Op};
use m3_core::formats::{convert, MxTensor, Nvfp4Tensor};
use m3_core::sample;
use m3_core::weights::LinearWeight;

/// The CPU reference backend. Runs on the current rayon pool (install a
/// pool of N threads around calls to choose the thread count).
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuBackend;

impl CpuBackend {
    pub fn new() -> Self {
        CpuBackend
    }
}

fn embed(table: &LinearWeight, tokens: &[u32], out: &mut [f32]) -> Result<(), BackendError> {
    let h = table.cols();
    for (t, &tok) in tokens.iter().enumerate() {
        let o = &mut out[t * h..(t + 1) * h];
        for lo in (0..h).step_by(numerics::BLOCK) {
            let hi = (lo + numerics::BLOCK).min(h);
            linear::decode_block(table, tok as usize, lo, &mut o[lo..hi]);
        }
    }
    Ok(())
}

impl Backend for CpuBackend {
    fn name(&self) -> &str {
        "cpu"
    }

    fn ptpc_linear(
        &self,
        x: &[f32],
        rows: usize,
        w: &m3_core::formats::convert::PtpcFp8,
        round_out: bool,
        out: &mut [f32],
    ) -> Result<(), BackendError> {
        linear::ptpc_linear(x, rows, w, round_out, out)
    }

    fn run_op(&self, op: Op<'_>) -> Result<(), BackendError> {
        op.check()?;
        match op {
            Op::Embed { table, tokens, out } => embed(table, tokens, out),
            Op::Linear {
                x,
                rows,
                w,
                input,
                round_out,
                out,
            } => linear::linear(x, rows, w, input, round_out, out),
            Op::RmsNorm {
                x,
                width,
                weight,
                eps,
                round_out,
                out,
            } => norm::rmsnorm(x, width, weight, eps, round_out, out),
            Op::Rope {
                x,
                heads,
                head_dim,
                rotary_dim,
                theta,
                positions,
                round_out,
            } => norm::rope(x, heads, head_dim, rotary_dim, theta, positions, round_out),
            Op::CacheWrite { cache, slots, x } => {
                let w = cache.width;
                for (t, &s) in slots.iter().enumerate() {
                    cache
                        .write(s as usize, &x[t * w..(t + 1) * w])
                        .map_err(|e| BackendError::Shape {
                            op: "cache_write",
                            what: e.to_string(),
                        })?;
                }
                Ok(())
            }
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
            } => attn::index_scores(q, heads, dim, cache, step, page_size, block_size, nb, out),
            Op::BlockTopK {
                scores,
                heads,
                nb,
                positions,
                block_size,
                topk,
                init_blocks,
                local_blocks,
                selection,
                kv_heads,
                out,
            } => attn::block_topk(
                scores,
                heads,
                nb,
                positions,
                block_size,
                topk,
                init_blocks,
                local_blocks,
                selection,
                kv_heads,
                out,
            ),
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
            } => attn::attention(
                q, heads, kv_heads, head_dim, k, v, step, page_size, blocks, out,
            ),
            Op::Router {
                x,
                rows,
                router,
                bias,
                top_k,
                scaling,
                ids,
                weights,
            } => moe::router(x, rows, router, bias, top_k, scaling, ids, weights),
            Op::SwiGlu {
                gate,
                up,
                alpha,
                limit,
                out,
            } => moe::swiglu(gate, up, alpha, limit, out),
            Op::Mlp {
                x,
                rows,
                w,
                alpha,
                limit,
                out,
            } => moe::mlp(x, rows, w, LinearInput::Bf16, alpha, limit, out),
            Op::Experts {
                x,
                rows,
                moe,
                ids,
                weights,
                top_k,
                act,
                alpha,
                limit,
                out,
            } => moe::experts(x, rows, moe, ids, weights, top_k, act, alpha, limit, out),
            Op::Add { acc, x } => {
                for (a, &b) in acc.iter_mut().zip(x) {
                    *a += b;
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
                for (r, o) in out.iter_mut().enumerate() {
                    *o = sample::sample(
                        &logits[r * vocab..(r + 1) * vocab],
                        &params[r],
                        positions[r],
                    );
                }
                Ok(())
            }
            Op::QuantizeMx {
                x,
                rows,
                cols,
                elem,
                rule,
                out,
            } => {
                *out = Some(MxTensor::quantize(x, rows, cols, elem, rule)?);
                Ok(())
            }
            Op::QuantizeNvfp4 { x, rows, cols, out } => {
                *out = Some(Nvfp4Tensor::quantize(x, rows, cols)?);
                Ok(())
            }
            Op::Dequantize { w, out } => linear::dequantize(w, out),
            Op::ConvertNvfp4ToMxfp4 { w, rule, out } => {
                *out = Some(convert::nvfp4_to_mxfp4(w, rule));
                Ok(())
            }
            Op::ActQuantMxfp4 { x, out } => {
                let cols = if x.len() % 32 == 0 { 32 } else { 0 };
                let bf: Vec<f32> = x.iter().map(|&v| numerics::bf16_round(v)).collect();
                out.copy_from_slice(&linear::act_quant_mxfp4(&bf, cols)?);
                Ok(())
            }
        }
    }
}
