//! Op-level checks against small cases computed by hand from the MODEL.md
//! formulas (not from the code under test), through `Backend::run_op`.

use m3_core::backend::{Backend, BlockSelection, LinearInput, Op, StepBatch};
use m3_core::config::IndexSelection;
use m3_core::formats::{MxElem, MxTensor, Nvfp4Tensor};
use m3_core::kv::{CacheDtype, CacheTensor};
use m3_core::weights::{LinearWeight, MlpWeights, MoeWeights};
use m3_cpu_ref::CpuBackend;

fn bf16w(rows: usize, cols: usize, v: &[f32]) -> LinearWeight {
    LinearWeight::Bf16 {
        rows,
        cols,
        data: v.iter().map(|&x| (x.to_bits() >> 16) as u16).collect(),
    }
}

#[test]
fn rmsnorm_gemma_hand_case() {
    // x = [1, 2, 3, 4]: mean(x^2) = 7.5; w = [0, 1, -0.5, 0] -> (1+w) = [1, 2, .5, 1].
    let x = [1.0f32, 2.0, 3.0, 4.0];
    let w = [0.0f32, 1.0, -0.5, 0.0];
    let mut out = [0.0f32; 4];
    CpuBackend
        .run_op(Op::RmsNorm {
            x: &x,
            width: 4,
            weight: &w,
            eps: 0.0,
            round_out: false,
            out: &mut out,
        })
        .unwrap();
    let r = 7.5f64.sqrt();
    let want = [1.0 / r, 2.0 * 2.0 / r, 3.0 * 0.5 / r, 4.0 / r];
    for (o, w) in out.iter().zip(want) {
        assert!((*o as f64 - w).abs() < 1e-6, "{o} vs {w}");
    }
}

#[test]
fn rope_neox_partial_hand_case() {
    // head_dim 6, rotary_dim 4, theta 100: pairs (0,2) with f0 = 1 and
    // (1,3) with f1 = 100^(-2/4) = 0.1; dims 4, 5 pass through. p = 3.
    let mut x = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
    CpuBackend
        .run_op(Op::Rope {
            x: &mut x,
            heads: 1,
            head_dim: 6,
            rotary_dim: 4,
            theta: 100.0,
            positions: &[3],
            round_out: false,
        })
        .unwrap();
    let (a0, a1) = (3.0f64, 0.3f64);
    let want = [
        1.0 * a0.cos() - 3.0 * a0.sin(),
        2.0 * a1.cos() - 4.0 * a1.sin(),
        3.0 * a0.cos() + 1.0 * a0.sin(),
        4.0 * a1.cos() + 2.0 * a1.sin(),
        5.0,
        6.0,
    ];
    for (o, w) in x.iter().zip(want) {
        assert!((*o as f64 - w).abs() < 1e-5, "{o} vs {w}");
    }
}

#[test]
fn rope_keeps_phase_at_one_million() {
    // p = 2^20, f0 = 1: angle 1048576 rad; an f32 angle would be off by up to 0.03 rad.
    let mut x = [1.0f32, 0.0];
    CpuBackend
        .run_op(Op::Rope {
            x: &mut x,
            heads: 1,
            head_dim: 2,
            rotary_dim: 2,
            theta: 1e4,
            positions: &[1 << 20],
            round_out: false,
        })
        .unwrap();
    let a = 1_048_576.0f64;
    assert!(
        (x[0] as f64 - a.cos()).abs() < 1e-6 && (x[1] as f64 - a.sin()).abs() < 1e-6,
        "{x:?}"
    );
}

