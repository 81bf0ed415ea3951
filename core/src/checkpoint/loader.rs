//! `Checkpoint`: a checkpoint directory opened, indexed, validated and
//! turned into typed [`ModelWeights`].
//!
//! Order of work, so a bad file fails fast and clearly:
//! 1. `open`: read `config.json` (model config + `quantization_config`),
//!    the shard index (or a lone `model.safetensors`), map every shard and
//!    validate its header; cross-check index and headers.
//! 2. `validate`: for every tensor the config needs, detect its format from
//!    the tensors present, check it against `quantization_config`, and check
//!    every dtype and shape (weights and scales) against the config. Nothing
//!    is decoded yet.
//! 3. `load`: copy the bytes into the typed weights (optionally converting
//!    NVFP4 routed experts to MXFP4, or MXFP8 to bf16 losslessly).
//!
//! The lower-level API (`tensors`, `info`, `raw_bytes`, `detect_format`)
//! serves tools such as `m3 inspect` and `m3 convert` that stream tensors.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::string::{String, ToString};
use std::vec::Vec;

use serde_json::Value;

use super::index::{parse_index, ShardIndex, INDEX_FILE, SINGLE_FILE};
use super::names::{
    self, Family, TensorNames, INPUT_SCALE, WEIGHT_SCALE, WEIGHT_SCALE_2, WEIGHT_SCALE_INV,
};
use super::quant_config::{QuantConfig, WeightFormat};
use super::safetensors_file::{Dtype, SafetensorsFile, TensorInfo};
use super::{online, CheckpointError};
use crate::config::{AttnKind, MlpKind, ModelConfig};
use crate::formats::convert::PtpcFp8;
use crate::formats::{convert, MxElem, MxTensor, Nvfp4Tensor, ScaleRule};
use crate::weights::{
    AttnWeights, FfnWeights, IndexerWeights, LayerWeights, LinearWeight, MlpWeights, ModelWeights,
    MoeWeights,
};

/// Load-time conversions (all off by default: weights are kept as stored).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LoadOptions {
    /// Convert NVFP4 routed experts to MXFP4 with this scale rule (lossy;
    /// FORMATS.md recommends `Even`).
    pub nvfp4_experts_to_mxfp4: Option<ScaleRule>,
    /// Convert every MXFP8 weight to bf16 losslessly: a block whose scale
    /// byte is NaN or outside the exact range is refused, naming the tensor
    /// and block.
    pub mxfp8_to_bf16_exact: bool,
    /// Online quantization (ARCHITECTURE.md, *Online quantization*): PTPC
    /// FP8 forms of the attention and dense-MLP linears, made after the
    /// stored weights are loaded (a host load only: [`Checkpoint::stored_linear`]
    /// refuses its targets, since a stored form cannot carry them).
    pub online_quant: Option<super::online::OnlineQuant>,
}

/// One linear weight in its stored format: borrowed from the mapped shards,
/// or owned after a load-time conversion.
#[derive(Clone, Debug, PartialEq)]
pub enum StoredLinear<'a> {
    Borrowed {
        format: WeightFormat,
        rows: usize,
        cols: usize,
        /// Element codes (bf16 / f32 values for the plain formats), as stored.
        codes: &'a [u8],
        /// Block scales (E8M0 for MX, E4M3 for NVFP4); empty for bf16 / f32.
        scales: &'a [u8],
        /// NVFP4 global scale (1.0 otherwise).
        global: f32,
    },
    Owned(LinearWeight),
}

impl StoredLinear<'_> {
    /// The `[rows, cols]` shape.
    pub fn shape(&self) -> (usize, usize) {
        match self {
            StoredLinear::Borrowed { rows, cols, .. } => (*rows, *cols),
            StoredLinear::Owned(w) => (w.rows(), w.cols()),
        }
    }

    /// Check that codes and scales have the lengths the shape needs.
    fn check_sizes(&self) -> Result<(), crate::formats::FormatError> {
        match self {
            StoredLinear::Owned(_) => Ok(()),
            StoredLinear::Borrowed {
                format,
                rows,
                cols,
                codes,
                scales,
                ..
            } => {
                let n = rows * cols;
                let (want_codes, want_scales) = match format {
                    WeightFormat::Bf16 => (2 * n, 0),
                    WeightFormat::F32 => (4 * n, 0),
                    WeightFormat::Mxfp4 => (n / 2, n / 32),
                    WeightFormat::Mxfp8E4M3 | WeightFormat::Mxfp8E5M2 => (n, n / 32),
                    WeightFormat::Nvfp4 => (n / 2, n / 16),
                };
                for (what, got, expected) in [
                    ("element codes", codes.len(), want_codes),
                    ("block scales", scales.len(), want_scales),
                ] {
                    if got != expected {
                        return Err(crate::formats::FormatError::BadLength {
                            what,
                            rows: *rows,
                            cols: *cols,
                            expected,
                            got,
                        });
                    }
                }
                Ok(())
            }
        }
    }

    /// A host copy in the typed form.
    pub fn into_owned(self) -> Result<LinearWeight, crate::formats::FormatError> {
        let StoredLinear::Borrowed {
            format,
            rows,
            cols,
            codes,
            scales,
            global,
        } = self
        else {
            let StoredLinear::Owned(w) = self else {
                unreachable!()
            };
            return Ok(w);
        };
        Ok(match format {
            WeightFormat::Bf16 => LinearWeight::Bf16 {
                rows,
                cols,
                data: u16s(codes),
            },
            WeightFormat::F32 => LinearWeight::F32 {
                rows,
                cols,
                data: f32s(codes),
            },
            WeightFormat::Mxfp4 => LinearWeight::Mx(MxTensor::from_parts(
                MxElem::Fp4E2M1,
                rows,
                cols,
                codes.to_vec(),
                scales.to_vec(),
            )?),
            WeightFormat::Mxfp8E4M3 | WeightFormat::Mxfp8E5M2 => {
                let elem = if format == WeightFormat::Mxfp8E4M3 {
                    MxElem::Fp8E4M3
                } else {
                    MxElem::Fp8E5M2
                };
                LinearWeight::Mx(MxTensor::from_parts(
                    elem,
                    rows,
                    cols,
                    codes.to_vec(),
                    scales.to_vec(),
                )?)
            }
            WeightFormat::Nvfp4 => LinearWeight::Nvfp4(Nvfp4Tensor::from_parts(
                rows,
                cols,
                codes.to_vec(),
                scales.to_vec(),
                global,
            )?),
        })
    }
}

