//! NVFP4: E2M1 elements, an E4M3 scale per 16, an f32 global scale per
//! tensor that multiplies at decode (ModelOpt's `weight_scale_2`).

use alloc::vec::Vec;

use super::FormatError;

/// Elements per NVFP4 scale block.
pub const BLOCK: usize = 16;

/// The global scale of FORMATS.md NVFP4 step 1 for a whole tensor.
pub fn global_scale(x: &[f32]) -> f32 {
    todo!("formats helper: {}", x.len())
}

/// A row-major `[rows, cols]` NVFP4 tensor: packed E2M1 codes
/// (`[rows, cols/2]`), E4M3 block scales (`[rows, cols/16]`) and the global
/// scale.
#[derive(Clone, Debug, PartialEq)]
pub struct Nvfp4Tensor {
    rows: usize,
    cols: usize,
    codes: Vec<u8>,
    scales: Vec<u8>,
    global: f32,
}

impl Nvfp4Tensor {
    /// Quantize row-major f32 values with one global scale (FORMATS.md NVFP4).
    pub fn quantize(x: &[f32], rows: usize, cols: usize) -> Result<Self, FormatError> {
        todo!("formats helper: {} {rows} {cols}", x.len())
    }

    /// Wrap existing buffers, checking every length (and that `global` is finite).
    pub fn from_parts(
        rows: usize,
        cols: usize,
        codes: Vec<u8>,
        scales: Vec<u8>,
        global: f32,
    ) -> Result<Self, FormatError> {
        todo!("formats helper: {rows} {cols} {} {} {global}", codes.len(), scales.len())
    }

    pub fn rows(&self) -> usize {
        self.rows
    }
    pub fn cols(&self) -> usize {
        self.cols
    }
    pub fn codes(&self) -> &[u8] {
        &self.codes
    }
    /// E4M3 block scale bytes, `[rows, cols/16]`.
    pub fn scales(&self) -> &[u8] {
        &self.scales
    }
    /// The global scale (`weight_scale_2`), multiplies at decode.
    pub fn global(&self) -> f32 {
        self.global
    }

    /// Exact value of element (row, col) as f64 (`e2m1 * e4m3(s) * g`).
    pub fn value_f64(&self, row: usize, col: usize) -> f64 {
        todo!("formats helper: {row} {col}")
    }

    /// Decode one row to f32 (`out.len() == cols`); f32 rounding of the exact product.
    pub fn dequantize_row(&self, row: usize, out: &mut [f32]) {
        todo!("formats helper: {row} {}", out.len())
    }

    /// Decode the whole tensor, row-major.
    pub fn dequantize(&self) -> Vec<f32> {
        todo!("formats helper")
    }
}
