//! PTPC FP8 (ARCHITECTURE.md, *Online quantization*) against the op-level
//! golden case `golden/cases/ops/ptpc-linear.safetensors`, written by the
//! independent numpy reference (`golden/gen/reference.py op-ptpc`, through
//! ml_dtypes' E4M3): weight codes and scales from the load-time quantizer,
//! activation codes and scales, and the linear's outputs must match bit for
//! bit (the dot is exact, so there is no summation noise to allow for).
//! Planted errors (one flipped weight code, truncation instead of
//! round-to-nearest-even, the scales multiplied in the other order) must be
//! caught by the same comparison.

mod common;

use common::OpCase;
use m3_core::backend::Backend;
use m3_core::checkpoint::online::{quantize_weight, OnlineQuantError};
use m3_core::formats::convert::{self, PtpcFp8};
use m3_core::formats::{bf16, fp8::e4m3, MxElem, MxTensor, ScaleRule};
use m3_core::weights::LinearWeight;
use m3_cpu_ref::CpuBackend;

struct Case {
    x: Vec<f32>,
    w: Vec<f32>,
    w_codes: Vec<u8>,
    w_scales: Vec<f32>,
    x_codes: Vec<u8>,
    x_scales: Vec<f32>,
    x_finite: Vec<u8>,
    y_f32: Vec<f32>,
    y_bf16: Vec<f32>,
    t: usize,
    k: usize,
    n: usize,
}

fn load() -> Case {
    let f = OpCase::open("ptpc-linear.safetensors");
    let (xs, _) = f.raw("x");
    let (ws, _) = f.raw("w");
    Case {
        x: f.f32s("x"),
        w: f.f32s("w"),
        w_codes: f.raw("w_codes").1,
        w_scales: f.f32s("w_scales"),
        x_codes: f.raw("x_codes").1,
        x_scales: f.f32s("x_scales"),
        x_finite: f.raw("x_finite").1,
        y_f32: f.f32s("y_f32"),
        y_bf16: f.f32s("y_bf16"),
        t: xs[0],
        k: xs[1],
        n: ws[0],
    }
}

fn bf16_weight(c: &Case) -> LinearWeight {
    LinearWeight::Bf16 {
        rows: c.n,
        cols: c.k,
        data: c.w.iter().map(|&v| bf16::from_f32(v)).collect(),
    }
}

/// Index of the first value whose bits differ (NaN equal to NaN).
fn first_diff(a: &[f32], b: &[f32]) -> Option<usize> {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .position(|(x, y)| !(x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan())))
}

fn run(w: &PtpcFp8, c: &Case, round_out: bool) -> Vec<f32> {
    let mut y = vec![0f32; c.t * c.n];
    CpuBackend::new()
        .ptpc_linear(&c.x, c.t, w, round_out, &mut y)
        .unwrap();
    y
}

#[test]
fn weight_quantizer_matches_the_reference() {
    let c = load();
    let q = quantize_weight("w", &bf16_weight(&c)).unwrap();
    assert_eq!(q.codes, c.w_codes, "weight codes");
    assert_eq!(first_diff(&q.scales, &c.w_scales), None, "weight scales");
    // the case exercises what it claims: a zero row (scale 1) and ties
    assert_eq!(c.w_scales[3], 1.0);
    assert!(c.w_codes[3 * c.k..4 * c.k].iter().all(|&b| b == 0));
    assert_eq!(c.w_scales[8], 1.0, "row 8 has amax 448");
    assert_eq!(c.w_codes[8 * c.k + 1], 0x38, "1.0625 ties to 1.0 (even)");
    assert_eq!(c.w_codes[8 * c.k + 2], 0x3A, "1.1875 ties to 1.25 (even)");
}

#[test]
fn activation_quantizer_matches_the_reference() {
    let c = load();
    for t in 0..c.t {
        if c.x_finite[t] == 0 {
            continue;
        }
        let row: Vec<f32> = c.x[t * c.k..(t + 1) * c.k].to_vec();
        let mut q = vec![0u8; c.k];
        let s = convert::ptpc_quantize_row(&row, &mut q);
        assert_eq!(s.to_bits(), c.x_scales[t].to_bits(), "row {t} scale");
        assert_eq!(q, c.x_codes[t * c.k..(t + 1) * c.k], "row {t} codes");
    }
    assert!(c.x_finite.contains(&0), "the case has a NaN row");
}