/// One tensor of the checkpoint as listed by the index (or the lone file).
#[derive(Clone, Debug, PartialEq)]
pub struct TensorEntry {
    pub name: String,
    /// Shard file name (relative to the checkpoint directory).
    pub file: String,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    pub nbytes: usize,
    pub family: Family,
}

/// What the config expects of one linear weight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Allowed {
    /// Any stored format (checked against `quantization_config`).
    Any,
    /// bf16 or f32 only (embeddings, router).
    Plain,
}

/// An opened, header-validated checkpoint directory.
pub struct Checkpoint {
    dir: PathBuf,
    config: ModelConfig,
    config_json: Value,
    quant: QuantConfig,
    names: TensorNames,
    shards: Vec<SafetensorsFile>,
    /// Tensor name -> (shard, index into that shard's header).
    map: BTreeMap<String, (usize, usize)>,
    vision_skipped: usize,
    warnings: Vec<String>,
}

fn read_file(path: &Path) -> Result<Vec<u8>, CheckpointError> {
    std::fs::read(path).map_err(|e| CheckpointError::io(path, e))
}

impl Checkpoint {
    /// Open a checkpoint directory (see the module doc, step 1).
    pub fn open(dir: impl AsRef<Path>) -> Result<Checkpoint, CheckpointError> {
        let dir = dir.as_ref().to_path_buf();
        if !dir.is_dir() {
            return Err(CheckpointError::Io {
                path: dir.display().to_string(),
                why: "not a directory".into(),
            });
        }
        // config.json
        let cfg_path = dir.join("config.json");
        let cfg_bytes = read_file(&cfg_path)?;
        let config_json: Value =
            serde_json::from_slice(&cfg_bytes).map_err(|e| CheckpointError::Config {
                file: "config.json".into(),
                why: format!("not valid JSON: {e}"),
            })?;
        let config = ModelConfig::from_json_value(&config_json).map_err(|e| {
            let msg = e.to_string();
            CheckpointError::Config {
                file: "config.json".into(),
                why: msg.strip_prefix("config: ").unwrap_or(&msg).to_string(),
            }
        })?;
        let qc = config_json.get("quantization_config").or_else(|| {
            config_json
                .get("text_config")
                .and_then(|t| t.get("quantization_config"))
        });
        let quant = QuantConfig::parse(qc)?;

        // Index or lone file.
        let mut warnings = Vec::new();
        let index_path = dir.join(INDEX_FILE);
        let index = if index_path.exists() {
            Some(parse_index(INDEX_FILE, &read_file(&index_path)?)?)
        } else if dir.join(SINGLE_FILE).exists() {
            None
        } else {
            return Err(CheckpointError::file(
                dir.display().to_string(),
                format!("neither {INDEX_FILE} nor {SINGLE_FILE} is present"),
            ));
        };
        let shard_names = match &index {
            Some(ix) => ix.shards(),
            None => alloc_vec(SINGLE_FILE),
        };
        let mut shards = Vec::with_capacity(shard_names.len());
        for s in &shard_names {
            let p = dir.join(s);
            if !p.is_file() {
                return Err(CheckpointError::file(
                    INDEX_FILE,
                    format!(
                        "names shard `{s}`, which does not exist in {}",
                        dir.display()
                    ),
                ));
            }
            shards.push(SafetensorsFile::open(&p, s)?);
        }
        let mut map = BTreeMap::new();
        match &index {
            Some(ix) => {
                let shard_pos: BTreeMap<&str, usize> = shard_names
                    .iter()
                    .enumerate()
                    .map(|(i, s)| (s.as_str(), i))
                    .collect();
                for (t, s) in &ix.weight_map {
                    let si = *shard_pos.get(s.as_str()).ok_or_else(|| {
                        CheckpointError::tensor(
                            INDEX_FILE,
                            t.as_str(),
                            format!("shard `{s}` was not opened"),
                        )
                    })?;
                    let ti = shards[si].position(t).ok_or_else(|| {
                        CheckpointError::tensor(
                            s.as_str(),
                            t.as_str(),
                            format!("is listed in {INDEX_FILE} but not in the shard"),
                        )
                    })?;
                    map.insert(t.clone(), (si, ti));
                }
                for sh in &shards {
                    let extra = sh
                        .header
                        .tensors
                        .iter()
                        .filter(|t| !ix.weight_map.contains_key(&t.name))
                        .count();
                    if extra > 0 {
                        warnings.push(format!(
                            "{}: {extra} tensors are not in {INDEX_FILE} (ignored)",
                            sh.name
                        ));
                    }
                }
                check_unused_shards(&dir, &shard_names, &mut warnings);
                check_total_size(ix, &shards, &map, &mut warnings);
            }
            None => {
                for (ti, t) in shards[0].header.tensors.iter().enumerate() {
                    map.insert(t.name.clone(), (0, ti));
                }
            }
        }
        for sh in &shards {
            if sh.header.unused_bytes > 0 {
                warnings.push(format!(
                    "{}: {} bytes of the data area belong to no tensor",
                    sh.name, sh.header.unused_bytes
                ));
            }
        }
        let vision_skipped = map.keys().filter(|n| names::is_vision(n)).count();
        if vision_skipped > 0 {
            tracing::info!(
                "skipping {vision_skipped} vision tower / projector tensors (out of scope)"
            );
        }
        let prefixed = map.keys().any(|n| n.starts_with(names::LM_PREFIX));
        let ckpt = Checkpoint {
            dir,
            config,
            config_json,
            quant,
            names: TensorNames::new(prefixed),
            shards,
            map,
            vision_skipped,
            warnings,
        };
        Ok(ckpt)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }
    /// The parsed `config.json` as written (for tools that copy it).
    pub fn config_json(&self) -> &Value {
        &self.config_json
    }
    pub fn quant_config(&self) -> &QuantConfig {
        &self.quant
    }
    /// The name layout this checkpoint uses (with or without `language_model.`).
    pub fn names(&self) -> TensorNames {
        self.names
    }
    /// Shard file names, sorted.
    pub fn shard_names(&self) -> Vec<&str> {
        self.shards.iter().map(|s| s.name.as_str()).collect()
    }
    /// Number of vision tensors that loading skips.
    pub fn vision_skipped(&self) -> usize {
        self.vision_skipped
    }
    /// Oddities found while opening (unused shards, tensors outside the
    /// index, holes in a data area, index size mismatch).
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// Every tensor of the index (vision ones included, family `Vision`), by name.
    pub fn tensors(&self) -> Vec<TensorEntry> {
        self.map
            .iter()
            .map(|(name, &(si, ti))| {
                let t = &self.shards[si].header.tensors[ti];
                TensorEntry {
                    name: name.clone(),
                    file: self.shards[si].name.clone(),
                    dtype: t.dtype,
                    shape: t.shape.clone(),
                    nbytes: t.nbytes(),
                    family: Family::of(name),
                }
            })
            .collect()
    }

