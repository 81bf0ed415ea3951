//! The small per-row and per-element launches of a step (embedding,
//! RMSNorm, per-head norm + RoPE, cache writes, SwiGLU, bf16 residual adds),
//! as free functions over a [`Launcher`] so the standard path's step and
//! the DSpark draft ([`crate::draft`]) launch them the same way.

use super::attn::{KvKind, NVFP4_BLOCK};
use super::launch::{Arg, Launcher};
use crate::error::{GpuError, Result};
use crate::runtime::api::Func;

/// One tensor of a fused per-head norm + RoPE launch (`SHnJob`), with
/// the cache its rows may also go to.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct HnJob {
    x: u64,
    w: u64,
    out: u64,
    cache: u64,
    scales: u64,
    heads: u32,
    d: u32,
    rd: u32,
    h0: u32,
    cscale: f32,
    pad: u32,
}

/// Tensors a head-norm launch takes (`SHnJobs::j`): q, k, v and the
/// indexer's q, k, and one spare.
pub(crate) const HN_MAX_JOBS: usize = 6;

/// `SHnJobs`: up to [`HN_MAX_JOBS`] tensors, by value.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct HnJobs {
    j: [HnJob; HN_MAX_JOBS],
    theta: f64,
    eps: f32,
    n: u32,
    kind: u32,
    pad: u32,
}

/// One cache write of a fused launch (`SCwJob`): `width` values of row t
/// of `x` (bf16) to slot `slots[t]` of `cache`, as bf16, as
/// `e4m3(x / scale)` saturating, or as NVFP4 blocks (codes to `cache`,
/// block scales to `scales`), by `kind` ([`KvKind`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct CwJob {
    x: u64,
    cache: u64,
    scales: u64,
    width: u32,
    scale: f32,
    kind: u32,
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
/// norm weight, rotary dims, out)`; a norm weight of 0 takes the values as
/// they are (V on its way to the cache), rotary dims 0 no RoPE, out 0 no
/// bf16 rows.
pub(crate) type HnSpec = (u64, usize, usize, u64, usize, u64);

/// The cache a head-norm job's rows also go to (a cache write fused into
/// the launch): rows of `heads * d` values of the launch's [`KvKind`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct HnCache {
    /// The cache: bf16 `[slot][heads * d]`, E4M3 `[slot][heads * d]` or
    /// NVFP4 codes `[slot][heads * d / 2]`.
    pub cache: u64,
    /// NVFP4 block scales `[slot][heads * d / 16]`; 0 for the other kinds.
    pub scales: u64,
    /// fp8's divisor, NVFP4's global (unused for bf16).
    pub scale: f32,
}

/// The cache writes a head-norm launch makes: one entry a job (`None`:
/// that job's rows go to no cache), every one of `kind`, row `i` to slot
/// `slots[i]` (`[t]` u32).
#[derive(Clone, Copy, Debug)]
pub(crate) struct HnCaches<'a> {
    pub of: &'a [Option<HnCache>],
    pub kind: KvKind,
    pub slots: u64,
}

/// One cache write of a fused launch.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CwSpec {
    /// Rows `[t][width]` bf16 to store.
    pub x: u64,
    /// Values a row.
    pub width: usize,
    /// The tensor's cache scale: fp8's divisor, NVFP4's global (unused for
    /// bf16).
    pub scale: f32,
    /// The cache: bf16 `[slot][width]`, E4M3 `[slot][width]` or NVFP4
    /// codes `[slot][width / 2]`.
    pub cache: u64,
    /// NVFP4 block scales `[slot][width / 16]`; 0 for the other kinds.
    pub scales: u64,
}

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

/// A MoE layer's combine (`m3s_moe_combine`'s inputs) left to the next
/// RMSNorm, which adds it into its rows and writes them to `out`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CombineIn {
    /// The experts' bf16 rows, `k` (+ `fold`) a row, and their weights.
    pub ye: u64,
    pub w: u64,
    pub k: u32,
    /// 1: the shared expert is the row's last expert row (folded).
    pub fold: u32,
    /// The shared expert's bf16 rows (0: none, or folded).
    pub shared: u64,
    /// Where the new residual rows go (f32 `[*, n]`).
    pub out: u64,
}

