//! `m3 parity`: greedy generation on two backends (a reference, by default
//! the CPU reference, and a backend under test, by default the GPU), token
//! streams compared, and the first divergence judged.
//!
//! Why a judgement and not plain equality: the two backends sum in
//! different f32 orders, which can flip a bf16 rounding upstream and so swap
//! two logits that are within a rounding of each other. ARCHITECTURE.md's
//! rule is that discrete choices must match except at reported near ties;
//! this command applies it to greedy tokens.
//!
//! Per prompt:
//! 1. greedy generation of `--max-tokens` tokens on each backend (the
//!    engine's prefill-then-decode loop, end-of-text ignored so both streams
//!    have the same length);
//! 2. identical streams: verdict `identical`;
//! 3. otherwise, at the first differing generated token, both backends are
//!    teacher-forced on the common prefix (prompt + agreed tokens, one
//!    prefill step on a fresh cache) and the logits of its last row are
//!    judged by [`judge`]: `near-tie` when the reference's logit gap between
//!    its own token and the backend's token is below `--margin` *and* the
//!    backend's gap the other way is below it too; `MISMATCH` otherwise
//!    (also for non-finite logits). The report has both top-2s, both gaps,
//!    each side's logit of the other's token, and the max-abs and
//!    relative-L2 difference of the two rows.
//!
//! 4. diagnosis (on a `MISMATCH`, or at every divergence with
//!    `--diagnose`): the same teacher-forced prefill is run on both backends
//!    with taps (`residual.{l}`, `experts.{l}`, `topk_blocks.{l}`,
//!    `index_scores.{l}`), plus one more run of each through
//!    [`forward_by_ops`] behind a recording wrapper ([`Recorder`]) for what
//!    the taps do not hold: each layer's attention output (after `o_proj`),
//!    FFN output and router input. Per layer: the residual's rel L2 on the
//!    last row and on its worst row, the attention/FFN outputs' rel L2 on
//!    the last row, and every discrete choice that differs (expert sets per
//!    row, block selections per KV head and row) with the reference's own
//!    score gap between the choices that differ (router: biased sigmoid
//!    scores, recomputed from the reference's router input with the
//!    reference's own `Linear`; indexer: `index_scores`). [`judge_upstream`]
//!    then turns a logits `MISMATCH` into `near-tie-upstream` when the first
//!    discrete difference is a near tie of the reference (below
//!    `--router-margin` / `--topk-margin`, golden's margins) and every
//!    residual before its layer is within `RESIDUAL_JUMP`.
//!
//! Any `MISMATCH` makes the command exit non-zero (after printing every
//! prompt's line and writing `--json`); `near-tie-upstream` does not.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use m3_core::backend::{
    forward_by_ops, Backend, BackendError, LinearInput, Op, Path as RunPath, RunOptions, StepBatch,
    TapRequest, Taps,
};
use m3_core::config::IndexSelection;
use m3_core::engine::{Engine, Request, SimplePlanner};
use m3_core::kv::{CacheDtype, KvCache, KvLayout};
use m3_core::sample::SampleParams;
use m3_core::weights::{FfnWeights, ModelWeights};
use serde::Serialize;

use super::forward::{backend, load_model, parse_act, parse_kv, parse_tokens, with_threads};

/// Default prompt when neither `--tokens`, `--prompt` nor `--prompts` is
/// given (the same as `m3 generate`'s).
const DEFAULT_PROMPT: [u32; 4] = [1, 2, 3, 4];

/// Residual rel L2 (reference vs backend) above which a layer counts as
/// the jump: below it, two backends differ by summation order only.
const RESIDUAL_JUMP: f64 = 1e-2;

/// Most discrete differences listed per prompt (the count is always whole).
const MAX_LISTED: usize = 64;

#[derive(clap::Args)]
#[command(after_help = "Verdicts (per prompt):
  identical  both backends generated the same greedy tokens.
  near-tie   at the first differing token, teacher-forced on the common
             prefix, ref[ref_tok] - ref[be_tok] < MARGIN and
             be[be_tok] - be[ref_tok] < MARGIN: a swap of two logits within
             rounding of each other (accepted, reported).
  near-tie-upstream
             a logits MISMATCH whose diagnosis finds, upstream, that the
             first differing discrete choice (router experts or indexer
             blocks, teacher-forced prefill of the common prefix) is a near
             tie of the reference (its score gap below --router-margin /
             --topk-margin) and every residual before that layer is within
             rel L2 1e-2 (accepted, reported).
  MISMATCH   anything else, including non-finite logits: exit status 1.

Diagnosis (on MISMATCH; at every divergence with --diagnose): per layer the
residual rel L2 (last row, worst row), attention/FFN output rel L2, the
experts and blocks that differ with the reference's score gap, the first
layer whose residual rel L2 exceeds 1e-2 and the first discrete difference.")]
pub struct Args {
    /// Checkpoint directory (default: the synthetic `tiny` checkpoint in the
    /// cache dir, as for `m3 generate`).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// The reference backend: auto, cpu or gpu.
    #[arg(long, default_value = "cpu")]
    pub reference: String,
    /// The backend under test: auto, cpu or gpu.
    #[arg(long, default_value = "gpu")]
    pub backend: String,
    /// Prompt token ids, comma separated.
    #[arg(long, conflicts_with_all = ["prompt", "prompts"])]
    pub tokens: Option<String>,
    /// Prompt text (needs the checkpoint's tokenizer.json).
    #[arg(long, conflicts_with = "prompts")]
    pub prompt: Option<String>,
    /// Greedy tokens to generate per prompt.
    #[arg(long, default_value_t = 32)]
    pub max_tokens: usize,
    /// Logit gap below which a token swap is a near tie (both sides).
    #[arg(long, default_value_t = 1e-3)]
    pub margin: f64,
    /// Run K deterministic prompts (4 to 16 token ids each, derived from
    /// `--seed`) instead of one.
    #[arg(long)]
    pub prompts: Option<usize>,
    /// Seed of the `--prompts` prompts.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// KV and index cache dtype: bf16 or fp8_e4m3.
    #[arg(long, default_value = "bf16")]
    pub kv_dtype: String,
    /// Routed-expert activation mode: bf16 or mxfp4.
    #[arg(long, default_value = "bf16")]
    pub act: String,
    /// Cache dtype of the backend under test only (default: --kv-dtype):
    /// e.g. fp8_e4m3 against a bf16 reference measures what the cache cast
    /// costs in greedy tokens.
    #[arg(long)]
    pub backend_kv_dtype: Option<String>,
    /// Activation mode of the backend under test only (default: --act).
    #[arg(long)]
    pub backend_act: Option<String>,
    /// Threads for a CPU backend (0 = all cores; results do not depend on it).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Also write the report as JSON here (temp file + rename).
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Diagnose every divergence (near-tie too), not only a MISMATCH.
    #[arg(long)]
    pub diagnose: bool,
    /// Router near-tie margin (biased sigmoid score units; golden's floor).
    #[arg(long, default_value_t = 1e-3)]
    pub router_margin: f64,
    /// Indexer near-tie margin (block score units; golden's floor).
    #[arg(long, default_value_t = 2e-2)]
    pub topk_margin: f64,
}

/// The judgement of one prompt.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub(crate) enum Verdict {
    #[serde(rename = "identical")]
    Identical,
    #[serde(rename = "near-tie")]
    NearTie,
    #[serde(rename = "near-tie-upstream")]
    NearTieUpstream,
    #[serde(rename = "MISMATCH")]
    Mismatch,
}

impl Verdict {
    fn as_str(self) -> &'static str {
        match self {
            Verdict::Identical => "identical",
            Verdict::NearTie => "near-tie",
            Verdict::NearTieUpstream => "near-tie-upstream",
            Verdict::Mismatch => "MISMATCH",
        }
    }
}

