//! Command-line pieces shared by every command that loads a model
//! (`generate`, `batch`, `forward`, `parity`): the model and engine flags,
//! parsed once by clap into typed values, the default synthetic checkpoint,
//! the backend choice and the one place a model gets loaded.
//!
//! Flag names follow vLLM's where a concept matches (`--kv-cache-dtype`,
//! `--max-model-len`, `--max-num-seqs`, `--max-num-batched-tokens`,
//! `--gpu-memory-utilization` are accepted as aliases).

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{anyhow, bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use m3_core::backend::{ActMode, Backend, BoxedRunner, KvBudget, LoadSpec, ModelSource};
use m3_core::checkpoint::online::OnlineQuant;
use m3_core::checkpoint::{Checkpoint, LoadOptions};
use m3_core::config::{IndexSelection, ModelConfig};
use m3_core::formats::ScaleRule;
use m3_core::kv::CacheDtype;
use m3_core::sched::runner::VerifyMode;
use m3_core::synth::{write_checkpoint, DenseFormat, ExpertFormat, SynthSpec};

/// `--backend`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendArg {
    /// The GPU when one opens, else the CPU reference.
    Auto,
    /// The CPU reference.
    Cpu,
    /// The GPU (an error, saying why, when none is usable).
    /// `M3_GPU_RUNTIME=cuda|hip` picks a vendor; `M3_GPU_RUNTIME=sim` (the
    /// HIP route) or `sim-cuda` (CUDA's code paths) runs the GPU engine on
    /// this machine's CPU, its kernels built by the host C++ compiler: slow,
    /// for checking the route where no such GPU is.
    #[value(alias = "cuda")]
    Gpu,
    /// The GPU's op-parity harness: host weights and cache, every op one
    /// kernel from host slices (slow; for finding which op differs).
    #[value(name = "gpu-ops", hide = true)]
    GpuOps,
}

/// The GPU op harness as a backend whose loaded model is a `HostRunner`
/// over its `run_op` (the op path, end to end).
struct OpsHarness(m3_gpu::GpuBackend);

impl Backend for OpsHarness {
    fn name(&self) -> &str {
        "gpu-ops"
    }
    fn run_op(&self, op: m3_core::backend::Op<'_>) -> Result<(), m3_core::backend::BackendError> {
        self.0.run_op(op)
    }
}

/// `--kv-dtype` / `--kv-cache-dtype`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum KvDtypeArg {
    /// bf16 (exact for MODEL.md's bf16-rounded K / V).
    Bf16,
    /// FP8 E4M3 with the checkpoint's per-tensor scales.
    #[value(name = "fp8_e4m3", alias = "fp8", alias = "e4m3")]
    Fp8E4m3,
    /// NVFP4: E2M1 values, an E4M3 scale per 16, the per-tensor scale as
    /// global (ARCHITECTURE.md, NVFP4 KV cache); every backend.
    Nvfp4,
}

impl From<KvDtypeArg> for CacheDtype {
    fn from(k: KvDtypeArg) -> Self {
        match k {
            KvDtypeArg::Bf16 => CacheDtype::Bf16,
            KvDtypeArg::Fp8E4m3 => CacheDtype::Fp8E4M3,
            KvDtypeArg::Nvfp4 => CacheDtype::Nvfp4,
        }
    }
}

/// `--act`: the routed experts' activation mode (MODEL.md 5).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ActArg {
    /// w4a16 (the decode default).
    Bf16,
    /// w4a4: expert GEMM inputs MXFP4-quantized (`even` rule).
    Mxfp4,
}

impl From<ActArg> for ActMode {
    fn from(a: ActArg) -> Self {
        match a {
            ActArg::Bf16 => ActMode::Bf16,
            ActArg::Mxfp4 => ActMode::Mxfp4,
        }
    }
}

/// `--selection`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum SelectionArg {
    #[value(name = "per_kv_head")]
    PerKvHead,
    Shared,
}

impl From<SelectionArg> for IndexSelection {
    fn from(s: SelectionArg) -> Self {
        match s {
            SelectionArg::PerKvHead => IndexSelection::PerKvHead,
            SelectionArg::Shared => IndexSelection::Shared,
        }
    }
}

/// `--scale-rule`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ScaleRuleArg {
    Even,
    Floor,
    Rceil,
}

impl From<ScaleRuleArg> for ScaleRule {
    fn from(r: ScaleRuleArg) -> Self {
        match r {
            ScaleRuleArg::Even => ScaleRule::Even,
            ScaleRuleArg::Floor => ScaleRule::Floor,
            ScaleRuleArg::Rceil => ScaleRule::Rceil,
        }
    }
}