/// RMSNorm (Gemma: `1 + w`) of rows of `x` (f32 `[*, n]`, all rows or
/// those listed at `rows`) into bf16 `out` (`nrows` rows), and into the MX
/// linears' f16 layout at `xh` if not 0: row-scaled when `xrow` is not 0
/// (one power of two a row, from a bound every CTA computes alike:
/// [`super::linear::F16X::row_scaled`]; `xrow` is then the weight's
/// max |1 + w|, [`crate::model::DevNorm::xrow_arg`]), else a power of two a
/// block.
/// With `combine`, the rows are `x` plus that combine (written to
/// `combine.out`; the bits `m3s_moe_combine` then this RMSNorm give).
#[allow(clippy::too_many_arguments)]
pub(crate) fn rmsnorm(
    l: &Launcher,
    f: &RmsNormFuncs<'_>,
    x: u64,
    rows: u64,
    w: u64,
    eps: f32,
    n: usize,
    out: u64,
    xh: u64,
    xrow: u32,
    nrows: usize,
    combine: Option<CombineIn>,
) -> Result<()> {
    let mut args = vec![
        Arg::U64(x),
        Arg::U64(rows),
        Arg::U64(w),
        Arg::F32(eps),
        Arg::U32(n as u32),
        Arg::U64(out),
        Arg::U64(xh),
        Arg::U32(xrow),
    ];
    let (label, func) = match combine {
        None => ("rmsnorm", f.plain),
        Some(c) => {
            let mix = f.mix.ok_or_else(|| {
                GpuError::input("rmsnorm", "a MoE combine taken in without m3s_rmsnorm_mix")
            })?;
            args.extend([
                Arg::U64(c.ye),
                Arg::U64(c.w),
                Arg::U32(c.k),
                Arg::U32(c.fold),
                Arg::U64(c.shared),
                Arg::U64(c.out),
            ]);
            ("rmsnorm_mix", mix)
        }
    };
    l.launch(
        label,
        func,
        (nrows as u32, (n as u32).div_ceil(RMSNORM_BLOCK), 1),
        RMSNORM_BLOCK,
        0,
        &args,
    )
}

/// The RMSNorm entry points: `m3s_rmsnorm`, and `m3s_rmsnorm_mix` (a
/// combine taken in) where the caller has it.
pub(crate) struct RmsNormFuncs<'a> {
    pub plain: &'a Func,
    pub mix: Option<&'a Func>,
}

/// Threads of a `m3s_rmsnorm` CTA (`S_NORM_BLOCK`): each CTA writes this
/// many values of a row and sums the whole row's squares itself, in the
/// order of a 1024-thread block (so the mono path, whose CTAs run 256
/// threads, takes the same launch and gets the same bits).
pub(crate) const RMSNORM_BLOCK: u32 = 256;
// the kernel's sums play a 1024-thread block in whole wavefronts
const _: () = assert!(1024 % RMSNORM_BLOCK == 0 && RMSNORM_BLOCK.is_multiple_of(64));

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

/// SwiGLU-OAI of `n` (gate, up) bf16 pairs into bf16 `out`, and into the
/// MX linears' f16 layout at `xh` (rows of `k`) if not 0: row-scaled with
/// p = 2^(xpe - 127) ([`swiglu_row_pe`]), or a power of two a block when
/// `xpe` is 0.
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
    xh: u64,
    k: usize,
    xpe: u32,
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
            Arg::U64(xh),
            Arg::U32(k as u32),
            Arg::U32(xpe),
        ],
    )
}

/// The one power of two SwiGLU-OAI's f16 rows take when row-scaled, as
/// `m3s_swiglu`'s `xpe` (p = 2^(xpe - 127)), or `None` where the output has
/// no bound (a limit or alpha that is not finite and positive). With `g'`
/// at most `limit` and `u'` in `[-limit, limit]`, `|((u' + 1) g')
/// sigmoid(alpha g')| <= (limit + 1) max(limit, 0.2785 / alpha)` (for
/// `g' < 0`, `|g'| sigmoid(alpha g') <= max_y y / (1 + e^y) / alpha`, which
/// is below 0.2785 / alpha); 2% more covers the f32 and bf16 roundings. p
/// puts that bound at most 2^14 (`s_xh_row_pe`: below f16's 65504).
pub(crate) fn swiglu_row_pe(alpha: f32, limit: f32) -> Option<u32> {
    let (a, l) = (f64::from(alpha), f64::from(limit));
    if !(a.is_finite() && a > 0.0 && l.is_finite() && l >= 0.0) {
        return None;
    }
    let bound = (l + 1.0) * l.max(0.2785 / a) * 1.02;
    if bound <= 0.0 {
        return None;
    }
    // every value at most 2^u
    let u = bound.log2().ceil() as i32;
    Some((141 - u).clamp(2, 253) as u32)
}

