//! Property tests of the number formats: encode is the nearest representable
//! value (checked against a brute-force search over every code, with its own
//! decode written from the layout), encode is monotonic, requantizing a
//! dequantized MX / NVFP4 tensor reproduces it, FP4 pack/unpack round-trips.

use m3_core::formats::{
    e2m1,
    fp8::{e4m3, e5m2},
    MxElem, MxTensor, Nvfp4Tensor, ScaleRule,
};
use proptest::prelude::*;

/// A minifloat layout, decoded here independently of the library.
#[derive(Clone, Copy, Debug)]
struct Layout {
    ebits: u32,
    mbits: u32,
    bias: i32,
    /// Largest finite magnitude code (sign bit clear).
    max_code: u8,
}

const E2M1: Layout = Layout {
    ebits: 2,
    mbits: 1,
    bias: 1,
    max_code: 0x7,
};
const E4M3: Layout = Layout {
    ebits: 4,
    mbits: 3,
    bias: 7,
    max_code: 0x7E,
};
const E5M2: Layout = Layout {
    ebits: 5,
    mbits: 2,
    bias: 15,
    max_code: 0x7B,
};

fn pow2(k: i32) -> f64 {
    let mut v = 1.0;
    for _ in 0..k.unsigned_abs() {
        v = if k > 0 { v * 2.0 } else { v * 0.5 };
    }
    v
}

impl Layout {
    fn sign_bit(self) -> u8 {
        1 << (self.ebits + self.mbits)
    }
    /// Value of a magnitude code (no sign), from the layout.
    fn mag_value(self, c: u8) -> f64 {
        let field = (c >> self.mbits) as i32;
        let m = (c & ((1 << self.mbits) - 1)) as f64;
        let scale = pow2(-(self.mbits as i32));
        if field == 0 {
            m * scale * pow2(1 - self.bias)
        } else {
            (1.0 + m * scale) * pow2(field - self.bias)
        }
    }
    fn max(self) -> f64 {
        self.mag_value(self.max_code)
    }
    /// Brute force: the code of the nearest value of the same sign, after
    /// saturation; ties go to the even code.
    fn nearest(self, x: f64) -> u8 {
        let sign = if x.is_sign_negative() {
            self.sign_bit()
        } else {
            0
        };
        let a = x.abs().min(self.max());
        let mut best = 0u8;
        let mut best_d = f64::INFINITY;
        for c in 0..=self.max_code {
            let d = (self.mag_value(c) - a).abs();
            if d < best_d || (d == best_d && c % 2 == 0) {
                best = c;
                best_d = d;
            }
        }
        sign | best
    }
}

fn encoder(l: Layout) -> fn(f64) -> u8 {
    match l.ebits {
        2 => e2m1::encode_sat,
        4 => e4m3::encode_sat,
        _ => e5m2::encode_sat,
    }
}

fn decoder(l: Layout) -> fn(u8) -> f32 {
    match l.ebits {
        2 => e2m1::decode,
        4 => e4m3::decode,
        _ => e5m2::decode,
    }
}

/// Values that matter for an element type: anything in +-1.5 max, exact
/// midpoints between neighbours (the ties), f32 bit patterns, tiny values.
fn values(l: Layout) -> BoxedStrategy<f64> {
    let max = l.max();
    let mids = (0..l.max_code, any::<bool>()).prop_map(move |(c, neg)| {
        let m = (l.mag_value(c) + l.mag_value(c + 1)) / 2.0;
        if neg {
            -m
        } else {
            m
        }
    });
    let sub = l.mag_value(1);
    prop_oneof![
        (-1.5 * max..1.5 * max),
        mids,
        any::<f32>()
            .prop_filter("not NaN", |v| !v.is_nan())
            .prop_map(|v| v as f64),
        (-4.0 * sub..4.0 * sub),
        Just(0.0),
        Just(-0.0),
    ]
    .boxed()
}

#[test]
fn decode_matches_layout_for_every_code() {
    for l in [E2M1, E4M3, E5M2] {
        let dec = decoder(l);
        for c in 0..=l.max_code {
            assert_eq!(dec(c) as f64, l.mag_value(c), "{l:?} code {c:#x}");
            let n = dec(c | l.sign_bit());
            assert_eq!(
                n as f64,
                -l.mag_value(c),
                "{l:?} code {:#x}",
                c | l.sign_bit()
            );
            assert!(n.is_sign_negative());
        }
    }
}

