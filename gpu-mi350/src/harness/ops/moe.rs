//! Router selection and the weighted expert combine (`kernels/moe.cu`,
//! MODEL.md 3.10), on device buffers. The expert GEMMs themselves run
//! through the linear kernels (`ops::linear`, `ops::elementwise`).

use cudarc::driver::{CudaSlice, PushKernelArg};

use super::elementwise::launch;
use super::{as_u32, grid_1d};
use crate::error::Result;
use crate::kernels::KernelSource;
use crate::CudaGpu;

/// Router and combine kernels.
pub const MOE: KernelSource = KernelSource {
    name: "moe",
    body: include_str!("../../../kernels/moe.cu"),
    exact: true,
    entries: &["m3_router_select", "m3_moe_combine"],
};

impl CudaGpu {
    /// Router selection from f32 logits `z [rows, ne]`: `ids`/`w`
    /// `[rows, top_k]`, ids ascending.
    #[allow(clippy::too_many_arguments)]
    pub fn router_select_dev(
        &self,
        z: &CudaSlice<f32>,
        bias: &CudaSlice<f32>,
        ne: usize,
        top_k: usize,
        scaling: f32,
        rows: usize,
        ids: &mut CudaSlice<i32>,
        w: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let op = "router";
        let f = self.function(&MOE, "m3_router_select")?;
        let mut flags = self.zeros::<u8>(rows * ne)?;
        let (ne32, k32, r32) = (
            as_u32(op, "experts", ne)?,
            as_u32(op, "top_k", top_k)?,
            as_u32(op, "rows", rows)?,
        );
        let mut b = self.stream().launch_builder(&f);
        b.arg(z)
            .arg(bias)
            .arg(&ne32)
            .arg(&k32)
            .arg(&scaling)
            .arg(&r32)
            .arg(ids)
            .arg(w)
            .arg(&mut flags);
        launch!("m3_router_select", b, grid_1d(op, rows)?)
    }

    /// `out[t] = sum_k f32(w[t,k] * y[src[t,k]]) + shared[t]` (k in
    /// ascending expert id), rows of width `h`.
    #[allow(clippy::too_many_arguments)]
    pub fn moe_combine_dev(
        &self,
        y: &CudaSlice<f32>,
        src: &CudaSlice<u32>,
        w: &CudaSlice<f32>,
        shared: Option<&CudaSlice<f32>>,
        rows: usize,
        top_k: usize,
        h: usize,
        out: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let op = "experts";
        let f = self.function(&MOE, "m3_moe_combine")?;
        let dummy;
        let (sh, has) = match shared {
            Some(s) => (s, 1i32),
            None => {
                dummy = self.zeros::<f32>(1)?;
                (&dummy, 0)
            }
        };
        let (r32, k32, h32) = (
            as_u32(op, "rows", rows)?,
            as_u32(op, "top_k", top_k)?,
            as_u32(op, "hidden", h)?,
        );
        let mut b = self.stream().launch_builder(&f);
        b.arg(y)
            .arg(src)
            .arg(w)
            .arg(sh)
            .arg(&has)
            .arg(&r32)
            .arg(&k32)
            .arg(&h32)
            .arg(out);
        launch!("m3_moe_combine", b, grid_1d(op, rows * h)?)
    }
}
