//! Linear layers of the standard path: `y = x W^T` on the tensor-core
//! kernel (`m3s_mma_*` in `kernels/standard_decode.cu`) for bf16, MXFP8
//! (E4M3 / E5M2), MXFP4 and NVFP4 weights, every matrix that shares `x` and
//! `K` fused into one launch per format; routed experts grouped by the
//! device-built route (`m3s_route`) so each chosen expert is read once per
//! step. f32 weights (the router) take `m3s_linear_f32w`.

use std::collections::HashMap;

use super::launch::{Arg, Launcher};
use crate::error::{GpuError, Result};
use crate::kernels::{KernelSource, Vendor};
use crate::model::{DevBuf, DevLinear, WFmt};
use crate::runtime::api::{Func, Gpu};

/// Output features per tensor-core CTA (one m16n8k16 tile of W rows).
pub(crate) const MMA_N: u32 = 16;
/// Matrices one tensor-core launch takes (`S_MAX_SEGS` in the kernel).
pub(crate) const MAX_SEGS: usize = 5;
/// A small step: at most this many rows (the small-step router,
/// `m3s_router_small`, and mono decode proper; the mono path takes up to
/// `mono::MONO_MAX_ROWS`).
pub(crate) const SMALL_STEP_ROWS: usize = 16;
/// Steps of at most this many rows run the small-step tensor-core variant
/// (4 warps per CTA, at most 2 row tiles: `SMALL_STEP_VARIANT`); larger
/// ones the default 8-warp build. Session 15 (H200) put the crossover at
/// 512 rows (context 512: 1024 rows 268.6 against 255.4 ms on the 8-warp
/// build); since then the small-step build's routed launches lost their
/// empty CTAs (route records, session 47) and its plain launches deal
/// chunk-minor. Measured again on the H100 (bench/NOTES.md session 48,
/// m3.1 --layers 12, whole steps, 2 rounds, with chunk-minor to the same
/// bound): 1024 rows (context 512) 171.3 against 199.5 ms (-14.1%), 2048
/// rows 348.5 against 368.4 (-5.4%); 4096 rows (context 128) 692.8
/// against 692.9 with tile-major launches and +14.4% chunk-minor, so the
/// bound stays at 2048. Not re-measured on the H200.
pub(crate) const SMALL_TILE_MAX_ROWS: usize = 2048;
/// The small-step variant's compile-time settings.
pub(crate) const SMALL_STEP_VARIANT: &str = "S_MMA_WARPS=4 S_MMA_MAXBT=2";
/// Plain launches of more than one row chunk and at most this many rows
/// deal the chunks in x (chunk-minor, [`MmaVariant::chunk_minor`]): every
/// small-step launch ([`SMALL_TILE_MAX_ROWS`]). Measured on the H100
/// (bench/NOTES.md session 46 run 1, session 47 run 2, session 48; m3.1
/// --layers 12, 2 rounds): whole steps -3.7% at b32, -3.5% at b64, -3.9%
/// at b128, -3.9% at b256 and -4.2% at b512 (context 512), -4.6% at 1024
/// rows and -1.8% at 2048 against the small-step build's tile-major
/// grid; MoE layers within +-1% to 1024 rows, +3.8% at 2048 (the whole
/// step still faster); b16 (one chunk) unchanged. At 4096 rows it lost
/// 14.4% (session 48), past this bound. The 8-warp build's launches keep
/// the tile-major grid (`S_CHUNK_MINOR_MAX=N`, a bench option, moves the
/// bound).
pub(crate) const CHUNK_MINOR_MAX_ROWS: usize = 2048;
/// Threads of `m3s_act_ptpc` (`S_PTPC_BLOCK`; one CTA per row).
pub(crate) const PTPC_BLOCK: u32 = 1024;
/// Threads of `m3s_linear_f32w` (one CTA per output feature).
pub(crate) const F32W_BLOCK: u32 = 256;
/// Largest K `m3s_linear_f32w` holds in registers (32 values a thread).
pub(crate) const F32W_MAX_K: usize = 32 * F32W_BLOCK as usize;

/// Where a linear layer's output goes.
#[derive(Clone, Copy, Debug)]
pub(crate) enum LinOut {
    /// bf16 rows (round to nearest even).
    Bf16(u64),
    /// f32 rows.
    F32(u64),
    /// f32 rows += f32(bf16(y)): MODEL.md's residual add, fused.
    AddF32(u64),
    /// The matrix is the gate, paired with the up stack in [`SwiGluOut`]:
    /// SwiGLU-OAI of each feature's two halves stored as bf16 rows and as
    /// their row-scaled f16 copy (`SSeg1` mode 3; MX weights only).
    SwiGlu(SwiGluOut),
}

/// The up half and the outputs of a [`LinOut::SwiGlu`] launch.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SwiGluOut {
    /// The up stack's codes, block scales (0: none) and NVFP4 globals (0:
    /// none): the same format and shape as the gate's (so its strides).
    pub up_w: u64,
    pub up_ws: u64,
    pub up_gs: u64,
    /// bf16 rows of the features, and their f16-layout rows.
    pub a: u64,
    pub xh: u64,
    pub alpha: f32,
    pub limit: f32,
    /// The rows' one power of two ([`super::pointwise::swiglu_row_pe`]).
    pub xpe: u32,
    /// Some up scale needs the any-scale kernel ([`DevLinear::any_scale`]).
    pub up_any: bool,
}

impl SwiGluOut {
    /// `up`'s half of a launch on `gate`, writing `a` and `xh` (rows of
    /// `gate.rows` features); `None` where the pair cannot run fused: not
    /// MX weights read as f16 (bf16, PTPC), stacks that differ in format or
    /// shape, features not whole 32-value blocks of the f16 rows, or a
    /// clamp that gives no row scale.
    pub fn new(
        gate: &DevLinear,
        up: &DevLinear,
        a: u64,
        xh: u64,
        alpha: f32,
        limit: f32,
    ) -> Option<Self> {
        let same = gate.fmt == up.fmt
            && (gate.rows, gate.cols, gate.count) == (up.rows, up.cols, up.count);
        if !same || !gate.fmt.f16_x() || gate.fmt == WFmt::Ptpc || !gate.rows.is_multiple_of(32) {
            return None;
        }
        Some(SwiGluOut {
            up_w: up.codes.ptr(),
            up_ws: up.scales.as_ref().map_or(0, |s| s.ptr()),
            up_gs: up.globals.as_ref().map_or(0, |g| g.ptr()),
            a,
            xh,
            alpha,
            limit,
            xpe: super::pointwise::swiglu_row_pe(alpha, limit)?,
            up_any: up.any_scale(),
        })
    }
}

/// One matrix of a tensor-core launch (`SSeg1` in standard_decode.cu).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct MmaSeg {
    /// Codes of matrix 0 of the stack.
    pub w: u64,
    /// Block scales of matrix 0 (0: none).
    pub ws: u64,
    pub yb: u64,
    pub yf: u64,
    /// Bytes between stacked matrices (codes, scales).
    pub w_es: u64,
    pub ws_es: u64,
    /// Per-matrix f32 global scale (NVFP4), indexed like the stack; 0: 1.0.
    pub gs: u64,
    /// Per-output-feature f32 scales (PTPC), `n` per stacked matrix; 0: none.
    pub cs: u64,
    /// Output features.
    pub n: u32,
    /// First CTA (blockIdx.x) of this matrix.
    pub tile0: u32,
    /// 0 = bf16 store, 1 = f32 store, 2 = f32 += bf16(y), 3 = SwiGLU of
    /// gate (this matrix) and up (`w2`, ...) to bf16 `yb` and f16 rows `yf`.
    pub mode: u32,
    /// Mode 3: the f16 rows' power of two (p = 2^(xpe - 127)).
    pub xpe: u32,
    /// Mode 3: the up stack's codes, block scales, NVFP4 globals.
    pub w2: u64,
    pub ws2: u64,
    pub gs2: u64,
    /// Mode 3: SwiGLU-OAI's alpha and clamp.
    pub alpha: f32,
    pub limit: f32,
}

/// Features (rows of each stack) one CTA takes in mode 3.
const SWIGLU_TILE: u32 = 8;

/// The matrices of a tensor-core launch, passed by value (`SSegs`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct MmaSegs {
    pub s: [MmaSeg; MAX_SEGS],
    pub nseg: u32,
    /// `SEGS_XROW` or 0.
    pub flags: u32,
}

/// `MmaSegs::flags`: x is row-scaled (`S_SEGS_XROW`, [`F16X::row_scaled`]).
pub(crate) const SEGS_XROW: u32 = 1;

/// The x of a linear launch: bf16 rows; for PTPC FP8 weights the same
/// rows quantized per token (`m3s_act_ptpc`); for MX weights the rows as
/// f16 fragments (`m3s_x_f16`, see [`prepare_x`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct LinX {
    pub x: u64,
    pub ptpc: Option<PtpcX>,
    pub f16: Option<F16X>,
}

/// Rows of x quantized the PTPC way: each value the bf16 of its E4M3 code,
/// and one f32 scale per row; `f16`: those rows as f16 fragments.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PtpcX {
    pub values: u64,
    pub scales: u64,
    pub f16: Option<F16X>,
}

/// Rows of x as the MX linears' f16 operands (`m3s_x_f16`, rows of
/// [`xh_stride`] bytes: the values as f16 fragments with a power of two per
/// 32-value block, then the blocks' exponent bytes).
#[derive(Clone, Copy, Debug)]
pub(crate) struct F16X {
    pub rows: u64,
    /// Every block of a row has the same power of two (its producer chose
    /// one a row: RMSNorm, SwiGLU; `s_xh_row_pe`), so the fast walks
    /// multiply it once an output instead of once a block.
    pub row_scaled: bool,
}

/// Bytes of one x row in the f16 layout (`s_xh_stride`): `k` f16 values,
/// then `k / 32` exponent bytes padded to 16.
pub(crate) fn xh_stride(k: usize) -> usize {
    2 * k + (k / 32).next_multiple_of(16)
}

/// Where value `i` of a row sits among the row's f16 values in the f16
/// layout (`s_xh_put_pe`: each 32-value block in m16n8k16 fragment order).
pub(crate) fn xh_slot(i: usize) -> usize {
    let (blk, kk) = (i / 32, i % 32);
    blk * 32 + (kk % 16) / 4 * 8 + kk / 16 * 4 + kk % 4
}

/// The exponent byte `p = 2^(pe - 127)` of a row-scaled f16 row whose
/// largest |value| is `max` (`s_xh_row_pe` with the tight bound, which is
/// `s_xh_put`'s choice for a block with that largest value): the largest
/// lands in [2^13, 2^14); 127 for a zero or non-finite maximum.
pub(crate) fn row_pe(max: f32) -> u32 {
    let b = max.abs().to_bits();
    if b == 0 || b >= 0x7f80_0000 {
        return 127;
    }
    (267 - (b >> 23) as i32).clamp(2, 253) as u32
}

