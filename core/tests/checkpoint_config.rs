//! `ModelConfig`: presets, `--layers`, both `config.json` spellings, and
//! field-naming errors. Expected values are taken from MODEL.md section 1.

use m3_core::config::{AttnKind, ConfigError, IndexSelection, MlpKind, ModelConfig};
use serde_json::{json, Value};

fn err_field(e: ConfigError) -> String {
    match e {
        ConfigError::Missing { field } | ConfigError::Invalid { field, .. } => field,
        other => panic!("expected a field error, got {other}"),
    }
}

#[test]
fn tiny_preset_matches_model_md() {
    let c = ModelConfig::preset("tiny").unwrap();
    assert_eq!(c.hidden_size, 128);
    assert_eq!(c.num_hidden_layers, 4);
    assert_eq!(c.first_k_dense(), 1);
    assert_eq!(
        (
            c.num_attention_heads,
            c.num_key_value_heads,
            c.head_dim,
            c.rotary_dim
        ),
        (8, 2, 32, 16)
    );
    assert_eq!(c.vocab_size, 512);
    assert_eq!((c.num_local_experts, c.num_experts_per_tok), (8, 2));
    assert_eq!(
        (
            c.intermediate_size,
            c.shared_intermediate_size,
            c.dense_intermediate_size
        ),
        (64, 64, 256)
    );
    assert_eq!(
        (
            c.index_n_heads,
            c.index_head_dim,
            c.index_block_size,
            c.index_topk_blocks
        ),
        (2, 32, 16, 4)
    );
    assert!(c.attn_kinds.iter().all(|k| *k == AttnKind::Sparse));
    assert_eq!(
        c.mlp_kinds,
        vec![MlpKind::Dense, MlpKind::Moe, MlpKind::Moe, MlpKind::Moe]
    );
}

#[test]
fn small_and_m31_presets_match_model_md() {
    let s = ModelConfig::preset("small").unwrap();
    assert_eq!(
        (s.hidden_size, s.num_hidden_layers, s.first_k_dense()),
        (1024, 6, 1)
    );
    assert_eq!(
        (
            s.num_attention_heads,
            s.num_key_value_heads,
            s.head_dim,
            s.rotary_dim
        ),
        (16, 4, 64, 32)
    );
    assert_eq!(
        (s.vocab_size, s.num_local_experts, s.num_experts_per_tok),
        (4096, 32, 4)
    );
    assert_eq!(
        (
            s.intermediate_size,
            s.shared_intermediate_size,
            s.dense_intermediate_size
        ),
        (512, 512, 2048)
    );
    assert_eq!(
        (
            s.index_n_heads,
            s.index_head_dim,
            s.index_block_size,
            s.index_topk_blocks
        ),
        (4, 64, 64, 8)
    );

    let m = ModelConfig::preset("m3.1").unwrap();
    assert_eq!(
        (m.hidden_size, m.num_hidden_layers, m.first_k_dense()),
        (6144, 60, 3)
    );
    assert_eq!(
        (
            m.num_attention_heads,
            m.num_key_value_heads,
            m.head_dim,
            m.rotary_dim
        ),
        (64, 4, 128, 64)
    );
    assert_eq!(m.rope_theta, 5e6);
    assert_eq!(m.vocab_size, 200064);
    assert_eq!(m.rms_norm_eps, 1e-6);
    assert_eq!((m.num_local_experts, m.num_experts_per_tok), (128, 4));
    assert_eq!(
        (
            m.intermediate_size,
            m.shared_intermediate_size,
            m.dense_intermediate_size
        ),
        (3072, 3072, 12288)
    );
    assert_eq!(m.routed_scaling_factor, 2.0);
    assert_eq!((m.swiglu_alpha, m.swiglu_limit), (1.702, 7.0));
    assert_eq!(
        (
            m.index_n_heads,
            m.index_head_dim,
            m.index_block_size,
            m.index_topk_blocks
        ),
        (4, 128, 128, 16)
    );
    assert_eq!((m.index_local_blocks, m.index_init_blocks), (1, 0));
    assert_eq!(m.index_selection, IndexSelection::PerKvHead);
    assert!(m.attn_kinds.iter().all(|k| *k == AttnKind::Sparse));

    assert!(matches!(
        ModelConfig::preset("huge"),
        Err(ConfigError::UnknownPreset { .. })
    ));
}

