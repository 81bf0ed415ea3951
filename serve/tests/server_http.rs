//! The HTTP server end to end over a real socket, on a scripted model.
//!
//! The scripted runner is a `ModelRunner` whose every sequence generates the
//! same text (the synthetic byte-level tokenizer's encoding of `SCRIPT`),
//! then end-of-text: so the tests know exactly what the engine produced and
//! can check what the server made of it (reasoning split from content, a
//! tool call parsed, stop strings cut, SSE framing), plus the engine's
//! behaviour around it (abort on disconnect frees blocks, 429 past the
//! queue, API key, draining on shutdown).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use m3_core::backend::{BackendError, ModelRunner, StepInput, StepOutput};
use m3_core::config::ModelConfig;
use m3_core::kv::{CacheDtype, KvLayout};
use m3_core::sched::runner::SchedRunner;
use m3_core::sched::SchedulerConfig;
use m3_core::synth::tokenizer;
use m3_serve::engine::{run_engine, EngineHandle};
use m3_serve::metrics::Metrics;
use m3_serve::protocol::Limits;
use m3_serve::server::{router, AppState, GenDefaults, ServerConfig};
use m3_serve::ChatTemplate;
use serde_json::{json, Value};

/// What every sequence generates: reasoning, an answer, a tool call.
const SCRIPT: &str = "plan</think>Hi there!<minimax:tool_call>\n<invoke name=\"get_weather\">\n<parameter name=\"city\">Paris</parameter>\n<parameter name=\"days\">3</parameter>\n</invoke>\n</minimax:tool_call>";

/// A runner that emits `script` (then EOS) for every sequence, counting from
/// the sequence's first logits row; it sleeps `step_delay` per step so
/// requests stay in flight long enough to be observed.
struct Scripted {
    cfg: ModelConfig,
    script: Vec<u32>,
    eos: u32,
    pages: usize,
    step_delay: Duration,
    /// Position of each request's first logits row (its last prompt token).
    base: BTreeMap<u64, u32>,
    /// Logits rows read back so far (only logprobs requests should).
    rows_read: Arc<AtomicUsize>,
}

impl ModelRunner for Scripted {
    fn backend_name(&self) -> &str {
        "scripted"
    }
    fn config(&self) -> &ModelConfig {
        &self.cfg
    }
    fn kv_layout(&self) -> KvLayout {
        KvLayout {
            page_size: 16,
            num_pages: self.pages,
            dtype: CacheDtype::Bf16,
        }
    }
    fn step(&mut self, input: &StepInput<'_>) -> Result<StepOutput, BackendError> {
        std::thread::sleep(self.step_delay);
        let b = input.batch;
        let mut tokens = Vec::new();
        for &r in &b.logits_rows {
            let r = r as usize;
            let seq = &b.seqs[b.row_seq[r] as usize];
            let pos = b.positions[r];
            let base = *self.base.entry(seq.request_id).or_insert(pos);
            let k = (pos - base) as usize;
            tokens.push(self.script.get(k).copied().unwrap_or(self.eos));
        }
        let vocab = self.cfg.vocab_size;
        // Logits rows asked for: a peak at the emitted token.
        let mut logits = Vec::new();
        self.rows_read
            .fetch_add(input.read.logits.len(), Ordering::Relaxed);
        for &i in &input.read.logits {
            let mut row = vec![0.0f32; vocab];
            row[tokens[i as usize] as usize] = 5.0;
            logits.extend(row);
        }
        Ok(StepOutput {
            tokens,
            logits,
            taps: Default::default(),
        })
    }
    fn copy_blocks(&mut self, _pairs: &[(u32, u32)]) -> Result<(), BackendError> {
        Ok(())
    }
}

struct Server {
    base: String,
    rows_read: Arc<AtomicUsize>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    served: Option<tokio::task::JoinHandle<()>>,
    engine: Option<std::thread::JoinHandle<()>>,
    client: reqwest::Client,
}

struct Opts {
    max_seqs: usize,
    queue: usize,
    api_key: Option<String>,
    step_delay: Duration,
    pages: usize,
}

impl Default for Opts {
    fn default() -> Self {
        Opts {
            max_seqs: 8,
            queue: 8,
            api_key: None,
            step_delay: Duration::from_millis(1),
            pages: 256,
        }
    }
}

