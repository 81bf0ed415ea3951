//! Unit tests from the concrete statements of FORMATS.md. Every expected
//! value below is worked out by hand from the spec text (layouts, biases,
//! the stated ties and rules), never taken from the code under test.

use m3_core::formats::{
    bf16, convert, e2m1, e8m0,
    fp8::{e4m3, e5m2},
    mx::{block_scale, scale_from_amax},
    FormatError, MxElem, MxTensor, Nvfp4Tensor, ScaleRule,
};

/// 2^k for small k, by repeated doubling / halving (independent of the code).
fn p2(k: i32) -> f64 {
    let mut v = 1.0f64;
    for _ in 0..k.unsigned_abs() {
        if k > 0 {
            v *= 2.0
        } else {
            v *= 0.5
        }
    }
    v
}

// ---------------------------------------------------------------- E2M1

#[test]
fn e2m1_decode_magnitudes() {
    let mags = [0.0f32, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
    for (c, &m) in mags.iter().enumerate() {
        assert_eq!(e2m1::decode(c as u8), m, "code {c}");
        assert_eq!(e2m1::decode(c as u8 | 8), -m, "code {}", c | 8);
    }
    assert!(e2m1::decode(8).is_sign_negative(), "code 8 is -0.0");
    // The high nibble is ignored.
    assert_eq!(e2m1::decode(0xF7), 6.0);
}

#[test]
fn e2m1_ties_to_even() {
    // FORMATS.md: 0.25->0, 0.75->1, 1.25->1, 1.75->2, 2.5->2, 3.5->4, 5->4.
    // Codes of 0, 1, 2, 4 are 0, 2, 4, 6.
    let cases = [
        (0.25, 0u8),
        (0.75, 2),
        (1.25, 2),
        (1.75, 4),
        (2.5, 4),
        (3.5, 6),
        (5.0, 6),
    ];
    for (x, code) in cases {
        assert_eq!(e2m1::encode_sat(x), code, "{x}");
        assert_eq!(e2m1::encode_sat(-x), code | 8, "-{x}");
    }
    // Just off the ties, the nearest wins.
    let eps = 1e-9;
    let off = [
        (0.25 + eps, 1u8),
        (0.75 - eps, 1),
        (1.25 + eps, 3),
        (1.75 - eps, 3),
        (2.5 + eps, 5),
        (3.5 - eps, 5),
        (5.0 + eps, 7),
    ];
    for (x, code) in off {
        assert_eq!(e2m1::encode_sat(x), code, "{x}");
    }
}

#[test]
fn e2m1_saturates_and_keeps_signed_zero() {
    assert_eq!(e2m1::encode_sat(7.0), 7);
    assert_eq!(e2m1::encode_sat(1e30), 7);
    assert_eq!(e2m1::encode_sat(f64::INFINITY), 7);
    assert_eq!(e2m1::encode_sat(f64::NEG_INFINITY), 15);
    assert_eq!(e2m1::encode_sat(-0.0), 8);
    assert_eq!(e2m1::encode_sat(0.0), 0);
    assert_eq!(
        e2m1::encode_sat(f64::NAN),
        0,
        "NaN encodes to +0 by contract"
    );
    // The subnormal 0.5 and values just above zero.
    assert_eq!(e2m1::encode_sat(0.5), 1);
    assert_eq!(e2m1::encode_sat(0.1), 0);
}

#[test]
fn e2m1_pack_low_nibble_first() {
    let codes = [0x1u8, 0x2, 0xF, 0x8];
    let mut packed = [0u8; 2];
    e2m1::pack(&codes, &mut packed);
    assert_eq!(packed, [0x21, 0x8F]);
    let mut back = [0u8; 4];
    e2m1::unpack(&packed, &mut back);
    assert_eq!(back, codes);
}

// ---------------------------------------------------------------- E4M3FN

#[test]
fn e4m3_decode_by_layout() {
    // s eeee mmm, bias 7.
    assert_eq!(e4m3::decode(0x38), 1.0); // 0 0111 000
    assert_eq!(e4m3::decode(0x7E), 448.0); // 0 1111 110 = 1.75 * 2^8
    assert_eq!(e4m3::decode(0xFE), -448.0);
    assert_eq!(e4m3::decode(0x08) as f64, p2(-6)); // smallest normal
    assert_eq!(e4m3::decode(0x01) as f64, p2(-9)); // smallest subnormal = 2^-6 / 8
    assert_eq!(e4m3::decode(0x07) as f64, 7.0 * p2(-9)); // largest subnormal
    assert!(e4m3::decode(0x7F).is_nan());
    assert!(e4m3::decode(0xFF).is_nan());
    assert!(e4m3::decode(0x80).is_sign_negative() && e4m3::decode(0x80) == 0.0);
}

#[test]
fn e4m3_encode_examples() {
    // 464 is the midpoint of 448 (mantissa 110) and 480 (would be 111 = NaN):
    // ties to even -> 448; 480 saturates to 448.
    assert_eq!(e4m3::encode_sat(464.0), 0x7E);
    assert_eq!(e4m3::encode_sat(480.0), 0x7E);
    assert_eq!(e4m3::encode_sat(-480.0), 0xFE);
    assert_eq!(e4m3::encode_sat(f64::INFINITY), 0x7E);
    assert_eq!(e4m3::encode_sat(f64::NEG_INFINITY), 0xFE);
    assert_eq!(e4m3::encode_sat(f64::NAN), 0x7F);
    assert_eq!(e4m3::encode_sat(-f64::NAN), 0xFF);
    assert_eq!(e4m3::encode_sat(-0.0), 0x80);
    assert_eq!(e4m3::encode_sat(1.0), 0x38);
    // Between 1 and 1.125 (0x39): 1.0625 is the tie -> even mantissa 000.
    assert_eq!(e4m3::encode_sat(1.0625), 0x38);
    // 1.1875 ties 1.125 (001) and 1.25 (010) -> 010.
    assert_eq!(e4m3::encode_sat(1.1875), 0x3A);
    // Subnormal ties: 1.5 * 2^-9 ties 2^-9 (001) and 2^-8 (010) -> 010;
    // 0.5 * 2^-9 ties 0 and 2^-9 -> 0.
    assert_eq!(e4m3::encode_sat(1.5 * p2(-9)), 0x02);
    assert_eq!(e4m3::encode_sat(0.5 * p2(-9)), 0x00);
    assert_eq!(e4m3::encode_sat(0.5 * p2(-9) * 1.0001), 0x01);
    // Carry from the largest subnormal into the first normal: 7.5 * 2^-9 -> 8 * 2^-9 = 2^-6.
    assert_eq!(e4m3::encode_sat(7.5 * p2(-9)), 0x08);
}

// ---------------------------------------------------------------- E5M2

#[test]
fn e5m2_decode_and_encode() {
    // s eeeee mm, bias 15.
    assert_eq!(e5m2::decode(0x3C), 1.0);
    assert_eq!(e5m2::decode(0x7B), 57344.0); // 1.75 * 2^15
    assert_eq!(e5m2::decode(0x7C), f32::INFINITY);
    assert_eq!(e5m2::decode(0xFC), f32::NEG_INFINITY);
    for c in [0x7D, 0x7E, 0x7F, 0xFD, 0xFE, 0xFF] {
        assert!(e5m2::decode(c).is_nan(), "{c:#x}");
    }
    assert_eq!(e5m2::decode(0x01) as f64, p2(-16));
    assert_eq!(e5m2::decode(0x04) as f64, p2(-14));
    assert_eq!(e5m2::encode_sat(1e9), 0x7B);
    assert_eq!(e5m2::encode_sat(f64::INFINITY), 0x7B);
    assert_eq!(e5m2::encode_sat(f64::NEG_INFINITY), 0xFB);
    assert!(e5m2::decode(e5m2::encode_sat(f64::NAN)).is_nan());
    assert_eq!(e5m2::encode_sat(-0.0), 0x80);
    // 1.125 ties 1.0 (00) and 1.25 (01) -> 00; 1.375 ties 1.25 and 1.5 -> 10.
    assert_eq!(e5m2::encode_sat(1.125), 0x3C);
    assert_eq!(e5m2::encode_sat(1.375), 0x3E);
    // 61440 ties 57344 and 65536 (which would be Inf): even -> 65536, but the
    // encode saturates: 57344.
    assert_eq!(e5m2::encode_sat(61440.0), 0x7B);
}

// ---------------------------------------------------------------- E8M0, BF16

#[test]
fn e8m0_decode() {
    assert_eq!(e8m0::decode(127), 1.0);
    assert_eq!(e8m0::decode(128), 2.0);
    assert_eq!(e8m0::decode(254) as f64, p2(127));
    // 0x00 is 2^-127, an f32 subnormal (mantissa bit 22), not zero.
    assert_eq!(e8m0::decode(0x00) as f64, p2(-127));
    assert_eq!(e8m0::decode(0x00).to_bits(), 0x0040_0000);
    assert!(e8m0::decode(0xFF).is_nan());
}

#[test]
fn bf16_rne() {
    assert_eq!(bf16::from_f32(1.0), 0x3F80);
    // 1 + 2^-8 is the midpoint of 0x3F80 and 0x3F81 -> even 0x3F80.
    assert_eq!(bf16::from_f32(f32::from_bits(0x3F80_8000)), 0x3F80);
    // 1 + 3 * 2^-8 is the midpoint of 0x3F81 and 0x3F82 -> 0x3F82.
    assert_eq!(bf16::from_f32(f32::from_bits(0x3F81_8000)), 0x3F82);
    assert_eq!(bf16::from_f32(f32::from_bits(0x3F80_8001)), 0x3F81);
    assert_eq!(bf16::from_f32(-0.0), 0x8000);
    assert_eq!(bf16::from_f32(f32::MAX), 0x7F80, "RNE overflows to +Inf");
    assert!(bf16::to_f32(bf16::from_f32(f32::NAN)).is_nan());
    // A NaN whose payload sits only in the low 16 bits stays NaN.
    assert!(bf16::to_f32(bf16::from_f32(f32::from_bits(0x7F80_0001))).is_nan());
    // Subnormal: 0x0000_8000 is the midpoint of 0x0000 and 0x0001 -> 0.
    assert_eq!(bf16::from_f32(f32::from_bits(0x0000_8000)), 0x0000);
    assert_eq!(bf16::from_f32(f32::from_bits(0x0001_8000)), 0x0002);
}

// ---------------------------------------------------------------- MX

fn block_with(amax: f32) -> Vec<f32> {
    let mut b = vec![0.0f32; 32];
    b[5] = amax;
    b[6] = -amax / 4.0;
    b
}

#[test]
fn mx_floor_scale() {
    // e = floor(log2 amax) - emax (2, 8, 15).
    assert_eq!(
        block_scale(MxElem::Fp4E2M1, ScaleRule::Floor, &block_with(1.0)),
        127 - 2
    );
    assert_eq!(
        block_scale(MxElem::Fp4E2M1, ScaleRule::Floor, &block_with(7.0)),
        127
    );
    assert_eq!(
        block_scale(MxElem::Fp8E4M3, ScaleRule::Floor, &block_with(448.0)),
        127
    );
    assert_eq!(
        block_scale(MxElem::Fp8E4M3, ScaleRule::Floor, &block_with(1.0)),
        127 - 8
    );
    assert_eq!(
        block_scale(MxElem::Fp8E5M2, ScaleRule::Floor, &block_with(1.0)),
        127 - 15
    );
    // Subnormal f32 amax: floor(log2(2^-140)) - 2 < -127, clamped to 0x00.
    let tiny = p2(-140) as f32;
    assert_eq!(
        block_scale(MxElem::Fp4E2M1, ScaleRule::Floor, &block_with(tiny)),
        0
    );
    // Huge amax: floor(log2(2^127)) - 2 = 125.
    let huge = p2(127) as f32;
    assert_eq!(
        block_scale(MxElem::Fp4E2M1, ScaleRule::Floor, &block_with(huge)),
        252
    );
}

#[test]
fn mx_floor_fp4_saturates_values_in_6_to_8() {
    // amax = 7: e = 0, 7 / 1 = 7 lies in (6, 8) and saturates to 6: the spec.
    let mut x = block_with(7.0);
    x[7] = 6.5;
    x[8] = -7.9;
    let t = MxTensor::quantize(&x, 1, 32, MxElem::Fp4E2M1, ScaleRule::Floor).unwrap();
    assert_eq!(t.scales(), &[127]);
    let y = t.dequantize();
    assert_eq!(y[5], 6.0);
    assert_eq!(y[7], 6.0);
    assert_eq!(y[8], -6.0);
    // -7/4 = -1.75 ties 1.5 and 2 -> 2 (FORMATS.md: 1.75->2).
    assert_eq!(y[6], -2.0);
}

#[test]
fn mx_even_rule_and_carry() {
    // amax = 7 = 1.75 * 2^2: mantissa .11 plus half a unit at 1 bit carries -> 8,
    // e = 3 - 2 = 1: scale 128; 7 / 2 = 3.5 ties 3 and 4 -> 4.
    let x = block_with(7.0);
    assert_eq!(block_scale(MxElem::Fp4E2M1, ScaleRule::Even, &x), 128);
    let t = MxTensor::quantize(&x, 1, 32, MxElem::Fp4E2M1, ScaleRule::Even).unwrap();
    assert_eq!(t.dequantize()[5], 8.0);
    // amax = 6 = 1.5 * 2^2: .10 + .01 = .11, no carry: scale 127.
    assert_eq!(
        block_scale(MxElem::Fp4E2M1, ScaleRule::Even, &block_with(6.0)),
        127
    );
    // The carry into the all-ones exponent: amax = 1.75 * 2^127 (finite f32)
    // is treated as 2^128: e = 128 - 2 = 126, byte 253 (floor gives 252).
    let big = (1.75 * p2(127)) as f32;
    assert!(big.is_finite());
    assert_eq!(
        block_scale(MxElem::Fp4E2M1, ScaleRule::Even, &block_with(big)),
        253
    );
    assert_eq!(
        block_scale(MxElem::Fp4E2M1, ScaleRule::Floor, &block_with(big)),
        252
    );
    // The same amax through f32::MAX: still finite scale.
    assert_eq!(
        block_scale(MxElem::Fp4E2M1, ScaleRule::Even, &block_with(f32::MAX)),
        253
    );
    // E4M3 (mbits 3): 1.9375 * 2^0 = 1.1111b carries -> 2: e = 1 - 8.
    assert_eq!(
        block_scale(MxElem::Fp8E4M3, ScaleRule::Even, &block_with(1.9375)),
        127 + 1 - 8
    );
    assert_eq!(
        block_scale(MxElem::Fp8E4M3, ScaleRule::Even, &block_with(1.875)),
        127 - 8
    );
}

#[test]
fn mx_rceil_rule() {
    // f32(1/6) = 11184811 * 2^-26; 6 * that = 1 + 2^-25, which rounds (f32) to
    // 1.0, a power of two: e = 0 -> 127.
    assert_eq!(
        block_scale(MxElem::Fp4E2M1, ScaleRule::Rceil, &block_with(6.0)),
        127
    );
    // 3 * f32(1/6) rounds to 0.5: e = -1.
    assert_eq!(
        block_scale(MxElem::Fp4E2M1, ScaleRule::Rceil, &block_with(3.0)),
        126
    );
    // 6.5 / 6 ~ 1.083 rounds up to 2: e = 1.
    assert_eq!(
        block_scale(MxElem::Fp4E2M1, ScaleRule::Rceil, &block_with(6.5)),
        128
    );
    // 4 / 6 ~ 0.667 -> 1: e = 0.
    assert_eq!(
        block_scale(MxElem::Fp4E2M1, ScaleRule::Rceil, &block_with(4.0)),
        127
    );
    // E5M2: 57344 * f32(1/57344): 1/57344 = 2^-13 / 7, rounded; the product is
    // within an ulp of 1, either 1 - 2^-24 (-> ceil 1 = 2^0) or 1 or 1 + 2^-23
    // (-> 2^1). f32(1/7) = 9586981 * 2^-26 > 1/7, so the product rounds to
    // >= 1: 7 * 9586981 = 67108867 = 2^26 + 3 -> 1 + 3 * 2^-26, rounds to 1.0: e = 0.
    assert_eq!(
        block_scale(MxElem::Fp8E5M2, ScaleRule::Rceil, &block_with(57344.0)),
        127
    );
}

#[test]
fn mx_nan_inf_and_zero_blocks() {
    for rule in [ScaleRule::Floor, ScaleRule::Even, ScaleRule::Rceil] {
        for elem in [MxElem::Fp4E2M1, MxElem::Fp8E4M3, MxElem::Fp8E5M2] {
            for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
                let mut x = vec![1.0f32; 64];
                x[40] = bad;
                let t = MxTensor::quantize(&x, 1, 64, elem, rule).unwrap();
                assert_eq!(t.scales()[1], 0xFF, "{elem:?} {rule:?} {bad}");
                let nb = elem.packed_len(32);
                assert!(t.codes()[nb..].iter().all(|&c| c == 0), "{elem:?} {rule:?}");
                let y = t.dequantize();
                assert!(y[32..].iter().all(|v| v.is_nan()));
                assert!(y[..32].iter().all(|&v| v == 1.0), "first block untouched");
            }
            let z = vec![0.0f32; 32];
            let t = MxTensor::quantize(&z, 1, 32, elem, rule).unwrap();
            assert_eq!(t.scales(), &[0x00]);
            assert!(t.codes().iter().all(|&c| c == 0));
            assert!(t
                .dequantize()
                .iter()
                .all(|&v| v == 0.0 && v.is_sign_positive()));
        }
    }
}

