//! Requests as the scheduler sees them: token ids in, token ids out, and the
//! rules that end a request.

use alloc::vec::Vec;

/// Caller-chosen request identifier (unique among live requests).
pub type RequestId = u64;

/// Sampling parameters, carried through the scheduler untouched so that the
/// engine samples each row with its request's settings and RNG key
/// (MODEL.md 4: the RNG is keyed by (seed, position), so a request's tokens
/// do not depend on the batch it ran in).
pub use crate::sample::SampleParams as SamplingParams;

/// One generation request.
#[derive(Clone, Debug, PartialEq)]
pub struct Request {
    pub id: RequestId,
    /// Prompt token ids (at least one).
    pub prompt: Vec<u32>,
    /// Most tokens to generate (at least one).
    pub max_tokens: usize,
    /// Tokens that end the request (included in the output).
    pub eos: Vec<u32>,
    /// Token sequences that end the request when the output ends with one
    /// (included in the output).
    pub stop: Vec<Vec<u32>>,
    pub sampling: SamplingParams,
}

impl Request {
    /// A greedy request with no EOS and no stop sequences.
    pub fn greedy(id: RequestId, prompt: Vec<u32>, max_tokens: usize) -> Self {
        Self {
            id,
            prompt,
            max_tokens,
            eos: Vec::new(),
            stop: Vec::new(),
            sampling: SamplingParams::default(),
        }
    }
}

/// Why a request ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// Generated `max_tokens` tokens.
    Length,
    /// Generated one of the EOS tokens.
    Eos,
    /// The output ended with a stop sequence.
    Stop,
    /// Never admitted: the prompt plus `max_tokens` cannot fit in the whole
    /// cache, or the request is empty.
    Rejected,
}

/// A finished request's result.
#[derive(Clone, Debug, PartialEq)]
pub struct FinishedRequest {
    pub id: RequestId,
    pub prompt_len: usize,
    /// Generated tokens (EOS / stop sequence included).
    pub output: Vec<u32>,
    pub reason: FinishReason,
    /// How many times the request was preempted and recomputed.
    pub preemptions: u32,
    /// Prompt-or-recompute tokens served from the prefix cache.
    pub cached_tokens: usize,
}

/// Why the output `out` is complete, if it is (checked after every appended
/// token, so a stop found inside a multi-token speculative commit ends the
/// request right there).
pub fn finish_reason(req: &Request, out: &[u32]) -> Option<FinishReason> {
    let last = *out.last()?;
    if req.eos.contains(&last) {
        return Some(FinishReason::Eos);
    }
    if req.stop.iter().any(|s| !s.is_empty() && out.ends_with(s)) {
        return Some(FinishReason::Stop);
    }
    (out.len() >= req.max_tokens).then_some(FinishReason::Length)
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec;

    #[test]
    fn finish_rules() {
        let mut r = Request::greedy(1, vec![1], 3);
        r.eos = vec![9];
        r.stop = vec![vec![4, 5]];
        assert_eq!(finish_reason(&r, &[]), None);
        assert_eq!(finish_reason(&r, &[1]), None);
        assert_eq!(finish_reason(&r, &[1, 9]), Some(FinishReason::Eos));
        assert_eq!(finish_reason(&r, &[4, 5]), Some(FinishReason::Stop));
        assert_eq!(finish_reason(&r, &[5, 4]), None);
        assert_eq!(finish_reason(&r, &[1, 2, 3]), Some(FinishReason::Length));
    }
}
