//! Prompt-lookup drafting: a model-free [`Drafter`] that proposes the tokens
//! which followed the most recent earlier occurrence of the context's last
//! n-gram (longest n first). Cheap, and effective on repetitive text (code,
//! extraction, the synthetic models' loops); a stand-in until a draft model
//! is wired in.

use alloc::vec::Vec;

use super::request::RequestId;
use super::runner::Drafter;

/// N-gram lookup over the request's own tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NgramDrafter {
    /// Longest suffix tried first.
    pub max_ngram: usize,
    /// Shortest suffix accepted as a match.
    pub min_ngram: usize,
}

impl Default for NgramDrafter {
    fn default() -> Self {
        Self {
            max_ngram: 4,
            min_ngram: 2,
        }
    }
}

impl NgramDrafter {
    /// The proposal for `context` (see the module docs).
    pub fn lookup(&self, context: &[u32], k: usize) -> Vec<u32> {
        let len = context.len();
        for n in (self.min_ngram.max(1)..=self.max_ngram).rev() {
            if n >= len {
                continue;
            }
            let suffix = &context[len - n..];
            // Most recent earlier occurrence (not the suffix itself).
            if let Some(i) = (0..len - n).rev().find(|&i| &context[i..i + n] == suffix) {
                let start = i + n;
                return context[start..(start + k).min(len)].to_vec();
            }
        }
        Vec::new()
    }
}

impl Drafter for NgramDrafter {
    fn propose(&mut self, _id: RequestId, context: &[u32], k: usize) -> Vec<u32> {
        self.lookup(context, k)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec;

    #[test]
    fn proposes_continuation_of_last_match() {
        let d = NgramDrafter::default();
        // "7 8" occurred before, followed by 9 1 2.
        assert_eq!(d.lookup(&[5, 7, 8, 9, 1, 2, 3, 7, 8], 3), vec![9, 1, 2]);
        assert_eq!(d.lookup(&[5, 7, 8, 9, 7, 8], 5), vec![9, 7, 8]);
        assert!(d.lookup(&[1, 2, 3, 4], 3).is_empty());
        assert!(d.lookup(&[1], 3).is_empty());
    }
}
