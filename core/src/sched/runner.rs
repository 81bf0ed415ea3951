//! The scheduler driving a loaded model ([`ModelRunner`]): plan a step, have
//! the runner perform its block copies, convert it to a [`StepBatch`], run
//! it (the runner samples one token per logits row where the logits are),
//! verify speculative rows, commit.
//!
//! Speculative decoding: a [`Drafter`] proposes up to `spec_tokens` tokens
//! for every sequence ready to decode; the verify rows are folded into the
//! same step as everything else (ordinary decode rows at consecutive
//! positions; a step of decode and verify rows only is marked
//! [`StepBatch::decode_only`], so it may take the Mono path). Verification
//! ([`VerifyMode`]):
//! - `Greedy`: the target's token for each verify row is what plain decoding
//!   would have produced there (`sample` keyed by the request seed and the
//!   position), and drafts are accepted while they match it
//!   ([`verify_greedy`]). This reproduces plain decoding token for token for
//!   greedy *and* stochastic requests. For a deterministic drafter (a point
//!   mass on its proposal, like prompt lookup) nothing is lost: a draft
//!   token `x` is accepted with probability `p_t(x)`, exactly what rejection
//!   sampling with `p_d = onehot(x)` gives.
//! - `Rejection` / `Block`: for a stochastic request whose drafter *samples*
//!   its proposals and reports their probabilities (DSpark), per-token
//!   rejection sampling or block verification ([`crate::spec_decode`])
//!   against the target's sampling distribution ([`sampling_probs`]); the
//!   output is distributed as the target's (not token-identical to plain
//!   decoding). Their uniforms are keyed by (seed, position of the verify's
//!   first row, draw index). Greedy requests and point-mass proposals always
//!   verify greedily (the same result, with no randomness).
//!
//! After each step the drafter [`Drafter::observe`]s the target's captured
//! tensors ([`Drafter::taps`]) for the rows that hold committed tokens
//! (prompt rows, decode rows, a verify's last committed token and accepted
//! drafts), which is how DSpark gets its context.

use alloc::boxed::Box;
use alloc::collections::{BTreeMap, BTreeSet};
use alloc::vec::Vec;

use super::request::SamplingParams;
use super::request::{FinishedRequest, RequestId};
use super::scheduler::{Scheduler, SchedulerConfig, SeqTokens};
use super::spec_probs::sampling_probs;
use super::step::{RowKind, ScheduledStep, StepPath};
use super::SchedError;
use crate::backend::{
    BackendError, ModelRunner, Path, ReadBack, StepBatch, StepInput, StepSeq, TapRequest, Taps,
};
use crate::sample::uniform;
use crate::spec_decode::{verify_block, verify_greedy, verify_rejection, UniformSource};

/// Draft tokens and, for a drafter that samples them, the distributions
/// they were drawn from.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Proposal {
    pub tokens: Vec<u32>,
    /// `tokens.len()` rows of `vocab`: row `i` is the draft distribution
    /// `tokens[i]` was drawn from (normalised). `None`: point masses.
    pub probs: Option<Vec<f32>>,
}

/// Proposes draft tokens to verify (the DSpark draft model, prompt lookup).
pub trait Drafter {
    /// Up to `k` tokens likely to follow `context` (the request's prompt and
    /// generated tokens so far).
    fn propose(&mut self, id: RequestId, context: &[u32], k: usize) -> Vec<u32>;

    /// Up to `k` tokens drawn for a request sampled with `params`, with
    /// their draft probabilities when the drafter has them (needed by the
    /// rejection and block verifiers). Default: [`Drafter::propose`] as
    /// point masses.
    fn propose_sampled(
        &mut self,
        id: RequestId,
        context: &[u32],
        k: usize,
        _params: &SamplingParams,
    ) -> Proposal {
        Proposal {
            tokens: self.propose(id, context, k),
            probs: None,
        }
    }

    /// Tensors the drafter wants captured from the target's forward.
    fn taps(&self) -> TapRequest {
        TapRequest::default()
    }

