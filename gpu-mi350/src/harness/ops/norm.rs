//! RMSNorm (Gemma) and partial NeoX RoPE.

use cudarc::driver::{LaunchConfig, PushKernelArg};

use super::{as_u32, check_len, grid_1d};
use crate::error::{GpuError, Result};
use crate::kernels::NORM;
use crate::CudaGpu;

impl CudaGpu {
    /// `y = x / sqrt(mean(x^2) + eps) * (1 + w)` per row of `n`; returns f32
    /// and its bf16 rounding.
    pub fn rmsnorm(
        &self,
        x: &[f32],
        w: &[f32],
        eps: f32,
        rows: usize,
        n: usize,
    ) -> Result<(Vec<f32>, Vec<u16>)> {
        check_len("rmsnorm", "x", x.len(), rows * n)?;
        check_len("rmsnorm", "w", w.len(), n)?;
        if rows == 0 || n == 0 {
            return Ok((Vec::new(), Vec::new()));
        }
        let n32 = as_u32("rmsnorm", "n", n)?;
        let f = self.function(&NORM, "m3_rmsnorm")?;
        let dx = self.upload(x)?;
        let dw = self.upload(w)?;
        let mut y = self.zeros::<f32>(rows * n)?;
        let mut yb = self.zeros::<u16>(rows * n)?;
        let cfg = LaunchConfig {
            grid_dim: (as_u32("rmsnorm", "rows", rows)?, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        unsafe {
            self.stream()
                .launch_builder(&f)
                .arg(&dx)
                .arg(&dw)
                .arg(&eps)
                .arg(&mut y)
                .arg(&mut yb)
                .arg(&n32)
                .launch(cfg)
        }
        .map_err(|e| GpuError::driver("cuLaunchKernel m3_rmsnorm", e))?;
        Ok((self.download(&y)?, self.download(&yb)?))
    }

    /// Partial NeoX RoPE over x `[t, heads, d]` with `positions[t]`;
    /// returns bf16 bits.
    pub fn rope(
        &self,
        x: &[f32],
        positions: &[u32],
        theta: f64,
        heads: usize,
        d: usize,
        rd: usize,
    ) -> Result<Vec<u16>> {
        let t = positions.len();
        check_len("rope", "x", x.len(), t * heads * d)?;
        if !rd.is_multiple_of(2) || rd > d {
            return Err(GpuError::input(
                "rope",
                format!("rotary_dim {rd} must be even and <= head_dim {d}"),
            ));
        }
        let items = t * heads * (d - rd / 2);
        if items == 0 {
            return Ok(vec![0; x.len()]);
        }
        let f = self.function(&NORM, "m3_rope_neox")?;
        let dx = self.upload(x)?;
        let dp = self.upload(positions)?;
        let mut out = self.zeros::<u16>(x.len())?;
        let (h32, d32, rd32, t32) = (
            as_u32("rope", "heads", heads)?,
            as_u32("rope", "d", d)?,
            as_u32("rope", "rd", rd)?,
            as_u32("rope", "t", t)?,
        );
        unsafe {
            self.stream()
                .launch_builder(&f)
                .arg(&dx)
                .arg(&dp)
                .arg(&theta)
                .arg(&h32)
                .arg(&d32)
                .arg(&rd32)
                .arg(&mut out)
                .arg(&t32)
                .launch(grid_1d("rope", items)?)
        }
        .map_err(|e| GpuError::driver("cuLaunchKernel m3_rope_neox", e))?;
        let mut v = self.download(&out)?;
        v.truncate(x.len());
        Ok(v)
    }
}