/// Which checkpoint, and how its weights are read.
#[derive(clap::Args, Clone, Debug)]
pub struct ModelArgs {
    /// Checkpoint directory (default: a synthetic `tiny` checkpoint, MXFP4
    /// experts and MXFP8 elsewhere, made once in `$XDG_CACHE_HOME/m3` or
    /// `~/.cache/m3`).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Convert NVFP4 routed experts to MXFP4 at load (lossy; FORMATS.md
    /// Conversions), with the rule of `--scale-rule`.
    #[arg(long)]
    pub nvfp4_to_mxfp4: bool,
    /// MX scale rule of `--nvfp4-to-mxfp4`.
    #[arg(long, value_enum, default_value = "even")]
    pub scale_rule: ScaleRuleArg,
    /// Convert every MXFP8 weight to bf16 at load, losslessly (FORMATS.md
    /// MXFP8 -> BF16: each value is already on the bf16 grid): a block
    /// whose scale byte is NaN or outside the exact range is refused,
    /// naming the tensor, row and block. Twice the weight bytes; the same
    /// values, so the same outputs as the MXFP8 weights.
    #[arg(long)]
    pub mxfp8_to_bf16: bool,
    /// Block selection, overriding the config's `index_selection`.
    #[arg(long, value_enum)]
    pub selection: Option<SelectionArg>,
    /// Online quantization at load (ARCHITECTURE.md, Online quantization):
    /// `ptpc_fp8` converts the attention linears (q/k/v/o, the indexer's
    /// q/k) and the dense-MLP linears to per-channel FP8 E4M3 weights, run
    /// with per-token FP8 activations; LM head, embeddings, router, routed
    /// and shared experts are never converted. The CPU backend and the GPU
    /// runner (`--backend gpu`) run it.
    #[arg(long, value_enum)]
    pub online_quant: Option<OnlineQuantArg>,
    /// Comma-separated tensor-name substrings whose linears online
    /// quantization leaves as stored (e.g. `o_proj,layers.0.`); a pattern
    /// that matches no converted linear is an error.
    #[arg(long, requires = "online_quant", value_name = "PATTERN,...")]
    pub online_quant_exclude: Option<String>,
}

/// `--online-quant` with its `--online-quant-exclude` patterns as the
/// loader's request. The patterns become the `&'static str` that
/// `LoadOptions` (which is `Copy`) holds: leaked once per call, a few bytes.
pub fn online_quant(q: Option<OnlineQuantArg>, exclude: Option<&str>) -> Option<OnlineQuant> {
    let exclude: &'static str = match exclude {
        Some(p) if !p.is_empty() => Box::leak(p.to_string().into_boxed_str()),
        _ => "",
    };
    q.map(|q| match q {
        OnlineQuantArg::PtpcFp8 => OnlineQuant::ptpc_fp8(exclude),
    })
}

/// `--online-quant`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum OnlineQuantArg {
    /// Per-token-per-channel FP8 E4M3.
    #[value(name = "ptpc_fp8")]
    PtpcFp8,
}

impl ModelArgs {
    /// The checkpoint directory (the default one made on first use).
    pub fn dir(&self) -> Result<PathBuf> {
        match &self.model {
            Some(d) => Ok(d.clone()),
            None => default_model(),
        }
    }

    /// Loader options.
    pub fn load_options(&self) -> LoadOptions {
        LoadOptions {
            nvfp4_experts_to_mxfp4: self.nvfp4_to_mxfp4.then(|| self.scale_rule.into()),
            mxfp8_to_bf16_exact: self.mxfp8_to_bf16,
            online_quant: online_quant(self.online_quant, self.online_quant_exclude.as_deref()),
        }
    }

    /// Open (and header-validate) the checkpoint.
    pub fn open(&self) -> Result<Checkpoint> {
        let dir = self.dir()?;
        if !dir.is_dir() {
            bail!("model directory {} does not exist", dir.display());
        }
        Checkpoint::open(&dir).with_context(|| format!("opening checkpoint {}", dir.display()))
    }
}

