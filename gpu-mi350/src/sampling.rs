//! Stochastic sampling on the device (`kernels/sample_keyed.cu`): the token
//! is drawn where the logits are, and it is exactly the token
//! `m3_core::sample::sample` picks from the same f32 row.
//!
//! The normative definition lives in `m3_core::sample` (module doc): keys
//! that order the candidates, integer weights `floor(exp_det(x) * 2^40)` from
//! a deterministic f64 exp, top_k / top_p cuts and the draw on integer sums,
//! the uniform keyed by `(seed, position)`. It was shaped so that a GPU can
//! reproduce it bit for bit with parallel passes and no sort: the kernel runs
//! radix selects (8 passes of 256-bin histograms over the 64-bit key, one
//! thread block per row) exactly as `m3_core::sample::radix` emulates them
//! on the CPU, all sums are integers (order-independent, so atomics are
//! deterministic) and the float work is compiled without FMA contraction
//! (`exact: true`).
//!
//! The kernel `m3s_sample_keyed(logits, vocab, rows, nrows, scratch, out)`
//! overwrites `out[r]` only for rows whose params are stochastic: the engine
//! runs the greedy argmax kernel (`ops::sample`) over every row first. It
//! starts with `griddepcontrol` (programmatic dependent launch), so it can be
//! launched with PDL right behind that kernel.

use m3_core::sample::SampleParams;

use crate::error::{GpuError, Result};
use crate::kernels::KernelSource;

/// The keyed sampling kernel (bit-exact: FMA contraction off).
pub const SAMPLE_KEYED: KernelSource = KernelSource {
    name: "sample_keyed",
    body: include_str!("../kernels/sample_keyed.cu"),
    exact: true,
    entries: &["m3s_sample_keyed"],
};

// The float work must not be contracted into FMAs (`--fmad=false`).
const _: () = assert!(SAMPLE_KEYED.exact);

/// Threads per block, one block per row (`M3SK_THREADS` in
/// sample_keyed.cu); the grid is `nrows` blocks.
pub const SAMPLE_KEYED_THREADS: u32 = 1024;

/// Largest vocabulary + 1: with `vocab < 2^23` every sum of weights
/// (`<= 2^40` each) stays below `2^63`.
pub const MAX_VOCAB: usize = 1 << 23;

/// Largest row count + 1 per launch.
pub const MAX_ROWS: usize = 1 << 16;

/// One row's sampling parameters as the kernel reads them (`M3RowSample`
/// in sample_keyed.cu; 32 bytes, 8-byte aligned).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct RowSample {
    /// NaN or `<= 0`: greedy, the kernel leaves the row alone.
    pub temperature: f32,
    /// 0: no cut (saturated from `SampleParams::top_k`, which changes
    /// nothing since `vocab < 2^23`).
    pub top_k: u32,
    /// `>= 1` or NaN: no cut.
    pub top_p: f32,
    /// Zero.
    pub pad0: u32,
    /// The request's seed.
    pub seed: u64,
    /// The key position of the uniform (`position` of
    /// `m3_core::sample::sample`).
    pub position: u32,
    /// Zero.
    pub pad1: u32,
}

impl RowSample {
    /// The kernel's row for `params`, drawing with the uniform keyed by
    /// `(params.seed, key_position)`.
    pub fn new(params: &SampleParams, key_position: u32) -> Self {
        RowSample {
            temperature: params.temperature,
            top_k: u32::try_from(params.top_k).unwrap_or(u32::MAX),
            top_p: params.top_p,
            pad0: 0,
            seed: params.seed,
            position: key_position,
            pad1: 0,
        }
    }
}

/// Bytes of the optional `scratch` output: one u64 per element of every
/// row (`nrows * vocab * 8`), which receives each stochastic row's relative
/// weights (`m3_core::sample::relative_weight`) as f64 bits, 0 for NaN and
/// for elements cut by top_k. Pass a null pointer to skip it (the engine
/// does); tests use it to check the float work bit for bit. Saturates
/// instead of overflowing.
pub fn scratch_bytes(nrows: usize, vocab: usize) -> usize {
    nrows.saturating_mul(vocab).saturating_mul(8)
}

