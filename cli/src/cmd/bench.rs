//! `m3 bench --backend cpu|gpu`. CPU: prefill and decode speed of a backend on a
//! preset with in-memory synthetic weights, the bytes a decode step must
//! move, and a same-run memory-bandwidth probe to compare them with
//! (PERF.md: ratios within one run, never absolute times across runs).
//!
//! Bytes per decode step (batch 1) = every weight tensor the step touches,
//! once (routed experts: the distinct experts chosen in that step), plus
//! the KV bytes attention reads (the selected blocks' K and V, or every
//! position on full layers) and the index-cache bytes the indexer reads.

use std::collections::BTreeSet;

/// The GPU standard path's diagnosis switches (`PathOptions::with_env_overrides`),
/// for `m3 bench --help`.
pub const ENV_HELP: &str = "\
GPU diagnosis switches (environment; for A/B runs, bench/NOTES.md):
  M3_SKIP_LAUNCHES=label,...      leave those launches out of every step (a kernel's cost
                                  inside the graph; the outputs are then wrong: ABLATION)
  M3_NO_PDL_LAUNCHES=label,...    launch those without PDL (same results)
  M3_TWICE_LAUNCHES=label,...     make those twice in a row (mono: the op twice), to time a cold
                                  run against its warm repeat (outputs may be wrong: DIAGNOSIS)
  M3_ROUTED_PDL_MAX_ROWS=N|max    routed experts of steps past N rows go without PDL (8)
  M3_ROUTE_CHUNK=0|1              routed linears past a CTA's rows on one z-block, same results (1)
  M3_O_FULL_EDGE=0|1              the o projection without PDL (0)
  M3_INDEX_PREWAIT=0|1            index scores load their first keys before the wait (1)
  M3_INDEX_GRID_X=N               most index-score CTAs a row, 0: 2048 / rows, at least 256 (256)
  M3_L2_PREFETCH_MIB=N            o-projection weights brought into L2 beside attention (16)
  M3_BESIDE=on|off                the shared expert on a second stream (on)
  M3_FUSE_CACHE_WRITES=0|1        cache writes in the head-norm launch (1)
  M3_SMALL_STEP_VARIANT=0         the small-step linear build off
  M3_SMALL_STEP_DEFINES=...       its compile-time defines
  M3_SMALL_STEP_MAX_ROWS=N        the rows it takes
  M3_MONO_DEFINES=...             the mono build's defines
  M3_ATTN_DEFINES=...             the attention kernels' (SA_MAXD=64|128|256; 1-8 CTAs an SM, CUDA:
                                  SA_MINB, SA_MINB_SPLIT, SA_MINB_SPARSE, SA_MINB_SPLIT_D128, SA_MINB_SPARSE_D128)
  M3_ATTN_D128=0|1                sparse layers with head dim <= 128 take the _d128 attention partials (1)
  M3_ATTN_SPLIT_MAX_ROWS=N        steps of at most N rows take the split attention partial (default 4)
Labels are the launch names of a step's profile (`--profile`), e.g. attn_partial, index_scores,
rmsnorm, or a linear's kernel name (m3s_mma_fp4_r1).";

/// `m3 bench --path`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum BenchPath {
    Standard,
    Mono,
    Both,
}
use std::time::Instant;

use anyhow::{anyhow, bail, Result};
use m3_core::backend::{forward_by_ops, Path, RunOptions, StepBatch, TapRequest, Taps};
use m3_core::checkpoint::names::TensorNames;
use m3_core::checkpoint::online;
use m3_core::config::{AttnKind, ModelConfig};
use m3_core::formats::convert::PtpcFp8;
use m3_core::kv::{KvCache, KvLayout};
use m3_core::weights::{FfnWeights, LinearWeight, MlpWeights, ModelWeights};
use m3_cpu_ref::synthetic::{self, Formats, WeightFormat};

use crate::args::{self, ActArg, KvDtypeArg};

#[path = "bench_gpu.rs"]
mod gpu;

