//! Loading the committed vectors: `spec/vectors/manifest.json` names the
//! groups; each group's tensors live in `<group>.safetensors` (written by
//! `spec/gen/gen_vectors.py`). Every tensor is checked for dtype and shape at
//! load time so the runner never indexes out of bounds.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use m3_core::formats::{MxElem, ScaleRule};
use safetensors::{Dtype, SafeTensors};
use serde::Deserialize;

use crate::error::SpecError;
use crate::ops::{ElemKind, MxParts, Nvfp4Parts, PtpcParts};

/// The manifest version this loader understands.
const FORMAT_VERSION: u32 = 1;

/// `spec/vectors` of this checkout.
pub fn default_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("vectors")
}

#[derive(Deserialize)]
struct Manifest {
    format_version: u32,
    groups: Vec<ManifestGroup>,
}

#[derive(Deserialize)]
struct ManifestGroup {
    name: String,
    kind: String,
    file: String,
    count: usize,
    params: Params,
    #[serde(default)]
    cases: Vec<ManifestCase>,
}

#[derive(Deserialize, Default)]
struct Params {
    elem: Option<String>,
    rule: Option<String>,
}

#[derive(Deserialize)]
struct ManifestCase {
    id: String,
    rows: usize,
    cols: usize,
    note: String,
    #[serde(default)]
    exact_refuses: Option<[usize; 2]>,
}

/// Every vector group, in manifest order.
#[derive(Clone, Debug)]
pub struct VectorSet {
    pub dir: PathBuf,
    pub groups: Vec<Group>,
}

/// One group: a named set of vectors of one operation.
#[derive(Clone, Debug)]
pub struct Group {
    pub name: String,
    /// Vectors in the group: elements for element groups, cases (tensors)
    /// for block groups.
    pub count: usize,
    pub data: GroupData,
}

/// The vectors of a group, by operation.
#[derive(Clone, Debug)]
pub enum GroupData {
    Decode {
        elem: ElemKind,
        codes: Vec<u8>,
        expected: Vec<f32>,
    },
    Encode {
        elem: ElemKind,
        inputs: Vec<f64>,
        expected: Vec<u8>,
    },
    Bf16 {
        inputs: Vec<f32>,
        expected: Vec<u16>,
    },
    Mx {
        elem: MxElem,
        rule: ScaleRule,
        cases: Vec<BlockCase>,
    },
    Nvfp4 {
        cases: Vec<Nvfp4Case>,
    },
    Nvfp4ToMxfp4 {
        rule: ScaleRule,
        cases: Vec<Nvfp4ToMxCase>,
    },
    Mxfp8ToBf16 {
        elem: MxElem,
        cases: Vec<Mxfp8Bf16Case>,
    },
    Ptpc {
        cases: Vec<PtpcCase>,
    },
    CacheCast {
        cases: Vec<CacheCastCase>,
    },
}

/// An MX quantize / dequantize case.
#[derive(Clone, Debug)]
pub struct BlockCase {
    pub id: String,
    pub note: String,
    pub x: Vec<f32>,
    pub expected: MxParts,
    /// Dequantize of `expected`.
    pub deq: Vec<f32>,
}

/// An NVFP4 quantize / dequantize case.
#[derive(Clone, Debug)]
pub struct Nvfp4Case {
    pub id: String,
    pub note: String,
    pub x: Vec<f32>,
    pub expected: Nvfp4Parts,
    pub deq: Vec<f32>,
}

/// An NVFP4 -> MXFP4 case.
#[derive(Clone, Debug)]
pub struct Nvfp4ToMxCase {
    pub id: String,
    pub note: String,
    pub input: Nvfp4Parts,
    pub expected: MxParts,
}

/// An MXFP8 -> BF16 case: the non-exact result, and whether (where) the
/// lossless mode refuses.
#[derive(Clone, Debug)]
pub struct Mxfp8Bf16Case {
    pub id: String,
    pub note: String,
    pub input: MxParts,
    pub bf16: Vec<u16>,
    /// `(row, block)` of the first block the exact mode must refuse.
    pub exact_refuses: Option<(usize, usize)>,
}

