//! The kernel sources, embedded at build time (`include_str!`, no build.rs),
//! and the flags each one is compiled with.
//!
//! Every source is compiled as `compat.h` + the source (one translation
//! unit), so neither NVRTC nor hiprtc needs an include path.

/// The CUDA/HIP prelude: warp size, bit helpers, element codecs.
pub const PRELUDE: &str = include_str!("../kernels/compat.h");

/// What the kernels use from the HIP headers and ROCm's device libraries,
/// written with clang builtins, for the ahead-of-time gfx942 / gfx950
/// build with `clang -nogpuinc -nogpulib` (no ROCm needed). Never on AMD
/// hardware so far.
pub const HIP_FREESTANDING: &str = include_str!("../kernels/hip_freestanding.h");

/// Which compiler a kernel source meets: compat.h's `M3_CUDA` (NVRTC) or
/// `M3_HIP` (hiprtc, hipcc, clang). Host launch code that sizes blocks by
/// warps takes the warp width from here, never from a literal 32.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Vendor {
    Cuda,
    Hip,
}

impl Vendor {
    /// Lanes of a warp (CUDA) or wavefront (CDNA, wave64): compat.h's
    /// `M3_WARP` for this vendor (checked against the prelude's text).
    pub const fn warp(self) -> u32 {
        match self {
            Vendor::Cuda => 32,
            Vendor::Hip => 64,
        }
    }
}

/// The value of `#define NAME <integer>` in `src` (the first such line),
/// for tests that hold a host constant to the kernel's.
pub fn define(src: &str, name: &str) -> Option<u64> {
    src.lines().find_map(|l| {
        let mut w = l.split_whitespace();
        if w.next() != Some("#define") || w.next() != Some(name) {
            return None;
        }
        w.next()?.parse().ok()
    })
}

/// One kernel source file.
#[derive(Clone, Copy, Debug)]
pub struct KernelSource {
    /// Module name (the file stem).
    pub name: &'static str,
    /// Source text without the prelude.
    pub body: &'static str,
    /// Format kernels must be bit-exact: FMA contraction off.
    pub exact: bool,
    /// Kernel entry points the module defines (checked after loading).
    pub entries: &'static [&'static str],
}

impl KernelSource {
    /// The full translation unit: prelude + body.
    pub fn full_source(&self) -> String {
        let mut s = String::with_capacity(PRELUDE.len() + self.body.len() + 64);
        s.push_str(PRELUDE);
        s.push_str("\n#line 1 \"");
        s.push_str(self.name);
        s.push_str(".cu\"\n");
        s.push_str(self.body);
        s
    }

    /// NVRTC options for `arch` (e.g. `sm_90`): straight to CUBIN for the
    /// real architecture; `--fmad=false` for the bit-exact format kernels.
    pub fn nvrtc_options(&self, arch: &str) -> Vec<String> {
        let mut o = vec![
            format!("--gpu-architecture={arch}"),
            "--std=c++17".to_string(),
        ];
        if self.exact {
            o.push("--fmad=false".to_string());
        }
        o
    }

    /// The translation unit for a plain clang HIP build without ROCm:
    /// `hip_freestanding.h` + prelude + body.
    pub fn hip_freestanding_source(&self) -> String {
        let full = self.full_source();
        let mut s = String::with_capacity(HIP_FREESTANDING.len() + full.len() + 64);
        s.push_str("#line 1 \"hip_freestanding.h\"\n");
        s.push_str(HIP_FREESTANDING);
        s.push_str("\n#line 1 \"compat.h\"\n");
        s.push_str(&full);
        s
    }

    /// clang options (after `-x hip`) that compile
    /// [`hip_freestanding_source`](Self::hip_freestanding_source) to one
    /// unbundled code object for `arch` (e.g. `gfx950`): device side only,
    /// no HIP headers, no device libraries.
    pub fn hip_freestanding_options(&self, arch: &str) -> Vec<String> {
        let mut o = vec![
            format!("--offload-arch={arch}"),
            "--offload-device-only".to_string(),
            "--no-gpu-bundle-output".to_string(),
            "-nogpuinc".to_string(),
            "-nogpulib".to_string(),
            "-std=c++17".to_string(),
            "-O3".to_string(),
        ];
        if self.exact {
            o.push("-ffp-contract=off".to_string());
        }
        o
    }

    /// hiprtc / hipcc options for `arch` (e.g. `gfx950`).
    pub fn hip_options(&self, arch: &str) -> Vec<String> {
        let mut o = vec![
            format!("--offload-arch={arch}"),
            "-std=c++17".to_string(),
            "-O3".to_string(),
        ];
        if self.exact {
            o.push("-ffp-contract=off".to_string());
        }
        o
    }
}

