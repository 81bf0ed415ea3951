//! Errors while loading the vectors (never while comparing: a mismatch is a
//! result, not an error).

use std::path::PathBuf;

/// Why the vector set could not be loaded. Every message names the file and,
/// where it applies, the group and tensor.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: bad manifest: {source}")]
    Manifest {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("{path}: not a safetensors file: {why}")]
    Safetensors { path: PathBuf, why: String },
    #[error("{path}: tensor `{tensor}`: {why}")]
    Tensor {
        path: PathBuf,
        tensor: String,
        why: String,
    },
    #[error("manifest group `{group}`: {why}")]
    Group { group: String, why: String },
}