#[derive(clap::Args)]
pub struct Args {
    /// Backend: cpu, or gpu (the graph-captured standard path on the bench
    /// model generated on the device; see `gpu_bench`).
    #[arg(long, default_value = "cpu")]
    pub backend: String,
    /// GPU: decode batch sizes (one sequence per row), comma separated.
    #[arg(long, default_value = "1,2,4,8,16,32,64")]
    pub batch: String,
    /// GPU: cached positions before the timed decode row.
    #[arg(long, default_value_t = 4096)]
    pub context: usize,
    /// GPU: bench-model weights: mxfp4 (PERF.md formats), nvfp4 (the same
    /// with NVFP4 routed experts) or bf16.
    #[arg(long, default_value = "mxfp4")]
    pub weights: String,
    /// GPU: timed replays per case per round.
    #[arg(long, default_value_t = 200)]
    pub iters: usize,
    /// GPU: untimed replays per case after capture.
    #[arg(long, default_value_t = 20)]
    pub warmup: usize,
    /// GPU: interleaved rounds over all cases.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// GPU: also time one sequence at this context (e.g. 131072; 0 = no
    /// long-context case).
    #[arg(long, default_value_t = 0)]
    pub long_context: usize,
    /// GPU, `--path both`: before timing, run each case the mono path
    /// takes as a chain of this many greedy steps on each path, graphs and
    /// direct launches (each step's tokens fed back, positions kept), and
    /// require identical tokens and bit-identical logits at every step
    /// (0 = no gate).
    #[arg(long, default_value_t = 32)]
    pub parity_steps: usize,
    /// GPU: also time a speculative verify step: one sequence, K + 1 rows
    /// at --context (0 = none).
    #[arg(long, default_value_t = 0)]
    pub verify_k: usize,
    /// GPU: print a per-kernel profile of every case (direct launches, one
    /// event per launch; also written to the JSON).
    #[arg(long)]
    pub profile: bool,
    /// GPU: tensor-core linear variants to time against the defaults,
    /// `;`-separated, each `NAME=VALUE ...` (S_MMA_WARPS=2|4|8, S_MMA_MAXBT=1|2|4|8, S_MMA_INTERLEAVE=0|1|2 (1: also the MX fast walk's batches dealt to the warps in turn; 2, the default: its MXFP8 walks past one row), S_H_TILE_UMUL=1|2: the E2M1 one-tile walk's batch in SHalf::U (_FP4 / _NV: one format's; defaults 1 / 2), S_H_ONE_UMUL=1|2: the one-row walk's (_FP4 / _NV / _FP8; defaults 1 / 2 / 1), S_H_PIPE_ONE / S_H_PIPE_TILE=0..30 (even): the one-row / one-tile walks software-pipelined, a bitmask over the MX formats (2 E4M3, 4 MXFP4, 8 E5M2, 16 NVFP4; default 0), S_W_PF_L1=0..30 (even): the one-row walk prefetches into L1 the weights S_W_PF_DIST=1..4 batches ahead (the same bitmask; default 0, distance 1; S_W_PF_MODE=0|1|2: in every launch, in launches of several segments (gate + up) only, in one-segment launches only; not in a software-pipelined walk), S_MMA_MINB=1..16, S_UNROLL_HALF=0|1,
    /// S_UNROLL_MUL=1..4, S_FORCE_ANY=0|1: the MX any-scale entry points everywhere; S_NV_FOLD=0|1: NVFP4 block scales in the f16 weights past one x row (default 1); S_NV_SPLIT=0|1: with them and a row-scaled x, a block's two products summed apart (default 1);
    /// S_H_FAST=0|1: the MX small-step fast walk and its one-row / one-tile entry points;
    /// S_R1_MINB / S_R8_MINB=1..16: those entry points' CTAs an SM, every format
    /// (S_R1_MINB_FP8 / _FP4 / _NV, S_R8_MINB_FP8 / _FP4 / _NV: one format's one-row or
    /// one-tile entry points);
    /// S_ROUTED_SMALL=0|1: MXFP4 routed launches of 9-64 rows on the general walks at
    /// S_RS_MINB_FP4=1..16 CTAs an SM (default 1, 5; 0: the general entry's 4);
    /// S_ROUTED_TILE=0|1: MXFP4 / NVFP4 routed launches of 2-8 rows on `_r8s` entry points that
    /// run a one-row slot by the one-row walk (default 0; NVFP4's at S_R8S_MINB_NV=1..16, default 4);
    /// S_CHUNK_MINOR=0|1: plain launches of several 16-row chunks (17-2048 rows) deal the chunks
    /// in x, so the CTAs of one weight tile run together (default 1; 0: the tile-major grid;
    /// S_CHUNK_MINOR_MAX=17..4096: the most rows such a launch takes, default 2048);
    /// bf16 weights only: S_MMA_DBUF=0|1, S_X_AHEAD=0|1: x of the first row tile
    /// loaded a super-chunk ahead), e.g. "S_MMA_WARPS=4;S_UNROLL_MUL=2".
    #[arg(long, default_value = "")]
    pub variants: String,
    /// GPU: the bench model's shared experts: `dense` (PERF.md: the dense
    /// format, their own launches), `expert` (the routed experts' format,
    /// their own launches) or `folded` (that format, inside the routed
    /// experts' grouped launches: `--fold-shared-expert`). `expert` against
    /// `folded` isolates the fold.
    #[arg(long, value_enum, default_value_t = SharedArg::Dense)]
    pub shared_expert: SharedArg,
    /// GPU: JSON output (default bench/results/<date>-gpu-standard.json).
    #[arg(long)]
    pub out: Option<std::path::PathBuf>,
    /// Model preset: tiny, small or m3.1.
    #[arg(long, default_value = "small")]
    pub preset: String,
    /// Override the number of layers.
    #[arg(long)]
    pub layers: Option<usize>,
    /// GPU: also time the bench model at this many layers in the same run
    /// and print PERF.md's per-layer figure (difference in bytes over
    /// difference in time) and the projected full-depth step, e.g.
    /// `--preset m3.1 --layers 12 --per-layer 6`.
    #[arg(long)]
    pub per_layer: Option<usize>,
    /// GPU: the decode path of steps of at most 16 rows: `standard` (about
    /// 20 launches a layer), `mono` (one persistent launch a layer running
    /// the same kernels' bodies, bit-identical results), or `both` (every
    /// case on each, interleaved in the same rounds, for the ratio).
    #[arg(long, value_enum, default_value = "standard")]
    pub path: BenchPath,
    /// GPU: the linear-kernel microbench instead of the step (every weight
    /// format at --kernel-rows x rows on a stack of 8 [hidden, hidden]
    /// matrices, and the fused expert gate+up at the preset's shapes over
    /// 4..64 distinct experts; each case checked against an f64 reference,
    /// then timed; GB/s of stored bytes and % of the in-run ceiling). MX
    /// formats run twice on the small-step build: x with a power of two per
    /// 32-value block, and row-scaled (variant `... x/row`: one a row, as
    /// RMSNorm and SwiGLU write it in a step).
    #[arg(long)]
    pub kernels: bool,
    /// GPU, --kernels: x rows of each case.
    #[arg(long, default_value = "1,2,4,8,16")]
    pub kernel_rows: String,
    /// GPU, --kernels: weight formats (bf16, mxfp8, mxfp8-e5m2, mxfp4,
    /// nvfp4).
    #[arg(long, default_value = "bf16,mxfp8,mxfp8-e5m2,mxfp4,nvfp4")]
    pub kernel_formats: String,
    /// GPU, --kernels: the plain case's stack as `COUNTxROWS` (COUNT
    /// separate [ROWS, hidden] matrices, one launch each); "" = 8 x hidden.
    /// One tall matrix (e.g. `1x49152`) shows the kernel body without the
    /// per-launch ramp and tail.
    #[arg(long, default_value = "")]
    pub kernel_stack: String,
    /// GPU, --kernels: distinct-expert counts of the expert cases ("" =
    /// none).
    #[arg(long, default_value = "4,16,64")]
    pub kernel_experts: String,
    /// GPU, --kernels: rows of each expert matrix (0 = the model's
    /// intermediate size). Small with --kernel-l2, so one gate + up pair
    /// fits in L2.
    #[arg(long, default_value_t = 0)]
    pub kernel_expert_n: usize,
    /// GPU, --kernels: experts each x row picks (0 = the model's top-k).
    /// One row with many picks (e.g. `--kernel-rows 1 --kernel-top-k 64
    /// --kernel-experts 64`) makes a long one-row grouped launch.
    #[arg(long, default_value_t = 0)]
    pub kernel_top_k: usize,
    /// GPU, --kernels: time each experts case a second time L2-fed, every
    /// slot routed to expert 0 (its weights then come from L2 after the
    /// first read): the kernel's own rate with the memory bus out of the
    /// way; its % of the ceiling may pass 100.
    #[arg(long)]
    pub kernel_l2: bool,
    /// GPU, --kernels: launches of each case per graph replay, timed as
    /// one and divided (1: one launch between two events, its launch
    /// latency and ramp included; more: spread as in a step of many
    /// launches). Each rep reads the same weights, so keep the cases far
    /// past L2 (e.g. `--kernel-stack 1x49152`).
    #[arg(long, default_value_t = 1)]
    pub kernel_reps: usize,
    /// GPU: MiB of the in-run ceiling's streaming-read probe (the copy
    /// probe moves half as many); far past L2 for a ceiling (PERF.md),
    /// small only to try the bench on the simulator.
    #[arg(long, default_value_t = 4096)]
    pub ceiling_mib: usize,
    /// Prompt length of the prefill step.
    #[arg(long, default_value_t = 256)]
    pub prompt_len: usize,
    /// Timed decode steps (batch 1) after the prefill.
    #[arg(long, default_value_t = 16)]
    pub decode_steps: usize,
    /// Routed-expert format: mxfp4, nvfp4, mxfp8, bf16.
    #[arg(long, default_value = "mxfp4")]
    pub experts: String,
    /// Format of attention, indexer, dense MLP and shared expert: mxfp8, bf16.
    #[arg(long, default_value = "mxfp8")]
    pub dense: String,
    /// Online quantization of the generated weights before the run (as
    /// `m3 generate --online-quant`; ARCHITECTURE.md, Online
    /// quantization): the converted linears are timed and their bytes
    /// counted in the PTPC FP8 form. CPU and GPU (there: the bench model's
    /// attention and dense MLP).
    #[arg(long, value_enum)]
    pub online_quant: Option<args::OnlineQuantArg>,
    /// CPU, with --online-quant: comma-separated tensor-name substrings
    /// left as generated (names as `m3 synth` writes them, e.g.
    /// `o_proj,model.layers.0.`).
    #[arg(long, requires = "online_quant", value_name = "PATTERN,...")]
    pub online_quant_exclude: Option<String>,
    /// KV and index cache dtype (bf16, fp8_e4m3, nvfp4). The GPU bench
    /// takes a comma-separated list (e.g. `fp8_e4m3,nvfp4`) and runs the
    /// whole bench once per dtype in one call (same device, same model);
    /// the CPU bench takes one.
    #[arg(
        long,
        value_enum,
        default_value = "fp8_e4m3",
        visible_alias = "kv-cache-dtype",
        value_delimiter = ','
    )]
    pub kv_dtype: Vec<KvDtypeArg>,
    /// Routed-expert activation mode.
    #[arg(long, value_enum, default_value = "bf16")]
    pub act: ActArg,
    /// Size of the memory-bandwidth probe buffer in MiB.
    #[arg(long, default_value_t = 512)]
    pub probe_mib: usize,
    /// Threads (0 = all cores).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
}

