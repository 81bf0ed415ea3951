//! Checkpoints on disk (MODEL.md section 7): tensor names, safetensors
//! header validation, the shard index, `quantization_config`, and the loader
//! that turns a checkpoint directory into typed [`crate::weights::ModelWeights`].

pub mod names;
pub mod writer;

mod error;
pub mod index;
pub mod safetensors_file;

pub use error::CheckpointError;
pub mod quant_config;
pub mod loader;

pub use loader::{Checkpoint, LoadOptions, TensorEntry};
pub use quant_config::{QuantConfig, WeightFormat};
pub use safetensors_file::Dtype;
