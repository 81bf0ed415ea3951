//! Element-wise and row kernels of the GPU backend (`kernels/elementwise.cu`):
//! weights in their stored format for the generic kernels (embedding rows,
//! whole-weight decode, an f32-out linear for the router, the LM head and
//! f32 weights), bf16 conversions, residual add, SwiGLU-OAI, RoPE and the
//! KV-cache store. All on device buffers; the backend moves host data.

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use m3_core::formats::MxElem;
use m3_core::weights::LinearWeight;

use super::{as_u32, grid_1d};
use crate::error::{GpuError, Result};
use crate::kernels::KernelSource;
use crate::CudaGpu;

/// Element-wise kernels; compiled without FMA contraction so each element
/// follows cpu-ref's operation order.
pub const ELEMENTWISE: KernelSource = KernelSource {
    name: "elementwise",
    body: include_str!("../../../kernels/elementwise.cu"),
    exact: true,
    entries: &[
        "m3_decode_rows",
        "m3_linear_generic",
        "m3_round_bf16",
        "m3_to_bf16",
        "m3_from_bf16",
        "m3_add",
        "m3_swiglu",
        "m3_rope",
        "m3_cache_encode",
        "m3_cache_encode_nvfp4",
    ],
};

/// Threads per block of the one-warp-per-item kernels (a multiple of
/// either warp width).
pub(crate) const WARP_BLOCK: u32 = 256;

/// A launch with one warp of `warp` lanes (the device's `M3_WARP`: 32 on
/// CUDA, 64 on CDNA) per item; the kernels index items by
/// `blockDim.x / M3_WARP`, so the block count must use the same width.
pub(crate) fn grid_warps(op: &'static str, items: usize, warp: u32) -> Result<LaunchConfig> {
    let per = (WARP_BLOCK / warp) as usize;
    let blocks = u32::try_from(items.div_ceil(per).max(1))
        .map_err(|_| GpuError::input(op, format!("{items} items is too many")))?;
    Ok(LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (WARP_BLOCK, 1, 1),
        shared_mem_bytes: 0,
    })
}

/// Storage kinds shared with elementwise.cu (`M3_W_*`).
const W_BF16: i32 = 0;
const W_F32: i32 = 1;
const W_MX: i32 = 2;
const W_NVFP4: i32 = 3;

/// A weight on the device in its stored format: raw codes (bf16 bits, f32,
/// or packed element codes) plus scale bytes and the NVFP4 global scale.
pub struct DeviceWeight {
    kind: i32,
    elem: i32,
    pub rows: usize,
    pub cols: usize,
    codes: CudaSlice<u8>,
    scales: CudaSlice<u8>,
    global: f32,
}

impl DeviceWeight {
    /// Device bytes held (codes + scales).
    pub fn bytes(&self) -> usize {
        self.codes.len() + self.scales.len()
    }
}

macro_rules! launch {
    ($name:literal, $b:expr, $cfg:expr) => {
        // SAFETY: the arguments pushed match the kernel's parameter list in
        // number, order and type, and every buffer is sized by the caller's
        // checks for the indices the kernel reads and writes.
        unsafe { $b.launch($cfg) }
            .map(|_| ())
            .map_err(|e| $crate::GpuError::driver(concat!("cuLaunchKernel ", $name), e))
    };
}
pub(crate) use launch;

impl CudaGpu {
    /// Upload a weight in its stored format (no conversion).
    pub fn upload_weight(&self, w: &LinearWeight) -> Result<DeviceWeight> {
        let (rows, cols) = (w.rows(), w.cols());
        let (kind, elem, codes, scales, global) = match w {
            LinearWeight::Bf16 { data, .. } => (
                W_BF16,
                0,
                self.upload::<u8>(bytemuck::cast_slice(data))?,
                None,
                1.0,
            ),
            LinearWeight::F32 { data, .. } => (
                W_F32,
                0,
                self.upload::<u8>(bytemuck::cast_slice(data))?,
                None,
                1.0,
            ),
            LinearWeight::Mx(t) => (
                W_MX,
                super::formats::elem_id(t.elem()),
                self.upload(t.codes())?,
                Some(self.upload(t.scales())?),
                1.0,
            ),
            LinearWeight::Nvfp4(t) => (
                W_NVFP4,
                super::formats::elem_id(MxElem::Fp4E2M1),
                self.upload(t.codes())?,
                Some(self.upload(t.scales())?),
                t.global(),
            ),
        };
        let scales = match scales {
            Some(s) => s,
            None => self.zeros::<u8>(1)?,
        };
        Ok(DeviceWeight {
            kind,
            elem,
            rows,
            cols,
            codes,
            scales,
            global,
        })
    }

