//! The incremental splitter of model output into reasoning, content and
//! tool calls.
//!
//! # Behaviour
//!
//! * **Channels.** Text outside any tag is content. With reasoning enabled,
//!   `think_start` (anywhere in content) switches to reasoning and
//!   `think_end` switches back; tool-call markup inside reasoning is just
//!   reasoning text (the model is thinking about a call, not making one).
//!   With reasoning disabled, think tags are ordinary content.
//! * **Whitespace.** Leading whitespace is dropped at the start of reasoning,
//!   right after `think_end` and right after a tool-call block: the model lays
//!   those out with newlines that are not part of what it says. Everything
//!   else is passed through byte for byte.
//! * **Holding back.** A suffix of the received text that could still grow
//!   into a tag is held until more text decides it, so no tag or partial tag
//!   is ever emitted as text, whatever the chunking. The concatenation of the
//!   emitted reasoning, the concatenation of the content and the list of
//!   tool calls do not depend on how the stream is cut into deltas.
//! * **Tool calls.** Inside a `tool_call_start … tool_call_end` block the
//!   parser expects `invoke` elements, each holding `parameter` elements,
//!   with only whitespace between elements. A call is emitted whole, as soon
//!   as its `invoke_end` arrives; calls are numbered from 0 over the stream.
//! * **`</parameter>` inside a value.** A `parameter_end` closes the value
//!   only if the next non-whitespace text is `parameter_start` or
//!   `invoke_end`; otherwise it is part of the value. A value that is still
//!   undecided at [`OutputParser::finish`] is closed by its pending
//!   `parameter_end`.
//! * **Malformed blocks.** If the block holds anything else (text between
//!   elements, `<invoke>` without a name, a name containing `<`, `>` or a
//!   newline, …), the parser gives up on the rest of that block: the raw
//!   text of the block not yet accounted for by an emitted call — up to the
//!   offending text — is emitted verbatim as content, and parsing resumes in
//!   content mode at the offending text. The model's output is thus shown
//!   rather than silently dropped, and calls completed before the defect
//!   stay valid. A malformed block never panics.
//! * **End of stream.** See [`OutputParser::finish`].

use serde_json::{Map, Value};

use crate::schema::{convert_value, strip_layout_newlines, ToolSchemas};
use crate::tags::{ConfigError, ParserOptions, Tags};

/// One piece of parsed output, in stream order.
///
/// Within one [`OutputParser::push`] result, adjacent text of the same
/// channel is merged into a single event.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// Reasoning text (OpenAI `reasoning_content`).
    Reasoning(String),
    /// Answer text (OpenAI `content`).
    Content(String),
    /// A complete tool call.
    ToolCall(ToolCall),
}

/// A complete tool call, emitted when its `invoke_end` is seen.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    /// Position of the call among the stream's calls, from 0 (OpenAI
    /// `tool_calls[].index`).
    pub index: usize,
    /// The function name from the `invoke` tag.
    pub name: String,
    /// Typed argument values (see [`convert_value`]). Keys are in
    /// `serde_json::Map` order (sorted unless serde_json's
    /// `preserve_order` is on); a repeated parameter keeps its last value.
    pub arguments: Map<String, Value>,
}

impl ToolCall {
    /// The OpenAI `function.arguments` string: the arguments as compact JSON.
    pub fn arguments_json(&self) -> String {
        arguments_to_json(&self.arguments)
    }
}

fn arguments_to_json(arguments: &Map<String, Value>) -> String {
    // Serializing a map of JSON values with string keys cannot fail; the
    // fallback only keeps this path free of panics.
    serde_json::to_string(arguments).unwrap_or_else(|_| String::from("{}"))
}

/// What was parsed of a call the stream cut off before its `invoke_end`.
#[derive(Debug, Clone, PartialEq)]
pub struct PartialToolCall {
    /// The index the call would have had.
    pub index: usize,
    /// The function name, if its `invoke` tag was complete.
    pub name: Option<String>,
    /// The parameters whose values were complete.
    pub arguments: Map<String, Value>,
    /// A parameter whose value was still open: its name and the raw text
    /// received so far (layout newlines stripped as for a complete value).
    pub unfinished_parameter: Option<(String, String)>,
}

impl PartialToolCall {
    /// The complete arguments as compact JSON.
    pub fn arguments_json(&self) -> String {
        arguments_to_json(&self.arguments)
    }
}

