//! MX block formats: MXFP4 (E2M1 / 32) and MXFP8 (E4M3 or E5M2 / 32), each
//! with an E8M0 scale per block along the last dimension.

use alloc::vec;
use alloc::vec::Vec;

use super::{e2m1, e8m0, floor_log2_f64, fp8, pow2_f64, FormatError};

/// How the shared exponent of a block is chosen (FORMATS.md, MX step 2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ScaleRule {
    /// OCP: `floor(log2(amax)) - emax`.
    Floor,
    /// Quark / aiter: round amax's mantissa up at `mbits` first, then floor.
    Even,
    /// NVIDIA `cvt.rp.ue8m0`: `amax / max_elem` rounded up to a power of two.
    Rceil,
}

/// The element type of an MX block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MxElem {
    Fp4E2M1,
    Fp8E4M3,
    Fp8E5M2,
}

impl MxElem {
    /// Elements per scale.
    pub const BLOCK: usize = 32;
    /// Exponent of the largest normal value (2 for E2M1, 8 for E4M3, 15 for E5M2).
    pub const fn emax(self) -> i32 {
        match self {
            MxElem::Fp4E2M1 => 2,
            MxElem::Fp8E4M3 => 8,
            MxElem::Fp8E5M2 => 15,
        }
    }
    /// Mantissa bits (1, 3, 2).
    pub const fn mbits(self) -> u32 {
        match self {
            MxElem::Fp4E2M1 => 1,
            MxElem::Fp8E4M3 => 3,
            MxElem::Fp8E5M2 => 2,
        }
    }
    /// Largest finite magnitude (6, 448, 57344).
    pub const fn max_value(self) -> f32 {
        match self {
            MxElem::Fp4E2M1 => 6.0,
            MxElem::Fp8E4M3 => 448.0,
            MxElem::Fp8E5M2 => 57344.0,
        }
    }
    /// Bytes of element storage for `n` elements (FP4 packs two per byte).
    pub const fn packed_len(self, n: usize) -> usize {
        match self {
            MxElem::Fp4E2M1 => n / 2,
            _ => n,
        }
    }
    /// Decode one element code to f32 (unscaled).
    #[inline]
    pub fn decode(self, code: u8) -> f32 {
        match self {
            MxElem::Fp4E2M1 => e2m1::decode(code),
            MxElem::Fp8E4M3 => fp8::e4m3::decode(code),
            MxElem::Fp8E5M2 => fp8::e5m2::decode(code),
        }
    }
    /// Saturating RNE encode of one exact (already scaled) value.
    #[inline]
    pub fn encode_sat(self, x: f64) -> u8 {
        match self {
            MxElem::Fp4E2M1 => e2m1::encode_sat(x),
            MxElem::Fp8E4M3 => fp8::e4m3::encode_sat(x),
            MxElem::Fp8E5M2 => fp8::e5m2::encode_sat(x),
        }
    }
}

/// The E8M0 scale byte of one block of values under `rule` (FORMATS.md MX
/// step 2, including the NaN/Inf block -> 0xFF and amax = 0 -> 0x00 cases).
pub fn block_scale(elem: MxElem, rule: ScaleRule, block: &[f32]) -> u8 {
    let mut amax = 0.0f32;
    for &v in block {
        if !v.is_finite() {
            return e8m0::NAN;
        }
        let a = v.abs();
        if a > amax {
            amax = a;
        }
    }
    scale_from_amax(elem, rule, amax as f64)
}

/// `ceil(log2(d))` of a non-negative finite f32 from its bits (`cvt.rp.ue8m0`
/// rounds up to a power of two). Zero gives -127 (the smallest scale).
#[inline]
fn ceil_log2_f32(d: f32) -> i32 {
    let bits = d.to_bits() & 0x7FFF_FFFF;
    let field = (bits >> 23) as i32;
    let mant = bits & 0x007F_FFFF;
    if field == 0 {
        if mant == 0 {
            return -127;
        }
        // Subnormal: mant * 2^-149.
        let p = 31 - mant.leading_zeros() as i32;
        p - 149 + i32::from(!mant.is_power_of_two())
    } else {
        field - 127 + i32::from(mant != 0)
    }
}

