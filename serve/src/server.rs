//! The OpenAI-compatible HTTP server (axum on tokio) in front of the
//! engine thread ([`crate::engine`]).
//!
//! Who owns what:
//! - the **engine thread** owns the loaded model and the scheduler; it sees
//!   token ids only;
//! - an **HTTP handler** owns its request's text side: it validates the body
//!   ([`crate::protocol`], every 400 names its field), renders the chat
//!   template, tokenizes, submits token ids, then turns the engine's token
//!   events into text with an [`IncrementalDetokenizer`], a [`StopMatcher`]
//!   and (chat) an [`OutputParser`] for reasoning and tool calls. Stop
//!   strings are matched here, on text; on a match the handler drops its
//!   receiver, which the engine sees as an abort (as it does a client that
//!   disconnects).
//!
//! Endpoints: `GET /v1/models`, `POST /v1/completions`,
//! `POST /v1/chat/completions` (behind `--api-key` when set), `GET /health`,
//! `GET /metrics` (Prometheus text).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::{Request as HttpRequest, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use m3_core::sched::{FinishReason as CoreFinish, Request, SamplingParams};
use serde_json::{json, Map, Value};
use subtle::ConstantTimeEq;
use tokio::sync::mpsc;
use tokio_stream::wrappers::{ReceiverStream, UnboundedReceiverStream};
use tokio_stream::{StreamExt as _, StreamMap};

use crate::engine::{EngineEvent, EngineHandle, OwnedSlot, Submission, SubmitError, TokenLogprob};
use crate::parser::{Event, OutputParser};
use crate::protocol::{
    self, ChatChoice, ChatCompletionChunk, ChatCompletionResponse, ChunkChoice, CompletionChoice,
    CompletionResponse, Delta, FinishReason, FunctionCallDelta, GenParams, Limits, Prompt,
    RequestError, ResponseMessage, ResponseToolCall, ToolCallDelta, Usage,
};
use crate::schema::ToolSchemas;
use crate::stop::StopMatcher;
use crate::tags::{ParserOptions, Tags};
use crate::template::starts_in_reasoning_with;
use crate::template::ChatTemplate;
use crate::IncrementalDetokenizer;

/// Sampling defaults from the checkpoint's `generation_config.json`, used
/// for fields a request leaves out.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct GenDefaults {
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<usize>,
}

impl GenDefaults {
    /// `temperature`, `top_p`, `top_k` of a `generation_config.json` text
    /// (absent or mistyped fields are ignored: they are only defaults).
    pub fn from_generation_config(text: &str) -> Self {
        let v: Value = serde_json::from_str(text).unwrap_or(Value::Null);
        GenDefaults {
            temperature: v
                .get("temperature")
                .and_then(Value::as_f64)
                .map(|x| x as f32),
            top_p: v.get("top_p").and_then(Value::as_f64).map(|x| x as f32),
            top_k: v.get("top_k").and_then(Value::as_u64).map(|x| x as usize),
        }
    }
}

/// Server settings.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// The model name clients send and `/v1/models` lists.
    pub served_model_name: String,
    pub limits: Limits,
    /// `Authorization: Bearer <key>` required on `/v1/*` when set.
    pub api_key: Option<String>,
    /// Token ids that end generation (unless a request sets `ignore_eos`).
    pub eos: Vec<u32>,
    pub defaults: GenDefaults,
    /// Unix time the server started (`created` of `/v1/models`).
    pub created: u64,
}

/// A detokenizer's decode function.
type DecodeFn = Arc<dyn Fn(&[u32]) -> String + Send + Sync>;
/// The same, boxed (what [`IncrementalDetokenizer`] takes).
type BoxedDecode = Box<dyn Fn(&[u32]) -> String + Send + Sync>;

/// Everything a handler needs.
pub struct AppState {
    pub cfg: ServerConfig,
    pub tokenizer: Option<Arc<tokenizers::Tokenizer>>,
    /// The chat template (`None`: chat requests get a 400 saying so).
    pub template: Option<ChatTemplate>,
    /// The reasoning / tool-call tag spellings (the checkpoint's where its
    /// tokenizer defines them: [`Tags::from_added_tokens`]).
    pub tags: Tags,
    pub engine: Arc<EngineHandle>,
}

impl AppState {
    /// Text of `ids` (special tokens skipped); ids without a tokenizer are
    /// printed as `<id>`.
    fn decoder(&self) -> DecodeFn {
        match &self.tokenizer {
            Some(tk) => {
                let tk = Arc::clone(tk);
                Arc::new(move |ids: &[u32]| tk.decode(ids, true).unwrap_or_default())
            }
            None => Arc::new(|ids: &[u32]| ids.iter().map(|i| format!("<{i}>")).collect()),
        }
    }

    /// One token's text for logprobs (special tokens kept).
    fn token_text(&self, id: u32) -> String {
        self.tokenizer
            .as_ref()
            .and_then(|tk| tk.decode(&[id], false).ok())
            .unwrap_or_else(|| format!("<{id}>"))
    }
}

/// The router with every endpoint.
pub fn router(state: Arc<AppState>) -> Router {
    let v1 = Router::new()
        .route("/v1/models", get(models))
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .route_layer(middleware::from_fn_with_state(Arc::clone(&state), auth));
    Router::new()
        .merge(v1)
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .with_state(state)
}

