//! Linear layers `y = x W^T` for every weight format, dequantizing the
//! weight one 32-element block at a time into a stack buffer (never the
//! whole tensor). Parallel over output features; each output element is one
//! fixed-order reduction (`numerics`), so the bits do not depend on threads.

use m3_core::backend::{BackendError, LinearInput};
use m3_core::formats::convert::{self, PtpcFp8};
use m3_core::formats::{MxElem, MxTensor, ScaleRule};
use m3_core::weights::LinearWeight;
use rayon::prelude::*;

use crate::numerics::{bf16_round, dot_block, pairwise_sum, tables, BLOCK};

fn shape(what: String) -> BackendError {
    BackendError::Shape { op: "linear", what }
}

/// Decode elements `[lo, lo + out.len())` of weight row `row` (`out.len()
/// <= 32`, `lo` a multiple of 32) exactly.
#[inline]
pub fn decode_block(w: &LinearWeight, row: usize, lo: usize, out: &mut [f32]) {
    let n = out.len();
    match w {
        LinearWeight::Bf16 { cols, data, .. } => {
            let base = row * cols + lo;
            for (o, &b) in out.iter_mut().zip(&data[base..base + n]) {
                *o = f32::from_bits((b as u32) << 16);
            }
        }
        LinearWeight::F32 { cols, data, .. } => {
            let base = row * cols + lo;
            out.copy_from_slice(&data[base..base + n]);
        }
        LinearWeight::Mx(t) => {
            let tb = tables();
            let cols = t.cols();
            let s = tb.e8m0[t.scales()[row * (cols / BLOCK) + lo / BLOCK] as usize];
            match t.elem() {
                MxElem::Fp4E2M1 => {
                    let base = (row * cols + lo) / 2;
                    let codes = &t.codes()[base..base + n.div_ceil(2)];
                    for (i, o) in out.iter_mut().enumerate() {
                        let byte = codes[i / 2];
                        let c = if i % 2 == 0 { byte & 0xF } else { byte >> 4 };
                        *o = tb.e2m1[c as usize] * s;
                    }
                }
                MxElem::Fp8E4M3 | MxElem::Fp8E5M2 => {
                    let tab = if t.elem() == MxElem::Fp8E4M3 {
                        &tb.e4m3
                    } else {
                        &tb.e5m2
                    };
                    let base = row * cols + lo;
                    for (o, &c) in out.iter_mut().zip(&t.codes()[base..base + n]) {
                        *o = tab[c as usize] * s;
                    }
                }
            }
        }
        LinearWeight::Nvfp4(t) => {
            let tb = tables();
            let cols = t.cols();
            let g = t.global() as f64;
            let base = (row * cols + lo) / 2;
            let codes = &t.codes()[base..base + n.div_ceil(2)];
            let sc = &t.scales()[row * (cols / 16)..];
            for (i, o) in out.iter_mut().enumerate() {
                let byte = codes[i / 2];
                let c = if i % 2 == 0 { byte & 0xF } else { byte >> 4 };
                // e2m1 * e4m3 is exact in f32; times g exactly in f64, one rounding.
                let bs = tb.e4m3[sc[(lo + i) / 16] as usize];
                *o = ((tb.e2m1[c as usize] * bs) as f64 * g) as f32;
            }
        }
    }
}

