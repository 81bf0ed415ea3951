//! `m3 generate`: one request through the scheduler on a loaded model (the
//! same loop as `m3 batch`); prints the text, then the backend and the
//! tokens/s of prefill and of decode.
//!
//! `--spec-tokens K` (K <= 7) decodes speculatively: the checkpoint's DSpark
//! draft (`dspark/`) proposes K tokens per step, or prompt lookup (n-gram)
//! when the checkpoint has no draft (the output says which); `--verify
//! greedy|rejection|block` picks the verifier (greedy is the default, and
//! the only one used for temperature 0).
//!
//! Without `--model` it uses a synthetic `tiny` checkpoint (MXFP4 routed
//! experts, MXFP8 elsewhere, seed 0) made once in the cache directory.

use std::time::Instant;

use anyhow::{anyhow, bail, Result};
use m3_core::sample::SampleParams;
use m3_core::sched::runner::{SchedRunner, VerifyMode};
use m3_core::sched::{Request, SchedulerConfig};

use crate::args::{self, EngineArgs, ModelArgs, SchedArgs};
use crate::drafting;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub engine: EngineArgs,
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
    /// Keep generating past the end-of-text token.
    #[arg(long)]
    pub ignore_eos: bool,
    #[command(flatten)]
    pub sched: SchedArgs,
}

/// (tokens, seconds) over a set of steps.
#[derive(Clone, Copy, Debug, Default)]
struct Rate {
    tokens: usize,
    secs: f64,
}

impl Rate {
    fn per_s(self) -> f64 {
        if self.secs > 0.0 {
            self.tokens as f64 / self.secs
        } else {
            0.0
        }
    }
}

pub fn run(args: Args) -> Result<()> {
    args.sched.check()?;
    let be = args.engine.open_backend()?;
    let ck = args.model.open()?;
    let c = ck.config().clone();
    let tokenizer = args::tokenizer(ck.dir())?;
    let prompt: Vec<u32> = match (&args.prompt, &args.tokens) {
        (_, Some(t)) => args::parse_tokens(t, c.vocab_size)?,
        (Some(text), None) => {
            let tk = tokenizer.as_ref().ok_or_else(|| {
                anyhow!(
                    "--prompt needs {}/tokenizer.json (or pass --tokens)",
                    ck.dir().display()
                )
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
    // Room for the draft rows past the last position as well.
    let need = prompt.len() + args.max_tokens + args.sched.spec_tokens;
    if need > args.engine.max_context {
        bail!(
            "prompt ({} tokens) + --max-tokens {} (+ --spec-tokens {}) = {need} exceeds --max-context {}",
            prompt.len(),
            args.max_tokens,
            args.sched.spec_tokens,
            args.engine.max_context
        );
    }
    let bs = args.engine.block_size.max(1);
    let spec = args
        .engine
        .load_spec(args::is_gpu(&*be), need.div_ceil(bs) + 1, &args.model);
    let draft = if args.sched.spec_tokens > 0 {
        drafting::load_draft(&ck, args.sched.draft)?
    } else {
        None
    };
    let params = SampleParams {
        temperature: args.temperature,
        top_k: args.top_k,
        top_p: args.top_p,
        seed: args.seed,
    };
    let mut req = Request::greedy(0, prompt.clone(), args.max_tokens);
    req.sampling = params;
    if !args.ignore_eos {
        req.eos = args::eos_ids(&ck);
    }
    let verify: VerifyMode = args.sched.verify.into();
    let (pre, dec, out, drafter_name, stats, (ran_mono, ran_standard)) =
        args::with_threads(args.engine.threads, || {
            {
                let mut runner = args::load_runner(&*be, &ck, args.model.load_options(), &spec)?;
                let cfg = SchedulerConfig {
                    max_batch_tokens: args.engine.max_batch_tokens,
                    max_seqs: 1,
                    max_draft_tokens: args.sched.spec_tokens,
                    enable_prefix_cache: args.sched.prefix_cache(),
                    ..SchedulerConfig::default()
                };
                let drafter = if args.sched.spec_tokens > 0 {
                    Some(drafting::make_drafter(&*be, &*runner, &ck, draft.as_ref())?)
                } else {
                    None
                };
                let mut sr = SchedRunner::new(&mut *runner, cfg).map_err(|e| anyhow!("{e}"))?;
                let mut drafter_name = "";
                if let Some((d, name)) = drafter {
                    sr.drafter = Some(d);
                    sr.spec_tokens = args.sched.spec_tokens;
                    sr.verify = verify;
                    drafter_name = name;
                }
                sr.sched.add_request(req).map_err(|e| anyhow!("{e}"))?;
                let (mut pre, mut dec) = (Rate::default(), Rate::default());
                let mut out = Vec::new();
                let mut first_decode = true;
                while !sr.sched.is_done() {
                    let before = sr.sched.counters().tokens_generated;
                    let t0 = Instant::now();
                    let step = sr
                        .step()
                        .map_err(|e| anyhow!("generation on {}: {e}", be.name()))?;
                    let s = t0.elapsed().as_secs_f64();
                    if step.is_empty() {
                        bail!("generation made no progress (the request does not fit the cache)");
                    }
                    let made = (sr.sched.counters().tokens_generated - before) as usize;
                    if step.decode_rows() < step.rows.len() {
                        pre.tokens += step.rows.len() - step.decode_rows();
                        pre.secs += s;
                    } else if first_decode {
                        // the first decode step captures the decode graph on a
                        // GPU: steady-state decode is timed from the second on
                        first_decode = false;
                    } else {
                        dec.tokens += made;
                        dec.secs += s;
                    }
                    for f in sr.sched.take_finished() {
                        out = f.output;
                    }
                }
                let stats = sr.spec_stats.get(&0).copied().unwrap_or_default();
                let paths = (sr.ran_mono, sr.ran_standard);
                Ok::<_, anyhow::Error>((pre, dec, out, drafter_name, stats, paths))
            }
        })??;
    let text = match &tokenizer {
        Some(tk) => tk
            .decode(&out, false)
            .map_err(|e| anyhow!("decoding the output: {e}"))?,
        None => format!("{out:?}"),
    };
    println!("{text}");
    let spec_line = if args.sched.spec_tokens > 0 {
        format!(
            " | drafter {drafter_name} | verify {verify:?} | spec-tokens {}: {} verifies, {} drafted, {} accepted, mean acceptance length {}",
            args.sched.spec_tokens,
            stats.verifies,
            stats.proposed,
            stats.accepted,
            stats
                .mean_acceptance_length()
                .map_or_else(|| "n/a".to_string(), |a| format!("{a:.2}")),
        )
    } else {
        String::new()
    };
    eprintln!(
        "backend {} | prompt {} tokens, prefill {:.1} tok/s | generated {} tokens, decode {:.1} tok/s (from the second decode step){spec_line} | steps {ran_mono} mono / {ran_standard} standard | tokens {:?}",
        be.name(),
        pre.tokens,
        pre.per_s(),
        out.len(),
        dec.per_s(),
        out
    );
    Ok(())
}