/// `rows` bf16 rows of `k` values (`x`, bits) in the MX linears' f16
/// layout, row-scaled ([`F16X::row_scaled`]): each value times one power of
/// two a row ([`row_pe`] of the row's largest), rounded to f16 in fragment
/// order, then every block's exponent byte `254 - pe`. The host's form of
/// what `m3s_rmsnorm` / `m3s_swiglu` write row-scaled (the kernel
/// microbench's row-scaled x, and the tests' reference).
pub(crate) fn row_scaled_xh(x: &[u16], rows: usize, k: usize) -> Vec<u8> {
    let stride = xh_stride(k);
    let mut out = vec![0u8; rows * stride];
    for (xr, o) in x
        .chunks_exact(k)
        .zip(out.chunks_exact_mut(stride))
        .take(rows)
    {
        let vals: Vec<f32> = xr
            .iter()
            .map(|&b| m3_core::formats::bf16::to_f32(b))
            .collect();
        let pe = row_pe(
            vals.iter()
                .fold(0f32, |m, v| if v.abs() > m { v.abs() } else { m }),
        );
        let p = f32::from_bits(pe << 23);
        for (i, &v) in vals.iter().enumerate() {
            let dst = xh_slot(i);
            let h = half::f16::from_f32(v * p).to_bits();
            o[2 * dst..2 * dst + 2].copy_from_slice(&h.to_le_bytes());
        }
        for b in 0..k / 32 {
            o[2 * k + b] = (254 - pe) as u8;
        }
    }
    out
}

impl From<u64> for LinX {
    fn from(x: u64) -> Self {
        LinX {
            x,
            ptpc: None,
            f16: None,
        }
    }
}

/// Threads of `m3s_x_f16` (`S_XH_BLOCK`: one 32-value block per 32 threads).
pub(crate) const XH_BLOCK: u32 = 256;

/// `rows` rows of `k` bf16 values at `x` in the f16 layout, into `room`
/// (at least `rows * xh_stride(k)` bytes).
pub(crate) fn x_f16(
    l: &Launcher,
    f: &Func,
    x: u64,
    rows: usize,
    k: usize,
    room: &DevBuf,
) -> Result<F16X> {
    if rows * xh_stride(k) > room.bytes() || !k.is_multiple_of(32) {
        return Err(GpuError::input(
            "standard path",
            format!(
                "f16 x of {rows} x {k} past its buffer (sized at load) or K not a multiple of 32"
            ),
        ));
    }
    let blocks = (rows * k / 32).div_ceil(XH_BLOCK as usize / 32);
    l.launch(
        "x_f16",
        f,
        (blocks.max(1) as u32, 1, 1),
        XH_BLOCK,
        0,
        &[
            Arg::U64(x),
            Arg::U32(rows as u32),
            Arg::U32(k as u32),
            Arg::U64(room.ptr()),
        ],
    )?;
    Ok(F16X {
        rows: room.ptr(),
        row_scaled: false,
    })
}

/// `x` made ready for `mats` (which share it): its `rows` rows in the f16
/// layout where an MX matrix reads them (into `raw`, unless `x.f16` is
/// already there), and the PTPC rows where a PTPC matrix does (into `ptpc`).
pub(crate) fn prepare_x(
    l: &Launcher,
    f: &Func,
    mats: &[(&DevLinear, LinOut)],
    mut x: LinX,
    rows: usize,
    raw: &DevBuf,
    ptpc: Option<&DevBuf>,
) -> Result<LinX> {
    let k_of = |pred: &dyn Fn(WFmt) -> bool| {
        mats.iter()
            .filter(|(w, _)| pred(w.fmt))
            .map(|(w, _)| w.cols)
            .max()
    };
    if let (Some(k), None) = (k_of(&|f| f.f16_x() && f != WFmt::Ptpc), x.f16) {
        x.f16 = Some(x_f16(l, f, x.x, rows, k, raw)?);
    }
    if let (Some(k), Some(p)) = (k_of(&|f| f == WFmt::Ptpc), x.ptpc.as_mut()) {
        let room = ptpc.ok_or_else(|| {
            GpuError::input("standard path", "PTPC f16 input without its buffers")
        })?;
        p.f16 = Some(x_f16(l, f, p.values, rows, k, room)?);
    }
    Ok(x)
}

/// The tensor-core kernels of one compiled variant.
pub(crate) struct MmaVariant {
    pub label: String,
    /// Threads per CTA (S_MMA_WARPS * 32 of that compile: "warps" there are
    /// 32-thread mma groups whatever the hardware width, two per wave64).
    pub block: u32,
    /// Most x rows one CTA takes (8 * S_MMA_MAXBT of that compile).
    pub rows: usize,
    /// MXFP4 routed launches of [`crate::model::weights::ROUTED_SMALL_ROWS`]
    /// rows take the `_rs` entry point ([`WFmt::mma_kernel_routed`];
    /// `S_ROUTED_SMALL`, default 1, where loaded).
    pub routed_small: bool,
    /// FP4 routed launches of 2-8 rows take the `_r8s` entry points
    /// ([`WFmt::mma_kernel_routed_tile`]; `S_ROUTED_TILE=1`, where loaded).
    pub routed_tile: bool,
    /// Plain launches of more than one row chunk and at most
    /// [`CHUNK_MINOR_MAX_ROWS`] rows deal the chunks in x (standard_decode.cu
    /// `s_lin_place`): the CTAs of one weight tile run together
    /// (`S_CHUNK_MINOR`, default 1; 0 gives the tile-major grid).
    pub chunk_minor: bool,
    /// The most rows a chunk-minor launch takes (`S_CHUNK_MINOR_MAX`,
    /// default [`CHUNK_MINOR_MAX_ROWS`]).
    pub chunk_minor_max_rows: usize,
    f: HashMap<&'static str, Func>,
}

/// A tensor-core variant's source and shape.
pub(crate) struct VariantSource {
    pub src: KernelSource,
    /// Threads per CTA / 32.
    pub warps: u32,
    /// 8-row x tiles per CTA.
    pub maxbt: usize,
    /// The small-step shape with the fast walk, whose CUDA build has the
    /// one-row and one-tile entry points ([`VariantSource::row_entries`]).
    pub small_fast: bool,
    /// `S_ROUTED_SMALL` (default 1): the host's choice of the routed entry
    /// point ([`MmaVariant::routed_small`]; no kernel reads it).
    pub routed_small: bool,
    /// `S_ROUTED_TILE=1` (a bench option): the `_r8s` entry points are
    /// built, and routed launches of 2-8 rows take them
    /// ([`MmaVariant::routed_tile`]).
    pub routed_tile: bool,
    /// `S_CHUNK_MINOR` (default 1): [`MmaVariant::chunk_minor`]; no kernel
    /// reads it (they tell the launch shape by its grid).
    pub chunk_minor: bool,
    /// `S_CHUNK_MINOR_MAX` (a bench option, 17-4096 rows):
    /// [`MmaVariant::chunk_minor_max_rows`].
    pub chunk_minor_max_rows: usize,
}

impl VariantSource {
    /// Whether the build for `vendor` has the one-row and one-tile entry
    /// points ([`WFmt::mma_kernel_rows`]): the small-step fast shape on
    /// CUDA only (standard_decode.cu builds them `!defined(M3_HIP)`: the
    /// fast walk they hold is CUDA's).
    pub fn row_entries(&self, vendor: Vendor) -> bool {
        self.small_fast && vendor == Vendor::Cuda
    }
}

/// `base` with compile-time `defines` (`NAME=VALUE` pairs separated by
/// spaces, values unsigned integers) put first as `#define`s, each offered
/// to `take` (false: a name or value the kernels do not take, refused and
/// named; errors say `what`). Empty `defines`: `base` itself. The kernels'
/// own values for these names are `#ifndef`-guarded.
pub(crate) fn prefixed_source(
    base: &KernelSource,
    defines: &str,
    what: &'static str,
    mut take: impl FnMut(&str, u32) -> bool,
) -> Result<KernelSource> {
    let bad = |why: String| GpuError::input(what, format!("`{defines}`: {why}"));
    let mut prefix = String::new();
    for kv in defines.split_whitespace() {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| bad(format!("`{kv}` is not NAME=VALUE")))?;
        let n: u32 = v
            .parse()
            .map_err(|_| bad(format!("`{v}` is not a number")))?;
        if !take(k, n) {
            return Err(bad(format!("unknown or out-of-range `{kv}`")));
        }
        prefix.push_str(&format!("#define {k} {n}\n"));
    }
    Ok(if prefix.is_empty() {
        *base
    } else {
        // leaked once per load with defines: a KernelSource holds &'static
        // text (the module cache compiles each text once)
        let body: &'static str = Box::leak(format!("{prefix}{}", base.body).into_boxed_str());
        KernelSource { body, ..*base }
    })
}

/// The unit a tensor-core variant loads its linears from: with `defines`,
/// [`variant_source`]'s text with `S_MMA_ONLY` set (the tensor-core
/// linears alone: the host takes nothing else from a variant's unit, and
/// the rest, attention above all, was ~2/3 of the small-step unit's
/// NVRTC compile), its entry points the `m3s_mma_*` ones; without, `base`
/// itself (the default unit, which holds every kernel of a step). The
/// mono unit is built from [`variant_source`]'s full text instead.
pub(crate) fn mma_unit_source(base: &KernelSource, defines: &str) -> Result<VariantSource> {
    let vs = variant_source(base, defines)?;
    if defines.trim().is_empty() {
        return Ok(vs);
    }
    let body: &'static str =
        Box::leak(format!("#define S_MMA_ONLY 1\n{}", vs.src.body).into_boxed_str());
    let entries: &'static [&'static str] = Box::leak(
        base.entries
            .iter()
            .copied()
            .filter(|e| e.starts_with("m3s_mma_"))
            .collect::<Vec<_>>()
            .into_boxed_slice(),
    );
    Ok(VariantSource {
        src: KernelSource {
            body,
            entries,
            ..vs.src
        },
        ..vs
    })
}

