//! Tap files: the safetensors written by `m3 forward --dump` and by the
//! Python reference (`golden/gen/reference.py`). Only F32 and I32 tensors
//! matter for parity; other dtypes are skipped.

use std::collections::BTreeMap;
use std::path::Path;

use safetensors::{Dtype, SafeTensors};

use crate::GoldenError;

/// One tap: its shape and its values (f32 for activations, i32 for ids).
#[derive(Clone, Debug, PartialEq)]
pub enum Tap {
    F32 { shape: Vec<usize>, data: Vec<f32> },
    I32 { shape: Vec<usize>, data: Vec<i32> },
}

impl Tap {
    pub fn shape(&self) -> &[usize] {
        match self {
            Tap::F32 { shape, .. } | Tap::I32 { shape, .. } => shape,
        }
    }
}

/// Named taps, e.g. `residual.3`, `topk_blocks.1`, `experts.2`, `logits`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Taps {
    pub tensors: BTreeMap<String, Tap>,
}

impl Taps {
    /// Read every F32 / I32 tensor of a safetensors file.
    pub fn load(path: &Path) -> Result<Taps, GoldenError> {
        let bytes = std::fs::read(path).map_err(|e| GoldenError::Io {
            path: path.display().to_string(),
            source: e,
        })?;
        Self::from_bytes(&bytes, &path.display().to_string())
    }

    /// Parse a safetensors image; `what` names it in errors.
    pub fn from_bytes(bytes: &[u8], what: &str) -> Result<Taps, GoldenError> {
        let st = SafeTensors::deserialize(bytes).map_err(|e| GoldenError::Format {
            path: what.to_string(),
            msg: e.to_string(),
        })?;
        let mut tensors = BTreeMap::new();
        for (name, view) in st.tensors() {
            let shape = view.shape().to_vec();
            let raw = view.data();
            let tap = match view.dtype() {
                Dtype::F32 => Tap::F32 {
                    shape,
                    data: raw
                        .chunks_exact(4)
                        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                        .collect(),
                },
                Dtype::I32 => Tap::I32 {
                    shape,
                    data: raw
                        .chunks_exact(4)
                        .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                        .collect(),
                },
                _ => continue,
            };
            tensors.insert(name, tap);
        }
        Ok(Taps { tensors })
    }

    /// The tensors of a backend's in-memory taps (`m3_core`'s type).
    pub fn from_core(taps: &m3_core::backend::Taps) -> Taps {
        use m3_core::backend::TapData;
        let tensors = taps
            .tensors
            .iter()
            .map(|(name, t)| {
                let shape = t.shape.clone();
                let tap = match &t.data {
                    TapData::F32(v) => Tap::F32 {
                        shape,
                        data: v.clone(),
                    },
                    TapData::I32(v) => Tap::I32 {
                        shape,
                        data: v.clone(),
                    },
                };
                (name.clone(), tap)
            })
            .collect();
        Taps { tensors }
    }

    pub fn get(&self, name: &str) -> Option<&Tap> {
        self.tensors.get(name)
    }

    /// The f32 values and shape of `name`, or an error naming it.
    pub fn f32(&self, name: &str, file: &str) -> Result<(&[usize], &[f32]), GoldenError> {
        match self.tensors.get(name) {
            Some(Tap::F32 { shape, data }) => Ok((shape, data)),
            Some(_) => Err(GoldenError::Tensor {
                path: file.to_string(),
                name: name.to_string(),
                msg: "expected F32".into(),
            }),
            None => Err(GoldenError::Tensor {
                path: file.to_string(),
                name: name.to_string(),
                msg: "missing".into(),
            }),
        }
    }

    /// Serialize to a safetensors image (used by tests that plant errors).
    pub fn to_bytes(&self) -> Result<Vec<u8>, GoldenError> {
        let mut owned: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
        for (name, tap) in &self.tensors {
            match tap {
                Tap::F32 { shape, data } => owned.push((
                    name.clone(),
                    Dtype::F32,
                    shape.clone(),
                    data.iter().flat_map(|v| v.to_le_bytes()).collect(),
                )),
                Tap::I32 { shape, data } => owned.push((
                    name.clone(),
                    Dtype::I32,
                    shape.clone(),
                    data.iter().flat_map(|v| v.to_le_bytes()).collect(),
                )),
            }
        }
        let mut views = Vec::new();
        for (name, dt, shape, bytes) in &owned {
            let v =
                safetensors::tensor::TensorView::new(*dt, shape.clone(), bytes).map_err(|e| {
                    GoldenError::Format {
                        path: name.clone(),
                        msg: e.to_string(),
                    }
                })?;
            views.push((name.clone(), v));
        }
        safetensors::tensor::serialize(views, None).map_err(|e| GoldenError::Format {
            path: "<taps>".into(),
            msg: e.to_string(),
        })
    }

    /// Write via a temp name in the same directory, then rename.
    pub fn save(&self, path: &Path) -> Result<(), GoldenError> {
        let bytes = self.to_bytes()?;
        crate::write_atomic(path, &bytes)
    }
}
