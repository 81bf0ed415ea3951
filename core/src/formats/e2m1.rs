//! E2M1 (FP4): s e e m, bias 1, magnitudes 0 .5 1 1.5 2 3 4 6, no Inf/NaN.

/// Decode a 4-bit code (low nibble of `code`; the high nibble is ignored).
pub fn decode(code: u8) -> f32 {
    todo!("formats helper: {code}")
}

/// Saturating round-to-nearest-even encode of an exact value. NaN is not
/// representable: callers handle NaN blocks before (block rules); here NaN
/// encodes to +0 (code 0).
pub fn encode_sat(x: f64) -> u8 {
    todo!("formats helper: {x}")
}

/// Pack codes two per byte: `byte[j] = code[2j] | code[2j+1] << 4`.
pub fn pack(codes: &[u8], out: &mut [u8]) {
    todo!("formats helper: {} {}", codes.len(), out.len())
}

/// Unpack `out.len()` codes from packed bytes.
pub fn unpack(packed: &[u8], out: &mut [u8]) {
    todo!("formats helper: {} {}", packed.len(), out.len())
}