#[test]
fn linear_bf16_and_mxfp4_hand_case() {
    // W (2 x 32) bf16: row 0 all 1, row 1 = 0.5 at even columns; x = 1..32.
    let mut wv = vec![1.0f32; 32];
    wv.extend((0..32).map(|i| if i % 2 == 0 { 0.5 } else { 0.0 }));
    let x: Vec<f32> = (1..=32).map(|i| i as f32).collect();
    let mut y = [0.0f32; 2];
    CpuBackend
        .run_op(Op::Linear {
            x: &x,
            rows: 1,
            w: &bf16w(2, 32, &wv),
            input: LinearInput::Bf16,
            round_out: true,
            out: &mut y,
        })
        .unwrap();
    // sum 1..32 = 528; odd numbers 1,3,..,31 sum to 256, halved = 128.
    assert_eq!(y, [528.0, 128.0]);
    // MXFP4: codes 0x2 (=1.0) everywhere, scale byte 128 (= 2): every weight is 2.
    let codes = vec![0x22u8; 16];
    let w =
        LinearWeight::Mx(MxTensor::from_parts(MxElem::Fp4E2M1, 1, 32, codes, vec![128]).unwrap());
    let mut y1 = [0.0f32];
    CpuBackend
        .run_op(Op::Linear {
            x: &x,
            rows: 1,
            w: &w,
            input: LinearInput::Bf16,
            round_out: false,
            out: &mut y1,
        })
        .unwrap();
    assert_eq!(y1[0], 1056.0);
    // NVFP4: code 0x7 (=6), block scales E4M3 0x38 (=1.0) and 0x30 (=0.5), global 0.25.
    let w = LinearWeight::Nvfp4(
        Nvfp4Tensor::from_parts(1, 32, vec![0x77; 16], vec![0x38, 0x30], 0.25).unwrap(),
    );
    CpuBackend
        .run_op(Op::Linear {
            x: &x,
            rows: 1,
            w: &w,
            input: LinearInput::Bf16,
            round_out: false,
            out: &mut y1,
        })
        .unwrap();
    // elements 1..16 weigh 6*1*0.25 = 1.5, 17..32 weigh 6*0.5*0.25 = 0.75.
    assert_eq!(y1[0], 1.5 * 136.0 + 0.75 * 392.0);
    // Output rounding to bf16: 528 + 1/2^... 257 is not a bf16 (8 bits) -> 256.
    let xs = [257.0f32];
    let mut y2 = [0.0f32];
    CpuBackend
        .run_op(Op::Linear {
            x: &xs,
            rows: 1,
            w: &bf16w(1, 1, &[1.0]),
            input: LinearInput::F32,
            round_out: true,
            out: &mut y2,
        })
        .unwrap();
    assert_eq!(y2[0], 256.0);
}

#[test]
fn swiglu_oai_hand_case() {
    // g = 8 clamps to 7, u = -9 clamps to -7: (-7 + 1) * 7 * sigmoid(1.702*7).
    let mut out = [0.0f32; 2];
    CpuBackend
        .run_op(Op::SwiGlu {
            gate: &[8.0, 1.0],
            up: &[-9.0, 0.5],
            alpha: 1.702,
            limit: 7.0,
            out: &mut out,
        })
        .unwrap();
    let s = |z: f64| 1.0 / (1.0 + (-z).exp());
    let want = [-42.0 * s(1.702 * 7.0), 1.5 * s(1.702)];
    for (o, w) in out.iter().zip(want) {
        // bf16 output: 8 bits of precision.
        assert!(
            ((*o as f64) - w).abs() <= w.abs() * 2f64.powi(-8),
            "{o} vs {w}"
        );
    }
}

