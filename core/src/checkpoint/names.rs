//! Tensor names of MODEL.md section 7: the one place that spells them.
//!
//! Everything a tool writes or reads goes through these functions, so the
//! loader, `m3 synth`, `m3 convert` and `m3 inspect` agree by construction.
//!
//! Names come in two layouts: with the `language_model.` prefix (the real
//! M3 / M3.1 VL checkpoints) or without it (text-only exports). Pick one
//! with [`TensorNames::new`]:
//!
//! ```
//! use m3_core::checkpoint::names::{TensorNames, WEIGHT_SCALE};
//! let n = TensorNames::new(true);
//! assert_eq!(n.embed(), "language_model.model.embed_tokens.weight");
//! assert_eq!(n.lm_head(), "language_model.lm_head.weight");
//! let l = n.layer(3);
//! assert_eq!(l.q_proj(), "language_model.model.layers.3.self_attn.q_proj.weight");
//! assert_eq!(
//!     l.expert(7).gate(),
//!     "language_model.model.layers.3.block_sparse_moe.experts.7.w1.weight"
//! );
//! assert_eq!(l.shared_expert().down(),
//!     "language_model.model.layers.3.block_sparse_moe.shared_experts.down_proj.weight");
//! // Scale tensors sit beside the packed `weight`:
//! assert_eq!(
//!     m3_core::checkpoint::names::sibling(&l.q_proj(), WEIGHT_SCALE),
//!     "language_model.model.layers.3.self_attn.q_proj.weight_scale"
//! );
//! ```

use std::string::String;

/// The prefix of the text weights in VL checkpoints.
pub const LM_PREFIX: &str = "language_model.";

/// Suffix of the packed elements (MXFP4, NVFP4, MXFP8) or plain weight.
pub const WEIGHT: &str = "weight";
/// MXFP4: U8 E8M0 `[out, in/32]`; NVFP4: F8_E4M3 `[out, in/16]`.
pub const WEIGHT_SCALE: &str = "weight_scale";
/// MXFP8: U8 E8M0 `[out, in/32]` (despite the name it multiplies).
pub const WEIGHT_SCALE_INV: &str = "weight_scale_inv";
/// NVFP4: F32 scalar global scale (multiplies at decode).
pub const WEIGHT_SCALE_2: &str = "weight_scale_2";
/// NVFP4: F32 scalar activation scale (unused when quantizing on the fly).
pub const INPUT_SCALE: &str = "input_scale";

/// Prefixes of tensors that belong to the vision tower / projector: skipped
/// at load (MODEL.md: out of scope).
pub const VISION_MARKERS: [&str; 3] = ["vision_tower", "multi_modal_projector", "patch_merge_mlp"];

/// `name` with its final `weight` component replaced by `suffix`
/// (e.g. `...q_proj.weight` -> `...q_proj.weight_scale_inv`). A name that
/// does not end in `.weight` gets `.suffix` appended.
pub fn sibling(weight_name: &str, suffix: &str) -> String {
    match weight_name.strip_suffix(WEIGHT) {
        Some(base) if base.ends_with('.') => format!("{base}{suffix}"),
        _ => format!("{weight_name}.{suffix}"),
    }
}

/// The base of a weight name (without the trailing `.weight` / scale
/// suffix), or None when the name has none of the known suffixes.
/// `...q_proj.weight_scale_inv` -> (`...q_proj`, `weight_scale_inv`).
pub fn split_suffix(name: &str) -> Option<(&str, &str)> {
    let (base, last) = name.rsplit_once('.')?;
    match last {
        WEIGHT | WEIGHT_SCALE | WEIGHT_SCALE_INV | WEIGHT_SCALE_2 | INPUT_SCALE => {
            Some((base, last))
        }
        _ => None,
    }
}

/// True for the vision tower / projector tensors the loader skips.
pub fn is_vision(name: &str) -> bool {
    VISION_MARKERS.iter().any(|m| name.contains(m))
}

/// Name builder for one checkpoint layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TensorNames {
    prefix: &'static str,
}

