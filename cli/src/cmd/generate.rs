//! `m3 generate`: prefill a prompt, then decode, on a backend; prints the
//! text, the backend and tokens/s of prefill and of decode.
//!
//! `--spec-tokens K` (K <= 7) decodes speculatively through the scheduler
//! runner: the checkpoint's DSpark draft (`dspark/`) proposes K tokens per
//! step, or prompt lookup (n-gram) when the checkpoint has no draft (the
//! output says which); `--verify greedy|rejection|block` picks the verifier
//! (greedy is the default, and the only one used for temperature 0). The
//! acceptance statistics are printed with the throughput.
//!
//! Without `--model` it uses a synthetic `tiny` checkpoint (MXFP4 routed
//! experts, MXFP8 elsewhere, seed 0) made once in the cache directory
//! (`$XDG_CACHE_HOME/m3`, else `~/.cache/m3`); the synthetic writer stages
//! it and renames it into place, so a half-written checkpoint never looks
//! complete.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{anyhow, bail, Context, Result};
use m3_core::backend::{Backend, RunOptions};
use m3_core::checkpoint::dspark_loader::load_dspark;
use m3_core::config::ModelConfig;
use m3_core::dspark::DsparkWeights;
use m3_core::engine::{Engine, Request, SimplePlanner};
use m3_core::kv::CacheDtype;
use m3_core::kv::{KvCache, KvLayout};
use m3_core::sample::SampleParams;
use m3_core::sched::dspark_drafter::DsparkDrafter;
use m3_core::sched::ngram::NgramDrafter;
use m3_core::sched::runner::{Drafter, SchedRunner, VerifyMode};
use m3_core::sched::SchedulerConfig;
use m3_core::synth::{write_checkpoint, DenseFormat, ExpertFormat, SynthSpec};
use m3_core::weights::ModelWeights;

use super::forward::{backend, load_model, parse_act, parse_kv, parse_tokens, with_threads};

#[derive(clap::Args)]
pub struct Args {
    /// Checkpoint directory (default: a synthetic `tiny` checkpoint in the cache dir).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Prompt text (needs the checkpoint's tokenizer.json).
    #[arg(long, conflicts_with = "tokens")]
    pub prompt: Option<String>,
    /// Prompt token ids, comma separated.
    #[arg(long)]
    pub tokens: Option<String>,
    /// Tokens to generate.
    #[arg(long, default_value_t = 32)]
    pub max_tokens: usize,
    /// Sampling temperature (0 = greedy).
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// Nucleus sampling mass.
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    /// Keep the K most likely tokens (0 = all).
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    /// Sampling seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// KV and index cache dtype: bf16 or fp8_e4m3.
    #[arg(long, default_value = "bf16")]
    pub kv_dtype: String,
    /// Routed-expert activation mode: bf16 or mxfp4.
    #[arg(long, default_value = "bf16")]
    pub act: String,
    /// Cache capacity in positions (prompt + generated must fit).
    #[arg(long, default_value_t = 4096)]
    pub max_context: usize,
    /// Keep generating past the end-of-text token.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Backend: auto, cpu or gpu.
    #[arg(long, default_value = "cpu")]
    pub backend: String,
    /// Threads for the CPU backend (0 = all cores).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Draft tokens verified per decode step (0 = no speculation; at most
    /// 7). Uses the checkpoint's DSpark draft, else prompt lookup.
    #[arg(long, default_value_t = 0)]
    pub spec_tokens: usize,
    /// Verifier for speculative steps: greedy, rejection or block (greedy
    /// requests always verify greedily).
    #[arg(long, default_value = "greedy")]
    pub verify: String,
}

/// Load the checkpoint's DSpark draft, if it has one.
pub(crate) fn load_draft(
    dir: &std::path::Path,
    model: &ModelWeights,
) -> Result<Option<DsparkWeights>> {
    load_dspark(dir, &model.config)
        .with_context(|| format!("loading the DSpark draft of {}", dir.display()))
}

/// The drafter for a run: DSpark when `draft` is given, else prompt lookup;
/// with a one-word name for reports.
pub(crate) fn make_drafter<'a>(
    be: &'a dyn Backend,
    model: &'a ModelWeights,
    draft: Option<&'a DsparkWeights>,
) -> Result<(Box<dyn Drafter + 'a>, &'static str)> {
    Ok(match draft {
        Some(w) => (
            Box::new(DsparkDrafter::new(be, model, w).map_err(|e| anyhow!("DSpark draft: {e}"))?),
            "dspark",
        ),
        None => (
            Box::new(NgramDrafter::default()),
            "ngram (no dspark/ in the checkpoint)",
        ),
    })
}

