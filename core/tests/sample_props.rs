//! The GPU sampling algorithm (radix selects, `m3_core::sample::radix`) picks
//! exactly the token of the sort-based definition (`sample::sample`) on
//! random rows built to hit the edges: exact ties (+0.0 / -0.0 too), -inf,
//! +inf, NaN, random bit patterns, tiny and huge temperatures, every kind of
//! top_k and top_p. Planted errors show that the comparisons can fail: a
//! wrong tie order and a wrong top_p boundary change tokens; a wrong weight
//! rounding changes weights; a one-ulp change in exp (an FMA) changes the
//! relative weights' bits though hardly ever a token, which is why the GPU
//! test compares the kernel's relative weights bit for bit as well as the
//! tokens.

use m3_core::sample::{
    self, exp_det, kept_weights, order_bits, radix, relative_weight, sample, weight, SampleParams,
    EXP_DET_COEFFS, LN2_HI, LN2_LO, LOG2E, WEIGHT_ONE,
};
use m3_core::sched::spec_probs::sampling_probs;
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::TestRunner;

/// One row to sample.
#[derive(Clone, Debug)]
struct Case {
    logits: Vec<f32>,
    params: SampleParams,
    position: u32,
}

/// A logit of a row of `style`: 0 ties on a coarse grid, 1 ties and
/// normal values with -inf and NaN, 2 everything (+inf too), 3 random bits.
fn logit(style: u8) -> BoxedStrategy<f32> {
    let ties = prop_oneof![
        (-16i32..16).prop_map(|i| i as f32 * 0.25),
        prop::sample::select(vec![0.0f32, -0.0, 1.0, -1.0, 2.5, 2.500_000_2]),
    ];
    match style {
        0 => ties.boxed(),
        1 => prop_oneof![
            8 => ties,
            8 => -30.0f32..30.0,
            1 => Just(f32::NEG_INFINITY),
            1 => Just(f32::NAN),
        ]
        .boxed(),
        2 => prop_oneof![
            20 => ties,
            20 => -30.0f32..30.0,
            2 => Just(f32::NEG_INFINITY),
            2 => Just(f32::NAN),
            1 => Just(f32::INFINITY),
            2 => prop::sample::select(vec![3.0e38f32, -3.0e38, 1e-45, -1e-45, f32::MIN_POSITIVE]),
        ]
        .boxed(),
        _ => any::<u32>().prop_map(f32::from_bits).boxed(),
    }
}

fn temperature() -> impl Strategy<Value = f32> {
    prop_oneof![
        prop::sample::select(vec![
            1e-45f32,
            1e-30,
            1e-6,
            0.05,
            0.3,
            0.7,
            1.0,
            1.5,
            10.0,
            1e6,
            1e30,
            3.4e38,
            f32::INFINITY,
            // greedy
            0.0,
            -1.0,
            f32::NAN,
        ]),
        0.01f32..5.0,
    ]
}

fn top_k() -> impl Strategy<Value = usize> {
    prop_oneof![
        Just(0usize),
        Just(1),
        2usize..50,
        0usize..4000,
        Just(usize::MAX),
    ]
}

fn top_p() -> impl Strategy<Value = f32> {
    prop_oneof![
        prop::sample::select(vec![
            0.0f32,
            -1.0,
            1e-30,
            1e-6,
            0.5,
            0.9,
            0.999_999_94,
            1.0,
            2.0,
            f32::NAN,
        ]),
        0.0f32..1.0,
    ]
}

fn case() -> impl Strategy<Value = Case> {
    let row = (0u8..4).prop_flat_map(|style| prop::collection::vec(logit(style), 1..3000));
    (
        row,
        temperature(),
        top_k(),
        top_p(),
        any::<u64>(),
        any::<u32>(),
    )
        .prop_map(|(logits, temperature, top_k, top_p, seed, position)| Case {
            logits,
            params: SampleParams {
                temperature,
                top_k,
                top_p,
                seed,
            },
            position,
        })
}

/// `n` cases from a fixed seed (the planted-error checks run on these).
fn fixed_cases(n: usize) -> Vec<Case> {
    let mut runner = TestRunner::deterministic();
    let s = case();
    (0..n)
        .map(|_| match s.new_tree(&mut runner) {
            Ok(t) => t.current(),
            Err(e) => panic!("case generation: {e}"),
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1500))]

    #[test]
    fn radix_select_picks_the_sorted_token(c in case()) {
        let got = radix::sample(&c.logits, &c.params, c.position);
        let want = sample(&c.logits, &c.params, c.position);
        prop_assert_eq!(got, want, "params {:?} position {}", c.params, c.position);
        // The token is in the distribution, with a positive weight, and
        // sampling_probs gives it a positive probability.
        let (ids, w) = kept_weights(&c.logits, &c.params);
        let at = ids.iter().position(|&i| i == want);
        prop_assert!(at.is_some_and(|n| w[n] > 0));
        if !c.logits.is_empty() {
            prop_assert!(sampling_probs(&c.logits, &c.params)[want as usize] > 0.0);
        }
    }
}