    /// Whether the checkpoint has `name`.
    pub fn contains(&self, name: &str) -> bool {
        self.map.contains_key(name)
    }

    /// The header entry of `name` and its shard's name.
    pub fn info(&self, name: &str) -> Option<(&TensorInfo, &str)> {
        self.map.get(name).map(|&(si, ti)| {
            (
                &self.shards[si].header.tensors[ti],
                self.shards[si].name.as_str(),
            )
        })
    }

    /// The raw little-endian bytes of one tensor (straight from the map).
    pub fn raw_bytes(&self, name: &str) -> Result<&[u8], CheckpointError> {
        let &(si, ti) = self.map.get(name).ok_or_else(|| CheckpointError::Missing {
            tensor: name.into(),
            why: "not in the index".into(),
        })?;
        let sh = &self.shards[si];
        Ok(sh.bytes(&sh.header.tensors[ti]))
    }

    fn shard_of(&self, name: &str) -> String {
        self.info(name)
            .map(|(_, f)| f.to_string())
            .unwrap_or_else(|| "checkpoint".into())
    }

    fn terr(&self, name: &str, why: impl Into<String>) -> CheckpointError {
        CheckpointError::tensor(self.shard_of(name), name, why)
    }

    /// Detect the stored format of the linear weight `weight_name` (ending in
    /// `.weight`) from the tensors beside it (MODEL.md section 7), checking
    /// the dtypes of every part. Shapes are checked by [`Self::check_linear`].
    pub fn detect_format(&self, weight_name: &str) -> Result<WeightFormat, CheckpointError> {
        let (w, _) = self
            .info(weight_name)
            .ok_or_else(|| CheckpointError::Missing {
                tensor: weight_name.into(),
                why: "weight not found".into(),
            })?;
        let sib = |s: &str| self.info(&names::sibling(weight_name, s)).map(|(t, _)| t);
        let (s, s_inv, s2) = (
            sib(WEIGHT_SCALE),
            sib(WEIGHT_SCALE_INV),
            sib(WEIGHT_SCALE_2),
        );
        let is_e8m0 = |t: &TensorInfo| matches!(t.dtype, Dtype::U8 | Dtype::F8E8M0);
        let scale_name = |s: &str| names::sibling(weight_name, s);
        if let Some(s2t) = s2 {
            // NVFP4.
            if w.dtype != Dtype::U8 {
                return Err(self.terr(
                    weight_name,
                    format!(
                        "dtype {} but NVFP4 (weight_scale_2 present) needs U8",
                        w.dtype
                    ),
                ));
            }
            let st = s.ok_or_else(|| CheckpointError::Missing {
                tensor: scale_name(WEIGHT_SCALE),
                why: "NVFP4 weight (weight_scale_2 present) needs its E4M3 block scales".into(),
            })?;
            if st.dtype != Dtype::F8E4M3 {
                return Err(self.terr(
                    &scale_name(WEIGHT_SCALE),
                    format!("dtype {} but NVFP4 block scales are F8_E4M3", st.dtype),
                ));
            }
            if s2t.dtype != Dtype::F32 || s2t.numel() != 1 {
                return Err(self.terr(
                    &scale_name(WEIGHT_SCALE_2),
                    format!(
                        "{} {:?} but the NVFP4 global scale is one F32",
                        s2t.dtype, s2t.shape
                    ),
                ));
            }
            if s_inv.is_some() {
                return Err(self.terr(
                    &scale_name(WEIGHT_SCALE_INV),
                    "unexpected beside an NVFP4 weight",
                ));
            }
            return Ok(WeightFormat::Nvfp4);
        }
        let unexpected_input_scale = |f: WeightFormat| -> Result<WeightFormat, CheckpointError> {
            match sib(INPUT_SCALE) {
                Some(_) => Err(self.terr(
                    &scale_name(INPUT_SCALE),
                    format!("unexpected beside a {} weight", f.label()),
                )),
                None => Ok(f),
            }
        };
        match (w.dtype, s, s_inv) {
            (Dtype::U8, Some(st), None) => {
                if !is_e8m0(st) {
                    return Err(self.terr(
                        &scale_name(WEIGHT_SCALE),
                        format!("dtype {} but MXFP4 scales are U8 (E8M0)", st.dtype),
                    ));
                }
                unexpected_input_scale(WeightFormat::Mxfp4)
            }
            (Dtype::F8E4M3 | Dtype::F8E5M2, None, Some(st)) => {
                if !is_e8m0(st) {
                    return Err(self.terr(
                        &scale_name(WEIGHT_SCALE_INV),
                        format!("dtype {} but MXFP8 scales are U8 (E8M0)", st.dtype),
                    ));
                }
                let f = if w.dtype == Dtype::F8E4M3 {
                    WeightFormat::Mxfp8E4M3
                } else {
                    WeightFormat::Mxfp8E5M2
                };
                unexpected_input_scale(f)
            }
            (Dtype::BF16, None, None) => unexpected_input_scale(WeightFormat::Bf16),
            (Dtype::F32, None, None) => unexpected_input_scale(WeightFormat::F32),
            (Dtype::BF16 | Dtype::F32, _, _) => Err(self.terr(
                weight_name,
                format!("{} weight has scale tensors beside it", w.dtype),
            )),
            (Dtype::U8, None, _) => Err(self.terr(
                weight_name,
                "U8 weight without weight_scale (MXFP4) or weight_scale_2 (NVFP4)",
            )),
            (Dtype::F8E4M3 | Dtype::F8E5M2, _, None) => Err(self.terr(
                weight_name,
                format!("{} weight without weight_scale_inv (MXFP8 scales)", w.dtype),
            )),
            (d, _, _) => Err(self.terr(
                weight_name,
                format!("dtype {d} with these scales is no known weight format"),
            )),
        }
    }

