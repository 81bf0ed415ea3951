//! `m3 batch`: offline batch generation through the scheduler (continuous
//! batching, chunked prefill, prefix cache, preemption, optional speculative
//! decoding) on a loaded model (`--backend cpu|gpu|auto`).
//!
//! Input: JSONL, one request per line: `{"id": ..., "prompt": "text"}` (needs
//! the checkpoint's tokenizer.json) or `{"id": ..., "tokens": [1, 2, 3]}`,
//! with optional `max_tokens`, `temperature`, `top_k`, `top_p`, `seed` and
//! `stop` (a list of strings or of token-id lists). A
//! malformed line is reported with its line number (on stderr and as an
//! `error` record in the output) and the other lines still run.
//! Output: JSONL in input order, written to a temporary file in the output's
//! directory and renamed into place when complete.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{anyhow, bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use m3_core::checkpoint::writer::write_file_atomic;
use m3_core::sched::runner::SchedRunner;
use m3_core::sched::{FinishReason, FinishedRequest, Request, SamplingParams, SchedulerConfig};
use serde_json::{json, Value};

use crate::args::{self, EngineArgs, ModelArgs, SchedArgs};
use crate::drafting;

#[derive(clap::Args)]
pub struct Args {
    /// Requests, one JSON object per line.
    #[arg(long)]
    pub input: PathBuf,
    /// Results, one JSON object per line (input order).
    #[arg(long)]
    pub output: PathBuf,
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Default `max_tokens` for lines that do not set it.
    #[arg(long, default_value_t = 64)]
    pub max_tokens: usize,
    #[command(flatten)]
    pub sched: SchedArgs,
    /// Keep generating past the end-of-text token.
    #[arg(long)]
    pub ignore_eos: bool,
}

/// KV blocks on the CPU when `--kv-blocks` is not given.
const HOST_DEFAULT_BLOCKS: usize = 512;

/// One parsed input line.
struct Job {
    line: usize,
    req: Request,
}

/// What an output line says about an input line.
enum Outcome {
    Error(String),
    Done(FinishedRequest),
}

fn field_u64(obj: &serde_json::Map<String, Value>, key: &str) -> Result<Option<u64>> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .map(Some)
            .ok_or_else(|| anyhow!("`{key}` must be a non-negative integer")),
    }
}

fn field_f32(obj: &serde_json::Map<String, Value>, key: &str) -> Result<Option<f32>> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_f64()
            .map(|x| Some(x as f32))
            .ok_or_else(|| anyhow!("`{key}` must be a number")),
    }
}

