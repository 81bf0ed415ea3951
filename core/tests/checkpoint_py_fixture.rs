//! A checkpoint written by another program (tests/fixtures/py_ckpt, made by
//! numpy + safetensors in Python) loads, and the values m3 decodes equal the
//! ones the Python script decoded from the same bytes (`expected.json`).

use std::path::PathBuf;

use m3_core::checkpoint::{Checkpoint, LoadOptions};
use m3_core::config::{AttnKind, MlpKind};
use m3_core::formats::MxElem;
use m3_core::weights::{FfnWeights, LinearWeight, ModelWeights};
use serde_json::Value;

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/py_ckpt")
}

/// Value (row, col) of a linear weight, decoded by m3.
fn value(w: &LinearWeight, row: usize, col: usize) -> f32 {
    match w {
        LinearWeight::Bf16 { cols, data, .. } => {
            m3_core::formats::bf16::to_f32(data[row * cols + col])
        }
        LinearWeight::F32 { cols, data, .. } => data[row * cols + col],
        LinearWeight::Mx(t) => {
            let mut out = vec![0.0; t.cols()];
            t.dequantize_row(row, &mut out);
            out[col]
        }
        LinearWeight::Nvfp4(t) => t.value_f64(row, col) as f32,
    }
}

/// The m3 value behind an `expected.json` entry, found by tensor name.
fn lookup(w: &ModelWeights, tensor: &str, row: usize, col: usize) -> f32 {
    let p = "language_model.model.";
    match tensor {
        t if t == format!("{p}embed_tokens.weight") => value(&w.embed, row, col),
        "language_model.lm_head.weight" => value(&w.lm_head, row, col),
        t if t == format!("{p}layers.0.self_attn.q_proj.weight") => {
            value(&w.layers[0].attn.q, row, col)
        }
        t if t == format!("{p}layers.0.input_layernorm.weight") => w.layers[0].input_norm[col],
        t if t == format!("{p}layers.1.block_sparse_moe.experts.2.w2.weight") => {
            match &w.layers[1].ffn {
                FfnWeights::Moe(m) => value(&m.experts[2].down, row, col),
                FfnWeights::Dense(_) => panic!("layer 1 should be MoE"),
            }
        }
        t if t == format!("{p}layers.1.block_sparse_moe.e_score_correction_bias") => {
            match &w.layers[1].ffn {
                FfnWeights::Moe(m) => m.correction_bias[col],
                FfnWeights::Dense(_) => panic!("layer 1 should be MoE"),
            }
        }
        other => panic!("expected.json names {other}, which this test does not map"),
    }
}

#[test]
fn python_written_checkpoint_loads_with_hand_decoded_values() {
    let ck = Checkpoint::open(fixture()).unwrap();
    let c = ck.config();
    assert_eq!(
        (c.hidden_size, c.num_hidden_layers, c.rotary_dim),
        (64, 2, 8)
    );
    assert_eq!(c.attn_kinds, vec![AttnKind::Sparse; 2]);
    assert_eq!(c.mlp_kinds, vec![MlpKind::Dense, MlpKind::Moe]);
    assert_eq!(ck.shard_names().len(), 2);
    assert_eq!(ck.vision_skipped(), 1);
    assert!(ck.warnings().is_empty(), "{:?}", ck.warnings());
    assert!(ck.unused_tensors().is_empty(), "{:?}", ck.unused_tensors());

    let w = ck.load(&LoadOptions::default()).unwrap();
    // Formats as written: MXFP8 attention + indexer, MXFP4 experts, bf16 rest, f32 router.
    assert!(matches!(&w.layers[0].attn.q, LinearWeight::Mx(t) if t.elem() == MxElem::Fp8E4M3));
    let idx = w.layers[1].attn.indexer.as_ref().unwrap();
    assert!(
        matches!(&idx.k, LinearWeight::Mx(t) if t.elem() == MxElem::Fp8E4M3 && t.rows() == 16 && t.cols() == 64)
    );
    assert!(
        matches!(&w.layers[0].ffn, FfnWeights::Dense(m) if matches!(m.gate, LinearWeight::Bf16 { rows: 64, cols: 64, .. }))
    );
    let FfnWeights::Moe(m) = &w.layers[1].ffn else {
        panic!("layer 1 should be MoE")
    };
    assert_eq!(m.experts.len(), 4);
    assert!(
        matches!(&m.experts[3].up, LinearWeight::Mx(t) if t.elem() == MxElem::Fp4E2M1 && t.rows() == 32 && t.cols() == 64)
    );
    assert!(matches!(
        &m.router,
        LinearWeight::F32 {
            rows: 4,
            cols: 64,
            ..
        }
    ));
    assert!(m.shared.is_some());
    assert_eq!(w.layers[0].attn.k_scale, 1.0);

    let exp: Value =
        serde_json::from_str(&std::fs::read_to_string(fixture().join("expected.json")).unwrap())
            .unwrap();
    let vals = exp["values"].as_array().unwrap();
    assert!(vals.len() >= 6);
    for v in vals {
        let t = v["tensor"].as_str().unwrap();
        let (r, c) = (
            v["row"].as_u64().unwrap() as usize,
            v["col"].as_u64().unwrap() as usize,
        );
        let want = v["value"].as_f64().unwrap() as f32;
        let got = lookup(&w, t, r, c);
        assert_eq!(
            got.to_bits(),
            want.to_bits(),
            "{t}[{r}, {c}]: m3 {got} vs numpy {want}"
        );
    }
    // The comparison can fail: a neighbouring value differs from the probe.
    let v0 = &vals[1];
    let (t, r, c) = (
        v0["tensor"].as_str().unwrap(),
        v0["row"].as_u64().unwrap() as usize,
        v0["col"].as_u64().unwrap() as usize,
    );
    let neighbours: Vec<f32> = (0..8).map(|k| lookup(&w, t, r, (c + 1 + k) % 64)).collect();
    assert!(neighbours
        .iter()
        .any(|x| *x != v0["value"].as_f64().unwrap() as f32));
}

#[test]
fn python_checkpoint_lists_tensors_and_raw_bytes() {
    let ck = Checkpoint::open(fixture()).unwrap();
    let list = ck.tensors();
    assert_eq!(list.len(), 72);
    let e = list
        .iter()
        .find(|t| t.name.ends_with("experts.0.w1.weight"))
        .unwrap();
    assert_eq!((e.shape.clone(), e.nbytes), (vec![32, 32], 1024));
    assert_eq!(e.file, "model-00002-of-00002.safetensors");
    assert_eq!(ck.raw_bytes(&e.name).unwrap().len(), 1024);
    assert!(ck.raw_bytes("nope.weight").is_err());
}