fn fmt(s: &str) -> Result<WeightFormat> {
    Ok(match s {
        "bf16" => WeightFormat::Bf16,
        "mxfp8" => WeightFormat::Mxfp8,
        "mxfp4" => WeightFormat::Mxfp4,
        "nvfp4" => WeightFormat::Nvfp4,
        o => bail!("weight format `{o}` is not one of bf16, mxfp8, mxfp4, nvfp4"),
    })
}

/// Stored bytes of a weight.
fn wbytes(w: &LinearWeight) -> usize {
    match w {
        LinearWeight::Bf16 { data, .. } => data.len() * 2,
        LinearWeight::F32 { data, .. } => data.len() * 4,
        LinearWeight::Mx(t) => t.codes().len() + t.scales().len(),
        LinearWeight::Nvfp4(t) => t.codes().len() + t.scales().len() + 4,
    }
}

fn mlp_bytes(m: &MlpWeights) -> usize {
    wbytes(&m.gate) + wbytes(&m.up) + wbytes(&m.down)
}

/// Bytes of a linear as the step reads it: its PTPC FP8 form where online
/// quantization made one (codes + one f32 scale a row), else as stored.
fn lin_bytes(w: &LinearWeight, ptpc: &Option<PtpcFp8>) -> usize {
    ptpc.as_ref()
        .map_or_else(|| wbytes(w), |p| p.codes.len() + 4 * p.scales.len())
}

