//! `m3 forward`: one prefill on a backend, with per-layer taps dumped to
//! safetensors (the parity interface used by the golden suite).
//!
//! Dump layout (`--dump OUT.safetensors`, written to a temp name and renamed):
//! - `residual.{l}`: F32 `[T, H]`, the residual stream after layer `l`;
//! - `topk_blocks.{l}`: I32 `[kv_heads, T, index_topk_blocks]`, selected
//!   index blocks per KV head, ascending, -1 padded (sparse layers only;
//!   with `--selection shared` every KV head repeats the shared selection);
//! - `experts.{l}`: I32 `[T, num_experts_per_tok]`, chosen experts,
//!   ascending (MoE layers only);
//! - `logits`: F32 `[T, vocab]` (every row);
//! - with `--index-scores`: `index_scores.{l}` F32 `[index_heads, T, nb]`,
//!   `nb = (T - 1) / index_block_size + 1`, -inf where no key is visible.
//!
//! With `--teacher IN.safetensors`, layer `l > 0` takes its input residual
//! from the teacher's `residual.{l-1}` (its caches are filled from that
//! input too) and the logits come from the teacher's last `residual.{L-1}`;
//! each layer's own output is still dumped.

use std::collections::BTreeMap;
use std::path::{Path as FsPath, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use m3_core::backend::{ActMode, Backend, Path, RunOptions, StepBatch, TapData, TapRequest, Taps};
use m3_core::checkpoint::{Checkpoint, LoadOptions};
use m3_core::config::IndexSelection;
use m3_core::formats::ScaleRule;
use m3_core::kv::{CacheDtype, KvCache, KvLayout};
use m3_core::weights::ModelWeights;
use safetensors::tensor::TensorView;
use safetensors::Dtype;

#[derive(clap::Args)]
pub struct Args {
    /// Checkpoint directory (config.json + safetensors shards).
    #[arg(long)]
    pub model: PathBuf,
    /// Prompt token ids, comma separated (e.g. `1,2,3`).
    #[arg(long)]
    pub tokens: String,
    /// KV and index cache dtype: bf16 or fp8_e4m3.
    #[arg(long, default_value = "bf16")]
    pub kv_dtype: String,
    /// Routed-expert activation mode: bf16 or mxfp4.
    #[arg(long, default_value = "bf16")]
    pub act: String,
    /// Block selection: per_kv_head or shared (overrides the config).
    #[arg(long)]
    pub selection: Option<String>,
    /// Teacher-force each layer's input from this dump's `residual.{l-1}`.
    #[arg(long)]
    pub teacher: Option<PathBuf>,
    /// Output safetensors file for the taps.
    #[arg(long)]
    pub dump: PathBuf,
    /// Convert NVFP4 routed experts to MXFP4 at load (lossy; FORMATS.md
    /// Conversions), with the rule of `--scale-rule`.
    #[arg(long)]
    pub nvfp4_to_mxfp4: bool,
    /// MX scale rule of `--nvfp4-to-mxfp4`: even, floor or rceil.
    #[arg(long, default_value = "even")]
    pub scale_rule: String,
    /// Also dump the indexer block scores.
    #[arg(long)]
    pub index_scores: bool,
    /// Backend: auto, cpu or gpu.
    #[arg(long, default_value = "cpu")]
    pub backend: String,
    /// Threads for the CPU backend (0 = all cores; results do not depend on it).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
}

/// Parse `1,2,3` (spaces allowed) into token ids below `vocab`.
pub(crate) fn parse_tokens(s: &str, vocab: usize) -> Result<Vec<u32>> {
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

pub(crate) fn parse_kv(s: &str) -> Result<CacheDtype> {
    CacheDtype::parse(s).ok_or_else(|| anyhow!("--kv-dtype: `{s}` is not one of bf16, fp8_e4m3"))
}

pub(crate) fn parse_scale_rule(s: &str) -> Result<ScaleRule> {
    match s {
        "even" => Ok(ScaleRule::Even),
        "floor" => Ok(ScaleRule::Floor),
        "rceil" => Ok(ScaleRule::Rceil),
        _ => bail!("--scale-rule: `{s}` is not one of even, floor, rceil"),
    }
}

pub(crate) fn parse_act(s: &str) -> Result<ActMode> {
    ActMode::parse(s).ok_or_else(|| anyhow!("--act: `{s}` is not one of bf16, mxfp4"))
}

/// Load a checkpoint directory into typed weights.
pub(crate) fn load_model(dir: &FsPath) -> Result<ModelWeights> {
    load_model_with(dir, &LoadOptions::default())
}

/// Load a checkpoint directory with explicit loader options (e.g. NVFP4
/// routed experts converted to MXFP4 at load).
pub(crate) fn load_model_with(dir: &FsPath, opts: &LoadOptions) -> Result<ModelWeights> {
    if !dir.is_dir() {
        bail!("model directory {} does not exist", dir.display());
    }
    let ck =
        Checkpoint::open(dir).with_context(|| format!("opening checkpoint {}", dir.display()))?;
    ck.load(opts)
        .with_context(|| format!("loading checkpoint {}", dir.display()))
}

/// The backend named on the command line.
pub(crate) fn backend(name: &str) -> Result<Box<dyn Backend + Sync>> {
    crate::backend_select::select(name)
}

/// Run `f` on a rayon pool of `threads` threads (0 = default).
pub(crate) fn with_threads<T: Send>(threads: usize, f: impl FnOnce() -> T + Send) -> Result<T> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .context("building the thread pool")?;
    Ok(pool.install(f))
}

/// Read the teacher residuals `residual.{l}` for `l in 0..layers`.
fn read_teacher(
    path: &FsPath,
    layers: usize,
    t: usize,
    h: usize,
) -> Result<BTreeMap<usize, Vec<f32>>> {
    let bytes =
        std::fs::read(path).with_context(|| format!("reading teacher {}", path.display()))?;
    let st = safetensors::SafeTensors::deserialize(&bytes)
        .map_err(|e| anyhow!("teacher {}: not a safetensors file: {e}", path.display()))?;
    let mut out = BTreeMap::new();
    for l in 0..layers {
        let name = format!("residual.{l}");
        let v = st
            .tensor(&name)
            .map_err(|_| anyhow!("teacher {}: tensor `{name}` is missing", path.display()))?;
        if v.dtype() != Dtype::F32 || v.shape() != [t, h] {
            bail!(
                "teacher {}: tensor `{name}` is {:?} {:?}, expected F32 [{t}, {h}]",
                path.display(),
                v.dtype(),
                v.shape()
            );
        }
        out.insert(
            l,
            v.data()
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
        );
    }
    Ok(out)
}

/// Write every tap to `path` (temp file in the same directory + rename).
pub(crate) fn write_taps(taps: &Taps, path: &FsPath) -> Result<()> {
    let mut bufs: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
    for (name, t) in &taps.tensors {
        let (dtype, bytes) = match &t.data {
            TapData::F32(v) => (Dtype::F32, v.iter().flat_map(|x| x.to_le_bytes()).collect()),
            TapData::I32(v) => (Dtype::I32, v.iter().flat_map(|x| x.to_le_bytes()).collect()),
        };
        bufs.push((name.clone(), dtype, t.shape.clone(), bytes));
    }
    let views = bufs
        .iter()
        .map(|(n, d, s, b)| {
            TensorView::new(*d, s.clone(), b)
                .map(|v| (n.clone(), v))
                .map_err(|e| anyhow!("tap `{n}`: {e}"))
        })
        .collect::<Result<Vec<_>>>()?;
    let bytes =
        safetensors::serialize(views, None).map_err(|e| anyhow!("serializing taps: {e}"))?;
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(FsPath::new("."));
    let file = path
        .file_name()
        .ok_or_else(|| anyhow!("--dump {}: not a file name", path.display()))?;
    let tmp = dir.join(format!(
        ".{}.tmp{}",
        file.to_string_lossy(),
        std::process::id()
    ));
    std::fs::write(&tmp, &bytes).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path)
        .with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))?;
    Ok(())
}

