//! The GPU standard path (ARCHITECTURE.md "standard path", PERF.md): a step
//! is a fixed sequence of kernel launches over device-resident weights
//! ([`crate::model::DevModel`]), the paged KV + index caches ([`kv`]),
//! preallocated activations and persistent step inputs ([`inputs`]);
//! nothing returns to the host inside a step, so a step of a given shape is
//! captured once into a CUDA graph ([`graphs`]) and replayed. Routed experts
//! are grouped by a device-built route, so each chosen expert is read once
//! per step.
//!
//! Code map: [`launch`] (the stream and launches), [`linear`] (tensor-core
//! linear layers), [`attn`] (indexer and attention launches), [`step`] (the
//! launch sequence of a step: layers, head, sampling, taps), [`bench`]
//! (bench-only: timed replays, per-launch profiles, kernel variants),
//! [`kernel_bench`] (the linear kernels alone, per format, checked and
//! timed).
//!
//! Every runtime call goes through the runtime line
//! ([`crate::runtime::api`]): this code is the same for CUDA and HIP. The
//! HIP route is exercised without hardware by `hip_route_tests` (a decode
//! step on a recording stub of the HIP runtime) and has never run on an
//! AMD GPU (nor has the mono path, which sizes its grid there from the
//! runtime's compute units and occupancy).
//!
//! Limits: head dims multiples of 32 up to 256; at most 1024 routed
//! experts, top-16 experts and top-64 blocks.

pub(crate) mod attn;
pub mod bench;
pub mod exec;
pub mod graphs;
#[cfg(test)]
mod hip_route_tests;
pub mod inputs;
pub mod kernel_bench;
pub mod kv;
pub(crate) mod launch;
pub(crate) mod linear;
pub(crate) mod mono;
pub(crate) mod pointwise;
pub(crate) mod step;

/// The device for the GPU tests inside this module (unit tests, so not the
/// integration tests' helper): `None` (printed as skipped) without one,
/// unless `REQUIRE_GPU=1`, which makes a missing device a failure. With
/// `M3_GPU_RUNTIME=sim` or `sim-cuda`, the simulator (`runtime::sim`) on
/// this CPU.
#[cfg(test)]
pub(crate) fn test_gpu() -> Option<Box<dyn Gpu>> {
    if let Some(sim) = crate::runtime::sim::from_env() {
        return Some(Box::new(
            sim.expect("M3_GPU_RUNTIME=sim*: the simulator opens"),
        ));
    }
    match crate::CudaGpu::open(0) {
        Ok(g) => Some(Box::new(g)),
        Err(e) => {
            assert!(
                std::env::var("REQUIRE_GPU").map_or(true, |v| v != "1"),
                "REQUIRE_GPU=1 but no GPU: {e}"
            );
            println!("skipped: {e}");
            None
        }
    }
}

/// The unit tests' inputs in this module (kv, linear, attn): a 64-bit LCG
/// (Knuth's MMIX constants), deterministic per seed, no dependency.
#[cfg(test)]
pub(crate) struct TestRng(pub u64);

#[cfg(test)]
impl TestRng {
    /// The next 32 bits (the state's high word).
    pub fn next_u32(&mut self) -> u32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 32) as u32
    }
    /// Uniform in [-1, 1), 24 bits (exact in f32).
    pub fn unit(&mut self) -> f32 {
        (self.next_u32() >> 8) as f32 / (1u32 << 23) as f32 - 1.0
    }
}

use m3_core::backend::{ActMode, KvBudget};
use m3_core::config::{AttnKind, IndexSelection};
use m3_core::kv::CacheDtype;

pub use kv::DevKv;
pub use launch::{Beside, Launcher};
pub use mono::{MonoCrossover, MonoRows, OpTime, MONO_MAX_ROWS};

use crate::error::{GpuError, Result};
use crate::kernels::KernelSource;
use crate::model::{DevBuf, DevFfn, DevModel};
use crate::runtime::api::{Device, Func, Gpu};
use graphs::Graphs;
use inputs::StepInputs;
use linear::{LinearKernels, MmaVariant, SMALL_STEP_VARIANT, SMALL_TILE_MAX_ROWS};
use std::sync::atomic::AtomicU64;

/// The standard path's kernels (`kernels/standard_decode.cu` followed by
/// `kernels/standard_attention.cu`, one translation unit).
pub const STANDARD: KernelSource = KernelSource {
    name: "standard_decode",
    body: concat!(
        include_str!("../../kernels/standard_decode.cu"),
        "\n",
        include_str!("../../kernels/standard_attention.cu")
    ),
    exact: false,
    entries: &[
        "m3s_embed",
        "m3s_rmsnorm",
        "m3s_rmsnorm_mix",
        "m3s_headnorm_rope",
        "m3s_cache_write",
        "m3s_swiglu",
        "m3s_moe_combine",
        "m3s_add_bf16",
        "m3s_act_mxfp4",
        "m3s_act_ptpc",
        "m3s_x_f16",
        "m3s_linear_f32w",
        "m3s_markov_bias",
        "m3s_mma_bf16",
        "m3s_mma_e4m3",
        "m3s_mma_e4m3_any",
        "m3s_mma_e5m2",
        "m3s_mma_e5m2_any",
        "m3s_mma_fp4",
        "m3s_mma_fp4_any",
        "m3s_mma_nvfp4",
        "m3s_mma_nvfp4_any",
        "m3s_route",
        "m3s_router_warp",
        "m3s_router_small",
        "m3s_argmax_part",
        "m3s_argmax_final",
        "m3s_index_scores",
        "m3s_index_scores_nv",
        "m3s_index_topk",
        "m3s_attn_partial",
        "m3s_attn_partial_sparse",
        "m3s_attn_partial_split",
        "m3s_attn_partial_nv",
        "m3s_attn_partial_sparse_nv",
        "m3s_attn_partial_split_nv",
        "m3s_attn_partial_sparse_d128",
        "m3s_attn_partial_split_d128",
        "m3s_attn_combine",
        "m3s_l2_prefetch",
    ],
};

/// [`STANDARD`]'s tensor-core linears as the runner compiles them for
/// steps of at most 2048 rows (the small-step variant's defines first, by
/// `linear::mma_unit_source` like every variant): CI compiles it beside
/// [`crate::kernels::ALL`], so the kernels a decode step runs are the
/// kernels CI checks.
pub fn small_step_source() -> Result<KernelSource> {
    let src = linear::mma_unit_source(&STANDARD, SMALL_STEP_VARIANT)?.src;
    Ok(KernelSource {
        name: "standard_decode_small",
        ..src
    })
}

/// The entry points [`small_step_source`] adds in CUDA builds only: the
/// one-row and one-tile MX linears and MXFP4's routed 9-64-row entry
/// (the fast walk is CUDA's; HIP runs the general entry points).
pub fn small_step_cuda_entries() -> Vec<&'static str> {
    crate::model::WFmt::MMA
        .iter()
        .flat_map(|f| {
            [
                f.mma_kernel_rows(1),
                f.mma_kernel_rows(8),
                f.mma_kernel_routed_entry(),
            ]
        })
        .flatten()
        .collect()
}

/// The mono kernel's translation unit as the runner compiles it (the
/// small-step defines; CUDA only, see kernels/mono_prelude.h): CI compiles
/// it with NVRTC beside [`crate::kernels::ALL`].
pub fn mono_step_source() -> Result<KernelSource> {
    mono::mono_source(SMALL_STEP_VARIANT, "")
}

/// The CUDA translation units a GPU runner under its default options
/// compiles, exactly as it compiles them (names and define prefixes, so
/// the same disk-cache keys): [`crate::kernels::ALL`] and
/// [`path_sources`] with the mono unit. Variants from `M3_*_DEFINES` and
/// the wide builds are not here. `cargo xtask kernels --seed-cache`
/// compiles these.
pub fn runner_cuda_sources() -> Result<Vec<KernelSource>> {
    let mut v = crate::kernels::ALL.to_vec();
    for s in path_sources(&PathOptions::default(), true)? {
        if !v.iter().any(|k| k.full_source() == s.full_source()) {
            v.push(s);
        }
    }
    Ok(v)
}

/// The translation units a path under `opts` loads ([`Kernels::load`]:
/// the default build, the small-step build as `opts` sets it, keyed
/// sampling, the attention module of `opts.attn_defines`; with `mono`,
/// [`mono::Mono::load`]'s unit), for [`Gpu::precompile`]: on a fresh
/// machine they then compile side by side. A hint: a unit missing here
/// compiles at its load.
fn path_sources(opts: &PathOptions, mono: bool) -> Result<Vec<KernelSource>> {
    let mut v = vec![
        STANDARD,
        linear::mma_unit_source(&STANDARD, opts.small_step_defines)?.src,
        crate::sampling::SAMPLE_KEYED,
    ];
    if !opts.attn_defines.is_empty() {
        v.push(attn::attn_source(opts.attn_defines)?.0);
    }
    if mono {
        // a bad mono define is reported by the mono load (or, with --path
        // auto, warned about there): nothing to precompile then
        if let Ok(m) = mono::mono_source(opts.small_step_defines, opts.mono_defines) {
            v.push(m);
        }
    }
    Ok(v)
}