/// Call `f(block index, values)` for every 32-element block of weight row
/// `row`, in order, decoded exactly (the same values as `decode_block`).
/// The format dispatch and table lookups are hoisted out of the block loop.
#[inline]
pub fn for_each_block(w: &LinearWeight, row: usize, mut f: impl FnMut(usize, &[f32])) {
    let k = w.cols();
    let nb = k.div_ceil(BLOCK);
    let mut buf = [0.0f32; BLOCK];
    match w {
        LinearWeight::Bf16 { data, .. } => {
            let r = &data[row * k..(row + 1) * k];
            for (b, src) in r.chunks(BLOCK).enumerate() {
                for (o, &v) in buf.iter_mut().zip(src) {
                    *o = f32::from_bits((v as u32) << 16);
                }
                f(b, &buf[..src.len()]);
            }
        }
        LinearWeight::F32 { data, .. } => {
            for (b, src) in data[row * k..(row + 1) * k].chunks(BLOCK).enumerate() {
                f(b, src);
            }
        }
        LinearWeight::Mx(t) => {
            let tb = tables();
            let scales = &t.scales()[row * nb..(row + 1) * nb];
            match t.elem() {
                MxElem::Fp4E2M1 => {
                    let codes = &t.codes()[row * k / 2..(row + 1) * k / 2];
                    for (b, (cb, &sc)) in codes.chunks(BLOCK / 2).zip(scales).enumerate() {
                        let s = tb.e8m0[sc as usize];
                        for (i, &byte) in cb.iter().enumerate() {
                            buf[2 * i] = tb.e2m1[(byte & 0xF) as usize] * s;
                            buf[2 * i + 1] = tb.e2m1[(byte >> 4) as usize] * s;
                        }
                        f(b, &buf);
                    }
                }
                MxElem::Fp8E4M3 | MxElem::Fp8E5M2 => {
                    let tab = if t.elem() == MxElem::Fp8E4M3 {
                        &tb.e4m3
                    } else {
                        &tb.e5m2
                    };
                    let codes = &t.codes()[row * k..(row + 1) * k];
                    for (b, (cb, &sc)) in codes.chunks(BLOCK).zip(scales).enumerate() {
                        let s = tb.e8m0[sc as usize];
                        for (o, &c) in buf.iter_mut().zip(cb) {
                            *o = tab[c as usize] * s;
                        }
                        f(b, &buf);
                    }
                }
            }
        }
        LinearWeight::Nvfp4(_) => {
            for b in 0..nb {
                let len = (k - b * BLOCK).min(BLOCK);
                decode_block(w, row, b * BLOCK, &mut buf[..len]);
                f(b, &buf[..len]);
            }
        }
    }
}

/// Fake-quantize activation rows (width `cols`, a multiple of 32) to MXFP4
/// with the `even` rule and decode them back (the values a w4a4 GEMM sees).
pub fn act_quant_mxfp4(x: &[f32], cols: usize) -> Result<Vec<f32>, BackendError> {
    if cols == 0 || !cols.is_multiple_of(BLOCK) || !x.len().is_multiple_of(cols) {
        return Err(BackendError::Shape {
            op: "act_quant_mxfp4",
            what: format!(
                "row width {cols} must be a positive multiple of 32 dividing {}",
                x.len()
            ),
        });
    }
    let rows = x.len() / cols;
    let q = MxTensor::quantize(x, rows, cols, MxElem::Fp4E2M1, ScaleRule::Even)?;
    Ok(q.dequantize())
}

