//! Online quantization at load (ARCHITECTURE.md, *Online quantization*):
//! PTPC FP8 (E4M3) forms of the attention linears (q / k / v / o and the
//! indexer's q / k) and the dense-MLP linears, made from the stored weights
//! after they are loaded.
//!
//! What is converted is decided by slot, not by name: the LM head, the
//! embeddings, the router, the routed experts and the shared expert are
//! never targets. Users exclude more by tensor-name pattern: a pattern
//! excludes every target whose weight name (`model.layers.3.self_attn.o_proj.weight`)
//! contains it (`o_proj`, `layers.0.`, `index_`). A pattern that excludes
//! no target is an error: a typo would otherwise silently convert what the
//! user meant to keep.
//!
//! Weights are quantized from their exact values: bf16, f32 and every MX
//! format decode exactly to f32 (an MXFP8 value `e4m3 * 2^(s-127)` has at
//! most 4 significant bits); NVFP4 weights are refused (not a target format
//! of the recipe, and `e2m1 * s * g` does not always fit an f32). A value
//! that is NaN or infinite after decoding (a NaN scale byte, an MX block
//! past f32's range) is refused, naming the tensor, row and column.

use std::string::{String, ToString};
use std::vec::Vec;

use rayon::prelude::*;

use super::names::TensorNames;
use crate::config::{AttnKind, MlpKind, ModelConfig};
use crate::formats::{bf16, convert, convert::PtpcFp8};
use crate::weights::{FfnWeights, LayerPtpc, LinearWeight, ModelWeights};

/// The online quantization schemes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OnlineQuantScheme {
    /// Per-token-per-channel FP8 E4M3: one f32 scale per weight row (output
    /// channel) made at load, one per activation row (token) at run time.
    PtpcFp8,
}

impl OnlineQuantScheme {
    /// The command-line spelling (`ptpc_fp8`).
    pub fn name(self) -> &'static str {
        match self {
            OnlineQuantScheme::PtpcFp8 => "ptpc_fp8",
        }
    }
}

/// An online quantization request: the scheme and the user's exclusions.
///
/// `Copy` like the rest of [`super::LoadOptions`] (a device loader copies
/// its options); so the patterns are one `&'static str`, comma-separated
/// (the CLI leaks its one flag value).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OnlineQuant {
    pub scheme: OnlineQuantScheme,
    /// Comma-separated tensor-name substrings; empty: no extra exclusion.
    pub exclude: &'static str,
}

impl OnlineQuant {
    /// PTPC FP8 with these exclusion patterns.
    pub fn ptpc_fp8(exclude: &'static str) -> Self {
        OnlineQuant {
            scheme: OnlineQuantScheme::PtpcFp8,
            exclude,
        }
    }

    /// The exclusion patterns (trimmed, empty pieces dropped).
    pub fn patterns(&self) -> impl Iterator<Item = &'static str> {
        self.exclude
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
    }

    /// Whether `name` is excluded by a pattern.
    pub fn excludes(&self, name: &str) -> bool {
        self.patterns().any(|p| name.contains(p))
    }
}

/// Which linear of a layer a target is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Slot {
    Q,
    K,
    V,
    O,
    IndexQ,
    IndexK,
    Gate,
    Up,
    Down,
}

/// One linear that online quantization converts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    pub layer: usize,
    pub slot: Slot,
    /// The weight's tensor name.
    pub name: String,
}

/// An online-quantization failure, naming the tensor at fault.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum OnlineQuantError {
    #[error("tensor `{tensor}`: PTPC FP8 needs finite weights, but row {row}, column {col} is {value} after decoding")]
    NonFinite {
        tensor: String,
        row: usize,
        col: usize,
        value: f32,
    },
    #[error("tensor `{tensor}`: PTPC FP8 from {format} weights is not supported (bf16, f32, MXFP4 and MXFP8 are); exclude it with --online-quant-exclude")]
    Format {
        tensor: String,
        format: &'static str,
    },
    #[error("--online-quant-exclude pattern `{pattern}` matches none of the {targets} linears that PTPC FP8 converts (attention q/k/v/o, index_q/k, dense-MLP gate/up/down)")]
    UnusedPattern { pattern: String, targets: usize },
}

impl OnlineQuantError {
    /// The tensor at fault, if one is.
    pub fn tensor(&self) -> Option<&str> {
        match self {
            OnlineQuantError::NonFinite { tensor, .. }
            | OnlineQuantError::Format { tensor, .. } => Some(tensor),
            OnlineQuantError::UnusedPattern { .. } => None,
        }
    }
}

/// Every linear of a model of config `c` that PTPC would convert before exclusions, in layer
/// then slot order.
fn candidates(c: &ModelConfig, names: TensorNames) -> Vec<Target> {
    let mut out = Vec::new();
    for l in 0..c.num_hidden_layers {
        let ln = names.layer(l);
        let mut push = |slot, name: String| {
            out.push(Target {
                layer: l,
                slot,
                name,
            })
        };
        push(Slot::Q, ln.q_proj());
        push(Slot::K, ln.k_proj());
        push(Slot::V, ln.v_proj());
        push(Slot::O, ln.o_proj());
        if c.attn_kinds[l] == AttnKind::Sparse {
            push(Slot::IndexQ, ln.index_q_proj());
            push(Slot::IndexK, ln.index_k_proj());
        }
        if c.mlp_kinds[l] == MlpKind::Dense {
            let m = ln.dense_mlp();
            push(Slot::Gate, m.gate());
            push(Slot::Up, m.up());
            push(Slot::Down, m.down());
        }
    }
    out
}

