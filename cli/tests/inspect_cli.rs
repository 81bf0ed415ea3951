//! `m3 inspect` end to end: the Python-written fixture, and a broken dir.

use std::path::PathBuf;
use std::process::Command;

fn m3() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_m3"));
    c.env("M3_LOG", "warn");
    c
}

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/py_ckpt")
}

#[test]
fn inspect_python_fixture() {
    let out = m3().arg("inspect").arg(fixture()).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "stdout:\n{stdout}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = |label: &str| {
        stdout
            .lines()
            .find(|l| l.starts_with(label))
            .unwrap_or_else(|| panic!("no `{label}` row in:\n{stdout}"))
            .to_string()
    };
    // 2 layers... only layer 1 is MoE: 4 experts x 3 weights x (weight + scale) = 24 tensors,
    // 4 x 3 x 32 x 64 = 24576 parameters.
    let experts = line("routed experts");
    assert!(experts.contains("mxfp4"), "{experts}");
    let cols: Vec<&str> = experts.split_whitespace().collect();
    assert!(cols.contains(&"24") && cols.contains(&"24576"), "{experts}");
    assert!(line("attn q").contains("mxfp8(e4m3)"));
    assert!(line("embed").contains("bf16") && line("embed").contains("[128, 64]"));
    assert!(line("router").contains("f32"));
    assert!(stdout.contains("vision tensors skipped at load: 1"));
    assert!(!stdout.contains("warning:"), "{stdout}");
    assert!(stdout.contains("ok: every tensor"));
}

#[test]
fn inspect_broken_dir_fails_with_one_line() {
    let d = tempfile::tempdir().unwrap();
    for f in [
        "config.json",
        "model.safetensors.index.json",
        "model-00001-of-00002.safetensors",
    ] {
        std::fs::copy(fixture().join(f), d.path().join(f)).unwrap();
    }
    // Shard 2 replaced by a file whose header length runs past its end.
    let mut bytes = 1_000_000u64.to_le_bytes().to_vec();
    bytes.extend_from_slice(b"{}");
    std::fs::write(d.path().join("model-00002-of-00002.safetensors"), bytes).unwrap();
    let out = m3().arg("inspect").arg(d.path()).output().unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("model-00002-of-00002.safetensors") && stderr.contains("header length"),
        "{stderr}"
    );

    // A NaN scale byte is reported as a warning, and the checkpoint still validates.
    let d = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(fixture()).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), d.path().join(e.file_name())).unwrap();
    }
    let ck = d.path().join("model-00001-of-00002.safetensors");
    let mut bytes = std::fs::read(&ck).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let h: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let name = "language_model.model.layers.0.self_attn.k_proj.weight_scale_inv";
    let begin = h[name]["data_offsets"][0].as_u64().unwrap() as usize;
    bytes[8 + n + begin] = 0xFF;
    std::fs::write(&ck, bytes).unwrap();
    let out = m3().arg("inspect").arg(d.path()).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(
        stdout.contains(&format!("warning: {name}")) && stdout.contains("1 NaN scale bytes"),
        "{stdout}"
    );
}
