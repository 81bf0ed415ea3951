//! `quantization_config` of `config.json` (MODEL.md section 7), in its three
//! shapes, reduced to one question: which weight formats may the tensor
//! `base` (a module name such as `model.layers.3.self_attn.q_proj`) have?
//!
//! The tensors present decide a tensor's format; this module only refuses
//! a checkpoint whose config contradicts them.

use std::string::{String, ToString};
use std::vec::Vec;

use serde_json::Value;

use super::names::LM_PREFIX;
use super::CheckpointError;

/// The stored format of one linear weight, as detected from its tensors.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum WeightFormat {
    Bf16,
    F32,
    Mxfp4,
    Nvfp4,
    Mxfp8E4M3,
    Mxfp8E5M2,
}

impl WeightFormat {
    pub fn label(self) -> &'static str {
        match self {
            WeightFormat::Bf16 => "bf16",
            WeightFormat::F32 => "f32",
            WeightFormat::Mxfp4 => "mxfp4",
            WeightFormat::Nvfp4 => "nvfp4",
            WeightFormat::Mxfp8E4M3 => "mxfp8(e4m3)",
            WeightFormat::Mxfp8E5M2 => "mxfp8(e5m2)",
        }
    }
    /// True for the block-quantized formats.
    pub fn is_quantized(self) -> bool {
        !matches!(self, WeightFormat::Bf16 | WeightFormat::F32)
    }
    fn is_mxfp8(self) -> bool {
        matches!(self, WeightFormat::Mxfp8E4M3 | WeightFormat::Mxfp8E5M2)
    }
}

/// What a Quark pattern says about a weight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QuarkDtype {
    Fp4,
    Fp8,
}

/// The parsed `quantization_config`.
#[derive(Clone, Debug, PartialEq, Default)]
pub enum QuantConfig {
    /// No `quantization_config`: the tensors alone decide.
    #[default]
    None,
    /// AMD Quark: a global weight dtype, per-pattern overrides, excludes.
    Quark {
        global: Option<QuarkDtype>,
        layers: Vec<(String, Option<QuarkDtype>)>,
        exclude: Vec<String>,
    },
    /// NVIDIA ModelOpt NVFP4: quantized layers (list or keys of an object)
    /// when given, and excluded modules.
    ModelOpt {
        quantized: Option<Vec<String>>,
        exclude: Vec<String>,
    },
    /// `quant_method: fp8` with `[1, 32]` blocks: every weight with scales is MXFP8.
    Fp8,
}

fn qerr(why: impl Into<String>) -> CheckpointError {
    CheckpointError::Config {
        file: "config.json".into(),
        why: why.into(),
    }
}

fn str_list(v: Option<&Value>, field: &str) -> Result<Vec<String>, CheckpointError> {
    match v {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(a)) => a
            .iter()
            .map(|e| {
                e.as_str().map(str::to_string).ok_or_else(|| {
                    qerr(format!(
                        "field `quantization_config.{field}`: entry {e} is not a string"
                    ))
                })
            })
            .collect(),
        Some(Value::Object(o)) => Ok(o.keys().cloned().collect()),
        Some(other) => Err(qerr(format!(
            "field `quantization_config.{field}`: {other} is not a list"
        ))),
    }
}