    /// The logical `[rows, cols]` of a linear weight (unpacking FP4).
    pub fn logical_shape(
        &self,
        weight_name: &str,
    ) -> Result<(usize, usize, WeightFormat), CheckpointError> {
        let f = self.detect_format(weight_name)?;
        let (w, _) = self
            .info(weight_name)
            .ok_or_else(|| CheckpointError::Missing {
                tensor: weight_name.into(),
                why: "weight not found".into(),
            })?;
        if w.shape.len() != 2 {
            return Err(self.terr(weight_name, format!("shape {:?} is not 2-D", w.shape)));
        }
        let per_byte = if matches!(f, WeightFormat::Mxfp4 | WeightFormat::Nvfp4) {
            2
        } else {
            1
        };
        Ok((w.shape[0], w.shape[1] * per_byte, f))
    }

    /// Check one linear weight against the `[rows, cols]` the config wants:
    /// format (and `quantization_config`), and the dtype and shape of the
    /// weight and every scale tensor.
    fn check_linear(
        &self,
        name: &str,
        rows: usize,
        cols: usize,
        allowed: Allowed,
    ) -> Result<WeightFormat, CheckpointError> {
        if !self.contains(name) {
            return Err(CheckpointError::Missing {
                tensor: name.into(),
                why: format!("config wants [{rows}, {cols}]"),
            });
        }
        let f = self.detect_format(name)?;
        if allowed == Allowed::Plain && f.is_quantized() {
            return Err(self.terr(name, format!("is {} but must be bf16 or f32", f.label())));
        }
        // Embeddings and routers are never quantized (MODEL.md section 5), so
        // `quantization_config` patterns (which target linear layers and
        // often omit them from `exclude`) are not consulted for them.
        let base = name.strip_suffix(".weight").unwrap_or(name);
        if allowed == Allowed::Any {
            if let Err(why) = self.quant.check(base, f) {
                return Err(self.terr(name, why));
            }
        }
        let (block, packed_cols) = match f {
            WeightFormat::Mxfp4 => (32, cols / 2),
            WeightFormat::Nvfp4 => (16, cols / 2),
            WeightFormat::Mxfp8E4M3 | WeightFormat::Mxfp8E5M2 => (32, cols),
            WeightFormat::Bf16 | WeightFormat::F32 => (1, cols),
        };
        if !cols.is_multiple_of(block) {
            return Err(self.terr(
                name,
                format!(
                    "input dimension {cols} is not a multiple of the {} block size {block}",
                    f.label()
                ),
            ));
        }
        self.check_shape(name, &[rows, packed_cols], f.label())?;
        match f {
            WeightFormat::Mxfp4 => self.check_shape(
                &names::sibling(name, WEIGHT_SCALE),
                &[rows, cols / 32],
                "E8M0 scales",
            )?,
            WeightFormat::Mxfp8E4M3 | WeightFormat::Mxfp8E5M2 => self.check_shape(
                &names::sibling(name, WEIGHT_SCALE_INV),
                &[rows, cols / 32],
                "E8M0 scales",
            )?,
            WeightFormat::Nvfp4 => {
                self.check_shape(
                    &names::sibling(name, WEIGHT_SCALE),
                    &[rows, cols / 16],
                    "E4M3 scales",
                )?;
                let is = names::sibling(name, INPUT_SCALE);
                if let Some((t, _)) = self.info(&is) {
                    if t.numel() != 1 || t.dtype != Dtype::F32 {
                        return Err(self.terr(
                            &is,
                            format!("{} {:?} but input_scale is one F32", t.dtype, t.shape),
                        ));
                    }
                }
            }
            WeightFormat::Bf16 | WeightFormat::F32 => {}
        }
        Ok(f)
    }

