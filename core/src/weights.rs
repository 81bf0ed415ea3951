//! Typed model weights: what the checkpoint loader produces and every
//! backend consumes. Shapes follow MODEL.md section 7 (`[out, in]`,
//! row-major, quantization blocks along `in`).

use alloc::vec::Vec;

use crate::config::ModelConfig;
use crate::formats::convert::PtpcFp8;
use crate::formats::{FormatError, MxTensor, Nvfp4Tensor};

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

    /// Input features a column range of this weight must start and end on:
    /// its quantization block (32 for MX, 16 for NVFP4, 1 otherwise).
    pub fn col_block(&self) -> usize {
        match self {
            LinearWeight::Bf16 { .. } | LinearWeight::F32 { .. } => 1,
            LinearWeight::Mx(_) => crate::formats::mx::MxElem::BLOCK,
            LinearWeight::Nvfp4(_) => crate::formats::nvfp4::BLOCK,
        }
    }

    /// Input features `k0..k1` of every row, in the same format and with
    /// the same codes and scales (a row-parallel shard: the rank's slice of
    /// the input). `k0` and `k1` must lie on [`Self::col_block`] boundaries.
    pub fn cols_range(&self, k0: usize, k1: usize) -> Result<LinearWeight, FormatError> {
        let (rows, cols, blk) = (self.rows(), self.cols(), self.col_block());
        if k0 > k1 || k1 > cols || !k0.is_multiple_of(blk) || !k1.is_multiple_of(blk) {
            return Err(FormatError::BadLength {
                what: "column range (block-aligned, inside the weight)",
                rows,
                cols,
                expected: blk,
                got: k1.saturating_sub(k0),
            });
        }
        let w = k1 - k0;
        // elements [a, b) of each row of a row-major buffer of `stride` a row
        fn rows_of<T: Copy>(data: &[T], rows: usize, stride: usize, a: usize, b: usize) -> Vec<T> {
            let mut v = Vec::with_capacity(rows * (b - a));
            for r in 0..rows {
                v.extend_from_slice(&data[r * stride + a..r * stride + b]);
            }
            v
        }
        Ok(match self {
            LinearWeight::Bf16 { data, .. } => LinearWeight::Bf16 {
                rows,
                cols: w,
                data: rows_of(data, rows, cols, k0, k1),
            },
            LinearWeight::F32 { data, .. } => LinearWeight::F32 {
                rows,
                cols: w,
                data: rows_of(data, rows, cols, k0, k1),
            },
            LinearWeight::Mx(t) => {
                let e = t.elem();
                let (pc, p0, p1) = (e.packed_len(cols), e.packed_len(k0), e.packed_len(k1));
                let codes = rows_of(t.codes(), rows, pc, p0, p1);
                let scales = rows_of(t.scales(), rows, cols / blk, k0 / blk, k1 / blk);
                LinearWeight::Mx(MxTensor::from_parts(e, rows, w, codes, scales)?)
            }
            LinearWeight::Nvfp4(t) => {
                let codes = rows_of(t.codes(), rows, cols / 2, k0 / 2, k1 / 2);
                let scales = rows_of(t.scales(), rows, cols / blk, k0 / blk, k1 / blk);
                LinearWeight::Nvfp4(Nvfp4Tensor::from_parts(rows, w, codes, scales, t.global())?)
            }
        })
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::formats::{MxElem, ScaleRule};

    fn values(rows: usize, cols: usize) -> Vec<f32> {
        (0..rows * cols)
            .map(|i| ((i * 2_654_435_761usize) % 1000) as f32 / 250.0 - 2.0)
            .collect()
    }

    fn dense(w: &LinearWeight) -> Vec<f32> {
        match w {
            LinearWeight::Bf16 { data, .. } => data
                .iter()
                .map(|&b| crate::formats::bf16::to_f32(b))
                .collect(),
            LinearWeight::F32 { data, .. } => data.clone(),
            LinearWeight::Mx(t) => t.dequantize(),
            LinearWeight::Nvfp4(t) => t.dequantize(),
        }
    }

    /// A column range holds exactly those columns' values in every format
    /// (codes and scales sliced on block boundaries); a range off a block
    /// boundary or past the weight is an error, not a panic.
    #[test]
    fn cols_range_slices_every_format() {
        let (rows, cols) = (3, 128);
        let x = values(rows, cols);
        let ws = [
            LinearWeight::Bf16 {
                rows,
                cols,
                data: x
                    .iter()
                    .map(|&v| crate::formats::bf16::from_f32(v))
                    .collect(),
            },
            LinearWeight::F32 {
                rows,
                cols,
                data: x.clone(),
            },
            LinearWeight::Mx(
                MxTensor::quantize(&x, rows, cols, MxElem::Fp4E2M1, ScaleRule::Even).unwrap(),
            ),
            LinearWeight::Mx(
                MxTensor::quantize(&x, rows, cols, MxElem::Fp8E4M3, ScaleRule::Even).unwrap(),
            ),
            LinearWeight::Nvfp4(Nvfp4Tensor::quantize(&x, rows, cols).unwrap()),
        ];
        for w in &ws {
            let full = dense(w);
            let blk = w.col_block();
            for (k0, k1) in [(0, 64), (64, 128), (32, 96), (0, 128)] {
                let s = w.cols_range(k0, k1).expect("aligned range");
                assert_eq!((s.rows(), s.cols()), (rows, k1 - k0));
                let got = dense(&s);
                for r in 0..rows {
                    assert_eq!(
                        &got[r * (k1 - k0)..(r + 1) * (k1 - k0)],
                        &full[r * cols + k0..r * cols + k1],
                        "{w:?} rows {r} cols {k0}..{k1}"
                    );
                }
            }
            assert!(w.cols_range(0, 129).is_err());
            assert!(w.cols_range(64, 32).is_err());
            if blk > 1 {
                assert!(w.cols_range(blk / 2, 64).is_err(), "off a block boundary");
            }
        }
        // the check can fail: a shifted range holds other values
        let s = ws[2].cols_range(32, 96).unwrap();
        assert_ne!(&dense(&s)[..64], &dense(&ws[2])[..64]);
    }
}