/// Parse `--verify`.
pub(crate) fn parse_verify(s: &str) -> Result<VerifyMode> {
    VerifyMode::parse(s).ok_or_else(|| anyhow!("--verify {s}: expected greedy, rejection or block"))
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

/// The default synthetic checkpoint, made on first use.
pub(crate) fn default_model() -> Result<PathBuf> {
    let dir = cache_dir()?.join("synthetic-tiny-mxfp4-v1");
    if dir.join("config.json").is_file() {
        return Ok(dir);
    }
    std::fs::create_dir_all(dir.parent().unwrap_or(&dir))
        .with_context(|| format!("creating {}", dir.display()))?;
    let cfg = ModelConfig::preset("tiny").map_err(|e| anyhow!("preset tiny: {e}"))?;
    let mut spec = SynthSpec::new(cfg, ExpertFormat::Mxfp4, DenseFormat::Mxfp8);
    spec.draft = None;
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

pub fn run(args: Args) -> Result<()> {
    if args.spec_tokens > 7 {
        bail!("--spec-tokens {} is above 7 (MODEL.md 6)", args.spec_tokens);
    }
    let verify = parse_verify(&args.verify)?;
    let dtype = parse_kv(&args.kv_dtype)?;
    let act = parse_act(&args.act)?;
    let be = backend(&args.backend)?;
    let dir = match &args.model {
        Some(d) => d.clone(),
        None => default_model()?,
    };
    let model = load_model(&dir)?;
    let c = &model.config;
    let tok_path = dir.join("tokenizer.json");
    let tokenizer = if tok_path.is_file() {
        Some(
            tokenizers::Tokenizer::from_file(&tok_path)
                .map_err(|e| anyhow!("reading {}: {e}", tok_path.display()))?,
        )
    } else {
        None
    };
    let prompt: Vec<u32> = match (&args.prompt, &args.tokens) {
        (_, Some(t)) => parse_tokens(t, c.vocab_size)?,
        (Some(text), None) => {
            let tk = tokenizer.as_ref().ok_or_else(|| {
                anyhow!("--prompt needs {} (or pass --tokens)", tok_path.display())
            })?;
            let enc = tk
                .encode(text.as_str(), false)
                .map_err(|e| anyhow!("tokenizing the prompt: {e}"))?;
            let ids = enc.get_ids().to_vec();
            if ids.is_empty() {
                bail!("--prompt: the prompt has no tokens");
            }
            if let Some(&t) = ids.iter().find(|&&t| t as usize >= c.vocab_size) {
                bail!(
                    "--prompt: tokenizer id {t} is out of range (vocab_size {})",
                    c.vocab_size
                );
            }
            ids
        }
        (None, None) => vec![1, 2, 3, 4],
    };
    let need = prompt.len() + args.max_tokens;
    if need > args.max_context {
        bail!(
            "prompt ({} tokens) + --max-tokens {} = {need} exceeds --max-context {}",
            prompt.len(),
            args.max_tokens,
            args.max_context
        );
    }
    let page = c.index_block_size.max(1);
    let layout = KvLayout {
        page_size: page,
        num_pages: args.max_context.div_ceil(page),
        dtype,
    };
    let cache = KvCache::new(&model, layout);
    let params = SampleParams {
        temperature: args.temperature,
        top_k: args.top_k,
        top_p: args.top_p,
        seed: args.seed,
    };
    let mut req = Request::new(0, prompt.clone(), args.max_tokens, params);
    if !args.ignore_eos {
        let cfg_json: serde_json::Value = std::fs::read_to_string(dir.join("config.json"))
            .ok()
            .and_then(|s| serde_json::from_str(&s).ok())
            .unwrap_or(serde_json::Value::Null);
        let eos = cfg_json
            .get("text_config")
            .and_then(|t| t.get("eos_token_id"))
            .or(cfg_json.get("eos_token_id"));
        match eos {
            Some(serde_json::Value::Number(n)) => {
                req.stop_tokens.extend(n.as_u64().map(|v| v as u32))
            }
            Some(serde_json::Value::Array(a)) => req
                .stop_tokens
                .extend(a.iter().filter_map(|v| v.as_u64()).map(|v| v as u32)),
            _ => {}
        }
    }
    let opts = RunOptions { act };
    if args.spec_tokens > 0 {
        let draft = load_draft(&dir, &model)?;
        let sreq = m3_core::sched::Request {
            id: 0,
            prompt: prompt.clone(),
            max_tokens: args.max_tokens,
            eos: req.stop_tokens.clone(),
            stop: Vec::new(),
            sampling: params,
        };
        let spec = SpecRun {
            be: &*be,
            model: &model,
            draft: draft.as_ref(),
            dtype,
            opts,
            page,
            max_context: args.max_context,
            spec_tokens: args.spec_tokens,
            verify,
        };
        let (rep, out) = with_threads(args.threads, || spec.run(sreq))??;
        let text = match &tokenizer {
            Some(tk) => tk
                .decode(&out, false)
                .map_err(|e| anyhow!("decoding the output: {e}"))?,
            None => format!("{out:?}"),
        };
        println!("{text}");
        eprintln!(
            "backend {} | drafter {} | verify {:?} | prompt {} tokens, prefill {:.1} tok/s | generated {} tokens, decode {:.1} tok/s | spec-tokens {}: {} verifies, {} drafted, {} accepted, mean acceptance length {} | tokens {:?}",
            be.name(),
            rep.drafter,
            verify,
            rep.prefill.0,
            rate(rep.prefill),
            out.len(),
            rate(rep.decode),
            args.spec_tokens,
            rep.stats.verifies,
            rep.stats.proposed,
            rep.stats.accepted,
            rep.stats
                .mean_acceptance_length()
                .map_or_else(|| "n/a".to_string(), |a| format!("{a:.2}")),
            out
        );
        return Ok(());
    }
    let (prefill, decode, out) = with_threads(args.threads, || -> Result<_> {
        let mut eng = Engine::new(&*be, &model, cache, SimplePlanner, opts);
        eng.add(req).map_err(|e| anyhow!("{e}"))?;
        let (mut pre, mut dec) = ((0usize, 0.0f64), (0usize, 0.0f64));
        loop {
            let t0 = Instant::now();
            let Some(rep) = eng
                .step()
                .map_err(|e| anyhow!("generation on {}: {e}", be.name()))?
            else {
                break;
            };
            let s = t0.elapsed().as_secs_f64();
            if rep.prefill_rows > 0 {
                pre.0 += rep.prefill_rows;
                pre.1 += s;
            } else {
                dec.0 += rep.rows;
                dec.1 += s;
            }
        }
        Ok((pre, dec, eng.requests[0].generated().to_vec()))
    })??;
    let text = match &tokenizer {
        Some(tk) => tk
            .decode(&out, false)
            .map_err(|e| anyhow!("decoding the output: {e}"))?,
        None => format!("{out:?}"),
    };
    println!("{text}");
    eprintln!(
        "backend {} | prompt {} tokens, prefill {:.1} tok/s | generated {} tokens, decode {:.1} tok/s | tokens {:?}",
        be.name(),
        pre_tokens(prefill),
        rate(prefill),
        out.len(),
        rate(decode),
        out
    );
    Ok(())
}

fn pre_tokens(p: (usize, f64)) -> usize {
    p.0
}

fn rate(p: (usize, f64)) -> f64 {
    if p.1 > 0.0 {
        p.0 as f64 / p.1
    } else {
        0.0
    }
}

/// What a speculative generation needs.
struct SpecRun<'a> {
    be: &'a (dyn Backend + Sync),
    model: &'a ModelWeights,
    draft: Option<&'a DsparkWeights>,
    dtype: CacheDtype,
    opts: RunOptions,
    page: usize,
    max_context: usize,
    spec_tokens: usize,
    verify: VerifyMode,
}

/// Timings and counts of a speculative generation.
struct SpecReport {
    drafter: &'static str,
    /// (tokens, seconds) of the prompt steps and of the decode steps.
    prefill: (usize, f64),
    decode: (usize, f64),
    stats: m3_core::sched::runner::SpecStats,
}

impl SpecRun<'_> {
    /// One request through the scheduler runner with a drafter; decode time
    /// includes drafting (the drafter runs inside `SchedRunner::step`).
    fn run(&self, req: m3_core::sched::Request) -> Result<(SpecReport, Vec<u32>)> {
        // Room for the draft rows past the last position as well.
        let positions = self.max_context + self.spec_tokens + 1;
        let cfg = SchedulerConfig {
            block_size: self.page,
            num_blocks: positions.div_ceil(self.page),
            max_seqs: 1,
            max_draft_tokens: self.spec_tokens,
            ..SchedulerConfig::default()
        };
        let mut runner = SchedRunner::new(self.be, self.model, cfg, self.dtype, self.opts)
            .map_err(|e| anyhow!("{e}"))?;
        let (drafter, name) = make_drafter(self.be, self.model, self.draft)?;
        runner.drafter = Some(drafter);
        runner.spec_tokens = self.spec_tokens;
        runner.verify = self.verify;
        runner.sched.add_request(req).map_err(|e| anyhow!("{e}"))?;
        let (mut pre, mut dec) = ((0usize, 0.0f64), (0usize, 0.0f64));
        let mut out = Vec::new();
        while !runner.sched.is_done() {
            let before = runner.sched.counters().tokens_generated;
            let t0 = Instant::now();
            let step = runner
                .step()
                .map_err(|e| anyhow!("speculative generation on {}: {e}", self.be.name()))?;
            let s = t0.elapsed().as_secs_f64();
            if step.is_empty() {
                bail!("speculative generation made no progress");
            }
            let made = (runner.sched.counters().tokens_generated - before) as usize;
            if step.decode_rows() < step.rows.len() {
                pre.0 += step.rows.len() - step.decode_rows();
                pre.1 += s;
            } else {
                dec.0 += made;
                dec.1 += s;
            }
            for f in runner.sched.take_finished() {
                out = f.output;
            }
        }
        Ok((
            SpecReport {
                drafter: name,
                prefill: pre,
                decode: dec,
                stats: runner.spec_stats.get(&0).copied().unwrap_or_default(),
            },
            out,
        ))
    }
}
