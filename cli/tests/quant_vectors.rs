//! `m3 quant` / `m3 dequant` against the format conformance vectors
//! (spec/vectors, made by the independent Python generator), bit for bit.
//!
//! For every MX block case (MXFP4, MXFP8-E4M3, MXFP8-E5M2 x floor / even /
//! rceil) and every NVFP4 case: write the case input as the interchange F32
//! `x`, run the `m3` binary's quant, compare the stored tensors (names,
//! dtypes, shapes, bytes) with the vectors; then dequant that file and compare
//! the F32 `x` with the vectors' dequantized values (NaN compared as NaN).

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};
use serde_json::Value;

/// One owned tensor: dtype, shape, bytes.
type Tensor = (Dtype, Vec<usize>, Vec<u8>);

fn vectors_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../spec/vectors")
}

fn read_tensors(path: &Path) -> HashMap<String, Tensor> {
    let bytes = fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let st = SafeTensors::deserialize(&bytes)
        .unwrap_or_else(|e| panic!("{}: not safetensors: {e}", path.display()));
    st.tensors()
        .into_iter()
        .map(|(n, v)| (n, (v.dtype(), v.shape().to_vec(), v.data().to_vec())))
        .collect()
}

fn manifest() -> Value {
    let p = vectors_dir().join("manifest.json");
    let text = fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_json::from_slice(&text).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// A block case of the vectors.
struct Case {
    group: String,
    id: String,
    rows: usize,
    cols: usize,
}

/// The cases of the groups of `kind` whose `params.elem` is `elem` (any elem
/// when `None`), with each group's scale rule.
fn cases(kind: &str, elem: Option<&str>) -> Vec<(Case, Option<String>)> {
    let m = manifest();
    let mut out = Vec::new();
    for g in m["groups"].as_array().expect("manifest groups") {
        if g["kind"] != kind {
            continue;
        }
        if let Some(e) = elem {
            if g["params"]["elem"] != e {
                continue;
            }
        }
        let rule = g["params"]["rule"].as_str().map(str::to_string);
        let name = g["name"].as_str().expect("group name").to_string();
        for c in g["cases"].as_array().expect("group cases") {
            out.push((
                Case {
                    group: name.clone(),
                    id: c["id"].as_str().expect("case id").to_string(),
                    rows: c["rows"].as_u64().expect("rows") as usize,
                    cols: c["cols"].as_u64().expect("cols") as usize,
                },
                rule.clone(),
            ));
        }
    }
    assert!(
        !out.is_empty(),
        "no {kind} cases for {elem:?} in the manifest"
    );
    out
}

fn m3(args: &[&std::ffi::OsStr]) {
    let out = Command::new(env!("CARGO_BIN_EXE_m3"))
        .args(args)
        .output()
        .expect("running the m3 binary");
    assert!(
        out.status.success(),
        "m3 {:?} failed: {}",
        args,
        String::from_utf8_lossy(&out.stderr)
    );
}

fn write_x(path: &Path, rows: usize, cols: usize, data: &[u8]) {
    let view = TensorView::new(Dtype::F32, vec![rows, cols], data).expect("x view");
    let bytes = safetensors::serialize(vec![("x", view)], None).expect("serialize x");
    fs::write(path, bytes).expect("write x");
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Compare one output tensor with the expected bytes; a mismatch message or
/// nothing.
fn same_tensor(
    what: &str,
    got: Option<&Tensor>,
    dtype: Dtype,
    shape: &[usize],
    want: &[u8],
) -> Option<String> {
    let Some((dt, sh, data)) = got else {
        return Some(format!("{what}: missing from the output"));
    };
    if *dt != dtype || sh.as_slice() != shape {
        return Some(format!(
            "{what}: {dt:?} {sh:?}, expected {dtype:?} {shape:?}"
        ));
    }
    let i = (0..want.len()).find(|&i| data.get(i) != Some(&want[i]))?;
    Some(format!(
        "{what}: first differing byte {i}: expected {:02x}, got {:?}",
        want[i],
        data.get(i)
    ))
}

/// Quantize one case with `m3 quant --format fmt [--scale-rule rule]`, then
/// dequantize, and return every mismatch with the vectors.
fn check_case(dir: &Path, c: &Case, fmt: &str, rule: Option<&str>) -> Vec<String> {
    let vec = read_tensors(&vectors_dir().join(format!("{}.safetensors", c.group)));
    let t = |s: &str| {
        vec.get(&format!("{}.{s}", c.id))
            .unwrap_or_else(|| panic!("{}: vector tensor {}.{s} missing", c.group, c.id))
    };
    let tag = format!("{}/{}", c.group, c.id);
    let input = dir.join(format!("{}-{}.x.safetensors", c.group, c.id));
    let quant = dir.join(format!("{}-{}.q.safetensors", c.group, c.id));
    let deq = dir.join(format!("{}-{}.d.safetensors", c.group, c.id));
    write_x(&input, c.rows, c.cols, &t("x").2);

    let mut args: Vec<&std::ffi::OsStr> = vec!["quant".as_ref(), "--format".as_ref(), fmt.as_ref()];
    if let Some(r) = rule {
        args.push("--scale-rule".as_ref());
        args.push(r.as_ref());
    }
    args.push(input.as_os_str());
    args.push(quant.as_os_str());
    m3(&args);
    let q = read_tensors(&quant);

    let (r, k) = (c.rows, c.cols);
    let mut bad = Vec::new();
    let mut push = |m: Option<String>| {
        if let Some(m) = m {
            bad.push(format!("{tag}: {m}"));
        }
    };
    match fmt {
        "nvfp4" => {
            push(same_tensor(
                "weight",
                q.get("weight"),
                Dtype::U8,
                &[r, k / 2],
                &t("codes").2,
            ));
            push(same_tensor(
                "weight_scale",
                q.get("weight_scale"),
                Dtype::F8_E4M3,
                &[r, k / 16],
                &t("scales").2,
            ));
            push(same_tensor(
                "weight_scale_2",
                q.get("weight_scale_2"),
                Dtype::F32,
                &[],
                &t("global").2,
            ));
        }
        _ => {
            let (wdt, cols_stored, scale_name) = match fmt {
                "mxfp4" => (Dtype::U8, k / 2, "weight_scale"),
                "mxfp8-e4m3" => (Dtype::F8_E4M3, k, "weight_scale_inv"),
                _ => (Dtype::F8_E5M2, k, "weight_scale_inv"),
            };
            push(same_tensor(
                "weight",
                q.get("weight"),
                wdt,
                &[r, cols_stored],
                &t("codes").2,
            ));
            push(same_tensor(
                scale_name,
                q.get(scale_name),
                Dtype::U8,
                &[r, k / 32],
                &t("scales").2,
            ));
        }
    }
    if !bad.is_empty() {
        return bad;
    }

    m3(&["dequant".as_ref(), quant.as_os_str(), deq.as_os_str()]);
    let d = read_tensors(&deq);
    match d.get("x") {
        Some((Dtype::F32, sh, data)) if sh.as_slice() == [r, k] => {
            let (want, got) = (f32s(&t("deq").2), f32s(data));
            if let Some(i) = (0..want.len()).find(|&i| {
                !(want[i].is_nan() && got[i].is_nan()) && want[i].to_bits() != got[i].to_bits()
            }) {
                bad.push(format!(
                    "{tag}: dequant [row {}, col {}]: expected {:e} ({:08x}), got {:e} ({:08x})",
                    i / k,
                    i % k,
                    want[i],
                    want[i].to_bits(),
                    got[i],
                    got[i].to_bits()
                ));
            }
        }
        Some((dt, sh, _)) => bad.push(format!(
            "{tag}: dequant x is {dt:?} {sh:?}, expected F32 [{r}, {k}]"
        )),
        None => bad.push(format!("{tag}: dequant output has no `x`")),
    }
    bad
}

fn check_all(kind: &str, elem: Option<&str>, fmt: &str) {
    let dir = tempfile::tempdir().expect("temp dir");
    let cases = cases(kind, elem);
    let mut bad = Vec::new();
    for (c, rule) in &cases {
        bad.extend(check_case(dir.path(), c, fmt, rule.as_deref()));
    }
    assert!(
        bad.is_empty(),
        "{} of {} {fmt} cases differ from spec/vectors:\n{}",
        bad.len(),
        cases.len(),
        bad.iter().take(12).cloned().collect::<Vec<_>>().join("\n")
    );
    println!("{fmt}: {} cases bit-exact (quant and dequant)", cases.len());
}

#[test]
fn mxfp4_quant_matches_vectors() {
    check_all("mx", Some("e2m1"), "mxfp4");
}

#[test]
fn mxfp8_e4m3_quant_matches_vectors() {
    check_all("mx", Some("e4m3"), "mxfp8-e4m3");
}

#[test]
fn mxfp8_e5m2_quant_matches_vectors() {
    check_all("mx", Some("e5m2"), "mxfp8-e5m2");
}

#[test]
fn nvfp4_quant_matches_vectors() {
    check_all("nvfp4", None, "nvfp4");
}

/// The comparison can fail: quantizing the `even` vectors with `floor` must
/// be reported (the vectors hold blocks at the `even` carry point).
#[test]
fn wrong_scale_rule_is_caught() {
    let dir = tempfile::tempdir().expect("temp dir");
    let all = cases("mx", Some("e2m1"));
    let (c, _) = all
        .iter()
        .find(|(c, r)| r.as_deref() == Some("even") && c.id == "even_carry")
        .expect("mxfp4_even/even_carry in the vectors");
    let bad = check_case(dir.path(), c, "mxfp4", Some("floor"));
    assert!(!bad.is_empty(), "floor instead of even went unnoticed");
    assert!(bad[0].contains("weight"), "{}", bad[0]);
}
