//! Loaded models: [`Backend::load`](super::Backend::load) returns a
//! [`ModelRunner`] that owns the weights in the backend's memory and a paged
//! KV + index-cache pool (ARCHITECTURE.md, "The Backend trait").
//!
//! The split of responsibilities (vLLM v1's, written for this project):
//! - the **scheduler** (`crate::sched`) owns block *ids* only: which block a
//!   sequence's positions live in, which blocks are shared, when a block is
//!   copied. It hands the runner plain data: a [`StepBatch`] and the block
//!   copies ([`ModelRunner::copy_blocks`]);
//! - the **runner** owns the KV tensors, its persistent input buffers and
//!   (on a GPU) the captured graphs. A step never moves weights or the KV
//!   cache across the host link: it takes the batch, samples one token per
//!   logits row where the logits are, and returns the tokens plus, only for
//!   what the caller asked, logits rows and taps.
//!
//! Sampling happens in the runner with core's definition
//! ([`crate::sample::sample`], keyed by the request seed and the position of
//! the token being produced, `position + 1` of its row), so every backend
//! samples the same token from the same logits.

use alloc::boxed::Box;
use alloc::collections::BTreeMap;
use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

use super::{ActMode, BackendError, Path, StepBatch, TapRequest, Taps};
use crate::config::{IndexSelection, ModelConfig};
use crate::dspark::DsparkWeights;
use crate::kv::{CacheDtype, KvLayout};
use crate::sample::SampleParams;
use crate::sched::draft_forward::DraftForward;

/// How many KV blocks a runner allocates.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum KvBudget {
    /// Exactly this many blocks (`--kv-blocks`).
    Blocks(usize),
    /// As many blocks as fit in this fraction of the device's memory, after
    /// the weights and the step buffers (`--gpu-memory-utilization`, vLLM's
    /// meaning: the fraction of *total* memory this process may hold), but
    /// no more than four times what `max_seqs` sequences of `max_context`
    /// positions can hold at once (the rest is prefix-cache room). A host
    /// runner, which has no device, treats it as
    /// [`LoadSpec::host_default_blocks`].
    MemoryFraction(f32),
}

/// What a loaded model must hold: cache geometry and dtype, the largest
/// step, and run options that are not part of the checkpoint.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LoadSpec {
    /// Storage dtype of the KV and index caches.
    pub cache_dtype: CacheDtype,
    /// Positions per KV block (the scheduler's block size).
    pub block_size: usize,
    /// How many blocks the pool has.
    pub kv: KvBudget,
    /// Most rows (tokens) of one step: decode rows plus prefill chunks
    /// (`--max-batch-tokens`).
    pub max_rows: usize,
    /// Most sequences of one step (`--max-num-seqs`).
    pub max_seqs: usize,
    /// Longest sequence, in positions (`--max-model-len`): bounds block
    /// tables and the attention scratch.
    pub max_context: usize,
    /// Routed-expert activation mode (MODEL.md 5).
    pub act: ActMode,
    /// Override of the checkpoint's `index_selection` (`--selection`).
    pub selection: Option<IndexSelection>,
}

impl LoadSpec {
    /// Blocks a host runner allocates for [`KvBudget::MemoryFraction`]:
    /// enough for `max_seqs` sequences of `max_context` positions.
    pub fn host_default_blocks(&self) -> usize {
        self.max_seqs
            .max(1)
            .saturating_mul(self.max_context.div_ceil(self.block_size.max(1)))
    }

    /// Check the numbers before anything is allocated; errors name the field.
    pub fn validate(&self) -> Result<(), BackendError> {
        let bad = |what: String| BackendError::Load { what };
        if self.block_size == 0 {
            return Err(bad("block size must be at least 1".into()));
        }
        if self.max_rows == 0 || self.max_seqs == 0 || self.max_context == 0 {
            return Err(bad(format!(
                "max rows {}, max sequences {} and max context {} must be at least 1",
                self.max_rows, self.max_seqs, self.max_context
            )));
        }
        match self.kv {
            KvBudget::Blocks(0) => Err(bad("--kv-blocks must be at least 1".into())),
            KvBudget::MemoryFraction(f) if !(f > 0.0 && f <= 1.0) => Err(bad(format!(
                "--gpu-memory-utilization {f} must be in (0, 1]"
            ))),
            _ => Ok(()),
        }
    }
}

/// Where a runner's weights come from.
pub enum ModelSource<'a> {
    /// Typed host weights (already loaded, or made in memory by a test).
    Weights(alloc::sync::Arc<crate::weights::ModelWeights>),
    /// A checkpoint directory, read tensor by tensor (a device runner
    /// streams it to the device without a host copy of the model).
    #[cfg(feature = "std")]
    Checkpoint(
        &'a crate::checkpoint::Checkpoint,
        crate::checkpoint::LoadOptions,
    ),
    #[doc(hidden)]
    #[cfg(not(feature = "std"))]
    _Lifetime(core::marker::PhantomData<&'a ()>),
}

/// Progress of a load (a callback gets it after every tensor): tensors done
/// of the total, and bytes placed so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LoadProgress {
    pub tensors_done: usize,
    pub tensors_total: usize,
    pub bytes_done: u64,
}

