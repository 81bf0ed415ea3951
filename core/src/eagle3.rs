//! The EAGLE3 draft head (ARCHITECTURE.md "EAGLE3 draft"): its config, typed
//! weights and tensor names, in the layout most published EAGLE3 drafts use.
//!
//! An EAGLE3 draft is one Llama-style decoder layer (`midlayer`) that reads
//! the target's hidden states instead of its own embedding stack:
//! `g = fc(concat(h_low, h_mid, h_high))` fuses three target residuals
//! (`[H, 3 H_target]`), each draft row's attention input is
//! `concat(input_layernorm(embed(token)), hidden_norm(h))` (width `2 H`, so
//! `q/k/v_proj` take `2 H`), and the head ends with `norm` and its own
//! `lm_head` over a reduced draft vocabulary, mapped back to target ids by
//! `d2t` (`target = draft + d2t[draft]`). The embedding is the target's.
//!
//! On disk it lives in the checkpoint's `eagle3/` directory: `config.json`
//! (this [`Eagle3Config`]; the published field names) and safetensors
//! shards (`model.safetensors.index.json` or one `model.safetensors`),
//! tensor names as [`Eagle3Names`] spells them. Weights are bf16 or f32,
//! `d2t` int64.
//!
//! `checkpoint::eagle3_loader::load_eagle3` reads it into [`Eagle3Weights`];
//! `sched::eagle3_drafter::Eagle3Drafter` runs it.

use alloc::format;
use alloc::string::String;
use alloc::vec;
use alloc::vec::Vec;

use serde::{Deserialize, Serialize};

use crate::config::ModelConfig;
use crate::weights::LinearWeight;

/// The checkpoint sub-directory that holds the draft.
pub const DIR: &str = "eagle3";

/// Why an EAGLE3 config or its token map is unusable; names the field or
/// tensor at fault.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Eagle3Error {
    #[error("eagle3 config: field `{field}`: {why}")]
    Invalid { field: &'static str, why: String },
    #[error("eagle3 config: not valid JSON: {0}")]
    Json(String),
    #[error("eagle3 tensor `d2t`: {0}")]
    D2t(String),
}

fn invalid(field: &'static str, why: impl Into<String>) -> Eagle3Error {
    Eagle3Error::Invalid {
        field,
        why: why.into(),
    }
}

fn default_max_draft() -> usize {
    7
}
fn default_theta() -> f64 {
    10000.0
}
fn default_eps() -> f32 {
    1e-6
}

/// The draft's hyper-parameters (`eagle3/config.json`). Field names are the
/// published ones (`intermediate_size`, `draft_vocab_size`,
/// `target_hidden_size`); `target_layer_ids` also reads the
/// `eagle_aux_hidden_state_layer_ids` spelling.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Eagle3Config {
    /// H: width of the draft's residual. Must equal the target's H (the
    /// draft embeds tokens with the target's embedding).
    pub hidden_size: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    /// Per-head width d; `None` means `hidden_size / num_attention_heads`.
    #[serde(default)]
    pub head_dim: Option<usize>,
    /// Width of the SiLU-gated MLP.
    pub intermediate_size: usize,
    /// The target's vocabulary (`d2t` maps into it).
    pub vocab_size: usize,
    /// Rows of the draft's own `lm_head` (the reduced draft vocabulary).
    pub draft_vocab_size: usize,
    /// Width of each captured target hidden state; `None` means
    /// `hidden_size`. Must equal the target's H.
    #[serde(default)]
    pub target_hidden_size: Option<usize>,
    /// RoPE base; the rotation is NeoX-style over the whole head.
    #[serde(default = "default_theta")]
    pub rope_theta: f64,
    #[serde(default = "default_eps")]
    pub rms_norm_eps: f32,
    /// The three target layers (low, mid, high) whose *output* residual
    /// (`residual.{l}` tap) is concatenated, in this order, into `fc`.
    #[serde(alias = "eagle_aux_hidden_state_layer_ids")]
    pub target_layer_ids: Vec<usize>,
    /// Most tokens proposed per step (MODEL.md: N <= 7).
    #[serde(default = "default_max_draft")]
    pub max_draft_tokens: usize,
}

