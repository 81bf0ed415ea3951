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

/// One spelling of [`Tags`], for the role table of
/// [`Tags::from_added_tokens`].
type TagField = fn(&mut Tags) -> &mut String;

impl Tags {
    /// The spellings a checkpoint defines among its tokenizer's added
    /// (special) tokens, the defaults where it does not: for each of the
    /// reasoning and tool-call blocks, an opening token `<…think…>` /
    /// `<…tool_call…>` and a closing `</…think…>` / `</…tool_call…>`. The
    /// default spelling wins when the tokenizer has it; another spelling is
    /// taken when it is the only candidate; two or more candidates without
    /// the default keep the default and say so. Returns the tags and one
    /// note per choice that is not simply the default.
    pub fn from_added_tokens<'a>(tokens: impl IntoIterator<Item = &'a str>) -> (Tags, Vec<String>) {
        let tokens: Vec<&str> = tokens.into_iter().collect();
        let mut tags = Tags::default();
        let mut notes = Vec::new();
        let roles: [(&str, bool, TagField); 4] = [
            ("think", false, |t| &mut t.think_start),
            ("think", true, |t| &mut t.think_end),
            ("tool_call", false, |t| &mut t.tool_call_start),
            ("tool_call", true, |t| &mut t.tool_call_end),
        ];
        for (word, closing, field) in roles {
            let slot = field(&mut tags);
            let candidates: Vec<&str> = tokens
                .iter()
                .copied()
                .filter(|t| {
                    t.ends_with('>')
                        && t.contains(word)
                        && if closing {
                            t.starts_with("</")
                        } else {
                            t.starts_with('<') && !t.starts_with("</")
                        }
                })
                .collect();
            if candidates.contains(&slot.as_str()) {
                continue;
            }
            match candidates.as_slice() {
                [] => {}
                [one] => {
                    notes.push(format!("`{slot}` spelled `{one}` by the tokenizer"));
                    *slot = (*one).to_string();
                }
                many => notes.push(format!(
                    "`{slot}` kept: the tokenizer has {} candidates ({})",
                    many.len(),
                    many.join(", ")
                )),
            }
        }
        (tags, notes)
    }

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spellings_come_from_the_added_tokens() {
        // the defaults present (among other specials): the defaults
        let (t, notes) = Tags::from_added_tokens([
            "<|endoftext|>",
            "<think>",
            "</think>",
            "<minimax:tool_call>",
            "</minimax:tool_call>",
        ]);
        assert_eq!(t, Tags::default());
        assert!(notes.is_empty(), "{notes:?}");
        // a renamed tool-call block is taken, with a note; the think tags
        // absent: the defaults
        let (t, notes) = Tags::from_added_tokens(["<tool_calls>", "</tool_calls>"]);
        assert_eq!(t.tool_call_start, "<tool_calls>");
        assert_eq!(t.tool_call_end, "</tool_calls>");
        assert_eq!(t.think_start, "<think>");
        assert_eq!(notes.len(), 2, "{notes:?}");
        // ambiguous: the default kept, and said
        let (t, notes) = Tags::from_added_tokens(["<thinking>", "<think_fast>"]);
        assert_eq!(t.think_start, "<think>");
        assert!(notes[0].contains("2 candidates"), "{notes:?}");
        assert!(t.validate().is_ok());
    }
}

/// A configuration the parser refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// A tag spelling is the empty string.
    #[error("tag `{0}` must not be empty")]
    EmptyTag(&'static str),
}