/// A PTPC FP8 case.
#[derive(Clone, Debug)]
pub struct PtpcCase {
    pub id: String,
    pub note: String,
    pub x: Vec<f32>,
    pub expected: PtpcParts,
    pub deq: Vec<f32>,
}

/// An FP8 cache cast case: values and one per-tensor scale.
#[derive(Clone, Debug)]
pub struct CacheCastCase {
    pub id: String,
    pub note: String,
    pub x: Vec<f32>,
    pub scale: f32,
    pub codes: Vec<u8>,
}

/// The tensors of one safetensors file, copied out (dtype, shape, bytes).
struct TensorFile {
    path: PathBuf,
    tensors: HashMap<String, (Dtype, Vec<usize>, Vec<u8>)>,
}

impl TensorFile {
    fn open(path: &Path) -> Result<Self, SpecError> {
        let bytes = std::fs::read(path).map_err(|source| SpecError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let st = SafeTensors::deserialize(&bytes).map_err(|e| SpecError::Safetensors {
            path: path.to_path_buf(),
            why: e.to_string(),
        })?;
        let tensors = st
            .tensors()
            .into_iter()
            .map(|(name, v)| (name, (v.dtype(), v.shape().to_vec(), v.data().to_vec())))
            .collect();
        Ok(Self {
            path: path.to_path_buf(),
            tensors,
        })
    }

    fn raw(&self, name: &str, dtype: Dtype, shape: &[usize]) -> Result<&[u8], SpecError> {
        let err = |why: String| SpecError::Tensor {
            path: self.path.clone(),
            tensor: name.to_string(),
            why,
        };
        let (dt, sh, data) = self
            .tensors
            .get(name)
            .ok_or_else(|| err("missing".to_string()))?;
        if *dt != dtype {
            return Err(err(format!("dtype {dt:?}, expected {dtype:?}")));
        }
        if sh.as_slice() != shape {
            return Err(err(format!("shape {sh:?}, expected {shape:?}")));
        }
        Ok(data)
    }

    fn u8(&self, name: &str, shape: &[usize]) -> Result<Vec<u8>, SpecError> {
        Ok(self.raw(name, Dtype::U8, shape)?.to_vec())
    }

    fn u16(&self, name: &str, shape: &[usize]) -> Result<Vec<u16>, SpecError> {
        Ok(self
            .raw(name, Dtype::U16, shape)?
            .chunks_exact(2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
            .collect())
    }

    fn f32(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>, SpecError> {
        Ok(self
            .raw(name, Dtype::F32, shape)?
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect())
    }

    fn f64(&self, name: &str, shape: &[usize]) -> Result<Vec<f64>, SpecError> {
        Ok(self
            .raw(name, Dtype::F64, shape)?
            .chunks_exact(8)
            .map(|b| f64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]))
            .collect())
    }

    fn scalar_f32(&self, name: &str) -> Result<f32, SpecError> {
        Ok(self.f32(name, &[1])?[0])
    }
}

fn group_err(g: &ManifestGroup, why: impl Into<String>) -> SpecError {
    SpecError::Group {
        group: g.name.clone(),
        why: why.into(),
    }
}

fn elem_kind(g: &ManifestGroup) -> Result<ElemKind, SpecError> {
    let s = g.params.elem.as_deref().unwrap_or("");
    ElemKind::parse(s).ok_or_else(|| group_err(g, format!("unknown elem `{s}`")))
}

fn mx_elem(g: &ManifestGroup) -> Result<MxElem, SpecError> {
    match g.params.elem.as_deref() {
        Some("e2m1") => Ok(MxElem::Fp4E2M1),
        Some("e4m3") => Ok(MxElem::Fp8E4M3),
        Some("e5m2") => Ok(MxElem::Fp8E5M2),
        other => Err(group_err(g, format!("unknown MX elem {other:?}"))),
    }
}

fn rule(g: &ManifestGroup) -> Result<ScaleRule, SpecError> {
    match g.params.rule.as_deref() {
        Some("floor") => Ok(ScaleRule::Floor),
        Some("even") => Ok(ScaleRule::Even),
        Some("rceil") => Ok(ScaleRule::Rceil),
        other => Err(group_err(g, format!("unknown scale rule {other:?}"))),
    }
}

/// Shape checks that keep later indexing in bounds.
fn check_shape(g: &ManifestGroup, c: &ManifestCase, block: usize) -> Result<(), SpecError> {
    if c.rows == 0 || c.cols == 0 || !c.cols.is_multiple_of(block) {
        return Err(group_err(
            g,
            format!(
                "case `{}`: shape [{}, {}] is not blockable by {block}",
                c.id, c.rows, c.cols
            ),
        ));
    }
    Ok(())
}

fn packed_cols(elem: MxElem, cols: usize) -> usize {
    elem.packed_len(cols)
}

impl VectorSet {
    /// Load `spec/vectors` of this checkout.
    pub fn load_default() -> Result<Self, SpecError> {
        Self::load(&default_dir())
    }