    /// `out[i, :] = W[ids[i], :]` decoded to f32 (`n` ids).
    pub fn decode_rows_dev(
        &self,
        w: &DeviceWeight,
        ids: &CudaSlice<u32>,
        n: usize,
        out: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let f = self.function(&ELEMENTWISE, "m3_decode_rows")?;
        let (c32, n32) = (
            as_u32("decode_rows", "cols", w.cols)?,
            as_u32("decode_rows", "n", n)?,
        );
        let mut b = self.stream().launch_builder(&f);
        b.arg(&w.kind)
            .arg(&w.elem)
            .arg(&w.codes)
            .arg(&w.scales)
            .arg(&w.global)
            .arg(&c32)
            .arg(ids)
            .arg(&n32)
            .arg(out);
        launch!("m3_decode_rows", b, grid_1d("decode_rows", n * w.cols)?)
    }

    /// `y [m, N] = x [m, K] W^T` in f32 for any stored format; `round_in`
    /// rounds x to bf16 first, `round_out` rounds y.
    pub fn linear_generic_dev(
        &self,
        w: &DeviceWeight,
        x: &CudaSlice<f32>,
        m: usize,
        round_in: bool,
        round_out: bool,
        y: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let f = self.function(&ELEMENTWISE, "m3_linear_generic")?;
        let (m32, n32, k32) = (
            as_u32("linear", "m", m)?,
            as_u32("linear", "n", w.rows)?,
            as_u32("linear", "k", w.cols)?,
        );
        let (ri, ro) = (round_in as i32, round_out as i32);
        let mut b = self.stream().launch_builder(&f);
        b.arg(&w.kind)
            .arg(&w.elem)
            .arg(&w.codes)
            .arg(&w.scales)
            .arg(&w.global)
            .arg(x)
            .arg(&m32)
            .arg(&n32)
            .arg(&k32)
            .arg(&ri)
            .arg(&ro)
            .arg(y);
        launch!(
            "m3_linear_generic",
            b,
            grid_warps("linear", m * w.rows, self.warp())?
        )
    }

    /// f32 -> bf16 bits, `n` values.
    pub fn to_bf16_dev(&self, x: &CudaSlice<f32>, y: &mut CudaSlice<u16>, n: usize) -> Result<()> {
        let f = self.function(&ELEMENTWISE, "m3_to_bf16")?;
        let n32 = as_u32("to_bf16", "n", n)?;
        let mut b = self.stream().launch_builder(&f);
        b.arg(x).arg(y).arg(&n32);
        launch!("m3_to_bf16", b, grid_1d("to_bf16", n)?)
    }

    /// bf16 bits -> f32, `n` values.
    pub fn from_bf16_dev(
        &self,
        x: &CudaSlice<u16>,
        y: &mut CudaSlice<f32>,
        n: usize,
    ) -> Result<()> {
        let f = self.function(&ELEMENTWISE, "m3_from_bf16")?;
        let n32 = as_u32("from_bf16", "n", n)?;
        let mut b = self.stream().launch_builder(&f);
        b.arg(x).arg(y).arg(&n32);
        launch!("m3_from_bf16", b, grid_1d("from_bf16", n)?)
    }

    /// `y = f32(bf16(x))`, `n` values.
    pub fn round_bf16_dev(
        &self,
        x: &CudaSlice<f32>,
        y: &mut CudaSlice<f32>,
        n: usize,
    ) -> Result<()> {
        let f = self.function(&ELEMENTWISE, "m3_round_bf16")?;
        let n32 = as_u32("round_bf16", "n", n)?;
        let mut b = self.stream().launch_builder(&f);
        b.arg(x).arg(y).arg(&n32);
        launch!("m3_round_bf16", b, grid_1d("round_bf16", n)?)
    }

    /// `acc += x`, `n` values.
    pub fn add_dev(&self, acc: &mut CudaSlice<f32>, x: &CudaSlice<f32>, n: usize) -> Result<()> {
        let f = self.function(&ELEMENTWISE, "m3_add")?;
        let n32 = as_u32("add", "n", n)?;
        let mut b = self.stream().launch_builder(&f);
        b.arg(acc).arg(x).arg(&n32);
        launch!("m3_add", b, grid_1d("add", n)?)
    }

