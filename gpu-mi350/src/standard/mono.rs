//! Mono decode, first form (issue 13): each decoder layer of a decode step
//! of at most [`MONO_MAX_ROWS`] rows runs as ONE persistent launch
//! (`m3s_mono`, kernels/mono.cu) instead of the standard path's ~20 (or
//! several layers one launch: `PathOptions::mono_layers_per_launch`, their
//! programs concatenated, [`concat_layers`]).
//!
//! The program a mono launch runs is recorded, not written twice: the
//! standard path's own launch code ([`StandardPath::enqueue_attention`] /
//! `enqueue_ffn`) runs once per (rows, layer) with the launcher in
//! recording mode, and every launch it would have made becomes an op (which
//! body, block size, grid, argument bytes) of that layer's program. On the
//! device each op's body is the standard kernel's own code compiled as a
//! device function (kernels/mono_prelude.h), run over its recorded grid by
//! the persistent CTAs, with a grid-wide barrier between two ops (none
//! inside a phase: the two chains of a `Launcher::beside` call, the MoE
//! layer's shared expert beside its router and routed experts, run op k
//! beside op k, see [`phases`]). So a mono
//! step computes exactly what the standard step computes, bit for bit; what
//! it removes is the launch boundaries (and, later, what overlapping across
//! them can win).
//!
//! Invariants: a program only holds kernel launches (a copy or memset while
//! recording is an error); every op's block is a power of two from 32 to
//! `MONO_THREADS`; the grid of `m3s_mono` is the same for every launch of a
//! path (its barrier counter counts generations of that many arrivals and is
//! never reset) and every CTA of it is resident at once (sized by the
//! occupancy the driver reports).

use std::collections::HashMap;

use m3_core::backend::StepBatch;

use super::launch::{Arg, Recorded};
use super::linear::{mma_unit_source, variant_source};
use super::{StandardPath, STANDARD};
use crate::error::{GpuError, Result};
use crate::kernels::{KernelSource, Vendor};
use crate::model::DevBuf;
use crate::runtime::api::{Device, Func, Gpu};

/// Most rows a mono step takes: 1-16 (mono decode proper) and 17-64 (its
/// wide mode, the same programs: the small-step variant's linears, which
/// the mono build carries, take any rows in row tiles of 16, and the
/// routed experts are grouped by id as on the standard path). core's
/// `Path::Mono` allows no more.
pub const MONO_MAX_ROWS: usize = m3_core::backend::MONO_MAX_ROWS;

/// Which decode steps a loaded mono path takes ([`super::PathOptions::mono_rows`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MonoRows {
    /// Every decode step of at most this many rows (capped at
    /// [`MONO_MAX_ROWS`]): `--path mono`.
    UpTo(usize),
    /// Those up to the crossover measured at load
    /// ([`StandardPath::measure_mono_crossover`]): `--path auto`. None
    /// until measured.
    Measured,
}

/// What [`StandardPath::measure_mono_crossover`] measured: per candidate
/// step (rows), the median ms of a step on each path, and the crossover
/// it set.
#[derive(Clone, Debug, PartialEq)]
pub struct MonoCrossover {
    /// (rows, standard ms, mono ms) per candidate, ascending rows.
    pub times: Vec<(usize, f64, f64)>,
    /// The largest decode step the mono path now takes: the largest
    /// candidate at and below which mono was faster at every candidate (0:
    /// at none). No cap beside it: mono gave the standard path's bits on
    /// the device (`m3 bench --path both`'s parity gate, 256 greedy steps,
    /// tokens at every step and logits at the first and last, at 1, 4, 16,
    /// 32 and 64 rows on `m3.1 --layers 12` and at 1, 4, 16 on `small`,
    /// and 2 steps at 2 rows; H100, bench/NOTES.md session 29).
    pub max_rows: usize,
}

impl MonoCrossover {
    /// The crossover of `times` ((rows, standard ms, mono ms), rows
    /// ascending): the largest rows up to which mono was faster at every
    /// candidate, 0 if it lost (or tied) at the first.
    pub fn from_times(times: Vec<(usize, f64, f64)>) -> Self {
        let max_rows = times
            .iter()
            .take_while(|(_, s, m)| m < s)
            .last()
            .map_or(0, |(t, _, _)| *t);
        MonoCrossover { times, max_rows }
    }

    /// One line for logs: each candidate's two medians and the result.
    pub fn summary(&self) -> String {
        let per: Vec<String> = self
            .times
            .iter()
            .map(|(t, s, m)| format!("{t} rows {s:.3}/{m:.3}"))
            .collect();
        let verdict = match self.max_rows {
            0 => "the standard path runs every step".to_string(),
            n => format!("decode steps of at most {n} rows run on the mono path"),
        };
        format!("standard/mono ms a step: {}; {verdict}", per.join(", "))
    }
}

/// Standard-path entry points that run another op's body, as (entry, op):
/// the d <= 128 attention partials (standard_attention.cu `_d128`).
const ATTN_ALIASES: [(&str, &str); 2] = [
    ("m3s_attn_partial_sparse_d128", "m3s_attn_partial_sparse"),
    ("m3s_attn_partial_split_d128", "m3s_attn_partial_split"),
];

/// Small-step entry points that run another linear op's body, as (entry,
/// op): MXFP4's routed entry of 9-64 rows (`S_ROUTED_SMALL`) is the
/// general entry's walks at more CTAs an SM, which in the persistent
/// kernel are the general body's (the same bits).
const LINEAR_ALIASES: [(&str, &str); 1] = [("m3s_mma_fp4_rs", "m3s_mma_fp4")];

/// The same for the FP4 routed entries of 2-8 rows, built only under
/// `S_ROUTED_TILE=1` (a bench option): they run each slot by the walk the
/// general entry picks for its rows (one-row or one-tile). MXFP4's
/// one-row walk gives its one-tile walk's bits, so it runs as the `_r8`
/// op (one walk, no spill under the mono bound); NVFP4's does not, so it
/// runs as the general body (which spills there: slower, the same bits).
const ROUTED_TILE_ALIASES: [(&str, &str); 2] = [
    ("m3s_mma_fp4_r8s", "m3s_mma_fp4_r8"),
    ("m3s_mma_nvfp4_r8s", "m3s_mma_nvfp4"),
];

/// Threads of a persistent CTA (`S_MONO_THREADS`).
pub(crate) const MONO_THREADS: u32 = 256;

/// The op bodies a program may name, by index: kernels/mono.cu's
/// `S_MONO_OPS` in the same order (a test holds the two lists equal).
pub(crate) const MONO_OPS: [&str; 41] = [
    "m3s_rmsnorm",
    "m3s_headnorm_rope",
    "m3s_cache_write",
    "m3s_swiglu",
    "m3s_moe_combine",
    "m3s_add_bf16",
    "m3s_act_mxfp4",
    "m3s_linear_f32w",
    "m3s_mma_bf16",
    "m3s_mma_e4m3",
    "m3s_mma_e4m3_any",
    "m3s_mma_e5m2",
    "m3s_mma_e5m2_any",
    "m3s_mma_fp4",
    "m3s_mma_fp4_any",
    "m3s_mma_nvfp4",
    "m3s_route",
    "m3s_router_warp",
    "m3s_index_scores",
    "m3s_index_topk",
    "m3s_attn_partial",
    "m3s_attn_partial_sparse",
    "m3s_attn_partial_split",
    "m3s_attn_combine",
    // the router of a small step in one launch
    "m3s_router_small",
    // the NVFP4 cache's entry points
    "m3s_index_scores_nv",
    "m3s_attn_partial_nv",
    "m3s_attn_partial_sparse_nv",
    "m3s_attn_partial_split_nv",
    // the MX linears' f16 x (m3s_mma_e4m3 .. m3s_mma_nvfp4 read it)
    "m3s_x_f16",
    // NVFP4 weights whose K is not a multiple of 128
    "m3s_mma_nvfp4_any",
    // RMSNorm with a MoE layer's combine taken in (fold_combine)
    "m3s_rmsnorm_mix",
    // the small-step build's one-row and one-tile linears (CUDA): one walk
    // a body, fewer registers than the format's general body
    "m3s_mma_e4m3_r1",
    "m3s_mma_e4m3_r8",
    "m3s_mma_e5m2_r1",
    "m3s_mma_e5m2_r8",
    "m3s_mma_fp4_r1",
    "m3s_mma_fp4_r8",
    "m3s_mma_nvfp4_r1",
    "m3s_mma_nvfp4_r8",
    // the o projection's L2 prefetch beside the attention chain
    // (`PathOptions::mono_l2_prefetch_mib`)
    "m3s_l2_prefetch",
];

/// Whether op `name` is a tensor-core linear (its body in the mono build
/// is the small-step variant's).
fn is_linear(name: &str) -> bool {
    name.starts_with("m3s_mma_")
}