/// Resolves on SIGINT or SIGTERM (what `m3 serve` drains on).
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}

// ------------------------------------------------------------------ errors

/// An error answer: status and OpenAI-shaped JSON body.
struct ApiError {
    status: StatusCode,
    body: Value,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(self.body)).into_response()
    }
}

fn error_response(
    status: StatusCode,
    kind: &str,
    message: String,
    param: Option<&str>,
) -> ApiError {
    ApiError {
        status,
        body: json!({"error": {"message": message, "type": kind, "param": param, "code": status.as_u16()}}),
    }
}

fn bad_request(e: RequestError) -> ApiError {
    ApiError {
        status: StatusCode::BAD_REQUEST,
        body: e.to_json(),
    }
}

fn submit_error(e: SubmitError) -> ApiError {
    match e {
        SubmitError::Full(_) => error_response(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limit_error",
            e.to_string(),
            None,
        ),
        SubmitError::Stopped => error_response(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            e.to_string(),
            None,
        ),
    }
}

async fn not_found() -> Response {
    error_response(
        StatusCode::NOT_FOUND,
        "not_found_error",
        "no such endpoint".into(),
        None,
    )
    .into_response()
}

async fn auth(State(st): State<Arc<AppState>>, req: HttpRequest, next: Next) -> Response {
    if let Some(key) = &st.cfg.api_key {
        let ok = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|s| s.strip_prefix("Bearer "))
            .is_some_and(|given| bool::from(given.as_bytes().ct_eq(key.as_bytes())));
        if !ok {
            return error_response(
                StatusCode::UNAUTHORIZED,
                "authentication_error",
                "missing or wrong API key (Authorization: Bearer <key>)".into(),
                None,
            )
            .into_response();
        }
    }
    next.run(req).await
}

// --------------------------------------------------------- small endpoints

async fn health(State(st): State<Arc<AppState>>) -> Response {
    if st.engine.is_running() {
        (StatusCode::OK, Json(json!({"status": "ok"}))).into_response()
    } else {
        error_response(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            "the engine is not running".into(),
            None,
        )
        .into_response()
    }
}

async fn metrics(State(st): State<Arc<AppState>>) -> Response {
    let mut r = st.engine.metrics.render();
    r.push_str(&format!(
        "# HELP m3_requests_in_flight Requests admitted by the HTTP side and not yet done.\n# TYPE m3_requests_in_flight gauge\nm3_requests_in_flight {}\n",
        st.engine.in_flight()
    ));
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4"),
        )],
        r,
    )
        .into_response()
}

async fn models(State(st): State<Arc<AppState>>) -> Response {
    Json(json!({
        "object": "list",
        "data": [{
            "id": st.cfg.served_model_name,
            "object": "model",
            "created": st.cfg.created,
            "owned_by": "m3",
            "max_model_len": st.cfg.limits.max_model_len,
        }]
    }))
    .into_response()
}

// ------------------------------------------------------------- generation

fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A seed for a request that gave none: distinct per request.
fn fresh_seed() -> u64 {
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    // splitmix64 finalizer, so close timestamps give unrelated seeds
    let mut z = t.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// What differs between the two endpoints' outputs.
enum Kind {
    Completion {
        /// The prompt text to prepend (`echo`).
        echo: Option<String>,
    },
    Chat {
        parser: Box<ParserOptions>,
    },
}

/// A validated request, tokenized and ready to submit.
struct Prepared {
    prompt: Vec<u32>,
    max_tokens: usize,
    params: GenParams,
    /// Explicitly sent sampling fields (else generation_config defaults).
    sent: (Option<f64>, Option<f64>, Option<i64>),
    logprobs: Option<u32>,
    ignore_eos: bool,
    return_token_ids: bool,
    kind: Kind,
}

fn check_model(st: &AppState, model: &Option<String>) -> Result<(), ApiError> {
    match model {
        Some(m) if *m != st.cfg.served_model_name => Err(error_response(
            StatusCode::NOT_FOUND,
            "not_found_error",
            format!(
                "the model `{m}` does not exist (this server serves `{}`)",
                st.cfg.served_model_name
            ),
            Some("model"),
        )),
        _ => Ok(()),
    }
}

fn encode(st: &AppState, text: &str, special: bool, field: &str) -> Result<Vec<u32>, ApiError> {
    let tk = st.tokenizer.as_ref().ok_or_else(|| {
        bad_request(RequestError::new(
            field,
            "this checkpoint has no tokenizer.json: send token ids",
        ))
    })?;
    let enc = tk.encode(text, special).map_err(|e| {
        bad_request(RequestError::new(
            field,
            format!("tokenization failed: {e}"),
        ))
    })?;
    let ids = enc.get_ids().to_vec();
    if ids.is_empty() {
        return Err(bad_request(RequestError::new(
            field,
            "the prompt has no tokens",
        )));
    }
    if let Some(&bad) = ids
        .iter()
        .find(|&&t| t as usize >= st.cfg.limits.vocab_size)
    {
        return Err(bad_request(RequestError::new(
            field,
            format!("the tokenizer produced id {bad}, outside the model's vocabulary"),
        )));
    }
    Ok(ids)
}

fn prepare_completion(st: &AppState, body: &[u8]) -> Result<Prepared, ApiError> {
    let v = protocol::parse_completion(body, &st.cfg.limits).map_err(bad_request)?;
    check_model(st, &v.request.model)?;
    let echo = v.request.echo.unwrap_or(false);
    let (prompt, text) = match &v.request.prompt {
        Prompt::Text(t) => (encode(st, t, true, "prompt")?, echo.then(|| t.clone())),
        Prompt::Tokens(ids) => (ids.clone(), echo.then(|| (st.decoder())(ids))),
    };
    let max_tokens =
        protocol::check_prompt_len(prompt.len(), v.params.max_tokens, "prompt", &st.cfg.limits)
            .map_err(bad_request)?;
    Ok(Prepared {
        prompt,
        max_tokens,
        sent: (v.request.temperature, v.request.top_p, v.request.top_k),
        params: v.params,
        logprobs: v.logprobs,
        ignore_eos: v.request.ignore_eos.unwrap_or(false),
        return_token_ids: v.request.return_token_ids.unwrap_or(false),
        kind: Kind::Completion { echo: text },
    })
}

/// A chat message as the template sees it (HF conventions; tool-call
/// arguments as an object).
fn message_json(m: &protocol::ChatMessage) -> Value {
    let mut o = Map::new();
    o.insert("role".into(), Value::from(m.role.as_str()));
    o.insert(
        "content".into(),
        m.content
            .as_ref()
            .map_or(Value::Null, |c| Value::from(c.text())),
    );
    if let Some(calls) = &m.tool_calls {
        let calls: Vec<Value> = calls
            .iter()
            .map(|c| {
                let mut c = c.clone();
                if let Some(f) = c.get_mut("function").and_then(Value::as_object_mut) {
                    if let Some(Value::String(a)) = f.get("arguments") {
                        if let Ok(parsed @ Value::Object(_)) = serde_json::from_str::<Value>(a) {
                            f.insert("arguments".into(), parsed);
                        }
                    }
                }
                c
            })
            .collect();
        o.insert("tool_calls".into(), Value::from(calls));
    }
    if let Some(id) = &m.tool_call_id {
        o.insert("tool_call_id".into(), Value::from(id.as_str()));
    }
    if let Some(n) = &m.name {
        o.insert("name".into(), Value::from(n.as_str()));
    }
    Value::Object(o)
}

fn prepare_chat(st: &AppState, body: &[u8]) -> Result<Prepared, ApiError> {
    let v = protocol::parse_chat(body, &st.cfg.limits).map_err(bad_request)?;
    check_model(st, &v.request.model)?;
    let template = st.template.as_ref().ok_or_else(|| {
        bad_request(RequestError::new(
            "messages",
            "this checkpoint has no chat template (tokenizer_config.json `chat_template`): use /v1/completions",
        ))
    })?;
    let use_tools = match &v.request.tool_choice {
        None => true,
        Some(Value::String(s)) if s == "auto" => true,
        Some(Value::String(s)) if s == "none" => false,
        Some(_) => {
            return Err(bad_request(RequestError::new(
                "tool_choice",
                "only \"auto\" and \"none\" are supported (no constrained decoding)",
            )))
        }
    };
    let tools = v
        .request
        .tools
        .as_deref()
        .filter(|t| use_tools && !t.is_empty());
    let messages: Vec<Value> = v.request.messages.iter().map(message_json).collect();
    let kwargs = v.request.chat_template_kwargs.clone().unwrap_or_default();
    let rendered = template
        .render(&messages, tools, true, &kwargs)
        .map_err(|e| bad_request(RequestError::new("messages", e.to_string())))?;
    let prompt = encode(st, &rendered, false, "messages")?;
    let max_tokens = protocol::check_prompt_len(
        prompt.len(),
        v.params.max_tokens,
        if v.request.max_completion_tokens.is_some() {
            "max_completion_tokens"
        } else {
            "messages"
        },
        &st.cfg.limits,
    )
    .map_err(bad_request)?;
    let parser = ParserOptions {
        tags: st.tags.clone(),
        starts_in_reasoning: starts_in_reasoning_with(
            &rendered,
            &st.tags.think_start,
            &st.tags.think_end,
        ),
        tool_schemas: tools
            .map(|t| ToolSchemas::from_openai_tools(&Value::from(t.to_vec())))
            .unwrap_or_default(),
        ..ParserOptions::default()
    };
    Ok(Prepared {
        prompt,
        max_tokens,
        sent: (v.request.temperature, v.request.top_p, v.request.top_k),
        params: v.params,
        logprobs: v.logprobs,
        ignore_eos: v.request.ignore_eos.unwrap_or(false),
        return_token_ids: v.request.return_token_ids.unwrap_or(false),
        kind: Kind::Chat {
            parser: Box::new(parser),
        },
    })
}

/// The engine request for `p`.
/// The engine request for choice `i` of `p`: with a `seed`, choice `i`
/// samples with `seed + i` (reproducible, and the choices differ).
fn engine_request(st: &AppState, p: &Prepared, i: usize) -> Request {
    let d = st.cfg.defaults;
    let s = &p.params.sampling;
    let sampling = SamplingParams {
        temperature: match p.sent.0 {
            Some(_) => s.temperature,
            None => d.temperature.unwrap_or(s.temperature),
        },
        top_p: match p.sent.1 {
            Some(_) => s.top_p,
            None => d.top_p.unwrap_or(s.top_p),
        },
        top_k: match p.sent.2 {
            Some(_) => s.top_k.unwrap_or(0),
            None => d.top_k.or(s.top_k).unwrap_or(0),
        },
        seed: s.seed.map_or_else(fresh_seed, |x| x.wrapping_add(i as u64)),
    };
    let mut r = Request::greedy(0, p.prompt.clone(), p.max_tokens);
    r.sampling = sampling;
    if !p.ignore_eos {
        r.eos = st.cfg.eos.clone();
    }
    r
}

/// The text side of one request: detokenize, match stop strings, parse.
struct Pipeline {
    detok: Option<IncrementalDetokenizer<BoxedDecode>>,
    stop: Option<StopMatcher>,
    parser: Option<OutputParser>,
    /// A stop string matched: later tokens are dropped.
    stopped: bool,
    /// Tokens accepted (up to and including the one completing a stop).
    tokens: Vec<u32>,
    logprobs: Vec<TokenLogprob>,
    /// Tool calls emitted so far.
    tool_calls: usize,
    /// Prompt tokens the engine served from the prefix cache (known at the
    /// end).
    cached_tokens: Option<usize>,
}

impl Pipeline {
    fn new(st: &AppState, p: &Prepared) -> Result<Self, ApiError> {
        let decode = st.decoder();
        // A few prompt tokens as context, so the first token's leading
        // space decodes as it would mid-text.
        let ctx_len = p.prompt.len().min(4);
        let ctx = p.prompt[p.prompt.len() - ctx_len..].to_vec();
        let parser = match &p.kind {
            Kind::Chat { parser } => Some(OutputParser::new((**parser).clone()).map_err(|e| {
                error_response(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "server_error",
                    format!("output parser: {e}"),
                    None,
                )
            })?),
            Kind::Completion { .. } => None,
        };
        Ok(Pipeline {
            detok: Some(IncrementalDetokenizer::with_context(
                Box::new(move |ids: &[u32]| decode(ids)) as BoxedDecode,
                ctx,
                ctx_len,
            )),
            stop: Some(StopMatcher::new(p.params.stop.clone())),
            parser,
            stopped: false,
            tokens: Vec::new(),
            logprobs: Vec::new(),
            tool_calls: 0,
            cached_tokens: None,
        })
    }

    fn route(&mut self, text: String, out: &mut Vec<Event>) {
        if text.is_empty() {
            return;
        }
        match &mut self.parser {
            Some(p) => out.extend(p.push(&text)),
            None => out.push(Event::Content(text)),
        }
    }

    /// Feed tokens; returns the events now final and how many of the tokens
    /// were accepted (all, unless a stop string completed).
    fn push(&mut self, ids: &[u32], lps: Option<&[TokenLogprob]>) -> (Vec<Event>, usize) {
        let mut out = Vec::new();
        let mut n = 0;
        for (j, &t) in ids.iter().enumerate() {
            if self.stopped {
                break;
            }
            n += 1;
            self.tokens.push(t);
            if let Some(lp) = lps.and_then(|l| l.get(j)) {
                self.logprobs.push(lp.clone());
            }
            let delta = match self.detok.as_mut() {
                Some(d) => d.push(t),
                None => String::new(),
            };
            if let Some(stop) = self.stop.as_mut() {
                let s = stop.push(&delta);
                self.route(s.emit, &mut out);
                if s.stopped {
                    self.stopped = true;
                }
            }
        }
        self.count_calls(&out);
        (out, n)
    }

    fn count_calls(&mut self, evs: &[Event]) {
        self.tool_calls += evs
            .iter()
            .filter(|e| matches!(e, Event::ToolCall(_)))
            .count();
    }

    /// End of output: flush what was held back.
    fn finish(&mut self) -> Vec<Event> {
        let mut out = Vec::new();
        if !self.stopped {
            let rest = self.detok.take().map(|d| d.finish()).unwrap_or_default();
            if let Some(stop) = self.stop.as_mut() {
                let s = stop.push(&rest);
                self.route(s.emit, &mut out);
                self.stopped |= s.stopped;
            }
            if !self.stopped {
                if let Some(stop) = self.stop.take() {
                    let tail = stop.finish();
                    self.route(tail, &mut out);
                }
            }
        }
        if let Some(p) = self.parser.take() {
            let fin = p.finish();
            out.extend(fin.events);
            if let Some(t) = fin.truncated_tool_call {
                tracing::debug!(name = ?t.name, "output ended inside a tool call");
            }
        }
        self.count_calls(&out);
        out
    }

    fn finish_reason(&self, done: CoreFinish) -> FinishReason {
        if self.tool_calls > 0 {
            FinishReason::ToolCalls
        } else if self.stopped {
            FinishReason::Stop
        } else {
            match done {
                CoreFinish::Length => FinishReason::Length,
                _ => FinishReason::Stop,
            }
        }
    }
}

/// OpenAI chat `logprobs` for `lps`.
fn chat_logprobs(st: &AppState, lps: &[TokenLogprob]) -> Value {
    let entry = |id: u32, lp: f32| {
        let t = st.token_text(id);
        json!({"token": t, "logprob": lp, "bytes": t.as_bytes()})
    };
    json!({"content": lps.iter().map(|l| {
        let mut e = entry(l.token, l.logprob);
        e["top_logprobs"] = Value::from(l.top.iter().map(|&(t, p)| entry(t, p)).collect::<Vec<_>>());
        e
    }).collect::<Vec<_>>()})
}

/// OpenAI completions `logprobs` for `lps`; `offset` is the text offset of
/// the first token.
fn completion_logprobs(st: &AppState, lps: &[TokenLogprob], mut offset: usize) -> Value {
    let mut tokens = Vec::new();
    let mut lp = Vec::new();
    let mut top = Vec::new();
    let mut offs = Vec::new();
    for l in lps {
        let t = st.token_text(l.token);
        offs.push(offset);
        offset += t.len();
        tokens.push(t);
        lp.push(l.logprob);
        let m: Map<String, Value> = l
            .top
            .iter()
            .map(|&(id, p)| (st.token_text(id), Value::from(p)))
            .collect();
        top.push(Value::Object(m));
    }
    json!({"tokens": tokens, "token_logprobs": lp, "top_logprobs": top, "text_offset": offs})
}

/// One submitted choice: its event receiver and admission slot.
struct Running {
    rx: mpsc::UnboundedReceiver<EngineEvent>,
    _slot: OwnedSlot,
}

/// A request's choices (`n` engine requests sharing one prompt; the prefix
/// cache shares its blocks) and their text pipelines.
struct Submitted {
    /// Engine id of the first choice (names the response and tool calls).
    id: u64,
    runs: Vec<Running>,
    pipes: Vec<Pipeline>,
    prompt_tokens: usize,
}

impl Submitted {
    fn usage(&self) -> Usage {
        let u = Usage::new(
            self.prompt_tokens,
            self.pipes.iter().map(|p| p.tokens.len()).sum(),
        );
        // The first choice's count (the others share its cached prompt).
        match self.pipes.first().and_then(|p| p.cached_tokens) {
            Some(c) => u.with_cached(c),
            None => u,
        }
    }
}

/// Submit every choice of `p`. All or nothing: when one is refused, the
/// ones already submitted are dropped, which aborts them.
fn submit(st: &AppState, p: &Prepared, arrival: Instant) -> Result<Submitted, ApiError> {
    let mut runs = Vec::with_capacity(p.params.n);
    let mut pipes = Vec::with_capacity(p.params.n);
    let mut first = 0;
    for i in 0..p.params.n {
        pipes.push(Pipeline::new(st, p)?);
        let (tx, rx) = mpsc::unbounded_channel();
        let (id, slot) = st
            .engine
            .submit(Submission {
                request: engine_request(st, p, i),
                logprobs: p.logprobs,
                arrival,
                events: tx,
            })
            .map_err(submit_error)?;
        if i == 0 {
            first = id;
        }
        runs.push(Running { rx, _slot: slot });
    }
    Ok(Submitted {
        id: first,
        runs,
        pipes,
        prompt_tokens: p.prompt.len(),
    })
}

fn engine_gone() -> ApiError {
    error_response(
        StatusCode::SERVICE_UNAVAILABLE,
        "server_error",
        "the engine stopped before the request finished".into(),
        None,
    )
}

fn rejected_message(prompt: usize, max_tokens: usize) -> String {
    format!("the prompt ({prompt} tokens) plus max_tokens ({max_tokens}) does not fit this server's KV cache")
}

fn rejected(prompt: usize, max_tokens: usize) -> ApiError {
    bad_request(RequestError::new(
        "max_tokens",
        rejected_message(prompt, max_tokens),
    ))
}

/// Drive one choice to its end without streaming; `None` reason: a stop
/// string ended it.
async fn collect(
    run: &mut Running,
    pipe: &mut Pipeline,
) -> Result<(Vec<Event>, Option<CoreFinish>), ApiError> {
    let mut events = Vec::new();
    loop {
        match run.rx.recv().await {
            Some(EngineEvent::Tokens { ids, logprobs }) => {
                let (evs, _) = pipe.push(&ids, logprobs.as_deref());
                events.extend(evs);
                if pipe.stopped {
                    // Closing the receiver aborts the request in the engine.
                    run.rx.close();
                    events.extend(pipe.finish());
                    return Ok((events, None));
                }
            }
            Some(EngineEvent::Done {
                reason,
                cached_tokens,
            }) => {
                pipe.cached_tokens = Some(cached_tokens);
                events.extend(pipe.finish());
                return Ok((events, Some(reason)));
            }
            Some(EngineEvent::Error(e)) => {
                return Err(error_response(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "server_error",
                    e,
                    None,
                ))
            }
            None => return Err(engine_gone()),
        }
    }
}

/// Every choice of `sub` collected (concurrently), with its finish reason.
async fn collect_all(
    sub: &mut Submitted,
    p: &Prepared,
) -> Result<Vec<(Vec<Event>, FinishReason)>, ApiError> {
    let results = futures_util::future::join_all(
        sub.runs
            .iter_mut()
            .zip(sub.pipes.iter_mut())
            .map(|(run, pipe)| collect(run, pipe)),
    )
    .await;
    let mut out = Vec::with_capacity(results.len());
    for (r, pipe) in results.into_iter().zip(&sub.pipes) {
        let (events, done) = r?;
        if done == Some(CoreFinish::Rejected) {
            return Err(rejected(p.prompt.len(), p.max_tokens));
        }
        out.push((events, pipe.finish_reason(done.unwrap_or(CoreFinish::Stop))));
    }
    Ok(out)
}

/// Prepare a request (`prepare`: parse, template, tokenize) and submit it.
/// Templating and tokenization are CPU work (long prompts take
/// milliseconds), so they run off the async workers, which keep streaming.
async fn prepare_and_submit(
    st: &Arc<AppState>,
    body: Bytes,
    prepare: fn(&AppState, &[u8]) -> Result<Prepared, ApiError>,
) -> Result<(Prepared, Submitted), ApiError> {
    let arrival = Instant::now();
    let prepared = {
        let st = Arc::clone(st);
        tokio::task::spawn_blocking(move || prepare(&st, &body)).await
    };
    let p = match prepared {
        Ok(r) => r?,
        Err(e) => {
            return Err(error_response(
                StatusCode::INTERNAL_SERVER_ERROR,
                "server_error",
                format!("preparing the request failed: {e}"),
                None,
            ))
        }
    };
    let sub = submit(st, &p, arrival)?;
    Ok((p, sub))
}

async fn completions(State(st): State<Arc<AppState>>, body: Bytes) -> Response {
    let (p, mut sub) = match prepare_and_submit(&st, body, prepare_completion).await {
        Ok(x) => x,
        Err(r) => return r.into_response(),
    };
    let created = now_unix();
    let rid = format!("cmpl-{}", sub.id);
    if p.params.stream {
        return stream_completion(st, p, sub, rid, created);
    }
    let results = match collect_all(&mut sub, &p).await {
        Ok(x) => x,
        Err(r) => return r.into_response(),
    };
    let echo = match &p.kind {
        Kind::Completion { echo: Some(e) } => e.as_str(),
        _ => "",
    };
    let choices = results
        .into_iter()
        .zip(&sub.pipes)
        .enumerate()
        .map(|(i, ((events, reason), pipe))| {
            let mut text = echo.to_string();
            for e in events {
                if let Event::Content(s) | Event::Reasoning(s) = e {
                    text.push_str(&s);
                }
            }
            CompletionChoice {
                index: i,
                text,
                logprobs: p
                    .logprobs
                    .map(|_| completion_logprobs(&st, &pipe.logprobs, echo.len())),
                finish_reason: Some(reason),
                token_ids: p.return_token_ids.then(|| pipe.tokens.clone()),
            }
        })
        .collect();
    let mut r = CompletionResponse::new(rid, created, st.cfg.served_model_name.clone(), choices);
    r.usage = Some(sub.usage());
    Json(r).into_response()
}

async fn chat_completions(State(st): State<Arc<AppState>>, body: Bytes) -> Response {
    let (p, mut sub) = match prepare_and_submit(&st, body, prepare_chat).await {
        Ok(x) => x,
        Err(r) => return r.into_response(),
    };
    let created = now_unix();
    let rid = format!("chatcmpl-{}", sub.id);
    if p.params.stream {
        return stream_chat(st, p, sub, rid, created);
    }
    let results = match collect_all(&mut sub, &p).await {
        Ok(x) => x,
        Err(r) => return r.into_response(),
    };
    let id = sub.id;
    let choices = results
        .into_iter()
        .zip(&sub.pipes)
        .enumerate()
        .map(|(i, ((events, reason), pipe))| {
            let (mut content, mut reasoning, mut calls) =
                (String::new(), String::new(), Vec::new());
            for e in events {
                match e {
                    Event::Content(s) => content.push_str(&s),
                    Event::Reasoning(s) => reasoning.push_str(&s),
                    Event::ToolCall(c) => {
                        calls.push(ResponseToolCall::from_parsed(call_id(id, i, c.index), &c))
                    }
                }
            }
            ChatChoice {
                index: i,
                message: ResponseMessage {
                    role: "assistant",
                    content: (!content.is_empty()).then_some(content),
                    reasoning_content: (!reasoning.is_empty()).then_some(reasoning),
                    tool_calls: (!calls.is_empty()).then_some(calls),
                },
                logprobs: p.logprobs.map(|_| chat_logprobs(&st, &pipe.logprobs)),
                finish_reason: Some(reason),
                token_ids: p.return_token_ids.then(|| pipe.tokens.clone()),
            }
        })
        .collect();
    let mut r =
        ChatCompletionResponse::new(rid, created, st.cfg.served_model_name.clone(), choices);
    r.usage = Some(sub.usage());
    Json(r).into_response()
}

/// A tool call's id: unique per request, choice and call.
fn call_id(request: u64, choice: usize, call: usize) -> String {
    format!("call_{request}_{choice}_{call}")
}

// --------------------------------------------------------------- streaming

/// SSE data line of a serializable chunk.
fn sse_json<T: serde::Serialize>(v: &T) -> SseEvent {
    SseEvent::default().data(serde_json::to_string(v).unwrap_or_else(|e| {
        json!({"error": {"message": format!("serializing a chunk: {e}")}}).to_string()
    }))
}

fn sse_error(status: u16, message: &str) -> SseEvent {
    SseEvent::default().data(
        json!({"error": {"message": message, "type": if status == 400 { "invalid_request_error" } else { "server_error" }, "code": status}}).to_string(),
    )
}

type SseTx = mpsc::Sender<Result<SseEvent, Infallible>>;

/// Run `body` as the producer of an SSE stream. The stream ends when it
/// returns (with `[DONE]` appended), or when the client goes away: then the
/// producer is dropped mid-flight, which drops its engine receivers, which
/// aborts the requests in the engine.
fn sse_response<F, Fut>(body: F) -> Response
where
    F: FnOnce(SseTx) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = mpsc::channel::<Result<SseEvent, Infallible>>(64);
    tokio::spawn(async move {
        let closed = tx.clone();
        tokio::select! {
            _ = closed.closed() => {}
            _ = async {
                body(tx.clone()).await;
                let _ = tx.send(Ok(SseEvent::default().data("[DONE]"))).await;
            } => {}
        }
    });
    Sse::new(ReceiverStream::new(rx))
        .keep_alive(KeepAlive::default())
        .into_response()
}