/// The numbers behind a divergence verdict (logits of the same position
/// from both backends).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub(crate) struct Judgement {
    pub verdict: Verdict,
    pub ref_tok: u32,
    pub be_tok: u32,
    /// The reference row's top-2 `(id, logit)` (greedy order: ties go to
    /// the lower id; NaN entries skipped).
    pub ref_top2: Vec<(u32, f32)>,
    pub be_top2: Vec<(u32, f32)>,
    /// `ref[ref_tok] - ref[be_tok]`.
    pub ref_gap: f64,
    /// `be[be_tok] - be[ref_tok]`.
    pub be_gap: f64,
    /// The reference's logit of the backend's token, and vice versa.
    pub ref_logit_of_be_tok: f32,
    pub be_logit_of_ref_tok: f32,
    /// `max |be - ref|` over the row.
    pub max_abs: f64,
    /// `||be - ref|| / ||ref||`.
    pub rel_l2: f64,
    /// Whether either row holds a NaN or an infinity.
    pub nonfinite: bool,
    pub margin: f64,
}

/// Top-2 `(id, value)` of `row` in greedy order (strictly greater wins, so
/// ties go to the lower id, as `m3_core::sample::greedy`), NaN skipped.
fn top2(row: &[f32]) -> Vec<(u32, f32)> {
    let mut best: Vec<(u32, f32)> = Vec::with_capacity(2);
    for (i, &v) in row.iter().enumerate() {
        if v.is_nan() {
            continue;
        }
        let e = (i as u32, v);
        match best.as_slice() {
            [] => best.push(e),
            [a] => {
                if v > a.1 {
                    best.insert(0, e);
                } else {
                    best.push(e);
                }
            }
            [a, b] => {
                if v > a.1 {
                    best = vec![e, *a];
                } else if v > b.1 {
                    best[1] = e;
                }
            }
            _ => unreachable!("at most two kept"),
        }
    }
    best
}

/// Judge the divergence of two backends at one position: `ref_row` and
/// `be_row` are the two logits rows, `ref_tok`/`be_tok` the tokens each
/// chose. Same token: `identical`. Otherwise `near-tie` when both gaps
/// (`ref[ref_tok] - ref[be_tok]` and `be[be_tok] - be[ref_tok]`) are below
/// `margin`, else `MISMATCH`; a non-finite logit anywhere in either row is
/// always `MISMATCH`. Errors only for rows of different lengths, an empty
/// row, a token out of range or a margin that is not a finite number >= 0.
pub(crate) fn judge(
    ref_row: &[f32],
    be_row: &[f32],
    ref_tok: u32,
    be_tok: u32,
    margin: f64,
) -> Result<Judgement> {
    if ref_row.len() != be_row.len() {
        bail!(
            "logits rows differ in length: reference {} vs backend {}",
            ref_row.len(),
            be_row.len()
        );
    }
    if ref_row.is_empty() {
        bail!("empty logits rows");
    }
    if !(margin.is_finite() && margin >= 0.0) {
        bail!("--margin {margin}: expected a finite number >= 0");
    }
    let n = ref_row.len();
    for (what, t) in [("reference", ref_tok), ("backend", be_tok)] {
        if t as usize >= n {
            bail!("{what} token {t} is out of range (vocab {n})");
        }
    }
    let at = |row: &[f32], t: u32| row[t as usize];
    let nonfinite = ref_row.iter().chain(be_row).any(|v| !v.is_finite());
    let (mut max_abs, mut e2, mut n2) = (0f64, 0f64, 0f64);
    for (&a, &b) in be_row.iter().zip(ref_row) {
        let d = f64::from(a) - f64::from(b);
        // NaN propagates through max only explicitly
        max_abs = if d.is_nan() {
            f64::NAN
        } else {
            max_abs.max(d.abs())
        };
        e2 += d * d;
        n2 += f64::from(b) * f64::from(b);
    }
    let rel_l2 = (e2 / n2.max(1e-300)).sqrt();
    let ref_gap = f64::from(at(ref_row, ref_tok)) - f64::from(at(ref_row, be_tok));
    let be_gap = f64::from(at(be_row, be_tok)) - f64::from(at(be_row, ref_tok));
    let verdict = if ref_tok == be_tok {
        Verdict::Identical
    } else if !nonfinite && ref_gap < margin && be_gap < margin {
        Verdict::NearTie
    } else {
        Verdict::Mismatch
    };
    Ok(Judgement {
        verdict,
        ref_tok,
        be_tok,
        ref_top2: top2(ref_row),
        be_top2: top2(be_row),
        ref_gap,
        be_gap,
        ref_logit_of_be_tok: at(ref_row, be_tok),
        be_logit_of_ref_tok: at(be_row, ref_tok),
        max_abs: if nonfinite { f64::NAN } else { max_abs },
        rel_l2: if nonfinite { f64::NAN } else { rel_l2 },
        nonfinite,
        margin,
    })
}

/// One prompt's result.
#[derive(Debug, Serialize)]
struct PromptReport {
    index: usize,
    prompt: Vec<u32>,
    reference_tokens: Vec<u32>,
    backend_tokens: Vec<u32>,
    /// Generated tokens the two streams agree on before the first
    /// difference.
    agreed: usize,
    verdict: Verdict,
    /// The judgement at the first divergence (absent when identical); its
    /// `verdict` is the logits' own, before the upstream rule.
    divergence: Option<Judgement>,
    /// The per-layer diagnosis of the divergence (when one ran).
    #[serde(skip_serializing_if = "Option::is_none")]
    diagnosis: Option<Diagnosis>,
    /// Why the diagnosis could not run (the verdict then stands as judged).
    #[serde(skip_serializing_if = "Option::is_none")]
    diagnosis_error: Option<String>,
}

#[derive(Debug, Serialize)]
struct Summary {
    prompts: usize,
    identical: usize,
    near_tie: usize,
    near_tie_upstream: usize,
    mismatch: usize,
    min_agreed: usize,
}

#[derive(Debug, Serialize)]
struct Report {
    reference: String,
    backend: String,
    model: String,
    margin: f64,
    router_margin: f64,
    topk_margin: f64,
    residual_jump: f64,
    max_tokens: usize,
    kv_dtype: String,
    act: String,
    backend_kv_dtype: String,
    backend_act: String,
    results: Vec<PromptReport>,
    summary: Summary,
}

/// What both runs of a prompt share.
struct Ctx<'a> {
    model: &'a ModelWeights,
    dtype: CacheDtype,
    opts: RunOptions,
}

impl Ctx<'_> {
    /// A fresh cache with room for `positions` positions.
    fn cache(&self, positions: usize) -> KvCache {
        let page = self.model.config.index_block_size.max(1);
        KvCache::new(
            self.model,
            KvLayout {
                page_size: page,
                num_pages: positions.div_ceil(page).max(1),
                dtype: self.dtype,
            },
        )
    }

    /// `n` greedy tokens after `prompt` (end-of-text ignored), through the
    /// engine's prefill-then-decode loop, as `m3 generate` runs it.
    fn greedy(&self, be: &dyn Backend, prompt: &[u32], n: usize) -> Result<Vec<u32>> {
        let params = SampleParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            seed: 0,
        };
        let cache = self.cache(prompt.len() + n);
        let mut eng = Engine::new(be, self.model, cache, SimplePlanner, self.opts);
        eng.add(Request::new(0, prompt.to_vec(), n, params))
            .map_err(|e| anyhow!("{e}"))?;
        eng.run()
            .map_err(|e| anyhow!("greedy generation on {}: {e}", be.name()))?;
        Ok(eng.requests[0].generated().to_vec())
    }

    /// Logits of the last row of `tokens`, run as one prefill step on a
    /// fresh cache (teacher forcing on the common prefix), capturing what
    /// `taps` asks for.
    fn last_logits(&self, be: &dyn Backend, tokens: &[u32], taps: &mut Taps) -> Result<Vec<f32>> {
        let mut cache = self.cache(tokens.len());
        let page = cache.layout.page_size;
        let table: Vec<u32> = (0..cache.layout.num_pages as u32).collect();
        let step = StepBatch::contiguous(0, tokens, 0, &table, page, false);
        let logits = be
            .forward(
                self.model,
                &mut cache,
                &step,
                RunPath::Standard,
                &self.opts,
                taps,
            )
            .map_err(|e| anyhow!("teacher-forced step on {}: {e}", be.name()))?;
        let vocab = self.model.config.vocab_size;
        if logits.len() != vocab {
            bail!(
                "{}: teacher-forced step gave {} logits, expected {vocab}",
                be.name(),
                logits.len()
            );
        }
        Ok(logits)
    }

    /// The same teacher-forced step through [`forward_by_ops`] behind a
    /// [`Recorder`]: the per-layer tensors the taps do not hold.
    fn recorded(&self, be: &dyn Backend, tokens: &[u32]) -> Result<Recorded> {
        let mut cache = self.cache(tokens.len());
        let page = cache.layout.page_size;
        let table: Vec<u32> = (0..cache.layout.num_pages as u32).collect();
        let step = StepBatch::contiguous(0, tokens, 0, &table, page, false);
        let rec = Recorder {
            inner: be,
            model: self.model,
            rec: RefCell::new(Recorded::default()),
        };
        forward_by_ops(
            &rec,
            self.model,
            &mut cache,
            &step,
            RunPath::Standard,
            &self.opts,
            &mut Taps::none(),
        )
        .map_err(|e| anyhow!("recorded teacher-forced step on {}: {e}", be.name()))?;
        Ok(rec.rec.into_inner())
    }
}