/// Bytes one batch-1 decode step at position `p` must move, given the
/// experts chosen per layer (`experts[l]`) and the blocks selected.
fn step_bytes(m: &ModelWeights, cache: &KvCache, p: usize, taps: &Taps) -> usize {
    let c = &m.config;
    let f = 4; // f32 norm weights
    let mut b = m.embed.cols() * 2 + wbytes(&m.lm_head) + m.final_norm.len() * f;
    for (l, lw) in m.layers.iter().enumerate() {
        let a = &lw.attn;
        b += (lw.input_norm.len() + lw.post_attn_norm.len() + a.q_norm.len() + a.k_norm.len()) * f;
        let pt = &lw.ptpc;
        b += lin_bytes(&a.q, &pt.q)
            + lin_bytes(&a.k, &pt.k)
            + lin_bytes(&a.v, &pt.v)
            + lin_bytes(&a.o, &pt.o);
        let lc = &cache.layers[l];
        let per_pos = lc.k.bytes_per(c.head_dim); // one head's K (or V) at one position
        let visible = p + 1;
        if c.attn_kinds[l] == AttnKind::Sparse {
            if let Some(ix) = &a.indexer {
                b += lin_bytes(&ix.q, &pt.index_q)
                    + lin_bytes(&ix.k, &pt.index_k)
                    + (ix.q_norm.len() + ix.k_norm.len()) * f;
            }
            if let Some(ik) = &lc.index_k {
                b += visible * ik.bytes_per(ik.width);
            }
            let sel = taps.i32(&format!("topk_blocks.{l}")).unwrap_or(&[]);
            for &blk in sel.iter().filter(|&&x| x >= 0) {
                let lo = blk as usize * c.index_block_size;
                let n = (lo + c.index_block_size).min(visible).saturating_sub(lo);
                b += 2 * n * per_pos;
            }
        } else {
            b += 2 * visible * per_pos * c.num_key_value_heads;
        }
        match &lw.ffn {
            FfnWeights::Dense(d) => {
                b += lin_bytes(&d.gate, &pt.gate)
                    + lin_bytes(&d.up, &pt.up)
                    + lin_bytes(&d.down, &pt.down)
            }
            FfnWeights::Moe(moe) => {
                b += wbytes(&moe.router) + moe.correction_bias.len() * f;
                let ids: BTreeSet<i32> = taps
                    .i32(&format!("experts.{l}"))
                    .unwrap_or(&[])
                    .iter()
                    .copied()
                    .collect();
                b += ids
                    .iter()
                    .map(|&e| mlp_bytes(&moe.experts[e as usize]))
                    .sum::<usize>();
                b += moe.shared.as_ref().map_or(0, mlp_bytes);
            }
        }
    }
    b
}

