//! Linear layers `y = x W^T` (bf16 rows in, f32 accumulate, bf16 out) with
//! device-resident weights in bf16, MXFP8, MXFP4 or NVFP4.

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use m3_core::formats::{MxElem, MxTensor, Nvfp4Tensor};

use super::check_len;
use crate::error::{GpuError, Result};
use crate::kernels::LINEAR;
use crate::CudaGpu;

/// Rows of x one launch handles (M3_LIN_MAXM in linear.cu).
pub const MAX_M_PER_LAUNCH: usize = 8;
/// Threads per block of the linear kernels (a multiple of any warp size):
/// `M3_LIN_THREADS`, which HIP builds them for (a larger block would not
/// launch there).
const LIN_THREADS: u32 = 256;

/// Weight storage formats the linear kernels read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightFormat {
    Bf16,
    Mxfp8E4M3,
    Mxfp8E5M2,
    Mxfp4,
    Nvfp4,
}

impl WeightFormat {
    /// Bytes of element storage of an `[n, k]` weight (scales excluded).
    pub fn code_bytes(self, n: usize, k: usize) -> usize {
        match self {
            WeightFormat::Bf16 => 2 * n * k,
            WeightFormat::Mxfp8E4M3 | WeightFormat::Mxfp8E5M2 => n * k,
            WeightFormat::Mxfp4 | WeightFormat::Nvfp4 => n * k / 2,
        }
    }
    /// Scale bytes of an `[n, k]` weight.
    pub fn scale_bytes(self, n: usize, k: usize) -> usize {
        match self {
            WeightFormat::Bf16 => 0,
            WeightFormat::Nvfp4 => n * k / 16,
            _ => n * k / 32,
        }
    }
    /// The generation `Auto` picks for `m` rows.
    fn resolve(self, kernel: LinearKernel, m: usize) -> LinearKernel {
        match kernel {
            LinearKernel::Auto => {
                let fp4 = matches!(self, WeightFormat::Mxfp4 | WeightFormat::Nvfp4);
                if m <= 1 || (m == 2 && !fp4) {
                    LinearKernel::V3
                } else {
                    LinearKernel::V2
                }
            }
            k => k,
        }
    }
    fn entry(self, kernel: LinearKernel) -> &'static str {
        match (self, kernel) {
            (_, LinearKernel::Auto) => self.entry(LinearKernel::V2),
            (WeightFormat::Bf16, LinearKernel::V2) => "m3_linear_bf16",
            (WeightFormat::Mxfp8E4M3, LinearKernel::V2) => "m3_linear_mxfp8_e4m3",
            (WeightFormat::Mxfp8E5M2, LinearKernel::V2) => "m3_linear_mxfp8_e5m2",
            (WeightFormat::Mxfp4, LinearKernel::V2) => "m3_linear_mxfp4",
            (WeightFormat::Nvfp4, LinearKernel::V2) => "m3_linear_nvfp4",
            (WeightFormat::Bf16, LinearKernel::V1) => "m3_linear_bf16_v1",
            (WeightFormat::Mxfp8E4M3, LinearKernel::V1) => "m3_linear_mxfp8_e4m3_v1",
            (WeightFormat::Mxfp8E5M2, LinearKernel::V1) => "m3_linear_mxfp8_e5m2_v1",
            (WeightFormat::Mxfp4, LinearKernel::V1) => "m3_linear_mxfp4_v1",
            (WeightFormat::Nvfp4, LinearKernel::V1) => "m3_linear_nvfp4_v1",
            (WeightFormat::Bf16, LinearKernel::V3) => "m3_linear_bf16_v3",
            (WeightFormat::Mxfp8E4M3, LinearKernel::V3) => "m3_linear_mxfp8_e4m3_v3",
            (WeightFormat::Mxfp8E5M2, LinearKernel::V3) => "m3_linear_mxfp8_e5m2_v3",
            (WeightFormat::Mxfp4, LinearKernel::V3) => "m3_linear_mxfp4_v3",
            (WeightFormat::Nvfp4, LinearKernel::V3) => "m3_linear_nvfp4_v3",
        }
    }
    /// Output rows one warp computes (M3Rows in linear.cu for v2).
    fn rows_per_warp(self, kernel: LinearKernel) -> u32 {
        match (self, kernel) {
            (_, LinearKernel::V1) => 1,
            (_, LinearKernel::Auto) => self.rows_per_warp(LinearKernel::V2),
            (WeightFormat::Mxfp4 | WeightFormat::Nvfp4, LinearKernel::V2) => 2,
            (_, LinearKernel::V2) => 4,
            (WeightFormat::Mxfp4 | WeightFormat::Nvfp4, LinearKernel::V3) => 4,
            (_, LinearKernel::V3) => 8,
        }
    }
    /// Rows of x one launch handles (M3_LIN_MAXM / M3_LIN3_MAXM).
    fn max_m(kernel: LinearKernel) -> usize {
        match kernel {
            LinearKernel::V3 => 2,
            _ => MAX_M_PER_LAUNCH,
        }
    }
}

