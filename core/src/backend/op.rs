//! `Op`: the LLM-level operations every backend runs (`Backend::run_op`), so
//! each can be compared with the CPU reference on its own, the way ggml's
//! test-backend-ops does. Inputs are borrowed host slices, outputs are
//! `&mut` host slices the caller sized; shapes are row-major and named in
//! each variant's doc. MODEL.md section numbers say what each computes.

use alloc::vec::Vec;

use crate::config::IndexSelection;
use crate::formats::{MxElem, MxTensor, Nvfp4Tensor, ScaleRule};
use crate::kv::CacheTensor;
use crate::sample::SampleParams;
use crate::weights::{LinearWeight, MlpWeights, MoeWeights};

use super::StepBatch;

/// How a linear layer's input row is presented to the weight (MODEL.md 2, 5).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum LinearInput {
    /// Rounded to bf16 (every linear layer but the router).
    #[default]
    Bf16,
    /// Used as f32 (the router: `h2` as f32).
    F32,
    /// MXFP4-quantized per 32 along K with the `even` scale rule
    /// (routed experts in `ActMode::Mxfp4`).
    Mxfp4,
}

/// Expert activation mode (MODEL.md 5).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum ActMode {
    /// w4a16: expert inputs stay bf16 (the default).
    #[default]
    Bf16,
    /// w4a4: the input row of each routed-expert GEMM is MXFP4-quantized
    /// (`even` rule); shared expert and dense MLPs are not.
    Mxfp4,
}

impl ActMode {
    /// Parse the command-line spelling (`bf16`, `mxfp4`).
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "bf16" => Some(ActMode::Bf16),
            "mxfp4" => Some(ActMode::Mxfp4),
            _ => None,
        }
    }
}

/// Block selection handed to sparse attention.
#[derive(Clone, Copy, Debug)]
pub struct BlockSelection<'a> {
    /// `[kv_heads, T, topk]` block ids, ascending, -1 padded.
    pub blocks: &'a [i32],
    pub topk: usize,
    /// Positions per index block.
    pub block_size: usize,
}

