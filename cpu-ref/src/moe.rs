//! FFN: SwiGLU-OAI, dense MLP, sigmoid router with correction bias, grouped
//! routed experts + shared expert (MODEL.md 3.10, 5).

use m3_core::backend::{ActMode, BackendError, LinearInput};
use m3_core::weights::{MlpWeights, MoeWeights};
use rayon::prelude::*;

use crate::linear::linear;
use crate::numerics::{bf16_round, sigmoid};

/// SwiGLU-OAI of one element: `((u' + 1) * g') * sigmoid(alpha * g')`,
/// `g' = min(g, limit)`, `u' = clamp(u, -limit, limit)`, then bf16.
#[inline]
pub fn swiglu_oai(g: f32, u: f32, alpha: f32, limit: f32) -> f32 {
    let g = g.min(limit);
    let u = u.clamp(-limit, limit);
    bf16_round(((u + 1.0) * g) * sigmoid(alpha * g))
}

pub fn swiglu(
    gate: &[f32],
    up: &[f32],
    alpha: f32,
    limit: f32,
    out: &mut [f32],
) -> Result<(), BackendError> {
    out.par_iter_mut()
        .zip(gate.par_iter().zip(up.par_iter()))
        .for_each(|(o, (&g, &u))| {
            *o = swiglu_oai(g, u, alpha, limit);
        });
    Ok(())
}

/// One SwiGLU-OAI MLP on `x` `[rows, H]`; `input` says how each GEMM's
/// input row is presented (bf16, or MXFP4 for w4a4 routed experts).
pub fn mlp(
    x: &[f32],
    rows: usize,
    w: &MlpWeights,
    input: LinearInput,
    alpha: f32,
    limit: f32,
    out: &mut [f32],
) -> Result<(), BackendError> {
    let width = w.gate.rows();
    let mut g = vec![0.0f32; rows * width];
    let mut u = vec![0.0f32; rows * width];
    linear(x, rows, &w.gate, input, true, &mut g)?;
    linear(x, rows, &w.up, input, true, &mut u)?;
    let mut a = vec![0.0f32; rows * width];
    swiglu(&g, &u, alpha, limit, &mut a)?;
    linear(&a, rows, &w.down, input, true, out)
}

/// The score the router ranks expert choices by: `sigmoid(z) + bias` of one
/// f32 logit (MODEL.md step 10). Near-tie checks elsewhere (the GPU gate,
/// `m3 parity`) compute their gaps with this same function.
#[inline]
pub fn router_key(z: f32, bias: f32) -> f32 {
    sigmoid(z) + bias
}

/// Router: f32 logits of `x` (as f32), sigmoid, top-k by `s + bias` (ties:
/// lower id), weights `s_e / sum(s_chosen) * scaling` (sum in ascending id).
#[allow(clippy::too_many_arguments)]
pub fn router(
    x: &[f32],
    rows: usize,
    w: &m3_core::weights::LinearWeight,
    bias: &[f32],
    top_k: usize,
    scaling: f32,
    ids: &mut [i32],
    weights: &mut [f32],
) -> Result<(), BackendError> {
    let ne = w.rows();
    let mut z = vec![0.0f32; rows * ne];
    linear(x, rows, w, LinearInput::F32, false, &mut z)?;
    for t in 0..rows {
        let zr = &z[t * ne..(t + 1) * ne];
        let s: Vec<f32> = zr.iter().map(|&v| sigmoid(v)).collect();
        let key = |e: usize| {
            let v = router_key(zr[e], bias[e]);
            if v.is_nan() {
                f32::NEG_INFINITY
            } else {
                v
            }
        };
        let mut order: Vec<usize> = (0..ne).collect();
        order.sort_by(|&a, &b| {
            key(b)
                .partial_cmp(&key(a))
                .unwrap_or(std::cmp::Ordering::Equal)
        });
        let mut chosen: Vec<usize> = order[..top_k].to_vec();
        chosen.sort_unstable();
        let mut sum = 0.0f32;
        for &e in &chosen {
            sum += s[e];
        }
        for (i, &e) in chosen.iter().enumerate() {
            ids[t * top_k + i] = e as i32;
            weights[t * top_k + i] = s[e] / sum * scaling;
        }
    }
    Ok(())
}

/// Routed experts grouped by expert (each expert runs once on the rows that
/// chose it), then per row: `sum over chosen e ascending of f32(w_e * o_e)`,
/// then `+ shared`.
#[allow(clippy::too_many_arguments)]
pub fn experts(
    x: &[f32],
    rows: usize,
    moe: &MoeWeights,
    ids: &[i32],
    weights: &[f32],
    top_k: usize,
    act: ActMode,
    alpha: f32,
    limit: f32,
    out: &mut [f32],
) -> Result<(), BackendError> {
    let ne = moe.experts.len();
    if rows == 0 {
        return Ok(());
    }
    let h = x.len() / rows;
    let input = match act {
        ActMode::Bf16 => LinearInput::Bf16,
        ActMode::Mxfp4 => LinearInput::Mxfp4,
    };
    // Rows per expert, ascending.
    let mut groups: Vec<Vec<usize>> = vec![Vec::new(); ne];
    for t in 0..rows {
        for i in 0..top_k {
            groups[ids[t * top_k + i] as usize].push(t);
        }
    }
    let outs: Vec<Result<Vec<f32>, BackendError>> = groups
        .par_iter()
        .enumerate()
        .map(|(e, rs)| {
            if rs.is_empty() {
                return Ok(Vec::new());
            }
            let mut xe = Vec::with_capacity(rs.len() * h);
            for &t in rs {
                xe.extend_from_slice(&x[t * h..(t + 1) * h]);
            }
            let mut ye = vec![0.0f32; rs.len() * h];
            mlp(&xe, rs.len(), &moe.experts[e], input, alpha, limit, &mut ye)?;
            Ok(ye)
        })
        .collect();
    let outs: Vec<Vec<f32>> = outs.into_iter().collect::<Result<_, _>>()?;
    let mut shared = vec![0.0f32; rows * h];
    if let Some(sw) = &moe.shared {
        mlp(x, rows, sw, LinearInput::Bf16, alpha, limit, &mut shared)?;
    }
    out.fill(0.0);
    // Position of row t inside each expert's group.
    let mut cursor = vec![0usize; ne];
    for t in 0..rows {
        let mut chosen: Vec<(usize, f32)> = (0..top_k)
            .map(|i| (ids[t * top_k + i] as usize, weights[t * top_k + i]))
            .collect();
        chosen.sort_by_key(|&(e, _)| e);
        let o = &mut out[t * h..(t + 1) * h];
        for &(e, we) in &chosen {
            let r = cursor[e];
            cursor[e] += 1;
            let ye = &outs[e][r * h..(r + 1) * h];
            for (a, &v) in o.iter_mut().zip(ye) {
                *a += we * v;
            }
        }
        if moe.shared.is_some() {
            for (a, &v) in o.iter_mut().zip(&shared[t * h..(t + 1) * h]) {
                *a += v;
            }
        }
    }
    Ok(())
}
