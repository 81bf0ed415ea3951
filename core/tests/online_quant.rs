//! Online PTPC FP8 at load (ARCHITECTURE.md, *Online quantization*): the
//! E4M3 unit table and the exact dot, which linears are converted, and the
//! errors (each test opens with a control that could fail).

use m3_core::checkpoint::online::{apply, targets, OnlineQuant};
use m3_core::checkpoint::{Checkpoint, LoadOptions};
use m3_core::config::{AttnKind, MlpKind, ModelConfig};
use m3_core::formats::convert::{e4m3_units, ptpc_dot};
use m3_core::formats::fp8::e4m3;
use m3_core::synth::{write_checkpoint, DenseFormat, ExpertFormat, SynthSpec};
use m3_core::weights::FfnWeights;

#[test]
fn e4m3_units_is_the_decoded_value_in_units_of_2_pow_minus_9() {
    for c in 0..=255u8 {
        let d = e4m3::decode(c);
        match e4m3_units(c) {
            None => assert!(d.is_nan(), "code {c:#x}"),
            Some(u) => assert_eq!(u as f64 * 2f64.powi(-9), d as f64, "code {c:#x}"),
        }
    }
}

#[test]
fn ptpc_dot_is_the_exact_sum_rounded_once() {
    let (big, one) = (0x7Eu8, 0x38u8); // 448, 1.0
                                       // 100 x 448^2, then 1, then 100 x -448^2: exactly 1.
    let mut qa = vec![big; 100];
    qa.push(one);
    qa.extend(vec![big | 0x80; 100]);
    let mut qw = vec![big; 100];
    qw.push(one);
    qw.extend(vec![big; 100]);
    assert_eq!(ptpc_dot(&qa, &qw), Some(1.0));
    // control: an f32 running sum loses the 1 (past 2^24 the ulp is 2)
    let mut f = 0f32;
    for (&a, &w) in qa.iter().zip(&qw) {
        f += e4m3::decode(a) * e4m3::decode(w);
    }
    assert_eq!(f, 0.0);
    // NaN codes are reported
    assert_eq!(ptpc_dot(&[0x7F], &[one]), None);
}

fn tiny(dir: &std::path::Path, dense: DenseFormat) -> Checkpoint {
    let cfg = ModelConfig::preset("tiny").unwrap().with_layers(2).unwrap();
    let spec = SynthSpec::new(cfg, ExpertFormat::Mxfp4, dense);
    write_checkpoint(&spec, dir).unwrap();
    Checkpoint::open(dir).unwrap()
}

#[test]
fn converts_attention_and_dense_mlp_only_and_honours_exclusions() {
    let d = tempfile::tempdir().unwrap();
    let ck = tiny(&d.path().join("m"), DenseFormat::Mxfp8);
    let plain = ck.load(&LoadOptions::default()).unwrap();
    assert!(plain.layers.iter().all(|l| !l.ptpc.any()), "off by default");
    let opts = |exclude| LoadOptions {
        online_quant: Some(OnlineQuant::ptpc_fp8(exclude)),
        ..LoadOptions::default()
    };
    let w = ck.load(&opts("")).unwrap();
    let c = &w.config;
    for (l, lw) in w.layers.iter().enumerate() {
        let p = &lw.ptpc;
        assert!(p.q.is_some() && p.k.is_some() && p.v.is_some() && p.o.is_some());
        let sparse = c.attn_kinds[l] == AttnKind::Sparse;
        assert_eq!(p.index_q.is_some(), sparse, "layer {l}");
        assert_eq!(p.index_k.is_some(), sparse, "layer {l}");
        let dense = c.mlp_kinds[l] == MlpKind::Dense;
        assert_eq!(
            p.gate.is_some() && p.up.is_some() && p.down.is_some(),
            dense
        );
        assert_eq!(matches!(lw.ffn, FfnWeights::Dense(_)), dense);
        // the stored weights stay as they were
        assert_eq!(lw.attn, plain.layers[l].attn);
    }
    assert_eq!(w.lm_head, plain.lm_head);
    // exclusions by name
    let x = ck.load(&opts("o_proj, layers.0.")).unwrap();
    assert_eq!(x.layers[0].ptpc.count(), 0);
    assert!(x.layers[1].ptpc.o.is_none() && x.layers[1].ptpc.q.is_some());
    let n = targets(c, ck.names(), &OnlineQuant::ptpc_fp8("o_proj")).unwrap();
    assert!(n.iter().all(|t| !t.name.contains("o_proj")));
    // a pattern that excludes nothing is an error
    let e = ck.load(&opts("o_prj")).unwrap_err().to_string();
    assert!(e.contains("`o_prj`") && e.contains("matches none"), "{e}");
    // the router / experts are never targets, so a pattern naming them is refused too
    let e = ck.load(&opts("block_sparse_moe")).unwrap_err().to_string();
    assert!(e.contains("matches none"), "{e}");
}