/// What a step's caller wants back besides the sampled tokens.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ReadBack {
    /// Indices into [`StepBatch::logits_rows`] whose logits come back
    /// (ascending), e.g. the verify rows of a stochastic rejection verify.
    pub logits: Vec<u32>,
    /// Per-layer captures (parity, the DSpark draft's context).
    pub taps: TapRequest,
}

impl ReadBack {
    /// Only the sampled tokens.
    pub fn tokens_only() -> Self {
        ReadBack::default()
    }

    /// Tokens plus every logits row.
    pub fn all_logits(step: &StepBatch) -> Self {
        ReadBack {
            logits: (0..step.logits_rows.len() as u32).collect(),
            taps: TapRequest::default(),
        }
    }
}

/// One step's input.
#[derive(Clone, Copy, Debug)]
pub struct StepInput<'a> {
    pub batch: &'a StepBatch,
    /// `Path::Mono` only where [`Path::allows`] says so; a runner without a
    /// mono path runs it on its standard path.
    pub path: Path,
    /// Sampling parameters of each logits row (same order as
    /// `batch.logits_rows`). Row `i` is sampled with key `(sampling[i].seed,
    /// position of its row + 1)`.
    pub sampling: &'a [SampleParams],
    pub read: &'a ReadBack,
    /// Teacher forcing (`m3 forward --teacher`): `teacher[l]` (`[T, H]` f32)
    /// replaces the residual after layer `l` as the next layer's input (see
    /// [`Taps::teacher`]).
    pub teacher: Option<&'a BTreeMap<usize, Vec<f32>>>,
}

/// What a step returns.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StepOutput {
    /// One sampled token per logits row, in `batch.logits_rows` order.
    pub tokens: Vec<u32>,
    /// `[read.logits.len(), vocab]` f32 logits, in `read.logits` order.
    pub logits: Vec<f32>,
    /// The captures `read.taps` asked for (names and layouts in
    /// [`super::taps`]).
    pub taps: Taps,
}

impl StepOutput {
    /// Logits of the `i`-th requested row.
    pub fn logits_row(&self, i: usize, vocab: usize) -> &[f32] {
        &self.logits[i * vocab..(i + 1) * vocab]
    }
}

/// A loaded model: weights and the paged caches in the backend's memory.
/// Object-safe; the scheduler's runner holds a `&mut dyn ModelRunner`.
pub trait ModelRunner {
    /// The backend's name (`cpu`, `cuda`, ...).
    fn backend_name(&self) -> &str;

    /// The model's config (after load-spec overrides).
    fn config(&self) -> &ModelConfig;

    /// Geometry of the KV pool actually allocated: the scheduler's block
    /// size and block count must equal `page_size` and `num_pages`.
    fn kv_layout(&self) -> KvLayout;

    /// Whether `Path::Mono` runs on its own kernel (else as `Standard`).
    fn supports_mono(&self) -> bool {
        self.mono_max_rows() > 0
    }

    /// The largest pure-decode step (rows, at most
    /// [`MONO_MAX_ROWS`](crate::backend::MONO_MAX_ROWS)) this runner runs on
    /// its mono kernel, every smaller one too; 0: none. The scheduler's
    /// runner plans its Mono steps up to it ([`crate::sched::SchedRunner::new`]):
    /// on the GPU it is the crossover measured at load (`--path auto`).
    fn mono_max_rows(&self) -> usize {
        0
    }

    /// Run one step: write the rows' K/V (and index keys) into the caches,
    /// sample one token per logits row, and return what `input.read` asks.
    fn step(&mut self, input: &StepInput<'_>) -> Result<StepOutput, BackendError>;

    /// Copy-on-write: copy every slot of block `src` into block `dst` in
    /// every K, V and index-key tensor, raw (no requantization), in order.
    fn copy_blocks(&mut self, pairs: &[(u32, u32)]) -> Result<(), BackendError>;

    /// Device memory held, in bytes (weights, caches, buffers); 0 where the
    /// backend does not count it.
    fn device_bytes(&self) -> usize {
        0
    }

    /// The forward of the DSpark draft `w` where this runner keeps its
    /// weights, sharing the target's embedding and LM head there; `None`
    /// when the runner has no such forward (the caller then runs the draft
    /// op by op on its backend,
    /// [`crate::sched::draft_forward::OpsDraft`]). The forward borrows
    /// nothing of the runner, so the scheduler may keep stepping it.
    fn draft_forward(
        &self,
        _w: &DsparkWeights,
    ) -> Option<Result<Box<dyn DraftForward>, BackendError>> {
        None
    }
}

/// A boxed runner borrowing its backend.
pub type BoxedRunner<'a> = Box<dyn ModelRunner + 'a>;

/// Check a step's sampling and read-back lists against its batch.
pub fn check_step_input(input: &StepInput<'_>) -> Result<(), BackendError> {
    let nl = input.batch.logits_rows.len();
    if input.sampling.len() != nl {
        return Err(BackendError::Shape {
            op: "step",
            what: format!(
                "{} sampling entries for {nl} logits rows",
                input.sampling.len()
            ),
        });
    }
    let mut prev: Option<u32> = None;
    for &i in &input.read.logits {
        if i as usize >= nl || prev.is_some_and(|p| p >= i) {
            return Err(BackendError::Shape {
                op: "step",
                what: format!(
                    "read-back logits rows must be ascending indices below {nl} (got {:?})",
                    input.read.logits
                ),
            });
        }
        prev = Some(i);
    }
    Ok(())
}
