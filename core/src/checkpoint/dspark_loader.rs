//! Loading the DSpark draft (MODEL.md 6) from a checkpoint's `dspark/`
//! directory into [`DsparkWeights`].
//!
//! Layout (written by `m3 synth`, see [`crate::dspark`]): `dspark/config.json`
//! (a [`DsparkConfig`]), `dspark/model.safetensors.index.json` and its shards
//! (or a lone `dspark/model.safetensors`). Every tensor is BF16 (F32 is also
//! accepted); its shape is checked against the config, and every error names
//! the file and the tensor (`dspark/...`).

use std::collections::BTreeMap;
use std::path::Path;
use std::string::{String, ToString};
use std::vec::Vec;

use super::index::{parse_index, INDEX_FILE, SINGLE_FILE};
use super::safetensors_file::{Dtype, SafetensorsFile};
use super::CheckpointError;
use crate::config::ModelConfig;
use crate::dspark::{DsparkConfig, DsparkLayerWeights, DsparkNames, DsparkWeights, DIR};
use crate::formats::bf16;
use crate::weights::{AttnWeights, LinearWeight, MlpWeights};

/// The opened shards of a draft directory (`dspark/`, `eagle3/`) and where
/// each tensor lives.
pub(crate) struct DraftFiles {
    /// The directory's name inside the checkpoint, for messages.
    dir: &'static str,
    /// The draft's name, for messages ("DSpark", "EAGLE3").
    what: &'static str,
    shards: Vec<SafetensorsFile>,
    /// Tensor name -> index into `shards`.
    map: BTreeMap<String, usize>,
}

impl DraftFiles {
    pub(crate) fn open(
        d: &Path,
        dir: &'static str,
        what: &'static str,
    ) -> Result<Self, CheckpointError> {
        let index = d.join(INDEX_FILE);
        let shard_names: Vec<String> = if index.is_file() {
            let bytes = std::fs::read(&index).map_err(|e| CheckpointError::io(&index, e))?;
            parse_index(&format!("{dir}/{INDEX_FILE}"), &bytes)?.shards()
        } else if d.join(SINGLE_FILE).is_file() {
            vec![SINGLE_FILE.to_string()]
        } else {
            return Err(CheckpointError::file(
                format!("{dir}/"),
                format!("has neither {INDEX_FILE} nor {SINGLE_FILE}"),
            ));
        };
        let mut shards = Vec::with_capacity(shard_names.len());
        let mut map = BTreeMap::new();
        for (i, s) in shard_names.iter().enumerate() {
            let f = SafetensorsFile::open(&d.join(s), &format!("{dir}/{s}"))?;
            for t in &f.header.tensors {
                map.insert(t.name.clone(), i);
            }
            shards.push(f);
        }
        Ok(DraftFiles {
            dir,
            what,
            shards,
            map,
        })
    }

    /// Whether the draft has tensor `name`.
    pub(crate) fn has(&self, name: &str) -> bool {
        self.map.contains_key(name)
    }

    /// The raw bytes of tensor `name` after checking its shape and that its
    /// dtype is one of `dtypes`.
    pub(crate) fn raw(
        &self,
        name: &str,
        shape: &[usize],
        dtypes: &[Dtype],
    ) -> Result<(Dtype, Vec<u8>), CheckpointError> {
        let (dir, what) = (self.dir, self.what);
        let &i = self.map.get(name).ok_or_else(|| CheckpointError::Missing {
            tensor: format!("{dir}/{name}"),
            why: format!("the {what} config needs it"),
        })?;
        let f = &self.shards[i];
        let t = f.info(name).ok_or_else(|| CheckpointError::Missing {
            tensor: format!("{dir}/{name}"),
            why: format!("not in {}", f.name),
        })?;
        if t.shape != shape {
            return Err(CheckpointError::tensor(
                &f.name,
                format!("{dir}/{name}"),
                format!("shape {:?}, expected {:?}", t.shape, shape),
            ));
        }
        if !dtypes.contains(&t.dtype) {
            let names: Vec<&str> = dtypes.iter().map(|d| d.name()).collect();
            return Err(CheckpointError::tensor(
                &f.name,
                format!("{dir}/{name}"),
                format!(
                    "dtype {} but {what} expects {}",
                    t.dtype.name(),
                    names.join(" or ")
                ),
            ));
        }
        Ok((t.dtype, f.bytes(t).to_vec()))
    }

