//! End to end on the CPU backend: regenerate two committed cases'
//! checkpoints with `m3 synth`, run `m3 forward --teacher` and hold the
//! dump to the case (the same path `cargo xtask golden` takes). Takes a few
//! seconds once `m3` is built (CI builds it with the workspace first).

use std::path::PathBuf;
use std::process::Command;

use m3_golden::{cases_dir, compare, table_lines, Case, Taps};

/// The `m3` binary: `M3_BIN`, or built here with cargo.
fn m3_bin() -> PathBuf {
    if let Ok(p) = std::env::var("M3_BIN") {
        return PathBuf::from(p);
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let st = Command::new(cargo)
        .current_dir(&root)
        .args(["build", "--quiet", "-p", "m3-cli"])
        .status()
        .expect("running cargo build -p m3-cli");
    assert!(st.success(), "cargo build -p m3-cli failed");
    let target = std::env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| root.join("target"));
    target.join("debug").join("m3")
}

fn run_case(m3: &PathBuf, name: &str) {
    let rep = forward_report(m3, name, None);
    for l in table_lines(&rep) {
        println!("{l}");
    }
    assert!(
        rep.passed(),
        "{name}: first divergence {:?}",
        rep.first_divergence()
    );
}

/// `m3 forward --teacher` on a committed case's checkpoint (made by
/// `m3 synth`), with the case's options or another `--kv-dtype`, held to
/// the case.
fn forward_report(m3: &PathBuf, name: &str, kv_dtype: Option<&str>) -> m3_golden::Report {
    let case = Case::load(&cases_dir(), name).expect("committed case");
    assert!(
        case.meta.config_edit.is_none(),
        "pick a case without a config edit"
    );
    let tmp = tempfile::tempdir().unwrap();
    let ckpt = tmp.path().join("ckpt");
    let r = &case.meta.recipe;
    let st = Command::new(m3)
        .args([
            "synth",
            "-q",
            "--preset",
            &r.preset,
            "--experts",
            &r.experts,
        ])
        .args(["--dense", &r.dense, "--seed", &r.seed.to_string()])
        .arg("--out")
        .arg(&ckpt)
        .status()
        .unwrap();
    assert!(st.success(), "m3 synth failed");
    let dump = tmp.path().join("dump.safetensors");
    let o = &case.meta.options;
    assert!(!o.nvfp4_as_mxfp4);
    let out = Command::new(m3)
        .arg("forward")
        .arg("--model")
        .arg(&ckpt)
        .args(["--tokens", &case.tokens_arg()])
        .args(["--kv-dtype", kv_dtype.unwrap_or(&o.kv_dtype)])
        .args([
            "--act",
            &o.act,
            "--selection",
            &o.selection,
            "--backend",
            "cpu",
        ])
        .arg("--teacher")
        .arg(&case.taps_path)
        .arg("--dump")
        .arg(&dump)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "m3 forward failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    compare(&case, &Taps::load(&dump).unwrap(), "cpu")
}

#[test]
fn cpu_backend_matches_the_reference_on_committed_cases() {
    let m3 = m3_bin();
    // A short bf16 case and a long w4a4 case (sparse selection engaged,
    // MXFP4 weights and activations, MXFP8 dense).
    run_case(&m3, "tiny-bf16-short");
    run_case(&m3, "tiny-mxfp4-a4-long");
}

/// The NVFP4-cache case passes with the NVFP4 cache, and a wrong cache
/// codec (the same run with the FP8 cache) is caught at the first layer.
#[test]
fn nvfp4_cache_case_passes_and_a_wrong_cache_codec_is_caught() {
    let m3 = m3_bin();
    let name = "tiny-bf16-short-kvnvfp4";
    run_case(&m3, name);
    let rep = forward_report(&m3, name, Some("fp8_e4m3"));
    assert!(!rep.passed(), "an FP8 cache read passed as NVFP4");
    let first = rep.first_divergence().expect("a divergence");
    assert_eq!(first.layer, Some(0), "{first:?}");
}
