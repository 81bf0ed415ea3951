//! E2M1 (FP4): s e e m, bias 1, magnitudes 0 .5 1 1.5 2 3 4 6, no Inf/NaN.
//!
//! Codes 0..=7 are the magnitudes in increasing order, bit 3 is the sign.
//! 0.5 (code 1) is the only subnormal.

/// The value of each 4-bit code (bit 3 = sign), exact.
pub const VALUES: [f32; 16] = [
    0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
];

/// Largest finite magnitude.
pub const MAX: f32 = 6.0;

/// Decode a 4-bit code (low nibble of `code`; the high nibble is ignored).
#[inline]
pub fn decode(code: u8) -> f32 {
    VALUES[(code & 0x0F) as usize]
}

/// Saturating round-to-nearest-even encode of an exact value. NaN is not
/// representable: callers handle NaN blocks before (block rules); here NaN
/// encodes to +0 (code 0).
///
/// The midpoints between neighbouring magnitudes are 0.25, 0.75, 1.25, 1.75,
/// 2.5, 3.5 and 5; a value exactly on one goes to the neighbour whose code is
/// even (0.25->0, 0.75->1, 1.25->1, 1.75->2, 2.5->2, 3.5->4, 5->4), hence the
/// alternation of `<=` (tie goes down, lower code even) and `<` (tie goes up).
/// Values past 6 (and +-Inf) saturate to +-6; -0.0 keeps its sign.
///
/// Written as a count of the midpoints the magnitude passes (strictly for a
/// tie that goes up, `>=`; for a tie that goes down, `>`), which compiles to
/// branch-free compares. [`encode_sat_generic`] is the same function by the
/// generic minifloat rounding of the FP8 types; the tests hold both to a
/// brute-force nearest search.
#[inline]
pub fn encode_sat(x: f64) -> u8 {
    if x.is_nan() {
        return 0;
    }
    let a = x.abs();
    let mag = u8::from(a > 0.25)
        + u8::from(a >= 0.75)
        + u8::from(a > 1.25)
        + u8::from(a >= 1.75)
        + u8::from(a > 2.5)
        + u8::from(a >= 3.5)
        + u8::from(a > 5.0);
    (u8::from(x.is_sign_negative()) << 3) | mag
}

/// [`encode_sat`] through the generic minifloat rounding (1 mantissa bit,
/// minimum normal exponent 0, largest code 7 = 6.0).
pub fn encode_sat_generic(x: f64) -> u8 {
    if x.is_nan() {
        return 0;
    }
    let sign = if x.is_sign_negative() { 0x8 } else { 0 };
    sign | super::fp8::encode_mag(x.abs(), 1, 0, 7, 6.0)
}

/// Pack codes two per byte: `byte[j] = code[2j] | code[2j+1] << 4`.
///
/// Packs `min(out.len(), codes.len() / 2)` bytes; an odd trailing code is
/// ignored (callers only pack whole blocks, whose sizes are even).
pub fn pack(codes: &[u8], out: &mut [u8]) {
    for (o, pair) in out.iter_mut().zip(codes.chunks_exact(2)) {
        *o = (pair[0] & 0x0F) | (pair[1] << 4);
    }
}

/// Unpack `out.len()` codes from packed bytes (low nibble first).
///
/// Stops early if `packed` holds fewer than `out.len()` codes.
pub fn unpack(packed: &[u8], out: &mut [u8]) {
    for (i, o) in out.iter_mut().enumerate() {
        let Some(&b) = packed.get(i / 2) else { return };
        *o = if i % 2 == 0 { b & 0x0F } else { b >> 4 };
    }
}
