//! `m3 batch`: offline batch generation through the scheduler (continuous
//! batching, chunked prefill, prefix cache, preemption, optional speculative
//! decoding with prompt-lookup drafts) on a backend.
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
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{anyhow, bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use m3_core::backend::RunOptions;
use m3_core::config::ModelConfig;
use m3_core::sched::runner::SchedRunner;
use m3_core::sched::{FinishReason, FinishedRequest, Request, SamplingParams, SchedulerConfig};
use m3_core::synth::{write_checkpoint, DenseFormat, ExpertFormat, SynthSpec};
use serde_json::{json, Value};

use super::forward::{backend, load_model, parse_act, parse_kv, with_threads};

#[derive(clap::Args)]
pub struct Args {
    /// Requests, one JSON object per line.
    #[arg(long)]
    pub input: PathBuf,
    /// Results, one JSON object per line (input order).
    #[arg(long)]
    pub output: PathBuf,
    /// Checkpoint directory (default: the synthetic `tiny` checkpoint that
    /// `m3 generate` also uses, made once in the cache directory).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Most rows (tokens) per step: decode rows plus prefill chunks.
    #[arg(long, default_value_t = 256)]
    pub max_batch_tokens: usize,
    /// KV / index-cache blocks (capacity = blocks x block size positions).
    #[arg(long, default_value_t = 512)]
    pub kv_blocks: usize,
    /// Positions per KV block.
    #[arg(long, default_value_t = 16)]
    pub block_size: usize,
    /// Most sequences per step.
    #[arg(long, default_value_t = 64)]
    pub max_seqs: usize,
    /// Default `max_tokens` for lines that do not set it.
    #[arg(long, default_value_t = 64)]
    pub max_tokens: usize,
    /// Draft tokens verified per decode step (0 = no speculation; at most
    /// 7). Drafts come from the checkpoint's DSpark draft (`dspark/`), else
    /// from prompt lookup; the run says which.
    #[arg(long, default_value_t = 0)]
    pub spec_tokens: usize,
    /// Disable the prefix cache.
    #[arg(long)]
    pub no_prefix_cache: bool,
    /// Keep generating past the end-of-text token.
    #[arg(long)]
    pub ignore_eos: bool,
    /// KV and index cache dtype: bf16 or fp8_e4m3.
    #[arg(long, default_value = "bf16")]
    pub kv_dtype: String,
    /// Routed-expert activation mode: bf16 or mxfp4.
    #[arg(long, default_value = "bf16")]
    pub act: String,
    /// Backend: cpu.
    #[arg(long, default_value = "cpu")]
    pub backend: String,
    /// Threads for the CPU backend (0 = all cores).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
}

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

/// EOS ids from the checkpoint's config.json (`eos_token_id`, top level or
/// under `text_config`; a number or a list).
fn eos_ids(dir: &Path) -> Vec<u32> {
    let cfg: Value = std::fs::read_to_string(dir.join("config.json"))
        .ok()
        .and_then(|s| serde_json::from_str(&s).ok())
        .unwrap_or(Value::Null);
    match cfg
        .get("text_config")
        .and_then(|t| t.get("eos_token_id"))
        .or(cfg.get("eos_token_id"))
    {
        Some(Value::Number(n)) => n.as_u64().map(|v| v as u32).into_iter().collect(),
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(Value::as_u64)
            .map(|v| v as u32)
            .collect(),
        _ => Vec::new(),
    }
}

/// The synthetic `tiny` checkpoint shared with `m3 generate` (same cache
/// directory and name), made on first use.
fn default_model() -> Result<PathBuf> {
    let base = match std::env::var_os("XDG_CACHE_HOME").filter(|v| !v.is_empty()) {
        Some(x) => PathBuf::from(x).join("m3"),
        None => {
            let home = std::env::var_os("HOME")
                .ok_or_else(|| anyhow!("neither XDG_CACHE_HOME nor HOME is set; pass --model"))?;
            PathBuf::from(home).join(".cache").join("m3")
        }
    };
    let dir = base.join("synthetic-tiny-mxfp4-v1");
    if dir.join("config.json").is_file() {
        return Ok(dir);
    }
    std::fs::create_dir_all(&base).with_context(|| format!("creating {}", base.display()))?;
    let cfg = ModelConfig::preset("tiny").map_err(|e| anyhow!("preset tiny: {e}"))?;
    let mut spec = SynthSpec::new(cfg, ExpertFormat::Mxfp4, DenseFormat::Mxfp8);
    spec.draft = None;
    eprintln!(
        "making the synthetic tiny checkpoint in {} (once)",
        dir.display()
    );
    if let Err(e) = write_checkpoint(&spec, &dir) {
        if !dir.join("config.json").is_file() {
            return Err(anyhow!(
                "writing the synthetic checkpoint {}: {e}",
                dir.display()
            ));
        }
    }
    Ok(dir)
}

fn reason_str(r: FinishReason) -> &'static str {
    match r {
        FinishReason::Length => "length",
        FinishReason::Eos => "eos",
        FinishReason::Stop => "stop",
        FinishReason::Rejected => "rejected",
    }
}

