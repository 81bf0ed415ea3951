//! `quantization_config` blocks in the three shapes of MODEL.md section 7
//! (Quark MXFP4, ModelOpt NVFP4, FP8 block-32), written by `m3 synth` and
//! (the Quark one) by `m3 convert`.
//!
//! Module patterns are fnmatch-style over module names such as
//! `language_model.model.layers.3.self_attn.q_proj`, the way Quark and
//! ModelOpt match them. The tensors present remain the authority on each
//! tensor's format; the config describes them.

use std::string::String;
use std::vec::Vec;

use serde_json::{json, Value};

use super::plan::{DenseFormat, ExpertFormat};

/// Attention and indexer projections.
pub const ATTN: &str = "*self_attn*";
/// Dense-layer MLPs.
pub const DENSE_MLP: &str = "*.mlp.*";
/// The shared expert.
pub const SHARED: &str = "*shared_experts*";
/// The routed experts.
pub const EXPERTS: &str = "*block_sparse_moe.experts.*";
/// Never quantized: LM head, embedding, router.
pub const ALWAYS_EXCLUDED: [&str; 3] = ["*lm_head", "*embed_tokens", "*block_sparse_moe.gate"];

/// The non-expert linear families and their patterns, in a fixed order.
pub const REST_FAMILIES: [&str; 3] = [ATTN, DENSE_MLP, SHARED];

fn fp4_group32(dynamic: bool) -> Value {
    json!({
        "dtype": "fp4",
        "qscheme": "per_group",
        "group_size": 32,
        "ch_axis": -1,
        "scale_format": "e8m0",
        "scale_calculation_mode": "even",
        "round_method": "half_even",
        "is_dynamic": dynamic,
    })
}

fn fp8_group32() -> Value {
    json!({
        "dtype": "fp8_e4m3",
        "qscheme": "per_group",
        "group_size": 32,
        "ch_axis": -1,
        "scale_format": "e8m0",
        "is_dynamic": false,
    })
}

fn excluded(bf16_patterns: &[&str]) -> Vec<Value> {
    ALWAYS_EXCLUDED
        .iter()
        .chain(bf16_patterns)
        .map(|p| Value::from(*p))
        .collect()
}

/// Quark export: routed experts MXFP4 (fp4, per_group 32, e8m0 scales;
/// activations dynamic fp4 per 32 as Quark writes it, which `--act` may
/// ignore), `mxfp8_patterns` in MXFP8 via `layer_quant_config`, and
/// `bf16_patterns` left unquantized via `exclude`.
pub fn quark(mxfp8_patterns: &[&str], bf16_patterns: &[&str]) -> Value {
    let layer: serde_json::Map<String, Value> = mxfp8_patterns
        .iter()
        .map(|p| {
            (
                String::from(*p),
                json!({"weight": fp8_group32(), "input_tensors": null, "output_tensors": null, "bias": null}),
            )
        })
        .collect();
    json!({
        "quant_method": "quark",
        "global_quant_config": {
            "weight": fp4_group32(false),
            "input_tensors": fp4_group32(true),
            "output_tensors": null,
            "bias": null,
        },
        "layer_quant_config": layer,
        "exclude": excluded(bf16_patterns),
        "export": {"weight_format": "real_quantized", "pack_method": "reorder"},
    })
}

/// ModelOpt NVFP4 (group 16, E4M3 block scales, F32 global scale) for the
/// routed experts, the only `quantized_layers` (ModelOpt's NVFP4 config
/// quantizes every listed module to NVFP4, so MXFP8 linears are not listed:
/// their tensors say what they are); `bf16_patterns` are excluded.
pub fn modelopt_nvfp4(bf16_patterns: &[&str]) -> Value {
    let mut layers = serde_json::Map::new();
    layers.insert(
        EXPERTS.into(),
        json!({"quant_algo": "NVFP4", "group_size": 16}),
    );
    json!({
        "quant_method": "modelopt",
        "quant_algo": "NVFP4",
        "group_size": 16,
        "kv_cache_quant_algo": null,
        "quantized_layers": layers,
        "exclude_modules": excluded(bf16_patterns),
    })
}

/// FP8 block-32 with UE8M0 scales (MXFP8 everywhere it has scales);
/// `bf16_patterns` are listed as not converted.
pub fn fp8_block32(bf16_patterns: &[&str]) -> Value {
    json!({
        "quant_method": "fp8",
        "fmt": "e4m3",
        "activation_scheme": "dynamic",
        "weight_block_size": [1, 32],
        "scale_fmt": "ue8m0",
        "modules_to_not_convert": excluded(bf16_patterns),
    })
}

