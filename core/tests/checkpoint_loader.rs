//! The loader on well-formed checkpoints built in a temp dir: layouts,
//! formats, the NVFP4 -> MXFP4 load option, `quantization_config` cross-checks.

mod checkpoint_util;

use checkpoint_util::*;
use m3_core::checkpoint::names::Family;
use m3_core::checkpoint::{Checkpoint, LoadOptions, WeightFormat};
use m3_core::formats::{convert, MxElem, Nvfp4Tensor, ScaleRule};
use m3_core::weights::{FfnWeights, LinearWeight};
use serde_json::json;

fn moe(w: &m3_core::weights::ModelWeights) -> &m3_core::weights::MoeWeights {
    match &w.layers[1].ffn {
        FfnWeights::Moe(m) => m,
        FfnWeights::Dense(_) => panic!("layer 1 is MoE in Spec::tiny"),
    }
}

#[test]
fn tiny_loads_with_stored_formats_and_bytes() {
    let spec = Spec::tiny();
    let groups = tensors(&spec);
    let d = build(&spec);
    let ck = Checkpoint::open(d.path()).unwrap();
    assert_eq!(ck.config(), &spec.cfg);
    assert!(ck.warnings().is_empty(), "{:?}", ck.warnings());
    assert!(ck.unused_tensors().is_empty());
    let q = ck.names().layer(0).q_proj();
    assert_eq!(ck.detect_format(&q).unwrap(), WeightFormat::Mxfp8E4M3);
    assert_eq!(
        ck.logical_shape(&ck.names().layer(1).expert(0).gate())
            .unwrap(),
        (64, 128, WeightFormat::Mxfp4)
    );
    let w = ck.load(&LoadOptions::default()).unwrap();
    assert_eq!(w.layers.len(), 2);
    // The stored bytes come through unchanged (compared with what was written).
    let written = |suffix: &str| {
        groups
            .iter()
            .flatten()
            .find(|t| t.name.ends_with(suffix))
            .unwrap()
            .data
            .clone()
    };
    match &moe(&w).experts[7].down {
        LinearWeight::Mx(t) => {
            assert_eq!((t.elem(), t.rows(), t.cols()), (MxElem::Fp4E2M1, 128, 64));
            assert_eq!(t.codes(), &written("experts.7.w2.weight")[..]);
            assert_eq!(t.scales(), &written("experts.7.w2.weight_scale")[..]);
        }
        other => panic!("expected MXFP4, got {other:?}"),
    }
    match &w.embed {
        LinearWeight::Bf16 {
            rows: 512,
            cols: 128,
            data,
        } => {
            let raw = written("embed_tokens.weight");
            assert_eq!(data[3], u16::from_le_bytes([raw[6], raw[7]]));
        }
        other => panic!("expected bf16 embed, got {other:?}"),
    }
    assert!(w.layers[0].attn.indexer.is_some());
    assert_eq!(moe(&w).experts.len(), 8);
    assert!(matches!(
        moe(&w).router,
        LinearWeight::F32 {
            rows: 8,
            cols: 128,
            ..
        }
    ));
}

#[test]
fn unprefixed_single_file_checkpoint_loads() {
    let mut spec = Spec::tiny();
    spec.prefix = false;
    let d = tempfile::tempdir().unwrap();
    let all: Vec<T> = tensors(&spec).into_iter().flatten().collect();
    std::fs::write(d.path().join("config.json"), spec.cfg.to_json()).unwrap();
    std::fs::write(d.path().join("model.safetensors"), safetensors_bytes(&all)).unwrap();
    let ck = Checkpoint::open(d.path()).unwrap();
    assert_eq!(ck.names().prefix(), "");
    ck.load(&LoadOptions::default()).unwrap();
}