/// Device-side weight and cache generation (`kernels/gen.cu`).
pub const GEN: KernelSource = KernelSource {
    name: "gen",
    body: include_str!("../../kernels/gen.cu"),
    exact: false,
    entries: &["m3s_gen_bytes", "m3s_gen_bf16", "m3s_gen_f32"],
};

/// Slices of the vocabulary in the first greedy phase.
pub(crate) const ARGMAX_PARTS: usize = 64;
/// Upper bound on the attention partials' scratch (bytes): past it, the
/// full-layer chunks grow by whole tiles instead of multiplying.
const ATTN_SCRATCH_CAP: usize = 1 << 30;

/// What a standard path is sized for. Buffers are never reallocated, so a
/// captured graph's addresses stay valid.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Capacity {
    /// Most rows a step may have.
    pub max_rows: usize,
    /// Most sequences a step may have.
    pub max_seqs: usize,
    /// Positions per cache page (the scheduler's block size).
    pub page_size: usize,
    /// Longest context (positions) a sequence may reach.
    pub max_context: usize,
    /// KV and index-cache dtype.
    pub cache_dtype: CacheDtype,
    /// Routed-expert activation mode.
    pub act: ActMode,
}

/// Choices that are not sizes (a runner reads no environment variables:
/// its caller decides).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PathOptions {
    /// Programmatic dependent launch (used only on sm_90+).
    pub pdl: bool,
    /// Steps of at most this many rows are captured into graphs (a graph per
    /// (rows, logits rows) shape); larger steps launch directly.
    pub graph_max_rows: usize,
    /// Most graphs kept (past it, new shapes launch directly).
    pub max_graphs: usize,
    /// Steps of at most 16 rows use the small-step tensor-core variant
    /// (`small_step_defines`: 4 warps a CTA, 8-12% faster per step at
    /// batch 1 and 20% at batch 16 on the H200, bench/NOTES.md session 4).
    /// Its 4 warps add K's partial sums in another order than the default's
    /// 8, so a decode row is not bit-identical to the same row in a prefill
    /// of more than 16 rows (session 3 took that for a kernel bug; it is the
    /// summation order: the variant matches an f64 reference, and the CPU
    /// reference under `m3 parity` as the default does). On by default;
    /// the CLI reads `M3_SMALL_STEP_VARIANT=0` / `M3_SMALL_STEP_DEFINES`
    /// for diagnosis ([`PathOptions::with_env_overrides`]).
    pub small_step_variant: bool,
    /// The small-step variant's compile-time settings.
    pub small_step_defines: &'static str,
    /// Steps of at most this many rows take the small-step variant (with
    /// `small_step_variant` on); larger ones the default build. 2048 by
    /// default (`linear::SMALL_TILE_MAX_ROWS`: the crossover measured on
    /// the H100 in session 48, bench/NOTES.md; session 15's H200 crossover
    /// was 512, before the route records and chunk-minor launches). The
    /// CLI reads `M3_SMALL_STEP_MAX_ROWS`.
    pub small_step_max_rows: usize,
    /// Load each MoE layer's shared expert as one more matrix of its expert
    /// stacks (`--fold-shared-expert`; it needs the experts' format and
    /// width): it then runs inside the routed experts' grouped launches
    /// instead of three launches of its own, and is added after the routed
    /// sum exactly as before (the same products, the same f32 sum).
    pub fold_shared_expert: bool,
    /// Steps of at most [`PathOptions::attn_split_max_rows`] rows run sparse attention
    /// with each selected block split over `attn::SPARSE_SPLIT` CTAs
    /// (`m3s_attn_partial_split`: -10% a batch-1 step on the H200,
    /// bench/NOTES.md session 7). Its partials merge in another order than
    /// a prefill's, so with it on a decode row is not bit-identical to the
    /// same row in a larger step (as with `small_step_variant`).
    pub small_step_attn_split: bool,
    /// Steps of at most this many rows take the split partial (with
    /// `small_step_attn_split` on): [`attn::SPLIT_MAX_ROWS`] by default. The
    /// CLI reads `M3_ATTN_SPLIT_MAX_ROWS` (timing A/Bs).
    pub attn_split_max_rows: usize,
    /// The attention kernels' compile-time settings (`SA_MAXD`, the
    /// partials' launch bounds; empty: the standard module as it is, see
    /// `attn::attn_source`). The CLI reads `M3_ATTN_DEFINES` (timing A/Bs).
    pub attn_defines: &'static str,
    /// Sparse layers whose head dim is at most 128 (bf16 and fp8 caches)
    /// take the `_d128` attention partials (standard_attention.cu: one
    /// output d group a warp; the split one built for 6 CTAs an SM, against
    /// 4 for any d; launch bounds are CUDA's alone): the same bits. On by
    /// default: 0.3-0.9% off a MoE layer at b1 / b4 / b16 on the H200
    /// (bench/NOTES.md session 39); untimed on the MI350, where it is the
    /// default too. The CLI reads `M3_ATTN_D128=0|1`.
    pub attn_d128: bool,
    /// Load the mono path: decode steps of up to [`PathOptions::mono_rows`]
    /// rows (at most `MONO_MAX_ROWS`, 64) then run each layer as one
    /// persistent launch running the standard kernels' bodies as a
    /// recorded program, bit-identical to the standard step
    /// (standard/mono.rs). Off by default; `--path mono` and `--path auto`
    /// turn it on.
    pub mono: bool,
    /// Which decode steps the loaded mono path takes: every one up to a
    /// number of rows (`--path mono`: all up to 64), or those up to the
    /// crossover the runner measures at load (`--path auto`,
    /// [`StandardPath::measure_mono_crossover`]; where loading or
    /// measuring fails there, the standard path runs every step, with a
    /// warning).
    pub mono_rows: MonoRows,
    /// In a mono program, run the two chains of each
    /// [`Launcher::beside`] call (the shared expert beside the router and
    /// the routed experts) in shared phases: each shared-expert op with a
    /// routed one, no grid barrier between the two, the second's blocks
    /// starting on the CTAs the first leaves idle (standard/mono.rs
    /// `phases`). Fewer barriers a layer and fuller phases; the same
    /// results bit for bit (each op computes what it computed). Measured
    /// -4% a b1 MoE layer and -3% at b16 against none (H100, bench/NOTES.md
    /// session 31); the CLI reads `M3_MONO_PAIR=0|1`.
    pub mono_pair_beside: bool,
    /// In a shared phase ([`PathOptions::mono_pair_beside`]), the routed
    /// chain's op first (its blocks from CTA 0) and the shared expert's on
    /// the CTAs it leaves idle; off: the shared expert's first. The routed
    /// chain is the layer's critical path (the router, whose last CTA
    /// picks every row's experts, then the experts), the shared expert's
    /// output waits until the combine. The same results bit for bit.
    /// Measured no faster (H100, a b1 MoE layer 0.3381 / 0.3366 ms against
    /// 0.3330 / 0.3337 with the shared expert's op first, bench/NOTES.md
    /// session 31: the router alone takes the phase), so off. The CLI
    /// reads `M3_MONO_MAIN_FIRST=0|1`.
    pub mono_main_first: bool,
    /// Start each mono op's blocks past the CTAs that held the op before's
    /// last round of blocks (its `rot`), so a small op after a large one
    /// runs on CTAs already waiting at the barrier with its body called,
    /// not on the ones finishing last. Off: an op alone in its phase starts
    /// from CTA 0. The op profile's wake split (bench/NOTES.md session 36,
    /// H100, b1) had the ops placed on the CTAs that finished last pass
    /// their wait 4.7-6.3 us (on average) after the barrier's last arrival
    /// (a reading: their own dispatch, the arrival's release, the body's
    /// call and first loads, the poll), where waiting CTAs took ~1.5 us:
    /// the head norm runs on q|k|v's 88 second-round CTAs, the index
    /// scores on the head norm's. The same
    /// results bit for bit (which CTA runs a block does not change its
    /// sums). On by default: -3.9% a b1 mono layer, b4 and b16 flat
    /// (H100, 3 rounds interleaved, every gate bitwise; with the router's
    /// one-row loop -5.3% / -1.1% / -0.6% against neither; bench/NOTES.md
    /// session 37). The CLI reads `M3_MONO_ROTATE_LATE=0|1`.
    pub mono_rotate_late: bool,
    /// The mono kernel's shared-memory carve-out, percent of an SM's most
    /// shared memory (CUDA; a value below the fit is raised to it, and the
    /// largest is taken where the occupancy would drop). `None`: the least
    /// that holds the CTAs an SM (H100: 37-38%, the 100 KB configuration,
    /// leaving 156 KB of L1 where the 228 KB one left 28), `Some(100)`: the
    /// largest (before session 31). The op calls' register saves are the
    /// CTAs' stacks (744 bytes a thread then, 800 with the small ops
    /// inlined), held in L1: with 28 KB they went
    /// on to L2 (Nsight Compute, a b1 mono layer: L1 hit rate 11%). -12% a
    /// b1 mono layer (bench/NOTES.md session 31); the same results. The
    /// CLI reads `M3_MONO_CARVEOUT=fit|max|N`.
    pub mono_carveout: Option<u32>,
    /// A mono program's router as the three ops it fuses (`m3s_linear_f32w`,
    /// `m3s_router_warp`, `m3s_route`, a grid barrier between each) instead
    /// of `m3s_router_small` (whose last CTA runs every row's top-k and the
    /// grouping after a device-wide count). The same bits. For timing the
    /// router's parts in the op profile: in a b1 mono layer the fused
    /// router takes ~36 us of the critical path against ~14 us in its own
    /// launch (bench/NOTES.md session 31). Measured (H200, one round, ms a
    /// MoE layer): b1 0.2701 / b4 0.4646 / b16 1.0805 against the fused
    /// router's 0.2672 / 0.4677 / 1.1030 in the same call (session 32):
    /// +1% at b1, -2% at b16, within a round's spread; off. The CLI reads
    /// `M3_MONO_ROUTER_SPLIT=0|1`.
    pub mono_router_split: bool,
    /// Decoder layers one `m3s_mono` launch runs (their programs one after
    /// another, a grid barrier between two layers as between two ops; the
    /// last group may hold fewer; 0: every layer in one launch). 1 is the
    /// issue's one launch a layer. More take the launch boundary out from
    /// between layers: the CTAs' drain and the next launch's start, which
    /// the op profile puts at ~5 us of a b1 mono layer's critical path
    /// (the first RMSNorm's 17.6 us against the second's 12.6, H100,
    /// bench/NOTES.md session 31). The same bits (each op computes what it
    /// computed; the runner tests bitwise with every layer in one launch on
    /// the H200). Measured no faster: every layer in one launch, H200, ms a
    /// MoE layer b1 0.2698 / b4 0.4660 / b16 1.1026 against 0.2672 /
    /// 0.4677 / 1.1030 in the same call (session 32): the boundary with PDL costs what a
    /// grid barrier costs, so 1. The op profile runs one launch a layer
    /// whatever this is. The CLI reads `M3_MONO_LAYERS=N`.
    pub mono_layers_per_launch: usize,
    /// The mono build's tunables (`S_MONO_INDIRECT=0|1 S_MONO_MINB=1|2 S_UNROLL_MUL=1|2
    /// S_UNROLL_HALF=0|1 S_MONO_SPREAD=0|1 S_MONO_EARLY=0|1 S_MONO_SKIP=0|1
    /// S_MONO_INLINE_SMALL=0|1 S_MONO_OPS_SMEM=0|1 S_PDL_AHEAD=1|2|3|4|6|8|12|16 S_H_PIPE_ONE|S_H_PIPE_TILE=0..30` (even; the mono build's own defaults 4 / 30, see `MONO_DEFAULTS` in mono.rs) `S_ROUTER_FIT=0|1 S_MONO_INLINE_LIN=0-63` (a mask, the CUDA default 63) `S_MONO_INLINE_ATTN=0-7` (a mask: 1 index scores, 2 split partial, 4 sparse partial; the CUDA default 2; both turned to 0 by `S_MONO_INDIRECT=0` or `S_MONO_INLINE_SMALL=0`, which refuse a non-zero mask) `S_MONO_WAKE_ACQ=0|1` (the wait's acquire: a GPU-scope fence, or one acquire load; default 1); `S_F32W_HOIST=0|1 S_F32W_ROWS=1|2` (the router logits: every load of a row before its products, 1 or 2 rows a pass; the kernel's CUDA default 1 / HIP 0, and the mono build's row default 1, see `MONO_DEFAULTS` in mono.rs); empty: the mono build's defaults). The CLI reads `M3_MONO_DEFINES` for A/B runs.
    pub mono_defines: &'static str,
    /// Each MoE layer's shared expert (gate + up, SwiGLU, down) runs on a
    /// second stream beside the router and the routed experts
    /// ([`Launcher::beside`]; in a graph, its own branch), so its launches
    /// fill the SMs the router's and the experts' small grids leave idle
    /// (a MoE layer -9.3% at batch 1, -6.0% at 4, -0.5% at 16 on the H200,
    /// bench/NOTES.md session 14). The same products and sums: results are
    /// bit-identical either way. The CLI reads `M3_BESIDE=off|on` for A/B
    /// runs.
    pub beside: Beside,
    /// Bring up to this many MiB of each layer's o-projection weights into
    /// L2 on the side stream while the layer's head norms, cache writes,
    /// indexer and attention run (latency-bound: the memory bus is mostly
    /// idle), so the o projection reads them from L2 (a MoE layer a
    /// further -3.6% at batch 1 with 16 MiB; 24 and 32 MiB measured no
    /// better, 48 worse: bench/NOTES.md session 14). Session 17 run 4 found
    /// the gain is not the bytes: leaving the prefetch launch out but
    /// keeping its fork / join costs nothing, turning it off +3.4%; what
    /// pays is the full edge the join puts before the o projection
    /// ([`PathOptions::o_full_edge`] is the switch to time that alone). 0:
    /// none. Needs the
    /// side stream and CUDA sm_90+ (`cp.async.bulk.prefetch.L2`; set to 0
    /// elsewhere); a hint: results do not change. The CLI reads
    /// `M3_L2_PREFETCH_MIB`.
    pub l2_prefetch_mib: usize,
    /// The mono path's o-projection prefetch: up to this many MiB of each
    /// layer's o weights (and all its block scales) brought into L2 by
    /// ops recorded beside the attention chain (the scales' prefetch
    /// sharing its phase with the head norms, the codes' with the next
    /// op), so the bulk prefetch streams while the attention chain
    /// (latency-bound; most CTAs idle) runs, as
    /// [`PathOptions::l2_prefetch_mib`] does on the standard path's side
    /// stream. Measured slower (H100, a b1 MoE layer 0.3331 ms
    /// without, 0.3439 / 0.3451 / 0.3490 with 16 / 32 / 48 MiB; the two
    /// prefetch ops alone ~26 us of a layer's critical path in the op
    /// profile: bench/NOTES.md session 31), so 0 (none): a diagnosis
    /// switch. CUDA sm_90+ only (set to 0 elsewhere); a hint: results do
    /// not change. The CLI reads `M3_MONO_L2_PREFETCH_MIB`.
    pub mono_l2_prefetch_mib: usize,
    /// Write K, V and the index key to their caches from the head-norm
    /// launch (V as a job without a norm) instead of a cache-write launch
    /// after it: one launch a layer fewer, the same bits (a MoE layer
    /// -0.3 to -0.7% on the H200, bench/NOTES.md session 15 run 3). The CLI reads
    /// `M3_FUSE_CACHE_WRITES=0|1` for A/B runs.
    pub fuse_cache_writes: bool,
    /// Diagnosis only: launches whose label is in this comma-separated list
    /// are left out of every step, so `m3 bench` times the step without
    /// them (a kernel's marginal cost inside the graph, overlap included).
    /// The step's outputs are then wrong; inputs a skipped kernel would
    /// have written keep earlier steps' values (routes, block choices), so
    /// the rest still reads in-range data. Empty: none. The CLI reads
    /// `M3_SKIP_LAUNCHES`.
    pub skip_launches: &'static str,
    /// Diagnosis: launches whose label is in this comma-separated list go
    /// without programmatic dependent launch (they start only once the
    /// previous kernel has finished: a plain stream order, a full edge in
    /// a graph). Results are the same; only timing changes. The CLI reads
    /// `M3_NO_PDL_LAUNCHES`.
    pub no_pdl_launches: &'static str,
    /// Diagnosis: launches whose label is in this comma-separated list are
    /// made twice in a row (on the mono path: the op recorded twice, a
    /// barrier between), so a profile times each such kernel a second time
    /// with its code and inputs just used: the cold run against the warm
    /// one. (Inside a `beside` call the mono phases pair the copy with the
    /// other chain's next op: not a clean repeat there.) Outputs may be
    /// wrong (a body that works in place runs twice), so only for timing.
    /// The CLI reads `M3_TWICE_LAUNCHES`.
    pub twice_launches: &'static str,
    /// Routed-expert launches of steps with more rows than this go without
    /// PDL ([`Launcher::full_edges`]): their CTAs cannot load weights
    /// before the route exists, and launched early they only hold SM room
    /// the shared expert's launches beside them could use. Measured on the
    /// H200 (bench/NOTES.md session 17 runs 4-5, a MoE layer without PDL):
    /// -2.4% at 16 rows, -0.7% at 32 and 64, +2-3% at 1 row, +-0 at 4.
    /// The CLI reads `M3_ROUTED_PDL_MAX_ROWS` (`max`: PDL always).
    pub routed_pdl_max_rows: usize,
    /// Routed launches of steps with more rows than one CTA takes (C: 16 in
    /// the small-step build, 64 in the 8-warp one) read route records of at
    /// most C pairs (`m3s_route`'s `chunk`: an expert of c pairs takes
    /// ceil(c / C) consecutive slots) on one z-block, instead of one record
    /// an expert on ceil(rows / C) z-blocks, where every z-block past an expert's
    /// pairs is a CTA that reads its record and exits (at b64, 3 of 4 of a
    /// routed launch's CTAs). The same CTAs' work: the same bits. Measured
    /// on the H100 (bench/NOTES.md session 47 runs 1 and 4; m3.1 --layers
    /// 12): a MoE layer -11% at b32, -19% at b64, -28% at b128 (2 rounds),
    /// -30 / -38 / -42% at 128 / 256 / 512-row steps and -19% at 1024 (the
    /// 8-warp build, 64-row CTAs; 1 round, context 512), b16 (one z-block
    /// either way) unchanged. The CLI reads `M3_ROUTE_CHUNK=0|1`.
    pub route_chunk: bool,
    /// Launch the o projection without PDL (untapped steps). Session 17
    /// run 4 found that the o prefetch's gain is mostly the full edge its
    /// fork / join puts before the o projection; this switch with
    /// `l2_prefetch_mib` 0 gives that edge without the side stream, and
    /// measured +1.0% a MoE layer at 1 row against the prefetch (session
    /// 18 run 1), so it stays off. The CLI reads `M3_O_FULL_EDGE=0|1`.
    pub o_full_edge: bool,
    /// The tensor-core index scores (fp8 / bf16 index caches) load their
    /// first key tile before the dependency wait when no row of the step
    /// writes into that block (kernels/standard_attention.cu
    /// `si_scores_mma`): keys of earlier steps, so the same results (a MoE
    /// layer -0.8% at 1 row, -0.2% at 4 on the H200, bench/NOTES.md
    /// session 18 run 4). The CLI reads `M3_INDEX_PREWAIT=0|1`.
    pub index_prewait: bool,
    /// Most `m3s_index_scores` CTAs a row (each loops over the blocks past
    /// the grid): 256 by default; 0: by the step's rows
    /// ([`attn::index_grid_x`]: faster at 128k, slower at 4k, bench/NOTES.md
    /// session 18 run 5). The CLI reads `M3_INDEX_GRID_X`.
    pub index_grid_x: usize,
    /// RMSNorm and SwiGLU (where its clamp bounds it) write the MX linears'
    /// f16 rows row-scaled: one power of two a row instead of one a block
    /// (`s_xh_row_pe` in standard_decode.cu), so the small-step fast walks
    /// multiply x's exponent once an output, not once a block (the
    /// prototype ran MXFP4 at one row 6-8 points of the ceiling faster
    /// without the per-block multiply, bench/NOTES.md session 23 run 1).
    /// The same products where both forms are exact (bf16 values down to
    /// ~2^-30 of the row's bound); the o projection's input stays
    /// per-block. The CLI reads `M3_ROW_SCALED_X=0|1` for A/B runs.
    pub row_scaled_x: bool,
    /// Gate and up run with SwiGLU in their launch's epilogue (`SSeg1`
    /// mode 3: a CTA takes 8 features, its tile rows the gate's and the
    /// up's, so each epilogue thread holds both halves), which also writes
    /// the down projection's row-scaled f16 rows: one launch fewer an MLP
    /// (the routed experts', the shared expert's, a dense layer's). The
    /// same bits as gate + up, then `m3s_swiglu`. Needs `row_scaled_x`, MX
    /// weights and a SwiGLU clamp. Measured neutral (H200, one round, ms a
    /// MoE layer, session 32): standard 0.1330 / 0.2546 / 0.6746 at b1 /
    /// b4 / b16 against 0.1337-0.1342 / 0.2523-0.2538 / 0.6625-0.6658
    /// without in the same call; mono 0.2658 / 0.4643 / 1.1065 against
    /// 0.2672 / 0.4677 / 1.1030; off. The CLI reads `M3_FUSE_SWIGLU=0|1`.
    pub fuse_swiglu: bool,
    /// A MoE layer's combine (`m3s_moe_combine`: its experts' rows weighted
    /// and added into the residual) is taken into the next layer's input
    /// RMSNorm: every CTA of that norm computes it for the whole row (it
    /// reads the whole row anyway) and writes its slice of the new
    /// residual to the other residual buffer. One launch a MoE layer
    /// fewer; the same bits (one device function for both). Steps with
    /// taps or teacher rows keep the launch. Off until measured on the
    /// device (prepared in session 23, not run). The CLI reads
    /// `M3_FOLD_COMBINE=0|1`.
    pub fold_combine: bool,
}

