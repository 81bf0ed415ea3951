//! The model's weights resident on the device, one allocation per tensor
//! (routed experts of a layer stacked into one allocation per projection so
//! a kernel can pick an expert chosen on the device by its id).

use std::sync::Arc;

use cudarc::driver::CudaContext;
use m3_core::config::ModelConfig;
use m3_core::formats::MxElem;
use m3_core::weights::{FfnWeights, LinearWeight, MlpWeights, ModelWeights};

use super::devmem::DevBuf;
use crate::error::{GpuError, Result};

/// Storage format of a device weight (the standard path's linear kernels).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WFmt {
    Bf16,
    /// MXFP8 E4M3 codes + E8M0 scale per 32 along `in`.
    Mxfp8,
    /// MXFP4 E2M1 codes (two a byte, low nibble first) + E8M0 scale per 32.
    Mxfp4,
    F32,
}

impl WFmt {
    /// Code bytes of a `[rows, cols]` matrix.
    pub fn code_bytes(self, rows: usize, cols: usize) -> usize {
        match self {
            WFmt::Bf16 => rows * cols * 2,
            WFmt::Mxfp8 => rows * cols,
            WFmt::Mxfp4 => rows * cols / 2,
            WFmt::F32 => rows * cols * 4,
        }
    }
    /// Scale bytes of a `[rows, cols]` matrix (E8M0 per 32, MX only).
    pub fn scale_bytes(self, rows: usize, cols: usize) -> usize {
        match self {
            WFmt::Mxfp8 | WFmt::Mxfp4 => rows * cols / 32,
            _ => 0,
        }
    }
    /// The tensor-core kernel entry point, where the format has one.
    pub fn mma_kernel(self) -> Option<&'static str> {
        match self {
            WFmt::Bf16 => Some("m3s_mma_bf16"),
            WFmt::Mxfp8 => Some("m3s_mma_e4m3"),
            WFmt::Mxfp4 => Some("m3s_mma_fp4"),
            WFmt::F32 => None,
        }
    }
}

/// `count` stacked `[rows, cols]` matrices of one format (count 1 for an
/// ordinary linear, the number of experts for a routed projection).
pub struct DevLinear {
    pub fmt: WFmt,
    pub rows: usize,
    pub cols: usize,
    pub count: usize,
    pub codes: DevBuf,
    pub scales: Option<DevBuf>,
}

impl DevLinear {
    /// Uninitialised storage.
    pub fn alloc(
        ctx: &Arc<CudaContext>,
        fmt: WFmt,
        rows: usize,
        cols: usize,
        count: usize,
    ) -> Result<Self> {
        if !cols.is_multiple_of(32) || rows == 0 {
            return Err(GpuError::input(
                "standard path weights",
                format!("[{rows}, {cols}]: in-dimension must be a multiple of 32"),
            ));
        }
        let codes = DevBuf::new(ctx, fmt.code_bytes(rows, cols) * count)?;
        let sb = fmt.scale_bytes(rows, cols) * count;
        let scales = if sb > 0 {
            Some(DevBuf::new(ctx, sb)?)
        } else {
            None
        };
        Ok(DevLinear {
            fmt,
            rows,
            cols,
            count,
            codes,
            scales,
        })
    }

    /// Bytes one matrix of the stack occupies (codes + scales).
    pub fn matrix_bytes(&self) -> usize {
        self.fmt.code_bytes(self.rows, self.cols) + self.fmt.scale_bytes(self.rows, self.cols)
    }

    /// Per-matrix strides (codes, scales) in bytes.
    pub fn strides(&self) -> (u64, u64) {
        (
            self.fmt.code_bytes(self.rows, self.cols) as u64,
            self.fmt.scale_bytes(self.rows, self.cols) as u64,
        )
    }