impl TensorNames {
    /// `language_model_prefix`: write/read names under `language_model.`.
    pub const fn new(language_model_prefix: bool) -> Self {
        TensorNames {
            prefix: if language_model_prefix { LM_PREFIX } else { "" },
        }
    }
    /// The prefix in front of every text tensor (`"language_model."` or `""`).
    pub fn prefix(&self) -> &'static str {
        self.prefix
    }
    /// `embed_tokens.weight`: `[vocab, H]`.
    pub fn embed(&self) -> String {
        format!("{}model.embed_tokens.weight", self.prefix)
    }
    /// Final `norm.weight`: `[H]`.
    pub fn final_norm(&self) -> String {
        format!("{}model.norm.weight", self.prefix)
    }
    /// `lm_head.weight`: `[vocab, H]` (untied).
    pub fn lm_head(&self) -> String {
        format!("{}lm_head.weight", self.prefix)
    }
    /// Names of decoder layer `l`.
    pub fn layer(&self, l: usize) -> LayerNames {
        LayerNames {
            base: format!("{}model.layers.{l}.", self.prefix),
        }
    }
    /// Strip this layout's prefix (None when `name` lacks it).
    pub fn strip<'a>(&self, name: &'a str) -> Option<&'a str> {
        name.strip_prefix(self.prefix)
    }
}

/// Names of one decoder layer (all end in `.weight` unless said otherwise).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerNames {
    /// `"<prefix>model.layers.N."`
    base: String,
}

