//! Gemma RMSNorm and partial NeoX RoPE (MODEL.md 2 and 3.4).

use m3_core::backend::BackendError;
use rayon::prelude::*;

use crate::numerics::{bf16_round, sum_sq};

/// Gemma RMSNorm of each `width`-wide row: `x / sqrt(mean(x^2) + eps) * (1 + w)`
/// (sum of squares in the fixed order of `numerics::dot`).
pub fn rmsnorm(
    x: &[f32],
    width: usize,
    w: &[f32],
    eps: f32,
    round_out: bool,
    out: &mut [f32],
) -> Result<(), BackendError> {
    out.par_chunks_mut(width)
        .zip(x.par_chunks(width))
        .for_each(|(o, xr)| {
            let ms = sum_sq(xr) / width as f32;
            let denom = (ms + eps).sqrt();
            for ((y, &v), &wi) in o.iter_mut().zip(xr).zip(w) {
                let r = v / denom * (1.0 + wi);
                *y = if round_out { bf16_round(r) } else { r };
            }
        });
    Ok(())
}

/// The (cos, sin) of pair `i` at position `p`: `f_i = theta^(-2i/rd)` and the
/// angle `p * f_i` in f64 (positions up to 2^20 keep their phase), then
/// sin/cos rounded to f32.
pub fn rope_cos_sin(p: u32, i: usize, rotary_dim: usize, theta: f64) -> (f32, f32) {
    let f = theta.powf(-(2.0 * i as f64) / rotary_dim as f64);
    let a = p as f64 * f;
    (a.cos() as f32, a.sin() as f32)
}

/// Partial NeoX RoPE in place on `x` `[T, heads, head_dim]`.
pub fn rope(
    x: &mut [f32],
    heads: usize,
    head_dim: usize,
    rotary_dim: usize,
    theta: f64,
    positions: &[u32],
    round_out: bool,
) -> Result<(), BackendError> {
    let row = heads * head_dim;
    let half = rotary_dim / 2;
    x.par_chunks_mut(row.max(1))
        .zip(positions.par_iter())
        .for_each(|(xr, &p)| {
            let cs: Vec<(f32, f32)> = (0..half)
                .map(|i| rope_cos_sin(p, i, rotary_dim, theta))
                .collect();
            for hv in xr.chunks_mut(head_dim) {
                for (i, &(c, s)) in cs.iter().enumerate() {
                    let (a, b) = (hv[i], hv[i + half]);
                    hv[i] = a * c - b * s;
                    hv[i + half] = b * c + a * s;
                }
                if round_out {
                    for v in hv.iter_mut() {
                        *v = bf16_round(*v);
                    }
                }
            }
        });
    Ok(())
}
