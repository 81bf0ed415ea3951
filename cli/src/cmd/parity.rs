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
//! 1. greedy generation of `--max-tokens` tokens on each backend's loaded
//!    model, through the scheduler as `m3 generate` runs it (end-of-text
//!    ignored so both streams have the same length);
//! 2. identical streams: verdict `identical`;
//! 3. otherwise, at the first differing generated token, both backends are
//!    teacher-forced on the common prefix (prompt + agreed tokens, one
//!    prefill step on a fresh cache) and the logits of its last row are
//!    judged by `m3_golden::parity::judge`: `near-tie` when the reference's logit gap between
//!    its own token and the backend's token is below `--margin` *and* the
//!    backend's gap the other way is below it too; `MISMATCH` otherwise
//!    (also for non-finite logits). The report has both top-2s, both gaps,
//!    each side's logit of the other's token, and the max-abs and
//!    relative-L2 difference of the two rows.
//!
//! 4. diagnosis (on a `MISMATCH`, or at every divergence with
//!    `--diagnose`): the same teacher-forced prefill runs on both backends
//!    with taps (`residual.{l}`, `experts.{l}`, `topk_blocks.{l}`, the
//!    reference's `index_scores.{l}`) and
//!    the diagnosis families (`attn_out.{l}`, `ffn_in.{l}`, `ffn_out.{l}`:
//!    each layer's attention output after `o_proj`, FFN input, FFN output).
//!    Per layer: the residual's rel L2 on the
//!    last row and on its worst row, the attention/FFN outputs' rel L2 on
//!    the last row, and every discrete choice that differs (expert sets per
//!    row, block selections per KV head and row) with the reference's own
//!    score gap between the choices that differ (router: biased sigmoid
//!    scores, recomputed from the reference's router input with the CPU
//!    reference's router; indexer: the reference's `index_scores`).
//!    `m3_golden::parity::judge_upstream`
//!    then turns a logits `MISMATCH` into `near-tie-upstream` when the first
//!    discrete difference is a near tie of the reference (below
//!    `--router-margin` / `--topk-margin`, golden's margins) and every
//!    residual before its layer is within `RESIDUAL_JUMP`.
//!
//! Any `MISMATCH` makes the command exit non-zero (after printing every
//! prompt's line and writing `--json`); `near-tie-upstream` does not.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{anyhow, bail, Context, Result};
use m3_core::backend::{
    Backend, BoxedRunner, LinearInput, Op, Path as RunPath, ReadBack, StepBatch, StepInput,
    TapRequest, Taps,
};
use m3_core::checkpoint::online::OnlineQuant;
use m3_core::checkpoint::writer::write_file_atomic;
use m3_core::checkpoint::{Checkpoint, LoadOptions};
use m3_core::sample::{greedy, SampleParams};
use m3_core::sched::runner::SchedRunner;
use m3_core::sched::{Request, SchedulerConfig};
use m3_golden::parity::{
    self, diagnose, final_verdict, judge, judge_teacher_forced, ChoiceKind, Diagnosis,
    DiscreteDiff, Judgement, Margins, Verdict, RESIDUAL_JUMP,
};
use serde::Serialize;

use crate::args::{
    self, ActArg, BackendArg, DecodePathArg, EngineArgs, KvDtypeArg, ModelArgs, OnlineQuantArg,
};

