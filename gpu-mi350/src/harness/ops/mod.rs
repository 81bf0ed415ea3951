//! Operations on a [`CudaGpu`](crate::CudaGpu): host-slice in, host-Vec out
//! wrappers for tests and tools, plus device-resident linear weights.

pub mod attention;
pub mod elementwise;
pub mod formats;
pub mod linear;
pub mod moe;
pub mod norm;
pub mod probe;
pub mod sample;

use cudarc::driver::{CudaSlice, DeviceRepr, LaunchConfig, ValidAsZeroBits};

use crate::error::{GpuError, Result};
use crate::CudaGpu;

/// Threads per block for the element-wise kernels.
pub(crate) const THREADS: u32 = 256;

/// A 1-D launch over `n` work items.
pub(crate) fn grid_1d(op: &'static str, n: usize) -> Result<LaunchConfig> {
    let blocks = n.div_ceil(THREADS as usize).max(1);
    let blocks = u32::try_from(blocks)
        .map_err(|_| GpuError::input(op, format!("{n} work items is too many")))?;
    Ok(LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    })
}

/// `n` as a kernel's u32 count.
pub(crate) fn as_u32(op: &'static str, what: &str, n: usize) -> Result<u32> {
    u32::try_from(n).map_err(|_| GpuError::input(op, format!("{what} = {n} exceeds u32")))
}

/// Check a buffer length against what the shape needs.
pub(crate) fn check_len(op: &'static str, what: &str, got: usize, want: usize) -> Result<()> {
    if got != want {
        return Err(GpuError::input(
            op,
            format!("{what}: expected {want} elements, got {got}"),
        ));
    }
    Ok(())
}

impl CudaGpu {
    /// Copy host data to a new device buffer.
    pub fn upload<T: DeviceRepr>(&self, x: &[T]) -> Result<CudaSlice<T>> {
        self.stream()
            .clone_htod(x)
            .map_err(|e| GpuError::driver("cuMemcpyHtoD", e))
    }
    /// A zeroed device buffer of `n` elements (`n` 0 allocates 1).
    pub fn zeros<T: DeviceRepr + ValidAsZeroBits>(&self, n: usize) -> Result<CudaSlice<T>> {
        self.stream()
            .alloc_zeros::<T>(n.max(1))
            .map_err(|e| GpuError::driver("cuMemAlloc", e))
    }
    /// Copy a device buffer back (synchronizes, surfacing launch errors).
    pub fn download<T: DeviceRepr>(&self, x: &CudaSlice<T>) -> Result<Vec<T>> {
        let v = self
            .stream()
            .clone_dtoh(x)
            .map_err(|e| GpuError::driver("cuMemcpyDtoH", e))?;
        self.sync()?;
        Ok(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::{define, FORMATS};

    /// `grid_1d`'s block is the one the format kernels are built for on
    /// HIP (`M3_FMT_THREADS`).
    #[test]
    fn block_matches_the_format_kernels() {
        assert_eq!(define(FORMATS.body, "M3_FMT_THREADS"), Some(THREADS as u64));
    }
}