/// Streaming read and memcpy bandwidth (bytes/s) over a `mib` buffer, the
/// best of 3 each; the copy counts bytes read + written.
fn bandwidth_probe(mib: usize) -> (f64, f64) {
    use rayon::prelude::*;
    let n = (mib << 20) / 8;
    let src: Vec<u64> = (0..n as u64)
        .into_par_iter()
        .map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15))
        .collect();
    let mut dst = vec![0u64; n];
    let mut read_bw = 0.0f64;
    let mut copy_bw = 0.0f64;
    for _ in 0..3 {
        let t = Instant::now();
        let s: u64 = src
            .par_chunks(1 << 16)
            .map(|c| c.iter().fold(0u64, |a, &b| a ^ b))
            .reduce(|| 0, |a, b| a ^ b);
        std::hint::black_box(s);
        read_bw = read_bw.max((n * 8) as f64 / t.elapsed().as_secs_f64());
        let t = Instant::now();
        dst.par_chunks_mut(1 << 16)
            .zip(src.par_chunks(1 << 16))
            .for_each(|(d, s)| d.copy_from_slice(s));
        std::hint::black_box(&dst);
        copy_bw = copy_bw.max((2 * n * 8) as f64 / t.elapsed().as_secs_f64());
    }
    (read_bw, copy_bw)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        0.0
    } else {
        v[v.len() / 2]
    }
}