    /// The tensor `name` (BF16 or F32) after checking its shape.
    fn tensor(&self, name: &str, shape: &[usize]) -> Result<(Dtype, Vec<u8>), CheckpointError> {
        self.raw(name, shape, &[Dtype::BF16, Dtype::F32])
    }

    pub(crate) fn linear(
        &self,
        name: &str,
        rows: usize,
        cols: usize,
    ) -> Result<LinearWeight, CheckpointError> {
        Ok(match self.tensor(name, &[rows, cols])? {
            (Dtype::BF16, raw) => LinearWeight::Bf16 {
                rows,
                cols,
                data: raw
                    .chunks_exact(2)
                    .map(|c| u16::from_le_bytes([c[0], c[1]]))
                    .collect(),
            },
            (_, raw) => LinearWeight::F32 {
                rows,
                cols,
                data: f32s(&raw),
            },
        })
    }

    pub(crate) fn vector(&self, name: &str, n: usize) -> Result<Vec<f32>, CheckpointError> {
        Ok(match self.tensor(name, &[n])? {
            (Dtype::BF16, raw) => raw
                .chunks_exact(2)
                .map(|c| bf16::to_f32(u16::from_le_bytes([c[0], c[1]])))
                .collect(),
            (_, raw) => f32s(&raw),
        })
    }
}

fn f32s(raw: &[u8]) -> Vec<f32> {
    raw.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Whether checkpoint `dir` carries a draft (`dir/dspark/config.json`).
pub fn has_dspark(dir: &Path) -> bool {
    dir.join(DIR).join("config.json").is_file()
}

/// Load the draft under `dir/dspark/`, validated against `target` (shared H
/// and vocabulary, target layers in range) and with every tensor's shape
/// checked. `Ok(None)` when the checkpoint has no `dspark/config.json`.
pub fn load_dspark(
    dir: &Path,
    target: &ModelConfig,
) -> Result<Option<DsparkWeights>, CheckpointError> {
    if !has_dspark(dir) {
        return Ok(None);
    }
    let d = dir.join(DIR);
    let cfg_path = d.join("config.json");
    let text = std::fs::read_to_string(&cfg_path).map_err(|e| CheckpointError::io(&cfg_path, e))?;
    let config = DsparkConfig::from_json_str(&text).map_err(|e| CheckpointError::Config {
        file: format!("{DIR}/config.json"),
        why: e.to_string(),
    })?;
    config
        .validate(Some(target))
        .map_err(|e| CheckpointError::Config {
            file: format!("{DIR}/config.json"),
            why: e.to_string(),
        })?;
    let files = DraftFiles::open(&d, DIR, "DSpark")?;
    let c = &config;
    let n = DsparkNames;
    let h = c.hidden_size;
    let qd = c.num_attention_heads * c.head_dim;
    let kvd = c.num_key_value_heads * c.head_dim;
    let f = c.ffn_hidden_size;
    let mut layers = Vec::with_capacity(c.n_layers);
    for l in 0..c.n_layers {
        let ln = n.layer(l);
        layers.push(DsparkLayerWeights {
            input_norm: files.vector(&ln.input_layernorm(), h)?,
            post_attn_norm: files.vector(&ln.post_attention_layernorm(), h)?,
            attn: AttnWeights {
                q: files.linear(&ln.q_proj(), qd, h)?,
                k: files.linear(&ln.k_proj(), kvd, h)?,
                v: files.linear(&ln.v_proj(), kvd, h)?,
                o: files.linear(&ln.o_proj(), h, qd)?,
                q_norm: files.vector(&ln.q_norm(), c.head_dim)?,
                k_norm: files.vector(&ln.k_norm(), c.head_dim)?,
                indexer: None,
                k_scale: 1.0,
                v_scale: 1.0,
            },
            mlp: MlpWeights {
                gate: files.linear(&ln.gate_proj(), f, h)?,
                up: files.linear(&ln.up_proj(), f, h)?,
                down: files.linear(&ln.down_proj(), h, f)?,
            },
        });
    }
    Ok(Some(DsparkWeights {
        fc: files.linear(&n.fc(), h, c.fc_in())?,
        layers,
        final_norm: files.vector(&n.final_norm(), h)?,
        markov_e: files.linear(&n.markov_e(), c.vocab_size, c.markov_rank)?,
        markov_w: files.linear(&n.markov_w(), c.markov_rank, c.vocab_size)?,
        config,
    }))
}