/// Format kernels (bit-exact with `m3_core::formats`).
pub const FORMATS: KernelSource = KernelSource {
    name: "formats",
    body: include_str!("../kernels/formats.cu"),
    exact: true,
    entries: &[
        "m3_decode_elem",
        "m3_decode_e8m0",
        "m3_encode_elem",
        "m3_bf16_round",
        "m3_mx_quantize",
        "m3_mx_dequantize",
        "m3_nvfp4_amax",
        "m3_nvfp4_global",
        "m3_nvfp4_quantize",
        "m3_nvfp4_dequantize",
        "m3_nvfp4_to_mxfp4",
        "m3_mxfp8_to_bf16",
        "m3_ptpc_quantize",
        "m3_ptpc_dequantize",
        "m3_cache_cast_e4m3",
    ],
};

/// Linear (GEMV / small-M GEMM) per weight format.
pub const LINEAR: KernelSource = KernelSource {
    name: "linear",
    body: include_str!("../kernels/linear.cu"),
    exact: false,
    entries: &[
        "m3_linear_bf16",
        "m3_linear_mxfp8_e4m3",
        "m3_linear_mxfp8_e5m2",
        "m3_linear_mxfp4",
        "m3_linear_nvfp4",
        "m3_linear_bf16_v1",
        "m3_linear_mxfp8_e4m3_v1",
        "m3_linear_mxfp8_e5m2_v1",
        "m3_linear_mxfp4_v1",
        "m3_linear_nvfp4_v1",
        "m3_linear_bf16_v3",
        "m3_linear_mxfp8_e4m3_v3",
        "m3_linear_mxfp8_e5m2_v3",
        "m3_linear_mxfp4_v3",
        "m3_linear_nvfp4_v3",
    ],
};

/// RMSNorm and RoPE.
pub const NORM: KernelSource = KernelSource {
    name: "norm",
    body: include_str!("../kernels/norm.cu"),
    exact: false,
    entries: &["m3_rmsnorm", "m3_rope_neox"],
};

/// Bandwidth probes.
pub const BENCH: KernelSource = KernelSource {
    name: "bench",
    body: include_str!("../kernels/bench.cu"),
    exact: false,
    entries: &["m3_stream_read"],
};

/// Every kernel source, in compile order.
pub const ALL: &[KernelSource] = &[
    FORMATS,
    LINEAR,
    NORM,
    BENCH,
    crate::ops::elementwise::ELEMENTWISE,
    crate::ops::attention::ATTENTION,
    crate::ops::moe::MOE,
    crate::ops::sample::SAMPLE,
    crate::sampling::SAMPLE_KEYED,
    crate::standard::STANDARD,
    crate::standard::GEN,
];

#[cfg(test)]
mod tests {
    use super::*;

    /// `M3_WARP` of the prelude's HIP branch, then of its CUDA branch.
    #[test]
    fn warp_width_matches_the_prelude() {
        let hip = PRELUDE.find("#define M3_HIP 1").unwrap();
        let cuda = PRELUDE.find("#define M3_CUDA 1").unwrap();
        assert!(hip < cuda);
        assert_eq!(define(&PRELUDE[hip..cuda], "M3_WARP"), Some(64));
        assert_eq!(define(&PRELUDE[cuda..], "M3_WARP"), Some(32));
        assert_eq!(Vendor::Hip.warp(), 64);
        assert_eq!(Vendor::Cuda.warp(), 32);
    }

    /// Every `M3_HIP_BLOCK(X)` names a block size that the same source
    /// defines as an integer (so a host constant can be tested against
    /// it), a multiple of the wave64 width, and within HIP's 1024.
    #[test]
    fn hip_block_bounds_are_defined_sizes() {
        let mut seen = 0;
        for k in ALL {
            let body = k.body;
            for (i, _) in body.match_indices("M3_HIP_BLOCK(") {
                let arg = &body[i + "M3_HIP_BLOCK(".len()..];
                let name = &arg[..arg.find(')').unwrap()];
                let v = define(body, name).unwrap_or_else(|| {
                    panic!(
                        "{}: M3_HIP_BLOCK({name}) without #define {name} <n>",
                        k.name
                    )
                });
                assert!(
                    v.is_multiple_of(64) && v <= 1024,
                    "{}: {name} = {v}",
                    k.name
                );
                seen += 1;
            }
        }
        assert!(seen > 0);
    }

    #[test]
    fn define_reads_integers_only() {
        let src = "#define A 12\n#define B (A * 2)\n  #define C 7 // c\n#define AB 3\n";
        assert_eq!(define(src, "A"), Some(12));
        assert_eq!(define(src, "B"), None);
        assert_eq!(define(src, "C"), Some(7));
        assert_eq!(define(src, "AB"), Some(3));
        assert_eq!(define(src, "D"), None);
    }
}