/// Per-head norm + RoPE (at the positions `pos`, `[t]` u32) of up to
/// [`HN_MAX_JOBS`] tensors of `t` rows in one launch, each optionally also
/// written to its cache (`caches`: the values and bits of [`cache_writes`]
/// on the launch's bf16 rows, without a launch of its own).
#[allow(clippy::too_many_arguments)]
pub(crate) fn headnorm_rope(
    l: &Launcher,
    f: &Func,
    jobs: &[HnSpec],
    caches: Option<HnCaches>,
    t: usize,
    pos: u64,
    theta: f64,
    eps: f32,
) -> Result<()> {
    let hj = hn_jobs(jobs, caches, theta, eps)?;
    let h0 = hj.j[..hj.n as usize].iter().map(|j| j.heads).sum::<u32>();
    l.launch(
        "headnorm_rope",
        f,
        (h0, t as u32, 1),
        l.warp(),
        0,
        &[
            Arg::pod(&hj),
            Arg::U64(pos),
            Arg::U64(caches.map_or(0, |c| c.slots)),
        ],
    )
}

/// The head-norm launch's job table, checked: 1..=[`HN_MAX_JOBS`] jobs of
/// at most 256 values a head; with caches, one entry a job, NVFP4 heads a
/// whole number of 16-value blocks with block scales given, the other
/// kinds without.
pub(crate) fn hn_jobs(
    jobs: &[HnSpec],
    caches: Option<HnCaches>,
    theta: f64,
    eps: f32,
) -> Result<HnJobs> {
    let bad = |why: String| GpuError::input("headnorm_rope", why);
    if jobs.is_empty() || jobs.len() > HN_MAX_JOBS {
        return Err(bad(format!(
            "{} tensors in one launch (1..={HN_MAX_JOBS})",
            jobs.len()
        )));
    }
    if let Some(c) = caches.filter(|c| c.of.len() != jobs.len()) {
        return Err(bad(format!(
            "{} cache entries for {} tensors",
            c.of.len(),
            jobs.len()
        )));
    }
    let kind = caches.map_or(KvKind::Bf16, |c| c.kind);
    let mut hj = HnJobs {
        theta,
        eps,
        kind: kind as u32,
        ..HnJobs::default()
    };
    let mut h0 = 0u32;
    for (i, &(x, heads, d, w, rd, out)) in jobs.iter().enumerate() {
        if d == 0 || d > 256 || rd > d {
            return Err(bad(format!(
                "job {i}: head of {d} values with {rd} rotary dims (1..=256 values, rotary dims at most that)"
            )));
        }
        let heads = u32::try_from(heads)
            .ok()
            .filter(|&h| h.checked_add(h0).is_some())
            .ok_or_else(|| bad(format!("job {i}: {heads} heads overflow the grid")))?;
        let cw = caches.and_then(|c| c.of[i]);
        if let Some(cw) = cw {
            let nv = kind == KvKind::Nvfp4;
            if nv && !d.is_multiple_of(NVFP4_BLOCK) {
                return Err(bad(format!(
                    "job {i}: an NVFP4 cache head of {d} values is not a whole number of {NVFP4_BLOCK}-value blocks"
                )));
            }
            if nv != (cw.scales != 0) {
                return Err(bad(format!(
                    "job {i}: block scales pointer {:#x} for a {kind:?} cache (NVFP4 needs one, the others take none)",
                    cw.scales
                )));
            }
        }
        hj.j[i] = HnJob {
            x,
            w,
            out,
            cache: cw.map_or(0, |c| c.cache),
            scales: cw.map_or(0, |c| c.scales),
            heads,
            d: d as u32,
            rd: rd as u32,
            h0,
            cscale: cw.map_or(1.0, |c| c.scale),
            pad: 0,
        };
        h0 += heads;
        hj.n += 1;
    }
    Ok(hj)
}

