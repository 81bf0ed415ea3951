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
            _ => self.mma_kernel(),
        }
    }

    /// E8M0 scale bytes the fast decode takes (E2M1 / E4M3: one bf16x2
    /// multiply by 2^bias x scale inside bf16's normal range; E5M2: one f32
    /// factor), or `None` where every scale is fast (`s_seg_frag` in
    /// standard_decode.cu).
    pub fn fast_scales(self) -> Option<std::ops::RangeInclusive<u8>> {
        match self {
            WFmt::Mxfp4 => Some(2..=128),
            WFmt::Mxfp8E4M3 => Some(17..=134),
            WFmt::Mxfp8E5M2 => Some(0..=142),
            _ => None,
        }
    }

    /// Whether stored `codes` and `scales` of this format all take the fast
    /// decode (see [`WFmt::mma_kernel_any_scale`]).
    pub fn fast_decode(self, codes: &[u8], scales: &[u8]) -> bool {
        let scales_ok = self
            .fast_scales()
            .is_none_or(|r| scales.iter().all(|s| r.contains(s)));
        // E5M2 codes with an all-ones exponent are Inf / NaN; E4M3's NaN
        // codes are 0x7F / 0xFF (the fast decode would read them as finite)
        let codes_ok = match self {
            WFmt::Mxfp8E5M2 => !any_byte_all_ones(codes, 0x7c),
            WFmt::Mxfp8E4M3 | WFmt::Ptpc => !any_byte_all_ones(codes, 0x7f),
            _ => true,
        };
        scales_ok && codes_ok
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
        let codes = DevBuf::new(ctx, fmt.code_bytes(rows, cols) * count)?;
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
            self.fmt.code_bytes(self.rows, self.cols) as u64,
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
        if codes.len() as u64 != cs {
            return Err(bad("codes", codes.len(), cs));
        }
        if scales.len() as u64 != ss {
            return Err(bad("scales", scales.len(), ss));
        }
        if !self.fmt.fast_decode(codes, scales) {
            self.any_scale.store(true, Ordering::Relaxed);
        }
        // the kernels read E2M1 / E4M3 codes in the device layout
        let codes = super::layout::to_device(self.fmt, codes);
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

/// Whether some byte `c` of `bytes` has `c & mask == mask`, for a `mask` of
/// contiguous bits below bit 7 (0x7f, 0x7c). Eight bytes a step on every
/// core: the load scans every E4M3 / E5M2 weight code with it. Per byte,
/// `(c & mask) + (0x80 - mask)` reaches bit 7 only when `c & mask == mask`,
/// and no byte's sum carries into the next.
fn any_byte_all_ones(bytes: &[u8], mask: u8) -> bool {
    use rayon::prelude::*;
    let (m, add) = (
        u64::from_ne_bytes([mask; 8]),
        u64::from_ne_bytes([0x80 - mask; 8]),
    );
    let hit = |w: u64| ((w & m) + add) & 0x8080_8080_8080_8080 != 0;
    bytes.par_chunks(1 << 20).any(|chunk| {
        let words = chunk.chunks_exact(8);
        let tail = words.remainder().iter().any(|&c| c & mask == mask);
        tail || words
            .map(|w| u64::from_ne_bytes(w.try_into().unwrap_or([0; 8])))
            .any(hit)
    })
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
    pub input_norm: DevBuf,
    pub post_norm: DevBuf,
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
    pub final_norm: DevBuf,
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
    use super::WFmt;

    /// Which stacks the launches send to the `_any` entry points: scale
    /// bytes outside each format's fast range, E5M2's Inf / NaN codes and
    /// E4M3's NaN codes.
    #[test]
    fn fast_decode_follows_the_kernels_ranges() {
        let ok = [0x11u8, 0x22];
        for (fmt, lo, hi) in [
            (WFmt::Mxfp4, 2u8, 128u8),
            (WFmt::Mxfp8E4M3, 17, 134),
            (WFmt::Mxfp8E5M2, 0, 142),
        ] {
            assert!(fmt.fast_decode(&ok, &[lo, hi, 127]), "{fmt:?}");
            if lo > 0 {
                assert!(!fmt.fast_decode(&ok, &[127, lo - 1]), "{fmt:?} below");
            }
            assert!(!fmt.fast_decode(&ok, &[hi + 1]), "{fmt:?} above");
            assert!(!fmt.fast_decode(&ok, &[0xff]), "{fmt:?} NaN scale");
            assert_ne!(fmt.mma_kernel(), fmt.mma_kernel_any_scale());
        }
        // E5M2: an all-ones exponent (+-Inf 0x7c / 0xfc, NaN 0x7d..0x7f) is slow
        for c in [0x7cu8, 0xfc, 0x7d, 0xff] {
            assert!(!WFmt::Mxfp8E5M2.fast_decode(&[0x3c, c], &[127]), "{c:#x}");
        }
        assert!(WFmt::Mxfp8E5M2.fast_decode(&[0x7b, 0xfb, 0x00], &[127]));
        // E4M3: only the NaN codes 0x7f / 0xff (448 = 0x7e is a value)
        for c in [0x7fu8, 0xff] {
            assert!(!WFmt::Mxfp8E4M3.fast_decode(&[0x3c, c], &[127]), "{c:#x}");
        }
        assert!(WFmt::Mxfp8E4M3.fast_decode(&[0x7e, 0xfe, 0x7c, 0xfd, 0x00], &[127]));
        // E2M1 has no NaN: every code is fast
        assert!(WFmt::Mxfp4.fast_decode(&[0xff, 0x77], &[127]));
        // no scale-dependent branch: always fast, one entry point
        for fmt in [WFmt::Bf16, WFmt::Nvfp4] {
            assert!(fmt.fast_decode(&[0xff], &[0xff]));
            assert_eq!(fmt.mma_kernel(), fmt.mma_kernel_any_scale());
        }
    }

    /// The word-wise scan equals the byte-by-byte definition, at every
    /// position (word-aligned or in the tail) and for both masks.
    #[test]
    fn any_byte_all_ones_is_the_byte_rule() {
        for mask in [0x7fu8, 0x7c] {
            for len in [0usize, 1, 7, 8, 9, 23, 64] {
                for c in 0..=255u8 {
                    for pos in [0, len / 2, len.saturating_sub(1)] {
                        if len == 0 && pos > 0 {
                            continue;
                        }
                        let mut v = vec![0x3cu8 & !mask; len];
                        if len > 0 {
                            v[pos] = c;
                        }
                        let want = v.iter().any(|&b| b & mask == mask);
                        assert_eq!(
                            super::any_byte_all_ones(&v, mask),
                            want,
                            "mask {mask:#x} len {len} byte {c:#x} at {pos}"
                        );
                    }
                }
            }
        }
    }
}
