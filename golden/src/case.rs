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
    /// `--fold-shared-expert` (a GPU runner option): the shared expert runs
    /// as one more expert of the expert table, bitwise the same math.
    /// Only in reuse cases ([`ReuseMeta`]), absent when off.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub fold_shared_expert: bool,
    /// `--mxfp8-to-bf16`: every MXFP8 weight converted to bf16 at load,
    /// losslessly. Only in reuse cases ([`ReuseMeta`]), absent when off.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub mxfp8_to_bf16: bool,
}

impl RunOptions {
    /// The lossless serving options that are set: the ones a reuse case
    /// adds to its reference's options (`m3 forward` flag names).
    pub fn lossless_flags(&self) -> Vec<&'static str> {
        let mut f = Vec::new();
        if self.fold_shared_expert {
            f.push("--fold-shared-expert");
        }
        if self.mxfp8_to_bf16 {
            f.push("--mxfp8-to-bf16");
        }
        f
    }

    /// These options without the lossless serving options.
    pub fn without_lossless(&self) -> RunOptions {
        RunOptions {
            fold_shared_expert: false,
            mxfp8_to_bf16: false,
            ..self.clone()
        }
    }
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

/// The JSON sidecar of a reuse case: no tensors of its own. It runs its
/// `reference` case's checkpoint and prompt with a lossless serving option
/// added (`--fold-shared-expert`, `--mxfp8-to-bf16`) and is held to that
/// case's tensors and tolerances, since the option changes no value. The
/// recipe, config edit, scalar tensors, prompt and options are restated
/// here and must equal the reference's (options: but for the added ones).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ReuseMeta {
    pub name: String,
    #[serde(default)]
    pub description: String,
    /// The case whose tensors and tolerances this one is held to.
    pub reference: String,
    pub recipe: Recipe,
    #[serde(default)]
    pub config_edit: Option<serde_json::Value>,
    #[serde(default)]
    pub scalar_tensors: Option<BTreeMap<String, f32>>,
    pub tokens: Vec<u32>,
    pub options: RunOptions,
}

/// A loaded case.
#[derive(Clone, Debug)]
pub struct Case {
    pub meta: CaseMeta,
    pub taps: Taps,
    /// The case's safetensors: also the teacher input of `m3 forward`.
    /// For a reuse case, its reference's.
    pub taps_path: PathBuf,
    /// A reuse case: the name of the case whose tensors it holds to.
    pub reuses: Option<String>,
}

impl Case {
    /// Load `dir/NAME.json` and `dir/NAME.safetensors`; for a reuse case
    /// (a sidecar with `reference`), `dir/NAME.json` and the reference
    /// case's files ([`Case::reuse`]).
    pub fn load(dir: &Path, name: &str) -> Result<Case, GoldenError> {
        let jp = dir.join(format!("{name}.json"));
        let text = std::fs::read_to_string(&jp).map_err(|e| GoldenError::Io {
            path: jp.display().to_string(),
            source: e,
        })?;
        let format = |e: serde_json::Error| GoldenError::Format {
            path: jp.display().to_string(),
            msg: e.to_string(),
        };
        let value: serde_json::Value = serde_json::from_str(&text).map_err(format)?;
        if value.get("reference").is_some() {
            let reuse: ReuseMeta = serde_json::from_value(value).map_err(format)?;
            if reuse.name != name {
                return Err(GoldenError::Format {
                    path: jp.display().to_string(),
                    msg: format!("name is {:?}, the file says {name:?}", reuse.name),
                });
            }
            if reuse.reference == name {
                return Err(GoldenError::Format {
                    path: jp.display().to_string(),
                    msg: format!("case {name}: reference names the case itself"),
                });
            }
            let rp = dir.join(format!("{}.json", reuse.reference));
            if !rp.exists() {
                return Err(GoldenError::Format {
                    path: jp.display().to_string(),
                    msg: format!(
                        "case {name}: reference {:?}: no such case ({} is missing)",
                        reuse.reference,
                        rp.display()
                    ),
                });
            }
            let referenced = Case::load(dir, &reuse.reference)?;
            return Case::reuse(reuse, referenced).map_err(|msg| GoldenError::Format {
                path: jp.display().to_string(),
                msg,
            });
        }
        let meta: CaseMeta = serde_json::from_value(value).map_err(format)?;
        let taps_path = dir.join(format!("{name}.safetensors"));
        let taps = Taps::load(&taps_path)?;
        let case = Case {
            meta,
            taps,
            taps_path,
            reuses: None,
        };
        case.validate()?;
        Ok(case)
    }

