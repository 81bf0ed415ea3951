//! Draft golden cases: m3's EAGLE3 drafter run on a backend, to be held to
//! the independent reference's proposal (`golden/gen/m3ref/eagle3.py`).
//!
//! A draft case is a model case (its `residual.{l}`, `logits`, ... taps)
//! plus the reference's greedy proposal of `steps` tokens after the prompt
//! (`draft.*` tensors, [`DraftMeta`]). The draft is teacher-forced like the
//! target's layers: its input features are the *reference's* residuals of
//! `target_layer_ids`, so a backend is judged on the draft alone.
//! [`run_eagle3`] drives [`Eagle3Drafter`] exactly as the scheduler does
//! ([`Drafter::observe`] of every prompt row, then one proposal, greedy)
//! through the [`Backend`] trait, so the same code runs on the CPU
//! reference and on a GPU backend's `run_op`.
//!
//! Dumped tensors (the case holds the same names):
//! - `draft.g` F32 `[T, H]`: the fused target state `g_j` of every prompt row;
//! - `draft.hidden` F32 `[K, H]`: each step's output before the final norm;
//! - `draft.logits` F32 `[K, draft_vocab]`: each step's draft logits;
//! - `draft.tokens` I32 `[K]`: the proposed target ids (after `d2t`).

use std::collections::BTreeMap;

use m3_core::backend::{Backend, BackendError, Taps as CoreTaps};
use m3_core::eagle3::Eagle3Weights;
use m3_core::sched::dspark_drafter::DraftTarget;
use m3_core::sched::eagle3_drafter::Eagle3Drafter;
use m3_core::sched::runner::Drafter;
use m3_core::sched::SamplingParams;
use serde::{Deserialize, Serialize};

/// The request id the harness drafts for.
const REQUEST: u64 = 1;

/// A case's draft: what was proposed and how tokens are judged.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct DraftMeta {
    /// `eagle3` (the only draft with cases so far).
    pub kind: String,
    /// Draft steps K after the prompt.
    pub steps: usize,
    /// The target layers whose residuals the draft fuses (low, mid, high).
    pub target_layer_ids: Vec<usize>,
    pub draft_vocab_size: usize,
    /// A step whose reference top-2 logit gap (`draft.logit_gap`) is below
    /// this may pick another token: a near-tie, after which later steps
    /// are not compared.
    pub token_margin: f64,
}

/// Why the draft could not be run; names the tensor or step.
#[derive(Debug, thiserror::Error)]
pub enum DraftError {
    #[error("draft input: tensor {name}: {msg}")]
    Input { name: String, msg: String },
    #[error("eagle3 draft on backend {backend}: {source}")]
    Backend {
        backend: String,
        #[source]
        source: BackendError,
    },
    #[error("eagle3 draft: {0}")]
    Drafter(String),
}

/// Run `weights` on `backend` for prompt `tokens`: observe every prompt row
/// with `features` (layer -> its residual `[T, H]`, at least the draft's
/// `target_layer_ids`), then propose `steps` tokens greedily. Returns the
/// `draft.*` tensors (module docs).
pub fn run_eagle3(
    backend: &dyn Backend,
    target: DraftTarget<'_>,
    weights: &Eagle3Weights,
    tokens: &[u32],
    features: &BTreeMap<usize, Vec<f32>>,
    steps: usize,
) -> Result<CoreTaps, DraftError> {
    let be = |source| DraftError::Backend {
        backend: backend.name().to_string(),
        source,
    };
    let c = &weights.config;
    let (t, h) = (tokens.len(), c.target_hidden());
    if t < 2 {
        return Err(DraftError::Input {
            name: "tokens".into(),
            msg: format!("{t} prompt tokens; a proposal needs at least 2"),
        });
    }
    if steps == 0 || steps > c.max_draft_tokens {
        return Err(DraftError::Input {
            name: "steps".into(),
            msg: format!(
                "{steps}: must be 1..={} (max_draft_tokens)",
                c.max_draft_tokens
            ),
        });
    }
    let mut taps = CoreTaps::default();
    for &l in &c.target_layer_ids {
        let name = format!("residual.{l}");
        let r = features.get(&l).ok_or_else(|| DraftError::Input {
            name: name.clone(),
            msg: "missing (the draft fuses this layer)".into(),
        })?;
        if r.len() != t * h {
            return Err(DraftError::Input {
                name,
                msg: format!("{} values, expected [{t}, {h}]", r.len()),
            });
        }
        taps.put_f32(name, vec![t, h], r.clone());
    }
    // fc's input, rows in order: the residuals of the three layers side by side.
    let mut feats = Vec::with_capacity(t * c.fc_in());
    for row in 0..t {
        for l in &c.target_layer_ids {
            if let Some(r) = features.get(l) {
                feats.extend_from_slice(&r[row * h..(row + 1) * h]);
            }
        }
    }
    let mut d = Eagle3Drafter::new(backend, target, weights).map_err(be)?;
    let positions: Vec<u32> = (0..t as u32).collect();
    let rows: Vec<usize> = (0..t).collect();
    d.observe(REQUEST, &positions, &rows, &taps);
    if let Some(e) = d.last_error.take() {
        return Err(DraftError::Drafter(e));
    }
    let g = d.fuse(&feats, t).map_err(be)?;
    let (prop, trace) = d
        .propose_traced(REQUEST, tokens, steps, &SamplingParams::GREEDY)
        .map_err(be)?;
    if prop.tokens.len() != steps {
        return Err(DraftError::Drafter(format!(
            "proposed {} of {steps} tokens",
            prop.tokens.len()
        )));
    }
    let mut out = CoreTaps::default();
    out.put_f32("draft.g".into(), vec![t, c.hidden_size], g);
    out.put_f32(
        "draft.hidden".into(),
        vec![steps, c.hidden_size],
        trace.hidden,
    );
    out.put_f32(
        "draft.logits".into(),
        vec![steps, c.draft_vocab_size],
        trace.logits,
    );
    out.put_i32(
        "draft.tokens".into(),
        vec![steps],
        prop.tokens.iter().map(|&x| x as i32).collect(),
    );
    Ok(out)
}
