//! Whole-step properties of the CPU reference on the `tiny` preset.

mod common;

use common::*;
use m3_core::backend::{
    forward_by_ops, ActMode, Path, RunOptions, StepBatch, TapData, TapRequest, Taps,
};
use m3_core::config::{AttnKind, IndexSelection};
use m3_core::kv::CacheDtype;
use m3_core::weights::{FfnWeights, LinearWeight, ModelWeights};
use m3_cpu_ref::synthetic::{Formats, WeightFormat};
use m3_cpu_ref::CpuBackend;

const BF: RunOptions = RunOptions {
    act: ActMode::Bf16,
    tensor_parallel: 1,
};

#[test]
fn one_and_four_threads_give_identical_bits() {
    let m = model(
        &tiny(),
        Formats {
            experts: WeightFormat::Mxfp4,
            dense: WeightFormat::Mxfp8,
        },
    );
    let toks = tokens(90, 1);
    let a = pool(1).install(|| prefill(&m, &toks, CacheDtype::Bf16, BF, TapRequest::ALL));
    let b = pool(4).install(|| prefill(&m, &toks, CacheDtype::Bf16, BF, TapRequest::ALL));
    // 4 layers x (residual, topk, scores, attn_out, ffn_in, ffn_out) + 3
    // MoE expert taps + logits.
    assert_eq!(a.tensors.len(), 4 * 6 + 3 + 1);
    taps_bit_equal(&a, &b).expect("1 vs 4 threads");
    // The comparison can fail: flip one low bit of one residual.
    let mut c = b.clone();
    if let Some(t) = c.tensors.get_mut("residual.2") {
        if let TapData::F32(v) = &mut t.data {
            v[17] = f32::from_bits(v[17].to_bits() ^ 1);
        }
    }
    assert!(
        taps_bit_equal(&a, &c).is_err(),
        "a planted 1-ulp error must be caught"
    );
}

/// Feed `toks` one row per step into one cache; collect per-step taps.
fn decode_one_by_one(m: &ModelWeights, toks: &[u32]) -> Vec<Taps> {
    let mut c = cache(m, CacheDtype::Bf16);
    let bt = block_table(toks.len());
    (0..toks.len())
        .map(|p| {
            let mut step = StepBatch::contiguous(1, &toks[p..p + 1], p as u32, &bt, PAGE, true);
            step.seqs[0].block_table = bt.clone();
            let mut taps = Taps::new(TapRequest::STANDARD);
            forward_by_ops(
                &CpuBackend,
                m,
                &mut c,
                &step,
                Path::Standard,
                &BF,
                &mut taps,
            )
            .expect("decode");
            taps
        })
        .collect()
}

#[test]
fn prefill_equals_token_by_token_decode() {
    // Tolerance: rel L2 <= 1e-6 per tensor and row; discrete taps exact.
    // (The reference's per-output reduction order does not depend on the
    // number of rows, so in practice the match is exact.)
    let cfg = tiny();
    let m = model(
        &cfg,
        Formats {
            experts: WeightFormat::Nvfp4,
            dense: WeightFormat::Bf16,
        },
    );
    let toks = tokens(100, 2);
    let pre = prefill(&m, &toks, CacheDtype::Bf16, BF, TapRequest::STANDARD);
    let dec = decode_one_by_one(&m, &toks);
    let h = cfg.hidden_size;
    let mut worst = 0.0f64;
    for (p, d) in dec.iter().enumerate() {
        for l in 0..cfg.num_hidden_layers {
            let a = &pre.f32(&format!("residual.{l}")).unwrap()[p * h..(p + 1) * h];
            let b = d.f32(&format!("residual.{l}")).unwrap();
            worst = worst.max(rel_l2(b, a));
            let k = cfg.index_topk_blocks;
            let nkv = cfg.num_key_value_heads;
            let sel_pre = pre.i32(&format!("topk_blocks.{l}")).unwrap();
            let sel_dec = d.i32(&format!("topk_blocks.{l}")).unwrap();
            for g in 0..nkv {
                assert_eq!(
                    &sel_pre[(g * toks.len() + p) * k..(g * toks.len() + p + 1) * k],
                    &sel_dec[g * k..(g + 1) * k],
                    "layer {l} head {g} position {p}"
                );
            }
        }
        let v = cfg.vocab_size;
        worst = worst.max(rel_l2(
            d.f32("logits").unwrap(),
            &pre.f32("logits").unwrap()[p * v..(p + 1) * v],
        ));
    }
    eprintln!("prefill vs decode: worst rel L2 {worst:e}");
    assert!(worst <= 1e-6, "worst rel L2 {worst}");
}

