//! The drafter of a speculative run (`--spec-tokens K`): the checkpoint's
//! DSpark draft when it has one (`dspark/`), else prompt lookup.
//!
//! The DSpark draft runs op by op on the command's backend (`run_op`) and
//! shares the target's embedding and LM head, which are read from the
//! checkpoint here (a device runner keeps no host copy of its weights).

use anyhow::{anyhow, Context, Result};
use m3_core::backend::Backend;
use m3_core::checkpoint::dspark_loader::load_dspark;
use m3_core::checkpoint::{Checkpoint, LoadOptions};
use m3_core::config::ModelConfig;
use m3_core::dspark::DsparkWeights;
use m3_core::sched::dspark_drafter::{DraftTarget, DsparkDrafter};
use m3_core::sched::ngram::NgramDrafter;
use m3_core::sched::runner::Drafter;
use m3_core::weights::LinearWeight;

/// A DSpark draft and the target parts it shares.
pub struct DraftModel {
    pub weights: DsparkWeights,
    pub config: ModelConfig,
    pub embed: LinearWeight,
    pub lm_head: LinearWeight,
}

/// Load the checkpoint's DSpark draft, if it has one.
pub fn load_draft(ck: &Checkpoint) -> Result<Option<DraftModel>> {
    let dir = ck.dir();
    let Some(weights) = load_dspark(dir, ck.config())
        .with_context(|| format!("loading the DSpark draft of {}", dir.display()))?
    else {
        return Ok(None);
    };
    let c = ck.config().clone();
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
    Ok(Some(DraftModel {
        embed: lin(n.embed())?,
        lm_head: lin(n.lm_head())?,
        weights,
        config: c,
    }))
}

/// The drafter for a run, with a one-word name for reports.
pub fn make_drafter<'a>(
    be: &'a dyn Backend,
    draft: Option<&'a DraftModel>,
) -> Result<(Box<dyn Drafter + 'a>, &'static str)> {
    Ok(match draft {
        Some(d) => (
            Box::new(
                DsparkDrafter::new(
                    be,
                    DraftTarget {
                        config: &d.config,
                        embed: &d.embed,
                        lm_head: &d.lm_head,
                    },
                    &d.weights,
                )
                .map_err(|e| anyhow!("DSpark draft: {e}"))?,
            ),
            "dspark",
        ),
        None => (
            Box::new(NgramDrafter::default()),
            "ngram (no dspark/ in the checkpoint)",
        ),
    })
}
