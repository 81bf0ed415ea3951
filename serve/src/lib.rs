//! Serving pieces for an OpenAI-compatible m3 server.
//!
//! The first piece is [`OutputParser`]: MiniMax models write their reasoning,
//! their answer and their tool calls into one text stream, marked up with
//! tags (`<think>…</think>`, `<minimax:tool_call><invoke name="…">…`). An
//! OpenAI-style API returns those as three separate things
//! (`reasoning_content`, `content`, `tool_calls`), and it has to do so while
//! the text is still being generated, one detokenized delta at a time. The
//! parser therefore works incrementally and gives the same result for every
//! way of cutting the text into deltas: it holds back any suffix that might
//! still become a tag, so tag text never leaks into what a client sees.
//!
//! ```
//! use m3_serve::{Event, OutputParser, ParserOptions};
//!
//! let mut p = OutputParser::new(ParserOptions::default()).unwrap();
//! let mut events = p.push("<think>hmm</think>Hi!<minimax:tool_call>\n<invoke name=\"f\">");
//! events.extend(p.push("\n<parameter name=\"n\">3</parameter>\n</invoke>\n</minimax:tool_call>"));
//! let fin = p.finish();
//! assert!(fin.events.is_empty() && fin.truncated_tool_call.is_none());
//! assert_eq!(events[0], Event::Reasoning("hmm".into()));
//! assert_eq!(events[1], Event::Content("Hi!".into()));
//! let Event::ToolCall(call) = &events[2] else { panic!() };
//! assert_eq!(call.arguments_json(), r#"{"n":3}"#);
//! ```
//!
//! Around it:
//!
//! * [`protocol`]: OpenAI request types for `/v1/completions` and
//!   `/v1/chat/completions`, their validation (errors name the field and
//!   serialize to OpenAI's 400 body), and the response / stream-chunk types.
//! * [`StopMatcher`] ([`stop`]): `stop` strings matched on the generated
//!   text while it streams, holding back only what might still become a
//!   stop string.
//! * [`IncrementalDetokenizer`] ([`detok`]): token ids to text deltas that
//!   never split a UTF-8 character and keep context-dependent spacing right.
//! * [`ChatTemplate`] ([`template`]): HuggingFace chat templates from
//!   `tokenizer_config.json`, rendered with minijinja, plus a built-in
//!   MiniMax-style template ([`MINIMAX_STYLE_TEMPLATE`]) and
//!   [`starts_in_reasoning`] to tell whether a prompt opens a `<think>` block.
//! * [`engine`]: the engine thread that owns the loaded model and runs the
//!   scheduler loop, fed through channels; [`metrics`] what it records.
//! * [`server`]: the axum router (`/v1/models`, `/v1/completions`,
//!   `/v1/chat/completions`, `/health`, `/metrics`), SSE streaming, API key.

pub mod detok;
pub mod engine;
pub mod metrics;
mod parser;
pub mod protocol;
mod schema;
pub mod server;
pub mod stop;
mod tags;
pub mod template;

pub use detok::IncrementalDetokenizer;
pub use parser::{Event, Finish, OutputParser, PartialToolCall, ToolCall};
pub use protocol::{check_prompt_len, parse_chat, parse_completion, Limits, RequestError};
pub use schema::{convert_value, ToolSchemas};
pub use stop::{StopMatcher, StopStep};
pub use tags::{ConfigError, ParserOptions, Tags};
pub use template::{
    starts_in_reasoning, starts_in_reasoning_with, ChatTemplate, TemplateError,
    MINIMAX_STYLE_TEMPLATE,
};
