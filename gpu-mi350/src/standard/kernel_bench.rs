//! The linear-kernel microbench (`m3 bench --backend gpu --kernels`): the
//! tensor-core linear alone, per weight format, at decode row counts, on
//! weights far larger than L2, so a figure is the kernel's own streaming
//! rate and not the step's.
//!
//! Two kinds of case, each captured into a CUDA graph and timed over graph
//! replays (one event pair each):
//! * **plain**: a stack of `stack` separate `[n, k]` matrices, one launch
//!   each (the shape of a layer's dense linears), `rows` x rows;
//! * **experts**: the fused gate+up launch of routed experts (two stacks of
//!   `experts` matrices `[expert_n, k]`) on a route of `rows x top_k` pairs
//!   spread over `distinct` experts, each read once.
//!
//! Bytes are the stored bytes the launch must read (codes + scales of every
//! matrix it touches); x and the outputs are not counted.
//!
//! `l2` adds, after each experts case, the same launch with every slot
//! routed to expert 0 (labelled `L2-fed`): one gate + up pair, read once
//! from memory and then from L2 by every other slot, so its GB/s (bytes
//! counted per slot, as above) is the kernel's own rate with the bus out of
//! the way, and may pass 100% of the memory ceiling. Keep the pair well
//! under L2 (`expert_n` small) for that reading to hold.
//!
//! `reps` > 1 captures each case that many times back to back in its graph
//! and reports a replay's time divided by it: the launch's own latency
//! (graph launch, the first CTAs' ramp, the last wave's tail) is then
//! spread as it is in a step of many launches, where PDL overlaps each
//! launch's start with the one before. With `reps` 1 a sample is one
//! launch between two events, latency included. Cases must stay far past
//! L2 for that to measure memory: each rep reads the same weights.
//!
//! Every case is checked before it is timed: sampled outputs (f32 stores)
//! against an f64 sum of the same exactly dequantized weights (downloaded
//! and put back in the stored layout) times the same bf16 x, within
//! [`CHECK_TOL`] of the sum of absolute products; and the comparison is
//! shown to fail on a planted one-code error.

use m3_core::formats::{bf16, MxElem, MxTensor, Nvfp4Tensor};

use super::graphs::{GraphKey, Graphs};
use super::launch::Launcher;
use super::linear::{
    linears, row_scaled_xh, x_f16, xh_stride, LinOut, LinX, LinearKernels, MmaVariant, Route, F16X,
    SMALL_STEP_VARIANT,
};
use super::STANDARD;
use crate::error::{GpuError, Result};
use crate::model::generated::Gen;
use crate::model::{layout, DevBuf, DevLinear, WFmt};
use crate::runtime::api::{Device, Gpu};

/// Largest accepted `|y - ref| / sum |w x|` of a checked output: products
/// are exact (bf16 x times exactly dequantized weights) and only the f32
/// summation order differs, worth ~log2(K) f32 ulps (~1e-6); one wrong code
/// moves an output by ~1/K of the sum (1.6e-4 at K = 6144).
pub const CHECK_TOL: f64 = 1.0 / 65536.0;
/// Output features checked per case (spread over the matrix).
const CHECKED_FEATURES: usize = 64;

/// What to run.
#[derive(Clone, Debug)]
pub struct KernelBenchSpec {
    pub formats: Vec<WFmt>,
    /// x rows of each case.
    pub rows: Vec<usize>,
    /// Plain stack: `stack` matrices of `[n, k]`.
    pub n: usize,
    pub k: usize,
    pub stack: usize,
    /// Experts: `experts` matrices of `[expert_n, k]` in each of the gate
    /// and up stacks; each case routes `rows * top_k` pairs over each
    /// `distinct` count of experts.
    pub experts: usize,
    pub expert_n: usize,
    pub top_k: usize,
    pub distinct: Vec<usize>,
    /// Also time each experts case L2-fed (module doc).
    pub l2: bool,
    pub iters: usize,
    /// Launches of a case per graph replay (module doc); 1 = one.
    pub reps: usize,
    /// Extra compiled variants of the tensor-core kernels
    /// (`NAME=VALUE ...`), timed beside the defaults.
    pub variants: Vec<String>,
}

