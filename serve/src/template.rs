//! Chat templates: turning an OpenAI-style message list into the prompt text
//! a model was trained on.
//!
//! HuggingFace models ship their template as a Jinja2 string in
//! `tokenizer_config.json` (`chat_template`). [`ChatTemplate`] reads that file
//! and renders the template with [minijinja], set up the way `transformers`
//! sets up Jinja2: `trim_blocks` and `lstrip_blocks` on, no auto-escaping,
//! loop controls (`break` / `continue`) enabled, and these extras:
//!
//! * `raise_exception(msg)`: fails the render with [`TemplateError::Raised`].
//! * `tojson` filter: Python `json.dumps` style output (`", "` and `": "`
//!   separators, non-ASCII kept, optional `indent`), as `transformers`
//!   produces it; this replaces minijinja's compact, HTML-escaping `tojson`.
//! * `fromjson` filter: parses a JSON string (e.g. tool-call `arguments`).
//! * `strftime_now(fmt)`: the current UTC time; supports `%Y %y %m %d %H %M
//!   %S %b %B %%` (other `%x` pass through verbatim).
//! * A few Python methods minijinja lacks: on strings `strip`, `lstrip`,
//!   `rstrip` (optional chars), `startswith`, `endswith`, `split` (optional
//!   separator and maxsplit), `upper`, `lower`, `replace`; on maps `items`,
//!   `keys`, `values`, `get(key[, default])`. Other Python methods
//!   (`minijinja-contrib`'s full pycompat) are not provided.
//!
//! [`MINIMAX_STYLE_TEMPLATE`] is a built-in MiniMax-M2/M3-style template
//! ([`ChatTemplate::builtin`]), and [`starts_in_reasoning`] tells whether a
//! rendered prompt leaves the model inside an open `<think>` block.

use std::collections::BTreeMap;
use std::fmt;
use std::time::{SystemTime, UNIX_EPOCH};

use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{AutoEscape, Environment, Error, ErrorKind, State};
use serde_json::Map;

/// Marks errors raised by the template's own `raise_exception(...)`.
const RAISE_MARKER: &str = "\u{0}raise_exception\u{0}";

const DEFAULT_NAME: &str = "default";
const TOOL_USE_NAME: &str = "tool_use";

/// A MiniMax-M2/M3-style chat template (written for this crate).
///
/// Layout: `bos_token`, then a system turn `]~b]system\n…[e~[\n` (the first
/// message when it is a `system` message, otherwise a default prompt; the
/// tools, when given, are listed there inside `<tools>…</tools>`, one JSON
/// object per line, followed by the tool-call format), then one turn per
/// message: `]~b]user\n…[e~[\n`, `]~b]ai\n…[e~[\n`, and consecutive `tool`
/// messages as one user-side turn of `<response>…</response>` blocks.
///
/// Assistant `reasoning_content` is emitted as `<think>\n…\n</think>\n\n` only
/// for the last assistant message. Assistant `tool_calls` are rendered as
/// `<minimax:tool_call>\n<invoke name="…">\n<parameter name="k">v</parameter>\n
/// </invoke>\n</minimax:tool_call>`: string values verbatim, others as JSON.
/// `arguments` should be an object (the server passes it that way); a JSON
/// string is parsed with the `fromjson` filter.
///
/// With `add_generation_prompt` it ends with `]~b]ai\n<think>\n` while
/// thinking is on (kwarg `enable_thinking`, default true), else `]~b]ai\n`.
pub const MINIMAX_STYLE_TEMPLATE: &str = r#"{%- macro text(c) -%}
{%- if c is string -%}{{ c }}
{%- elif c is none or c is undefined -%}
{%- elif c is mapping -%}{{ c | tojson }}
{%- else -%}{%- for p in c -%}{%- if p is mapping and p.type == 'text' -%}{{ p.text }}{%- elif p is string -%}{{ p }}{%- endif -%}{%- endfor -%}
{%- endif -%}
{%- endmacro -%}
{%- set ns = namespace(last_ai=-1) -%}
{%- for m in messages -%}{%- if m.role == 'assistant' -%}{%- set ns.last_ai = loop.index0 -%}{%- endif -%}{%- endfor -%}
{{- bos_token -}}
]~b]system
{% if messages and messages[0].role == 'system' -%}
{{ text(messages[0].content) }}
{%- else -%}
You are a helpful assistant.
{%- endif %}
{% if tools %}


