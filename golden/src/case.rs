//! A golden case: `golden/cases/NAME.json` (inputs, recipe, options,
//! tolerances, the reference's greedy run) beside `NAME.safetensors` (the
//! reference's taps and near-tie margins). Both are written by
//! `golden/gen/reference.py case` (through `cargo xtask gen-golden`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::tensors::Taps;
use crate::GoldenError;

/// How to regenerate the case's checkpoint with `m3 synth`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Recipe {
    pub preset: String,
    pub experts: String,
    pub dense: String,
    pub seed: u64,
    /// `--layers N` override, if any.
    #[serde(default)]
    pub layers: Option<usize>,
    /// `--eagle3`: the checkpoint carries the synthetic EAGLE3 draft.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub eagle3: bool,
}

impl Recipe {
    /// A directory name unique to this recipe (and config edit).
    pub fn cache_key(&self, edit: Option<&serde_json::Value>) -> String {
        let mut key = format!(
            "{}-{}-{}-s{}",
            self.preset, self.experts, self.dense, self.seed
        );
        if let Some(l) = self.layers {
            key.push_str(&format!("-l{l}"));
        }
        if self.eagle3 {
            key.push_str("-eagle3");
        }
        if let Some(e) = edit {
            key.push_str(&format!("-e{}", Self::short_hash(&e.to_string())));
        }
        key
    }

    /// FNV-1a of a text, 8 hex digits: stable across runs and machines.
    pub fn short_hash(text: &str) -> String {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in text.bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        format!("{:08x}", h as u32)
    }
}

/// Run options of a case (the `m3 forward` flags).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct RunOptions {
    pub kv_dtype: String,
    pub act: String,
    pub selection: String,
    pub nvfp4_as_mxfp4: bool,
    /// Online quantization (`ptpc_fp8`), absent when off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub online_quant: Option<String>,
    /// `--online-quant-exclude` patterns, absent when none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub online_quant_exclude: Option<String>,
}

/// Tolerance of one continuous tensor.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq)]
pub struct Tolerance {
    pub rel_l2: f64,
    pub max_abs: f64,
}

/// Margins below which a discrete mismatch is a near-tie of the reference.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct NearTie {
    /// Router: biased score gap between the k-th and (k+1)-th expert.
    pub router_margin: f64,
    /// Indexer: block-score gap at the selection boundary (score units).
    pub topk_margin: f64,
}

/// The reference's greedy run from the case's prompt.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Greedy {
    pub n: usize,
    pub tokens: Vec<u32>,
    /// Logit gap top-1 minus top-2 of each step.
    pub logit_gap: Vec<Option<f64>>,
    #[serde(default)]
    pub min_router_margin: Vec<Option<f64>>,
    #[serde(default)]
    pub min_topk_margin: Vec<Option<f64>>,
}

/// The JSON sidecar.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct CaseMeta {
    pub name: String,
    #[serde(default)]
    pub description: String,
    pub recipe: Recipe,
    #[serde(default)]
    pub config_edit: Option<serde_json::Value>,
    /// F32 scalars added to every layer after synth, by name below
    /// `layers.N.` (e.g. `self_attn.k_scale`); `index_*` ones only on
    /// sparse layers. Used for non-unit FP8 cache scales.
    #[serde(default)]
    pub scalar_tensors: Option<BTreeMap<String, f32>>,
    pub options: RunOptions,
    pub tokens: Vec<u32>,
    pub num_layers: usize,
    pub attn_kinds: Vec<String>,
    pub mlp_kinds: Vec<String>,
    /// The case's `logits` hold rows `logits_rows_from..T` of the prompt.
    pub logits_rows_from: usize,
    pub tolerances: BTreeMap<String, Tolerance>,
    pub near_tie: NearTie,
    #[serde(default)]
    pub greedy: Option<Greedy>,
    /// A draft case: the reference's draft proposal after the prompt.
    #[serde(default)]
    pub draft: Option<crate::draft::DraftMeta>,
}