/// One timed case.
#[derive(Clone, Debug)]
pub struct KernelRow {
    pub case: String,
    pub fmt: WFmt,
    pub rows: usize,
    pub variant: String,
    /// Stored weight bytes one replay reads.
    pub bytes: u64,
    /// Per launch of the case (a replay's time / `reps`).
    pub samples_ms: Vec<f64>,
    /// Outputs checked and the worst `|y - ref| / sum |w x|`.
    pub checked: usize,
    pub worst: f64,
}

/// Stored-layout parts of one matrix, downloaded.
struct HostMatrix {
    fmt: WFmt,
    cols: usize,
    codes: Vec<u8>,
    scales: Vec<u8>,
    global: f32,
}

impl HostMatrix {
    fn download(l: &Launcher, w: &DevLinear, i: usize) -> Result<Self> {
        let (cs, ss) = w.strides();
        let mut codes = vec![0u8; cs as usize];
        w.codes.read(l.stream(), i * cs as usize, &mut codes)?;
        let codes = layout::from_device(w.fmt, &codes, w.cols, w.rows).into_owned();
        let mut scales = vec![0u8; ss as usize];
        if let Some(s) = &w.scales {
            s.read(l.stream(), i * ss as usize, &mut scales)?;
        }
        let mut global = [1.0f32];
        if let Some(g) = &w.globals {
            g.read(l.stream(), 4 * i, &mut global)?;
        }
        Ok(HostMatrix {
            fmt: w.fmt,
            cols: w.cols,
            codes,
            scales,
            global: global[0],
        })
    }

    /// Row `r`, exactly dequantized (NVFP4: the global scale applied after
    /// the block products, as the kernel's epilogue does: returned apart).
    fn row(&self, r: usize) -> Result<(Vec<f64>, f64)> {
        let k = self.cols;
        let bad = |e: m3_core::formats::FormatError| GpuError::input("kernel bench", e.to_string());
        let mx = |elem: MxElem, per: usize| -> Result<Vec<f64>> {
            let cb = elem.packed_len(k);
            let t = MxTensor::from_parts(
                elem,
                1,
                k,
                self.codes[r * cb..(r + 1) * cb].to_vec(),
                self.scales[r * k / per..(r + 1) * k / per].to_vec(),
            )
            .map_err(bad)?;
            let mut out = vec![0f32; k];
            t.dequantize_row(0, &mut out);
            Ok(out.into_iter().map(f64::from).collect())
        };
        Ok(match self.fmt {
            WFmt::Bf16 => (
                self.codes[2 * r * k..2 * (r + 1) * k]
                    .chunks_exact(2)
                    .map(|b| f64::from(bf16::to_f32(u16::from_le_bytes([b[0], b[1]]))))
                    .collect(),
                1.0,
            ),
            WFmt::Mxfp8E4M3 => (mx(MxElem::Fp8E4M3, 32)?, 1.0),
            WFmt::Mxfp8E5M2 => (mx(MxElem::Fp8E5M2, 32)?, 1.0),
            WFmt::Mxfp4 => (mx(MxElem::Fp4E2M1, 32)?, 1.0),
            WFmt::Nvfp4 => {
                let t = Nvfp4Tensor::from_parts(
                    1,
                    k,
                    self.codes[r * k / 2..(r + 1) * k / 2].to_vec(),
                    self.scales[r * k / 16..(r + 1) * k / 16].to_vec(),
                    1.0,
                )
                .map_err(bad)?;
                let mut out = vec![0f64; k];
                t.row_f64(0, &mut out);
                (out, f64::from(self.global))
            }
            WFmt::F32 | WFmt::Ptpc => {
                return Err(GpuError::input(
                    "kernel bench",
                    format!("{:?} weights", self.fmt),
                ))
            }
        })
    }
}

/// `|y - ref| / sum |w x|` of output feature `o` for x row `x` (bf16 bits).
fn rel_err(w: &[f64], global: f64, x: &[u16], y: f32) -> f64 {
    let (mut s, mut a) = (0f64, 0f64);
    for (wi, &xi) in w.iter().zip(x) {
        let p = wi * f64::from(bf16::to_f32(xi));
        s += p;
        a += p.abs();
    }
    let want = s * global;
    let scale = (a * global.abs()).max(f64::MIN_POSITIVE);
    if !y.is_finite() {
        return f64::INFINITY;
    }
    (f64::from(y) - want).abs() / scale
}

