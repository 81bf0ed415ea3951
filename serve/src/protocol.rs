//! OpenAI-compatible request and response types for `/v1/completions` and
//! `/v1/chat/completions`, with request validation.
//!
//! Why hand-written field-by-field parsing: OpenAI clients send many fields
//! this server does not use (`user`, `presence_penalty`, vendor extras), so
//! unknown fields must be accepted and ignored; but a known field with the
//! wrong type or an out-of-range value must be rejected with a 400 that
//! names the field (`param` in OpenAI's error shape), which a derived
//! `Deserialize` cannot do. A JSON `null` counts as "not given" for every
//! optional field, as OpenAI's own API does.
//!
//! Parsing happens in two stages. [`parse_completion`] / [`parse_chat`]
//! check everything that can be checked from the body alone and return a
//! [`ValidCompletion`] / [`ValidChat`] whose [`GenParams`] are normalized
//! (defaults filled in, `max_completion_tokens` folded into `max_tokens`,
//! `stop` always a list). The prompt length is only known after
//! tokenization (or chat templating), so [`check_prompt_len`] is called
//! afterwards to check it against the context window and to settle the
//! effective `max_tokens`.
//!
//! ```
//! use m3_serve::protocol::{check_prompt_len, parse_chat, Limits};
//!
//! let limits = Limits { max_model_len: 4096, max_tokens_cap: 4096, vocab_size: 200_064 };
//! let req = parse_chat(br#"{"messages":[{"role":"user","content":"hi"}],"stop":"\n","user":"x"}"#, &limits).unwrap();
//! assert_eq!(req.params.stop, vec!["\n".to_string()]);
//! assert_eq!(check_prompt_len(96, req.params.max_tokens, "messages", &limits).unwrap(), 4000);
//!
//! let err = parse_chat(br#"{"messages":[{"role":"user","content":"hi"}],"max_tokens":0}"#, &limits)
//!     .unwrap_err();
//! assert_eq!(err.to_string(), "invalid request: field `max_tokens`: must be >= 1");
//! assert_eq!(err.to_json()["error"]["param"], "max_tokens");
//! ```

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

/// Server-side limits that requests are validated against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Context window: prompt plus completion tokens.
    pub max_model_len: usize,
    /// Largest `max_tokens` a request may ask for (and the default's cap).
    pub max_tokens_cap: usize,
    /// Token ids in a prompt must be below this.
    pub vocab_size: usize,
}

/// A rejected request: an HTTP 400 naming the offending field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid request: field `{field}`: {message}")]
pub struct RequestError {
    /// The field (OpenAI's `param`), e.g. `max_tokens`, `messages[2].role`,
    /// or `body` for a body that is not a JSON object.
    pub field: String,
    /// What is wrong with it.
    pub message: String,
}

impl RequestError {
    /// An error for `field`.
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        RequestError {
            field: field.into(),
            message: message.into(),
        }
    }

    /// The HTTP 400 body in OpenAI's error shape.
    pub fn to_json(&self) -> Value {
        json!({
            "error": {
                "message": self.to_string(),
                "type": "invalid_request_error",
                "param": self.field,
                "code": null,
            }
        })
    }
}

/// The largest `n` accepted.
pub const MAX_N: usize = 8;
/// The most stop strings accepted (OpenAI's limit).
pub const MAX_STOP: usize = 4;
/// The largest `logprobs` (completions) / `top_logprobs` (chat).
pub const MAX_LOGPROBS: u32 = 20;

// ---------------------------------------------------------------- requests

/// A completion prompt: text, or token ids that skip tokenization.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Prompt {
    /// Text to tokenize.
    Text(String),
    /// Token ids, each below [`Limits::vocab_size`].
    Tokens(Vec<u32>),
}

/// `stream_options`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
pub struct StreamOptions {
    /// Send a final chunk with `usage` (and empty `choices`).
    #[serde(default)]
    pub include_usage: Option<bool>,
}

/// A `/v1/completions` request as sent (typed, not yet range-checked).
#[derive(Debug, Clone, PartialEq)]
pub struct CompletionRequest {
    pub model: Option<String>,
    pub prompt: Prompt,
    pub max_tokens: Option<i64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<i64>,
    pub seed: Option<u64>,
    /// Normalized: a single string becomes a one-element list.
    pub stop: Option<Vec<String>>,
    pub n: Option<i64>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    /// Number of top log-probabilities per token (0..=20).
    pub logprobs: Option<i64>,
    /// Prepend the prompt to the completion text.
    pub echo: Option<bool>,
    /// vLLM extension: keep generating past end-of-text tokens.
    pub ignore_eos: Option<bool>,
    /// vLLM extension: return the generated token ids (`token_ids` in each
    /// choice / chunk choice).
    pub return_token_ids: Option<bool>,
}

