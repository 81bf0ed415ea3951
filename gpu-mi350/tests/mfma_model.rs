//! The gfx950 MX linears (`kernels/mfma_mx.cu`), emulated on the CPU through
//! `m3_gpu::mfma_model` (the scaled / bf16 MFMA instructions' documented
//! semantics and register layouts) with the kernels' data layout (tiles,
//! waves, lanes, K steps), against cpu-ref's linear on the same MX inputs.
//! No AMD hardware runs here or has run these kernels.
//!
//! Tolerance: every product `x_k * w_k` is exact in f32 (E2M1 x E2M1: 2 x 2
//! significant bits; bf16 x E4M3: 8 x 4; times powers of two, no f32
//! under/overflow in these data), so both sides sum the same exact terms
//! and differ only by f32 rounding in their (different) orders. Any order of
//! n additions is within `(n - 1) u sum |t|` of the exact sum (u = 2^-24;
//! Higham, Accuracy and Stability, 4.2), so the two are within
//! `2 (K - 1) u sum |t|`; the test uses `2 K u sum |t|` per output. Data
//! whose sums are exact in f32 must agree to the bit, and do.

use m3_core::backend::LinearInput;
use m3_core::formats::{bf16, MxElem, MxTensor, ScaleRule};
use m3_core::weights::LinearWeight;
use m3_gpu::mfma_model::{self, Plant};

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    /// Uniform in [-1, 1).
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

/// `rows x cols` values with a per-row power-of-two spread (2^-12..2^12)
/// and some per-block spread, so the E8M0 scales vary.
fn data(rng: &mut Rng, rows: usize, cols: usize) -> Vec<f32> {
    let mut v = Vec::with_capacity(rows * cols);
    for r in 0..rows {
        let row_scale = 2f32.powi((r as i32 * 7) % 25 - 12);
        for c in 0..cols {
            let blk = 2f32.powi(((c / 32) as i32 * 3) % 7 - 3);
            v.push(rng.unit() * row_scale * blk);
        }
    }
    v
}

fn bf16_round(v: &[f32]) -> Vec<f32> {
    v.iter().map(|&x| bf16::round(x)).collect()
}

/// cpu-ref's `y = x W^T` (f32 out, no bf16 rounding).
fn reference(x: &[f32], m: usize, w: &MxTensor, input: LinearInput) -> Vec<f32> {
    let lw = LinearWeight::Mx(w.clone());
    let mut y = vec![0.0f32; m * w.rows()];
    m3_cpu_ref::linear::linear(x, m, &lw, input, false, &mut y).unwrap();
    y
}

/// `sum_k |x_k w_k|` per output, from the decoded operands (f64).
fn abs_dots(xd: &[f32], wd: &[f32], m: usize, n: usize, k: usize) -> Vec<f64> {
    let mut out = vec![0.0f64; m * n];
    for t in 0..m {
        for o in 0..n {
            out[t * n + o] = (0..k)
                .map(|i| (f64::from(xd[t * k + i]) * f64::from(wd[o * k + i])).abs())
                .sum();
        }
    }
    out
}

/// Outputs outside `2 K u sum |t|` (NaN must match NaN), as messages.
fn mismatches(got: &[f32], want: &[f32], absdot: &[f64], k: usize) -> Vec<String> {
    let u = 2f64.powi(-24);
    let mut bad = Vec::new();
    for (i, ((&g, &w), &a)) in got.iter().zip(want).zip(absdot).enumerate() {
        let ok = if w.is_nan() || g.is_nan() {
            w.is_nan() && g.is_nan()
        } else {
            (f64::from(g) - f64::from(w)).abs() <= 2.0 * k as f64 * u * a
        };
        if !ok {
            bad.push(format!("y[{i}] = {g:e}, cpu-ref {w:e} (sum |t| {a:e})"));
        }
    }
    bad
}

struct Fp4Case {
    m: usize,
    n: usize,
    k: usize,
    xq: MxTensor,
    w: MxTensor,
    /// the f32 activations cpu-ref quantizes itself (bf16 values)
    x: Vec<f32>,
}

