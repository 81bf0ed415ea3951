//! Stop strings, matched on generated text while it streams.
//!
//! Why on text and not on tokens: OpenAI's `stop` is a list of strings, and
//! a tokenizer can spell the same string with many different token
//! sequences (and a stop string may start or end in the middle of a token).
//! So the server matches the detokenized text. While streaming it must also
//! never send a client text that later turns out to be the start of a stop
//! string: [`StopMatcher`] holds back the longest suffix of what it has seen
//! that is still a prefix of some stop string, and emits everything before
//! it.
//!
//! Semantics: generation stops at the first point where *some* stop string
//! has been completely generated (the match that ends earliest; among those
//! ending at the same place, the one that starts earliest). The output is
//! the text up to, not including, that match. This is what a streaming
//! server can decide without looking ahead, and it does not depend on how
//! the text was cut into deltas.
//!
//! ```
//! use m3_serve::StopMatcher;
//!
//! let mut m = StopMatcher::new(vec!["</end>".into()]);
//! let a = m.push("Hello </e");
//! assert_eq!((a.emit.as_str(), a.stopped), ("Hello ", false));
//! let b = m.push("nd> ignored");
//! assert_eq!((b.emit.as_str(), b.stopped), ("", true));
//! ```

/// What one [`StopMatcher::push`] releases.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StopStep {
    /// Text that can be sent to the client now.
    pub emit: String,
    /// A stop string was matched; `emit` ends right before it and the
    /// request should finish with `finish_reason: "stop"`.
    pub stopped: bool,
}

/// Streaming stop-string matcher; see the module docs.
#[derive(Debug, Clone)]
pub struct StopMatcher {
    stops: Vec<String>,
    /// Text seen but not yet emitted: always a (possibly empty) prefix of
    /// some stop string, unless `stopped`.
    held: String,
    stopped: bool,
}

impl StopMatcher {
    /// A matcher for `stops`. Empty strings are ignored (request validation
    /// rejects them anyway); with no stop strings every push emits its
    /// whole delta.
    pub fn new(stops: Vec<String>) -> Self {
        let stops = stops.into_iter().filter(|s| !s.is_empty()).collect();
        StopMatcher {
            stops,
            held: String::new(),
            stopped: false,
        }
    }

    /// Whether a stop string has been matched.
    pub fn is_stopped(&self) -> bool {
        self.stopped
    }

    /// Feeds one delta of generated text. After a stop, further pushes
    /// emit nothing and keep reporting `stopped`.
    pub fn push(&mut self, delta: &str) -> StopStep {
        if self.stopped {
            return StopStep {
                emit: String::new(),
                stopped: true,
            };
        }
        self.held.push_str(delta);
        // Earliest-ending match, ties to the earliest start. Matches that
        // end before this delta would have been found by an earlier push,
        // because the start of any possible match is always still held.
        let mut best: Option<(usize, usize)> = None; // (end, start)
        for s in &self.stops {
            if let Some(start) = self.held.find(s.as_str()) {
                let cand = (start + s.len(), start);
                if best.is_none_or(|b| cand < b) {
                    best = Some(cand);
                }
            }
        }
        if let Some((_, start)) = best {
            self.held.truncate(start);
            self.stopped = true;
            return StopStep {
                emit: std::mem::take(&mut self.held),
                stopped: true,
            };
        }
        let keep = self.longest_partial_suffix();
        let emit = self.held[..self.held.len() - keep].to_string();
        self.held.drain(..self.held.len() - keep);
        StopStep {
            emit,
            stopped: false,
        }
    }

    /// Ends the stream: returns the held-back text (it did not become a
    /// stop string), or nothing after a stop.
    pub fn finish(self) -> String {
        if self.stopped {
            String::new()
        } else {
            self.held
        }
    }

