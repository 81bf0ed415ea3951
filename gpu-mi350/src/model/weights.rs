//! The model's weights resident on the device, one allocation per tensor
//! (routed experts of a layer stacked into one allocation per projection so
//! a kernel can pick an expert chosen on the device by its id).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use m3_core::checkpoint::WeightFormat;
use m3_core::config::ModelConfig;
use m3_core::formats::convert::PtpcFp8;
use m3_core::formats::MxElem;
use m3_core::weights::{LinearWeight, ModelWeights};

use super::devmem::DevBuf;
use crate::error::{GpuError, Result};
use crate::runtime::api::Device;

/// Rows of a routed launch (the step's x rows) that take MXFP4's
/// [`WFmt::mma_kernel_routed_entry`]: past one 8-row tile, where the tile
/// entry no longer holds the step, up to the wide steps of 64 rows. Such a
/// step routes most slots 1-4 rows, whose one-row and one-tile walks ran
/// 8-10% faster L2-fed at 5 CTAs an SM than at the general entry's 4, the
/// 16-row walk 12% slower (H100, bench/NOTES.md sessions 44-45).
pub const ROUTED_SMALL_ROWS: std::ops::RangeInclusive<usize> = 9..=64;

/// Storage format of a device weight (what the standard path's linear
/// kernels read; the same bytes as the checkpoint stores).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WFmt {
    Bf16,
    /// MXFP8 E4M3 codes + E8M0 scale per 32 along `in`.
    Mxfp8E4M3,
    /// MXFP8 E5M2 codes + E8M0 scale per 32 along `in`.
    Mxfp8E5M2,
    /// MXFP4 E2M1 codes (two a byte, low nibble first) + E8M0 scale per 32.
    Mxfp4,
    /// NVFP4: E2M1 codes + E4M3 scale per 16 + one f32 global scale per
    /// matrix (kept in [`DevLinear::globals`]).
    Nvfp4,
    F32,
    /// PTPC FP8 (`--online-quant ptpc_fp8`, made at load): E4M3 codes and
    /// one f32 scale per output row ([`DevLinear::chan`]). The tensor-core
    /// kernel reads it as MXFP8 E4M3 whose block scales are all 2^0 (E8M0
    /// 127, written at load), so its f32 sum is the exact products of the
    /// codes' values; the row scale and the token's scale (`m3s_act_ptpc`)
    /// multiply the sum in the epilogue. Never fused with another format
    /// (its x is the quantized one).
    Ptpc,
}

impl WFmt {
    /// The formats with a tensor-core kernel.
    pub const MMA: [WFmt; 5] = [
        WFmt::Bf16,
        WFmt::Mxfp8E4M3,
        WFmt::Mxfp8E5M2,
        WFmt::Mxfp4,
        WFmt::Nvfp4,
    ];

    /// Code bytes of a `[rows, cols]` matrix.
    pub fn code_bytes(self, rows: usize, cols: usize) -> usize {
        match self {
            WFmt::Bf16 => rows * cols * 2,
            WFmt::Mxfp8E4M3 | WFmt::Mxfp8E5M2 | WFmt::Ptpc => rows * cols,
            WFmt::Mxfp4 | WFmt::Nvfp4 => rows * cols / 2,
            WFmt::F32 => rows * cols * 4,
        }
    }

    /// Device code bytes of a `[rows, cols]` matrix: [`Self::code_bytes`]
    /// of its [`super::layout::device_rows`] (E2M1: whole 16-row tiles).
    pub fn device_code_bytes(self, rows: usize, cols: usize) -> usize {
        self.code_bytes(super::layout::device_rows(self, rows), cols)
    }

    /// Scale bytes of a `[rows, cols]` matrix (E8M0 per 32 for MX and for
    /// PTPC's unit block scales, E4M3 per 16 for NVFP4).
    pub fn scale_bytes(self, rows: usize, cols: usize) -> usize {
        match self {
            WFmt::Mxfp8E4M3 | WFmt::Mxfp8E5M2 | WFmt::Mxfp4 | WFmt::Ptpc => rows * cols / 32,
            WFmt::Nvfp4 => rows * cols / 16,
            WFmt::Bf16 | WFmt::F32 => 0,
        }
    }

