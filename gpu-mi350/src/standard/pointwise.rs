//! The small per-row and per-element launches of a step (embedding,
//! RMSNorm, per-head norm + RoPE, cache writes, SwiGLU, bf16 residual adds),
//! as free functions over a [`Launcher`] so the standard path's step and
//! the DSpark draft ([`crate::draft`]) launch them the same way.

use super::launch::{Arg, Launcher};
use crate::error::Result;
use crate::runtime::api::Func;

/// One tensor of a fused per-head norm + RoPE launch (`SHnJob`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct HnJob {
    x: u64,
    w: u64,
    out: u64,
    heads: u32,
    d: u32,
    rd: u32,
    h0: u32,
}

/// `SHnJobs`: up to 4 tensors, by value.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct HnJobs {
    j: [HnJob; 4],
    theta: f64,
    eps: f32,
    n: u32,
}

/// One cache write of a fused launch (`SCwJob`): `width` values of row t
/// of `x` (bf16) to slot `slots[t]` of `cache`, as bf16 (`bf16 = 1`) or
/// `e4m3(x / scale)` saturating.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct CwJob {
    x: u64,
    cache: u64,
    width: u32,
    scale: f32,
    bf16: u32,
    pad: u32,
}

/// `SCwJobs`: up to 3 cache writes, by value.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct CwJobs {
    j: [CwJob; 3],
    n: u32,
    pad: u32,
}

/// One tensor of a fused per-head norm + RoPE launch: `(x, heads, d,
/// norm weight, rotary dims, out)`.
pub(crate) type HnSpec = (u64, usize, usize, u64, usize, u64);

/// One cache write of a fused launch: `(x, width, fp8 scale, cache)`.
pub(crate) type CwSpec = (u64, usize, f32, u64);

/// `out[t] = f32(table[tokens[t]])` for `t` rows of width `h` (bf16 table).
pub(crate) fn embed(
    l: &Launcher,
    f: &Func,
    tokens: u64,
    table: u64,
    h: usize,
    out: u64,
    t: usize,
) -> Result<()> {
    l.launch(
        "embed",
        f,
        (t as u32, 1, 1),
        256,
        0,
        &[
            Arg::U64(tokens),
            Arg::U64(table),
            Arg::U32(h as u32),
            Arg::U64(out),
        ],
    )
}

/// RMSNorm (Gemma: `1 + w`) of rows of `x` (f32 `[*, n]`, all rows or
/// those listed at `rows`) into bf16 `out` (`nrows` rows).
#[allow(clippy::too_many_arguments)]
pub(crate) fn rmsnorm(
    l: &Launcher,
    f: &Func,
    x: u64,
    rows: u64,
    w: u64,
    eps: f32,
    n: usize,
    out: u64,
    nrows: usize,
) -> Result<()> {
    l.launch(
        "rmsnorm",
        f,
        (nrows as u32, 1, 1),
        RMSNORM_BLOCK,
        0,
        &[
            Arg::U64(x),
            Arg::U64(rows),
            Arg::U64(w),
            Arg::F32(eps),
            Arg::U32(n as u32),
            Arg::U64(out),
        ],
    )
}

/// Threads of `m3s_rmsnorm` (one CTA a row). 1024: a 256-thread block
/// keeping 32 values a thread measured twice as slow at one row
/// (bench/NOTES.md session 8); the mono path runs the same sums in its
/// 256-thread CTAs with `m3s_rmsnorm_v1024`.
pub(crate) const RMSNORM_BLOCK: u32 = 1024;

/// `acc[i] += f32(y[i])` for `n` values (`y` bf16).
pub(crate) fn add_bf16(l: &Launcher, f: &Func, acc: u64, y: u64, n: usize) -> Result<()> {
    l.launch(
        "add_bf16",
        f,
        ((n as u32).div_ceil(256).max(1), 1, 1),
        256,
        0,
        &[Arg::U64(acc), Arg::U64(y), Arg::U32(n as u32)],
    )
}

/// SwiGLU-OAI of `n` (gate, up) bf16 pairs into bf16 `out`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn swiglu(
    l: &Launcher,
    f: &Func,
    g: u64,
    u: u64,
    alpha: f32,
    limit: f32,
    out: u64,
    n: usize,
) -> Result<()> {
    l.launch(
        "swiglu",
        f,
        ((n as u32).div_ceil(256).max(1), 1, 1),
        256,
        0,
        &[
            Arg::U64(g),
            Arg::U64(u),
            Arg::F32(alpha),
            Arg::F32(limit),
            Arg::U64(out),
            Arg::U32(n as u32),
        ],
    )
}

/// Per-head norm + RoPE (at the positions `pos`, `[t]` u32) of up to 4
/// tensors of `t` rows in one launch.
pub(crate) fn headnorm_rope(
    l: &Launcher,
    f: &Func,
    jobs: &[HnSpec],
    t: usize,
    pos: u64,
    theta: f64,
    eps: f32,
) -> Result<()> {
    let mut hj = HnJobs {
        theta,
        eps,
        ..HnJobs::default()
    };
    let mut h0 = 0u32;
    for (i, &(x, heads, d, w, rd, out)) in jobs.iter().take(4).enumerate() {
        hj.j[i] = HnJob {
            x,
            w,
            out,
            heads: heads as u32,
            d: d as u32,
            rd: rd as u32,
            h0,
        };
        h0 += heads as u32;
        hj.n += 1;
    }
    l.launch(
        "headnorm_rope",
        f,
        (h0, t as u32, 1),
        l.warp(),
        0,
        &[Arg::pod(&hj), Arg::U64(pos)],
    )
}

/// Cache writes of up to 3 tensors of `t` rows (row `i` to slot
/// `slots[i]`) in one launch: bf16 bits, or E4M3 codes of `x / scale`.
pub(crate) fn cache_writes(
    l: &Launcher,
    f: &Func,
    jobs: &[CwSpec],
    t: usize,
    slots: u64,
    bf16: bool,
) -> Result<()> {
    let mut cj = CwJobs::default();
    for (i, &(x, width, scale, cache)) in jobs.iter().take(3).enumerate() {
        cj.j[i] = CwJob {
            x,
            cache,
            width: width as u32,
            scale,
            bf16: bf16 as u32,
            pad: 0,
        };
        cj.n += 1;
    }
    l.launch(
        "cache_write",
        f,
        (t as u32, cj.n, 1),
        128,
        0,
        &[Arg::pod(&cj), Arg::U64(slots)],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_tables_have_the_kernel_layout() {
        // SHnJob: 3 u64 + 4 u32; SHnJobs: 4 of them, f64, f32, u32.
        assert_eq!(std::mem::size_of::<HnJob>(), 40);
        assert_eq!(std::mem::size_of::<HnJobs>(), 4 * 40 + 16);
        // SCwJob: 2 u64 + u32, f32, u32, u32; SCwJobs: 3 of them + 2 u32.
        assert_eq!(std::mem::size_of::<CwJob>(), 32);
        assert_eq!(std::mem::size_of::<CwJobs>(), 3 * 32 + 8);
    }
}
