//! PLACEHOLDER (replaced by the keyed-sampling kernel's module).
use m3_core::sample::SampleParams;

/// Per-row sampling parameters as the kernel reads them.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct RowSample {
    pub temperature: f32,
    pub top_k: u32,
    pub top_p: f32,
    pub pad0: u32,
    pub seed: u64,
    pub position: u32,
    pub pad1: u32,
}

impl RowSample {
    pub fn new(p: &SampleParams, key_position: u32) -> Self {
        RowSample {
            temperature: p.temperature,
            top_k: p.top_k.min(u32::MAX as usize) as u32,
            top_p: p.top_p,
            pad0: 0,
            seed: p.seed,
            position: key_position,
            pad1: 0,
        }
    }
}

/// PLACEHOLDER.
pub const SAMPLE_KEYED: crate::kernels::KernelSource = crate::kernels::KernelSource {
    name: "sample_keyed",
    body: "M3_KERNEL void m3s_sample_keyed(const float* logits, u32 vocab, const void* rows, u32 nrows, u64* scratch, u32* out) { M3_PDL_TRIGGER(); M3_PDL_WAIT(); }\n",
    exact: true,
    entries: &["m3s_sample_keyed"],
};
/// Threads per CTA of the keyed sampler.
pub const SAMPLE_KEYED_THREADS: u32 = 1024;
/// PLACEHOLDER.
pub fn scratch_bytes(_rows: usize, _vocab: usize) -> usize {
    0
}