    fn check_shape(&self, name: &str, want: &[usize], what: &str) -> Result<(), CheckpointError> {
        let (t, _) = self.info(name).ok_or_else(|| CheckpointError::Missing {
            tensor: name.into(),
            why: format!("{what} {want:?}"),
        })?;
        if t.shape != want {
            return Err(self.terr(
                name,
                format!("shape {:?} but the config wants {want:?} ({what})", t.shape),
            ));
        }
        Ok(())
    }

    /// A vector (norm weight, bias) of `len`, BF16 or F32 (`f32_only`: F32).
    fn check_vector(&self, name: &str, len: usize, f32_only: bool) -> Result<(), CheckpointError> {
        let (t, _) = self.info(name).ok_or_else(|| CheckpointError::Missing {
            tensor: name.into(),
            why: format!("config wants [{len}]"),
        })?;
        let ok_dtype = if f32_only {
            t.dtype == Dtype::F32
        } else {
            matches!(t.dtype, Dtype::F32 | Dtype::BF16)
        };
        if !ok_dtype {
            let want = if f32_only { "F32" } else { "BF16 or F32" };
            return Err(self.terr(name, format!("dtype {} but must be {want}", t.dtype)));
        }
        if t.shape != [len] {
            return Err(self.terr(
                name,
                format!("shape {:?} but the config wants [{len}]", t.shape),
            ));
        }
        Ok(())
    }

    /// An optional F32 scalar (KV-cache scales).
    fn check_scalar_opt(&self, name: &str) -> Result<(), CheckpointError> {
        if let Some((t, _)) = self.info(name) {
            if t.numel() != 1 || !matches!(t.dtype, Dtype::F32 | Dtype::BF16) {
                return Err(self.terr(
                    name,
                    format!("{} {:?} but must be one F32", t.dtype, t.shape),
                ));
            }
        }
        Ok(())
    }

    /// Every tensor the config needs, with what it must be. The single
    /// source for `validate`, `load` and `unused_tensors`.
    fn plan(&self) -> Vec<Need> {
        let c = &self.config;
        let (h, n) = (c.hidden_size, self.names);
        let mut v = vec![
            Need::Linear(n.embed(), c.vocab_size, h, Allowed::Plain),
            Need::Vector(n.final_norm(), h, false),
            Need::Linear(n.lm_head(), c.vocab_size, h, Allowed::Any),
        ];
        let qd = c.num_attention_heads * c.head_dim;
        let kvd = c.num_key_value_heads * c.head_dim;
        for l in 0..c.num_hidden_layers {
            let ln = n.layer(l);
            v.push(Need::Vector(ln.input_layernorm(), h, false));
            v.push(Need::Vector(ln.post_attention_layernorm(), h, false));
            v.push(Need::Linear(ln.q_proj(), qd, h, Allowed::Any));
            v.push(Need::Linear(ln.k_proj(), kvd, h, Allowed::Any));
            v.push(Need::Linear(ln.v_proj(), kvd, h, Allowed::Any));
            v.push(Need::Linear(ln.o_proj(), h, qd, Allowed::Any));
            v.push(Need::Vector(ln.q_norm(), c.head_dim, false));
            v.push(Need::Vector(ln.k_norm(), c.head_dim, false));
            v.push(Need::Scalar(ln.k_scale()));
            v.push(Need::Scalar(ln.v_scale()));
            if c.attn_kinds[l] == AttnKind::Sparse {
                let di = c.index_head_dim;
                v.push(Need::Linear(
                    ln.index_q_proj(),
                    c.index_n_heads * di,
                    h,
                    Allowed::Any,
                ));
                v.push(Need::Linear(ln.index_k_proj(), di, h, Allowed::Any));
                v.push(Need::Vector(ln.index_q_norm(), di, false));
                v.push(Need::Vector(ln.index_k_norm(), di, false));
                v.push(Need::Scalar(ln.index_k_scale()));
            }
            let mlp = |m: names::MlpNames, w: usize, v: &mut Vec<Need>| {
                v.push(Need::Linear(m.gate(), w, h, Allowed::Any));
                v.push(Need::Linear(m.up(), w, h, Allowed::Any));
                v.push(Need::Linear(m.down(), h, w, Allowed::Any));
            };
            match c.mlp_kinds[l] {
                MlpKind::Dense => mlp(ln.dense_mlp(), c.dense_intermediate_size, &mut v),
                MlpKind::Moe => {
                    v.push(Need::Linear(
                        ln.router(),
                        c.num_local_experts,
                        h,
                        Allowed::Plain,
                    ));
                    v.push(Need::Vector(
                        ln.correction_bias(),
                        c.num_local_experts,
                        false,
                    ));
                    for e in 0..c.num_local_experts {
                        mlp(ln.expert(e), c.intermediate_size, &mut v);
                    }
                    if c.shared_intermediate_size > 0 {
                        mlp(ln.shared_expert(), c.shared_intermediate_size, &mut v);
                    }
                }
            }
        }
        v
    }

