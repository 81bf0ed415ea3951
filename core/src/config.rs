//! `ModelConfig`: what a forward pass needs to know about the model
//! (MODEL.md section 1). Parsed from a checkpoint's `config.json` (flat names
//! or the HF `MiniMaxM3VLTextConfig` spelling, at the top level or under
//! `text_config`) or built from a preset.

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

use serde_json::{Map, Value};

/// Attention type of one layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AttnKind {
    /// Every cached position `j <= p`; no indexer tensors.
    Full,
    /// MSA: indexer + block top-k, attention over the selected blocks.
    Sparse,
}

/// FFN type of one layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MlpKind {
    Dense,
    Moe,
}

/// How the indexer's per-head scores become block selections.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum IndexSelection {
    /// Index head g selects the blocks of KV head g (vLLM, MSA) — the default.
    #[default]
    PerKvHead,
    /// Max over index heads, one selection shared by all KV heads (HF reference).
    Shared,
}

/// The text model's hyper-parameters. Field names follow MODEL.md's table.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    /// NeoX-rotated dims at the start of each head (even, <= head_dim).
    pub rotary_dim: usize,
    pub rope_theta: f64,
    pub vocab_size: usize,
    pub rms_norm_eps: f32,
    pub num_local_experts: usize,
    pub num_experts_per_tok: usize,
    /// Routed expert width.
    pub intermediate_size: usize,
    /// Shared expert width; 0 means no shared expert.
    pub shared_intermediate_size: usize,
    /// Dense FFN width (layers whose `mlp_kinds` entry is `Dense`).
    pub dense_intermediate_size: usize,
    pub routed_scaling_factor: f32,
    pub swiglu_alpha: f32,
    pub swiglu_limit: f32,
    pub index_n_heads: usize,
    pub index_head_dim: usize,
    pub index_block_size: usize,
    pub index_topk_blocks: usize,
    pub index_local_blocks: usize,
    pub index_init_blocks: usize,
    pub index_selection: IndexSelection,
    /// One entry per layer.
    pub attn_kinds: Vec<AttnKind>,
    /// One entry per layer.
    pub mlp_kinds: Vec<MlpKind>,
    /// Model family tag for messages ("minimax_m3", preset name, ...).
    pub model_type: String,
}

/// Why a config could not be built: always names the field at fault (as
/// spelled in `config.json`, e.g. `sparse_attention_config.sparse_block_size`),
/// so a CLI can print it as one line.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfigError {
    /// A required field is absent.
    #[error("config: missing required field `{field}`")]
    Missing { field: String },
    /// A field is present but has the wrong type or an impossible value, or
    /// contradicts another field.
    #[error("config: field `{field}`: {why}")]
    Invalid { field: String, why: String },
    /// `ModelConfig::preset` got a name it does not know.
    #[error("config: unknown preset `{name}` (known: tiny, small, m3.1)")]
    UnknownPreset { name: String },
    /// The text is not JSON (or not a JSON object).
    #[error("config: not valid JSON: {0}")]
    Json(String),
}

fn invalid(field: &str, why: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        field: field.into(),
        why: why.into(),
    }
}

/// Names of the presets `ModelConfig::preset` knows.
pub const PRESETS: [&str; 3] = ["tiny", "small", "m3.1"];

