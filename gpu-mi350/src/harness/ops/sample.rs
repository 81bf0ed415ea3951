//! Greedy sampling on the device (`kernels/sample.cu`): argmax per row,
//! lowest id on ties, NaN never wins (as `m3_core::sample::greedy`).

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

use super::as_u32;
use super::elementwise::launch;
use crate::error::Result;
use crate::kernels::KernelSource;
use crate::CudaGpu;

/// The argmax kernel.
pub const SAMPLE: KernelSource = KernelSource {
    name: "sample",
    body: include_str!("../../../kernels/sample.cu"),
    exact: true,
    entries: &["m3_argmax"],
};

/// Threads per row (M3_SAMPLE_THREADS in sample.cu).
const SAMPLE_THREADS: u32 = 256;

impl CudaGpu {
    /// `out[r] = argmax(logits[r])` for `rows` rows of `vocab`.
    pub fn argmax_dev(
        &self,
        logits: &CudaSlice<f32>,
        rows: usize,
        vocab: usize,
        out: &mut CudaSlice<u32>,
    ) -> Result<()> {
        let f = self.function(&SAMPLE, "m3_argmax")?;
        let v32 = as_u32("sample", "vocab", vocab)?;
        let cfg = LaunchConfig {
            grid_dim: (as_u32("sample", "rows", rows)?, 1, 1),
            block_dim: (SAMPLE_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream().launch_builder(&f);
        b.arg(logits).arg(&v32).arg(out);
        launch!("m3_argmax", b, cfg)
    }
}

// The cudarc marker impls live with the op harness (CUDA only; the
// engine hands the kernel a device address of its step inputs instead).
// SAFETY: `RowSample` is `#[repr(C)]` plain old data (checked by bytemuck's
// Pod derive) with the field order, sizes and alignment of `M3RowSample`
// (checked by `row_layout_matches_the_kernel`), so a device copy of a slice
// of it is what the kernel reads.
unsafe impl cudarc::driver::DeviceRepr for crate::sampling::RowSample {}
// SAFETY: all-zero bits are a valid `RowSample` (Zeroable).
unsafe impl cudarc::driver::ValidAsZeroBits for crate::sampling::RowSample {}