/// The result of [`OutputParser::finish`].
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Finish {
    /// Text that had been held back, flushed to the channel it was in.
    pub events: Vec<Event>,
    /// The call that was open when the stream ended, if an `invoke_start`
    /// had been seen for it.
    pub truncated_tool_call: Option<PartialToolCall>,
    /// The stream ended inside a tool-call block (with or without an open
    /// call). Its raw markup is not emitted as content.
    pub unterminated_tool_block: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Content,
    Reasoning,
    Tool,
}

/// Where the parser is inside a tool-call block.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Phase {
    /// Expecting `invoke_start` or `tool_call_end`.
    BetweenInvokes,
    /// Inside an invoke: expecting `parameter_start` or `invoke_end`.
    InInvoke,
    /// Inside a value that starts at `value_start` in the buffer; no
    /// closing tag can start before `scan`.
    InValue {
        name: String,
        value_start: usize,
        scan: usize,
    },
}

#[derive(Debug)]
struct OpenCall {
    name: String,
    arguments: Map<String, Value>,
}

/// Tool-block state. The buffer then holds the block's raw text not yet
/// accounted for by an emitted call, so that a malformed block can be shown
/// verbatim.
#[derive(Debug)]
struct ToolState {
    /// Parse cursor into the buffer.
    pos: usize,
    phase: Phase,
    call: Option<OpenCall>,
}

impl ToolState {
    fn new(pos: usize) -> Self {
        Self {
            pos,
            phase: Phase::BetweenInvokes,
            call: None,
        }
    }
}

/// What to do next in a tool block, decided from the buffer alone.
enum Decision {
    NeedMore,
    /// Need more text; no closing tag starts before this offset.
    NeedMoreScan(usize),
    BlockEnd {
        after: usize,
    },
    OpenInvoke {
        name: String,
        after: usize,
    },
    OpenParam {
        name: String,
        after: usize,
    },
    CloseInvoke {
        after: usize,
    },
    CloseParam {
        value_end: usize,
        after: usize,
    },
    /// The `parameter_end` found is part of the value; search on from here.
    LiteralClose {
        next_scan: usize,
    },
    Malformed {
        at: usize,
    },
}

/// Splits a MiniMax output stream into [`Event`]s. See the module docs
/// for the exact behaviour.
#[derive(Debug)]
pub struct OutputParser {
    tags: Tags,
    reasoning_enabled: bool,
    schemas: ToolSchemas,
    mode: Mode,
    /// Text received but not yet emitted (text modes), or the unaccounted
    /// raw block text (tool mode).
    buf: String,
    tool: ToolState,
    /// Drop whitespace until the next non-whitespace text is emitted.
    trim_leading: bool,
    next_index: usize,
}

impl OutputParser {
    /// A parser for one output stream. Fails only on unusable tag spellings.
    pub fn new(options: ParserOptions) -> Result<Self, ConfigError> {
        options.tags.validate()?;
        let in_reasoning = options.reasoning_enabled && options.starts_in_reasoning;
        Ok(Self {
            tags: options.tags,
            reasoning_enabled: options.reasoning_enabled,
            schemas: options.tool_schemas,
            mode: if in_reasoning {
                Mode::Reasoning
            } else {
                Mode::Content
            },
            buf: String::new(),
            tool: ToolState::new(0),
            trim_leading: in_reasoning,
            next_index: 0,
        })
    }

    /// Feeds the next piece of generated text; returns what it decided.
    pub fn push(&mut self, delta: &str) -> Vec<Event> {
        self.buf.push_str(delta);
        let mut out = Vec::new();
        while self.step(&mut out) {}
        out
    }