    /// Step 2 of the module doc: check every tensor the config needs
    /// (presence, format, `quantization_config`, dtypes, shapes of weights
    /// and scales) without decoding anything.
    pub fn validate(&self) -> Result<(), CheckpointError> {
        for need in self.plan() {
            match need {
                Need::Linear(name, r, c, a) => {
                    self.check_linear(&name, r, c, a)?;
                }
                Need::Vector(name, len, f32_only) => self.check_vector(&name, len, f32_only)?,
                Need::Scalar(name) => self.check_scalar_opt(&name)?,
            }
        }
        Ok(())
    }

    /// Text tensors in the index that the config does not use (e.g. index
    /// tensors on a full-attention layer, experts past `num_local_experts`).
    /// Vision tensors are not listed (they are skipped by design).
    pub fn unused_tensors(&self) -> Vec<String> {
        let mut used = BTreeSet::new();
        for need in self.plan() {
            let name = match need {
                Need::Linear(n, ..) => {
                    for s in [WEIGHT_SCALE, WEIGHT_SCALE_INV, WEIGHT_SCALE_2, INPUT_SCALE] {
                        used.insert(names::sibling(&n, s));
                    }
                    n
                }
                Need::Vector(n, ..) | Need::Scalar(n) => n,
            };
            used.insert(name);
        }
        self.map
            .keys()
            .filter(|n| !names::is_vision(n) && !used.contains(*n))
            .cloned()
            .collect()
    }

    /// Validate, then build the typed weights (step 3 of the module doc).
    pub fn load(&self, opts: &LoadOptions) -> Result<ModelWeights, CheckpointError> {
        let mut w = self.load_stored(&LoadOptions {
            online_quant: None,
            ..*opts
        })?;
        if let Some(oq) = &opts.online_quant {
            online::apply(&mut w, self.names, oq).map_err(|e| self.online_err(e))?;
        }
        Ok(w)
    }

    /// An online-quantization error as a checkpoint error: naming the
    /// tensor's shard and the tensor where it has one.
    fn online_err(&self, e: online::OnlineQuantError) -> CheckpointError {
        match e.tensor() {
            Some(t) => CheckpointError::tensor(self.shard_of(t), t, e.to_string()),
            None => CheckpointError::Config {
                file: "online quantization".into(),
                why: e.to_string(),
            },
        }
    }

    /// The linears `opts` converts by online quantization (none without
    /// it), checking the exclusion patterns: a streaming loader calls it
    /// once before [`Self::online_linear`], as [`Self::load`] does.
    pub fn online_targets(
        &self,
        opts: &LoadOptions,
    ) -> Result<Vec<online::Target>, CheckpointError> {
        match &opts.online_quant {
            Some(oq) => {
                online::targets(&self.config, self.names, oq).map_err(|e| self.online_err(e))
            }
            None => Ok(Vec::new()),
        }
    }

    /// The PTPC FP8 form of linear `name` (`[rows, cols]`) when `opts`
    /// converts it at load (ARCHITECTURE.md, *Online quantization*), made
    /// from its exact stored values like [`Self::load`] makes it; `None`
    /// when it is not a target. For a streaming (device) loader, which
    /// then never asks [`Self::stored_linear`] for it.
    pub fn online_linear(
        &self,
        name: &str,
        rows: usize,
        cols: usize,
        opts: &LoadOptions,
    ) -> Result<Option<PtpcFp8>, CheckpointError> {
        let Some(oq) = &opts.online_quant else {
            return Ok(None);
        };
        if !online::is_target(&self.config, self.names, oq, name) {
            return Ok(None);
        }
        let plain = LoadOptions {
            online_quant: None,
            ..*opts
        };
        let w = self
            .stored_linear(name, rows, cols, false, &plain)?
            .into_owned()
            .map_err(|e| self.terr(name, e.to_string()))?;
        online::quantize_weight(name, &w)
            .map(Some)
            .map_err(|e| self.online_err(e))
    }