#[test]
fn nvfp4_experts_convert_to_mxfp4_at_load() {
    let mut spec = Spec::tiny();
    spec.experts = Fmt::Nvfp4;
    spec.quant = Some(
        json!({"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16,
        "exclude_modules": ["lm_head", "*self_attn*", "*mlp*", "*shared_experts*", "*block_sparse_moe.gate"]}),
    );
    let d = build(&spec);
    let ck = Checkpoint::open(d.path()).unwrap();
    let native = ck.load(&LoadOptions::default()).unwrap();
    let LinearWeight::Nvfp4(nv) = &moe(&native).experts[0].gate else {
        panic!("expected NVFP4")
    };
    assert_eq!(nv.global(), 0.01);
    let conv = ck
        .load(&LoadOptions {
            nvfp4_experts_to_mxfp4: Some(ScaleRule::Even),
            ..Default::default()
        })
        .unwrap();
    let LinearWeight::Mx(mx) = &moe(&conv).experts[0].gate else {
        panic!("expected MXFP4 after conversion")
    };
    assert_eq!(mx.elem(), MxElem::Fp4E2M1);
    assert_eq!(mx, &convert::nvfp4_to_mxfp4(nv, ScaleRule::Even));
    // Only routed experts convert; attention stays MXFP8.
    assert!(matches!(&conv.layers[1].attn.q, LinearWeight::Mx(t) if t.elem() == MxElem::Fp8E4M3));
    // The conversion is close to the exact values (relative L2 well under 20%).
    let (a, b): (Vec<f64>, Vec<f32>) = (
        (0..nv.rows() * nv.cols())
            .map(|i| nv.value_f64(i / nv.cols(), i % nv.cols()))
            .collect(),
        mx.dequantize(),
    );
    let num: f64 = a.iter().zip(&b).map(|(x, y)| (x - *y as f64).powi(2)).sum();
    let den: f64 = a.iter().map(|x| x * x).sum();
    assert!((num / den).sqrt() < 0.2, "rel L2 {}", (num / den).sqrt());
    let _: &Nvfp4Tensor = nv;
}

#[test]
fn quant_config_contradiction_names_the_tensor() {
    // MXFP4 experts but a modelopt NVFP4 config.
    let mut spec = Spec::tiny();
    spec.quant = Some(
        json!({"quant_method": "modelopt", "quant_algo": "NVFP4", "exclude_modules": ["*self_attn*", "*mlp*", "*shared_experts*", "lm_head"]}),
    );
    let d = build(&spec);
    let e = Checkpoint::open(d.path())
        .unwrap()
        .load(&LoadOptions::default())
        .unwrap_err()
        .to_string();
    assert_names(
        &e,
        &["block_sparse_moe.experts.0.w1.weight", "nvfp4", "mxfp4"],
    );

    // A matching quark config loads.
    spec.quant = Some(json!({"quant_method": "quark",
        "global_quant_config": {"weight": {"dtype": "fp4", "group_size": 32}},
        "layer_quant_config": {"*self_attn*": {"weight": {"dtype": "fp8_e4m3", "group_size": 32}},
                               "*.mlp.*": {"weight": {"dtype": "fp8_e4m3", "group_size": 32}},
                               "*shared_experts*": {"weight": {"dtype": "fp8_e4m3", "group_size": 32}}},
        "exclude": ["lm_head"]}));
    let d = build(&spec);
    Checkpoint::open(d.path())
        .unwrap()
        .load(&LoadOptions::default())
        .unwrap();

    // fp8 config with MXFP4 experts contradicts.
    spec.quant =
        Some(json!({"quant_method": "fp8", "weight_block_size": [1, 32], "scale_fmt": "ue8m0"}));
    let d = build(&spec);
    let e = Checkpoint::open(d.path())
        .unwrap()
        .validate()
        .unwrap_err()
        .to_string();
    assert_names(&e, &["experts.0.w1.weight", "fp8"]);
}

#[test]
fn vision_tensors_skipped_and_extras_reported() {
    let spec = Spec::tiny();
    let d = build_with(&spec, |g| {
        g[0].push(T {
            name: "vision_tower.blocks.0.qkv.weight".into(),
            dtype: "BF16",
            shape: vec![4, 4],
            data: vec![0; 32],
        });
        // An expert past num_local_experts: unused, reported, not fatal.
        let mut extra = find(g, "experts.0.w1.weight").clone();
        extra.name = extra.name.replace("experts.0.", "experts.99.");
        g[1].push(extra);
    });
    std::fs::write(d.path().join("stray.safetensors"), safetensors_bytes(&[])).unwrap();
    let ck = Checkpoint::open(d.path()).unwrap();
    assert_eq!(ck.vision_skipped(), 1);
    assert!(ck.tensors().iter().any(|t| t.family == Family::Vision));
    let unused = ck.unused_tensors();
    assert_eq!(unused.len(), 1, "{unused:?}");
    assert!(unused[0].contains("experts.99."));
    assert!(
        ck.warnings()
            .iter()
            .any(|w| w.contains("stray.safetensors")),
        "{:?}",
        ck.warnings()
    );
    ck.load(&LoadOptions::default()).unwrap();
}
