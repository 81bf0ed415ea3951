//! What one step runs, as plain data, and the Standard / Mono path decision.
//!
//! The planner makes the decision; a backend only executes it (a backend
//! without a mono path runs a `Mono` step on its standard path).

use alloc::vec::Vec;

use super::blocks::{BlockCopy, BlockId};
use super::request::RequestId;

/// Which execution path a step takes (ARCHITECTURE.md, "The step").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StepPath {
    /// A kernel per op; any mix of prefill and decode rows.
    Standard,
    /// One persistent kernel per layer; only pure decode steps (speculative
    /// verify rows included) of at most `mono_max_rows` rows.
    Mono,
}

/// One token row of the step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Row {
    pub token: u32,
    /// Position of the token in its sequence (0-based).
    pub position: u32,
    /// Cache slot its K/V (and indexer key) is written to:
    /// `block * block_size + position % block_size`.
    pub slot: u32,
    /// Index into [`ScheduledStep::seqs`].
    pub seq: u32,
}

/// What a sequence's rows in this step are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RowKind {
    /// A chunk of prompt (or recompute) tokens; logits only on the last row
    /// and only when the chunk reaches the end of the known tokens.
    Prefill,
    /// One row: the last committed token.
    Decode,
    /// Speculative verification: the last committed token followed by the
    /// draft tokens, every row with logits.
    Verify { draft: Vec<u32> },
}

/// One sequence's part of the step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepSeq {
    pub request_id: RequestId,
    /// Its rows are `rows[first_row .. first_row + num_rows]`, positions ascending.
    pub first_row: u32,
    pub num_rows: u32,
    /// Tokens in the cache once this step's rows are written (the attention
    /// context length of the last row).
    pub context_len: u32,
    /// Block table covering positions `0 .. context_len`.
    pub block_table: Vec<BlockId>,
    pub kind: RowKind,
    /// Whether any of its rows produce logits (the sequence then expects
    /// tokens back in [`super::Scheduler::commit`]).
    pub needs_logits: bool,
}

/// Plain-data description of one step: what the backend computes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScheduledStep {
    /// Step counter (0-based).
    pub index: u64,
    pub path: StepPath,
    pub rows: Vec<Row>,
    pub seqs: Vec<StepSeq>,
    /// Indices into `rows` whose logits are needed, ascending.
    pub logits_rows: Vec<u32>,
    /// Block copies to perform before writing this step's rows.
    pub copies: Vec<BlockCopy>,
    /// Requests preempted (blocks freed, requeued) while planning this step.
    pub preempted: Vec<RequestId>,
}

impl ScheduledStep {
    /// A step with no rows (nothing runnable).
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Number of rows with a decode or verify kind.
    pub fn decode_rows(&self) -> usize {
        self.seqs
            .iter()
            .filter(|s| !matches!(s.kind, RowKind::Prefill))
            .map(|s| s.num_rows as usize)
            .sum()
    }
}

/// The path rule: `Mono` iff every row is a decode (or verify) row and there
/// are at most `mono_max_rows` of them, else `Standard`. An empty step is
/// `Standard` (nothing to launch).
pub fn plan_path(seqs: &[StepSeq], num_rows: usize, mono_max_rows: usize) -> StepPath {
    let pure_decode = seqs.iter().all(|s| !matches!(s.kind, RowKind::Prefill));
    if num_rows > 0 && pure_decode && num_rows <= mono_max_rows {
        StepPath::Mono
    } else {
        StepPath::Standard
    }
}

/// Running totals kept by the scheduler (all counts, no units beyond that).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StepCounters {
    pub steps_mono: u64,
    pub steps_standard: u64,
    pub rows_mono: u64,
    pub rows_standard: u64,
    /// Prompt / recompute rows actually computed (rows at positions the
    /// sequence already had when it was last admitted, whatever their kind).
    pub prefill_tokens: u64,
    /// Prefill / recompute tokens skipped thanks to prefix-cache hits.
    pub prefix_hit_tokens: u64,
    /// Rows of decode or verify kind (a fully cached prompt's recomputed last
    /// token is one of these and also a prefill token).
    pub decode_rows: u64,
    pub preemptions: u64,
    pub cow_copies: u64,
    pub requests_finished: u64,
    /// Requests dropped by [`super::Scheduler::abort`] before finishing.
    pub requests_aborted: u64,
    pub tokens_generated: u64,
    /// Speculative verification: sequence-steps verified, draft tokens
    /// proposed and accepted.
    pub spec_verifies: u64,
    pub spec_proposed: u64,
    pub spec_accepted: u64,
}

impl StepCounters {
    /// Mean tokens committed per verify (accepted drafts + the target's own
    /// token), or `None` before any verify.
    pub fn mean_acceptance_length(&self) -> Option<f64> {
        (self.spec_verifies > 0)
            .then(|| (self.spec_accepted + self.spec_verifies) as f64 / self.spec_verifies as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec;

    fn seq(kind: RowKind, n: u32) -> StepSeq {
        StepSeq {
            request_id: 0,
            first_row: 0,
            num_rows: n,
            context_len: n,
            block_table: vec![],
            kind,
            needs_logits: true,
        }
    }

    #[test]
    fn path_rule() {
        let d = seq(RowKind::Decode, 1);
        let v = seq(
            RowKind::Verify {
                draft: vec![1, 2, 3],
            },
            4,
        );
        let p = seq(RowKind::Prefill, 3);
        assert_eq!(plan_path(&[d.clone(), v.clone()], 5, 16), StepPath::Mono);
        assert_eq!(plan_path(&[d.clone(), p], 4, 16), StepPath::Standard);
        assert_eq!(plan_path(&vec![d.clone(); 16], 16, 16), StepPath::Mono);
        assert_eq!(plan_path(&vec![d.clone(); 17], 17, 16), StepPath::Standard);
        assert_eq!(
            plan_path(&[v.clone(), v.clone(), v.clone(), v.clone(), v], 20, 16),
            StepPath::Standard
        );
        assert_eq!(plan_path(&[], 0, 16), StepPath::Standard);
        assert_eq!(
            plan_path(&vec![d; 4], 4, 2),
            StepPath::Standard,
            "threshold configurable"
        );
    }
}