impl LayerNames {
    fn n(&self, rest: &str) -> String {
        format!("{}{rest}", self.base)
    }
    /// `"<prefix>model.layers.N."`, the common start of every name here.
    pub fn base(&self) -> &str {
        &self.base
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
    /// Optional F32 scalar: FP8 KV-cache scale for k (default 1.0).
    pub fn k_scale(&self) -> String {
        self.n("self_attn.k_scale")
    }
    /// Optional F32 scalar: FP8 KV-cache scale for v (default 1.0).
    pub fn v_scale(&self) -> String {
        self.n("self_attn.v_scale")
    }
    /// `[index_heads * di, H]` (sparse layers only)
    pub fn index_q_proj(&self) -> String {
        self.n("self_attn.index_q_proj.weight")
    }
    /// `[di, H]` (sparse layers only)
    pub fn index_k_proj(&self) -> String {
        self.n("self_attn.index_k_proj.weight")
    }
    /// `[di]` (sparse layers only)
    pub fn index_q_norm(&self) -> String {
        self.n("self_attn.index_q_norm.weight")
    }
    /// `[di]` (sparse layers only)
    pub fn index_k_norm(&self) -> String {
        self.n("self_attn.index_k_norm.weight")
    }
    /// Optional F32 scalar: FP8 index-cache scale (default 1.0).
    pub fn index_k_scale(&self) -> String {
        self.n("self_attn.index_k_scale")
    }
    /// The dense FFN of a dense layer (`mlp.{gate,up,down}_proj`).
    pub fn dense_mlp(&self) -> MlpNames {
        MlpNames {
            base: self.n("mlp."),
            style: MlpStyle::Proj,
        }
    }
    /// Router `[experts, H]`, F32 or BF16.
    pub fn router(&self) -> String {
        self.n("block_sparse_moe.gate.weight")
    }
    /// `[experts]` F32, used for selection only.
    pub fn correction_bias(&self) -> String {
        self.n("block_sparse_moe.e_score_correction_bias")
    }
    /// Routed expert `e` (`experts.E.{w1,w3,w2}`).
    pub fn expert(&self, e: usize) -> MlpNames {
        MlpNames {
            base: self.n(&format!("block_sparse_moe.experts.{e}.")),
            style: MlpStyle::W123,
        }
    }
    /// The shared expert (`shared_experts.{gate,up,down}_proj`).
    pub fn shared_expert(&self) -> MlpNames {
        MlpNames {
            base: self.n("block_sparse_moe.shared_experts."),
            style: MlpStyle::Proj,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum MlpStyle {
    /// `gate_proj` / `up_proj` / `down_proj`
    Proj,
    /// `w1` (gate) / `w3` (up) / `w2` (down)
    W123,
}

/// Names of one SwiGLU MLP (dense FFN, routed expert or shared expert).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MlpNames {
    base: String,
    style: MlpStyle,
}

impl MlpNames {
    /// Gate `[width, H]` (`gate_proj` or `w1`).
    pub fn gate(&self) -> String {
        match self.style {
            MlpStyle::Proj => format!("{}gate_proj.weight", self.base),
            MlpStyle::W123 => format!("{}w1.weight", self.base),
        }
    }
    /// Up `[width, H]` (`up_proj` or `w3`).
    pub fn up(&self) -> String {
        match self.style {
            MlpStyle::Proj => format!("{}up_proj.weight", self.base),
            MlpStyle::W123 => format!("{}w3.weight", self.base),
        }
    }
    /// Down `[H, width]` (`down_proj` or `w2`).
    pub fn down(&self) -> String {
        match self.style {
            MlpStyle::Proj => format!("{}down_proj.weight", self.base),
            MlpStyle::W123 => format!("{}w2.weight", self.base),
        }
    }
    /// `[gate, up, down]`.
    pub fn all(&self) -> [String; 3] {
        [self.gate(), self.up(), self.down()]
    }
}

/// The tensor families `m3 inspect` reports and tools dispatch on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    Embed,
    AttnQ,
    AttnK,
    AttnV,
    AttnO,
    /// `index_{q,k}_proj` (the norms are `Norm`).
    Indexer,
    /// `mlp.*` of dense layers.
    DenseMlp,
    /// `block_sparse_moe.gate` and `e_score_correction_bias`.
    Router,
    RoutedExpert,
    SharedExpert,
    /// Every RMSNorm weight and the KV / index-cache scales.
    Norm,
    LmHead,
    /// The DSpark draft (`dspark.` names or the `dspark/` directory).
    Dspark,
    /// Vision tower / projector: skipped.
    Vision,
    /// Anything else (reported as a warning by `m3 inspect`).
    Other,
}

impl Family {
    /// Short label for tables.
    pub fn label(self) -> &'static str {
        match self {
            Family::Embed => "embed",
            Family::AttnQ => "attn q",
            Family::AttnK => "attn k",
            Family::AttnV => "attn v",
            Family::AttnO => "attn o",
            Family::Indexer => "indexer",
            Family::DenseMlp => "dense mlp",
            Family::Router => "router",
            Family::RoutedExpert => "routed experts",
            Family::SharedExpert => "shared expert",
            Family::Norm => "norms",
            Family::LmHead => "lm_head",
            Family::Dspark => "dspark",
            Family::Vision => "vision (skipped)",
            Family::Other => "other",
        }
    }

    /// The family of a tensor name (with or without `language_model.`;
    /// scale siblings belong to their weight's family).
    pub fn of(name: &str) -> Family {
        if is_vision(name) {
            return Family::Vision;
        }
        let n = name.strip_prefix(LM_PREFIX).unwrap_or(name);
        if n.starts_with("dspark") {
            return Family::Dspark;
        }
        if n == "lm_head.weight" || n.starts_with("lm_head.") {
            return Family::LmHead;
        }
        if n.starts_with("model.embed_tokens.") {
            return Family::Embed;
        }
        if n == "model.norm.weight" {
            return Family::Norm;
        }
        let Some(rest) = n.strip_prefix("model.layers.") else {
            return Family::Other;
        };
        // Skip "N."
        let Some((idx, rest)) = rest.split_once('.') else {
            return Family::Other;
        };
        if idx.parse::<usize>().is_err() {
            return Family::Other;
        }
        if rest.ends_with("layernorm.weight") || rest.ends_with("_norm.weight") {
            return Family::Norm;
        }
        if let Some(a) = rest.strip_prefix("self_attn.") {
            return if a.starts_with("q_proj.") {
                Family::AttnQ
            } else if a.starts_with("k_proj.") {
                Family::AttnK
            } else if a.starts_with("v_proj.") {
                Family::AttnV
            } else if a.starts_with("o_proj.") {
                Family::AttnO
            } else if a.starts_with("index_q_proj.") || a.starts_with("index_k_proj.") {
                Family::Indexer
            } else if a == "k_scale" || a == "v_scale" || a == "index_k_scale" {
                Family::Norm
            } else {
                Family::Other
            };
        }
        if rest.starts_with("mlp.") {
            return Family::DenseMlp;
        }
        if let Some(m) = rest.strip_prefix("block_sparse_moe.") {
            return if m.starts_with("gate.") || m == "e_score_correction_bias" {
                Family::Router
            } else if m.starts_with("experts.") {
                Family::RoutedExpert
            } else if m.starts_with("shared_experts.") {
                Family::SharedExpert
            } else {
                Family::Other
            };
        }
        Family::Other
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_families_agree() {
        for prefixed in [false, true] {
            let n = TensorNames::new(prefixed);
            let l = n.layer(12);
            let cases = [
                (n.embed(), Family::Embed),
                (n.lm_head(), Family::LmHead),
                (n.final_norm(), Family::Norm),
                (l.input_layernorm(), Family::Norm),
                (l.post_attention_layernorm(), Family::Norm),
                (l.q_proj(), Family::AttnQ),
                (l.k_proj(), Family::AttnK),
                (l.v_proj(), Family::AttnV),
                (l.o_proj(), Family::AttnO),
                (l.q_norm(), Family::Norm),
                (l.k_norm(), Family::Norm),
                (l.k_scale(), Family::Norm),
                (l.index_q_proj(), Family::Indexer),
                (l.index_k_proj(), Family::Indexer),
                (l.index_q_norm(), Family::Norm),
                (l.index_k_norm(), Family::Norm),
                (l.dense_mlp().gate(), Family::DenseMlp),
                (l.router(), Family::Router),
                (l.correction_bias(), Family::Router),
                (l.expert(3).down(), Family::RoutedExpert),
                (
                    sibling(&l.expert(3).up(), WEIGHT_SCALE_2),
                    Family::RoutedExpert,
                ),
                (l.shared_expert().up(), Family::SharedExpert),
                (
                    "vision_tower.blocks.0.attn.qkv.weight".into(),
                    Family::Vision,
                ),
                ("model.layers.x.foo".into(), Family::Other),
            ];
            for (name, fam) in cases {
                assert_eq!(Family::of(&name), fam, "{name}");
                let synthetic = matches!(fam, Family::Vision | Family::Other);
                assert_eq!(
                    name.starts_with(LM_PREFIX),
                    prefixed && !synthetic,
                    "{name}"
                );
            }
        }
    }

    #[test]
    fn exact_spellings() {
        let l = TensorNames::new(false).layer(0);
        assert_eq!(
            l.expert(5).all(),
            [
                "model.layers.0.block_sparse_moe.experts.5.w1.weight".to_string(),
                "model.layers.0.block_sparse_moe.experts.5.w3.weight".to_string(),
                "model.layers.0.block_sparse_moe.experts.5.w2.weight".to_string(),
            ]
        );
        assert_eq!(l.dense_mlp().down(), "model.layers.0.mlp.down_proj.weight");
        assert_eq!(
            l.correction_bias(),
            "model.layers.0.block_sparse_moe.e_score_correction_bias"
        );
        assert_eq!(
            l.index_k_norm(),
            "model.layers.0.self_attn.index_k_norm.weight"
        );
        assert_eq!(
            sibling("a.b.weight", WEIGHT_SCALE_INV),
            "a.b.weight_scale_inv"
        );
        assert_eq!(sibling("a.b.bias", WEIGHT_SCALE), "a.b.bias.weight_scale");
        assert_eq!(
            split_suffix("a.b.weight_scale_2"),
            Some(("a.b", "weight_scale_2"))
        );
        assert_eq!(split_suffix("a.b.e_score_correction_bias"), None);
    }
}
