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
//!
//! With `--eagle3-steps K`, the checkpoint's EAGLE3 draft (`eagle3/`) then
//! proposes K tokens greedily after the prompt, op by op on the same
//! backend (`m3_golden::run_eagle3`, the drafter the scheduler runs), from
//! the teacher's residuals of its `target_layer_ids` when `--teacher` is
//! given, else this forward's own; it adds `draft.g` `[T, H]`,
//! `draft.hidden` `[K, H]`, `draft.logits` `[K, draft_vocab]` and
//! `draft.tokens` I32 `[K]` (the golden draft cases' tensors).

use std::collections::BTreeMap;
use std::path::{Path as FsPath, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use m3_core::backend::{Path, ReadBack, StepBatch, StepInput, TapData, TapRequest};
use m3_core::checkpoint::writer::write_file_atomic;
use m3_core::sample::SampleParams;
use safetensors::tensor::TensorView;
use safetensors::Dtype;

use crate::args::{self, EngineArgs, ModelArgs};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Prompt token ids, comma separated (e.g. `1,2,3`).
    #[arg(long)]
    pub tokens: String,
    /// Teacher-force each layer's input from this dump's `residual.{l-1}`.
    #[arg(long)]
    pub teacher: Option<PathBuf>,
    /// Output safetensors file for the taps.
    #[arg(long)]
    pub dump: PathBuf,
    /// Also dump the indexer block scores (CPU reference only).
    #[arg(long)]
    pub index_scores: bool,
    /// Also dump each layer's attention output, FFN input and FFN output
    /// (`attn_out.{l}`, `ffn_in.{l}`, `ffn_out.{l}`).
    #[arg(long)]
    pub diagnose: bool,
    /// Also run the checkpoint's EAGLE3 draft: K greedy draft steps after
    /// the prompt, dumped as `draft.*` (1..=max_draft_tokens).
    #[arg(long, default_value_t = 0, value_name = "K")]
    pub eagle3_steps: usize,
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

/// Write every tap to `path` (complete or not at all).
pub(crate) fn write_taps(taps: &m3_core::backend::Taps, path: &FsPath) -> Result<()> {
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
    write_file_atomic(path, &bytes).with_context(|| format!("writing --dump {}", path.display()))
}

/// The EAGLE3 draft's proposal after `toks` on `be` (`--eagle3-steps`).
fn eagle3_taps(
    be: &dyn m3_core::backend::Backend,
    ck: &m3_core::checkpoint::Checkpoint,
    toks: &[u32],
    features: &BTreeMap<usize, Vec<f32>>,
    steps: usize,
) -> Result<m3_core::backend::Taps> {
    let draft = crate::drafting::load_draft(ck, crate::args::DraftArg::Eagle3)?
        .context("--eagle3-steps: the checkpoint has no EAGLE3 draft")?;
    let crate::drafting::DraftWeights::Eagle3(w) = &draft.weights else {
        bail!("--eagle3-steps: the checkpoint's draft is not an EAGLE3 draft");
    };
    let (embed, lm_head) = draft.shared(ck)?;
    let target = m3_core::sched::dspark_drafter::DraftTarget {
        config: ck.config(),
        embed,
        lm_head,
    };
    m3_golden::run_eagle3(be, target, w, toks, features, steps)
        .map_err(|e| anyhow!("--eagle3-steps {steps}: {e}"))
}

pub fn run(args: Args) -> Result<()> {
    // one prefill: no decode step for the mono path to take (and no
    // crossover worth timing at load)
    let mut engine_args = args.engine.clone();
    engine_args.path = args::DecodePathArg::Standard;
    let be = engine_args.open_backend()?;
    let ck = args.model.open()?;
    let c = ck.config().clone();
    let toks = args::parse_tokens(&args.tokens, c.vocab_size)?;
    let t = toks.len();
    let teacher = match &args.teacher {
        Some(tp) => Some(read_teacher(tp, c.num_hidden_layers, t, c.hidden_size)?),
        None => None,
    };
    let mut request = TapRequest {
        index_scores: args.index_scores,
        ..TapRequest::STANDARD
    };
    if args.diagnose {
        request = TapRequest {
            index_scores: args.index_scores,
            ..TapRequest::DIAGNOSE
        };
    }
    // One prefill of every token: the step is as wide as the prompt.
    let bs = args.engine.block_size.max(1);
    let mut engine = args.engine.clone();
    engine.max_batch_tokens = engine.max_batch_tokens.max(t);
    engine.max_context = engine.max_context.max(t);
    engine.max_seqs = 1;
    let blocks = t.div_ceil(bs);
    engine.kv_blocks = Some(engine.kv_blocks.unwrap_or(blocks).max(blocks));
    let spec = engine.load_spec(args::is_gpu(&*be), blocks, &args.model);
    let table: Vec<u32> = (0..blocks as u32).collect();
    let step = StepBatch::contiguous(0, &toks, 0, &table, bs, true);
    let sampling = vec![SampleParams::GREEDY; t];
    let read = ReadBack {
        logits: Vec::new(),
        taps: request,
    };
    let start = std::time::Instant::now();
    let mut taps = args::with_threads(engine.threads, || -> Result<_> {
        let mut runner = args::load_runner(&*be, &ck, args.model.load_options(), &spec)?;
        let out = runner
            .step(&StepInput {
                batch: &step,
                path: Path::Standard,
                sampling: &sampling,
                read: &read,
                teacher: teacher.as_ref(),
            })
            .map_err(|e| anyhow!("forward on {}: {e}", be.name()))?;
        Ok(out.taps)
    })??;
    let secs = start.elapsed().as_secs_f64();
    taps.teacher.clear();
    if args.eagle3_steps > 0 {
        let features = match &teacher {
            Some(t) => t.clone(),
            None => (0..c.num_hidden_layers)
                .filter_map(|l| taps.f32(&format!("residual.{l}")).map(|r| (l, r.to_vec())))
                .collect(),
        };
        let draft = eagle3_taps(&*be, &ck, &toks, &features, args.eagle3_steps)?;
        taps.tensors.extend(draft.tensors);
    }
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