pub fn run(args: Args) -> Result<()> {
    let oq = args::online_quant(args.online_quant, args.online_quant_exclude.as_deref());
    if args.backend == "gpu" || args.backend == "cuda" {
        if let Some(oq) = oq {
            // the device-generated model has no tensor names to match
            if oq.patterns().next().is_some() {
                bail!(
                    "--online-quant-exclude: the GPU bench generates its model on the device \
                     (no tensor names), so it converts the default targets only; drop the \
                     exclusions or use --backend cpu"
                );
            }
        }
        return gpu::run(&args);
    }
    if args.backend != "cpu" {
        bail!("--backend `{}` is not one of cpu, gpu", args.backend);
    }
    if args.path != BenchPath::Standard {
        bail!("--path {:?}: the mono path is the GPU's (--backend gpu); the CPU reference has one path", args.path);
    }
    let be = args::open_backend(
        args::BackendArg::Cpu,
        false,
        false,
        args::DecodePathArg::Standard,
    )?;
    let mut cfg = ModelConfig::preset(&args.preset).map_err(|e| anyhow!("--preset: {e}"))?;
    if let Some(l) = args.layers {
        cfg = cfg.with_layers(l).map_err(|e| anyhow!("--layers: {e}"))?;
    }
    let dtype: m3_core::kv::CacheDtype = match args.kv_dtype.as_slice() {
        [one] => (*one).into(),
        _ => bail!("--kv-cache-dtype: the CPU bench takes one dtype (a list is the GPU bench's)"),
    };
    let opts = RunOptions {
        act: args.act.into(),
        tensor_parallel: 1,
    };
    let formats = Formats {
        experts: fmt(&args.experts)?,
        dense: fmt(&args.dense)?,
    };
    if args.prompt_len == 0 {
        bail!("--prompt-len must be at least 1");
    }
    let threads = args.threads;
    let be = &*be;
    args::with_threads(threads, move || -> Result<()> {
        let t0 = Instant::now();
        let mut model =
            synthetic::model(&cfg, formats, 0).map_err(|e| anyhow!("generating weights: {e}"))?;
        eprintln!("weights generated in {:.1} s", t0.elapsed().as_secs_f64());
        if let Some(oq) = &oq {
            let t = Instant::now();
            let n = online::apply(&mut model, TensorNames::new(true), oq)
                .map_err(|e| anyhow!("--online-quant {}: {e}", oq.scheme.name()))?;
            eprintln!(
                "online quantization {}: {n} linears converted in {:.1} s",
                oq.scheme.name(),
                t.elapsed().as_secs_f64()
            );
        }
        let total = args.prompt_len + args.decode_steps + 1;
        let page = cfg.index_block_size.max(1);
        let layout = KvLayout {
            page_size: page,
            num_pages: total.div_ceil(page),
            dtype,
        };
        let mut cache = KvCache::new(&model, layout).map_err(|e| anyhow!("--kv-dtype: {e}"))?;
        let table: Vec<u32> = (0..layout.num_pages as u32).collect();
        let prompt: Vec<u32> = (0..args.prompt_len as u32)
            .map(|i| (i * 7919 + 13) % cfg.vocab_size as u32)
            .collect();
        let step = StepBatch::contiguous(0, &prompt, 0, &table, page, false);
        let t = Instant::now();
        // the reference's step, op by op: the CPU bench times cpu-ref itself
        let logits = forward_by_ops(
            be,
            &model,
            &mut cache,
            &step,
            Path::Standard,
            &opts,
            &mut Taps::none(),
        )
        .map_err(|e| anyhow!("prefill: {e}"))?;
        let prefill_s = t.elapsed().as_secs_f64();
        let mut tok = m3_core::sample::greedy(&logits);
        let (mut times, mut bytes) = (Vec::new(), Vec::new());
        for i in 0..args.decode_steps {
            let p = args.prompt_len + i;
            let step = StepBatch::contiguous(0, &[tok], p as u32, &table, page, true);
            let mut taps = Taps::new(TapRequest {
                topk_blocks: true,
                experts: true,
                ..TapRequest::NONE
            });
            let t = Instant::now();
            let logits = forward_by_ops(
                be,
                &model,
                &mut cache,
                &step,
                Path::Standard,
                &opts,
                &mut taps,
            )
            .map_err(|e| anyhow!("decode step {i}: {e}"))?;
            times.push(t.elapsed().as_secs_f64());
            bytes.push(step_bytes(&model, &cache, p, &taps) as f64);
            tok = m3_core::sample::greedy(&logits);
        }
        let step_s = median(&mut times.clone());
        let step_b = median(&mut bytes);
        let (read_bw, copy_bw) = bandwidth_probe(args.probe_mib);
        let ceiling = read_bw.max(copy_bw);
        let achieved = if step_s > 0.0 { step_b / step_s } else { 0.0 };
        println!(
            "bench backend {} preset {} (layers {}, experts {:?}, dense {:?}, online quant {}, kv {:?}, act {:?}, threads {})",
            be.name(),
            args.preset,
            cfg.num_hidden_layers,
            formats.experts,
            formats.dense,
            oq.map_or("none", |q| q.scheme.name()),
            dtype,
            opts.act,
            rayon::current_num_threads()
        );
        println!(
            "prefill: {} tokens in {:.3} s = {:.1} tok/s",
            args.prompt_len,
            prefill_s,
            args.prompt_len as f64 / prefill_s
        );
        println!(
            "decode (batch 1, context {}..{}): median {:.2} ms/step = {:.1} tok/s over {} steps",
            args.prompt_len,
            args.prompt_len + args.decode_steps,
            step_s * 1e3,
            if step_s > 0.0 { 1.0 / step_s } else { 0.0 },
            times.len()
        );
        println!(
            "bytes/step: {:.2} MB (weights touched + KV/index read) -> {:.2} GB/s achieved",
            step_b / 1e6,
            achieved / 1e9
        );
        println!(
            "memory probe ({} MiB): streaming read {:.2} GB/s, memcpy {:.2} GB/s (read+write); ceiling {:.2} GB/s",
            args.probe_mib,
            read_bw / 1e9,
            copy_bw / 1e9,
            ceiling / 1e9
        );
        println!(
            "decode bytes/time vs ceiling: {:.1}%",
            100.0 * achieved / ceiling.max(1.0)
        );
        Ok(())
    })?
}

