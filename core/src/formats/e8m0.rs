//! E8M0 scale: value 2^(c-127); 0x00 = 2^-127 (an f32 subnormal); 0xFF = NaN.

/// Exact decode (0x00 gives 2^-127, not 0; 0xFF gives NaN).
pub fn decode(code: u8) -> f32 {
    todo!("formats helper: {code}")
}
