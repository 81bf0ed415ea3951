//! Incremental detokenization for streaming.
//!
//! Why this is not just "decode each new token": many tokenizers decode a
//! token differently depending on its neighbours (SentencePiece-style
//! leading-space markers are dropped at the start of a decode, byte-level
//! and byte-fallback tokens carry only part of a UTF-8 character). Decoding
//! tokens one at a time therefore produces wrong spaces and U+FFFD
//! replacement characters.
//!
//! [`IncrementalDetokenizer`] uses the usual two-offset scheme: it keeps
//! `prefix_offset` (start of a short window of already-emitted tokens used
//! as context) and `read_offset` (end of what has been emitted). For each
//! new token it decodes `tokens[prefix_offset..read_offset]` and
//! `tokens[prefix_offset..]`; the part of the second beyond the first is
//! the new text. If that text ends in U+FFFD, the last token(s) are an
//! incomplete UTF-8 sequence, so nothing is emitted until more bytes
//! arrive. Otherwise the new text is emitted and the window slides forward.
//!
//! Trade-off: a decode that genuinely ends in U+FFFD (invalid bytes, or a
//! real U+FFFD character) is held until a later token ends the text with
//! something else, or until [`finish`](IncrementalDetokenizer::finish).
//! There is no token-count cut-off, because cutting could split a
//! character that is still being completed.
//!
//! ```
//! use m3_serve::IncrementalDetokenizer;
//!
//! // A toy byte-level tokenizer: each token is one byte.
//! let mut d = IncrementalDetokenizer::new(|t: &[u32]| {
//!     String::from_utf8_lossy(&t.iter().map(|&b| b as u8).collect::<Vec<_>>()).into_owned()
//! });
//! let mut out = String::new();
//! for b in "hé".bytes() {
//!     out.push_str(&d.push(b as u32));
//! }
//! out.push_str(&d.finish());
//! assert_eq!(out, "hé");
//! ```

/// Streaming detokenizer over a `decode` function; see the module docs.
pub struct IncrementalDetokenizer<F: Fn(&[u32]) -> String> {
    decode: F,
    tokens: Vec<u32>,
    prefix_offset: usize,
    read_offset: usize,
}

impl<F: Fn(&[u32]) -> String> IncrementalDetokenizer<F> {
    /// A detokenizer with no context. To continue after a prompt (so the
    /// first generated token gets the right leading space), use
    /// [`with_context`](Self::with_context).
    pub fn new(decode: F) -> Self {
        Self::with_context(decode, Vec::new(), 0)
    }

    /// A detokenizer that has already "emitted" `context` (typically the
    /// last few prompt tokens); only the last `window` of them are decoded
    /// as context.
    pub fn with_context(decode: F, context: Vec<u32>, window: usize) -> Self {
        let read_offset = context.len();
        IncrementalDetokenizer {
            decode,
            prefix_offset: read_offset.saturating_sub(window),
            read_offset,
            tokens: context,
        }
    }