    /// The tensor-core kernel entry point for stacks that pass
    /// [`WFmt::fast_decode`] (every real checkpoint's), where the format
    /// has one.
    pub fn mma_kernel(self) -> Option<&'static str> {
        match self {
            WFmt::Bf16 => Some("m3s_mma_bf16"),
            WFmt::Mxfp8E4M3 | WFmt::Ptpc => Some("m3s_mma_e4m3"),
            WFmt::Mxfp8E5M2 => Some("m3s_mma_e5m2"),
            WFmt::Mxfp4 => Some("m3s_mma_fp4"),
            WFmt::Nvfp4 => Some("m3s_mma_nvfp4"),
            WFmt::F32 => None,
        }
    }

    /// The small-step build's entry points for one x row and for one 8-row
    /// x tile (`s_h_fast` in standard_decode.cu: each holds one walk, so
    /// fewer registers and more CTAs an SM), where the fast entry point
    /// reads x as f16; `rows` is the most rows one CTA can get.
    pub fn mma_kernel_rows(self, rows: usize) -> Option<&'static str> {
        let (one, tile) = match self {
            WFmt::Mxfp8E4M3 | WFmt::Ptpc => ("m3s_mma_e4m3_r1", "m3s_mma_e4m3_r8"),
            WFmt::Mxfp8E5M2 => ("m3s_mma_e5m2_r1", "m3s_mma_e5m2_r8"),
            WFmt::Mxfp4 => ("m3s_mma_fp4_r1", "m3s_mma_fp4_r8"),
            WFmt::Nvfp4 => ("m3s_mma_nvfp4_r1", "m3s_mma_nvfp4_r8"),
            WFmt::Bf16 | WFmt::F32 => return None,
        };
        match rows {
            1 => Some(one),
            2..=8 => Some(tile),
            _ => None,
        }
    }

    /// The small-step build's entry point for routed launches of
    /// [`ROUTED_SMALL_ROWS`] rows (`S_ROUTED_SMALL`, default on), where most
    /// slots hold 1-4 rows: MXFP4's general walks at more CTAs an SM.
    /// `None` for the other formats (the general entry; NVFP4's form was
    /// measured and not kept, bench/NOTES.md session 45).
    pub fn mma_kernel_routed_entry(self) -> Option<&'static str> {
        (self == WFmt::Mxfp4).then_some("m3s_mma_fp4_rs")
    }

    /// The small-step build's entry point for routed launches of 2-8 rows
    /// under `S_ROUTED_TILE=1` (a bench option): a slot of one row by the
    /// one-row walk, as the general entry runs it, where the `_r8` entry
    /// runs every slot by the one-tile walk. `None` for formats without
    /// one.
    pub fn mma_kernel_routed_tile(self) -> Option<&'static str> {
        match self {
            WFmt::Mxfp4 => Some("m3s_mma_fp4_r8s"),
            WFmt::Nvfp4 => Some("m3s_mma_nvfp4_r8s"),
            _ => None,
        }
    }

    /// [`WFmt::mma_kernel_routed_entry`] where a routed launch of `rows`
    /// rows takes it; `None` for other counts (the general entry, or the
    /// one-row / one-tile ones of [`WFmt::mma_kernel_rows`]).
    pub fn mma_kernel_routed(self, rows: usize) -> Option<&'static str> {
        self.mma_kernel_routed_entry()
            .filter(|_| ROUTED_SMALL_ROWS.contains(&rows))
    }

    /// The entry point for any block scale and code: MXFP4, MXFP8 E4M3 and
    /// E5M2 decode a scale outside [`WFmt::fast_scales`] (and E5M2's Inf /
    /// NaN, E4M3's NaN codes) on a slower exact path, which the fast
    /// entry point leaves out (bench/NOTES.md session 6 run 6: ~10% of the
    /// batch-1 step).
    pub fn mma_kernel_any_scale(self) -> Option<&'static str> {
        match self {
            WFmt::Mxfp8E4M3 | WFmt::Ptpc => Some("m3s_mma_e4m3_any"),
            WFmt::Mxfp8E5M2 => Some("m3s_mma_e5m2_any"),
            WFmt::Mxfp4 => Some("m3s_mma_fp4_any"),
            WFmt::Nvfp4 => Some("m3s_mma_nvfp4_any"),
            _ => self.mma_kernel(),
        }
    }

    /// E8M0 scale bytes the fast entry points take (`s_h_factor` in
    /// standard_decode.cu: one f32 factor 2^(e - 121) for E2M1 read as E4M3,
    /// 2^(e - 127) for E4M3 / E5M2), or `None` where every scale is fast.
    /// Codes never matter: E4M3's NaN and E5M2's Inf / NaN codes become f16
    /// NaN / Inf through the same conversion as values.
    pub fn fast_scales(self) -> Option<std::ops::RangeInclusive<u8>> {
        match self {
            WFmt::Mxfp4 => Some(0..=248),
            WFmt::Mxfp8E4M3 | WFmt::Mxfp8E5M2 | WFmt::Ptpc => Some(1..=254),
            _ => None,
        }
    }

    /// Whether the stored `scales` of this format all take the fast entry
    /// point (see [`WFmt::mma_kernel_any_scale`]).
    pub fn fast_decode(self, scales: &[u8]) -> bool {
        self.fast_scales()
            .is_none_or(|r| scales.iter().all(|s| r.contains(s)))
    }

    /// Whether the tensor-core kernel reads x as f16 fragments
    /// (`s_mmh_linear`: the MX formats and PTPC's E4M3 codes).
    pub fn f16_x(self) -> bool {
        matches!(
            self,
            WFmt::Mxfp4 | WFmt::Nvfp4 | WFmt::Mxfp8E4M3 | WFmt::Mxfp8E5M2 | WFmt::Ptpc
        )
    }

    /// The device format of a host weight.
    pub fn of(w: &LinearWeight) -> WFmt {
        match w {
            LinearWeight::Bf16 { .. } => WFmt::Bf16,
            LinearWeight::F32 { .. } => WFmt::F32,
            LinearWeight::Mx(t) => match t.elem() {
                MxElem::Fp4E2M1 => WFmt::Mxfp4,
                MxElem::Fp8E4M3 => WFmt::Mxfp8E4M3,
                MxElem::Fp8E5M2 => WFmt::Mxfp8E5M2,
            },
            LinearWeight::Nvfp4(_) => WFmt::Nvfp4,
        }
    }

    /// The device format of a checkpoint weight format.
    pub fn of_stored(f: WeightFormat) -> WFmt {
        match f {
            WeightFormat::Bf16 => WFmt::Bf16,
            WeightFormat::F32 => WFmt::F32,
            WeightFormat::Mxfp4 => WFmt::Mxfp4,
            WeightFormat::Mxfp8E4M3 => WFmt::Mxfp8E4M3,
            WeightFormat::Mxfp8E5M2 => WFmt::Mxfp8E5M2,
            WeightFormat::Nvfp4 => WFmt::Nvfp4,
        }
    }
}