/// `base` with a tensor-core variant's compile-time `defines` (`NAME=VALUE`
/// pairs separated by spaces; see standard_decode.cu) put first, checked
/// against the names and ranges the kernels take.
pub(crate) fn variant_source(base: &KernelSource, defines: &str) -> Result<VariantSource> {
    let mut warps = 8u32;
    let mut maxbt = 8usize;
    let mut fast = true;
    let mut routed_small = true;
    let mut routed_tile = false;
    let mut chunk_minor = true;
    let mut chunk_minor_max_rows = CHUNK_MINOR_MAX_ROWS;
    let src = prefixed_source(base, defines, "kernel variant", |k, n| {
        match k {
            "S_MMA_WARPS" if [2, 4, 8].contains(&n) => warps = n,
            "S_UNROLL_MUL" if (1..=4).contains(&n) => {}
            "S_MMA_INTERLEAVE" if n <= 2 => {}
            "S_H_TILE_UMUL" | "S_H_TILE_UMUL_FP4" | "S_H_TILE_UMUL_NV" | "S_H_ONE_UMUL"
            | "S_H_ONE_UMUL_FP4" | "S_H_ONE_UMUL_NV" | "S_H_ONE_UMUL_FP8"
                if (1..=2).contains(&n) => {}
            "S_MMA_DBUF" if n <= 1 => {}
            "S_UNROLL_HALF" if n <= 1 => {}
            "S_PDL_AHEAD" if [1, 2, 3, 4, 6, 8, 12, 16].contains(&n) => {}
            // format bitmasks (bit 1 << S_FMT_*: the MX formats, 2..=16)
            "S_H_PIPE_ONE" | "S_H_PIPE_TILE" | "S_W_PF_L1" if n <= 30 && n.is_multiple_of(2) => {}
            "S_W_PF_DIST" if (1..=4).contains(&n) => {}
            "S_W_PF_MODE" if n <= 2 => {}
            "S_MMA_MINB" | "S_R1_MINB" | "S_R8_MINB" | "S_R1_MINB_FP8" | "S_R1_MINB_FP4"
            | "S_R1_MINB_NV" | "S_R8_MINB_FP8" | "S_R8_MINB_FP4" | "S_R8_MINB_NV"
            | "S_RS_MINB_FP4"
                if (1..=16).contains(&n) => {}
            "S_MMA_MAXBT" if [1, 2, 4, 8].contains(&n) => maxbt = n as usize,
            "S_H_FAST" if n <= 1 => fast = n == 1,
            "S_FORCE_ANY" if n <= 1 => {}
            "S_X_AHEAD" if n <= 1 => {}
            "S_NV_FOLD" if n <= 1 => {}
            "S_NV_SPLIT" if n <= 1 => {}
            "S_ROUTED_SMALL" if n <= 1 => routed_small = n == 1,
            "S_ROUTED_TILE" if n <= 1 => routed_tile = n == 1,
            "S_CHUNK_MINOR" if n <= 1 => chunk_minor = n == 1,
            "S_CHUNK_MINOR_MAX" if (17..=4096).contains(&n) => chunk_minor_max_rows = n as usize,
            "S_R8S_MINB_NV" if (1..=16).contains(&n) => {}
            _ => return false,
        }
        true
    })?;
    Ok(VariantSource {
        src,
        warps,
        maxbt,
        small_fast: maxbt == 2 && fast,
        routed_small,
        routed_tile,
        chunk_minor,
        chunk_minor_max_rows,
    })
}

impl MmaVariant {
    /// Load the tensor-core entry points of `src` compiled with `defines`
    /// (`NAME=VALUE` pairs separated by spaces; see standard_decode.cu).
    pub fn load(gpu: &dyn Gpu, base: &KernelSource, defines: &str) -> Result<Self> {
        let vs = mma_unit_source(base, defines)?;
        let row_entries = vs.row_entries(gpu.vendor());
        let VariantSource {
            src,
            warps,
            maxbt,
            routed_small,
            routed_tile,
            chunk_minor,
            chunk_minor_max_rows,
            ..
        } = vs;
        // the routed entries exist only where the row-class ones do
        let (routed_small, routed_tile) = (routed_small && row_entries, routed_tile && row_entries);
        let mut f = HashMap::new();
        for fm in WFmt::MMA {
            let rows = if row_entries {
                [
                    fm.mma_kernel_rows(1),
                    fm.mma_kernel_rows(8),
                    fm.mma_kernel_routed_entry(),
                    fm.mma_kernel_routed_tile().filter(|_| routed_tile),
                ]
            } else {
                [None; 4]
            };
            for n in [fm.mma_kernel(), fm.mma_kernel_any_scale()]
                .into_iter()
                .chain(rows)
                .flatten()
            {
                if !f.contains_key(n) {
                    f.insert(n, gpu.kernel(&src, n)?);
                }
            }
        }
        Ok(MmaVariant {
            label: if defines.is_empty() {
                "default".into()
            } else {
                defines.to_string()
            },
            block: warps * 32,
            rows: maxbt * 8,
            routed_small,
            routed_tile,
            chunk_minor,
            chunk_minor_max_rows,
            f,
        })
    }
}

/// The kernels linear layers use.
pub(crate) struct LinearKernels {
    /// Tensor-core variants (0: the defaults; 1: the small-step variant;
    /// later ones: bench variants).
    pub mma: Vec<MmaVariant>,
    /// f32 weights (the router): one CTA per output feature.
    pub f32w: Func,
    /// x as f16 fragments for the MX formats (`m3s_x_f16`).
    pub x_f16: Func,
}

/// Where a routed launch finds its pairs.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Route {
    /// The route records (`m3s_route`).
    pub table: u64,
    /// Expert slots of the step (distinct experts at most).
    pub slots: usize,
    /// x row of pair p = p / xdiv.
    pub xdiv: usize,
    /// Rows of x (pairs / xdiv).
    pub x_rows: usize,
    /// Pairs a record at most (`m3s_route`'s `chunk`,
    /// `PathOptions::route_chunk`; at most the launch's CTA rows): records
    /// of 2 + chunk ints on one z-block. 0: one record an expert, of the
    /// runner's row capacity, on z-blocks by the step's rows.
    pub chunk: usize,
}

/// `y_i = x W_i^T` for matrices that share `x` and `K`, fused into one
/// launch per weight format. `m` rows (plain), or with `route` the layer's
/// expert pairs grouped by the device-built route (`m` = the step's rows).
/// `max_rows` is the runner's row capacity (the stride of a route of one
/// record an expert: [`Route::chunk`]).
#[allow(clippy::too_many_arguments)]
pub(crate) fn linears(
    l: &Launcher,
    k: &LinearKernels,
    variant: usize,
    mats: &[(&DevLinear, LinOut)],
    x: impl Into<LinX>,
    m: usize,
    route: Option<Route>,
    max_rows: usize,
) -> Result<()> {
    let x: LinX = x.into();
    let mut done = vec![false; mats.len()];
    for i in 0..mats.len() {
        if done[i] {
            continue;
        }
        let (w0, y0) = mats[i];
        let Some(mut name) = w0.fmt.mma_kernel() else {
            done[i] = true;
            if route.is_some() {
                return Err(GpuError::input(
                    "standard path",
                    "f32 routed experts are not supported",
                ));
            }
            linear_f32(l, k, w0, x.x, m, y0)?;
            continue;
        };
        // MX weights read x in the f16 layout (PTPC: the quantized rows',
        // and multiply by their row scales)
        let missing = |what: &str| {
            GpuError::input(
                "standard path",
                format!("a {:?} linear launched without its {what}", w0.fmt),
            )
        };
        let (xa, ts, row_scaled) = if w0.fmt == WFmt::Ptpc {
            let p = x.ptpc.ok_or_else(|| missing("quantized input"))?;
            let h = p.f16.ok_or_else(|| missing("f16 input"))?;
            (h.rows, p.scales, h.row_scaled)
        } else if w0.fmt.f16_x() {
            let h = x.f16.ok_or_else(|| missing("f16 input"))?;
            (h.rows, 0, h.row_scaled)
        } else {
            (x.x, 0, false)
        };
        let mut segs = MmaSegs {
            flags: if row_scaled { SEGS_XROW } else { 0 },
            ..MmaSegs::default()
        };
        let mut tiles = 0u32;
        for j in i..mats.len() {
            let (w, y) = mats[j];
            if done[j] || w.fmt != w0.fmt || w.cols != w0.cols {
                continue;
            }
            if segs.nseg as usize == MAX_SEGS {
                break;
            }
            done[j] = true;
            // one matrix with a scale outside the fast range (or K not a
            // multiple of 128) takes the whole launch to the any kernel
            let up_any = matches!(y, LinOut::SwiGlu(o) if o.up_any);
            if w.any_scale() || up_any || (w.fmt.f16_x() && !w.cols.is_multiple_of(128)) {
                name = w.fmt.mma_kernel_any_scale().unwrap_or(name);
            }
            let (w_es, ws_es) = w.strides();
            let (yb, yf, mode) = match y {
                LinOut::Bf16(p) => (p, 0, 0),
                LinOut::F32(p) => (0, p, 1),
                LinOut::AddF32(p) => (0, p, 2),
                LinOut::SwiGlu(o) => (o.a, o.xh, 3),
            };
            let mut seg = MmaSeg {
                w: w.codes.ptr(),
                ws: w.scales.as_ref().map_or(0, |s| s.ptr()),
                yb,
                yf,
                w_es,
                ws_es,
                gs: w.globals.as_ref().map_or(0, |g| g.ptr()),
                cs: w.chan.as_ref().map_or(0, |c| c.ptr()),
                n: w.rows as u32,
                tile0: tiles,
                mode,
                ..MmaSeg::default()
            };
            let mut per_cta = MMA_N;
            if let LinOut::SwiGlu(o) = y {
                if !w.fmt.f16_x() || w.fmt == WFmt::Ptpc {
                    return Err(GpuError::input(
                        "standard path",
                        format!(
                            "gate + up with SwiGLU fused on {:?} weights (MX only)",
                            w.fmt
                        ),
                    ));
                }
                (seg.w2, seg.ws2, seg.gs2) = (o.up_w, o.up_ws, o.up_gs);
                (seg.alpha, seg.limit, seg.xpe) = (o.alpha, o.limit, o.xpe);
                per_cta = SWIGLU_TILE;
            }
            segs.s[segs.nseg as usize] = seg;
            segs.nseg += 1;
            tiles += (w.rows as u32).div_ceil(per_cta);
        }
        let mv = &k.mma[variant];
        // a step of one row or of one 8-row tile: the entry point holding
        // only that walk (small-step build, fast entry point only); an
        // MXFP4 routed step of 9-64 rows (S_ROUTED_SMALL): the general
        // walks at more CTAs an SM (WFmt::mma_kernel_routed_entry); an FP4
        // routed step of 2-8 rows under S_ROUTED_TILE: one-row slots by
        // the one-row walk (WFmt::mma_kernel_routed_tile)
        if Some(name) == w0.fmt.mma_kernel() {
            let routed = route.and_then(|_| match m {
                2..=8 if mv.routed_tile => w0.fmt.mma_kernel_routed_tile(),
                _ if mv.routed_small => w0.fmt.mma_kernel_routed(m),
                _ => None,
            });
            if let Some(n) = routed
                .or(w0.fmt.mma_kernel_rows(m))
                .filter(|n| mv.f.contains_key(n))
            {
                name = n;
            }
        }
        let chunks = m.div_ceil(mv.rows) as u32;
        // (the kernels' `max_rows`: the pairs a route record holds)
        let (gx, gy, gz, rp, xdiv, rec_rows) = match route {
            Some(r) if r.chunk > mv.rows => {
                return Err(GpuError::input(
                    "standard path",
                    format!(
                        "route records of {} pairs for CTAs of {} rows",
                        r.chunk, mv.rows
                    ),
                ))
            }
            Some(r) if r.chunk > 0 => (tiles, r.slots as u32, 1, r.table, r.xdiv, r.chunk),
            Some(r) => (tiles, r.slots as u32, chunks, r.table, r.xdiv, max_rows),
            // chunk-minor: the kernels read a plain launch of more than one
            // chunk on a grid one block high as x = tile * chunks + chunk
            None if mv.chunk_minor && chunks > 1 && m <= mv.chunk_minor_max_rows => {
                (tiles * chunks, 1, 1, 0, 1, max_rows)
            }
            None => (tiles, chunks, 1, 0, 1, max_rows),
        };
        let f = mv
            .f
            .get(name)
            .ok_or_else(|| GpuError::input("standard path", format!("kernel {name} not loaded")))?;
        l.launch(
            name,
            f,
            (gx, gy, gz),
            mv.block,
            0,
            &[
                Arg::U64(xa),
                Arg::pod(&segs),
                Arg::U32(w0.cols as u32),
                Arg::U32(m as u32),
                Arg::U64(rp),
                Arg::U32(rec_rows as u32),
                Arg::U32(xdiv.max(1) as u32),
                Arg::U64(ts),
            ],
        )?;
    }
    Ok(())
}