#[test]
fn mx_negative_zero_and_packing() {
    let mut x = vec![0.0f32; 32];
    x[0] = -0.0;
    x[1] = 4.0; // amax 4: floor e = 0, code of 4 is 6
    x[2] = -0.5;
    let t = MxTensor::quantize(&x, 1, 32, MxElem::Fp4E2M1, ScaleRule::Floor).unwrap();
    assert_eq!(t.scales(), &[127]);
    assert_eq!(t.codes()[0], 0x8 | (6 << 4)); // -0 low nibble, 4.0 high nibble
    assert_eq!(t.codes()[1], 0x9); // -0.5, then +0
    let y = t.dequantize();
    assert!(y[0] == 0.0 && y[0].is_sign_negative());
    assert_eq!(&y[1..3], &[4.0, -0.5]);
    let t8 = MxTensor::quantize(&x, 1, 32, MxElem::Fp8E4M3, ScaleRule::Floor).unwrap();
    assert_eq!(t8.codes()[0], 0x80);
}

#[test]
fn mx_exact_values_round_trip() {
    // Values on the FP4 grid times 2^-3: floor e = floor(log2 0.75) - 2 = -3,
    // 0.75 / 2^-3 = 6. Every value is exact.
    let vals = [0.0f32, 0.0625, 0.125, 0.1875, 0.25, 0.375, 0.5, 0.75];
    let x: Vec<f32> = (0..64)
        .map(|i| {
            if i % 3 == 0 {
                -vals[i % 8]
            } else {
                vals[i % 8]
            }
        })
        .collect();
    let t = MxTensor::quantize(&x, 2, 32, MxElem::Fp4E2M1, ScaleRule::Floor).unwrap();
    assert_eq!(t.scales(), &[124, 124]);
    assert_eq!(t.dequantize(), x);
}