/// Default prompt when neither `--tokens`, `--prompt` nor `--prompts` is
/// given (the same as `m3 generate`'s).
const DEFAULT_PROMPT: [u32; 4] = [1, 2, 3, 4];

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
    #[command(flatten)]
    pub model: ModelArgs,
    /// The reference backend.
    #[arg(long, value_enum, default_value = "cpu")]
    pub reference: BackendArg,
    /// The backend under test.
    #[arg(long, value_enum, default_value = "gpu")]
    pub backend: BackendArg,
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
    #[arg(long, default_value_t = parity::LOGIT_MARGIN)]
    pub margin: f64,
    /// Run K deterministic prompts (4 to 16 token ids each, derived from
    /// `--seed`) instead of one.
    #[arg(long)]
    pub prompts: Option<usize>,
    /// Seed of the `--prompts` prompts.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// KV and index cache dtype.
    #[arg(long, value_enum, default_value = "bf16", alias = "kv-cache-dtype")]
    pub kv_dtype: KvDtypeArg,
    /// Routed-expert activation mode.
    #[arg(long, value_enum, default_value = "bf16")]
    pub act: ActArg,
    /// Cache dtype of the backend under test only (default: --kv-dtype):
    /// e.g. fp8_e4m3 against a bf16 reference measures what the cache cast
    /// costs in greedy tokens.
    #[arg(long, value_enum)]
    pub backend_kv_dtype: Option<KvDtypeArg>,
    /// Activation mode of the backend under test only (default: --act).
    #[arg(long, value_enum)]
    pub backend_act: Option<ActArg>,
    /// Online quantization of the backend under test only (default:
    /// --online-quant, with its exclusions): e.g. `--reference cpu --backend
    /// cpu --backend-online-quant ptpc_fp8` measures what PTPC FP8 costs.
    #[arg(long, value_enum)]
    pub backend_online_quant: Option<OnlineQuantArg>,
    /// Convert NVFP4 routed experts to MXFP4 at load on the backend under
    /// test only (with --scale-rule): e.g. `--reference cpu --backend cpu
    /// --backend-nvfp4-to-mxfp4` on an NVFP4 checkpoint measures what
    /// serving the NVFP4 experts as MXFP4 costs against serving them
    /// natively.
    #[arg(long, conflicts_with = "nvfp4_to_mxfp4")]
    pub backend_nvfp4_to_mxfp4: bool,
    /// Also run both sides teacher-forced on prompt + the reference's
    /// tokens (one prefill step each) and compare every logits row: rel L2
    /// and max abs over all rows, and how many rows' top-1 agree.
    #[arg(long)]
    pub teacher_forced_logits: bool,
    /// Positions per KV block.
    #[arg(long, default_value_t = 16)]
    pub block_size: usize,
    /// GPU backend under test: direct launches only, no CUDA graphs.
    #[arg(long)]
    pub enforce_eager: bool,
    /// GPU backend under test: shared experts folded into the expert tables
    /// (see `m3 generate --help`).
    #[arg(long)]
    pub fold_shared_expert: bool,
    /// Backend under test: its steps computed as if sharded N ways
    /// (`--backend cpu`: the tensor / expert parallel math, see `m3 generate
    /// --help`); the reference runs unsharded.
    #[arg(long, default_value_t = 1)]
    pub tensor_parallel_size: usize,
    /// GPU backend under test: the path of its mono steps (see `m3 generate
    /// --help`); the reference always runs its one way.
    #[arg(long, value_enum, default_value = "auto")]
    pub path: DecodePathArg,
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
    #[arg(long, default_value_t = parity::ROUTER_MARGIN)]
    pub router_margin: f64,
    /// Indexer near-tie margin (block score units; golden's floor).
    #[arg(long, default_value_t = parity::TOPK_MARGIN)]
    pub topk_margin: f64,
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
    /// `--teacher-forced-logits`: every row of prompt + reference tokens.
    #[serde(skip_serializing_if = "Option::is_none")]
    teacher_forced: Option<TeacherForced>,
}

/// Both sides' logits on the same tokens (prompt + the reference's greedy
/// tokens, teacher-forced), compared row by row.
#[derive(Debug, Serialize)]
struct TeacherForced {
    rows: usize,
    /// Over all rows together (golden's `rel_l2`).
    rel_l2: f64,
    max_abs: f64,
    /// Rows whose greedy token agrees.
    top1_agree: usize,
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
            ChoiceKind::ActCodes => "relative value",
        },
        d.gap.map_or("unknown".to_string(), |g| format!("{g:.3e}")),
        if d.near_tie { "near tie" } else { "NOT a near tie" },
        d.margin
    )
}