/// The E8M0 scale byte for a block whose values are all finite and whose
/// largest magnitude is the exact value `amax` (>= 0).
///
/// `amax` is f64 so the NVFP4 -> MXFP4 conversion can apply the rule to the
/// exact decoded values; for f32 inputs the widening is exact and `floor` /
/// `even` give what the f32-bit recipes of FORMATS.md give (the `even` carry
/// past 2^127 simply reaches 2^128 in f64, the value the spec prescribes).
/// `rceil` is defined on f32 (`f32(amax * f32(1/max_elem))`), so an f64 amax
/// is first rounded to f32 (exact for f32 inputs).
pub fn scale_from_amax(elem: MxElem, rule: ScaleRule, amax: f64) -> u8 {
    if amax == 0.0 {
        return 0x00;
    }
    let e = match rule {
        ScaleRule::Floor => floor_log2_f64(amax) - elem.emax(),
        ScaleRule::Even => {
            // Round the mantissa half-up at `mbits` bits, then keep the exponent.
            let bits = amax.to_bits() + (1u64 << (52 - elem.mbits() - 1));
            floor_log2_f64(f64::from_bits(bits & 0x7FF0_0000_0000_0000)) - elem.emax()
        }
        ScaleRule::Rceil => {
            let d = (amax as f32) * (1.0f32 / elem.max_value());
            ceil_log2_f32(d)
        }
    };
    (e.clamp(-127, 127) + 127) as u8
}

/// Quantize one block of values (any length; 32 in MX tensors) into unpacked
/// element codes, returning its scale byte. Values are exact f64 (f32 inputs
/// widened). A NaN/Inf anywhere gives scale 0xFF and codes 0.
pub fn quantize_block(elem: MxElem, rule: ScaleRule, vals: &[f64], codes: &mut [u8]) -> u8 {
    // No early exit, so the scan vectorizes; NaN/Inf are caught by `bad`.
    let mut amax = 0.0f64;
    let mut bad = false;
    for &v in vals {
        bad |= !v.is_finite();
        amax = amax.max(v.abs());
    }
    if bad {
        codes.fill(0);
        return e8m0::NAN;
    }
    let s = scale_from_amax(elem, rule, amax);
    // V / 2^e == V * 2^-e exactly (e in [-127, 127], no f64 over/underflow).
    let inv = pow2_f64(127 - s as i32);
    let pairs = codes.iter_mut().zip(vals);
    match elem {
        MxElem::Fp4E2M1 => pairs.for_each(|(c, &v)| *c = e2m1::encode_sat(v * inv)),
        MxElem::Fp8E4M3 => pairs.for_each(|(c, &v)| *c = fp8::e4m3::encode_sat(v * inv)),
        MxElem::Fp8E5M2 => pairs.for_each(|(c, &v)| *c = fp8::e5m2::encode_sat(v * inv)),
    }
    s
}

/// Check `cols` against the block size and compute `rows * cols`.
pub(crate) fn checked_elems(rows: usize, cols: usize, block: usize) -> Result<usize, FormatError> {
    if !cols.is_multiple_of(block) {
        return Err(FormatError::NotBlockMultiple { cols, block });
    }
    rows.checked_mul(cols).ok_or_else(|| {
        FormatError::Invalid(alloc::format!("shape [{rows}, {cols}] overflows usize"))
    })
}

/// A row-major `[rows, cols]` MX tensor: packed element codes
/// (`[rows, packed_len(cols)]` bytes) and E8M0 scales (`[rows, cols/32]`).
/// Fields are private so the shape, element type and buffers always agree.
#[derive(Clone, Debug, PartialEq)]
pub struct MxTensor {
    elem: MxElem,
    rows: usize,
    cols: usize,
    codes: Vec<u8>,
    scales: Vec<u8>,
}

impl MxTensor {
    /// Quantize row-major f32 values (FORMATS.md MX steps 1-3).
    pub fn quantize(
        x: &[f32],
        rows: usize,
        cols: usize,
        elem: MxElem,
        rule: ScaleRule,
    ) -> Result<Self, FormatError> {
        let n = checked_elems(rows, cols, MxElem::BLOCK)?;
        if x.len() != n {
            return Err(FormatError::BadLength {
                what: "values",
                rows,
                cols,
                expected: n,
                got: x.len(),
            });
        }
        Ok(Self::quantize_with(rows, cols, elem, rule, |r, buf| {
            for (b, &v) in buf.iter_mut().zip(&x[r * cols..(r + 1) * cols]) {
                *b = v as f64;
            }
        }))
    }

