//! The scheduler driving a real [`Backend`]: plan a step, perform its block
//! copies, convert it to a [`StepBatch`], run the forward, sample or verify
//! the rows with logits, commit.
//!
//! Speculative decoding: a [`Drafter`] proposes up to `spec_tokens` tokens
//! for every sequence ready to decode; the verify rows are folded into the
//! same step as everything else. The target's token for each verify row is
//! what plain decoding would have produced there (`sample` keyed by the
//! request seed and the position), and drafts are accepted while they match
//! it ([`verify_greedy`]). Because the sampler's randomness is keyed by
//! (seed, position), this reproduces plain decoding token for token for
//! greedy *and* stochastic requests. For a deterministic drafter (a point
//! mass on its proposal, like prompt lookup) nothing is lost: a draft token
//! `x` is accepted with probability `p_t(x)`, exactly what rejection sampling
//! with `p_d = onehot(x)` gives. A drafter that *samples* its proposals
//! (DSpark) would accept more with the rejection or block verifiers of
//! [`crate::spec_decode`], which need the draft's probabilities; they are
//! not wired here yet.

use alloc::boxed::Box;
use alloc::collections::BTreeMap;
use alloc::vec::Vec;

use super::request::{FinishedRequest, RequestId};
use super::scheduler::{Scheduler, SchedulerConfig, SeqTokens};
use super::step::{RowKind, ScheduledStep, StepPath};
use super::SchedError;
use crate::backend::{Backend, BackendError, Path, RunOptions, StepBatch, StepSeq, Taps};
use crate::kv::{CacheData, CacheDtype, KvCache, KvLayout};
use crate::sample::sample;
use crate::spec_decode::verify_greedy;
use crate::weights::ModelWeights;

/// Proposes draft tokens to verify (e.g. the DSpark draft model).
pub trait Drafter {
    /// Up to `k` tokens likely to follow `context` (the request's prompt and
    /// generated tokens so far).
    fn propose(&mut self, id: RequestId, context: &[u32], k: usize) -> Vec<u32>;
}

/// Why a runner step failed.
#[derive(Debug, thiserror::Error)]
pub enum RunnerError {
    #[error(transparent)]
    Sched(#[from] SchedError),
    #[error(transparent)]
    Backend(#[from] BackendError),
    #[error("backend returned {got} logits, expected {expected}")]
    Logits { got: usize, expected: usize },
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
    }
}

/// Copy every slot of page `src` into page `dst` in every K, V and index
/// tensor, raw (no requantization).
pub fn copy_page(cache: &mut KvCache, src: u32, dst: u32) {
    let ps = cache.layout.page_size;
    for layer in &mut cache.layers {
        for t in [
            Some(&mut layer.k),
            Some(&mut layer.v),
            layer.index_k.as_mut(),
        ]
        .into_iter()
        .flatten()
        {
            let n = ps * t.width;
            let (s, d) = (src as usize * n, dst as usize * n);
            match &mut t.data {
                CacheData::Bf16(x) => x.copy_within(s..s + n, d),
                CacheData::Fp8(x) => x.copy_within(s..s + n, d),
            }
        }
    }
}

/// Scheduler + backend + cache.
pub struct SchedRunner<'a> {
    pub backend: &'a dyn Backend,
    pub model: &'a ModelWeights,
    pub cache: KvCache,
    pub sched: Scheduler,
    pub opts: RunOptions,
    /// Draft tokens per verify (0: no speculation).
    pub spec_tokens: usize,
    pub drafter: Option<Box<dyn Drafter + 'a>>,
    /// Steps by path actually run (a `Mono` plan runs `Standard` on a backend
    /// without a mono path, or when the backend's own rule refuses it).
    pub ran_mono: u64,
    pub ran_standard: u64,
}

impl<'a> SchedRunner<'a> {
    /// A runner whose cache pages are the scheduler's blocks.
    pub fn new(
        backend: &'a dyn Backend,
        model: &'a ModelWeights,
        cfg: SchedulerConfig,
        dtype: CacheDtype,
        opts: RunOptions,
    ) -> Result<Self, RunnerError> {
        let sched = Scheduler::new(cfg)?;
        let layout = KvLayout {
            page_size: cfg.block_size,
            num_pages: cfg.num_blocks,
            dtype,
        };
        Ok(Self {
            backend,
            model,
            cache: KvCache::new(model, layout),
            sched,
            opts,
            spec_tokens: 0,
            drafter: None,
            ran_mono: 0,
            ran_standard: 0,
        })
    }

    /// Plan, run and commit one step; returns the step.
    pub fn step(&mut self) -> Result<ScheduledStep, RunnerError> {
        if self.spec_tokens > 0 {
            if let Some(d) = self.drafter.as_mut() {
                let ready: Vec<(RequestId, Vec<u32>)> = self
                    .sched
                    .decode_ready()
                    .map(|(id, t)| (id, t.to_vec()))
                    .collect();
                for (id, ctx) in ready {
                    let draft = d.propose(id, &ctx, self.spec_tokens);
                    if !draft.is_empty() {
                        self.sched.set_draft(id, draft)?;
                    }
                }
            }
        }
        let step = self.sched.schedule()?;
        if step.is_empty() {
            return Ok(step);
        }
        for c in &step.copies {
            copy_page(&mut self.cache, c.src, c.dst);
        }
        let batch = to_step_batch(&step);
        let path = match step.path {
            StepPath::Mono if self.backend.supports_mono() && Path::Mono.allows(&batch) => {
                Path::Mono
            }
            _ => Path::Standard,
        };
        match path {
            Path::Mono => self.ran_mono += 1,
            Path::Standard => self.ran_standard += 1,
        }
        let logits = self.backend.forward(
            self.model,
            &mut self.cache,
            &batch,
            path,
            &self.opts,
            &mut Taps::none(),
        )?;
        let vocab = self.model.config.vocab_size;
        if logits.len() != step.logits_rows.len() * vocab {
            return Err(RunnerError::Logits {
                got: logits.len(),
                expected: step.logits_rows.len() * vocab,
            });
        }
        let row_of: BTreeMap<u32, usize> = step
            .logits_rows
            .iter()
            .enumerate()
            .map(|(i, &r)| (r, i))
            .collect();
        let mut results = Vec::new();
        for s in step.seqs.iter().filter(|s| s.needs_logits) {
            let params = self
                .sched
                .request(s.request_id)
                .map(|r| r.sampling)
                .unwrap_or_default();
            // The target's token after each row with logits, keyed by the
            // position it will occupy.
            let mut target = Vec::new();
            for r in s.first_row..s.first_row + s.num_rows {
                if let Some(&i) = row_of.get(&r) {
                    let pos = step.rows[r as usize].position;
                    target.push(sample(
                        &logits[i * vocab..(i + 1) * vocab],
                        &params,
                        pos + 1,
                    ));
                }
            }
            let tokens = match &s.kind {
                RowKind::Verify { draft } => {
                    verify_greedy(draft, &target)
                        .map_err(|_| SchedError::BadResult(s.request_id))?
                        .tokens
                }
                _ => target.last().copied().into_iter().collect(),
            };
            results.push(SeqTokens {
                request_id: s.request_id,
                tokens,
            });
        }
        self.sched.commit(&step, &results)?;
        Ok(step)
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