#[test]
fn encode_is_nearest_on_every_midpoint() {
    // Exhaustive over the ties and their neighbours, both signs.
    for l in [E2M1, E4M3, E5M2] {
        let enc = encoder(l);
        for c in 0..l.max_code {
            let lo = l.mag_value(c);
            let hi = l.mag_value(c + 1);
            let mid = (lo + hi) / 2.0;
            for x in [mid, mid * (1.0 + 1e-12), mid * (1.0 - 1e-12), lo, hi] {
                for s in [x, -x] {
                    assert_eq!(enc(s), l.nearest(s), "{l:?} x = {s}");
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn e2m1_encode_is_nearest(x in values(E2M1)) {
        prop_assert_eq!(e2m1::encode_sat(x), E2M1.nearest(x), "x = {}", x);
        prop_assert_eq!(e2m1::encode_sat_generic(x), E2M1.nearest(x), "x = {}", x);
    }

    #[test]
    fn e4m3_encode_is_nearest(x in values(E4M3)) {
        prop_assert_eq!(e4m3::encode_sat(x), E4M3.nearest(x), "x = {}", x);
    }

    #[test]
    fn e5m2_encode_is_nearest(x in values(E5M2)) {
        prop_assert_eq!(e5m2::encode_sat(x), E5M2.nearest(x), "x = {}", x);
    }

    #[test]
    fn encode_is_monotonic(a in values(E4M3), b in values(E4M3), which in 0usize..3) {
        let l = [E2M1, E4M3, E5M2][which];
        let (enc, dec) = (encoder(l), decoder(l));
        let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
        prop_assert!(dec(enc(lo)) <= dec(enc(hi)), "{:?}: {} -> {}, {} -> {}", l, lo, dec(enc(lo)), hi, dec(enc(hi)));
    }

    #[test]
    fn fp4_pack_unpack_round_trip(codes in proptest::collection::vec(0u8..16, 0..64usize).prop_map(|mut v| { v.truncate(v.len() & !1); v })) {
        let mut packed = vec![0u8; codes.len() / 2];
        e2m1::pack(&codes, &mut packed);
        let mut back = vec![0xAAu8; codes.len()];
        e2m1::unpack(&packed, &mut back);
        prop_assert_eq!(back, codes);
    }
}

/// A tensor of `rows x cols` values: each block gets its own magnitude
/// (2^k, k in -140..120 so clamped scales and huge ones both occur), some
/// blocks hold NaN/Inf, zeros or negative zeros.
fn tensor(
    block: usize,
    kmin: i32,
    kmax: i32,
    specials: bool,
) -> impl Strategy<Value = (usize, usize, Vec<f32>)> {
    (1usize..4, 1usize..4).prop_flat_map(move |(rows, nblocks)| {
        let cols = nblocks * block;
        let blocks = proptest::collection::vec(
            (
                kmin..kmax,
                proptest::collection::vec(-1.0f32..1.0, block),
                if specials { 0u8..20 } else { 2u8..20 },
            ),
            rows * nblocks,
        );
        blocks.prop_map(move |bs| {
            let mut x = Vec::with_capacity(rows * cols);
            for (k, vals, kind) in bs {
                let s = pow2(k) as f32;
                for (i, v) in vals.into_iter().enumerate() {
                    x.push(match kind {
                        0 if i == 3 => f32::NAN,
                        1 if i == 7 => f32::NEG_INFINITY,
                        2 => 0.0,
                        3 => -0.0,
                        _ => v * s,
                    });
                }
            }
            (rows, cols, x)
        })
    })
}

fn rule_of(i: usize) -> ScaleRule {
    [ScaleRule::Floor, ScaleRule::Even, ScaleRule::Rceil][i]
}

fn elem_of(i: usize) -> MxElem {
    [MxElem::Fp4E2M1, MxElem::Fp8E4M3, MxElem::Fp8E5M2][i]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    /// `floor` and `even`: the same codes and scales.
    #[test]
    fn mx_requantize_is_idempotent((rows, cols, x) in tensor(32, -140, 120, true), e in 0usize..3, r in 0usize..2) {
        let (elem, rule) = (elem_of(e), rule_of(r));
        let t = MxTensor::quantize(&x, rows, cols, elem, rule).unwrap();
        let y = t.dequantize();
        let t2 = MxTensor::quantize(&y, rows, cols, elem, rule).unwrap();
        prop_assert_eq!(t2.scales(), t.scales());
        prop_assert_eq!(t2.codes(), t.codes());
    }

    /// `rceil` picks the smallest power of two 2^e with amax <= max_elem * 2^e;
    /// when rounding brings a block's amax down to exactly max_elem * 2^(e-1)
    /// (e.g. E5M2 amax 0.933 -> 0.875 = 57344 * 2^-16), requantizing picks
    /// e - 1 and every code doubles. So the codes are not idempotent, but the
    /// values are: requantizing reproduces the dequantized tensor exactly.
    #[test]
    fn mx_rceil_requantize_keeps_values((rows, cols, x) in tensor(32, -140, 120, true), e in 0usize..3) {
        let elem = elem_of(e);
        let t = MxTensor::quantize(&x, rows, cols, elem, ScaleRule::Rceil).unwrap();
        let y = t.dequantize();
        let y2 = MxTensor::quantize(&y, rows, cols, elem, ScaleRule::Rceil).unwrap().dequantize();
        let bits = |v: &[f32]| v.iter().map(|f| if f.is_nan() { u32::MAX } else { f.to_bits() }).collect::<Vec<_>>();
        prop_assert_eq!(bits(&y2), bits(&y));
    }

    /// NVFP4: blocks within 2^5 of the tensor's amax keep E4M3 block scales
    /// in the normal range (>= 448 / 2^6), where the largest code of a block
    /// is 6 and requantizing reproduces the scale. (Blocks far below the
    /// global amax get subnormal scales whose relative rounding can leave a
    /// largest code below 6; requantizing such a block legitimately picks a
    /// smaller scale, so they are outside this property. So are NaN/Inf
    /// blocks: they decode to NaN everywhere, losing their finite values and
    /// with them possibly the tensor's amax.)
    #[test]
    fn nvfp4_requantize_is_idempotent((rows, cols, x) in tensor(16, -5, 1, false), big in -100i32..100) {
        let s = pow2(big) as f32;
        let x: Vec<f32> = x.iter().map(|v| v * s).collect();
        let t = Nvfp4Tensor::quantize(&x, rows, cols).unwrap();
        let y = t.dequantize();
        let t2 = Nvfp4Tensor::quantize(&y, rows, cols).unwrap();
        prop_assert_eq!(t2.global(), t.global());
        prop_assert_eq!(t2.scales(), t.scales());
        prop_assert_eq!(t2.codes(), t.codes());
    }
}
