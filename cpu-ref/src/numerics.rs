//! Fixed-order f32 arithmetic shared by every CPU op.
//!
//! Every reduction here has an order that depends only on the length of its
//! input, never on the thread count: a dot product is summed per 32-element
//! block (8 interleaved lanes, lanes combined as a balanced tree), and the
//! block sums are added pairwise in index order (`pairwise_sum`). Parallel
//! code only ever splits *independent* outputs across threads.

use std::sync::OnceLock;

use m3_core::formats::{e2m1, e8m0, fp8};

/// Elements per reduction block (= the MX block size, so quantized weights
/// decode one scale block at a time).
pub const BLOCK: usize = 32;

/// `bf16(x)`: round to nearest even to bfloat16 and back (NaN stays NaN).
/// Same rule as `m3_core::formats::bf16::round`; a test checks they agree.
#[inline]
pub fn bf16_round(x: f32) -> f32 {
    let b = x.to_bits();
    if x.is_nan() {
        return f32::from_bits((b | 0x0040_0000) & 0xFFFF_0000);
    }
    let lsb = (b >> 16) & 1;
    let r = b.wrapping_add(0x7FFF + lsb);
    f32::from_bits(r & 0xFFFF_0000)
}

/// Round a slice to bf16 in place.
pub fn bf16_round_all(x: &mut [f32]) {
    for v in x {
        *v = bf16_round(*v);
    }
}

/// Sum `v` pairwise: split at the largest power of two below the length,
/// sum both halves the same way, add left + right.
pub fn pairwise_sum(v: &[f32]) -> f32 {
    match v.len() {
        0 => 0.0,
        1 => v[0],
        2 => v[0] + v[1],
        n => {
            // Largest power of two strictly below n.
            let h = 1usize << (usize::BITS - 1 - (n - 1).leading_zeros());
            pairwise_sum(&v[..h]) + pairwise_sum(&v[h..])
        }
    }
}

/// Dot product of one block (at most 32 elements): lane `i % 8` accumulates
/// in index order, then lanes combine as ((0+1)+(2+3))+((4+5)+(6+7)).
#[inline]
pub fn dot_block(a: &[f32], b: &[f32]) -> f32 {
    let mut l = [0.0f32; 8];
    let n = a.len().min(b.len());
    if let (Ok(a), Ok(b)) = (<&[f32; BLOCK]>::try_from(a), <&[f32; BLOCK]>::try_from(b)) {
        // Fixed-size arrays: no bounds checks, the 8 lanes vectorize.
        for c in 0..4 {
            for i in 0..8 {
                l[i] += a[c * 8 + i] * b[c * 8 + i];
            }
        }
    } else {
        for i in 0..n {
            l[i % 8] += a[i] * b[i];
        }
    }
    ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]))
}

/// Dot product of two equal-length vectors in the fixed order.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    if n <= BLOCK {
        return dot_block(&a[..n], &b[..n]);
    }
    let nb = n.div_ceil(BLOCK);
    let mut sums = [0.0f32; 64];
    let mut heap;
    let s: &mut [f32] = if nb <= 64 {
        &mut sums[..nb]
    } else {
        heap = vec![0.0f32; nb];
        &mut heap
    };
    for (i, o) in s.iter_mut().enumerate() {
        let lo = i * BLOCK;
        let hi = (lo + BLOCK).min(n);
        *o = dot_block(&a[lo..hi], &b[lo..hi]);
    }
    pairwise_sum(s)
}

/// Sum of squares in the same fixed order as `dot(x, x)`.
pub fn sum_sq(x: &[f32]) -> f32 {
    dot(x, x)
}

/// `1 / (1 + exp(-x))` in f32.
#[inline]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// Decode tables built once from the `formats` codecs (the bit-exact
/// contract), so the inner loops are lookups.
pub struct Tables {
    pub e2m1: [f32; 16],
    pub e4m3: [f32; 256],
    pub e5m2: [f32; 256],
    pub e8m0: [f32; 256],
}

/// The decode tables.
pub fn tables() -> &'static Tables {
    static T: OnceLock<Tables> = OnceLock::new();
    T.get_or_init(|| {
        let mut t = Tables {
            e2m1: [0.0; 16],
            e4m3: [0.0; 256],
            e5m2: [0.0; 256],
            e8m0: [0.0; 256],
        };
        for c in 0..16u8 {
            t.e2m1[c as usize] = e2m1::decode(c);
        }
        for c in 0..=255u8 {
            t.e4m3[c as usize] = fp8::e4m3::decode(c);
            t.e5m2[c as usize] = fp8::e5m2::decode(c);
            t.e8m0[c as usize] = e8m0::decode(c);
        }
        t
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_round_hand_cases() {
        // 1 + 2^-8 is exactly halfway between 1 and 1 + 2^-7: ties to even (1).
        assert_eq!(bf16_round(1.0 + 2f32.powi(-8)), 1.0);
        // 1 + 3*2^-8 is halfway between 1+2^-7 (odd) and 1+2^-6 (even).
        assert_eq!(bf16_round(1.0 + 3.0 * 2f32.powi(-8)), 1.0 + 2f32.powi(-6));
        // Just above halfway rounds up.
        assert_eq!(
            bf16_round(1.0 + 2f32.powi(-8) + 2f32.powi(-20)),
            1.0 + 2f32.powi(-7)
        );
        assert_eq!(bf16_round(-2.0), -2.0);
        assert!(bf16_round(f32::NAN).is_nan());
        assert_eq!(bf16_round(f32::INFINITY), f32::INFINITY);
    }

    #[test]
    fn bf16_round_agrees_with_the_formats_codec() {
        let mut x = 0x9E37_79B9u32;
        for _ in 0..100_000 {
            x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            let v = f32::from_bits(x);
            let (a, b) = (bf16_round(v), m3_core::formats::bf16::round(v));
            assert!(
                a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()),
                "{v:e}: {a:e} vs {b:e}"
            );
        }
    }

    #[test]
    fn pairwise_order_is_the_documented_tree() {
        // With values whose sum depends on order in f32: 2^24, 1, 1, -2^24.
        // Tree: (2^24 + 1) + (1 - 2^24) = 2^24 + (1 - 2^24) = 1 (2^24+1 rounds
        // to 2^24 in f32).
        let v = [16_777_216.0f32, 1.0, 1.0, -16_777_216.0];
        assert_eq!(pairwise_sum(&v), 1.0);
        // Sequential would give 2^24 + 1 + 1 = 2^24 (each +1 lost) - 2^24 = 0.
        assert_eq!(v.iter().fold(0.0f32, |a, &b| a + b), 0.0);
        assert_eq!(pairwise_sum(&[1.0, 2.0, 3.0]), 6.0);
        assert_eq!(pairwise_sum(&[]), 0.0);
    }

    #[test]
    fn dot_matches_exact_small_integers() {
        let a: Vec<f32> = (0..100).map(|i| (i % 7) as f32 - 3.0).collect();
        let b: Vec<f32> = (0..100).map(|i| (i % 5) as f32 - 2.0).collect();
        let exact: i64 = (0..100)
            .map(|i| ((i % 7) as i64 - 3) * ((i % 5) as i64 - 2))
            .sum();
        assert_eq!(dot(&a, &b), exact as f32);
    }
}