/// `m3 bench --shared-expert`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum SharedArg {
    Dense,
    Expert,
    Folded,
}

#[cfg(test)]
mod env_help_tests {
    use m3_gpu::standard::{Beside, PathOptions};

    /// The defaults `m3 bench --help` states are the path's own: a changed
    /// default fails here until the help says it.
    #[test]
    fn the_stated_defaults_are_the_path_options() {
        let d = PathOptions::default();
        let line = |var: &str| {
            super::ENV_HELP
                .lines()
                .find(|l| l.trim_start().starts_with(var))
                .unwrap_or_else(|| panic!("{var} missing from ENV_HELP"))
                .to_string()
        };
        assert!(line("M3_ROUTED_PDL_MAX_ROWS").ends_with(&format!("({})", d.routed_pdl_max_rows)));
        assert!(line("M3_ROUTE_CHUNK").ends_with(&format!("({})", u8::from(d.route_chunk))));
        assert!(line("M3_O_FULL_EDGE").ends_with(&format!("({})", u8::from(d.o_full_edge))));
        assert!(line("M3_INDEX_PREWAIT").ends_with(&format!("({})", u8::from(d.index_prewait))));
        assert!(line("M3_INDEX_GRID_X").ends_with(&format!("({})", d.index_grid_x)));
        assert!(line("M3_L2_PREFETCH_MIB").ends_with(&format!("({})", d.l2_prefetch_mib)));
        assert!(
            line("M3_FUSE_CACHE_WRITES").ends_with(&format!("({})", u8::from(d.fuse_cache_writes)))
        );
        let beside = if d.beside == Beside::On {
            "(on)"
        } else {
            "(off)"
        };
        assert!(line("M3_BESIDE").ends_with(beside));
    }
}
