//! The format conformance vectors of `m3-spec` (made by the independent
//! ml_dtypes generator) run on the GPU kernels through `FormatOps`, bit for
//! bit. Skips without a GPU (fails under REQUIRE_GPU=1).

mod common;

use common::gpu_or_skip;
use m3_core::formats::{MxElem, ScaleRule};
use m3_gpu::{CudaGpu, GpuError};
use m3_spec::{ElemKind, FormatOps, MxParts, Nvfp4Parts, OpError, PtpcParts, VectorSet};

/// The GPU kernels behind the conformance runner's trait.
struct GpuOps<'a>(&'a CudaGpu);

fn failed(e: GpuError) -> OpError {
    OpError::Failed(e.to_string())
}

fn mx_elem(e: ElemKind) -> Result<MxElem, OpError> {
    match e {
        ElemKind::E2M1 => Ok(MxElem::Fp4E2M1),
        ElemKind::E4M3 => Ok(MxElem::Fp8E4M3),
        ElemKind::E5M2 => Ok(MxElem::Fp8E5M2),
        ElemKind::E8M0 => Err(OpError::Failed("E8M0 has no encode".into())),
    }
}

impl FormatOps for GpuOps<'_> {
    fn name(&self) -> &str {
        "cuda:0"
    }
    fn decode(&self, elem: ElemKind, codes: &[u8]) -> Result<Vec<f32>, OpError> {
        match elem {
            ElemKind::E8M0 => self.0.decode_e8m0(codes).map_err(failed),
            e => self.0.decode_elem(mx_elem(e)?, codes).map_err(failed),
        }
    }
    fn encode_sat(&self, elem: ElemKind, xs: &[f64]) -> Result<Vec<u8>, OpError> {
        self.0.encode_elem(mx_elem(elem)?, xs).map_err(failed)
    }
    fn bf16_from_f32(&self, xs: &[f32]) -> Result<Vec<u16>, OpError> {
        self.0.bf16_round(xs).map_err(failed)
    }
    fn mx_quantize(
        &self,
        x: &[f32],
        rows: usize,
        cols: usize,
        elem: MxElem,
        rule: ScaleRule,
    ) -> Result<MxParts, OpError> {
        let q = self
            .0
            .mx_quantize(x, rows, cols, elem, rule)
            .map_err(failed)?;
        Ok(MxParts {
            elem,
            rows,
            cols,
            codes: q.codes,
            scales: q.scales,
        })
    }
    fn mx_dequantize(&self, t: &MxParts) -> Result<Vec<f32>, OpError> {
        self.0
            .mx_dequantize(t.elem, &t.codes, &t.scales, t.rows, t.cols)
            .map_err(failed)
    }
    fn nvfp4_quantize(&self, x: &[f32], rows: usize, cols: usize) -> Result<Nvfp4Parts, OpError> {
        let q = self.0.nvfp4_quantize(x, rows, cols).map_err(failed)?;
        Ok(Nvfp4Parts {
            rows,
            cols,
            codes: q.codes,
            scales: q.scales,
            global: q.global,
        })
    }
    fn nvfp4_dequantize(&self, t: &Nvfp4Parts) -> Result<Vec<f32>, OpError> {
        self.0
            .nvfp4_dequantize(&t.codes, &t.scales, t.global, t.rows, t.cols)
            .map_err(failed)
    }
    fn nvfp4_to_mxfp4(&self, t: &Nvfp4Parts, rule: ScaleRule) -> Result<MxParts, OpError> {
        let q = self
            .0
            .nvfp4_to_mxfp4(&t.codes, &t.scales, t.global, t.rows, t.cols, rule)
            .map_err(failed)?;
        Ok(MxParts {
            elem: MxElem::Fp4E2M1,
            rows: t.rows,
            cols: t.cols,
            codes: q.codes,
            scales: q.scales,
        })
    }
    fn mxfp8_to_bf16(&self, t: &MxParts, exact: bool) -> Result<Vec<u16>, OpError> {
        if exact {
            // the refusal names row and block, as the runner expects
            let (lo, hi) = if t.elem == MxElem::Fp8E5M2 {
                (10u8, 239u8)
            } else {
                (3, 246)
            };
            let nb = (t.cols / 32).max(1);
            if let Some((i, &s)) = t
                .scales
                .iter()
                .enumerate()
                .find(|(_, &s)| s == 0xff || s < lo || s > hi)
            {
                return Err(OpError::Refused {
                    row: i / nb,
                    block: i % nb,
                    why: format!("scale byte {s}"),
                });
            }
        }
        self.0
            .mxfp8_to_bf16(t.elem, &t.codes, &t.scales, t.rows, t.cols, false)
            .map_err(failed)
    }
    fn ptpc_quantize(&self, x: &[f32], rows: usize, cols: usize) -> Result<PtpcParts, OpError> {
        let (codes, scales) = self.0.ptpc_quantize(x, rows, cols).map_err(failed)?;
        Ok(PtpcParts {
            rows,
            cols,
            codes,
            scales,
        })
    }
    fn ptpc_dequantize(&self, t: &PtpcParts) -> Result<Vec<f32>, OpError> {
        self.0
            .ptpc_dequantize(&t.codes, &t.scales, t.rows, t.cols)
            .map_err(failed)
    }
    fn cache_cast_e4m3(&self, xs: &[f32], scale: f32) -> Result<Vec<u8>, OpError> {
        self.0.cache_cast_e4m3(xs, scale).map_err(failed)
    }
}

#[test]
fn spec_vectors_pass_on_the_gpu() {
    let Some(gpu) = gpu_or_skip("spec_vectors_pass_on_the_gpu") else {
        return;
    };
    // M3_SPEC_VECTORS: where the vectors are when the binary runs elsewhere
    // than the checkout it was built in (the device machine)
    let set = match std::env::var_os("M3_SPEC_VECTORS") {
        Some(d) => VectorSet::load(std::path::Path::new(&d)),
        None => VectorSet::load_default(),
    }
    .unwrap_or_else(|e| panic!("loading spec vectors: {e}"));
    // the CPU codecs on the same vectors, for the record (a group failing on
    // both points at the vectors or core, not at the kernels)
    let cpu = m3_spec::run(&m3_spec::CpuOps, &set);
    println!("cpu failed groups: {:?}", cpu.failed_groups());
    let report = m3_spec::run(&GpuOps(&gpu), &set);
    println!(
        "gpu: {} groups, failed: {:?}",
        report.groups.len(),
        report.failed_groups()
    );
    assert!(
        report.all_passed(),
        "failed groups on the GPU: {:?}",
        report.failed_groups()
    );
}
