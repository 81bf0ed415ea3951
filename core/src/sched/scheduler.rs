//! Continuous batching with chunked prefill, prefix caching and preemption by
//! recompute.
//!
//! The loop the engine runs: [`Scheduler::schedule`] plans one step (rows,
//! block tables, copies, path), the backend computes it, the engine samples
//! or verifies the rows with logits, and [`Scheduler::commit`] records the
//! tokens. Nothing else changes scheduler state between the two calls.
//!
//! Policy, per step, under a budget of `max_batch_tokens` rows:
//! 1. Running sequences in admission order (oldest first): a decode
//!    sequence gets its one row (plus its speculative draft when one was set
//!    and fits), a sequence still in prefill gets the next chunk of its
//!    prompt that fits the budget. When the cache cannot hold a sequence's
//!    new rows, the newest running sequence not yet scheduled this step is
//!    preempted (its blocks are freed and it is requeued at the front of the
//!    queue with its generated tokens appended to its prompt, to be
//!    recomputed later, mostly from the prefix cache); if there is none, the
//!    sequence itself is. The oldest sequence is therefore never preempted
//!    by a newer one and always progresses (admission checks that one
//!    request alone fits the cache), so every admitted request finishes.
//! 2. If nothing was preempted, waiting requests are admitted in order while
//!    the budget, `max_seqs` and the free blocks allow: the prefix cache
//!    supplies the longest run of cached full blocks, the rest is scheduled
//!    as prefill chunks. Admission never preempts.

use alloc::collections::VecDeque;
use alloc::vec::Vec;

use super::blocks::{BlockCopy, BlockId, BlockPool};
use super::prefix::{block_hashes, chain_hash, BlockHash, ROOT_HASH};
use super::request::{finish_reason, FinishReason, FinishedRequest, Request, RequestId};
use super::step::{plan_path, Row, RowKind, ScheduledStep, StepCounters, StepPath, StepSeq};
use super::SchedError;

/// Scheduler limits (counts; `block_size` in token slots).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SchedulerConfig {
    /// Token slots per KV / index-cache block.
    pub block_size: usize,
    /// Blocks in the pool (the cache's capacity is `num_blocks * block_size` positions).
    pub num_blocks: usize,
    /// Most rows (tokens) in one step.
    pub max_batch_tokens: usize,
    /// Most sequences in one step.
    pub max_seqs: usize,
    /// Largest pure-decode step the planner marks for the mono path (16 by
    /// default; `SchedRunner::new` sets the runner's own figure where it
    /// has a mono path, `ModelRunner::mono_max_rows`).
    pub mono_max_rows: usize,
    /// Reuse cached full blocks across requests.
    pub enable_prefix_cache: bool,
    /// Most draft tokens verified per sequence and step (MODEL.md 6: N <= 7).
    pub max_draft_tokens: usize,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self {
            block_size: 16,
            num_blocks: 1024,
            max_batch_tokens: 2048,
            max_seqs: 64,
            mono_max_rows: 16,
            enable_prefix_cache: true,
            max_draft_tokens: 7,
        }
    }
}

/// The tokens the engine produced for one sequence of a step: one sampled
/// token for a decode row or a final prefill chunk; for a verify row set, the
/// accepted draft prefix followed by the target's own token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeqTokens {
    pub request_id: RequestId,
    pub tokens: Vec<u32>,
}

/// A sequence in the scheduler.
#[derive(Clone, Debug)]
struct Seq {
    req: Request,
    /// Prompt followed by every generated token.
    tokens: Vec<u32>,
    /// Leading tokens whose K/V is in the cache.
    num_computed: usize,
    blocks: Vec<BlockId>,
    /// Chained keys of the computed full blocks `0 .. hashes.len()`.
    hashes: Vec<BlockHash>,
    /// Draft tokens to verify in the next step (decode sequences only).
    draft: Vec<u32>,
    preemptions: u32,
    cached_tokens: usize,
    /// `tokens.len()` at the last admission: positions below it are prompt
    /// (or recompute) work, counted as prefill whatever the row kind.
    prefill_end: usize,
}