#[test]
fn with_layers_keeps_first_k_dense() {
    let m = ModelConfig::preset("m3.1").unwrap().with_layers(5).unwrap();
    assert_eq!(m.num_hidden_layers, 5);
    assert_eq!(
        m.mlp_kinds,
        vec![
            MlpKind::Dense,
            MlpKind::Dense,
            MlpKind::Dense,
            MlpKind::Moe,
            MlpKind::Moe
        ]
    );
    assert_eq!(m.attn_kinds.len(), 5);
    let t = ModelConfig::preset("tiny").unwrap().with_layers(9).unwrap();
    assert_eq!(t.first_k_dense(), 1);
    assert_eq!(t.attn_kinds, vec![AttnKind::Sparse; 9]);
    let two = ModelConfig::preset("m3.1").unwrap().with_layers(2).unwrap();
    assert_eq!(two.mlp_kinds, vec![MlpKind::Dense, MlpKind::Dense]);
    assert!(ModelConfig::preset("tiny").unwrap().with_layers(0).is_err());
}

#[test]
fn to_json_reads_back_equal() {
    for p in m3_core::config::PRESETS {
        let c = ModelConfig::preset(p).unwrap();
        let text = c.to_json();
        let back = ModelConfig::from_json_str(&text).unwrap();
        assert_eq!(back, c, "preset {p}");
        // Also readable when nested under text_config, as VL checkpoints do.
        let v: Value = serde_json::from_str(&text).unwrap();
        let nested = json!({"model_type": "minimax_m3_vl", "text_config": v});
        assert_eq!(ModelConfig::from_json_value(&nested).unwrap(), c);
    }
    // A changed value does not read back equal (the comparison can fail).
    let mut c = ModelConfig::preset("tiny").unwrap();
    let text = c.to_json();
    c.swiglu_limit = 6.0;
    assert_ne!(ModelConfig::from_json_str(&text).unwrap(), c);
}

/// HF `MiniMaxM3VLTextConfig` spelling, written by hand as a VL config.
fn hf_config() -> Value {
    json!({
        "architectures": ["MiniMaxM3VLForConditionalGeneration"],
        "model_type": "minimax_m3_vl",
        "vision_config": {"hidden_size": 1280},
        "text_config": {
            "model_type": "minimax_m3_vl_text",
            "hidden_size": 64, "num_hidden_layers": 3,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
            "partial_rotary_factor": 0.5, "rope_theta": 5000000.0,
            "vocab_size": 256, "rms_norm_eps": 1e-6, "hidden_act": "swigluoai",
            "num_local_experts": 4, "num_experts_per_tok": 2,
            "intermediate_size": 32, "shared_intermediate_size": 32, "dense_intermediate_size": 96,
            "routed_scaling_factor": 2.0, "swiglu_alpha": 1.702, "swiglu_limit": 7.0,
            "layer_types": ["full_attention", "minimax_m3_sparse", "minimax_m3_sparse"],
            "moe_layer_freq": [0, 1, 1],
            "first_k_dense": 2,
            "sparse_attention_config": {
                "sparse_num_index_heads": 2, "sparse_index_dim": 16, "sparse_block_size": 8,
                "sparse_topk_blocks": 4, "sparse_local_block": 1, "sparse_init_block": 1
            },
            "some_unknown_field": {"ignored": true}
        }
    })
}