/// Which backend, and how big the loaded model's state is.
#[derive(clap::Args, Clone, Debug)]
pub struct EngineArgs {
    /// Backend: auto (a GPU when one is usable, else the CPU reference),
    /// cpu or gpu.
    #[arg(long, value_enum, default_value = "auto")]
    pub backend: BackendArg,
    /// KV and index cache dtype: bf16, fp8_e4m3 (per-tensor scales), or
    /// nvfp4 (E2M1 + an E4M3 scale per 16 values, the per-tensor scale as
    /// the global; every backend).
    #[arg(
        long,
        value_enum,
        default_value = "bf16",
        visible_alias = "kv-cache-dtype"
    )]
    pub kv_dtype: KvDtypeArg,
    /// Routed-expert activation mode.
    #[arg(long, value_enum, default_value = "bf16")]
    pub act: ActArg,
    /// KV / index-cache blocks (default: on a GPU, what
    /// --gpu-memory-utilization leaves after the weights; on the CPU,
    /// enough for the command's requests).
    #[arg(long)]
    pub kv_blocks: Option<usize>,
    /// Fraction of the GPU's memory this process may hold (weights, step
    /// buffers and the KV cache), when --kv-blocks is not given.
    #[arg(long, default_value_t = 0.9)]
    pub gpu_memory_utilization: f32,
    /// Positions per KV block.
    #[arg(long, default_value_t = 16)]
    pub block_size: usize,
    /// Longest sequence, prompt plus output, in positions.
    #[arg(long, default_value_t = 4096, visible_alias = "max-model-len")]
    pub max_context: usize,
    /// Most rows (tokens) per step: decode rows plus prefill chunks.
    #[arg(long, default_value_t = 256, visible_alias = "max-num-batched-tokens")]
    pub max_batch_tokens: usize,
    /// Most sequences per step.
    #[arg(long, default_value_t = 64, visible_alias = "max-num-seqs")]
    pub max_seqs: usize,
    /// Threads for the CPU backend (0 = all cores; results do not depend
    /// on it).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// GPU: run every step with direct kernel launches, never a captured
    /// CUDA graph (slower; for debugging, vLLM's flag).
    #[arg(long)]
    pub enforce_eager: bool,
    /// GPUs to shard the model over (vLLM's flag). The GPU takes only 1
    /// until multi-GPU exists; `--backend cpu` computes every step as if
    /// sharded N ways (row-parallel partial sums and the expert-parallel
    /// combine all-reduced in rank order: the proof of the sharded math).
    #[arg(long, default_value_t = 1)]
    pub tensor_parallel_size: usize,
    /// GPU: run each MoE layer's shared expert inside the routed experts'
    /// grouped launches, as one more expert every row takes (vLLM's shared
    /// expert fusion on MI350). Same arithmetic as without (its output is
    /// added after the routed sum, unscaled, as MODEL.md adds it); needs the
    /// shared expert in the routed experts' format and width, and bf16
    /// expert inputs (not --act mxfp4). No effect on the CPU reference.
    #[arg(long)]
    pub fold_shared_expert: bool,
    /// GPU: the path of pure decode steps (decode and verify rows only, at
    /// most 64 rows): `mono` loads the mono kernel (each layer one
    /// persistent launch running the standard kernels' bodies, giving the
    /// standard path's bits: measured over 256 greedy steps at 1, 4, 16,
    /// 32 and 64 rows on the bench model, `m3.1 --layers 12`,
    /// bench/NOTES.md session 29) and runs
    /// every such step on it; `auto` loads it too, times both paths at
    /// load on steps of 1-64 rows (a few seconds), and runs mono up to
    /// where it stops being faster (it says what it measured; where the
    /// mono kernel cannot load, or the timing
    /// returns an error, the standard path, with a warning; a fault on the
    /// device still ends the command); `standard` runs every step on the
    /// standard path. The mono kernel's grid must be resident all at once:
    /// on a GPU shared through MPS with a partition smaller than the
    /// device, use `standard`. `m3 forward` (one prefill) always runs
    /// `standard`.
    #[arg(long, value_enum, default_value = "auto")]
    pub path: DecodePathArg,
}

/// `--path` of the engine commands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum DecodePathArg {
    Auto,
    Standard,
    Mono,
}

impl EngineArgs {
    /// Open `--backend` (with `--enforce-eager`), after refusing what this
    /// build cannot do (`--tensor-parallel-size` above 1).
    pub fn open_backend(&self) -> Result<Box<dyn Backend + Sync>> {
        match (self.tensor_parallel_size, self.backend) {
            (0, _) => bail!("--tensor-parallel-size must be at least 1"),
            (1, _) => {}
            // the CPU computes the sharded step's math (the proof of it)
            (n, BackendArg::Cpu) => {
                if self.path == DecodePathArg::Mono {
                    bail!("--path mono: the mono kernel is the GPU's (--backend gpu)");
                }
                if self.act == ActArg::Mxfp4 {
                    bail!("--tensor-parallel-size {n} with --act mxfp4: the sharded math is modelled with bf16 expert inputs only");
                }
                return Ok(Box::new(m3_core::backend::TensorParallel {
                    inner: m3_cpu_ref::CpuBackend::new(),
                    ranks: n,
                }));
            }
            (n, _) => bail!(
                "--tensor-parallel-size {n}: m3 runs a model on one device for now (multi-GPU sharding is not implemented); use 1, or --backend cpu to compute the sharded step's math on the CPU"
            ),
        }
        open_backend(
            self.backend,
            self.enforce_eager,
            self.fold_shared_expert,
            self.path,
        )
    }

