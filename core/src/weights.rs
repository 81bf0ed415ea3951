//! Typed model weights: what the checkpoint loader produces and every
//! backend consumes. Shapes follow MODEL.md section 7 (`[out, in]`,
//! row-major, quantization blocks along `in`).

use alloc::vec::Vec;

use crate::config::ModelConfig;
use crate::formats::convert::PtpcFp8;
use crate::formats::{MxTensor, Nvfp4Tensor};

/// A `[rows, cols]` (`[out, in]`) weight matrix in its stored format.
#[derive(Clone, Debug, PartialEq)]
pub enum LinearWeight {
    /// bf16 bits, row-major.
    Bf16 {
        rows: usize,
        cols: usize,
        data: Vec<u16>,
    },
    /// f32, row-major (router weights).
    F32 {
        rows: usize,
        cols: usize,
        data: Vec<f32>,
    },
    /// MXFP4 or MXFP8 (E4M3 / E5M2).
    Mx(MxTensor),
    /// NVFP4 with its global scale.
    Nvfp4(Nvfp4Tensor),
}

impl LinearWeight {
    pub fn rows(&self) -> usize {
        match self {
            LinearWeight::Bf16 { rows, .. } | LinearWeight::F32 { rows, .. } => *rows,
            LinearWeight::Mx(t) => t.rows(),
            LinearWeight::Nvfp4(t) => t.rows(),
        }
    }
    pub fn cols(&self) -> usize {
        match self {
            LinearWeight::Bf16 { cols, .. } | LinearWeight::F32 { cols, .. } => *cols,
            LinearWeight::Mx(t) => t.cols(),
            LinearWeight::Nvfp4(t) => t.cols(),
        }
    }
}

/// The indexer of a sparse layer.
#[derive(Clone, Debug, PartialEq)]
pub struct IndexerWeights {
    /// `index_q_proj`: `[index_n_heads * index_head_dim, H]`.
    pub q: LinearWeight,
    /// `index_k_proj`: `[index_head_dim, H]`.
    pub k: LinearWeight,
    /// `index_q_norm`, width `index_head_dim` (Gemma: multiplies by `1 + w`).
    pub q_norm: Vec<f32>,
    pub k_norm: Vec<f32>,
    /// FP8 index-cache scale (default 1.0).
    pub k_scale: f32,
}

/// Self-attention of one layer.
#[derive(Clone, Debug, PartialEq)]
pub struct AttnWeights {
    pub q: LinearWeight,
    pub k: LinearWeight,
    pub v: LinearWeight,
    pub o: LinearWeight,
    /// Per-head q/k norms of width `head_dim`, shared by all heads.
    pub q_norm: Vec<f32>,
    pub k_norm: Vec<f32>,
    /// Present exactly on sparse layers.
    pub indexer: Option<IndexerWeights>,
    /// FP8 KV-cache scales (checkpoint `k_scale` / `v_scale`, default 1.0).
    pub k_scale: f32,
    pub v_scale: f32,
}

/// A SwiGLU-OAI MLP: gate (w1), up (w3), down (w2).
#[derive(Clone, Debug, PartialEq)]
pub struct MlpWeights {
    pub gate: LinearWeight,
    pub up: LinearWeight,
    pub down: LinearWeight,
}

/// A mixture-of-experts FFN.
#[derive(Clone, Debug, PartialEq)]
pub struct MoeWeights {
    /// `[experts, H]`, F32 or Bf16; logits stay f32.
    pub router: LinearWeight,
    /// `e_score_correction_bias`, `[experts]`, for selection only.
    pub correction_bias: Vec<f32>,
    pub experts: Vec<MlpWeights>,
    pub shared: Option<MlpWeights>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum FfnWeights {
    Dense(MlpWeights),
    Moe(MoeWeights),
}

/// The linears of one layer converted at load to PTPC FP8 (ARCHITECTURE.md,
/// Online quantization); `None` where the option is off or the linear is
/// excluded. The stored weight stays in [`AttnWeights`] / [`MlpWeights`]
/// (tools and taps read it); a linear with a PTPC form here is computed from
/// that form only (`Backend::ptpc_linear`), never from the stored weight.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LayerPtpc {
    pub q: Option<PtpcFp8>,
    pub k: Option<PtpcFp8>,
    pub v: Option<PtpcFp8>,
    pub o: Option<PtpcFp8>,
    pub index_q: Option<PtpcFp8>,
    pub index_k: Option<PtpcFp8>,
    /// Dense-MLP gate / up / down (dense layers only).
    pub gate: Option<PtpcFp8>,
    pub up: Option<PtpcFp8>,
    pub down: Option<PtpcFp8>,
}

impl LayerPtpc {
    /// Whether any linear of the layer has a PTPC form.
    pub fn any(&self) -> bool {
        self.slots().iter().any(|s| s.is_some())
    }

    /// How many linears of the layer have a PTPC form.
    pub fn count(&self) -> usize {
        self.slots().iter().filter(|s| s.is_some()).count()
    }

    fn slots(&self) -> [&Option<PtpcFp8>; 9] {
        [
            &self.q,
            &self.k,
            &self.v,
            &self.o,
            &self.index_q,
            &self.index_k,
            &self.gate,
            &self.up,
            &self.down,
        ]
    }
}

/// One decoder layer.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerWeights {
    pub input_norm: Vec<f32>,
    pub post_attn_norm: Vec<f32>,
    pub attn: AttnWeights,
    pub ffn: FfnWeights,
    /// Online-quantized forms of some of the linears above (default: none).
    pub ptpc: LayerPtpc,
}

/// The whole text model.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelWeights {
    pub config: ModelConfig,
    /// `[vocab, H]` bf16 (rows are looked up, never multiplied).
    pub embed: LinearWeight,
    pub layers: Vec<LayerWeights>,
    pub final_norm: Vec<f32>,
    /// `[vocab, H]`.
    pub lm_head: LinearWeight,
}