/// Per-layer tensors of a [`forward_by_ops`] step that the taps do not hold
/// (`[T, H]` each, by layer).
#[derive(Debug, Default)]
struct Recorded {
    /// Attention output after `o_proj` (before the residual add).
    attn_out: BTreeMap<usize, Vec<f32>>,
    /// FFN output (dense MLP, or routed experts + shared).
    ffn_out: BTreeMap<usize, Vec<f32>>,
    /// The router's input `h2` (MoE layers).
    router_in: BTreeMap<usize, Vec<f32>>,
}

/// A backend that runs every op on `inner` and records, by layer, the
/// outputs of `o_proj`, of the FFN and the router's input. Layers are told
/// apart by the weights an op names (pointer identity with `model`'s), so
/// it relies on nothing but the op stream of [`forward_by_ops`].
struct Recorder<'a> {
    inner: &'a dyn Backend,
    model: &'a ModelWeights,
    rec: RefCell<Recorded>,
}

impl Recorder<'_> {
    fn layer_where(&self, f: impl Fn(&m3_core::weights::LayerWeights) -> bool) -> Option<usize> {
        self.model.layers.iter().position(f)
    }
}

impl Backend for Recorder<'_> {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn run_op(&self, op: Op<'_>) -> Result<(), BackendError> {
        match op {
            Op::Linear {
                x,
                rows,
                w,
                input,
                round_out,
                out,
            } => {
                let l = self.layer_where(|lw| std::ptr::eq(&lw.attn.o, w));
                self.inner.run_op(Op::Linear {
                    x,
                    rows,
                    w,
                    input,
                    round_out,
                    out: &mut *out,
                })?;
                if let Some(l) = l {
                    self.rec.borrow_mut().attn_out.insert(l, out.to_vec());
                }
                Ok(())
            }
            Op::Mlp {
                x,
                rows,
                w,
                alpha,
                limit,
                out,
            } => {
                let l = self.layer_where(
                    |lw| matches!(&lw.ffn, FfnWeights::Dense(m) if std::ptr::eq(m, w)),
                );
                self.inner.run_op(Op::Mlp {
                    x,
                    rows,
                    w,
                    alpha,
                    limit,
                    out: &mut *out,
                })?;
                if let Some(l) = l {
                    self.rec.borrow_mut().ffn_out.insert(l, out.to_vec());
                }
                Ok(())
            }
            Op::Experts {
                x,
                rows,
                moe,
                ids,
                weights,
                top_k,
                act,
                alpha,
                limit,
                out,
            } => {
                let l = self.layer_where(
                    |lw| matches!(&lw.ffn, FfnWeights::Moe(m) if std::ptr::eq(m, moe)),
                );
                self.inner.run_op(Op::Experts {
                    x,
                    rows,
                    moe,
                    ids,
                    weights,
                    top_k,
                    act,
                    alpha,
                    limit,
                    out: &mut *out,
                })?;
                if let Some(l) = l {
                    self.rec.borrow_mut().ffn_out.insert(l, out.to_vec());
                }
                Ok(())
            }
            Op::Router {
                x,
                rows,
                router,
                bias,
                top_k,
                scaling,
                ids,
                weights,
            } => {
                let l = self.layer_where(
                    |lw| matches!(&lw.ffn, FfnWeights::Moe(m) if std::ptr::eq(&m.router, router)),
                );
                if let Some(l) = l {
                    self.rec.borrow_mut().router_in.insert(l, x.to_vec());
                }
                self.inner.run_op(Op::Router {
                    x,
                    rows,
                    router,
                    bias,
                    top_k,
                    scaling,
                    ids,
                    weights,
                })
            }
            other => self.inner.run_op(other),
        }
    }
}

/// The taps a diagnosis needs from each backend's teacher-forced step.
const DIAG_TAPS: TapRequest = TapRequest {
    residual: true,
    topk_blocks: true,
    index_scores: true,
    experts: true,
    logits: false,
};

/// Which discrete choice differs. Declared in the order a layer makes them
/// (the indexer's blocks before the router's experts), which is the order
/// "first difference" follows within a layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub(crate) enum ChoiceKind {
    #[serde(rename = "blocks")]
    Blocks,
    #[serde(rename = "experts")]
    Experts,
}

impl ChoiceKind {
    fn as_str(self) -> &'static str {
        match self {
            ChoiceKind::Blocks => "blocks",
            ChoiceKind::Experts => "experts",
        }
    }
}

/// One layer's comparison (reference vs backend, teacher-forced prefill).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub(crate) struct LayerDiag {
    pub layer: usize,
    /// `||be - ref|| / ||ref||` of `residual.{l}`, last row (NaN when either
    /// side is non-finite).
    pub residual_rel_l2_last: f64,
    pub residual_max_abs_last: f64,
    /// The largest per-row rel L2 of `residual.{l}`, and its row.
    pub residual_rel_l2_max_row: f64,
    pub residual_worst_row: usize,
    /// Last row of the attention output after `o_proj` / of the FFN output.
    pub attn_out_rel_l2_last: Option<f64>,
    pub ffn_out_rel_l2_last: Option<f64>,
    /// Rows whose expert sets differ; (KV head, row) pairs whose block
    /// selections differ.
    pub expert_rows_differ: usize,
    pub block_rows_differ: usize,
}

/// One discrete choice that differs.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub(crate) struct DiscreteDiff {
    pub layer: usize,
    pub kind: ChoiceKind,
    pub row: usize,
    /// The KV head of a block selection (`None` for experts; 0 for a shared
    /// selection, which every KV head repeats).
    pub kv_head: Option<usize>,
    pub ref_ids: Vec<i32>,
    pub be_ids: Vec<i32>,
    /// Chosen by the reference only / by the backend only.
    pub ref_only: Vec<i32>,
    pub be_only: Vec<i32>,
    /// The reference's own score gap: the highest reference score among
    /// `ref_only` minus the lowest among `be_only` (router: biased sigmoid
    /// score; indexer: block score). `None`: unknown (no scores, or a
    /// non-finite score).
    pub gap: Option<f64>,
    pub margin: f64,
    /// `|gap| < margin` (a gap is >= 0 when the scores are the ones the
    /// reference chose by).
    pub near_tie: bool,
}

/// The upstream rule's result.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub(crate) struct Upstream {
    /// The first discrete difference is a near tie and nothing jumped
    /// before its layer.
    pub near_tie: bool,
    pub reason: String,
}

