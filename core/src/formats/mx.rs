//! MX block formats: MXFP4 (E2M1 / 32) and MXFP8 (E4M3 or E5M2 / 32), each
//! with an E8M0 scale per block along the last dimension.

use alloc::vec::Vec;

use super::FormatError;

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
    pub fn decode(self, code: u8) -> f32 {
        todo!("formats helper: {code}")
    }
    /// Saturating RNE encode of one exact (already scaled) value.
    pub fn encode_sat(self, x: f64) -> u8 {
        todo!("formats helper: {x}")
    }
}

/// The E8M0 scale byte of one block of values under `rule` (FORMATS.md MX
/// step 2, including the NaN/Inf block -> 0xFF and amax = 0 -> 0x00 cases).
pub fn block_scale(elem: MxElem, rule: ScaleRule, block: &[f32]) -> u8 {
    todo!("formats helper: {elem:?} {rule:?} {}", block.len())
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
        todo!("formats helper: {} {rows} {cols} {elem:?} {rule:?}", x.len())
    }

    /// Wrap existing buffers (e.g. from a checkpoint), checking every length.
    pub fn from_parts(
        elem: MxElem,
        rows: usize,
        cols: usize,
        codes: Vec<u8>,
        scales: Vec<u8>,
    ) -> Result<Self, FormatError> {
        todo!("formats helper: {elem:?} {rows} {cols} {} {}", codes.len(), scales.len())
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

    /// Decode one row into `out` (`out.len() == cols`), exactly.
    pub fn dequantize_row(&self, row: usize, out: &mut [f32]) {
        todo!("formats helper: {row} {}", out.len())
    }

    /// Decode the whole tensor, row-major.
    pub fn dequantize(&self) -> Vec<f32> {
        todo!("formats helper")
    }
}
