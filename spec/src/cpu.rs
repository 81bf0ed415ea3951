//! [`FormatOps`] on the CPU: thin calls into `m3_core::formats`, the codecs
//! every other backend is held to.

use m3_core::formats::{
    bf16, convert, e2m1, e8m0,
    fp8::{e4m3, e5m2},
    FormatError, MxElem, MxTensor, Nvfp4Tensor, ScaleRule,
};

use crate::ops::{ElemKind, FormatOps, MxParts, Nvfp4Parts, OpError, PtpcParts};

/// The CPU codecs of `m3-core`.
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuOps;

fn failed(e: FormatError) -> OpError {
    match e {
        FormatError::NotExact { row, block, why } => OpError::Refused { row, block, why },
        other => OpError::Failed(other.to_string()),
    }
}

fn mx_tensor(t: &MxParts) -> Result<MxTensor, OpError> {
    MxTensor::from_parts(t.elem, t.rows, t.cols, t.codes.clone(), t.scales.clone()).map_err(failed)
}

fn mx_parts(t: MxTensor) -> MxParts {
    let (elem, rows, cols) = (t.elem(), t.rows(), t.cols());
    let (codes, scales) = t.into_parts();
    MxParts {
        elem,
        rows,
        cols,
        codes,
        scales,
    }
}

fn nvfp4_tensor(t: &Nvfp4Parts) -> Result<Nvfp4Tensor, OpError> {
    Nvfp4Tensor::from_parts(t.rows, t.cols, t.codes.clone(), t.scales.clone(), t.global)
        .map_err(failed)
}

impl FormatOps for CpuOps {
    fn name(&self) -> &str {
        "cpu"
    }

    fn decode(&self, elem: ElemKind, codes: &[u8]) -> Result<Vec<f32>, OpError> {
        let f: fn(u8) -> f32 = match elem {
            ElemKind::E2M1 => e2m1::decode,
            ElemKind::E4M3 => e4m3::decode,
            ElemKind::E5M2 => e5m2::decode,
            ElemKind::E8M0 => e8m0::decode,
        };
        Ok(codes.iter().map(|&c| f(c)).collect())
    }

    fn encode_sat(&self, elem: ElemKind, xs: &[f64]) -> Result<Vec<u8>, OpError> {
        let f: fn(f64) -> u8 = match elem {
            ElemKind::E2M1 => e2m1::encode_sat,
            ElemKind::E4M3 => e4m3::encode_sat,
            ElemKind::E5M2 => e5m2::encode_sat,
            ElemKind::E8M0 => {
                return Err(OpError::Failed("E8M0 has no element encode".into()));
            }
        };
        Ok(xs.iter().map(|&x| f(x)).collect())
    }

    fn bf16_from_f32(&self, xs: &[f32]) -> Result<Vec<u16>, OpError> {
        Ok(xs.iter().map(|&x| bf16::from_f32(x)).collect())
    }

    fn mx_quantize(
        &self,
        x: &[f32],
        rows: usize,
        cols: usize,
        elem: MxElem,
        rule: ScaleRule,
    ) -> Result<MxParts, OpError> {
        MxTensor::quantize(x, rows, cols, elem, rule)
            .map(mx_parts)
            .map_err(failed)
    }

    fn mx_dequantize(&self, t: &MxParts) -> Result<Vec<f32>, OpError> {
        Ok(mx_tensor(t)?.dequantize())
    }

    fn nvfp4_quantize(&self, x: &[f32], rows: usize, cols: usize) -> Result<Nvfp4Parts, OpError> {
        let t = Nvfp4Tensor::quantize(x, rows, cols).map_err(failed)?;
        Ok(Nvfp4Parts {
            rows: t.rows(),
            cols: t.cols(),
            codes: t.codes().to_vec(),
            scales: t.scales().to_vec(),
            global: t.global(),
        })
    }

    fn nvfp4_dequantize(&self, t: &Nvfp4Parts) -> Result<Vec<f32>, OpError> {
        Ok(nvfp4_tensor(t)?.dequantize())
    }

    fn nvfp4_to_mxfp4(&self, t: &Nvfp4Parts, rule: ScaleRule) -> Result<MxParts, OpError> {
        if !t.cols.is_multiple_of(MxElem::BLOCK) {
            return Err(OpError::Failed(format!(
                "NVFP4 -> MXFP4: cols {} is not a multiple of 32",
                t.cols
            )));
        }
        Ok(mx_parts(convert::nvfp4_to_mxfp4(&nvfp4_tensor(t)?, rule)))
    }

    fn mxfp8_to_bf16(&self, t: &MxParts, exact: bool) -> Result<Vec<u16>, OpError> {
        convert::mxfp8_to_bf16(&mx_tensor(t)?, exact).map_err(failed)
    }

    fn ptpc_quantize(&self, x: &[f32], rows: usize, cols: usize) -> Result<PtpcParts, OpError> {
        let q = convert::PtpcFp8::quantize(x, rows, cols).map_err(failed)?;
        Ok(PtpcParts {
            rows: q.rows,
            cols: q.cols,
            codes: q.codes,
            scales: q.scales,
        })
    }

    fn ptpc_dequantize(&self, t: &PtpcParts) -> Result<Vec<f32>, OpError> {
        if t.codes.len() != t.rows * t.cols || t.scales.len() != t.rows {
            return Err(OpError::Failed(format!(
                "PTPC [{}, {}]: {} codes, {} scales",
                t.rows,
                t.cols,
                t.codes.len(),
                t.scales.len()
            )));
        }
        let q = convert::PtpcFp8 {
            rows: t.rows,
            cols: t.cols,
            codes: t.codes.clone(),
            scales: t.scales.clone(),
        };
        Ok(q.dequantize())
    }

    fn cache_cast_e4m3(&self, xs: &[f32], scale: f32) -> Result<Vec<u8>, OpError> {
        Ok(xs
            .iter()
            .map(|&x| convert::cache_cast_e4m3(x, scale))
            .collect())
    }
}