#[test]
fn mx_shape_errors() {
    let x = vec![0.0f32; 48];
    assert_eq!(
        MxTensor::quantize(&x, 1, 48, MxElem::Fp4E2M1, ScaleRule::Floor),
        Err(FormatError::NotBlockMultiple {
            cols: 48,
            block: 32
        })
    );
    assert!(matches!(
        MxTensor::quantize(&x, 2, 32, MxElem::Fp4E2M1, ScaleRule::Floor),
        Err(FormatError::BadLength {
            expected: 64,
            got: 48,
            ..
        })
    ));
    assert!(MxTensor::from_parts(MxElem::Fp4E2M1, 1, 32, vec![0; 16], vec![0]).is_ok());
    assert!(MxTensor::from_parts(MxElem::Fp4E2M1, 1, 32, vec![0; 32], vec![0]).is_err());
    assert!(MxTensor::from_parts(MxElem::Fp8E4M3, 1, 32, vec![0; 32], vec![0; 2]).is_err());
    assert!(Nvfp4Tensor::quantize(&[0.0; 24], 1, 24).is_err());
    assert!(Nvfp4Tensor::from_parts(1, 16, vec![0; 8], vec![0], f32::NAN).is_err());
}

#[test]
fn scale_from_amax_zero() {
    for rule in [ScaleRule::Floor, ScaleRule::Even, ScaleRule::Rceil] {
        assert_eq!(scale_from_amax(MxElem::Fp4E2M1, rule, 0.0), 0x00);
    }
}