/// Parse one request line (1-based `line` numbers the request ids).
fn parse_line(
    text: &str,
    line: usize,
    default_max: usize,
    vocab: usize,
    eos: &[u32],
    tokenizer: Option<&tokenizers::Tokenizer>,
) -> Result<(Value, Request), (Value, anyhow::Error)> {
    let v: Value =
        serde_json::from_str(text).map_err(|e| (Value::Null, anyhow!("not JSON: {e}")))?;
    let Value::Object(obj) = v else {
        return Err((Value::Null, anyhow!("not a JSON object")));
    };
    let id = obj.get("id").cloned().unwrap_or_else(|| json!(line));
    let parse = || -> Result<Request> {
        let tokens: Vec<u32> = match (obj.get("tokens"), obj.get("prompt")) {
            (Some(Value::Array(a)), _) => a
                .iter()
                .map(|t| {
                    t.as_u64()
                        .filter(|&x| (x as usize) < vocab)
                        .map(|x| x as u32)
                        .ok_or_else(|| {
                            anyhow!("`tokens`: {t} is not a token id below vocab_size {vocab}")
                        })
                })
                .collect::<Result<_>>()?,
            (Some(_), _) => bail!("`tokens` must be an array of token ids"),
            (None, Some(Value::String(s))) => {
                let tk = tokenizer.ok_or_else(|| {
                    anyhow!("`prompt` needs the checkpoint's tokenizer.json (or give `tokens`)")
                })?;
                let enc = tk
                    .encode(s.as_str(), false)
                    .map_err(|e| anyhow!("tokenizing `prompt`: {e}"))?;
                let ids = enc.get_ids().to_vec();
                if let Some(&t) = ids.iter().find(|&&t| t as usize >= vocab) {
                    bail!("tokenizer id {t} is out of range (vocab_size {vocab})");
                }
                ids
            }
            (None, Some(_)) => bail!("`prompt` must be a string"),
            (None, None) => bail!("needs `prompt` or `tokens`"),
        };
        if tokens.is_empty() {
            bail!("the prompt has no tokens");
        }
        let max_tokens = field_u64(&obj, "max_tokens")?.map_or(default_max, |x| x as usize);
        if max_tokens == 0 {
            bail!("`max_tokens` must be at least 1");
        }
        let sampling = SamplingParams {
            temperature: field_f32(&obj, "temperature")?.unwrap_or(0.0),
            top_k: field_u64(&obj, "top_k")?.unwrap_or(0) as usize,
            top_p: field_f32(&obj, "top_p")?.unwrap_or(1.0),
            seed: field_u64(&obj, "seed")?.unwrap_or(0),
        };
        let mut req = Request::greedy(line as u64, tokens, max_tokens);
        req.sampling = sampling;
        req.eos = eos.to_vec();
        // `stop`: a list of stop sequences, each a string (tokenized) or a
        // list of token ids; generation ends after one is produced.
        match obj.get("stop") {
            None | Some(Value::Null) => {}
            Some(Value::Array(list)) => {
                for s in list {
                    let seq: Vec<u32> = match s {
                        Value::String(text) => {
                            let tk = tokenizer
                                .ok_or_else(|| anyhow!("a string in `stop` needs the tokenizer"))?;
                            let enc = tk
                                .encode(text.as_str(), false)
                                .map_err(|e| anyhow!("tokenizing `stop`: {e}"))?;
                            enc.get_ids().to_vec()
                        }
                        Value::Array(ids) => ids
                            .iter()
                            .map(|t| {
                                t.as_u64()
                                    .map(|x| x as u32)
                                    .ok_or_else(|| anyhow!("`stop`: {t} is not a token id"))
                            })
                            .collect::<Result<_>>()?,
                        other => {
                            bail!("`stop`: {other} is neither a string nor a list of token ids")
                        }
                    };
                    if seq.is_empty() {
                        bail!("`stop`: empty stop sequence");
                    }
                    req.stop.push(seq);
                }
            }
            Some(_) => bail!("`stop` must be a list"),
        }
        Ok(req)
    };
    parse().map(|r| (id.clone(), r)).map_err(|e| (id, e))
}

fn reason_str(r: FinishReason) -> &'static str {
    match r {
        FinishReason::Length => "length",
        FinishReason::Eos => "eos",
        FinishReason::Stop => "stop",
        FinishReason::Rejected => "rejected",
    }
}

