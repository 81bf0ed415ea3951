//! Tag spellings and parser configuration.

use serde::{Deserialize, Serialize};

use crate::schema::ToolSchemas;

/// The literal markup the model uses.
///
/// The spellings are data rather than constants because they belong to the
/// checkpoint: its tokenizer / chat template may define them (for example a
/// model revision that renames the tool-call block). [`Tags::default`] gives
/// the spellings MiniMax-M2 uses.
///
/// `invoke_start` and `parameter_start` are the text *before* the name
/// attribute value: the parser then reads a quoted (`"x"` or `'x'`) or bare
/// name followed by `>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Tags {
    /// Opens reasoning: `<think>`.
    pub think_start: String,
    /// Closes reasoning: `</think>`.
    pub think_end: String,
    /// Opens a tool-call block: `<minimax:tool_call>`.
    pub tool_call_start: String,
    /// Closes a tool-call block: `</minimax:tool_call>`.
    pub tool_call_end: String,
    /// Opens one call, up to the name value: `<invoke name=`.
    pub invoke_start: String,
    /// Closes one call: `</invoke>`.
    pub invoke_end: String,
    /// Opens one argument, up to the name value: `<parameter name=`.
    pub parameter_start: String,
    /// Closes one argument: `</parameter>`.
    pub parameter_end: String,
}

impl Default for Tags {
    fn default() -> Self {
        Self {
            think_start: "<think>".into(),
            think_end: "</think>".into(),
            tool_call_start: "<minimax:tool_call>".into(),
            tool_call_end: "</minimax:tool_call>".into(),
            invoke_start: "<invoke name=".into(),
            invoke_end: "</invoke>".into(),
            parameter_start: "<parameter name=".into(),
            parameter_end: "</parameter>".into(),
        }
    }
}

impl Tags {
    /// Rejects spellings the parser cannot work with. An empty tag would
    /// match everywhere (and never consume input), so it is refused up
    /// front instead of looping or guessing.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let all = [
            ("think_start", &self.think_start),
            ("think_end", &self.think_end),
            ("tool_call_start", &self.tool_call_start),
            ("tool_call_end", &self.tool_call_end),
            ("invoke_start", &self.invoke_start),
            ("invoke_end", &self.invoke_end),
            ("parameter_start", &self.parameter_start),
            ("parameter_end", &self.parameter_end),
        ];
        for (field, value) in all {
            if value.is_empty() {
                return Err(ConfigError::EmptyTag(field));
            }
        }
        Ok(())
    }
}

/// Everything that decides how one output stream is parsed.
#[derive(Debug, Clone)]
pub struct ParserOptions {
    /// Tag spellings.
    pub tags: Tags,
    /// Whether the model reasons at all. When `false`, `think` tags are not
    /// treated specially: all non-tool-call text is content.
    pub reasoning_enabled: bool,
    /// The chat template already emitted `think_start` into the prompt, so
    /// the generated text begins inside reasoning. Ignored when
    /// `reasoning_enabled` is `false`.
    pub starts_in_reasoning: bool,
    /// Declared parameter types of the tools offered in the request, used to
    /// type argument values. Empty means "infer from the text".
    pub tool_schemas: ToolSchemas,
}

impl Default for ParserOptions {
    fn default() -> Self {
        Self {
            tags: Tags::default(),
            reasoning_enabled: true,
            starts_in_reasoning: false,
            tool_schemas: ToolSchemas::default(),
        }
    }
}

/// A configuration the parser refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// A tag spelling is the empty string.
    #[error("tag `{0}` must not be empty")]
    EmptyTag(&'static str),
}