#[test]
fn sparse_selection_engages_and_changes_the_output() {
    let cfg = tiny();
    let (bs, k) = (cfg.index_block_size, cfg.index_topk_blocks);
    let m = model(&cfg, Formats::default());
    let toks = tokens(120, 3);
    let t = toks.len();
    let taps = prefill(&m, &toks, CacheDtype::Bf16, BF, TapRequest::ALL);
    let sel = taps.i32("topk_blocks.1").unwrap();
    let scores = taps.f32("index_scores.1").unwrap();
    let nb = (t - 1) / bs + 1;
    let mut unforced_choices = std::collections::BTreeSet::new();
    for p in [70usize, 100, 119] {
        for g in 0..cfg.num_key_value_heads {
            let row = &sel[(g * t + p) * k..(g * t + p + 1) * k];
            let n = p / bs + 1;
            assert!(n > k);
            // K blocks, ascending, the local block included, all visible.
            assert!(row.iter().all(|&b| b >= 0 && (b as usize) < n), "{row:?}");
            assert!(row.windows(2).all(|w| w[0] < w[1]), "{row:?}");
            assert_eq!(*row.last().unwrap() as usize, p / bs, "local block forced");
            // Every unselected visible block scores no higher than the
            // weakest selected non-local one (ties to the lower index).
            let s = &scores[(g * t + p) * nb..(g * t + p) * nb + n];
            let min_sel = row[..k - 1]
                .iter()
                .map(|&b| s[b as usize])
                .fold(f32::INFINITY, f32::min);
            for (b, &sb) in s.iter().enumerate().take(n - 1) {
                if !row.contains(&(b as i32)) {
                    assert!(
                        sb <= min_sel,
                        "block {b} score {sb} beats a selected {min_sel}"
                    );
                }
            }
            unforced_choices.insert(row[..k - 1].to_vec());
        }
    }
    // The selection is data-dependent, not a fixed prefix.
    assert!(unforced_choices.len() > 1, "{unforced_choices:?}");
    // Against "all blocks": a model whose top-k covers everything.
    let mut all_cfg = cfg.clone();
    all_cfg.index_topk_blocks = 64;
    let mut m_all = m.clone();
    m_all.config = all_cfg;
    let dense = prefill(&m_all, &toks, CacheDtype::Bf16, BF, TapRequest::STANDARD);
    let h = cfg.hidden_size;
    let a = taps.f32("residual.0").unwrap();
    let b = dense.f32("residual.0").unwrap();
    // Rows inside the first K blocks see every block either way: identical.
    assert_eq!(&a[..k * bs * h], &b[..k * bs * h]);
    // Rows past them attend to fewer keys: different.
    assert!(rel_l2(&a[100 * h..101 * h], &b[100 * h..101 * h]) > 1e-4);
}

/// A copy of `m` with every quantized linear replaced by its f32 values,
/// decoded by the formats library (whole-tensor `dequantize`), not by the
/// reference's block decoder.
fn dequantized(m: &ModelWeights) -> ModelWeights {
    fn dq(w: &mut LinearWeight) {
        let (rows, cols) = (w.rows(), w.cols());
        let data = match w {
            LinearWeight::Mx(t) => t.dequantize(),
            LinearWeight::Nvfp4(t) => t.dequantize(),
            _ => return,
        };
        *w = LinearWeight::F32 { rows, cols, data };
    }
    let mut m = m.clone();
    for l in &mut m.layers {
        for w in [&mut l.attn.q, &mut l.attn.k, &mut l.attn.v, &mut l.attn.o] {
            dq(w);
        }
        if let Some(ix) = &mut l.attn.indexer {
            dq(&mut ix.q);
            dq(&mut ix.k);
        }
        let mlps: Vec<&mut m3_core::weights::MlpWeights> = match &mut l.ffn {
            FfnWeights::Dense(d) => vec![d],
            FfnWeights::Moe(moe) => moe.experts.iter_mut().chain(moe.shared.as_mut()).collect(),
        };
        for mw in mlps {
            dq(&mut mw.gate);
            dq(&mut mw.up);
            dq(&mut mw.down);
        }
    }
    m
}

#[test]
fn every_weight_format_matches_its_dequantized_twin() {
    let cfg = tiny();
    let toks = tokens(40, 4);
    let base = prefill(
        &model(&cfg, Formats::default()),
        &toks,
        CacheDtype::Bf16,
        BF,
        TapRequest::STANDARD,
    );
    for (experts, dense) in [
        (WeightFormat::Mxfp8, WeightFormat::Mxfp8),
        (WeightFormat::Mxfp4, WeightFormat::Mxfp8),
        (WeightFormat::Nvfp4, WeightFormat::Bf16),
    ] {
        let m = model(&cfg, Formats { experts, dense });
        let q = prefill(&m, &toks, CacheDtype::Bf16, BF, TapRequest::STANDARD);
        let f = prefill(
            &dequantized(&m),
            &toks,
            CacheDtype::Bf16,
            BF,
            TapRequest::STANDARD,
        );
        // Block-wise decode in the inner loop == whole-tensor decode: same bits.
        taps_bit_equal(&q, &f).unwrap_or_else(|e| panic!("{experts:?}/{dense:?}: {e}"));
        let lq = q.f32("logits").unwrap();
        assert!(lq.iter().all(|v| v.is_finite()));
        // And the quantized model is a different (but related) model.
        let e = rel_l2(lq, base.f32("logits").unwrap());
        assert!(e > 1e-3 && e < 1.0, "{experts:?}: rel L2 vs bf16 {e}");
    }
}

