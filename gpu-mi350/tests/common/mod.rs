//! Shared by the GPU test binaries: open the GPU or skip.
//!
//! Without a usable GPU a test prints `skipped: <reason>` and passes, unless
//! `REQUIRE_GPU=1`, where it fails (the H200 runs set it).
#![allow(dead_code)]

use m3_gpu::{CudaGpu, GpuBackend};

/// Whether the environment demands a GPU.
pub fn require_gpu() -> bool {
    std::env::var("REQUIRE_GPU")
        .map(|v| v == "1")
        .unwrap_or(false)
}

/// The GPU, or `None` after printing why the test is skipped.
pub fn gpu_or_skip(test: &str) -> Option<CudaGpu> {
    match CudaGpu::open(0) {
        Ok(g) => Some(g),
        Err(e) => {
            if require_gpu() {
                panic!("{test}: REQUIRE_GPU=1 but no usable GPU: {e}");
            }
            println!("skipped: {test}: {e}");
            None
        }
    }
}

/// Whether the tests run on the simulator (`M3_GPU_RUNTIME=sim`, the HIP
/// route, or `sim-cuda`, its CUDA flavour) on this machine's CPU.
pub fn on_sim() -> bool {
    std::env::var("M3_GPU_RUNTIME").is_ok_and(|v| {
        let v = v.trim();
        v.eq_ignore_ascii_case("sim") || v.eq_ignore_ascii_case("sim-cuda")
    })
}

/// The engine on the GPU (or, with `M3_GPU_RUNTIME=sim|sim-cuda`, on the
/// simulator), or `None` after printing why the test is skipped.
pub fn backend_or_skip(test: &str) -> Option<GpuBackend> {
    if on_sim() {
        return match GpuBackend::open() {
            Ok(b) => Some(b),
            Err(e) => panic!("{test}: M3_GPU_RUNTIME=sim but the simulator does not open: {e}"),
        };
    }
    gpu_or_skip(test).map(GpuBackend::new)
}

/// A small deterministic RNG (SplitMix64) so failures reproduce from the seed.
pub struct Rng(pub u64);
impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in [-1, 1).
    pub fn unit(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    /// Normal-ish (sum of uniforms) scaled by `s`.
    pub fn normal(&mut self, s: f32) -> f32 {
        (self.unit() + self.unit() + self.unit()) * s
    }
    /// An f32 with random bits (any class: NaN, Inf, subnormal, ...).
    pub fn any_f32(&mut self) -> f32 {
        f32::from_bits(self.next_u64() as u32)
    }
}

/// Index of the first element where `a` and `b` differ as bit patterns,
/// treating any two NaNs as equal (NaN payloads carry no meaning here).
pub fn first_f32_mismatch(a: &[f32], b: &[f32]) -> Option<usize> {
    if a.len() != b.len() {
        return Some(a.len().min(b.len()));
    }
    a.iter()
        .zip(b)
        .position(|(x, y)| !(x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan())))
}