# Tools
You may call one or more tools to assist with the user query.
Here are the tools available in JSONSchema format:

<tools>
{% for t in tools %}
{{ (t.function if t.function is defined else t) | tojson }}
{% endfor %}
</tools>

When making tool calls, use XML format to invoke tools and pass parameters:

<minimax:tool_call>
<invoke name="tool-name">
<parameter name="param-key">param-value</parameter>
</invoke>
</minimax:tool_call>
{%- endif %}
[e~[
{% for m in messages %}
{% if m.role == 'system' and loop.first %}
{% elif m.role == 'system' %}
]~b]system
{{ text(m.content) }}[e~[
{% elif m.role == 'user' %}
]~b]user
{{ text(m.content) }}[e~[
{% elif m.role == 'tool' %}
{% if loop.first or loop.previtem.role != 'tool' %}
]~b]user
{% endif %}
<response>{{ text(m.content) }}</response>
{% if loop.last or loop.nextitem.role != 'tool' %}
[e~[
{% endif %}
{% elif m.role == 'assistant' %}
]~b]ai
{% if loop.index0 == ns.last_ai and m.reasoning_content is string and m.reasoning_content %}
<think>
{{ m.reasoning_content }}
</think>

{% endif %}
{{- text(m.content) -}}
{% if m.tool_calls %}
{% if text(m.content) %}

{% endif %}
<minimax:tool_call>
{% for tc in m.tool_calls %}
{% set f = tc.function if tc.function is defined else tc %}
{% set args = f.arguments | fromjson if f.arguments is string else f.arguments %}
<invoke name="{{ f.name }}">
{% if args is mapping %}
{% for k, v in args | items %}
<parameter name="{{ k }}">{{ v if v is string else v | tojson }}</parameter>
{% endfor %}
{% endif %}
</invoke>
{% endfor %}
</minimax:tool_call>
{%- endif -%}
[e~[
{% else %}
{{ raise_exception("unknown message role: " ~ m.role) }}
{% endif %}
{% endfor %}
{% if add_generation_prompt %}
]~b]ai
{% if enable_thinking is not defined or enable_thinking %}
<think>
{% endif %}
{% endif %}"#;

/// Errors reading or rendering a chat template. Each names the file (or
/// other source) the template came from.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TemplateError {
    /// The config file is not valid JSON (or not a JSON object).
    #[error("{file}: not a valid tokenizer config: {message}")]
    Json {
        /// Where the template came from.
        file: String,
        /// What is wrong.
        message: String,
    },
    /// `chat_template` is absent or null.
    #[error("{file}: missing field `chat_template` (the model ships no chat template)")]
    MissingTemplate {
        /// Where the template came from.
        file: String,
    },
    /// A field has the wrong type or shape.
    #[error("{file}: field `{field}`: {message}")]
    InvalidField {
        /// Where the template came from.
        file: String,
        /// The offending field, e.g. `chat_template` or `bos_token`.
        field: String,
        /// What was expected.
        message: String,
    },
    /// The template does not parse.
    #[error("{file}: syntax error in `{field}`{}: {message}", line.map(|l| format!(" at line {l}")).unwrap_or_default())]
    Syntax {
        /// Where the template came from.
        file: String,
        /// `chat_template`, or `chat_template[name]` for the list form.
        field: String,
        /// Line in the template, when known.
        line: Option<usize>,
        /// minijinja's description.
        message: String,
    },
    /// The template called `raise_exception(message)`.
    #[error("{file}: chat template raised an exception: {message}")]
    Raised {
        /// Where the template came from.
        file: String,
        /// The template's message.
        message: String,
    },
    /// Any other render failure.
    #[error("{file}: chat template render failed: {message}")]
    Render {
        /// Where the template came from.
        file: String,
        /// minijinja's description (with line info).
        message: String,
    },
}