    /// Upload `ws` (all the same format and shape) as one stack.
    pub fn upload(ctx: &Arc<CudaContext>, name: &str, ws: &[&LinearWeight]) -> Result<Self> {
        let bad = |why: String| GpuError::input("standard path weights", format!("{name}: {why}"));
        let first = ws.first().ok_or_else(|| bad("no matrices".into()))?;
        let (rows, cols) = (first.rows(), first.cols());
        let fmt_of =
            |w: &LinearWeight| -> Result<WFmt> {
                Ok(match w {
                    LinearWeight::Bf16 { .. } => WFmt::Bf16,
                    LinearWeight::F32 { .. } => WFmt::F32,
                    LinearWeight::Mx(t) => match t.elem() {
                        MxElem::Fp4E2M1 => WFmt::Mxfp4,
                        MxElem::Fp8E4M3 => WFmt::Mxfp8,
                        MxElem::Fp8E5M2 => {
                            return Err(bad(
                                "MXFP8 E5M2 is not supported by the standard path".into()
                            ))
                        }
                    },
                    LinearWeight::Nvfp4(_) => return Err(bad(
                        "NVFP4 is not supported by the standard path (convert to MXFP4 at load)"
                            .into(),
                    )),
                })
            };
        let fmt = fmt_of(first)?;
        let mut codes: Vec<u8> = Vec::with_capacity(fmt.code_bytes(rows, cols) * ws.len());
        let mut scales: Vec<u8> = Vec::with_capacity(fmt.scale_bytes(rows, cols) * ws.len());
        for w in ws {
            if fmt_of(w)? != fmt || w.rows() != rows || w.cols() != cols {
                return Err(bad("stacked matrices differ in format or shape".into()));
            }
            match w {
                LinearWeight::Bf16 { data, .. } => {
                    codes.extend_from_slice(bytemuck::cast_slice(data))
                }
                LinearWeight::F32 { data, .. } => {
                    codes.extend_from_slice(bytemuck::cast_slice(data))
                }
                LinearWeight::Mx(t) => {
                    codes.extend_from_slice(t.codes());
                    scales.extend_from_slice(t.scales());
                }
                LinearWeight::Nvfp4(_) => {}
            }
        }
        if codes.len() != fmt.code_bytes(rows, cols) * ws.len()
            || scales.len() != fmt.scale_bytes(rows, cols) * ws.len()
        {
            return Err(bad(format!(
                "stored sizes {} / {} do not match [{rows}, {cols}] {fmt:?}",
                codes.len(),
                scales.len()
            )));
        }
        let mut d = Self::alloc(ctx, fmt, rows, cols, ws.len())?;
        d.codes = DevBuf::from_slice(ctx, &codes)?;
        if !scales.is_empty() {
            d.scales = Some(DevBuf::from_slice(ctx, &scales)?);
        }
        Ok(d)
    }
}

/// Gate (w1), up (w3), down (w2); stacked over experts for routed MLPs.
pub struct DevMlp {
    pub gate: DevLinear,
    pub up: DevLinear,
    pub down: DevLinear,
}

impl DevMlp {
    /// Bytes of one (expert's) MLP.
    pub fn matrix_bytes(&self) -> usize {
        self.gate.matrix_bytes() + self.up.matrix_bytes() + self.down.matrix_bytes()
    }
    fn upload(ctx: &Arc<CudaContext>, name: &str, ms: &[&MlpWeights]) -> Result<Self> {
        let g: Vec<&LinearWeight> = ms.iter().map(|m| &m.gate).collect();
        let u: Vec<&LinearWeight> = ms.iter().map(|m| &m.up).collect();
        let d: Vec<&LinearWeight> = ms.iter().map(|m| &m.down).collect();
        Ok(DevMlp {
            gate: DevLinear::upload(ctx, &format!("{name}.gate"), &g)?,
            up: DevLinear::upload(ctx, &format!("{name}.up"), &u)?,
            down: DevLinear::upload(ctx, &format!("{name}.down"), &d)?,
        })
    }
}

pub struct DevIndexer {
    pub q: DevLinear,
    pub k: DevLinear,
    pub q_norm: DevBuf,
    pub k_norm: DevBuf,
    pub k_scale: f32,
}