#[test]
fn mxfp4_activations_and_fp8_cache_run_and_stay_close() {
    let cfg = tiny();
    let m = model(
        &cfg,
        Formats {
            experts: WeightFormat::Mxfp4,
            dense: WeightFormat::Mxfp8,
        },
    );
    let toks = tokens(70, 5);
    let base = prefill(&m, &toks, CacheDtype::Bf16, BF, TapRequest::STANDARD);
    let a4 = prefill(
        &m,
        &toks,
        CacheDtype::Bf16,
        RunOptions {
            act: ActMode::Mxfp4,
            tensor_parallel: 1,
        },
        TapRequest::STANDARD,
    );
    let f8 = prefill(&m, &toks, CacheDtype::Fp8E4M3, BF, TapRequest::STANDARD);
    let l = base.f32("logits").unwrap();
    for (name, t) in [("mxfp4 act", &a4), ("fp8 cache", &f8)] {
        let e = rel_l2(t.f32("logits").unwrap(), l);
        assert!(e > 0.0 && e < 0.5, "{name}: rel L2 {e}");
    }
    // Layer 0 is dense: w4a4 must not touch it (only routed experts are quantized).
    assert_eq!(a4.f32("residual.0"), base.f32("residual.0"));
}

#[test]
fn m3_full_layers_and_shared_selection() {
    let mut cfg = tiny();
    cfg.attn_kinds[0] = AttnKind::Full;
    cfg.index_selection = IndexSelection::Shared;
    let mut m = model(&tiny(), Formats::default());
    m.config = cfg.clone();
    m.layers[0].attn.indexer = None;
    let toks = tokens(80, 6);
    let t = toks.len();
    let taps = prefill(&m, &toks, CacheDtype::Bf16, BF, TapRequest::STANDARD);
    assert!(
        !taps.tensors.contains_key("topk_blocks.0"),
        "full layer has no selection"
    );
    let sel = taps.i32("topk_blocks.1").unwrap();
    let k = cfg.index_topk_blocks;
    // Shared: both KV heads carry the same selection.
    assert_eq!(&sel[..t * k], &sel[t * k..2 * t * k]);
    assert!(taps.f32("logits").unwrap().iter().all(|v| v.is_finite()));
}

#[test]
fn teacher_forcing_replaces_layer_inputs() {
    let cfg = tiny();
    let m = model(&cfg, Formats::default());
    let toks = tokens(20, 7);
    let free = prefill(&m, &toks, CacheDtype::Bf16, BF, TapRequest::STANDARD);
    // A teacher equal to the free run reproduces it exactly.
    let run = |teacher: std::collections::BTreeMap<usize, Vec<f32>>| {
        let mut c = cache(&m, CacheDtype::Bf16);
        let step = StepBatch::contiguous(1, &toks, 0, &block_table(toks.len()), PAGE, true);
        let mut taps = Taps::new(TapRequest::STANDARD);
        taps.teacher = teacher;
        forward_by_ops(
            &CpuBackend,
            &m,
            &mut c,
            &step,
            Path::Standard,
            &BF,
            &mut taps,
        )
        .expect("forward");
        taps
    };
    let same: std::collections::BTreeMap<usize, Vec<f32>> = (0..4)
        .map(|l| (l, free.f32(&format!("residual.{l}")).unwrap().to_vec()))
        .collect();
    let mut t_same = run(same.clone());
    t_same.teacher.clear();
    taps_bit_equal(&free, &t_same).expect("identity teacher");
    // A perturbed teacher for layer 1 changes layer 2's output, not layer 1's.
    let mut bent = same;
    for v in bent.get_mut(&1).unwrap().iter_mut() {
        *v *= 1.5;
    }
    let t_bent = run(bent);
    assert_eq!(t_bent.f32("residual.1"), free.f32("residual.1"));
    assert_ne!(t_bent.f32("residual.2"), free.f32("residual.2"));
}

#[test]
fn mono_path_rules() {
    let m = model(&tiny(), Formats::default());
    let mut c = cache(&m, CacheDtype::Bf16);
    let toks = tokens(20, 8);
    let step = StepBatch::contiguous(1, &toks, 0, &block_table(20), PAGE, false);
    let err = forward_by_ops(
        &CpuBackend,
        &m,
        &mut c,
        &step,
        Path::Mono,
        &BF,
        &mut Taps::none(),
    );
    assert!(err.is_err(), "a 20-row prefill is not a mono step");
    let step = StepBatch::contiguous(1, &toks[..1], 0, &block_table(20), PAGE, true);
    forward_by_ops(
        &CpuBackend,
        &m,
        &mut c,
        &step,
        Path::Mono,
        &BF,
        &mut Taps::none(),
    )
    .expect("decode may run mono");
}