// ---------------------------------------------------------------- NVFP4

#[test]
fn nvfp4_global_scale() {
    assert_eq!(nvfp4::global(&[2688.0, -1.0]), 1.0);
    assert_eq!(nvfp4::global(&[0.0, -0.0]), 1.0, "amax 0 -> 1.0");
    assert_eq!(
        nvfp4::global(&[-5376.0, f32::NAN, f32::INFINITY]),
        2.0,
        "finite values only"
    );
    // 2^-149 / 2688 underflows to 0: the smallest subnormal instead.
    let min = f32::from_bits(1);
    assert_eq!(nvfp4::global(&[min]), min);
}

mod nvfp4 {
    pub fn global(x: &[f32]) -> f32 {
        m3_core::formats::nvfp4::global_scale(x)
    }
}

#[test]
fn nvfp4_blocks() {
    // g = 2688 / 2688 = 1. Block 0: bamax 6 -> s = e4m3(6/6) = 1.0 (0x38);
    // element 6 -> code 7, 2688 is in block 1: s = e4m3(448) = 0x7E, 2688 /
    // 448 = 6 -> code 7. Block 2: bamax 1e-4 -> 1e-4/6 < 2^-10 (half the
    // smallest E4M3 subnormal) -> s = 0 -> codes 0. Block 3 holds NaN -> 0x7F.
    let mut x = vec![0.0f32; 64];
    x[0] = 6.0;
    x[1] = -3.0;
    x[2] = -0.0;
    x[16] = 2688.0;
    x[17] = 448.0;
    x[32] = 1e-4;
    x[48] = f32::NAN;
    x[49] = 1.0;
    let t = Nvfp4Tensor::quantize(&x, 1, 64).unwrap();
    assert_eq!(t.global(), 1.0);
    assert_eq!(t.scales(), &[0x38, 0x7E, 0x00, 0x7F]);
    assert_eq!(t.codes()[0], 0x7 | (0xD << 4)); // 6 | -3 << 4
    assert_eq!(t.codes()[1], 0x8); // -0.0, then +0
    assert_eq!(t.codes()[8], 0x7 | (0x2 << 4)); // 2688/448 = 6, 448/448 = 1
    assert!(t.codes()[16..].iter().all(|&c| c == 0));
    let y = t.dequantize();
    assert_eq!(&y[..2], &[6.0, -3.0]);
    assert!(y[2] == 0.0 && y[2].is_sign_negative());
    assert_eq!(&y[16..18], &[2688.0, 448.0]);
    assert!(y[32..48].iter().all(|&v| v == 0.0));
    assert!(y[48..].iter().all(|v| v.is_nan()));
    assert_eq!(t.value_f64(0, 17), 448.0);
}

