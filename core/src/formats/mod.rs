//! The number formats of FORMATS.md, bit by bit.
//!
//! Element codecs (`e2m1`, `fp8` for E4M3FN and E5M2, `e8m0`, `bf16`), block
//! formats (`mx` for MXFP4 / MXFP8, `nvfp4`), and conversions (`convert`:
//! NVFP4 -> MXFP4, MXFP8 -> BF16, PTPC FP8, the FP8 cache cast).
//!
//! Every function here is the contract every backend is held to bit for bit.

pub mod bf16;
pub mod convert;
pub mod e2m1;
pub mod e8m0;
mod error;
pub mod fp8;
pub mod mx;
pub mod nvfp4;

pub use error::FormatError;
pub use mx::{MxElem, MxTensor, ScaleRule};
pub use nvfp4::Nvfp4Tensor;

/// 2^k as f64, built from the exponent bits (core has no `powi`).
/// Exact for k in [-1022, 1023]; callers stay well inside.
#[inline]
pub(crate) const fn pow2_f64(k: i32) -> f64 {
    f64::from_bits(((k + 1023) as u64) << 52)
}

/// `floor(log2(a))` of a positive, finite, normal f64, from its exponent bits.
#[inline]
pub(crate) const fn floor_log2_f64(a: f64) -> i32 {
    ((a.to_bits() >> 52) & 0x7FF) as i32 - 1023
}

/// A block-quantized weight format, as named on the command line and in
/// checkpoints.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BlockFormat {
    /// E2M1 elements, one E8M0 scale per 32.
    Mxfp4,
    /// E4M3FN elements, one E8M0 scale per 32.
    Mxfp8E4M3,
    /// E5M2 elements, one E8M0 scale per 32.
    Mxfp8E5M2,
    /// E2M1 elements, one E4M3 scale per 16, one f32 global scale per tensor.
    Nvfp4,
}

impl BlockFormat {
    /// Elements per scale block.
    pub const fn block_size(self) -> usize {
        match self {
            BlockFormat::Nvfp4 => 16,
            _ => 32,
        }
    }
}