impl Seq {
    fn output(&self) -> &[u32] {
        &self.tokens[self.req.prompt.len()..]
    }
}

/// The scheduler: queue, running set, block pool and counters.
#[derive(Debug)]
pub struct Scheduler {
    cfg: SchedulerConfig,
    pool: BlockPool,
    waiting: VecDeque<Seq>,
    running: Vec<Seq>,
    finished: Vec<FinishedRequest>,
    counters: StepCounters,
    next_step: u64,
    /// Index of the step planned but not yet committed.
    pending: Option<u64>,
}

impl Scheduler {
    pub fn new(cfg: SchedulerConfig) -> Result<Self, SchedError> {
        if cfg.max_batch_tokens == 0 || cfg.max_seqs == 0 {
            return Err(SchedError::Config(
                "max_batch_tokens and max_seqs must be > 0",
            ));
        }
        let pool = BlockPool::new(cfg.num_blocks, cfg.block_size)?;
        Ok(Self {
            cfg,
            pool,
            waiting: VecDeque::new(),
            running: Vec::new(),
            finished: Vec::new(),
            counters: StepCounters::default(),
            next_step: 0,
            pending: None,
        })
    }

    pub fn config(&self) -> &SchedulerConfig {
        &self.cfg
    }

    pub fn counters(&self) -> &StepCounters {
        &self.counters
    }

