//! Checkpoints on disk (MODEL.md section 7): tensor names, safetensors
//! header validation, the shard index, `quantization_config`, and the loader
//! that turns a checkpoint directory into typed [`crate::weights::ModelWeights`].
//!
//! - [`names`], every tensor name (`TensorNames::new(prefixed).layer(l).q_proj()`),
//!   scale siblings, and the tensor [`names::Family`] classification.
//! - [`safetensors_file`], header parsing + validation, memory-mapped shards.
//! - [`index`], the `model.safetensors.index.json` shard map.
//! - [`quant_config`], the three `quantization_config` shapes, cross-checked
//!   against the formats the tensors show.
//! - [`loader`], [`Checkpoint::open`] / [`Checkpoint::validate`] /
//!   [`Checkpoint::load`], plus the tensor-level API tools stream through
//!   ([`Checkpoint::tensors`], [`Checkpoint::raw_bytes`], [`Checkpoint::detect_format`]).
//! - [`writer`], streamed shard writing for `m3 synth` / `m3 convert`.

pub mod dspark_loader;
pub mod eagle3_loader;
mod error;
pub mod index;
pub mod loader;
pub mod names;
pub mod online;
pub mod quant_config;
pub mod safetensors_file;
pub mod writer;

pub use error::CheckpointError;
pub use loader::{Checkpoint, LoadOptions, StoredLinear, TensorEntry};
pub use quant_config::{QuantConfig, WeightFormat};
pub use safetensors_file::Dtype;