/// The linears `oq` converts: the candidates less the excluded ones. Errors
/// on a pattern that excludes no candidate.
pub fn targets(
    c: &ModelConfig,
    names: TensorNames,
    oq: &OnlineQuant,
) -> Result<Vec<Target>, OnlineQuantError> {
    let all = candidates(c, names);
    for p in oq.patterns() {
        if !all.iter().any(|t| t.name.contains(p)) {
            return Err(OnlineQuantError::UnusedPattern {
                pattern: p.to_string(),
                targets: all.len(),
            });
        }
    }
    Ok(all.into_iter().filter(|t| !oq.excludes(&t.name)).collect())
}

/// Whether weight `name` of a model of config `c` is a target of `oq`
/// (before the pattern check of [`targets`]).
pub fn is_target(c: &ModelConfig, names: TensorNames, oq: &OnlineQuant, name: &str) -> bool {
    !oq.excludes(name) && candidates(c, names).iter().any(|t| t.name == name)
}

/// The stored weight of `slot` in layer `l` (`None` if the layer lacks it).
fn stored(w: &ModelWeights, l: usize, slot: Slot) -> Option<&LinearWeight> {
    let lw = w.layers.get(l)?;
    let a = &lw.attn;
    let dense = match &lw.ffn {
        FfnWeights::Dense(m) => Some(m),
        FfnWeights::Moe(_) => None,
    };
    match slot {
        Slot::Q => Some(&a.q),
        Slot::K => Some(&a.k),
        Slot::V => Some(&a.v),
        Slot::O => Some(&a.o),
        Slot::IndexQ => a.indexer.as_ref().map(|i| &i.q),
        Slot::IndexK => a.indexer.as_ref().map(|i| &i.k),
        Slot::Gate => dense.map(|m| &m.gate),
        Slot::Up => dense.map(|m| &m.up),
        Slot::Down => dense.map(|m| &m.down),
    }
}

fn slot_mut(p: &mut LayerPtpc, slot: Slot) -> &mut Option<PtpcFp8> {
    match slot {
        Slot::Q => &mut p.q,
        Slot::K => &mut p.k,
        Slot::V => &mut p.v,
        Slot::O => &mut p.o,
        Slot::IndexQ => &mut p.index_q,
        Slot::IndexK => &mut p.index_k,
        Slot::Gate => &mut p.gate,
        Slot::Up => &mut p.up,
        Slot::Down => &mut p.down,
    }
}

/// PTPC FP8 form of one stored weight (`name` for errors): per row, the
/// exact values, `scale = f32(amax / 448)` (zero row: 1.0), codes
/// `encode_sat_e4m3(w / scale)` with the quotient exact. Rows in parallel.
pub fn quantize_weight(name: &str, w: &LinearWeight) -> Result<PtpcFp8, OnlineQuantError> {
    let (rows, cols) = (w.rows(), w.cols());
    // Row decoder: exact f32 values of row `r` into `buf`.
    let decode = |r: usize, buf: &mut [f32]| match w {
        LinearWeight::Bf16 { data, .. } => {
            for (o, &b) in buf.iter_mut().zip(&data[r * cols..(r + 1) * cols]) {
                *o = bf16::to_f32(b);
            }
        }
        LinearWeight::F32 { data, .. } => buf.copy_from_slice(&data[r * cols..(r + 1) * cols]),
        LinearWeight::Mx(t) => t.dequantize_row(r, buf),
        LinearWeight::Nvfp4(_) => unreachable!("refused below"),
    };
    if let LinearWeight::Nvfp4(_) = w {
        return Err(OnlineQuantError::Format {
            tensor: name.to_string(),
            format: "NVFP4",
        });
    }
    let mut codes = std::vec![0u8; rows * cols];
    let mut scales = std::vec![1.0f32; rows];
    if cols > 0 {
        codes
            .par_chunks_mut(cols)
            .zip(scales.par_iter_mut())
            .enumerate()
            .try_for_each_init(
                || std::vec![0f32; cols],
                |buf, (r, (q, s))| {
                    decode(r, buf);
                    if let Some((col, &value)) =
                        buf.iter().enumerate().find(|(_, v)| !v.is_finite())
                    {
                        return Err(OnlineQuantError::NonFinite {
                            tensor: name.to_string(),
                            row: r,
                            col,
                            value,
                        });
                    }
                    *s = convert::ptpc_quantize_row(buf, q);
                    Ok(())
                },
            )?;
    }
    Ok(PtpcFp8 {
        rows,
        cols,
        codes,
        scales,
    })
}

/// Convert every target of `oq` in `w` (tensors in parallel, rows in
/// parallel within each), filling each layer's [`LayerPtpc`]. Returns how
/// many linears were converted. The error of the first failing target in
/// target order is returned, so the message does not depend on scheduling.
pub fn apply(
    w: &mut ModelWeights,
    names: TensorNames,
    oq: &OnlineQuant,
) -> Result<usize, OnlineQuantError> {
    let OnlineQuantScheme::PtpcFp8 = oq.scheme;
    let list = targets(&w.config, names, oq)?;
    let made: Vec<Result<Option<PtpcFp8>, OnlineQuantError>> = list
        .par_iter()
        .map(|t| match stored(w, t.layer, t.slot) {
            Some(lw) => quantize_weight(&t.name, lw).map(Some),
            None => Ok(None),
        })
        .collect();
    let mut n = 0;
    for (t, r) in list.iter().zip(made) {
        if let Some(q) = r? {
            *slot_mut(&mut w.layers[t.layer].ptpc, t.slot) = Some(q);
            n += 1;
        }
    }
    Ok(n)
}
