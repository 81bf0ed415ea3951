//! Conversions between formats (FORMATS.md, Conversions).

use alloc::format;
use alloc::vec;
use alloc::vec::Vec;

use super::{
    bf16, e2m1, e8m0, fp8::e4m3, nvfp4, FormatError, MxElem, MxTensor, Nvfp4Tensor, ScaleRule,
};

/// NVFP4 -> MXFP4: decode each value exactly (f64), then MX-quantize the
/// exact values under `rule` (`Even` by default). Lossy in general.
///
/// The NVFP4 block (16) divides the MX block (32), so the shape is always
/// valid. The scale rule is applied to the exact f64 values (see
/// [`super::mx::scale_from_amax`]).
pub fn nvfp4_to_mxfp4(x: &Nvfp4Tensor, rule: ScaleRule) -> MxTensor {
    // An NVFP4 tensor with cols % 16 == 0 but cols % 32 != 0 cannot be an MX
    // tensor; FORMATS.md never pads, so such a tensor is a caller error.
    assert!(
        x.cols().is_multiple_of(MxElem::BLOCK),
        "NVFP4 -> MXFP4: cols {} is not a multiple of 32",
        x.cols()
    );
    MxTensor::quantize_with(x.rows(), x.cols(), MxElem::Fp4E2M1, rule, |r, buf| {
        x.row_f64(r, buf)
    })
}

/// NVFP4 -> MXFP4 with the shape checked instead of asserted: an error when
/// `cols` is not a multiple of 32.
pub fn try_nvfp4_to_mxfp4(x: &Nvfp4Tensor, rule: ScaleRule) -> Result<MxTensor, FormatError> {
    if !x.cols().is_multiple_of(MxElem::BLOCK) {
        return Err(FormatError::NotBlockMultiple {
            cols: x.cols(),
            block: MxElem::BLOCK,
        });
    }
    Ok(nvfp4_to_mxfp4(x, rule))
}

/// Relative L2 error `||a - b|| / ||a||` in f64 (0 when both are zero), as
/// reported by the lossy conversions.
pub fn rel_l2(reference: &[f64], approx: &[f64]) -> f64 {
    let mut num = 0.0f64;
    let mut den = 0.0f64;
    for (&a, &b) in reference.iter().zip(approx) {
        num += (a - b) * (a - b);
        den += a * a;
    }
    if den == 0.0 {
        if num == 0.0 {
            0.0
        } else {
            f64::INFINITY
        }
    } else {
        sqrt_f64(num / den)
    }
}

/// Square root by Newton iteration on f64 bits (core has no `sqrt` without
/// std); accurate to an ulp or two, which is all an error report needs.
fn sqrt_f64(x: f64) -> f64 {
    if x.is_nan() || x <= 0.0 || x.is_infinite() {
        return x;
    }
    // Halve the exponent for a first guess, then refine.
    let mut y = f64::from_bits((x.to_bits() >> 1) + (1023u64 << 51));
    for _ in 0..6 {
        y = 0.5 * (y + x / y);
    }
    y
}

/// MXFP8 -> BF16 bits: `RNE(decode(e) * 2^(s-127))`. With `exact`, refuse
/// (naming row and block) any block whose scale byte is NaN (0xFF) or outside
/// the exact range (3..=246 for E4M3, 10..=239 for E5M2).
///
/// `decode(e) * 2^(s-127)` has at most 4 significant bits and, for scale
/// bytes in the exact range, lies on the bf16 grid; it is also exactly
/// representable in f32 for every scale byte (or overflows), so one f32
/// multiplication followed by one bf16 RNE is the single rounding required.
/// Refuses an MXFP4 tensor (`Invalid`).
pub fn mxfp8_to_bf16(x: &MxTensor, exact: bool) -> Result<Vec<u16>, FormatError> {
    let (lo, hi, dec): (u8, u8, fn(u8) -> f32) = match x.elem() {
        MxElem::Fp8E4M3 => (3, 246, e4m3::decode),
        MxElem::Fp8E5M2 => (10, 239, super::fp8::e5m2::decode),
        MxElem::Fp4E2M1 => {
            return Err(FormatError::Invalid(
                "MXFP8 -> BF16: the tensor is MXFP4, not MXFP8".into(),
            ))
        }
    };
    let (rows, cols) = (x.rows(), x.cols());
    let nb = cols / MxElem::BLOCK;
    if exact {
        for (i, &s) in x.scales().iter().enumerate() {
            if s == e8m0::NAN || s < lo || s > hi {
                let why = if s == e8m0::NAN {
                    "scale byte 0xFF is NaN".into()
                } else {
                    format!("scale byte {s} is outside the exact range {lo}..={hi}")
                };
                return Err(FormatError::NotExact {
                    row: i / nb,
                    block: i % nb,
                    why,
                });
            }
        }
    }
    let mut out = vec![0u16; rows * cols];
    for ((o, c), &s) in out
        .chunks_exact_mut(MxElem::BLOCK)
        .zip(x.codes().chunks_exact(MxElem::BLOCK))
        .zip(x.scales())
    {
        let sc = e8m0::decode(s);
        for (v, &code) in o.iter_mut().zip(c) {
            *v = bf16::from_f32(dec(code) * sc);
        }
    }
    Ok(out)
}

