//! The DSpark draft (MODEL.md 6) as a [`Drafter`]: proposals sampled with
//! their draft probabilities from a [`DraftForward`] (op by op on any
//! backend with [`OpsDraft`], or where a loaded model keeps its weights:
//! [`crate::backend::ModelRunner::draft_forward`]), and the context rows it
//! feeds that forward from the target's taps.
//!
//! ## What this project computes (choices where MODEL.md 6 is open)
//!
//! - **Context rows.** For every committed position `j` whose target forward
//!   has run, `c_j = bf16(fc(concat_l residual.{l}[j]))` over
//!   `target_layer_ids` (the target residual *after* layer `l`, captured
//!   with [`Taps`] in the runner's step). Only rows for committed tokens are
//!   kept (verify rows of rejected drafts are dropped). Positions skipped by
//!   a prefix-cache hit have no context row; the draft attends to the rows
//!   it has.
//! - **Context K/V cache.** Context rows are *not* transformed by the draft
//!   layers: draft layer `l` projects them with its own input norm, `k_proj`,
//!   `v_proj`, k-norm and RoPE, `k_j = rope(knorm(bf16(rmsnorm(c_j; ln_l))
//!   Wk), j)`, `v_j = bf16(rmsnorm(c_j; ln_l)) Wv`. So each context row's
//!   per-layer K/V is computed once, when the row is committed, and kept in a
//!   per-request bf16 cache (the draft's KV cache); a proposal computes only
//!   its `N` query rows.
//! - **Query rows.** With `P` the position of the last committed token, the
//!   query rows are `embed(last)` at position `P` and `embed(mask_token_id)`
//!   at `P+1 .. P+N-1` (RoPE at those positions); query row `i` predicts the
//!   token at `P + 1 + i`. Each draft layer is MODEL.md 3 without indexer or
//!   MoE: Gemma RMSNorm, q/k/v, per-head q/k norms, partial NeoX RoPE, full
//!   *non-causal* attention over `[context | block]` (every query row sees
//!   every context row and every block row), `o_proj`, residual, RMSNorm,
//!   SwiGLU-OAI MLP, residual. Then `bf16(rmsnorm(x; norm))` and the
//!   target's LM head in f32.
//! - **Markov bias.** Proposed token `i` is drawn from
//!   `logits_i + E_m[prev] . W_m`, `prev` being the last committed token for
//!   `i = 0` and proposed token `i - 1` after; sampling uses the request's
//!   temperature / top-k / top-p ([`sampling_probs`]), keyed by (seed,
//!   position) with a salt of its own, so greedy requests get the draft's
//!   argmax.
//!
//! Errors of the backend inside a proposal give an empty proposal (that
//! step is verified without drafts) and are kept in
//! [`DsparkDrafter::last_error`].
//!
//! Backends compute the forward in their own summation orders, so a CPU
//! draft and a GPU draft may propose different tokens at near ties; the
//! verified output does not depend on it (greedy verification commits the
//! target's own tokens, the stochastic verifiers use the draft
//! probabilities that were actually proposed).

use alloc::boxed::Box;
use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

use super::draft_forward::{tap_features, DraftForward, OpsDraft};
use super::request::{RequestId, SamplingParams};
use super::runner::{Drafter, Proposal};
use super::spec_probs::sampling_probs;
use crate::backend::{Backend, BackendError, TapRequest, Taps};
use crate::dspark::{DsparkConfig, DsparkWeights};
use crate::sample::{greedy, uniform};
use crate::spec_decode::sample_index;

pub use super::draft_forward::DraftTarget;

/// Salt of the draft's sampling key, so draft draws are independent of the
/// target's (which use `uniform(seed, position)`).
const DRAFT_SALT: u64 = 0x6473_7061_726b_5f64; // "dspark_d"

/// The DSpark draft model as a [`Drafter`].
pub struct DsparkDrafter<'a> {
    forward: Box<dyn DraftForward + 'a>,
    config: DsparkConfig,
    /// The last backend error met while drafting (drafting then skipped).
    pub last_error: Option<String>,
    /// Proposals made (for reports).
    pub proposals: u64,
}