/// `count` stacked `[rows, cols]` matrices of one format (count 1 for an
/// ordinary linear, the number of experts for a routed projection).
pub struct DevLinear {
    pub fmt: WFmt,
    pub rows: usize,
    pub cols: usize,
    pub count: usize,
    pub codes: DevBuf,
    pub scales: Option<DevBuf>,
    /// NVFP4: the f32 global scale of each matrix (`count` values).
    pub globals: Option<DevBuf>,
    /// PTPC: the f32 scale of each output row (`count * rows` values).
    pub chan: Option<DevBuf>,
    /// Some written block scale (or E5M2 / E4M3 special code) needs the
    /// general decode
    /// ([`WFmt::fast_decode`]): the launches take
    /// [`WFmt::mma_kernel_any_scale`].
    any_scale: AtomicBool,
}

impl DevLinear {
    /// Uninitialised storage.
    pub fn alloc(ctx: &Device, fmt: WFmt, rows: usize, cols: usize, count: usize) -> Result<Self> {
        if !cols.is_multiple_of(32) || rows == 0 || count == 0 {
            return Err(GpuError::input(
                "device weights",
                format!("[{rows}, {cols}] x {count}: in-dimension must be a multiple of 32"),
            ));
        }
        let codes = DevBuf::new(ctx, fmt.device_code_bytes(rows, cols) * count)?;
        let sb = fmt.scale_bytes(rows, cols) * count;
        let scales = if sb > 0 {
            Some(DevBuf::new(ctx, sb)?)
        } else {
            None
        };
        let globals = if fmt == WFmt::Nvfp4 {
            Some(DevBuf::new(ctx, 4 * count)?)
        } else {
            None
        };
        let chan = if fmt == WFmt::Ptpc {
            Some(DevBuf::new(ctx, 4 * rows * count)?)
        } else {
            None
        };
        Ok(DevLinear {
            fmt,
            rows,
            cols,
            count,
            codes,
            scales,
            globals,
            chan,
            any_scale: AtomicBool::new(false),
        })
    }

    /// Whether some block scale needs the any-scale kernel.
    pub fn any_scale(&self) -> bool {
        self.any_scale.load(Ordering::Relaxed)
    }

