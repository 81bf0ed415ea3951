//! BF16: the top 16 bits of an f32, rounded to nearest even (NaN stays NaN).

/// Round an f32 to bf16 bits, RNE; NaN stays a quiet NaN (sign kept).
///
/// Overflow rounds to +-Inf as IEEE RNE does (bf16 is not a saturating
/// type); f32 subnormals round to bf16 subnormals, never flushed.
#[inline]
pub fn from_f32(x: f32) -> u16 {
    let bits = x.to_bits();
    if x.is_nan() {
        return ((bits >> 16) as u16) | 0x0040;
    }
    // Add half an ulp of bf16 minus one, plus the lowest kept bit: ties go to even.
    let lsb = (bits >> 16) & 1;
    (bits.wrapping_add(0x7FFF + lsb) >> 16) as u16
}

/// Exact widening.
#[inline]
pub fn to_f32(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

/// `bf16(x)` of MODEL.md: round to bf16 and back.
#[inline]
pub fn round(x: f32) -> f32 {
    to_f32(from_f32(x))
}