    /// After a step: the rows `rows` (indices into the step, ascending) of
    /// request `id`, at `positions`, hold committed tokens; `taps` holds what
    /// [`Drafter::taps`] asked for, for every row of the step.
    fn observe(&mut self, _id: RequestId, _positions: &[u32], _rows: &[usize], _taps: &Taps) {}

    /// The request finished: drop its state.
    fn forget(&mut self, _id: RequestId) {}
}

/// How verify rows are verified (module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum VerifyMode {
    /// Accept drafts while they equal the target's keyed sample.
    #[default]
    Greedy,
    /// Per-token rejection sampling (MODEL.md 6).
    Rejection,
    /// Block verification (Sun et al.).
    Block,
}

impl VerifyMode {
    /// Parse the command-line spelling (`greedy`, `rejection`, `block`).
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "greedy" => Some(VerifyMode::Greedy),
            "rejection" => Some(VerifyMode::Rejection),
            "block" => Some(VerifyMode::Block),
            _ => None,
        }
    }
}

/// Speculation counts of one request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpecStats {
    /// Verify steps.
    pub verifies: u64,
    /// Draft tokens verified.
    pub proposed: u64,
    /// Draft tokens accepted.
    pub accepted: u64,
}

impl SpecStats {
    /// Mean tokens committed per verify (accepted drafts + the target's own
    /// token), `None` before any verify.
    pub fn mean_acceptance_length(&self) -> Option<f64> {
        (self.verifies > 0).then(|| (self.accepted + self.verifies) as f64 / self.verifies as f64)
    }
}

/// Salt of the verifiers' uniforms (independent of the target's sampler).
const VERIFY_SALT: u64 = 0x7665_7269_6679_5f73; // "verify_s"

/// Uniforms keyed by (seed, position, draw index): batch-layout independent.
struct KeyedUniform {
    seed: u64,
    position: u32,
    draws: u64,
}

impl UniformSource for KeyedUniform {
    fn next_uniform(&mut self) -> f64 {
        let key = self.seed ^ VERIFY_SALT ^ self.draws.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.draws += 1;
        uniform(key, self.position)
    }
}