/// What a choice's stream renderer is told.
enum Update {
    /// Parsed output of newly arrived tokens (possibly none).
    Events(Vec<Event>),
    /// The choice is over.
    End(FinishReason),
}

/// How far a choice's stream has got: logprobs and token ids already sent,
/// and the text offset (completions' `text_offset`).
#[derive(Clone, Copy, Default)]
struct Cursor {
    lp_from: usize,
    ids_from: usize,
    offset: usize,
}

/// Drive every choice of `sub` through its pipeline as events arrive (in
/// whatever order the choices produce them), sending what `render` makes
/// of each update. Returns whether every choice ended normally (errors are
/// sent as an SSE error event). A choice that hits a stop string has its
/// receiver dropped at once (its engine request aborts).
async fn drive_stream(
    sub: &mut Submitted,
    p: &Prepared,
    tx: &SseTx,
    mut render: impl FnMut(usize, &Pipeline, &mut Cursor, Update) -> Vec<SseEvent>,
) -> bool {
    let n = sub.runs.len();
    let mut map = StreamMap::new();
    for (i, run) in sub.runs.iter_mut().enumerate() {
        // Move the receiver out (the slot stays with `sub`).
        let (_, dead) = mpsc::unbounded_channel();
        let rx = std::mem::replace(&mut run.rx, dead);
        map.insert(i, UnboundedReceiverStream::new(rx));
    }
    let mut cursors = vec![Cursor::default(); n];
    let mut ended = vec![false; n];
    while let Some((i, ev)) = map.next().await {
        let pipe = &mut sub.pipes[i];
        let updates = match ev {
            EngineEvent::Tokens { ids, logprobs } => {
                let (mut evs, _) = pipe.push(&ids, logprobs.as_deref());
                if pipe.stopped {
                    map.remove(&i); // aborts it in the engine
                    evs.extend(pipe.finish());
                    vec![
                        Update::Events(evs),
                        Update::End(pipe.finish_reason(CoreFinish::Stop)),
                    ]
                } else {
                    vec![Update::Events(evs)]
                }
            }
            EngineEvent::Done {
                reason: CoreFinish::Rejected,
                ..
            } => {
                let m = rejected_message(p.prompt.len(), p.max_tokens);
                let _ = tx.send(Ok(sse_error(400, &m))).await;
                return false;
            }
            EngineEvent::Done {
                reason,
                cached_tokens,
            } => {
                pipe.cached_tokens = Some(cached_tokens);
                let evs = pipe.finish();
                vec![Update::Events(evs), Update::End(pipe.finish_reason(reason))]
            }
            EngineEvent::Error(e) => {
                let _ = tx.send(Ok(sse_error(500, &e))).await;
                return false;
            }
        };
        for u in updates {
            if matches!(u, Update::End(_)) {
                ended[i] = true;
            }
            for ev in render(i, &sub.pipes[i], &mut cursors[i], u) {
                if tx.send(Ok(ev)).await.is_err() {
                    return false;
                }
            }
        }
    }
    if ended.iter().all(|&e| e) {
        true
    } else {
        let _ = tx
            .send(Ok(sse_error(
                503,
                "the engine stopped before the request finished",
            )))
            .await;
        false
    }
}

