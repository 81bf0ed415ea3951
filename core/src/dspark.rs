//! The DSpark draft model (MODEL.md section 6): its config, typed weights and
//! tensor names.
//!
//! A DSpark draft is a small dense decoder (`n_layers` full-attention layers
//! with a SwiGLU-OAI MLP of width `ffn_hidden_size`; no MoE, no indexer) that
//! shares the target's embedding and LM head. Its context rows are
//! `fc(concat of the target residuals after the layers in target_layer_ids)`;
//! its query block is `embed(last token)` then `embed(mask_token_id)` rows;
//! each proposed token adds the low-rank Markov bias `E_m[prev] . W_m` to the
//! draft logits.
//!
//! On disk it lives in the checkpoint's `dspark/` directory: its own
//! `config.json` (this [`DsparkConfig`] as JSON) and safetensors shards with
//! a `model.safetensors.index.json`, tensor names as [`DsparkNames`] spells
//! them (without the `dspark/` directory in the name). Weights are bf16.
//!
//! `checkpoint::dspark_loader::load_dspark` reads it into [`DsparkWeights`];
//! `sched::dspark_drafter::DsparkDrafter` runs it (and documents the choices
//! this project makes where MODEL.md 6 leaves the draft open).

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

use serde::{Deserialize, Serialize};

use crate::config::ModelConfig;
use crate::weights::{AttnWeights, LinearWeight, MlpWeights};

/// The checkpoint sub-directory that holds the draft.
pub const DIR: &str = "dspark";

/// Why a DSpark config is unusable; names the field at fault.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DsparkError {
    #[error("dspark config: field `{field}`: {why}")]
    Invalid { field: &'static str, why: String },
    #[error("dspark config: not valid JSON: {0}")]
    Json(String),
}

fn invalid(field: &'static str, why: impl Into<String>) -> DsparkError {
    DsparkError::Invalid {
        field,
        why: why.into(),
    }
}

fn default_n_layers() -> usize {
    DsparkConfig::DEFAULT_LAYERS
}
fn default_max_draft() -> usize {
    7
}

/// The draft's hyper-parameters (`dspark/config.json`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DsparkConfig {
    /// Decoder layers of the draft (default 5).
    #[serde(default = "default_n_layers")]
    pub n_layers: usize,
    /// Must equal the target's H (the embedding and LM head are shared).
    pub hidden_size: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    /// NeoX-rotated dims at the start of each head.
    pub rotary_dim: usize,
    pub rope_theta: f64,
    pub rms_norm_eps: f32,
    /// Width of the draft's SwiGLU-OAI MLP.
    pub ffn_hidden_size: usize,
    pub swiglu_alpha: f32,
    pub swiglu_limit: f32,
    /// Must equal the target's vocabulary (shared LM head).
    pub vocab_size: usize,
    /// Target layers whose output residuals feed `fc`, ascending.
    pub target_layer_ids: Vec<usize>,
    /// Rank r of the Markov bias `E_m [vocab, r] . W_m [r, vocab]`.
    pub markov_rank: usize,
    /// Token whose embedding fills query rows 2..N.
    pub mask_token_id: u32,
    /// Most tokens proposed per step (MODEL.md: N <= 7).
    #[serde(default = "default_max_draft")]
    pub max_draft_tokens: usize,
}

impl DsparkConfig {
    /// Layers of a draft when nothing else is said.
    pub const DEFAULT_LAYERS: usize = 5;

    /// A draft shaped for `target`: same attention geometry, `n_layers`
    /// layers, MLP width 2 H, Markov rank 16 (H <= 256) or 64, and up to three
    /// target layers spread evenly (`(i+1) L / (k+1)`, distinct for k <= L).
    pub fn for_target(target: &ModelConfig, n_layers: usize, mask_token_id: u32) -> Self {
        let l = target.num_hidden_layers;
        let k = l.min(3);
        let ids = (0..k).map(|i| (i + 1) * l / (k + 1)).collect();
        DsparkConfig {
            n_layers,
            hidden_size: target.hidden_size,
            num_attention_heads: target.num_attention_heads,
            num_key_value_heads: target.num_key_value_heads,
            head_dim: target.head_dim,
            rotary_dim: target.rotary_dim,
            rope_theta: target.rope_theta,
            rms_norm_eps: target.rms_norm_eps,
            ffn_hidden_size: 2 * target.hidden_size,
            swiglu_alpha: target.swiglu_alpha,
            swiglu_limit: target.swiglu_limit,
            vocab_size: target.vocab_size,
            target_layer_ids: ids,
            markov_rank: if target.hidden_size <= 256 { 16 } else { 64 },
            mask_token_id,
            max_draft_tokens: default_max_draft(),
        }
    }