/// PTPC FP8 (E4M3), per row: `scale = f32(amax_row / 448)` (zero row: 1.0),
/// `q = encode_sat_e4m3(x / scale)` with the quotient exact.
#[derive(Clone, Debug, PartialEq)]
pub struct PtpcFp8 {
    pub rows: usize,
    pub cols: usize,
    /// E4M3 codes, row-major.
    pub codes: Vec<u8>,
    /// One f32 scale per row.
    pub scales: Vec<f32>,
}

impl PtpcFp8 {
    pub fn quantize(x: &[f32], rows: usize, cols: usize) -> Result<Self, FormatError> {
        let n = rows.checked_mul(cols).ok_or_else(|| {
            FormatError::Invalid(format!("shape [{rows}, {cols}] overflows usize"))
        })?;
        if x.len() != n {
            return Err(FormatError::BadLength {
                what: "values",
                rows,
                cols,
                expected: n,
                got: x.len(),
            });
        }
        let mut codes = vec![0u8; n];
        let mut scales = vec![1.0f32; rows];
        if cols > 0 {
            for ((row, q), scale) in x
                .chunks_exact(cols)
                .zip(codes.chunks_exact_mut(cols))
                .zip(scales.iter_mut())
            {
                *scale = ptpc_quantize_row(row, q);
            }
        }
        Ok(PtpcFp8 {
            rows,
            cols,
            codes,
            scales,
        })
    }

    /// `e4m3 * scale` per row (one f32 multiplication: the exact product rounded).
    pub fn dequantize(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.rows * self.cols];
        if self.cols > 0 {
            for ((o, q), &s) in out
                .chunks_exact_mut(self.cols)
                .zip(self.codes.chunks_exact(self.cols))
                .zip(&self.scales)
            {
                for (v, &c) in o.iter_mut().zip(q) {
                    *v = e4m3::decode(c) * s;
                }
            }
        }
        out
    }
}

/// The PTPC scale of one row: `f32(amax / 448)` over the finite values; a
/// zero row gives 1.0; a quotient that underflows to 0 gives the smallest
/// f32 subnormal (as the NVFP4 global scale does) so the division stays finite.
pub fn ptpc_scale(row: &[f32]) -> f32 {
    let mut amax = 0.0f32;
    for &v in row {
        let a = v.abs();
        if a.is_finite() && a > amax {
            amax = a;
        }
    }
    if amax == 0.0 {
        return 1.0;
    }
    let s = amax / 448.0;
    if s == 0.0 {
        f32::from_bits(1)
    } else {
        s
    }
}

/// Quantize one row the PTPC way: `codes[i] = encode_sat_e4m3(row[i] /
/// scale)` (quotient exact in f64), returning `scale = ptpc_scale(row)`.
pub fn ptpc_quantize_row(row: &[f32], codes: &mut [u8]) -> f32 {
    let scale = ptpc_scale(row);
    let d = scale as f64;
    for (c, &v) in codes.iter_mut().zip(row) {
        *c = e4m3::encode_sat(v as f64 / d);
    }
    scale
}

/// The value of E4M3 code `c` in units of 2^-9 (the smallest subnormal):
/// an integer in [-229376, 229376] (448 = 229376 * 2^-9); `None` for the
/// NaN codes 0x7F / 0xFF.
pub fn e4m3_units(c: u8) -> Option<i32> {
    (c & 0x7F != 0x7F).then(|| E4M3_UNITS[c as usize])
}

/// [`e4m3_units`] of every code, NaN codes as 0 (callers check them).
const E4M3_UNITS: [i32; 256] = {
    let mut t = [0i32; 256];
    let mut c = 0usize;
    while c < 256 {
        let mag = (c & 0x7f) as i32;
        if mag != 0x7f {
            let (e, m) = (mag >> 3, mag & 7);
            // subnormal: m * 2^-9; normal: (8 + m) * 2^(e - 10) = (8 + m) << (e - 1) units
            let u = if e == 0 { m } else { (8 + m) << (e - 1) };
            t[c] = if c & 0x80 != 0 { -u } else { u };
        }
        c += 1;
    }
    t
};

/// The PTPC FP8 dot product of two rows of E4M3 codes (ARCHITECTURE.md,
/// Online quantization): the products `qa_k * qw_k` are summed **exactly**
/// (each is an integer number of 2^-18 units below 2^36, so an i64 holds
/// any sum of up to 2^27 of them) and the exact sum is rounded to f32 once.
/// The result is the f32 that any f32 accumulation would give without
/// intermediate rounding, and does not depend on the summation order.
/// `None` when either row holds a NaN code, or when the rows exceed 2^27
/// elements.
pub fn ptpc_dot(qa: &[u8], qw: &[u8]) -> Option<f32> {
    if qa.len() > (1 << 27) {
        return None;
    }
    // the same sum as `e4m3_units(a) * e4m3_units(w)` term by term, from a
    // table (NaN codes read as 0 there and flagged), without a branch in
    // the loop (bench/NOTES.md: the CPU PTPC decode step 1.5x faster)
    let mut acc: i64 = 0;
    let mut nan = false;
    for (&a, &w) in qa.iter().zip(qw) {
        nan |= (a & 0x7f) == 0x7f || (w & 0x7f) == 0x7f;
        acc += i64::from(E4M3_UNITS[a as usize]) * i64::from(E4M3_UNITS[w as usize]);
    }
    if nan {
        return None;
    }
    // `i64 as f32` rounds to nearest even (one rounding); the power-of-two
    // scaling is exact (|acc| >= 1 unit or zero, far from f32 underflow).
    Some(acc as f32 * f32::from_bits((127 - 18) << 23))
}