/// A chat message role.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    System,
    User,
    Assistant,
    Tool,
}

impl Role {
    /// The role's name as in the API.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        }
    }
}

/// A message's `content`: a string or a list of text parts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MessageContent {
    Text(String),
    /// The `text` of each `{"type":"text","text":…}` part (other part
    /// types are rejected).
    Parts(Vec<String>),
}

impl MessageContent {
    /// The content as one string (parts concatenated).
    pub fn text(&self) -> String {
        match self {
            MessageContent::Text(s) => s.clone(),
            MessageContent::Parts(p) => p.concat(),
        }
    }
}

/// One chat message.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatMessage {
    pub role: Role,
    /// Required for system, user and tool messages; optional for an
    /// assistant message (which may carry only `tool_calls`).
    pub content: Option<MessageContent>,
    /// An assistant's earlier tool calls, passed through to the chat
    /// template as sent.
    pub tool_calls: Option<Vec<Value>>,
    /// For a tool message: the call it answers.
    pub tool_call_id: Option<String>,
    pub name: Option<String>,
}

/// A `/v1/chat/completions` request as sent (typed, not yet range-checked).
#[derive(Debug, Clone, PartialEq)]
pub struct ChatRequest {
    pub model: Option<String>,
    pub messages: Vec<ChatMessage>,
    pub max_tokens: Option<i64>,
    /// OpenAI's newer name for `max_tokens`; wins when both are given.
    pub max_completion_tokens: Option<i64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<i64>,
    pub seed: Option<u64>,
    pub stop: Option<Vec<String>>,
    pub n: Option<i64>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub logprobs: Option<bool>,
    pub top_logprobs: Option<i64>,
    pub tools: Option<Vec<Value>>,
    pub tool_choice: Option<Value>,
    pub chat_template_kwargs: Option<Map<String, Value>>,
    /// vLLM extension: keep generating past end-of-text tokens.
    pub ignore_eos: Option<bool>,
    /// vLLM extension: return the generated token ids.
    pub return_token_ids: Option<bool>,
}

/// Sampling settings with defaults applied.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplingParams {
    /// In `[0, 2]`; 0 means greedy. Default 1.
    pub temperature: f32,
    /// In `(0, 1]`. Default 1 (off).
    pub top_p: f32,
    /// `None` when off (not given, 0 or -1).
    pub top_k: Option<usize>,
    pub seed: Option<u64>,
}

/// Generation settings common to both endpoints, validated and normalized.
#[derive(Debug, Clone, PartialEq)]
pub struct GenParams {
    /// As requested (in `1..=max_tokens_cap`), or `None` for "as many as
    /// fit"; [`check_prompt_len`] turns it into the effective value.
    pub max_tokens: Option<usize>,
    pub sampling: SamplingParams,
    /// Non-empty strings, at most [`MAX_STOP`].
    pub stop: Vec<String>,
    /// In `1..=MAX_N`.
    pub n: usize,
    pub stream: bool,
    /// `stream_options.include_usage` (only meaningful when streaming).
    pub include_usage: bool,
}

/// A validated completion request.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidCompletion {
    /// The request as sent.
    pub request: CompletionRequest,
    pub params: GenParams,
    /// Top log-probabilities to return per token, if requested.
    pub logprobs: Option<u32>,
}

/// A validated chat request.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidChat {
    /// The request as sent.
    pub request: ChatRequest,
    /// `max_tokens` here is `max_completion_tokens` if given, else
    /// `max_tokens`.
    pub params: GenParams,
    /// Top log-probabilities to return per token: `Some(k)` when `logprobs`
    /// is true (`k` = `top_logprobs`, default 0).
    pub logprobs: Option<u32>,
}

// ----------------------------------------------------------------- parsing

type Obj = Map<String, Value>;

fn parse_object(body: &[u8]) -> Result<Obj, RequestError> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(o)) => Ok(o),
        Ok(_) => Err(RequestError::new("body", "must be a JSON object")),
        Err(e) => Err(RequestError::new("body", e.to_string())),
    }
}

/// `obj[name]` as `T`; absent or `null` is `None`.
fn field<T: DeserializeOwned>(obj: &Obj, name: &str) -> Result<Option<T>, RequestError> {
    field_at(obj, name, name)
}

fn field_at<T: DeserializeOwned>(
    obj: &Obj,
    name: &str,
    path: &str,
) -> Result<Option<T>, RequestError> {
    match obj.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => T::deserialize(v)
            .map(Some)
            .map_err(|e| RequestError::new(path, e.to_string())),
    }
}