/// The config `m3 synth` writes for a format choice (None: all bf16).
pub fn for_synth(experts: ExpertFormat, dense: DenseFormat) -> Option<Value> {
    for_synth_with(experts, dense, &[])
}

/// The module pattern of layer `l`'s attention and indexer projections.
pub fn layer_attn(l: usize) -> String {
    format!("*layers.{l}.self_attn*")
}

/// [`for_synth`] with the attention of layers `bf16_attn` excluded by name
/// (stored bf16 whatever `dense` says; exclusions win over a format
/// pattern, as in Quark and ModelOpt).
pub fn for_synth_with(
    experts: ExpertFormat,
    dense: DenseFormat,
    bf16_attn: &[usize],
) -> Option<Value> {
    let per_layer: Vec<String> = bf16_attn.iter().map(|&l| layer_attn(l)).collect();
    let (mx8, mut bf): (Vec<&str>, Vec<&str>) = match dense {
        DenseFormat::Mxfp8 => (REST_FAMILIES.to_vec(), Vec::new()),
        DenseFormat::Bf16 => (Vec::new(), REST_FAMILIES.to_vec()),
    };
    if dense == DenseFormat::Mxfp8 {
        bf.extend(per_layer.iter().map(String::as_str));
    }
    match (experts, dense) {
        (ExpertFormat::Mxfp4, _) => Some(quark(&mx8, &bf)),
        (ExpertFormat::Nvfp4, _) => Some(modelopt_nvfp4(&bf)),
        (ExpertFormat::Mxfp8, _) => Some(fp8_block32(&bf)),
        (ExpertFormat::Bf16, DenseFormat::Mxfp8) => {
            let mut bf = bf;
            bf.push(EXPERTS);
            Some(fp8_block32(&bf))
        }
        (ExpertFormat::Bf16, DenseFormat::Bf16) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_match_model_md() {
        let q = for_synth(ExpertFormat::Mxfp4, DenseFormat::Mxfp8).unwrap();
        assert_eq!(q["quant_method"], "quark");
        assert_eq!(q["global_quant_config"]["weight"]["dtype"], "fp4");
        assert_eq!(q["global_quant_config"]["weight"]["group_size"], 32);
        assert_eq!(q["layer_quant_config"][ATTN]["weight"]["dtype"], "fp8_e4m3");
        let q = for_synth(ExpertFormat::Mxfp4, DenseFormat::Bf16).unwrap();
        assert!(q["exclude"]
            .as_array()
            .unwrap()
            .contains(&Value::from(SHARED)));
        let m = for_synth(ExpertFormat::Nvfp4, DenseFormat::Mxfp8).unwrap();
        assert_eq!(
            (m["quant_method"].as_str(), m["quant_algo"].as_str()),
            (Some("modelopt"), Some("NVFP4"))
        );
        let f = for_synth(ExpertFormat::Mxfp8, DenseFormat::Mxfp8).unwrap();
        assert_eq!(f["weight_block_size"], json!([1, 32]));
        assert_eq!(f["scale_fmt"], "ue8m0");
        assert!(for_synth(ExpertFormat::Bf16, DenseFormat::Bf16).is_none());
    }

    #[test]
    fn bf16_attention_layers_are_excluded_by_name() {
        let q = for_synth_with(ExpertFormat::Mxfp4, DenseFormat::Mxfp8, &[0, 2]).unwrap();
        let ex = q["exclude"].as_array().unwrap();
        for l in ["*layers.0.self_attn*", "*layers.2.self_attn*"] {
            assert!(ex.contains(&Value::from(l)), "{ex:?}");
        }
        assert!(!ex.contains(&Value::from("*layers.1.self_attn*")));
        // the rest of the attention stays MXFP8 by its pattern
        assert_eq!(q["layer_quant_config"][ATTN]["weight"]["dtype"], "fp8_e4m3");
        // the other config shapes exclude by their own key
        let m = for_synth_with(ExpertFormat::Nvfp4, DenseFormat::Mxfp8, &[1]).unwrap();
        assert!(m["exclude_modules"]
            .as_array()
            .unwrap()
            .contains(&Value::from("*layers.1.self_attn*")));
        // no layer: the plain config
        assert_eq!(
            for_synth_with(ExpertFormat::Mxfp4, DenseFormat::Mxfp8, &[]),
            for_synth(ExpertFormat::Mxfp4, DenseFormat::Mxfp8)
        );
    }
}