    /// The load spec; `host_blocks` is the CPU's block count when
    /// `--kv-blocks` is not given.
    pub fn load_spec(&self, on_gpu: bool, host_blocks: usize, model: &ModelArgs) -> LoadSpec {
        let kv = match (self.kv_blocks, on_gpu) {
            (Some(n), _) => KvBudget::Blocks(n),
            (None, true) => KvBudget::MemoryFraction(self.gpu_memory_utilization),
            (None, false) => KvBudget::Blocks(host_blocks.max(1)),
        };
        LoadSpec {
            cache_dtype: self.kv_dtype.into(),
            block_size: self.block_size,
            kv,
            max_rows: self.max_batch_tokens,
            max_seqs: self.max_seqs,
            max_context: self.max_context,
            act: self.act.into(),
            selection: model.selection.map(Into::into),
        }
    }
}

/// `--verify`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum VerifyArg {
    Greedy,
    Rejection,
    Block,
}

impl From<VerifyArg> for VerifyMode {
    fn from(v: VerifyArg) -> Self {
        match v {
            VerifyArg::Greedy => VerifyMode::Greedy,
            VerifyArg::Rejection => VerifyMode::Rejection,
            VerifyArg::Block => VerifyMode::Block,
        }
    }
}

/// `--draft`: where speculative drafts come from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum DraftArg {
    /// The checkpoint's DSpark draft (`dspark/`) if it has one, else its
    /// EAGLE3 draft (`eagle3/`), else prompt lookup.
    #[default]
    Auto,
    /// The DSpark draft (`dspark/`); an error without one.
    Dspark,
    /// The EAGLE3 draft head (`eagle3/`); an error without one.
    Eagle3,
    /// Prompt lookup (n-gram matching over the request's own tokens).
    Ngram,
}

/// Scheduler options shared by every command that runs the scheduler
/// (`generate`, `batch`, `serve`): speculative decoding and the prefix
/// cache, with vLLM's names as aliases.
#[derive(clap::Args, Clone, Debug)]
pub struct SchedArgs {
    /// Draft tokens verified per decode step (0 = no speculation; at most
    /// 7). Drafts come from `--draft`; the run says which.
    #[arg(
        long,
        default_value_t = 0,
        visible_alias = "speculative-tokens",
        alias = "num-speculative-tokens"
    )]
    pub spec_tokens: usize,
    /// Drafter for --spec-tokens: auto (dspark/, else eagle3/, else prompt
    /// lookup), dspark, eagle3 (the checkpoint's EAGLE3 draft head under
    /// eagle3/, op by op on the backend) or ngram.
    #[arg(long, value_enum, default_value = "auto")]
    pub draft: DraftArg,
    /// Verifier for speculative steps (greedy requests always verify
    /// greedily).
    #[arg(long, value_enum, default_value = "greedy")]
    pub verify: VerifyArg,
    /// Disable the prefix cache.
    #[arg(
        long = "no-enable-prefix-caching",
        visible_alias = "no-prefix-cache",
        overrides_with = "enable_prefix_caching"
    )]
    pub no_prefix_cache: bool,
    /// Enable the prefix cache (the default).
    #[arg(long, overrides_with = "no_prefix_cache")]
    pub enable_prefix_caching: bool,
}

impl SchedArgs {
    /// Refuse a speculation depth the verifier does not support.
    pub fn check(&self) -> Result<()> {
        if self.spec_tokens > 7 {
            bail!("--spec-tokens {} is above 7 (MODEL.md 6)", self.spec_tokens);
        }
        Ok(())
    }

    /// Whether the prefix cache is on (the last of the two flags wins).
    pub fn prefix_cache(&self) -> bool {
        !self.no_prefix_cache
    }
}