fn parse_stop(obj: &Obj) -> Result<Option<Vec<String>>, RequestError> {
    match obj.get("stop") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(vec![s.clone()])),
        Some(v @ Value::Array(_)) => Vec::<String>::deserialize(v)
            .map(Some)
            .map_err(|e| RequestError::new("stop", e.to_string())),
        Some(_) => Err(RequestError::new(
            "stop",
            "must be a string or an array of strings",
        )),
    }
}

fn parse_prompt(obj: &Obj) -> Result<Prompt, RequestError> {
    match obj.get("prompt") {
        None | Some(Value::Null) => Err(RequestError::new("prompt", "is required")),
        Some(Value::String(s)) => Ok(Prompt::Text(s.clone())),
        Some(v @ Value::Array(_)) => Vec::<u32>::deserialize(v).map(Prompt::Tokens).map_err(|e| {
            RequestError::new(
                "prompt",
                format!("must be a string or an array of token ids: {e}"),
            )
        }),
        Some(_) => Err(RequestError::new(
            "prompt",
            "must be a string or an array of token ids",
        )),
    }
}

fn parse_message(i: usize, v: &Value) -> Result<ChatMessage, RequestError> {
    let at = |f: &str| format!("messages[{i}].{f}");
    let Value::Object(m) = v else {
        return Err(RequestError::new(
            format!("messages[{i}]"),
            "must be an object",
        ));
    };
    let role_name: String = field_at(m, "role", &at("role"))?
        .ok_or_else(|| RequestError::new(at("role"), "is required"))?;
    let role = match role_name.as_str() {
        "system" => Role::System,
        "user" => Role::User,
        "assistant" => Role::Assistant,
        "tool" => Role::Tool,
        other => {
            return Err(RequestError::new(
                at("role"),
                format!("unsupported role `{other}`; expected system, user, assistant or tool"),
            ))
        }
    };
    let content = match m.get("content") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(MessageContent::Text(s.clone())),
        Some(Value::Array(parts)) => {
            let mut texts = Vec::with_capacity(parts.len());
            for (j, p) in parts.iter().enumerate() {
                let pat = |f: &str| format!("messages[{i}].content[{j}]{f}");
                let Value::Object(p) = p else {
                    return Err(RequestError::new(pat(""), "must be an object"));
                };
                let ty: Option<String> = field_at(p, "type", &pat(".type"))?;
                if ty.as_deref() != Some("text") {
                    return Err(RequestError::new(
                        pat(".type"),
                        format!(
                            "unsupported content part type {}; only `text` is supported",
                            ty.map_or("(missing)".to_string(), |t| format!("`{t}`"))
                        ),
                    ));
                }
                let text: String = field_at(p, "text", &pat(".text"))?
                    .ok_or_else(|| RequestError::new(pat(".text"), "is required"))?;
                texts.push(text);
            }
            Some(MessageContent::Parts(texts))
        }
        Some(_) => {
            return Err(RequestError::new(
                at("content"),
                "must be a string or an array of content parts",
            ))
        }
    };
    if content.is_none() && role != Role::Assistant {
        return Err(RequestError::new(
            at("content"),
            format!("is required for a {} message", role.as_str()),
        ));
    }
    Ok(ChatMessage {
        role,
        content,
        tool_calls: field_at(m, "tool_calls", &at("tool_calls"))?,
        tool_call_id: field_at(m, "tool_call_id", &at("tool_call_id"))?,
        name: field_at(m, "name", &at("name"))?,
    })
}

/// The fields shared by both endpoints, as sent.
struct Common {
    max_tokens: Option<i64>,
    temperature: Option<f64>,
    top_p: Option<f64>,
    top_k: Option<i64>,
    seed: Option<u64>,
    stop: Option<Vec<String>>,
    n: Option<i64>,
    stream: Option<bool>,
    stream_options: Option<StreamOptions>,
}