    /// Length in bytes of the longest suffix of `held` that is a proper
    /// prefix of some stop string.
    fn longest_partial_suffix(&self) -> usize {
        let h = self.held.as_str();
        let mut best = 0;
        for s in &self.stops {
            let max = (s.len() - 1).min(h.len());
            for k in (best + 1..=max).rev() {
                if s.is_char_boundary(k) && h.as_bytes().ends_with(&s.as_bytes()[..k]) {
                    best = k;
                    break;
                }
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Reference: truncate at the earliest-ending match (ties: earliest
    /// start).
    fn reference(text: &str, stops: &[String]) -> (String, bool) {
        let best = stops
            .iter()
            .filter(|s| !s.is_empty())
            .filter_map(|s| text.find(s.as_str()).map(|i| (i + s.len(), i)))
            .min();
        match best {
            Some((_, start)) => (text[..start].to_string(), true),
            None => (text.to_string(), false),
        }
    }

    fn run(chunks: &[&str], stops: &[String]) -> (String, bool) {
        let mut m = StopMatcher::new(stops.to_vec());
        let mut out = String::new();
        let mut stopped = false;
        for c in chunks {
            let step = m.push(c);
            out.push_str(&step.emit);
            stopped = step.stopped;
        }
        if !stopped {
            out.push_str(&m.finish());
        }
        (out, stopped)
    }

    #[test]
    fn basic() {
        let stops = vec!["\n\n".to_string(), "END".to_string()];
        assert_eq!(run(&["a\n", "b\n", "\nc"], &stops), ("a\nb".into(), true));
        assert_eq!(run(&["EN", "D"], &stops), ("".into(), true));
        assert_eq!(run(&["xE", "Nx"], &stops), ("xENx".into(), false));
        assert_eq!(run(&["no stop"], &[]), ("no stop".into(), false));
    }

    #[test]
    fn holds_back_only_possible_prefixes() {
        let mut m = StopMatcher::new(vec!["abc".into()]);
        assert_eq!(m.push("xxab").emit, "xx");
        assert_eq!(m.push("x").emit, "abx");
        assert_eq!(m.push("a").emit, "");
        assert_eq!(m.finish(), "a");
    }

    #[test]
    fn earliest_end_wins() {
        // "b" completes before "abc" could, so the stream stops after "a".
        let stops = vec!["abc".to_string(), "b".to_string()];
        assert_eq!(run(&["abc"], &stops), ("a".into(), true));
        assert_eq!(run(&["a", "b", "c"], &stops), ("a".into(), true));
        // Same end: the longer (earlier-starting) one wins.
        let stops = vec!["c".to_string(), "bc".to_string()];
        assert_eq!(run(&["abcd"], &stops), ("a".into(), true));
    }

    #[test]
    fn multibyte() {
        let stops = vec!["é!".to_string()];
        assert_eq!(run(&["caf", "é", "!x"], &stops), ("caf".into(), true));
        let mut m = StopMatcher::new(stops);
        assert_eq!(m.push("éa").emit, "éa");
    }

    fn arb_text() -> impl Strategy<Value = String> {
        proptest::collection::vec(prop::sample::select(vec!['a', 'b', 'c', 'é', '😀']), 0..30)
            .prop_map(|v| v.into_iter().collect())
    }

    fn arb_stop() -> impl Strategy<Value = String> {
        proptest::collection::vec(prop::sample::select(vec!['a', 'b', 'c', 'é', '😀']), 1..5)
            .prop_map(|v| v.into_iter().collect())
    }

    proptest! {
        #[test]
        fn chunking_invariant(
            text in arb_text(),
            stops in proptest::collection::vec(arb_stop(), 0..4),
            cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..8),
        ) {
            let bounds: Vec<usize> =
                (0..=text.len()).filter(|&i| text.is_char_boundary(i)).collect();
            let mut points: Vec<usize> = cuts.iter().map(|c| bounds[c.index(bounds.len())]).collect();
            points.push(0);
            points.push(text.len());
            points.sort_unstable();
            points.dedup();
            let chunks: Vec<&str> = points.windows(2).map(|w| &text[w[0]..w[1]]).collect();
            let expected = reference(&text, &stops);
            prop_assert_eq!(run(&[text.as_str()], &stops), expected.clone());
            prop_assert_eq!(run(&chunks, &stops), expected);
        }
    }
}