/// Open the backend `--backend` names. `auto` says on stderr what it chose
/// and why. `eager`: a GPU runs every step with direct launches (no CUDA
/// graphs; `--enforce-eager`); `fold`: a GPU loads shared experts into the
/// expert tables (`--fold-shared-expert`).
/// `path`: the GPU loads its mono kernel for `--path mono` (every decode
/// step up to 64 rows) and `--path auto` (up to the crossover it measures
/// at load); the other backends refuse `mono` and run `auto` as their one
/// path.
pub fn open_backend(
    choice: BackendArg,
    eager: bool,
    fold: bool,
    path: DecodePathArg,
) -> Result<Box<dyn Backend + Sync>> {
    let mono = path == DecodePathArg::Mono;
    let cpu = || -> Box<dyn Backend + Sync> { Box::new(m3_cpu_ref::CpuBackend::new()) };
    let gpu = |mut g: m3_gpu::GpuBackend| -> Box<dyn Backend + Sync> {
        g.path_options = g.path_options.with_env_overrides();
        if eager {
            g.path_options.graph_max_rows = 0;
        }
        g.path_options.fold_shared_expert = fold;
        g.path_options.mono = path != DecodePathArg::Standard;
        g.path_options.mono_rows = match path {
            DecodePathArg::Auto => m3_gpu::standard::MonoRows::Measured,
            _ => m3_gpu::standard::MonoRows::UpTo(m3_gpu::standard::MONO_MAX_ROWS),
        };
        Box::new(g)
    };
    const MONO_CPU: &str =
        "--path mono: the mono kernel is the GPU's (--backend gpu); the CPU reference runs every step one way";
    match choice {
        BackendArg::Cpu if mono => bail!("{MONO_CPU}"),
        BackendArg::GpuOps if mono => bail!("--path mono: the op-by-op harness (--backend gpu-ops) has no mono path; use --backend gpu"),
        BackendArg::Cpu => Ok(cpu()),
        BackendArg::GpuOps => match m3_gpu::GpuBackend::open() {
            Ok(g) if g.runtime() == m3_gpu::Runtime::Hip => bail!(
                "--backend gpu-ops: the op-by-op harness is CUDA only and this GPU is {}; \
                 use --backend gpu",
                g.describe()
            ),
            Ok(g) => Ok(Box::new(OpsHarness(g))),
            Err(e) => bail!("--backend gpu-ops: no usable GPU: {e}"),
        },
        BackendArg::Gpu => match m3_gpu::GpuBackend::open() {
            Ok(g) => {
                // CUDA runs as it always has, quietly; the HIP route is
                // new and unproven on hardware, so say that it was taken.
                if g.runtime() == m3_gpu::Runtime::Hip {
                    eprintln!("info: --backend gpu: using {}", g.describe());
                }
                Ok(gpu(g))
            }
            Err(e) => bail!("--backend gpu: no usable GPU: {e}"),
        },
        BackendArg::Auto => match m3_gpu::GpuBackend::open() {
            Ok(g) => {
                eprintln!("info: --backend auto: using gpu ({})", g.describe());
                Ok(gpu(g))
            }
            Err(e) if mono => bail!("{MONO_CPU} (--backend auto found no usable GPU: {e})"),
            Err(e) => {
                eprintln!("info: --backend auto: using cpu (no usable GPU: {e})");
                Ok(cpu())
            }
        },
    }
}

/// Whether `be` is the GPU backend (its loaded models live on the device).
pub fn is_gpu(be: &dyn Backend) -> bool {
    be.name() == "gpu"
}

/// Refuse online quantization where it does not run: the CPU reference
/// and the GPU runner have PTPC FP8 linears, the op-by-op GPU harness
/// (`gpu-ops`) does not.
pub fn online_quant_backend(backend: &str, opts: &LoadOptions) -> Result<()> {
    if let Some(oq) = opts.online_quant {
        if backend != "cpu" && backend != "gpu" {
            bail!(
                "--online-quant {}: PTPC FP8 runs on the CPU backend and the GPU runner, not \
                 on the op-by-op harness; use --backend cpu or gpu (backend here: {backend})",
                oq.scheme.name()
            );
        }
    }
    Ok(())
}

