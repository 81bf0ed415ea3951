//! A minimal generation loop: the engine asks a `Planner` for the next
//! `StepBatch`, runs it on a `Backend`, samples the rows that need logits and
//! appends the tokens to their requests. `SimplePlanner` prefills each
//! request's prompt in one step, then decodes all running requests together;
//! the scheduler in `sched` plugs in as another `Planner`.

use alloc::vec::Vec;

use crate::backend::{Backend, BackendError, Path, RunOptions, StepBatch, StepSeq, Taps};
use crate::kv::{KvCache, PagePool};
use crate::sample::{sample, SampleParams};
use crate::weights::ModelWeights;

/// One generation request and its progress.
#[derive(Clone, Debug)]
pub struct Request {
    pub id: u64,
    /// Prompt followed by the generated tokens.
    pub tokens: Vec<u32>,
    pub prompt_len: usize,
    pub max_new_tokens: usize,
    pub params: SampleParams,
    /// Stop when one of these is generated (it is kept in `tokens`).
    pub stop_tokens: Vec<u32>,
    /// Positions whose K/V are in the cache.
    pub cached: usize,
    /// KV pages of this request.
    pub block_table: Vec<u32>,
    pub done: bool,
}

impl Request {
    pub fn new(id: u64, prompt: Vec<u32>, max_new_tokens: usize, params: SampleParams) -> Self {
        let prompt_len = prompt.len();
        Request {
            id,
            tokens: prompt,
            prompt_len,
            max_new_tokens,
            params,
            stop_tokens: Vec::new(),
            cached: 0,
            block_table: Vec::new(),
            done: max_new_tokens == 0,
        }
    }

    /// Tokens generated so far.
    pub fn generated(&self) -> &[u32] {
        &self.tokens[self.prompt_len..]
    }
}

/// Why generation stopped early.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Backend(#[from] BackendError),
    #[error(
        "request {id}: needs {need} cache positions, the cache has {have} (raise --max-context)"
    )]
    CacheFull { id: u64, need: usize, have: usize },
    #[error("request {id}: empty prompt")]
    EmptyPrompt { id: u64 },
}

/// Decides the next step from the requests' state (the scheduling policy).
pub trait Planner {
    /// The next step, or `None` when nothing is left to run. May allocate
    /// pages from `pool` into the requests' block tables.
    fn plan(
        &mut self,
        reqs: &mut [Request],
        pool: &mut PagePool,
        page_size: usize,
    ) -> Result<Option<(StepBatch, Path)>, EngineError>;
}

/// Prefill one request's whole prompt per step (first come first), then
/// decode every running request in one step.
#[derive(Clone, Copy, Debug, Default)]
pub struct SimplePlanner;

fn alloc_for(
    r: &mut Request,
    pool: &mut PagePool,
    page_size: usize,
    positions: usize,
) -> Result<(), EngineError> {
    if pool.ensure(&mut r.block_table, positions, page_size) {
        Ok(())
    } else {
        Err(EngineError::CacheFull {
            id: r.id,
            need: positions,
            have: (r.block_table.len() + pool.available()) * page_size,
        })
    }
}

impl Planner for SimplePlanner {
    fn plan(
        &mut self,
        reqs: &mut [Request],
        pool: &mut PagePool,
        page_size: usize,
    ) -> Result<Option<(StepBatch, Path)>, EngineError> {
        if let Some(r) = reqs.iter_mut().find(|r| !r.done && r.cached < r.prompt_len) {
            if r.prompt_len == 0 {
                return Err(EngineError::EmptyPrompt { id: r.id });
            }
            alloc_for(r, pool, page_size, r.prompt_len)?;
            let step = StepBatch::contiguous(
                r.id,
                &r.tokens[r.cached..r.prompt_len],
                r.cached as u32,
                &r.block_table,
                page_size,
                false,
            );
            return Ok(Some((step, Path::Standard)));
        }
        let mut step = StepBatch::default();
        for r in reqs.iter_mut().filter(|r| !r.done) {
            let pos = r.tokens.len() - 1;
            if r.cached != pos {
                continue;
            }
            alloc_for(r, pool, page_size, pos + 1)?;
            let row = step.rows() as u32;
            step.tokens.push(r.tokens[pos]);
            step.positions.push(pos as u32);
            let page = r.block_table[pos / page_size];
            step.slot_mapping
                .push(page * page_size as u32 + (pos % page_size) as u32);
            step.row_seq.push(step.seqs.len() as u32);
            step.seqs.push(StepSeq {
                request_id: r.id,
                block_table: r.block_table.clone(),
                context_len: pos as u32 + 1,
            });
            step.logits_rows.push(row);
        }
        if step.rows() == 0 {
            return Ok(None);
        }
        let path = if Path::Mono.allows(&step) {
            Path::Mono
        } else {
            Path::Standard
        };
        Ok(Some((step, path)))
    }
}