// ---------------------------------------------------------------- conversions

#[test]
fn nvfp4_to_mxfp4_exact_when_representable() {
    // g = 1 (amax 2688 absent: set via from_parts), s = 1.0 for both blocks:
    // values are plain E2M1 values, max 6 -> MX floor e = 0, even e = 0
    // (1.5 * 2^2: no carry), so the conversion is exact.
    let codes: Vec<u8> = (0..16u8).map(|j| (j % 8) | ((7 - j % 8) << 4)).collect();
    let t = Nvfp4Tensor::from_parts(1, 32, codes, vec![0x38, 0x38], 1.0).unwrap();
    for rule in [ScaleRule::Floor, ScaleRule::Even] {
        let m = convert::nvfp4_to_mxfp4(&t, rule);
        assert_eq!(m.scales(), &[127]);
        assert_eq!(m.dequantize(), t.dequantize(), "{rule:?}");
        assert_eq!(m.codes(), t.codes());
    }
    let bad = Nvfp4Tensor::from_parts(1, 16, vec![0; 8], vec![0x38], 1.0).unwrap();
    assert!(convert::try_nvfp4_to_mxfp4(&bad, ScaleRule::Even).is_err());
}

#[test]
fn nvfp4_to_mxfp4_uses_exact_values() {
    // s = 1.25 (0x3A), g = 1: values 6 * 1.25 = 7.5 and 0.5 * 1.25 = 0.625.
    // floor: e = floor(log2 7.5) - 2 = 0; 7.5 saturates to 6; 0.625 -> 0.5.
    // even: 7.5 = 1.875 * 4, + 0.25 carries to 8 -> e = 1: 3.75 -> 4, so 8;
    // 0.3125 -> 0.5 (nearer than 0), so 1.
    let mut codes = vec![0u8; 16];
    codes[0] = 0x7 | (0x1 << 4);
    let t = Nvfp4Tensor::from_parts(1, 32, codes, vec![0x3A, 0x38], 1.0).unwrap();
    let f = convert::nvfp4_to_mxfp4(&t, ScaleRule::Floor).dequantize();
    assert_eq!(&f[..2], &[6.0, 0.5]);
    let e = convert::nvfp4_to_mxfp4(&t, ScaleRule::Even).dequantize();
    assert_eq!(&e[..2], &[8.0, 1.0]);
}