/// Write `lines` to `path` through a temporary file in the same directory.
fn write_atomic(path: &Path, lines: &[String]) -> Result<()> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .ok_or_else(|| anyhow!("--output {} has no file name", path.display()))?;
    let tmp = dir.join(format!(
        ".{}.tmp-{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    let mut f =
        std::fs::File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    for l in lines {
        writeln!(f, "{l}").with_context(|| format!("writing {}", tmp.display()))?;
    }
    f.sync_all()
        .with_context(|| format!("writing {}", tmp.display()))?;
    drop(f);
    std::fs::rename(&tmp, path)
        .with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))?;
    Ok(())
}

pub fn run(args: Args) -> Result<()> {
    if args.spec_tokens > 7 {
        bail!("--spec-tokens {} is above 7 (MODEL.md 6)", args.spec_tokens);
    }
    let dtype = parse_kv(&args.kv_dtype)?;
    let act = parse_act(&args.act)?;
    let be = backend(&args.backend)?;
    let input = std::fs::read_to_string(&args.input)
        .with_context(|| format!("reading --input {}", args.input.display()))?;
    let dir = match &args.model {
        Some(d) => d.clone(),
        None => default_model()?,
    };
    let model = load_model(&dir)?;
    let vocab = model.config.vocab_size;
    let tok_path = dir.join("tokenizer.json");
    let tokenizer = if tok_path.is_file() {
        Some(
            tokenizers::Tokenizer::from_file(&tok_path)
                .map_err(|e| anyhow!("reading {}: {e}", tok_path.display()))?,
        )
    } else {
        None
    };
    let eos = if args.ignore_eos {
        Vec::new()
    } else {
        eos_ids(&dir)
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

    let cfg = SchedulerConfig {
        block_size: args.block_size,
        num_blocks: args.kv_blocks,
        max_batch_tokens: args.max_batch_tokens,
        max_seqs: args.max_seqs,
        enable_prefix_cache: !args.no_prefix_cache,
        ..SchedulerConfig::default()
    };
    let n_jobs = jobs.len();
    let draft = if args.spec_tokens > 0 {
        super::generate::load_draft(&dir, &model)?
    } else {
        None
    };
    let t0 = Instant::now();
    let (finished, counters, ran) = with_threads(args.threads, || -> Result<_> {
        let mut runner = SchedRunner::new(&*be, &model, cfg, dtype, RunOptions { act })
            .map_err(|e| anyhow!("{e}"))?;
        runner.spec_tokens = args.spec_tokens;
        if args.spec_tokens > 0 {
            let (d, name) = super::generate::make_drafter(&*be, &model, draft.as_ref())?;
            eprintln!(
                "speculative decoding: {} draft tokens, drafter {name}",
                args.spec_tokens
            );
            runner.drafter = Some(d);
        }
        for j in &jobs {
            runner
                .sched
                .add_request(j.req.clone())
                .map_err(|e| anyhow!("line {}: {e}", j.line))?;
        }
        let bar = ProgressBar::new(n_jobs as u64);
        bar.set_style(
            ProgressStyle::with_template("{bar:40} {pos}/{len} requests {elapsed} {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        let done = runner
            .run(|_, fin| bar.inc(fin.len() as u64))
            .map_err(|e| anyhow!("batch generation on {}: {e}", be.name()))?;
        bar.finish_and_clear();
        Ok((
            done,
            *runner.sched.counters(),
            (runner.ran_mono, runner.ran_standard),
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
                args.kv_blocks,
                args.block_size
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
                "error": format!("line {line}: prompt ({} tokens) + max_tokens does not fit the cache ({} blocks of {})", f.prompt_len, args.kv_blocks, args.block_size),
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
    write_atomic(&args.output, &lines)?;

    let errors = order.len() - n_jobs;
    let acc = counters
        .mean_acceptance_length()
        .map_or_else(|| "n/a".to_string(), |a| format!("{a:.2}"));
    println!(
        "{n_jobs} requests ({errors} bad lines) in {secs:.2} s: {:.2} requests/s, {:.1} output tokens/s, mean acceptance length {acc}, preemptions {}, prefix-cache hit tokens {}, prefill tokens {}, steps {} mono / {} standard planned ({} / {} run)",
        n_jobs as f64 / secs.max(1e-9),
        out_tokens as f64 / secs.max(1e-9),
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