fn validate_common(
    c: &Common,
    max_tokens_field: &str,
    limits: &Limits,
) -> Result<GenParams, RequestError> {
    let max_tokens = match c.max_tokens {
        None => None,
        Some(m) if m < 1 => return Err(RequestError::new(max_tokens_field, "must be >= 1")),
        Some(m) if m as u64 > limits.max_tokens_cap as u64 => {
            return Err(RequestError::new(
                max_tokens_field,
                format!("must be <= {}", limits.max_tokens_cap),
            ))
        }
        Some(m) => Some(m as usize),
    };
    let temperature = c.temperature.unwrap_or(1.0);
    if !(temperature.is_finite() && (0.0..=2.0).contains(&temperature)) {
        return Err(RequestError::new("temperature", "must be in [0, 2]"));
    }
    let top_p = c.top_p.unwrap_or(1.0);
    if !(top_p.is_finite() && top_p > 0.0 && top_p <= 1.0) {
        return Err(RequestError::new("top_p", "must be in (0, 1]"));
    }
    let top_k = match c.top_k {
        None | Some(0) | Some(-1) => None,
        Some(k) if k < 0 => {
            return Err(RequestError::new(
                "top_k",
                "must be >= 0 (0 or -1 turns it off)",
            ))
        }
        Some(k) => Some(usize::try_from(k).unwrap_or(usize::MAX)),
    };
    let stop = c.stop.clone().unwrap_or_default();
    if stop.len() > MAX_STOP {
        return Err(RequestError::new(
            "stop",
            format!("at most {MAX_STOP} stop strings are allowed"),
        ));
    }
    if stop.iter().any(String::is_empty) {
        return Err(RequestError::new("stop", "stop strings must not be empty"));
    }
    let n = c.n.unwrap_or(1);
    if !(1..=MAX_N as i64).contains(&n) {
        return Err(RequestError::new("n", format!("must be in 1..={MAX_N}")));
    }
    let stream = c.stream.unwrap_or(false);
    Ok(GenParams {
        max_tokens,
        sampling: SamplingParams {
            temperature: temperature as f32,
            top_p: top_p as f32,
            top_k,
            seed: c.seed,
        },
        stop,
        n: n as usize,
        stream,
        include_usage: c
            .stream_options
            .and_then(|o| o.include_usage)
            .unwrap_or(false),
    })
}

fn check_logprobs(field: &str, v: Option<i64>) -> Result<Option<u32>, RequestError> {
    match v {
        None => Ok(None),
        Some(k) if (0..=MAX_LOGPROBS as i64).contains(&k) => Ok(Some(k as u32)),
        Some(_) => Err(RequestError::new(
            field,
            format!("must be in 0..={MAX_LOGPROBS}"),
        )),
    }
}

/// Parses and validates a `/v1/completions` body.
pub fn parse_completion(body: &[u8], limits: &Limits) -> Result<ValidCompletion, RequestError> {
    let o = parse_object(body)?;
    let request = CompletionRequest {
        model: field(&o, "model")?,
        prompt: parse_prompt(&o)?,
        max_tokens: field(&o, "max_tokens")?,
        temperature: field(&o, "temperature")?,
        top_p: field(&o, "top_p")?,
        top_k: field(&o, "top_k")?,
        seed: field(&o, "seed")?,
        stop: parse_stop(&o)?,
        n: field(&o, "n")?,
        stream: field(&o, "stream")?,
        stream_options: field(&o, "stream_options")?,
        logprobs: field(&o, "logprobs")?,
        echo: field(&o, "echo")?,
        ignore_eos: field(&o, "ignore_eos")?,
        return_token_ids: field(&o, "return_token_ids")?,
    };
    if let Prompt::Tokens(t) = &request.prompt {
        if t.is_empty() {
            return Err(RequestError::new("prompt", "must not be empty"));
        }
        if let Some((i, &bad)) = t
            .iter()
            .enumerate()
            .find(|(_, &id)| id as usize >= limits.vocab_size)
        {
            return Err(RequestError::new(
                "prompt",
                format!(
                    "token id {bad} at position {i} is out of range (vocabulary size {})",
                    limits.vocab_size
                ),
            ));
        }
    }
    let params = validate_common(
        &Common {
            max_tokens: request.max_tokens,
            temperature: request.temperature,
            top_p: request.top_p,
            top_k: request.top_k,
            seed: request.seed,
            stop: request.stop.clone(),
            n: request.n,
            stream: request.stream,
            stream_options: request.stream_options,
        },
        "max_tokens",
        limits,
    )?;
    let logprobs = check_logprobs("logprobs", request.logprobs)?;
    Ok(ValidCompletion {
        request,
        params,
        logprobs,
    })
}