#[test]
fn mxfp8_to_bf16_exact_range() {
    // E4M3 1.0 (0x38) at scale 127 -> bf16 1.0 = 0x3F80.
    let mk = |elem, s: u8| MxTensor::from_parts(elem, 2, 32, vec![0x38; 64], vec![127, s]).unwrap();
    let ok = convert::mxfp8_to_bf16(&mk(MxElem::Fp8E4M3, 3), true).unwrap();
    assert_eq!(ok[0], 0x3F80);
    // Row 1 block 0 holds 1.0 * 2^(3-127) = 2^-124: bf16 0x0180 (exponent 3).
    assert_eq!(ok[32], 0x0180);
    assert!(convert::mxfp8_to_bf16(&mk(MxElem::Fp8E4M3, 246), true).is_ok());
    for (elem, s) in [
        (MxElem::Fp8E4M3, 2u8),
        (MxElem::Fp8E4M3, 247),
        (MxElem::Fp8E4M3, 0xFF),
        (MxElem::Fp8E5M2, 9),
        (MxElem::Fp8E5M2, 240),
    ] {
        match convert::mxfp8_to_bf16(&mk(elem, s), true) {
            Err(FormatError::NotExact {
                row: 1, block: 0, ..
            }) => {}
            other => panic!("{elem:?} scale {s}: {other:?}"),
        }
        assert!(convert::mxfp8_to_bf16(&mk(elem, s), false).is_ok());
    }
    assert!(convert::mxfp8_to_bf16(&mk(MxElem::Fp8E5M2, 10), true).is_ok());
    assert!(convert::mxfp8_to_bf16(&mk(MxElem::Fp8E5M2, 239), true).is_ok());
    // Non-exact: E4M3 smallest subnormal 2^-9 at scale 0 is 2^-136, below the
    // smallest bf16 subnormal 2^-133: it rounds (to 0), never flushes blindly;
    // 4 * 2^-9 * 2^-127 = 2^-134 ties 0 and 2^-133 -> 0; 6 * 2^-136 -> 2^-133 * 0.75 -> 1 ulp.
    let sub = MxTensor::from_parts(
        MxElem::Fp8E4M3,
        1,
        32,
        [0x01u8, 0x04, 0x06]
            .iter()
            .copied()
            .chain(std::iter::repeat_n(0, 29))
            .collect(),
        vec![0],
    )
    .unwrap();
    let b = convert::mxfp8_to_bf16(&sub, false).unwrap();
    assert_eq!(&b[..3], &[0x0000, 0x0000, 0x0001]);
    let nan = convert::mxfp8_to_bf16(&mk(MxElem::Fp8E4M3, 0xFF), false).unwrap();
    assert!(bf16::to_f32(nan[32]).is_nan());
    let fp4 = MxTensor::from_parts(MxElem::Fp4E2M1, 1, 32, vec![0; 16], vec![127]).unwrap();
    assert!(convert::mxfp8_to_bf16(&fp4, false).is_err());
}

#[test]
fn ptpc_and_cache_cast() {
    // Row 0: amax 448 -> scale 1.0; row 1: zero -> 1.0; row 2: amax 896 -> 2.0.
    let x = [448.0f32, -1.0, 0.0, 0.0, 896.0, 3.0];
    let p = convert::PtpcFp8::quantize(&x, 3, 2).unwrap();
    assert_eq!(p.scales, vec![1.0, 1.0, 2.0]);
    assert_eq!(p.codes, vec![0x7E, 0xB8, 0x00, 0x00, 0x7E, 0x3C]); // 3/2 = 1.5 = 0 0111 100
    assert_eq!(p.dequantize(), x.to_vec());
    assert!(convert::PtpcFp8::quantize(&x, 2, 2).is_err());
    assert_eq!(convert::cache_cast_e4m3(2.0, 2.0), 0x38);
    assert_eq!(convert::cache_cast_e4m3(f32::NAN, 1.0) & 0x7F, 0x7F);
    assert_eq!(convert::cache_cast_e4m3(1e6, 1.0), 0x7E);
    assert_eq!(convert::cache_load_e4m3(0x38, 0.5), 0.5);
}