#[test]
fn from_bf16_and_mxfp8_and_stored_linear_refuses_targets() {
    let d = tempfile::tempdir().unwrap();
    let ck = tiny(&d.path().join("m"), DenseFormat::Bf16);
    let oq = OnlineQuant::ptpc_fp8("");
    let opts = LoadOptions {
        online_quant: Some(oq),
        ..LoadOptions::default()
    };
    let mut w = ck.load(&LoadOptions::default()).unwrap();
    let n = apply(&mut w, ck.names(), &oq).unwrap();
    assert_eq!(w, ck.load(&opts).unwrap(), "apply == load with the option");
    assert!(n > 0);
    let c = ck.config().clone();
    let ln = ck.names().layer(0);
    let (h, qd) = (c.hidden_size, c.num_attention_heads * c.head_dim);
    // control: without the option the stored form is there
    assert!(ck
        .stored_linear(&ln.q_proj(), qd, h, false, &LoadOptions::default())
        .is_ok());
    let e = ck
        .stored_linear(&ln.q_proj(), qd, h, false, &opts)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(&ln.q_proj()) && e.contains("online_linear"),
        "{e}"
    );
    // a non-target (the LM head) still has its stored form
    assert!(ck
        .stored_linear(&ck.names().lm_head(), c.vocab_size, h, false, &opts)
        .is_ok());
    // a streaming loader's PTPC form is the host load's, target by target
    let q = ck.online_linear(&ln.q_proj(), qd, h, &opts).unwrap();
    assert_eq!(q.as_ref(), w.layers[0].ptpc.q.as_ref());
    assert!(q.is_some());
    let kd = c.num_key_value_heads * c.head_dim;
    let o = ck.online_linear(&ln.o_proj(), h, qd, &opts).unwrap();
    assert_eq!(o.as_ref(), w.layers[0].ptpc.o.as_ref());
    assert_eq!(
        ck.online_linear(&ln.v_proj(), kd, h, &opts)
            .unwrap()
            .as_ref(),
        w.layers[0].ptpc.v.as_ref()
    );
    // not a target, or no option: no PTPC form
    let lm = ck.names().lm_head();
    assert!(ck
        .online_linear(&lm, c.vocab_size, h, &opts)
        .unwrap()
        .is_none());
    assert!(ck
        .online_linear(&ln.q_proj(), qd, h, &LoadOptions::default())
        .unwrap()
        .is_none());
    // the targets, checked like a load: an excluded one has none, and a
    // pattern that excludes nothing is an error
    let some = LoadOptions {
        online_quant: Some(OnlineQuant::ptpc_fp8("q_proj")),
        ..LoadOptions::default()
    };
    assert!(ck
        .online_linear(&ln.q_proj(), qd, h, &some)
        .unwrap()
        .is_none());
    assert_eq!(ck.online_targets(&opts).unwrap().len(), n);
    let typo = LoadOptions {
        online_quant: Some(OnlineQuant::ptpc_fp8("no_such")),
        ..LoadOptions::default()
    };
    let e = ck.online_targets(&typo).unwrap_err().to_string();
    assert!(e.contains("no_such"), "{e}");
}

