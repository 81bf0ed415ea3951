//! The gfx950 (MI350) native MX linears of `kernels/mfma_mx.cu`: their
//! source, launch geometry and a launcher behind the HIP runtime.
//!
//! **Never run on AMD hardware.** `cargo xtask kernels` compiles the source
//! for gfx950 only (it is not in [`crate::kernels::ALL`]: the CUDA path never
//! sees it) and checks the code object: the scaled MFMA instruction is there,
//! no spills, VGPRs under [`VGPR_CEILING`]. `crate::mfma_model` proves the
//! data layout and numerics on the CPU (tests/mfma_model.rs). Nothing in the
//! standard path calls this yet: the HIP route of the device-resident
//! engine (issue 16 item 2) does not exist, and the MXFP4 weights it would
//! take must then be uploaded in the stored layout (this kernel reads
//! FORMATS.md's packing directly), not `model::layout`'s device permutation
//! that the CUDA tensor-core linear reads.

use std::ffi::c_void;

use crate::error::{GpuError, Result};
use crate::kernels::KernelSource;
use crate::mfma_model;
use crate::runtime::hip::HipGpu;

/// The gfx950-only MX linears.
pub const MFMA_MX: KernelSource = KernelSource {
    name: "mfma_mx",
    body: include_str!("../kernels/mfma_mx.cu"),
    exact: false,
    entries: &[
        ACT_PACK,
        MxLinear::Fp4A4.entry(),
        MxLinear::E4m3Bf16.entry(),
    ],
};

/// Sources compiled for gfx950 alone (CDNA4 instructions; no CUDA, gfx942
/// or gfx940 build).
pub const GFX950_ONLY: &[KernelSource] = &[MFMA_MX];

/// The only target the kernels exist for.
pub const ARCH: &str = "gfx950";

/// Entry point of the `--act mxfp4` activation packer.
pub const ACT_PACK: &str = "m3x_act_mxfp4_pack";

/// Most VGPRs (arch + accumulation) any kernel of [`MFMA_MX`] may use on
/// gfx950: 64 keeps 8 waves per SIMD (512 registers per lane / 8); the
/// kernels use about 35-60 (clang 22). `cargo xtask kernels` fails above it.
pub const VGPR_CEILING: u32 = 64;

/// The instruction each entry point must contain (checked by `cargo xtask
/// kernels` in the gfx950 disassembly).
pub const REQUIRED_INSTRUCTIONS: &[(&str, &str)] = &[
    (MxLinear::Fp4A4.entry(), "v_mfma_scale_f32_16x16x128_f8f6f4"),
    (MxLinear::E4m3Bf16.entry(), "v_mfma_f32_16x16x32_bf16"),
];

/// The two linears.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MxLinear {
    /// MXFP4 weight x MXFP4 activations (`--act mxfp4`): scaled MFMA, E2M1
    /// both sides; products exact, f32 sums.
    Fp4A4,
    /// MXFP8 E4M3 weight x bf16 activations: bf16 MFMA on the exactly
    /// decoded weight codes, the block scale applied per channel in f32.
    E4m3Bf16,
}

impl MxLinear {
    pub const fn entry(self) -> &'static str {
        match self {
            MxLinear::Fp4A4 => "m3x_mfma_fp4_a4",
            MxLinear::E4m3Bf16 => "m3x_mfma_e4m3_bf16",
        }
    }

    /// Grid for `y [m, n]`: one workgroup per 16 x 16 tile.
    pub fn grid(self, m: usize, n: usize) -> (u32, u32, u32) {
        let t = mfma_model::TILE;
        (n.div_ceil(t) as u32, m.div_ceil(t) as u32, 1)
    }

    /// Threads per workgroup (MX_WAVES wave64s).
    pub const fn block(self) -> u32 {
        mfma_model::BLOCK as u32
    }
}

/// Grid of the activation packer: one thread per 32-value block.
pub fn act_pack_grid(rows: usize, k: usize) -> (u32, u32, u32) {
    ((rows * (k / 32)).div_ceil(mfma_model::BLOCK) as u32, 1, 1)
}

/// Shape rules of the kernels (K a positive multiple of 32, fits u32).
pub fn check_shape(m: usize, n: usize, k: usize) -> Result<()> {
    if k == 0 || !k.is_multiple_of(32) || m == 0 || n == 0 {
        return Err(GpuError::input(
            "mfma_mx",
            format!("m {m}, n {n}, k {k}: k must be a positive multiple of 32, m and n positive"),
        ));
    }
    if [m, n, k].iter().any(|&v| u32::try_from(v).is_err()) {
        return Err(GpuError::input("mfma_mx", "a dimension past u32"));
    }
    Ok(())
}

/// The loaded kernels on a gfx950 device (HIP only; untested on hardware).
pub struct MfmaMx<'g> {
    gpu: &'g HipGpu,
    pack: *mut c_void,
    fp4: *mut c_void,
    e4m3: *mut c_void,
}

impl<'g> MfmaMx<'g> {
    /// Load from `code`: the ahead-of-time gfx950 code object
    /// (`target/kernels/gfx950/mfma_mx.co`) or `gpu.compile(&MFMA_MX)`.
    /// Refuses any device but gfx950.
    pub fn load(gpu: &'g HipGpu, code: &[u8]) -> Result<Self> {
        if gpu.arch != ARCH {
            return Err(GpuError::input(
                "mfma_mx",
                format!(
                    "needs {ARCH} (CDNA4 scaled MFMA); this device is {}",
                    gpu.arch
                ),
            ));
        }
        Ok(Self {
            gpu,
            pack: gpu.function(code, ACT_PACK)?,
            fp4: gpu.function(code, MxLinear::Fp4A4.entry())?,
            e4m3: gpu.function(code, MxLinear::E4m3Bf16.entry())?,
        })
    }

