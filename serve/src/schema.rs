//! Typing of tool-call argument values.
//!
//! The model writes every argument as plain text between parameter tags, so
//! `3` could be the integer 3 or the string "3". When the request declared
//! the tool's JSON schema we follow the declared type; otherwise we guess
//! from the text.

use std::collections::HashMap;

use serde_json::Value;

/// Declared JSON-schema types: tool name -> parameter name -> type string
/// (`"string"`, `"integer"`, `"number"`, `"boolean"`, `"object"`,
/// `"array"`, `"null"`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ToolSchemas {
    tools: HashMap<String, HashMap<String, String>>,
}

impl ToolSchemas {
    /// An empty set: every value is typed by inference.
    pub fn new() -> Self {
        Self::default()
    }

    /// Declares `tool.param` to have JSON-schema type `ty`.
    pub fn insert(&mut self, tool: &str, param: &str, ty: &str) {
        self.tools
            .entry(tool.to_string())
            .or_default()
            .insert(param.to_string(), ty.to_string());
    }

    /// The declared type of `tool.param`, if any.
    pub fn param_type(&self, tool: &str, param: &str) -> Option<&str> {
        self.tools.get(tool)?.get(param).map(String::as_str)
    }

    /// Reads the `tools` array of an OpenAI chat-completions request
    /// (`[{"type":"function","function":{"name":…,"parameters":{"properties":{…}}}}]`).
    /// Entries that do not have this shape are skipped: a request's tool
    /// list is only a typing hint here, not something to reject. For a union
    /// type such as `["string","null"]` the first non-`"null"` entry counts.
    pub fn from_openai_tools(tools: &Value) -> Self {
        let mut out = Self::new();
        let Some(list) = tools.as_array() else {
            return out;
        };
        for tool in list {
            let func = tool.get("function").unwrap_or(tool);
            let Some(name) = func.get("name").and_then(Value::as_str) else {
                continue;
            };
            let props = func
                .get("parameters")
                .and_then(|p| p.get("properties"))
                .and_then(Value::as_object);
            // Record the tool even without properties, so it is known.
            out.tools.entry(name.to_string()).or_default();
            for (param, schema) in props.into_iter().flatten() {
                let ty = match schema.get("type") {
                    Some(Value::String(t)) => Some(t.as_str()),
                    Some(Value::Array(ts)) => {
                        ts.iter().filter_map(Value::as_str).find(|t| *t != "null")
                    }
                    _ => None,
                };
                if let Some(ty) = ty {
                    out.insert(name, param, ty);
                }
            }
        }
        out
    }
}

/// Removes exactly one leading and one trailing newline (`\n` or `\r\n`).
///
/// The model often lays a value out as `<parameter name="x">\nvalue\n</parameter>`;
/// those two newlines are layout, not data. Any other whitespace is kept,
/// because for strings (code, file contents) it is data.
pub(crate) fn strip_layout_newlines(raw: &str) -> &str {
    let s = raw
        .strip_prefix("\r\n")
        .or_else(|| raw.strip_prefix('\n'))
        .unwrap_or(raw);
    s.strip_suffix("\r\n")
        .or_else(|| s.strip_suffix('\n'))
        .unwrap_or(s)
}