fn quark_dtype(v: &Value, field: &str) -> Result<Option<QuarkDtype>, CheckpointError> {
    let w = match v.get("weight") {
        None | Some(Value::Null) => return Ok(None),
        Some(w) => w,
    };
    // Quark allows a list of specs (e.g. double quantization); the first decides.
    let w = match w {
        Value::Array(a) => match a.first() {
            Some(x) => x,
            None => return Ok(None),
        },
        w => w,
    };
    let dt = w.get("dtype").and_then(Value::as_str).unwrap_or("");
    let d = match dt {
        "fp4" | "fp4_e2m1" | "mx_fp4" | "mxfp4" => QuarkDtype::Fp4,
        "fp8_e4m3" | "fp8_e5m2" | "fp8" | "mx_fp8" | "mxfp8" => QuarkDtype::Fp8,
        _ => {
            return Err(qerr(format!(
                "field `quantization_config.{field}.weight.dtype`: `{dt}` is not fp4 or fp8_e4m3"
            )))
        }
    };
    if let Some(g) = w.get("group_size").and_then(Value::as_u64) {
        if g != 32 {
            return Err(qerr(format!(
                "field `quantization_config.{field}.weight.group_size`: {g} (MX needs 32)"
            )));
        }
    }
    Ok(Some(d))
}

impl QuantConfig {
    /// Parse the `quantization_config` value (top level of `config.json`,
    /// or under `text_config`).
    pub fn parse(v: Option<&Value>) -> Result<QuantConfig, CheckpointError> {
        let v = match v {
            None | Some(Value::Null) => return Ok(QuantConfig::None),
            Some(v) => v,
        };
        let o = v
            .as_object()
            .ok_or_else(|| qerr("field `quantization_config` is not an object"))?;
        let method = o
            .get("quant_method")
            .and_then(Value::as_str)
            .ok_or_else(|| qerr("missing field `quantization_config.quant_method`"))?;
        match method {
            "quark" => {
                let global = match o.get("global_quant_config") {
                    Some(g) if !g.is_null() => quark_dtype(g, "global_quant_config")?,
                    _ => None,
                };
                let mut layers = Vec::new();
                if let Some(Value::Object(lq)) = o.get("layer_quant_config") {
                    for (pat, spec) in lq {
                        layers.push((
                            pat.clone(),
                            quark_dtype(spec, &format!("layer_quant_config.{pat}"))?,
                        ));
                    }
                }
                let exclude = str_list(o.get("exclude"), "exclude")?;
                Ok(QuantConfig::Quark {
                    global,
                    layers,
                    exclude,
                })
            }
            "modelopt" => {
                let algo = o
                    .get("quant_algo")
                    .and_then(Value::as_str)
                    .or_else(|| {
                        o.get("quantization")
                            .and_then(|q| q.get("quant_algo"))
                            .and_then(Value::as_str)
                    })
                    .unwrap_or("");
                if algo != "NVFP4" {
                    return Err(qerr(format!(
                        "field `quantization_config.quant_algo`: `{algo}` is not NVFP4"
                    )));
                }
                if let Some(g) = o.get("group_size").and_then(Value::as_u64) {
                    if g != 16 {
                        return Err(qerr(format!(
                            "field `quantization_config.group_size`: {g} (NVFP4 needs 16)"
                        )));
                    }
                }
                let quantized = match o.get("quantized_layers") {
                    None | Some(Value::Null) => None,
                    q => Some(str_list(q, "quantized_layers")?),
                };
                let exclude = str_list(o.get("exclude_modules"), "exclude_modules")?;
                Ok(QuantConfig::ModelOpt { quantized, exclude })
            }
            "fp8" => {
                if let Some(b) = o.get("weight_block_size") {
                    if b != &serde_json::json!([1, 32]) {
                        return Err(qerr(format!(
                            "field `quantization_config.weight_block_size`: {b} (MXFP8 needs [1, 32])"
                        )));
                    }
                }
                if let Some(f) = o.get("scale_fmt").and_then(Value::as_str) {
                    if f != "ue8m0" {
                        return Err(qerr(format!(
                            "field `quantization_config.scale_fmt`: `{f}` (MXFP8 needs ue8m0)"
                        )));
                    }
                }
                Ok(QuantConfig::Fp8)
            }
            other => Err(qerr(format!(
                "field `quantization_config.quant_method`: `{other}` is not quark, modelopt or fp8"
            ))),
        }
    }