    /// Check the invariants the draft math relies on, and (with `target`)
    /// that it can share the target's embedding and LM head.
    pub fn validate(&self, target: Option<&ModelConfig>) -> Result<(), DsparkError> {
        for (field, v) in [
            ("n_layers", self.n_layers),
            ("hidden_size", self.hidden_size),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("head_dim", self.head_dim),
            ("ffn_hidden_size", self.ffn_hidden_size),
            ("vocab_size", self.vocab_size),
            ("markov_rank", self.markov_rank),
            ("max_draft_tokens", self.max_draft_tokens),
        ] {
            if v == 0 {
                return Err(invalid(field, "must be positive"));
            }
        }
        if !self
            .num_attention_heads
            .is_multiple_of(self.num_key_value_heads)
        {
            return Err(invalid(
                "num_attention_heads",
                "must be a multiple of num_key_value_heads",
            ));
        }
        if !self.rotary_dim.is_multiple_of(2) || self.rotary_dim > self.head_dim {
            return Err(invalid("rotary_dim", "must be even and at most head_dim"));
        }
        if self.max_draft_tokens > 7 {
            return Err(invalid("max_draft_tokens", "at most 7"));
        }
        if self.target_layer_ids.is_empty() {
            return Err(invalid(
                "target_layer_ids",
                "must name at least one target layer",
            ));
        }
        if self.target_layer_ids.windows(2).any(|w| w[0] >= w[1]) {
            return Err(invalid("target_layer_ids", "must be strictly ascending"));
        }
        if self.mask_token_id as usize >= self.vocab_size {
            return Err(invalid(
                "mask_token_id",
                format!("{} is not below vocab_size", self.mask_token_id),
            ));
        }
        if let Some(t) = target {
            if self.hidden_size != t.hidden_size {
                return Err(invalid(
                    "hidden_size",
                    format!("{} != target {}", self.hidden_size, t.hidden_size),
                ));
            }
            if self.vocab_size != t.vocab_size {
                return Err(invalid(
                    "vocab_size",
                    format!("{} != target {}", self.vocab_size, t.vocab_size),
                ));
            }
            if let Some(&last) = self.target_layer_ids.last() {
                if last >= t.num_hidden_layers {
                    return Err(invalid(
                        "target_layer_ids",
                        format!(
                            "layer {last} past the target's {} layers",
                            t.num_hidden_layers
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Input width of `fc`: `len(target_layer_ids) * H`.
    pub fn fc_in(&self) -> usize {
        self.target_layer_ids.len() * self.hidden_size
    }

    /// Parse `dspark/config.json` and validate it (without a target).
    pub fn from_json_str(text: &str) -> Result<Self, DsparkError> {
        let c: DsparkConfig =
            serde_json::from_str(text).map_err(|e| DsparkError::Json(format!("{e}")))?;
        c.validate(None)?;
        Ok(c)
    }

    /// Pretty JSON that `from_json_str` reads back to an equal config.
    pub fn to_json(&self) -> String {
        // Serializing plain numbers and lists cannot fail.
        serde_json::to_string_pretty(self).unwrap_or_default()
    }
}

/// Tensor names inside `dspark/`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DsparkNames;

impl DsparkNames {
    /// `fc.weight`: `[H, len(target_layer_ids) * H]`.
    pub fn fc(&self) -> String {
        "fc.weight".into()
    }
    /// Final RMSNorm before the shared LM head: `[H]`.
    pub fn final_norm(&self) -> String {
        "norm.weight".into()
    }
    /// Markov bias `E_m`: `[vocab, r]`.
    pub fn markov_e(&self) -> String {
        "markov.e_m.weight".into()
    }
    /// Markov bias `W_m`: `[r, vocab]`.
    pub fn markov_w(&self) -> String {
        "markov.w_m.weight".into()
    }
    /// Names of draft layer `l`.
    pub fn layer(&self, l: usize) -> DsparkLayerNames {
        DsparkLayerNames {
            base: format!("layers.{l}."),
        }
    }
}

/// Names of one draft decoder layer (same spelling as a target dense layer,
/// without the `model.` prefix).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DsparkLayerNames {
    base: String,
}

impl DsparkLayerNames {
    fn n(&self, rest: &str) -> String {
        format!("{}{rest}", self.base)
    }
    /// `[H]`
    pub fn input_layernorm(&self) -> String {
        self.n("input_layernorm.weight")
    }
    /// `[H]`
    pub fn post_attention_layernorm(&self) -> String {
        self.n("post_attention_layernorm.weight")
    }
    /// `[heads * d, H]`
    pub fn q_proj(&self) -> String {
        self.n("self_attn.q_proj.weight")
    }
    /// `[kv_heads * d, H]`
    pub fn k_proj(&self) -> String {
        self.n("self_attn.k_proj.weight")
    }
    /// `[kv_heads * d, H]`
    pub fn v_proj(&self) -> String {
        self.n("self_attn.v_proj.weight")
    }
    /// `[H, heads * d]`
    pub fn o_proj(&self) -> String {
        self.n("self_attn.o_proj.weight")
    }
    /// `[d]`
    pub fn q_norm(&self) -> String {
        self.n("self_attn.q_norm.weight")
    }
    /// `[d]`
    pub fn k_norm(&self) -> String {
        self.n("self_attn.k_norm.weight")
    }
    /// `[ffn, H]`
    pub fn gate_proj(&self) -> String {
        self.n("mlp.gate_proj.weight")
    }
    /// `[ffn, H]`
    pub fn up_proj(&self) -> String {
        self.n("mlp.up_proj.weight")
    }
    /// `[H, ffn]`
    pub fn down_proj(&self) -> String {
        self.n("mlp.down_proj.weight")
    }
}

/// One draft decoder layer (its attention has no indexer).
#[derive(Clone, Debug, PartialEq)]
pub struct DsparkLayerWeights {
    /// Gemma RMSNorm weights (multiply by `1 + w`).
    pub input_norm: Vec<f32>,
    pub post_attn_norm: Vec<f32>,
    pub attn: AttnWeights,
    pub mlp: MlpWeights,
}

/// The whole draft. The embedding and LM head are the target's.
#[derive(Clone, Debug, PartialEq)]
pub struct DsparkWeights {
    pub config: DsparkConfig,
    /// `[H, len(target_layer_ids) * H]`.
    pub fc: LinearWeight,
    pub layers: Vec<DsparkLayerWeights>,
    /// Final RMSNorm before the shared LM head, `[H]`.
    pub final_norm: Vec<f32>,
    /// `E_m`: `[vocab, r]`.
    pub markov_e: LinearWeight,
    /// `W_m`: `[r, vocab]`.
    pub markov_w: LinearWeight,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_round_trips_and_fits_its_target() {
        let t = ModelConfig::preset("tiny").unwrap();
        let c = DsparkConfig::for_target(&t, 2, 511);
        assert_eq!(c.target_layer_ids, alloc::vec![1, 2, 3]);
        assert_eq!(c.fc_in(), 3 * t.hidden_size);
        c.validate(Some(&t)).unwrap();
        assert_eq!(DsparkConfig::from_json_str(&c.to_json()).unwrap(), c);
        let one = t.clone().with_layers(1).unwrap();
        assert_eq!(
            DsparkConfig::for_target(&one, 2, 0).target_layer_ids,
            alloc::vec![0]
        );
        let mut bad = c.clone();
        bad.mask_token_id = 512;
        assert!(bad
            .validate(None)
            .unwrap_err()
            .to_string()
            .contains("mask_token_id"));
        let mut bad = c.clone();
        bad.hidden_size = 64;
        assert!(bad
            .validate(Some(&t))
            .unwrap_err()
            .to_string()
            .contains("hidden_size"));
        let mut bad = c;
        bad.target_layer_ids = alloc::vec![2, 1];
        assert!(bad.validate(None).is_err());
    }

    #[test]
    fn names_spell_the_layout() {
        let n = DsparkNames;
        assert_eq!(n.layer(3).q_proj(), "layers.3.self_attn.q_proj.weight");
        assert_eq!(n.layer(0).down_proj(), "layers.0.mlp.down_proj.weight");
        assert_eq!(n.fc(), "fc.weight");
    }
}
