//! A deterministic stand-in backend and a small engine loop around the
//! scheduler, for tests and for exercising the scheduler without a model.
//!
//! The mock "model" maps a whole context (every token at positions `0..=p`)
//! to one next token by hashing it: the same context always gives the same
//! token, and any change in any earlier token changes it. The mock backend
//! keeps a simulated cache of `(token, position)` per slot, applies the
//! step's block copies, writes the step's rows, and for each logits row
//! *reads the context back through the block table*, failing if a slot
//! holds the wrong position. A wrong slot mapping, a missing copy, or a block
//! reused while still in use therefore gives different tokens than running
//! the request alone (or an error), which is what the tests compare.

use alloc::collections::BTreeMap;
use alloc::vec;
use alloc::vec::Vec;

use super::request::{FinishedRequest, RequestId};
use super::scheduler::{Scheduler, SeqTokens};
use super::step::{RowKind, ScheduledStep};
use super::SchedError;
use crate::spec_decode::verify_greedy;

/// The mock model: the next token after `context` (never empty).
pub fn mock_next(context: &[u32], vocab: u32) -> u32 {
    let mut h: u64 = 0x6d6f_636b_0000_0001;
    for &t in context {
        h = (h ^ u64::from(t)).wrapping_mul(0x0000_0100_0000_01b3);
        h ^= h >> 29;
    }
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    ((h >> 32) % u64::from(vocab.max(1))) as u32
}

/// Why the mock backend refused a step.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MockError {
    #[error("slot {slot} out of range ({slots} slots)")]
    SlotOutOfRange { slot: usize, slots: usize },
    #[error("request {request}: position {pos} read from slot {slot} holds {found:?}")]
    StaleSlot {
        request: RequestId,
        pos: u32,
        slot: usize,
        found: Option<(u32, u32)>,
    },
    #[error(transparent)]
    Sched(#[from] SchedError),
    #[error("engine made no progress for {0} steps")]
    Stuck(u32),
}

/// Simulated paged cache + mock model.
#[derive(Clone, Debug)]
pub struct MockBackend {
    block_size: usize,
    vocab: u32,
    /// `(token, position)` per slot.
    cache: Vec<Option<(u32, u32)>>,
    /// Rows computed, for throughput-style counts.
    pub rows_computed: u64,
}

impl MockBackend {
    pub fn new(num_blocks: usize, block_size: usize, vocab: u32) -> Self {
        Self {
            block_size,
            vocab,
            cache: vec![None; num_blocks * block_size],
            rows_computed: 0,
        }
    }

    pub fn vocab(&self) -> u32 {
        self.vocab
    }

    /// Run a step; returns the mock model's token for every row of
    /// `step.logits_rows`, in that order.
    pub fn execute(&mut self, step: &ScheduledStep) -> Result<Vec<u32>, MockError> {
        let bs = self.block_size;
        let slots = self.cache.len();
        for c in &step.copies {
            let (s, d) = (c.src as usize * bs, c.dst as usize * bs);
            if s + bs > slots || d + bs > slots {
                return Err(MockError::SlotOutOfRange {
                    slot: s.max(d),
                    slots,
                });
            }
            for k in 0..bs {
                self.cache[d + k] = self.cache[s + k];
            }
        }
        for r in &step.rows {
            let slot = r.slot as usize;
            *self
                .cache
                .get_mut(slot)
                .ok_or(MockError::SlotOutOfRange { slot, slots })? = Some((r.token, r.position));
        }
        self.rows_computed += step.rows.len() as u64;
        let mut out = Vec::with_capacity(step.logits_rows.len());
        let mut ctx = Vec::new();
        for &ri in &step.logits_rows {
            let r = step.rows[ri as usize];
            let seq = &step.seqs[r.seq as usize];
            ctx.clear();
            for j in 0..=r.position {
                let page = seq
                    .block_table
                    .get(j as usize / bs)
                    .copied()
                    .unwrap_or(u32::MAX) as usize;
                let slot = page.saturating_mul(bs).saturating_add(j as usize % bs);
                let found = self.cache.get(slot).copied().flatten();
                match found {
                    Some((t, p)) if p == j => ctx.push(t),
                    _ => {
                        return Err(MockError::StaleSlot {
                            request: seq.request_id,
                            pos: j,
                            slot,
                            found,
                        })
                    }
                }
            }
            out.push(mock_next(&ctx, self.vocab));
        }
        Ok(out)
    }
}