    /// Ends the stream.
    ///
    /// * In content or reasoning, the held-back text (a possible start of a
    ///   tag that never completed) is emitted to that channel as text.
    /// * Inside a tool-call block, nothing of the block's markup is emitted.
    ///   `unterminated_tool_block` is set, and if a call was open (its
    ///   `invoke_start` seen) it is returned as `truncated_tool_call` with
    ///   its name (if the tag was complete) and its complete parameters. A
    ///   value followed by a still-undecided `parameter_end` counts as
    ///   complete; a value without one is `unfinished_parameter`.
    pub fn finish(mut self) -> Finish {
        let mut events = Vec::new();
        if self.mode != Mode::Tool {
            let text = std::mem::take(&mut self.buf);
            let reasoning = self.mode == Mode::Reasoning;
            emit_text(&mut events, &mut self.trim_leading, reasoning, &text);
            return Finish {
                events,
                truncated_tool_call: None,
                unterminated_tool_block: false,
            };
        }
        let index = self.next_index;
        let tags = &self.tags;
        let buf = &self.buf;
        let truncated = match std::mem::replace(&mut self.tool.phase, Phase::BetweenInvokes) {
            Phase::BetweenInvokes => {
                let p = skip_ws(buf, self.tool.pos);
                buf[p..]
                    .starts_with(tags.invoke_start.as_str())
                    .then(|| PartialToolCall {
                        index,
                        name: None,
                        arguments: Map::new(),
                        unfinished_parameter: None,
                    })
            }
            Phase::InInvoke => self.tool.call.take().map(|c| PartialToolCall {
                index,
                name: Some(c.name),
                arguments: c.arguments,
                unfinished_parameter: None,
            }),
            Phase::InValue {
                name,
                value_start,
                scan,
            } => self.tool.call.take().map(|mut c| {
                let raw_end = buf
                    .get(scan..)
                    .and_then(|s| s.find(tags.parameter_end.as_str()))
                    .map(|rel| scan + rel);
                let raw = buf.get(value_start..raw_end.unwrap_or(buf.len()));
                let raw = strip_layout_newlines(raw.unwrap_or(""));
                let unfinished_parameter = if raw_end.is_some() {
                    let ty = self.schemas.param_type(&c.name, &name);
                    c.arguments.insert(name, convert_value(raw, ty));
                    None
                } else {
                    Some((name, raw.to_string()))
                };
                PartialToolCall {
                    index,
                    name: Some(c.name),
                    arguments: c.arguments,
                    unfinished_parameter,
                }
            }),
        };
        Finish {
            events,
            truncated_tool_call: truncated,
            unterminated_tool_block: true,
        }
    }

    /// One parsing step; `true` if it made progress (call again).
    fn step(&mut self, out: &mut Vec<Event>) -> bool {
        match self.mode {
            Mode::Content | Mode::Reasoning => self.text_step(out),
            Mode::Tool => {
                let decision = self.decide_tool();
                self.apply_tool(decision, out)
            }
        }
    }

    fn text_step(&mut self, out: &mut Vec<Event>) -> bool {
        let reasoning = self.mode == Mode::Reasoning;
        let t = &self.tags;
        let mut candidates: Vec<(&str, Mode)> = Vec::with_capacity(2);
        if reasoning {
            candidates.push((&t.think_end, Mode::Content));
        } else {
            if self.reasoning_enabled {
                candidates.push((&t.think_start, Mode::Reasoning));
            }
            candidates.push((&t.tool_call_start, Mode::Tool));
        }
        let Some((idx, tag_len, target)) = find_earliest(&self.buf, &candidates) else {
            let hold = held_suffix_len(&self.buf, &candidates);
            let emit_len = self.buf.len() - hold;
            if emit_len > 0 {
                let text: String = self.buf.drain(..emit_len).collect();
                emit_text(out, &mut self.trim_leading, reasoning, &text);
            }
            return false;
        };
        let rest = self.buf.split_off(idx);
        let before = std::mem::replace(&mut self.buf, rest);
        emit_text(out, &mut self.trim_leading, reasoning, &before);
        if target == Mode::Tool {
            // Keep the start tag in the buffer: it is part of the raw block
            // text shown if the block turns out malformed.
            self.tool = ToolState::new(tag_len);
        } else {
            self.buf.drain(..tag_len);
            self.trim_leading = true;
        }
        self.mode = target;
        true
    }