    /// [`Checkpoint::load`] without online quantization.
    fn load_stored(&self, opts: &LoadOptions) -> Result<ModelWeights, CheckpointError> {
        self.validate()?;
        let unused = self.unused_tensors();
        if !unused.is_empty() {
            tracing::warn!(
                "{} tensors in the index are not used by the config (first: {})",
                unused.len(),
                unused[0]
            );
        }
        let c = &self.config;
        let (h, n) = (c.hidden_size, self.names);
        let qd = c.num_attention_heads * c.head_dim;
        let kvd = c.num_key_value_heads * c.head_dim;
        let lin = |name: &str, rows: usize, cols: usize, kind: Role| {
            self.linear(name, rows, cols, kind, opts)
        };
        let mlp =
            |m: names::MlpNames, w: usize, role: Role| -> Result<MlpWeights, CheckpointError> {
                Ok(MlpWeights {
                    gate: lin(&m.gate(), w, h, role)?,
                    up: lin(&m.up(), w, h, role)?,
                    down: lin(&m.down(), h, w, role)?,
                })
            };
        let mut layers = Vec::with_capacity(c.num_hidden_layers);
        for l in 0..c.num_hidden_layers {
            let ln = n.layer(l);
            let indexer = if c.attn_kinds[l] == AttnKind::Sparse {
                let di = c.index_head_dim;
                Some(IndexerWeights {
                    q: lin(&ln.index_q_proj(), c.index_n_heads * di, h, Role::Other)?,
                    k: lin(&ln.index_k_proj(), di, h, Role::Other)?,
                    q_norm: self.vector(&ln.index_q_norm())?,
                    k_norm: self.vector(&ln.index_k_norm())?,
                    k_scale: self.scalar_or(&ln.index_k_scale(), 1.0)?,
                })
            } else {
                None
            };
            let attn = AttnWeights {
                q: lin(&ln.q_proj(), qd, h, Role::Other)?,
                k: lin(&ln.k_proj(), kvd, h, Role::Other)?,
                v: lin(&ln.v_proj(), kvd, h, Role::Other)?,
                o: lin(&ln.o_proj(), h, qd, Role::Other)?,
                q_norm: self.vector(&ln.q_norm())?,
                k_norm: self.vector(&ln.k_norm())?,
                indexer,
                k_scale: self.scalar_or(&ln.k_scale(), 1.0)?,
                v_scale: self.scalar_or(&ln.v_scale(), 1.0)?,
            };
            let ffn = match c.mlp_kinds[l] {
                MlpKind::Dense => {
                    FfnWeights::Dense(mlp(ln.dense_mlp(), c.dense_intermediate_size, Role::Other)?)
                }
                MlpKind::Moe => {
                    let mut experts = Vec::with_capacity(c.num_local_experts);
                    for e in 0..c.num_local_experts {
                        experts.push(mlp(ln.expert(e), c.intermediate_size, Role::RoutedExpert)?);
                    }
                    let shared = if c.shared_intermediate_size > 0 {
                        Some(mlp(
                            ln.shared_expert(),
                            c.shared_intermediate_size,
                            Role::Other,
                        )?)
                    } else {
                        None
                    };
                    FfnWeights::Moe(MoeWeights {
                        router: lin(&ln.router(), c.num_local_experts, h, Role::Other)?,
                        correction_bias: self.vector(&ln.correction_bias())?,
                        experts,
                        shared,
                    })
                }
            };
            layers.push(LayerWeights {
                input_norm: self.vector(&ln.input_layernorm())?,
                post_attn_norm: self.vector(&ln.post_attention_layernorm())?,
                attn,
                ffn,
                ptpc: Default::default(),
            });
        }
        Ok(ModelWeights {
            config: c.clone(),
            embed: lin(&n.embed(), c.vocab_size, h, Role::Other)?,
            layers,
            final_norm: self.vector(&n.final_norm())?,
            lm_head: lin(&n.lm_head(), c.vocab_size, h, Role::Other)?,
        })
    }

    /// Decode one (validated) linear weight into its typed form (a host
    /// copy).
    fn linear(
        &self,
        name: &str,
        rows: usize,
        cols: usize,
        role: Role,
        opts: &LoadOptions,
    ) -> Result<LinearWeight, CheckpointError> {
        self.stored_linear(name, rows, cols, role == Role::RoutedExpert, opts)?
            .into_owned()
            .map_err(|e| self.terr(name, e.to_string()))
    }