/// Why a runner step failed.
#[derive(Debug, thiserror::Error)]
pub enum RunnerError {
    #[error(transparent)]
    Sched(#[from] SchedError),
    #[error(transparent)]
    Backend(#[from] BackendError),
    #[error("the runner returned {got} {what}, expected {expected}")]
    Output {
        what: &'static str,
        got: usize,
        expected: usize,
    },
    #[error("the runner's KV pool ({runner}) does not match the scheduler's ({sched})")]
    Layout {
        runner: alloc::string::String,
        sched: alloc::string::String,
    },
    #[error("no progress for {0} steps (nothing schedulable)")]
    Stuck(u32),
}

/// Convert a planned step into the backend's plain-data batch.
pub fn to_step_batch(step: &ScheduledStep) -> StepBatch {
    StepBatch {
        tokens: step.rows.iter().map(|r| r.token).collect(),
        positions: step.rows.iter().map(|r| r.position).collect(),
        slot_mapping: step.rows.iter().map(|r| r.slot).collect(),
        row_seq: step.rows.iter().map(|r| r.seq).collect(),
        seqs: step
            .seqs
            .iter()
            .map(|s| StepSeq {
                request_id: s.request_id,
                block_table: s.block_table.clone(),
                context_len: s.context_len,
            })
            .collect(),
        logits_rows: step.logits_rows.clone(),
        decode_only: !step.rows.is_empty()
            && step
                .seqs
                .iter()
                .all(|s| !matches!(s.kind, RowKind::Prefill)),
    }
}

/// The scheduler driving a loaded model ([`ModelRunner`]): the scheduler
/// keeps the block tables, the runner the caches.
pub struct SchedRunner<'a> {
    pub runner: &'a mut dyn ModelRunner,
    pub sched: Scheduler,
    /// Draft tokens per verify (0: no speculation).
    pub spec_tokens: usize,
    pub drafter: Option<Box<dyn Drafter + 'a>>,
    /// How verify rows are verified.
    pub verify: VerifyMode,
    /// Speculation counts per request (finished ones included).
    pub spec_stats: BTreeMap<RequestId, SpecStats>,
    /// This step's proposals (tokens and draft probabilities) by request.
    proposals: BTreeMap<RequestId, Proposal>,
    /// Steps by path actually run (a `Mono` plan runs `Standard` on a runner
    /// without a mono path, or when the batch's own rule refuses it).
    pub ran_mono: u64,
    pub ran_standard: u64,
    /// Requests whose logits rows the caller wants back (a server's
    /// `logprobs`): only these rows are read back from the runner.
    pub want_logits: BTreeSet<RequestId>,
    /// After each step: for every request in `want_logits` that committed
    /// tokens, one `vocab`-long row of raw logits per committed token, in
    /// order (the distribution that token was sampled from), concatenated.
    pub step_logits: BTreeMap<RequestId, Vec<f32>>,
}

impl<'a> SchedRunner<'a> {
    /// A scheduler over `runner`'s KV pool: `cfg.block_size` and
    /// `cfg.num_blocks` are taken from the runner (the blocks it allocated),
    /// and so is `cfg.mono_max_rows` where the runner has a mono path (its
    /// [`ModelRunner::mono_max_rows`]: the planner marks Mono exactly the
    /// steps it runs on it); the rest of `cfg` as given.
    pub fn new(
        runner: &'a mut dyn ModelRunner,
        mut cfg: SchedulerConfig,
    ) -> Result<Self, RunnerError> {
        let layout = runner.kv_layout();
        cfg.block_size = layout.page_size;
        cfg.num_blocks = layout.num_pages;
        if runner.supports_mono() {
            cfg.mono_max_rows = runner.mono_max_rows().min(crate::backend::MONO_MAX_ROWS);
        }
        let sched = Scheduler::new(cfg)?;
        Ok(Self {
            runner,
            sched,
            spec_tokens: 0,
            drafter: None,
            verify: VerifyMode::Greedy,
            spec_stats: BTreeMap::new(),
            proposals: BTreeMap::new(),
            ran_mono: 0,
            ran_standard: 0,
            want_logits: BTreeSet::new(),
            step_logits: BTreeMap::new(),
        })
    }