/// The mono build's tunables and the values each takes (mono.cu /
/// mono_prelude.h / standard_decode.cu): op calls through a pointer table
/// or a switch, persistent CTAs an SM, the linears' loads in flight, and
/// how a lone op's blocks are dealt to the CTAs' sub-blocks, whether a
/// phase's bodies start before the grid barrier before it completes,
/// whether a CTA with no block of an op skips its call, whether the small
/// ops' bodies are inlined into the interpreter, whether the op records
/// are copied to shared memory at the launch's start, how many load
/// batches a plain linear brings into L2 before its wait, which fast walks
/// are software-pipelined (format bitmasks), whether the router's arrays
/// are sized to the model's experts, which linear and attention bodies are
/// inlined into the interpreter (masks), how a body's wait acquires, how
/// the router's logits loop issues its loads.
const MONO_TUNABLES: [(&str, Takes); 18] = [
    ("S_MONO_INDIRECT", Takes::List(&["0", "1"])),
    ("S_MONO_MINB", Takes::List(&["1", "2"])),
    ("S_UNROLL_MUL", Takes::List(&["1", "2"])),
    ("S_UNROLL_HALF", Takes::List(&["0", "1"])),
    ("S_MONO_SPREAD", Takes::List(&["0", "1"])),
    ("S_MONO_EARLY", Takes::List(&["0", "1"])),
    ("S_MONO_SKIP", Takes::List(&["0", "1"])),
    ("S_MONO_INLINE_SMALL", Takes::List(&["0", "1"])),
    ("S_MONO_OPS_SMEM", Takes::List(&["0", "1"])),
    (
        "S_PDL_AHEAD",
        Takes::List(&["1", "2", "3", "4", "6", "8", "12", "16"]),
    ),
    ("S_H_PIPE_ONE", Takes::List(PIPE_MASKS)),
    ("S_H_PIPE_TILE", Takes::List(PIPE_MASKS)),
    ("S_ROUTER_FIT", Takes::List(&["0", "1"])),
    ("S_MONO_INLINE_LIN", Takes::UpTo(63)),
    ("S_MONO_INLINE_ATTN", Takes::UpTo(7)),
    ("S_MONO_WAKE_ACQ", Takes::List(&["0", "1"])),
    ("S_F32W_HOIST", Takes::List(&["0", "1"])),
    ("S_F32W_ROWS", Takes::List(&["1", "2"])),
];

/// The values a mono tunable takes: these strings, or a decimal integer
/// 0 to max written plainly (no sign or leading zero: C would read `015`
/// as octal).
#[derive(Clone, Copy)]
enum Takes {
    List(&'static [&'static str]),
    UpTo(u32),
}

impl Takes {
    fn takes(self, v: &str) -> bool {
        match self {
            Takes::List(vals) => vals.contains(&v),
            Takes::UpTo(max) => v
                .parse::<u32>()
                .is_ok_and(|n| n <= max && n.to_string() == v),
        }
    }
}

impl std::fmt::Display for Takes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Takes::List(vals) => f.write_str(&vals.join("|")),
            Takes::UpTo(max) => write!(f, "0-{max}"),
        }
    }
}

/// The values of a pipelined-walk bitmask (bit 1 << S_FMT_*, the MX formats).
const PIPE_MASKS: &[&str] = &[
    "0", "2", "4", "6", "8", "10", "12", "14", "16", "18", "20", "22", "24", "26", "28", "30",
];

/// The mono build's own defaults of standard_decode.cu's tunables, put
/// first unless the mono or the small-step defines name them (they cannot
/// live in mono_prelude.h: the small-step defines come after it). Measured
/// (bench/NOTES.md session 33, H100, 2 rounds, every gate bitwise): the
/// one-tile walks (30: every MX format's mask; FP8's one-tile walks are
/// interleaved, never pipelined, so the E2M1 ones) and MXFP4's one-row
/// walk pipelined, -3.0% a b4 and
/// -3.5% a b16 mono layer, -0.3% at b1 (every one-row walk pipelined: +0.5%
/// at b1), the kernel still at 128 registers and 800 bytes of stack
/// (NVRTC 13.0). The fast walk is CUDA's; HIP's build ignores them.
/// The router's logits loop takes one row a pass (`S_F32W_ROWS`; the
/// standard build two, not timed against one there): session 37 (H100, 3
/// rounds, every gate bitwise) had one row -1.6% a b1, -1.4% a b4 and
/// -0.5% a b16 mono layer against two. HIP keeps the unhoisted loop,
/// which ignores it.
const MONO_DEFAULTS: [(&str, &str); 3] = [
    ("S_H_PIPE_TILE", "30"),
    ("S_H_PIPE_ONE", "4"),
    ("S_F32W_ROWS", "1"),
];

/// The mono translation unit: `extra` (`NAME=VALUE` pairs of
/// [`MONO_TUNABLES`]), the prelude, the standard sources with the
/// small-step defines `small`, the interpreter. Built (and leaked) once per
/// define strings.
pub fn mono_source(small: &str, extra: &str) -> Result<KernelSource> {
    let std_small = variant_source(&STANDARD, small)?.src;
    let mut prefix = String::new();
    for kv in extra.split_whitespace() {
        let known = kv.split_once('=').is_some_and(|(k, v)| {
            MONO_TUNABLES
                .iter()
                .any(|(name, vals)| *name == k && vals.takes(v))
        });
        if !known {
            let takes: Vec<String> = MONO_TUNABLES
                .iter()
                .map(|(name, vals)| format!("{name}={vals}"))
                .collect();
            return Err(GpuError::input(
                "mono defines",
                format!("`{kv}`: the mono build takes {}", takes.join(", ")),
            ));
        }
        // (the small-step defines come after: one name set in both would
        // be defined twice)
        let name = kv.split_once('=').map_or(kv, |(k, _)| k);
        if small
            .split_whitespace()
            .any(|d| d.split_once('=').is_some_and(|(k, _)| k == name))
        {
            return Err(GpuError::input(
                "mono defines",
                format!("`{kv}`: {name} is already set by the small-step defines `{small}`; set it in one of the two"),
            ));
        }
        prefix.push_str(&format!("#define {}\n", kv.replacen('=', " ", 1)));
    }
    let named = |name: &str| {
        small
            .split_whitespace()
            .chain(extra.split_whitespace())
            .any(|d| d.split_once('=').is_some_and(|(k, _)| k == name))
    };
    for (name, value) in MONO_DEFAULTS {
        if !named(name) {
            prefix.push_str(&format!("#define {name} {value}\n"));
        }
    }
    let body: &'static str = Box::leak(
        format!(
            "{prefix}{}\n#line 1 \"standard_decode.cu\"\n{}\n#line 1 \"mono.cu\"\n{}",
            include_str!("../../kernels/mono_prelude.h"),
            std_small.body,
            include_str!("../../kernels/mono.cu")
        )
        .into_boxed_str(),
    );
    Ok(KernelSource {
        name: "standard_mono",
        body,
        exact: false,
        entries: &["m3s_mono"],
    })
}

/// Whether the define list `defines` (`NAME=VALUE` pairs) holds `kv`.
fn sets(defines: &str, kv: &str) -> bool {
    defines.split_whitespace().any(|x| x == kv)
}

/// Refuse mono tunables the `vendor`'s build cannot take, before the
/// compiler does: the early start on HIP (mono_prelude.h `S_MONO_EARLY`:
/// its waiters spin beside their poller's lane, which wave64 lockstep
/// cannot run); linear or attention bodies inlined (mono.cu
/// `S_MONO_INLINE_LIN` / `S_MONO_INLINE_ATTN`, a non-zero mask) where the
/// interpreter has no inlining switch: on HIP, or with `S_MONO_INDIRECT=0`
/// or `S_MONO_INLINE_SMALL=0`.
fn defines_fit(vendor: Vendor, extra: &str) -> Result<()> {
    let has = |kv: &str| sets(extra, kv);
    if vendor == Vendor::Hip && has("S_MONO_EARLY=1") {
        return Err(GpuError::input(
            "mono defines",
            "`S_MONO_EARLY=1`: the early start is CUDA only (on HIP the mono build keeps the grid barrier whole); leave it out",
        ));
    }
    let inlined = extra.split_whitespace().find(|kv| {
        ["S_MONO_INLINE_LIN=", "S_MONO_INLINE_ATTN="]
            .iter()
            .any(|p| kv.strip_prefix(p).is_some_and(|v| v != "0"))
    });
    if let Some(kv) = inlined {
        let why = if vendor == Vendor::Hip {
            Some("HIP's interpreter calls every body through its switch")
        } else if has("S_MONO_INDIRECT=0") || has("S_MONO_INLINE_SMALL=0") {
            Some("the inlining switch needs S_MONO_INDIRECT=1 and S_MONO_INLINE_SMALL=1")
        } else {
            None
        };
        if let Some(why) = why {
            return Err(GpuError::input(
                "mono defines",
                format!("`{kv}`: {why}; leave it out or set it to 0"),
            ));
        }
    }
    Ok(())
}

/// Shared memory CUDA keeps back a block (sm_80 on), bytes.
const SHARED_RESERVED_A_BLOCK: usize = 1024;
/// CUDA's shared-memory allocation unit (sm_80 on), bytes: a block's
/// shared memory is rounded up to it.
const SHARED_ALLOC_UNIT: usize = 128;

/// The least shared-memory carve-out, in percent of `max` (a
/// multiprocessor's most shared memory, bytes), that holds `ctas` blocks
/// of `shared` bytes each (static and dynamic; plus what CUDA keeps back a
/// block, rounded up to its allocation unit); 100 where a size is unknown
/// (0). The driver rounds the percent up to a configuration it supports.
fn fit_carveout(ctas: u32, shared: usize, max: usize) -> u32 {
    if max == 0 || shared == 0 {
        return 100;
    }
    let block = (shared + SHARED_RESERVED_A_BLOCK).next_multiple_of(SHARED_ALLOC_UNIT);
    (ctas as usize * block * 100).div_ceil(max).clamp(1, 100) as u32
}

/// One recorded op as kernels/mono.cu's `SMonoOp` reads it.
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
struct OpRecord {
    fn_id: u32,
    lg: u32,
    gx: u32,
    gy: u32,
    gz: u32,
    arg: u32,
    /// Bit 0: no grid barrier after this op (the next op shares its phase:
    /// the two are independent, [`phases`]). Bit 1: the op has its phase
    /// to itself (mono.cu `S_MONO_ALONE`).
    flags: u32,
    /// CTAs the op's virtual blocks are rotated by: 0, or with
    /// `mono_rotate_late` past the op before's last round; a phase's
    /// second op starts where its first ends.
    rot: u32,
}