impl Default for PathOptions {
    fn default() -> Self {
        PathOptions {
            pdl: true,
            graph_max_rows: 128,
            max_graphs: 256,
            small_step_variant: true,
            small_step_defines: SMALL_STEP_VARIANT,
            small_step_max_rows: SMALL_TILE_MAX_ROWS,
            fold_shared_expert: false,
            small_step_attn_split: true,
            attn_split_max_rows: attn::SPLIT_MAX_ROWS,
            attn_defines: "",
            attn_d128: true,
            mono: false,
            mono_rows: MonoRows::UpTo(MONO_MAX_ROWS),
            mono_pair_beside: true,
            mono_main_first: false,
            mono_rotate_late: true,
            mono_carveout: None,
            mono_router_split: false,
            mono_layers_per_launch: 1,
            mono_defines: "",
            beside: Beside::On,
            l2_prefetch_mib: 16,
            mono_l2_prefetch_mib: 0,
            fuse_cache_writes: true,
            skip_launches: "",
            no_pdl_launches: "",
            twice_launches: "",
            routed_pdl_max_rows: ROUTED_PDL_MAX_ROWS,
            route_chunk: true,
            o_full_edge: false,
            index_prewait: true,
            index_grid_x: attn::INDEX_SCORES_GRID_X as usize,
            row_scaled_x: true,
            fuse_swiglu: false,
            fold_combine: false,
        }
    }
}