fn print_diagnosis(g: &Diagnosis) {
    println!(
        "  diagnosis: prefill of {} rows, the backend teacher-forced on the reference's residuals, per layer (rel L2; last row, worst row):",
        g.rows
    );
    for d in &g.layers {
        println!(
            "    layer {:>3}: residual {:.3e} (max abs {:.3e}), worst row {} {:.3e}; attn out {}; ffn out {}; experts differ in {} row(s); blocks differ in {} head-row(s){}{}",
            d.layer,
            d.residual_rel_l2_last,
            d.residual_max_abs_last,
            d.residual_worst_row,
            d.residual_rel_l2_max_row,
            fmt_opt(d.attn_out_rel_l2_last),
            fmt_opt(d.ffn_out_rel_l2_last),
            d.expert_rows_differ,
            d.block_rows_differ,
            d.act_code_flips
                .map(|n| format!("; MXFP4 activation codes flipped: {n}"))
                .unwrap_or_default(),
            if d.jump_rows > 0 {
                format!(
                    "; {} row(s) above {:.0e}, {} with no choice of their own",
                    d.jump_rows, g.residual_jump, d.unexplained_jump_rows
                )
            } else {
                String::new()
            }
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

fn fmt_top2(t: &[(u32, f32)]) -> String {
    t.iter()
        .map(|(i, v)| format!("{i} ({v:.6})"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// One side of the comparison: a backend's loaded model.
struct Side<'b> {
    name: String,
    runner: BoxedRunner<'b>,
}

impl Side<'_> {
    /// `n` greedy tokens after `prompt` (end-of-text ignored), through the
    /// scheduler as `m3 generate` runs it.
    fn greedy(&mut self, prompt: &[u32], n: usize, max_batch_tokens: usize) -> Result<Vec<u32>> {
        let cfg = SchedulerConfig {
            max_batch_tokens,
            max_seqs: 1,
            enable_prefix_cache: false,
            ..SchedulerConfig::default()
        };
        let mut sr = SchedRunner::new(&mut *self.runner, cfg).map_err(|e| anyhow!("{e}"))?;
        sr.sched
            .add_request(Request::greedy(0, prompt.to_vec(), n))
            .map_err(|e| anyhow!("{e}"))?;
        let done = sr
            .run(|_, _| {})
            .map_err(|e| anyhow!("greedy generation on {}: {e}", self.name))?;
        Ok(done
            .into_iter()
            .next()
            .map(|f| f.output)
            .unwrap_or_default())
    }

    /// Logits of every row of `tokens` (`[T, vocab]`), one prefill step on
    /// a fresh cache.
    fn all_logits(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        let bs = self.runner.kv_layout().page_size;
        let table: Vec<u32> = (0..tokens.len().div_ceil(bs) as u32).collect();
        let step = StepBatch::contiguous(0, tokens, 0, &table, bs, true);
        let sampling = vec![SampleParams::GREEDY; step.logits_rows.len()];
        let out = self
            .runner
            .step(&StepInput {
                batch: &step,
                path: RunPath::Standard,
                sampling: &sampling,
                read: &ReadBack::all_logits(&step),
                teacher: None,
            })
            .map_err(|e| anyhow!("teacher-forced step on {}: {e}", self.name))?;
        Ok(out.logits)
    }

    /// Logits of the last row of `tokens`, run as one prefill step (teacher
    /// forcing on the common prefix), with the taps of `req`; `teacher`:
    /// every layer's input taken from these residuals.
    fn last_logits(
        &mut self,
        tokens: &[u32],
        req: TapRequest,
        teacher: Option<&BTreeMap<usize, Vec<f32>>>,
    ) -> Result<(Vec<f32>, Taps)> {
        let bs = self.runner.kv_layout().page_size;
        let table: Vec<u32> = (0..tokens.len().div_ceil(bs) as u32).collect();
        let step = StepBatch::contiguous(0, tokens, 0, &table, bs, false);
        let out = self
            .runner
            .step(&StepInput {
                batch: &step,
                path: RunPath::Standard,
                sampling: &[SampleParams::GREEDY],
                read: &ReadBack {
                    logits: vec![0],
                    taps: req,
                },
                teacher,
            })
            .map_err(|e| anyhow!("teacher-forced step on {}: {e}", self.name))?;
        Ok((out.logits, out.taps))
    }
}

/// The reference's biased router scores `sigmoid(z) + bias` (`[T, experts]`)
/// of MoE layer `l` from its router input `x`, with the CPU reference's
/// router (the router weights read from the checkpoint).
fn router_scores(ck: &Checkpoint, l: usize, x: &[f32], rows: usize) -> Result<Vec<f32>> {
    let c = ck.config();
    let n = ck.names().layer(l);
    let ne = c.num_local_experts;
    let w = ck
        .stored_linear(
            &n.router(),
            ne,
            c.hidden_size,
            false,
            &LoadOptions::default(),
        )
        .map_err(|e| anyhow!("{e}"))?
        .into_owned()
        .map_err(|e| anyhow!("{}: {e}", n.router()))?;
    let bias = ck
        .vector_f32(&n.correction_bias())
        .map_err(|e| anyhow!("{e}"))?;
    let mut z = vec![0.0f32; rows * ne];
    m3_cpu_ref::CpuBackend::new()
        .run_op(Op::Linear {
            x,
            rows,
            w: &w,
            input: LinearInput::F32,
            round_out: false,
            out: &mut z,
        })
        .map_err(|e| anyhow!("router logits of layer {l}: {e}"))?;
    for (i, v) in z.iter_mut().enumerate() {
        *v = m3_cpu_ref::moe::router_key(*v, bias.get(i % ne).copied().unwrap_or(0.0));
    }
    Ok(z)
}

/// How divergences are judged.
#[derive(Clone, Copy, Debug)]
struct Judging {
    margin: f64,
    margins: Margins,
    /// Diagnose every divergence, not only a logits MISMATCH.
    diagnose_always: bool,
    max_batch_tokens: usize,
    /// Count MXFP4 activation code flips per layer (`--act mxfp4` runs).
    count_act_flips: bool,
    /// Compare every teacher-forced logits row (`--teacher-forced-logits`).
    teacher_forced_logits: bool,
}

/// One prompt: both greedy streams, and the judgement at the first
/// difference.
fn run_prompt(
    ck: &Checkpoint,
    rs: &mut Side<'_>,
    bs: &mut Side<'_>,
    index: usize,
    prompt: Vec<u32>,
    n: usize,
    how: Judging,
) -> Result<PromptReport> {
    let a = rs.greedy(&prompt, n, how.max_batch_tokens)?;
    let b = bs.greedy(&prompt, n, how.max_batch_tokens)?;
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
        let (ra, rt) = rs.last_logits(&prefix, TapRequest::ALL, None)?;
        let (rb, _) = bs.last_logits(&prefix, TapRequest::NONE, None)?;
        let j = judge(&ra, &rb, a[agreed], b[agreed], how.margin)
            .with_context(|| format!("prompt {index}: judging generated token {agreed}"))?;
        let mut verdict = final_verdict(&j, None);
        if verdict == Verdict::Mismatch || how.diagnose_always {
            let g = (|| -> Result<Diagnosis> {
                // the backend teacher-forced on the reference's residuals:
                // each layer's difference is its own
                let nl = ck.config().num_hidden_layers;
                let mut teacher = BTreeMap::new();
                for l in 0..nl {
                    let r = rt
                        .f32(&format!("residual.{l}"))
                        .ok_or_else(|| anyhow!("the reference gave no residual.{l}"))?;
                    teacher.insert(l, r.to_vec());
                }
                let (rbt, bt) = bs.last_logits(&prefix, TapRequest::DIAGNOSE, Some(&teacher))?;
                let mut scores = |l: usize, x: &[f32], rows: usize| {
                    router_scores(ck, l, x, rows).map_err(|e| format!("{e:#}"))
                };
                let mut g = diagnose(
                    ck.config(),
                    prefix.len(),
                    &rt,
                    &bt,
                    &mut scores,
                    how.margins,
                    how.count_act_flips,
                )?;
                let tf = judge(&ra, &rbt, a[agreed], greedy(&rbt), how.margin)?;
                g.upstream = judge_teacher_forced(&g, &tf);
                Ok(g)
            })();
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
    let teacher_forced = if how.teacher_forced_logits {
        let mut all = prompt.clone();
        all.extend_from_slice(&a);
        let (la, lb) = (rs.all_logits(&all)?, bs.all_logits(&all)?);
        let vocab = ck.config().vocab_size;
        let (rel_l2, max_abs) = m3_golden::parity::rel_l2(&la, &lb);
        let top1_agree = la
            .chunks_exact(vocab)
            .zip(lb.chunks_exact(vocab))
            .filter(|(x, y)| greedy(x) == greedy(y))
            .count();
        Some(TeacherForced {
            rows: all.len(),
            rel_l2,
            max_abs,
            top1_agree,
        })
    } else {
        None
    };
    Ok(PromptReport {
        teacher_forced,
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
    if let Some(t) = &r.teacher_forced {
        println!(
            "  teacher-forced logits over {} rows: rel L2 {:.3e}, max abs {:.3e}, top-1 agree {}/{}",
            t.rows, t.rel_l2, t.max_abs, t.top1_agree, t.rows
        );
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
    let reference = args::open_backend(args.reference, false, false, args::DecodePathArg::Standard)
        .context("--reference")?;
    let ck = args.model.open()?;
    let vocab = ck.config().vocab_size;
    let prompts: Vec<Vec<u32>> = match (args.prompts, &args.tokens, &args.prompt) {
        (Some(k), _, _) => (0..k).map(|i| seeded_prompt(args.seed, i, vocab)).collect(),
        (None, Some(t), _) => vec![args::parse_tokens(t, vocab)?],
        (None, None, Some(text)) => {
            let tk = args::tokenizer(ck.dir())?.ok_or_else(|| {
                anyhow!(
                    "--prompt needs {}/tokenizer.json (or pass --tokens)",
                    ck.dir().display()
                )
            })?;
            let ids = tk
                .encode(text.as_str(), false)
                .map_err(|e| anyhow!("tokenizing the prompt: {e}"))?
                .get_ids()
                .to_vec();
            if ids.is_empty() {
                bail!("--prompt: the prompt has no tokens");
            }
            vec![ids]
        }
        (None, None, None) => vec![DEFAULT_PROMPT.to_vec()],
    };
    if let Some(&t) = prompts.iter().flatten().find(|&&t| t as usize >= vocab) {
        bail!("prompt token {t} is out of range (vocab_size {vocab})");
    }
    let n = args.max_tokens;
    // One step holds a whole teacher-forced prefix.
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(1) + n;
    let bs = args.block_size.max(1);
    let engine = |backend: BackendArg, kv: KvDtypeArg, act: ActArg, path, tp| EngineArgs {
        backend,
        kv_dtype: kv,
        act,
        kv_blocks: Some(longest.div_ceil(bs) + 1),
        gpu_memory_utilization: 0.9,
        block_size: bs,
        max_context: longest,
        max_batch_tokens: longest,
        max_seqs: 1,
        threads: args.threads,
        enforce_eager: args.enforce_eager,
        tensor_parallel_size: tp,
        fold_shared_expert: args.fold_shared_expert,
        path,
    };
    let re = engine(
        args.reference,
        args.kv_dtype,
        args.act,
        DecodePathArg::Auto,
        1,
    );
    let bee = engine(
        args.backend,
        args.backend_kv_dtype.unwrap_or(args.kv_dtype),
        args.backend_act.unwrap_or(args.act),
        args.path,
        args.tensor_parallel_size,
    );
    let be = bee.open_backend()?;
    let how = Judging {
        margin: args.margin,
        margins: Margins {
            router: args.router_margin,
            topk: args.topk_margin,
        },
        diagnose_always: args.diagnose,
        max_batch_tokens: longest,
        teacher_forced_logits: args.teacher_forced_logits,
        count_act_flips: args.act == ActArg::Mxfp4
            || args.backend_act.is_some_and(|a| a == ActArg::Mxfp4),
    };
    let opts = args.model.load_options();
    let opts_b = LoadOptions {
        online_quant: match args.backend_online_quant {
            Some(OnlineQuantArg::PtpcFp8) => Some(OnlineQuant::ptpc_fp8(
                opts.online_quant.map(|q| q.exclude).unwrap_or(""),
            )),
            None => opts.online_quant,
        },
        nvfp4_experts_to_mxfp4: if args.backend_nvfp4_to_mxfp4 {
            Some(args.model.scale_rule.into())
        } else {
            opts.nvfp4_experts_to_mxfp4
        },
        ..opts
    };
    let (ref_name, be_name) = (
        format!("ref {}", reference.name()),
        format!("backend {}", be.name()),
    );
    let results = args::with_threads(args.threads, || -> Result<Vec<PromptReport>> {
        let spec_r = re.load_spec(args::is_gpu(&*reference), 1, &args.model);
        let spec_b = bee.load_spec(args::is_gpu(&*be), 1, &args.model);
        let mut rs = Side {
            name: ref_name.clone(),
            runner: args::load_runner(&*reference, &ck, opts, &spec_r)?,
        };
        let mut bsd = Side {
            name: be_name.clone(),
            runner: args::load_runner(&*be, &ck, opts_b, &spec_b)?,
        };
        let mut out = Vec::new();
        for (i, p) in prompts.into_iter().enumerate() {
            let r = run_prompt(&ck, &mut rs, &mut bsd, i, p, n, how)?;
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
            model: ck.dir().display().to_string(),
            margin: args.margin,
            router_margin: args.router_margin,
            topk_margin: args.topk_margin,
            residual_jump: RESIDUAL_JUMP,
            max_tokens: n,
            kv_dtype: format!("{:?}", args.kv_dtype),
            act: format!("{:?}", args.act),
            backend_kv_dtype: format!("{:?}", args.backend_kv_dtype.unwrap_or(args.kv_dtype)),
            backend_act: format!("{:?}", args.backend_act.unwrap_or(args.act)),
            results,
            summary,
        };
        let bytes = serde_json::to_vec_pretty(&report).context("serializing the report")?;
        write_file_atomic(path, &bytes)
            .with_context(|| format!("writing --json {}", path.display()))?;
    }
    if mismatch > 0 {
        bail!("parity: {mismatch} of {total} prompt(s) MISMATCH (not a near tie within --margin)");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

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