impl Eagle3Config {
    /// A draft shaped for `target`: the target's attention geometry and
    /// RoPE base, MLP width 2 H, a draft vocabulary of half the target's
    /// (at least 1), and the reference layer choice: the outputs of layers
    /// `1, L/2 - 1, L - 4` (the inputs of layers 2, L/2, L-3 that the
    /// reference implementation captures) when `L >= 8`, else the evenly
    /// spread `0, (L-1)/2, L-1`.
    pub fn for_target(target: &ModelConfig) -> Self {
        let l = target.num_hidden_layers.max(1);
        let ids = if l >= 8 {
            vec![1, l / 2 - 1, l - 4]
        } else {
            vec![0, (l - 1) / 2, l - 1]
        };
        Eagle3Config {
            hidden_size: target.hidden_size,
            num_attention_heads: target.num_attention_heads,
            num_key_value_heads: target.num_key_value_heads,
            head_dim: Some(target.head_dim),
            intermediate_size: 2 * target.hidden_size,
            vocab_size: target.vocab_size,
            draft_vocab_size: (target.vocab_size / 2).max(1),
            target_hidden_size: Some(target.hidden_size),
            rope_theta: target.rope_theta,
            rms_norm_eps: target.rms_norm_eps,
            target_layer_ids: ids,
            max_draft_tokens: default_max_draft(),
        }
    }

    /// Per-head width d.
    pub fn head_dim(&self) -> usize {
        self.head_dim
            .unwrap_or(self.hidden_size / self.num_attention_heads.max(1))
    }

    /// Width of each captured target hidden state.
    pub fn target_hidden(&self) -> usize {
        self.target_hidden_size.unwrap_or(self.hidden_size)
    }

    /// Input width of `fc`: `3 * target_hidden`.
    pub fn fc_in(&self) -> usize {
        self.target_layer_ids.len() * self.target_hidden()
    }