/// `OpRecord::flags`: the next op runs in this op's phase.
const OP_SHARES_PHASE: u32 = 1;
/// `OpRecord::flags`: neither this op nor the one before shares a phase.
const OP_ALONE: u32 = 2;

/// How many CTAs, counted from an op's rotation, hold a block of its final
/// round of `n` blocks of `block` threads on `grid` CTAs (0 where every
/// CTA does: no CTA then finishes clearly earlier). `spread`: blocks dealt
/// to every CTA's first sub-block before any second (mono.cu
/// `s_mono_spreads`: an op alone in its phase, `S_MONO_SPREAD` 1); else
/// CTA-major. Those CTAs finish the op last; the next op's blocks start
/// past them ([`PathOptions::mono_rotate_late`](super::PathOptions)).
fn late_places(n: u64, block: u32, grid: u32, spread: bool) -> u32 {
    let g = u64::from(grid.max(1));
    let s = u64::from(MONO_THREADS / block.clamp(1, MONO_THREADS));
    let per_round = g * s;
    if n == 0 {
        return 0;
    }
    let m = n - (n - 1) / per_round * per_round; // the final round's blocks, 1..=per_round
    let places = if spread {
        m.min(g)
    } else {
        m.div_ceil(s).min(g)
    };
    if places >= g {
        0
    } else {
        places as u32
    }
}

/// An op's `OpRecord::flags`: whether the next op shares its phase, and
/// whether the previous op shared its phase with this one.
fn op_flags(shares: bool, prev_shares: bool) -> u32 {
    match (shares, prev_shares) {
        (true, _) => OP_SHARES_PHASE,
        (false, false) => OP_ALONE,
        (false, true) => 0,
    }
}

/// The order a layer's recorded launches run in as a program, and per op
/// whether the next one shares its phase (no grid barrier between them).
/// Launches outside a [`Launcher::beside`](super::Launcher) call keep their
/// order, a barrier after each. A call's side chain S and main chain M
/// (independent by `beside`'s contract, as the standard path's two streams
/// already rely on) run in phases: S0 with M0, then S1 with M1, ..., each
/// chain's own order kept (a barrier after each phase), the longer chain's
/// rest alone; the op after the call waits for both. `pair` off: the
/// recorded order with a barrier after every op. `main_first`: a phase
/// runs M_k first (its blocks from CTA 0) and S_k on the CTAs M_k leaves
/// idle (`PathOptions::mono_main_first`), else S_k first.
fn phases(tags: &[Option<(u32, bool)>], pair: bool, main_first: bool) -> Vec<(usize, bool)> {
    let mut out = Vec::with_capacity(tags.len());
    let mut i = 0;
    while i < tags.len() {
        let Some((call, true)) = tags[i].filter(|_| pair) else {
            out.push((i, false));
            i += 1;
            continue;
        };
        let run = |from: usize, side: bool| {
            (from..tags.len())
                .take_while(|&j| tags[j] == Some((call, side)))
                .count()
        };
        let ns = run(i, true);
        let nm = run(i + ns, false);
        for k in 0..ns.max(nm) {
            match (k < ns, k < nm) {
                (true, true) => {
                    let (a, b) = if main_first {
                        (i + ns + k, i + k)
                    } else {
                        (i + k, i + ns + k)
                    };
                    out.push((a, true));
                    out.push((b, false));
                }
                (true, false) => out.push((i + k, false)),
                _ => out.push((i + ns + k, false)),
            }
        }
        i += ns + nm;
    }
    out
}

/// A program on the device: one layer's, or several layers' one after
/// another ([`concat_layers`]).
struct Program {
    ops: DevBuf,
    args: DevBuf,
    nops: u32,
    /// Per op: the launch label, the body and the virtual launch (for the
    /// op profile).
    about: Vec<OpAbout>,
    /// The op profile's timestamps (`nops x (2 grid + 1)` u64: the start
    /// and finish table, then the wake table; kernels/mono.cu `m3s_mono`),
    /// made by the first profiled run.
    prof: Option<DevBuf>,
}

/// What one op of a program is, for reports.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct OpAbout {
    pub(crate) label: &'static str,
    pub(crate) body: &'static str,
    pub(crate) grid: (u32, u32, u32),
    pub(crate) block: u32,
    /// No grid barrier after it: the next op runs in its phase.
    pub(crate) shares_phase: bool,
    /// CTAs its virtual blocks are rotated by.
    pub(crate) rot: u32,
}

/// One op's times in a profiled mono step, summed over the layers whose
/// programs have the same ops ([`StandardPath::mono_op_profile`]).
#[derive(Clone, Debug)]
pub struct OpTime {
    /// The standard path's launch label (what the op replaces).
    pub label: &'static str,
    /// The op body (kernels/mono.cu `S_MONO_OPS`).
    pub body: &'static str,
    /// The virtual launch: grid and threads a block.
    pub grid: (u32, u32, u32),
    pub block: u32,
    /// Rounds of virtual blocks a sub-block runs at most: the op's blocks
    /// over the grid's sub-blocks of its size (a second round where the
    /// standard launch holds every block resident at once costs nearly a
    /// block's time more on a latency-bound body).
    pub rounds: u32,
    /// Whether the next op runs in its phase (no grid barrier between:
    /// `PathOptions::mono_pair_beside`); its `barrier_us` is then the gap
    /// to the next op's start, with no barrier in it.
    pub shares_phase: bool,
    /// Microseconds from the op's start (CTA 0 past the barrier before it)
    /// to the last CTA's finish.
    pub work_us: f64,
    /// Microseconds from the first CTA's finish to the last one's (how long
    /// the earliest CTA idles at the barrier).
    pub straggle_us: f64,
    /// Microseconds from the last CTA's finish to the next op's start (the
    /// barrier's own cost; 0 after the last op).
    pub barrier_us: f64,
    /// Microseconds from the previous op's last finish (the first op: its
    /// start) to this op's last finish: the op's share of the layer's
    /// critical path, whatever overlaps (with the early start a CTA's
    /// start stamp comes before its wait, so `work_us` holds waiting; this
    /// does not). The ops' values add up to the layer.
    pub crit_us: f64,
    /// The CTA that finished the op last: microseconds from the previous
    /// op's last finish to when its body passed its dependency wait (how
    /// late it saw the grid barrier, or the op before its phase, complete;
    /// 0 where it waited before that finish, as a phase's second op may).
    pub wake_us: f64,
    /// The same CTA: microseconds from passing its wait to its finish (its
    /// share of the op's work once its inputs existed). `wake_us + run_us`
    /// is `crit_us` where that CTA's wait came after the previous op's end.
    pub run_us: f64,
    /// Mean over the CTAs that ran a body of the op of `wake_us`'s interval
    /// (how late the grid as a whole saw the barrier complete).
    pub wake_mean_us: f64,
}

/// The mono path of one standard path.
pub(crate) struct Mono {
    f: Func,
    /// Grid, registers and local memory, for reports.
    about: String,
    /// CTAs of every `m3s_mono` launch (all resident at once).
    grid: u32,
    /// The grid barrier's counter (u64, zeroed once).
    bar: DevBuf,
    /// Function handle (`Func::handle`) of each standard kernel a program may hold ->
    /// its op index.
    ids: HashMap<usize, u32>,
    /// Run the two chains of a `beside` call in shared phases
    /// ([`phases`]; `PathOptions::mono_pair_beside`).
    pair_beside: bool,
    /// A shared phase's main-chain op first ([`phases`];
    /// `PathOptions::mono_main_first`).
    main_first: bool,
    /// Each op's blocks start past the CTAs that held the op before's last
    /// round ([`late_places`]; `PathOptions::mono_rotate_late`).
    rotate_late: bool,
    /// Whether an op alone in its phase deals its blocks spread (mono.cu
    /// `S_MONO_SPREAD`: on unless the mono defines turn it off).
    spread: bool,
    /// Decoder layers a launch runs (`PathOptions::mono_layers_per_launch`,
    /// 0 taken as every layer).
    layers_per_launch: usize,
    /// Programs per step rows.
    programs: HashMap<usize, Programs>,
}

/// The programs of steps of one number of rows.
struct Programs {
    /// One a layer (what the op profile runs, one launch each).
    layers: Vec<Program>,
    /// One a launch where a launch runs several layers
    /// ([`Mono::layers_per_launch`]); empty: a launch a layer, `layers`.
    launches: Vec<Program>,
    /// The residual buffer the layers leave the step in
    /// (`PathOptions::fold_combine` moves it), where the head reads it.
    last: u64,
}

/// Several layers' recorded launches as one program's: in order, each
/// `beside` call renumbered past the calls of the layers before it (a
/// recording numbers its calls from 0, and [`phases`] pairs only the two
/// chains of one call).
fn concat_layers(layers: Vec<Vec<Recorded>>) -> Vec<Recorded> {
    let mut out = Vec::with_capacity(layers.iter().map(Vec::len).sum());
    let mut base = 0u32;
    for layer in layers {
        let calls = layer
            .iter()
            .filter_map(|r| r.beside)
            .map(|(c, _)| c + 1)
            .max()
            .unwrap_or(0);
        out.extend(layer.into_iter().map(|mut r| {
            r.beside = r.beside.map(|(c, side)| (c + base, side));
            r
        }));
        base += calls;
    }
    out
}

