//! What a synthetic checkpoint holds: one [`Unit`] per logical weight (a
//! weight and, for quantized formats, its scale siblings), with the
//! distribution its values are drawn from.
//!
//! Scales, chosen so activations stay well conditioned through the layers:
//! - inputs of every linear (h after Gemma RMSNorm) have unit RMS, so
//!   "in" projections use `N(0, 1/fan_in)` and give unit-RMS outputs;
//! - projections that write into the residual (`o_proj`, MLP `down`) are
//!   further scaled by `1/sqrt(2 L)`, so the residual (embedding RMS 1)
//!   grows slowly, about `sqrt(2)` over the whole stack;
//! - RMSNorm weights are `N(0, 0.05^2)` (Gemma multiplies by `1 + w`);
//! - router weights are `N(0, (1.5/sqrt(H))^2)`: logits with std 1.5 so the
//!   sigmoid scores of different experts are well apart and near-ties are
//!   rare; `e_score_correction_bias` is `N(0, 0.01^2)`.

use std::string::String;
use std::vec::Vec;

use crate::checkpoint::names::{self, TensorNames};
use crate::checkpoint::writer::{Dtype, TensorEntry};
use crate::config::{AttnKind, MlpKind, ModelConfig};
use crate::dspark::{DsparkConfig, DsparkNames};

/// Storage format of the routed experts (`--experts`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ExpertFormat {
    Nvfp4,
    Mxfp4,
    Mxfp8,
    Bf16,
}

/// Storage format of the other linears: attention, indexer, dense MLP,
/// shared expert (`--dense`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DenseFormat {
    Mxfp8,
    Bf16,
}

/// How one logical weight is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Storage {
    Bf16,
    F32,
    /// E4M3 `weight` + U8 E8M0 `weight_scale_inv`.
    Mxfp8,
    /// U8 packed E2M1 `weight` + U8 E8M0 `weight_scale`.
    Mxfp4,
    /// U8 packed E2M1 `weight`, E4M3 `weight_scale`, F32 `weight_scale_2`
    /// and `input_scale` scalars.
    Nvfp4,
}

impl From<ExpertFormat> for Storage {
    fn from(f: ExpertFormat) -> Self {
        match f {
            ExpertFormat::Nvfp4 => Storage::Nvfp4,
            ExpertFormat::Mxfp4 => Storage::Mxfp4,
            ExpertFormat::Mxfp8 => Storage::Mxfp8,
            ExpertFormat::Bf16 => Storage::Bf16,
        }
    }
}

impl From<DenseFormat> for Storage {
    fn from(f: DenseFormat) -> Self {
        match f {
            DenseFormat::Mxfp8 => Storage::Mxfp8,
            DenseFormat::Bf16 => Storage::Bf16,
        }
    }
}

/// One logical weight: values `std * N(0, 1)` keyed by `(seed, name)`,
/// element `i` in row-major order, stored as `storage`.
#[derive(Clone, Debug, PartialEq)]
pub struct Unit {
    /// The `.weight` name (or the plain name of a non-weight tensor).
    pub name: String,
    /// `[len]` for vectors, `[rows, cols]` for matrices.
    pub shape: Vec<usize>,
    pub std: f64,
    pub storage: Storage,
}

impl Unit {
    fn new(name: String, shape: &[usize], std: f64, storage: Storage) -> Self {
        Unit {
            name,
            shape: shape.to_vec(),
            std,
            storage,
        }
    }
    /// Rows of the matrix view (1 for a vector).
    pub fn rows(&self) -> usize {
        if self.shape.len() == 2 {
            self.shape[0]
        } else {
            1
        }
    }
    /// Columns of the matrix view (the length of a vector).
    pub fn cols(&self) -> usize {
        self.shape.last().copied().unwrap_or(1)
    }
    /// The tensors this unit stores, in the order they are written.
    pub fn entries(&self) -> Vec<TensorEntry> {
        let (r, c) = (self.rows(), self.cols());
        let sib = |s: &str| names::sibling(&self.name, s);
        match self.storage {
            Storage::Bf16 => vec![TensorEntry::new(
                self.name.clone(),
                Dtype::BF16,
                &self.shape,
            )],
            Storage::F32 => vec![TensorEntry::new(self.name.clone(), Dtype::F32, &self.shape)],
            Storage::Mxfp8 => vec![
                TensorEntry::new(self.name.clone(), Dtype::F8E4M3, &[r, c]),
                TensorEntry::new(sib(names::WEIGHT_SCALE_INV), Dtype::U8, &[r, c / 32]),
            ],
            Storage::Mxfp4 => vec![
                TensorEntry::new(self.name.clone(), Dtype::U8, &[r, c / 2]),
                TensorEntry::new(sib(names::WEIGHT_SCALE), Dtype::U8, &[r, c / 32]),
            ],
            Storage::Nvfp4 => vec![
                TensorEntry::new(self.name.clone(), Dtype::U8, &[r, c / 2]),
                TensorEntry::new(sib(names::WEIGHT_SCALE), Dtype::F8E4M3, &[r, c / 16]),
                TensorEntry::new(sib(names::WEIGHT_SCALE_2), Dtype::F32, &[]),
                TensorEntry::new(sib(names::INPUT_SCALE), Dtype::F32, &[]),
            ],
        }
    }
}