    /// A reuse case from its sidecar and its loaded reference case: the
    /// reference's tensors, tolerances and margins under the reuse case's
    /// name and options (the reference's greedy run is left to the
    /// reference case). Refused, naming the case and the field, when the
    /// reference is itself a reuse case, when the recipe, config edit,
    /// scalar tensors, prompt or options (but for the added lossless ones)
    /// differ, or when no lossless option is added or the one added could
    /// change nothing (`--mxfp8-to-bf16` without MXFP8 weights) or cannot
    /// apply (`--fold-shared-expert` needs the shared expert in the
    /// experts' format: synth stores it in the `dense` format; and bf16
    /// expert inputs).
    pub fn reuse(reuse: ReuseMeta, referenced: Case) -> Result<Case, String> {
        let name = &reuse.name;
        let refname = &referenced.meta.name;
        let r = &referenced.meta;
        if let Some(other) = &referenced.reuses {
            return Err(format!(
                "case {name}: reference {refname} is itself a reuse case (of {other}): name a case with tensors"
            ));
        }
        let differs = |field: &str, mine: String, theirs: String| {
            Err(format!(
                "case {name}: {field} differs from its reference {refname}'s ({mine} vs {theirs}): a reuse case runs the reference's checkpoint and prompt"
            ))
        };
        fn same<T: PartialEq + std::fmt::Debug>(a: &T, b: &T) -> Option<(String, String)> {
            (a != b).then(|| (format!("{a:?}"), format!("{b:?}")))
        }
        for (field, d) in [
            ("recipe", same(&reuse.recipe, &r.recipe)),
            ("config_edit", same(&reuse.config_edit, &r.config_edit)),
            (
                "scalar_tensors",
                same(&reuse.scalar_tensors, &r.scalar_tensors),
            ),
        ] {
            if let Some((mine, theirs)) = d {
                return differs(field, mine, theirs);
            }
        }
        if reuse.tokens != r.tokens {
            return differs(
                "tokens",
                format!("{} tokens", reuse.tokens.len()),
                format!("{} tokens", r.tokens.len()),
            );
        }
        let o = &reuse.options;
        if !r.options.lossless_flags().is_empty() {
            return Err(format!(
                "case {name}: reference {refname}'s options already hold {:?}",
                r.options.lossless_flags()
            ));
        }
        if o.without_lossless() != r.options {
            return differs(
                "options",
                format!("{:?}", o.without_lossless()),
                format!("{:?}", r.options),
            );
        }
        if o.lossless_flags().is_empty() {
            return Err(format!(
                "case {name}: options add no lossless serving option (fold_shared_expert, mxfp8_to_bf16) to its reference {refname}'s: it would repeat that case"
            ));
        }
        if o.mxfp8_to_bf16 && reuse.recipe.experts != "mxfp8" && reuse.recipe.dense != "mxfp8" {
            return Err(format!(
                "case {name}: options.mxfp8_to_bf16 on a recipe without MXFP8 weights (experts {}, dense {}): the option would change nothing",
                reuse.recipe.experts, reuse.recipe.dense
            ));
        }
        if o.fold_shared_expert {
            if reuse.recipe.experts != reuse.recipe.dense {
                return Err(format!(
                    "case {name}: options.fold_shared_expert needs the shared expert (synth: the `dense` format, {}) in the experts' format ({})",
                    reuse.recipe.dense, reuse.recipe.experts
                ));
            }
            if o.act == "mxfp4" {
                return Err(format!(
                    "case {name}: options.fold_shared_expert with act mxfp4: the folded shared expert needs bf16 inputs"
                ));
            }
        }
        let mut meta = referenced.meta;
        meta.name = reuse.name;
        meta.description = reuse.description;
        meta.options = reuse.options;
        meta.greedy = None;
        Ok(Case {
            meta,
            taps: referenced.taps,
            taps_path: referenced.taps_path,
            reuses: Some(reuse.reference),
        })
    }

    /// Every case in `dir` (by its `.json` sidecar, beside its
    /// `.safetensors` or naming a `reference`), sorted by name.
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
                    if dir.join(format!("{stem}.safetensors")).exists() || is_reuse(&p) {
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

/// A sidecar naming a `reference` (a reuse case); an unreadable one is
/// not, and is left out as before.
fn is_reuse(path: &Path) -> bool {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .is_some_and(|v| v.get("reference").is_some())
}
