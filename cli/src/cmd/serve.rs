//! `m3 serve`: an OpenAI-compatible HTTP server (`m3_serve::server`) over
//! one engine thread that owns the loaded model and runs the same scheduler
//! loop as `m3 batch` (`m3_serve::engine`).
//!
//! Threads: the engine thread (a scoped thread: it borrows the backend and
//! the checkpoint, loads the model itself, and keeps the runner to the end,
//! since a device runner may not move between threads) and a tokio runtime
//! for HTTP. SIGINT / SIGTERM stop accepting connections, let in-flight
//! requests finish (streams included), stop the engine and exit 0.
//!
//! Without `--model` it serves the synthetic `tiny` checkpoint, whose
//! tokenizer_config.json carries a MiniMax-style chat template.

use std::net::SocketAddr;
use std::sync::atomic::AtomicBool;
use std::sync::{mpsc, Arc};
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, bail, Context, Result};
use m3_core::checkpoint::Checkpoint;
use m3_core::sched::runner::SchedRunner;
use m3_core::sched::SchedulerConfig;
use m3_serve::engine::{run_engine, EngineHandle};
use m3_serve::metrics::Metrics;
use m3_serve::protocol::Limits;
use m3_serve::server::{self, AppState, GenDefaults, ServerConfig};
use m3_serve::ChatTemplate;
use m3_serve::Tags;

use crate::args::{self, EngineArgs, ModelArgs, SchedArgs};
use crate::drafting;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub engine: EngineArgs,
    #[command(flatten)]
    pub sched: SchedArgs,
    /// Address to bind (loopback unless told otherwise).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// TCP port (0: any free port; the bound address is printed).
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// The model name of `/v1/models` and of requests' `model` field
    /// (default: the checkpoint directory's name).
    #[arg(long)]
    pub served_model_name: Option<String>,
    /// Require `Authorization: Bearer KEY` on `/v1/*` (`/health` and
    /// `/metrics` stay open).
    #[arg(long)]
    pub api_key: Option<String>,
    /// A Jinja chat template file to use instead of the checkpoint's
    /// (vLLM's flag); its `bos_token` / `eos_token` come from the
    /// checkpoint's tokenizer_config.json when it has one.
    #[arg(long)]
    pub chat_template: Option<std::path::PathBuf>,
    /// Requests waiting beyond the `--max-num-seqs` running ones before new
    /// ones get 429.
    #[arg(long, default_value_t = 256)]
    pub max_queue: usize,
}

/// KV blocks on the CPU when `--kv-blocks` is not given: room for two
/// sequences at the full context, and at least 1024 blocks (on the CPU
/// reference each block is small; more sequences than fit run by
/// preemption and recompute).
fn host_blocks(e: &EngineArgs) -> usize {
    (2 * e.max_context.div_ceil(e.block_size.max(1))).max(1024)
}

/// The chat template: the checkpoint's `tokenizer_config.json`, else the
/// built-in MiniMax-style one (said on stderr).
fn chat_template(ck: &Checkpoint) -> Result<Option<ChatTemplate>> {
    let p = ck.dir().join("tokenizer_config.json");
    if !p.is_file() {
        eprintln!(
            "info: {} has no tokenizer_config.json: chat uses the built-in MiniMax-style template",
            ck.dir().display()
        );
        return Ok(Some(ChatTemplate::builtin()));
    }
    let text = std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?;
    match ChatTemplate::from_tokenizer_config(&text, &p.display().to_string()) {
        Ok(t) => Ok(Some(t)),
        Err(m3_serve::TemplateError::MissingTemplate { .. }) => {
            eprintln!(
                "info: {} has no chat_template: /v1/chat/completions answers 400",
                p.display()
            );
            Ok(None)
        }
        Err(e) => Err(anyhow!("{e}")),
    }
}