/// A compiled chat template plus the special tokens it refers to.
#[derive(Clone)]
pub struct ChatTemplate {
    env: Environment<'static>,
    has_tool_use: bool,
    bos_token: Option<String>,
    eos_token: Option<String>,
    source: String,
}

impl fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("source", &self.source)
            .field("has_tool_use", &self.has_tool_use)
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .finish_non_exhaustive()
    }
}

impl ChatTemplate {
    /// The built-in [`MINIMAX_STYLE_TEMPLATE`] with bos `]~!b[` and eos `[e~[`.
    pub fn builtin() -> ChatTemplate {
        ChatTemplate::new(
            vec![(DEFAULT_NAME.into(), MINIMAX_STYLE_TEMPLATE.into())],
            Some("]~!b[".into()),
            Some("[e~[".into()),
            "<builtin MiniMax-style template>",
        )
        .expect("built-in template compiles")
    }

    /// Compiles a single template string. `source` names it in errors.
    pub fn from_template(
        template: &str,
        bos_token: Option<String>,
        eos_token: Option<String>,
        source: &str,
    ) -> Result<ChatTemplate, TemplateError> {
        ChatTemplate::new(
            vec![(DEFAULT_NAME.into(), template.into())],
            bos_token,
            eos_token,
            source,
        )
    }

    /// Reads a HuggingFace `tokenizer_config.json` (its text in `json`;
    /// `source` is the file name used in errors): `chat_template` (a string,
    /// or a list of `{name, template}` where `default` is required and
    /// `tool_use` is used for requests with tools), `bos_token` and
    /// `eos_token` (a string or an object with `content`).
    pub fn from_tokenizer_config(json: &str, source: &str) -> Result<ChatTemplate, TemplateError> {
        let file = || source.to_string();
        let config: serde_json::Value =
            serde_json::from_str(json).map_err(|e| TemplateError::Json {
                file: file(),
                message: e.to_string(),
            })?;
        let obj = config.as_object().ok_or_else(|| TemplateError::Json {
            file: file(),
            message: "top level is not a JSON object".into(),
        })?;
        let invalid = |field: &str, message: &str| TemplateError::InvalidField {
            file: file(),
            field: field.into(),
            message: message.into(),
        };
        let templates = match obj.get("chat_template") {
            None | Some(serde_json::Value::Null) => {
                return Err(TemplateError::MissingTemplate { file: file() })
            }
            Some(serde_json::Value::String(s)) => vec![(DEFAULT_NAME.to_string(), s.clone())],
            Some(serde_json::Value::Array(items)) => {
                let mut out = Vec::with_capacity(items.len());
                for (i, item) in items.iter().enumerate() {
                    let field = format!("chat_template[{i}]");
                    let name = item.get("name").and_then(|v| v.as_str());
                    let template = item.get("template").and_then(|v| v.as_str());
                    match (name, template) {
                        (Some(n), Some(t)) => out.push((n.to_string(), t.to_string())),
                        _ => {
                            return Err(invalid(
                                &field,
                                "expected an object with string fields `name` and `template`",
                            ))
                        }
                    }
                }
                if !out.iter().any(|(n, _)| n == DEFAULT_NAME) {
                    return Err(invalid(
                        "chat_template",
                        "the list has no template named \"default\"",
                    ));
                }
                out
            }
            Some(_) => {
                return Err(invalid(
                    "chat_template",
                    "expected a string or a list of {name, template} objects",
                ))
            }
        };
        let token = |field: &str| -> Result<Option<String>, TemplateError> {
            match obj.get(field) {
                None | Some(serde_json::Value::Null) => Ok(None),
                Some(serde_json::Value::String(s)) => Ok(Some(s.clone())),
                Some(serde_json::Value::Object(o)) => match o.get("content") {
                    Some(serde_json::Value::String(s)) => Ok(Some(s.clone())),
                    _ => Err(invalid(field, "object without a string `content`")),
                },
                Some(_) => Err(invalid(
                    field,
                    "expected a string or an object with `content`",
                )),
            }
        };
        let bos = token("bos_token")?;
        let eos = token("eos_token")?;
        ChatTemplate::new(templates, bos, eos, source)
    }

