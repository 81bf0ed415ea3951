//! The drafter of a speculative run (`--spec-tokens K`): the checkpoint's
//! DSpark draft when it has one (`dspark/`), else prompt lookup.
//!
//! The DSpark draft runs where the loaded model keeps its weights when the
//! runner offers that (`ModelRunner::draft_forward`: the GPU runner's draft
//! shares the target's embedding and LM head on the device); otherwise op
//! by op on the command's backend, with host copies of the target's
//! embedding and LM head read from the checkpoint only then.

use std::sync::OnceLock;

use anyhow::{anyhow, Context, Result};
use m3_core::backend::{Backend, ModelRunner};
use m3_core::checkpoint::dspark_loader::load_dspark;
use m3_core::checkpoint::{Checkpoint, LoadOptions};
use m3_core::config::ModelConfig;
use m3_core::dspark::DsparkWeights;
use m3_core::sched::dspark_drafter::{DraftTarget, DsparkDrafter};
use m3_core::sched::ngram::NgramDrafter;
use m3_core::sched::runner::Drafter;
use m3_core::weights::LinearWeight;

/// A DSpark draft, and (read on first use) the target parts it shares.
pub struct DraftModel {
    pub weights: DsparkWeights,
    pub config: ModelConfig,
    /// The target's embedding and LM head on the host, for the op-by-op
    /// draft only.
    shared: OnceLock<(LinearWeight, LinearWeight)>,
}

impl DraftModel {
    /// The target's embedding and LM head, read from `ck` the first time.
    fn shared(&self, ck: &Checkpoint) -> Result<&(LinearWeight, LinearWeight)> {
        if let Some(s) = self.shared.get() {
            return Ok(s);
        }
        let c = &self.config;
        let n = ck.names();
        let lin = |name: String| -> Result<LinearWeight> {
            ck.stored_linear(
                &name,
                c.vocab_size,
                c.hidden_size,
                false,
                &LoadOptions::default(),
            )
            .and_then(|s| {
                s.into_owned()
                    .map_err(|e| m3_core::checkpoint::CheckpointError::Missing {
                        tensor: name.clone(),
                        why: e.to_string(),
                    })
            })
            .with_context(|| format!("reading {name} for the DSpark draft"))
        };
        let pair = (lin(n.embed())?, lin(n.lm_head())?);
        Ok(self.shared.get_or_init(|| pair))
    }
}

/// Load the checkpoint's DSpark draft, if it has one.
pub fn load_draft(ck: &Checkpoint) -> Result<Option<DraftModel>> {
    let dir = ck.dir();
    let Some(weights) = load_dspark(dir, ck.config())
        .with_context(|| format!("loading the DSpark draft of {}", dir.display()))?
    else {
        return Ok(None);
    };
    Ok(Some(DraftModel {
        weights,
        config: ck.config().clone(),
        shared: OnceLock::new(),
    }))
}

/// The drafter for a run on `runner` (call before the scheduler borrows
/// it), with a short name for reports.
pub fn make_drafter<'a>(
    be: &'a dyn Backend,
    runner: &dyn ModelRunner,
    ck: &Checkpoint,
    draft: Option<&'a DraftModel>,
) -> Result<(Box<dyn Drafter + 'a>, &'static str)> {
    let Some(d) = draft else {
        return Ok((
            Box::new(NgramDrafter::default()),
            "ngram (no dspark/ in the checkpoint)",
        ));
    };
    if let Some(f) = runner.draft_forward(&d.weights) {
        let f = f.map_err(|e| anyhow!("DSpark draft: {e}"))?;
        return Ok((
            Box::new(DsparkDrafter::with_forward(&d.weights.config, f)),
            "dspark (on the device)",
        ));
    }
    let (embed, lm_head) = d.shared(ck)?;
    let target = DraftTarget {
        config: &d.config,
        embed,
        lm_head,
    };
    let drafter =
        DsparkDrafter::new(be, target, &d.weights).map_err(|e| anyhow!("DSpark draft: {e}"))?;
    Ok((Box::new(drafter), "dspark"))
}