pub fn run(args: Args) -> Result<()> {
    let dtype = parse_kv(&args.kv_dtype)?;
    let act = parse_act(&args.act)?;
    let be = backend(&args.backend)?;
    let load_opts = LoadOptions {
        nvfp4_experts_to_mxfp4: if args.nvfp4_to_mxfp4 {
            Some(parse_scale_rule(&args.scale_rule)?)
        } else {
            None
        },
        ..LoadOptions::default()
    };
    let mut model = load_model_with(&args.model, &load_opts)?;
    if let Some(s) = &args.selection {
        model.config.index_selection = match s.as_str() {
            "per_kv_head" => IndexSelection::PerKvHead,
            "shared" => IndexSelection::Shared,
            o => bail!("--selection: `{o}` is not one of per_kv_head, shared"),
        };
    }
    let c = model.config.clone();
    let toks = parse_tokens(&args.tokens, c.vocab_size)?;
    let t = toks.len();
    let mut taps = Taps::new(TapRequest {
        index_scores: args.index_scores,
        ..TapRequest::STANDARD
    });
    if let Some(tp) = &args.teacher {
        taps.teacher = read_teacher(tp, c.num_hidden_layers, t, c.hidden_size)?;
    }
    let page = c.index_block_size.max(1);
    let layout = KvLayout {
        page_size: page,
        num_pages: t.div_ceil(page),
        dtype,
    };
    let mut cache = KvCache::new(&model, layout);
    let table: Vec<u32> = (0..layout.num_pages as u32).collect();
    let step = StepBatch::contiguous(0, &toks, 0, &table, page, true);
    let start = std::time::Instant::now();
    let opts = RunOptions { act };
    with_threads(args.threads, || {
        be.forward(&model, &mut cache, &step, Path::Standard, &opts, &mut taps)
    })?
    .map_err(|e| anyhow!("forward on {}: {e}", be.name()))?;
    let secs = start.elapsed().as_secs_f64();
    taps.teacher.clear();
    write_taps(&taps, &args.dump)?;
    println!(
        "forward: {t} tokens, {} layers, backend {}, {:.3} s; wrote {} tensors to {}",
        c.num_hidden_layers,
        be.name(),
        secs,
        taps.tensors.len(),
        args.dump.display()
    );
    Ok(())
}