/// Types one argument value (already stripped of its layout newlines).
///
/// * declared `"string"`: the text as is, even if it looks like a number;
/// * declared `"integer"`, `"number"`, `"boolean"`, `"object"`, `"array"`,
///   `"null"`: the trimmed text parsed as JSON, kept only if it is of the
///   declared kind (an integer for `"integer"`, …); `True`/`False` are
///   accepted for booleans because models trained on Python write them.
///   Anything else falls back to the raw text as a string, so a bad value
///   reaches the client visibly instead of being dropped;
/// * no declared (or an unknown) type: the trimmed text parsed as JSON if it
///   is a number, boolean, null, object or array; otherwise the raw text as
///   a string (a quoted JSON string keeps its quotes: we cannot tell whether
///   they are data).
pub fn convert_value(raw: &str, declared: Option<&str>) -> Value {
    let trimmed = raw.trim();
    let parsed = || serde_json::from_str::<Value>(trimmed).ok();
    let typed = match declared {
        Some("string") => return Value::String(raw.to_string()),
        Some("integer") => parsed().filter(|v| v.is_i64() || v.is_u64()),
        Some("number") => parsed().filter(Value::is_number),
        Some("boolean") => match trimmed {
            "True" => Some(Value::Bool(true)),
            "False" => Some(Value::Bool(false)),
            _ => parsed().filter(Value::is_boolean),
        },
        Some("object") => parsed().filter(Value::is_object),
        Some("array") => parsed().filter(Value::is_array),
        Some("null") => parsed().filter(Value::is_null),
        _ => parsed().filter(|v| !v.is_string()),
    };
    typed.unwrap_or_else(|| Value::String(raw.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn declared_string_stays_string() {
        assert_eq!(convert_value("42", Some("string")), json!("42"));
        assert_eq!(convert_value(" true ", Some("string")), json!(" true "));
    }

    #[test]
    fn declared_integer() {
        assert_eq!(convert_value(" 42 ", Some("integer")), json!(42));
        assert_eq!(convert_value("-7", Some("integer")), json!(-7));
        assert_eq!(convert_value("forty", Some("integer")), json!("forty"));
        assert_eq!(convert_value("4.5", Some("integer")), json!("4.5"));
    }

    #[test]
    fn declared_other_kinds() {
        assert_eq!(convert_value("4.5", Some("number")), json!(4.5));
        assert_eq!(convert_value("True", Some("boolean")), json!(true));
        assert_eq!(convert_value("false", Some("boolean")), json!(false));
        assert_eq!(convert_value("yes", Some("boolean")), json!("yes"));
        assert_eq!(convert_value(r#"{"a":1}"#, Some("object")), json!({"a": 1}));
        assert_eq!(convert_value("[1, 2]", Some("object")), json!("[1, 2]"));
        assert_eq!(convert_value("[1, 2]", Some("array")), json!([1, 2]));
        assert_eq!(convert_value("[1, 2", Some("array")), json!("[1, 2"));
    }

    #[test]
    fn inferred_without_schema() {
        assert_eq!(convert_value("3", None), json!(3));
        assert_eq!(convert_value("null", None), json!(null));
        assert_eq!(convert_value(" [1] ", None), json!([1]));
        assert_eq!(convert_value("Paris", None), json!("Paris"));
        assert_eq!(convert_value("\"q\"", None), json!("\"q\""));
        assert_eq!(convert_value("  two words ", None), json!("  two words "));
        assert_eq!(convert_value("1e999", None), json!("1e999"));
    }

    #[test]
    fn layout_newlines() {
        assert_eq!(strip_layout_newlines("\nx\n"), "x");
        assert_eq!(strip_layout_newlines("\n\nx\n\n"), "\nx\n");
        assert_eq!(strip_layout_newlines("\r\n x \r\n"), " x ");
        assert_eq!(strip_layout_newlines(" x "), " x ");
    }

    #[test]
    fn openai_tools() {
        let tools = json!([
            {"type": "function", "function": {"name": "w", "parameters": {"type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": ["integer", "null"]},
                               "x": {"description": "untyped"}}}}},
            {"type": "function", "function": {"parameters": {}}},
            "garbage"
        ]);
        let s = ToolSchemas::from_openai_tools(&tools);
        assert_eq!(s.param_type("w", "city"), Some("string"));
        assert_eq!(s.param_type("w", "days"), Some("integer"));
        assert_eq!(s.param_type("w", "x"), None);
        assert_eq!(s.param_type("v", "city"), None);
        assert_eq!(
            ToolSchemas::from_openai_tools(&json!({})),
            ToolSchemas::new()
        );
    }
}