/// Parses and validates a `/v1/chat/completions` body.
pub fn parse_chat(body: &[u8], limits: &Limits) -> Result<ValidChat, RequestError> {
    let o = parse_object(body)?;
    let messages = match o.get("messages") {
        None | Some(Value::Null) => return Err(RequestError::new("messages", "is required")),
        Some(Value::Array(a)) => a
            .iter()
            .enumerate()
            .map(|(i, m)| parse_message(i, m))
            .collect::<Result<Vec<_>, _>>()?,
        Some(_) => return Err(RequestError::new("messages", "must be an array")),
    };
    let request = ChatRequest {
        model: field(&o, "model")?,
        messages,
        max_tokens: field(&o, "max_tokens")?,
        max_completion_tokens: field(&o, "max_completion_tokens")?,
        temperature: field(&o, "temperature")?,
        top_p: field(&o, "top_p")?,
        top_k: field(&o, "top_k")?,
        seed: field(&o, "seed")?,
        stop: parse_stop(&o)?,
        n: field(&o, "n")?,
        stream: field(&o, "stream")?,
        stream_options: field(&o, "stream_options")?,
        logprobs: field(&o, "logprobs")?,
        top_logprobs: field(&o, "top_logprobs")?,
        tools: field(&o, "tools")?,
        tool_choice: field(&o, "tool_choice")?,
        chat_template_kwargs: field(&o, "chat_template_kwargs")?,
        ignore_eos: field(&o, "ignore_eos")?,
        return_token_ids: field(&o, "return_token_ids")?,
    };
    if request.messages.is_empty() {
        return Err(RequestError::new("messages", "must not be empty"));
    }
    let (max_tokens, max_field) = match request.max_completion_tokens {
        Some(m) => (Some(m), "max_completion_tokens"),
        None => (request.max_tokens, "max_tokens"),
    };
    let params = validate_common(
        &Common {
            max_tokens,
            temperature: request.temperature,
            top_p: request.top_p,
            top_k: request.top_k,
            seed: request.seed,
            stop: request.stop.clone(),
            n: request.n,
            stream: request.stream,
            stream_options: request.stream_options,
        },
        max_field,
        limits,
    )?;
    let top = check_logprobs("top_logprobs", request.top_logprobs)?;
    let logprobs = if request.logprobs.unwrap_or(false) {
        Some(top.unwrap_or(0))
    } else if top.is_some() {
        return Err(RequestError::new(
            "top_logprobs",
            "requires `logprobs` to be true",
        ));
    } else {
        None
    };
    Ok(ValidChat {
        request,
        params,
        logprobs,
    })
}

/// Checks the tokenized prompt against the context window and returns the
/// effective `max_tokens`.
///
/// * `prompt_tokens >= max_model_len` is an error on `field` (the caller
///   passes `"prompt"` or `"messages"`): no room for even one token.
/// * An explicit `max_tokens` that does not fit beside the prompt is an
///   error on `max_tokens` (it is not silently shortened: the client asked
///   for a specific budget).
/// * Without `max_tokens` the default is everything that fits,
///   `max_model_len - prompt_tokens`, capped at `max_tokens_cap`.
pub fn check_prompt_len(
    prompt_tokens: usize,
    max_tokens: Option<usize>,
    field: &str,
    limits: &Limits,
) -> Result<usize, RequestError> {
    if prompt_tokens >= limits.max_model_len {
        return Err(RequestError::new(
            field,
            format!(
                "the prompt is {prompt_tokens} tokens, but this model's maximum context length is {} tokens",
                limits.max_model_len
            ),
        ));
    }
    let room = limits.max_model_len - prompt_tokens;
    match max_tokens {
        Some(m) if m > room => Err(RequestError::new(
            "max_tokens",
            format!(
                "this model's maximum context length is {} tokens, but {} were requested ({prompt_tokens} in the prompt, {m} in the completion)",
                limits.max_model_len,
                prompt_tokens + m
            ),
        )),
        Some(m) => Ok(m),
        None => Ok(room.min(limits.max_tokens_cap)),
    }
}

// --------------------------------------------------------------- responses

/// Why a choice ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// End of sequence or a stop string.
    Stop,
    /// `max_tokens` or the context window reached.
    Length,
    /// The model called tools.
    ToolCalls,
}

/// Token counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
    /// OpenAI's `prompt_tokens_details` (prompt tokens served from the
    /// prefix cache), when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_tokens_details: Option<PromptTokensDetails>,
}

/// `usage.prompt_tokens_details`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct PromptTokensDetails {
    /// Prompt tokens whose KV came from the prefix cache.
    pub cached_tokens: usize,
}

impl Usage {
    /// Usage with `total_tokens` computed.
    pub fn new(prompt_tokens: usize, completion_tokens: usize) -> Self {
        Usage {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens + completion_tokens,
            prompt_tokens_details: None,
        }
    }

    /// With `prompt_tokens_details.cached_tokens`.
    pub fn with_cached(mut self, cached_tokens: usize) -> Self {
        self.prompt_tokens_details = Some(PromptTokensDetails { cached_tokens });
        self
    }
}

/// One choice of a completion response or stream chunk.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CompletionChoice {
    pub index: usize,
    pub text: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finish_reason: Option<FinishReason>,
    /// Generated token ids (vLLM's `return_token_ids` extension).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_ids: Option<Vec<u32>>,
}

/// The function part of a tool call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FunctionCall {
    pub name: String,
    /// The arguments as a JSON-encoded string, as OpenAI sends them.
    pub arguments: String,
}

/// A complete tool call in a chat response.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ResponseToolCall {
    pub id: String,
    /// Always `"function"`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub function: FunctionCall,
}