    fn new(
        templates: Vec<(String, String)>,
        bos_token: Option<String>,
        eos_token: Option<String>,
        source: &str,
    ) -> Result<ChatTemplate, TemplateError> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_keep_trailing_newline(false);
        env.set_auto_escape_callback(|_| AutoEscape::None);
        env.set_unknown_method_callback(py_method);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.add_filter("fromjson", fromjson);
        let single = templates.len() == 1;
        let mut has_tool_use = false;
        for (name, text) in templates {
            let field = if single && name == DEFAULT_NAME {
                "chat_template".to_string()
            } else {
                format!("chat_template[{name}]")
            };
            has_tool_use |= name == TOOL_USE_NAME;
            env.add_template_owned(name, text)
                .map_err(|e| TemplateError::Syntax {
                    file: source.to_string(),
                    field,
                    line: e.line(),
                    message: e
                        .detail()
                        .map(str::to_string)
                        .unwrap_or_else(|| e.kind().to_string()),
                })?;
        }
        Ok(ChatTemplate {
            env,
            has_tool_use,
            bos_token,
            eos_token,
            source: source.to_string(),
        })
    }

    /// The `bos_token` given to the template.
    pub fn bos_token(&self) -> Option<&str> {
        self.bos_token.as_deref()
    }

    /// The `eos_token` given to the template.
    pub fn eos_token(&self) -> Option<&str> {
        self.eos_token.as_deref()
    }

    /// Renders the prompt. The context holds every `kwargs` entry
    /// (`chat_template_kwargs`, e.g. `enable_thinking`), then `messages`,
    /// `tools` (undefined when `None`), `add_generation_prompt`, `bos_token`
    /// and `eos_token`; these last ones cannot be overridden by `kwargs`.
    /// With `tools` and a `tool_use` template, that one is used.
    pub fn render(
        &self,
        messages: &[serde_json::Value],
        tools: Option<&[serde_json::Value]>,
        add_generation_prompt: bool,
        kwargs: &Map<String, serde_json::Value>,
    ) -> Result<String, TemplateError> {
        let mut ctx: BTreeMap<String, Value> = kwargs
            .iter()
            .map(|(k, v)| (k.clone(), Value::from_serialize(v)))
            .collect();
        for reserved in [
            "messages",
            "tools",
            "add_generation_prompt",
            "bos_token",
            "eos_token",
        ] {
            ctx.remove(reserved);
        }
        ctx.insert("messages".into(), Value::from_serialize(messages));
        if let Some(tools) = tools {
            ctx.insert("tools".into(), Value::from_serialize(tools));
        }
        ctx.insert(
            "add_generation_prompt".into(),
            Value::from(add_generation_prompt),
        );
        if let Some(b) = &self.bos_token {
            ctx.insert("bos_token".into(), Value::from(b.as_str()));
        }
        if let Some(e) = &self.eos_token {
            ctx.insert("eos_token".into(), Value::from(e.as_str()));
        }
        let name = if tools.is_some() && self.has_tool_use {
            TOOL_USE_NAME
        } else {
            DEFAULT_NAME
        };
        let file = || self.source.clone();
        let tmpl = self
            .env
            .get_template(name)
            .map_err(|e| TemplateError::Render {
                file: file(),
                message: e.to_string(),
            })?;
        tmpl.render(Value::from(ctx)).map_err(|e| {
            let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(&e);
            while let Some(err) = cur {
                if let Some(me) = err.downcast_ref::<Error>() {
                    if let Some(msg) = me.detail().and_then(|d| d.strip_prefix(RAISE_MARKER)) {
                        return TemplateError::Raised {
                            file: file(),
                            message: msg.to_string(),
                        };
                    }
                }
                cur = err.source();
            }
            TemplateError::Render {
                file: file(),
                message: e.to_string(),
            }
        })
    }
}

