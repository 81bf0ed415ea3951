//! `CheckpointError`: every way a checkpoint can be refused, each a one-line
//! message naming the file, tensor or field at fault.

use std::string::String;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CheckpointError {
    /// The file could not be opened, read or mapped.
    #[error("{path}: {why}")]
    Io { path: String, why: String },
    /// A file-level problem (safetensors header, index JSON, unused shard).
    #[error("{file}: {why}")]
    File { file: String, why: String },
    /// A problem with one tensor (header entry, dtype, shape, format, value).
    #[error("{file}: tensor `{tensor}`: {why}")]
    Tensor {
        file: String,
        tensor: String,
        why: String,
    },
    /// A tensor the config requires is in no shard.
    #[error("tensor `{tensor}` is missing from the checkpoint ({why})")]
    Missing { tensor: String, why: String },
    /// `config.json` is missing, malformed or inconsistent.
    #[error("{file}: {why}")]
    Config { file: String, why: String },
}

impl CheckpointError {
    pub(crate) fn file(file: impl Into<String>, why: impl Into<String>) -> Self {
        CheckpointError::File {
            file: file.into(),
            why: why.into(),
        }
    }
    pub(crate) fn tensor(
        file: impl Into<String>,
        tensor: impl Into<String>,
        why: impl Into<String>,
    ) -> Self {
        CheckpointError::Tensor {
            file: file.into(),
            tensor: tensor.into(),
            why: why.into(),
        }
    }
    pub(crate) fn io(path: &std::path::Path, e: impl core::fmt::Display) -> Self {
        CheckpointError::Io {
            path: path.display().to_string(),
            why: e.to_string(),
        }
    }
}