/// Generate a stack with codes covering the format's finite values
/// (subnormals included) and one scale byte per matrix near real weights'.
fn gen_stack(
    g: &Gen,
    fmt: WFmt,
    rows: usize,
    cols: usize,
    count: usize,
    tid: &mut u32,
) -> Result<DevLinear> {
    let w = DevLinear::alloc(g.context(), fmt, rows, cols, count)?;
    let seed = 0x6b62u64;
    *tid += 1;
    match fmt {
        WFmt::Bf16 => g.bf16(&w.codes, seed, *tid, 118)?,
        WFmt::Mxfp4 | WFmt::Nvfp4 => g.bytes(&w.codes, seed, *tid, 0xff, 0)?,
        // every exponent, no NaN (0x7f & 0xfe = 0x7e)
        WFmt::Mxfp8E4M3 => g.bytes(&w.codes, seed, *tid, 0xfe, 0)?,
        // exponents 0..15 (subnormals too), no Inf / NaN
        WFmt::Mxfp8E5M2 => g.bytes(&w.codes, seed, *tid, 0xbf, 0)?,
        WFmt::F32 | WFmt::Ptpc => {
            return Err(GpuError::input("kernel bench", format!("{fmt:?} weights")))
        }
    }
    if let Some(s) = &w.scales {
        *tid += 1;
        match fmt {
            // positive E4M3 scales, exponent field 0..7 (subnormals too)
            WFmt::Nvfp4 => g.bytes(s, seed, *tid, 0x3f, 0)?,
            _ => g.bytes(s, seed, *tid, 0x03, 116)?,
        }
    }
    if let Some(gl) = &w.globals {
        let v: Vec<f32> = (0..count).map(|i| 2f32.powi(-8 - (i % 3) as i32)).collect();
        gl.write_sync(0, bytemuck::cast_slice(&v))?;
    }
    Ok(w)
}

/// A kernel variant's launches for one case.
struct Ctx<'a> {
    l: &'a Launcher,
    kern: &'a LinearKernels,
    ctx: Device,
}

/// Time `iters` replays of `enqueue` `reps` times over, captured as one
/// graph (after a capture and three warm-up replays): ms a replay / reps.
fn time(
    c: &Ctx<'_>,
    graphs: &mut Graphs,
    key: GraphKey,
    iters: usize,
    reps: usize,
    enqueue: &dyn Fn() -> Result<()>,
) -> Result<Vec<f64>> {
    let all = || -> Result<()> {
        for _ in 0..reps {
            enqueue()?;
        }
        Ok(())
    };
    for _ in 0..4 {
        graphs.run(c.l, key, all)?;
    }
    let v = c.l.time_each(iters, || graphs.run(c.l, key, all))?;
    Ok(v.into_iter().map(|ms| ms / reps as f64).collect())
}