fn stream_completion(
    st: Arc<AppState>,
    p: Prepared,
    mut sub: Submitted,
    rid: String,
    created: u64,
) -> Response {
    sse_response(move |tx| async move {
        let model = st.cfg.served_model_name.clone();
        let chunk = |i: usize,
                     text: String,
                     lps: Option<Value>,
                     ids: Option<Vec<u32>>,
                     fin: Option<FinishReason>| {
            sse_json(&CompletionResponse::new(
                rid.clone(),
                created,
                model.clone(),
                vec![CompletionChoice {
                    index: i,
                    text,
                    logprobs: lps,
                    finish_reason: fin,
                    token_ids: ids,
                }],
            ))
        };
        let echo = match &p.kind {
            Kind::Completion { echo: Some(e) } => e.clone(),
            _ => String::new(),
        };
        if !echo.is_empty() {
            for i in 0..sub.runs.len() {
                if tx
                    .send(Ok(chunk(i, echo.clone(), None, None, None)))
                    .await
                    .is_err()
                {
                    return;
                }
            }
        }
        let wants_tokens = p.return_token_ids || p.logprobs.is_some();
        let ok = drive_stream(&mut sub, &p, &tx, |i, pipe, cur, u| match u {
            Update::Events(events) => {
                let text: String = events
                    .into_iter()
                    .filter_map(|e| match e {
                        Event::Content(s) | Event::Reasoning(s) => Some(s),
                        Event::ToolCall(_) => None,
                    })
                    .collect();
                // Tokens whose text is still held back (an incomplete
                // UTF-8 character, a possible stop string) get a chunk of
                // their own only when the client asked for their ids or
                // logprobs.
                if text.is_empty() && !(wants_tokens && pipe.tokens.len() > cur.ids_from) {
                    return Vec::new();
                }
                if cur.offset == 0 {
                    cur.offset = echo.len();
                }
                let lps = p
                    .logprobs
                    .map(|_| completion_logprobs(&st, &pipe.logprobs[cur.lp_from..], cur.offset));
                let ids = p
                    .return_token_ids
                    .then(|| pipe.tokens[cur.ids_from..].to_vec());
                cur.offset += text.len();
                cur.lp_from = pipe.logprobs.len();
                cur.ids_from = pipe.tokens.len();
                vec![chunk(i, text, lps, ids, None)]
            }
            Update::End(reason) => vec![chunk(i, String::new(), None, None, Some(reason))],
        })
        .await;
        if ok && p.params.include_usage {
            let mut u = CompletionResponse::new(rid.clone(), created, model.clone(), vec![]);
            u.usage = Some(sub.usage());
            let _ = tx.send(Ok(sse_json(&u))).await;
        }
    })
}