impl ResponseToolCall {
    /// A `function` tool call with the given id (from a parsed
    /// [`ToolCall`](crate::ToolCall)).
    pub fn from_parsed(id: String, call: &crate::ToolCall) -> Self {
        ResponseToolCall {
            id,
            kind: "function",
            function: FunctionCall {
                name: call.name.clone(),
                arguments: call.arguments_json(),
            },
        }
    }
}

/// `choices[].message` of a chat response.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ResponseMessage {
    /// Always `"assistant"`.
    pub role: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ResponseToolCall>>,
}

/// One choice of a chat response.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChatChoice {
    pub index: usize,
    pub message: ResponseMessage,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finish_reason: Option<FinishReason>,
    /// Generated token ids (vLLM's `return_token_ids` extension).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_ids: Option<Vec<u32>>,
}

/// The function part of a streamed tool-call delta.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct FunctionCallDelta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub arguments: Option<String>,
}

/// A streamed tool-call delta: the first for a call carries `id`, `type`
/// and the name; later ones append to `arguments`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ToolCallDelta {
    pub index: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<&'static str>,
    pub function: FunctionCallDelta,
}

/// `choices[].delta` of a chat stream chunk.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct Delta {
    /// `"assistant"` in the first chunk of a choice.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallDelta>>,
}

/// One choice of a chat stream chunk.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChunkChoice {
    pub index: usize,
    pub delta: Delta,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finish_reason: Option<FinishReason>,
    /// Generated token ids (vLLM's `return_token_ids` extension).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_ids: Option<Vec<u32>>,
}

/// The envelope shared by every response body and stream chunk: the
/// `object` string is fixed by the kind of choice it carries.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Response<C: Choice> {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<C>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

/// A kind of `choices[]` entry, naming the `object` of its envelope.
pub trait Choice: Serialize {
    /// The envelope's `object` field.
    const OBJECT: &'static str;
}

impl<C: Choice> Response<C> {
    /// An envelope without `usage` (set it on the final body or chunk).
    pub fn new(id: String, created: u64, model: String, choices: Vec<C>) -> Self {
        Response {
            id,
            object: C::OBJECT,
            created,
            model,
            choices,
            usage: None,
        }
    }
}

impl Choice for CompletionChoice {
    const OBJECT: &'static str = "text_completion";
}

impl Choice for ChatChoice {
    const OBJECT: &'static str = "chat.completion";
}

impl Choice for ChunkChoice {
    const OBJECT: &'static str = "chat.completion.chunk";
}

/// A `/v1/completions` response; streaming sends a sequence of these, each
/// with the new text.
pub type CompletionResponse = Response<CompletionChoice>;
/// A non-streaming `/v1/chat/completions` response.
pub type ChatCompletionResponse = Response<ChatChoice>;
/// A streamed chat chunk. With `include_usage`, the last chunk has empty
/// `choices` and `usage` set.
pub type ChatCompletionChunk = Response<ChunkChoice>;

#[cfg(test)]
mod tests {
    use super::*;

    const L: Limits = Limits {
        max_model_len: 1000,
        max_tokens_cap: 500,
        vocab_size: 100,
    };

    fn chat_err(body: &str) -> RequestError {
        parse_chat(body.as_bytes(), &L).unwrap_err()
    }

    fn comp_err(body: &str) -> RequestError {
        parse_completion(body.as_bytes(), &L).unwrap_err()
    }

    const MSG: &str = r#""messages":[{"role":"user","content":"hi"}]"#;