/// Load `ck` on `be` for `spec`, with a progress bar over its tensors and
/// one line on stderr: load time, device memory, and the host's peak RSS.
pub fn load_runner<'b>(
    be: &'b dyn Backend,
    ck: &Checkpoint,
    opts: LoadOptions,
    spec: &LoadSpec,
) -> Result<BoxedRunner<'b>> {
    online_quant_backend(be.name(), &opts)?;
    let t0 = Instant::now();
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template("loading {bar:40} {pos}/{len} tensors {msg} {elapsed}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let mut progress = |p: m3_core::backend::LoadProgress| {
        bar.set_length(p.tensors_total as u64);
        bar.set_position(p.tensors_done as u64);
        bar.set_message(format!("{:.2} GB", p.bytes_done as f64 / 1e9));
    };
    let runner = be
        .load(ModelSource::Checkpoint(ck, opts), spec, &mut progress)
        .map_err(|e| anyhow!("loading {} on {}: {e}", ck.dir().display(), be.name()))?;
    bar.finish_and_clear();
    let layout = runner.kv_layout();
    eprintln!(
        "loaded {} on {} in {:.2} s: {} KV blocks of {} positions ({:?}){}{}",
        ck.dir().display(),
        runner.backend_name(),
        t0.elapsed().as_secs_f64(),
        layout.num_pages,
        layout.page_size,
        layout.dtype,
        match runner.device_bytes() {
            0 => String::new(),
            b => format!(", {:.2} GiB on the device", b as f64 / (1u64 << 30) as f64),
        },
        peak_rss().map_or(String::new(), |kb| format!(
            ", host peak RSS {:.1} MiB",
            kb as f64 / 1024.0
        )),
    );
    Ok(runner)
}

/// The process's peak resident set (kB), where the OS tells it (Linux).
pub fn peak_rss() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// Run `f` on a rayon pool of `threads` threads (0 = default).
pub fn with_threads<T: Send>(threads: usize, f: impl FnOnce() -> T + Send) -> Result<T> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .context("building the thread pool")?;
    Ok(pool.install(f))
}

/// `$XDG_CACHE_HOME/m3`, else `$HOME/.cache/m3`.
fn cache_dir() -> Result<PathBuf> {
    if let Some(x) = std::env::var_os("XDG_CACHE_HOME").filter(|v| !v.is_empty()) {
        return Ok(PathBuf::from(x).join("m3"));
    }
    let home = std::env::var_os("HOME")
        .ok_or_else(|| anyhow!("neither XDG_CACHE_HOME nor HOME is set; pass --model"))?;
    Ok(PathBuf::from(home).join(".cache").join("m3"))
}

/// The default synthetic checkpoint, made on first use (staged and renamed
/// into place by the writer, so a half-written one never looks complete).
pub fn default_model() -> Result<PathBuf> {
    // v2: adds tokenizer_config.json (chat template) and
    // generation_config.json; the weights and tokenizer are v1's.
    let dir = cache_dir()?.join("synthetic-tiny-mxfp4-v2");
    if dir.join("config.json").is_file() {
        return Ok(dir);
    }
    std::fs::create_dir_all(dir.parent().unwrap_or(&dir))
        .with_context(|| format!("creating {}", dir.display()))?;
    let cfg = ModelConfig::preset("tiny").map_err(|e| anyhow!("preset tiny: {e}"))?;
    let mut spec = SynthSpec::new(cfg, ExpertFormat::Mxfp4, DenseFormat::Mxfp8);
    spec.draft = None;
    spec.chat_template = Some(m3_serve::MINIMAX_STYLE_TEMPLATE.to_string());
    eprintln!(
        "making the synthetic tiny checkpoint in {} (once)",
        dir.display()
    );
    if let Err(e) = write_checkpoint(&spec, &dir) {
        // Another process may have won the race: use its complete copy.
        if !dir.join("config.json").is_file() {
            return Err(anyhow!(
                "writing the synthetic checkpoint {}: {e}",
                dir.display()
            ));
        }
    }
    Ok(dir)
}

/// Parse `1,2,3` (spaces allowed) into token ids below `vocab`.
pub fn parse_tokens(s: &str, vocab: usize) -> Result<Vec<u32>> {
    let toks = s
        .split([',', ' '])
        .filter(|p| !p.trim().is_empty())
        .map(|p| {
            p.trim()
                .parse::<u32>()
                .map_err(|_| anyhow!("--tokens: `{p}` is not a token id"))
        })
        .collect::<Result<Vec<u32>>>()?;
    if toks.is_empty() {
        bail!("--tokens: no token ids given");
    }
    if let Some(&t) = toks.iter().find(|&&t| t as usize >= vocab) {
        bail!("--tokens: token id {t} is out of range (vocab_size {vocab})");
    }
    Ok(toks)
}

/// The checkpoint's tokenizer, if it has a `tokenizer.json`.
pub fn tokenizer(dir: &Path) -> Result<Option<tokenizers::Tokenizer>> {
    let p = dir.join("tokenizer.json");
    if !p.is_file() {
        return Ok(None);
    }
    tokenizers::Tokenizer::from_file(&p)
        .map(Some)
        .map_err(|e| anyhow!("reading {}: {e}", p.display()))
}

