//! The codec surface a backend offers to the conformance runner.
//!
//! Everything is plain data (byte and float buffers with their shape) so a GPU
//! backend can implement it with kernels and host copies; the trait is object
//! safe so the runner takes `&dyn FormatOps`. Element operations are batched
//! (one call per vector group) for the same reason.

use m3_core::formats::{MxElem, ScaleRule};

/// An element type with a decode (E8M0 has no encode: scales are computed by
/// the block rules).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ElemKind {
    E2M1,
    E4M3,
    E5M2,
    E8M0,
}

impl ElemKind {
    /// The name used in the manifest (`e2m1`, `e4m3`, `e5m2`, `e8m0`).
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "e2m1" => Some(Self::E2M1),
            "e4m3" => Some(Self::E4M3),
            "e5m2" => Some(Self::E5M2),
            "e8m0" => Some(Self::E8M0),
            _ => None,
        }
    }

    /// Whether `code` is a NaN code of this 8-bit float (used to compare NaN
    /// encodes as NaN: FORMATS.md does not pin which NaN code).
    pub fn is_nan_code(self, code: u8) -> bool {
        match self {
            ElemKind::E4M3 => code & 0x7F == 0x7F,
            ElemKind::E5M2 => code & 0x7F > 0x7C,
            ElemKind::E8M0 => code == 0xFF,
            ElemKind::E2M1 => false,
        }
    }
}

/// An MX tensor as stored: packed element codes (`[rows, cols/2]` for FP4,
/// `[rows, cols]` for FP8) and E8M0 scale bytes (`[rows, cols/32]`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MxParts {
    pub elem: MxElem,
    pub rows: usize,
    pub cols: usize,
    pub codes: Vec<u8>,
    pub scales: Vec<u8>,
}

/// An NVFP4 tensor as stored: packed E2M1 codes (`[rows, cols/2]`), E4M3
/// block scales (`[rows, cols/16]`), the f32 global scale that multiplies at
/// decode (`weight_scale_2`).
#[derive(Clone, Debug, PartialEq)]
pub struct Nvfp4Parts {
    pub rows: usize,
    pub cols: usize,
    pub codes: Vec<u8>,
    pub scales: Vec<u8>,
    pub global: f32,
}

/// A PTPC FP8 (E4M3) tensor: codes `[rows, cols]`, one f32 scale per row.
#[derive(Clone, Debug, PartialEq)]
pub struct PtpcParts {
    pub rows: usize,
    pub cols: usize,
    pub codes: Vec<u8>,
    pub scales: Vec<f32>,
}

/// Why an operation gave no result.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum OpError {
    /// A lossless conversion refused the tensor at this block (row-major
    /// first offending block).
    #[error("refused at row {row}, block {block}: {why}")]
    Refused {
        row: usize,
        block: usize,
        why: String,
    },
    /// The operation failed (bad shape, unsupported, backend error).
    #[error("{0}")]
    Failed(String),
}

/// Every format operation of FORMATS.md, as a backend implements it. All of
/// them must be bit-exact; the runner checks them against the vectors.
pub trait FormatOps {
    /// A short name for reports ("cpu", "cuda:0", ...).
    fn name(&self) -> &str;

    /// Exact decode of each code (E2M1 uses the low nibble).
    fn decode(&self, elem: ElemKind, codes: &[u8]) -> Result<Vec<f32>, OpError>;

    /// Saturating RNE encode of each exact value (E2M1, E4M3, E5M2).
    fn encode_sat(&self, elem: ElemKind, xs: &[f64]) -> Result<Vec<u8>, OpError>;

    /// f32 -> bf16 bits, RNE, NaN stays NaN.
    fn bf16_from_f32(&self, xs: &[f32]) -> Result<Vec<u16>, OpError>;

    /// MX quantize of a row-major `[rows, cols]` f32 tensor.
    fn mx_quantize(
        &self,
        x: &[f32],
        rows: usize,
        cols: usize,
        elem: MxElem,
        rule: ScaleRule,
    ) -> Result<MxParts, OpError>;

    /// MX dequantize to f32, row-major.
    fn mx_dequantize(&self, t: &MxParts) -> Result<Vec<f32>, OpError>;

    /// NVFP4 quantize of a row-major `[rows, cols]` f32 tensor (one global scale).
    fn nvfp4_quantize(&self, x: &[f32], rows: usize, cols: usize) -> Result<Nvfp4Parts, OpError>;

    /// NVFP4 dequantize to f32, row-major.
    fn nvfp4_dequantize(&self, t: &Nvfp4Parts) -> Result<Vec<f32>, OpError>;

    /// NVFP4 -> MXFP4 under `rule`.
    fn nvfp4_to_mxfp4(&self, t: &Nvfp4Parts, rule: ScaleRule) -> Result<MxParts, OpError>;

    /// MXFP8 -> BF16 bits; with `exact`, refuse ([`OpError::Refused`]) a NaN
    /// scale byte or a scale outside the exact range.
    fn mxfp8_to_bf16(&self, t: &MxParts, exact: bool) -> Result<Vec<u16>, OpError>;

    /// PTPC FP8 quantize, per row.
    fn ptpc_quantize(&self, x: &[f32], rows: usize, cols: usize) -> Result<PtpcParts, OpError>;

    /// PTPC FP8 dequantize to f32 (`f32(e4m3 * scale_row)`).
    fn ptpc_dequantize(&self, t: &PtpcParts) -> Result<Vec<f32>, OpError>;

    /// FP8 cache store: `encode_sat_e4m3(x / scale)` for each value.
    fn cache_cast_e4m3(&self, xs: &[f32], scale: f32) -> Result<Vec<u8>, OpError>;
}
