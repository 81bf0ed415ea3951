//! NVFP4: E2M1 elements, an E4M3 scale per 16, an f32 global scale per
//! tensor that multiplies at decode (ModelOpt's `weight_scale_2`).

use alloc::vec;
use alloc::vec::Vec;

use super::mx::checked_elems;
use super::{e2m1, fp8::e4m3, FormatError};

/// Elements per NVFP4 scale block.
pub const BLOCK: usize = 16;

/// The global scale of FORMATS.md NVFP4 step 1 for a whole tensor.
///
/// `g = f32(amax / 2688)` (2688 = 6 * 448, one f32 division) over the finite
/// values; amax = 0 (or no finite value) gives 1.0; a quotient that
/// underflows to 0 gives the smallest f32 subnormal, so g is never 0.
pub fn global_scale(x: &[f32]) -> f32 {
    let mut amax = 0.0f32;
    for &v in x {
        let a = v.abs();
        if a.is_finite() && a > amax {
            amax = a;
        }
    }
    if amax == 0.0 {
        return 1.0;
    }
    let g = amax / 2688.0;
    if g == 0.0 {
        f32::from_bits(1)
    } else {
        g
    }
}

/// Quantize one block of 16 (or any length) values with global scale `g`,
/// writing unpacked E2M1 codes and returning the E4M3 scale byte
/// (FORMATS.md NVFP4 steps 2-3).
///
/// The quotients `bamax / (6 g)` and `x / (g s)` are taken in f64: `6 g` and
/// `g s` are exact there (at most 26 and 28 significant bits), and the f64
/// quotient of two such numbers is never rounded onto an E4M3 / E2M1
/// midpoint it was not already on (a midpoint has at most 5 significant
/// bits, so a non-tie quotient differs from it by far more than an f64 ulp),
/// so the final RNE equals RNE of the exact quotient.
pub fn quantize_block(vals: &[f32], g: f32, codes: &mut [u8]) -> u8 {
    // No early exit, so the scan vectorizes; NaN/Inf are caught by `bad`.
    let mut bamax = 0.0f32;
    let mut bad = false;
    for &v in vals {
        bad |= !v.is_finite();
        bamax = bamax.max(v.abs());
    }
    if bad {
        codes.fill(0);
        return e4m3::NAN;
    }
    let g = g as f64;
    let s = e4m3::encode_sat(bamax as f64 / (6.0 * g));
    let sv = e4m3::decode(s) as f64;
    if sv == 0.0 {
        codes.fill(0);
        return s;
    }
    let d = g * sv;
    for (c, &v) in codes.iter_mut().zip(vals) {
        *c = e2m1::encode_sat(v as f64 / d);
    }
    s
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
        let n = checked_elems(rows, cols, BLOCK)?;
        if x.len() != n {
            return Err(FormatError::BadLength {
                what: "values",
                rows,
                cols,
                expected: n,
                got: x.len(),
            });
        }
        let g = global_scale(x);
        let mut codes = vec![0u8; n / 2];
        let mut scales = vec![0u8; n / BLOCK];
        let mut block_codes = [0u8; BLOCK];
        for ((vals, packed), s) in x
            .chunks_exact(BLOCK)
            .zip(codes.chunks_exact_mut(BLOCK / 2))
            .zip(scales.iter_mut())
        {
            *s = quantize_block(vals, g, &mut block_codes);
            e2m1::pack(&block_codes, packed);
        }
        Ok(Nvfp4Tensor {
            rows,
            cols,
            codes,
            scales,
            global: g,
        })
    }

    /// Wrap existing buffers, checking every length (and that `global` is finite).
    pub fn from_parts(
        rows: usize,
        cols: usize,
        codes: Vec<u8>,
        scales: Vec<u8>,
        global: f32,
    ) -> Result<Self, FormatError> {
        let n = checked_elems(rows, cols, BLOCK)?;
        if codes.len() != n / 2 {
            return Err(FormatError::BadLength {
                what: "E2M1 codes",
                rows,
                cols,
                expected: n / 2,
                got: codes.len(),
            });
        }
        if scales.len() != n / BLOCK {
            return Err(FormatError::BadLength {
                what: "E4M3 block scales",
                rows,
                cols,
                expected: n / BLOCK,
                got: scales.len(),
            });
        }
        if !global.is_finite() {
            return Err(FormatError::Invalid(alloc::format!(
                "global scale (weight_scale_2) is not finite: {global}"
            )));
        }
        Ok(Nvfp4Tensor {
            rows,
            cols,
            codes,
            scales,
            global,
        })
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
    /// The product has at most 3 + 4 + 24 significant bits, so it is exact.
    /// A NaN block scale gives NaN.
    ///
    /// # Panics
    /// If `(row, col)` is out of range.
    pub fn value_f64(&self, row: usize, col: usize) -> f64 {
        assert!(
            row < self.rows && col < self.cols,
            "({row}, {col}) out of range"
        );
        let i = row * self.cols + col;
        let byte = self.codes[i / 2];
        let code = if i.is_multiple_of(2) {
            byte & 0x0F
        } else {
            byte >> 4
        };
        let s = e4m3::decode(self.scales[i / BLOCK]) as f64;
        e2m1::decode(code) as f64 * s * self.global as f64
    }

    /// Exact values of one row as f64 into `out` (`out.len() == cols`).
    ///
    /// # Panics
    /// If `row >= rows` or `out.len() != cols`.
    pub fn row_f64(&self, row: usize, out: &mut [f64]) {
        assert!(
            row < self.rows,
            "row {row} out of range (rows = {})",
            self.rows
        );
        assert_eq!(out.len(), self.cols, "output row length");
        let g = self.global as f64;
        let codes = &self.codes[row * self.cols / 2..(row + 1) * self.cols / 2];
        let scales = &self.scales[row * self.cols / BLOCK..(row + 1) * self.cols / BLOCK];
        for ((o, c), &s) in out
            .chunks_exact_mut(BLOCK)
            .zip(codes.chunks_exact(BLOCK / 2))
            .zip(scales)
        {
            let sg = e4m3::decode(s) as f64 * g; // exact: 4 x 24 bits
            for (pair, &byte) in o.chunks_exact_mut(2).zip(c) {
                pair[0] = e2m1::VALUES[(byte & 0x0F) as usize] as f64 * sg;
                pair[1] = e2m1::VALUES[(byte >> 4) as usize] as f64 * sg;
            }
        }
    }

    /// Decode one row to f32 (`out.len() == cols`); f32 rounding of the exact product.
    ///
    /// # Panics
    /// If `row >= rows` or `out.len() != cols`.
    pub fn dequantize_row(&self, row: usize, out: &mut [f32]) {
        assert!(
            row < self.rows,
            "row {row} out of range (rows = {})",
            self.rows
        );
        assert_eq!(out.len(), self.cols, "output row length");
        let g = self.global as f64;
        let codes = &self.codes[row * self.cols / 2..(row + 1) * self.cols / 2];
        let scales = &self.scales[row * self.cols / BLOCK..(row + 1) * self.cols / BLOCK];
        for ((o, c), &s) in out
            .chunks_exact_mut(BLOCK)
            .zip(codes.chunks_exact(BLOCK / 2))
            .zip(scales)
        {
            let sg = e4m3::decode(s) as f64 * g;
            for (pair, &byte) in o.chunks_exact_mut(2).zip(c) {
                pair[0] = (e2m1::VALUES[(byte & 0x0F) as usize] as f64 * sg) as f32;
                pair[1] = (e2m1::VALUES[(byte >> 4) as usize] as f64 * sg) as f32;
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