/// End-of-text ids from the checkpoint's config.json (`eos_token_id`, top
/// level or under `text_config`; a number or a list).
pub fn eos_ids(ck: &Checkpoint) -> Vec<u32> {
    let cfg = ck.config_json();
    match cfg
        .get("text_config")
        .and_then(|t| t.get("eos_token_id"))
        .or(cfg.get("eos_token_id"))
    {
        Some(serde_json::Value::Number(n)) => n.as_u64().map(|v| v as u32).into_iter().collect(),
        Some(serde_json::Value::Array(a)) => a
            .iter()
            .filter_map(serde_json::Value::as_u64)
            .map(|v| v as u32)
            .collect(),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_and_auto_always_give_a_backend() {
        assert_eq!(
            open_backend(BackendArg::Cpu, false, false, DecodePathArg::Standard)
                .map(|b| b.name().to_string())
                .ok()
                .as_deref(),
            Some("cpu")
        );
        // auto: gpu where a device opens, else cpu; never an error
        let name = open_backend(BackendArg::Auto, false, false, DecodePathArg::Standard)
            .map(|b| b.name().to_string());
        assert!(matches!(name.as_deref(), Ok("cpu") | Ok("gpu")));
    }

    #[test]
    fn gpu_without_a_device_is_a_clear_error() {
        if m3_gpu::GpuBackend::open().is_ok() {
            return; // a device is present: nothing to check here
        }
        let e = open_backend(BackendArg::Gpu, false, false, DecodePathArg::Standard)
            .err()
            .map(|e| e.to_string());
        assert!(e.is_some_and(|m| m.starts_with("--backend gpu: no usable GPU")));
    }

    /// `--path mono` where no mono kernel can run is a one-line error
    /// (the CPU reference; the op harness), before anything loads.
    #[test]
    fn mono_path_is_refused_off_the_gpu_runner() {
        let e = open_backend(BackendArg::Cpu, false, false, DecodePathArg::Mono)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            e.contains("--path mono") && e.contains("--backend gpu"),
            "{e}"
        );
        assert!(open_backend(BackendArg::Cpu, false, false, DecodePathArg::Standard).is_ok());
        if m3_gpu::GpuBackend::open().is_err() {
            let e = open_backend(BackendArg::Auto, false, false, DecodePathArg::Mono)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(e.contains("--path mono"), "{e}");
        }
    }

    #[test]
    fn online_quant_is_refused_on_the_op_harness() {
        let on = LoadOptions {
            online_quant: Some(OnlineQuant::ptpc_fp8("")),
            ..LoadOptions::default()
        };
        assert!(online_quant_backend("cpu", &on).is_ok());
        assert!(online_quant_backend("gpu", &on).is_ok());
        assert!(online_quant_backend("gpu-ops", &LoadOptions::default()).is_ok());
        let e = online_quant_backend("gpu-ops", &on)
            .unwrap_err()
            .to_string();
        assert!(e.contains("not on the op-by-op harness"), "{e}");
        assert!(e.contains("gpu-ops"), "{e}");
    }

    #[test]
    fn nvfp4_cache_reaches_every_backend() {
        // issue 17's GPU half: no refusal before a device is looked for
        // (this machine may have none: any error must not be about the
        // cache dtype)
        use clap::Parser;
        #[derive(Parser)]
        struct T {
            #[command(flatten)]
            e: EngineArgs,
        }
        for be in ["gpu", "gpu-ops", "cpu", "auto"] {
            let t = T::try_parse_from(["t", "--backend", be, "--kv-cache-dtype", "nvfp4"]).unwrap();
            assert_eq!(t.e.kv_dtype, KvDtypeArg::Nvfp4);
            if let Err(e) = t.e.open_backend() {
                assert!(!e.to_string().contains("kv-cache-dtype"), "{be}: {e}");
            }
        }
    }

    #[test]
    fn online_quant_flags_reach_the_load_options() {
        #[derive(clap::Parser)]
        struct Cmd {
            #[command(flatten)]
            model: ModelArgs,
        }
        use clap::Parser;
        let m = Cmd::try_parse_from([
            "m3",
            "--online-quant",
            "ptpc_fp8",
            "--online-quant-exclude",
            "o_proj,layers.0.",
        ])
        .unwrap()
        .model;
        let oq = m.load_options().online_quant.unwrap();
        assert_eq!(oq, OnlineQuant::ptpc_fp8("o_proj,layers.0."));
        let off = Cmd::try_parse_from(["m3"]).unwrap().model;
        assert_eq!(off.load_options().online_quant, None);
        // the exclusions need the option
        assert!(Cmd::try_parse_from(["m3", "--online-quant-exclude", "o_proj"]).is_err());
        assert!(Cmd::try_parse_from(["m3", "--online-quant", "int8"]).is_err());
    }

    #[test]
    fn tokens_parse_and_bad_ones_are_named() {
        assert_eq!(parse_tokens("1, 2,3", 10).unwrap(), vec![1, 2, 3]);
        let e = parse_tokens("1,x", 10).unwrap_err().to_string();
        assert!(e.contains("`x`"), "{e}");
        let e = parse_tokens("1,10", 10).unwrap_err().to_string();
        assert!(e.contains("10") && e.contains("vocab_size"), "{e}");
        assert!(parse_tokens(" , ", 10).is_err());
    }

    /// vLLM's flag names parse into the same fields as the old spellings.
    #[test]
    fn vllm_flag_names() {
        use clap::Parser;
        #[derive(Parser)]
        struct T {
            #[command(flatten)]
            e: EngineArgs,
            #[command(flatten)]
            s: SchedArgs,
        }
        let t = T::try_parse_from([
            "t",
            "--max-model-len",
            "100",
            "--max-num-seqs",
            "3",
            "--max-num-batched-tokens",
            "5",
            "--kv-cache-dtype",
            "fp8_e4m3",
            "--gpu-memory-utilization",
            "0.5",
            "--speculative-tokens",
            "2",
            "--no-enable-prefix-caching",
            "--tensor-parallel-size",
            "2",
            "--backend",
            "cpu",
        ])
        .unwrap();
        assert_eq!(
            (t.e.max_context, t.e.max_seqs, t.e.max_batch_tokens),
            (100, 3, 5)
        );
        assert_eq!(t.e.kv_dtype, KvDtypeArg::Fp8E4m3);
        assert_eq!(t.s.spec_tokens, 2);
        assert!(!t.s.prefix_cache());
        // the CPU computes the 2-way sharded step; a GPU is refused
        let be = t.e.open_backend().expect("cpu, TP 2");
        assert_eq!(be.tensor_parallel(), 2);
        let mut a = t.e.clone();
        a.act = ActArg::Mxfp4;
        let err = a.open_backend().err().unwrap().to_string();
        assert!(err.contains("--act mxfp4"), "{err}");
        let mut g = t.e.clone();
        g.backend = BackendArg::Gpu;
        let err = g.open_backend().err().unwrap().to_string();
        assert!(err.contains("--tensor-parallel-size 2"), "{err}");
        // The old spellings still work, and the last prefix-cache flag wins.
        let t = T::try_parse_from([
            "t",
            "--max-context",
            "7",
            "--spec-tokens",
            "1",
            "--no-prefix-cache",
            "--enable-prefix-caching",
        ])
        .unwrap();
        assert_eq!(t.e.max_context, 7);
        assert_eq!(t.s.spec_tokens, 1);
        assert!(t.s.prefix_cache());
        assert!(t.e.open_backend().is_ok());
    }

    #[test]
    fn load_spec_budget_follows_the_flags() {
        let e = EngineArgs {
            backend: BackendArg::Cpu,
            kv_dtype: KvDtypeArg::Fp8E4m3,
            act: ActArg::Mxfp4,
            kv_blocks: None,
            gpu_memory_utilization: 0.5,
            block_size: 16,
            max_context: 100,
            max_batch_tokens: 8,
            max_seqs: 2,
            threads: 0,
            enforce_eager: false,
            tensor_parallel_size: 1,
            fold_shared_expert: false,
            path: DecodePathArg::Auto,
        };
        let m = ModelArgs {
            model: None,
            nvfp4_to_mxfp4: false,
            mxfp8_to_bf16: false,
            scale_rule: ScaleRuleArg::Even,
            selection: Some(SelectionArg::Shared),
            online_quant: None,
            online_quant_exclude: None,
        };
        let s = e.load_spec(true, 7, &m);
        assert_eq!(s.kv, KvBudget::MemoryFraction(0.5));
        assert_eq!(s.cache_dtype, CacheDtype::Fp8E4M3);
        assert_eq!(s.act, ActMode::Mxfp4);
        assert_eq!(s.selection, Some(IndexSelection::Shared));
        assert_eq!(e.load_spec(false, 7, &m).kv, KvBudget::Blocks(7));
        let e = EngineArgs {
            kv_blocks: Some(3),
            ..e
        };
        assert_eq!(e.load_spec(true, 7, &m).kv, KvBudget::Blocks(3));
    }
}