#[test]
fn router_bias_selects_but_does_not_weigh() {
    // 3 experts, H = 1, x = 1: logits = [0, 1, 2] (f32 weights),
    // s = sigmoid; bias pushes expert 0 above expert 2 for selection.
    let router = LinearWeight::F32 {
        rows: 3,
        cols: 1,
        data: vec![0.0, 1.0, 2.0],
    };
    let (mut ids, mut w) = ([0i32; 2], [0.0f32; 2]);
    CpuBackend
        .run_op(Op::Router {
            x: &[1.0],
            rows: 1,
            router: &router,
            bias: &[1.0, 0.0, 0.0],
            top_k: 2,
            scaling: 2.0,
            ids: &mut ids,
            weights: &mut w,
        })
        .unwrap();
    let s = |z: f64| 1.0 / (1.0 + (-z).exp());
    // s+bias = [1.5, .73, .88]: choose 0 and 2; weights from unbiased s.
    assert_eq!(ids, [0, 2]);
    let tot = s(0.0) + s(2.0);
    assert!((w[0] as f64 - s(0.0) / tot * 2.0).abs() < 1e-6);
    assert!((w[1] as f64 - s(2.0) / tot * 2.0).abs() < 1e-6);
    // Ties go to the lower id.
    let router = LinearWeight::F32 {
        rows: 3,
        cols: 1,
        data: vec![1.0, 1.0, 1.0],
    };
    CpuBackend
        .run_op(Op::Router {
            x: &[1.0],
            rows: 1,
            router: &router,
            bias: &[0.0; 3],
            top_k: 2,
            scaling: 1.0,
            ids: &mut ids,
            weights: &mut w,
        })
        .unwrap();
    assert_eq!(ids, [0, 1]);
    assert_eq!(w, [0.5, 0.5]);
}

#[test]
fn block_topk_hand_cases() {
    let run = |scores: &[f32], p: u32, topk: usize, init: usize| {
        let mut out = vec![0i32; topk];
        CpuBackend
            .run_op(Op::BlockTopK {
                scores,
                heads: 1,
                nb: scores.len(),
                positions: &[p],
                block_size: 4,
                topk,
                init_blocks: init,
                local_blocks: 1,
                selection: IndexSelection::PerKvHead,
                kv_heads: 1,
                out: &mut out,
            })
            .unwrap();
        out
    };
    // p = 9 -> 3 visible blocks <= K = 4: all of them, -1 padded.
    assert_eq!(run(&[0.0, 5.0, 1.0], 9, 4, 0), [0, 1, 2, -1]);
    // p = 23 -> 6 visible, K = 3: local block 5 forced, then best of 0..5
    // (scores 1, 9, 3, 9, 2): 1 and 3 tie at 9 -> both (ties lower first).
    assert_eq!(run(&[1.0, 9.0, 3.0, 9.0, 2.0, -5.0], 23, 3, 0), [1, 3, 5]);
    // K = 2: only one free slot: the tie at 9 goes to block 1.
    assert_eq!(run(&[1.0, 9.0, 3.0, 9.0, 2.0, -5.0], 23, 2, 0), [1, 5]);
    // init_blocks = 1 forces block 0 too.
    assert_eq!(run(&[1.0, 9.0, 3.0, 9.0, 2.0, -5.0], 23, 3, 1), [0, 1, 5]);
}

fn one_seq_step(positions: &[u32], table: &[u32], page: usize) -> StepBatch {
    let max = *positions.iter().max().unwrap();
    let mut s = StepBatch::contiguous(0, &vec![0; positions.len()], 0, table, page, false);
    s.positions = positions.to_vec();
    s.slot_mapping = positions
        .iter()
        .map(|&p| table[p as usize / page] * page as u32 + p % page as u32)
        .collect();
    s.seqs[0].context_len = max + 1;
    s
}