    /// Quantize a `[rows, cols]` tensor whose row `r` is written as exact f64
    /// values into the buffer by `fill_row(r, buf)`. `cols` must already be a
    /// multiple of 32 (checked by the callers).
    pub(crate) fn quantize_with(
        rows: usize,
        cols: usize,
        elem: MxElem,
        rule: ScaleRule,
        mut fill_row: impl FnMut(usize, &mut [f64]),
    ) -> Self {
        const B: usize = MxElem::BLOCK;
        let row_bytes = elem.packed_len(cols);
        let mut codes = vec![0u8; rows * row_bytes];
        let mut scales = vec![0u8; rows * (cols / B)];
        let mut buf = vec![0f64; cols];
        let mut block_codes = [0u8; B];
        for r in 0..rows {
            fill_row(r, &mut buf);
            let out_row = &mut codes[r * row_bytes..(r + 1) * row_bytes];
            let scale_row = &mut scales[r * (cols / B)..(r + 1) * (cols / B)];
            for (b, vals) in buf.chunks_exact(B).enumerate() {
                scale_row[b] = quantize_block(elem, rule, vals, &mut block_codes);
                match elem {
                    MxElem::Fp4E2M1 => {
                        e2m1::pack(&block_codes, &mut out_row[b * B / 2..(b + 1) * B / 2])
                    }
                    _ => out_row[b * B..(b + 1) * B].copy_from_slice(&block_codes),
                }
            }
        }
        MxTensor {
            elem,
            rows,
            cols,
            codes,
            scales,
        }
    }

    /// Wrap existing buffers (e.g. from a checkpoint), checking every length.
    pub fn from_parts(
        elem: MxElem,
        rows: usize,
        cols: usize,
        codes: Vec<u8>,
        scales: Vec<u8>,
    ) -> Result<Self, FormatError> {
        let n = checked_elems(rows, cols, MxElem::BLOCK)?;
        let expected = elem.packed_len(n);
        if codes.len() != expected {
            return Err(FormatError::BadLength {
                what: "element codes",
                rows,
                cols,
                expected,
                got: codes.len(),
            });
        }
        let expected = n / MxElem::BLOCK;
        if scales.len() != expected {
            return Err(FormatError::BadLength {
                what: "E8M0 scales",
                rows,
                cols,
                expected,
                got: scales.len(),
            });
        }
        Ok(MxTensor {
            elem,
            rows,
            cols,
            codes,
            scales,
        })
    }

    pub fn elem(&self) -> MxElem {
        self.elem
    }
    pub fn rows(&self) -> usize {
        self.rows
    }
    pub fn cols(&self) -> usize {
        self.cols
    }
    /// Packed element codes, row-major.
    pub fn codes(&self) -> &[u8] {
        &self.codes
    }
    /// E8M0 scale bytes, `[rows, cols/32]` row-major.
    pub fn scales(&self) -> &[u8] {
        &self.scales
    }
    pub fn into_parts(self) -> (Vec<u8>, Vec<u8>) {
        (self.codes, self.scales)
    }

    /// Decode one row into `out` (`out.len() == cols`): `decode(code) *
    /// 2^(scale-127)`, one f32 multiplication of two exact f32 values, so the
    /// result is the exact value correctly rounded (exact unless it leaves
    /// the f32 range). Scale 0xFF gives NaN for the whole block.
    ///
    /// # Panics
    /// If `row >= rows` or `out.len() != cols` (a caller bug, not bad data).
    pub fn dequantize_row(&self, row: usize, out: &mut [f32]) {
        const B: usize = MxElem::BLOCK;
        assert!(
            row < self.rows,
            "row {row} out of range (rows = {})",
            self.rows
        );
        assert_eq!(out.len(), self.cols, "output row length");
        let nb = self.cols / B;
        let scales = &self.scales[row * nb..(row + 1) * nb];
        let row_bytes = self.elem.packed_len(self.cols);
        let codes = &self.codes[row * row_bytes..(row + 1) * row_bytes];
        match self.elem {
            MxElem::Fp4E2M1 => {
                for ((o, c), &s) in out
                    .chunks_exact_mut(B)
                    .zip(codes.chunks_exact(B / 2))
                    .zip(scales)
                {
                    let sc = e8m0::decode(s);
                    for (pair, &byte) in o.chunks_exact_mut(2).zip(c) {
                        pair[0] = e2m1::VALUES[(byte & 0x0F) as usize] * sc;
                        pair[1] = e2m1::VALUES[(byte >> 4) as usize] * sc;
                    }
                }
            }
            elem => {
                // The table itself (not a fn pointer) so the loop inlines.
                let table: &[u32; 256] = if elem == MxElem::Fp8E4M3 {
                    &fp8::E4M3_BITS
                } else {
                    &fp8::E5M2_BITS
                };
                for ((o, c), &s) in out
                    .chunks_exact_mut(B)
                    .zip(codes.chunks_exact(B))
                    .zip(scales)
                {
                    let sc = e8m0::decode(s);
                    for (v, &code) in o.iter_mut().zip(c) {
                        *v = f32::from_bits(table[code as usize]) * sc;
                    }
                }
            }
        }
    }

    /// Decode the whole tensor, row-major.
    pub fn dequantize(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.rows * self.cols];
        if self.cols > 0 {
            for (r, row) in out.chunks_exact_mut(self.cols).enumerate() {
                self.dequantize_row(r, row);
            }
        }
        out
    }
}