/// Run the microbench; `report` sees each row as it is measured.
pub fn kernel_bench(
    gpu: &dyn Gpu,
    spec: &KernelBenchSpec,
    report: &mut dyn FnMut(&KernelRow),
) -> Result<Vec<KernelRow>> {
    let bad = |why: String| GpuError::input("kernel bench", why);
    if spec.k == 0 || !spec.k.is_multiple_of(32) || spec.n == 0 || spec.expert_n == 0 {
        return Err(bad(format!(
            "shapes n {} x k {} (k a multiple of 32), expert n {}",
            spec.n, spec.k, spec.expert_n
        )));
    }
    let max_rows = spec.rows.iter().copied().max().unwrap_or(0);
    if max_rows == 0 || spec.rows.contains(&0) || spec.iters == 0 || spec.reps == 0 {
        return Err(bad("rows, iters and reps must be positive".into()));
    }
    if spec.top_k > spec.experts {
        return Err(bad(format!(
            "top-k {} past the {} experts (a row picks each expert once)",
            spec.top_k, spec.experts
        )));
    }
    if spec.distinct.iter().any(|&d| d == 0 || d > spec.experts) {
        return Err(bad(format!(
            "distinct expert counts {:?} must be in 1..={}",
            spec.distinct, spec.experts
        )));
    }
    let ctx = gpu.device().clone();
    let l = Launcher::new(&ctx, gpu.pdl())?;
    let mut kern = LinearKernels {
        mma: vec![
            MmaVariant::load(gpu, &STANDARD, "")?,
            MmaVariant::load(gpu, &STANDARD, SMALL_STEP_VARIANT)?,
        ],
        f32w: gpu.kernel(&STANDARD, "m3s_linear_f32w")?,
        x_f16: gpu.kernel(&STANDARD, "m3s_x_f16")?,
    };
    for v in &spec.variants {
        kern.mma.push(MmaVariant::load(gpu, &STANDARD, v)?);
    }
    let c = Ctx {
        l: &l,
        kern: &kern,
        ctx: ctx.clone(),
    };
    let g = Gen::new(gpu)?;
    let mut tid = 0u32;
    // x: the largest case's rows (pairs for experts: rows * top_k of them
    // point into these rows), bf16 values in [2^-9, 2^-7) of random sign
    let x = DevBuf::new(&ctx, 2 * max_rows * spec.k)?;
    g.bf16(&x, 0x78, 1, 118)?;
    // f32 outputs: the plain case's rows x n, the experts' pairs x expert_n
    let ybytes = max_rows
        .checked_mul(spec.top_k.max(1))
        .and_then(|p| p.checked_mul(spec.expert_n))
        .map(|e| e.max(max_rows * spec.n))
        .and_then(|v| v.checked_mul(4))
        .ok_or_else(|| bad("rows x top-k x expert rows overflow".into()))?;
    let y = DevBuf::zeroed(&ctx, ybytes)?;
    let y2 = DevBuf::zeroed(&ctx, ybytes)?;
    // every check launch writes over NaN in y (the checked output), so an
    // output it skipped fails the check instead of passing on the case
    // before's value
    let nan = vec![0xffu8; ybytes];
    let poison = || y.write_sync(0, &nan);
    g.sync()?;
    let mut xh = vec![0u16; max_rows * spec.k];
    x.read(l.stream(), 0, &mut xh)?;
    // the MX kernels' f16 x, made once outside the timed launches (in a
    // step it is one small launch per distinct x: `m3s_x_f16`)
    let xf = DevBuf::new(&ctx, max_rows * xh_stride(spec.k))?;
    let f16 = x_f16(&l, &kern.x_f16, x.ptr(), max_rows, spec.k, &xf)?;
    let lx = LinX {
        x: x.ptr(),
        ptpc: None,
        f16: Some(f16),
    };
    // the same x row-scaled (what RMSNorm and SwiGLU write in a step,
    // `F16X::row_scaled`): timed beside the per-block form on the builds
    // with the fast walk (the small-step shape), labelled `x/row`
    let xr = DevBuf::from_slice(&ctx, &row_scaled_xh(&xh, max_rows, spec.k))?;
    let lx_row = LinX {
        f16: Some(F16X {
            rows: xr.ptr(),
            row_scaled: true,
        }),
        ..lx
    };
    let forms = |fmt: WFmt| -> Vec<(usize, LinX, String)> {
        let mut f = Vec::new();
        for (v, mv) in kern.mma.iter().enumerate() {
            f.push((v, lx, mv.label.clone()));
            if fmt.f16_x() && mv.rows <= 16 {
                f.push((v, lx_row, format!("{} x/row", mv.label)));
            }
        }
        f
    };
    let mut out = Vec::new();
    let mut graphs = Graphs::new(usize::MAX);
    let mut key_n = 0usize;
    let mut planted_checked = false;
    for &fmt in &spec.formats {
        if fmt.mma_kernel().is_none() {
            return Err(bad(format!("{fmt:?} has no tensor-core kernel")));
        }
        // ---- plain stack -------------------------------------------------
        let mats: Vec<DevLinear> = (0..spec.stack.max(1))
            .map(|_| gen_stack(&g, fmt, spec.n, spec.k, 1, &mut tid))
            .collect::<Result<_>>()?;
        g.sync()?;
        let host0 = HostMatrix::download(&l, &mats[0], 0)?;
        let stack_bytes: u64 = mats.iter().map(|m| m.bytes() as u64).sum();
        for &m in &spec.rows {
            for (v, lx, label) in forms(fmt) {
                // check: matrix 0 alone, f32 out
                poison()?;
                linears(
                    c.l,
                    c.kern,
                    v,
                    &[(&mats[0], LinOut::F32(y.ptr()))],
                    lx,
                    m,
                    None,
                    m,
                )?;
                l.sync()?;
                let mut yh = vec![0f32; m * spec.n];
                y.read(l.stream(), 0, &mut yh)?;
                let rows: Vec<(usize, usize)> = (0..m).map(|r| (r, r)).collect();
                let what = format!("plain, {m} rows, variant `{label}`");
                let (checked, worst) = check(&host0, &xh, &yh, &rows, spec.k, spec.n, &what)?;
                if !planted_checked {
                    planted_self_check(&host0, &xh, &yh, spec.k)?;
                    planted_checked = true;
                }
                let enqueue = || -> Result<()> {
                    for w in &mats {
                        linears(c.l, c.kern, v, &[(w, LinOut::F32(y.ptr()))], lx, m, None, m)?;
                    }
                    Ok(())
                };
                key_n += 1;
                let key = GraphKey {
                    rows: key_n,
                    logits_rows: 0,
                    variant: v,
                    mono: false,
                };
                let samples_ms = time(&c, &mut graphs, key, spec.iters, spec.reps, &enqueue)?;
                let row = KernelRow {
                    case: format!("{} x [{}, {}] m{m}", mats.len(), spec.n, spec.k),
                    fmt,
                    rows: m,
                    variant: label,
                    bytes: stack_bytes,
                    samples_ms,
                    checked,
                    worst,
                };
                report(&row);
                out.push(row);
            }
        }
        drop(mats);
        graphs.clear();
        // ---- routed experts (gate + up fused) ------------------------------
        if spec.distinct.is_empty() {
            continue;
        }
        let gate = gen_stack(&g, fmt, spec.expert_n, spec.k, spec.experts, &mut tid)?;
        let up = gen_stack(&g, fmt, spec.expert_n, spec.k, spec.experts, &mut tid)?;
        g.sync()?;
        // every route's slot 0 is expert 0 (`route`): the checked matrix
        let host_g = HostMatrix::download(&l, &gate, 0)?;
        for &m in &spec.rows {
            let pairs = m * spec.top_k.max(1);
            let mut ds: Vec<usize> = spec.distinct.iter().map(|&d| d.min(pairs)).collect();
            ds.dedup();
            let fed: &[bool] = if spec.l2 { &[false, true] } else { &[false] };
            // one distinct expert is expert 0 already: no second, L2-fed case
            for (d, alias) in ds
                .into_iter()
                .flat_map(|d| fed.iter().map(move |&a| (d, a)))
                .filter(|&(d, alias)| !(alias && d == 1))
            {
                let (table, slots, routed) =
                    route(&c, spec.experts, d, m, spec.top_k.max(1), alias)?;
                let per_expert = gate.matrix_bytes() as u64 * 2;
                for (v, lx, label) in forms(fmt) {
                    let mats = [(&gate, LinOut::F32(y.ptr())), (&up, LinOut::F32(y2.ptr()))];
                    let r = Some(Route {
                        table: table.ptr(),
                        slots,
                        xdiv: spec.top_k.max(1),
                        x_rows: m,
                        chunk: 0,
                    });
                    poison()?;
                    linears(c.l, c.kern, v, &mats, lx, m, r, m)?;
                    l.sync()?;
                    let mut yh = vec![0f32; pairs * spec.expert_n];
                    y.read(l.stream(), 0, &mut yh)?;
                    // the pairs of every slot routed to expert 0 (slot 0's;
                    // all of them when L2-fed): output row = pair id, x row
                    // = pair / top_k
                    let top_k = spec.top_k.max(1);
                    let rows: Vec<(usize, usize)> = routed
                        .iter()
                        .filter(|(e, _)| *e == 0)
                        .flat_map(|(_, ps)| ps.iter().map(|&p| (p / top_k, p)))
                        .collect();
                    let what = format!("experts, {m} rows, variant `{label}`");
                    let (checked, worst) =
                        check(&host_g, &xh, &yh, &rows, spec.k, spec.expert_n, &what)?;
                    let enqueue = || linears(c.l, c.kern, v, &mats, lx, m, r, m);
                    key_n += 1;
                    let key = GraphKey {
                        rows: key_n,
                        logits_rows: 0,
                        variant: v,
                        mono: false,
                    };
                    let samples_ms = time(&c, &mut graphs, key, spec.iters, spec.reps, &enqueue)?;
                    let row = KernelRow {
                        case: format!(
                            "experts gate+up {d} of {} x 2 x [{}, {}] m{m}{}",
                            spec.experts,
                            spec.expert_n,
                            spec.k,
                            if alias {
                                format!(
                                    " L2-fed (every slot expert 0: {:.1} MB a gate + up pair)",
                                    per_expert as f64 / 1e6
                                )
                            } else {
                                String::new()
                            }
                        ),
                        fmt,
                        rows: m,
                        variant: label,
                        bytes: per_expert * d as u64,
                        samples_ms,
                        checked,
                        worst,
                    };
                    report(&row);
                    out.push(row);
                }
            }
        }
        graphs.clear();
    }
    drop(c);
    Ok(out)
}