/// A loaded case.
#[derive(Clone, Debug)]
pub struct Case {
    pub meta: CaseMeta,
    pub taps: Taps,
    /// The case's safetensors: also the teacher input of `m3 forward`.
    pub taps_path: PathBuf,
}

impl Case {
    /// Load `dir/NAME.json` and `dir/NAME.safetensors`.
    pub fn load(dir: &Path, name: &str) -> Result<Case, GoldenError> {
        let jp = dir.join(format!("{name}.json"));
        let text = std::fs::read_to_string(&jp).map_err(|e| GoldenError::Io {
            path: jp.display().to_string(),
            source: e,
        })?;
        let meta: CaseMeta = serde_json::from_str(&text).map_err(|e| GoldenError::Format {
            path: jp.display().to_string(),
            msg: e.to_string(),
        })?;
        let taps_path = dir.join(format!("{name}.safetensors"));
        let taps = Taps::load(&taps_path)?;
        let case = Case {
            meta,
            taps,
            taps_path,
        };
        case.validate()?;
        Ok(case)
    }

    /// Every case in `dir` (by its `.json` sidecar), sorted by name.
    pub fn list(dir: &Path) -> Result<Vec<String>, GoldenError> {
        let rd = std::fs::read_dir(dir).map_err(|e| GoldenError::Io {
            path: dir.display().to_string(),
            source: e,
        })?;
        let mut names = Vec::new();
        for entry in rd.flatten() {
            let p = entry.path();
            if p.extension().and_then(|e| e.to_str()) == Some("json") {
                if let Some(stem) = p.file_stem().and_then(|s| s.to_str()) {
                    if dir.join(format!("{stem}.safetensors")).exists() {
                        names.push(stem.to_string());
                    }
                }
            }
        }
        names.sort();
        Ok(names)
    }

    /// The sidecar and the taps agree (every tolerance names a tap, every
    /// residual has a tolerance).
    fn validate(&self) -> Result<(), GoldenError> {
        let file = self.taps_path.display().to_string();
        for l in 0..self.meta.num_layers {
            let name = format!("residual.{l}");
            self.taps.f32(&name, &file)?;
            if !self.meta.tolerances.contains_key(&name) {
                return Err(GoldenError::Tensor {
                    path: file.clone(),
                    name,
                    msg: "no tolerance in the sidecar".into(),
                });
            }
        }
        self.taps.f32("logits", &file)?;
        if let Some(d) = &self.meta.draft {
            for name in ["draft.g", "draft.hidden", "draft.logits", "draft.logit_gap"] {
                let (shape, _) = self.taps.f32(name, &file)?;
                let rows = if name == "draft.g" {
                    self.meta.tokens.len()
                } else {
                    d.steps
                };
                if shape.first() != Some(&rows) {
                    return Err(GoldenError::Tensor {
                        path: file.clone(),
                        name: name.into(),
                        msg: format!("shape {shape:?}, expected {rows} rows"),
                    });
                }
                if name != "draft.logit_gap" && !self.meta.tolerances.contains_key(name) {
                    return Err(GoldenError::Tensor {
                        path: file.clone(),
                        name: name.into(),
                        msg: "no tolerance in the sidecar".into(),
                    });
                }
            }
            match self.taps.get("draft.tokens") {
                Some(crate::Tap::I32 { shape, .. }) if shape == &[d.steps] => {}
                other => {
                    return Err(GoldenError::Tensor {
                        path: file,
                        name: "draft.tokens".into(),
                        msg: format!(
                            "expected I32 [{}], got {:?}",
                            d.steps,
                            other.map(|t| t.shape())
                        ),
                    })
                }
            }
        }
        Ok(())
    }

    /// The prompt as the comma-separated ids `m3 forward --tokens` takes.
    pub fn tokens_arg(&self) -> String {
        self.meta
            .tokens
            .iter()
            .map(|t| t.to_string())
            .collect::<Vec<_>>()
            .join(",")
    }
}