/// The diagnosis of one divergence.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub(crate) struct Diagnosis {
    /// Rows of the teacher-forced prefill (the common prefix).
    pub rows: usize,
    pub residual_jump: f64,
    pub layers: Vec<LayerDiag>,
    /// First layer whose residual rel L2 is above `residual_jump` (or
    /// non-finite), on the last row / on any row.
    pub first_jump_layer_last_row: Option<usize>,
    pub first_jump_layer_any_row: Option<usize>,
    /// All discrete differences (the list holds the first `MAX_LISTED`, in
    /// layer, kind, row, KV-head order).
    pub discrete_differences: usize,
    pub discrete: Vec<DiscreteDiff>,
    pub first_discrete: Option<DiscreteDiff>,
    /// Set when router gaps could not be computed ("router gap unknown").
    #[serde(skip_serializing_if = "Option::is_none")]
    pub router_gap_note: Option<String>,
    pub upstream: Upstream,
}

/// Rel L2 and max abs of `be` against `reference` (NaN for both when either
/// holds a non-finite value or the lengths differ).
fn rel_l2(reference: &[f32], be: &[f32]) -> (f64, f64) {
    if reference.len() != be.len() {
        return (f64::NAN, f64::NAN);
    }
    let (mut e2, mut n2, mut mx) = (0.0f64, 0.0f64, 0.0f64);
    for (&a, &b) in reference.iter().zip(be) {
        if !(a.is_finite() && b.is_finite()) {
            return (f64::NAN, f64::NAN);
        }
        let d = f64::from(b) - f64::from(a);
        e2 += d * d;
        n2 += f64::from(a) * f64::from(a);
        mx = mx.max(d.abs());
    }
    ((e2 / n2.max(1e-300)).sqrt(), mx)
}

/// Whether a rel L2 is a jump: above `jump`, or NaN (non-finite values).
fn is_jump(rel: f64, jump: f64) -> bool {
    rel.is_nan() || rel >= jump
}

/// The upstream rule. `residual` is each layer's worst-row residual rel L2
/// (NaN counts as a jump); `diffs` every discrete difference in (layer,
/// kind, row, head) order. Near tie upstream when there is a first
/// difference, every residual *before* its layer is below `jump`, and every
/// difference of the same layer and kind (all made from the same inputs) is
/// a near tie of the reference.
pub(crate) fn judge_upstream(residual: &[f64], diffs: &[DiscreteDiff], jump: f64) -> Upstream {
    let first_jump = residual.iter().position(|&r| is_jump(r, jump));
    let Some(first) = diffs.first() else {
        return Upstream {
            near_tie: false,
            reason: match first_jump {
                Some(l) => format!(
                    "no discrete choice differs, yet the residual rel L2 exceeds {jump:.0e} at layer {l}: a numeric difference"
                ),
                None => format!(
                    "no discrete choice differs and every residual is within rel L2 {jump:.0e}: the difference is after the last layer (final norm, LM head) or below the threshold"
                ),
            },
        };
    };
    if let Some(l) = first_jump.filter(|&l| l < first.layer) {
        return Upstream {
            near_tie: false,
            reason: format!(
                "the residual rel L2 exceeds {jump:.0e} at layer {l} ({:.3e}), before the first discrete difference (layer {}): a numeric difference, not a flip",
                residual[l], first.layer
            ),
        };
    }
    let stage: Vec<&DiscreteDiff> = diffs
        .iter()
        .take_while(|d| d.layer == first.layer && d.kind == first.kind)
        .collect();
    if let Some(d) = stage.iter().find(|d| !d.near_tie) {
        return Upstream {
            near_tie: false,
            reason: format!(
                "layer {} row {}{} {}: the reference's gap {} is not below the margin {:.1e}",
                d.layer,
                d.row,
                d.kv_head
                    .map(|h| format!(" kv head {h}"))
                    .unwrap_or_default(),
                d.kind.as_str(),
                d.gap.map_or("unknown".to_string(), |g| format!("{g:.3e}")),
                d.margin
            ),
        };
    }
    let worst = stage
        .iter()
        .filter_map(|d| d.gap)
        .fold(f64::NEG_INFINITY, f64::max);
    Upstream {
        near_tie: true,
        reason: format!(
            "the first discrete difference (layer {}, {}, {} of them) is a near tie of the reference (largest gap {worst:.3e} < margin {:.1e}) and every residual before layer {} is within rel L2 {jump:.0e}",
            first.layer,
            first.kind.as_str(),
            stage.len(),
            first.margin,
            first.layer
        ),
    }
}

/// A prompt's verdict: the logits' own, except that a `MISMATCH` with
/// finite logits whose diagnosis found a near tie upstream is
/// `near-tie-upstream`.
pub(crate) fn final_verdict(j: &Judgement, upstream: Option<&Upstream>) -> Verdict {
    match (j.verdict, upstream) {
        (Verdict::Mismatch, Some(u)) if u.near_tie && !j.nonfinite => Verdict::NearTieUpstream,
        (v, _) => v,
    }
}

/// The non-negative ids of a padded selection, as a set.
fn id_set(v: &[i32]) -> BTreeSet<i32> {
    v.iter().copied().filter(|&i| i >= 0).collect()
}

/// `max score(ref_only) - min score(be_only)`; `None` when a score is
/// missing or the result is not finite.
fn score_gap(score: impl Fn(i32) -> Option<f64>, ref_only: &[i32], be_only: &[i32]) -> Option<f64> {
    let mut hi = f64::NEG_INFINITY;
    for &a in ref_only {
        hi = hi.max(score(a)?);
    }
    let mut lo = f64::INFINITY;
    for &b in be_only {
        lo = lo.min(score(b)?);
    }
    let g = hi - lo;
    g.is_finite().then_some(g)
}

/// A difference record, if the two selections differ.
#[allow(clippy::too_many_arguments)]
fn diff_of(
    layer: usize,
    kind: ChoiceKind,
    row: usize,
    kv_head: Option<usize>,
    r: &[i32],
    b: &[i32],
    score: impl Fn(i32) -> Option<f64>,
    margin: f64,
) -> Option<DiscreteDiff> {
    let (rs, bs) = (id_set(r), id_set(b));
    if rs == bs {
        return None;
    }
    let ref_only: Vec<i32> = rs.difference(&bs).copied().collect();
    let be_only: Vec<i32> = bs.difference(&rs).copied().collect();
    let gap = score_gap(score, &ref_only, &be_only);
    Some(DiscreteDiff {
        layer,
        kind,
        row,
        kv_head,
        ref_ids: rs.into_iter().collect(),
        be_ids: bs.into_iter().collect(),
        ref_only,
        be_only,
        gap,
        margin,
        // a negative gap (the reference's own scores preferring what it did
        // not choose) means the scores are not the ones it chose by: only
        // within the margin is that still a tie
        near_tie: gap.is_some_and(|g| g.abs() < margin),
    })
}

/// The reference's biased router scores `sigmoid(z) + bias` (`[T, experts]`)
/// of MoE layer `l`, from its recorded router input, through the
/// reference's own f32-input `Linear` (as its router computes `z`).
fn router_scores(
    reference: &dyn Backend,
    model: &ModelWeights,
    l: usize,
    x: &[f32],
    rows: usize,
) -> Result<Vec<f32>> {
    let FfnWeights::Moe(moe) = &model.layers[l].ffn else {
        bail!("layer {l} is not an MoE layer");
    };
    let ne = moe.router.rows();
    let mut z = vec![0.0f32; rows * ne];
    reference
        .run_op(Op::Linear {
            x,
            rows,
            w: &moe.router,
            input: LinearInput::F32,
            round_out: false,
            out: &mut z,
        })
        .map_err(|e| anyhow!("router logits of layer {l} on {}: {e}", reference.name()))?;
    for (i, v) in z.iter_mut().enumerate() {
        *v = m3_cpu_ref::moe::router_key(
            *v,
            moe.correction_bias.get(i % ne).copied().unwrap_or(0.0),
        );
    }
    Ok(z)
}

/// Margins of the discrete choices.
#[derive(Clone, Copy, Debug)]
struct Margins {
    router: f64,
    topk: f64,
}