    #[test]
    fn chat_defaults_and_extras() {
        let v = parse_chat(
            format!(r#"{{{MSG},"user":"u","presence_penalty":0.5,"logit_bias":{{}}}}"#).as_bytes(),
            &L,
        )
        .unwrap();
        let p = &v.params;
        assert_eq!(p.max_tokens, None);
        assert_eq!(p.n, 1);
        assert!(!p.stream && !p.include_usage);
        assert_eq!(p.sampling.temperature, 1.0);
        assert_eq!(p.sampling.top_p, 1.0);
        assert_eq!(p.sampling.top_k, None);
        assert!(p.stop.is_empty());
        assert_eq!(v.logprobs, None);
        assert_eq!(v.request.messages[0].role, Role::User);
    }

    #[test]
    fn chat_full() {
        let body = r#"{"model":"m3","messages":[
            {"role":"system","content":"be brief"},
            {"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},
            {"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}]},
            {"role":"tool","content":"42","tool_call_id":"c1"}],
            "max_tokens":10,"max_completion_tokens":20,"temperature":0,"top_p":0.9,"top_k":-1,
            "seed":7,"stop":["x","y"],"n":2,"stream":true,"stream_options":{"include_usage":true},
            "logprobs":true,"top_logprobs":5,"tools":[{"type":"function"}],"tool_choice":"auto",
            "chat_template_kwargs":{"enable_thinking":false}}"#;
        let v = parse_chat(body.as_bytes(), &L).unwrap();
        assert_eq!(v.params.max_tokens, Some(20));
        assert_eq!(v.params.sampling.temperature, 0.0);
        assert_eq!(v.params.sampling.top_k, None);
        assert_eq!(v.params.sampling.seed, Some(7));
        assert_eq!(v.params.stop, ["x", "y"]);
        assert_eq!(v.params.n, 2);
        assert!(v.params.stream && v.params.include_usage);
        assert_eq!(v.logprobs, Some(5));
        let m = &v.request.messages;
        assert_eq!(m[1].content.as_ref().unwrap().text(), "ab");
        assert!(m[2].content.is_none() && m[2].tool_calls.is_some());
        assert_eq!(m[3].tool_call_id.as_deref(), Some("c1"));
        assert_eq!(v.request.tool_choice, Some(json!("auto")));
        assert_eq!(
            v.request.chat_template_kwargs.unwrap()["enable_thinking"],
            json!(false)
        );
    }

    #[test]
    fn chat_errors() {
        let e = chat_err("{\"messages\": [");
        assert_eq!(e.field, "body");
        assert!(e.message.contains("line 1 column"), "{}", e.message);
        assert_eq!(chat_err("[]").field, "body");
        assert_eq!(chat_err("{}").field, "messages");
        assert_eq!(chat_err(r#"{"messages":[]}"#).field, "messages");
        assert_eq!(
            chat_err(r#"{"messages":[{"role":"bot","content":"x"}]}"#).field,
            "messages[0].role"
        );
        assert_eq!(
            chat_err(r#"{"messages":[{"role":"user"}]}"#).field,
            "messages[0].content"
        );
        assert_eq!(
            chat_err(r#"{"messages":[{"role":"user","content":[{"type":"image_url"}]}]}"#).field,
            "messages[0].content[0].type"
        );
        let cases = [
            (r#""max_tokens":0"#, "max_tokens", "must be >= 1"),
            (r#""max_tokens":501"#, "max_tokens", "must be <= 500"),
            (r#""max_tokens":"5""#, "max_tokens", "invalid type"),
            (
                r#""max_completion_tokens":0"#,
                "max_completion_tokens",
                ">= 1",
            ),
            (r#""temperature":2.5"#, "temperature", "[0, 2]"),
            (r#""temperature":-0.1"#, "temperature", "[0, 2]"),
            (r#""top_p":0"#, "top_p", "(0, 1]"),
            (r#""top_p":1.1"#, "top_p", "(0, 1]"),
            (r#""top_k":-2"#, "top_k", ">= 0"),
            (r#""n":0"#, "n", "1..=8"),
            (r#""n":9"#, "n", "1..=8"),
            (r#""stop":["a","b","c","d","e"]"#, "stop", "at most 4"),
            (r#""stop":[""]"#, "stop", "empty"),
            (r#""stop":5"#, "stop", "string"),
            (r#""stream":"yes""#, "stream", "invalid type"),
            (r#""top_logprobs":3"#, "top_logprobs", "requires `logprobs`"),
            (
                r#""logprobs":true,"top_logprobs":21"#,
                "top_logprobs",
                "0..=20",
            ),
            (r#""tools":{}"#, "tools", "invalid type"),
        ];
        for (extra, field, msg) in cases {
            let e = chat_err(&format!("{{{MSG},{extra}}}"));
            assert_eq!(e.field, field, "{extra}");
            assert!(e.message.contains(msg), "{extra}: {}", e.message);
        }
    }

    #[test]
    fn error_json_shape() {
        let e = chat_err(&format!(r#"{{{MSG},"max_tokens":0}}"#));
        assert_eq!(
            e.to_string(),
            "invalid request: field `max_tokens`: must be >= 1"
        );
        assert_eq!(
            e.to_json(),
            json!({"error":{"message":"invalid request: field `max_tokens`: must be >= 1",
                "type":"invalid_request_error","param":"max_tokens","code":null}})
        );
    }

    #[test]
    fn completion() {
        let v = parse_completion(
            br#"{"prompt":[1,2,99],"max_tokens":5,"logprobs":3,"echo":true,"stop":"\n","foo":1}"#,
            &L,
        )
        .unwrap();
        assert_eq!(v.request.prompt, Prompt::Tokens(vec![1, 2, 99]));
        assert_eq!(v.params.max_tokens, Some(5));
        assert_eq!(v.params.stop, ["\n"]);
        assert_eq!(v.logprobs, Some(3));
        assert_eq!(v.request.echo, Some(true));
        let v = parse_completion(br#"{"prompt":"hello","top_k":40}"#, &L).unwrap();
        assert_eq!(v.request.prompt, Prompt::Text("hello".into()));
        assert_eq!(v.params.sampling.top_k, Some(40));

        assert_eq!(comp_err("{}").field, "prompt");
        assert!(comp_err(r#"{"prompt":[1,100]}"#).message.contains("100"));
        assert_eq!(comp_err(r#"{"prompt":[]}"#).field, "prompt");
        assert_eq!(comp_err(r#"{"prompt":[-1]}"#).field, "prompt");
        assert_eq!(comp_err(r#"{"prompt":["a"]}"#).field, "prompt");
        assert_eq!(comp_err(r#"{"prompt":5}"#).field, "prompt");
        assert_eq!(
            comp_err(r#"{"prompt":"a","logprobs":true}"#).field,
            "logprobs"
        );
        assert_eq!(
            comp_err(r#"{"prompt":"a","logprobs":21}"#).field,
            "logprobs"
        );
        assert_eq!(comp_err(r#"{"prompt":"a","n":9}"#).field, "n");
    }

    #[test]
    fn nulls_are_absent() {
        let v = parse_chat(
            format!(r#"{{{MSG},"max_tokens":null,"stop":null,"temperature":null,"tools":null}}"#)
                .as_bytes(),
            &L,
        )
        .unwrap();
        assert_eq!(v.params.max_tokens, None);
        assert!(v.params.stop.is_empty());
    }

    #[test]
    fn prompt_len() {
        assert_eq!(check_prompt_len(100, None, "prompt", &L).unwrap(), 500);
        assert_eq!(check_prompt_len(800, None, "prompt", &L).unwrap(), 200);
        assert_eq!(check_prompt_len(800, Some(200), "prompt", &L).unwrap(), 200);
        assert_eq!(
            check_prompt_len(800, Some(201), "prompt", &L)
                .unwrap_err()
                .field,
            "max_tokens"
        );
        assert_eq!(
            check_prompt_len(1000, None, "messages", &L)
                .unwrap_err()
                .field,
            "messages"
        );
        assert_eq!(check_prompt_len(999, None, "prompt", &L).unwrap(), 1);
    }

    #[test]
    fn serialize_responses() {
        let mut r = ChatCompletionResponse::new(
            "chatcmpl-1".into(),
            5,
            "m3".into(),
            vec![ChatChoice {
                index: 0,
                message: ResponseMessage {
                    role: "assistant",
                    content: Some("hi".into()),
                    reasoning_content: None,
                    tool_calls: Some(vec![ResponseToolCall {
                        id: "call_0".into(),
                        kind: "function",
                        function: FunctionCall {
                            name: "f".into(),
                            arguments: "{}".into(),
                        },
                    }]),
                },
                logprobs: None,
                finish_reason: Some(FinishReason::ToolCalls),
                token_ids: None,
            }],
        );
        r.usage = Some(Usage::new(3, 4));
        assert_eq!(
            serde_json::to_value(&r).unwrap(),
            json!({"id":"chatcmpl-1","object":"chat.completion","created":5,"model":"m3",
                "choices":[{"index":0,"message":{"role":"assistant","content":"hi",
                    "tool_calls":[{"id":"call_0","type":"function","function":{"name":"f","arguments":"{}"}}]},
                    "finish_reason":"tool_calls"}],
                "usage":{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7}})
        );
        let c = ChatCompletionChunk::new(
            "c".into(),
            1,
            "m3".into(),
            vec![ChunkChoice {
                index: 0,
                delta: Delta {
                    reasoning_content: Some("hmm".into()),
                    ..Default::default()
                },
                logprobs: None,
                finish_reason: None,
                token_ids: None,
            }],
        );
        assert_eq!(
            serde_json::to_value(&c).unwrap(),
            json!({"id":"c","object":"chat.completion.chunk","created":1,"model":"m3",
                "choices":[{"index":0,"delta":{"reasoning_content":"hmm"}}]})
        );
        let t = CompletionResponse::new(
            "cmpl".into(),
            1,
            "m3".into(),
            vec![CompletionChoice {
                index: 0,
                text: "x".into(),
                logprobs: None,
                finish_reason: Some(FinishReason::Length),
                token_ids: None,
            }],
        );
        assert_eq!(
            serde_json::to_value(&t).unwrap()["choices"][0],
            json!({"index":0,"text":"x","finish_reason":"length"})
        );
        assert_eq!(
            serde_json::to_value(FinishReason::Stop).unwrap(),
            json!("stop")
        );
    }
}