/// Whether `rendered` ends inside an open `<think>` block (the last `<think>`
/// has no `</think>` after it), i.e. the model starts out reasoning.
pub fn starts_in_reasoning(rendered: &str) -> bool {
    starts_in_reasoning_with(rendered, "<think>", "</think>")
}

/// [`starts_in_reasoning`] with the checkpoint's spellings of the tags.
pub fn starts_in_reasoning_with(rendered: &str, open: &str, close: &str) -> bool {
    !open.is_empty()
        && rendered
            .rfind(open)
            .is_some_and(|i| !rendered[i..].contains(close))
}

fn raise_exception(msg: String) -> Result<Value, Error> {
    Err(Error::new(
        ErrorKind::InvalidOperation,
        format!("{RAISE_MARKER}{msg}"),
    ))
}

/// `json.dumps` separators: `", "` between items, `": "` after keys.
struct PyCompact;

impl serde_json::ser::Formatter for PyCompact {
    fn begin_array_value<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if first {
            Ok(())
        } else {
            w.write_all(b", ")
        }
    }
    fn begin_object_key<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if first {
            Ok(())
        } else {
            w.write_all(b", ")
        }
    }
    fn begin_object_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        w.write_all(b": ")
    }
}

fn tojson(value: &Value, indent: Option<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    let indent = match kwargs.get::<Option<Value>>("indent")? {
        Some(v) => Some(v),
        None => indent,
    };
    // Accepted for compatibility with transformers' signature; ignored.
    for unused in ["ensure_ascii", "separators", "sort_keys"] {
        let _: Option<Value> = kwargs.get(unused)?;
    }
    kwargs.assert_all_used()?;
    let fail =
        |e: serde_json::Error| Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}"));
    let mut out = Vec::new();
    match indent.filter(|v| !v.is_none() && !v.is_undefined()) {
        None => {
            let mut ser = serde_json::Serializer::with_formatter(&mut out, PyCompact);
            serde::Serialize::serialize(value, &mut ser).map_err(fail)?;
        }
        Some(ind) => {
            let pad = match ind.as_str() {
                Some(s) => s.to_string(),
                None => {
                    let n = usize::try_from(ind.clone()).map_err(|_| {
                        Error::new(
                            ErrorKind::InvalidOperation,
                            "tojson: indent must be an integer or string",
                        )
                    })?;
                    " ".repeat(n)
                }
            };
            let fmt = serde_json::ser::PrettyFormatter::with_indent(pad.as_bytes());
            let mut ser = serde_json::Serializer::with_formatter(&mut out, fmt);
            serde::Serialize::serialize(value, &mut ser).map_err(fail)?;
        }
    }
    let s = String::from_utf8(out)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, e.to_string()))?;
    Ok(Value::from_safe_string(s))
}

fn fromjson(text: &str) -> Result<Value, Error> {
    serde_json::from_str::<serde_json::Value>(text)
        .map(|v| Value::from_serialize(&v))
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("fromjson: {e}")))
}

fn strftime_now(fmt: &str) -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    format_utc(secs, fmt)
}

/// Formats Unix time `secs` (UTC) with a subset of `strftime`.
fn format_utc(secs: u64, fmt: &str) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    let days = (secs / 86_400) as i64;
    let tod = secs % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let mut out = String::new();
    let mut chars = fmt.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&year.to_string()),
            Some('y') => out.push_str(&format!("{:02}", year.rem_euclid(100))),
            Some('m') => out.push_str(&format!("{month:02}")),
            Some('d') => out.push_str(&format!("{day:02}")),
            Some('H') => out.push_str(&format!("{:02}", tod / 3600)),
            Some('M') => out.push_str(&format!("{:02}", tod / 60 % 60)),
            Some('S') => out.push_str(&format!("{:02}", tod % 60)),
            Some('B') => out.push_str(MONTHS[(month - 1) as usize]),
            Some('b') => out.push_str(&MONTHS[(month - 1) as usize][..3]),
            Some('%') => out.push('%'),
            Some(o) => {
                out.push('%');
                out.push(o);
            }
            None => out.push('%'),
        }
    }
    out
}