    /// `--act mxfp4`: pack bf16 `x [rows, k]` into MXFP4 codes
    /// `[rows, k/2]` and E8M0 scales `[rows, k/32]`.
    ///
    /// # Safety
    /// Device pointers live and sized as stated.
    pub unsafe fn act_pack(
        &self,
        x: u64,
        rows: usize,
        k: usize,
        codes: u64,
        scales: u64,
    ) -> Result<()> {
        check_shape(rows, 1, k)?;
        let (mut x, mut r, mut kk, mut c, mut s) = (x, rows as u32, k as u32, codes, scales);
        let mut args: [*mut c_void; 5] = [
            (&raw mut x).cast(),
            (&raw mut r).cast(),
            (&raw mut kk).cast(),
            (&raw mut c).cast(),
            (&raw mut s).cast(),
        ];
        self.gpu.launch_grid(
            self.pack,
            act_pack_grid(rows, k),
            mfma_model::BLOCK as u32,
            &mut args,
        )
    }

    /// `y [m, n] = x W^T`, MXFP4 both (`xq`/`xs` from [`act_pack`](Self::act_pack),
    /// `w`/`ws` in the stored layout).
    ///
    /// # Safety
    /// Device pointers live and sized as stated.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn fp4_a4(
        &self,
        w: u64,
        ws: u64,
        xq: u64,
        xs: u64,
        k: usize,
        n: usize,
        m: usize,
        y: u64,
    ) -> Result<()> {
        check_shape(m, n, k)?;
        let (mut w, mut ws, mut xq, mut xs, mut y) = (w, ws, xq, xs, y);
        let (mut k32, mut n32, mut m32) = (k as u32, n as u32, m as u32);
        let mut args: [*mut c_void; 8] = [
            (&raw mut w).cast(),
            (&raw mut ws).cast(),
            (&raw mut xq).cast(),
            (&raw mut xs).cast(),
            (&raw mut k32).cast(),
            (&raw mut n32).cast(),
            (&raw mut m32).cast(),
            (&raw mut y).cast(),
        ];
        let l = MxLinear::Fp4A4;
        self.gpu
            .launch_grid(self.fp4, l.grid(m, n), l.block(), &mut args)
    }

    /// `y [m, n] = x W^T`, `x` bf16 `[m, k]`, `w` E4M3 `[n, k]`, `ws` `[n, k/32]`.
    ///
    /// # Safety
    /// Device pointers live and sized as stated.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn e4m3_bf16(
        &self,
        w: u64,
        ws: u64,
        x: u64,
        k: usize,
        n: usize,
        m: usize,
        y: u64,
    ) -> Result<()> {
        check_shape(m, n, k)?;
        let (mut w, mut ws, mut x, mut y) = (w, ws, x, y);
        let (mut k32, mut n32, mut m32) = (k as u32, n as u32, m as u32);
        let mut args: [*mut c_void; 7] = [
            (&raw mut w).cast(),
            (&raw mut ws).cast(),
            (&raw mut x).cast(),
            (&raw mut k32).cast(),
            (&raw mut n32).cast(),
            (&raw mut m32).cast(),
            (&raw mut y).cast(),
        ];
        let l = MxLinear::E4m3Bf16;
        self.gpu
            .launch_grid(self.e4m3, l.grid(m, n), l.block(), &mut args)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::define;

    #[test]
    fn host_constants_match_the_kernel() {
        let src = MFMA_MX.body;
        assert_eq!(define(src, "MX_WAVES"), Some(mfma_model::WAVES as u64));
        assert_eq!(define(src, "MX_TILE"), Some(mfma_model::TILE as u64));
        assert_eq!(define(src, "MX_BLOCK"), Some(mfma_model::BLOCK as u64));
        assert_eq!(
            mfma_model::BLOCK,
            mfma_model::WAVES * mfma_model::LANES,
            "one wave64 per MX_WAVES"
        );
        assert_eq!(mfma_model::BLOCK, mfma_model::TILE * mfma_model::TILE);
        assert_eq!(define(src, "MX_FMT_E2M1"), Some(4));
        assert_eq!(define(src, "MX_FMT_E4M3"), Some(0));
        for e in MFMA_MX.entries {
            assert!(
                src.contains(&format!("M3_KERNEL void __launch_bounds__(MX_BLOCK) {e}(")),
                "{e}"
            );
        }
        for (e, i) in REQUIRED_INSTRUCTIONS {
            assert!(MFMA_MX.entries.contains(e));
            let builtin = format!("__builtin_amdgcn_{}", i.trim_start_matches("v_"));
            assert!(src.contains(&builtin), "{builtin}");
        }
    }

    #[test]
    fn not_in_the_cuda_build_and_grids_cover_the_output() {
        assert!(crate::kernels::ALL.iter().all(|k| k.name != MFMA_MX.name));
        assert_eq!(MxLinear::Fp4A4.grid(1, 4096), (256, 1, 1));
        assert_eq!(MxLinear::E4m3Bf16.grid(17, 40), (3, 2, 1));
        assert_eq!(act_pack_grid(3, 4096), (2, 1, 1));
        assert!(check_shape(1, 1, 48).is_err());
        assert!(check_shape(1, 1, 0).is_err());
        assert!(check_shape(1, 1, 96).is_ok());
    }
}