fn stream_chat(
    st: Arc<AppState>,
    p: Prepared,
    mut sub: Submitted,
    rid: String,
    created: u64,
) -> Response {
    sse_response(move |tx| async move {
        let model = st.cfg.served_model_name.clone();
        let chunk = |i: usize,
                     delta: Delta,
                     lps: Option<Value>,
                     ids: Option<Vec<u32>>,
                     fin: Option<FinishReason>| {
            sse_json(&ChatCompletionChunk::new(
                rid.clone(),
                created,
                model.clone(),
                vec![ChunkChoice {
                    index: i,
                    delta,
                    logprobs: lps,
                    finish_reason: fin,
                    token_ids: ids,
                }],
            ))
        };
        for i in 0..sub.runs.len() {
            let first = Delta {
                role: Some("assistant"),
                content: Some(String::new()),
                ..Delta::default()
            };
            if tx
                .send(Ok(chunk(i, first, None, None, None)))
                .await
                .is_err()
            {
                return;
            }
        }
        let id = sub.id;
        let wants_tokens = p.return_token_ids || p.logprobs.is_some();
        let ok = drive_stream(&mut sub, &p, &tx, |i, pipe, cur, u| match u {
            Update::Events(events) => {
                // One chunk per event; the token ids and logprobs that
                // arrived ride on the first chunk sent after them.
                let mut deltas: Vec<Delta> = events
                    .into_iter()
                    .map(|e| match e {
                        Event::Content(s) => Delta {
                            content: Some(s),
                            ..Delta::default()
                        },
                        Event::Reasoning(s) => Delta {
                            reasoning_content: Some(s),
                            ..Delta::default()
                        },
                        Event::ToolCall(c) => Delta {
                            tool_calls: Some(vec![ToolCallDelta {
                                index: c.index,
                                id: Some(call_id(id, i, c.index)),
                                kind: Some("function"),
                                function: FunctionCallDelta {
                                    name: Some(c.name.clone()),
                                    arguments: Some(c.arguments_json()),
                                },
                            }]),
                            ..Delta::default()
                        },
                    })
                    .collect();
                if deltas.is_empty() && wants_tokens && pipe.tokens.len() > cur.ids_from {
                    deltas.push(Delta::default());
                }
                let mut out = Vec::with_capacity(deltas.len());
                for d in deltas {
                    let lps = p
                        .logprobs
                        .filter(|_| pipe.logprobs.len() > cur.lp_from)
                        .map(|_| chat_logprobs(&st, &pipe.logprobs[cur.lp_from..]));
                    let ids = p
                        .return_token_ids
                        .then(|| pipe.tokens[cur.ids_from..].to_vec());
                    cur.lp_from = pipe.logprobs.len();
                    cur.ids_from = pipe.tokens.len();
                    out.push(chunk(i, d, lps, ids, None));
                }
                out
            }
            Update::End(reason) => vec![chunk(i, Delta::default(), None, None, Some(reason))],
        })
        .await;
        if ok && p.params.include_usage {
            let mut u = ChatCompletionChunk::new(rid.clone(), created, model.clone(), vec![]);
            u.usage = Some(sub.usage());
            let _ = tx.send(Ok(sse_json(&u))).await;
        }
    })
}