impl PathOptions {
    /// These options with the diagnosis switches of the environment applied
    /// (for binaries; a runner itself reads no environment):
    /// `M3_SMALL_STEP_VARIANT=0` turns the small-step variant off,
    /// `M3_SMALL_STEP_DEFINES` replaces its compile-time defines,
    /// `M3_SMALL_STEP_MAX_ROWS` sets the rows it takes,
    /// `M3_ATTN_DEFINES` the attention kernels' defines
    /// ([`PathOptions::attn_defines`]), `M3_ATTN_SPLIT_MAX_ROWS` the split
    /// partial's rows ([`PathOptions::attn_split_max_rows`]),
    /// `M3_ATTN_D128=0|1` the d <= 128 partials ([`PathOptions::attn_d128`]),
    /// `M3_MONO_DEFINES` sets the mono build's (see [`mono::mono_source`]),
    /// `M3_MONO_PAIR=0|1` its beside phases ([`PathOptions::mono_pair_beside`]),
    /// `M3_MONO_MAIN_FIRST=0|1` their order ([`PathOptions::mono_main_first`]),
    /// `M3_MONO_ROTATE_LATE=0|1` where each op's blocks start
    /// ([`PathOptions::mono_rotate_late`]),
    /// `M3_MONO_CARVEOUT=fit|max|N` its L1 ([`PathOptions::mono_carveout`]),
    /// `M3_MONO_ROUTER_SPLIT=0|1` its router ([`PathOptions::mono_router_split`]),
    /// `M3_MONO_LAYERS=N` its layers a launch ([`PathOptions::mono_layers_per_launch`]),
    /// `M3_BESIDE=off|on` the shared expert's stream
    /// ([`PathOptions::beside`]), `M3_L2_PREFETCH_MIB` the o projection's
    /// prefetch (`M3_MONO_L2_PREFETCH_MIB` mono's), `M3_FUSE_CACHE_WRITES=0|1` where the cache writes happen,
    /// `M3_SKIP_LAUNCHES` a timing ablation ([`PathOptions::skip_launches`]),
    /// `M3_NO_PDL_LAUNCHES` launches without PDL
    /// ([`PathOptions::no_pdl_launches`]), `M3_TWICE_LAUNCHES` launches
    /// made twice ([`PathOptions::twice_launches`]),
    /// `M3_ROUTED_PDL_MAX_ROWS` the routed experts' PDL ([`PathOptions::routed_pdl_max_rows`]),
    /// `M3_ROUTE_CHUNK=0|1` the route records' size ([`PathOptions::route_chunk`]),
    /// `M3_O_FULL_EDGE=0|1` the o projection's ([`PathOptions::o_full_edge`]),
    /// `M3_INDEX_PREWAIT=0|1` and `M3_INDEX_GRID_X` the index scores'
    /// ([`PathOptions::index_prewait`], [`PathOptions::index_grid_x`]),
    /// `M3_ROW_SCALED_X=0|1` the f16 rows' scale
    /// ([`PathOptions::row_scaled_x`]), `M3_FUSE_SWIGLU=0|1` SwiGLU in the
    /// gate + up epilogue ([`PathOptions::fuse_swiglu`]),
    /// `M3_FOLD_COMBINE=0|1` the MoE combine in the next RMSNorm
    /// ([`PathOptions::fold_combine`]).
    pub fn with_env_overrides(mut self) -> Self {
        if let Some(on) = env_flag("M3_SMALL_STEP_VARIANT") {
            self.small_step_variant = on;
        }
        if let Some(d) = env_text("M3_SMALL_STEP_DEFINES") {
            self.small_step_defines = d;
        }
        if let Some(d) = env_text("M3_ATTN_DEFINES") {
            self.attn_defines = d;
        }
        if let Some(on) = env_flag("M3_ATTN_D128") {
            self.attn_d128 = on;
        }
        if let Some(n) = env_usize("M3_ATTN_SPLIT_MAX_ROWS") {
            self.attn_split_max_rows = n;
        }
        if let Some(d) = env_text("M3_MONO_DEFINES") {
            self.mono_defines = d;
        }
        if let Some(on) = env_flag("M3_MONO_PAIR") {
            self.mono_pair_beside = on;
        }
        if let Some(on) = env_flag("M3_MONO_MAIN_FIRST") {
            self.mono_main_first = on;
        }
        if let Some(on) = env_flag("M3_MONO_ROTATE_LATE") {
            self.mono_rotate_late = on;
        }
        if let Some(on) = env_flag("M3_MONO_ROUTER_SPLIT") {
            self.mono_router_split = on;
        }
        if let Some(n) = env_usize("M3_MONO_LAYERS") {
            self.mono_layers_per_launch = n;
        }
        match env_text("M3_MONO_CARVEOUT") {
            Some("fit") => self.mono_carveout = None,
            Some("max") => self.mono_carveout = Some(100),
            Some(n) => {
                if let Ok(p) = n.parse::<u32>() {
                    self.mono_carveout = Some(p.min(100));
                }
            }
            None => {}
        }
        if let Some(n) = env_usize("M3_SMALL_STEP_MAX_ROWS") {
            self.small_step_max_rows = n.max(1);
        }
        match env_flag("M3_BESIDE") {
            Some(false) => self.beside = Beside::Off,
            Some(true) => self.beside = Beside::On,
            None => {}
        }
        if let Some(n) = env_usize("M3_L2_PREFETCH_MIB") {
            self.l2_prefetch_mib = n;
        }
        if let Some(n) = env_usize("M3_MONO_L2_PREFETCH_MIB") {
            self.mono_l2_prefetch_mib = n;
        }
        if let Some(on) = env_flag("M3_FUSE_CACHE_WRITES") {
            self.fuse_cache_writes = on;
        }
        if let Some(d) = env_text("M3_SKIP_LAUNCHES") {
            self.skip_launches = d;
        }
        if let Some(n) = env_usize("M3_ROUTED_PDL_MAX_ROWS") {
            self.routed_pdl_max_rows = n;
        }
        if let Some(on) = env_flag("M3_ROUTE_CHUNK") {
            self.route_chunk = on;
        }
        if let Some(on) = env_flag("M3_O_FULL_EDGE") {
            self.o_full_edge = on;
        }
        if let Some(d) = env_text("M3_NO_PDL_LAUNCHES") {
            self.no_pdl_launches = d;
        }
        if let Some(d) = env_text("M3_TWICE_LAUNCHES") {
            self.twice_launches = d;
        }
        if let Some(on) = env_flag("M3_INDEX_PREWAIT") {
            self.index_prewait = on;
        }
        if let Some(on) = env_flag("M3_ROW_SCALED_X") {
            self.row_scaled_x = on;
        }
        if let Some(on) = env_flag("M3_FUSE_SWIGLU") {
            self.fuse_swiglu = on;
        }
        if let Some(on) = env_flag("M3_FOLD_COMBINE") {
            self.fold_combine = on;
        }
        if let Some(n) = env_usize("M3_INDEX_GRID_X") {
            self.index_grid_x = n.min(u32::MAX as usize);
        }
        self
    }
}

