//! FP8 element types: E4M3FN (bias 7, max 448, NaN = 0x7F/0xFF, no Inf) and
//! E5M2 (bias 15, max 57344, Inf = 0x7C/0xFC, NaN = 0x7D-0x7F and negatives).
//!
//! Decoding goes through 256-entry tables of f32 bits built at compile time
//! with integer arithmetic; encoding is the generic saturating RNE of
//! [`encode_mag`], shared by both types.

/// Which 8-bit float.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Fp8 {
    E4M3,
    E5M2,
}

/// The f32 bit pattern of the value of a minifloat code with `ebits`
/// exponent bits, `mbits` mantissa bits and `bias` (finite codes only; the
/// caller patches Inf / NaN codes). Integer arithmetic only, so it runs at
/// compile time.
const fn minifloat_f32_bits(code: u8, ebits: u32, mbits: u32, bias: i32) -> u32 {
    let sign = ((code as u32) >> (ebits + mbits)) << 31;
    let field = ((code as u32) >> mbits) & ((1 << ebits) - 1);
    let mant = (code as u32) & ((1 << mbits) - 1);
    if field == 0 {
        if mant == 0 {
            return sign;
        }
        // Subnormal: mant * 2^(1 - bias - mbits); normalise on its top bit p.
        let p = 31 - mant.leading_zeros();
        let exp = p as i32 + 1 - bias - mbits as i32;
        let frac = (mant - (1 << p)) << (23 - p);
        sign | (((exp + 127) as u32) << 23) | frac
    } else {
        let exp = field as i32 - bias;
        sign | (((exp + 127) as u32) << 23) | (mant << (23 - mbits))
    }
}

const fn table(e5m2: bool) -> [u32; 256] {
    let mut t = [0u32; 256];
    let mut c = 0usize;
    while c < 256 {
        let code = c as u8;
        let mag = code & 0x7F;
        let neg = (code & 0x80) != 0;
        t[c] = if e5m2 {
            if mag == 0x7C {
                if neg {
                    0xFF80_0000
                } else {
                    0x7F80_0000
                }
            } else if mag > 0x7C {
                if neg {
                    0xFFC0_0000
                } else {
                    0x7FC0_0000
                }
            } else {
                minifloat_f32_bits(code, 5, 2, 15)
            }
        } else if mag == 0x7F {
            if neg {
                0xFFC0_0000
            } else {
                0x7FC0_0000
            }
        } else {
            minifloat_f32_bits(code, 4, 3, 7)
        };
        c += 1;
    }
    t
}

/// f32 bits of every E4M3FN code.
pub(crate) static E4M3_BITS: [u32; 256] = table(false);
/// f32 bits of every E5M2 code.
pub(crate) static E5M2_BITS: [u32; 256] = table(true);

/// Saturating round-to-nearest-even of a magnitude `a` (>= 0, not NaN; may
/// be +Inf) to a sign-less minifloat code with `mbits` mantissa bits, minimum
/// normal exponent `emin`, largest finite code `max_code` whose value is
/// `max`.
///
/// In one binade `[2^e, 2^(e+1))` (or the subnormal range, e = emin) the
/// representable values are `t * 2^(e - mbits)` for integer t, and the code
/// is `((e - emin) << mbits) + t`; a carry of t to `2^(mbits+1)` lands on the
/// next binade's first code, so rounding t is all there is to do. The scaling
/// by a power of two is exact in f64.
///
/// Written with selects rather than early returns so block loops vectorize;
/// values at or past `max` (incl. +Inf) compute a meaningless code that the
/// final select replaces by `max_code`.
#[inline]
pub(crate) fn encode_mag(a: f64, mbits: u32, emin: i32, max_code: u8, max: f64) -> u8 {
    // floor(log2 a) from the f64 exponent field (f64 subnormals and 0 give
    // -1023, clamped to emin: they round to 0 anyway). The upper clamp only
    // keeps the power of two below in range for huge a (>= max anyway:
    // every type here has max < 2^17).
    let fe = ((a.to_bits() >> 52) & 0x7FF) as i32 - 1023;
    let e = fe.clamp(emin, 17);
    let n = a * super::pow2_f64(mbits as i32 - e);
    // n < 2^(mbits+1). Adding 2^52 leaves no fraction bits in an f64, so
    // the hardware's own RNE rounds n to an integer, ties to even; the
    // integer is then the low mantissa bits of the sum.
    const MAGIC: f64 = 4_503_599_627_370_496.0; // 2^52
    let t = (n + MAGIC).to_bits() - MAGIC.to_bits();
    let code = ((((e - emin) as u64) << mbits).wrapping_add(t)).min(max_code as u64) as u8;
    if a >= max {
        max_code
    } else {
        code
    }
}

pub mod e4m3 {
    /// Largest finite magnitude.
    pub const MAX: f32 = 448.0;
    /// Code of +448.
    pub const MAX_CODE: u8 = 0x7E;
    /// The positive NaN code.
    pub const NAN: u8 = 0x7F;

    /// Exact decode of an E4M3FN code (NaN codes give NaN).
    #[inline]
    pub fn decode(code: u8) -> f32 {
        f32::from_bits(super::E4M3_BITS[code as usize])
    }
    /// Saturating RNE encode of an exact value (f64 so quotients stay exact):
    /// past 448 (incl. Inf) -> +-448, NaN -> 0x7F (sign kept), -0 -> 0x80.
    #[inline]
    pub fn encode_sat(x: f64) -> u8 {
        let sign = u8::from(x.is_sign_negative()) << 7;
        let mag = super::encode_mag(x.abs(), 3, -6, MAX_CODE, 448.0);
        sign | if x.is_nan() { NAN } else { mag }
    }
}

pub mod e5m2 {
    /// Largest finite magnitude.
    pub const MAX: f32 = 57344.0;
    /// Code of +57344.
    pub const MAX_CODE: u8 = 0x7B;
    /// The positive NaN code written by the encoder.
    pub const NAN: u8 = 0x7E;

    /// Exact decode of an E5M2 code (Inf and NaN codes give Inf / NaN).
    #[inline]
    pub fn decode(code: u8) -> f32 {
        f32::from_bits(super::E5M2_BITS[code as usize])
    }
    /// Saturating RNE encode: past 57344 (incl. Inf) -> +-57344, NaN -> NaN
    /// (0x7E, sign kept), -0 -> 0x80.
    #[inline]
    pub fn encode_sat(x: f64) -> u8 {
        let sign = u8::from(x.is_sign_negative()) << 7;
        let mag = super::encode_mag(x.abs(), 2, -14, MAX_CODE, 57344.0);
        sign | if x.is_nan() { NAN } else { mag }
    }
}

impl Fp8 {
    pub fn decode(self, code: u8) -> f32 {
        match self {
            Fp8::E4M3 => e4m3::decode(code),
            Fp8::E5M2 => e5m2::decode(code),
        }
    }
    pub fn encode_sat(self, x: f64) -> u8 {
        match self {
            Fp8::E4M3 => e4m3::encode_sat(x),
            Fp8::E5M2 => e5m2::encode_sat(x),
        }
    }
}