/// Compare the two teacher-forced steps layer by layer (see the module doc).
#[allow(clippy::too_many_arguments)]
fn diagnose(
    model: &ModelWeights,
    reference: &dyn Backend,
    rows: usize,
    rt: &Taps,
    bt: &Taps,
    rr: &Recorded,
    br: &Recorded,
    margins: Margins,
) -> Result<Diagnosis> {
    let c = &model.config;
    let h = c.hidden_size;
    let last = rows.checked_sub(1).context("empty prefix")?;
    let row =
        |v: &[f32], t: usize| -> Vec<f32> { v.get(t * h..(t + 1) * h).unwrap_or(&[]).to_vec() };
    let mut layers = Vec::with_capacity(model.layers.len());
    let mut diffs: Vec<DiscreteDiff> = Vec::new();
    let mut router_notes: Vec<String> = Vec::new();
    for l in 0..model.layers.len() {
        let name = format!("residual.{l}");
        let (Some(ra), Some(ba)) = (rt.f32(&name), bt.f32(&name)) else {
            bail!("no {name} tap from both backends (a backend that ignores taps cannot be diagnosed)");
        };
        if ra.len() != rows * h || ba.len() != rows * h {
            bail!(
                "{name}: {} and {} values, expected {}",
                ra.len(),
                ba.len(),
                rows * h
            );
        }
        let (last_rel, last_abs) = rel_l2(&row(ra, last), &row(ba, last));
        let (mut worst, mut worst_row) = (0.0f64, 0usize);
        for t in 0..rows {
            let (r, _) = rel_l2(&row(ra, t), &row(ba, t));
            if r.is_nan() || r > worst {
                worst = r;
                worst_row = t;
                if r.is_nan() {
                    break;
                }
            }
        }
        let side = |m: &BTreeMap<usize, Vec<f32>>, n: &BTreeMap<usize, Vec<f32>>| match (
            m.get(&l),
            n.get(&l),
        ) {
            (Some(a), Some(b)) if a.len() == rows * h && b.len() == rows * h => {
                Some(rel_l2(&row(a, last), &row(b, last)).0)
            }
            _ => None,
        };
        let mut ld = LayerDiag {
            layer: l,
            residual_rel_l2_last: last_rel,
            residual_max_abs_last: last_abs,
            residual_rel_l2_max_row: worst,
            residual_worst_row: worst_row,
            attn_out_rel_l2_last: side(&rr.attn_out, &br.attn_out),
            ffn_out_rel_l2_last: side(&rr.ffn_out, &br.ffn_out),
            expert_rows_differ: 0,
            block_rows_differ: 0,
        };
        // the indexer's blocks
        let tb = format!("topk_blocks.{l}");
        if let (Some(ra), Some(ba)) = (rt.i32(&tb), bt.i32(&tb)) {
            let k = c.index_topk_blocks.max(1);
            let nkv = c.num_key_value_heads;
            if ra.len() == ba.len() && ra.len() == nkv * rows * k {
                let scores = rt.tensors.get(&format!("index_scores.{l}")).and_then(|t| {
                    match (&t.data, t.shape.as_slice()) {
                        (m3_core::backend::TapData::F32(v), &[nih, tt, nb])
                            if tt == rows && v.len() == nih * tt * nb =>
                        {
                            Some((v.as_slice(), nih, nb))
                        }
                        _ => None,
                    }
                });
                let shared = c.index_selection == IndexSelection::Shared;
                let heads = if shared { 1 } else { nkv };
                for g in 0..heads {
                    for t in 0..rows {
                        let at = (g * rows + t) * k;
                        let score = |b: i32| -> Option<f64> {
                            let (v, nih, nb) = scores?;
                            let b = usize::try_from(b).ok().filter(|&b| b < nb)?;
                            let s = if shared {
                                (0..nih)
                                    .map(|q| v[(q * rows + t) * nb + b])
                                    .fold(f32::NEG_INFINITY, f32::max)
                            } else if g < nih {
                                v[(g * rows + t) * nb + b]
                            } else {
                                return None;
                            };
                            Some(f64::from(s))
                        };
                        if let Some(d) = diff_of(
                            l,
                            ChoiceKind::Blocks,
                            t,
                            Some(g),
                            &ra[at..at + k],
                            &ba[at..at + k],
                            score,
                            margins.topk,
                        ) {
                            ld.block_rows_differ += 1;
                            diffs.push(d);
                        }
                    }
                }
            }
        }
        // the router's experts
        let te = format!("experts.{l}");
        if let (Some(ra), Some(ba)) = (rt.i32(&te), bt.i32(&te)) {
            let k = c.num_experts_per_tok.max(1);
            if ra.len() == ba.len() && ra.len() == rows * k {
                let differ: Vec<usize> = (0..rows)
                    .filter(|&t| id_set(&ra[t * k..(t + 1) * k]) != id_set(&ba[t * k..(t + 1) * k]))
                    .collect();
                let scores = if differ.is_empty() {
                    None
                } else {
                    match rr.router_in.get(&l) {
                        None => {
                            router_notes.push(format!("layer {l}: no router input recorded"));
                            None
                        }
                        Some(x) => match router_scores(reference, model, l, x, rows) {
                            Ok(s) => Some(s),
                            Err(e) => {
                                router_notes.push(format!("{e:#}"));
                                None
                            }
                        },
                    }
                };
                let ne = scores.as_ref().map_or(0, |s| s.len() / rows.max(1));
                for t in differ {
                    let score = |e: i32| -> Option<f64> {
                        let s = scores.as_ref()?;
                        let e = usize::try_from(e).ok().filter(|&e| e < ne)?;
                        Some(f64::from(s[t * ne + e]))
                    };
                    if let Some(d) = diff_of(
                        l,
                        ChoiceKind::Experts,
                        t,
                        None,
                        &ra[t * k..(t + 1) * k],
                        &ba[t * k..(t + 1) * k],
                        score,
                        margins.router,
                    ) {
                        ld.expert_rows_differ += 1;
                        diffs.push(d);
                    }
                }
            }
        }
        layers.push(ld);
    }
    diffs.sort_by_key(|d| (d.layer, d.kind, d.row, d.kv_head));
    let worst: Vec<f64> = layers.iter().map(|d| d.residual_rel_l2_max_row).collect();
    let upstream = judge_upstream(&worst, &diffs, RESIDUAL_JUMP);
    let jump = |f: fn(&LayerDiag) -> f64| layers.iter().position(|d| is_jump(f(d), RESIDUAL_JUMP));
    Ok(Diagnosis {
        rows,
        residual_jump: RESIDUAL_JUMP,
        first_jump_layer_last_row: jump(|d| d.residual_rel_l2_last),
        first_jump_layer_any_row: jump(|d| d.residual_rel_l2_max_row),
        discrete_differences: diffs.len(),
        first_discrete: diffs.first().cloned(),
        discrete: diffs.into_iter().take(MAX_LISTED).collect(),
        router_gap_note: (!router_notes.is_empty())
            .then(|| format!("router gap unknown: {}", router_notes.join("; "))),
        layers,
        upstream,
    })
}

fn fmt_opt(v: Option<f64>) -> String {
    v.map_or("n/a".to_string(), |x| format!("{x:.3e}"))
}

fn fmt_diff(d: &DiscreteDiff) -> String {
    format!(
        "layer {} row {}{} {}: ref {:?}, backend {:?} (ref only {:?}, backend only {:?}); ref {} gap {} ({}, margin {:.1e})",
        d.layer,
        d.row,
        d.kv_head.map(|h| format!(" kv head {h}")).unwrap_or_default(),
        d.kind.as_str(),
        d.ref_ids,
        d.be_ids,
        d.ref_only,
        d.be_only,
        match d.kind {
            ChoiceKind::Blocks => "index-score",
            ChoiceKind::Experts => "router-score",
        },
        d.gap.map_or("unknown".to_string(), |g| format!("{g:.3e}")),
        if d.near_tie { "near tie" } else { "NOT a near tie" },
        d.margin
    )
}