async fn start(o: Opts) -> Server {
    let cfg = ModelConfig::preset("tiny").unwrap();
    let vocab = cfg.vocab_size;
    let tk = tokenizers::Tokenizer::from_bytes(tokenizer::tokenizer_json(vocab).unwrap()).unwrap();
    let script = tk.encode(SCRIPT, false).unwrap().get_ids().to_vec();
    let eos = tokenizer::eos_token_id(vocab);
    let metrics = Arc::new(Metrics::default());
    let stopped = Arc::new(AtomicBool::new(false));
    let (tx, rx) = mpsc::channel();
    let rows_read = Arc::new(AtomicUsize::new(0));
    let engine = {
        let rows_read = Arc::clone(&rows_read);
        let (metrics, stopped) = (Arc::clone(&metrics), Arc::clone(&stopped));
        let (max_seqs, pages, delay) = (o.max_seqs, o.pages, o.step_delay);
        std::thread::spawn(move || {
            let mut runner = Scripted {
                cfg,
                script,
                eos,
                pages,
                step_delay: delay,
                base: BTreeMap::new(),
                rows_read,
            };
            let sc = SchedulerConfig {
                max_seqs,
                max_batch_tokens: 256,
                ..SchedulerConfig::default()
            };
            let mut sr = SchedRunner::new(&mut runner, sc).unwrap();
            run_engine(&mut sr, rx, &metrics, &stopped).unwrap();
        })
    };
    let handle = Arc::new(EngineHandle::new(
        tx,
        o.max_seqs + o.queue,
        Arc::clone(&metrics),
        stopped,
    ));
    let state = Arc::new(AppState {
        tags: m3_serve::Tags::default(),
        cfg: ServerConfig {
            served_model_name: "scripted".into(),
            limits: Limits {
                max_model_len: 1024,
                max_tokens_cap: 1024,
                vocab_size: vocab,
            },
            api_key: o.api_key,
            eos: vec![eos],
            defaults: GenDefaults::default(),
            created: 0,
        },
        tokenizer: Some(Arc::new(tk)),
        template: Some(ChatTemplate::builtin()),
        engine: handle,
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (stx, srx) = tokio::sync::oneshot::channel::<()>();
    let app = router(state);
    let served = tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async {
                let _ = srx.await;
            })
            .await
            .unwrap();
    });
    Server {
        base,
        rows_read,
        shutdown: Some(stx),
        served: Some(served),
        engine: Some(engine),
        client: reqwest::Client::new(),
    }
}

impl Server {
    async fn post(&self, path: &str, body: &str) -> (u16, Value) {
        let r = self
            .client
            .post(format!("{}{path}", self.base))
            .body(body.to_string())
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let text = r.text().await.unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    /// Every `data:` payload of an SSE response, in order.
    async fn sse(&self, path: &str, body: Value) -> Vec<String> {
        let r = self
            .client
            .post(format!("{}{path}", self.base))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 200);
        assert_eq!(
            r.headers()["content-type"].to_str().unwrap(),
            "text/event-stream"
        );
        let text = r.text().await.unwrap();
        sse_data(&text)
    }

    async fn metric(&self, name: &str) -> f64 {
        let text = self
            .client
            .get(format!("{}/metrics", self.base))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no metric {name} in\n{text}"))
    }

    async fn stop(mut self) {
        if let Some(s) = self.shutdown.take() {
            let _ = s.send(());
        }
        if let Some(j) = self.served.take() {
            j.await.unwrap();
        }
        // The router (and its engine handle) is gone: the engine returns.
        if let Some(e) = self.engine.take() {
            tokio::task::spawn_blocking(move || e.join().unwrap())
                .await
                .unwrap();
        }
    }
}

/// The `data:` payloads of an SSE body, checking the framing: every event
/// is `data: ...` followed by a blank line, and `[DONE]` is last.
fn sse_data(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for event in text.split("\n\n").filter(|e| !e.trim().is_empty()) {
        for line in event.lines() {
            if line.starts_with(':') {
                continue; // keep-alive comment
            }
            let d = line
                .strip_prefix("data: ")
                .unwrap_or_else(|| panic!("not an SSE data line: {line:?}"));
            out.push(d.to_string());
        }
    }
    assert!(
        text.ends_with("\n\n"),
        "SSE body must end with a blank line"
    );
    out
}