/// Which linear kernel generation to launch (older ones are kept to compare
/// against in the same run, as bench/NOTES.md records).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum LinearKernel {
    /// The fastest generation measured on the H200 for this M and format
    /// (bench/NOTES.md, session 1): v3 for M = 1 (and M = 2 outside FP4),
    /// else v2.
    #[default]
    Auto,
    /// One warp per output row, select-chain decoders (session 1 baseline).
    V1,
    /// Several rows per warp sharing each x chunk, shift-and-multiply decoders.
    V2,
    /// More rows per warp, weights re-decoded per x row: for M <= 2.
    V3,
}

/// A linear weight `[n, k]` on the device.
pub struct DeviceLinear {
    pub format: WeightFormat,
    pub n: usize,
    pub k: usize,
    codes: CudaSlice<u8>,
    scales: CudaSlice<u8>,
    global: f32,
}

impl DeviceLinear {
    /// Bytes a full pass over the weight reads (codes + scales).
    pub fn bytes(&self) -> usize {
        self.format.code_bytes(self.n, self.k) + self.format.scale_bytes(self.n, self.k)
    }
}

impl CudaGpu {
    /// Upload a weight from raw parts: bf16 bits as little-endian bytes
    /// (`2 n k`), or packed codes + scale bytes (+ NVFP4 global scale).
    pub fn upload_linear(
        &self,
        format: WeightFormat,
        n: usize,
        k: usize,
        codes: &[u8],
        scales: &[u8],
        global: f32,
    ) -> Result<DeviceLinear> {
        if !k.is_multiple_of(32) || n == 0 {
            return Err(GpuError::input(
                "upload_linear",
                format!("shape [{n}, {k}]: k must be a multiple of 32, n > 0"),
            ));
        }
        check_len(
            "upload_linear",
            "codes",
            codes.len(),
            format.code_bytes(n, k),
        )?;
        check_len(
            "upload_linear",
            "scales",
            scales.len(),
            format.scale_bytes(n, k),
        )?;
        if format == WeightFormat::Nvfp4 && !global.is_finite() {
            return Err(GpuError::input(
                "upload_linear",
                format!("NVFP4 global scale {global} is not finite"),
            ));
        }
        let c = self.upload(codes)?;
        let s = if scales.is_empty() {
            self.zeros::<u8>(1)?
        } else {
            self.upload(scales)?
        };
        Ok(DeviceLinear {
            format,
            n,
            k,
            codes: c,
            scales: s,
            global,
        })
    }

    /// Upload a bf16 weight `[n, k]` given as bf16 bits.
    pub fn upload_linear_bf16(&self, n: usize, k: usize, w: &[u16]) -> Result<DeviceLinear> {
        self.upload_linear(WeightFormat::Bf16, n, k, bytemuck::cast_slice(w), &[], 1.0)
    }

    /// Upload an MX tensor (MXFP4 or MXFP8) as a linear weight.
    pub fn upload_linear_mx(&self, t: &MxTensor) -> Result<DeviceLinear> {
        let f = match t.elem() {
            MxElem::Fp4E2M1 => WeightFormat::Mxfp4,
            MxElem::Fp8E4M3 => WeightFormat::Mxfp8E4M3,
            MxElem::Fp8E5M2 => WeightFormat::Mxfp8E5M2,
        };
        self.upload_linear(f, t.rows(), t.cols(), t.codes(), t.scales(), 1.0)
    }