    fn decide_tool(&self) -> Decision {
        let t = &self.tags;
        let buf = self.buf.as_str();
        match &self.tool.phase {
            Phase::BetweenInvokes => {
                let p = skip_ws(buf, self.tool.pos);
                let rest = &buf[p..];
                if rest.is_empty() {
                    Decision::NeedMore
                } else if rest.starts_with(t.tool_call_end.as_str()) {
                    Decision::BlockEnd {
                        after: p + t.tool_call_end.len(),
                    }
                } else if rest.starts_with(t.invoke_start.as_str()) {
                    match parse_name_attr(buf, p + t.invoke_start.len()) {
                        Attr::Done { name, after } => Decision::OpenInvoke { name, after },
                        Attr::NeedMore => Decision::NeedMore,
                        Attr::Bad => Decision::Malformed { at: p },
                    }
                } else if is_prefix_of_any(rest, &[&t.tool_call_end, &t.invoke_start]) {
                    Decision::NeedMore
                } else {
                    Decision::Malformed { at: p }
                }
            }
            Phase::InInvoke => {
                let p = skip_ws(buf, self.tool.pos);
                let rest = &buf[p..];
                if rest.is_empty() {
                    Decision::NeedMore
                } else if rest.starts_with(t.invoke_end.as_str()) {
                    Decision::CloseInvoke {
                        after: p + t.invoke_end.len(),
                    }
                } else if rest.starts_with(t.parameter_start.as_str()) {
                    match parse_name_attr(buf, p + t.parameter_start.len()) {
                        Attr::Done { name, after } => Decision::OpenParam { name, after },
                        Attr::NeedMore => Decision::NeedMore,
                        Attr::Bad => Decision::Malformed { at: p },
                    }
                } else if is_prefix_of_any(rest, &[&t.invoke_end, &t.parameter_start]) {
                    Decision::NeedMore
                } else {
                    Decision::Malformed { at: p }
                }
            }
            Phase::InValue { scan, .. } => {
                let scan = *scan;
                let end_tag = t.parameter_end.as_str();
                let Some(rel) = buf.get(scan..).and_then(|s| s.find(end_tag)) else {
                    let earliest = buf.len().saturating_sub(end_tag.len() - 1);
                    return Decision::NeedMoreScan(scan.max(floor_char_boundary(buf, earliest)));
                };
                let i = scan + rel;
                let after = i + end_tag.len();
                let k = skip_ws(buf, after);
                let rest = &buf[k..];
                if rest.starts_with(t.parameter_start.as_str())
                    || rest.starts_with(t.invoke_end.as_str())
                {
                    Decision::CloseParam {
                        value_end: i,
                        after,
                    }
                } else if rest.is_empty()
                    || is_prefix_of_any(rest, &[&t.parameter_start, &t.invoke_end])
                {
                    Decision::NeedMoreScan(i)
                } else {
                    let step = buf[i..].chars().next().map_or(1, char::len_utf8);
                    Decision::LiteralClose {
                        next_scan: i + step,
                    }
                }
            }
        }
    }

    fn apply_tool(&mut self, decision: Decision, out: &mut Vec<Event>) -> bool {
        match decision {
            Decision::NeedMore => false,
            Decision::NeedMoreScan(s) => {
                if let Phase::InValue { scan, .. } = &mut self.tool.phase {
                    *scan = s;
                }
                false
            }
            Decision::BlockEnd { after } => {
                self.buf.drain(..after);
                self.mode = Mode::Content;
                self.tool = ToolState::new(0);
                self.trim_leading = true;
                true
            }
            Decision::OpenInvoke { name, after } => {
                self.tool.call = Some(OpenCall {
                    name,
                    arguments: Map::new(),
                });
                self.tool.phase = Phase::InInvoke;
                self.tool.pos = after;
                true
            }
            Decision::OpenParam { name, after } => {
                self.tool.phase = Phase::InValue {
                    name,
                    value_start: after,
                    scan: after,
                };
                self.tool.pos = after;
                true
            }
            Decision::CloseInvoke { after } => {
                if let Some(call) = self.tool.call.take() {
                    out.push(Event::ToolCall(ToolCall {
                        index: self.next_index,
                        name: call.name,
                        arguments: call.arguments,
                    }));
                    self.next_index += 1;
                }
                self.buf.drain(..after);
                self.tool = ToolState::new(0);
                true
            }
            Decision::CloseParam { value_end, after } => {
                let phase = std::mem::replace(&mut self.tool.phase, Phase::InInvoke);
                if let (
                    Phase::InValue {
                        name, value_start, ..
                    },
                    Some(call),
                ) = (phase, self.tool.call.as_mut())
                {
                    let raw = self.buf.get(value_start..value_end).unwrap_or("");
                    let ty = self.schemas.param_type(&call.name, &name);
                    let value = convert_value(strip_layout_newlines(raw), ty);
                    call.arguments.insert(name, value);
                }
                self.tool.pos = after;
                true
            }
            Decision::LiteralClose { next_scan } => {
                if let Phase::InValue { scan, .. } = &mut self.tool.phase {
                    *scan = next_scan;
                }
                true
            }
            Decision::Malformed { at } => {
                let rest = self.buf.split_off(at);
                let raw = std::mem::replace(&mut self.buf, rest);
                self.trim_leading = false;
                emit_text(out, &mut self.trim_leading, false, &raw);
                self.mode = Mode::Content;
                self.tool = ToolState::new(0);
                true
            }
        }
    }
}