    /// Plan, run and commit one step; returns the step.
    pub fn step(&mut self) -> Result<ScheduledStep, RunnerError> {
        self.proposals.clear();
        self.step_logits.clear();
        if self.spec_tokens > 0 {
            if let Some(d) = self.drafter.as_mut() {
                let ready: Vec<(RequestId, Vec<u32>)> = self
                    .sched
                    .decode_ready()
                    .map(|(id, t)| (id, t.to_vec()))
                    .collect();
                for (id, ctx) in ready {
                    let params = self
                        .sched
                        .request(id)
                        .map(|r| r.sampling)
                        .unwrap_or_default();
                    let p = d.propose_sampled(id, &ctx, self.spec_tokens, &params);
                    if !p.tokens.is_empty() {
                        self.sched.set_draft(id, p.tokens.clone())?;
                        self.proposals.insert(id, p);
                    }
                }
            }
        }
        let step = self.sched.schedule()?;
        if step.is_empty() {
            return Ok(step);
        }
        if !step.copies.is_empty() {
            let pairs: Vec<(u32, u32)> = step.copies.iter().map(|c| (c.src, c.dst)).collect();
            self.runner.copy_blocks(&pairs)?;
        }
        let batch = to_step_batch(&step);
        let path = match step.path {
            // (the planner marks no step past the runner's mono_max_rows:
            // `new` gave it that threshold)
            StepPath::Mono if self.runner.supports_mono() && Path::Mono.allows(&batch) => {
                Path::Mono
            }
            _ => Path::Standard,
        };
        match path {
            Path::Mono => self.ran_mono += 1,
            Path::Standard => self.ran_standard += 1,
        }
        let vocab = self.runner.config().vocab_size;
        // Sampling parameters of each logits row (its request's), and which
        // rows' logits the stochastic verifiers need back.
        let params_of = |id: RequestId| {
            self.sched
                .request(id)
                .map(|r| r.sampling)
                .unwrap_or_default()
        };
        let sampling: Vec<SamplingParams> = step
            .logits_rows
            .iter()
            .map(|&r| params_of(step.seqs[step.rows[r as usize].seq as usize].request_id))
            .collect();
        let row_of: BTreeMap<u32, usize> = step
            .logits_rows
            .iter()
            .enumerate()
            .map(|(i, &r)| (r, i))
            .collect();
        let mut read = ReadBack::tokens_only();
        for s in &step.seqs {
            if let RowKind::Verify { draft } = &s.kind {
                if self.stochastic_verify(s.request_id, draft.len(), vocab) {
                    read.logits.extend(
                        (s.first_row..s.first_row + s.num_rows)
                            .filter_map(|r| row_of.get(&r).map(|&i| i as u32)),
                    );
                }
            }
        }
        for s in &step.seqs {
            if s.needs_logits && self.want_logits.contains(&s.request_id) {
                read.logits.extend(
                    (s.first_row..s.first_row + s.num_rows)
                        .filter_map(|r| row_of.get(&r).map(|&i| i as u32)),
                );
            }
        }
        read.logits.sort_unstable();
        read.logits.dedup();
        if let (Some(d), true) = (&self.drafter, self.spec_tokens > 0) {
            read.taps = d.taps();
        }
        let out = self.runner.step(&StepInput {
            batch: &batch,
            path,
            sampling: &sampling,
            read: &read,
            teacher: None,
        })?;
        if out.tokens.len() != step.logits_rows.len() {
            return Err(RunnerError::Output {
                what: "sampled tokens",
                got: out.tokens.len(),
                expected: step.logits_rows.len(),
            });
        }
        if out.logits.len() != read.logits.len() * vocab {
            return Err(RunnerError::Output {
                what: "logits values",
                got: out.logits.len(),
                expected: read.logits.len() * vocab,
            });
        }
        // Position in `out.logits` of each read-back logits row.
        let logits_at: BTreeMap<usize, usize> = read
            .logits
            .iter()
            .enumerate()
            .map(|(j, &i)| (i as usize, j))
            .collect();
        let mut results = Vec::new();
        // Rows of each sequence that hold committed tokens (for the drafter).
        let mut committed_rows: Vec<(RequestId, usize)> = Vec::new();
        for s in &step.seqs {
            if !s.needs_logits {
                committed_rows.push((s.request_id, s.num_rows as usize));
                continue;
            }
            let params = params_of(s.request_id);
            let rows: Vec<usize> = (s.first_row..s.first_row + s.num_rows)
                .filter_map(|r| row_of.get(&r).copied())
                .collect();
            let tokens = match &s.kind {
                RowKind::Verify { draft } => {
                    let first_pos = step.rows[s.first_row as usize].position;
                    let probs = self
                        .proposals
                        .get(&s.request_id)
                        .and_then(|p| p.probs.as_deref())
                        .filter(|p| p.len() >= draft.len() * vocab);
                    let v = match (self.verify, probs) {
                        (VerifyMode::Rejection | VerifyMode::Block, Some(pd))
                            if !params.is_greedy()
                                && rows.iter().all(|i| logits_at.contains_key(i)) =>
                        {
                            let pd = &pd[..draft.len() * vocab];
                            let mut pt = Vec::with_capacity(rows.len() * vocab);
                            for i in &rows {
                                pt.extend(sampling_probs(
                                    out.logits_row(logits_at[i], vocab),
                                    &params,
                                ));
                            }
                            let mut rng = KeyedUniform {
                                seed: params.seed,
                                position: first_pos,
                                draws: 0,
                            };
                            if self.verify == VerifyMode::Block {
                                verify_block(draft, pd, &pt, vocab, &mut rng)
                            } else {
                                verify_rejection(draft, pd, &pt, vocab, &mut rng)
                            }
                        }
                        _ => {
                            // The runner's keyed samples are what plain
                            // decoding would have produced at each row.
                            let target: Vec<u32> = rows.iter().map(|&i| out.tokens[i]).collect();
                            verify_greedy(draft, &target)
                        }
                    }
                    .map_err(|_| SchedError::BadResult(s.request_id))?;
                    let st = self.spec_stats.entry(s.request_id).or_default();
                    st.verifies += 1;
                    st.proposed += draft.len() as u64;
                    st.accepted += v.accepted as u64;
                    committed_rows.push((s.request_id, 1 + v.accepted));
                    v.tokens
                }
                _ => {
                    committed_rows.push((s.request_id, s.num_rows as usize));
                    rows.last().map(|&i| out.tokens[i]).into_iter().collect()
                }
            };
            if self.want_logits.contains(&s.request_id) {
                // Row `j` of the sequence's logits rows is the distribution
                // its `j`-th committed token was sampled from.
                let mut rows_out = Vec::with_capacity(tokens.len() * vocab);
                for i in rows.iter().take(tokens.len()) {
                    if let Some(&j) = logits_at.get(i) {
                        rows_out.extend_from_slice(out.logits_row(j, vocab));
                    }
                }
                self.step_logits.insert(s.request_id, rows_out);
            }
            results.push(SeqTokens {
                request_id: s.request_id,
                tokens,
            });
        }
        if let (Some(d), true) = (self.drafter.as_mut(), self.spec_tokens > 0) {
            for (s, &(id, n)) in step.seqs.iter().zip(&committed_rows) {
                let rows: Vec<usize> = (s.first_row as usize..s.first_row as usize + n).collect();
                let positions: Vec<u32> = rows.iter().map(|&r| step.rows[r].position).collect();
                d.observe(id, &positions, &rows, &out.taps);
            }
        }
        self.sched.commit(&step, &results)?;
        Ok(step)
    }