impl<'a> DsparkDrafter<'a> {
    /// A drafter running `weights` op by op on `backend` ([`OpsDraft`]),
    /// sharing `target`'s embedding and LM head. Fails if the draft does
    /// not fit the target.
    pub fn new(
        backend: &'a dyn Backend,
        target: DraftTarget<'a>,
        weights: &'a DsparkWeights,
    ) -> Result<Self, BackendError> {
        let f = OpsDraft::new(backend, target, weights)?;
        Ok(Self::with_forward(&weights.config, Box::new(f)))
    }

    /// A drafter over a forward already built for a draft of `config`
    /// (e.g. a device runner's, which checked the fit when it built it).
    pub fn with_forward(config: &DsparkConfig, forward: Box<dyn DraftForward + 'a>) -> Self {
        DsparkDrafter {
            forward,
            config: config.clone(),
            last_error: None,
            proposals: 0,
        }
    }

    /// Context rows currently kept for `id`.
    pub fn context_rows(&self, id: RequestId) -> usize {
        self.forward.context_rows(id)
    }

    /// Draft `k` tokens with their distributions (see [`Drafter::propose_sampled`]).
    pub fn try_propose(
        &mut self,
        id: RequestId,
        context: &[u32],
        k: usize,
        params: &SamplingParams,
    ) -> Result<Proposal, BackendError> {
        let n = k.min(self.config.max_draft_tokens);
        let Some(&last) = context.last() else {
            return Ok(Proposal::default());
        };
        if n == 0 {
            return Ok(Proposal::default());
        }
        let vocab = self.config.vocab_size;
        let last_pos = (context.len() - 1) as u32;
        let logits = self.forward.draft_logits(id, last, last_pos, n)?;
        if logits.len() != n * vocab {
            return Err(BackendError::Shape {
                op: "dspark",
                what: format!(
                    "the draft forward returned {} logits for {n} rows of {vocab}",
                    logits.len()
                ),
            });
        }
        let mut prev = last;
        let mut tokens = Vec::with_capacity(n);
        let mut probs = Vec::with_capacity(n * vocab);
        for i in 0..n {
            let bias = self.forward.markov_bias(prev)?;
            let li: Vec<f32> = logits[i * vocab..(i + 1) * vocab]
                .iter()
                .zip(&bias)
                .map(|(a, b)| a + b)
                .collect();
            let p = sampling_probs(&li, params);
            let pos = last_pos + 1 + i as u32;
            let w: Vec<f64> = p.iter().map(|&x| f64::from(x)).collect();
            let u = uniform(params.seed ^ DRAFT_SALT, pos);
            let x = sample_index(&w, u).map_or_else(|| greedy(&li), |t| t as u32);
            tokens.push(x);
            probs.extend_from_slice(&p);
            prev = x;
        }
        self.proposals += 1;
        Ok(Proposal {
            tokens,
            probs: Some(probs),
        })
    }
}

impl Drafter for DsparkDrafter<'_> {
    fn propose(&mut self, id: RequestId, context: &[u32], k: usize) -> Vec<u32> {
        self.propose_sampled(id, context, k, &SamplingParams::default())
            .tokens
    }

    fn propose_sampled(
        &mut self,
        id: RequestId,
        context: &[u32],
        k: usize,
        params: &SamplingParams,
    ) -> Proposal {
        match self.try_propose(id, context, k, params) {
            Ok(p) => p,
            Err(e) => {
                self.last_error = Some(format!("dspark draft: {e}"));
                Proposal::default()
            }
        }
    }

    fn taps(&self) -> TapRequest {
        TapRequest {
            residual: true,
            ..TapRequest::NONE
        }
        .only_layers(&self.config.target_layer_ids)
    }

    fn observe(&mut self, id: RequestId, positions: &[u32], rows: &[usize], taps: &Taps) {
        if rows.is_empty() {
            return;
        }
        let c = &self.config;
        let feats = match tap_features(taps, &c.target_layer_ids, c.hidden_size, rows) {
            Ok(f) => f,
            Err(e) => {
                self.last_error = Some(format!("dspark draft: {e}"));
                return;
            }
        };
        if let Err(e) = self.forward.add_context(id, positions, &feats) {
            self.last_error = Some(format!("dspark draft: {e}"));
        }
    }

    fn forget(&mut self, id: RequestId) {
        self.forward.forget(id);
    }
}
