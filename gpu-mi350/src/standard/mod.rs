//! The GPU standard path (ARCHITECTURE.md "standard path", PERF.md): device-
//! resident weights ([`model::DevModel`], uploaded from `ModelWeights` or
//! generated on the device by [`crate::benchmodel`]), a paged fp8 E4M3 KV +
//! index cache, preallocated activations, a step that launches only
//! kernels, and decode steps captured into CUDA graphs keyed by
//! (rows, logits rows, path, kernel variant). Routed experts are grouped by
//! a device-built route, so each chosen expert is read once per step.
//!
//! Limits (tracked in bench/NOTES.md): fp8 caches only; MXFP4 / MXFP8 E4M3 /
//! bf16 / f32 weights (NVFP4 and E5M2 refused); bf16 expert activations
//! only; CUDA only (the HIP build compiles the kernels but has no runtime
//! path here).

mod attn;
pub mod devmem;
pub mod model;
pub mod path;

pub use devmem::DevBuf;
pub use model::{DevLinear, DevModel, WFmt};
pub use path::{Capacity, StandardPath};

use crate::kernels::KernelSource;

/// The standard path's kernels (`kernels/standard_decode.cu`).
pub const STANDARD: KernelSource = KernelSource {
    name: "standard_decode",
    // one translation unit: the per-op kernels, then attention + indexer
    body: concat!(
        include_str!("../../kernels/standard_decode.cu"),
        "\n",
        include_str!("../../kernels/standard_attention.cu")
    ),
    exact: false,
    entries: &[
        "m3s_linear_f32",
        "m3s_embed",
        "m3s_rmsnorm",
        "m3s_headnorm_rope",
        "m3s_cache_write",
        "m3s_swiglu",
        "m3s_moe_combine",
        "m3s_linear_f32w",
        "m3s_mma_bf16",
        "m3s_mma_e4m3",
        "m3s_mma_fp4",
        "m3s_route",
        "m3s_router_warp",
        "m3s_argmax_part",
        "m3s_argmax_final",
    ],
};

/// Device-side weight and cache generation (`kernels/gen.cu`).
pub const GEN: KernelSource = KernelSource {
    name: "gen",
    body: include_str!("../../kernels/gen.cu"),
    exact: false,
    entries: &["m3s_gen_bytes", "m3s_gen_bf16", "m3s_gen_f32"],
};