/// Std of RMSNorm weights (Gemma adds 1).
pub const NORM_STD: f64 = 0.05;
/// Router logit std for unit-RMS inputs.
pub const ROUTER_LOGIT_STD: f64 = 1.5;
/// Std of `e_score_correction_bias`.
pub const BIAS_STD: f64 = 0.01;

fn inv_sqrt(n: usize) -> f64 {
    1.0 / (n as f64).sqrt()
}

/// Units of one SwiGLU MLP: gate/up `[w, H]`, down `[H, w]` scaled by `res`.
fn mlp_units(out: &mut Vec<Unit>, names3: [String; 3], h: usize, w: usize, res: f64, s: Storage) {
    let [g, u, d] = names3;
    out.push(Unit::new(g, &[w, h], inv_sqrt(h), s));
    out.push(Unit::new(u, &[w, h], inv_sqrt(h), s));
    out.push(Unit::new(d, &[h, w], inv_sqrt(w) * res, s));
}

/// Every unit of the target model, in file order (embedding, layers, final
/// norm, LM head), text weights under `language_model.`.
pub fn target_units(cfg: &ModelConfig, experts: ExpertFormat, dense: DenseFormat) -> Vec<Unit> {
    target_units_with(cfg, experts, dense, &[])
}

/// [`target_units`] with the attention and indexer projections of layers
/// `bf16_attn` in bf16 whatever `dense` says.
pub fn target_units_with(
    cfg: &ModelConfig,
    experts: ExpertFormat,
    dense: DenseFormat,
    bf16_attn: &[usize],
) -> Vec<Unit> {
    let n = TensorNames::new(true);
    let h = cfg.hidden_size;
    let res = inv_sqrt(2 * cfg.num_hidden_layers);
    let ds = Storage::from(dense);
    let es = Storage::from(experts);
    let qd = cfg.num_attention_heads * cfg.head_dim;
    let kvd = cfg.num_key_value_heads * cfg.head_dim;
    let mut u = vec![Unit::new(
        n.embed(),
        &[cfg.vocab_size, h],
        1.0,
        Storage::Bf16,
    )];
    for l in 0..cfg.num_hidden_layers {
        let ln = n.layer(l);
        // this layer's attention (and indexer) storage
        let ads = if bf16_attn.contains(&l) {
            Storage::Bf16
        } else {
            ds
        };
        u.push(Unit::new(
            ln.input_layernorm(),
            &[h],
            NORM_STD,
            Storage::Bf16,
        ));
        u.push(Unit::new(ln.q_proj(), &[qd, h], inv_sqrt(h), ads));
        u.push(Unit::new(ln.k_proj(), &[kvd, h], inv_sqrt(h), ads));
        u.push(Unit::new(ln.v_proj(), &[kvd, h], inv_sqrt(h), ads));
        u.push(Unit::new(ln.o_proj(), &[h, qd], inv_sqrt(qd) * res, ads));
        u.push(Unit::new(
            ln.q_norm(),
            &[cfg.head_dim],
            NORM_STD,
            Storage::Bf16,
        ));
        u.push(Unit::new(
            ln.k_norm(),
            &[cfg.head_dim],
            NORM_STD,
            Storage::Bf16,
        ));
        if cfg.attn_kinds.get(l) == Some(&AttnKind::Sparse) {
            let di = cfg.index_head_dim;
            u.push(Unit::new(
                ln.index_q_proj(),
                &[cfg.index_n_heads * di, h],
                inv_sqrt(h),
                ads,
            ));
            u.push(Unit::new(ln.index_k_proj(), &[di, h], inv_sqrt(h), ads));
            u.push(Unit::new(ln.index_q_norm(), &[di], NORM_STD, Storage::Bf16));
            u.push(Unit::new(ln.index_k_norm(), &[di], NORM_STD, Storage::Bf16));
        }
        u.push(Unit::new(
            ln.post_attention_layernorm(),
            &[h],
            NORM_STD,
            Storage::Bf16,
        ));
        match cfg.mlp_kinds.get(l) {
            Some(MlpKind::Moe) => {
                let e = cfg.num_local_experts;
                u.push(Unit::new(
                    ln.router(),
                    &[e, h],
                    ROUTER_LOGIT_STD * inv_sqrt(h),
                    Storage::F32,
                ));
                u.push(Unit::new(
                    ln.correction_bias(),
                    &[e],
                    BIAS_STD,
                    Storage::F32,
                ));
                for x in 0..e {
                    mlp_units(
                        &mut u,
                        ln.expert(x).all(),
                        h,
                        cfg.intermediate_size,
                        res,
                        es,
                    );
                }
                if cfg.shared_intermediate_size > 0 {
                    mlp_units(
                        &mut u,
                        ln.shared_expert().all(),
                        h,
                        cfg.shared_intermediate_size,
                        res,
                        ds,
                    );
                }
            }
            _ => mlp_units(
                &mut u,
                ln.dense_mlp().all(),
                h,
                cfg.dense_intermediate_size,
                res,
                ds,
            ),
        }
    }
    u.push(Unit::new(n.final_norm(), &[h], NORM_STD, Storage::Bf16));
    u.push(Unit::new(
        n.lm_head(),
        &[cfg.vocab_size, h],
        inv_sqrt(h),
        Storage::Bf16,
    ));
    u
}