/// End-of-text ids: config.json's, generation_config.json's and the
/// tokenizer config's `eos_token`.
fn eos_ids(
    ck: &Checkpoint,
    tk: Option<&tokenizers::Tokenizer>,
    t: Option<&ChatTemplate>,
) -> Vec<u32> {
    let mut ids = args::eos_ids(ck);
    if let Ok(text) = std::fs::read_to_string(ck.dir().join("generation_config.json")) {
        if let Ok(v) = serde_json::from_str::<serde_json::Value>(&text) {
            match v.get("eos_token_id") {
                Some(serde_json::Value::Number(n)) => ids.extend(n.as_u64().map(|x| x as u32)),
                Some(serde_json::Value::Array(a)) => {
                    ids.extend(a.iter().filter_map(|x| x.as_u64()).map(|x| x as u32))
                }
                _ => {}
            }
        }
    }
    if let (Some(tk), Some(e)) = (tk, t.and_then(ChatTemplate::eos_token)) {
        ids.extend(tk.token_to_id(e));
    }
    ids.sort_unstable();
    ids.dedup();
    ids
}

pub fn run(a: Args) -> Result<()> {
    a.sched.check()?;
    if a.max_queue == 0 {
        bail!("--max-queue must be at least 1");
    }
    let be = a.engine.open_backend()?;
    let ck = a.model.open()?;
    let vocab = ck.config().vocab_size;
    let tokenizer = args::tokenizer(ck.dir())?.map(Arc::new);
    // tag spellings: the tokenizer's added tokens where it defines them
    let tags = match &tokenizer {
        Some(tk) => {
            let added = tk.get_added_tokens_decoder();
            let (tags, notes) = Tags::from_added_tokens(added.values().map(|t| t.content.as_str()));
            for n in notes {
                eprintln!("info: tags: {n}");
            }
            tags
        }
        None => Tags::default(),
    };
    let template = match &a.chat_template {
        None => chat_template(&ck)?,
        Some(p) => {
            let text = std::fs::read_to_string(p)
                .with_context(|| format!("reading --chat-template {}", p.display()))?;
            let base = chat_template(&ck).ok().flatten();
            let bos = base
                .as_ref()
                .and_then(|t| t.bos_token().map(str::to_string));
            let eos = base
                .as_ref()
                .and_then(|t| t.eos_token().map(str::to_string));
            Some(
                ChatTemplate::from_template(&text, bos, eos, &p.display().to_string())
                    .map_err(|e| anyhow!("--chat-template: {e}"))?,
            )
        }
    };
    let eos = eos_ids(&ck, tokenizer.as_deref(), template.as_ref());
    let defaults = std::fs::read_to_string(ck.dir().join("generation_config.json"))
        .map(|t| GenDefaults::from_generation_config(&t))
        .unwrap_or_default();
    let name = a.served_model_name.clone().unwrap_or_else(|| {
        ck.dir()
            .file_name()
            .map_or_else(|| "m3".into(), |n| n.to_string_lossy().into_owned())
    });
    let addr: SocketAddr = format!("{}:{}", a.host, a.port)
        .parse()
        .with_context(|| format!("--host {} --port {}: not an address", a.host, a.port))?;
    let e = &a.engine;
    let spec = e.load_spec(args::is_gpu(&*be), host_blocks(e), &a.model);
    let cfg = SchedulerConfig {
        max_batch_tokens: e.max_batch_tokens,
        max_seqs: e.max_seqs,
        enable_prefix_cache: a.sched.prefix_cache(),
        ..SchedulerConfig::default()
    };
    let draft = if a.sched.spec_tokens > 0 {
        drafting::load_draft(&ck, a.sched.draft)?
    } else {
        None
    };
    let metrics = Arc::new(Metrics::default());
    let stopped = Arc::new(AtomicBool::new(false));
    let (cmd_tx, cmd_rx) = mpsc::channel();
    let (ready_tx, ready_rx) = mpsc::channel::<Result<(usize, usize)>>();

    std::thread::scope(|scope| -> Result<()> {
        let engine = {
            let (be, ck, metrics, stopped) = (&be, &ck, Arc::clone(&metrics), Arc::clone(&stopped));
            let (spec, draft, sched) = (&spec, draft.as_ref(), &a.sched);
            let model = &a.model;
            std::thread::Builder::new()
                .name("m3-engine".into())
                .spawn_scoped(scope, move || -> Result<()> {
                    args::with_threads(e.threads, move || -> Result<()> {
                        let setup = || -> Result<_> {
                            let runner = args::load_runner(&**be, ck, model.load_options(), spec)?;
                            Ok(runner)
                        };
                        let mut runner = match setup() {
                            Ok(r) => r,
                            Err(err) => {
                                let _ = ready_tx.send(Err(err));
                                stopped.store(true, std::sync::atomic::Ordering::Release);
                                return Ok(());
                            }
                        };
                        let layout = runner.kv_layout();
                        let drafter = if sched.spec_tokens > 0 {
                            Some(drafting::make_drafter(&**be, &*runner, ck, draft)?)
                        } else {
                            None
                        };
                        let mut sr =
                            SchedRunner::new(&mut *runner, cfg).map_err(|e| anyhow!("{e}"))?;
                        if let Some((d, dname)) = drafter {
                            eprintln!(
                                "speculative decoding: {} draft tokens, drafter {dname}",
                                sched.spec_tokens
                            );
                            sr.drafter = Some(d);
                            sr.spec_tokens = sched.spec_tokens;
                            sr.verify = sched.verify.into();
                        }
                        let _ = ready_tx.send(Ok((layout.num_pages, layout.page_size)));
                        run_engine(&mut sr, cmd_rx, &metrics, &stopped)
                            .map_err(|e| anyhow!("engine on {}: {e}", be.name()))
                    })?
                })
                .context("starting the engine thread")?
        };
        let (pages, page_size) = match ready_rx.recv() {
            Ok(Ok(x)) => x,
            Ok(Err(err)) => {
                let _ = engine.join();
                return Err(err);
            }
            Err(_) => {
                return match engine.join() {
                    Ok(r) => r.and(Err(anyhow!("the engine thread stopped while loading"))),
                    Err(_) => Err(anyhow!("the engine thread panicked while loading")),
                }
            }
        };
        let capacity = pages * page_size;
        let max_model_len = e.max_context;
        if capacity < max_model_len {
            drop(cmd_tx);
            let _ = engine.join();
            bail!(
                "the KV cache holds {capacity} positions ({pages} blocks of {page_size}), less than --max-model-len {max_model_len}: raise --kv-blocks or lower --max-model-len"
            );
        }
        let handle = Arc::new(EngineHandle::new(
            cmd_tx,
            e.max_seqs + a.max_queue,
            Arc::clone(&metrics),
            Arc::clone(&stopped),
        ));
        let state = Arc::new(AppState {
            tags: tags.clone(),
            cfg: ServerConfig {
                served_model_name: name.clone(),
                limits: Limits {
                    max_model_len,
                    max_tokens_cap: max_model_len,
                    vocab_size: vocab,
                },
                api_key: a.api_key.clone(),
                eos,
                defaults,
                created: SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs()),
            },
            tokenizer: tokenizer.clone(),
            template: template.clone(),
            engine: Arc::clone(&handle),
        });
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .context("starting the tokio runtime")?;
        let served = rt.block_on(async {
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("binding {addr}"))?;
            let local = listener.local_addr().context("reading the bound address")?;
            eprintln!(
                "serving `{name}` on http://{local} (max-model-len {max_model_len}, max-num-seqs {}, queue {}){}",
                e.max_seqs,
                a.max_queue,
                if a.api_key.is_some() { ", API key required" } else { "" }
            );
            // Stop on a signal, or when the engine thread has ended (a
            // backend error): then the process exits with that error.
            let engine_down = {
                let stopped = Arc::clone(&stopped);
                async move {
                    while !stopped.load(std::sync::atomic::Ordering::Acquire) {
                        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                    }
                }
            };
            axum::serve(listener, server::router(state))
                .with_graceful_shutdown(async move {
                    tokio::select! {
                        _ = server::shutdown_signal() => {}
                        _ = engine_down => eprintln!("the engine stopped: shutting the server down"),
                    }
                })
                .await
                .context("serving HTTP")
        });
        eprintln!("shutting down: in-flight requests done, stopping the engine");
        handle.shutdown();
        drop(handle);
        rt.shutdown_background();
        let engine_result = engine
            .join()
            .map_err(|_| anyhow!("the engine thread panicked"))?;
        served?;
        engine_result
    })
}