fn fp4_case(seed: u64, m: usize, n: usize, k: usize) -> Fp4Case {
    let mut rng = Rng(seed);
    let x = bf16_round(&data(&mut rng, m, k));
    let wf = data(&mut rng, n, k);
    // the activation codes exactly as cpu-ref's `act_quant_mxfp4` makes them
    // (MODEL.md 5: `even` rule on the bf16 row), which m3x_act_mxfp4_pack
    // writes on the device
    let xq = MxTensor::quantize(&x, m, k, MxElem::Fp4E2M1, ScaleRule::Even).unwrap();
    let w = MxTensor::quantize(&wf, n, k, MxElem::Fp4E2M1, ScaleRule::Even).unwrap();
    Fp4Case { m, n, k, xq, w, x }
}

fn run_fp4(c: &Fp4Case, plant: Plant) -> Vec<String> {
    let got = mfma_model::linear_fp4_a4(
        c.xq.codes(),
        c.xq.scales(),
        c.w.codes(),
        c.w.scales(),
        c.m,
        c.n,
        c.k,
        plant,
    );
    let want = reference(&c.x, c.m, &c.w, LinearInput::Mxfp4);
    let ad = abs_dots(&c.xq.dequantize(), &c.w.dequantize(), c.m, c.n, c.k);
    mismatches(&got, &want, &ad, c.k)
}

/// Tails in every direction: M and N not multiples of 16, K not a multiple
/// of 128 (partial scaled-MFMA steps), K steps not a multiple of the waves.
const SHAPES: &[(usize, usize, usize)] = &[
    (1, 16, 128),
    (5, 40, 96),
    (19, 33, 288),
    (16, 16, 1024),
    (3, 24, 2560),
];

#[test]
fn fp4_a4_matches_cpu_ref_within_f32_summation() {
    for (i, &(m, n, k)) in SHAPES.iter().enumerate() {
        let c = fp4_case(0x9e37_79b9 + i as u64, m, n, k);
        let bad = run_fp4(&c, Plant::None);
        assert!(
            bad.is_empty(),
            "m {m} n {n} k {k}: {:?}",
            &bad[..bad.len().min(5)]
        );
    }
}