/// Cache writes of up to 3 tensors of `t` rows (row `i` to slot
/// `slots[i]`) in one launch, every one of `kind`: bf16 bits, E4M3 codes of
/// `x / scale`, or NVFP4 blocks of 16 with `scale` the global (a thread a
/// block, bit-identical with `m3_core::kv::CacheTensor::write`).
pub(crate) fn cache_writes(
    l: &Launcher,
    f: &Func,
    jobs: &[CwSpec],
    t: usize,
    slots: u64,
    kind: KvKind,
) -> Result<()> {
    let cj = cache_write_jobs(jobs, kind)?;
    l.launch(
        "cache_write",
        f,
        (t as u32, cj.n, 1),
        128,
        0,
        &[Arg::pod(&cj), Arg::U64(slots)],
    )
}

/// The launch's job table, checked: at most 3 jobs (the kernel's table);
/// NVFP4 rows a whole number of 16-value blocks with block scales given,
/// the other kinds without; widths that fit the kernel's u32.
pub(crate) fn cache_write_jobs(jobs: &[CwSpec], kind: KvKind) -> Result<CwJobs> {
    let bad = |why: String| GpuError::input("cache_write", why);
    if jobs.is_empty() || jobs.len() > 3 {
        return Err(bad(format!(
            "{} cache writes in one launch (1..=3: K, V, index K)",
            jobs.len()
        )));
    }
    let mut cj = CwJobs::default();
    for (i, j) in jobs.iter().enumerate() {
        let width = u32::try_from(j.width)
            .map_err(|_| bad(format!("job {i}: width {} does not fit in u32", j.width)))?;
        let nv = kind == KvKind::Nvfp4;
        if nv && (j.width == 0 || !j.width.is_multiple_of(NVFP4_BLOCK)) {
            return Err(bad(format!(
                "job {i}: an NVFP4 cache row of {} values is not a whole number of {NVFP4_BLOCK}-value blocks",
                j.width
            )));
        }
        if nv != (j.scales != 0) {
            return Err(bad(format!(
                "job {i}: block scales pointer {:#x} for a {kind:?} cache (NVFP4 needs one, the others take none)",
                j.scales
            )));
        }
        cj.j[i] = CwJob {
            x: j.x,
            cache: j.cache,
            scales: j.scales,
            width,
            scale: j.scale,
            kind: kind as u32,
            pad: 0,
        };
        cj.n += 1;
    }
    Ok(cj)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{DevBuf, DevNorm};
    use crate::runtime::api::Gpu;

    /// SwiGLU-OAI as `m3s_swiglu` computes it (f32, then bf16), in f64.
    fn swiglu_f32(g: f32, u: f32, alpha: f32, limit: f32) -> f64 {
        let g = g.min(limit);
        let u = u.max(-limit).min(limit);
        let sg = 1.0 / (1.0 + (-(alpha * g)).exp());
        f64::from(m3_core::formats::bf16::to_f32(
            m3_core::formats::bf16::from_f32(((u + 1.0) * g) * sg),
        ))
    }

    #[test]
    fn the_swiglu_row_scale_bounds_every_output() {
        // the M3 family's alpha and limit, and others; scanning g and u over
        // and past the clamp, every output times p stays at most 2^14 (f16
        // holds it), and the bound is not loose by more than 4x
        for (alpha, limit) in [(1.702f32, 7.0f32), (1.0, 10.0), (4.0, 1.0), (0.5, 0.25)] {
            let pe = swiglu_row_pe(alpha, limit).unwrap();
            let p = 2f64.powi(pe as i32 - 127);
            let mut most = 0f64;
            for i in 0..=4000 {
                let g = -40.0 + 80.0 * i as f32 / 4000.0;
                for u in [
                    -limit - 3.0,
                    -limit,
                    -1.0,
                    0.0,
                    limit * 0.5,
                    limit,
                    limit + 5.0,
                ] {
                    most = most.max(swiglu_f32(g, u, alpha, limit).abs());
                }
            }
            assert!(
                most * p <= 16384.0,
                "alpha {alpha} limit {limit}: {most} x 2^{}",
                pe as i32 - 127
            );
            assert!(
                most * p > 4096.0,
                "alpha {alpha} limit {limit}: {most} x 2^{}",
                pe as i32 - 127
            );
        }
        // no bound without a finite clamp or a positive alpha
        assert_eq!(swiglu_row_pe(1.702, f32::INFINITY), None);
        assert_eq!(swiglu_row_pe(0.0, 7.0), None);
        assert_eq!(swiglu_row_pe(f32::NAN, 7.0), None);
    }

    /// Row r of an f16-layout buffer (`super::super::linear::xh_stride`):
    /// its values decoded (f16 times the block's 2^(byte - 127)) and its
    /// exponent bytes.
    fn xh_row(xh: &[u8], r: usize, k: usize) -> (Vec<f64>, Vec<u8>) {
        let row = &xh[r * super::super::linear::xh_stride(k)..];
        let bytes = row[2 * k..2 * k + k / 32].to_vec();
        let vals = (0..k)
            .map(|i| {
                let d = super::super::linear::xh_slot(i);
                let h = half::f16::from_bits(u16::from_le_bytes([row[2 * d], row[2 * d + 1]]));
                f64::from(h.to_f32()) * 2f64.powi(i32::from(bytes[i / 32]) - 127)
            })
            .collect();
        (vals, bytes)
    }

    /// Rows written row-scaled: one exponent byte a row, every value the
    /// bf16 output rounded to f16 once scaled (so exactly that output where
    /// the scaled value is an f16 normal, bf16's 8 bits fitting; rounded to
    /// f16's subnormal grid below, as SwiGLU's far negative tail is), none
    /// past f16's range. Count of values off.
    fn row_scaled_off(xh: &[u8], out: &[u16], rows: usize, k: usize) -> usize {
        let mut off = 0;
        for r in 0..rows {
            let (vals, bytes) = xh_row(xh, r, k);
            off += bytes.iter().filter(|&&b| b != bytes[0]).count();
            let p = 2f64.powi(127 - i32::from(bytes[0]));
            for (i, v) in vals.iter().enumerate() {
                let want = f64::from(m3_core::formats::bf16::to_f32(out[r * k + i]));
                let rounded = f64::from(half::f16::from_f64(want * p).to_f32()) / p;
                if *v != rounded || (v * p).abs() > 16384.0 {
                    off += 1;
                }
            }
        }
        off
    }

    /// A producer's bf16 rows and their f16-layout copy, after a sync.
    fn read_back(
        l: &Launcher,
        out: &DevBuf,
        xh: &DevBuf,
        rows: usize,
        k: usize,
    ) -> (Vec<u16>, Vec<u8>) {
        l.sync().unwrap();
        let mut o = vec![0u16; rows * k];
        out.read(l.stream(), 0, &mut o).unwrap();
        let mut h = vec![0u8; rows * super::super::linear::xh_stride(k)];
        xh.read(l.stream(), 0, &mut h).unwrap();
        (o, h)
    }

    #[test]
    fn producers_write_row_scaled_f16_rows() {
        let Some(gpu) = super::super::test_gpu() else {
            return;
        };
        let st = &super::super::STANDARD;
        let (fr, fs) = (
            gpu.kernel(st, "m3s_rmsnorm").unwrap(),
            gpu.kernel(st, "m3s_swiglu").unwrap(),
        );
        let l = Launcher::new(gpu.device(), true).unwrap();
        let ctx = gpu.device();
        let mut rng = super::super::TestRng(23);
        // RMSNorm: rows of very different magnitude, 1 + w over [-0.5, 2.5];
        // n past 8192 takes the kernel's tail loop
        for n in [2048usize, 8320] {
            let rows = 3;
            let x: Vec<f32> = (0..rows * n)
                .map(|i| rng.unit() * [1e-3f32, 1.0, 3e3][i / n])
                .collect();
            let w: Vec<f32> = (0..n).map(|_| 1.5 * rng.unit()).collect();
            let (xd, wd) = (
                DevBuf::from_slice(ctx, &x).unwrap(),
                DevNorm::new(ctx, &w).unwrap(),
            );
            let out = DevBuf::zeroed(ctx, 2 * rows * n).unwrap();
            let xh = DevBuf::zeroed(ctx, rows * super::super::linear::xh_stride(n)).unwrap();
            rmsnorm(
                &l,
                &RmsNormFuncs {
                    plain: &fr,
                    mix: None,
                },
                xd.ptr(),
                0,
                wd.ptr(),
                1e-6,
                n,
                out.ptr(),
                xh.ptr(),
                wd.xrow_arg(true),
                rows,
                None,
            )
            .unwrap();
            let (o, h) = read_back(&l, &out, &xh, rows, n);
            assert_eq!(row_scaled_off(&h, &o, rows, n), 0, "rmsnorm n {n}");
            // the check sees a planted one-bit error in a value
            let mut bad = h.clone();
            bad[2 * 37] ^= 0x04;
            assert!(row_scaled_off(&bad, &o, rows, n) > 0);
        }
        // SwiGLU: g, u over and past the clamp, rows of 1536
        let (k, rows) = (1536usize, 4usize);
        let g: Vec<u16> = (0..rows * k)
            .map(|_| m3_core::formats::bf16::from_f32(12.0 * rng.unit()))
            .collect();
        let u: Vec<u16> = (0..rows * k)
            .map(|_| m3_core::formats::bf16::from_f32(12.0 * rng.unit()))
            .collect();
        let (gd, ud) = (
            DevBuf::from_slice(ctx, &g).unwrap(),
            DevBuf::from_slice(ctx, &u).unwrap(),
        );
        let out = DevBuf::zeroed(ctx, 2 * rows * k).unwrap();
        let xh = DevBuf::zeroed(ctx, rows * super::super::linear::xh_stride(k)).unwrap();
        swiglu(
            &l,
            &fs,
            gd.ptr(),
            ud.ptr(),
            1.702,
            7.0,
            out.ptr(),
            rows * k,
            xh.ptr(),
            k,
            swiglu_row_pe(1.702, 7.0).unwrap(),
        )
        .unwrap();
        let (o, h) = read_back(&l, &out, &xh, rows, k);
        assert_eq!(row_scaled_off(&h, &o, rows, k), 0, "swiglu");
        let pe = swiglu_row_pe(1.702, 7.0).unwrap();
        assert_eq!(u32::from(xh_row(&h, 2, k).1[5]), 254 - pe);
    }

    #[test]
    fn rmsnorm_block_is_the_kernels() {
        let want = format!("#define S_NORM_BLOCK {RMSNORM_BLOCK}\n");
        assert!(super::super::STANDARD.body.contains(&want));
    }

    #[test]
    fn job_tables_have_the_kernel_layout() {
        // SHnJob: 5 u64 + 4 u32 + f32 + u32; SHnJobs: 6 of them, f64, f32,
        // 3 u32.
        assert_eq!(std::mem::size_of::<HnJob>(), 64);
        assert_eq!(std::mem::size_of::<HnJobs>(), HN_MAX_JOBS * 64 + 24);
        // SCwJob: 3 u64 + u32, f32, u32, u32; SCwJobs: 3 of them + 2 u32.
        assert_eq!(std::mem::size_of::<CwJob>(), 40);
        assert_eq!(std::mem::size_of::<CwJobs>(), 3 * 40 + 8);
        // and the kernel's struct has the fields in this order
        let body = super::super::STANDARD.body;
        assert!(body.contains(
            "struct SHnJob {\n  u64 x, w, out, cache, scales;\n  u32 heads, d, rd, h0;\n  float cscale;\n  u32 pad;\n};\nstruct SHnJobs {\n  SHnJob j[6];\n  double theta;\n  float eps;\n  u32 n, kind, pad;\n};"
        ));
        assert_eq!(HN_MAX_JOBS, 6);
        assert!(body.contains(
            "struct SCwJob {\n  u64 x, cache, scales;\n  u32 width;\n  float scale;\n  u32 kind, pad;\n};"
        ));
    }

    fn job(width: usize, scales: u64) -> CwSpec {
        CwSpec {
            x: 256,
            width,
            scale: 0.25,
            cache: 512,
            scales,
        }
    }

    #[test]
    fn head_norm_jobs_are_checked() {
        // control: m3.1's q, k (cached), v (cached, no norm), index q, index
        // k (cached) in each kind
        let cache = |sc| {
            Some(HnCache {
                cache: 4096,
                scales: sc,
                scale: 0.5,
            })
        };
        let jobs: [HnSpec; 5] = [
            (256, 64, 128, 8, 64, 512),
            (256, 4, 128, 8, 64, 512),
            (256, 4, 128, 0, 0, 0),
            (256, 4, 128, 8, 64, 512),
            (256, 1, 128, 8, 64, 512),
        ];
        let ok = |kind, sc| {
            let of = [None, cache(sc), cache(sc), None, cache(sc)];
            hn_jobs(
                &jobs,
                Some(HnCaches {
                    of: &of,
                    kind,
                    slots: 64,
                }),
                1e4,
                1e-6,
            )
        };
        let hj = ok(KvKind::Nvfp4, 1024).unwrap();
        assert_eq!((hj.n, hj.kind), (5, KvKind::Nvfp4 as u32));
        assert_eq!(hj.j[4].h0, 64 + 4 + 4 + 4);
        assert_eq!(
            (hj.j[0].cache, hj.j[1].cache, hj.j[2].scales),
            (0, 4096, 1024)
        );
        assert_eq!(hj.j[2].w, 0);
        assert!(ok(KvKind::Fp8, 0).is_ok());
        assert!(ok(KvKind::Bf16, 0).is_ok());
        assert!(hn_jobs(&jobs[..2], None, 1e4, 1e-6).is_ok_and(|h| h.j[1].cache == 0));
        let j = |d: usize, rd: usize| -> HnSpec { (256, 4, d, 8, rd, 512) };
        let one = [cache(0)];
        let one_nv = [cache(1024)];
        let c = |of, kind| {
            Some(HnCaches {
                of,
                kind,
                slots: 64,
            })
        };
        let bad: [(&[HnSpec], Option<HnCaches>, &str); 7] = [
            (&[], None, "0 tensors"),
            (&[j(128, 64); 7], None, "7 tensors"),
            (&[j(512, 64)], None, "512 values"),
            (&[j(128, 130)], None, "130 rotary"),
            (&[j(40, 0)], c(&one_nv, KvKind::Nvfp4), "40 values is not"),
            (&[j(128, 64)], c(&one, KvKind::Nvfp4), "needs one"),
            (
                &[j(128, 64), j(128, 64)],
                c(&one, KvKind::Fp8),
                "1 cache entries for 2",
            ),
        ];
        for (i, (jobs, caches, what)) in bad.iter().enumerate() {
            let e = hn_jobs(jobs, *caches, 1e4, 1e-6)
                .err()
                .map(|e| e.to_string());
            assert!(
                e.as_deref()
                    .is_some_and(|e| e.contains(what) && e.contains("headnorm_rope")),
                "case {i}: {e:?}"
            );
        }
    }

    #[test]
    fn cache_write_jobs_are_checked() {
        // control: K, V, index K of m3.1 in each kind
        let ok = |kind, sc| {
            let j = [job(512, sc), job(512, sc), job(128, sc)];
            cache_write_jobs(&j, kind)
        };
        let cj = ok(KvKind::Nvfp4, 1024).unwrap();
        assert_eq!(cj.n, 3);
        assert_eq!(cj.j[2].width, 128);
        assert_eq!(cj.j[0].kind, KvKind::Nvfp4 as u32);
        assert_eq!(cj.j[1].scales, 1024);
        assert!(ok(KvKind::Fp8, 0).is_ok());
        assert!(ok(KvKind::Bf16, 0).is_ok());
        let bad: [(&[CwSpec], KvKind, &str); 7] = [
            (&[], KvKind::Fp8, "0 cache writes"),
            (&[job(64, 0); 4], KvKind::Fp8, "4 cache writes"),
            (&[job(40, 1024)], KvKind::Nvfp4, "40 values"),
            (&[job(0, 1024)], KvKind::Nvfp4, "0 values"),
            (&[job(64, 0)], KvKind::Nvfp4, "needs one"),
            (&[job(64, 0), job(64, 1024)], KvKind::Fp8, "job 1"),
            (&[job(1 << 33, 0)], KvKind::Bf16, "does not fit"),
        ];
        for (i, (jobs, kind, what)) in bad.iter().enumerate() {
            let e = cache_write_jobs(jobs, *kind).err().map(|e| e.to_string());
            assert!(
                e.as_deref()
                    .is_some_and(|e| e.contains(what) && e.contains("cache_write")),
                "case {i}: {e:?}"
            );
        }
    }
}