    /// One linear weight as the checkpoint stores it, borrowed from the
    /// mapped shard (no copy), or converted and owned when `opts` asks for
    /// a load-time conversion of it (`routed_expert` says whether the
    /// NVFP4 -> MXFP4 option applies). Sizes are checked against
    /// `[rows, cols]`; call [`Checkpoint::validate`] first for dtypes,
    /// shapes and `quantization_config`.
    pub fn stored_linear(
        &self,
        name: &str,
        rows: usize,
        cols: usize,
        routed_expert: bool,
        opts: &LoadOptions,
    ) -> Result<StoredLinear<'_>, CheckpointError> {
        if let Some(oq) = &opts.online_quant {
            if online::is_target(&self.config, self.names, oq, name) {
                return Err(self.terr(
                    name,
                    format!(
                        "online quantization ({}) converts this linear: a streaming loader \
                         takes it from `online_linear`, not in its stored form",
                        oq.scheme.name()
                    ),
                ));
            }
        }
        let f = self.detect_format(name)?;
        let codes = self.raw_bytes(name)?;
        let fmt_err = |e: crate::formats::FormatError| self.terr(name, e.to_string());
        let (scales, global): (&[u8], f32) = match f {
            WeightFormat::Bf16 | WeightFormat::F32 => (&[], 1.0),
            WeightFormat::Mxfp4 => (self.raw_bytes(&names::sibling(name, WEIGHT_SCALE))?, 1.0),
            WeightFormat::Mxfp8E4M3 | WeightFormat::Mxfp8E5M2 => (
                self.raw_bytes(&names::sibling(name, WEIGHT_SCALE_INV))?,
                1.0,
            ),
            WeightFormat::Nvfp4 => {
                let g_name = names::sibling(name, WEIGHT_SCALE_2);
                let global = f32s(self.raw_bytes(&g_name)?)
                    .first()
                    .copied()
                    .unwrap_or(f32::NAN);
                if !(global.is_finite() && global > 0.0) {
                    return Err(self.terr(
                        &g_name,
                        format!("NVFP4 global scale {global} must be finite and positive"),
                    ));
                }
                (self.raw_bytes(&names::sibling(name, WEIGHT_SCALE))?, global)
            }
        };
        let stored = StoredLinear::Borrowed {
            format: f,
            rows,
            cols,
            codes,
            scales,
            global,
        };
        stored.check_sizes().map_err(fmt_err)?;
        match f {
            WeightFormat::Mxfp8E4M3 | WeightFormat::Mxfp8E5M2 if opts.mxfp8_to_bf16_exact => {
                let t = match stored.into_owned().map_err(fmt_err)? {
                    LinearWeight::Mx(t) => t,
                    _ => unreachable!("an MXFP8 weight decodes to an MX tensor"),
                };
                let data = convert::mxfp8_to_bf16(&t, true)
                    .map_err(|e| self.terr(name, format!("lossless MXFP8 -> bf16 refused: {e}")))?;
                Ok(StoredLinear::Owned(LinearWeight::Bf16 { rows, cols, data }))
            }
            WeightFormat::Nvfp4 if routed_expert && opts.nvfp4_experts_to_mxfp4.is_some() => {
                let rule = opts.nvfp4_experts_to_mxfp4.unwrap_or(ScaleRule::Even);
                let t = match stored.into_owned().map_err(fmt_err)? {
                    LinearWeight::Nvfp4(t) => t,
                    _ => unreachable!("an NVFP4 weight decodes to an NVFP4 tensor"),
                };
                Ok(StoredLinear::Owned(LinearWeight::Mx(
                    convert::try_nvfp4_to_mxfp4(&t, rule)
                        .map_err(|e| self.terr(name, format!("NVFP4 -> MXFP4: {e}")))?,
                )))
            }
            _ => Ok(stored),
        }
    }

    /// Drop the resident pages of linear `name` and its scale tensors (see
    /// [`SafetensorsFile::release`]): a streaming loader calls it once a
    /// tensor is on the device.
    pub fn release(&self, name: &str) {
        let mut all = vec![name.to_string()];
        for s in [WEIGHT_SCALE, WEIGHT_SCALE_INV, WEIGHT_SCALE_2] {
            all.push(names::sibling(name, s));
        }
        for n in all {
            if let Some(&(si, ti)) = self.map.get(&n) {
                let sh = &self.shards[si];
                sh.release(&sh.header.tensors[ti]);
            }
        }
    }

    /// A BF16 or F32 vector (norm weights, the router bias) as f32.
    pub fn vector_f32(&self, name: &str) -> Result<Vec<f32>, CheckpointError> {
        self.vector(name)
    }

    /// An optional positive scalar (the cache scales), `default` when absent.
    pub fn scalar_f32_or(&self, name: &str, default: f32) -> Result<f32, CheckpointError> {
        self.scalar_or(name, default)
    }

    /// A BF16 or F32 vector as f32.
    fn vector(&self, name: &str) -> Result<Vec<f32>, CheckpointError> {
        let (t, _) = self.info(name).ok_or_else(|| CheckpointError::Missing {
            tensor: name.into(),
            why: "vector not found".into(),
        })?;
        let raw = self.raw_bytes(name)?;
        Ok(match t.dtype {
            Dtype::BF16 => u16s(raw)
                .into_iter()
                .map(crate::formats::bf16::to_f32)
                .collect(),
            Dtype::F32 => f32s(raw),
            d => return Err(self.terr(name, format!("dtype {d} but must be BF16 or F32"))),
        })
    }

    fn scalar_or(&self, name: &str, default: f32) -> Result<f32, CheckpointError> {
        if !self.contains(name) {
            return Ok(default);
        }
        let v = self.vector(name)?;
        let x = v.first().copied().unwrap_or(default);
        if !(x.is_finite() && x > 0.0) {
            return Err(self.terr(name, format!("cache scale {x} must be finite and positive")));
        }
        Ok(x)
    }
}

/// What a tensor is for, where loading treats it specially.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    RoutedExpert,
    Other,
}

/// One entry of the config's tensor plan.
enum Need {
    /// name, rows, cols, allowed formats
    Linear(String, usize, usize, Allowed),
    /// name, length, F32 only
    Vector(String, usize, bool),
    /// Optional scalar (cache scales).
    Scalar(String),
}

fn alloc_vec(s: &str) -> Vec<String> {
    vec![s.to_string()]
}

fn u16s(raw: &[u8]) -> Vec<u16> {
    raw.chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .collect()
}

fn f32s(raw: &[u8]) -> Vec<f32> {
    raw.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Safetensors files in the directory that the index never names.
fn check_unused_shards(dir: &Path, used: &[String], warnings: &mut Vec<String>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    let mut unused: Vec<String> = rd
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.ends_with(".safetensors") && !used.contains(n))
        .collect();
    unused.sort();
    for u in unused {
        warnings.push(format!("{u}: shard not named by {INDEX_FILE} (ignored)"));
    }
}

fn check_total_size(
    ix: &ShardIndex,
    shards: &[SafetensorsFile],
    map: &BTreeMap<String, (usize, usize)>,
    warnings: &mut Vec<String>,
) {
    if let Some(total) = ix.total_size {
        let sum: u64 = map
            .values()
            .map(|&(s, t)| shards[s].header.tensors[t].nbytes() as u64)
            .sum();
        if sum != total {
            warnings.push(format!("{INDEX_FILE}: metadata.total_size {total} but the indexed tensors hold {sum} bytes"));
        }
    }
}