#[test]
fn linear_matches_the_reference_bit_for_bit() {
    let c = load();
    let w = quantize_weight("w", &bf16_weight(&c)).unwrap();
    assert_eq!(
        first_diff(&run(&w, &c, false), &c.y_f32),
        None,
        "f32 outputs"
    );
    assert_eq!(
        first_diff(&run(&w, &c, true), &c.y_bf16),
        None,
        "bf16 outputs"
    );
}

#[test]
fn planted_errors_are_caught() {
    let c = load();
    let w = quantize_weight("w", &bf16_weight(&c)).unwrap();
    // control: the unplanted weight passes
    assert_eq!(first_diff(&run(&w, &c, false), &c.y_f32), None);

    // 1. one flipped weight code (lowest mantissa bit of row 0, column 0)
    let mut bad = w.clone();
    bad.codes[0] ^= 1;
    assert!(first_diff(&run(&bad, &c, false), &c.y_f32).is_some());

    // 2. truncation toward zero instead of round-to-nearest-even
    let mut trunc = w.clone();
    for (r, s) in trunc.scales.iter().enumerate() {
        for j in 0..c.k {
            let v = c.w[r * c.k + j] as f64 / *s as f64;
            let mut code = e4m3::encode_sat(v);
            if (e4m3::decode(code) as f64).abs() > v.abs() {
                code -= 1; // the next magnitude down (same sign bit)
            }
            trunc.codes[r * c.k + j] = code;
        }
    }
    assert_ne!(trunc.codes, c.w_codes, "truncation changes some code");
    assert!(first_diff(&run(&trunc, &c, false), &c.y_f32).is_some());

    // 3. the two scale multiplies in the other order: y = acc * (sw * sa)
    let mut other = vec![0f32; c.t * c.n];
    for t in 0..c.t {
        for n in 0..c.n {
            let qa = &c.x_codes[t * c.k..(t + 1) * c.k];
            let qw = &w.codes[n * c.k..(n + 1) * c.k];
            other[t * c.n + n] = match (c.x_finite[t], convert::ptpc_dot(qa, qw)) {
                (1, Some(acc)) => acc * (w.scales[n] * c.x_scales[t]),
                _ => f32::NAN,
            };
        }
    }
    assert!(first_diff(&other, &c.y_f32).is_some());
}

#[test]
fn results_do_not_depend_on_the_thread_count() {
    let c = load();
    let w = quantize_weight("w", &bf16_weight(&c)).unwrap();
    let on = |n: usize| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .build()
            .unwrap()
            .install(|| run(&w, &c, true))
    };
    let one = on(1);
    assert_eq!(first_diff(&on(2), &one), None);
    assert_eq!(first_diff(&on(5), &one), None);
}

#[test]
fn mxfp8_weights_quantize_from_their_exact_values() {
    // an MXFP8 weight and its exact bf16 copy give the same PTPC form
    let c = load();
    let mx = MxTensor::quantize(&c.w, c.n, c.k, MxElem::Fp8E4M3, ScaleRule::Floor).unwrap();
    let exact = mx.dequantize();
    let from_mx = quantize_weight("w", &LinearWeight::Mx(mx)).unwrap();
    let from_f32 = quantize_weight(
        "w",
        &LinearWeight::F32 {
            rows: c.n,
            cols: c.k,
            data: exact,
        },
    )
    .unwrap();
    assert_eq!(from_mx, from_f32);
}

#[test]
fn non_finite_weights_are_refused_naming_tensor_row_and_column() {
    let c = load();
    let mut data = c.w.clone();
    data[5 * c.k + 7] = f32::INFINITY;
    let e = quantize_weight(
        "model.layers.1.self_attn.o_proj.weight",
        &LinearWeight::F32 {
            rows: c.n,
            cols: c.k,
            data,
        },
    )
    .unwrap_err();
    assert!(matches!(
        e,
        OnlineQuantError::NonFinite { row: 5, col: 7, .. }
    ));
    let msg = e.to_string();
    assert!(
        msg.contains("model.layers.1.self_attn.o_proj.weight"),
        "{msg}"
    );
    assert!(msg.contains("row 5, column 7"), "{msg}");
}