impl Mono {
    /// The mono path for a standard path built with `opts`, or why it
    /// cannot run (`ptpc`: the model has a per-token FP8 linear).
    /// Why [`Mono::load_for`] would refuse the mono path here before
    /// compiling anything (`None`: it goes on to compile and load).
    pub(crate) fn refusal(gpu: &dyn Gpu, opts: &super::PathOptions, ptpc: bool) -> Option<String> {
        if let Some(why) = gpu.mono_unsupported() {
            return Some(format!(
                "the mono path needs its all-resident grid sized on this device, and {why}; use --path standard"
            ));
        }
        if !opts.small_step_variant {
            return Some(
                "the mono path runs the small-step linears: it needs the small-step variant on"
                    .into(),
            );
        }
        if ptpc {
            return Some(
                "the mono path with --online-quant ptpc_fp8: the per-token FP8 quantize runs 1024-thread blocks, which the mono build does not take (its CTAs have 256 threads); use --path standard".into(),
            );
        }
        None
    }

    pub(crate) fn load_for(gpu: &dyn Gpu, opts: &super::PathOptions, ptpc: bool) -> Result<Self> {
        if let Some(why) = Mono::refusal(gpu, opts, ptpc) {
            return Err(GpuError::input("standard path", why));
        }
        let mut m = Mono::load(
            gpu,
            opts.small_step_defines,
            opts.mono_defines,
            opts.mono_carveout,
        )?;
        m.pair_beside = opts.mono_pair_beside;
        m.main_first = opts.mono_main_first;
        m.rotate_late = opts.mono_rotate_late;
        m.spread = !sets(opts.mono_defines, "S_MONO_SPREAD=0");
        m.layers_per_launch = opts.mono_layers_per_launch;
        if !opts.attn_defines.is_empty() {
            // the standard path's attention kernels then come from a module
            // of their own (`M3_ATTN_DEFINES`): its launches are the same ops
            // (mono runs its own bodies either way)
            let (src, _) = super::attn::attn_source(opts.attn_defines)?;
            m.alias_ops(gpu, &src, true)?;
        }
        Ok(m)
    }

    /// Take the launches of `src`'s kernels that are another entry point's
    /// body (the `_d128` attention partials: the split and sparse bodies
    /// with one output d group a warp, the same bits) and, with `own` (`src`
    /// is a module of its own: `M3_ATTN_DEFINES`), its every non-linear
    /// kernel, as the ops they run: mono runs its own bodies either way.
    fn alias_ops(&mut self, gpu: &dyn Gpu, src: &KernelSource, own: bool) -> Result<()> {
        let id = |name: &str| MONO_OPS.iter().position(|n| *n == name).map(|i| i as u32);
        for (i, name) in MONO_OPS.iter().enumerate() {
            if own && !is_linear(name) {
                self.ids.insert(gpu.kernel(src, name)?.handle(), i as u32);
            }
        }
        for (alias, op) in ATTN_ALIASES {
            if let Some(i) = id(op) {
                self.ids.insert(gpu.kernel(src, alias)?.handle(), i);
            }
        }
        Ok(())
    }

    /// Compile the mono kernel (the small-step defines `small`, the ones
    /// the path's decode linears use; mono.cu's tunables `extra`) and size
    /// its grid.
    pub(crate) fn load(
        gpu: &dyn Gpu,
        small: &str,
        extra: &str,
        carveout: Option<u32>,
    ) -> Result<Self> {
        defines_fit(gpu.vendor(), extra)?;
        let src = mono_source(small, extra)?;
        let f = gpu.kernel(&src, "m3s_mono")?;
        // the largest shared-memory carve-out first, so the occupancy the
        // driver reports (every CTA resident: the grid barrier needs it)
        // holds whatever the kernel's shared memory
        f.set_shared_carveout(100)?;
        let regs = f.registers();
        let local = f.local_bytes();
        let per_sm = gpu.occupancy(&f, MONO_THREADS, 0)?;
        if per_sm == 0 {
            return Err(GpuError::input(
                "mono path",
                "m3s_mono cannot be resident on this device (occupancy 0)",
            ));
        }
        // then the carve-out asked for (None: the least that still holds
        // that many CTAs; never less), the rest of the SM's store left to
        // L1, where the CTAs' stacks live; back to the largest if the
        // driver refuses it or the occupancy drops (every CTA of the grid
        // must stay resident: the grid barrier waits for all of them)
        let fit = fit_carveout(
            per_sm,
            f.shared_bytes(),
            gpu.device().shared_per_multiprocessor(),
        );
        let mut carve = carveout.map_or(fit, |c| c.max(fit));
        if carve < 100 {
            let held = f.set_shared_carveout(carve).is_ok()
                && gpu.occupancy(&f, MONO_THREADS, 0)? >= per_sm;
            if !held {
                f.set_shared_carveout(100)?;
                carve = 100;
            }
        }
        let carve_about = if gpu.vendor() == Vendor::Cuda {
            format!(", shared carve-out {carve}%")
        } else {
            String::new()
        };
        let sms = gpu.multiprocessors();
        // the linears' launches come from the unit the standard path loads
        // them from (the tensor-core unit of the small-step defines)
        let small_src = mma_unit_source(&STANDARD, small)?;
        let routed_tile = small_src.routed_tile;
        let std_small = small_src.src;
        // the row-class entry points (`_r1` / `_r8`, and `_rs` as an
        // alias below) exist, and are recorded, only where the small-step
        // build has them
        let row_entries = super::small_step_cuda_entries();
        let rows = small_src.row_entries(gpu.vendor());
        let mut ids = HashMap::new();
        for (i, name) in MONO_OPS.iter().enumerate() {
            if !rows && row_entries.contains(name) {
                continue;
            }
            let from = if is_linear(name) {
                &std_small
            } else {
                &STANDARD
            };
            let h = gpu.kernel(from, name)?;
            ids.insert(h.handle(), i as u32);
        }
        // entries that run another op's body, where the build has them
        let tile_aliases = ROUTED_TILE_ALIASES.into_iter().filter(|_| routed_tile);
        for (alias, op) in LINEAR_ALIASES
            .into_iter()
            .chain(tile_aliases)
            .filter(|_| rows)
        {
            if let Some(i) = MONO_OPS.iter().position(|n| *n == op) {
                ids.insert(gpu.kernel(&std_small, alias)?.handle(), i as u32);
            }
        }
        let mut m = Mono {
            f,
            about: format!(
                "{} persistent CTAs ({per_sm} an SM) of {MONO_THREADS} threads, {regs} registers, {local} bytes of local memory a thread{carve_about}",
                per_sm as u32 * sms
            ),
            grid: per_sm as u32 * sms,
            bar: DevBuf::zeroed(gpu.device(), 8)?,
            ids,
            pair_beside: true,
            main_first: false,
            rotate_late: true,
            spread: true,
            layers_per_launch: 1,
            programs: HashMap::new(),
        };
        m.alias_ops(gpu, &STANDARD, false)?;
        Ok(m)
    }

    /// The launch shape and resources, for reports.
    pub(crate) fn about(&self) -> &str {
        &self.about
    }

    /// The layers a launch runs, for reports.
    pub(crate) fn launch_layers(&self) -> String {
        match self.layers_per_launch {
            0 => "every layer in one launch".into(),
            1 => "one launch a layer".into(),
            k => format!("up to {k} layers a launch"),
        }
    }

    /// Turn recorded launches (one layer's, or several layers' concatenated)
    /// into a program (checking each).
    fn program(&self, ctx: &Device, rec: &[Recorded]) -> Result<Program> {
        let bad = |why: String| GpuError::input("mono program", why);
        let mut ops: Vec<OpRecord> = Vec::with_capacity(rec.len());
        let mut args: Vec<u8> = Vec::new();
        let mut about = Vec::with_capacity(rec.len());
        let tags: Vec<Option<(u32, bool)>> = rec.iter().map(|r| r.beside).collect();
        // where this op's blocks start: past the CTAs the previous op fills
        // when it shares its phase with this one, or (rotate_late) past its
        // last round's
        let mut after = 0u32;
        let g = self.grid.max(1);
        let mut prev_shares = false;
        for (ri, shares) in phases(&tags, self.pair_beside, self.main_first) {
            let r = &rec[ri];
            let Some(&id) = self.ids.get(&r.func) else {
                return Err(bad(format!(
                    "launch `{}` is not a mono op (an 8-warp linear, or a kernel the mono build lacks)",
                    r.label
                )));
            };
            let block = r.block;
            if !block.is_power_of_two() || !(32..=MONO_THREADS).contains(&block) {
                return Err(bad(format!(
                    "launch `{}` has {} threads a block (mono runs powers of two from 32 to {MONO_THREADS})",
                    r.label, block
                )));
            }
            if r.smem != 0 {
                return Err(bad(format!(
                    "launch `{}` takes {} bytes of dynamic shared memory (mono bodies carve a static pool)",
                    r.label, r.smem
                )));
            }
            let n = r.grid.0 as u64 * r.grid.1 as u64 * r.grid.2 as u64;
            if n > u32::MAX as u64 {
                return Err(bad(format!(
                    "launch `{}`: grid {:?} too large",
                    r.label, r.grid
                )));
            }
            args.resize(args.len().next_multiple_of(8), 0);
            ops.push(OpRecord {
                fn_id: id,
                lg: block.trailing_zeros(),
                gx: r.grid.0,
                gy: r.grid.1,
                gz: r.grid.2,
                arg: args.len() as u32,
                flags: op_flags(shares, prev_shares),
                rot: after,
            });
            // (a CTA runs MONO_THREADS / block of the op's blocks at once)
            let rot = after;
            after = if shares {
                let ctas = (n.div_ceil(u64::from(MONO_THREADS / block)) % u64::from(g)) as u32;
                if self.rotate_late {
                    (rot + ctas) % g
                } else {
                    ctas
                }
            } else if self.rotate_late {
                let spread = self.spread && op_flags(shares, prev_shares) == OP_ALONE;
                (rot + late_places(n, block, g, spread)) % g
            } else {
                0
            };
            prev_shares = shares;
            args.extend_from_slice(&r.args);
            about.push(OpAbout {
                label: r.label,
                body: MONO_OPS[id as usize],
                grid: r.grid,
                block,
                shares_phase: shares,
                rot: ops.last().map_or(0, |o| o.rot),
            });
        }
        if ops.is_empty() {
            return Err(bad("a layer with no launches".into()));
        }
        args.resize(args.len().next_multiple_of(8).max(8), 0);
        Ok(Program {
            ops: DevBuf::from_slice(ctx, &ops)?,
            args: DevBuf::from_slice(ctx, &args)?,
            nops: ops.len() as u32,
            about,
            prof: None,
        })
    }
}