/// Every unit of a DSpark draft (all bf16), in file order. Names are keyed
/// for the RNG with a `dspark/` prefix so they never share a stream with a
/// target tensor of the same spelling.
pub fn draft_units(d: &DsparkConfig) -> Vec<Unit> {
    let n = DsparkNames;
    let h = d.hidden_size;
    let res = inv_sqrt(2 * d.n_layers);
    let qd = d.num_attention_heads * d.head_dim;
    let kvd = d.num_key_value_heads * d.head_dim;
    let b = Storage::Bf16;
    let mut u = vec![Unit::new(n.fc(), &[h, d.fc_in()], inv_sqrt(d.fc_in()), b)];
    for l in 0..d.n_layers {
        let ln = n.layer(l);
        u.push(Unit::new(ln.input_layernorm(), &[h], NORM_STD, b));
        u.push(Unit::new(ln.q_proj(), &[qd, h], inv_sqrt(h), b));
        u.push(Unit::new(ln.k_proj(), &[kvd, h], inv_sqrt(h), b));
        u.push(Unit::new(ln.v_proj(), &[kvd, h], inv_sqrt(h), b));
        u.push(Unit::new(ln.o_proj(), &[h, qd], inv_sqrt(qd) * res, b));
        u.push(Unit::new(ln.q_norm(), &[d.head_dim], NORM_STD, b));
        u.push(Unit::new(ln.k_norm(), &[d.head_dim], NORM_STD, b));
        u.push(Unit::new(ln.post_attention_layernorm(), &[h], NORM_STD, b));
        mlp_units(
            &mut u,
            [ln.gate_proj(), ln.up_proj(), ln.down_proj()],
            h,
            d.ffn_hidden_size,
            res,
            b,
        );
    }
    u.push(Unit::new(n.final_norm(), &[h], NORM_STD, b));
    // Markov bias E_m[prev] . W_m with std about 0.5 per logit.
    u.push(Unit::new(
        n.markov_e(),
        &[d.vocab_size, d.markov_rank],
        1.0,
        b,
    ));
    u.push(Unit::new(
        n.markov_w(),
        &[d.markov_rank, d.vocab_size],
        0.5 * inv_sqrt(d.markov_rank),
        b,
    ));
    u
}

/// The RNG key of a draft tensor.
pub fn draft_key(name: &str) -> String {
    format!("{}/{name}", crate::dspark::DIR)
}

/// Check every quantized unit's last dimension fits its block size, naming
/// the first tensor that does not.
pub fn check_blocks(units: &[Unit]) -> Result<(), String> {
    for u in units {
        let block = match u.storage {
            Storage::Bf16 | Storage::F32 => continue,
            Storage::Nvfp4 => 16,
            Storage::Mxfp4 | Storage::Mxfp8 => 32,
        };
        if u.shape.len() != 2 || u.cols() % block != 0 {
            return Err(format!(
                "{}: shape {:?} cannot be stored as {:?} (last dimension must be a multiple of {block})",
                u.name, u.shape, u.storage
            ));
        }
    }
    Ok(())
}
