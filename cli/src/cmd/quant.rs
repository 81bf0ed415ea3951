//! `m3 quant` / `m3 dequant`: the interchange file of FORMATS.md.
//!
//! `m3 quant` reads a safetensors file holding a 2-D F32 tensor `x` and writes
//! it in one block format under the tensor names a checkpoint uses (MODEL.md
//! section 7): MXFP4 `weight` (U8, packed `[rows, cols/2]`) + `weight_scale`
//! (U8 E8M0 `[rows, cols/32]`); MXFP8 `weight` (F8_E4M3 / F8_E5M2
//! `[rows, cols]`) + `weight_scale_inv` (U8 E8M0); NVFP4 `weight` (U8 packed),
//! `weight_scale` (F8_E4M3 `[rows, cols/16]`) and `weight_scale_2` (F32,
//! shape `[]`). The format and scale rule also go in `__metadata__`, for
//! people; `m3 dequant` reads the tensors alone, as a checkpoint loader does,
//! and writes F32 `x`.
//!
//! Outputs are written to a temporary file in the output's directory and
//! renamed into place, so a failure never leaves a file that looks complete.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use m3_core::formats::{BlockFormat, MxElem, MxTensor, Nvfp4Tensor, ScaleRule};
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};

#[derive(clap::Args)]
pub struct QuantArgs {
    /// Target format: mxfp4, mxfp8-e4m3, mxfp8-e5m2 or nvfp4.
    #[arg(long)]
    format: String,
    /// MX shared-exponent rule: floor (OCP, default), even or rceil. Not
    /// accepted for nvfp4, whose block scales are E4M3.
    #[arg(long)]
    scale_rule: Option<String>,
    /// Input safetensors file with a 2-D F32 tensor `x`.
    input: PathBuf,
    /// Output safetensors file (checkpoint tensor names).
    output: PathBuf,
}

#[derive(clap::Args)]
pub struct DequantArgs {
    /// Input safetensors file written by `m3 quant` (or any file with a
    /// checkpoint's `weight` + scale tensors).
    input: PathBuf,
    /// Output safetensors file with one F32 tensor `x`.
    output: PathBuf,
}

/// The command-line name of a format.
fn format_name(f: BlockFormat) -> &'static str {
    match f {
        BlockFormat::Mxfp4 => "mxfp4",
        BlockFormat::Mxfp8E4M3 => "mxfp8-e4m3",
        BlockFormat::Mxfp8E5M2 => "mxfp8-e5m2",
        BlockFormat::Nvfp4 => "nvfp4",
    }
}

fn parse_format(s: &str) -> Result<BlockFormat> {
    Ok(match s {
        "mxfp4" => BlockFormat::Mxfp4,
        "mxfp8-e4m3" => BlockFormat::Mxfp8E4M3,
        "mxfp8-e5m2" => BlockFormat::Mxfp8E5M2,
        "nvfp4" => BlockFormat::Nvfp4,
        _ => bail!("unknown --format `{s}` (expected mxfp4, mxfp8-e4m3, mxfp8-e5m2 or nvfp4)"),
    })
}

fn rule_name(r: ScaleRule) -> &'static str {
    match r {
        ScaleRule::Floor => "floor",
        ScaleRule::Even => "even",
        ScaleRule::Rceil => "rceil",
    }
}

fn parse_rule(s: &str) -> Result<ScaleRule> {
    Ok(match s {
        "floor" => ScaleRule::Floor,
        "even" => ScaleRule::Even,
        "rceil" => ScaleRule::Rceil,
        _ => bail!("unknown --scale-rule `{s}` (expected floor, even or rceil)"),
    })
}

/// An owned tensor to write: dtype, shape and little-endian bytes.
struct OutTensor {
    name: &'static str,
    dtype: Dtype,
    shape: Vec<usize>,
    data: Vec<u8>,
}