/// Python `str` / `dict` methods that templates commonly call.
fn py_method(_state: &State, value: &Value, method: &str, args: &[Value]) -> Result<Value, Error> {
    let unknown = || {
        Error::new(
            ErrorKind::UnknownMethod,
            format!("{} has no method {method}", value.kind()),
        )
    };
    let arg_str = |i: usize| -> Result<Option<&str>, Error> {
        match args.get(i) {
            None => Ok(None),
            Some(v) if v.is_none() => Ok(None),
            Some(v) => v.as_str().map(Some).ok_or_else(|| {
                Error::new(
                    ErrorKind::InvalidOperation,
                    format!("{method}: expected a string"),
                )
            }),
        }
    };
    if let Some(s) = value.as_str() {
        let chars: Option<Vec<char>> = arg_str(0)?.map(|c| c.chars().collect());
        let trim = |c: char| match &chars {
            Some(set) => set.contains(&c),
            None => c.is_whitespace(),
        };
        return Ok(match method {
            "strip" => Value::from(s.trim_matches(trim)),
            "lstrip" => Value::from(s.trim_start_matches(trim)),
            "rstrip" => Value::from(s.trim_end_matches(trim)),
            "upper" => Value::from(s.to_uppercase()),
            "lower" => Value::from(s.to_lowercase()),
            "startswith" | "endswith" => {
                let pats: Vec<String> = match args.first() {
                    Some(v) if v.kind() == ValueKind::Seq => v
                        .try_iter()?
                        .filter_map(|p| p.as_str().map(str::to_string))
                        .collect(),
                    _ => vec![arg_str(0)?.unwrap_or_default().to_string()],
                };
                let hit = pats.iter().any(|p| {
                    if method == "startswith" {
                        s.starts_with(p.as_str())
                    } else {
                        s.ends_with(p.as_str())
                    }
                });
                Value::from(hit)
            }
            "replace" => {
                let (Some(from), Some(to)) = (arg_str(0)?, arg_str(1)?) else {
                    return Err(Error::new(ErrorKind::MissingArgument, "replace(old, new)"));
                };
                Value::from(s.replace(from, to))
            }
            "split" => {
                let max = args
                    .get(1)
                    .and_then(|v| i64::try_from(v.clone()).ok())
                    .filter(|&n| n >= 0)
                    .map(|n| n as usize);
                let parts: Vec<Value> = match (arg_str(0)?, max) {
                    (Some(sep), Some(n)) => s.splitn(n + 1, sep).map(Value::from).collect(),
                    (Some(sep), None) => s.split(sep).map(Value::from).collect(),
                    (None, _) => s.split_whitespace().map(Value::from).collect(),
                };
                Value::from(parts)
            }
            _ => return Err(unknown()),
        });
    }
    if value.kind() == ValueKind::Map {
        let keys: Vec<Value> = value.try_iter()?.collect();
        return Ok(match method {
            "keys" => Value::from(keys),
            "values" => Value::from(
                keys.iter()
                    .map(|k| value.get_item(k))
                    .collect::<Result<Vec<_>, _>>()?,
            ),
            "items" => Value::from(
                keys.iter()
                    .map(|k| Ok(Value::from(vec![k.clone(), value.get_item(k)?])))
                    .collect::<Result<Vec<_>, Error>>()?,
            ),
            "get" => {
                let key = args
                    .first()
                    .ok_or_else(|| Error::new(ErrorKind::MissingArgument, "get(key[, default])"))?;
                let v = value.get_item(key)?;
                if v.is_undefined() {
                    args.get(1).cloned().unwrap_or(Value::from(()))
                } else {
                    v
                }
            }
            _ => return Err(unknown()),
        });
    }
    Err(unknown())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn render(
        t: &ChatTemplate,
        msgs: serde_json::Value,
        tools: Option<serde_json::Value>,
        kw: serde_json::Value,
    ) -> String {
        let msgs = msgs.as_array().unwrap().clone();
        let tools = tools.map(|t| t.as_array().unwrap().clone());
        t.render(&msgs, tools.as_deref(), true, kw.as_object().unwrap())
            .unwrap()
    }

    #[test]
    fn builtin_system_user() {
        let out = render(
            &ChatTemplate::builtin(),
            json!([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]),
            None,
            json!({}),
        );
        assert_eq!(
            out,
            "]~!b[]~b]system\nBe brief.[e~[\n]~b]user\nHi[e~[\n]~b]ai\n<think>\n"
        );
        assert!(starts_in_reasoning(&out));
    }

    #[test]
    fn builtin_thinking_off() {
        let out = render(
            &ChatTemplate::builtin(),
            json!([{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]),
            None,
            json!({"enable_thinking": false}),
        );
        assert_eq!(
            out,
            "]~!b[]~b]system\nYou are a helpful assistant.[e~[\n]~b]user\nHi[e~[\n]~b]ai\n"
        );
        assert!(!starts_in_reasoning(&out));
    }

    #[test]
    fn builtin_tools() {
        let tools = json!([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}},
                           {"type": "function", "function": {"name": "f", "description": "<x> é"}}]);
        let out = render(
            &ChatTemplate::builtin(),
            json!([{"role": "user", "content": "Hi"}]),
            Some(tools),
            json!({}),
        );
        assert!(
            out.starts_with("]~!b[]~b]system\nYou are a helpful assistant.\n\n# Tools\n"),
            "{out}"
        );
        assert!(out.contains(
            "<tools>\n{\"name\": \"get_weather\", \"parameters\": {\"type\": \"object\"}}\n{\"description\": \"<x> é\", \"name\": \"f\"}\n</tools>\n"
        ), "{out}");
        assert!(
            out.contains("</minimax:tool_call>[e~[\n]~b]user\nHi[e~[\n]~b]ai\n<think>\n"),
            "{out}"
        );
    }

    #[test]
    fn builtin_tool_call_and_result() {
        let msgs = json!([
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": "old", "reasoning_content": "dropped"},
            {"role": "user", "content": "Paris and Rome?"},
            {"role": "assistant", "content": null, "reasoning_content": "need tool",
             "tool_calls": [{"type": "function", "function": {"name": "w", "arguments": {"city": "Paris", "days": 2}}},
                            {"type": "function", "function": {"name": "w", "arguments": "{\"city\": \"Rome\"}"}}]},
            {"role": "tool", "content": "sunny"},
            {"role": "tool", "content": "rain"},
        ]);
        let out = render(&ChatTemplate::builtin(), msgs, None, json!({}));
        let expected = "]~!b[]~b]system\nYou are a helpful assistant.[e~[\n]~b]user\nWeather?[e~[\n\
            ]~b]ai\nold[e~[\n]~b]user\nParis and Rome?[e~[\n\
            ]~b]ai\n<think>\nneed tool\n</think>\n\n<minimax:tool_call>\n<invoke name=\"w\">\n\
            <parameter name=\"city\">Paris</parameter>\n<parameter name=\"days\">2</parameter>\n</invoke>\n\
            <invoke name=\"w\">\n<parameter name=\"city\">Rome</parameter>\n</invoke>\n</minimax:tool_call>[e~[\n\
            ]~b]user\n<response>sunny</response>\n<response>rain</response>\n[e~[\n]~b]ai\n<think>\n";
        assert_eq!(out, expected);
    }

    #[test]
    fn config_string_and_list_forms() {
        let cfg = json!({
            "bos_token": {"content": "<s>", "lstrip": false},
            "eos_token": "</s>",
            "chat_template": "{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content | trim }}{% endfor %}{% if add_generation_prompt %}>{% endif %}{{ eos_token }}{{ mode }}",
        });
        let t =
            ChatTemplate::from_tokenizer_config(&cfg.to_string(), "tokenizer_config.json").unwrap();
        assert_eq!(t.bos_token(), Some("<s>"));
        let out = render(
            &t,
            json!([{"role": "user", "content": " hi "}]),
            None,
            json!({"mode": "x"}),
        );
        assert_eq!(out, "<s>[user]hi></s>x");

        let cfg = json!({"chat_template": [
            {"name": "default", "template": "D{{ messages | length }}{{ 'a,b'.split(',') | join('|') }}"},
            {"name": "tool_use", "template": "T{{ tools | tojson }}{{ {'k': 1}.items() | list | length }}"},
        ]});
        let t = ChatTemplate::from_tokenizer_config(&cfg.to_string(), "tc.json").unwrap();
        assert_eq!(
            render(&t, json!([{"role": "user"}]), None, json!({})),
            "D1a|b"
        );
        assert_eq!(
            render(&t, json!([]), Some(json!([{"a": [1, 2]}])), json!({})),
            "T[{\"a\": [1, 2]}]1"
        );
    }

    #[test]
    fn errors() {
        let e = ChatTemplate::from_tokenizer_config(
            r#"{"eos_token": "x"}"#,
            "models/m/tokenizer_config.json",
        )
        .unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("models/m/tokenizer_config.json") && msg.contains("chat_template"),
            "{msg}"
        );

        let e =
            ChatTemplate::from_tokenizer_config(r#"{"chat_template": 3}"#, "c.json").unwrap_err();
        assert!(
            matches!(e, TemplateError::InvalidField { ref field, .. } if field == "chat_template"),
            "{e}"
        );

        let cfg = json!({"chat_template": "line one\n{% if x %}\n{{ x }"});
        let e = ChatTemplate::from_tokenizer_config(&cfg.to_string(), "c.json").unwrap_err();
        let TemplateError::Syntax { line, .. } = &e else {
            panic!("{e}")
        };
        assert!(line.is_some(), "{e}");
        assert!(
            e.to_string()
                .starts_with("c.json: syntax error in `chat_template` at line"),
            "{e}"
        );

        let t = ChatTemplate::from_template(
            "{{ raise_exception('no system role, ' ~ 'sorry') }}",
            None,
            None,
            "t.jinja",
        )
        .unwrap();
        let e = t.render(&[], None, false, &Map::new()).unwrap_err();
        assert_eq!(
            e,
            TemplateError::Raised {
                file: "t.jinja".into(),
                message: "no system role, sorry".into()
            }
        );
    }

    #[test]
    fn kwargs_cannot_override_messages() {
        let t = ChatTemplate::from_template(
            "{{ messages | length }} {{ add_generation_prompt }} {{ thinking_mode }}",
            None,
            None,
            "t",
        )
        .unwrap();
        let out = render(
            &t,
            json!([{"role": "user", "content": "a"}]),
            None,
            json!({"messages": [], "add_generation_prompt": false, "thinking_mode": "on"}),
        );
        assert_eq!(out, "1 True on");
    }

    #[test]
    fn reasoning_detection_and_dates() {
        assert!(starts_in_reasoning("x<think>\n"));
        assert!(!starts_in_reasoning("<think>a</think>b"));
        assert!(!starts_in_reasoning("plain"));
        assert!(starts_in_reasoning("<think>a</think><think>"));
        assert_eq!(
            format_utc(951_782_400 + 3723, "%Y-%m-%d %H:%M:%S %d %b %B %y %%"),
            "2000-02-29 01:02:03 29 Feb February 00 %"
        );
        let t =
            ChatTemplate::from_template("{{ strftime_now('%Y-%m-%d') }}", None, None, "t").unwrap();
        assert_eq!(t.render(&[], None, false, &Map::new()).unwrap().len(), 10);
    }
}