#[test]
fn index_scores_and_sparse_attention_hand_case() {
    // d = 2, page 2 with pages [1, 0] (positions 0,1 in page 1; 2,3 in page 0).
    // keys k_j: j0 = (1,0), j1 = (0,1), j2 = (2,0), j3 = (0,0); v_j = (j, 10j).
    let page = 2;
    let mut kc = CacheTensor::new(CacheDtype::Bf16, 4, 2, 1.0).unwrap();
    let mut vc = CacheTensor::new(CacheDtype::Bf16, 4, 2, 1.0).unwrap();
    let slots = [2u32, 3, 0, 1];
    let keys = [[1.0f32, 0.0], [0.0, 1.0], [2.0, 0.0], [0.0, 0.0]];
    for j in 0..4 {
        kc.write(slots[j] as usize, &keys[j]).unwrap();
        vc.write(slots[j] as usize, &[j as f32, 10.0 * j as f32])
            .unwrap();
    }
    let step = one_seq_step(&[3], &[1, 0], page);
    assert_eq!(step.slot_mapping, [1]);
    // Index scores with q = (1, 3), block size 2: block 0 = max(1, 3) = 3, block 1 = max(2, 0) = 2.
    let mut sc = [0.0f32; 2];
    CpuBackend
        .run_op(Op::IndexScores {
            q: &[1.0, 3.0],
            heads: 1,
            dim: 2,
            cache: &kc,
            step: &step,
            page_size: page,
            block_size: 2,
            nb: 2,
            out: &mut sc,
        })
        .unwrap();
    assert_eq!(sc, [3.0, 2.0]);
    // Attention, q = (ln 4 * sqrt 2, 0): scores q.k/sqrt(2) = ln4 * k_x -> (ln4, 0, 2 ln4, 0).
    let q = [4f32.ln() * 2f32.sqrt(), 0.0];
    let mut o = [0.0f32; 2];
    CpuBackend
        .run_op(Op::Attention {
            q: &q,
            heads: 1,
            kv_heads: 1,
            head_dim: 2,
            k: &kc,
            v: &vc,
            step: &step,
            page_size: page,
            blocks: None,
            out: &mut o,
        })
        .unwrap();
    // weights (4, 1, 16, 1) / 22 over v = (j, 10j): sum = (1 + 32 + 3)/22 = 36/22.
    let want = 36.0f64 / 22.0;
    assert!((o[0] as f64 - want).abs() <= want * 2f64.powi(-8), "{o:?}");
    assert!(
        (o[1] as f64 - 10.0 * want).abs() <= 10.0 * want * 2f64.powi(-8),
        "{o:?}"
    );
    // Sparse over block 1 only (positions 2, 3): weights (16, 1)/17 -> (2*16 + 3)/17.
    let sel = [1i32];
    CpuBackend
        .run_op(Op::Attention {
            q: &q,
            heads: 1,
            kv_heads: 1,
            head_dim: 2,
            k: &kc,
            v: &vc,
            step: &step,
            page_size: page,
            blocks: Some(BlockSelection {
                blocks: &sel,
                topk: 1,
                block_size: 2,
            }),
            out: &mut o,
        })
        .unwrap();
    let want = 35.0f64 / 17.0;
    assert!((o[0] as f64 - want).abs() <= want * 2f64.powi(-8), "{o:?}");
    // Causality: a row at p = 1 sees only j0, j1 -> weights (4, 1)/5 -> v = 1/5.
    let step1 = one_seq_step(&[1], &[1, 0], page);
    CpuBackend
        .run_op(Op::Attention {
            q: &q,
            heads: 1,
            kv_heads: 1,
            head_dim: 2,
            k: &kc,
            v: &vc,
            step: &step1,
            page_size: page,
            blocks: None,
            out: &mut o,
        })
        .unwrap();
    assert!((o[0] as f64 - 0.2).abs() <= 0.2 * 2f64.powi(-8), "{o:?}");
}

#[test]
fn fp8_cache_saturates_and_scales() {
    let mut c = CacheTensor::new(CacheDtype::Fp8E4M3, 1, 3, 2.0).unwrap();
    c.write(0, &[1000.0, 3.0, -0.5]).unwrap();
    let mut out = [0.0f32; 3];
    c.read(0, 0, &mut out);
    // 1000/2 = 500 saturates to 448 -> 896; 3/2 = 1.5 exact; -0.25 exact.
    assert_eq!(out, [896.0, 3.0, -0.5]);
}

