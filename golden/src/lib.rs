//! The golden parity suite.
//!
//! Golden cases (`golden/cases/NAME.{json,safetensors}`) are written by an
//! independent numpy implementation of MODEL.md (`golden/gen/reference.py`,
//! driven by `cargo xtask gen-golden`). A backend runs the case's prompt
//! with teacher forcing (`m3 forward --teacher NAME.safetensors --dump OUT`)
//! so every layer sees the reference's own input; [`compare`] then judges
//! each tap on its own with the case's per-tensor tolerances:
//!
//! - `residual.{l}` and `logits`: relative L2 and max-abs error;
//! - `topk_blocks.{l}` and `experts.{l}`: exact ids, except rows where the
//!   reference's own score gap (`topk_margin.{l}`, `router_margin.{l}`) is
//!   below the case's stated margin: those are counted as near-ties.
//!
//! [`Report::first_divergence`] names the first layer and op that fails.
//!
//! Draft cases ([`draft`]) add the EAGLE3 draft's proposal after the prompt
//! (`draft.*`), compared after the target's rows by the same [`compare`].

pub mod case;
pub mod compare;
pub mod draft;
pub mod parity;
pub mod tensors;

pub use case::{Case, CaseMeta, Greedy, NearTie, Recipe, ReuseMeta, RunOptions, Tolerance};
pub use compare::{
    compare, compare_draft, table_header, table_lines, Measure, Report, Row, Verdict,
};
pub use draft::{run_eagle3, DraftError, DraftMeta};
pub use tensors::{Tap, Taps};

/// Re-exported for tools that read the case sidecars (xtask).
pub use serde_json;

use std::path::{Path, PathBuf};

/// Errors of the parity suite; each names the file and tensor involved.
#[derive(Debug, thiserror::Error)]
pub enum GoldenError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {msg}")]
    Format { path: String, msg: String },
    #[error("{path}: tensor {name}: {msg}")]
    Tensor {
        path: String,
        name: String,
        msg: String,
    },
}

/// `golden/cases` of this workspace.
pub fn cases_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("cases")
}

/// Write `bytes` to `path` through a temp file in the same directory and a
/// rename, so a partial file never carries the final name.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), GoldenError> {
    let io = |e| GoldenError::Io {
        path: path.display().to_string(),
        source: e,
    };
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "out".into());
    let tmp = path.with_file_name(format!(".{file_name}.tmp{}", std::process::id()));
    std::fs::write(&tmp, bytes).map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)
}