/// `ptpc_dot`'s branch-free loop equals the per-code sum of
/// `e4m3_units` (checked against the E4M3 decode above) on every pair of
/// codes, alone and after terms that cancel, NaN codes giving None.
#[test]
fn ptpc_dot_equals_the_literal_sum_on_every_code_pair() {
    for a in 0..=255u8 {
        for w in 0..=255u8 {
            let want = match (e4m3_units(a), e4m3_units(w)) {
                (Some(x), Some(y)) => {
                    Some((x as i64 * y as i64) as f32 * f32::from_bits((127 - 18) << 23))
                }
                _ => None,
            };
            // one pair, and the pair after terms that cancel exactly
            // (1.0 * 2.0 + -1.0 * 2.0): the same value
            assert_eq!(ptpc_dot(&[a], &[w]), want, "{a:#x} x {w:#x}");
            let (qa, qw) = ([0x38u8, 0xb8, a], [0x40u8, 0x40, w]);
            assert_eq!(ptpc_dot(&qa, &qw), want, "3-term {a:#x} x {w:#x}");
        }
    }
}

/// `SynthSpec::bf16_attention_layers` (`m3 synth --bf16-attention-layers`):
/// the Quark export's shape, some layers' attention left bf16 among MXFP8
/// ones, described by per-layer exclusions; it loads (the config agrees
/// with the tensors), PTPC converts both kinds, and a layer past the model
/// is refused.
#[test]
fn quark_style_bf16_attention_layers_load_and_convert() {
    use m3_core::weights::LinearWeight;
    let d = tempfile::tempdir().unwrap();
    let cfg = ModelConfig::preset("tiny").unwrap().with_layers(3).unwrap();
    let mut spec = SynthSpec::new(cfg.clone(), ExpertFormat::Mxfp4, DenseFormat::Mxfp8);
    spec.bf16_attention_layers = vec![0, 2];
    spec.draft = None;
    let dir = d.path().join("q");
    write_checkpoint(&spec, &dir).unwrap();
    let ck = Checkpoint::open(&dir).unwrap();
    let w = ck.load(&LoadOptions::default()).unwrap();
    for (l, lw) in w.layers.iter().enumerate() {
        let bf16 = [0, 2].contains(&l);
        let a = &lw.attn;
        let ix = a.indexer.as_ref().expect("tiny layers are sparse");
        for (name, x) in [("q", &a.q), ("o", &a.o), ("index_k", &ix.k)] {
            assert_eq!(
                matches!(x, LinearWeight::Bf16 { .. }),
                bf16,
                "layer {l} {name}"
            );
        }
        // the rest of the layer keeps --dense (MXFP8) or the experts' MXFP4
        if let FfnWeights::Dense(m) = &lw.ffn {
            assert!(
                matches!(m.down, LinearWeight::Mx(_)),
                "layer {l} dense down"
            );
        }
    }
    let p = ck
        .load(&LoadOptions {
            online_quant: Some(OnlineQuant::ptpc_fp8("")),
            ..LoadOptions::default()
        })
        .unwrap();
    assert!(p
        .layers
        .iter()
        .all(|l| l.ptpc.q.is_some() && l.ptpc.o.is_some()));
    // a layer the model does not have
    let mut bad = SynthSpec::new(cfg, ExpertFormat::Mxfp4, DenseFormat::Mxfp8);
    bad.bf16_attention_layers = vec![3];
    let e = write_checkpoint(&bad, &d.path().join("bad"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("layer 3") && e.contains("3 layers"), "{e}");
    assert!(!d.path().join("bad").exists(), "nothing left behind");
}
