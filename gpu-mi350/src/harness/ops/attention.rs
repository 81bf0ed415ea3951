//! Indexer block scores, block top-k and attention over the paged cache
//! (`kernels/attention.cu`, MODEL.md 3.6-3.7), on device buffers.

use cudarc::driver::{CudaSlice, PushKernelArg};

use super::elementwise::{grid_warps, launch};
use super::{as_u32, grid_1d};
use crate::error::{GpuError, Result};
use crate::kernels::KernelSource;
use crate::CudaGpu;

/// Indexer and attention kernels.
pub const ATTENTION: KernelSource = KernelSource {
    name: "attention",
    body: include_str!("../../../kernels/attention.cu"),
    exact: true,
    entries: &["m3_index_scores", "m3_block_topk", "m3_attention"],
};

/// Largest head_dim the attention kernel holds per warp (`M3_ATT_PER *
/// M3_WARP` in attention.cu), for the narrower warp (CUDA's 32 lanes), so
/// one bound holds on both vendors.
pub const MAX_HEAD_DIM: usize = 16 * crate::kernels::Vendor::Cuda.warp() as usize;

/// The step's row -> slot mapping on the device: positions, the sequence of
/// each row, and every sequence's block table concatenated (`bt_off[s]` is
/// where sequence `s` starts in `bt`).
pub struct DeviceStep {
    pub rows: usize,
    pub page: usize,
    pos: CudaSlice<u32>,
    row_seq: CudaSlice<u32>,
    bt: CudaSlice<u32>,
    bt_off: CudaSlice<u32>,
}

/// What a harness cache buffer holds: the kernels' `kind` argument
/// (`M3_CACHE_*` in attention.cu; a test holds the values equal).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(i32)]
pub enum CacheKind {
    /// bf16 bits.
    Bf16 = 0,
    /// E4M3 codes, read `e4m3 * scale`.
    Fp8 = 1,
    /// NVFP4: packed E2M1 codes `[slot][width / 2]` plus E4M3 block scales
    /// `[slot][width / 16]`, read `e2m1 * e4m3(s) * scale` (the scale is
    /// the global; ARCHITECTURE.md, *NVFP4 KV cache*).
    Nvfp4 = 2,
}

/// A cache tensor's raw bytes on the device and how to read them.
pub struct DeviceCache {
    /// bf16 bits, E4M3 codes or packed E2M1 codes, as `m3_core::kv::CacheData`.
    pub data: CudaSlice<u8>,
    /// NVFP4 block scales (E4M3 bytes); `None` for the other kinds.
    pub scales: Option<CudaSlice<u8>>,
    pub kind: CacheKind,
    /// The per-tensor scale: fp8's, NVFP4's global (unused by bf16).
    pub scale: f32,
}

impl DeviceCache {
    /// The block scales the kernels take: the NVFP4 ones, or `dummy` (never
    /// read) for the other kinds. An NVFP4 cache without scales is refused.
    fn scales_or<'a>(
        &'a self,
        dummy: &'a CudaSlice<u8>,
        op: &'static str,
    ) -> Result<&'a CudaSlice<u8>> {
        match (&self.scales, self.kind) {
            (Some(s), _) => Ok(s),
            (None, CacheKind::Nvfp4) => Err(GpuError::input(
                op,
                "an NVFP4 cache tensor without its block scales",
            )),
            (None, _) => Ok(dummy),
        }
    }
}

impl CudaGpu {
    /// Upload a step's tables (the caller has checked every row's pages).
    pub fn upload_step(
        &self,
        positions: &[u32],
        row_seq: &[u32],
        tables: &[&[u32]],
        page: usize,
    ) -> Result<DeviceStep> {
        let mut bt = Vec::new();
        let mut off = Vec::with_capacity(tables.len());
        for t in tables {
            off.push(as_u32("step", "block table offset", bt.len())?);
            bt.extend_from_slice(t);
        }
        if bt.is_empty() {
            bt.push(0);
        }
        if off.is_empty() {
            off.push(0);
        }
        Ok(DeviceStep {
            rows: positions.len(),
            page,
            pos: self.upload(positions)?,
            row_seq: self.upload(row_seq)?,
            bt: self.upload(&bt)?,
            bt_off: self.upload(&off)?,
        })
    }

    /// Block scores `out [heads, T, nb]` of `q [T, heads, dim]`.
    #[allow(clippy::too_many_arguments)]
    pub fn index_scores_dev(
        &self,
        q: &CudaSlice<f32>,
        heads: usize,
        dim: usize,
        cache: &DeviceCache,
        step: &DeviceStep,
        bs: usize,
        nb: usize,
        out: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let f = self.function(&ATTENTION, "m3_index_scores")?;
        let op = "index_scores";
        let (h32, d32, p32, bs32, nb32, t32) = (
            as_u32(op, "heads", heads)?,
            as_u32(op, "dim", dim)?,
            as_u32(op, "page", step.page)?,
            as_u32(op, "block_size", bs)?,
            as_u32(op, "nb", nb)?,
            as_u32(op, "rows", step.rows)?,
        );
        let kind = cache.kind as i32;
        let dummy = self.zeros::<u8>(1)?;
        let scales = cache.scales_or(&dummy, op)?;
        let mut b = self.stream().launch_builder(&f);
        b.arg(q)
            .arg(&h32)
            .arg(&d32)
            .arg(&cache.data)
            .arg(scales)
            .arg(&kind)
            .arg(&cache.scale)
            .arg(&step.pos)
            .arg(&step.row_seq)
            .arg(&step.bt)
            .arg(&step.bt_off)
            .arg(&p32)
            .arg(&bs32)
            .arg(&nb32)
            .arg(&t32)
            .arg(out);
        launch!("m3_index_scores", b, grid_1d(op, heads * step.rows * nb)?)
    }