/// A diagnosis switch's text, if set and not blank (leaked: kernel sources
/// and launch labels are `&'static`; one leak per switch and process).
fn env_text(name: &str) -> Option<&'static str> {
    let v = std::env::var(name).ok().filter(|v| !v.trim().is_empty())?;
    Some(Box::leak(v.into_boxed_str()))
}

/// A diagnosis switch's count (`max`: `usize::MAX`); None if unset or not
/// a count.
fn env_usize(name: &str) -> Option<usize> {
    match std::env::var(name).ok()?.trim() {
        "max" => Some(usize::MAX),
        v => v.parse().ok(),
    }
}

/// A diagnosis switch's on / off (`1`, `on` / `0`, `off`); None otherwise.
fn env_flag(name: &str) -> Option<bool> {
    match std::env::var(name).ok()?.trim() {
        "1" | "on" => Some(true),
        "0" | "off" => Some(false),
        _ => None,
    }
}

/// The pairs a chunked route record may hold: a routed launch's CTA rows
/// (8 x `S_MMA_MAXBT`, 1, 2, 4 or 8 row tiles).
const ROUTE_CHUNKS: [usize; 4] = [8, 16, 32, 64];

/// Ints of the route table of a step of at most `max_rows` rows, `pairs`
/// pairs over `experts`: the larger of one record an expert (2 + max_rows
/// ints each) and records of at most c pairs (2 + c ints each) for every
/// CTA's rows c. Linear in the rows (one record an expert is at most
/// `experts` records).
fn route_table_ints(pairs: usize, experts: usize, max_rows: usize) -> usize {
    ROUTE_CHUNKS
        .iter()
        .map(|&c| route_records(pairs, experts, c) * (2 + c))
        .fold(
            route_records(pairs, experts, 0) * (2 + max_rows),
            usize::max,
        )
}

/// Route records (`m3s_route`) of a step's `pairs` over `experts`
/// (the routed ones and a folded shared one): one an expert (`chunk` 0),
/// or, records of at most `chunk` pairs ([`PathOptions::route_chunk`]),
/// the bound sum ceil(c_e / chunk) <= (pairs + (chunk - 1) D) / chunk for
/// D <= min(pairs, experts) experts chosen. At least 1.
pub(crate) fn route_records(pairs: usize, experts: usize, chunk: usize) -> usize {
    let d = pairs.min(experts);
    (pairs + chunk.saturating_sub(1) * d)
        .checked_div(chunk)
        .unwrap_or(d)
        .max(1)
}

/// [`PathOptions::routed_pdl_max_rows`]'s default: the one-tile steps (up
/// to 8 rows) keep PDL, larger ones take a full edge.
pub const ROUTED_PDL_MAX_ROWS: usize = 8;

/// Every kernel of a step.
pub(crate) struct Kernels {
    pub lin: LinearKernels,
    pub attn: attn::AttnKernels,
    pub route: Func,
    pub router_warp: Func,
    pub router_small: Func,
    pub argmax_part: Func,
    pub argmax_final: Func,
    pub embed: Func,
    pub rmsnorm: Func,
    /// RMSNorm with a MoE combine taken in (`PathOptions::fold_combine`).
    pub rmsnorm_mix: Func,
    pub headnorm_rope: Func,
    pub cache_write: Func,
    pub swiglu: Func,
    pub moe_combine: Func,
    pub add_bf16: Func,
    pub act_mxfp4: Func,
    pub act_ptpc: Func,
    pub l2_prefetch: Func,
    pub sample_keyed: Func,
}