/// f32 weights (the router): one CTA per output feature, the weight row in
/// registers and reused for every row (K <= 8192, f32 out).
fn linear_f32(
    l: &Launcher,
    k: &LinearKernels,
    w: &DevLinear,
    x: u64,
    m: usize,
    y: LinOut,
) -> Result<()> {
    let LinOut::F32(yf) = y else {
        return Err(GpuError::input(
            "standard path",
            "f32-weight linears write f32 outputs only (the router)",
        ));
    };
    if w.fmt != WFmt::F32 || w.cols > F32W_MAX_K {
        return Err(GpuError::input(
            "standard path",
            format!(
                "{:?} [{}, {}] weights on the f32 linear kernel (f32, K <= {F32W_MAX_K})",
                w.fmt, w.rows, w.cols
            ),
        ));
    }
    l.launch(
        "linear_f32",
        &k.f32w,
        (w.rows as u32, 1, 1),
        F32W_BLOCK,
        0,
        &[
            Arg::U64(x),
            Arg::U64(w.codes.ptr()),
            Arg::U32(w.rows as u32),
            Arg::U32(w.cols as u32),
            Arg::U32(m as u32),
            Arg::U64(yf),
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (row amax, value) pairs, both bf16 bits, whose PTPC quotient
    /// `value / f32(amax / 448)` rounds to another E4M3 code when taken in
    /// f32 first than when taken exactly: the double-rounding cases
    /// `s_e4m3_quotient` must get right (its midpoint correction).
    pub(crate) fn ptpc_double_rounding_cases(most: usize) -> Vec<(u16, u16)> {
        use m3_core::formats::{bf16, fp8::e4m3};
        let mut out = Vec::new();
        // every bf16 mantissa of amax in [1, 2) (the quotient's digits do
        // not depend on a power-of-two scale), values up to amax
        for a in 0x3f80u16..=0x3fff {
            let sa = bf16::to_f32(a) / 448.0;
            for x in 1u16..=a {
                let xf = bf16::to_f32(x);
                let exact = e4m3::encode_sat(f64::from(xf) / f64::from(sa));
                if e4m3::encode_sat(f64::from(xf / sa)) != exact {
                    out.push((a, x));
                    if out.len() == most {
                        return out;
                    }
                }
            }
        }
        out
    }

    #[test]
    fn ptpc_double_rounding_cases_exist() {
        // the device test needs some; the f32-first rounding really differs
        assert!(ptpc_double_rounding_cases(4).len() == 4);
    }

    #[test]
    fn ptpc_block_is_the_kernels() {
        let want = format!("#define S_PTPC_BLOCK {PTPC_BLOCK}\n");
        assert!(super::super::STANDARD.body.contains(&want));
    }

    /// A variant's unit is the tensor-core linears alone (its text asks
    /// for it, its entry list is theirs); no defines: the default unit,
    /// every kernel of a step.
    #[test]
    fn a_variant_unit_holds_the_linears_alone() {
        let base = &super::super::STANDARD;
        let v = mma_unit_source(base, "S_MMA_WARPS=4 S_MMA_MAXBT=2").unwrap();
        assert!(v.src.body.starts_with("#define S_MMA_ONLY 1\n"));
        assert!(!v.src.entries.is_empty());
        assert!(v.src.entries.iter().all(|e| e.starts_with("m3s_mma_")));
        assert!(!v.src.entries.contains(&"m3s_attn_combine"));
        let d = mma_unit_source(base, "").unwrap();
        assert_eq!(d.src.body, base.body);
        assert!(d.src.entries.contains(&"m3s_attn_combine"));
        // the mono unit's text (variant_source) keeps every kernel
        assert!(!variant_source(base, "S_MMA_WARPS=4")
            .unwrap()
            .src
            .body
            .contains("S_MMA_ONLY 1"));
    }

    /// Every `#ifndef S_*` default in standard_decode.cu is a define
    /// `--variants` / `M3_SMALL_STEP_DEFINES` can set, unless it belongs to
    /// another kernel (session 42: two new bench defines were missing from
    /// `variant_source`'s list, so their device script would have been
    /// refused there).
    #[test]
    fn every_bench_define_is_a_variant() {
        // set by the engine or by other kernels' entry points, not variants
        const NOT_VARIANTS: [&str; 6] = [
            "S_F32W_HOIST",
            "S_F32W_ROWS",
            "S_L2PF_CHUNK",
            "S_MMA_ONLY",
            "S_ROUTER_FIT",
            "S_SHARED",
        ];
        let body = include_str!("../../kernels/standard_decode.cu");
        let names: Vec<&str> = body
            .lines()
            .filter_map(|l| l.strip_prefix("#ifndef "))
            .map(str::trim)
            .filter(|n| n.starts_with("S_") && !NOT_VARIANTS.contains(n))
            .collect();
        assert!(names.len() > 20, "found only {names:?}");
        let base = &super::super::STANDARD;
        let refused: Vec<&str> = names
            .iter()
            .copied()
            .filter(|n| {
                ![0u32, 1, 2, 4, 8]
                    .iter()
                    .any(|v| variant_source(base, &format!("{n}={v}")).is_ok())
            })
            .collect();
        assert!(
            refused.is_empty(),
            "defines no variant can set: {refused:?}"
        );
        // and the check can fail: a name the kernels do not take is refused
        assert!(variant_source(base, "S_NO_SUCH_DEFINE=1").is_err());
    }

    #[test]
    fn job_tables_have_the_kernel_layout() {
        // SSeg1: 8 u64 + 4 u32 + 3 u64 + 2 f32 = 112 bytes; SSegs: 5 of
        // them + 2 u32; and the kernel's structs have the fields in this order
        assert_eq!(std::mem::size_of::<MmaSeg>(), 112);
        assert_eq!(std::mem::size_of::<MmaSegs>(), 5 * 112 + 8);
        assert_eq!(std::mem::align_of::<MmaSegs>(), 8);
        let body = super::super::STANDARD.body;
        assert!(body.contains(
            "struct SSeg1 {\n  u64 w, ws, yb, yf, w_es, ws_es, gs, cs;\n  u32 n, tile0, mode, xpe;\n  u64 w2, ws2, gs2;\n  float alpha, limit;\n};"
        ));
        assert!(body.contains("struct SSegs {\n  SSeg1 s[S_MAX_SEGS];\n  u32 nseg, flags;\n};"));
        assert!(body.contains(&format!("#define S_MAX_SEGS {MAX_SEGS}\n")));
    }
}

/// The tensor-core linear against an f64 reference, per compiled variant,
/// in plain and routed mode (runs on a GPU; skips without one unless
/// REQUIRE_GPU=1). Products of bf16 inputs and exactly dequantized weights
/// are exact; only the f32 summation order differs, so every output must
/// be within a few f32 ulps of the sum's magnitude.
#[cfg(test)]
mod gpu_tests {
    use super::*;
    use crate::model::DevBuf;
    use m3_core::formats::{bf16, MxElem, MxTensor, Nvfp4Tensor, ScaleRule};
    use m3_core::weights::LinearWeight;

    /// `x` (`rows` x `kk` bf16, PTPC rows where given) with the f16
    /// fragments the MX kernels read; the buffers they live in come back
    /// with it (keep them alive while the launches run).
    fn with_f16(
        l: &Launcher,
        k: &LinearKernels,
        x: u64,
        ptpc: Option<PtpcX>,
        rows: usize,
        kk: usize,
    ) -> (LinX, Vec<DevBuf>) {
        let ctx = l.device();
        let bufs: Vec<DevBuf> = (0..2)
            .map(|_| DevBuf::zeroed(ctx, rows * xh_stride(kk)).unwrap())
            .collect();
        let mut lx = LinX { x, ptpc, f16: None };
        lx.f16 = Some(x_f16(l, &k.x_f16, x, rows, kk, &bufs[0]).unwrap());
        if let Some(p) = lx.ptpc.as_mut() {
            p.f16 = Some(x_f16(l, &k.x_f16, p.values, rows, kk, &bufs[1]).unwrap());
        }
        (lx, bufs)
    }

    use super::super::test_gpu as gpu;

    use super::super::TestRng;

    fn weight(fmt: &str, rows: usize, cols: usize, rng: &mut TestRng) -> LinearWeight {
        // "-nanscale": row 0's first block scale is E8M0's NaN (0xff): its
        // outputs must be NaN, and the stack takes the any-scale kernel
        if let Some(base) = fmt.strip_suffix("-nanscale") {
            let LinearWeight::Mx(t) = weight(base, rows, cols, rng) else {
                unreachable!()
            };
            let mut scales = t.scales().to_vec();
            scales[0] = 0xff;
            return LinearWeight::Mx(
                MxTensor::from_parts(t.elem(), rows, cols, t.codes().to_vec(), scales).unwrap(),
            );
        }
        // "e4m3-nan": row 0's first code is E4M3's NaN (0x7f): its outputs
        // must be NaN (FORMATS.md), every other output as usual
        if fmt == "e4m3-nan" {
            let LinearWeight::Mx(t) = weight("e4m3", rows, cols, rng) else {
                unreachable!()
            };
            let mut codes = t.codes().to_vec();
            codes[0] = 0x7f;
            return LinearWeight::Mx(
                MxTensor::from_parts(MxElem::Fp8E4M3, rows, cols, codes, t.scales().to_vec())
                    .unwrap(),
            );
        }
        // "nvfp4-wide": row r 2^-(r % 19) the size of row 0, so the E4M3
        // block scales of rows 15-18 are subnormals (each output is held to
        // its own row's sum): the scale folded into the f16 operands
        // (S_NV_FOLD) must stay exact there too
        if fmt == "nvfp4-wide" {
            let v: Vec<f32> = (0..rows * cols)
                .map(|i| rng.unit() * 2f32.powi(-((i / cols % 19) as i32)))
                .collect();
            let t = Nvfp4Tensor::quantize(&v, rows, cols).unwrap();
            let subnormal = t
                .scales()
                .iter()
                .filter(|&&b| b != 0 && b & 0x78 == 0)
                .count();
            assert!(
                subnormal > 0,
                "nvfp4-wide [{rows}, {cols}]: no subnormal block scale"
            );
            return LinearWeight::Nvfp4(t);
        }
        // "-big": magnitudes with large block scales (MXFP4 scale bytes
        // ~134, E4M3 ~136, E5M2 ~161), inside the f16 kernels' fast ranges
        let (fmt, gain) = match fmt.strip_suffix("-big") {
            Some("fp4") => ("fp4", 16384.0),
            // E5M2 scale bytes ~161 > 142: the two-multiply factor
            Some("e5m2") => ("e5m2", 2f32.powi(36)),
            Some(f) => (f, 4_194_304.0),
            None => (fmt, 1.0),
        };
        let v: Vec<f32> = (0..rows * cols).map(|_| rng.unit() * 0.05 * gain).collect();
        match fmt {
            "bf16" => LinearWeight::Bf16 {
                rows,
                cols,
                data: v.iter().map(|&x| bf16::from_f32(x)).collect(),
            },
            "e4m3" => LinearWeight::Mx(
                MxTensor::quantize(&v, rows, cols, MxElem::Fp8E4M3, ScaleRule::Floor).unwrap(),
            ),
            "e5m2" => LinearWeight::Mx(
                MxTensor::quantize(&v, rows, cols, MxElem::Fp8E5M2, ScaleRule::Floor).unwrap(),
            ),
            "nvfp4" => LinearWeight::Nvfp4(Nvfp4Tensor::quantize(&v, rows, cols).unwrap()),
            _ => LinearWeight::Mx(
                MxTensor::quantize(&v, rows, cols, MxElem::Fp4E2M1, ScaleRule::Floor).unwrap(),
            ),
        }
    }

    fn dequant(w: &LinearWeight) -> Vec<f32> {
        match w {
            LinearWeight::Bf16 { data, .. } => data.iter().map(|&b| bf16::to_f32(b)).collect(),
            LinearWeight::Mx(t) => t.dequantize(),
            LinearWeight::Nvfp4(t) => t.dequantize(),
            _ => unreachable!(),
        }
    }

    /// PTPC FP8 on the device (`m3s_act_ptpc`, then the E4M3 tensor-core
    /// linear with row and token scales) against cpu-ref's `ptpc_linear`,
    /// whose dot is exact: the quantized x and its scales must be bit-exact,
    /// every output within f32 summation noise (1e-5 of its absolute sum),
    /// a NaN row all NaN. The comparison is shown to catch a planted error
    /// (a reference from the wrong weight row scale).
    #[test]
    fn ptpc_matches_the_cpu_reference() {
        use m3_core::formats::convert::PtpcFp8;
        use m3_core::formats::fp8::e4m3;
        let Some(gpu) = gpu() else { return };
        let l = Launcher::new(gpu.device(), true).unwrap();
        let ctx = gpu.device();
        let act = gpu.kernel(&super::super::STANDARD, "m3s_act_ptpc").unwrap();
        let mut k = LinearKernels {
            mma: Vec::new(),
            f32w: gpu
                .kernel(&super::super::STANDARD, "m3s_linear_f32w")
                .unwrap(),
            x_f16: gpu.kernel(&super::super::STANDARD, "m3s_x_f16").unwrap(),
        };
        for v in ["", SMALL_STEP_VARIANT] {
            k.mma
                .push(MmaVariant::load(&gpu, &super::super::STANDARD, v).unwrap());
        }
        // `m3s_act_ptpc` on m rows of kk bf16 values: the device buffers
        // (x, quantized x, scales) and the quantized values and scales read back
        let quantize = |xs: &[u16], m: usize, kk: usize| {
            let xd = DevBuf::from_slice(ctx, xs).unwrap();
            let xq = DevBuf::zeroed(ctx, m * kk * 2).unwrap();
            let xsd = DevBuf::zeroed(ctx, m * 4).unwrap();
            l.launch(
                "act_ptpc",
                &act,
                (m as u32, 1, 1),
                PTPC_BLOCK,
                0,
                &[
                    Arg::U64(xd.ptr()),
                    Arg::U32(m as u32),
                    Arg::U32(kk as u32),
                    Arg::U64(xq.ptr()),
                    Arg::U64(xsd.ptr()),
                ],
            )
            .unwrap();
            let mut gq = vec![0u16; m * kk];
            xq.read(l.stream(), 0, &mut gq).unwrap();
            let mut gs = vec![0f32; m];
            xsd.read(l.stream(), 0, &mut gs).unwrap();
            (xd, xq, xsd, gq, gs)
        };
        let mut rng = TestRng(11);
        let mut failures = Vec::new();
        let mut planted_caught = 0usize;
        for &(n, kk) in &[(48usize, 128usize), (64, 1024), (40, 2048), (24, 160)] {
            // bf16 weights with one row of zeros and rows of other magnitudes
            let wv: Vec<f32> = (0..n * kk)
                .map(|i| {
                    let r = i / kk;
                    if r == 3 {
                        0.0
                    } else {
                        rng.unit() * 0.05 * (1 + r % 5) as f32
                    }
                })
                .collect();
            let lw = LinearWeight::Bf16 {
                rows: n,
                cols: kk,
                data: wv.iter().map(|&x| bf16::from_f32(x)).collect(),
            };
            let qw: PtpcFp8 = m3_core::checkpoint::online::quantize_weight("test", &lw).unwrap();
            let dev = DevLinear::upload_ptpc(ctx, "test", &[&qw]).unwrap();
            for &m in &[1usize, 3, 16, 40] {
                let mut xs: Vec<u16> = (0..m * kk)
                    .map(|i| bf16::from_f32(rng.unit() * (1 + i / kk) as f32))
                    .collect();
                // row 1: a NaN (every output NaN); row 2: zeros (scale 1.0)
                if m > 2 {
                    xs[kk + 5] = 0x7fc0;
                    xs[2 * kk..3 * kk].fill(0);
                }
                let (xd, xq, xsd, gq, gs) = quantize(&xs, m, kk);
                // the CPU's quantized rows
                let xf: Vec<f32> = xs.iter().map(|&b| bf16::to_f32(b)).collect();
                let mut qa = vec![0u8; m * kk];
                for r in 0..m {
                    let row = &xf[r * kk..(r + 1) * kk];
                    if row.iter().any(|v| !v.is_finite()) {
                        if !gs[r].is_nan() {
                            failures.push(format!(
                                "[{n}, {kk}] m {m} row {r}: scale {} for a NaN row",
                                gs[r]
                            ));
                        }
                        continue;
                    }
                    let sa = m3_core::formats::convert::ptpc_quantize_row(
                        row,
                        &mut qa[r * kk..(r + 1) * kk],
                    );
                    if sa.to_bits() != gs[r].to_bits() {
                        failures.push(format!(
                            "[{n}, {kk}] m {m} row {r}: scale {} vs {sa}",
                            gs[r]
                        ));
                    }
                    let off = (0..kk)
                        .filter(|&c| {
                            bf16::to_f32(gq[r * kk + c]).to_bits()
                                != e4m3::decode(qa[r * kk + c]).to_bits()
                        })
                        .count();
                    if off > 0 {
                        failures.push(format!(
                            "[{n}, {kk}] m {m} row {r}: {off} quantized values off"
                        ));
                    }
                }
                let ptpc = PtpcX {
                    values: xq.ptr(),
                    scales: xsd.ptr(),
                    f16: None,
                };
                let (lx, _keep) = with_f16(&l, &k, xd.ptr(), Some(ptpc), m, kk);
                for vi in 0..k.mma.len() {
                    let y = DevBuf::zeroed(ctx, m * n * 4).unwrap();
                    linears(&l, &k, vi, &[(&dev, LinOut::F32(y.ptr()))], lx, m, None, m).unwrap();
                    let mut got = vec![0f32; m * n];
                    y.read(l.stream(), 0, &mut got).unwrap();
                    let mut want = vec![0f32; m * n];
                    m3_cpu_ref::linear::ptpc_linear(&xf, m, &qw, false, &mut want).unwrap();
                    // outputs off by more than 1e-5 of |sum| of the row's
                    // products (times both scales); `sw_of` picks the row
                    // scale the reference used
                    let count_off = |want: &[f32], sw_of: &dyn Fn(usize) -> f32| {
                        let mut bad = 0;
                        for r in 0..m {
                            for o in 0..n {
                                let (g, w) = (got[r * n + o], want[r * n + o]);
                                if w.is_nan() || g.is_nan() {
                                    bad += usize::from(w.is_nan() != g.is_nan());
                                    continue;
                                }
                                let abs: f64 = (0..kk)
                                    .map(|c| {
                                        f64::from(e4m3::decode(qa[r * kk + c]))
                                            * f64::from(e4m3::decode(qw.codes[o * kk + c]))
                                    })
                                    .map(f64::abs)
                                    .sum::<f64>()
                                    * f64::from(sw_of(o)).abs()
                                    * f64::from(gs[r]);
                                if (f64::from(g) - f64::from(w)).abs() > 1e-5 * abs + 1e-30 {
                                    bad += 1;
                                }
                            }
                        }
                        bad
                    };
                    let bad = count_off(&want, &|o| qw.scales[o]);
                    if bad > 0 {
                        failures.push(format!(
                            "[{n}, {kk}] m {m} variant {vi}: {bad} of {} outputs off",
                            m * n
                        ));
                    }
                    // planted: the reference made with the next row's scale
                    let mut wrong = qw.clone();
                    wrong.scales.rotate_left(1);
                    let mut planted = vec![0f32; m * n];
                    m3_cpu_ref::linear::ptpc_linear(&xf, m, &wrong, false, &mut planted).unwrap();
                    if count_off(&planted, &|o| wrong.scales[o]) > 0 {
                        planted_caught += 1;
                    }
                }
            }
        }
        // the double-rounding cases: rows [amax, x, -x, 0, ...] whose
        // quotient x / sa rounds otherwise when taken in f32 first
        let cases = super::tests::ptpc_double_rounding_cases(64);
        let kk = 128;
        let m = cases.len();
        let mut xs = vec![0u16; m * kk];
        for (r, &(a, x)) in cases.iter().enumerate() {
            xs[r * kk] = a;
            xs[r * kk + 1] = x;
            xs[r * kk + 2] = x | 0x8000;
        }
        let (_, _, _, gq, _) = quantize(&xs, m, kk);
        let mut dr_off = 0;
        for r in 0..m {
            let row: Vec<f32> = xs[r * kk..(r + 1) * kk]
                .iter()
                .map(|&b| bf16::to_f32(b))
                .collect();
            let mut qa = vec![0u8; kk];
            m3_core::formats::convert::ptpc_quantize_row(&row, &mut qa);
            dr_off += (0..kk)
                .filter(|&c| {
                    bf16::to_f32(gq[r * kk + c]).to_bits() != e4m3::decode(qa[c]).to_bits()
                })
                .count();
        }
        if dr_off > 0 {
            failures.push(format!(
                "double-rounding rows: {dr_off} of {} values off",
                m * kk
            ));
        }
        println!("double-rounding rows checked: {m}");
        for f in &failures {
            println!("{f}");
        }
        assert!(failures.is_empty(), "{} failing cases", failures.len());
        assert_eq!(planted_caught, 4 * 4 * 2, "a planted error went unnoticed");
    }

    /// The route records (`m3s_route`'s form) of `m` x rows over a stack
    /// of 2: pairs p = r * 2 + c choose expert (r + c) % 2, x row p / 2,
    /// output row p.
    fn two_expert_route(m: usize) -> Vec<i32> {
        let pairs = m * 2;
        let stride = 2 + pairs;
        let mut rec = vec![0i32; 2 * stride];
        for e in 0..2 {
            let rows: Vec<i32> = (0..pairs)
                .filter(|&p| (p / 2 + p % 2) % 2 == e)
                .map(|p| p as i32)
                .collect();
            rec[e * stride] = e as i32;
            rec[e * stride + 1] = rows.len() as i32;
            rec[e * stride + 2..e * stride + 2 + rows.len()].copy_from_slice(&rows);
        }
        rec
    }

    /// SwiGLU in the gate + up epilogue (`LinOut::SwiGlu`, mode 3) against
    /// gate + up stored as bf16, then `m3s_swiglu` row-scaled: the same
    /// bits in the bf16 rows and in the f16 rows, every MX format, x per
    /// block and row-scaled, plain and routed, 1 / 4 / 16 rows, the
    /// small-step build (fast walks) and the default one.
    #[test]
    fn swiglu_in_the_epilogue_is_gate_up_then_swiglu() {
        let Some(gpu) = gpu() else { return };
        let l = Launcher::new(gpu.device(), true).unwrap();
        let st = &super::super::STANDARD;
        let k = LinearKernels {
            mma: ["", SMALL_STEP_VARIANT]
                .iter()
                .map(|v| MmaVariant::load(&gpu, st, v).unwrap())
                .collect(),
            f32w: gpu.kernel(st, "m3s_linear_f32w").unwrap(),
            x_f16: gpu.kernel(st, "m3s_x_f16").unwrap(),
        };
        let fsw = gpu.kernel(st, "m3s_swiglu").unwrap();
        let ctx = gpu.device();
        let mut rng = TestRng(41);
        let (alpha, limit) = (1.702f32, 7.0f32);
        let mut failures = Vec::new();
        for fmt in ["fp4", "e4m3", "e5m2", "nvfp4", "fp4-big"] {
            for &(n, kk) in &[(64usize, 256usize), (96, 2048)] {
                let stack = |rng: &mut TestRng| {
                    let ws: Vec<LinearWeight> = (0..2).map(|_| weight(fmt, n, kk, rng)).collect();
                    DevLinear::upload(ctx, "test", &ws.iter().collect::<Vec<_>>()).unwrap()
                };
                let (gate, up) = (stack(&mut rng), stack(&mut rng));
                for &m in &[1usize, 4, 16, 32] {
                    // gate and up outputs large enough to meet the clamp
                    let xs: Vec<u16> = (0..m * kk)
                        .map(|_| bf16::from_f32(8.0 * rng.unit()))
                        .collect();
                    let xd = DevBuf::from_slice(ctx, &xs).unwrap();
                    let (lx, _keep) = with_f16(&l, &k, xd.ptr(), None, m, kk);
                    let xrb = DevBuf::from_slice(ctx, &row_scaled_xh(&xs, m, kk)).unwrap();
                    let lx_row = LinX {
                        f16: Some(F16X {
                            rows: xrb.ptr(),
                            row_scaled: true,
                        }),
                        ..lx
                    };
                    let pairs = m * 2;
                    let rt = DevBuf::from_slice(ctx, &two_expert_route(m)).unwrap();
                    let routed = Route {
                        table: rt.ptr(),
                        slots: 2,
                        xdiv: 2,
                        x_rows: m,
                        chunk: 0,
                    };
                    for (vi, lxv, route, rows) in [
                        (0usize, lx, None, m),
                        (1, lx, None, m),
                        (1, lx_row, None, m),
                        (1, lx_row, Some(routed), pairs),
                        (0, lx_row, Some(routed), pairs),
                    ] {
                        let buf = |b: usize| DevBuf::zeroed(ctx, b).unwrap();
                        let (g, u, a0, a1) = (
                            buf(rows * n * 2),
                            buf(rows * n * 2),
                            buf(rows * n * 2),
                            buf(rows * n * 2),
                        );
                        let (h0, h1) = (buf(rows * xh_stride(n)), buf(rows * xh_stride(n)));
                        // reference: gate + up to bf16, then m3s_swiglu row-scaled
                        linears(
                            &l,
                            &k,
                            vi,
                            &[(&gate, LinOut::Bf16(g.ptr())), (&up, LinOut::Bf16(u.ptr()))],
                            lxv,
                            m,
                            route,
                            rows,
                        )
                        .unwrap();
                        super::super::pointwise::swiglu(
                            &l,
                            &fsw,
                            g.ptr(),
                            u.ptr(),
                            alpha,
                            limit,
                            a0.ptr(),
                            rows * n,
                            h0.ptr(),
                            n,
                            super::super::pointwise::swiglu_row_pe(alpha, limit).unwrap(),
                        )
                        .unwrap();
                        let o =
                            SwiGluOut::new(&gate, &up, a1.ptr(), h1.ptr(), alpha, limit).unwrap();
                        linears(
                            &l,
                            &k,
                            vi,
                            &[(&gate, LinOut::SwiGlu(o))],
                            lxv,
                            m,
                            route,
                            rows,
                        )
                        .unwrap();
                        l.sync().unwrap();
                        let read16 = |b: &DevBuf| {
                            let mut v = vec![0u16; rows * n];
                            b.read(l.stream(), 0, &mut v).unwrap();
                            v
                        };
                        let read8 = |b: &DevBuf| {
                            let mut v = vec![0u8; rows * xh_stride(n)];
                            b.read(l.stream(), 0, &mut v).unwrap();
                            v
                        };
                        let (want, got) = (read16(&a0), read16(&a1));
                        let differ = want.iter().zip(&got).filter(|(a, b)| a != b).count();
                        // not a vacuous comparison: values to compare, and
                        // (once a format and shape) the epilogue with gate
                        // and up swapped gives other bits
                        let nonzero = want.iter().filter(|&&b| b & 0x7fff != 0).count();
                        let control = m == 4
                            && vi == 1
                            && route.is_none()
                            && !lxv.f16.is_some_and(|h| h.row_scaled);
                        let mut swapped_same = false;
                        if control {
                            let (a2, h2) = (buf(rows * n * 2), buf(rows * xh_stride(n)));
                            let o2 = SwiGluOut::new(&up, &gate, a2.ptr(), h2.ptr(), alpha, limit)
                                .unwrap();
                            linears(
                                &l,
                                &k,
                                vi,
                                &[(&up, LinOut::SwiGlu(o2))],
                                lxv,
                                m,
                                route,
                                rows,
                            )
                            .unwrap();
                            l.sync().unwrap();
                            swapped_same = read16(&a2) == want;
                        }
                        let hdiff = read8(&h0)
                            .iter()
                            .zip(&read8(&h1))
                            .filter(|(a, b)| a != b)
                            .count();
                        if differ > 0 || hdiff > 0 || nonzero == 0 || swapped_same {
                            failures.push(format!(
                                "{fmt} [{n}, {kk}] m {m} variant {vi} row-scaled {} routed {}: \
                                 {differ} bf16 values, {hdiff} f16-row bytes differ ({nonzero} nonzero, gate and up swapped gave the same bits: {swapped_same})",
                                lxv.f16.is_some_and(|h| h.row_scaled),
                                route.is_some()
                            ));
                        }
                    }
                }
            }
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }

    /// The mono build halves the small-step linears' load batch
    /// (`S_UNROLL_HALF=1`, mono_prelude.h) and must still give the
    /// standard path's bits, so the fast walk deals K to the warps in
    /// granules of the full batch (`SHWalk::G`). Dealt by the halved batch,
    /// MXFP8's interleaved walks (2-16 rows) summed in another order
    /// (bench/NOTES.md session 28). Every MX format at 1, 4, 16, 32 and 64
    /// rows (the one-row, one-tile and two-tile walks), K = 6144 with x over
    /// 2^-6..2^6 so the f32 sums round: the default build, which splits K
    /// over 8 warps, must differ from the small-step one (the comparison
    /// sees an order change). The halved batch is tested as the mono build
    /// runs it, with its software-pipelined walks (mono.rs
    /// `MONO_DEFAULTS`); the full batch with every contiguous walk
    /// pipelined (`S_H_PIPE_ONE` / `S_H_PIPE_TILE`; FP8's one-tile walks are
    /// interleaved, never pipelined) must give the same bits too: they move
    /// loads, not sums. K = 6272 too: 49 super-chunks, warp runs of 13 and
    /// 10, so the pipelined walks end in a part batch. Routed launches of
    /// 16, 32 and 64 rows (MXFP4: the `_rs` entry, `S_ROUTED_SMALL`'s default)
    /// and of 4 rows under `S_ROUTED_TILE=1` (FP4: `_r8s`) give the
    /// general entry's bits (`S_ROUTED_SMALL=0`); plain launches dealt
    /// chunk-minor (the default at 32, 64 and 128 rows: 2, 4 and 8
    /// chunks) the tile-major grid's (`S_CHUNK_MINOR=0`).
    #[test]
    fn the_halved_batch_is_bitwise_the_full_one() {
        let Some(gpu) = gpu() else { return };
        let l = Launcher::new(gpu.device(), true).unwrap();
        let st = &super::super::STANDARD;
        let half = format!("{SMALL_STEP_VARIANT} S_UNROLL_HALF=1 S_H_PIPE_TILE=30 S_H_PIPE_ONE=4");
        let pipe =
            format!("{SMALL_STEP_VARIANT} S_H_PIPE_ONE=30 S_H_PIPE_TILE=30 S_H_ONE_UMUL_NV=1");
        // MXFP4 routed launches of 9-64 rows on the general entry point
        // (variant 0 takes the `_rs` one)
        let routed = format!("{SMALL_STEP_VARIANT} S_ROUTED_SMALL=0");
        // FP4 routed launches of 2-8 rows on the `_r8s` entry points
        let routed_tile = format!("{SMALL_STEP_VARIANT} S_ROUTED_TILE=1");
        // plain launches of several row chunks on the tile-major grid
        // (variant 0 deals them chunk-minor)
        let tile_major = format!("{SMALL_STEP_VARIANT} S_CHUNK_MINOR=0");
        let k = LinearKernels {
            mma: [
                SMALL_STEP_VARIANT,
                half.as_str(),
                "",
                pipe.as_str(),
                routed.as_str(),
                routed_tile.as_str(),
                tile_major.as_str(),
            ]
            .iter()
            .map(|v| MmaVariant::load(&gpu, st, v).unwrap())
            .collect(),
            f32w: gpu.kernel(st, "m3s_linear_f32w").unwrap(),
            x_f16: gpu.kernel(st, "m3s_x_f16").unwrap(),
        };
        // the routed comparison below is `_rs` against the general entry
        // only where the build has `_rs` (CUDA); elsewhere both are general
        let cuda = gpu.vendor() == Vendor::Cuda;
        assert_eq!(
            (k.mma[0].routed_small, k.mma[4].routed_small),
            (cuda, false),
            "which variants route MXFP4's 9-64-row launches to `_rs`"
        );
        assert_eq!(
            (k.mma[0].routed_tile, k.mma[5].routed_tile),
            (false, cuda),
            "which variants route FP4's 2-8-row launches to `_r8s`"
        );
        assert!(
            k.mma[0].chunk_minor && !k.mma[6].chunk_minor,
            "which variants deal row chunks chunk-minor"
        );
        let ctx = gpu.device();
        let mut rng = TestRng(43);
        let n = 32usize;
        let mut failures = Vec::new();
        for (fmt, kk) in ["e4m3", "e5m2", "fp4", "nvfp4"]
            .into_iter()
            .flat_map(|f| [(f, 6144usize), (f, 6272)])
        {
            let w = weight(fmt, n, kk, &mut rng);
            let dw = DevLinear::upload(ctx, "test", &[&w]).unwrap();
            for &m in &[1usize, 4, 16, 32, 64, 128] {
                let xs: Vec<u16> = (0..m * kk)
                    .map(|_| {
                        let e = (rng.next_u32() % 13) as i32 - 6;
                        bf16::from_f32((2.0 * rng.unit() - 1.0) * 2f32.powi(e))
                    })
                    .collect();
                let xd = DevBuf::from_slice(ctx, &xs).unwrap();
                let (lx, _keep) = with_f16(&l, &k, xd.ptr(), None, m, kk);
                let out = |vi: usize| {
                    let y = DevBuf::zeroed(ctx, m * n * 4).unwrap();
                    linears(&l, &k, vi, &[(&dw, LinOut::F32(y.ptr()))], lx, m, None, m).unwrap();
                    l.sync().unwrap();
                    let mut v = vec![0f32; m * n];
                    y.read(l.stream(), 0, &mut v).unwrap();
                    v
                };
                let differ = |a: &[f32], b: &[f32]| {
                    a.iter()
                        .zip(b)
                        .filter(|(x, y)| x.to_bits() != y.to_bits())
                        .count()
                };
                let full = out(0);
                let (halved, eight_warps) = (differ(&full, &out(1)), differ(&full, &out(2)));
                let piped = differ(&full, &out(3));
                // (2, 4 and 8 row chunks at 32, 64 and 128 rows: the same CTAs'
                // work, dealt chunk-minor; and below, a fused launch of two
                // matrices, 2 + 3 tiles, over 24 rows: a part chunk)
                let mut minor = differ(&full, &out(6));
                if m == 32 {
                    let n2 = 48usize;
                    let w2 = weight(fmt, n2, kk, &mut rng);
                    let dw2 = DevLinear::upload(ctx, "test", &[&w2]).unwrap();
                    let m2 = 24usize;
                    let fused = |vi: usize| {
                        let y1 = DevBuf::zeroed(ctx, m2 * n * 4).unwrap();
                        let y2 = DevBuf::zeroed(ctx, m2 * n2 * 4).unwrap();
                        let mats = [(&dw, LinOut::F32(y1.ptr())), (&dw2, LinOut::F32(y2.ptr()))];
                        linears(&l, &k, vi, &mats, lx, m2, None, m2).unwrap();
                        l.sync().unwrap();
                        let mut v = vec![0f32; m2 * (n + n2)];
                        y1.read(l.stream(), 0, &mut v[..m2 * n]).unwrap();
                        y2.read(l.stream(), 0, &mut v[m2 * n..]).unwrap();
                        v
                    };
                    minor += differ(&fused(0), &fused(6));
                }
                if halved > 0 || piped > 0 || eight_warps == 0 || minor > 0 {
                    failures.push(format!(
                        "{fmt} K {kk} m {m}: {halved} of {} outputs differ with the halved batch \
                         (mono's pipelined walks), {piped} pipelined, {minor} chunk-minor \
                         ({eight_warps} with K over 8 warps, which must differ)",
                        m * n
                    ));
                }
                // routed at 16, 32 and 64 rows (where `_rs` takes MXFP4), and at
                // 4 for the FP4 formats (`_r8s` under S_ROUTED_TILE): three
                // slots of 3m/4, 1 and m/4 - 1 of the 2m pairs (at 32 rows
                // the first slot's 24 span two 16-row CTAs), all routed to
                // the one matrix here (the 16-row, one-row and one-tile
                // walks); the other pairs' rows stay NaN in both, the
                // routed ones must not
                if (16..=64).contains(&m) || (m == 4 && dw.fmt.mma_kernel_routed_tile().is_some()) {
                    let pairs = 2 * m;
                    let stride = 2 + pairs;
                    let mut table = vec![0i32; 3 * stride];
                    let (a, b) = (3 * m as i32 / 4, 3 * m as i32 / 4 + 1);
                    for (slot, ids) in [(0usize, 0..a), (1, a..b), (2, b..m as i32)] {
                        table[slot * stride + 1] = ids.len() as i32;
                        for (i, p) in ids.enumerate() {
                            table[slot * stride + 2 + i] = p;
                        }
                    }
                    // `launch_m`: the launch's row count, which picks the
                    // entry point (the slots' rows come from the table)
                    let routed_out = |vi: usize, launch_m: usize| {
                        let rt = DevBuf::from_slice(ctx, &table).unwrap();
                        let y = DevBuf::from_slice(ctx, &vec![f32::NAN; pairs * n]).unwrap();
                        let route = Route {
                            table: rt.ptr(),
                            slots: 3,
                            xdiv: 2,
                            x_rows: m,
                            chunk: 0,
                        };
                        let mats = [(&dw, LinOut::F32(y.ptr()))];
                        linears(&l, &k, vi, &mats, lx, launch_m, Some(route), pairs).unwrap();
                        l.sync().unwrap();
                        let mut v = vec![0f32; pairs * n];
                        y.read(l.stream(), 0, &mut v).unwrap();
                        v
                    };
                    // against the general entry (variant 4), which picks a
                    // slot's walk by its rows: at 4 rows `_r8s` (variant
                    // 5; the general entry by a 16-row launch of the same
                    // table: NVFP4's one-row walk gives other bits than
                    // `_r8`'s one-tile walk), at 16, 32 and 64 `_rs` (0)
                    let (entry, rs, general) = if m <= 8 {
                        ("`_r8s`", routed_out(5, m), routed_out(4, 16))
                    } else {
                        ("`_rs`", routed_out(0, m), routed_out(4, m))
                    };
                    let unwritten = [&rs, &general]
                        .iter()
                        .map(|v| v[..m * n].iter().filter(|x| !x.is_finite()).count())
                        .sum::<usize>();
                    // the pairs no slot holds: never written
                    let stray = [&rs, &general]
                        .iter()
                        .map(|v| v[m * n..].iter().filter(|x| !x.is_nan()).count())
                        .sum::<usize>();
                    let rs_differ = differ(&general, &rs);
                    if rs_differ > 0 || unwritten > 0 || stray > 0 {
                        failures.push(format!(
                            "{fmt} K {kk} m {m}: {rs_differ} of {} routed outputs differ on the \
                             {entry} entry point, {unwritten} routed outputs not finite, {stray} \
                             outputs of unrouted pairs written",
                            pairs * n
                        ));
                    }
                }
            }
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }

    #[test]
    fn variants_match_an_f64_reference() {
        let Some(gpu) = gpu() else { return };
        let l = Launcher::new(gpu.device(), true).unwrap();
        let mut k = LinearKernels {
            mma: Vec::new(),
            f32w: gpu
                .kernel(&super::super::STANDARD, "m3s_linear_f32w")
                .unwrap(),
            x_f16: gpu.kernel(&super::super::STANDARD, "m3s_x_f16").unwrap(),
        };
        let variants = [
            "",
            SMALL_STEP_VARIANT,
            "S_MMA_WARPS=4",
            "S_MMA_WARPS=2",
            "S_MMA_MAXBT=2",
            // bench variant, not a default (standard_decode.cu, S_X_AHEAD)
            "S_MMA_WARPS=4 S_MMA_MAXBT=2 S_X_AHEAD=1 S_UNROLL_HALF=1",
            // the fast walk's other shapes (bench variants): every walk
            // interleaved over the warps, the one-tile walk's single batch,
            // NVFP4's chained sum
            "S_MMA_WARPS=4 S_MMA_MAXBT=2 S_MMA_INTERLEAVE=1 S_H_TILE_UMUL=1 S_NV_SPLIT=0",
            // MXFP4 routed launches of 9-64 rows on the general entry point
            "S_MMA_WARPS=4 S_MMA_MAXBT=2 S_ROUTED_SMALL=0",
        ];
        for v in variants {
            k.mma
                .push(MmaVariant::load(&gpu, &super::super::STANDARD, v).unwrap());
        }
        let ctx = gpu.device();
        let mut rng = TestRng(7);
        let mut failures = Vec::new();
        let mut any_scale_seen = (0usize, 0usize);
        for fmt in [
            "bf16",
            "e4m3",
            "fp4",
            "e5m2",
            "nvfp4",
            "nvfp4-wide",
            "fp4-big",
            "e4m3-big",
            "e5m2-big",
            "e4m3-nan",
            "fp4-nanscale",
            "e4m3-nanscale",
        ] {
            // K = 160: the last super-chunk partly past K; K = 1408 and
            // 2688: 11 and 21 super-chunks, so the fast walks' shares end in
            // part batches (2688: the one-tile walk's contiguous share of 6
            // is a batch of 4 and two single super-chunks)
            for &(n, kk) in &[
                (48usize, 128usize),
                (64, 1024),
                (40, 2048),
                (16, 512),
                (24, 160),
                (32, 1408),
                (16, 2688),
            ] {
                // 2 stacked matrices: plain mode uses the first, routed both
                let ws: Vec<LinearWeight> = (0..2).map(|_| weight(fmt, n, kk, &mut rng)).collect();
                let refs: Vec<&LinearWeight> = ws.iter().collect();
                let dev = DevLinear::upload(ctx, "test", &refs).unwrap();
                if dev.any_scale() != fmt.ends_with("-nanscale") {
                    failures.push(format!(
                        "{fmt} [{n}, {kk}]: any_scale {} (scales {:?})",
                        dev.any_scale(),
                        dev.fmt.fast_scales()
                    ));
                }
                if dev.any_scale() {
                    any_scale_seen.0 += 1;
                } else {
                    any_scale_seen.1 += 1;
                }
                let wf: Vec<Vec<f32>> = ws.iter().map(dequant).collect();
                for &m in &[1usize, 2, 7, 16] {
                    // rows of different magnitude (2^-6 .. 2^6): each its
                    // own power of two when row-scaled
                    let xs: Vec<u16> = (0..m * kk)
                        .map(|i| {
                            let sc = 2f32.powi(3 * (i / kk % 5) as i32 - 6);
                            bf16::from_f32(rng.unit() * sc)
                        })
                        .collect();
                    let xd = DevBuf::from_slice(ctx, &xs).unwrap();
                    let x = |r: usize, c: usize| f64::from(bf16::to_f32(xs[r * kk + c]));
                    // plain: y[r][o] = x[r] . W0[o]; (sum, sum of |products|)
                    // of expert e, x row r, output o, computed once for every
                    // variant and x form (recomputed per comparison they were
                    // 12% of the test's perf samples on the simulator)
                    let table: Vec<(f64, f64)> = (0..ws.len() * m * n)
                        .map(|i| {
                            let (e, r, o) = (i / (m * n), i / n % m, i % n);
                            let (mut s, mut a) = (0f64, 0f64);
                            for c in 0..kk {
                                let p = x(r, c) * f64::from(wf[e][o * kk + c]);
                                s += p;
                                a += p.abs();
                            }
                            (s, a)
                        })
                        .collect();
                    let want = |e: usize, r: usize, o: usize| table[(e * m + r) * n + o];
                    // outputs of `got` (rows of n) off the f64 reference by more
                    // than 1e-5 of the row's absolute sum; `which(row)` names the
                    // (expert, x row) the output row was computed from
                    let count_off =
                        |got: &[f32], n: usize, which: &dyn Fn(usize) -> (usize, usize)| {
                            let mut bad = 0;
                            for (r, out) in got.chunks(n).enumerate() {
                                let (e, xr) = which(r);
                                for (o, &g) in out.iter().enumerate() {
                                    let (s, a) = want(e, xr, o);
                                    // a NaN where a value is due (or the
                                    // reverse) is off too
                                    let off = if s.is_nan() {
                                        !g.is_nan()
                                    } else {
                                        let d = (f64::from(g) - s).abs();
                                        d.is_nan() || d > 1e-5 * a + 1e-30
                                    };
                                    if off {
                                        bad += 1;
                                    }
                                }
                            }
                            bad
                        };
                    let (lx, _keep) = with_f16(&l, &k, xd.ptr(), None, m, kk);
                    // the same x row-scaled (F16X::row_scaled), flagged or not
                    let xrb = DevBuf::from_slice(ctx, &row_scaled_xh(&xs, m, kk)).unwrap();
                    let lx_row = |on: bool| LinX {
                        f16: Some(F16X {
                            rows: xrb.ptr(),
                            row_scaled: on,
                        }),
                        ..lx
                    };
                    let plain = |vi: usize, lx: LinX| -> Vec<f32> {
                        let y = DevBuf::zeroed(ctx, m * n * 4).unwrap();
                        linears(&l, &k, vi, &[(&dev, LinOut::F32(y.ptr()))], lx, m, None, m)
                            .unwrap();
                        let mut got = vec![0f32; m * n];
                        y.read(l.stream(), 0, &mut got).unwrap();
                        got
                    };
                    let xforms: Vec<(LinX, &str)> = if fmt == "bf16" {
                        vec![(lx, "")]
                    } else {
                        vec![(lx, ""), (lx_row(true), " x/row")]
                    };
                    for (vi, v) in variants.iter().enumerate() {
                        for &(lx, xform) in &xforms {
                            let got = plain(vi, lx);
                            let bad = count_off(&got, n, &|r| (0, r));
                            if bad > 0 {
                                failures.push(format!(
                                "plain{xform} {fmt} [{n}, {kk}] m {m} variant `{v}`: {bad} of {} outputs off",
                                m * n
                            ));
                            }
                            // the flag moves x's exponent to the epilogue: the
                            // same bits as multiplying it in every block (but
                            // NVFP4's chained walks of several x rows, whose
                            // row-scaled form adds inside the tile products:
                            // S_NV_FOLD with S_NV_SPLIT=0)
                            let nv_fold =
                                fmt.starts_with("nvfp4") && m > 1 && v.contains("S_NV_SPLIT=0");
                            if !xform.is_empty() && !nv_fold {
                                let off = plain(vi, lx_row(false));
                                let differ = got
                                    .iter()
                                    .zip(&off)
                                    .filter(|(a, b)| {
                                        a.to_bits() != b.to_bits() && !(a.is_nan() && b.is_nan())
                                    })
                                    .count();
                                if differ > 0 {
                                    failures.push(format!(
                                    "plain {fmt} [{n}, {kk}] m {m} variant `{v}`: {differ} outputs differ \
                                     row-scaled with the flag and without"
                                ));
                                }
                            }
                            let pairs = m * 2;
                            let rt = DevBuf::from_slice(ctx, &two_expert_route(m)).unwrap();
                            let y = DevBuf::zeroed(ctx, pairs * n * 4).unwrap();
                            linears(
                                &l,
                                &k,
                                vi,
                                &[(&dev, LinOut::F32(y.ptr()))],
                                lx,
                                m,
                                Some(Route {
                                    table: rt.ptr(),
                                    slots: 2,
                                    xdiv: 2,
                                    x_rows: m,
                                    chunk: 0,
                                }),
                                pairs,
                            )
                            .unwrap();
                            let mut got = vec![0f32; pairs * n];
                            y.read(l.stream(), 0, &mut got).unwrap();
                            let bad = count_off(&got, n, &|p| ((p / 2 + p % 2) % 2, p / 2));
                            if bad > 0 {
                                failures.push(format!(
                                "routed{xform} {fmt} [{n}, {kk}] m {m} variant `{v}`: {bad} of {} outputs off",
                                pairs * n
                            ));
                            }
                        }
                    }
                }
            }
        }
        // fused pairs with bf16 and accumulating outputs, the runner's
        // shapes (gate/up of one x, then a down projection added into f32)
        for fmt in ["bf16", "e4m3"] {
            for &(n, kk) in &[
                (512usize, 1024usize),
                (1024, 512),
                (1024, 1024),
                (2048, 1024),
            ] {
                let wa = weight(fmt, n, kk, &mut rng);
                let wb = weight(fmt, n, kk, &mut rng);
                let (da, db) = (
                    DevLinear::upload(ctx, "a", &[&wa]).unwrap(),
                    DevLinear::upload(ctx, "b", &[&wb]).unwrap(),
                );
                let (fa, fb) = (dequant(&wa), dequant(&wb));
                for &m in &[1usize, 3, 16] {
                    let xs: Vec<u16> = (0..m * kk).map(|_| bf16::from_f32(rng.unit())).collect();
                    let xd = DevBuf::from_slice(ctx, &xs).unwrap();
                    let dot = |w: &[f32], r: usize, o: usize| -> f64 {
                        (0..kk)
                            .map(|c| {
                                f64::from(bf16::to_f32(xs[r * kk + c])) * f64::from(w[o * kk + c])
                            })
                            .sum()
                    };
                    let (lx, _keep) = with_f16(&l, &k, xd.ptr(), None, m, kk);
                    for (vi, v) in variants.iter().enumerate() {
                        let ya = DevBuf::zeroed(ctx, m * n * 2 + 64).unwrap();
                        let init: Vec<f32> = (0..m * n + 16).map(|i| i as f32 * 0.25).collect();
                        let yb = DevBuf::from_slice(ctx, &init).unwrap();
                        linears(
                            &l,
                            &k,
                            vi,
                            &[
                                (&da, LinOut::Bf16(ya.ptr())),
                                (&db, LinOut::AddF32(yb.ptr())),
                            ],
                            lx,
                            m,
                            None,
                            m,
                        )
                        .unwrap();
                        let mut ga = vec![0u16; m * n + 32];
                        ya.read(l.stream(), 0, &mut ga).unwrap();
                        let mut gb = vec![0f32; m * n + 16];
                        yb.read(l.stream(), 0, &mut gb).unwrap();
                        let mut bad = 0;
                        for r in 0..m {
                            for o in 0..n {
                                let want = dot(&fa, r, o) as f32;
                                let got = bf16::to_f32(ga[r * n + o]);
                                if (got - want).abs() > want.abs() / 64.0 + 1e-6 {
                                    bad += 1;
                                }
                                let want = init[r * n + o]
                                    + bf16::to_f32(bf16::from_f32(dot(&fb, r, o) as f32));
                                if (gb[r * n + o] - want).abs() > want.abs() / 64.0 + 1e-6 {
                                    bad += 1;
                                }
                            }
                        }
                        // nothing written past the outputs
                        let tail_a = ga[m * n..].iter().filter(|&&b| b != 0).count();
                        let tail_b = (m * n..m * n + 16).filter(|&i| gb[i] != init[i]).count();
                        if bad + tail_a + tail_b > 0 {
                            failures.push(format!(
                                "fused {fmt} [{n}, {kk}] m {m} variant `{v}`: {bad} outputs off, {tail_a} + {tail_b} written past the end"
                            ));
                        }
                    }
                }
            }
        }
        println!(
            "stacks on the any-scale kernels: {}, on the fast-scale ones: {}",
            any_scale_seen.0, any_scale_seen.1
        );
        for f in &failures {
            println!("{f}");
        }
        assert!(failures.is_empty(), "{} failing cases", failures.len());
    }
}