    pub fn pool(&self) -> &BlockPool {
        &self.pool
    }

    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }

    pub fn num_running(&self) -> usize {
        self.running.len()
    }

    /// No request waiting or running.
    pub fn is_done(&self) -> bool {
        self.waiting.is_empty() && self.running.is_empty()
    }

    /// Requests finished since the last call.
    pub fn take_finished(&mut self) -> Vec<FinishedRequest> {
        core::mem::take(&mut self.finished)
    }

    /// Queue a request. One that can never fit the cache (or is empty) is
    /// finished at once as [`FinishReason::Rejected`]; a duplicate live id is
    /// an error.
    pub fn add_request(&mut self, req: Request) -> Result<(), SchedError> {
        let live = self
            .waiting
            .iter()
            .chain(self.running.iter())
            .any(|s| s.req.id == req.id);
        if live {
            return Err(SchedError::DuplicateRequest(req.id));
        }
        // Positions written: the prompt and every generated token but the last.
        let positions = (req.prompt.len() + req.max_tokens).saturating_sub(1);
        let blocks = positions.div_ceil(self.cfg.block_size);
        if req.prompt.is_empty() || req.max_tokens == 0 || blocks > self.cfg.num_blocks {
            self.counters.requests_finished += 1;
            self.finished.push(FinishedRequest {
                id: req.id,
                prompt_len: req.prompt.len(),
                output: Vec::new(),
                reason: FinishReason::Rejected,
                preemptions: 0,
                cached_tokens: 0,
            });
            return Ok(());
        }
        self.waiting.push_back(Seq {
            tokens: req.prompt.clone(),
            req,
            num_computed: 0,
            blocks: Vec::new(),
            hashes: Vec::new(),
            draft: Vec::new(),
            preemptions: 0,
            cached_tokens: 0,
            prefill_end: 0,
        });
        Ok(())
    }

    /// The request `id` if it is queued or running.
    pub fn request(&self, id: RequestId) -> Option<&Request> {
        self.running
            .iter()
            .chain(self.waiting.iter())
            .find(|s| s.req.id == id)
            .map(|s| &s.req)
    }

    /// Generated tokens so far of the queued or running request `id` (a
    /// preempted request keeps its output: it is recomputed, not redone).
    pub fn output(&self, id: RequestId) -> Option<&[u32]> {
        self.running
            .iter()
            .chain(self.waiting.iter())
            .find(|s| s.req.id == id)
            .map(Seq::output)
    }

    /// Drop the queued or running request `id` (a client went away): its
    /// blocks go back to the pool (full computed blocks stay in the prefix
    /// cache as idle entries), and it is not reported as finished. Returns
    /// whether it was live. Only between steps: refused while a planned
    /// step awaits its commit, since that step's rows name its blocks.
    pub fn abort(&mut self, id: RequestId) -> Result<bool, SchedError> {
        if self.pending.is_some() {
            return Err(SchedError::StepPending);
        }
        if let Some(pos) = self.waiting.iter().position(|s| s.req.id == id) {
            // Waiting sequences hold no blocks.
            self.waiting.remove(pos);
            self.counters.requests_aborted += 1;
            return Ok(true);
        }
        if let Some(pos) = self.running.iter().position(|s| s.req.id == id) {
            let seq = self.running.remove(pos);
            for &blk in &seq.blocks {
                self.pool.release(blk)?;
            }
            self.counters.requests_aborted += 1;
            return Ok(true);
        }
        Ok(false)
    }

    /// Running sequences ready for a decode step, with their tokens so far
    /// (what a draft model conditions on).
    pub fn decode_ready(&self) -> impl Iterator<Item = (RequestId, &[u32])> + '_ {
        self.running
            .iter()
            .filter(|s| s.tokens.len() == s.num_computed + 1)
            .map(|s| (s.req.id, s.tokens.as_slice()))
    }

    /// Set the draft tokens to verify for `id` in the next step (truncated to
    /// `max_draft_tokens`; the planner may shorten it further to fit the
    /// budget and `max_tokens`).
    pub fn set_draft(&mut self, id: RequestId, mut draft: Vec<u32>) -> Result<(), SchedError> {
        let seq = self
            .running
            .iter_mut()
            .find(|s| s.req.id == id)
            .ok_or(SchedError::UnknownRequest(id))?;
        if seq.tokens.len() != seq.num_computed + 1 {
            return Err(SchedError::NotDecoding(id));
        }
        draft.truncate(self.cfg.max_draft_tokens);
        seq.draft = draft;
        Ok(())
    }

    /// Plan the next step. Call [`Scheduler::commit`] with its results before
    /// planning another.
    pub fn schedule(&mut self) -> Result<ScheduledStep, SchedError> {
        if self.pending.is_some() {
            return Err(SchedError::StepPending);
        }
        let bs = self.cfg.block_size;
        let mut budget = self.cfg.max_batch_tokens;
        let mut b = StepBuilder::default();
        let mut preempted_any = false;

        // 1. Running sequences, oldest first.
        let mut i = 0;
        while i < self.running.len() && budget > 0 && b.seqs.len() < self.cfg.max_seqs {
            let (base, n) = {
                let s = &self.running[i];
                let remaining = s.tokens.len() - s.num_computed;
                if remaining == 1 {
                    let left = s.req.max_tokens.saturating_sub(s.output().len());
                    let d = s.draft.len().min(budget - 1).min(left.saturating_sub(1));
                    (s.num_computed, 1 + d)
                } else {
                    (s.num_computed, remaining.min(budget))
                }
            };
            let mut self_preempted = false;
            loop {
                match reserve(&mut self.pool, &mut self.running[i], base, n, bs) {
                    Ok(copies) => {
                        b.copies.extend(copies);
                        break;
                    }
                    Err(SchedError::OutOfBlocks) => {
                        preempted_any = true;
                        let victim = self.running.len() - 1;
                        let victim_id = self.running[victim].req.id;
                        self.preempt(victim)?;
                        b.preempted.push(victim_id);
                        if victim == i {
                            self_preempted = true;
                            break;
                        }
                    }
                    Err(e) => return Err(e),
                }
            }
            if self_preempted {
                break;
            }
            emit(&mut b, &mut self.running[i], base, n, bs);
            budget -= n;
            i += 1;
        }

        // 2. Admission.
        while !preempted_any
            && budget > 0
            && self.running.len() < self.cfg.max_seqs
            && b.seqs.len() < self.cfg.max_seqs
            && !self.waiting.is_empty()
        {
            let Some(mut seq) = self.waiting.pop_front() else {
                break;
            };
            match self.admit(&mut seq, budget)? {
                Some((base, n, copies)) => {
                    b.copies.extend(copies);
                    emit(&mut b, &mut seq, base, n, bs);
                    budget -= n;
                    self.running.push(seq);
                }
                None => {
                    self.waiting.push_front(seq);
                    break;
                }
            }
        }

        let path = plan_path(&b.seqs, b.rows.len(), self.cfg.mono_max_rows);
        let index = self.next_step;
        self.next_step += 1;
        let prefill_rows = b.prefill_rows;
        let step = ScheduledStep {
            index,
            path,
            rows: b.rows,
            seqs: b.seqs,
            logits_rows: b.logits_rows,
            copies: b.copies,
            preempted: b.preempted,
        };
        let c = &mut self.counters;
        if !step.is_empty() {
            match path {
                StepPath::Mono => {
                    c.steps_mono += 1;
                    c.rows_mono += step.rows.len() as u64;
                }
                StepPath::Standard => {
                    c.steps_standard += 1;
                    c.rows_standard += step.rows.len() as u64;
                }
            }
            self.pending = Some(index);
        }
        let decode = step.decode_rows() as u64;
        c.decode_rows += decode;
        c.prefill_tokens += prefill_rows;
        c.cow_copies += step.copies.len() as u64;
        #[cfg(feature = "std")]
        tracing::debug!(
            step = index,
            path = ?path,
            rows = step.rows.len(),
            seqs = step.seqs.len(),
            decode_rows = decode,
            copies = step.copies.len(),
            preempted = step.preempted.len(),
            waiting = self.waiting.len(),
            free_blocks = self.pool.num_available(),
            "sched step"
        );
        Ok(step)
    }

    /// Record a step's results. `results` holds one entry for every sequence
    /// of the step with `needs_logits` (others may be omitted).
    pub fn commit(
        &mut self,
        step: &ScheduledStep,
        results: &[SeqTokens],
    ) -> Result<(), SchedError> {
        if step.is_empty() {
            return Ok(());
        }
        if self.pending != Some(step.index) {
            return Err(SchedError::WrongStep(step.index));
        }
        let bs = self.cfg.block_size;
        let mut done: Vec<(RequestId, FinishReason)> = Vec::new();
        for s in &step.seqs {
            let id = s.request_id;
            let seq = self
                .running
                .iter_mut()
                .find(|q| q.req.id == id)
                .ok_or(SchedError::UnknownRequest(id))?;
            if !s.needs_logits {
                seq.num_computed += s.num_rows as usize;
            } else {
                let out = &results
                    .iter()
                    .find(|r| r.request_id == id)
                    .ok_or(SchedError::MissingResult(id))?
                    .tokens;
                let draft: &[u32] = match &s.kind {
                    RowKind::Verify { draft } => draft,
                    _ => &[],
                };
                let ok = !out.is_empty()
                    && out.len() <= draft.len() + 1
                    && out[..out.len() - 1] == draft[..out.len() - 1];
                if !ok {
                    return Err(SchedError::BadResult(id));
                }
                let accepted = out.len() - 1;
                if matches!(s.kind, RowKind::Verify { .. }) {
                    self.counters.spec_verifies += 1;
                    self.counters.spec_proposed += draft.len() as u64;
                    self.counters.spec_accepted += accepted as u64;
                }
                seq.num_computed = seq.tokens.len() + accepted;
                for &t in out {
                    seq.tokens.push(t);
                    self.counters.tokens_generated += 1;
                    if let Some(r) = finish_reason(&seq.req, seq.output()) {
                        done.push((id, r));
                        break;
                    }
                }
            }
            seq.draft.clear();
            // Computed full blocks become shareable; blocks past the computed
            // tokens (rejected draft rows) go back to the pool.
            let full = seq.num_computed.min(seq.tokens.len()) / bs;
            while seq.hashes.len() < full {
                let k = seq.hashes.len();
                let parent = seq.hashes.last().copied().unwrap_or(ROOT_HASH);
                let toks = &seq.tokens[k * bs..(k + 1) * bs];
                let h = chain_hash(parent, toks);
                if self.cfg.enable_prefix_cache {
                    self.pool.register(seq.blocks[k], h, toks);
                }
                seq.hashes.push(h);
            }
            let keep = seq.num_computed.div_ceil(bs);
            while seq.blocks.len() > keep {
                if let Some(blk) = seq.blocks.pop() {
                    self.pool.release(blk)?;
                }
            }
        }
        for (id, reason) in done {
            if let Some(pos) = self.running.iter().position(|q| q.req.id == id) {
                let seq = self.running.remove(pos);
                for &blk in &seq.blocks {
                    self.pool.release(blk)?;
                }
                self.counters.requests_finished += 1;
                self.finished.push(FinishedRequest {
                    id,
                    prompt_len: seq.req.prompt.len(),
                    output: seq.output().to_vec(),
                    reason,
                    preemptions: seq.preemptions,
                    cached_tokens: seq.cached_tokens,
                });
            }
        }
        self.pending = None;
        Ok(())
    }

    /// Free `running[idx]`'s blocks and requeue it at the front, to be
    /// recomputed from its prompt plus generated tokens.
    fn preempt(&mut self, idx: usize) -> Result<(), SchedError> {
        let mut seq = self.running.remove(idx);
        for &blk in &seq.blocks {
            self.pool.release(blk)?;
        }
        seq.blocks.clear();
        seq.hashes.clear();
        seq.draft.clear();
        seq.num_computed = 0;
        seq.preemptions += 1;
        self.counters.preemptions += 1;
        self.waiting.push_front(seq);
        Ok(())
    }

    /// Try to admit `seq` with at most `budget` rows: prefix-cache lookup,
    /// block reservation. Returns its first chunk `(base, n, copies)`, or
    /// `None` (state unchanged) when the free blocks do not suffice.
    fn admit(
        &mut self,
        seq: &mut Seq,
        budget: usize,
    ) -> Result<Option<(usize, usize, Vec<BlockCopy>)>, SchedError> {
        let bs = self.cfg.block_size;
        let len = seq.tokens.len();
        let mut hits: Vec<(BlockId, BlockHash)> = Vec::new();
        if self.cfg.enable_prefix_cache {
            for (k, h) in block_hashes(&seq.tokens, bs).into_iter().enumerate() {
                match self.pool.lookup(h, &seq.tokens[k * bs..(k + 1) * bs]) {
                    Some(blk) => hits.push((blk, h)),
                    None => break,
                }
            }
        }
        loop {
            // A fully cached prompt still recomputes its last token (its
            // logits are needed): that write lands in a cached block, which
            // is copied first (copy-on-write: one extra block).
            let full_hit = hits.len() * bs >= len;
            let computed = if full_hit { len - 1 } else { hits.len() * bs };
            let n = (len - computed).min(budget);
            let need = (computed + n).div_ceil(bs) - hits.len() + usize::from(full_hit);
            let idle_hits = hits
                .iter()
                .filter(|(blk, _)| self.pool.ref_count(*blk) == 0)
                .count();
            if self.pool.num_available() - idle_hits >= need {
                for &(blk, _) in &hits {
                    self.pool.retain(blk)?;
                }
                seq.blocks = hits.iter().map(|&(blk, _)| blk).collect();
                seq.hashes = hits.iter().map(|&(_, h)| h).collect();
                seq.num_computed = computed;
                seq.cached_tokens += computed;
                seq.prefill_end = len;
                self.counters.prefix_hit_tokens += computed as u64;
                let copies = reserve(&mut self.pool, seq, computed, n, bs)?;
                return Ok(Some((computed, n, copies)));
            }
            if full_hit && !hits.is_empty() {
                // Not enough room for the copy: recompute the last block instead.
                hits.pop();
                continue;
            }
            return Ok(None);
        }
    }

    /// Test support: the pool's own invariants, plus every block's reference
    /// count equals the number of running sequences holding it (so no block
    /// is owned twice without being shared knowingly), waiting sequences hold
    /// nothing, and every running sequence's table covers its computed tokens.
    pub fn check_invariants(&self) -> Result<(), &'static str> {
        self.pool.check_invariants()?;
        let mut held = alloc::vec![0u32; self.pool.num_blocks()];
        for s in &self.running {
            if s.blocks.len() < s.num_computed.div_ceil(self.cfg.block_size) {
                return Err("block table shorter than the computed tokens");
            }
            for &blk in &s.blocks {
                held[blk as usize] += 1;
            }
        }
        if self
            .waiting
            .iter()
            .any(|s| !s.blocks.is_empty() || s.num_computed != 0)
        {
            return Err("a waiting sequence holds blocks");
        }
        for (blk, &h) in held.iter().enumerate() {
            if self.pool.ref_count(blk as BlockId) != h {
                return Err("reference count differs from the number of holders");
            }
        }
        Ok(())
    }
}