impl Kernels {
    /// Load every kernel of a step from the module cache (compiled once
    /// per source, arch and flags): the default tensor-core variant and the
    /// small-step one of `opts`.
    pub(crate) fn load(gpu: &dyn Gpu, opts: &PathOptions) -> Result<Self> {
        let f = |n: &str| gpu.kernel(&STANDARD, n);
        Ok(Kernels {
            lin: LinearKernels {
                mma: vec![
                    MmaVariant::load(gpu, &STANDARD, "")?,
                    MmaVariant::load(gpu, &STANDARD, opts.small_step_defines)?,
                ],
                f32w: f("m3s_linear_f32w")?,
                x_f16: f("m3s_x_f16")?,
            },
            attn: attn::AttnKernels::load(gpu, opts.attn_defines, opts.attn_d128)?,
            route: f("m3s_route")?,
            router_warp: f("m3s_router_warp")?,
            router_small: f("m3s_router_small")?,
            argmax_part: f("m3s_argmax_part")?,
            argmax_final: f("m3s_argmax_final")?,
            embed: f("m3s_embed")?,
            rmsnorm: f("m3s_rmsnorm")?,
            rmsnorm_mix: f("m3s_rmsnorm_mix")?,
            headnorm_rope: f("m3s_headnorm_rope")?,
            cache_write: f("m3s_cache_write")?,
            swiglu: f("m3s_swiglu")?,
            moe_combine: f("m3s_moe_combine")?,
            add_bf16: f("m3s_add_bf16")?,
            act_mxfp4: f("m3s_act_mxfp4")?,
            act_ptpc: f("m3s_act_ptpc")?,
            l2_prefetch: f("m3s_l2_prefetch")?,
            sample_keyed: gpu.kernel(&crate::sampling::SAMPLE_KEYED, "m3s_sample_keyed")?,
        })
    }
}

/// Activations, sized for `max_rows`.
pub(crate) struct Acts {
    pub r: DevBuf,
    /// The residual's second buffer (`PathOptions::fold_combine`: an
    /// RMSNorm that takes a MoE layer's combine in writes the new rows
    /// here, or back into `r`, in turn), the buffer holding it now, and
    /// the combine left to the next RMSNorm (host-side state of one
    /// enqueue, step.rs).
    pub r2: DevBuf,
    pub cur_r: AtomicU64,
    pub pending_combine: std::sync::Mutex<Option<pointwise::CombineIn>>,
    pub hn: DevBuf,
    pub q0: DevBuf,
    pub k0: DevBuf,
    pub v: DevBuf,
    pub q: DevBuf,
    pub k: DevBuf,
    pub iq0: DevBuf,
    pub ik0: DevBuf,
    pub iq: DevBuf,
    pub ik: DevBuf,
    /// Indexer block scores (attn.rs).
    pub scratch: DevBuf,
    /// Attention partials per (row, KV head, chunk, head) (attn.rs).
    pub ascratch: DevBuf,
    pub o: DevBuf,
    pub h2: DevBuf,
    /// MXFP4-quantized expert inputs (`--act mxfp4`): h2 rows, then the
    /// SwiGLU pairs.
    pub xq: DevBuf,
    /// PTPC FP8 inputs (online quantization): the x rows of a PTPC linear
    /// as E4M3 values in bf16, and their f32 scales (`m3s_act_ptpc`).
    pub ptpc_x: DevBuf,
    pub ptpc_s: DevBuf,
    /// The MX linears' x in the f16 layout (`m3s_x_f16`): up to every
    /// expert pair's row of the widest input; `ptpc_h`: the PTPC rows.
    pub xh: DevBuf,
    pub ptpc_h: DevBuf,
    /// The same layout written by the producers themselves (no launch of
    /// its own): RMSNorm's rows (`xh_n`), SwiGLU's and the attention
    /// merge's (`xh_a`), when the model has MX linears (`xh_fused`).
    /// `last_n` / `last_a`: the bf16 buffer whose rows each holds now and
    /// the f16 copy's address (0, 0: none), so a linear on that buffer
    /// reads the copy (step.rs), and whether that copy is row-scaled (1).
    pub xh_n: DevBuf,
    pub xh_a: DevBuf,
    /// The shared expert's SwiGLU rows in the f16 layout: apart from
    /// `xh_a`, which the routed experts' SwiGLU writes at the same time
    /// when the shared expert runs beside them.
    pub xh_s: DevBuf,
    pub xh_fused: bool,
    pub last_n: [AtomicU64; 3],
    pub last_a: [AtomicU64; 3],
    pub g: DevBuf,
    pub u: DevBuf,
    pub a: DevBuf,
    /// The shared expert's output; in tap mode also the o-projection and
    /// the dense MLP's output (bf16).
    pub yd: DevBuf,
    pub z: DevBuf,
    pub wts: DevBuf,
    pub eg: DevBuf,
    pub eu: DevBuf,
    pub ea: DevBuf,
    pub ye: DevBuf,
    pub xn: DevBuf,
    pub logits: DevBuf,
    pub tok_out: DevBuf,
    /// Expert route of the current layer (see `m3s_route`).
    pub route: DevBuf,
    /// `m3s_router_small`'s count of finished CTAs (one u32, back to 0
    /// after each launch).
    pub router_done: DevBuf,
    /// Greedy partials: best value / id per (logits row, slice).
    pub amax_v: DevBuf,
    pub amax_i: DevBuf,
    /// Chosen experts per layer `[L][max_rows][k]` and selected blocks per
    /// layer `[L][kv_heads][rows][topk]` (taps, bench byte counts).
    pub ids: DevBuf,
    pub sel: DevBuf,
}

/// The standard path on one device.
pub struct StandardPath {
    pub(crate) l: Launcher,
    pub(crate) kern: Kernels,
    pub model: DevModel,
    pub(crate) cap: Capacity,
    pub kv: DevKv,
    pub(crate) acts: Acts,
    pub(crate) inputs: StepInputs,
    pub(crate) graphs: Graphs,
    opts: PathOptions,
    /// Blocks of the longest context (`max_context / index_block_size`).
    pub(crate) maxnb: usize,
    /// Attention chunks per (row, KV head) of a full layer (attn.rs).
    pub(crate) full_chunks: usize,
    /// Attention chunks per (row, KV head) of a sparse layer (attn.rs:
    /// top-k blocks, each in `SPARSE_SPLIT` parts).
    pub(crate) sparse_chunks: usize,
    /// A tensor-core variant forced by the bench (index into
    /// `kern.lin.mma`); `None`: chosen per step by its rows.
    pub(crate) forced_variant: Option<usize>,
    /// The mono path (`PathOptions::mono`).
    pub(crate) mono: Option<mono::Mono>,
    /// Whether steps that can take the mono path do (on when it loads;
    /// the bench turns it off and on to time both).
    pub(crate) mono_on: bool,
    /// Steps launched on the mono path so far (tests check it was taken).
    pub(crate) mono_steps: u64,
    /// The largest decode step (rows) the mono path takes, every smaller
    /// one too ([`PathOptions::mono_rows`]; 0 until measured, or without
    /// the mono kernel).
    pub(crate) mono_limit: usize,
}

fn z(ctx: &Device, n: usize) -> Result<DevBuf> {
    DevBuf::zeroed(ctx, n)
}

/// Check what the kernels assume of a model config.
fn check_config(c: &m3_core::config::ModelConfig) -> Result<()> {
    let bad = |why: String| GpuError::input("standard path", why);
    if !c.head_dim.is_multiple_of(32)
        || c.head_dim > 256
        || !c.index_head_dim.is_multiple_of(32)
        || c.index_head_dim > 256
    {
        return Err(bad(format!(
            "head_dim {} / index_head_dim {} must be multiples of 32 up to 256",
            c.head_dim, c.index_head_dim
        )));
    }
    if !c.hidden_size.is_multiple_of(32) {
        return Err(bad(format!(
            "hidden_size {} must be a multiple of 32",
            c.hidden_size
        )));
    }
    if c.num_local_experts > 1024 {
        return Err(bad(format!(
            "{} routed experts: the device route and router take at most 1024",
            c.num_local_experts
        )));
    }
    if c.num_experts_per_tok > 16 || c.index_topk_blocks > 64 {
        return Err(bad(
            "top-k experts <= 16 and top-k blocks <= 64 required".into()
        ));
    }
    if c.index_selection == IndexSelection::Shared && c.index_n_heads > 4 {
        return Err(bad(
            "shared index selection supports at most 4 index heads".into()
        ));
    }
    if c.index_selection == IndexSelection::PerKvHead
        && c.index_n_heads != c.num_key_value_heads
        && c.attn_kinds.contains(&AttnKind::Sparse)
    {
        return Err(bad(
            "per-KV-head selection needs index heads == KV heads".into()
        ));
    }
    Ok(())
}

