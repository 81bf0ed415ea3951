//! The drafter of a speculative run (`--spec-tokens K`, `--draft`): the
//! checkpoint's DSpark draft (`dspark/`), its EAGLE3 draft head
//! (`eagle3/`), or prompt lookup. `--draft auto` takes the first present.
//!
//! The EAGLE3 draft always runs op by op on the command's backend
//! (`Eagle3Drafter`), sharing a host copy of the target's embedding.
//!
//! The DSpark draft runs where the loaded model keeps its weights when the
//! runner offers that (`ModelRunner::draft_forward`: the GPU runner's draft
//! shares the target's embedding and LM head on the device); otherwise op
//! by op on the command's backend, with host copies of the target's
//! embedding and LM head read from the checkpoint only then.

use std::sync::OnceLock;

use anyhow::{anyhow, bail, Context, Result};
use m3_core::backend::{Backend, ModelRunner};
use m3_core::checkpoint::dspark_loader::{has_dspark, load_dspark};
use m3_core::checkpoint::eagle3_loader::{has_eagle3, load_eagle3};
use m3_core::checkpoint::{Checkpoint, LoadOptions};
use m3_core::config::ModelConfig;
use m3_core::dspark::DsparkWeights;
use m3_core::eagle3::Eagle3Weights;
use m3_core::sched::dspark_drafter::{DraftTarget, DsparkDrafter};
use m3_core::sched::eagle3_drafter::Eagle3Drafter;
use m3_core::sched::ngram::NgramDrafter;
use m3_core::sched::runner::Drafter;
use m3_core::weights::LinearWeight;

use crate::args::DraftArg;

/// The weights of a draft model.
pub enum DraftWeights {
    Dspark(Box<DsparkWeights>),
    Eagle3(Box<Eagle3Weights>),
}

/// A draft model, and (read on first use) the target parts it shares.
pub struct DraftModel {
    pub weights: DraftWeights,
    pub config: ModelConfig,
    /// The target's embedding and LM head on the host, for the op-by-op
    /// draft only.
    shared: OnceLock<(LinearWeight, LinearWeight)>,
}

impl DraftModel {
    /// The target's embedding and LM head, read from `ck` the first time.
    pub fn shared(&self, ck: &Checkpoint) -> Result<&(LinearWeight, LinearWeight)> {
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
            .with_context(|| format!("reading {name} for the draft model"))
        };
        let pair = (lin(n.embed())?, lin(n.lm_head())?);
        Ok(self.shared.get_or_init(|| pair))
    }
}

/// Load the draft model `choice` asks for: `None` means prompt lookup
/// (`--draft ngram`, or `auto` on a checkpoint without a draft). Asking for
/// a draft the checkpoint lacks is an error.
pub fn load_draft(ck: &Checkpoint, choice: DraftArg) -> Result<Option<DraftModel>> {
    let dir = ck.dir();
    let kind = match choice {
        DraftArg::Ngram => return Ok(None),
        DraftArg::Auto if has_dspark(dir) => DraftArg::Dspark,
        DraftArg::Auto if has_eagle3(dir) => DraftArg::Eagle3,
        DraftArg::Auto => return Ok(None),
        k => k,
    };
    let weights = if kind == DraftArg::Eagle3 {
        let w = load_eagle3(dir, ck.config())
            .with_context(|| format!("loading the EAGLE3 draft of {}", dir.display()))?;
        let Some(w) = w else {
            bail!(
                "--draft eagle3: {} has no eagle3/config.json (m3 synth --eagle3 writes one)",
                dir.display()
            );
        };
        DraftWeights::Eagle3(Box::new(w))
    } else {
        let w = load_dspark(dir, ck.config())
            .with_context(|| format!("loading the DSpark draft of {}", dir.display()))?;
        let Some(w) = w else {
            bail!(
                "--draft dspark: {} has no dspark/config.json",
                dir.display()
            );
        };
        DraftWeights::Dspark(Box::new(w))
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
        return Ok((Box::new(NgramDrafter::default()), "ngram (prompt lookup)"));
    };
    let weights = match &d.weights {
        DraftWeights::Dspark(w) => w,
        DraftWeights::Eagle3(w) => {
            let (embed, lm_head) = d.shared(ck)?;
            let target = DraftTarget {
                config: &d.config,
                embed,
                lm_head,
            };
            let drafter =
                Eagle3Drafter::new(be, target, w).map_err(|e| anyhow!("EAGLE3 draft: {e}"))?;
            return Ok((Box::new(drafter), "eagle3"));
        }
    };
    if let Some(f) = runner.draft_forward(weights) {
        let f = f.map_err(|e| anyhow!("DSpark draft: {e}"))?;
        return Ok((
            Box::new(DsparkDrafter::with_forward(&weights.config, f)),
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
        DsparkDrafter::new(be, target, weights).map_err(|e| anyhow!("DSpark draft: {e}"))?;
    Ok((Box::new(drafter), "dspark"))
}