/// A draft model for the mock: proposes `k` tokens by running the mock model
/// itself, but replaces a token by a wrong one when a hash of the context
/// falls under `error_rate` (so acceptance is partial and deterministic).
pub fn mock_draft(context: &[u32], k: usize, vocab: u32, error_rate: f64) -> Vec<u32> {
    let mut ctx = context.to_vec();
    let mut out = Vec::with_capacity(k);
    for _ in 0..k {
        let mut t = mock_next(&ctx, vocab);
        let coin = f64::from(mock_next(&ctx, 1 << 20)) / f64::from(1u32 << 20);
        if coin < error_rate {
            t = (t + 1) % vocab.max(1);
        }
        out.push(t);
        ctx.push(t);
    }
    out
}

/// Scheduler + mock backend, greedy decoding, optional speculative drafts.
pub struct MockEngine {
    pub sched: Scheduler,
    pub backend: MockBackend,
    /// Draft tokens per verify (0: no speculation) and the mock draft's error rate.
    pub spec_tokens: usize,
    pub draft_error_rate: f64,
    /// Check the scheduler's invariants after every step (tests).
    pub check_invariants: bool,
}

impl MockEngine {
    /// Plan, execute and commit one step; returns the step (for inspection).
    pub fn step(&mut self) -> Result<ScheduledStep, MockError> {
        if self.spec_tokens > 0 {
            let vocab = self.backend.vocab();
            let drafts: Vec<(RequestId, Vec<u32>)> = self
                .sched
                .decode_ready()
                .map(|(id, toks)| {
                    (
                        id,
                        mock_draft(toks, self.spec_tokens, vocab, self.draft_error_rate),
                    )
                })
                .collect();
            for (id, d) in drafts {
                self.sched.set_draft(id, d)?;
            }
        }
        let step = self.sched.schedule()?;
        let logits = self.backend.execute(&step)?;
        let by_row: BTreeMap<u32, u32> = step.logits_rows.iter().copied().zip(logits).collect();
        let mut results = Vec::new();
        for s in step.seqs.iter().filter(|s| s.needs_logits) {
            let rows: Vec<u32> = (s.first_row..s.first_row + s.num_rows)
                .filter_map(|r| by_row.get(&r).copied())
                .collect();
            let tokens = match &s.kind {
                RowKind::Verify { draft } => {
                    verify_greedy(draft, &rows)
                        .map_err(|_| SchedError::BadResult(s.request_id))?
                        .tokens
                }
                _ => rows.last().copied().into_iter().collect(),
            };
            results.push(SeqTokens {
                request_id: s.request_id,
                tokens,
            });
        }
        self.sched.commit(&step, &results)?;
        if self.check_invariants {
            if let Err(why) = self.sched.check_invariants() {
                return Err(MockError::Sched(SchedError::Config(why)));
            }
        }
        Ok(step)
    }

    /// Step until every request has finished; returns them sorted by id.
    pub fn run(&mut self) -> Result<Vec<FinishedRequest>, MockError> {
        let mut done = self.sched.take_finished();
        let mut idle = 0u32;
        while !self.sched.is_done() {
            let step = self.step()?;
            done.extend(self.sched.take_finished());
            idle = if step.is_empty() { idle + 1 } else { 0 };
            if idle > 2 {
                return Err(MockError::Stuck(idle));
            }
        }
        done.extend(self.sched.take_finished());
        done.sort_by_key(|f| f.id);
        Ok(done)
    }
}