    /// Check the invariants the draft math relies on, and (with `target`)
    /// that it can read the target's hidden states and embedding.
    pub fn validate(&self, target: Option<&ModelConfig>) -> Result<(), Eagle3Error> {
        for (field, v) in [
            ("hidden_size", self.hidden_size),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("head_dim", self.head_dim()),
            ("intermediate_size", self.intermediate_size),
            ("vocab_size", self.vocab_size),
            ("draft_vocab_size", self.draft_vocab_size),
            ("target_hidden_size", self.target_hidden()),
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
        if !self.head_dim().is_multiple_of(2) {
            return Err(invalid("head_dim", "must be even (RoPE pairs)"));
        }
        if self.max_draft_tokens > 7 {
            return Err(invalid("max_draft_tokens", "at most 7"));
        }
        if self.draft_vocab_size > self.vocab_size {
            return Err(invalid(
                "draft_vocab_size",
                format!(
                    "{} is above vocab_size {}",
                    self.draft_vocab_size, self.vocab_size
                ),
            ));
        }
        if self.target_layer_ids.len() != 3 {
            return Err(invalid(
                "target_layer_ids",
                format!(
                    "EAGLE3 fuses exactly 3 target layers (low, mid, high), got {}",
                    self.target_layer_ids.len()
                ),
            ));
        }
        if let Some(t) = target {
            if self.hidden_size != t.hidden_size {
                return Err(invalid(
                    "hidden_size",
                    format!(
                        "{} != target {} (the target's embedding is shared)",
                        self.hidden_size, t.hidden_size
                    ),
                ));
            }
            if self.target_hidden() != t.hidden_size {
                return Err(invalid(
                    "target_hidden_size",
                    format!("{} != target {}", self.target_hidden(), t.hidden_size),
                ));
            }
            if self.vocab_size != t.vocab_size {
                return Err(invalid(
                    "vocab_size",
                    format!("{} != target {}", self.vocab_size, t.vocab_size),
                ));
            }
            if let Some(&l) = self
                .target_layer_ids
                .iter()
                .find(|&&l| l >= t.num_hidden_layers)
            {
                return Err(invalid(
                    "target_layer_ids",
                    format!("layer {l} past the target's {} layers", t.num_hidden_layers),
                ));
            }
        }
        Ok(())
    }

    /// Parse `eagle3/config.json` and validate it (without a target).
    pub fn from_json_str(text: &str) -> Result<Self, Eagle3Error> {
        let c: Eagle3Config =
            serde_json::from_str(text).map_err(|e| Eagle3Error::Json(format!("{e}")))?;
        c.validate(None)?;
        Ok(c)
    }

    /// Pretty JSON that `from_json_str` reads back to an equal config.
    pub fn to_json(&self) -> String {
        // Serializing plain numbers and lists cannot fail.
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    /// Check a `d2t` table (`[draft_vocab_size]` offsets) and return the
    /// target id of every draft id: `draft + d2t[draft]` must lie in
    /// `0 .. vocab_size`, and no two draft ids may map to the same target id
    /// (the draft distribution is scattered onto target ids).
    pub fn draft_to_target(&self, d2t: &[i64]) -> Result<Vec<u32>, Eagle3Error> {
        if d2t.len() != self.draft_vocab_size {
            return Err(Eagle3Error::D2t(format!(
                "{} entries, expected draft_vocab_size {}",
                d2t.len(),
                self.draft_vocab_size
            )));
        }
        let mut seen = vec![false; self.vocab_size];
        let mut out = Vec::with_capacity(d2t.len());
        for (i, &off) in d2t.iter().enumerate() {
            let t = (i as i64)
                .checked_add(off)
                .filter(|&t| t >= 0 && (t as u64) < self.vocab_size as u64);
            let Some(t) = t else {
                return Err(Eagle3Error::D2t(format!(
                    "draft id {i} + offset {off} is outside the target vocabulary 0..{}",
                    self.vocab_size
                )));
            };
            let t = t as usize;
            if seen[t] {
                return Err(Eagle3Error::D2t(format!(
                    "draft id {i} maps to target id {t}, which an earlier draft id already maps to"
                )));
            }
            seen[t] = true;
            out.push(t as u32);
        }
        Ok(out)
    }
}

/// Tensor names inside `eagle3/` (the published spelling).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Eagle3Names;

impl Eagle3Names {
    /// `[H, 3 H_target]`
    pub const FC: &'static str = "fc.weight";
    /// `[H]` (Llama RMSNorm: multiplies by `w`)
    pub const INPUT_LAYERNORM: &'static str = "midlayer.input_layernorm.weight";
    /// `[H]`
    pub const HIDDEN_NORM: &'static str = "midlayer.hidden_norm.weight";
    /// `[heads * d, 2 H]`
    pub const Q_PROJ: &'static str = "midlayer.self_attn.q_proj.weight";
    /// `[kv_heads * d, 2 H]`
    pub const K_PROJ: &'static str = "midlayer.self_attn.k_proj.weight";
    /// `[kv_heads * d, 2 H]`
    pub const V_PROJ: &'static str = "midlayer.self_attn.v_proj.weight";
    /// `[H, heads * d]`
    pub const O_PROJ: &'static str = "midlayer.self_attn.o_proj.weight";
    /// `[H]`
    pub const POST_ATTENTION_LAYERNORM: &'static str = "midlayer.post_attention_layernorm.weight";
    /// `[intermediate, H]`
    pub const GATE_PROJ: &'static str = "midlayer.mlp.gate_proj.weight";
    /// `[intermediate, H]`
    pub const UP_PROJ: &'static str = "midlayer.mlp.up_proj.weight";
    /// `[H, intermediate]`
    pub const DOWN_PROJ: &'static str = "midlayer.mlp.down_proj.weight";
    /// `[H]`
    pub const NORM: &'static str = "norm.weight";
    /// `[draft_vocab, H]`
    pub const LM_HEAD: &'static str = "lm_head.weight";
    /// int64 `[draft_vocab]`: `target id = draft id + d2t[draft id]`.
    pub const D2T: &'static str = "d2t";
    /// bool `[vocab]` (which target ids the draft can propose); not read:
    /// `d2t` says the same.
    pub const T2D: &'static str = "t2d";
}

/// The whole draft. The embedding is the target's.
///
/// Norm weights are stored as `w - 1` so the project's Gemma RMSNorm op
/// (`x / rms * (1 + w')`) computes the Llama norm `x / rms * w` of the file
/// exactly (`w - 1` of a bf16 `w` is exact in f32, and so is `1 + (w - 1)`).
#[derive(Clone, Debug, PartialEq)]
pub struct Eagle3Weights {
    pub config: Eagle3Config,
    /// `[H, 3 H_target]`.
    pub fc: LinearWeight,
    /// Gemma-form (`w - 1`) norm weights, `[H]` each.
    pub input_norm: Vec<f32>,
    pub hidden_norm: Vec<f32>,
    pub post_attn_norm: Vec<f32>,
    pub final_norm: Vec<f32>,
    /// `[heads * d, 2 H]`, `[kv * d, 2 H]`, `[kv * d, 2 H]`, `[H, heads * d]`.
    pub q: LinearWeight,
    pub k: LinearWeight,
    pub v: LinearWeight,
    pub o: LinearWeight,
    /// SiLU-gated MLP: `[I, H]`, `[I, H]`, `[H, I]`.
    pub gate: LinearWeight,
    pub up: LinearWeight,
    pub down: LinearWeight,
    /// `[draft_vocab, H]`.
    pub lm_head: LinearWeight,
    /// Target id of each draft id (`draft + d2t[draft]`, checked).
    pub draft_to_target: Vec<u32>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_round_trips_and_fits_its_target() {
        let t = ModelConfig::preset("tiny").unwrap();
        let c = Eagle3Config::for_target(&t);
        assert_eq!(c.target_layer_ids, vec![0, 1, 3]);
        assert_eq!(c.fc_in(), 3 * t.hidden_size);
        c.validate(Some(&t)).unwrap();
        assert_eq!(Eagle3Config::from_json_str(&c.to_json()).unwrap(), c);
        let big = t.clone().with_layers(32).unwrap();
        assert_eq!(
            Eagle3Config::for_target(&big).target_layer_ids,
            vec![1, 15, 28]
        );
        let mut bad = c.clone();
        bad.target_layer_ids = vec![0, 1];
        assert!(bad
            .validate(None)
            .unwrap_err()
            .to_string()
            .contains("target_layer_ids"));
        let mut bad = c.clone();
        bad.draft_vocab_size = t.vocab_size + 1;
        assert!(bad
            .validate(None)
            .unwrap_err()
            .to_string()
            .contains("draft_vocab_size"));
        let mut bad = c;
        bad.hidden_size = 64;
        assert!(bad
            .validate(Some(&t))
            .unwrap_err()
            .to_string()
            .contains("hidden_size"));
    }

    #[test]
    fn published_spelling_parses() {
        let j = r#"{"hidden_size": 8, "num_attention_heads": 2, "num_key_value_heads": 1,
            "intermediate_size": 16, "vocab_size": 10, "draft_vocab_size": 4,
            "eagle_aux_hidden_state_layer_ids": [1, 2, 3], "architectures": ["LlamaForCausalLMEagle3"]}"#;
        let c = Eagle3Config::from_json_str(j).unwrap();
        assert_eq!(c.head_dim(), 4);
        assert_eq!(c.target_layer_ids, vec![1, 2, 3]);
        assert_eq!(c.target_hidden(), 8);
    }

    #[test]
    fn d2t_is_checked() {
        let t = ModelConfig::preset("tiny").unwrap();
        let mut c = Eagle3Config::for_target(&t);
        c.draft_vocab_size = 3;
        assert_eq!(c.draft_to_target(&[0, 4, 8]).unwrap(), vec![0, 5, 10]);
        let e = c.draft_to_target(&[0, 511, 0]).unwrap_err().to_string();
        assert!(e.contains("d2t") && e.contains("draft id 1"), "{e}");
        let e = c.draft_to_target(&[-1, 0, 0]).unwrap_err().to_string();
        assert!(e.contains("draft id 0"), "{e}");
        let e = c.draft_to_target(&[1, 0, 0]).unwrap_err().to_string();
        assert!(e.contains("earlier draft id"), "{e}");
        assert!(c.draft_to_target(&[0, 0]).is_err());
    }
}
