//! E8M0 scale: value 2^(c-127); 0x00 = 2^-127 (an f32 subnormal); 0xFF = NaN.

/// The NaN code.
pub const NAN: u8 = 0xFF;

/// Exact decode (0x00 gives 2^-127, not 0; 0xFF gives NaN).
///
/// `c << 23` as f32 bits is right for 1..=254 only: for c = 0 it would give
/// +0, so 2^-127 is built as the subnormal with mantissa bit 22 set.
#[inline]
pub fn decode(code: u8) -> f32 {
    match code {
        0 => f32::from_bits(1 << 22),
        NAN => f32::NAN,
        c => f32::from_bits((c as u32) << 23),
    }
}

/// 2^(c-127) as f64, exactly (`None` for the NaN code 0xFF).
#[inline]
pub fn decode_f64(code: u8) -> Option<f64> {
    if code == NAN {
        None
    } else {
        Some(super::pow2_f64(code as i32 - 127))
    }
}