pub fn run(args: Args) -> Result<()> {
    args.sched.check()?;
    let be = args.engine.open_backend()?;
    let input = std::fs::read_to_string(&args.input)
        .with_context(|| format!("reading --input {}", args.input.display()))?;
    let ck = args.model.open()?;
    let vocab = ck.config().vocab_size;
    let tokenizer = args::tokenizer(ck.dir())?;
    let eos = if args.ignore_eos {
        Vec::new()
    } else {
        args::eos_ids(&ck)
    };

    // Parse every line; bad ones become error records.
    let mut order: Vec<(usize, Value)> = Vec::new();
    let mut outcomes: BTreeMap<usize, Outcome> = BTreeMap::new();
    let mut jobs = Vec::new();
    for (i, text) in input.lines().enumerate() {
        let line = i + 1;
        if text.trim().is_empty() {
            continue;
        }
        match parse_line(text, line, args.max_tokens, vocab, &eos, tokenizer.as_ref()) {
            Ok((id, req)) => {
                order.push((line, id));
                jobs.push(Job { line, req });
            }
            Err((id, e)) => {
                eprintln!("{}: line {line}: {e:#}", args.input.display());
                order.push((line, id));
                outcomes.insert(line, Outcome::Error(format!("line {line}: {e:#}")));
            }
        }
    }

    let e = &args.engine;
    let cfg = SchedulerConfig {
        max_batch_tokens: e.max_batch_tokens,
        max_seqs: e.max_seqs,
        enable_prefix_cache: args.sched.prefix_cache(),
        ..SchedulerConfig::default()
    };
    let spec = e.load_spec(args::is_gpu(&*be), HOST_DEFAULT_BLOCKS, &args.model);
    let n_jobs = jobs.len();
    let draft = if args.sched.spec_tokens > 0 {
        drafting::load_draft(&ck, args.sched.draft)?
    } else {
        None
    };
    let mut t0 = Instant::now();
    let (finished, counters, ran, layout) = args::with_threads(e.threads, || {
        let mut runner = args::load_runner(&*be, &ck, args.model.load_options(), &spec)?;
        let layout = runner.kv_layout();
        let drafter = if args.sched.spec_tokens > 0 {
            Some(drafting::make_drafter(&*be, &*runner, &ck, draft.as_ref())?)
        } else {
            None
        };
        let mut sr = SchedRunner::new(&mut *runner, cfg).map_err(|e| anyhow!("{e}"))?;
        sr.spec_tokens = args.sched.spec_tokens;
        sr.verify = args.sched.verify.into();
        if let Some((d, name)) = drafter {
            eprintln!(
                "speculative decoding: {} draft tokens, drafter {name}",
                args.sched.spec_tokens
            );
            sr.drafter = Some(d);
        }
        for j in &jobs {
            sr.sched
                .add_request(j.req.clone())
                .map_err(|e| anyhow!("line {}: {e}", j.line))?;
        }
        let bar = ProgressBar::new(n_jobs as u64);
        bar.set_style(
            ProgressStyle::with_template("{bar:40} {pos}/{len} requests {elapsed} {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        // the clock starts once the model is loaded
        t0 = Instant::now();
        // time of the decode-only steps and the rows they ran (one token a
        // row without speculation): the serving rate once prompts are in
        let mut last = Instant::now();
        let mut decode = (0usize, 0f64);
        let done = sr
            .run(|step, fin| {
                let now = Instant::now();
                if !step.is_empty() && step.decode_rows() == step.rows.len() {
                    decode.0 += step.rows.len();
                    decode.1 += now.duration_since(last).as_secs_f64();
                }
                last = now;
                bar.inc(fin.len() as u64)
            })
            .map_err(|e| anyhow!("batch generation on {}: {e}", be.name()))?;
        bar.finish_and_clear();
        Ok::<_, anyhow::Error>((
            done,
            *sr.sched.counters(),
            (sr.ran_mono, sr.ran_standard, decode),
            layout,
        ))
    })??;
    let secs = t0.elapsed().as_secs_f64();
    let out_tokens: usize = finished.iter().map(|f| f.output.len()).sum();
    for f in finished {
        if f.reason == FinishReason::Rejected {
            eprintln!(
                "{}: line {}: prompt ({} tokens) + max_tokens does not fit the cache ({} blocks of {})",
                args.input.display(),
                f.id,
                f.prompt_len,
                layout.num_pages,
                layout.page_size
            );
        }
        outcomes.insert(f.id as usize, Outcome::Done(f));
    }

    let mut lines = Vec::with_capacity(order.len());
    for (line, id) in &order {
        let rec = match outcomes.get(line) {
            Some(Outcome::Error(e)) => json!({"id": id, "line": line, "error": e}),
            Some(Outcome::Done(f)) if f.reason == FinishReason::Rejected => json!({
                "id": id, "line": line,
                "error": format!("line {line}: prompt ({} tokens) + max_tokens does not fit the cache ({} blocks of {})", f.prompt_len, layout.num_pages, layout.page_size),
            }),
            Some(Outcome::Done(f)) => {
                let mut rec = json!({
                    "id": id,
                    "tokens": f.output,
                    "finish_reason": reason_str(f.reason),
                    "prompt_tokens": f.prompt_len,
                    "cached_tokens": f.cached_tokens,
                    "preemptions": f.preemptions,
                });
                if let Some(tk) = &tokenizer {
                    if let Ok(text) = tk.decode(&f.output, false) {
                        rec["text"] = json!(text);
                    }
                }
                rec
            }
            None => json!({"id": id, "line": line, "error": format!("line {line}: no result")}),
        };
        lines.push(rec.to_string());
    }
    let mut text = lines.join("\n");
    text.push('\n');
    write_file_atomic(&args.output, text.as_bytes())
        .with_context(|| format!("writing --output {}", args.output.display()))?;

    let errors = order.len() - n_jobs;
    let acc = counters
        .mean_acceptance_length()
        .map_or_else(|| "n/a".to_string(), |a| format!("{a:.2}"));
    println!(
        "{n_jobs} requests ({errors} bad lines) in {secs:.2} s: {:.2} requests/s, {:.1} output tokens/s ({:.1} tokens/s over the decode-only steps, {} rows), mean acceptance length {acc}, preemptions {}, prefix-cache hit tokens {}, prefill tokens {}, steps {} mono / {} standard planned ({} / {} run)",
        n_jobs as f64 / secs.max(1e-9),
        out_tokens as f64 / secs.max(1e-9),
        ran.2 .0 as f64 / ran.2 .1.max(1e-9),
        ran.2 .0,
        counters.preemptions,
        counters.prefix_hit_tokens,
        counters.prefill_tokens,
        counters.steps_mono,
        counters.steps_standard,
        ran.0,
        ran.1,
    );
    Ok(())
}