/// Serialize `tensors` with `metadata` and write them to `path` through a
/// temporary file in the same directory, renamed into place on success.
fn write_safetensors(
    path: &Path,
    tensors: &[OutTensor],
    metadata: HashMap<String, String>,
) -> Result<()> {
    let views = tensors
        .iter()
        .map(|t| {
            TensorView::new(t.dtype, t.shape.clone(), &t.data)
                .map(|v| (t.name, v))
                .map_err(|e| anyhow!("tensor `{}`: {e}", t.name))
        })
        .collect::<Result<Vec<_>>>()?;
    let bytes = safetensors::serialize(views, Some(metadata))
        .map_err(|e| anyhow!("serializing {}: {e}", path.display()))?;
    let file_name = path
        .file_name()
        .ok_or_else(|| anyhow!("output path {} has no file name", path.display()))?;
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let tmp = dir.join(format!(
        ".{}.tmp-{}",
        file_name.to_string_lossy(),
        std::process::id()
    ));
    if let Err(e) = fs::write(&tmp, &bytes) {
        let _ = fs::remove_file(&tmp);
        return Err(anyhow!("writing {}: {e}", tmp.display()));
    }
    if let Err(e) = fs::rename(&tmp, path) {
        let _ = fs::remove_file(&tmp);
        return Err(anyhow!(
            "renaming {} to {}: {e}",
            tmp.display(),
            path.display()
        ));
    }
    Ok(())
}

/// Read a whole file, naming it in the error.
fn read_file(path: &Path) -> Result<Vec<u8>> {
    fs::read(path).with_context(|| format!("reading {}", path.display()))
}

fn parse_safetensors<'a>(path: &Path, bytes: &'a [u8]) -> Result<SafeTensors<'a>> {
    SafeTensors::deserialize(bytes)
        .map_err(|e| anyhow!("{}: not a valid safetensors file: {e}", path.display()))
}

/// Look up tensor `name`, listing what the file does hold when it is absent.
fn tensor<'a>(path: &Path, st: &SafeTensors<'a>, name: &str) -> Result<TensorView<'a>> {
    st.tensor(name).map_err(|_| {
        let mut names = st.names();
        names.sort();
        anyhow!(
            "{}: no tensor `{name}` (the file holds: {})",
            path.display(),
            if names.is_empty() {
                "nothing".to_string()
            } else {
                names.join(", ")
            }
        )
    })
}

/// Check a tensor's dtype and rank, naming file, tensor and what was found.
fn expect(path: &Path, name: &str, t: &TensorView, dtypes: &[Dtype], rank: usize) -> Result<()> {
    if !dtypes.contains(&t.dtype()) {
        let want: Vec<String> = dtypes.iter().map(|d| format!("{d:?}")).collect();
        bail!(
            "{}: tensor `{name}` has dtype {:?}, expected {}",
            path.display(),
            t.dtype(),
            want.join(" or ")
        );
    }
    if t.shape().len() != rank {
        bail!(
            "{}: tensor `{name}` has shape {:?} ({}-D), expected {rank}-D",
            path.display(),
            t.shape(),
            t.shape().len()
        );
    }
    Ok(())
}

