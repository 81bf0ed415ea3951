//! `ModelConfig`: what a forward pass needs to know about the model
//! (MODEL.md section 1). Parsed from a checkpoint's `config.json` (flat names
//! or the HF `MiniMaxM3VLTextConfig` spelling, at the top level or under
//! `text_config`) or built from a preset.

use alloc::string::String;
use alloc::vec::Vec;

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