    /// Block top-k of `scores [heads, T, nb]` into `out [kv_heads, T, topk]`.
    #[allow(clippy::too_many_arguments)]
    pub fn block_topk_dev(
        &self,
        scores: &CudaSlice<f32>,
        heads: usize,
        nb: usize,
        pos: &CudaSlice<u32>,
        t: usize,
        bs: usize,
        topk: usize,
        init: usize,
        local: usize,
        shared: bool,
        kv_heads: usize,
        out: &mut CudaSlice<i32>,
    ) -> Result<()> {
        let f = self.function(&ATTENTION, "m3_block_topk")?;
        let op = "block_topk";
        let mut flags = self.zeros::<u8>(kv_heads * t * nb)?;
        let v = [heads, nb, bs, topk, init, local, kv_heads, t]
            .iter()
            .map(|&n| as_u32(op, "size", n))
            .collect::<Result<Vec<u32>>>()?;
        let sh = shared as i32;
        let mut b = self.stream().launch_builder(&f);
        b.arg(scores)
            .arg(&v[0])
            .arg(&v[1])
            .arg(pos)
            .arg(&v[2])
            .arg(&v[3])
            .arg(&v[4])
            .arg(&v[5])
            .arg(&sh)
            .arg(&v[6])
            .arg(&v[7])
            .arg(out)
            .arg(&mut flags);
        launch!("m3_block_topk", b, grid_1d(op, kv_heads * t)?)
    }

    /// Attention of `q [T, heads, d]` over the paged `k`/`v`; `blocks`
    /// (`[kv_heads, T, topk]` ids, with `topk` and the block size) selects
    /// sparse attention. `out [T, heads, d]` bf16 values.
    #[allow(clippy::too_many_arguments)]
    pub fn attention_dev(
        &self,
        q: &CudaSlice<f32>,
        heads: usize,
        kv_heads: usize,
        d: usize,
        k: &DeviceCache,
        v: &DeviceCache,
        step: &DeviceStep,
        blocks: Option<(&CudaSlice<i32>, usize, usize)>,
        out: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let op = "attention";
        if d > MAX_HEAD_DIM || k.kind != v.kind {
            return Err(GpuError::input(
                op,
                format!("head_dim {d} (max {MAX_HEAD_DIM}) or mixed K/V dtypes"),
            ));
        }
        let f = self.function(&ATTENTION, "m3_attention")?;
        let dummy;
        let (ids, topk, bs, has) = match blocks {
            Some((ids, topk, bs)) => (ids, topk, bs, 1i32),
            None => {
                dummy = self.zeros::<i32>(1)?;
                (&dummy, 0, 1, 0)
            }
        };
        let (h32, kv32, d32, p32, k32, bs32, t32) = (
            as_u32(op, "heads", heads)?,
            as_u32(op, "kv_heads", kv_heads)?,
            as_u32(op, "head_dim", d)?,
            as_u32(op, "page", step.page)?,
            as_u32(op, "topk", topk)?,
            as_u32(op, "block_size", bs)?,
            as_u32(op, "rows", step.rows)?,
        );
        let kind = k.kind as i32;
        let sdummy = self.zeros::<u8>(1)?;
        let (ksc, vsc) = (k.scales_or(&sdummy, op)?, v.scales_or(&sdummy, op)?);
        let mut b = self.stream().launch_builder(&f);
        b.arg(q)
            .arg(&h32)
            .arg(&kv32)
            .arg(&d32)
            .arg(&k.data)
            .arg(&v.data)
            .arg(ksc)
            .arg(vsc)
            .arg(&kind)
            .arg(&k.scale)
            .arg(&v.scale)
            .arg(&step.pos)
            .arg(&step.row_seq)
            .arg(&step.bt)
            .arg(&step.bt_off)
            .arg(&p32)
            .arg(&has)
            .arg(ids)
            .arg(&k32)
            .arg(&bs32)
            .arg(&t32)
            .arg(out);
        launch!(
            "m3_attention",
            b,
            grid_warps(op, step.rows * heads, self.warp())?
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kind values are attention.cu's M3_CACHE_* defines.
    #[test]
    fn cache_kinds_match_the_kernel() {
        let d = |n: &str| crate::kernels::define(ATTENTION.body, n);
        assert_eq!(d("M3_CACHE_BF16"), Some(CacheKind::Bf16 as u64));
        assert_eq!(d("M3_CACHE_FP8"), Some(CacheKind::Fp8 as u64));
        assert_eq!(d("M3_CACHE_NVFP4"), Some(CacheKind::Nvfp4 as u64));
    }
}