/// Check a stream's chunks (without `[DONE]`): all parse, one id.
fn chunks(data: &[String]) -> Vec<Value> {
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "{data:?}");
    assert_eq!(data.iter().filter(|d| *d == "[DONE]").count(), 1);
    let v: Vec<Value> = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    let id = &v[0]["id"];
    assert!(v.iter().all(|c| &c["id"] == id));
    v
}

const TOOLS: &str = r#"[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"},"days":{"type":"integer"}}}}}]"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_reasoning_content_and_tool_call() {
    let s = start(Opts::default()).await;
    let body = format!(
        r#"{{"model":"scripted","messages":[{{"role":"user","content":"weather?"}}],"tools":{TOOLS},"max_tokens":200,"temperature":0}}"#
    );
    let (st, v) = s.post("/v1/chat/completions", &body).await;
    assert_eq!(st, 200, "{v}");
    let m = &v["choices"][0]["message"];
    assert_eq!(m["reasoning_content"], "plan");
    assert_eq!(m["content"], "Hi there!");
    let call = &m["tool_calls"][0];
    assert_eq!(call["type"], "function");
    assert_eq!(call["function"]["name"], "get_weather");
    let args: Value =
        serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(args, json!({"city": "Paris", "days": 3}));
    assert_eq!(v["choices"][0]["finish_reason"], "tool_calls");
    let u = &v["usage"];
    assert_eq!(
        u["total_tokens"].as_u64().unwrap(),
        u["prompt_tokens"].as_u64().unwrap() + u["completion_tokens"].as_u64().unwrap()
    );

    // Streaming: the same split, no tag text anywhere, usage last.
    let body: Value = json!({
        "messages": [{"role": "user", "content": "weather?"}],
        "tools": serde_json::from_str::<Value>(TOOLS).unwrap(),
        "max_tokens": 200, "temperature": 0, "stream": true,
        "stream_options": {"include_usage": true},
    });
    let data = s.sse("/v1/chat/completions", body).await;
    let c = chunks(&data);
    assert_eq!(c[0]["object"], "chat.completion.chunk");
    assert_eq!(c[0]["choices"][0]["delta"]["role"], "assistant");
    let (mut reasoning, mut content, mut calls) = (String::new(), String::new(), Vec::new());
    for ch in &c {
        for choice in ch["choices"].as_array().unwrap() {
            let d = &choice["delta"];
            reasoning.push_str(d["reasoning_content"].as_str().unwrap_or(""));
            content.push_str(d["content"].as_str().unwrap_or(""));
            if let Some(tc) = d["tool_calls"].as_array() {
                calls.extend(tc.iter().cloned());
            }
        }
    }
    assert_eq!(reasoning, "plan");
    assert_eq!(content, "Hi there!");
    assert!(!content.contains('<') && !reasoning.contains('<'));
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0]["function"]["name"], "get_weather");
    let n = c.len();
    assert_eq!(c[n - 2]["choices"][0]["finish_reason"], "tool_calls");
    assert_eq!(c[n - 1]["choices"], json!([]));
    assert_eq!(
        c[n - 1]["usage"]["completion_tokens"],
        v["usage"]["completion_tokens"]
    );
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_stop_logprobs_and_token_ids() {
    let s = start(Opts::default()).await;
    // The raw text, up to EOS.
    let (st, v) = s
        .post(
            "/v1/completions",
            r#"{"prompt":"abc","max_tokens":300,"temperature":0,"return_token_ids":true}"#,
        )
        .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["choices"][0]["text"], SCRIPT);
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    let ids = v["choices"][0]["token_ids"].as_array().unwrap().len();
    // The script's tokens plus the EOS that ended it.
    assert_eq!(
        v["usage"]["completion_tokens"].as_u64().unwrap() as usize,
        ids
    );
    // No logits were read back for requests without logprobs.
    assert_eq!(s.rows_read.load(Ordering::Relaxed), 0);
    // A stop string cuts the text right before it (matched on text) and
    // ends the request early.
    let (_, v) = s
        .post(
            "/v1/completions",
            r#"{"prompt":"abc","max_tokens":300,"temperature":0,"stop":["there"],"logprobs":2}"#,
        )
        .await;
    assert_eq!(v["choices"][0]["text"], "plan</think>Hi ");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    let lp = &v["choices"][0]["logprobs"];
    let n = v["usage"]["completion_tokens"].as_u64().unwrap() as usize;
    assert!(n < ids, "the stop string did not end the request early");
    assert_eq!(lp["tokens"].as_array().unwrap().len(), n);
    assert_eq!(lp["top_logprobs"][0].as_object().unwrap().len(), 2);
    assert!(lp["token_logprobs"][0].as_f64().unwrap() < 0.0);
    // One row per token of the logprobs request (and no more).
    assert!(s.rows_read.load(Ordering::Relaxed) >= n);
    // max_tokens: finish_reason length.
    let (_, v) = s
        .post("/v1/completions", r#"{"prompt":[5,6,7],"max_tokens":3}"#)
        .await;
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(
        v["usage"],
        json!({"prompt_tokens":3,"completion_tokens":3,"total_tokens":6,
               "prompt_tokens_details":{"cached_tokens":0}})
    );
    // The same long prompt twice: the second is served from the prefix
    // cache, and usage says how much of it.
    let long = json!({"prompt": (0..40).collect::<Vec<u32>>(), "max_tokens": 2}).to_string();
    let (_, first) = s.post("/v1/completions", &long).await;
    let (_, again) = s.post("/v1/completions", &long).await;
    assert_eq!(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    assert_eq!(again["usage"]["prompt_tokens_details"]["cached_tokens"], 32);
    // Streaming completions: text chunks concatenate to the full text.
    let data = s
        .sse(
            "/v1/completions",
            json!({"prompt":"abc","max_tokens":300,"stream":true}),
        )
        .await;
    let c = chunks(&data);
    let text: String = c
        .iter()
        .map(|ch| ch["choices"][0]["text"].as_str().unwrap_or("").to_string())
        .collect();
    assert_eq!(text, SCRIPT);
    assert!(
        c.iter().all(|ch| ch.get("usage").is_none()),
        "no include_usage"
    );
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_name_the_field_and_change_nothing() {
    let s = start(Opts::default()).await;
    let long: Vec<u32> = (0..1100).map(|i| i % 200).collect();
    let cases: Vec<(&str, String, u16, &str)> = vec![
        ("/v1/completions", "{not json".into(), 400, "body"),
        ("/v1/completions", "[1,2]".into(), 400, "body"),
        (
            "/v1/completions",
            r#"{"prompt":"a","max_tokens":0}"#.into(),
            400,
            "max_tokens",
        ),
        (
            "/v1/completions",
            r#"{"prompt":"a","max_tokens":100000000}"#.into(),
            400,
            "max_tokens",
        ),
        (
            "/v1/completions",
            r#"{"prompt":"a","max_tokens":"5"}"#.into(),
            400,
            "max_tokens",
        ),
        (
            "/v1/completions",
            r#"{"prompt":"a","temperature":"hot"}"#.into(),
            400,
            "temperature",
        ),
        (
            "/v1/completions",
            json!({"prompt": long}).to_string(),
            400,
            "prompt",
        ),
        (
            "/v1/completions",
            r#"{"prompt":"a","n":9}"#.into(),
            400,
            "n",
        ),
        (
            "/v1/completions",
            r#"{"prompt":[999999]}"#.into(),
            400,
            "prompt",
        ),
        (
            "/v1/completions",
            r#"{"prompt":"a","model":"other"}"#.into(),
            404,
            "model",
        ),
        (
            "/v1/chat/completions",
            r#"{"messages":"hi"}"#.into(),
            400,
            "messages",
        ),
        (
            "/v1/chat/completions",
            r#"{"messages":[{"role":"robot","content":"x"}]}"#.into(),
            400,
            "messages[0].role",
        ),
        (
            "/v1/chat/completions",
            r#"{"messages":[{"role":"user","content":"x"}],"tool_choice":"required"}"#.into(),
            400,
            "tool_choice",
        ),
    ];
    for (path, body, status, field) in cases {
        let (st, v) = s.post(path, &body).await;
        assert_eq!(st, status, "{body}: {v}");
        assert_eq!(v["error"]["param"], field, "{body}: {v}");
        assert!(v["error"]["message"].as_str().is_some());
    }
    // The server is still fine.
    let (st, v) = s
        .post("/v1/completions", r#"{"prompt":"a","max_tokens":2}"#)
        .await;
    assert_eq!(st, 200, "{v}");
    let r = s
        .client
        .get(format!("{}/health", s.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let r = s
        .client
        .get(format!("{}/v1/nothing", s.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 404);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_key_guards_v1_only() {
    let s = start(Opts {
        api_key: Some("sekret".into()),
        ..Opts::default()
    })
    .await;
    let url = format!("{}/v1/models", s.base);
    assert_eq!(
        s.client.get(&url).send().await.unwrap().status().as_u16(),
        401
    );
    let wrong = s
        .client
        .get(&url)
        .bearer_auth("sekreT")
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status().as_u16(), 401);
    let ok = s
        .client
        .get(&url)
        .bearer_auth("sekret")
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status().as_u16(), 200);
    let v: Value = ok.json().await.unwrap();
    assert_eq!(v["data"][0]["id"], "scripted");
    let (st, _) = s.post("/v1/completions", r#"{"prompt":"a"}"#).await;
    assert_eq!(st, 401);
    for open in ["/health", "/metrics"] {
        let r = s
            .client
            .get(format!("{}{open}", s.base))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 200, "{open}");
    }
    s.stop().await;
}

/// Open a streaming completion and wait for its first chunk; returns the
/// open response.
async fn open_stream(s: &Server, max_tokens: usize) -> reqwest::Response {
    let mut r = s
        .client
        .post(format!("{}/v1/completions", s.base))
        .json(
            &json!({"prompt":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20],
                      "max_tokens": max_tokens, "stream": true, "ignore_eos": true}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let first = r.chunk().await.unwrap().unwrap();
    assert!(first.starts_with(b"data: "));
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disconnect_aborts_and_frees_blocks() {
    let s = start(Opts {
        step_delay: Duration::from_millis(5),
        ..Opts::default()
    })
    .await;
    let r = open_stream(&s, 400).await;
    assert!(s.metric("m3_kv_blocks_used").await > 0.0);
    drop(r); // the client goes away mid-stream
    let t0 = Instant::now();
    while s.metric("m3_requests_aborted_total").await < 1.0 {
        assert!(t0.elapsed() < Duration::from_secs(10), "no abort seen");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(s.metric("m3_kv_blocks_used").await, 0.0);
    assert_eq!(s.metric("m3_num_requests_running").await, 0.0);
    assert_eq!(s.metric("m3_requests_finished_total").await, 0.0);
    // A non-streaming request whose client gives up is aborted too.
    let c = reqwest::Client::builder()
        .timeout(Duration::from_millis(100))
        .build()
        .unwrap();
    let e = c
        .post(format!("{}/v1/completions", s.base))
        .body(r#"{"prompt":"abc","max_tokens":400,"ignore_eos":true}"#)
        .send()
        .await;
    assert!(e.is_err(), "expected the client timeout");
    while s.metric("m3_requests_aborted_total").await < 2.0 {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "no second abort seen"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(s.metric("m3_kv_blocks_used").await, 0.0);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_overflow_is_429_and_shutdown_drains() {
    let s = start(Opts {
        max_seqs: 1,
        queue: 1,
        step_delay: Duration::from_millis(5),
        ..Opts::default()
    })
    .await;
    // One running, one queued: the third is refused.
    let a = open_stream(&s, 60).await;
    let b_req = s
        .client
        .post(format!("{}/v1/completions", s.base))
        .body(r#"{"prompt":"abc","max_tokens":5,"ignore_eos":true}"#)
        .send();
    let b = tokio::spawn(b_req);
    let t0 = Instant::now();
    while s.metric("m3_requests_in_flight").await < 2.0 {
        assert!(t0.elapsed() < Duration::from_secs(10));
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (st, v) = s
        .post("/v1/completions", r#"{"prompt":"abc","max_tokens":5}"#)
        .await;
    assert_eq!(st, 429, "{v}");
    assert_eq!(v["error"]["type"], "rate_limit_error");
    // Shut down while `a` streams and `b` waits: both complete.
    let Server {
        shutdown,
        served,
        engine,
        ..
    } = s;
    let _ = shutdown.unwrap().send(());
    let text = a.text().await.unwrap();
    let data = sse_data(&text);
    let c = chunks(&data);
    assert_eq!(
        c.last().unwrap()["choices"][0]["finish_reason"],
        "length",
        "the stream was cut"
    );
    let b = b.await.unwrap().unwrap();
    assert_eq!(b.status().as_u16(), 200);
    let v: Value = b.json().await.unwrap();
    assert_eq!(v["usage"]["completion_tokens"], 5);
    served.unwrap().await.unwrap();
    let e = engine.unwrap();
    tokio::task::spawn_blocking(move || e.join().unwrap())
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n_choices() {
    let s = start(Opts::default()).await;
    let (st, v) = s
        .post(
            "/v1/completions",
            r#"{"prompt":"abc","max_tokens":300,"n":3}"#,
        )
        .await;
    assert_eq!(st, 200, "{v}");
    let ch = v["choices"].as_array().unwrap();
    assert_eq!(ch.len(), 3);
    for (i, c) in ch.iter().enumerate() {
        assert_eq!(c["index"], i);
        assert_eq!(c["text"], SCRIPT);
    }
    let one = s
        .post("/v1/completions", r#"{"prompt":"abc","max_tokens":300}"#)
        .await
        .1;
    let per = one["usage"]["completion_tokens"].as_u64().unwrap();
    assert_eq!(v["usage"]["completion_tokens"].as_u64().unwrap(), 3 * per);
    assert_eq!(v["usage"]["prompt_tokens"], one["usage"]["prompt_tokens"]);
    // Streaming chat with n = 2: each choice gets its role chunk, its
    // reasoning, content and tool call, and its own finish.
    let data = s
        .sse(
            "/v1/chat/completions",
            json!({"messages":[{"role":"user","content":"x"}],"n":2,"stream":true,
                   "max_tokens":300,"stream_options":{"include_usage":true}}),
        )
        .await;
    let c = chunks(&data);
    for i in 0..2 {
        let mine: Vec<&Value> = c
            .iter()
            .filter_map(|ch| ch["choices"].as_array()?.iter().find(|x| x["index"] == i))
            .collect();
        assert_eq!(mine[0]["delta"]["role"], "assistant");
        let content: String = mine
            .iter()
            .map(|x| x["delta"]["content"].as_str().unwrap_or(""))
            .collect();
        let reasoning: String = mine
            .iter()
            .map(|x| x["delta"]["reasoning_content"].as_str().unwrap_or(""))
            .collect();
        assert_eq!(
            (content.as_str(), reasoning.as_str()),
            ("Hi there!", "plan")
        );
        let fins: Vec<&Value> = mine.iter().filter_map(|x| x.get("finish_reason")).collect();
        assert_eq!(fins, [&json!("tool_calls")], "choice {i}");
    }
    assert!(
        c.last().unwrap()["usage"]["completion_tokens"]
            .as_u64()
            .unwrap()
            > 0
    );
    s.stop().await;
}

/// Many streams at once, half of them dropped at different points: the
/// others all complete with the full text, and once everything is over no
/// block is held and nothing is running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn churn_of_disconnects_leaves_no_blocks() {
    let s = start(Opts {
        step_delay: Duration::from_millis(2),
        ..Opts::default()
    })
    .await;
    let base = s.base.clone();
    let mut tasks = Vec::new();
    for i in 0..16usize {
        let (c, base) = (s.client.clone(), base.clone());
        tasks.push(tokio::spawn(async move {
            let mut r = c
                .post(format!("{base}/v1/completions"))
                .json(&json!({"prompt": format!("request {i}"), "max_tokens": 300, "stream": true}))
                .send()
                .await
                .unwrap();
            let mut body = String::new();
            let mut chunks = 0;
            while let Some(ch) = r.chunk().await.unwrap() {
                body.push_str(&String::from_utf8_lossy(&ch));
                chunks += 1;
                if i % 2 == 1 && chunks == i {
                    return None; // disconnect after `i` chunks
                }
            }
            Some(body)
        }));
    }
    let mut completed = 0;
    for t in tasks {
        if let Some(body) = t.await.unwrap() {
            let c = chunks(&sse_data(&body));
            let text: String = c
                .iter()
                .map(|ch| ch["choices"][0]["text"].as_str().unwrap_or("").to_string())
                .collect();
            assert_eq!(text, SCRIPT);
            completed += 1;
        }
    }
    assert_eq!(completed, 8);
    let t0 = Instant::now();
    while s.metric("m3_num_requests_running").await > 0.0
        || s.metric("m3_kv_blocks_used").await > 0.0
    {
        assert!(t0.elapsed() < Duration::from_secs(10), "blocks still held");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(s.metric("m3_requests_finished_total").await, 8.0);
    s.stop().await;
}
