//! The indexer (block scores, block top-k) and attention over the paged
//! cache (MODEL.md 3.6-3.7). Parallel over rows (and heads); each output is
//! one fixed-order loop.

use m3_core::backend::{BackendError, BlockSelection, StepBatch};
use m3_core::config::IndexSelection;
use m3_core::kv::CacheTensor;
use rayon::prelude::*;

use crate::numerics::{bf16_round, dot};

/// Slot of position `j` of the sequence of row `t`.
#[inline]
fn slot(step: &StepBatch, t: usize, j: usize, page: usize) -> usize {
    let bt = &step.seq_of(t).block_table;
    bt[j / page] as usize * page + j % page
}

/// Block scores `[heads, T, nb]`: `max_{j in b, j <= p} q[t,g] . k_j`, -inf
/// where a block has no visible key.
#[allow(clippy::too_many_arguments)]
pub fn index_scores(
    q: &[f32],
    heads: usize,
    dim: usize,
    cache: &CacheTensor,
    step: &StepBatch,
    page: usize,
    bs: usize,
    nb: usize,
    out: &mut [f32],
) -> Result<(), BackendError> {
    let t_rows = step.rows();
    let per_row: Vec<Vec<f32>> = (0..t_rows)
        .into_par_iter()
        .map(|t| {
            let p = step.positions[t] as usize;
            let mut s = vec![f32::NEG_INFINITY; heads * nb];
            let mut key = vec![0.0f32; dim];
            for j in 0..=p {
                cache.read(slot(step, t, j, page), 0, &mut key);
                let b = j / bs;
                if b >= nb {
                    break;
                }
                for g in 0..heads {
                    let v = dot(&q[(t * heads + g) * dim..(t * heads + g + 1) * dim], &key);
                    let cur = &mut s[g * nb + b];
                    if v > *cur {
                        *cur = v;
                    }
                }
            }
            s
        })
        .collect();
    for (t, s) in per_row.iter().enumerate() {
        for g in 0..heads {
            out[(g * t_rows + t) * nb..(g * t_rows + t + 1) * nb]
                .copy_from_slice(&s[g * nb..(g + 1) * nb]);
        }
    }
    Ok(())
}

/// Select blocks for one (head, row): `n = p/B + 1` visible; all when
/// `n <= K`; else the forced init/local blocks plus the best-scoring others
/// (ties: lower index). Writes ascending ids, -1 padded.
pub fn select_blocks(
    scores: &[f32],
    p: usize,
    bs: usize,
    topk: usize,
    init: usize,
    local: usize,
    out: &mut [i32],
) {
    out.fill(-1);
    let n = p / bs + 1;
    if n <= topk {
        for (b, o) in out.iter_mut().enumerate().take(n) {
            *o = b as i32;
        }
        return;
    }
    let mut chosen = vec![false; n];
    for c in chosen.iter_mut().take(init.min(n)) {
        *c = true;
    }
    for c in chosen.iter_mut().skip(n.saturating_sub(local)) {
        *c = true;
    }
    let forced = chosen.iter().filter(|&&c| c).count();
    let mut rest: Vec<usize> = (0..n).filter(|&b| !chosen[b]).collect();
    let key = |b: usize| {
        let v = scores.get(b).copied().unwrap_or(f32::NEG_INFINITY);
        if v.is_nan() {
            f32::NEG_INFINITY
        } else {
            v
        }
    };
    // Stable sort by score descending keeps ascending ids among equal scores.
    rest.sort_by(|&a, &b| {
        key(b)
            .partial_cmp(&key(a))
            .unwrap_or(std::cmp::Ordering::Equal)
    });
    for &b in rest.iter().take(topk.saturating_sub(forced)) {
        chosen[b] = true;
    }
    let mut i = 0;
    for (b, &c) in chosen.iter().enumerate() {
        if c && i < out.len() {
            out[i] = b as i32;
            i += 1;
        }
    }
}

/// Block top-k over `scores` `[heads, T, nb]` into `out` `[kv_heads, T, topk]`.
#[allow(clippy::too_many_arguments)]
pub fn block_topk(
    scores: &[f32],
    heads: usize,
    nb: usize,
    positions: &[u32],
    bs: usize,
    topk: usize,
    init: usize,
    local: usize,
    selection: IndexSelection,
    kv_heads: usize,
    out: &mut [i32],
) -> Result<(), BackendError> {
    let t_rows = positions.len();
    match selection {
        IndexSelection::PerKvHead => {
            out.par_chunks_mut(topk).enumerate().for_each(|(i, o)| {
                let t = i % t_rows;
                select_blocks(
                    &scores[i * nb..(i + 1) * nb],
                    positions[t] as usize,
                    bs,
                    topk,
                    init,
                    local,
                    o,
                );
            });
        }
        IndexSelection::Shared => {
            for t in 0..t_rows {
                let mut m = vec![f32::NEG_INFINITY; nb];
                for g in 0..heads {
                    for (b, mv) in m.iter_mut().enumerate() {
                        let v = scores[(g * t_rows + t) * nb + b];
                        if v > *mv {
                            *mv = v;
                        }
                    }
                }
                let mut sel = vec![-1i32; topk];
                select_blocks(&m, positions[t] as usize, bs, topk, init, local, &mut sel);
                for g in 0..kv_heads {
                    out[(g * t_rows + t) * topk..(g * t_rows + t + 1) * topk].copy_from_slice(&sel);
                }
            }
        }
    }
    Ok(())
}

/// Attention of `q` `[T, heads, d]` over the paged cache; `out` bf16.
#[allow(clippy::too_many_arguments)]
pub fn attention(
    q: &[f32],
    heads: usize,
    kv_heads: usize,
    d: usize,
    k: &CacheTensor,
    v: &CacheTensor,
    step: &StepBatch,
    page: usize,
    blocks: Option<BlockSelection<'_>>,
    out: &mut [f32],
) -> Result<(), BackendError> {
    let t_rows = step.rows();
    let group = heads / kv_heads;
    let scale = (d as f32).sqrt();
    out.par_chunks_mut(d).enumerate().for_each(|(i, o)| {
        let (t, hi) = (i / heads, i % heads);
        let g = hi / group;
        let p = step.positions[t] as usize;
        let qh = &q[i * d..(i + 1) * d];
        // Keys this head sees, ascending.
        let keys: Vec<usize> = match &blocks {
            None => (0..=p).collect(),
            Some(bsel) => {
                let ids =
                    &bsel.blocks[(g * t_rows + t) * bsel.topk..(g * t_rows + t + 1) * bsel.topk];
                let mut js = Vec::new();
                for &b in ids.iter().filter(|&&b| b >= 0) {
                    let lo = b as usize * bsel.block_size;
                    js.extend(lo..(lo + bsel.block_size).min(p + 1));
                }
                js
            }
        };
        let mut kb = vec![0.0f32; d];
        let sc: Vec<f32> = keys
            .iter()
            .map(|&j| {
                k.read(slot(step, t, j, page), g * d, &mut kb);
                dot(qh, &kb) / scale
            })
            .collect();
        let m = sc.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut acc = vec![0.0f32; d];
        let mut sum = 0.0f32;
        for (&j, &s) in keys.iter().zip(&sc) {
            let e = (s - m).exp();
            sum += e;
            v.read(slot(step, t, j, page), g * d, &mut kb);
            for (a, &x) in acc.iter_mut().zip(&kb) {
                *a += e * x;
            }
        }
        for (y, a) in o.iter_mut().zip(acc) {
            *y = bf16_round(a / sum);
        }
    });
    Ok(())
}
