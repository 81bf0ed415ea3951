//! BF16: the top 16 bits of an f32, rounded to nearest even (NaN stays NaN).

/// Round an f32 to bf16 bits, RNE; NaN stays a quiet NaN.
pub fn from_f32(x: f32) -> u16 {
    todo!("formats helper: {x}")
}

/// Exact widening.
pub fn to_f32(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

/// `bf16(x)` of MODEL.md: round to bf16 and back.
pub fn round(x: f32) -> f32 {
    to_f32(from_f32(x))
}