impl StandardPath {
    /// Whether a plain step of `t` rows runs on the mono path.
    pub(crate) fn mono_for(&self, t: usize) -> bool {
        self.mono_on && self.mono.is_some() && t <= self.mono_limit && self.variant_for(t) == 1
    }

    /// The largest decode step (rows) this path runs on its mono kernel,
    /// every smaller one too (0: none): the runner's
    /// `ModelRunner::mono_max_rows`, the planner's threshold.
    pub fn mono_max_rows(&self) -> usize {
        if self.mono.is_none() {
            return 0;
        }
        // (the mono build's linears are the small-step variant's)
        let small = if self.opts.small_step_variant && self.kern.lin.mma.len() > 1 {
            self.opts.small_step_max_rows
        } else {
            0
        };
        self.mono_limit.min(small).min(self.cap.max_rows)
    }

    /// Rows of the candidate steps [`Self::measure_mono_crossover`] times
    /// by default: mono decode's 1-16 and the wide mode's 24-64.
    pub const MONO_CANDIDATES: [usize; 9] = [1, 2, 4, 8, 16, 24, 32, 48, 64];

    /// Measure where the mono path stops being faster (`--path auto`): for
    /// each of `candidates` (rows, ascending; those past the capacity are
    /// left out) a decode step of that many rows, one per sequence while
    /// sequences last (then verify rows), at context `context` (less where
    /// the pool or the longest context is smaller), timed `iters` replays
    /// on each path (graphs where the path captures them, as steps run).
    /// The mono path then takes every step up to the crossover
    /// ([`MonoCrossover::max_rows`]).
    ///
    /// It writes the candidate steps' K, V and index keys into cache pages:
    /// call it before any sequence holds pages (a runner's load).
    pub fn measure_mono_crossover(
        &mut self,
        candidates: &[usize],
        context: usize,
        iters: usize,
    ) -> Result<MonoCrossover> {
        if self.mono.is_none() {
            return Err(GpuError::input(
                "mono crossover",
                "the mono path is not loaded",
            ));
        }
        let was_on = self.mono_on;
        let mut times = Vec::new();
        let mut run = || -> Result<()> {
            let mut last = 0;
            for &t in candidates {
                if t == 0 || t <= last || t > self.cap.max_rows.min(MONO_MAX_ROWS) {
                    continue;
                }
                last = t;
                // (a sequence's rows must fit under the longest context)
                if t.div_ceil(t.min(self.cap.max_seqs).max(1)) > self.cap.max_context {
                    break;
                }
                let step = self.crossover_step(t, context);
                let sampling = vec![m3_core::sample::SampleParams::GREEDY; step.logits_rows.len()];
                let shape = self.prepare(&step, &sampling)?;
                // (the limit and the switch decide mono_for: each path in turn)
                self.mono_limit = MONO_MAX_ROWS;
                self.mono_on = false;
                let s = crate::Timing::from_samples(self.time_replays(shape, iters)?).median_ms;
                self.mono_on = true;
                if !self.mono_for(t) {
                    // the small-step variant ends before t: mono cannot take it
                    break;
                }
                let m = crate::Timing::from_samples(self.time_replays(shape, iters)?).median_ms;
                times.push((t, s, m));
            }
            Ok(())
        };
        let r = run();
        self.mono_on = was_on;
        self.mono_steps = 0;
        // the timing graphs: half of them are of a path their rows will
        // not take (steps capture their own again); nothing in flight
        let synced = self.l.sync();
        self.graphs.clear();
        synced?;
        let x = MonoCrossover::from_times(times);
        self.mono_limit = if r.is_ok() { x.max_rows } else { 0 };
        r?;
        Ok(x)
    }

    /// The decode step of `t` rows [`Self::measure_mono_crossover`] times:
    /// `min(t, max_seqs)` sequences, the rows dealt out one each in turn
    /// (a sequence of several is a verify's shape: rows at consecutive
    /// positions ending its context), each sequence's rows after `context`
    /// positions, its pages its own while the pool lasts (then shared:
    /// the cache writes of the timing steps land anywhere, which is fine
    /// for pages nobody holds).
    fn crossover_step(&self, t: usize, context: usize) -> StepBatch {
        let page = self.cap.page_size;
        let nseq = t.min(self.cap.max_seqs).max(1);
        let most = t.div_ceil(nseq);
        let ctx = context.min(self.cap.max_context.saturating_sub(most));
        let pps = (ctx + most).div_ceil(page);
        let pages = self.kv.num_pages.max(1);
        let rows: Vec<usize> = (0..nseq)
            .map(|b| t / nseq + usize::from(b < t % nseq))
            .collect();
        super::bench::timing_step(&rows, ctx, page, self.model.config.vocab_size, |b| {
            (0..pps).map(|i| ((b * pps + i) % pages) as u32).collect()
        })
    }

    /// Record the per-layer programs of steps of `t` rows (once per `t`),
    /// and the launches' programs where a launch runs several layers.
    pub(crate) fn mono_prepare(&mut self, t: usize) -> Result<()> {
        let Some(mono) = self.mono.as_ref() else {
            return Err(GpuError::input(
                "mono path",
                "not loaded (PathOptions::mono)",
            ));
        };
        if mono.programs.contains_key(&t) {
            return Ok(());
        }
        let ex = super::step::Extras::default();
        let ctx = self.l.device().clone();
        // (an input error names the layers and rows it was recording)
        let located = |e: GpuError, at: String| match e {
            GpuError::Input { op, why } => GpuError::Input {
                op,
                why: format!("{at}, {t} rows: {why}"),
            },
            e => e,
        };
        let nl = self.model.layers.len();
        let mut progs = Vec::with_capacity(nl);
        let mut recs = Vec::with_capacity(nl);
        // the layers in order, the residual buffers as a step's enqueue
        // passes them (PathOptions::fold_combine)
        self.reset_residual();
        for li in 0..nl {
            let rec = self.l.record(|| {
                self.enqueue_attention(li, t, &ex)?;
                self.enqueue_ffn(li, t, &ex)
            })?;
            let p = mono
                .program(&ctx, &rec)
                .map_err(|e| located(e, format!("layer {li}")))?;
            progs.push(p);
            recs.push(rec);
        }
        let per = match mono.layers_per_launch {
            0 => nl,
            k => k.min(nl),
        };
        let mut launches = Vec::new();
        if per > 1 {
            let mut recs = recs.into_iter();
            for first in (0..nl).step_by(per) {
                let group: Vec<Vec<Recorded>> = recs.by_ref().take(per).collect();
                let rec = concat_layers(group);
                launches.push(
                    mono.program(&ctx, &rec)
                        .map_err(|e| located(e, format!("layers {first}..")))?,
                );
            }
        }
        let last = self.acts.cur_r.load(std::sync::atomic::Ordering::Relaxed);
        if let Some(m) = self.mono.as_mut() {
            m.programs.insert(
                t,
                Programs {
                    layers: progs,
                    launches,
                    last,
                },
            );
        }
        Ok(())
    }

    /// The ops of each layer's program for steps of `t` rows
    /// ([`Self::mono_prepare`] first), for tests.
    #[cfg(test)]
    pub(crate) fn mono_programs(&self, t: usize) -> Option<Vec<Vec<OpAbout>>> {
        let p = self.mono.as_ref()?.programs.get(&t)?;
        Some(p.layers.iter().map(|p| p.about.clone()).collect())
    }

    /// The mono grid (CTAs of every `m3s_mono` launch), for tests.
    #[cfg(test)]
    pub(crate) fn mono_grid(&self) -> Option<u32> {
        self.mono.as_ref().map(|m| m.grid)
    }

    /// Every kernel of a mono step of `t` rows with `nl` logits rows: the
    /// embedding, one `m3s_mono` per layer (or per group of
    /// `PathOptions::mono_layers_per_launch` layers), the head
    /// ([`Self::mono_prepare`] first).
    ///
    /// `profile`: one launch a layer, each writing its op timestamps (the
    /// buffers [`Self::mono_op_profile`] made; a direct run, not for
    /// capture).
    pub(crate) fn enqueue_mono(&self, t: usize, nl: usize, profile: bool) -> Result<()> {
        let mono = self
            .mono
            .as_ref()
            .ok_or_else(|| GpuError::input("mono path", "not loaded (PathOptions::mono)"))?;
        let ps = mono
            .programs
            .get(&t)
            .ok_or_else(|| GpuError::input("mono path", format!("no programs for {t} rows")))?;
        let progs = if profile || ps.launches.is_empty() {
            &ps.layers
        } else {
            &ps.launches
        };
        self.enqueue_embed(t)?;
        for p in progs {
            self.l.launch(
                "mono",
                &mono.f,
                (mono.grid, 1, 1),
                MONO_THREADS,
                0,
                &[
                    Arg::U64(p.ops.ptr()),
                    Arg::U32(p.nops),
                    Arg::U64(p.args.ptr()),
                    Arg::U64(mono.bar.ptr()),
                    Arg::U64(match (&p.prof, profile) {
                        (Some(b), true) => b.ptr(),
                        _ => 0,
                    }),
                ],
            )?;
        }
        if nl > 0 {
            // the residual where the recorded layers leave it
            self.acts
                .cur_r
                .store(ps.last, std::sync::atomic::Ordering::Relaxed);
            self.enqueue_head(nl)?;
        }
        Ok(())
    }
}