/// What one `Engine::step` did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StepReport {
    /// Rows computed.
    pub rows: usize,
    /// Prompt rows among them.
    pub prefill_rows: usize,
    /// (request id, token) sampled this step.
    pub sampled: Vec<(u64, u32)>,
}

/// The loop: planner -> backend -> sampler.
pub struct Engine<'a, P: Planner> {
    pub backend: &'a dyn Backend,
    pub model: &'a ModelWeights,
    pub cache: KvCache,
    pub pool: PagePool,
    pub planner: P,
    pub opts: RunOptions,
    pub requests: Vec<Request>,
}

impl<'a, P: Planner> Engine<'a, P> {
    pub fn new(
        backend: &'a dyn Backend,
        model: &'a ModelWeights,
        cache: KvCache,
        planner: P,
        opts: RunOptions,
    ) -> Self {
        let pool = PagePool::new(cache.layout.num_pages);
        Engine {
            backend,
            model,
            cache,
            pool,
            planner,
            opts,
            requests: Vec::new(),
        }
    }

    pub fn add(&mut self, req: Request) -> Result<(), EngineError> {
        let have = self.cache.layout.slots();
        let need = req.prompt_len + req.max_new_tokens;
        if need > have {
            return Err(EngineError::CacheFull {
                id: req.id,
                need,
                have,
            });
        }
        if req.prompt_len == 0 {
            return Err(EngineError::EmptyPrompt { id: req.id });
        }
        self.requests.push(req);
        Ok(())
    }

    /// Run one step; `None` when every request is done.
    pub fn step(&mut self) -> Result<Option<StepReport>, EngineError> {
        let page = self.cache.layout.page_size;
        let Some((step, path)) = self
            .planner
            .plan(&mut self.requests, &mut self.pool, page)?
        else {
            return Ok(None);
        };
        let path = if path == Path::Mono && !self.backend.supports_mono() {
            Path::Standard
        } else {
            path
        };
        let logits = self.backend.forward(
            self.model,
            &mut self.cache,
            &step,
            path,
            &self.opts,
            &mut Taps::none(),
        )?;
        let vocab = self.model.config.vocab_size;
        let mut rep = StepReport {
            rows: step.rows(),
            ..StepReport::default()
        };
        // Mark cached positions.
        for row in 0..step.rows() {
            let id = step.request_id(row);
            if let Some(r) = self.requests.iter_mut().find(|r| r.id == id) {
                let p = step.positions[row] as usize;
                if p < r.prompt_len {
                    rep.prefill_rows += 1;
                }
                r.cached = r.cached.max(p + 1);
            }
        }
        for (i, &row) in step.logits_rows.iter().enumerate() {
            let row = row as usize;
            let id = step.request_id(row);
            let pos = step.positions[row];
            let Some(r) = self.requests.iter_mut().find(|r| r.id == id) else {
                continue;
            };
            // Only the row at the request's last known token extends it.
            if r.done || pos as usize + 1 != r.tokens.len() {
                continue;
            }
            let tok = sample(&logits[i * vocab..(i + 1) * vocab], &r.params, pos + 1);
            r.tokens.push(tok);
            rep.sampled.push((id, tok));
            if r.generated().len() >= r.max_new_tokens || r.stop_tokens.contains(&tok) {
                r.done = true;
                let mut bt = core::mem::take(&mut r.block_table);
                self.pool.release(&mut bt);
            }
        }
        Ok(Some(rep))
    }

    /// Run until every request is done.
    pub fn run(&mut self) -> Result<(), EngineError> {
        while self.step()?.is_some() {}
        Ok(())
    }
}
