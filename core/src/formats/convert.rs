//! Conversions between formats (FORMATS.md, Conversions).

use alloc::vec::Vec;

use super::{FormatError, MxTensor, Nvfp4Tensor, ScaleRule};

/// NVFP4 -> MXFP4: decode each value exactly (f64), then MX-quantize the
/// exact values under `rule` (`Even` by default). Lossy in general.
pub fn nvfp4_to_mxfp4(x: &Nvfp4Tensor, rule: ScaleRule) -> MxTensor {
    todo!("formats helper: {} {rule:?}", x.rows())
}

/// MXFP8 -> BF16 bits: `RNE(decode(e) * 2^(s-127))`. With `exact`, refuse
/// (naming row and block) any block whose scale byte is NaN (0xFF) or outside
/// the exact range (3..=246 for E4M3, 10..=239 for E5M2).
pub fn mxfp8_to_bf16(x: &MxTensor, exact: bool) -> Result<Vec<u16>, FormatError> {
    todo!("formats helper: {} {exact}", x.rows())
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
        todo!("formats helper: {} {rows} {cols}", x.len())
    }
    pub fn dequantize(&self) -> Vec<f32> {
        todo!("formats helper")
    }
}

/// FP8 KV / index cache store: `encode_sat_e4m3(x / scale)`, NaN stays NaN.
pub fn cache_cast_e4m3(x: f32, scale: f32) -> u8 {
    todo!("formats helper: {x} {scale}")
}

/// FP8 KV / index cache load: `e4m3 * scale`.
pub fn cache_load_e4m3(code: u8, scale: f32) -> f32 {
    super::fp8::e4m3::decode(code) * scale
}
