//! The `Backend` trait family (ARCHITECTURE.md, "The Backend trait").
//!
//! Two levels:
//! - `Op` + `Backend::run_op`: every LLM-level operation on its own, so any
//!   backend can be compared op by op with the CPU reference (the op-parity
//!   interface);
//! - `Backend::load` -> [`ModelRunner`]: a loaded model that owns its
//!   weights and paged caches in the backend's memory and runs whole steps
//!   ([`runner`]). The provided `load` gives a [`HostRunner`]: host weights
//!   and a host cache, each step composed from `run_op` by
//!   [`forward_by_ops`] (the CPU reference's runner). The GPU backend's
//!   `load` gives its device-resident runner.
//!
//! The core decides what runs (rows, path, blocks); the backend decides how.

mod check;
mod forward;
pub mod host;
mod op;
pub mod runner;
mod step;
pub mod taps;

use alloc::string::String;

pub use forward::{forward_by_ops, max_blocks};
pub use host::HostRunner;
pub use op::{ActMode, BlockSelection, LinearInput, Op};
pub use runner::{
    BoxedRunner, KvBudget, LoadProgress, LoadSpec, ModelRunner, ModelSource, ReadBack, StepInput,
    StepOutput,
};
pub use step::{StepBatch, StepError, StepSeq};
pub use taps::{TapData, TapRequest, TapTensor, Taps};

use crate::formats::FormatError;

/// Most rows a `Path::Mono` step may have: mono decode proper takes steps
/// of 1-16 rows, its wide mode 17-64 (issue 13). A backend runs mono only
/// up to its own [`ModelRunner::mono_max_rows`](crate::backend::ModelRunner::mono_max_rows)
/// (the GPU's measured crossover), and the planner marks no larger step.
pub const MONO_MAX_ROWS: usize = 64;

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
    /// Ranks the step is computed as if sharded over (0 or 1: unsharded):
    /// the CPU proof of tensor / expert parallel math (ARCHITECTURE.md,
    /// *Tensor parallel*), see [`TensorParallel`].
    pub tensor_parallel: usize,
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
    /// The model or its caches could not be loaded (bad load spec, a
    /// checkpoint error, not enough device memory); `what` names the field,
    /// tensor or size at fault.
    #[error("loading the model: {what}")]
    Load { what: String },
    /// The device failed (a driver call, a kernel launch).
    #[error("{backend}: {what}")]
    Device { backend: String, what: String },
    #[error("{0}")]
    Other(String),
}

/// A compute backend. Object-safe: callers hold a `&dyn Backend`.
pub trait Backend {
    /// Short name for logs and reports (`cpu`, `cuda`, ...).
    fn name(&self) -> &str;

    /// Run one op (outputs overwritten): the op-parity interface.
    fn run_op(&self, op: Op<'_>) -> Result<(), BackendError>;

    /// A linear with a PTPC FP8 weight (ARCHITECTURE.md, *Online
    /// quantization*): `x` `[rows, w.cols]` is rounded to bf16 and quantized
    /// per row (per token) to E4M3 with `sa = f32(amax / 448)`, then
    /// `out[t][n] = f32(f32(dot(qa_t, qw_n) * sw_n) * sa_t)` with the dot
    /// exact ([`crate::formats::convert::ptpc_dot`]), rounded to bf16 when
    /// `round_out`. `out` is `[rows, w.rows]`. A row of `x` holding NaN or
    /// an infinity gives a NaN output row.
    ///
    /// Not an [`Op`] variant yet: a provided method, so that a backend
    /// without it (the GPU's op harness; the GPU runner runs PTPC linears
    /// inside its steps) refuses it clearly instead of failing to build.
    fn ptpc_linear(
        &self,
        x: &[f32],
        rows: usize,
        w: &crate::formats::convert::PtpcFp8,
        round_out: bool,
        out: &mut [f32],
    ) -> Result<(), BackendError> {
        let _ = (x, rows, w, round_out, out);
        Err(BackendError::Unsupported {
            op: "ptpc_linear",
            backend: self.name().into(),
            what: "PTPC FP8 linears as single ops run on the CPU backend only (the GPU runner runs them inside its steps)".into(),
        })
    }

    /// Ranks a host runner of this backend computes each step as if
    /// sharded over (1: unsharded; [`TensorParallel`] sets more).
    fn tensor_parallel(&self) -> usize {
        1
    }

    /// Load a model: its weights into the backend's memory and a paged KV +
    /// index-cache pool sized by `spec`; `progress` is called as tensors
    /// arrive. The default is a [`HostRunner`] (host weights and cache,
    /// steps composed from [`Backend::run_op`]).
    fn load<'b>(
        &'b self,
        source: ModelSource<'_>,
        spec: &LoadSpec,
        progress: &mut dyn FnMut(LoadProgress),
    ) -> Result<BoxedRunner<'b>, BackendError> {
        host::load_host(self, source, spec, progress)
    }
}

impl<T: Backend + ?Sized> Backend for &T {
    fn name(&self) -> &str {
        (**self).name()
    }
    fn tensor_parallel(&self) -> usize {
        (**self).tensor_parallel()
    }
    fn run_op(&self, op: Op<'_>) -> Result<(), BackendError> {
        (**self).run_op(op)
    }
    fn ptpc_linear(
        &self,
        x: &[f32],
        rows: usize,
        w: &crate::formats::convert::PtpcFp8,
        round_out: bool,
        out: &mut [f32],
    ) -> Result<(), BackendError> {
        (**self).ptpc_linear(x, rows, w, round_out, out)
    }
    fn load<'b>(
        &'b self,
        source: ModelSource<'_>,
        spec: &LoadSpec,
        progress: &mut dyn FnMut(LoadProgress),
    ) -> Result<BoxedRunner<'b>, BackendError> {
        (**self).load(source, spec, progress)
    }
}

/// A backend whose host runner computes every step as if sharded over
/// `ranks` ranks (MODEL.md's step with the row-parallel linears' partial
/// sums and the expert-parallel combine all-reduced in rank order:
/// ARCHITECTURE.md, *Tensor parallel*). Its ops are the inner backend's.
#[derive(Clone, Copy, Debug)]
pub struct TensorParallel<B> {
    pub inner: B,
    pub ranks: usize,
}

impl<B: Backend> Backend for TensorParallel<B> {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn run_op(&self, op: Op<'_>) -> Result<(), BackendError> {
        self.inner.run_op(op)
    }
    fn ptpc_linear(
        &self,
        x: &[f32],
        rows: usize,
        w: &crate::formats::convert::PtpcFp8,
        round_out: bool,
        out: &mut [f32],
    ) -> Result<(), BackendError> {
        self.inner.ptpc_linear(x, rows, w, round_out, out)
    }
    fn tensor_parallel(&self) -> usize {
        self.ranks.max(1)
    }
}