/// Appends text to the channel, merging with a preceding event of the same
/// channel and applying the leading-whitespace trim.
fn emit_text(out: &mut Vec<Event>, trim_leading: &mut bool, reasoning: bool, text: &str) {
    let text = if *trim_leading {
        let t = text.trim_start();
        if !t.is_empty() {
            *trim_leading = false;
        }
        t
    } else {
        text
    };
    if text.is_empty() {
        return;
    }
    match out.last_mut() {
        Some(Event::Reasoning(s)) if reasoning => s.push_str(text),
        Some(Event::Content(s)) if !reasoning => s.push_str(text),
        _ => out.push(if reasoning {
            Event::Reasoning(text.to_string())
        } else {
            Event::Content(text.to_string())
        }),
    }
}

/// The earliest occurrence of any candidate tag (the longest on a tie):
/// its offset, length and target.
fn find_earliest(buf: &str, candidates: &[(&str, Mode)]) -> Option<(usize, usize, Mode)> {
    let mut best: Option<(usize, usize, Mode)> = None;
    for &(tag, target) in candidates {
        if let Some(i) = buf.find(tag) {
            let better = match best {
                None => true,
                Some((bi, bl, _)) => i < bi || (i == bi && tag.len() > bl),
            };
            if better {
                best = Some((i, tag.len(), target));
            }
        }
    }
    best
}

/// Length of the longest suffix of `buf` that is a proper prefix of a
/// candidate tag, i.e. text that may still become a tag.
fn held_suffix_len(buf: &str, candidates: &[(&str, Mode)]) -> usize {
    let longest = candidates.iter().map(|(t, _)| t.len()).max().unwrap_or(0);
    let start = floor_char_boundary(buf, buf.len().saturating_sub(longest.saturating_sub(1)));
    for (i, _) in buf[start..].char_indices() {
        let suffix = &buf[start + i..];
        if candidates.iter().any(|(t, _)| t.starts_with(suffix)) {
            return suffix.len();
        }
    }
    0
}

fn is_prefix_of_any(text: &str, tags: &[&String]) -> bool {
    tags.iter().any(|t| t.starts_with(text))
}

fn skip_ws(buf: &str, pos: usize) -> usize {
    let rest = buf.get(pos..).unwrap_or("");
    buf.len() - rest.trim_start().len()
}

fn floor_char_boundary(s: &str, mut i: usize) -> usize {
    if i >= s.len() {
        return s.len();
    }
    while i > 0 && !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

enum Attr {
    Done { name: String, after: usize },
    NeedMore,
    Bad,
}

/// Reads a name attribute value starting at `start`: `"name">`, `'name'>`
/// (spaces or tabs allowed before `>`) or `name>`. A name must be non-empty
/// and free of `<`, `>`, quotes and newlines; anything else is malformed.
/// The verdict never depends on how much text has arrived beyond what it
/// needs, which keeps the parse independent of chunking.
fn parse_name_attr(buf: &str, start: usize) -> Attr {
    let Some(rest) = buf.get(start..) else {
        return Attr::NeedMore;
    };
    let bad_char = |c: char| matches!(c, '<' | '>' | '\n' | '\r' | '"' | '\'');
    let Some(first) = rest.chars().next() else {
        return Attr::NeedMore;
    };
    if first == '"' || first == '\'' {
        let body = &rest[1..];
        let Some(q) = body.find(first) else {
            return if body.contains(bad_char) {
                Attr::Bad
            } else {
                Attr::NeedMore
            };
        };
        let name = &body[..q];
        if name.is_empty() || name.contains(bad_char) {
            return Attr::Bad;
        }
        let tail = &body[q + 1..];
        let trimmed = tail.trim_start_matches([' ', '\t']);
        match trimmed.chars().next() {
            None => Attr::NeedMore,
            Some('>') => Attr::Done {
                name: name.to_string(),
                after: buf.len() - trimmed.len() + 1,
            },
            Some(_) => Attr::Bad,
        }
    } else {
        let Some(g) = rest.find('>') else {
            return if rest.contains(|c: char| bad_char(c)) {
                Attr::Bad
            } else {
                Attr::NeedMore
            };
        };
        let name = rest[..g].trim_end_matches([' ', '\t']);
        if name.is_empty() || name.contains(|c: char| bad_char(c) || c.is_whitespace()) {
            return Attr::Bad;
        }
        Attr::Done {
            name: name.to_string(),
            after: start + g + 1,
        }
    }
}