    /// Upload an NVFP4 tensor as a linear weight.
    pub fn upload_linear_nvfp4(&self, t: &Nvfp4Tensor) -> Result<DeviceLinear> {
        self.upload_linear(
            WeightFormat::Nvfp4,
            t.rows(),
            t.cols(),
            t.codes(),
            t.scales(),
            t.global(),
        )
    }

    /// `y[m, n] = bf16(sum_k x[m, k] W[n, k])` on device buffers: x `[m, k]`
    /// bf16 bits, y `[m, n]`. Launches ceil(m / 8) kernels.
    pub fn linear_into(
        &self,
        w: &DeviceLinear,
        x: &CudaSlice<u16>,
        m: usize,
        y: &mut CudaSlice<u16>,
    ) -> Result<()> {
        self.linear_into_with(w, x, m, y, LinearKernel::default())
    }

    /// [`linear_into`](Self::linear_into) with an explicit kernel generation.
    pub fn linear_into_with(
        &self,
        w: &DeviceLinear,
        x: &CudaSlice<u16>,
        m: usize,
        y: &mut CudaSlice<u16>,
        kernel: LinearKernel,
    ) -> Result<()> {
        if x.len() < m * w.k || y.len() < m * w.n {
            return Err(GpuError::input(
                "linear",
                format!(
                    "x holds {} (needs {}), y holds {} (needs {})",
                    x.len(),
                    m * w.k,
                    y.len(),
                    m * w.n
                ),
            ));
        }
        let kernel = w.format.resolve(kernel, m);
        let f = self.function(&LINEAR, w.format.entry(kernel))?;
        let (n32, k32) = (w.n as u32, w.k as u32);
        let rows_per_block = LIN_THREADS / self.warp() * w.format.rows_per_warp(kernel);
        let cfg = LaunchConfig {
            grid_dim: ((w.n as u32).div_ceil(rows_per_block), 1, 1),
            block_dim: (LIN_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut m0 = 0;
        while m0 < m {
            let mc = (m - m0).min(WeightFormat::max_m(kernel));
            let xv = x.slice(m0 * w.k..(m0 + mc) * w.k);
            let mut yv = y.slice_mut(m0 * w.n..(m0 + mc) * w.n);
            let mc32 = mc as u32;
            let mut b = self.stream().launch_builder(&f);
            b.arg(&xv).arg(&w.codes);
            if w.format != WeightFormat::Bf16 {
                b.arg(&w.scales);
            }
            if w.format == WeightFormat::Nvfp4 {
                b.arg(&w.global);
            }
            b.arg(&mut yv).arg(&mc32).arg(&n32).arg(&k32);
            unsafe { b.launch(cfg) }
                .map_err(|e| GpuError::driver("cuLaunchKernel m3_linear", e))?;
            m0 += mc;
        }
        Ok(())
    }

    /// Host wrapper of [`linear_into`](Self::linear_into).
    pub fn linear(&self, w: &DeviceLinear, x: &[u16], m: usize) -> Result<Vec<u16>> {
        self.linear_with(w, x, m, LinearKernel::default())
    }

    /// [`linear`](Self::linear) with an explicit kernel generation.
    pub fn linear_with(
        &self,
        w: &DeviceLinear,
        x: &[u16],
        m: usize,
        kernel: LinearKernel,
    ) -> Result<Vec<u16>> {
        check_len("linear", "x", x.len(), m * w.k)?;
        let dx = self.upload(x)?;
        let mut dy = self.zeros::<u16>(m * w.n)?;
        self.linear_into_with(w, &dx, m, &mut dy, kernel)?;
        let mut v = self.download(&dy)?;
        v.truncate(m * w.n);
        Ok(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::{define, Vendor};

    /// The block size is the kernels' HIP launch bound, and a whole number
    /// of warps on either vendor.
    #[test]
    fn block_matches_the_kernels() {
        assert_eq!(
            define(LINEAR.body, "M3_LIN_THREADS"),
            Some(LIN_THREADS as u64)
        );
        for v in [Vendor::Cuda, Vendor::Hip] {
            assert!(LIN_THREADS.is_multiple_of(v.warp()));
        }
    }
}