    /// SwiGLU-OAI of `n` (gate, up) pairs, bf16-rounded f32 out.
    #[allow(clippy::too_many_arguments)]
    pub fn swiglu_dev(
        &self,
        gate: &CudaSlice<f32>,
        up: &CudaSlice<f32>,
        alpha: f32,
        limit: f32,
        out: &mut CudaSlice<f32>,
        n: usize,
    ) -> Result<()> {
        let f = self.function(&ELEMENTWISE, "m3_swiglu")?;
        let n32 = as_u32("swiglu", "n", n)?;
        let mut b = self.stream().launch_builder(&f);
        b.arg(gate)
            .arg(up)
            .arg(&alpha)
            .arg(&limit)
            .arg(out)
            .arg(&n32);
        launch!("m3_swiglu", b, grid_1d("swiglu", n)?)
    }

    /// Partial NeoX RoPE in place on `x` `[t, heads, d]` (f32).
    #[allow(clippy::too_many_arguments)]
    pub fn rope_dev(
        &self,
        x: &mut CudaSlice<f32>,
        pos: &CudaSlice<u32>,
        theta: f64,
        heads: usize,
        d: usize,
        rd: usize,
        t: usize,
        round_out: bool,
    ) -> Result<()> {
        let f = self.function(&ELEMENTWISE, "m3_rope")?;
        let (h32, d32, rd32, t32) = (
            as_u32("rope", "heads", heads)?,
            as_u32("rope", "head_dim", d)?,
            as_u32("rope", "rotary_dim", rd)?,
            as_u32("rope", "rows", t)?,
        );
        let ro = round_out as i32;
        let mut b = self.stream().launch_builder(&f);
        b.arg(x)
            .arg(pos)
            .arg(&theta)
            .arg(&h32)
            .arg(&d32)
            .arg(&rd32)
            .arg(&t32)
            .arg(&ro);
        launch!("m3_rope", b, grid_1d("rope", t * heads)?)
    }

    /// KV-cache store of `n` values: bf16 bits into `o16`, or (fp8)
    /// `e4m3_sat(x / scale)` codes into `o8`.
    pub fn cache_encode_dev(
        &self,
        x: &CudaSlice<f32>,
        n: usize,
        fp8: bool,
        scale: f32,
        o16: &mut CudaSlice<u16>,
        o8: &mut CudaSlice<u8>,
    ) -> Result<()> {
        let f = self.function(&ELEMENTWISE, "m3_cache_encode")?;
        let n32 = as_u32("cache_write", "n", n)?;
        let fp = fp8 as i32;
        let mut b = self.stream().launch_builder(&f);
        b.arg(x).arg(&n32).arg(&fp).arg(&scale).arg(o16).arg(o8);
        launch!("m3_cache_encode", b, grid_1d("cache_write", n)?)
    }

    /// NVFP4 KV-cache store of `nblocks` blocks of 16 values of `x` with
    /// global scale `g` (`m3_cache_encode_nvfp4`): packed codes
    /// `[nblocks * 8]`, E4M3 block scales `[nblocks]`, bit-identical with
    /// `m3_core::formats::convert::cache_store_nvfp4`.
    pub fn cache_encode_nvfp4_dev(
        &self,
        x: &CudaSlice<f32>,
        nblocks: usize,
        g: f32,
        codes: &mut CudaSlice<u8>,
        scales: &mut CudaSlice<u8>,
    ) -> Result<()> {
        let op = "cache_write";
        if x.len() < nblocks * 16 || codes.len() < nblocks * 8 || scales.len() < nblocks {
            return Err(GpuError::input(
                op,
                format!(
                    "{nblocks} NVFP4 blocks from {} values into {} code bytes and {} scale bytes",
                    x.len(),
                    codes.len(),
                    scales.len()
                ),
            ));
        }
        let f = self.function(&ELEMENTWISE, "m3_cache_encode_nvfp4")?;
        let n32 = as_u32(op, "blocks", nblocks)?;
        let mut b = self.stream().launch_builder(&f);
        b.arg(x).arg(&n32).arg(&g).arg(codes).arg(scales);
        launch!("m3_cache_encode_nvfp4", b, grid_1d(op, nblocks)?)
    }
}