fn f32_from_le(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn f32_to_le(vals: &[f32]) -> Vec<u8> {
    vals.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// Relative L2 error of `approx` against `reference` over the entries where
/// both are finite (NaN/Inf blocks decode to NaN by design).
fn rel_l2(reference: &[f32], approx: &[f32]) -> f64 {
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for (&a, &b) in reference.iter().zip(approx) {
        if a.is_finite() && b.is_finite() {
            let d = a as f64 - b as f64;
            num += d * d;
            den += a as f64 * a as f64;
        }
    }
    if den == 0.0 {
        0.0
    } else {
        (num / den).sqrt()
    }
}

pub fn run_quant(args: QuantArgs) -> Result<()> {
    let format = parse_format(&args.format)?;
    let rule = match (format, args.scale_rule.as_deref()) {
        (BlockFormat::Nvfp4, Some(_)) => {
            bail!("--scale-rule applies to the MX formats only; nvfp4 block scales are E4M3")
        }
        (BlockFormat::Nvfp4, None) => None,
        (_, Some(r)) => Some(parse_rule(r)?),
        (_, None) => Some(ScaleRule::Floor),
    };
    let path = &args.input;
    let bytes = read_file(path)?;
    let st = parse_safetensors(path, &bytes)?;
    let x = tensor(path, &st, "x")?;
    expect(path, "x", &x, &[Dtype::F32], 2)?;
    let (rows, cols) = (x.shape()[0], x.shape()[1]);
    let block = format.block_size();
    if cols % block != 0 {
        bail!(
            "{}: tensor `x` has shape [{rows}, {cols}]: the last dimension must be a multiple of the {} block size {block} (never padded)",
            path.display(),
            format_name(format)
        );
    }
    let vals = f32_from_le(x.data());
    let shape_err = |e| anyhow!("{}: tensor `x` [{rows}, {cols}]: {e}", path.display());

    let mut meta = HashMap::new();
    meta.insert("format".to_string(), format_name(format).to_string());
    let (tensors, decoded) = match format {
        BlockFormat::Nvfp4 => {
            let t = Nvfp4Tensor::quantize(&vals, rows, cols).map_err(shape_err)?;
            let decoded = t.dequantize();
            let g = t.global();
            let tensors = vec![
                OutTensor {
                    name: "weight",
                    dtype: Dtype::U8,
                    shape: vec![rows, cols / 2],
                    data: t.codes().to_vec(),
                },
                OutTensor {
                    name: "weight_scale",
                    dtype: Dtype::F8_E4M3,
                    shape: vec![rows, cols / 16],
                    data: t.scales().to_vec(),
                },
                OutTensor {
                    name: "weight_scale_2",
                    dtype: Dtype::F32,
                    shape: vec![],
                    data: g.to_le_bytes().to_vec(),
                },
            ];
            (tensors, decoded)
        }
        mx => {
            let rule = rule.unwrap_or(ScaleRule::Floor);
            let (elem, dtype) = match mx {
                BlockFormat::Mxfp4 => (MxElem::Fp4E2M1, Dtype::U8),
                BlockFormat::Mxfp8E4M3 => (MxElem::Fp8E4M3, Dtype::F8_E4M3),
                _ => (MxElem::Fp8E5M2, Dtype::F8_E5M2),
            };
            meta.insert("scale_rule".to_string(), rule_name(rule).to_string());
            let t = MxTensor::quantize(&vals, rows, cols, elem, rule).map_err(shape_err)?;
            let decoded = t.dequantize();
            let scale_name = if elem == MxElem::Fp4E2M1 {
                "weight_scale"
            } else {
                "weight_scale_inv"
            };
            let (codes, scales) = t.into_parts();
            let tensors = vec![
                OutTensor {
                    name: "weight",
                    dtype,
                    shape: vec![rows, elem.packed_len(cols)],
                    data: codes,
                },
                OutTensor {
                    name: scale_name,
                    dtype: Dtype::U8,
                    shape: vec![rows, cols / 32],
                    data: scales,
                },
            ];
            (tensors, decoded)
        }
    };
    write_safetensors(&args.output, &tensors, meta)?;
    println!(
        "{}: x [{rows}, {cols}] -> {}{}, relative L2 error {:.3e}",
        args.output.display(),
        format_name(format),
        rule.map(|r| format!(" (scale rule {})", rule_name(r)))
            .unwrap_or_default(),
        rel_l2(&vals, &decoded)
    );
    Ok(())
}

/// Which format an interchange / checkpoint file holds, from its tensor names
/// and dtypes alone.
fn detect(path: &Path, st: &SafeTensors) -> Result<BlockFormat> {
    let has = |n: &str| st.tensor(n).is_ok();
    let w = tensor(path, st, "weight")?;
    Ok(if has("weight_scale_2") {
        BlockFormat::Nvfp4
    } else if has("weight_scale_inv") {
        match w.dtype() {
            Dtype::F8_E4M3 => BlockFormat::Mxfp8E4M3,
            Dtype::F8_E5M2 => BlockFormat::Mxfp8E5M2,
            d => bail!(
                "{}: `weight_scale_inv` marks MXFP8 but tensor `weight` has dtype {d:?}, expected F8_E4M3 or F8_E5M2",
                path.display()
            ),
        }
    } else if has("weight_scale") {
        BlockFormat::Mxfp4
    } else {
        bail!(
            "{}: tensor `weight` has no scale tensor (`weight_scale`, `weight_scale_inv` or `weight_scale_2`)",
            path.display()
        )
    })
}

/// Check that a scale tensor has shape `[rows, cols / block]`.
fn expect_scale_shape(
    path: &Path,
    name: &str,
    t: &TensorView,
    rows: usize,
    cols: usize,
    block: usize,
) -> Result<()> {
    let want = [rows, cols / block];
    if t.shape() != want {
        bail!(
            "{}: tensor `{name}` has shape {:?}, expected {want:?} for a weight of [{rows}, {cols}] with blocks of {block}",
            path.display(),
            t.shape()
        );
    }
    Ok(())
}

pub fn run_dequant(args: DequantArgs) -> Result<()> {
    let path = &args.input;
    let bytes = read_file(path)?;
    let st = parse_safetensors(path, &bytes)?;
    let format = detect(path, &st)?;
    let w = tensor(path, &st, "weight")?;
    let parts_err = |e| anyhow!("{}: {e}", path.display());
    let decoded = match format {
        BlockFormat::Nvfp4 => {
            expect(path, "weight", &w, &[Dtype::U8], 2)?;
            let (rows, cols) = (w.shape()[0], w.shape()[1] * 2);
            let s = tensor(path, &st, "weight_scale")?;
            expect(path, "weight_scale", &s, &[Dtype::F8_E4M3], 2)?;
            expect_scale_shape(path, "weight_scale", &s, rows, cols, 16)?;
            let g = tensor(path, &st, "weight_scale_2")?;
            if g.dtype() != Dtype::F32 || g.data().len() != 4 {
                bail!(
                    "{}: tensor `weight_scale_2` must be one F32 value, found {:?} {:?}",
                    path.display(),
                    g.dtype(),
                    g.shape()
                );
            }
            let global = f32_from_le(g.data())[0];
            let t =
                Nvfp4Tensor::from_parts(rows, cols, w.data().to_vec(), s.data().to_vec(), global)
                    .map_err(parts_err)?;
            t.dequantize()
        }
        mx => {
            let (elem, scale_name) = match mx {
                BlockFormat::Mxfp4 => (MxElem::Fp4E2M1, "weight_scale"),
                BlockFormat::Mxfp8E4M3 => (MxElem::Fp8E4M3, "weight_scale_inv"),
                _ => (MxElem::Fp8E5M2, "weight_scale_inv"),
            };
            let wdt = match elem {
                MxElem::Fp4E2M1 => Dtype::U8,
                MxElem::Fp8E4M3 => Dtype::F8_E4M3,
                MxElem::Fp8E5M2 => Dtype::F8_E5M2,
            };
            expect(path, "weight", &w, &[wdt], 2)?;
            let rows = w.shape()[0];
            let cols = if elem == MxElem::Fp4E2M1 {
                w.shape()[1] * 2
            } else {
                w.shape()[1]
            };
            let s = tensor(path, &st, scale_name)?;
            expect(path, scale_name, &s, &[Dtype::U8], 2)?;
            expect_scale_shape(path, scale_name, &s, rows, cols, 32)?;
            let t = MxTensor::from_parts(elem, rows, cols, w.data().to_vec(), s.data().to_vec())
                .map_err(parts_err)?;
            t.dequantize()
        }
    };
    let rows = w.shape()[0];
    let cols = decoded.len().checked_div(rows).unwrap_or(0);
    let mut meta = HashMap::new();
    meta.insert(
        "dequantized_from".to_string(),
        format_name(format).to_string(),
    );
    let out = [OutTensor {
        name: "x",
        dtype: Dtype::F32,
        shape: vec![rows, cols],
        data: f32_to_le(&decoded),
    }];
    write_safetensors(&args.output, &out, meta)?;
    println!(
        "{}: {} [{rows}, {cols}] -> F32 x",
        args.output.display(),
        format_name(format)
    );
    Ok(())
}