/// The route of `m` rows choosing `top_k` experts each, `distinct` experts
/// in all (pair p goes to expert slot p % distinct; experts spread over the
/// stack, so slot 0's is expert 0; `alias`: every slot names expert 0,
/// the L2-fed case): (device records, slots, each slot's (expert, pair
/// ids)).
#[allow(clippy::type_complexity)]
fn route(
    c: &Ctx<'_>,
    experts: usize,
    distinct: usize,
    m: usize,
    top_k: usize,
    alias: bool,
) -> Result<(DevBuf, usize, Vec<(usize, Vec<usize>)>)> {
    let stride = 2 + m;
    let mut rec = vec![0i32; distinct * stride];
    let mut routed = Vec::with_capacity(distinct);
    for s in 0..distinct {
        let e = if alias { 0 } else { s * (experts / distinct) };
        let ps: Vec<usize> = (0..m * top_k).filter(|p| p % distinct == s).collect();
        // a row may pick an expert once: keep the first pair of each row
        let mut seen = std::collections::BTreeSet::new();
        let ps: Vec<usize> = ps.into_iter().filter(|p| seen.insert(p / top_k)).collect();
        rec[s * stride] = e as i32;
        rec[s * stride + 1] = ps.len() as i32;
        for (i, &p) in ps.iter().enumerate() {
            rec[s * stride + 2 + i] = p as i32;
        }
        routed.push((e, ps));
    }
    Ok((DevBuf::from_slice(&c.ctx, &rec)?, distinct, routed))
}