/// `out = x W^T` (`x` `[rows, K]`, `out` `[rows, N]`, `W` `[N, K]`).
pub fn linear(
    x: &[f32],
    rows: usize,
    w: &LinearWeight,
    input: LinearInput,
    round_out: bool,
    out: &mut [f32],
) -> Result<(), BackendError> {
    let (n, k) = (w.rows(), w.cols());
    let xin: Vec<f32> = match input {
        LinearInput::F32 => x.to_vec(),
        LinearInput::Bf16 => x.iter().map(|&v| bf16_round(v)).collect(),
        LinearInput::Mxfp4 => {
            let xb: Vec<f32> = x.iter().map(|&v| bf16_round(v)).collect();
            act_quant_mxfp4(&xb, k)?
        }
    };
    if matches!(w, LinearWeight::Mx(_) | LinearWeight::Nvfp4(_)) && !k.is_multiple_of(BLOCK) {
        return Err(shape(format!(
            "quantized weight width {k} is not a multiple of 32"
        )));
    }
    let nb = k.div_ceil(BLOCK);
    // Column-major scratch: out_t[o * rows + t].
    let mut out_t = vec![0.0f32; n * rows];
    let chunk = (4096 / (rows * nb).max(1)).clamp(1, 64);
    out_t
        .par_chunks_mut(rows * chunk)
        .enumerate()
        .for_each_init(
            || vec![0.0f32; rows * nb],
            |partial, (ci, col)| {
                for (j, outs) in col.chunks_mut(rows).enumerate() {
                    let o = ci * chunk + j;
                    for_each_block(w, o, |b, wb| {
                        let lo = b * BLOCK;
                        for t in 0..rows {
                            partial[t * nb + b] =
                                dot_block(wb, &xin[t * k + lo..t * k + lo + wb.len()]);
                        }
                    });
                    for (t, y) in outs.iter_mut().enumerate() {
                        let s = pairwise_sum(&partial[t * nb..(t + 1) * nb]);
                        *y = if round_out { bf16_round(s) } else { s };
                    }
                }
            },
        );
    for o in 0..n {
        for t in 0..rows {
            out[t * n + o] = out_t[o * rows + t];
        }
    }
    Ok(())
}

/// Decode a whole weight to f32 `[rows, cols]` (the `Dequantize` op and
/// tests; the forward never calls it).
pub fn dequantize(w: &LinearWeight, out: &mut [f32]) -> Result<(), BackendError> {
    let k = w.cols();
    out.par_chunks_mut(k.max(1))
        .enumerate()
        .for_each(|(o, row)| {
            for lo in (0..k).step_by(BLOCK) {
                let hi = (lo + BLOCK).min(k);
                decode_block(w, o, lo, &mut row[lo..hi]);
            }
        });
    Ok(())
}

/// A linear with a PTPC FP8 weight (ARCHITECTURE.md, *Online
/// quantization*; [`m3_core::backend::Backend::ptpc_linear`]): per token,
/// the bf16-rounded row is quantized to E4M3 with `sa = f32(amax / 448)`;
/// each output is `f32(f32(ptpc_dot(qa, qw_n) * sw_n) * sa)`, the dot exact
/// (so the result does not depend on the thread count or any order), then
/// bf16 when `round_out`. A row holding NaN or an infinity gives NaN outputs.
pub fn ptpc_linear(
    x: &[f32],
    rows: usize,
    w: &PtpcFp8,
    round_out: bool,
    out: &mut [f32],
) -> Result<(), BackendError> {
    let (n, k) = (w.rows, w.cols);
    if w.codes.len() != n * k || w.scales.len() != n {
        return Err(shape(format!(
            "ptpc_linear: weight [{n}, {k}] has {} codes and {} scales",
            w.codes.len(),
            w.scales.len()
        )));
    }
    if x.len() != rows * k || out.len() != rows * n {
        return Err(shape(format!(
            "ptpc_linear: x has {} values (expected {rows} x {k}), out {} (expected {rows} x {n})",
            x.len(),
            out.len()
        )));
    }
    if k == 0 || n == 0 {
        out.fill(0.0);
        return Ok(());
    }
    out.par_chunks_mut(n).zip(x.par_chunks(k)).for_each_init(
        || (vec![0f32; k], vec![0u8; k]),
        |(xb, qa), (o, xr)| {
            for (b, &v) in xb.iter_mut().zip(xr) {
                *b = bf16_round(v);
            }
            if xb.iter().any(|v| !v.is_finite()) {
                o.fill(f32::NAN);
                return;
            }
            let sa = convert::ptpc_quantize_row(xb, qa);
            for ((y, qw), &sw) in o.iter_mut().zip(w.codes.chunks_exact(k)).zip(&w.scales) {
                let v = match convert::ptpc_dot(qa, qw) {
                    Some(acc) => (acc * sw) * sa,
                    None => f32::NAN,
                };
                *y = if round_out { bf16_round(v) } else { v };
            }
        },
    );
    Ok(())
}