    /// Check a detected format against the config for module `base`
    /// (e.g. `language_model.model.layers.0.self_attn.q_proj`). `Err` holds
    /// the reason for the contradiction.
    pub fn check(&self, base: &str, fmt: WeightFormat) -> Result<(), String> {
        match self {
            QuantConfig::None => Ok(()),
            QuantConfig::Fp8 => {
                if fmt.is_quantized() && !fmt.is_mxfp8() {
                    Err(format!(
                        "is {} but quantization_config says fp8 (MXFP8)",
                        fmt.label()
                    ))
                } else {
                    Ok(())
                }
            }
            QuantConfig::ModelOpt { quantized, exclude } => {
                let excluded = exclude.iter().any(|p| module_matches(p, base));
                let listed = match quantized {
                    Some(q) => q.iter().any(|p| module_matches(p, base)),
                    None => true,
                };
                let want_nvfp4 = listed && !excluded;
                match (want_nvfp4, fmt == WeightFormat::Nvfp4) {
                    (true, true) | (false, false) => Ok(()),
                    (true, false) => Err(format!(
                        "is {} but quantization_config (modelopt) quantizes it to nvfp4",
                        fmt.label()
                    )),
                    (false, true) => {
                        Err("is nvfp4 but quantization_config (modelopt) excludes it".into())
                    }
                }
            }
            QuantConfig::Quark {
                global,
                layers,
                exclude,
            } => {
                let want = if exclude.iter().any(|p| module_matches(p, base)) {
                    None
                } else if let Some((_, d)) = layers.iter().find(|(p, _)| module_matches(p, base)) {
                    *d
                } else {
                    *global
                };
                match (want, fmt) {
                    (None, f) if !f.is_quantized() => Ok(()),
                    (Some(QuarkDtype::Fp4), WeightFormat::Mxfp4) => Ok(()),
                    (Some(QuarkDtype::Fp8), f) if f.is_mxfp8() => Ok(()),
                    (None, f) => Err(format!(
                        "is {} but quantization_config (quark) leaves it unquantized",
                        f.label()
                    )),
                    (Some(QuarkDtype::Fp4), f) => Err(format!(
                        "is {} but quantization_config (quark) says mxfp4",
                        f.label()
                    )),
                    (Some(QuarkDtype::Fp8), f) => Err(format!(
                        "is {} but quantization_config (quark) says mxfp8",
                        f.label()
                    )),
                }
            }
        }
    }
}

/// Does a config pattern name module `base`? Patterns are globs (`*`, `?`)
/// or plain module names; both are tried against the name with and without
/// `language_model.`, as a full match or as a dotted suffix (`lm_head`
/// matches `language_model.lm_head`). A `re:` prefix is a regex in Quark;
/// it is approximated by treating `.*` as `*`.
pub fn module_matches(pattern: &str, base: &str) -> bool {
    let pat_owned;
    let pat = match pattern.strip_prefix("re:") {
        Some(r) => {
            pat_owned = r.replace(".*", "*").replace("\\.", ".");
            pat_owned.as_str()
        }
        None => pattern,
    };
    let short = base.strip_prefix(LM_PREFIX).unwrap_or(base);
    for cand in [base, short] {
        if glob(pat.as_bytes(), cand.as_bytes()) {
            return true;
        }
        if !pat.contains('*') && !pat.contains('?') && cand.ends_with(pat) {
            let cut = cand.len() - pat.len();
            if cut == 0 || cand.as_bytes()[cut - 1] == b'.' {
                return true;
            }
        }
    }
    false
}