    /// All tokens pushed so far (including any context).
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Adds one token and returns the text that is now final (possibly
    /// empty).
    pub fn push(&mut self, token: u32) -> String {
        self.tokens.push(token);
        self.step(false)
    }

    /// Ends the stream: returns any text still held back (which may then
    /// contain U+FFFD if the tokens really ended mid-character).
    pub fn finish(mut self) -> String {
        self.step(true)
    }

    fn step(&mut self, force: bool) -> String {
        if self.read_offset >= self.tokens.len() {
            return String::new();
        }
        let prefix = (self.decode)(&self.tokens[self.prefix_offset..self.read_offset]);
        let full = (self.decode)(&self.tokens[self.prefix_offset..]);
        if full.ends_with('\u{FFFD}') && !force {
            return String::new();
        }
        // The context's decode is normally a prefix of the longer decode;
        // if a tokenizer breaks that, fall back to the common prefix.
        let cut = if full.starts_with(&prefix) {
            prefix.len()
        } else {
            common_prefix_len(&prefix, &full)
        };
        let new = full[cut..].to_string();
        if new.is_empty() && !force {
            // Nothing visible yet (e.g. a token that only carries a space
            // marker); keep the window so the context stays intact.
            return String::new();
        }
        self.prefix_offset = self.read_offset;
        self.read_offset = self.tokens.len();
        new
    }
}

/// Length of the longest common prefix of `a` and `b`, on a char boundary.
fn common_prefix_len(a: &str, b: &str) -> usize {
    a.char_indices()
        .zip(b.chars())
        .find(|((_, ca), cb)| ca != cb)
        .map_or(a.len().min(b.len()), |((i, _), _)| i)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const REPL: char = '\u{FFFD}';

    fn bytes_decode(t: &[u32]) -> String {
        String::from_utf8_lossy(&t.iter().map(|&b| b as u8).collect::<Vec<_>>()).into_owned()
    }

    #[test]
    fn four_byte_char_waits_for_all_bytes() {
        let mut d = IncrementalDetokenizer::new(bytes_decode);
        let bytes: Vec<u32> = "a😀b".bytes().map(u32::from).collect();
        let pieces: Vec<String> = bytes.iter().map(|&b| d.push(b)).collect();
        assert_eq!(pieces, ["a", "", "", "", "😀", "b"]);
        assert_eq!(d.finish(), "");
    }

    #[test]
    fn invalid_bytes_held_until_valid_text() {
        let mut d = IncrementalDetokenizer::new(bytes_decode);
        assert_eq!(d.push(0xFF), "");
        assert_eq!(d.push(0xFF), "");
        assert_eq!(d.push(b'a' as u32), "\u{FFFD}\u{FFFD}a");
        assert_eq!(d.push(0xFF), "");
        assert_eq!(d.finish(), "\u{FFFD}");
    }

    #[test]
    fn truncated_sequence_flushed_at_finish() {
        let mut d = IncrementalDetokenizer::new(bytes_decode);
        assert_eq!(d.push(b'x' as u32), "x");
        assert_eq!(d.push(0xE2), "");
        assert_eq!(d.finish(), "\u{FFFD}");
    }

    /// A SentencePiece-like toy: token 0 is "▁hello", 1 is "▁world"; a
    /// decode drops the leading space of its first token.
    #[test]
    fn leading_space_tokens() {
        let decode = |t: &[u32]| {
            let s: String = t
                .iter()
                .map(|&x| if x == 0 { " hello" } else { " world" })
                .collect();
            s.strip_prefix(' ').unwrap_or(&s).to_string()
        };
        let mut d = IncrementalDetokenizer::new(decode);
        let out = [d.push(0), d.push(1), d.push(1)].concat();
        assert_eq!(out, "hello world world");
        // Continuing after a prompt keeps the space on the first token.
        let mut d = IncrementalDetokenizer::with_context(decode, vec![0], 1);
        assert_eq!(d.push(1), " world");
    }

    proptest! {
        #[test]
        fn byte_tokens_roundtrip(s in "[a-z \\u{e9}\\u{3b1}\\u{4e2d}\\u{20ac}\\u{1f600}\\u{10348}]{0,40}") {
            let mut d = IncrementalDetokenizer::new(bytes_decode);
            let mut out = String::new();
            for b in s.bytes() {
                let piece = d.push(u32::from(b));
                prop_assert!(!piece.contains(REPL), "piece {:?}", piece);
                out.push_str(&piece);
            }
            let tail = d.finish();
            prop_assert!(!tail.contains(REPL), "tail {:?}", tail);
            out.push_str(&tail);
            prop_assert_eq!(out, s);
        }

        #[test]
        fn any_utf8_roundtrip(s in any::<String>()) {
            let mut d = IncrementalDetokenizer::new(bytes_decode);
            let mut out = String::new();
            for b in s.bytes() {
                let piece = d.push(u32::from(b));
                prop_assert!(!piece.contains(REPL) || s.contains(REPL), "piece {:?}", piece);
                out.push_str(&piece);
            }
            out.push_str(&d.finish());
            prop_assert_eq!(out, s);
        }
    }
}