/// Rows, sequences and copies of the step being planned.
#[derive(Default)]
struct StepBuilder {
    rows: Vec<Row>,
    seqs: Vec<StepSeq>,
    logits_rows: Vec<u32>,
    copies: Vec<BlockCopy>,
    preempted: Vec<RequestId>,
    /// Rows at positions below their sequence's `prefill_end`.
    prefill_rows: u64,
}

/// Make sure `seq` has writable blocks for positions `base .. base + n`:
/// copy-on-write of existing non-writable blocks in that range and new
/// blocks past its table. All or nothing: `OutOfBlocks` changes nothing.
fn reserve(
    pool: &mut BlockPool,
    seq: &mut Seq,
    base: usize,
    n: usize,
    bs: usize,
) -> Result<Vec<BlockCopy>, SchedError> {
    let end_blocks = (base + n).div_ceil(bs);
    let first = base / bs;
    let cows = (first..seq.blocks.len().min(end_blocks))
        .filter(|&k| !pool.is_writable(seq.blocks[k]))
        .count();
    let new = end_blocks.saturating_sub(seq.blocks.len());
    if pool.num_available() < cows + new {
        return Err(SchedError::OutOfBlocks);
    }
    let mut copies = Vec::new();
    for k in first..seq.blocks.len().min(end_blocks) {
        let (blk, copy) = pool.make_writable(seq.blocks[k])?;
        seq.blocks[k] = blk;
        copies.extend(copy);
    }
    while seq.blocks.len() < end_blocks {
        seq.blocks.push(pool.allocate()?);
    }
    Ok(copies)
}