/// Whether a launch over `nrows` rows of `vocab` logits is within the
/// kernel's limits: `1 <= vocab < 2^23` (integer sums below 2^63) and
/// `1 <= nrows < 65536` (one block per row).
pub fn check(nrows: usize, vocab: usize) -> Result<()> {
    if vocab == 0 || vocab >= MAX_VOCAB {
        return Err(GpuError::input(
            "sample_keyed",
            format!("vocab = {vocab}, must be in 1..{MAX_VOCAB}"),
        ));
    }
    if nrows == 0 || nrows >= MAX_ROWS {
        return Err(GpuError::input(
            "sample_keyed",
            format!("nrows = {nrows}, must be in 1..{MAX_ROWS}"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::{align_of, offset_of, size_of};
    use m3_core::sample::{EXP_DET_COEFFS, LN2_HI, LN2_LO, LOG2E};

    #[test]
    fn row_layout_matches_the_kernel() {
        assert_eq!(size_of::<RowSample>(), 32);
        assert_eq!(align_of::<RowSample>(), 8);
        assert_eq!(offset_of!(RowSample, temperature), 0);
        assert_eq!(offset_of!(RowSample, top_k), 4);
        assert_eq!(offset_of!(RowSample, top_p), 8);
        assert_eq!(offset_of!(RowSample, pad0), 12);
        assert_eq!(offset_of!(RowSample, seed), 16);
        assert_eq!(offset_of!(RowSample, position), 24);
        assert_eq!(offset_of!(RowSample, pad1), 28);
        let body = SAMPLE_KEYED.body;
        let s = body
            .find("struct M3RowSample {")
            .and_then(|a| body[a..].find("};").map(|b| &body[a..a + b]))
            .expect("M3RowSample in sample_keyed.cu");
        let fields: Vec<&str> = s
            .lines()
            .skip(1)
            .filter_map(|l| l.split("//").next())
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect();
        assert_eq!(
            fields,
            [
                "float temperature;",
                "u32 top_k;",
                "float top_p;",
                "u32 pad0;",
                "u64 seed;",
                "u32 position;",
                "u32 pad1;"
            ]
        );
    }

    #[test]
    fn row_from_params() {
        let p = SampleParams {
            temperature: 0.7,
            top_k: usize::MAX,
            top_p: 0.9,
            seed: 42,
        };
        let r = RowSample::new(&p, 17);
        assert_eq!(
            r,
            RowSample {
                temperature: 0.7,
                top_k: u32::MAX,
                top_p: 0.9,
                pad0: 0,
                seed: 42,
                position: 17,
                pad1: 0
            }
        );
        assert_eq!(RowSample::new(&SampleParams { top_k: 5, ..p }, 0).top_k, 5);
    }

    #[test]
    fn mirrored_constants() {
        let body = SAMPLE_KEYED.body;
        assert!(body.contains(&format!("#define M3SK_THREADS {SAMPLE_KEYED_THREADS}\n")));
        // The kernel's exp carries the very constants of m3_core's exp_det.
        for c in EXP_DET_COEFFS.iter().chain([&LOG2E, &LN2_HI, &LN2_LO]) {
            let hex = format!("0x{:016x}ull", c.to_bits());
            assert!(
                body.contains(&hex),
                "{hex} ({c:e}) missing from sample_keyed.cu"
            );
        }
        assert!(crate::kernels::ALL.iter().any(|k| k.name == "sample_keyed"));
    }

    #[test]
    fn limits() {
        assert!(check(1, 1).is_ok());
        assert!(check(65535, MAX_VOCAB - 1).is_ok());
        assert!(check(1, 200_064).is_ok());
        assert!(check(0, 10).is_err());
        assert!(check(65536, 10).is_err());
        assert!(check(1, 0).is_err());
        assert!(check(1, MAX_VOCAB).is_err());
        assert_eq!(scratch_bytes(3, 200_064), 3 * 200_064 * 8);
        assert_eq!(scratch_bytes(usize::MAX, 2), usize::MAX);
    }
}