/// FP8 KV / index cache store: `encode_sat_e4m3(x / scale)`, NaN stays NaN.
/// The quotient is taken in f64 (see `nvfp4::quantize_block` for why that
/// rounds like the exact quotient).
pub fn cache_cast_e4m3(x: f32, scale: f32) -> u8 {
    e4m3::encode_sat(x as f64 / scale as f64)
}

/// FP8 KV / index cache load: `e4m3 * scale`.
pub fn cache_load_e4m3(code: u8, scale: f32) -> f32 {
    super::fp8::e4m3::decode(code) * scale
}

/// NVFP4 KV / index cache store of one cached row (ARCHITECTURE.md, *NVFP4
/// KV cache*): FORMATS.md's NVFP4 block rule with the tensor's cache scale
/// `g` (checkpoint `k_scale` / `v_scale` / `index_k_scale`, default 1.0) as
/// the global scale, because a cache is written a row at a time and has no
/// whole-tensor amax to derive a global from.
///
/// Per block of 16 values ([`nvfp4::quantize_block`]): NaN or +-Inf in the
/// block gives scale byte 0x7F (E4M3 NaN) and codes 0, so the block reads as
/// NaN; else `s = encode_sat_e4m3(bamax / (6 g))` and, unless `s` decodes to
/// 0 (then every code is 0 and the block reads as +0),
/// `code_i = encode_sat_e2m1(x_i / (g s))`, both quotients exact (f64).
/// `codes` gets the E2M1 codes packed two a byte (low nibble = even
/// element), `row.len() / 2` bytes; `scales` the E4M3 bytes, `row.len() / 16`.
///
/// `g` must be finite and positive (the loader and
/// [`crate::kv::CacheTensor::new`] check it). A row that is not a whole
/// number of blocks, or buffers of the wrong length, are refused.
pub fn cache_store_nvfp4(
    row: &[f32],
    g: f32,
    codes: &mut [u8],
    scales: &mut [u8],
) -> Result<(), FormatError> {
    let n = row.len();
    if !n.is_multiple_of(nvfp4::BLOCK) {
        return Err(FormatError::NotBlockMultiple {
            cols: n,
            block: nvfp4::BLOCK,
        });
    }
    if codes.len() != n / 2 || scales.len() != n / nvfp4::BLOCK {
        return Err(FormatError::BadLength {
            what: "nvfp4 cache row (codes + scales)",
            rows: 1,
            cols: n,
            expected: n / 2 + n / nvfp4::BLOCK,
            got: codes.len() + scales.len(),
        });
    }
    let mut block = [0u8; nvfp4::BLOCK];
    for ((vals, packed), s) in row
        .chunks_exact(nvfp4::BLOCK)
        .zip(codes.chunks_exact_mut(nvfp4::BLOCK / 2))
        .zip(scales.iter_mut())
    {
        *s = nvfp4::quantize_block(vals, g, &mut block);
        e2m1::pack(&block, packed);
    }
    Ok(())
}

/// NVFP4 KV / index cache load: elements `first .. first + out.len()` of a
/// row stored by [`cache_store_nvfp4`] (`codes` and `scales` of that one
/// row), each `f32(e2m1(code) * e4m3(s) * g)`: the product is exact in f64
/// (2 + 4 + 24 significant bits) and rounded to f32 once, as
/// [`Nvfp4Tensor::dequantize_row`] decodes a weight. A NaN scale byte reads
/// as NaN. `first` need not be block-aligned (a head's slice of a K row
/// is). An element past the row's buffers reads as NaN (callers check the
/// range first; this keeps the read free of panics).
pub fn cache_load_nvfp4(codes: &[u8], scales: &[u8], g: f32, first: usize, out: &mut [f32]) {
    let g = g as f64;
    let mut cur = usize::MAX;
    let mut sg = f64::NAN;
    for (i, o) in out.iter_mut().enumerate() {
        let e = first + i;
        let b = e / nvfp4::BLOCK;
        if b != cur {
            cur = b;
            // exact: a 4-bit significand times a 24-bit one
            sg = scales
                .get(b)
                .map_or(f64::NAN, |&s| e4m3::decode(s) as f64 * g);
        }
        let Some(&byte) = codes.get(e / 2) else {
            *o = f32::NAN;
            continue;
        };
        let code = if e.is_multiple_of(2) {
            byte & 0x0F
        } else {
            byte >> 4
        };
        *o = (e2m1::decode(code) as f64 * sg) as f32;
    }
}