/// One operation. Every variant's outputs are fully overwritten.
pub enum Op<'a> {
    /// `out[t] = f32(table[tokens[t]])` (`[T, H]`), no scaling.
    Embed {
        table: &'a LinearWeight,
        tokens: &'a [u32],
        out: &'a mut [f32],
    },
    /// `out = x W^T`: `x` `[rows, W.cols]`, `out` `[rows, W.rows]`; products
    /// summed in f32 in a fixed order; output rounded to bf16 when
    /// `round_out` (every linear but router and LM head).
    Linear {
        x: &'a [f32],
        rows: usize,
        w: &'a LinearWeight,
        input: LinearInput,
        round_out: bool,
        out: &'a mut [f32],
    },
    /// Gemma RMSNorm of each `width`-wide row of `x`:
    /// `x / sqrt(mean(x^2) + eps) * (1 + w)`; per-head norms use
    /// `width = head_dim`. Optionally rounded to bf16.
    RmsNorm {
        x: &'a [f32],
        width: usize,
        weight: &'a [f32],
        eps: f32,
        round_out: bool,
        out: &'a mut [f32],
    },
    /// Partial NeoX RoPE in place on `x` `[T, heads, head_dim]` at
    /// `positions` (MODEL.md 3.4; f64 angle product, f32 sin/cos), then
    /// optionally bf16.
    Rope {
        x: &'a mut [f32],
        heads: usize,
        head_dim: usize,
        rotary_dim: usize,
        theta: f64,
        positions: &'a [u32],
        round_out: bool,
    },
    /// Write row `t` of `x` (`[T, cache.width]`) into slot `slots[t]`.
    CacheWrite {
        cache: &'a mut CacheTensor,
        slots: &'a [u32],
        x: &'a [f32],
    },
    /// Indexer block scores (MODEL.md 3.6): `q` `[T, heads, dim]`;
    /// `out` `[heads, T, nb]`: max over cached keys `j <= p` in block `b`
    /// of `q . k_j`, -inf for blocks with no visible key.
    IndexScores {
        q: &'a [f32],
        heads: usize,
        dim: usize,
        cache: &'a CacheTensor,
        step: &'a StepBatch,
        page_size: usize,
        block_size: usize,
        nb: usize,
        out: &'a mut [f32],
    },
    /// Block top-k (MODEL.md 3.6) of `scores` `[heads, T, nb]`: `out`
    /// `[kv_heads, T, topk]` ascending, -1 padded. Per-KV-head needs
    /// `heads == kv_heads`; shared takes the max over heads.
    BlockTopK {
        scores: &'a [f32],
        heads: usize,
        nb: usize,
        positions: &'a [u32],
        block_size: usize,
        topk: usize,
        init_blocks: usize,
        local_blocks: usize,
        selection: IndexSelection,
        kv_heads: usize,
        out: &'a mut [i32],
    },
    /// Attention (MODEL.md 3.7): `q` `[T, heads, head_dim]` over the paged
    /// `k`/`v` (`[slots, kv_heads * head_dim]`); full when `blocks` is None,
    /// else only positions in the selected blocks. `out` `[T, heads,
    /// head_dim]`, bf16.
    Attention {
        q: &'a [f32],
        heads: usize,
        kv_heads: usize,
        head_dim: usize,
        k: &'a CacheTensor,
        v: &'a CacheTensor,
        step: &'a StepBatch,
        page_size: usize,
        blocks: Option<BlockSelection<'a>>,
        out: &'a mut [f32],
    },
    /// Router (MODEL.md 3.10): f32 logits, sigmoid, top-k by
    /// `s + bias` (ties: lower id), `w = s / sum(s_chosen) * scaling`.
    /// `ids`/`weights` `[rows, top_k]`, ids ascending.
    Router {
        x: &'a [f32],
        rows: usize,
        router: &'a LinearWeight,
        bias: &'a [f32],
        top_k: usize,
        scaling: f32,
        ids: &'a mut [i32],
        weights: &'a mut [f32],
    },
    /// SwiGLU-OAI elementwise (MODEL.md 3.10): `g' = min(g, limit)`,
    /// `u' = clamp(u, -limit, limit)`, `((u' + 1) * g') * sigmoid(alpha * g')`,
    /// rounded to bf16.
    SwiGlu {
        gate: &'a [f32],
        up: &'a [f32],
        alpha: f32,
        limit: f32,
        out: &'a mut [f32],
    },
    /// A dense SwiGLU-OAI MLP (dense layers, shared expert): `x` `[rows, H]`,
    /// `out` `[rows, H]` (bf16 values).
    Mlp {
        x: &'a [f32],
        rows: usize,
        w: &'a MlpWeights,
        alpha: f32,
        limit: f32,
        out: &'a mut [f32],
    },
    /// Grouped routed experts + shared expert (MODEL.md 3.10):
    /// `out[t] = sum_e asc f32(w_e * Expert_e(x_t)) + Shared(x_t)`.
    Experts {
        x: &'a [f32],
        rows: usize,
        moe: &'a MoeWeights,
        ids: &'a [i32],
        weights: &'a [f32],
        top_k: usize,
        act: ActMode,
        alpha: f32,
        limit: f32,
        out: &'a mut [f32],
    },
    /// `acc += x` elementwise (residual adds).
    Add { acc: &'a mut [f32], x: &'a [f32] },
    /// Sample one token per row of `logits` (`[rows, vocab]`), keyed by
    /// `(params[r].seed, positions[r])` (MODEL.md 4).
    Sample {
        logits: &'a [f32],
        vocab: usize,
        params: &'a [SampleParams],
        positions: &'a [u32],
        out: &'a mut [u32],
    },
    /// MX-quantize `x` `[rows, cols]`.
    QuantizeMx {
        x: &'a [f32],
        rows: usize,
        cols: usize,
        elem: MxElem,
        rule: ScaleRule,
        out: &'a mut Option<MxTensor>,
    },
    /// NVFP4-quantize `x` `[rows, cols]` (one global scale).
    QuantizeNvfp4 {
        x: &'a [f32],
        rows: usize,
        cols: usize,
        out: &'a mut Option<Nvfp4Tensor>,
    },
    /// Decode any weight to f32 `[rows, cols]`.
    Dequantize {
        w: &'a LinearWeight,
        out: &'a mut [f32],
    },
    /// NVFP4 -> MXFP4 (FORMATS.md Conversions).
    ConvertNvfp4ToMxfp4 {
        w: &'a Nvfp4Tensor,
        rule: ScaleRule,
        out: &'a mut Option<MxTensor>,
    },
    /// Fake-quantize activation rows to MXFP4 (`even` rule) and back to f32:
    /// the values a `LinearInput::Mxfp4` GEMM sees.
    ActQuantMxfp4 { x: &'a [f32], out: &'a mut [f32] },
}

impl Op<'_> {
    /// Short name for errors and logs.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Embed { .. } => "embed",
            Op::Linear { .. } => "linear",
            Op::RmsNorm { .. } => "rmsnorm",
            Op::Rope { .. } => "rope",
            Op::CacheWrite { .. } => "cache_write",
            Op::IndexScores { .. } => "index_scores",
            Op::BlockTopK { .. } => "block_topk",
            Op::Attention { .. } => "attention",
            Op::Router { .. } => "router",
            Op::SwiGlu { .. } => "swiglu",
            Op::Mlp { .. } => "mlp",
            Op::Experts { .. } => "experts",
            Op::Add { .. } => "add",
            Op::Sample { .. } => "sample",
            Op::QuantizeMx { .. } => "quantize_mx",
            Op::QuantizeNvfp4 { .. } => "quantize_nvfp4",
            Op::Dequantize { .. } => "dequantize",
            Op::ConvertNvfp4ToMxfp4 { .. } => "convert_nvfp4_to_mxfp4",
            Op::ActQuantMxfp4 { .. } => "act_quant_mxfp4",
        }
    }
}

/// Convenience: an owned vector of `n` zeros (used by the default forward).
pub(crate) fn zeros(n: usize) -> Vec<f32> {
    alloc::vec![0.0; n]
}