/// The features checked: spread over `n`.
fn features(n: usize) -> impl Iterator<Item = usize> {
    let step = (n / CHECKED_FEATURES).max(1);
    (0..n).step_by(step).take(CHECKED_FEATURES)
}

/// Check the outputs `yh[out * n + o]` for sampled features `o` against
/// matrix `w` on x rows `xh[x * k..]`, over `(x row, output row)` pairs.
fn check(
    w: &HostMatrix,
    xh: &[u16],
    yh: &[f32],
    rows: &[(usize, usize)],
    k: usize,
    n: usize,
    what: &str,
) -> Result<(usize, f64)> {
    let mut worst = 0f64;
    let mut checked = 0;
    // the first output at the worst error: (output row, feature, value)
    let mut at = (0usize, 0usize, 0f32);
    for o in features(n) {
        let (row, global) = w.row(o)?;
        for &(x, out) in rows {
            let y = yh[out * n + o];
            let e = rel_err(&row, global, &xh[x * k..(x + 1) * k], y);
            // f64::max drops a NaN: keep it, so fail_if sees it
            if !worst.is_nan() && (e.is_nan() || e > worst) {
                at = (out, o, y);
            }
            worst = if e.is_nan() || worst.is_nan() {
                f64::NAN
            } else {
                worst.max(e)
            };
            checked += 1;
        }
    }
    let (out, o, y) = at;
    fail_if(
        worst,
        checked,
        w.fmt,
        &format!("{what} (output row {out}, feature {o}: {y:e})"),
    )
}

fn fail_if(worst: f64, checked: usize, fmt: WFmt, what: &str) -> Result<(usize, f64)> {
    if worst.is_nan() || worst > CHECK_TOL {
        return Err(GpuError::input(
            "kernel bench",
            format!(
                "{fmt:?} {what}: an output is off the f64 reference by {worst:.3e} of its absolute sum (tolerance {CHECK_TOL:.1e}, {checked} outputs)"
            ),
        ));
    }
    Ok((checked, worst))
}