/// Size difference between the variants is irrelevant: one per layer.
#[allow(clippy::large_enum_variant)]
pub enum DevFfn {
    Dense(DevMlp),
    Moe {
        /// `[experts, H]`, f32 or bf16; logits f32.
        router: DevLinear,
        bias: DevBuf,
        /// Stacked over experts.
        experts: DevMlp,
        shared: Option<DevMlp>,
    },
}

pub struct DevLayer {
    pub input_norm: DevBuf,
    pub post_norm: DevBuf,
    pub q: DevLinear,
    pub k: DevLinear,
    pub v: DevLinear,
    pub o: DevLinear,
    pub q_norm: DevBuf,
    pub k_norm: DevBuf,
    pub indexer: Option<DevIndexer>,
    pub k_scale: f32,
    pub v_scale: f32,
    pub ffn: DevFfn,
}

/// The whole text model on the device.
pub struct DevModel {
    pub config: ModelConfig,
    /// `[vocab, H]` bf16.
    pub embed: DevBuf,
    pub layers: Vec<DevLayer>,
    pub final_norm: DevBuf,
    pub lm_head: DevLinear,
}

impl DevModel {
    /// Upload `m` once (weights stay resident).
    pub fn upload(ctx: &Arc<CudaContext>, m: &ModelWeights) -> Result<Self> {
        let c = &m.config;
        let embed = match &m.embed {
            LinearWeight::Bf16 { data, rows, cols }
                if *rows == c.vocab_size && *cols == c.hidden_size =>
            {
                DevBuf::from_slice(ctx, data)?
            }
            _ => {
                return Err(GpuError::input(
                    "standard path weights",
                    "embed_tokens: expected a bf16 [vocab, hidden] table",
                ))
            }
        };
        let f = |v: &Vec<f32>| DevBuf::from_slice(ctx, v);
        let mut layers = Vec::with_capacity(m.layers.len());
        for (l, lw) in m.layers.iter().enumerate() {
            let a = &lw.attn;
            let p = format!("layers.{l}");
            let lin = |n: &str, w: &LinearWeight| DevLinear::upload(ctx, &format!("{p}.{n}"), &[w]);
            let indexer = match &a.indexer {
                Some(ix) => Some(DevIndexer {
                    q: lin("index_q_proj", &ix.q)?,
                    k: lin("index_k_proj", &ix.k)?,
                    q_norm: f(&ix.q_norm)?,
                    k_norm: f(&ix.k_norm)?,
                    k_scale: ix.k_scale,
                }),
                None => None,
            };
            let ffn = match &lw.ffn {
                FfnWeights::Dense(d) => {
                    DevFfn::Dense(DevMlp::upload(ctx, &format!("{p}.mlp"), &[d])?)
                }
                FfnWeights::Moe(moe) => {
                    let ex: Vec<&MlpWeights> = moe.experts.iter().collect();
                    DevFfn::Moe {
                        router: lin("gate", &moe.router)?,
                        bias: f(&moe.correction_bias)?,
                        experts: DevMlp::upload(ctx, &format!("{p}.experts"), &ex)?,
                        shared: match &moe.shared {
                            Some(s) => Some(DevMlp::upload(ctx, &format!("{p}.shared"), &[s])?),
                            None => None,
                        },
                    }
                }
            };
            layers.push(DevLayer {
                input_norm: f(&lw.input_norm)?,
                post_norm: f(&lw.post_attn_norm)?,
                q: lin("q_proj", &a.q)?,
                k: lin("k_proj", &a.k)?,
                v: lin("v_proj", &a.v)?,
                o: lin("o_proj", &a.o)?,
                q_norm: f(&a.q_norm)?,
                k_norm: f(&a.k_norm)?,
                indexer,
                k_scale: a.k_scale,
                v_scale: a.v_scale,
                ffn,
            });
        }
        Ok(DevModel {
            config: c.clone(),
            embed,
            layers,
            final_norm: f(&m.final_norm)?,
            lm_head: DevLinear::upload(ctx, "lm_head", &[&m.lm_head])?,
        })
    }
}