    /// Bytes one matrix of the stack occupies (codes + scales).
    pub fn matrix_bytes(&self) -> usize {
        self.fmt.code_bytes(self.rows, self.cols) + self.fmt.scale_bytes(self.rows, self.cols)
    }

    /// Device bytes of the whole stack.
    pub fn bytes(&self) -> usize {
        self.matrix_bytes() * self.count
            + self.globals.as_ref().map_or(0, |g| g.bytes())
            + self.chan.as_ref().map_or(0, |c| c.bytes())
    }

    /// Per-matrix strides (codes, scales) in bytes.
    pub fn strides(&self) -> (u64, u64) {
        (
            self.fmt.device_code_bytes(self.rows, self.cols) as u64,
            self.fmt.scale_bytes(self.rows, self.cols) as u64,
        )
    }

    /// Write matrix `i` of the stack from its stored parts (`codes`,
    /// `scales`, NVFP4 `global`), synchronously. Sizes are checked. Codes
    /// are given in the stored layout and kept in the device layout
    /// ([`super::layout`]). PTPC: `scales` are the f32 row scales
    /// (little-endian bytes, 4 a row); the unit block scales are written here.
    pub fn write(&self, i: usize, codes: &[u8], scales: &[u8], global: f32) -> Result<()> {
        if self.fmt == WFmt::Ptpc {
            if i >= self.count || scales.len() != 4 * self.rows {
                return Err(GpuError::input(
                    "device weights",
                    format!(
                        "PTPC matrix {i} of {}: {} row-scale bytes for {} rows",
                        self.count,
                        scales.len(),
                        self.rows
                    ),
                ));
            }
            if let Some(c) = &self.chan {
                c.write_sync(4 * self.rows * i, scales)?;
            }
            let unit = vec![127u8; self.fmt.scale_bytes(self.rows, self.cols)];
            return self.write_parts(i, codes, &unit, global);
        }
        self.write_parts(i, codes, scales, global)
    }

    /// [`Self::write`] of the parts the kernels read as they are.
    fn write_parts(&self, i: usize, codes: &[u8], scales: &[u8], global: f32) -> Result<()> {
        let (cs, ss) = self.strides();
        let bad = |what: &str, got: usize, want: u64| {
            GpuError::input(
                "device weights",
                format!(
                    "{what}: {got} bytes for a [{}, {}] {:?} matrix (expected {want})",
                    self.rows, self.cols, self.fmt
                ),
            )
        };
        if i >= self.count {
            return Err(GpuError::input(
                "device weights",
                format!("matrix {i} of a stack of {}", self.count),
            ));
        }
        let stored = self.fmt.code_bytes(self.rows, self.cols) as u64;
        if codes.len() as u64 != stored {
            return Err(bad("codes", codes.len(), stored));
        }
        if scales.len() as u64 != ss {
            return Err(bad("scales", scales.len(), ss));
        }
        if !self.fmt.fast_decode(scales) {
            self.any_scale.store(true, Ordering::Relaxed);
        }
        // the kernels read E2M1 / E4M3 codes in the device layout
        let codes = super::layout::to_device(self.fmt, codes, self.cols);
        self.codes.write_sync(i * cs as usize, &codes)?;
        if let Some(s) = &self.scales {
            s.write_sync(i * ss as usize, scales)?;
        }
        if let Some(g) = &self.globals {
            g.write_sync(4 * i, &global.to_le_bytes())?;
        }
        Ok(())
    }

    /// Upload PTPC FP8 weights (all the same shape) as one stack.
    pub fn upload_ptpc(ctx: &Device, name: &str, ws: &[&PtpcFp8]) -> Result<Self> {
        let bad = |why: String| GpuError::input("device weights", format!("{name}: {why}"));
        let first = ws.first().ok_or_else(|| bad("no matrices".into()))?;
        let d = Self::alloc(ctx, WFmt::Ptpc, first.rows, first.cols, ws.len())
            .map_err(|e| bad(e.to_string()))?;
        for (i, w) in ws.iter().enumerate() {
            if (w.rows, w.cols) != (first.rows, first.cols) {
                return Err(bad("stacked matrices differ in shape".into()));
            }
            d.write(i, &w.codes, bytemuck::cast_slice(&w.scales), 1.0)
                .map_err(|e| bad(e.to_string()))?;
        }
        Ok(d)
    }