    /// Drop request `id` (its client went away): the scheduler frees its
    /// blocks, the drafter forgets it. Between steps only.
    pub fn abort(&mut self, id: RequestId) -> Result<bool, RunnerError> {
        let live = self.sched.abort(id)?;
        if let Some(d) = self.drafter.as_mut() {
            d.forget(id);
        }
        self.want_logits.remove(&id);
        self.spec_stats.remove(&id);
        Ok(live)
    }

    /// Whether a verify of `n` drafts for request `id` uses a stochastic
    /// verifier (and so needs the target's logits rows back).
    fn stochastic_verify(&self, id: RequestId, n: usize, vocab: usize) -> bool {
        let greedy = self
            .sched
            .request(id)
            .is_none_or(|r| r.sampling.is_greedy());
        matches!(self.verify, VerifyMode::Rejection | VerifyMode::Block)
            && !greedy
            && self
                .proposals
                .get(&id)
                .and_then(|p| p.probs.as_ref())
                .is_some_and(|p| p.len() >= n * vocab)
    }

    /// Mean acceptance length over every verify so far (the scheduler's
    /// counters), `None` before any verify.
    pub fn mean_acceptance_length(&self) -> Option<f64> {
        self.sched.counters().mean_acceptance_length()
    }

    /// Step until every queued request has finished; returns the finished
    /// requests in completion order. `on_step` sees each step and the
    /// requests it finished (progress reporting).
    pub fn run(
        &mut self,
        mut on_step: impl FnMut(&ScheduledStep, &[FinishedRequest]),
    ) -> Result<Vec<FinishedRequest>, RunnerError> {
        let mut done = self.sched.take_finished();
        let mut idle = 0;
        while !self.sched.is_done() {
            let step = self.step()?;
            let fin = self.sched.take_finished();
            if let Some(d) = self.drafter.as_mut() {
                for f in &fin {
                    d.forget(f.id);
                }
            }
            on_step(&step, &fin);
            done.extend(fin);
            idle = if step.is_empty() { idle + 1 } else { 0 };
            if idle > 2 {
                return Err(RunnerError::Stuck(idle));
            }
        }
        Ok(done)
    }
}