fn print_diagnosis(g: &Diagnosis) {
    println!(
        "  diagnosis: teacher-forced prefill of {} rows, reference vs backend per layer (rel L2; last row, worst row):",
        g.rows
    );
    for d in &g.layers {
        println!(
            "    layer {:>3}: residual {:.3e} (max abs {:.3e}), worst row {} {:.3e}; attn out {}; ffn out {}; experts differ in {} row(s); blocks differ in {} head-row(s)",
            d.layer,
            d.residual_rel_l2_last,
            d.residual_max_abs_last,
            d.residual_worst_row,
            d.residual_rel_l2_max_row,
            fmt_opt(d.attn_out_rel_l2_last),
            fmt_opt(d.ffn_out_rel_l2_last),
            d.expert_rows_differ,
            d.block_rows_differ
        );
    }
    let jl = |v: Option<usize>| v.map_or("none".to_string(), |l| format!("layer {l}"));
    println!(
        "  first residual rel L2 above {:.0e}: {} (last row), {} (any row)",
        g.residual_jump,
        jl(g.first_jump_layer_last_row),
        jl(g.first_jump_layer_any_row)
    );
    match &g.first_discrete {
        None => println!("  first discrete difference: none"),
        Some(d) => println!(
            "  first discrete difference: {} ({} in all)",
            fmt_diff(d),
            g.discrete_differences
        ),
    }
    if let Some(n) = &g.router_gap_note {
        println!("  {n}");
    }
    println!(
        "  upstream: {}: {}",
        if g.upstream.near_tie {
            "near tie"
        } else {
            "not a near tie"
        },
        g.upstream.reason
    );
}

/// SplitMix64: the `--prompts` prompts are a pure function of the seed.
fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Prompt `k` of seed `seed`: 4 to 16 ids below `vocab`.
fn seeded_prompt(seed: u64, k: usize, vocab: usize) -> Vec<u32> {
    let mut s = seed ^ (k as u64).wrapping_mul(0xd1b5_4a32_d192_ed03);
    let len = 4 + (splitmix(&mut s) % 13) as usize;
    (0..len)
        .map(|_| (splitmix(&mut s) % vocab.max(1) as u64) as u32)
        .collect()
}

/// The prompt of `--prompt TEXT`, through the checkpoint's tokenizer.
fn tokenize(dir: &Path, text: &str, vocab: usize) -> Result<Vec<u32>> {
    let path = dir.join("tokenizer.json");
    if !path.is_file() {
        bail!("--prompt needs {} (or pass --tokens)", path.display());
    }
    let tk = tokenizers::Tokenizer::from_file(&path)
        .map_err(|e| anyhow!("reading {}: {e}", path.display()))?;
    let ids = tk
        .encode(text, false)
        .map_err(|e| anyhow!("tokenizing the prompt: {e}"))?
        .get_ids()
        .to_vec();
    if ids.is_empty() {
        bail!("--prompt: the prompt has no tokens");
    }
    if let Some(&t) = ids.iter().find(|&&t| t as usize >= vocab) {
        bail!("--prompt: tokenizer id {t} is out of range (vocab_size {vocab})");
    }
    Ok(ids)
}

/// Write `bytes` to `path` through a temp file in the same directory.
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let file = path
        .file_name()
        .ok_or_else(|| anyhow!("--json {}: not a file name", path.display()))?;
    let tmp = dir.join(format!(
        ".{}.tmp{}",
        file.to_string_lossy(),
        std::process::id()
    ));
    std::fs::write(&tmp, bytes).with_context(|| format!("writing {}", tmp.display()))?;
    if let Err(e) = std::fs::rename(&tmp, path) {
        let _ = std::fs::remove_file(&tmp);
        return Err(e).with_context(|| format!("renaming {} to {}", tmp.display(), path.display()));
    }
    Ok(())
}

