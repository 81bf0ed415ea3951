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
//! Any `MISMATCH` makes the command exit non-zero (after printing every
//! prompt's line and writing `--json`).

use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use m3_core::backend::{Backend, Path as RunPath, RunOptions, StepBatch, Taps};
use m3_core::engine::{Engine, Request, SimplePlanner};
use m3_core::kv::{CacheDtype, KvCache, KvLayout};
use m3_core::sample::SampleParams;
use m3_core::weights::ModelWeights;
use serde::Serialize;

use super::forward::{backend, load_model, parse_act, parse_kv, parse_tokens, with_threads};

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
  MISMATCH   anything else, including non-finite logits: exit status 1.")]
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
}

/// The judgement of one prompt.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub(crate) enum Verdict {
    #[serde(rename = "identical")]
    Identical,
    #[serde(rename = "near-tie")]
    NearTie,
    #[serde(rename = "MISMATCH")]
    Mismatch,
}

impl Verdict {
    fn as_str(self) -> &'static str {
        match self {
            Verdict::Identical => "identical",
            Verdict::NearTie => "near-tie",
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
    /// The judgement at the first divergence (absent when identical).
    divergence: Option<Judgement>,
}

#[derive(Debug, Serialize)]
struct Summary {
    prompts: usize,
    identical: usize,
    near_tie: usize,
    mismatch: usize,
    min_agreed: usize,
}

#[derive(Debug, Serialize)]
struct Report {
    reference: String,
    backend: String,
    model: String,
    margin: f64,
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
    /// fresh cache (teacher forcing on the common prefix).
    fn last_logits(&self, be: &dyn Backend, tokens: &[u32]) -> Result<Vec<f32>> {
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
                &mut Taps::none(),
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
    margin: f64,
) -> Result<PromptReport> {
    let a = rc.greedy(reference, &prompt, n)?;
    let b = bc.greedy(be, &prompt, n)?;
    let agreed = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
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
        let ra = rc.last_logits(reference, &prefix)?;
        let rb = bc.last_logits(be, &prefix)?;
        let j = judge(&ra, &rb, a[agreed], b[agreed], margin)
            .with_context(|| format!("prompt {index}: judging generated token {agreed}"))?;
        (j.verdict, Some(j))
    };
    Ok(PromptReport {
        index,
        prompt,
        reference_tokens: a,
        backend_tokens: b,
        agreed,
        verdict,
        divergence,
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
}

pub fn run(args: Args) -> Result<()> {
    if args.max_tokens == 0 {
        bail!("--max-tokens must be at least 1");
    }
    if !(args.margin.is_finite() && args.margin >= 0.0) {
        bail!("--margin {}: expected a finite number >= 0", args.margin);
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
    let results = with_threads(args.threads, || -> Result<Vec<PromptReport>> {
        let mut out = Vec::new();
        for (i, p) in prompts.into_iter().enumerate() {
            let r = run_prompt(&rc, &bc, &*reference, &*be, i, p, n, args.margin)?;
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
        mismatch: count(Verdict::Mismatch),
        min_agreed: results.iter().map(|r| r.agreed).min().unwrap_or(0),
    };
    println!(
        "parity {ref_name} vs {be_name}: {} prompt(s): {} identical, {} near-tie, {} MISMATCH; min tokens agreed {}/{n} (margin {:.1e})",
        summary.prompts,
        summary.identical,
        summary.near_tie,
        summary.mismatch,
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