impl StandardPath {
    /// Compile the kernels, allocate activations and step inputs for `cap`,
    /// then the KV pool (`kv` blocks, or as many as the memory fraction
    /// allows after everything else), taking ownership of `model`.
    pub fn new(
        gpu: &dyn Gpu,
        model: DevModel,
        cap: Capacity,
        kv: KvBudget,
        opts: PathOptions,
    ) -> Result<Self> {
        let c = model.config.clone();
        let bad = |why: String| GpuError::input("standard path", why);
        if cap.max_rows == 0 || cap.max_seqs == 0 || cap.page_size == 0 || cap.max_context == 0 {
            return Err(bad(format!("empty capacity {cap:?}")));
        }
        check_config(&c)?;
        if gpu.vendor() == crate::kernels::Vendor::Hip && cap.cache_dtype == CacheDtype::Nvfp4 {
            // its attention and indexer entry points trap on HIP
            // (standard_attention.cu, S_NV_ONLY): refuse before any step
            return Err(bad(
                "an NVFP4 KV cache runs on CUDA only so far (the HIP route reads bf16 and fp8 caches)"
                    .into(),
            ));
        }
        let folded = model
            .layers
            .iter()
            .any(|l| matches!(l.ffn, DevFfn::Moe { folded: true, .. }));
        if folded && cap.act == ActMode::Mxfp4 {
            return Err(bad(
                "--fold-shared-expert with --act mxfp4: the folded shared expert would take MXFP4-quantized inputs, MODEL.md gives it bf16"
                    .into(),
            ));
        }
        if folded && c.num_local_experts + 1 > 1024 {
            return Err(bad(format!(
                "{} routed experts + the folded shared expert: the device route takes at most 1024",
                c.num_local_experts
            )));
        }
        // pairs per row: the router's top-k, plus a folded shared expert
        let kp = c.num_experts_per_tok + usize::from(folded);
        let ctx = gpu.device().clone();
        let mut l = Launcher::with_side(&ctx, opts.pdl && gpu.pdl(), opts.beside)?;
        l.diagnose(
            opts.skip_launches,
            opts.no_pdl_launches,
            opts.twice_launches,
        );
        // the bulk L2 prefetch is sm_90's (the devices that take PDL)
        let mut opts = opts;
        if !gpu.pdl() {
            opts.l2_prefetch_mib = 0;
            opts.mono_l2_prefetch_mib = 0;
        }
        // widest input of a PTPC linear (0: the model has none)
        let ptpc_k = model
            .layers
            .iter()
            .flat_map(|l| {
                let mut v = vec![&l.q, &l.k, &l.v, &l.o];
                if let Some(ix) = &l.indexer {
                    v.extend([&ix.q, &ix.k]);
                }
                if let DevFfn::Dense(m) = &l.ffn {
                    v.extend([&m.gate, &m.up, &m.down]);
                }
                v
            })
            .filter(|w| w.fmt == crate::model::WFmt::Ptpc)
            .map(|w| w.cols)
            .max()
            .unwrap_or(0);
        let mono_unit = opts.mono && mono::Mono::refusal(gpu, &opts, ptpc_k > 0).is_none();
        gpu.precompile(&path_sources(&opts, mono_unit)?);
        let kern = Kernels::load(gpu, &opts)?;
        let t = cap.max_rows;
        let h = c.hidden_size;
        let (nh, nkv, d) = (c.num_attention_heads, c.num_key_value_heads, c.head_dim);
        let (nih, di) = (c.index_n_heads, c.index_head_dim);
        let k = c.num_experts_per_tok;
        let kb = c.index_topk_blocks;
        let wmax = c
            .dense_intermediate_size
            .max(c.shared_intermediate_size)
            .max(c.intermediate_size);
        let maxnb = cap.max_context.div_ceil(c.index_block_size.max(1)).max(1);
        let hg = nh / nkv.max(1);
        let any_full = c.attn_kinds.contains(&AttnKind::Full);
        let full_chunks = if any_full {
            let per_chunk = attn::attn_scratch_bytes(t, nkv, 1, hg, d).max(1);
            attn::attn_max_chunks(cap.max_context, kb).min((ATTN_SCRATCH_CAP / per_chunk).max(kb))
        } else {
            kb.max(1)
        };
        // a sparse layer's chunks: each selected block in SPARSE_SPLIT parts
        let sparse_chunks = kb.max(1) * attn::SPARSE_SPLIT;
        let nl = c.num_hidden_layers;
        let selh = if c.index_selection == IndexSelection::Shared {
            1
        } else {
            nkv
        };
        let pages_per_seq = cap.max_context.div_ceil(cap.page_size);
        let mono = if opts.mono {
            match mono::Mono::load_for(gpu, &opts, ptpc_k > 0) {
                Ok(m) => Some(m),
                // --path auto: the standard path, saying why
                Err(e) if opts.mono_rows == MonoRows::Measured => {
                    tracing::warn!("--path auto runs the standard path only: {e}");
                    None
                }
                Err(e) => return Err(e),
            }
        } else {
            None
        };
        // the f16 x of the MX linears: rows up to the expert pairs, values up
        // to the widest linear input; the norms and SwiGLU write it
        // themselves where the model has MX linears
        let xh_fused = model.layers.iter().any(|l| {
            let mut v = vec![&l.q, &l.o];
            match &l.ffn {
                DevFfn::Dense(m) => v.extend([&m.gate, &m.down]),
                DevFfn::Moe {
                    experts, shared, ..
                } => {
                    v.extend([&experts.gate, &experts.down]);
                    if let Some(s) = shared {
                        v.extend([&s.gate, &s.down]);
                    }
                }
            }
            v.iter().any(|w| w.fmt.f16_x())
        }) || model.lm_head.fmt.f16_x();
        let xh_rows = t * kp.max(1);
        let xh_k = h
            .max(nh * d)
            .max(wmax)
            .max(c.intermediate_size)
            .max(nih * di);
        let acts = Acts {
            r: z(&ctx, t * h * 4)?,
            r2: z(&ctx, t * h * 4)?,
            cur_r: AtomicU64::new(0),
            pending_combine: std::sync::Mutex::new(None),
            hn: z(&ctx, t * h * 2)?,
            q0: z(&ctx, t * nh * d * 2)?,
            k0: z(&ctx, t * nkv * d * 2)?,
            v: z(&ctx, t * nkv * d * 2)?,
            q: z(&ctx, t * nh * d * 2)?,
            k: z(&ctx, t * nkv * d * 2)?,
            iq0: z(&ctx, t * nih * di * 2)?,
            ik0: z(&ctx, t * di * 2)?,
            iq: z(&ctx, t * nih * di * 2)?,
            ik: z(&ctx, t * di * 2)?,
            scratch: z(&ctx, attn::index_scratch_bytes(t, selh, maxnb))?,
            ascratch: z(
                &ctx,
                attn::attn_scratch_bytes(t, nkv, full_chunks.max(sparse_chunks), hg, d),
            )?,
            o: z(&ctx, t * nh * d * 2)?,
            h2: z(&ctx, t * h * 2)?,
            xq: z(
                &ctx,
                if cap.act == ActMode::Mxfp4 {
                    (t * h).max(t * k * c.intermediate_size) * 2
                } else {
                    2
                },
            )?,
            ptpc_x: z(&ctx, t * ptpc_k.max(1) * 2)?,
            ptpc_s: z(&ctx, t * 4)?,
            xh: z(&ctx, xh_rows * linear::xh_stride(xh_k))?,
            ptpc_h: z(&ctx, t * linear::xh_stride(ptpc_k.max(32)))?,
            xh_n: z(
                &ctx,
                if xh_fused {
                    t * linear::xh_stride(h)
                } else {
                    4
                },
            )?,
            xh_a: z(
                &ctx,
                if xh_fused {
                    (t * kp.max(1) * linear::xh_stride(c.intermediate_size.max(32)))
                        .max(t * linear::xh_stride(wmax.max(32)))
                        .max(t * linear::xh_stride(nh * d))
                } else {
                    4
                },
            )?,
            xh_s: z(
                &ctx,
                if xh_fused {
                    t * linear::xh_stride(c.shared_intermediate_size.max(32))
                } else {
                    4
                },
            )?,
            xh_fused,
            last_n: Default::default(),
            last_a: Default::default(),
            g: z(&ctx, t * wmax * 2)?,
            u: z(&ctx, t * wmax * 2)?,
            a: z(&ctx, t * wmax * 2)?,
            yd: z(&ctx, t * h * 2)?,
            z: z(&ctx, t * c.num_local_experts.max(1) * 4)?,
            wts: z(&ctx, t * k.max(1) * 4)?,
            eg: z(&ctx, t * kp * c.intermediate_size.max(1) * 2)?,
            eu: z(&ctx, t * kp * c.intermediate_size.max(1) * 2)?,
            ea: z(&ctx, t * kp * c.intermediate_size.max(1) * 2)?,
            ye: z(&ctx, t * kp.max(1) * h * 2)?,
            xn: z(&ctx, t * h * 2)?,
            logits: z(&ctx, t * c.vocab_size * 4)?,
            tok_out: z(&ctx, t * 4)?,
            route: z(
                &ctx,
                route_table_ints(t * kp, c.num_local_experts + usize::from(folded), t) * 4,
            )?,
            router_done: z(&ctx, 4)?,
            amax_v: z(&ctx, t * ARGMAX_PARTS * 4)?,
            amax_i: z(&ctx, t * ARGMAX_PARTS * 4)?,
            ids: z(&ctx, nl * t * k.max(1) * 4)?,
            sel: z(&ctx, nl * nkv * t * kb.max(1) * 4)?,
        };
        let inputs = StepInputs::new(&ctx, t, cap.max_seqs, pages_per_seq)?;
        let block_bytes = DevKv::block_bytes(&c, cap.page_size, cap.cache_dtype);
        let num_pages = match kv {
            KvBudget::Blocks(n) => n,
            KvBudget::MemoryFraction(frac) => {
                ctx.bind()?;
                let (free, total) = ctx.mem_info()?;
                // vLLM's meaning: this process may hold `frac` of the total;
                // what others hold counts against it too.
                let allowed = (frac as f64 * total as f64) as usize;
                let used = total.saturating_sub(free);
                let left = allowed.saturating_sub(used);
                // never more than the scheduler could hold at once, four
                // times over (the rest is the prefix cache's room)
                let most = cap.max_seqs * pages_per_seq * 4;
                let n = (left / block_bytes.max(1)).min(most);
                if n == 0 {
                    return Err(GpuError::input(
                        "kv cache",
                        format!(
                            "--gpu-memory-utilization {frac} leaves no room for the KV cache: {} MiB allowed, {} MiB already in use (weights and buffers), one block needs {} KiB",
                            allowed >> 20,
                            used >> 20,
                            block_bytes >> 10
                        ),
                    ));
                }
                n
            }
        };
        let kv = DevKv::new(&ctx, &c, cap.page_size, num_pages, cap.cache_dtype).map_err(|e| {
            GpuError::input(
                "kv cache",
                format!("{num_pages} blocks of {} KiB: {e}", block_bytes >> 10),
            )
        })?;
        Ok(StandardPath {
            l,
            kern,
            model,
            cap,
            kv,
            acts,
            inputs,
            graphs: Graphs::new(opts.max_graphs),
            opts,
            maxnb,
            full_chunks,
            sparse_chunks,
            forced_variant: None,
            mono_on: mono.is_some(),
            mono_limit: match opts.mono_rows {
                MonoRows::UpTo(n) if mono.is_some() => n.min(MONO_MAX_ROWS),
                _ => 0,
            },
            mono,
            mono_steps: 0,
        })
    }