fn fmt_top2(t: &[(u32, f32)]) -> String {
    t.iter()
        .map(|(i, v)| format!("{i} ({v:.6})"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// How divergences are judged.
#[derive(Clone, Copy, Debug)]
struct Judging {
    margin: f64,
    margins: Margins,
    /// Diagnose every divergence, not only a logits MISMATCH.
    diagnose_always: bool,
}

/// One prompt: both greedy streams, and the judgement at the first
/// difference (`rc`/`bc`: the reference's and the backend's run settings).
#[allow(clippy::too_many_arguments)]
fn run_prompt(
    rc: &Ctx<'_>,
    bc: &Ctx<'_>,
    reference: &dyn Backend,
    be: &dyn Backend,
    index: usize,
    prompt: Vec<u32>,
    n: usize,
    how: Judging,
) -> Result<PromptReport> {
    let a = rc.greedy(reference, &prompt, n)?;
    let b = bc.greedy(be, &prompt, n)?;
    let agreed = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    let (mut diagnosis, mut diagnosis_error) = (None, None);
    let (verdict, divergence) = if a == b {
        (Verdict::Identical, None)
    } else if agreed == a.len().min(b.len()) {
        // one stream stopped early (cannot happen with end-of-text
        // ignored, but never judge past the shorter one)
        bail!(
            "prompt {index}: the streams have different lengths ({} vs {})",
            a.len(),
            b.len()
        );
    } else {
        let mut prefix = prompt.clone();
        prefix.extend_from_slice(&a[..agreed]);
        let (mut rt, mut bt) = (Taps::new(DIAG_TAPS), Taps::new(DIAG_TAPS));
        let ra = rc.last_logits(reference, &prefix, &mut rt)?;
        let rb = bc.last_logits(be, &prefix, &mut bt)?;
        let j = judge(&ra, &rb, a[agreed], b[agreed], how.margin)
            .with_context(|| format!("prompt {index}: judging generated token {agreed}"))?;
        let mut verdict = final_verdict(&j, None);
        if verdict == Verdict::Mismatch || how.diagnose_always {
            let g = rc.recorded(reference, &prefix).and_then(|rr| {
                let br = bc.recorded(be, &prefix)?;
                diagnose(
                    rc.model,
                    reference,
                    prefix.len(),
                    &rt,
                    &bt,
                    &rr,
                    &br,
                    how.margins,
                )
            });
            match g {
                Ok(g) => {
                    verdict = final_verdict(&j, Some(&g.upstream));
                    diagnosis = Some(g);
                }
                Err(e) => diagnosis_error = Some(format!("{e:#}")),
            }
        }
        (verdict, Some(j))
    };
    Ok(PromptReport {
        index,
        prompt,
        reference_tokens: a,
        backend_tokens: b,
        agreed,
        verdict,
        divergence,
        diagnosis,
        diagnosis_error,
    })
}

fn print_line(r: &PromptReport, n: usize, ref_name: &str, be_name: &str) {
    let head = format!(
        "prompt {} ({} tokens {:?}): {}",
        r.index,
        r.prompt.len(),
        r.prompt,
        r.verdict.as_str()
    );
    match &r.divergence {
        None => println!("{head}, {n}/{n} tokens agree"),
        Some(j) => println!(
            "{head} at generated token {} of {n} (position {}): {ref_name} chose {}, {be_name} chose {}; \
             {ref_name} top-2 {} gap {:.3e}; {be_name} top-2 {} gap {:.3e}; \
             {ref_name} logit of {} = {:.6}, {be_name} logit of {} = {:.6}; \
             logits max abs {:.3e}, rel L2 {:.3e}{} (margin {:.1e})",
            r.agreed,
            r.prompt.len() + r.agreed,
            j.ref_tok,
            j.be_tok,
            fmt_top2(&j.ref_top2),
            j.ref_gap,
            fmt_top2(&j.be_top2),
            j.be_gap,
            j.be_tok,
            j.ref_logit_of_be_tok,
            j.ref_tok,
            j.be_logit_of_ref_tok,
            j.max_abs,
            j.rel_l2,
            if j.nonfinite { ", NON-FINITE logits" } else { "" },
            j.margin,
        ),
    }
    if let Some(g) = &r.diagnosis {
        print_diagnosis(g);
    }
    if let Some(e) = &r.diagnosis_error {
        println!("  diagnosis failed: {e}");
    }
}

pub fn run(args: Args) -> Result<()> {
    if args.max_tokens == 0 {
        bail!("--max-tokens must be at least 1");
    }
    if !(args.margin.is_finite() && args.margin >= 0.0) {
        bail!("--margin {}: expected a finite number >= 0", args.margin);
    }
    for (flag, m) in [
        ("--router-margin", args.router_margin),
        ("--topk-margin", args.topk_margin),
    ] {
        if !(m.is_finite() && m >= 0.0) {
            bail!("{flag} {m}: expected a finite number >= 0");
        }
    }
    if args.prompts == Some(0) {
        bail!("--prompts must be at least 1");
    }
    let dtype = parse_kv(&args.kv_dtype)?;
    let act = parse_act(&args.act)?;
    let reference = backend(&args.reference).context("--reference")?;
    let be = backend(&args.backend)?;
    let dir = match &args.model {
        Some(d) => d.clone(),
        None => super::generate::default_model()?,
    };
    let model = load_model(&dir)?;
    let vocab = model.config.vocab_size;
    let prompts: Vec<Vec<u32>> = match (args.prompts, &args.tokens, &args.prompt) {
        (Some(k), _, _) => (0..k).map(|i| seeded_prompt(args.seed, i, vocab)).collect(),
        (None, Some(t), _) => vec![parse_tokens(t, vocab)?],
        (None, None, Some(text)) => vec![tokenize(&dir, text, vocab)?],
        (None, None, None) => vec![DEFAULT_PROMPT.to_vec()],
    };
    if let Some(&t) = prompts.iter().flatten().find(|&&t| t as usize >= vocab) {
        bail!("prompt token {t} is out of range (vocab_size {vocab})");
    }
    let rc = Ctx {
        model: &model,
        dtype,
        opts: RunOptions { act },
    };
    let bc = Ctx {
        model: &model,
        dtype: match &args.backend_kv_dtype {
            Some(s) => parse_kv(s).context("--backend-kv-dtype")?,
            None => dtype,
        },
        opts: RunOptions {
            act: match &args.backend_act {
                Some(s) => parse_act(s).context("--backend-act")?,
                None => act,
            },
        },
    };
    let (ref_name, be_name) = (
        format!("ref {}", reference.name()),
        format!("backend {}", be.name()),
    );
    let n = args.max_tokens;
    let how = Judging {
        margin: args.margin,
        margins: Margins {
            router: args.router_margin,
            topk: args.topk_margin,
        },
        diagnose_always: args.diagnose,
    };
    let results = with_threads(args.threads, || -> Result<Vec<PromptReport>> {
        let mut out = Vec::new();
        for (i, p) in prompts.into_iter().enumerate() {
            let r = run_prompt(&rc, &bc, &*reference, &*be, i, p, n, how)?;
            print_line(&r, n, &ref_name, &be_name);
            out.push(r);
        }
        Ok(out)
    })??;
    let count = |v: Verdict| results.iter().filter(|r| r.verdict == v).count();
    let summary = Summary {
        prompts: results.len(),
        identical: count(Verdict::Identical),
        near_tie: count(Verdict::NearTie),
        near_tie_upstream: count(Verdict::NearTieUpstream),
        mismatch: count(Verdict::Mismatch),
        min_agreed: results.iter().map(|r| r.agreed).min().unwrap_or(0),
    };
    println!(
        "parity {ref_name} vs {be_name}: {} prompt(s): {} identical, {} near-tie, {} MISMATCH, {} near-tie-upstream; min tokens agreed {}/{n} (margin {:.1e})",
        summary.prompts,
        summary.identical,
        summary.near_tie,
        summary.mismatch,
        summary.near_tie_upstream,
        summary.min_agreed,
        args.margin
    );
    let mismatch = summary.mismatch;
    let total = summary.prompts;
    if let Some(path) = &args.json {
        let report = Report {
            reference: reference.name().to_string(),
            backend: be.name().to_string(),
            model: dir.display().to_string(),
            margin: args.margin,
            router_margin: args.router_margin,
            topk_margin: args.topk_margin,
            residual_jump: RESIDUAL_JUMP,
            max_tokens: n,
            kv_dtype: args.kv_dtype.clone(),
            act: args.act.clone(),
            backend_kv_dtype: args
                .backend_kv_dtype
                .clone()
                .unwrap_or(args.kv_dtype.clone()),
            backend_act: args.backend_act.clone().unwrap_or(args.act.clone()),
            results,
            summary,
        };
        let bytes = serde_json::to_vec_pretty(&report).context("serializing the report")?;
        write_atomic(path, &bytes)?;
    }
    if mismatch > 0 {
        bail!("parity: {mismatch} of {total} prompt(s) MISMATCH (not a near tie within --margin)");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A synthetic logits row: `base` everywhere, then the given entries.
    fn row(n: usize, set: &[(usize, f32)]) -> Vec<f32> {
        let mut v: Vec<f32> = (0..n).map(|i| (i as f32) * 1e-3 - 1.0).collect();
        for &(i, x) in set {
            v[i] = x;
        }
        v
    }

    #[test]
    fn identical_argmax_is_identical() {
        let a = row(64, &[(7, 3.0), (9, 2.0)]);
        let b = row(64, &[(7, 3.1), (9, 2.2)]);
        let j = judge(&a, &b, 7, 7, 1e-3).expect("judge");
        assert_eq!(j.verdict, Verdict::Identical);
        assert_eq!(j.ref_top2, vec![(7, 3.0), (9, 2.0)]);
        assert_eq!(j.be_top2, vec![(7, 3.1), (9, 2.2)]);
        assert!((j.max_abs - 0.2).abs() < 1e-6, "{j:?}");
        assert!(j.rel_l2 > 0.0 && !j.nonfinite);
    }

    #[test]
    fn a_true_near_tie_is_a_near_tie() {
        // the tiny case seen on the H200: 152 vs 176, gap 7.7e-4
        let a = row(512, &[(152, 2.44118), (176, 2.44042)]);
        let b = row(512, &[(152, 2.44030), (176, 2.44070)]);
        let j = judge(&a, &b, 152, 176, 1e-3).expect("judge");
        assert_eq!(j.verdict, Verdict::NearTie, "{j:?}");
        assert!((j.ref_gap - 7.6e-4).abs() < 1e-5, "{j:?}");
        assert!((j.be_gap - 4.0e-4).abs() < 1e-5, "{j:?}");
        assert_eq!(j.ref_logit_of_be_tok, 2.44042);
        assert_eq!(j.be_logit_of_ref_tok, 2.44030);
        // a tighter margin turns the same numbers into a mismatch
        let j = judge(&a, &b, 152, 176, 5e-4).expect("judge");
        assert_eq!(j.verdict, Verdict::Mismatch);
    }

    #[test]
    fn a_real_mismatch_is_caught() {
        // the planted error: the backend prefers a token the reference
        // ranks far lower
        let a = row(128, &[(3, 5.0), (4, 4.9), (60, 1.0)]);
        let b = row(128, &[(3, 4.0), (4, 3.9), (60, 6.0)]);
        let j = judge(&a, &b, 3, 60, 1e-3).expect("judge");
        assert_eq!(j.verdict, Verdict::Mismatch, "{j:?}");
        assert!((j.ref_gap - 4.0).abs() < 1e-6 && (j.be_gap - 2.0).abs() < 1e-6);
        // a small reference gap does not excuse a backend that is sure
        let a = row(128, &[(3, 5.0), (60, 4.9995)]);
        let j = judge(&a, &b, 3, 60, 1e-3).expect("judge");
        assert_eq!(j.verdict, Verdict::Mismatch, "{j:?}");
    }

    #[test]
    fn nan_logits_are_a_mismatch_not_a_panic() {
        let a = row(32, &[(1, 2.0), (2, 1.9995), (5, f32::NAN)]);
        let b = row(32, &[(1, 1.9995), (2, 2.0)]);
        let j = judge(&a, &b, 1, 2, 1e-3).expect("judge");
        assert_eq!(j.verdict, Verdict::Mismatch, "{j:?}");
        assert!(j.nonfinite && j.max_abs.is_nan() && j.rel_l2.is_nan());
        assert_eq!(j.ref_top2, vec![(1, 2.0), (2, 1.9995)], "NaN skipped");
        // all-NaN rows and NaN at the chosen ids: still no panic
        let nan = vec![f32::NAN; 32];
        let j = judge(&nan, &nan, 0, 1, 1e-3).expect("judge");
        assert_eq!(j.verdict, Verdict::Mismatch);
        assert!(j.ref_top2.is_empty());
    }

    #[test]
    fn bad_inputs_are_errors() {
        let a = row(8, &[]);
        assert!(judge(&a, &a[..7], 0, 1, 1e-3).is_err());
        assert!(judge(&a, &a, 0, 8, 1e-3).is_err());
        assert!(judge(&[], &[], 0, 0, 1e-3).is_err());
        assert!(judge(&a, &a, 0, 1, f64::NAN).is_err());
        assert!(judge(&a, &a, 0, 1, -1.0).is_err());
    }

    #[test]
    fn top2_follows_greedy_tie_order() {
        let v = [1.0, 3.0, 3.0, 2.0];
        assert_eq!(top2(&v), vec![(1, 3.0), (2, 3.0)]);
        assert_eq!(top2(&v)[0].0, m3_core::sample::greedy(&v));
        assert_eq!(top2(&[0.5]), vec![(0, 0.5)]);
    }

    /// A discrete difference with the given reference gap (margin: golden's
    /// router margin 1e-3, or topk 2e-2 for blocks).
    fn flip(layer: usize, kind: ChoiceKind, row: usize, gap: Option<f64>) -> DiscreteDiff {
        let margin = match kind {
            ChoiceKind::Experts => 1e-3,
            ChoiceKind::Blocks => 2e-2,
        };
        diff_of(
            layer,
            kind,
            row,
            (kind == ChoiceKind::Blocks).then_some(0),
            &[1, 4],
            &[1, 5],
            |e| match e {
                4 => gap.map(|g| 0.5 + g),
                5 => gap.map(|_| 0.5),
                _ => Some(0.9),
            },
            margin,
        )
        .expect("the selections differ")
    }

    #[test]
    fn a_near_tie_flip_upstream_is_accepted() {
        // residuals at summation noise until the flip at layer 2, large after
        let residual = [2e-4, 3e-4, 0.4, 0.6];
        let d = flip(2, ChoiceKind::Experts, 40, Some(3e-4));
        assert_eq!((d.ref_only.clone(), d.be_only.clone()), (vec![4], vec![5]));
        assert!(
            (d.gap.expect("gap") - 3e-4).abs() < 1e-12 && d.near_tie,
            "{d:?}"
        );
        let u = judge_upstream(&residual, std::slice::from_ref(&d), RESIDUAL_JUMP);
        assert!(u.near_tie, "{u:?}");
        // the logits MISMATCH becomes near-tie-upstream, and only that
        let a = row(64, &[(7, 3.0), (9, 1.0)]);
        let b = row(64, &[(7, 1.0), (9, 3.0)]);
        let j = judge(&a, &b, 7, 9, 1e-3).expect("judge");
        assert_eq!(j.verdict, Verdict::Mismatch);
        assert_eq!(final_verdict(&j, Some(&u)), Verdict::NearTieUpstream);
        assert_eq!(final_verdict(&j, None), Verdict::Mismatch);
        // an indexer flip at layer 0 (nothing before it) within topk margin
        let b0 = flip(0, ChoiceKind::Blocks, 12, Some(5e-3));
        assert!(judge_upstream(&[0.2, 0.5], &[b0], RESIDUAL_JUMP).near_tie);
        // non-finite logits stay a MISMATCH whatever the upstream says
        let nan = row(64, &[(7, 3.0), (9, f32::NAN)]);
        let j = judge(&nan, &b, 7, 9, 1e-3).expect("judge");
        assert_eq!(final_verdict(&j, Some(&u)), Verdict::Mismatch);
    }

    #[test]
    fn a_residual_jump_before_any_flip_is_a_mismatch() {
        // layer 1 already differs by 5e-2 (a numeric bug); the near-tie flip
        // at layer 2 is its consequence, not an excuse
        let residual = [2e-4, 5e-2, 0.4];
        let d = flip(2, ChoiceKind::Experts, 3, Some(1e-4));
        let u = judge_upstream(&residual, &[d], RESIDUAL_JUMP);
        assert!(!u.near_tie && u.reason.contains("layer 1"), "{u:?}");
        // a non-finite residual counts as a jump
        let d = flip(2, ChoiceKind::Experts, 3, Some(1e-4));
        assert!(!judge_upstream(&[1e-4, f64::NAN, 0.4], &[d], RESIDUAL_JUMP).near_tie);
        // no flip at all but a jump: numeric
        let u = judge_upstream(&residual, &[], RESIDUAL_JUMP);
        assert!(!u.near_tie && u.reason.contains("layer 1"), "{u:?}");
        assert!(!judge_upstream(&[1e-4, 2e-4], &[], RESIDUAL_JUMP).near_tie);
    }

    #[test]
    fn a_flip_that_is_not_a_near_tie_is_a_mismatch() {
        // the planted error: the backend picks an expert the reference
        // scores 4e-2 lower, with every residual before it at noise level
        let residual = [2e-4, 3e-4, 0.4];
        let d = flip(2, ChoiceKind::Experts, 7, Some(4e-2));
        assert!(!d.near_tie);
        let u = judge_upstream(&residual, &[d], RESIDUAL_JUMP);
        assert!(
            !u.near_tie && u.reason.contains("not below the margin"),
            "{u:?}"
        );
        // one near tie and one real flip in the same layer and kind: mismatch
        let ds = [
            flip(2, ChoiceKind::Experts, 3, Some(1e-4)),
            flip(2, ChoiceKind::Experts, 9, Some(4e-2)),
        ];
        assert!(!judge_upstream(&residual, &ds, RESIDUAL_JUMP).near_tie);
        // an unknown gap (no router scores) is never a near tie
        let d = flip(2, ChoiceKind::Experts, 3, None);
        assert!(d.gap.is_none() && !d.near_tie);
        assert!(!judge_upstream(&residual, &[d], RESIDUAL_JUMP).near_tie);
        // a block gap within the router margin but judged by topk's: tie;
        // beyond topk's: not
        assert!(flip(1, ChoiceKind::Blocks, 0, Some(1.5e-2)).near_tie);
        assert!(!flip(1, ChoiceKind::Blocks, 0, Some(3e-2)).near_tie);
    }

    #[test]
    fn gaps_and_rel_l2_handle_edge_cases() {
        // padded selections: -1 ignored, order ignored
        assert!(diff_of(
            0,
            ChoiceKind::Blocks,
            0,
            Some(0),
            &[0, 3, -1],
            &[3, 0, -1],
            |_| None,
            1.0
        )
        .is_none());
        // worst pair: max over ref-only minus min over backend-only
        let s = |e: i32| Some([0.0, 0.9, 0.8, 0.7, 0.1][e as usize]);
        assert_eq!(score_gap(s, &[1, 2], &[3, 4]), Some(0.9 - 0.1));
        assert_eq!(score_gap(|_| Some(f64::NEG_INFINITY), &[1], &[2]), None);
        let (r, m) = rel_l2(&[3.0, 4.0], &[3.0, 4.5]);
        assert!((r - 0.1).abs() < 1e-12 && (m - 0.5).abs() < 1e-12);
        assert!(rel_l2(&[1.0], &[f32::INFINITY]).0.is_nan());
        assert!(rel_l2(&[1.0], &[1.0, 2.0]).0.is_nan());
    }

    #[test]
    fn seeded_prompts_are_deterministic_and_in_range() {
        let a: Vec<_> = (0..5).map(|k| seeded_prompt(3, k, 100)).collect();
        let b: Vec<_> = (0..5).map(|k| seeded_prompt(3, k, 100)).collect();
        assert_eq!(a, b);
        assert_ne!(a[0], a[1]);
        assert_ne!(seeded_prompt(4, 0, 100), a[0]);
        for p in &a {
            assert!((4..=16).contains(&p.len()) && p.iter().all(|&t| t < 100));
        }
    }
}