impl ModelConfig {
    /// A built-in preset (MODEL.md section 1): `tiny`, `small` or `m3.1`.
    /// All three are M3.1-style: sparse attention on every layer, the first
    /// `first_k_dense` layers with a dense FFN and MoE after.
    pub fn preset(name: &str) -> Result<ModelConfig, ConfigError> {
        // (H, L, first_k_dense, heads, kv, d, rotary, vocab, experts, top_k,
        //  expert width, shared width, dense width, index heads, index dim,
        //  block, top-k blocks)
        #[allow(clippy::type_complexity)]
        let p: (
            usize,
            usize,
            usize,
            usize,
            usize,
            usize,
            usize,
            usize,
            usize,
            usize,
            usize,
            usize,
            usize,
            usize,
            usize,
            usize,
            usize,
        ) = match name {
            "tiny" => (
                128, 4, 1, 8, 2, 32, 16, 512, 8, 2, 64, 64, 256, 2, 32, 16, 4,
            ),
            "small" => (
                1024, 6, 1, 16, 4, 64, 32, 4096, 32, 4, 512, 512, 2048, 4, 64, 64, 8,
            ),
            "m3.1" => (
                6144, 60, 3, 64, 4, 128, 64, 200_064, 128, 4, 3072, 3072, 12288, 4, 128, 128, 16,
            ),
            _ => return Err(ConfigError::UnknownPreset { name: name.into() }),
        };
        let (
            h,
            l,
            k_dense,
            heads,
            kv,
            d,
            rot,
            vocab,
            experts,
            top_k,
            w,
            sw,
            dw,
            ih,
            idim,
            blk,
            topk,
        ) = p;
        let cfg = ModelConfig {
            hidden_size: h,
            num_hidden_layers: l,
            num_attention_heads: heads,
            num_key_value_heads: kv,
            head_dim: d,
            rotary_dim: rot,
            rope_theta: 5.0e6,
            vocab_size: vocab,
            rms_norm_eps: 1e-6,
            num_local_experts: experts,
            num_experts_per_tok: top_k,
            intermediate_size: w,
            shared_intermediate_size: sw,
            dense_intermediate_size: dw,
            routed_scaling_factor: 2.0,
            swiglu_alpha: 1.702,
            swiglu_limit: 7.0,
            index_n_heads: ih,
            index_head_dim: idim,
            index_block_size: blk,
            index_topk_blocks: topk,
            index_local_blocks: 1,
            index_init_blocks: 0,
            index_selection: IndexSelection::PerKvHead,
            attn_kinds: alloc::vec![AttnKind::Sparse; l],
            mlp_kinds: (0..l)
                .map(|i| {
                    if i < k_dense {
                        MlpKind::Dense
                    } else {
                        MlpKind::Moe
                    }
                })
                .collect(),
            model_type: name.into(),
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// Number of leading layers with a dense FFN (`first_k_dense`).
    pub fn first_k_dense(&self) -> usize {
        self.mlp_kinds
            .iter()
            .take_while(|k| **k == MlpKind::Dense)
            .count()
    }

    /// Override the layer count (`--layers N`), keeping `first_k_dense`
    /// (clipped to `n`) and the attention type of the existing layers; new
    /// layers repeat the last layer's attention type and are MoE.
    pub fn with_layers(mut self, n: usize) -> Result<ModelConfig, ConfigError> {
        if n == 0 {
            return Err(invalid("num_hidden_layers", "--layers must be at least 1"));
        }
        let k = self.first_k_dense();
        let last_attn = self.attn_kinds.last().copied().unwrap_or(AttnKind::Sparse);
        self.attn_kinds.resize(n, last_attn);
        self.mlp_kinds = (0..n)
            .map(|i| if i < k { MlpKind::Dense } else { MlpKind::Moe })
            .collect();
        self.num_hidden_layers = n;
        self.validate()?;
        Ok(self)
    }

    /// True when any layer is sparse (the model carries indexer tensors).
    pub fn has_sparse_layers(&self) -> bool {
        self.attn_kinds.contains(&AttnKind::Sparse)
    }

    /// True when any layer is MoE.
    pub fn has_moe_layers(&self) -> bool {
        self.mlp_kinds.contains(&MlpKind::Moe)
    }

    /// Check every invariant the model math relies on; the error names the
    /// field at fault.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let pos = |field: &str, v: usize| {
            if v == 0 {
                Err(invalid(field, "must be positive"))
            } else {
                Ok(())
            }
        };
        pos("hidden_size", self.hidden_size)?;
        pos("num_hidden_layers", self.num_hidden_layers)?;
        pos("num_attention_heads", self.num_attention_heads)?;
        pos("num_key_value_heads", self.num_key_value_heads)?;
        pos("head_dim", self.head_dim)?;
        pos("vocab_size", self.vocab_size)?;
        if !self
            .num_attention_heads
            .is_multiple_of(self.num_key_value_heads)
        {
            return Err(invalid(
                "num_attention_heads",
                format!(
                    "{} heads are not divisible by num_key_value_heads {}",
                    self.num_attention_heads, self.num_key_value_heads
                ),
            ));
        }
        if !self.rotary_dim.is_multiple_of(2) || self.rotary_dim > self.head_dim {
            return Err(invalid(
                "rotary_dim",
                format!(
                    "{} must be even and at most head_dim {}",
                    self.rotary_dim, self.head_dim
                ),
            ));
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 0.0) {
            return Err(invalid(
                "rope_theta",
                format!("{} must be finite and positive", self.rope_theta),
            ));
        }
        if !(self.rms_norm_eps.is_finite() && self.rms_norm_eps > 0.0) {
            return Err(invalid(
                "rms_norm_eps",
                format!("{} must be finite and positive", self.rms_norm_eps),
            ));
        }
        if self.attn_kinds.len() != self.num_hidden_layers {
            return Err(invalid(
                "layer_types",
                format!(
                    "{} entries for num_hidden_layers {}",
                    self.attn_kinds.len(),
                    self.num_hidden_layers
                ),
            ));
        }
        if self.mlp_kinds.len() != self.num_hidden_layers {
            return Err(invalid(
                "mlp_layer_types",
                format!(
                    "{} entries for num_hidden_layers {}",
                    self.mlp_kinds.len(),
                    self.num_hidden_layers
                ),
            ));
        }
        if self.mlp_kinds.contains(&MlpKind::Dense) {
            pos("dense_intermediate_size", self.dense_intermediate_size)?;
        }
        if self.has_moe_layers() {
            pos("num_local_experts", self.num_local_experts)?;
            pos("num_experts_per_tok", self.num_experts_per_tok)?;
            pos("intermediate_size", self.intermediate_size)?;
            if self.num_experts_per_tok > self.num_local_experts {
                return Err(invalid(
                    "num_experts_per_tok",
                    format!(
                        "top-k {} exceeds num_local_experts {}",
                        self.num_experts_per_tok, self.num_local_experts
                    ),
                ));
            }
            for (f, v) in [("routed_scaling_factor", self.routed_scaling_factor)] {
                if !(v.is_finite() && v > 0.0) {
                    return Err(invalid(f, format!("{v} must be finite and positive")));
                }
            }
        }
        for (f, v) in [
            ("swiglu_alpha", self.swiglu_alpha),
            ("swiglu_limit", self.swiglu_limit),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return Err(invalid(f, format!("{v} must be finite and positive")));
            }
        }
        if self.has_sparse_layers() {
            pos("index_n_heads", self.index_n_heads)?;
            pos("index_head_dim", self.index_head_dim)?;
            pos("index_block_size", self.index_block_size)?;
            pos("index_topk_blocks", self.index_topk_blocks)?;
            if self.rotary_dim > self.index_head_dim {
                return Err(invalid(
                    "index_head_dim",
                    format!(
                        "{} is smaller than rotary_dim {} (the indexer uses the same RoPE)",
                        self.index_head_dim, self.rotary_dim
                    ),
                ));
            }
            if self.index_selection == IndexSelection::PerKvHead
                && self.index_n_heads != self.num_key_value_heads
            {
                return Err(invalid(
                    "index_n_heads",
                    format!(
                        "{} must equal num_key_value_heads {} with index_selection = per_kv_head",
                        self.index_n_heads, self.num_key_value_heads
                    ),
                ));
            }
            if self.index_local_blocks + self.index_init_blocks > self.index_topk_blocks {
                return Err(invalid(
                    "index_topk_blocks",
                    format!(
                        "{} is fewer than the forced index_local_blocks {} + index_init_blocks {}",
                        self.index_topk_blocks, self.index_local_blocks, self.index_init_blocks
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Parse a `config.json` text (see `from_json_value`).
    pub fn from_json_str(text: &str) -> Result<ModelConfig, ConfigError> {
        let v: Value = serde_json::from_str(text).map_err(|e| ConfigError::Json(format!("{e}")))?;
        ModelConfig::from_json_value(&v)
    }

    /// Build from a parsed `config.json`: the text config is `text_config`
    /// when present, else the top level. Accepts the flat MODEL.md names and
    /// the HF `MiniMaxM3VLTextConfig` spelling; per-layer lists
    /// (`layer_types`, `mlp_layer_types`, a `moe_layer_freq` list) win over
    /// counts (`first_k_dense`). Unknown fields are ignored. Defaults for
    /// optional fields: `head_dim` = H / heads, `rms_norm_eps` 1e-6,
    /// `shared_intermediate_size` 0 (no shared expert),
    /// `routed_scaling_factor` 1.0, `swiglu_alpha` 1.702, `swiglu_limit` 7.0,
    /// `index_local_blocks` 1, `index_init_blocks` 0, `index_selection`
    /// per_kv_head; without `layer_types` every layer is sparse when index
    /// fields are present, else full.
    pub fn from_json_value(root: &Value) -> Result<ModelConfig, ConfigError> {
        let root_obj = root
            .as_object()
            .ok_or_else(|| ConfigError::Json("top level is not an object".into()))?;
        let (obj, pfx) = match root_obj.get("text_config") {
            Some(Value::Object(t)) => (t, "text_config."),
            Some(Value::Null) | None => (root_obj, ""),
            Some(_) => return Err(invalid("text_config", "is not an object")),
        };
        let r = Reader { obj, pfx };
        let sparse_cfg = match obj.get("sparse_attention_config") {
            Some(Value::Object(s)) => Some(Reader { obj: s, pfx: "" }),
            Some(Value::Null) | None => None,
            Some(_) => {
                return Err(invalid(
                    &r.name("sparse_attention_config"),
                    "is not an object",
                ))
            }
        };
        let sparse_pfx = format!("{pfx}sparse_attention_config.");
        let sparse_cfg = sparse_cfg.map(|s| Reader {
            obj: s.obj,
            pfx: &sparse_pfx,
        });

        if let Some(act) = obj.get("hidden_act") {
            match act.as_str() {
                Some("swigluoai") | Some("swiglu_oai") => {}
                _ => {
                    return Err(invalid(
                        &r.name("hidden_act"),
                        format!("{act} is not supported (expected \"swigluoai\")"),
                    ))
                }
            }
        }

        let hidden_size = r.usize_req("hidden_size")?;
        let num_hidden_layers = r.usize_req("num_hidden_layers")?;
        let num_attention_heads = r.usize_req("num_attention_heads")?;
        let num_key_value_heads = r.usize_req("num_key_value_heads")?;
        let head_dim = match r.usize_opt("head_dim")? {
            Some(d) => d,
            None if num_attention_heads > 0 => hidden_size / num_attention_heads,
            None => 0,
        };
        let rotary_dim = match (
            r.usize_opt("rotary_dim")?,
            r.f64_opt("partial_rotary_factor")?,
        ) {
            (Some(rd), _) => rd,
            (None, Some(f)) => {
                let rd = f * head_dim as f64;
                if !(0.0..=1.0).contains(&f) || rd != (rd as usize) as f64 {
                    return Err(invalid(
                        &r.name("partial_rotary_factor"),
                        format!("{f} x head_dim {head_dim} is not a whole number of dims"),
                    ));
                }
                rd as usize
            }
            (None, None) => {
                return Err(ConfigError::Missing {
                    field: r.name("rotary_dim"),
                })
            }
        };

        // Index fields: flat names, else `sparse_attention_config`.
        let idx = |flat: &str, nested: &str| -> Result<Option<usize>, ConfigError> {
            if let Some(v) = r.usize_opt(flat)? {
                return Ok(Some(v));
            }
            match &sparse_cfg {
                Some(s) => s.usize_opt(nested),
                None => Ok(None),
            }
        };
        let index_n_heads = idx("index_n_heads", "sparse_num_index_heads")?;
        let index_head_dim = idx("index_head_dim", "sparse_index_dim")?;
        let index_block_size = idx("index_block_size", "sparse_block_size")?;
        let index_topk_blocks = idx("index_topk_blocks", "sparse_topk_blocks")?;
        let index_local_blocks = idx("index_local_blocks", "sparse_local_block")?.unwrap_or(1);
        let index_init_blocks = idx("index_init_blocks", "sparse_init_block")?.unwrap_or(0);
        let any_index = index_n_heads.is_some() || index_head_dim.is_some() || sparse_cfg.is_some();

        let attn_kinds = match obj.get("layer_types") {
            Some(Value::Null) | None => {
                let k = if any_index {
                    AttnKind::Sparse
                } else {
                    AttnKind::Full
                };
                alloc::vec![k; num_hidden_layers]
            }
            Some(v) => {
                let f = r.name("layer_types");
                let list = v.as_array().ok_or_else(|| invalid(&f, "is not a list"))?;
                let mut out = Vec::with_capacity(list.len());
                for (i, e) in list.iter().enumerate() {
                    out.push(match e.as_str() {
                        Some("full_attention") | Some("full") | Some("attention") => AttnKind::Full,
                        Some("minimax_m3_sparse") | Some("sparse") | Some("sparse_attention") => AttnKind::Sparse,
                        _ => return Err(invalid(&f, format!("entry {i} ({e}) is not \"full_attention\" or \"minimax_m3_sparse\""))),
                    });
                }
                out
            }
        };
        if attn_kinds.len() != num_hidden_layers {
            return Err(invalid(
                &r.name("layer_types"),
                format!(
                    "{} entries for num_hidden_layers {num_hidden_layers}",
                    attn_kinds.len()
                ),
            ));
        }

        let mlp_kinds = r.mlp_kinds(num_hidden_layers)?;

        let sparse_needed = attn_kinds.contains(&AttnKind::Sparse);
        let need = |v: Option<usize>, flat: &str| -> Result<usize, ConfigError> {
            match v {
                Some(v) => Ok(v),
                None if sparse_needed => Err(ConfigError::Missing {
                    field: r.name(flat),
                }),
                None => Ok(0),
            }
        };
        let has_moe = mlp_kinds.contains(&MlpKind::Moe);
        let has_dense = mlp_kinds.contains(&MlpKind::Dense);
        let moe_req = |f: &str| -> Result<usize, ConfigError> {
            if has_moe {
                r.usize_req(f)
            } else {
                Ok(r.usize_opt(f)?.unwrap_or(0))
            }
        };

        let index_selection = match obj.get("index_selection") {
            None | Some(Value::Null) => IndexSelection::PerKvHead,
            Some(v) => match v.as_str() {
                Some("per_kv_head") => IndexSelection::PerKvHead,
                Some("shared") => IndexSelection::Shared,
                _ => {
                    return Err(invalid(
                        &r.name("index_selection"),
                        format!("{v} is not \"per_kv_head\" or \"shared\""),
                    ))
                }
            },
        };

        let cfg = ModelConfig {
            hidden_size,
            num_hidden_layers,
            num_attention_heads,
            num_key_value_heads,
            head_dim,
            rotary_dim,
            rope_theta: r.f64_req("rope_theta")?,
            vocab_size: r.usize_req("vocab_size")?,
            rms_norm_eps: r.f64_opt("rms_norm_eps")?.unwrap_or(1e-6) as f32,
            num_local_experts: moe_req("num_local_experts")?,
            num_experts_per_tok: moe_req("num_experts_per_tok")?,
            intermediate_size: moe_req("intermediate_size")?,
            shared_intermediate_size: r.usize_opt("shared_intermediate_size")?.unwrap_or(0),
            dense_intermediate_size: if has_dense {
                r.usize_req("dense_intermediate_size")?
            } else {
                r.usize_opt("dense_intermediate_size")?.unwrap_or(0)
            },
            routed_scaling_factor: r.f64_opt("routed_scaling_factor")?.unwrap_or(1.0) as f32,
            swiglu_alpha: r.f64_opt("swiglu_alpha")?.unwrap_or(1.702) as f32,
            swiglu_limit: r.f64_opt("swiglu_limit")?.unwrap_or(7.0) as f32,
            index_n_heads: need(index_n_heads, "index_n_heads")?,
            index_head_dim: need(index_head_dim, "index_head_dim")?,
            index_block_size: need(index_block_size, "index_block_size")?,
            index_topk_blocks: need(index_topk_blocks, "index_topk_blocks")?,
            index_local_blocks,
            index_init_blocks,
            index_selection,
            attn_kinds,
            mlp_kinds,
            model_type: match obj.get("model_type").and_then(Value::as_str) {
                Some(s) => s.into(),
                None => "minimax_m3".into(),
            },
        };
        cfg.validate().map_err(|e| match e {
            ConfigError::Invalid { field, why } if !pfx.is_empty() => ConfigError::Invalid {
                field: format!("{pfx}{field}"),
                why,
            },
            e => e,
        })?;
        Ok(cfg)
    }

    /// A Hugging Face style `config.json` (pretty-printed): the flat MODEL.md
    /// names plus the per-layer `layer_types` / `mlp_layer_types` lists and
    /// `first_k_dense`, `hidden_act`, `index_selection`. `from_json_str`
    /// reads it back to an equal config.
    pub fn to_json(&self) -> String {
        let attn: Vec<Value> = self
            .attn_kinds
            .iter()
            .map(|k| {
                Value::from(match k {
                    AttnKind::Full => "full_attention",
                    AttnKind::Sparse => "minimax_m3_sparse",
                })
            })
            .collect();
        let mlp: Vec<Value> = self
            .mlp_kinds
            .iter()
            .map(|k| {
                Value::from(match k {
                    MlpKind::Dense => "dense",
                    MlpKind::Moe => "sparse",
                })
            })
            .collect();
        let mut m = Map::new();
        let mut put = |k: &str, v: Value| {
            m.insert(k.into(), v);
        };
        put(
            "architectures",
            Value::Array(alloc::vec![Value::from("MiniMaxM3ForCausalLM")]),
        );
        put("model_type", Value::from(self.model_type.as_str()));
        put("hidden_act", Value::from("swigluoai"));
        put("hidden_size", self.hidden_size.into());
        put("num_hidden_layers", self.num_hidden_layers.into());
        put("num_attention_heads", self.num_attention_heads.into());
        put("num_key_value_heads", self.num_key_value_heads.into());
        put("head_dim", self.head_dim.into());
        put("rotary_dim", self.rotary_dim.into());
        put("rope_theta", self.rope_theta.into());
        put("vocab_size", self.vocab_size.into());
        put("rms_norm_eps", f32_json(self.rms_norm_eps));
        put("num_local_experts", self.num_local_experts.into());
        put("num_experts_per_tok", self.num_experts_per_tok.into());
        put("intermediate_size", self.intermediate_size.into());
        put(
            "shared_intermediate_size",
            self.shared_intermediate_size.into(),
        );
        put(
            "dense_intermediate_size",
            self.dense_intermediate_size.into(),
        );
        put("first_k_dense", self.first_k_dense().into());
        put(
            "routed_scaling_factor",
            f32_json(self.routed_scaling_factor),
        );
        put("swiglu_alpha", f32_json(self.swiglu_alpha));
        put("swiglu_limit", f32_json(self.swiglu_limit));
        put("index_n_heads", self.index_n_heads.into());
        put("index_head_dim", self.index_head_dim.into());
        put("index_block_size", self.index_block_size.into());
        put("index_topk_blocks", self.index_topk_blocks.into());
        put("index_local_blocks", self.index_local_blocks.into());
        put("index_init_blocks", self.index_init_blocks.into());
        put(
            "index_selection",
            Value::from(match self.index_selection {
                IndexSelection::PerKvHead => "per_kv_head",
                IndexSelection::Shared => "shared",
            }),
        );
        put("layer_types", Value::Array(attn));
        put("mlp_layer_types", Value::Array(mlp));
        put("tie_word_embeddings", Value::Bool(false));
        // Serializing a Map of plain values cannot fail.
        serde_json::to_string_pretty(&Value::Object(m)).unwrap_or_default()
    }
}

/// An f32 written as the shortest decimal that reads back to the same f32
/// (so `1e-6f32` is written `1e-6`, not `9.999999974752427e-7`).
fn f32_json(x: f32) -> Value {
    let s = format!("{x}");
    match s.parse::<f64>() {
        Ok(v) => Value::from(v),
        Err(_) => Value::from(x as f64),
    }
}

/// Typed access to one JSON object, naming fields with their path.
struct Reader<'a> {
    obj: &'a Map<String, Value>,
    pfx: &'a str,
}

impl Reader<'_> {
    fn name(&self, f: &str) -> String {
        format!("{}{f}", self.pfx)
    }
    fn usize_opt(&self, f: &str) -> Result<Option<usize>, ConfigError> {
        match self.obj.get(f) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => match v.as_u64() {
                Some(n) if n <= u32::MAX as u64 => Ok(Some(n as usize)),
                _ => {
                    // Accept integral floats (some exporters write 64.0).
                    match v.as_f64() {
                        Some(x) if x >= 0.0 && x <= u32::MAX as f64 && x == (x as u64) as f64 => {
                            Ok(Some(x as usize))
                        }
                        _ => Err(invalid(
                            &self.name(f),
                            format!("{v} is not a non-negative integer"),
                        )),
                    }
                }
            },
        }
    }
    fn usize_req(&self, f: &str) -> Result<usize, ConfigError> {
        self.usize_opt(f)?.ok_or_else(|| ConfigError::Missing {
            field: self.name(f),
        })
    }
    fn f64_opt(&self, f: &str) -> Result<Option<f64>, ConfigError> {
        match self.obj.get(f) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| invalid(&self.name(f), format!("{v} is not a number"))),
        }
    }
    fn f64_req(&self, f: &str) -> Result<f64, ConfigError> {
        self.f64_opt(f)?.ok_or_else(|| ConfigError::Missing {
            field: self.name(f),
        })
    }

