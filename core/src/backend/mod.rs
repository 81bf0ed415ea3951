//! The `Backend` trait family (ARCHITECTURE.md, "The Backend trait").
//!
//! Two levels:
//! - `Op` + `Backend::run_op`: every LLM-level operation on its own, so any
//!   backend can be compared op by op with the CPU reference;
//! - `Backend::forward`: one step (`StepBatch`) through the whole model. The
//!   provided default composes the ops layer by layer
//!   (`forward::forward_by_ops`); a GPU backend overrides it with its
//!   standard path and its mono path.
//!
//! The core decides what runs (rows, path); the backend decides how.

mod check;
mod forward;
mod op;
mod step;
mod taps;

use alloc::string::String;
use alloc::vec::Vec;

pub use forward::{forward_by_ops, max_blocks};
pub use op::{ActMode, BlockSelection, LinearInput, Op};
pub use step::{StepBatch, StepError, StepSeq};
pub use taps::{TapData, TapRequest, TapTensor, Taps};

use crate::formats::FormatError;
use crate::kv::KvCache;
use crate::weights::ModelWeights;

/// Most rows a `Path::Mono` step may have.
pub const MONO_MAX_ROWS: usize = 16;

/// Which execution path a step takes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Path {
    /// A kernel (or op) at a time. Always legal.
    #[default]
    Standard,
    /// One persistent kernel per layer: legal only for a pure decode step of
    /// at most `MONO_MAX_ROWS` rows (speculative verify rows included when
    /// the planner marks the step [`StepBatch::decode_only`]). A backend
    /// without a mono path runs `Standard` instead.
    Mono,
}

impl Path {
    /// Whether this path may run `step` (the planner's rule).
    pub fn allows(self, step: &StepBatch) -> bool {
        match self {
            Path::Standard => true,
            Path::Mono => step.rows() <= MONO_MAX_ROWS && step.is_pure_decode(),
        }
    }
}

/// Per-run options that are not part of the checkpoint.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RunOptions {
    /// Routed-expert activation mode (MODEL.md 5).
    pub act: ActMode,
}

/// Why a backend could not run an op or a step.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error(transparent)]
    Step(#[from] StepError),
    #[error("{op}: {what}")]
    Shape { op: &'static str, what: String },
    #[error("path {path:?} cannot run this step ({rows} rows, pure decode: {pure})")]
    IllegalPath { path: Path, rows: usize, pure: bool },
    #[error("{op}: not supported by backend {backend}: {what}")]
    Unsupported {
        op: &'static str,
        backend: String,
        what: String,
    },
    #[error(transparent)]
    Format(#[from] FormatError),
    #[error("{0}")]
    Other(String),
}

/// A compute backend. Object-safe: the engine holds a `&dyn Backend`.
pub trait Backend {
    /// Short name for logs and reports (`cpu`, `cuda`, ...).
    fn name(&self) -> &str;

    /// Run one op (outputs overwritten).
    fn run_op(&self, op: Op<'_>) -> Result<(), BackendError>;

    /// Whether `Path::Mono` is implemented (otherwise it runs `Standard`).
    fn supports_mono(&self) -> bool {
        false
    }

    /// One step through the model: writes the step's K/V (and index keys)
    /// into `cache`, captures what `taps` asks for, and returns the logits of
    /// `step.logits_rows` (`[logits_rows.len(), vocab]`, f32).
    fn forward(
        &self,
        model: &ModelWeights,
        cache: &mut KvCache,
        step: &StepBatch,
        path: Path,
        opts: &RunOptions,
        taps: &mut Taps,
    ) -> Result<Vec<f32>, BackendError> {
        forward_by_ops(self, model, cache, step, path, opts, taps)
    }
}