/// The check must catch one wrong code: row 0's largest product (|w x|)
/// with its weight's sign flipped moves output 0 by twice that product, at
/// least 2 / k of the absolute sum the tolerance is a fraction of (a fixed
/// code could sit in a block of tiny scale and move it by less).
fn planted_self_check(w: &HostMatrix, xh: &[u16], yh: &[f32], k: usize) -> Result<()> {
    let mut bent = HostMatrix {
        codes: w.codes.clone(),
        scales: w.scales.clone(),
        ..*w
    };
    let (row0, _) = w.row(0)?;
    let v = (0..k)
        .filter(|&v| (row0[v] * f64::from(bf16::to_f32(xh[v]))).is_finite())
        .max_by(|&a, &b| {
            let p = |v: usize| (row0[v] * f64::from(bf16::to_f32(xh[v]))).abs();
            p(a).total_cmp(&p(b))
        })
        .ok_or_else(|| {
            GpuError::input("kernel bench", "self-check: row 0 has no finite product")
        })?;
    // the sign bit of value v in the stored layout
    let (byte, bit) = match w.fmt {
        WFmt::Mxfp4 | WFmt::Nvfp4 => (v / 2, 3 + 4 * (v % 2)),
        WFmt::Bf16 => (2 * v + 1, 7),
        WFmt::F32 => (4 * v + 3, 7),
        WFmt::Mxfp8E4M3 | WFmt::Mxfp8E5M2 | WFmt::Ptpc => (v, 7),
    };
    bent.codes[byte] ^= 1 << bit;
    let (row, global) = bent.row(0)?;
    let e = rel_err(&row, global, &xh[..k], yh[0]);
    if e <= CHECK_TOL {
        return Err(GpuError::input(
            "kernel bench",
            format!("self-check: a planted code error moved output 0 by only {e:.3e} (the check cannot fail)"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Row 0 of `fmt` with 256 values whose first block has a tiny scale
    /// (where a planted error in value 0 hides below the tolerance), x all
    /// ones: the self-check must still catch its planted error, and take a
    /// correct output.
    #[test]
    fn the_planted_error_is_caught_in_a_tiny_first_block() {
        let k = 256;
        let x = vec![bf16::from_f32(1.0); k];
        for fmt in [WFmt::Mxfp4, WFmt::Nvfp4, WFmt::Mxfp8E4M3, WFmt::Mxfp8E5M2] {
            let (codes, scales) = match fmt {
                // E2M1 1.0 (0x2) everywhere; E8M0 2^-40 for block 0
                WFmt::Mxfp4 => (
                    vec![0x22u8; k / 2],
                    [vec![87u8], vec![127u8; k / 32 - 1]].concat(),
                ),
                // E4M3 scales: 0 for block 0, 1.0 (0x38) for the rest
                WFmt::Nvfp4 => (
                    vec![0x22u8; k / 2],
                    [vec![0x00u8], vec![0x38u8; k / 16 - 1]].concat(),
                ),
                // E4M3 / E5M2 1.0
                WFmt::Mxfp8E4M3 => (
                    vec![0x38u8; k],
                    [vec![87u8], vec![127u8; k / 32 - 1]].concat(),
                ),
                _ => (
                    vec![0x3cu8; k],
                    [vec![87u8], vec![127u8; k / 32 - 1]].concat(),
                ),
            };
            let w = HostMatrix {
                fmt,
                cols: k,
                codes,
                scales,
                global: 1.0,
            };
            let (row, global) = w.row(0).unwrap();
            let y = (row.iter().sum::<f64>() * global) as f32;
            // the old plant (value 0's code) moves output 0 by less than the
            // tolerance here
            assert!(
                row[0].abs() * 2.0 / row.iter().map(|v| v.abs()).sum::<f64>() < CHECK_TOL,
                "{fmt:?}"
            );
            planted_self_check(&w, &x, &[y], k).unwrap_or_else(|e| panic!("{fmt:?}: {e}"));
            // and a wrong output still fails the ordinary check
            let bad = y * (1.0 + 1e-3);
            assert!(
                check(&w, &x, &[bad], &[(0, 0)], k, 1, "t").is_err(),
                "{fmt:?}"
            );
        }
    }
}