    /// What the path is sized for.
    /// The options it was built with.
    pub fn options(&self) -> PathOptions {
        self.opts
    }

    pub fn capacity(&self) -> Capacity {
        self.cap
    }

    /// The launcher (its stream orders every launch of this path).
    pub fn launcher(&self) -> &Launcher {
        &self.l
    }

    /// KV blocks in the pool.
    pub fn num_pages(&self) -> usize {
        self.kv.num_pages
    }

    /// Device bytes held: weights, caches and step buffers.
    pub fn device_bytes(&self) -> usize {
        let a = &self.acts;
        let acts: usize = [
            &a.r,
            &a.r2,
            &a.hn,
            &a.q0,
            &a.k0,
            &a.v,
            &a.q,
            &a.k,
            &a.iq0,
            &a.ik0,
            &a.iq,
            &a.ik,
            &a.scratch,
            &a.ascratch,
            &a.o,
            &a.h2,
            &a.xq,
            &a.g,
            &a.u,
            &a.a,
            &a.yd,
            &a.z,
            &a.wts,
            &a.eg,
            &a.eu,
            &a.ea,
            &a.ye,
            &a.xn,
            &a.logits,
            &a.tok_out,
            &a.route,
            &a.amax_v,
            &a.amax_i,
            &a.ids,
            &a.sel,
        ]
        .iter()
        .map(|b| b.bytes())
        .sum();
        self.model.bytes() + self.kv.bytes() + acts
    }

    /// The tensor-core variant a step of `t` rows runs with.
    pub(crate) fn variant_for(&self, t: usize) -> usize {
        match self.forced_variant {
            Some(i) => i,
            None if t <= self.opts.small_step_max_rows
                && self.opts.small_step_variant
                && self.kern.lin.mma.len() > 1 =>
            {
                1
            }
            None => 0,
        }
    }

    /// Whether a step of `t` rows may be captured into a graph.
    pub(crate) fn graphable(&self, t: usize) -> bool {
        t <= self.opts.graph_max_rows
    }
}

#[cfg(test)]
mod env_switch_tests {
    use super::{env_flag, env_text, env_usize};

    /// Each switch reader on its own variable (tests run in parallel).
    #[test]
    fn switches_read_what_they_say_and_ignore_the_rest() {
        let set = |n: &str, v: &str| std::env::set_var(n, v);
        set("M3_TEST_SW_FLAG_ON", " on ");
        set("M3_TEST_SW_FLAG_OFF", "0");
        set("M3_TEST_SW_FLAG_BAD", "yes");
        assert_eq!(env_flag("M3_TEST_SW_FLAG_ON"), Some(true));
        assert_eq!(env_flag("M3_TEST_SW_FLAG_OFF"), Some(false));
        assert_eq!(env_flag("M3_TEST_SW_FLAG_BAD"), None);
        assert_eq!(env_flag("M3_TEST_SW_FLAG_UNSET"), None);
        set("M3_TEST_SW_N", "12");
        set("M3_TEST_SW_MAX", "max");
        set("M3_TEST_SW_NAN", "twelve");
        assert_eq!(env_usize("M3_TEST_SW_N"), Some(12));
        assert_eq!(env_usize("M3_TEST_SW_MAX"), Some(usize::MAX));
        assert_eq!(env_usize("M3_TEST_SW_NAN"), None);
        set("M3_TEST_SW_TEXT", "rmsnorm,swiglu");
        set("M3_TEST_SW_BLANK", "  ");
        assert_eq!(env_text("M3_TEST_SW_TEXT"), Some("rmsnorm,swiglu"));
        assert_eq!(env_text("M3_TEST_SW_BLANK"), None);
    }
}

#[cfg(test)]
mod route_bound_tests {
    use super::{route_records, route_table_ints, TestRng, ROUTE_CHUNKS};

    /// `m3s_route` drops records past its slots, so the bound the host
    /// sizes the route by must hold for every choice of experts. Random
    /// steps: each row picks k distinct experts, half of them from a few
    /// hot ones (the skew that makes many part-filled records), plus the
    /// folded shared expert; for one record an expert and every CTA's
    /// rows, the records `m3s_route` writes (distinct experts, or the sum
    /// of ceil(c_e / chunk)) against `route_records`, and their ints
    /// against `route_table_ints`.
    #[test]
    fn route_records_bound_every_step() {
        let mut rng = TestRng(7);
        let mut checked = 0;
        for _ in 0..400 {
            let ne = [8usize, 64, 256][rng.next_u32() as usize % 3];
            let k = [1usize, 4, 8][rng.next_u32() as usize % 3];
            let fold = (rng.next_u32() % 2) as usize;
            let t = 1 + rng.next_u32() as usize % 300;
            let mut cnt = vec![0usize; ne + fold];
            for _ in 0..t {
                let mut row: Vec<usize> = Vec::with_capacity(k);
                while row.len() < k {
                    let hot = rng.next_u32() & 1 == 0;
                    let e = rng.next_u32() as usize % if hot { (k + 3).min(ne) } else { ne };
                    if !row.contains(&e) {
                        row.push(e);
                    }
                }
                row.iter().for_each(|&e| cnt[e] += 1);
                cnt[ne..].iter_mut().for_each(|c| *c += 1);
            }
            let pairs = t * (k + fold);
            for chunk in std::iter::once(0).chain(ROUTE_CHUNKS) {
                let recs: usize = cnt
                    .iter()
                    .map(|&c| {
                        if chunk == 0 {
                            usize::from(c > 0)
                        } else {
                            c.div_ceil(chunk)
                        }
                    })
                    .sum();
                let bound = route_records(pairs, ne + fold, chunk);
                assert!(
                    recs <= bound,
                    "{t} rows, k {k}, {ne} experts + {fold}, chunk {chunk}: {recs} records > {bound}"
                );
                let stride = 2 + if chunk == 0 { t } else { chunk };
                assert!(recs * stride <= route_table_ints(pairs, ne + fold, t));
                checked += 1;
            }
        }
        assert_eq!(checked, 2000);
    }
}