/// Values that are E2M1 codes times 1 (every block holds a 6, so the `even`
/// scale is 2^0) sum exactly in f32: the emulated kernel, cpu-ref and the
/// exact f64 sum agree to the bit.
#[test]
fn fp4_a4_exact_sums_agree_to_the_bit() {
    let (m, n, k) = (7, 20, 384);
    let vals = [0.0f32, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
    let mut rng = Rng(77);
    let mut gen = |rows: usize| -> Vec<f32> {
        (0..rows * k)
            .map(|i| {
                let v = if i % 32 == 5 {
                    6.0
                } else {
                    vals[(rng.next() % 8) as usize]
                };
                if rng.next().is_multiple_of(2) {
                    -v
                } else {
                    v
                }
            })
            .collect()
    };
    let (x, wf) = (gen(m), gen(n));
    let xq = MxTensor::quantize(&x, m, k, MxElem::Fp4E2M1, ScaleRule::Even).unwrap();
    let w = MxTensor::quantize(&wf, n, k, MxElem::Fp4E2M1, ScaleRule::Even).unwrap();
    assert_eq!(xq.dequantize(), x, "every value is a code times 2^0");
    let got = mfma_model::linear_fp4_a4(
        xq.codes(),
        xq.scales(),
        w.codes(),
        w.scales(),
        m,
        n,
        k,
        Plant::None,
    );
    let want = reference(&x, m, &w, LinearInput::Mxfp4);
    for t in 0..m {
        for o in 0..n {
            let exact: f64 = (0..k)
                .map(|i| f64::from(x[t * k + i]) * f64::from(wf[o * k + i]))
                .sum();
            assert_eq!(got[t * n + o].to_bits(), want[t * n + o].to_bits());
            assert_eq!(f64::from(got[t * n + o]), exact);
        }
    }
}

/// An MX block with a NaN: scale byte 0xFF; the row's outputs are NaN in
/// both.
#[test]
fn fp4_a4_nan_blocks_propagate() {
    let mut c = fp4_case(5, 3, 20, 256);
    c.x[256 + 70] = f32::NAN;
    c.xq = MxTensor::quantize(&c.x, c.m, c.k, MxElem::Fp4E2M1, ScaleRule::Even).unwrap();
    assert_eq!(c.xq.scales()[8 + 2], 0xff);
    assert!(run_fp4(&c, Plant::None).is_empty());
    let got = mfma_model::linear_fp4_a4(
        c.xq.codes(),
        c.xq.scales(),
        c.w.codes(),
        c.w.scales(),
        c.m,
        c.n,
        c.k,
        Plant::None,
    );
    assert!(got[20..40].iter().all(|v| v.is_nan()));
    assert!(got[..20].iter().chain(&got[40..]).all(|v| v.is_finite()));
}

/// The test fails on a wrong scale byte, a wrong lane layout, the wrong
/// nibble order or a transposed accumulator.
#[test]
fn fp4_a4_planted_errors_are_caught() {
    let c = fp4_case(11, 19, 33, 288);
    for plant in [
        Plant::ScaleByte { lane: 5 },
        Plant::ScaleByte { lane: 63 },
        Plant::SwapLanes,
        Plant::NibbleOrder,
        Plant::TransposedAcc,
    ] {
        let bad = run_fp4(&c, plant);
        assert!(!bad.is_empty(), "{plant:?} went unnoticed");
    }
}

struct E4m3Case {
    m: usize,
    n: usize,
    k: usize,
    x: Vec<f32>,
    w: MxTensor,
}

fn e4m3_case(seed: u64, m: usize, n: usize, k: usize) -> E4m3Case {
    let mut rng = Rng(seed);
    let x = bf16_round(&data(&mut rng, m, k));
    let wf = data(&mut rng, n, k);
    let w = MxTensor::quantize(&wf, n, k, MxElem::Fp8E4M3, ScaleRule::Floor).unwrap();
    E4m3Case { m, n, k, x, w }
}

fn run_e4m3(c: &E4m3Case, plant: Plant) -> Vec<String> {
    let xb: Vec<u16> = c.x.iter().map(|&v| bf16::from_f32(v)).collect();
    let got = mfma_model::linear_e4m3_bf16(&xb, c.w.codes(), c.w.scales(), c.m, c.n, c.k, plant);
    let want = reference(&c.x, c.m, &c.w, LinearInput::Bf16);
    let ad = abs_dots(&c.x, &c.w.dequantize(), c.m, c.n, c.k);
    mismatches(&got, &want, &ad, c.k)
}

#[test]
fn e4m3_bf16_matches_cpu_ref_within_f32_summation() {
    for (i, &(m, n, k)) in SHAPES.iter().enumerate() {
        let c = e4m3_case(0x5151 + i as u64, m, n, k);
        let bad = run_e4m3(&c, Plant::None);
        assert!(
            bad.is_empty(),
            "m {m} n {n} k {k}: {:?}",
            &bad[..bad.len().min(5)]
        );
    }
}

/// Small integers times E4M3 integers (scale 2^0: every block holds 448):
/// exact sums, bit-equal results.
#[test]
fn e4m3_bf16_exact_sums_agree_to_the_bit() {
    let (m, n, k) = (4, 18, 160);
    let mut rng = Rng(99);
    let x: Vec<f32> = (0..m * k).map(|_| (rng.next() % 17) as f32 - 8.0).collect();
    let wvals = [0.0f32, 1.0, 2.0, 3.0, 5.0, 7.0, 12.0, 448.0];
    let wf: Vec<f32> = (0..n * k)
        .map(|i| {
            if i % 32 == 9 {
                448.0
            } else {
                wvals[(rng.next() % 8) as usize]
            }
        })
        .collect();
    let w = MxTensor::quantize(&wf, n, k, MxElem::Fp8E4M3, ScaleRule::Floor).unwrap();
    assert_eq!(w.dequantize(), wf);
    let c = E4m3Case { m, n, k, x, w };
    let xb: Vec<u16> = c.x.iter().map(|&v| bf16::from_f32(v)).collect();
    let got = mfma_model::linear_e4m3_bf16(&xb, c.w.codes(), c.w.scales(), m, n, k, Plant::None);
    let want = reference(&c.x, m, &c.w, LinearInput::Bf16);
    for (g, w) in got.iter().zip(&want) {
        assert_eq!(g.to_bits(), w.to_bits());
    }
}

#[test]
fn e4m3_bf16_planted_errors_are_caught() {
    let c = e4m3_case(12, 19, 33, 288);
    for plant in [
        Plant::ScaleByte { lane: 5 },
        Plant::ScaleByte { lane: 50 },
        Plant::SwapLanes,
        Plant::TransposedAcc,
    ] {
        let bad = run_e4m3(&c, plant);
        assert!(!bad.is_empty(), "{plant:?} went unnoticed");
    }
}