impl StandardPath {
    /// Run a mono step of shape `s` once with op timestamps and return, per
    /// op of the most common layer program, its work, straggle, barrier,
    /// wake and run times summed over the layers running that program,
    /// with how many layers that is. The step's inputs must be uploaded
    /// ([`Self::prepare`]); a direct run, so the first op of each layer
    /// also holds the launch's own start.
    pub fn mono_op_profile(&mut self, s: super::exec::Shape) -> Result<(Vec<OpTime>, usize)> {
        let t = s.rows;
        if !self.mono_for(t) {
            return Err(GpuError::input(
                "mono profile",
                format!("a step of {t} rows does not run on the mono path"),
            ));
        }
        self.mono_prepare(t)?;
        let ctx = self.l.device().clone();
        let Some(mono) = self.mono.as_mut() else {
            return Err(GpuError::input("mono profile", "not loaded"));
        };
        let g = mono.grid as usize;
        if let Some(ps) = mono.programs.get_mut(&t) {
            for p in ps.layers.iter_mut().filter(|p| p.prof.is_none()) {
                p.prof = Some(DevBuf::zeroed(&ctx, p.nops as usize * (2 * g + 1) * 8)?);
            }
        }
        self.enqueue_mono(t, s.logits_rows, true)?;
        let Some(progs) = self.mono.as_ref().and_then(|m| m.programs.get(&t)) else {
            return Err(GpuError::input("mono profile", "no programs"));
        };
        let progs = &progs.layers;
        // the most common op sequence (the MoE layers of the bench model)
        let mut common: Vec<(&[OpAbout], usize)> = Vec::new();
        for p in progs {
            match common.iter_mut().find(|(a, _)| *a == p.about.as_slice()) {
                Some((_, n)) => *n += 1,
                None => common.push((&p.about, 1)),
            }
        }
        let Some(&(about, layers)) = common.iter().max_by_key(|(_, n)| *n) else {
            return Err(GpuError::input("mono profile", "no layers"));
        };
        let mut out: Vec<OpTime> = about
            .iter()
            .map(|a| OpTime {
                label: a.label,
                body: a.body,
                grid: a.grid,
                block: a.block,
                rounds: rounds(a.grid, a.block, g as u32),
                shares_phase: a.shares_phase,
                work_us: 0.0,
                straggle_us: 0.0,
                barrier_us: 0.0,
                crit_us: 0.0,
                wake_us: 0.0,
                run_us: 0.0,
                wake_mean_us: 0.0,
            })
            .collect();
        for p in progs.iter().filter(|p| p.about.as_slice() == about) {
            let Some(buf) = &p.prof else { continue };
            let mut all = vec![0u64; p.nops as usize * (2 * g + 1)];
            buf.read(self.l.stream(), 0, &mut all)?;
            let (ts, woke) = all.split_at(p.nops as usize * (g + 1));
            for (o, ((w, s, b, c), (wk, r, wm))) in out
                .iter_mut()
                .zip(op_times(ts, g).into_iter().zip(wake_times(ts, woke, g)))
            {
                o.crit_us += c;
                o.work_us += w;
                o.straggle_us += s;
                o.barrier_us += b;
                o.wake_us += wk;
                o.run_us += r;
                o.wake_mean_us += wm;
            }
        }
        Ok((out, layers))
    }
}

/// Rounds of virtual blocks the busiest sub-block runs for an op of
/// `grid` blocks of `block` threads on `ctas` persistent CTAs.
fn rounds(grid: (u32, u32, u32), block: u32, ctas: u32) -> u32 {
    let n = u64::from(grid.0) * u64::from(grid.1) * u64::from(grid.2);
    let subs = u64::from(ctas) * u64::from(MONO_THREADS / block.clamp(1, MONO_THREADS));
    n.div_ceil(subs.max(1)).min(u64::from(u32::MAX)) as u32
}

/// (work, straggle, barrier, critical path) in us per op of one launch's
/// stamps `ts` (`nops` rows of `grid + 1` ns stamps: CTA 0's start of the
/// op, then each CTA's finish; kernels/mono.cu `m3s_mono`). Work: start to
/// the last finish; straggle: first finish to last; barrier: last finish
/// to the next op's start (0 for the last op); critical path: the previous
/// op's last finish (the first op: its start) to this op's last. Stamps
/// out of order count as 0.
fn op_times(ts: &[u64], grid: usize) -> Vec<(f64, f64, f64, f64)> {
    let rows: Vec<&[u64]> = ts.chunks_exact(grid + 1).collect();
    let us = |a: u64, b: u64| b.saturating_sub(a) as f64 * 1e-3;
    let mut prev_last = rows.first().map_or(0, |r| r[0]);
    rows.iter()
        .enumerate()
        .map(|(i, row)| {
            let (lo, hi) = row[1..]
                .iter()
                .fold((u64::MAX, 0), |(lo, hi), &v| (lo.min(v), hi.max(v)));
            let barrier = rows.get(i + 1).map_or(0.0, |next| us(hi, next[0]));
            let crit = us(prev_last, hi);
            prev_last = prev_last.max(hi);
            (us(row[0], hi), us(lo, hi), barrier, crit)
        })
        .collect()
}