/// Order bits without treating -0.0 as +0.0 (a plausible GPU bug).
fn key_without_zero_fix(l: f32, id: u32) -> u64 {
    let b = l.to_bits();
    let o = if b & 0x8000_0000 == 0 {
        b ^ 0x8000_0000
    } else {
        !b
    };
    ((o as u64) << 32) | (0xFFFF_FFFF - id) as u64
}

#[test]
fn planted_tie_order_error_is_caught() {
    let bad = radix::Rules {
        key: key_without_zero_fix,
        ..radix::RULES
    };
    let cases = fixed_cases(600);
    let wrong = cases
        .iter()
        .filter(|c| {
            radix::sample_with(&c.logits, &c.params, c.position, &bad)
                != sample(&c.logits, &c.params, c.position)
        })
        .count();
    eprintln!("-0.0 ordering bug: {wrong} of 600 tokens differ");
    assert!(wrong > 0, "a -0.0 ordering bug went unnoticed");
    // The real rules agree on the same cases.
    for c in &cases {
        assert_eq!(
            radix::sample(&c.logits, &c.params, c.position),
            sample(&c.logits, &c.params, c.position)
        );
    }
}

#[test]
fn planted_top_p_boundary_error_is_caught() {
    // "strictly more than W * p" instead of "at least": floor + 1 for ceil.
    let bad = radix::Rules {
        top_p_target: |total, p24| ((total as u128 * p24 as u128) >> 24) as u64 + 1,
        ..radix::RULES
    };
    let wrong = fixed_cases(2000)
        .iter()
        .filter(|c| {
            radix::sample_with(&c.logits, &c.params, c.position, &bad)
                != sample(&c.logits, &c.params, c.position)
        })
        .count();
    eprintln!("top_p boundary bug: {wrong} of 2000 tokens differ");
    assert!(wrong > 0, "a top_p boundary bug went unnoticed");
}

/// Weight with round-to-nearest instead of floor.
fn weight_rounded(l: f32, m: f32, t: f32) -> u64 {
    if l == m {
        return WEIGHT_ONE;
    }
    let x = (l as f64 - m as f64) / t as f64;
    (exp_det(x) * WEIGHT_ONE as f64 + 0.5) as u64
}

/// `exp_det` with a fused multiply-add Horner step (what a GPU compiled
/// without `--fmad=false` would do): off by an ulp here and there.
fn exp_fma(x: f64) -> f64 {
    if x.is_nan() || x < -745.0 {
        return 0.0;
    }
    let t = x * LOG2E;
    let k = (t + if t < 0.0 { -0.5 } else { 0.5 }) as i32;
    let kf = k as f64;
    let r = (x - kf * LN2_HI) - kf * LN2_LO;
    let mut p = EXP_DET_COEFFS[13];
    for n in (0..13).rev() {
        p = p.mul_add(r, EXP_DET_COEFFS[n]);
    }
    let s = |k: i32| f64::from_bits(((k + 1023) as u64) << 52);
    if k >= -1022 {
        p * s(k)
    } else {
        (p * s(k + 1000)) * s(-1000)
    }
}

fn relative_weight_fma(l: f32, m: f32, t: f32) -> f64 {
    if l == m {
        return 1.0;
    }
    exp_fma((l as f64 - m as f64) / t as f64)
}

/// The maximum candidate logit of a stochastic case (None: greedy or no
/// candidate).
fn max_logit(c: &Case) -> Option<f32> {
    if c.params.is_greedy() {
        return None;
    }
    c.logits
        .iter()
        .copied()
        .filter(|l| !l.is_nan())
        .max_by_key(|&l| order_bits(l))
}

/// The non-NaN elements of the stochastic fixed cases for which
/// `differs(logit, max logit, temperature)` holds.
fn mismatches(differs: impl Fn(f32, f32, f32) -> bool) -> usize {
    let mut bad = 0;
    for c in fixed_cases(600) {
        let Some(m) = max_logit(&c) else { continue };
        let t = c.params.temperature;
        bad += c
            .logits
            .iter()
            .filter(|l| !l.is_nan())
            .filter(|&&l| differs(l, m, t))
            .count();
    }
    bad
}

/// The elements whose weight under `w` differs from `sample::weight`.
fn weight_mismatches(w: fn(f32, f32, f32) -> u64) -> usize {
    mismatches(|l, m, t| w(l, m, t) != weight(l, m, t))
}

/// The elements whose relative weight under `e` differs in bits from
/// `sample::relative_weight` (the check the GPU test makes on the kernel's
/// `scratch` output).
fn relative_weight_mismatches(e: fn(f32, f32, f32) -> f64) -> usize {
    mismatches(|l, m, t| e(l, m, t).to_bits() != relative_weight(l, m, t).to_bits())
}

#[test]
fn planted_weight_rounding_errors_are_caught() {
    let rounded = weight_mismatches(weight_rounded);
    eprintln!("rounded weights: {rounded} weights differ");
    assert!(rounded > 0);
    assert_eq!(weight_mismatches(sample::weight), 0);
    // One ulp in exp rarely moves a floored weight (or a token), but it
    // shows in the relative weights' bits.
    let fma = relative_weight_mismatches(relative_weight_fma);
    eprintln!("FMA in exp: {fma} relative weights differ");
    assert!(fma > 100, "an FMA in exp went unnoticed ({fma} mismatches)");
    assert_eq!(relative_weight_mismatches(relative_weight), 0);
}