    /// Upload `ws` (all the same format and shape) as one stack.
    pub fn upload(ctx: &Device, name: &str, ws: &[&LinearWeight]) -> Result<Self> {
        let bad = |why: String| GpuError::input("device weights", format!("{name}: {why}"));
        let first = ws.first().ok_or_else(|| bad("no matrices".into()))?;
        let (rows, cols) = (first.rows(), first.cols());
        let fmt = WFmt::of(first);
        let d = Self::alloc(ctx, fmt, rows, cols, ws.len()).map_err(|e| bad(e.to_string()))?;
        for (i, w) in ws.iter().enumerate() {
            if WFmt::of(w) != fmt || w.rows() != rows || w.cols() != cols {
                return Err(bad("stacked matrices differ in format or shape".into()));
            }
            let (codes, scales, global): (&[u8], &[u8], f32) = match w {
                LinearWeight::Bf16 { data, .. } => (bytemuck::cast_slice(data), &[], 1.0),
                LinearWeight::F32 { data, .. } => (bytemuck::cast_slice(data), &[], 1.0),
                LinearWeight::Mx(t) => (t.codes(), t.scales(), 1.0),
                LinearWeight::Nvfp4(t) => (t.codes(), t.scales(), t.global()),
            };
            d.write(i, codes, scales, global)
                .map_err(|e| bad(e.to_string()))?;
        }
        Ok(d)
    }
}

/// Gate (w1), up (w3), down (w2); stacked over experts for routed MLPs.
pub struct DevMlp {
    pub gate: DevLinear,
    pub up: DevLinear,
    pub down: DevLinear,
}

impl DevMlp {
    /// Bytes of one (expert's) MLP.
    pub fn matrix_bytes(&self) -> usize {
        self.gate.matrix_bytes() + self.up.matrix_bytes() + self.down.matrix_bytes()
    }
}

/// An RMSNorm weight on the device (f32 `[n]`) and the constant its
/// kernel takes for a row-scaled f16 output (`m3s_rmsnorm`'s `xrow`):
/// max |1 + w| over the weight as f32 bits, computed once here (session
/// 23's kernel read the whole weight for it in every CTA of every launch).
pub struct DevNorm {
    pub w: DevBuf,
    /// [`norm_bound`] of the weight.
    pub bound: u32,
}

impl DevNorm {
    /// Upload `w` and compute its bound.
    pub fn new(ctx: &Device, w: &[f32]) -> Result<Self> {
        Ok(DevNorm {
            w: DevBuf::from_slice(ctx, w)?,
            bound: norm_bound(w),
        })
    }

    /// A weight already on the device whose values the host holds in `w`.
    pub fn resident(dev: DevBuf, w: &[f32]) -> Self {
        DevNorm {
            w: dev,
            bound: norm_bound(w),
        }
    }

    /// The kernel's `xrow` argument: the bound when the f16 rows are
    /// row-scaled, 0 when they are scaled a block at a time.
    pub fn xrow_arg(&self, row_scaled: bool) -> u32 {
        if row_scaled {
            self.bound
        } else {
            0
        }
    }

    pub fn ptr(&self) -> u64 {
        self.w.ptr()
    }

    pub fn bytes(&self) -> usize {
        self.w.bytes()
    }
}

/// max |1 + w| over `w` as f32 bits, as session 23's kernel computed it in
/// every CTA (`fmaxf(m, fabsf(1.0f + w))`: the same roundings; NaN values
/// left out as fmaxf leaves them; an infinite value gives Inf's bits, which
/// the kernel takes as "no bound": p = 1). Never 0, which the kernel's
/// argument reserves for "a block at a time": a zero bound (every w = -1,
/// or none) is -0.0's bits, which the kernel reads as 0.
pub fn norm_bound(w: &[f32]) -> u32 {
    let m = w
        .iter()
        .map(|&v| (1.0f32 + v).abs())
        .filter(|a| !a.is_nan())
        .fold(0.0f32, f32::max);
    if m == 0.0 {
        (-0.0f32).to_bits()
    } else {
        m.to_bits()
    }
}

pub struct DevIndexer {
    pub q: DevLinear,
    pub k: DevLinear,
    pub q_norm: DevBuf,
    pub k_norm: DevBuf,
    pub k_scale: f32,
}