    /// FFN kinds: `mlp_layer_types` list, else a `moe_layer_freq` 0/1 list,
    /// else `first_k_dense` (or `first_k_dense_replace`), else every layer MoE.
    fn mlp_kinds(&self, n: usize) -> Result<Vec<MlpKind>, ConfigError> {
        let check_len = |f: &str, len: usize| {
            if len != n {
                Err(invalid(
                    &self.name(f),
                    format!("{len} entries for num_hidden_layers {n}"),
                ))
            } else {
                Ok(())
            }
        };
        if let Some(v) = self.obj.get("mlp_layer_types").filter(|v| !v.is_null()) {
            let f = self.name("mlp_layer_types");
            let list = v.as_array().ok_or_else(|| invalid(&f, "is not a list"))?;
            let mut out = Vec::with_capacity(list.len());
            for (i, e) in list.iter().enumerate() {
                out.push(match e.as_str() {
                    Some("dense") => MlpKind::Dense,
                    Some("sparse") | Some("moe") => MlpKind::Moe,
                    _ => {
                        return Err(invalid(
                            &f,
                            format!("entry {i} ({e}) is not \"dense\" or \"sparse\""),
                        ))
                    }
                });
            }
            check_len("mlp_layer_types", out.len())?;
            return Ok(out);
        }
        if let Some(Value::Array(list)) = self.obj.get("moe_layer_freq") {
            let f = self.name("moe_layer_freq");
            let mut out = Vec::with_capacity(list.len());
            for (i, e) in list.iter().enumerate() {
                out.push(match e.as_u64() {
                    Some(0) => MlpKind::Dense,
                    Some(1) => MlpKind::Moe,
                    _ => return Err(invalid(&f, format!("entry {i} ({e}) is not 0 or 1"))),
                });
            }
            check_len("moe_layer_freq", out.len())?;
            return Ok(out);
        }
        let k = match self.usize_opt("first_k_dense")? {
            Some(k) => Some(k),
            None => self.usize_opt("first_k_dense_replace")?,
        };
        let k = k.unwrap_or(0);
        if k > n {
            return Err(invalid(
                &self.name("first_k_dense"),
                format!("{k} exceeds num_hidden_layers {n}"),
            ));
        }
        Ok((0..n)
            .map(|i| if i < k { MlpKind::Dense } else { MlpKind::Moe })
            .collect())
    }
}