/// (wake, run, mean wake) in us per op of one launch: `ts` as
/// [`op_times`] takes it, `woke` nops rows of `grid` stamps (when a body of
/// the op first passed its dependency wait on each CTA; 0: none ran
/// there). Wake and run are those of the CTA that finished last (the one
/// on the critical path; 0 and 0 where it holds no stamp): the previous
/// op's last finish (the first op: its start) to its wake, and its wake to
/// its finish; the mean wake is over the CTAs with a stamp. Stamps out of
/// order count as 0.
fn wake_times(ts: &[u64], woke: &[u64], grid: usize) -> Vec<(f64, f64, f64)> {
    let us = |a: u64, b: u64| b.saturating_sub(a) as f64 * 1e-3;
    let mut prev_last = ts.first().copied().unwrap_or(0);
    ts.chunks_exact(grid + 1)
        .zip(woke.chunks_exact(grid.max(1)))
        .map(|(row, wk)| {
            let fin = &row[1..];
            // the last finisher (the lowest CTA among equals)
            let last = (0..fin.len()).fold(0, |b, c| if fin[c] > fin[b] { c } else { b });
            let hi = fin.get(last).copied().unwrap_or(0);
            let (wake, run) = match wk.get(last) {
                Some(&w) if w > 0 => (us(prev_last, w), us(w, hi)),
                _ => (0.0, 0.0),
            };
            let (sum, k) = wk
                .iter()
                .filter(|&&w| w > 0)
                .fold((0.0, 0u32), |(s, k), &w| (s + us(prev_last, w), k + 1));
            let mean = if k == 0 { 0.0 } else { sum / f64::from(k) };
            prev_last = prev_last.max(hi);
            (wake, run, mean)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Phases: outside a beside call the recorded order, a barrier after
    /// each op; a call's side and main chains pair up in order (the
    /// longer one's rest alone), each chain's order kept, every op exactly
    /// once; two calls in a row stay apart; off: the recorded order.
    #[test]
    fn beside_chains_pair_up_in_phases() {
        let s = |c| Some((c, true));
        let m = |c| Some((c, false));
        // a, [S0 S1 S2 | M0 M1 M2 M3 M4], b, [S | M], c
        let tags = [
            None,
            s(0),
            s(0),
            s(0),
            m(0),
            m(0),
            m(0),
            m(0),
            m(0),
            None,
            s(1),
            m(1),
            None,
        ];
        let got = phases(&tags, true, false);
        let want = vec![
            (0, false),
            (1, true),
            (4, false),
            (2, true),
            (5, false),
            (3, true),
            (6, false),
            (7, false),
            (8, false),
            (9, false),
            (10, true),
            (11, false),
            (12, false),
        ];
        assert_eq!(got, want);
        let mut seen: Vec<usize> = got.iter().map(|p| p.0).collect();
        seen.sort_unstable();
        assert_eq!(seen, (0..tags.len()).collect::<Vec<_>>());
        // a longer side chain; a main chain alone (no side ops) stays apart
        let tags = [s(0), s(0), m(0), m(1), None];
        assert_eq!(
            phases(&tags, true, false),
            vec![(0, true), (2, false), (1, false), (3, false), (4, false)]
        );
        // main first: each pair's main op leads, the rest unchanged
        assert_eq!(
            phases(&tags, true, true),
            vec![(2, true), (0, false), (1, false), (3, false), (4, false)]
        );
        let first = phases(&[None, s(0), s(0), m(0), m(0), m(0)], true, true);
        assert_eq!(
            first,
            vec![
                (0, false),
                (3, true),
                (1, false),
                (4, true),
                (2, false),
                (5, false)
            ]
        );
        // off: the recorded order, barriers everywhere
        let off = phases(&[s(0), m(0)], false, true);
        assert_eq!(off, vec![(0, false), (1, false)]);
        // the last op never shares its phase with nothing
        for t in [&[s(0)][..], &[None, s(3)]] {
            for mf in [false, true] {
                assert!(!phases(t, true, mf).last().is_some_and(|p| p.1), "{t:?}");
            }
        }
    }

    /// Layers concatenated into one launch's program keep their order and
    /// their own pairs: each layer's `beside` calls are renumbered past
    /// the ones before, and `phases` then pairs exactly what it pairs in
    /// each layer alone. With the recordings' own numbers (each from 0) a
    /// layer whose call has a longer side chain, followed by a layer that
    /// starts on a call's main chain, would pair the second layer's op
    /// with the first layer's (a phase across the layer's dependency).
    #[test]
    fn concatenated_layers_keep_their_own_pairs() {
        let r = |label: &'static str, beside: Option<(u32, bool)>| Recorded {
            label,
            func: 0,
            grid: (1, 1, 1),
            block: 256,
            smem: 0,
            args: Vec::new(),
            sizes: Vec::new(),
            beside,
        };
        // layer 0: a, then call 0 with two side ops and one main op;
        // layer 1 starts with its call 0's main chain
        let l0 = vec![
            r("a", None),
            r("s0", Some((0, true))),
            r("s1", Some((0, true))),
            r("m0", Some((0, false))),
        ];
        let l1 = vec![r("n0", Some((0, false))), r("b", None)];
        let all = concat_layers(vec![l0, l1]);
        let labels: Vec<_> = all.iter().map(|r| r.label).collect();
        assert_eq!(labels, ["a", "s0", "s1", "m0", "n0", "b"]);
        let tags: Vec<_> = all.iter().map(|r| r.beside).collect();
        assert_eq!(tags[4], Some((1, false)), "layer 1's call after layer 0's");
        let ph = phases(&tags, true, false);
        // s0 with m0, s1 alone, then layer 1's ops alone
        assert_eq!(
            ph,
            [
                (0, false),
                (1, true),
                (3, false),
                (2, false),
                (4, false),
                (5, false)
            ]
        );
        // with the recordings' numbers n0 would share s1's phase: the
        // comparison can fail
        let mut stale = tags.clone();
        stale[4] = Some((0, false));
        assert_eq!(
            phases(&stale, true, false),
            [
                (0, false),
                (1, true),
                (3, false),
                (2, true),
                (4, false),
                (5, false)
            ]
        );
    }

    /// A phase's first op carries "shares", its second neither bit; an op
    /// between two barriers is alone (the kernel may spread its blocks).
    #[test]
    fn op_flags_mark_phases_and_lone_ops() {
        // a program: [a+ b] [c] [d+ e] [f]
        let shares = [true, false, false, true, false, false];
        let mut prev = false;
        let mut got = Vec::new();
        for s in shares {
            got.push(op_flags(s, prev));
            prev = s;
        }
        let (sh, al) = (OP_SHARES_PHASE, OP_ALONE);
        assert_eq!(got, vec![sh, 0, al, sh, 0, al]);
    }

    /// The crossover is the last candidate of the run of mono wins from the
    /// smallest: a later win after a loss does not count, a tie is a loss,
    /// a first loss gives 0.
    #[test]
    fn crossover_is_the_end_of_the_first_run_of_wins() {
        let t = |v: &[(usize, f64, f64)]| MonoCrossover::from_times(v.to_vec()).max_rows;
        assert_eq!(t(&[]), 0);
        assert_eq!(t(&[(1, 1.0, 0.5), (4, 2.0, 1.9), (16, 3.0, 2.0)]), 16);
        assert_eq!(t(&[(1, 1.0, 0.5), (4, 2.0, 2.5), (16, 3.0, 2.0)]), 1);
        assert_eq!(t(&[(1, 1.0, 1.0), (4, 2.0, 1.0)]), 0);
        assert_eq!(t(&[(1, 1.0, 1.5), (4, 2.0, 1.0)]), 0);
        assert_eq!(t(&[(1, 1.0, f64::NAN)]), 0);
        // the summary names each candidate and the share
        let x = MonoCrossover::from_times(vec![(1, 1.0, 0.5), (4, 2.0, 1.9), (24, 2.0, 2.5)]);
        let line = x.summary();
        assert!(
            line.contains("1 rows 1.000/0.500")
                && line.contains("24 rows 2.000/2.500")
                && line.contains("at most 4 rows run on the mono path"),
            "{line}"
        );
        let none = MonoCrossover {
            times: vec![],
            max_rows: 0,
        };
        assert!(none.summary().contains("standard path runs every step"));
    }

    /// Where `list` and the `X(i, name)` entries of `src` (mono.cu's
    /// `S_MONO_OPS`) disagree, if they do.
    fn op_list_mismatch(list: &[&str], src: &str) -> Option<String> {
        let mut cu = Vec::new();
        for line in src.lines() {
            let l = line.trim().trim_end_matches('\\').trim();
            if let Some(rest) = l.strip_prefix("X(") {
                let rest = rest.trim_end_matches(')');
                let (i, name) = rest.split_once(',')?;
                cu.push((i.trim().parse::<usize>().ok()?, name.trim().to_string()));
            }
        }
        if cu.len() != list.len() {
            return Some(format!(
                "S_MONO_OPS has {}, the host {}",
                cu.len(),
                list.len()
            ));
        }
        cu.iter().enumerate().find_map(|(k, (i, name))| {
            (*i != k || name != list[k])
                .then(|| format!("entry {k}: X({i}, {name}) vs {}", list[k]))
        })
    }

    /// The host's op list and kernels/mono.cu's `S_MONO_OPS` name the same
    /// bodies at the same indices (a program's op ids index that switch),
    /// and the comparison catches a swap.
    #[test]
    fn op_list_matches_the_interpreter() {
        let src = include_str!("../../kernels/mono.cu");
        assert_eq!(op_list_mismatch(&MONO_OPS, src), None);
        let mut swapped = MONO_OPS;
        swapped.swap(3, 4);
        assert!(
            op_list_mismatch(&swapped, src).is_some(),
            "a swap went unseen"
        );
        assert!(
            op_list_mismatch(&MONO_OPS[..MONO_OPS.len() - 1], src).is_some(),
            "a missing op went unseen"
        );
        // every op is a standard kernel, or a row-class entry point of the
        // small-step build's CUDA form (`_rs` is an alias, never an op)
        let rows = crate::standard::small_step_cuda_entries();
        for n in MONO_OPS {
            assert!(
                STANDARD.entries.contains(&n) || rows.contains(&n),
                "{n} is not a standard kernel"
            );
        }
        assert!(
            rows.iter()
                .all(|r| MONO_OPS.contains(r) || LINEAR_ALIASES.iter().any(|(a, _)| a == r)),
            "every row-class entry point is an op or an alias of one"
        );
        // an alias whose op is not in the list would be skipped at load
        // (`Mono::new`), and its launches then leave mono's program
        for (alias, op) in LINEAR_ALIASES.iter().chain(&ROUTED_TILE_ALIASES) {
            assert!(
                MONO_OPS.contains(op),
                "{alias} runs {op}, which is no mono op"
            );
        }
    }

    /// The mono build takes its tunables' listed values and refuses
    /// anything else.
    #[test]
    fn mono_defines_are_checked() {
        let small = super::super::linear::SMALL_STEP_VARIANT;
        for ok in [
            "",
            "S_MONO_INDIRECT=0",
            "S_MONO_INDIRECT=1",
            "S_MONO_MINB=1 S_UNROLL_MUL=2",
            "S_UNROLL_HALF=1",
            "S_MONO_SPREAD=1",
            "S_PDL_AHEAD=3",
            "S_MONO_INLINE_LIN=15",
            "S_MONO_INLINE_LIN=63",
            "S_MONO_INLINE_ATTN=2",
            "S_MONO_WAKE_ACQ=1",
            "S_F32W_HOIST=0",
            "S_F32W_ROWS=1",
        ] {
            assert!(mono_source(small, ok).is_ok(), "{ok}");
        }
        // a name the small-step defines set too is refused, named
        let e = mono_source("S_MMA_WARPS=4 S_MMA_MAXBT=2 S_PDL_AHEAD=2", "S_PDL_AHEAD=3")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("S_PDL_AHEAD is already set"), "{e}");
        assert!(mono_source(
            "S_MMA_WARPS=4 S_MMA_MAXBT=2 S_PDL_AHEAD=2",
            "S_UNROLL_HALF=1"
        )
        .is_ok());
        let src = mono_source(small, "S_MONO_INDIRECT=0").expect("source");
        assert!(src.body.starts_with("#define S_MONO_INDIRECT 0\n"));
        // the mono defaults of the pipelined walks, unless either list
        // names them
        assert!(src
            .body
            .contains("#define S_H_PIPE_TILE 30\n#define S_H_PIPE_ONE 4\n#define S_F32W_ROWS 1\n"));
        let off = mono_source(small, "S_H_PIPE_TILE=0 S_H_PIPE_ONE=0").expect("source");
        assert!(off.body.starts_with(
            "#define S_H_PIPE_TILE 0\n#define S_H_PIPE_ONE 0\n#define S_F32W_ROWS 1\n//"
        ));
        assert!(!off.body.contains("#define S_H_PIPE_TILE 30"));
        let mine = mono_source("S_MMA_WARPS=4 S_MMA_MAXBT=2 S_H_PIPE_ONE=2", "").expect("source");
        assert!(
            mine.body
                .starts_with("#define S_H_PIPE_TILE 30\n#define S_F32W_ROWS 1\n/"),
            "{}",
            &mine.body[..80]
        );
        assert!(!mine.body.contains("#define S_H_PIPE_ONE 4"));
        for bad in [
            "S_MONO_INDIRECT=2",
            "S_MONO_MINB=0",
            "S_UNROLL_MUL=3",
            "S_UNROLL_MUL=0",
            "S_UNROLL_HALF=2",
            "S_MONO_SPREAD=2",
            "S_PDL_AHEAD=5",
            "S_H_PIPE_ONE=3",
            "S_H_PIPE_TILE=32",
            "S_MMA_WARPS=8",
            "S_MONO_INLINE_LIN=64",
            "S_MONO_INLINE_LIN=015",
            "S_MONO_INLINE_LIN=+3",
            "S_MONO_INLINE_ATTN=8",
            "S_F32W_ROWS=4",
            "junk",
        ] {
            let e = mono_source(small, bad)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(e.contains("S_MONO_INDIRECT"), "{bad}: {e}");
        }
    }

    /// The carve-out holds the CTAs' shared memory with what CUDA keeps
    /// back a block, each rounded up to the 128-byte allocation unit (H100:
    /// 2 x 43264 of 233472 bytes -> 38%, the driver's 100 KB
    /// configuration), never more than 100 or less than 1, and 100 when a
    /// size is unknown.
    #[test]
    fn carveout_fits_the_ctas() {
        assert_eq!(fit_carveout(2, 42172, 233472), 38);
        for shared in [1, 42172, 42240, 42241, 60000] {
            let p = fit_carveout(2, shared, 233472) as usize;
            let need = 2 * (shared + 1024).next_multiple_of(128);
            assert!(p * 233472 / 100 >= need.min(233472), "{shared}");
            assert!(p == 1 || (p - 1) * 233472 / 100 < need, "{shared}");
        }
        assert_eq!(fit_carveout(4, 60000, 233472), 100);
        assert_eq!(fit_carveout(1, 1, 233472), 1);
        assert_eq!(fit_carveout(2, 42172, 0), 100);
        assert_eq!(fit_carveout(2, 0, 233472), 100);
    }

    /// Rounds: q|k|v's 616 one-row blocks of 128 threads on 264 CTAs of
    /// 256 threads take two (528 sub-blocks), the o projection's 384 one,
    /// a 256-thread op of 264 blocks one and of 265 two.
    #[test]
    fn rounds_of_virtual_blocks() {
        assert_eq!(rounds((616, 1, 1), 128, 264), 2);
        assert_eq!(rounds((384, 1, 1), 128, 264), 1);
        assert_eq!(rounds((264, 1, 1), 256, 264), 1);
        assert_eq!(rounds((265, 1, 1), 256, 264), 2);
        assert_eq!(rounds((384, 4, 1), 128, 264), 3);
    }

    /// The early start is refused on HIP with the define named, taken on
    /// CUDA, and its off value taken on both.
    #[test]
    fn early_start_is_refused_on_hip() {
        let e = defines_fit(Vendor::Hip, "S_MONO_SPREAD=1 S_MONO_EARLY=1")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("S_MONO_EARLY=1"), "{e}");
        assert!(defines_fit(Vendor::Cuda, "S_MONO_EARLY=1").is_ok());
        assert!(defines_fit(Vendor::Hip, "S_MONO_EARLY=0").is_ok());
    }

    /// Inlined linear or attention bodies are refused where the interpreter has no
    /// inlining switch (HIP; CUDA without the indirect table or the inlined
    /// small ops), with the define named; 0 and the CUDA default taken.
    #[test]
    fn inlined_bodies_need_the_inlining_switch() {
        for (vendor, extra) in [
            (Vendor::Hip, "S_MONO_INLINE_LIN=3"),
            (Vendor::Cuda, "S_MONO_INDIRECT=0 S_MONO_INLINE_LIN=1"),
            (Vendor::Cuda, "S_MONO_INLINE_LIN=63 S_MONO_INLINE_SMALL=0"),
            (Vendor::Hip, "S_MONO_INLINE_ATTN=2"),
        ] {
            let e = defines_fit(vendor, extra)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(e.contains("S_MONO_INLINE_"), "{extra}: {e}");
        }
        for (vendor, extra) in [
            (Vendor::Hip, "S_MONO_INLINE_LIN=0"),
            (Vendor::Cuda, "S_MONO_INLINE_LIN=15"),
            (Vendor::Cuda, "S_MONO_INDIRECT=0"),
            (Vendor::Cuda, "S_MONO_INDIRECT=0 S_MONO_INLINE_LIN=0"),
        ] {
            assert!(defines_fit(vendor, extra).is_ok(), "{extra}");
        }
    }

    /// The CTAs holding an op's last round, worked by hand on the m3.1
    /// bench model's b1 mono grid (264 CTAs of 256 threads): q|k|v's 616
    /// blocks of 128 threads fill 528 sub-blocks, so its second round of
    /// 88 sits on 88 CTAs (spread) or 44 (CTA-major, two a CTA); the head
    /// norm's 77 one-warp blocks on 77; the o projection's 384 reach every
    /// CTA in their one round (0: none later than the rest), CTA-major 192;
    /// 792 blocks of 256 threads: three full rounds (0); none (0).
    #[test]
    fn late_places_by_hand() {
        assert_eq!(late_places(616, 128, 264, true), 88);
        assert_eq!(late_places(616, 128, 264, false), 44);
        assert_eq!(late_places(77, 32, 264, true), 77);
        assert_eq!(late_places(384, 128, 264, true), 0);
        assert_eq!(late_places(384, 128, 264, false), 192);
        assert_eq!(late_places(792, 256, 264, true), 0);
        assert_eq!(late_places(0, 128, 264, true), 0);
        assert_eq!(late_places(1, 256, 264, false), 1);
    }

    /// The op profile's arithmetic on stamps worked by hand: 2 ops over 3
    /// CTAs; and a wrong stamp is seen.
    #[test]
    fn op_times_from_stamps() {
        // op 0 starts at 1000 ns, CTAs finish at 3000, 1500, 2000; op 1
        // starts at 3400 (barrier 400 ns), CTAs finish at 5000, 5000, 4000
        let ts = [1000, 3000, 1500, 2000, 3400, 5000, 5000, 4000];
        // (critical path: op 0 from its start to 3000, op 1 from 3000 to 5000)
        let t = op_times(&ts, 3);
        assert_eq!(t, vec![(2.0, 1.5, 0.4, 2.0), (1.6, 1.0, 0.0, 2.0)]);
        let mut bad = ts;
        bad[1] = 2500; // the last CTA of op 0 finishing earlier
        assert_ne!(op_times(&bad, 3), t);
        // a stamp before its op's start counts as 0, not a negative time
        assert_eq!(op_times(&[5, 1, 2], 2), vec![(0.0, 0.001, 0.0, 0.0)]);
    }

    /// The wake split on stamps worked by hand: the same 2 ops over 3 CTAs
    /// as `op_times_from_stamps`, with when each CTA's body passed its wait.
    #[test]
    fn wake_times_from_stamps() {
        let ts = [1000, 3000, 1500, 2000, 3400, 5000, 5000, 4000];
        // op 0: CTA 0 (last to finish, at 3000) woke at 1200, CTA 2 at
        // 1600, CTA 1 ran no body; op 1: CTAs 0 and 1 finish at 5000 (the
        // lower one counts), CTA 0 woke at 3600, CTA 1 at 3800, CTA 2 at 3300
        let woke = [1200, 0, 1600, 3600, 3800, 3300];
        let t = wake_times(&ts, &woke, 3);
        let close = |a: (f64, f64, f64), b: (f64, f64, f64)| {
            (a.0 - b.0).abs() < 1e-9 && (a.1 - b.1).abs() < 1e-9 && (a.2 - b.2).abs() < 1e-9
        };
        // op 0 from its start (1000): wake 0.2, run 1.8, mean (0.2 + 0.6) / 2
        assert!(close(t[0], (0.2, 1.8, 0.4)), "{:?}", t[0]);
        // op 1 from op 0's last finish (3000): wake 0.6, run 1.4, mean
        // (0.6 + 0.8 + 0.3) / 3
        assert!(close(t[1], (0.6, 1.4, 1.7 / 3.0)), "{:?}", t[1]);
        // the last finisher without a stamp: no split; a planted stamp moves it
        let mut none = woke;
        none[0] = 0;
        assert!(close(wake_times(&ts, &none, 3)[0], (0.0, 0.0, 0.6)));
        let mut bad = woke;
        bad[3] = 3700;
        assert!(!close(wake_times(&ts, &bad, 3)[1], t[1]));
    }

    /// Arguments are laid out as mono.cu's `SMonoPack` reads them: 4-byte
    /// values at 4-byte boundaries, u64s and structs at 8, structs padded to
    /// a multiple of 8.
    #[test]
    fn arguments_follow_the_interpreters_layout() {
        let mut b = Vec::new();
        for a in [
            Arg::U32(1),
            Arg::U64(0x0203_0405_0607_0809),
            Arg::F32(1.5),
            Arg::Pod(vec![7, 8]),
            Arg::U32(3),
        ] {
            a.encode_for_test(&mut b);
        }
        assert_eq!(b.len(), 4 + 4 + 8 + 4 + 4 + 16 + 4);
        assert_eq!(&b[0..4], &1u32.to_le_bytes());
        assert_eq!(&b[4..8], &[0; 4], "the u64 starts at 8");
        assert_eq!(&b[8..16], &0x0203_0405_0607_0809u64.to_le_bytes());
        assert_eq!(&b[16..20], &1.5f32.to_le_bytes());
        assert_eq!(&b[24..32], &7u64.to_le_bytes(), "the struct starts at 24");
        assert_eq!(&b[40..44], &3u32.to_le_bytes());
    }
}
