//! Event timing of the op harness (`CudaGpu::time`) and its summary
//! (`Timing`); the bandwidth probes are `standard::bench::probe_copy` /
//! `probe_read`, on either vendor.

use cudarc::driver::sys::CUevent_flags;

use crate::error::{GpuError, Result};
use crate::CudaGpu;

/// Median, p10 and p90 of timing samples (ms).
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    pub median_ms: f64,
    pub p10_ms: f64,
    pub p90_ms: f64,
    pub samples: usize,
}

impl Timing {
    /// Summarize samples (empty gives NaNs).
    pub fn from_samples(mut v: Vec<f64>) -> Self {
        v.sort_by(|a, b| a.total_cmp(b));
        let q = |p: f64| {
            if v.is_empty() {
                f64::NAN
            } else {
                v[((v.len() - 1) as f64 * p).round() as usize]
            }
        };
        Timing {
            median_ms: q(0.5),
            p10_ms: q(0.1),
            p90_ms: q(0.9),
            samples: v.len(),
        }
    }
    /// GB/s (1e9 bytes per second) for `bytes` moved in the median time.
    pub fn gbps(&self, bytes: usize) -> f64 {
        bytes as f64 / (self.median_ms * 1e-3) / 1e9
    }
}

impl CudaGpu {
    /// Time `f` with device events: `warmup` untimed calls, then `iters`
    /// calls each bracketed by its own event pair.
    pub fn time(
        &self,
        warmup: usize,
        iters: usize,
        mut f: impl FnMut() -> Result<()>,
    ) -> Result<Timing> {
        for _ in 0..warmup {
            f()?;
        }
        self.sync()?;
        let ev = |c| {
            self.context()
                .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(|e| GpuError::driver(c, e))
        };
        let mut samples = Vec::with_capacity(iters);
        for _ in 0..iters {
            let (a, b) = (ev("cuEventCreate")?, ev("cuEventCreate")?);
            a.record(self.stream())
                .map_err(|e| GpuError::driver("cuEventRecord", e))?;
            f()?;
            b.record(self.stream())
                .map_err(|e| GpuError::driver("cuEventRecord", e))?;
            b.synchronize()
                .map_err(|e| GpuError::driver("cuEventSynchronize", e))?;
            samples.push(
                a.elapsed_ms(&b)
                    .map_err(|e| GpuError::driver("cuEventElapsedTime", e))? as f64,
            );
        }
        Ok(Timing::from_samples(samples))
    }
}
