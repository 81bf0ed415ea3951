//! `model.safetensors.index.json`: which shard holds which tensor.
//!
//! Its `weight_map` is the only list of tensors to load (release
//! checkpoints ship extra files that repeat names).

use std::collections::BTreeMap;
use std::string::String;

use serde_json::Value;

use super::CheckpointError;

/// The file name of the index in a checkpoint directory.
pub const INDEX_FILE: &str = "model.safetensors.index.json";
/// The single-file checkpoint name (no index).
pub const SINGLE_FILE: &str = "model.safetensors";

/// A parsed, validated shard index.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct ShardIndex {
    /// Tensor name -> shard file name (relative to the checkpoint dir).
    pub weight_map: BTreeMap<String, String>,
    /// `metadata.total_size`, when given (bytes of tensor data).
    pub total_size: Option<u64>,
}

impl ShardIndex {
    /// The distinct shard names, sorted.
    pub fn shards(&self) -> Vec<String> {
        let mut v: Vec<String> = self.weight_map.values().cloned().collect();
        v.sort();
        v.dedup();
        v
    }
}

/// Parse the index text. Shard names must be plain file names or relative
/// paths that stay inside the checkpoint directory (no `..`, no absolute
/// paths), so a hostile index cannot make the loader read elsewhere.
pub fn parse_index(file: &str, bytes: &[u8]) -> Result<ShardIndex, CheckpointError> {
    let v: Value = serde_json::from_slice(bytes)
        .map_err(|e| CheckpointError::file(file, format!("not valid JSON: {e}")))?;
    let obj = v
        .as_object()
        .ok_or_else(|| CheckpointError::file(file, "top level is not an object"))?;
    let wm = obj
        .get("weight_map")
        .ok_or_else(|| CheckpointError::file(file, "missing field `weight_map`"))?
        .as_object()
        .ok_or_else(|| CheckpointError::file(file, "field `weight_map` is not an object"))?;
    let mut weight_map = BTreeMap::new();
    for (tensor, shard) in wm {
        let shard = shard.as_str().ok_or_else(|| {
            CheckpointError::tensor(
                file,
                tensor.as_str(),
                format!("weight_map entry {shard} is not a string"),
            )
        })?;
        if !safe_relative(shard) {
            return Err(CheckpointError::tensor(
                file,
                tensor.as_str(),
                format!("shard `{shard}` is not a relative path inside the checkpoint"),
            ));
        }
        weight_map.insert(tensor.clone(), shard.to_string());
    }
    let total_size = match obj.get("metadata").and_then(|m| m.get("total_size")) {
        None | Some(Value::Null) => None,
        Some(t) => Some(
            t.as_u64()
                .or_else(|| {
                    t.as_f64()
                        .filter(|x| *x >= 0.0 && x.fract() == 0.0)
                        .map(|x| x as u64)
                })
                .ok_or_else(|| {
                    CheckpointError::file(
                        file,
                        format!("metadata.total_size {t} is not an integer"),
                    )
                })?,
        ),
    };
    Ok(ShardIndex {
        weight_map,
        total_size,
    })
}

fn safe_relative(p: &str) -> bool {
    !p.is_empty()
        && !p.starts_with('/')
        && !p.starts_with('\\')
        && !p.contains(':')
        && !p.contains('\0')
        && p.split(['/', '\\'])
            .all(|c| !c.is_empty() && c != "." && c != "..")
}