/// Size difference between the variants is irrelevant: one per layer.
#[allow(clippy::large_enum_variant)]
pub enum DevFfn {
    Dense(DevMlp),
    Moe {
        /// `[experts, H]`, f32 or bf16; logits f32.
        router: DevLinear,
        bias: DevBuf,
        /// Stacked over experts; with `folded`, one more: the shared expert
        /// at index `num_local_experts`.
        experts: DevMlp,
        /// The shared expert on its own (`None` when folded).
        shared: Option<DevMlp>,
        /// The shared expert is the last matrix of the expert stacks
        /// (`--fold-shared-expert`): it runs in the routed experts' grouped
        /// launches as one more expert every row chooses, its output added
        /// unscaled after the routed sum, as MODEL.md adds it.
        folded: bool,
    },
}

pub struct DevLayer {
    pub input_norm: DevNorm,
    pub post_norm: DevNorm,
    pub q: DevLinear,
    pub k: DevLinear,
    pub v: DevLinear,
    pub o: DevLinear,
    pub q_norm: DevBuf,
    pub k_norm: DevBuf,
    pub indexer: Option<DevIndexer>,
    pub k_scale: f32,
    pub v_scale: f32,
    pub ffn: DevFfn,
}

/// The whole text model on the device.
pub struct DevModel {
    pub config: ModelConfig,
    /// `[vocab, H]` bf16 (shared with a DSpark draft on the device).
    pub embed: Arc<DevBuf>,
    pub layers: Vec<DevLayer>,
    pub final_norm: DevNorm,
    /// Shared with a DSpark draft on the device.
    pub lm_head: Arc<DevLinear>,
}

impl DevModel {
    /// Upload host weights `m` (weights stay resident).
    pub fn upload(ctx: &Device, m: &ModelWeights) -> Result<Self> {
        DevModel::load(ctx, &super::load::WeightSource::Host(m), false, &mut |_| {})
    }
}

#[cfg(test)]
mod tests {
    use super::{norm_bound, WFmt};

    /// The RMSNorm bound: max |1 + w| as the kernel's fmaxf took it (NaN
    /// left out, Inf kept: the kernel's "no bound"), and never 0 (the
    /// kernel's "per block"): -0.0 for a zero bound.
    #[test]
    fn norm_bound_is_max_abs_one_plus_w() {
        assert_eq!(norm_bound(&[0.25, -2.5, 0.5]), 1.5f32.to_bits());
        assert_eq!(norm_bound(&[-0.125, 0.0]), 1.0f32.to_bits());
        // 1 + w rounds in f32 as the kernel's 1.0f + w does: 1 + 2^-25 and 1 - 2^-26 are 1
        assert_eq!(norm_bound(&[2f32.powi(-25)]), 1.0f32.to_bits());
        assert_eq!(norm_bound(&[-2f32.powi(-26), -0.5]), 1.0f32.to_bits());
        assert_eq!(norm_bound(&[0.5, f32::NAN, 3.0]), 4.0f32.to_bits());
        assert_eq!(norm_bound(&[f32::INFINITY, 1.0]), f32::INFINITY.to_bits());
        assert_eq!(norm_bound(&[-1.0, -1.0]), 0x8000_0000);
        assert_eq!(norm_bound(&[f32::NAN]), 0x8000_0000);
        assert_eq!(norm_bound(&[]), 0x8000_0000);
    }

    /// Which stacks the launches send to the `_any` entry points: scale
    /// bytes outside each format's fast range; codes never.
    #[test]
    fn fast_decode_follows_the_kernels_ranges() {
        for (fmt, lo, hi) in [
            (WFmt::Mxfp4, 0u8, 248u8),
            (WFmt::Mxfp8E4M3, 1, 254),
            (WFmt::Mxfp8E5M2, 1, 254),
        ] {
            assert!(fmt.fast_decode(&[lo, hi, 127]), "{fmt:?}");
            if lo > 0 {
                assert!(!fmt.fast_decode(&[127, lo - 1]), "{fmt:?} below");
            }
            assert!(!fmt.fast_decode(&[hi + 1]), "{fmt:?} above");
            assert!(!fmt.fast_decode(&[0xff]), "{fmt:?} NaN scale");
            assert_ne!(fmt.mma_kernel(), fmt.mma_kernel_any_scale());
        }
        // no scale-dependent branch
        for fmt in [WFmt::Bf16, WFmt::Nvfp4] {
            assert!(fmt.fast_decode(&[0xff]));
        }
        // K not a multiple of 128 takes NVFP4 to its own any entry point
        assert_ne!(WFmt::Nvfp4.mma_kernel(), WFmt::Nvfp4.mma_kernel_any_scale());
        assert_eq!(WFmt::Bf16.mma_kernel(), WFmt::Bf16.mma_kernel_any_scale());
    }
}