    /// Load the manifest and every group file under `dir`.
    pub fn load(dir: &Path) -> Result<Self, SpecError> {
        let mpath = dir.join("manifest.json");
        let text = std::fs::read(&mpath).map_err(|source| SpecError::Io {
            path: mpath.clone(),
            source,
        })?;
        let m: Manifest = serde_json::from_slice(&text).map_err(|source| SpecError::Manifest {
            path: mpath.clone(),
            source,
        })?;
        if m.format_version != FORMAT_VERSION {
            return Err(SpecError::Group {
                group: "(manifest)".into(),
                why: format!(
                    "format_version {} (this loader reads {FORMAT_VERSION})",
                    m.format_version
                ),
            });
        }
        let mut groups = Vec::with_capacity(m.groups.len());
        for g in &m.groups {
            let file = TensorFile::open(&dir.join(&g.file))?;
            let data = load_group(g, &file)?;
            groups.push(Group {
                name: g.name.clone(),
                count: g.count,
                data,
            });
        }
        Ok(Self {
            dir: dir.to_path_buf(),
            groups,
        })
    }

    /// Total vectors over every group.
    pub fn total(&self) -> usize {
        self.groups.iter().map(|g| g.count).sum()
    }
}

fn load_group(g: &ManifestGroup, f: &TensorFile) -> Result<GroupData, SpecError> {
    let n = g.count;
    let data = match g.kind.as_str() {
        "decode" => GroupData::Decode {
            elem: elem_kind(g)?,
            codes: f.u8("input", &[n])?,
            expected: f.f32("expected", &[n])?,
        },
        "encode" => GroupData::Encode {
            elem: elem_kind(g)?,
            inputs: f.f64("input", &[n])?,
            expected: f.u8("expected", &[n])?,
        },
        "bf16" => GroupData::Bf16 {
            inputs: f.f32("input", &[n])?,
            expected: f.u16("expected", &[n])?,
        },
        "mx" => {
            let elem = mx_elem(g)?;
            let mut cases = Vec::new();
            for c in &g.cases {
                check_shape(g, c, 32)?;
                let (r, k) = (c.rows, c.cols);
                let t = |s: &str| format!("{}.{s}", c.id);
                cases.push(BlockCase {
                    id: c.id.clone(),
                    note: c.note.clone(),
                    x: f.f32(&t("x"), &[r, k])?,
                    expected: MxParts {
                        elem,
                        rows: r,
                        cols: k,
                        codes: f.u8(&t("codes"), &[r, packed_cols(elem, k)])?,
                        scales: f.u8(&t("scales"), &[r, k / 32])?,
                    },
                    deq: f.f32(&t("deq"), &[r, k])?,
                });
            }
            GroupData::Mx {
                elem,
                rule: rule(g)?,
                cases,
            }
        }
        "nvfp4" => {
            let mut cases = Vec::new();
            for c in &g.cases {
                check_shape(g, c, 16)?;
                let (r, k) = (c.rows, c.cols);
                let t = |s: &str| format!("{}.{s}", c.id);
                cases.push(Nvfp4Case {
                    id: c.id.clone(),
                    note: c.note.clone(),
                    x: f.f32(&t("x"), &[r, k])?,
                    expected: Nvfp4Parts {
                        rows: r,
                        cols: k,
                        codes: f.u8(&t("codes"), &[r, k / 2])?,
                        scales: f.u8(&t("scales"), &[r, k / 16])?,
                        global: f.scalar_f32(&t("global"))?,
                    },
                    deq: f.f32(&t("deq"), &[r, k])?,
                });
            }
            GroupData::Nvfp4 { cases }
        }
        "nvfp4_to_mxfp4" => {
            let mut cases = Vec::new();
            for c in &g.cases {
                check_shape(g, c, 32)?;
                let (r, k) = (c.rows, c.cols);
                let t = |s: &str| format!("{}.{s}", c.id);
                cases.push(Nvfp4ToMxCase {
                    id: c.id.clone(),
                    note: c.note.clone(),
                    input: Nvfp4Parts {
                        rows: r,
                        cols: k,
                        codes: f.u8(&t("codes_in"), &[r, k / 2])?,
                        scales: f.u8(&t("scales_in"), &[r, k / 16])?,
                        global: f.scalar_f32(&t("global_in"))?,
                    },
                    expected: MxParts {
                        elem: MxElem::Fp4E2M1,
                        rows: r,
                        cols: k,
                        codes: f.u8(&t("codes"), &[r, k / 2])?,
                        scales: f.u8(&t("scales"), &[r, k / 32])?,
                    },
                });
            }
            GroupData::Nvfp4ToMxfp4 {
                rule: rule(g)?,
                cases,
            }
        }
        "mxfp8_to_bf16" => {
            let elem = mx_elem(g)?;
            let mut cases = Vec::new();
            for c in &g.cases {
                check_shape(g, c, 32)?;
                let (r, k) = (c.rows, c.cols);
                let t = |s: &str| format!("{}.{s}", c.id);
                cases.push(Mxfp8Bf16Case {
                    id: c.id.clone(),
                    note: c.note.clone(),
                    input: MxParts {
                        elem,
                        rows: r,
                        cols: k,
                        codes: f.u8(&t("codes_in"), &[r, k])?,
                        scales: f.u8(&t("scales_in"), &[r, k / 32])?,
                    },
                    bf16: f.u16(&t("bf16"), &[r, k])?,
                    exact_refuses: c.exact_refuses.map(|[a, b]| (a, b)),
                });
            }
            GroupData::Mxfp8ToBf16 { elem, cases }
        }
        "ptpc" => {
            let mut cases = Vec::new();
            for c in &g.cases {
                check_shape(g, c, 1)?;
                let (r, k) = (c.rows, c.cols);
                let t = |s: &str| format!("{}.{s}", c.id);
                cases.push(PtpcCase {
                    id: c.id.clone(),
                    note: c.note.clone(),
                    x: f.f32(&t("x"), &[r, k])?,
                    expected: PtpcParts {
                        rows: r,
                        cols: k,
                        codes: f.u8(&t("codes"), &[r, k])?,
                        scales: f.f32(&t("scales"), &[r])?,
                    },
                    deq: f.f32(&t("deq"), &[r, k])?,
                });
            }
            GroupData::Ptpc { cases }
        }
        "cache_cast" => {
            let mut cases = Vec::new();
            for c in &g.cases {
                check_shape(g, c, 1)?;
                let t = |s: &str| format!("{}.{s}", c.id);
                cases.push(CacheCastCase {
                    id: c.id.clone(),
                    note: c.note.clone(),
                    x: f.f32(&t("x"), &[c.cols])?,
                    scale: f.scalar_f32(&t("scale"))?,
                    codes: f.u8(&t("codes"), &[c.cols])?,
                });
            }
            GroupData::CacheCast { cases }
        }
        other => return Err(group_err(g, format!("unknown kind `{other}`"))),
    };
    Ok(data)
}
