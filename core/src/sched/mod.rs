//! Scheduling: every decision about what a step computes (ARCHITECTURE.md:
//! backends never schedule).
//!
//! - [`blocks`]: the fixed block pool of the paged KV and index caches,
//!   reference counts, copy-on-write.
//! - [`prefix`]: the prefix cache (chained block hashes, LRU of idle blocks).
//! - [`request`]: requests, sampling parameters, finish rules.
//! - [`step`]: the plain-data step ([`ScheduledStep`]), the Standard / Mono
//!   path rule and the counters.
//! - [`scheduler`]: continuous batching, chunked prefill, preemption.
//! - [`runner`]: the scheduler driving a real backend (block copies, batch
//!   conversion, sampling, speculative verification).
//! - [`ngram`]: prompt-lookup drafting (a model-free [`runner::Drafter`]).
//! - [`dspark_drafter`]: the DSpark draft model as a [`runner::Drafter`];
//!   [`draft_forward`]: its forward (op by op, or a loaded model's own).
//! - [`spec_probs`]: sampling distributions for the speculative verifiers.
//! - [`mock`]: a deterministic stand-in backend that checks every slot it
//!   reads, for tests and for running the scheduler without a model.
//!
//! Host-only, `no_std + alloc`.

pub mod blocks;
pub mod draft_forward;
pub mod dspark_drafter;
pub mod eagle3_drafter;
pub mod mock;
pub mod ngram;
pub mod prefix;
pub mod request;
pub mod runner;
pub mod scheduler;
pub mod spec_probs;
pub mod step;

pub use blocks::{BlockCopy, BlockId, BlockPool};
pub use request::{FinishReason, FinishedRequest, Request, RequestId, SamplingParams};
pub use scheduler::{Scheduler, SchedulerConfig, SeqTokens};
pub use step::{plan_path, Row, RowKind, ScheduledStep, StepCounters, StepPath, StepSeq};

/// Why a scheduler call was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SchedError {
    #[error("scheduler config: {0}")]
    Config(&'static str),
    #[error("no free KV block")]
    OutOfBlocks,
    #[error("block {0} is not allocated (bad id or reference count already 0)")]
    BadBlock(BlockId),
    #[error("request {0} is already queued or running")]
    DuplicateRequest(RequestId),
    #[error("request {0} is not running")]
    UnknownRequest(RequestId),
    #[error("request {0} is not ready for a decode step (draft refused)")]
    NotDecoding(RequestId),
    #[error("a planned step has not been committed yet")]
    StepPending,
    #[error("step {0} is not the step awaiting commit")]
    WrongStep(u64),
    #[error("no tokens given for request {0}, whose rows produced logits")]
    MissingResult(RequestId),
    #[error("tokens for request {0} do not fit its rows (one token, or an accepted draft prefix plus one)")]
    BadResult(RequestId),
}
