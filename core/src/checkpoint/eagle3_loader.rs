//! Loading the EAGLE3 draft (ARCHITECTURE.md "EAGLE3 draft") from a
//! checkpoint's `eagle3/` directory into [`Eagle3Weights`].
//!
//! Layout (see [`crate::eagle3`]; written by `m3 synth --eagle3`):
//! `eagle3/config.json` (an [`Eagle3Config`]),
//! `eagle3/model.safetensors.index.json` and its shards (or a lone
//! `eagle3/model.safetensors`). Linears and norms are BF16 or F32, `d2t` is
//! I64; `t2d` and an `embed_tokens.weight` (published drafts sometimes
//! carry a copy of the target's) are ignored. Every shape is checked
//! against the config, and every error names the tensor (`eagle3/...`).

use std::path::Path;
use std::string::ToString;
use std::vec::Vec;

use super::dspark_loader::DraftFiles;
use super::safetensors_file::Dtype;
use super::CheckpointError;
use crate::config::ModelConfig;
use crate::eagle3::{Eagle3Config, Eagle3Names as N, Eagle3Weights, DIR};

/// Whether checkpoint `dir` carries an EAGLE3 draft (`dir/eagle3/config.json`).
pub fn has_eagle3(dir: &Path) -> bool {
    dir.join(DIR).join("config.json").is_file()
}

/// Load the draft under `dir/eagle3/`, validated against `target` (shared H
/// and vocabulary, target layers in range), every tensor's shape and dtype
/// checked, and `d2t` checked to map draft ids injectively into the target
/// vocabulary. `Ok(None)` when the checkpoint has no `eagle3/config.json`.
pub fn load_eagle3(
    dir: &Path,
    target: &ModelConfig,
) -> Result<Option<Eagle3Weights>, CheckpointError> {
    if !has_eagle3(dir) {
        return Ok(None);
    }
    let d = dir.join(DIR);
    let cfg_path = d.join("config.json");
    let text = std::fs::read_to_string(&cfg_path).map_err(|e| CheckpointError::io(&cfg_path, e))?;
    let cfg_err = |e: crate::eagle3::Eagle3Error| CheckpointError::Config {
        file: format!("{DIR}/config.json"),
        why: e.to_string(),
    };
    let config = Eagle3Config::from_json_str(&text).map_err(cfg_err)?;
    config.validate(Some(target)).map_err(cfg_err)?;
    let files = DraftFiles::open(&d, DIR, "EAGLE3")?;
    let c = &config;
    let h = c.hidden_size;
    let hd = c.head_dim();
    let qd = c.num_attention_heads * hd;
    let kvd = c.num_key_value_heads * hd;
    let i = c.intermediate_size;
    // Llama norm weights `w` kept as `w - 1` for the Gemma-form norm op.
    let norm = |name: &str| -> Result<Vec<f32>, CheckpointError> {
        Ok(files.vector(name, h)?.iter().map(|w| w - 1.0).collect())
    };
    let (_, raw) = files.raw(N::D2T, &[c.draft_vocab_size], &[Dtype::I64])?;
    let d2t: Vec<i64> = raw
        .chunks_exact(8)
        .map(|b| i64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]))
        .collect();
    let draft_to_target = c
        .draft_to_target(&d2t)
        .map_err(|e| CheckpointError::Tensor {
            file: format!("{DIR}/"),
            tensor: format!("{DIR}/{}", N::D2T),
            why: e.to_string(),
        })?;
    if files.has(N::T2D) {
        // Present in published drafts; only its shape is checked.
        files.raw(N::T2D, &[c.vocab_size], &[Dtype::Bool, Dtype::U8])?;
    }
    Ok(Some(Eagle3Weights {
        fc: files.linear(N::FC, h, c.fc_in())?,
        input_norm: norm(N::INPUT_LAYERNORM)?,
        hidden_norm: norm(N::HIDDEN_NORM)?,
        post_attn_norm: norm(N::POST_ATTENTION_LAYERNORM)?,
        final_norm: norm(N::NORM)?,
        q: files.linear(N::Q_PROJ, qd, 2 * h)?,
        k: files.linear(N::K_PROJ, kvd, 2 * h)?,
        v: files.linear(N::V_PROJ, kvd, 2 * h)?,
        o: files.linear(N::O_PROJ, h, qd)?,
        gate: files.linear(N::GATE_PROJ, i, h)?,
        up: files.linear(N::UP_PROJ, i, h)?,
        down: files.linear(N::DOWN_PROJ, h, i)?,
        lm_head: files.linear(N::LM_HEAD, c.draft_vocab_size, h)?,
        draft_to_target,
        config,
    }))
}