#[test]
fn hf_spelling_parses() {
    let c = ModelConfig::from_json_value(&hf_config()).unwrap();
    assert_eq!(c.hidden_size, 64);
    assert_eq!(c.rotary_dim, 8);
    assert_eq!(
        c.attn_kinds,
        vec![AttnKind::Full, AttnKind::Sparse, AttnKind::Sparse]
    );
    // The per-layer list wins over first_k_dense = 2.
    assert_eq!(
        c.mlp_kinds,
        vec![MlpKind::Dense, MlpKind::Moe, MlpKind::Moe]
    );
    assert_eq!(
        (
            c.index_n_heads,
            c.index_head_dim,
            c.index_block_size,
            c.index_topk_blocks
        ),
        (2, 16, 8, 4)
    );
    assert_eq!((c.index_local_blocks, c.index_init_blocks), (1, 1));
    assert_eq!(c.model_type, "minimax_m3_vl_text");

    // mlp_layer_types beats moe_layer_freq.
    let mut v = hf_config();
    v["text_config"]["mlp_layer_types"] = json!(["dense", "dense", "sparse"]);
    let c = ModelConfig::from_json_value(&v).unwrap();
    assert_eq!(
        c.mlp_kinds,
        vec![MlpKind::Dense, MlpKind::Dense, MlpKind::Moe]
    );

    // Without lists, first_k_dense decides.
    let mut v = hf_config();
    v["text_config"]
        .as_object_mut()
        .unwrap()
        .remove("moe_layer_freq");
    let c = ModelConfig::from_json_value(&v).unwrap();
    assert_eq!(
        c.mlp_kinds,
        vec![MlpKind::Dense, MlpKind::Dense, MlpKind::Moe]
    );

    // index_selection = shared lifts the index-heads == kv-heads rule.
    let mut v = hf_config();
    v["text_config"]["sparse_attention_config"]["sparse_num_index_heads"] = json!(3);
    assert_eq!(
        err_field(ModelConfig::from_json_value(&v).unwrap_err()),
        "text_config.index_n_heads"
    );
    v["text_config"]["index_selection"] = json!("shared");
    let c = ModelConfig::from_json_value(&v).unwrap();
    assert_eq!(
        (c.index_n_heads, c.index_selection),
        (3, IndexSelection::Shared)
    );
}

/// An edit of the `text_config` object.
type Edit = Box<dyn FnOnce(&mut serde_json::Map<String, Value>)>;

fn edit(f: impl FnOnce(&mut serde_json::Map<String, Value>)) -> Result<ModelConfig, ConfigError> {
    let mut v = hf_config();
    f(v["text_config"].as_object_mut().unwrap());
    ModelConfig::from_json_value(&v)
}

#[test]
fn bad_configs_name_the_field() {
    let cases: Vec<(&str, Edit)> = vec![
        (
            "text_config.hidden_size",
            Box::new(|m| {
                m.remove("hidden_size");
            }),
        ),
        (
            "text_config.vocab_size",
            Box::new(|m| {
                m.insert("vocab_size".into(), json!("many"));
            }),
        ),
        (
            "text_config.rotary_dim",
            Box::new(|m| {
                m.remove("partial_rotary_factor");
            }),
        ),
        (
            "text_config.rotary_dim",
            Box::new(|m| {
                m.insert("rotary_dim".into(), json!(7));
            }),
        ),
        (
            "text_config.rotary_dim",
            Box::new(|m| {
                m.insert("rotary_dim".into(), json!(18));
            }),
        ),
        (
            "text_config.num_attention_heads",
            Box::new(|m| {
                m.insert("num_attention_heads".into(), json!(5));
            }),
        ),
        (
            "text_config.num_experts_per_tok",
            Box::new(|m| {
                m.insert("num_experts_per_tok".into(), json!(5));
            }),
        ),
        (
            "text_config.layer_types",
            Box::new(|m| {
                m.insert("layer_types".into(), json!(["full_attention"]));
            }),
        ),
        (
            "text_config.layer_types",
            Box::new(|m| {
                m.insert(
                    "layer_types".into(),
                    json!(["full_attention", "linear", "sparse"]),
                );
            }),
        ),
        (
            "text_config.moe_layer_freq",
            Box::new(|m| {
                m.insert("moe_layer_freq".into(), json!([0, 2, 1]));
            }),
        ),
        (
            "text_config.hidden_act",
            Box::new(|m| {
                m.insert("hidden_act".into(), json!("silu"));
            }),
        ),
        (
            "text_config.dense_intermediate_size",
            Box::new(|m| {
                m.remove("dense_intermediate_size");
            }),
        ),
        (
            "text_config.index_head_dim",
            Box::new(|m| {
                m["sparse_attention_config"]
                    .as_object_mut()
                    .unwrap()
                    .remove("sparse_index_dim");
            }),
        ),
        (
            "text_config.index_selection",
            Box::new(|m| {
                m.insert("index_selection".into(), json!("max"));
            }),
        ),
    ];
    for (field, f) in cases {
        let e = edit(f).expect_err(field);
        let msg = e.to_string();
        assert!(!msg.contains('\n'), "{msg}");
        assert!(msg.contains(field), "{msg} should name {field}");
        assert_eq!(err_field(e), field);
    }
    assert!(matches!(
        ModelConfig::from_json_str("{nope"),
        Err(ConfigError::Json(_))
    ));
    assert!(ModelConfig::from_json_str("[1]").is_err());
}