#[test]
fn experts_sum_in_order_plus_shared() {
    // H = 32, width 32, identity-like experts built so that Expert_e(x) is
    // a known constant: gate, up rows pick x[0]; down writes to every output.
    // With x = e_0 * 1 (bf16) every expert computes a = swiglu(g, u) with
    // g = c_e, u = 0 -> a = c_e * sigmoid(1.702 c_e) in element 0, down = 1 on col 0.
    let h = 32;
    let mk = |c: f32| {
        let mut g = vec![0.0f32; h * h];
        g[0] = c;
        let u = vec![0.0f32; h * h];
        let mut d = vec![0.0f32; h * h];
        for r in 0..h {
            d[r * h] = 1.0;
        }
        MlpWeights {
            gate: bf16w(h, h, &g),
            up: bf16w(h, h, &u),
            down: bf16w(h, h, &d),
        }
    };
    let moe = MoeWeights {
        router: LinearWeight::F32 {
            rows: 3,
            cols: h,
            data: vec![0.0; 3 * h],
        },
        correction_bias: vec![0.0; 3],
        experts: vec![mk(1.0), mk(2.0), mk(4.0)],
        shared: Some(mk(0.5)),
    };
    let mut x = vec![0.0f32; h];
    x[0] = 1.0;
    let mut out = vec![0.0f32; h];
    CpuBackend
        .run_op(Op::Experts {
            x: &x,
            rows: 1,
            moe: &moe,
            ids: &[2, 0],
            weights: &[0.25, 3.0],
            top_k: 2,
            act: m3_core::backend::ActMode::Bf16,
            alpha: 1.702,
            limit: 7.0,
            out: &mut out,
        })
        .unwrap();
    let a = |c: f64| c / (1.0 + (-1.702 * c).exp());
    let want = 3.0 * a(1.0) + 0.25 * a(4.0) + a(0.5);
    for v in &out {
        assert!(
            (*v as f64 - want).abs() <= want * 2f64.powi(-7),
            "{v} vs {want}"
        );
    }
}

#[test]
fn act_quant_mxfp4_even_rule_hand_case() {
    // Block 1: amax 5 (= 1.25 * 4): `even` adds half an E2M1 ulp -> 6, floor
    // exponent 2, e = 2 - 2 = 0 -> scale 1; 5 is a tie between 4 and 6 -> 4,
    // 1.2 -> 1. Block 2: amax 7 (= 1.75 * 4) carries to 8, e = 1, scale 2:
    // 7/2 = 3.5 ties to 4 -> 8; 1.2/2 = 0.6 -> 0.5 -> 1.
    let mut x = vec![0.0f32; 64];
    x[0] = 5.0;
    x[1] = 1.2;
    x[32] = 7.0;
    x[33] = 1.2;
    let mut out = vec![0.0f32; 64];
    CpuBackend
        .run_op(Op::ActQuantMxfp4 {
            x: &x,
            out: &mut out,
        })
        .unwrap();
    assert_eq!(&out[..2], &[4.0, 1.0]);
    assert_eq!(&out[32..34], &[8.0, 1.0]);
    assert!(out[2..32].iter().chain(&out[34..]).all(|&v| v == 0.0));
}

#[test]
fn sample_and_dequantize_ops() {
    let logits = [0.0f32, 2.0, 2.0, 1.0, 9.0, 9.0];
    let mut out = [0u32; 2];
    let g = m3_core::sample::SampleParams::GREEDY;
    CpuBackend
        .run_op(Op::Sample {
            logits: &logits,
            vocab: 3,
            params: &[g, g],
            positions: &[0, 1],
            out: &mut out,
        })
        .unwrap();
    assert_eq!(out, [1, 1], "argmax, lowest id on ties");
    // Dequantize: E4M3 code 0x40 = 2.0, scale byte 126 = 0.5 -> 1.0 everywhere.
    let w = LinearWeight::Mx(
        MxTensor::from_parts(MxElem::Fp8E4M3, 2, 32, vec![0x40; 64], vec![126, 126]).unwrap(),
    );
    let mut d = vec![0.0f32; 64];
    CpuBackend
        .run_op(Op::Dequantize { w: &w, out: &mut d })
        .unwrap();
    assert!(d.iter().all(|&v| v == 1.0));
}