/// Iterative glob match (`*` any run, `?` one byte), linear-ish, no recursion.
fn glob(p: &[u8], s: &[u8]) -> bool {
    let (mut pi, mut si) = (0usize, 0usize);
    let (mut star, mut mark) = (None::<usize>, 0usize);
    while si < s.len() {
        if pi < p.len() && (p[pi] == b'?' || p[pi] == s[si]) {
            pi += 1;
            si += 1;
        } else if pi < p.len() && p[pi] == b'*' {
            star = Some(pi);
            mark = si;
            pi += 1;
        } else if let Some(st) = star {
            pi = st + 1;
            mark += 1;
            si = mark;
        } else {
            return false;
        }
    }
    while pi < p.len() && p[pi] == b'*' {
        pi += 1;
    }
    pi == p.len()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn globs() {
        assert!(module_matches(
            "*experts*",
            "language_model.model.layers.3.block_sparse_moe.experts.1.w1"
        ));
        assert!(module_matches("lm_head", "language_model.lm_head"));
        assert!(!module_matches("lm_head", "language_model.not_lm_head"));
        assert!(module_matches(
            "model.layers.*.self_attn*",
            "language_model.model.layers.0.self_attn.q_proj"
        ));
        assert!(!module_matches(
            "*.mlp.*",
            "model.layers.0.self_attn.q_proj"
        ));
        assert!(module_matches(
            "re:.*self_attn.*",
            "model.layers.0.self_attn.q_proj"
        ));
    }

    #[test]
    fn quark_expectations() {
        let q = QuantConfig::parse(Some(&json!({
            "quant_method": "quark",
            "global_quant_config": {"weight": {"dtype": "fp4", "qscheme": "per_group", "group_size": 32, "scale_format": "e8m0"}, "input_tensors": null},
            "layer_quant_config": {"*self_attn*": {"weight": {"dtype": "fp8_e4m3", "group_size": 32}}},
            "exclude": ["lm_head", "*block_sparse_moe.gate", "*shared_experts*"]
        })))
        .unwrap();
        let e = "model.layers.1.block_sparse_moe.experts.0.w1";
        assert!(q.check(e, WeightFormat::Mxfp4).is_ok());
        assert!(q.check(e, WeightFormat::Nvfp4).is_err());
        assert!(q.check(e, WeightFormat::Bf16).is_err());
        let a = "model.layers.1.self_attn.q_proj";
        assert!(q.check(a, WeightFormat::Mxfp8E4M3).is_ok());
        assert!(q.check(a, WeightFormat::Mxfp4).is_err());
        assert!(q.check("lm_head", WeightFormat::Bf16).is_ok());
        assert!(q.check("lm_head", WeightFormat::Mxfp8E4M3).is_err());
    }

    #[test]
    fn modelopt_and_fp8_expectations() {
        let m = QuantConfig::parse(Some(&json!({
            "quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16,
            "exclude_modules": ["*self_attn*", "lm_head"]
        })))
        .unwrap();
        assert!(m
            .check(
                "model.layers.1.block_sparse_moe.experts.0.w1",
                WeightFormat::Nvfp4
            )
            .is_ok());
        assert!(m
            .check(
                "model.layers.1.block_sparse_moe.experts.0.w1",
                WeightFormat::Mxfp4
            )
            .is_err());
        assert!(m
            .check("model.layers.1.self_attn.q_proj", WeightFormat::Mxfp8E4M3)
            .is_ok());
        assert!(m
            .check("model.layers.1.self_attn.q_proj", WeightFormat::Nvfp4)
            .is_err());
        let f = QuantConfig::parse(Some(
            &json!({"quant_method": "fp8", "weight_block_size": [1, 32], "scale_fmt": "ue8m0"}),
        ))
        .unwrap();
        assert!(f.check("x", WeightFormat::Mxfp8E4M3).is_ok());
        assert!(f.check("x", WeightFormat::Bf16).is_ok());
        assert!(f.check("x", WeightFormat::Mxfp4).is_err());
        assert!(QuantConfig::parse(Some(&json!({"quant_method": "gptq"}))).is_err());
        assert!(QuantConfig::parse(Some(
            &json!({"quant_method": "fp8", "weight_block_size": [128, 128]})
        ))
        .is_err());
    }
}