/// Append `seq`'s rows for positions `base .. base + n` to the step.
fn emit(b: &mut StepBuilder, seq: &mut Seq, base: usize, n: usize, bs: usize) {
    let known = seq.tokens.len();
    let seq_idx = b.seqs.len() as u32;
    let first_row = b.rows.len() as u32;
    for p in base..base + n {
        let token = if p < known {
            seq.tokens[p]
        } else {
            seq.draft[p - known]
        };
        let slot = seq.blocks[p / bs] as usize * bs + p % bs;
        b.rows.push(Row {
            token,
            position: p as u32,
            slot: slot as u32,
            seq: seq_idx,
        });
        b.prefill_rows += u64::from(p < seq.prefill_end);
    }
    let needs_logits = base + n >= known;
    let kind = if base + 1 == known && n > 1 {
        RowKind::Verify {
            draft: seq.draft[..n - 1].to_vec(),
        }
    } else if base + 1 == known {
        RowKind::Decode
    } else {
        RowKind::Prefill
    };
    if needs_logits {
        // Logits from the row of the last known token on (every verify row).
        for r in (known - 1 - base)..n {
            b.logits_rows.push(first_row + r as u32);
        }
    }
    b.seqs.push(StepSeq {
        request_id: seq.req.id,
        first_row,
        num_rows: n as u32,
        context_len: (base + n) as u32,
        block_table: seq.blocks[..(base + n).div_ceil(bs)].to_vec(),
        kind,
        needs_logits,
    });
}
