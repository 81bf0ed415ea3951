//! `m3 quant` / `m3 dequant` end to end: the built binary on temp files.
//!
//! Round trips check the file against the library (codes, scales and the
//! decoded values bit for bit); bad inputs must exit non-zero with exactly
//! one stderr line and leave no output (nor a temporary) behind.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use m3_core::formats::{MxElem, MxTensor, Nvfp4Tensor, ScaleRule};
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};

fn m3(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_m3"))
        .args(args)
        .env("M3_LOG", "warn")
        .output()
        .expect("run the m3 binary")
}

fn write_tensors(path: &Path, tensors: Vec<(&str, Dtype, Vec<usize>, Vec<u8>)>) {
    let views: Vec<(&str, TensorView)> = tensors
        .iter()
        .map(|(n, d, s, b)| (*n, TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    std::fs::write(path, safetensors::serialize(views, None).unwrap()).unwrap();
}

fn write_x(path: &Path, rows: usize, cols: usize, x: &[f32]) {
    let bytes = x.iter().flat_map(|v| v.to_le_bytes()).collect();
    write_tensors(path, vec![("x", Dtype::F32, vec![rows, cols], bytes)]);
}

/// Deterministic test values: magnitudes spread over many binades per block,
/// signs mixed, one NaN block, a zero block and a -0.0.
fn test_values(rows: usize, cols: usize) -> Vec<f32> {
    let mut s = 0x2545_F491_4F6C_DD1Du64;
    let mut x = Vec::with_capacity(rows * cols);
    for i in 0..rows * cols {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        let u = (s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0;
        let k = ((i / 16) % 13) as i32 - 6;
        x.push(u * 2f32.powi(k * 3));
    }
    x[5] = -0.0;
    x[cols + 40] = f32::NAN; // row 1, second MX block
    for v in &mut x[2 * cols..2 * cols + 32] {
        *v = 0.0;
    }
    x
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter()
        .map(|f| if f.is_nan() { u32::MAX } else { f.to_bits() })
        .collect()
}

fn entries(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn round_trip_every_format_and_rule() {
    let (rows, cols) = (4, 128);
    let x = test_values(rows, cols);
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.safetensors");
    write_x(&input, rows, cols, &x);
    let cases: Vec<(&str, Option<&str>)> = vec![
        ("mxfp4", None),
        ("mxfp4", Some("floor")),
        ("mxfp4", Some("even")),
        ("mxfp4", Some("rceil")),
        ("mxfp8-e4m3", Some("floor")),
        ("mxfp8-e4m3", Some("even")),
        ("mxfp8-e4m3", Some("rceil")),
        ("mxfp8-e5m2", Some("floor")),
        ("mxfp8-e5m2", Some("even")),
        ("mxfp8-e5m2", Some("rceil")),
        ("nvfp4", None),
    ];
    for (format, rule) in cases {
        let q = dir.path().join(format!(
            "{format}-{}.safetensors",
            rule.unwrap_or("default")
        ));
        let back = dir.path().join("back.safetensors");
        let mut args = vec!["quant", "--format", format];
        if let Some(r) = rule {
            args.extend(["--scale-rule", r]);
        }
        let (qs, bs) = (q.to_str().unwrap(), back.to_str().unwrap());
        args.extend([input.to_str().unwrap(), qs]);
        let out = m3(&args);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );

        // The file against the library: names, dtypes, shapes, bytes, metadata.
        let qbytes = std::fs::read(&q).unwrap();
        let st = SafeTensors::deserialize(&qbytes).unwrap();
        let (_, meta) = SafeTensors::read_metadata(&qbytes).unwrap();
        let meta: HashMap<String, String> = meta.metadata().clone().unwrap_or_default();
        assert_eq!(meta.get("format").map(String::as_str), Some(format));
        let expected: Vec<f32> = if format == "nvfp4" {
            assert!(!meta.contains_key("scale_rule"));
            let t = Nvfp4Tensor::quantize(&x, rows, cols).unwrap();
            let w = st.tensor("weight").unwrap();
            assert_eq!((w.dtype(), w.shape()), (Dtype::U8, &[rows, cols / 2][..]));
            assert_eq!(w.data(), t.codes());
            let s = st.tensor("weight_scale").unwrap();
            assert_eq!(
                (s.dtype(), s.shape()),
                (Dtype::F8_E4M3, &[rows, cols / 16][..])
            );
            assert_eq!(s.data(), t.scales());
            let g = st.tensor("weight_scale_2").unwrap();
            assert_eq!((g.dtype(), g.shape()), (Dtype::F32, &[][..]));
            assert_eq!(f32s(g.data()), vec![t.global()]);
            t.dequantize()
        } else {
            let r = match rule.unwrap_or("floor") {
                "floor" => ScaleRule::Floor,
                "even" => ScaleRule::Even,
                _ => ScaleRule::Rceil,
            };
            assert_eq!(
                meta.get("scale_rule").map(String::as_str),
                Some(rule.unwrap_or("floor"))
            );
            let (elem, wdt, sname) = match format {
                "mxfp4" => (MxElem::Fp4E2M1, Dtype::U8, "weight_scale"),
                "mxfp8-e4m3" => (MxElem::Fp8E4M3, Dtype::F8_E4M3, "weight_scale_inv"),
                _ => (MxElem::Fp8E5M2, Dtype::F8_E5M2, "weight_scale_inv"),
            };
            let t = MxTensor::quantize(&x, rows, cols, elem, r).unwrap();
            let w = st.tensor("weight").unwrap();
            assert_eq!(
                (w.dtype(), w.shape()),
                (wdt, &[rows, elem.packed_len(cols)][..])
            );
            assert_eq!(w.data(), t.codes());
            let s = st.tensor(sname).unwrap();
            assert_eq!((s.dtype(), s.shape()), (Dtype::U8, &[rows, cols / 32][..]));
            assert_eq!(s.data(), t.scales());
            assert_eq!(st.names().len(), 2);
            t.dequantize()
        };

        let out = m3(&["dequant", qs, bs]);
        assert!(
            out.status.success(),
            "dequant {format}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let bbytes = std::fs::read(&back).unwrap();
        let st = SafeTensors::deserialize(&bbytes).unwrap();
        let y = st.tensor("x").unwrap();
        assert_eq!((y.dtype(), y.shape()), (Dtype::F32, &[rows, cols][..]));
        assert_eq!(bits(&f32s(y.data())), bits(&expected), "{format} {rule:?}");
        // Sanity that the comparison has teeth: the NaN block and -0.0 survive.
        assert!(f32s(y.data())[cols + 40].is_nan());
    }
    let left: Vec<String> = entries(dir.path())
        .into_iter()
        .filter(|n| n.starts_with('.'))
        .collect();
    assert!(left.is_empty(), "temporaries left: {left:?}");
}

/// Run a failing command: non-zero exit, exactly one stderr line containing
/// `needle`, and the output path (and any temporary) absent.
fn assert_fails(args: &[&str], out_path: &Path, needle: &str) {
    let out = m3(args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{args:?} succeeded");
    assert_eq!(
        stderr.lines().count(),
        1,
        "{args:?}: stderr is not one line:\n{stderr}"
    );
    assert!(
        stderr.contains(needle),
        "{args:?}: `{needle}` not in: {stderr}"
    );
    assert!(!out_path.exists(), "{args:?}: output left behind");
    if let Some(dir) = out_path.parent() {
        let tmp: Vec<String> = entries(dir)
            .into_iter()
            .filter(|n| n.starts_with('.'))
            .collect();
        assert!(tmp.is_empty(), "{args:?}: temporaries left: {tmp:?}");
    }
}

struct Case {
    dir: tempfile::TempDir,
}

impl Case {
    fn new() -> Self {
        Case {
            dir: tempfile::tempdir().unwrap(),
        }
    }
    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

#[test]
fn quant_bad_inputs() {
    let c = Case::new();
    let out = c.path("out.safetensors");
    let o = out.to_str().unwrap();
    let p = |n: &str| c.path(n).to_str().unwrap().to_string();

    // Missing input file.
    assert_fails(
        &["quant", "--format", "mxfp4", &p("missing.safetensors"), o],
        &out,
        "missing.safetensors",
    );

    // Not a safetensors file.
    std::fs::write(c.path("junk.bin"), b"this is not a safetensors file at all").unwrap();
    assert_fails(
        &["quant", "--format", "mxfp4", &p("junk.bin"), o],
        &out,
        "not a valid safetensors",
    );

    // No tensor `x`.
    write_tensors(
        &c.path("noy.st"),
        vec![("y", Dtype::F32, vec![1, 32], vec![0; 128])],
    );
    assert_fails(
        &["quant", "--format", "mxfp4", &p("noy.st"), o],
        &out,
        "no tensor `x`",
    );

    // Wrong dtype.
    write_tensors(
        &c.path("f64.st"),
        vec![("x", Dtype::F64, vec![1, 32], vec![0; 256])],
    );
    assert_fails(
        &["quant", "--format", "mxfp4", &p("f64.st"), o],
        &out,
        "dtype F64",
    );

    // 1-D and 3-D.
    write_tensors(
        &c.path("1d.st"),
        vec![("x", Dtype::F32, vec![32], vec![0; 128])],
    );
    assert_fails(
        &["quant", "--format", "mxfp8-e4m3", &p("1d.st"), o],
        &out,
        "1-D",
    );
    write_tensors(
        &c.path("3d.st"),
        vec![("x", Dtype::F32, vec![1, 1, 32], vec![0; 128])],
    );
    assert_fails(&["quant", "--format", "nvfp4", &p("3d.st"), o], &out, "3-D");

    // Last dimension not a multiple of the block: 48 for MX (32), 24 for NVFP4 (16).
    write_x(&c.path("c48.st"), 2, 48, &[1.0; 96]);
    assert_fails(
        &["quant", "--format", "mxfp4", &p("c48.st"), o],
        &out,
        "multiple of the mxfp4 block size 32",
    );
    write_x(&c.path("c24.st"), 1, 24, &[1.0; 24]);
    assert_fails(
        &["quant", "--format", "nvfp4", &p("c24.st"), o],
        &out,
        "block size 16",
    );
    // ... while 48 is fine for NVFP4.
    let ok = m3(&["quant", "--format", "nvfp4", &p("c48.st"), o]);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    std::fs::remove_file(&out).unwrap();

    // Unknown format / rule, and a rule for NVFP4.
    write_x(&c.path("good.st"), 1, 32, &[1.0; 32]);
    assert_fails(
        &["quant", "--format", "mxfp6", &p("good.st"), o],
        &out,
        "unknown --format `mxfp6`",
    );
    assert_fails(
        &[
            "quant",
            "--format",
            "mxfp4",
            "--scale-rule",
            "up",
            &p("good.st"),
            o,
        ],
        &out,
        "unknown --scale-rule `up`",
    );
    assert_fails(
        &[
            "quant",
            "--format",
            "nvfp4",
            "--scale-rule",
            "even",
            &p("good.st"),
            o,
        ],
        &out,
        "MX formats only",
    );

    // An existing output is not clobbered by a failing run.
    std::fs::write(&out, b"keep").unwrap();
    let r = m3(&["quant", "--format", "mxfp4", &p("c48.st"), o]);
    assert!(!r.status.success());
    assert_eq!(std::fs::read(&out).unwrap(), b"keep");
}

#[test]
fn dequant_bad_inputs() {
    let c = Case::new();
    let out = c.path("out.safetensors");
    let o = out.to_str().unwrap();
    let p = |n: &str| c.path(n).to_str().unwrap().to_string();

    assert_fails(&["dequant", &p("missing.st"), o], &out, "missing.st");
    std::fs::write(c.path("junk.bin"), [0xFFu8; 64]).unwrap();
    assert_fails(
        &["dequant", &p("junk.bin"), o],
        &out,
        "not a valid safetensors",
    );
    // A plain F32 `x` is not a quantized file.
    write_x(&c.path("x.st"), 1, 32, &[1.0; 32]);
    assert_fails(&["dequant", &p("x.st"), o], &out, "no tensor `weight`");
    // `weight` without any scale.
    write_tensors(
        &c.path("w.st"),
        vec![("weight", Dtype::U8, vec![1, 16], vec![0; 16])],
    );
    assert_fails(&["dequant", &p("w.st"), o], &out, "no scale tensor");
    // MXFP4 with a scale of the wrong shape.
    write_tensors(
        &c.path("bad_scale.st"),
        vec![
            ("weight", Dtype::U8, vec![1, 16], vec![0; 16]),
            ("weight_scale", Dtype::U8, vec![1, 2], vec![127; 2]),
        ],
    );
    assert_fails(
        &["dequant", &p("bad_scale.st"), o],
        &out,
        "`weight_scale` has shape [1, 2], expected [1, 1]",
    );
    // MXFP8 marked by weight_scale_inv but with a U8 weight.
    write_tensors(
        &c.path("bad_w.st"),
        vec![
            ("weight", Dtype::U8, vec![1, 32], vec![0; 32]),
            ("weight_scale_inv", Dtype::U8, vec![1, 1], vec![127]),
        ],
    );
    assert_fails(
        &["dequant", &p("bad_w.st"), o],
        &out,
        "expected F8_E4M3 or F8_E5M2",
    );
    // NVFP4 with a non-F32 global scale.
    write_tensors(
        &c.path("bad_g.st"),
        vec![
            ("weight", Dtype::U8, vec![1, 8], vec![0; 8]),
            ("weight_scale", Dtype::F8_E4M3, vec![1, 1], vec![0x38]),
            ("weight_scale_2", Dtype::U8, vec![], vec![1]),
        ],
    );
    assert_fails(&["dequant", &p("bad_g.st"), o], &out, "weight_scale_2");
}
