//! `m3 convert` refusals and atomicity: one-line errors for bad inputs, no
//! overwrite without --force, stale temp directories cleaned, and
//! `--verify` catching a corrupted copy.

use std::path::Path;
use std::process::{Command, Output};

fn m3(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_m3"))
        .args(args)
        .output()
        .expect("spawn m3")
}

fn synth_tiny(dir: &Path) {
    let o = m3(&[
        "synth",
        "--preset",
        "tiny",
        "--experts",
        "nvfp4",
        "--out",
        dir.to_str().unwrap(),
        "-q",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

/// The command failed with exactly one stderr line, `error: ...`, holding `needle`.
fn fails_with(o: &Output, needle: &str) {
    let err = String::from_utf8_lossy(&o.stderr);
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(!o.status.success(), "expected failure, stderr: {err}");
    assert_eq!(lines.len(), 1, "want one line, got: {err}");
    assert!(
        lines[0].starts_with("error: ") && lines[0].contains(needle),
        "want `{needle}` in: {err}"
    );
}

#[test]
fn bad_inputs_give_one_line_errors() {
    let root = tempfile::tempdir().unwrap();
    let out = root.path().join("out");
    let out_s = out.to_str().unwrap();
    let missing = root.path().join("nope");
    fails_with(
        &m3(&[
            "convert",
            "--from",
            missing.to_str().unwrap(),
            "--to",
            out_s,
        ]),
        "no such directory",
    );
    let empty = root.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    fails_with(
        &m3(&["convert", "--from", empty.to_str().unwrap(), "--to", out_s]),
        "not a checkpoint",
    );
    // A config but no shards.
    std::fs::write(empty.join("config.json"), "{}").unwrap();
    fails_with(
        &m3(&["convert", "--from", empty.to_str().unwrap(), "--to", out_s]),
        "not a checkpoint",
    );
    // Shards whose config is not a model config.
    let ck = root.path().join("ck");
    synth_tiny(&ck);
    std::fs::write(ck.join("config.json"), "{\"hidden_size\": 3}").unwrap();
    fails_with(
        &m3(&["convert", "--from", ck.to_str().unwrap(), "--to", out_s]),
        "config.json",
    );
    // A truncated shard names the shard.
    let ck2 = root.path().join("ck2");
    synth_tiny(&ck2);
    let shard = ck2.join("model-00002-of-00005.safetensors");
    let bytes = std::fs::read(&shard).unwrap();
    std::fs::write(&shard, &bytes[..bytes.len() / 2]).unwrap();
    fails_with(
        &m3(&["convert", "--from", ck2.to_str().unwrap(), "--to", out_s]),
        "model-00002-of-00005.safetensors",
    );
    assert!(!out.exists(), "a failed run must leave no output");
    let left: Vec<_> = std::fs::read_dir(root.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(
        left.iter().all(|n| !n.to_string_lossy().contains(".tmp-")),
        "temp dir left behind: {left:?}"
    );
    fails_with(
        &m3(&["synth", "--preset", "huge", "--out", out_s]),
        "unknown preset",
    );
}

#[test]
fn refuses_to_overwrite_without_force_and_cleans_stale_temps() {
    let root = tempfile::tempdir().unwrap();
    let (a, b) = (root.path().join("a"), root.path().join("b"));
    synth_tiny(&a);
    let (a_s, b_s) = (a.to_str().unwrap(), b.to_str().unwrap());
    // An interrupted earlier run: a temp dir of a dead process with partial files.
    let stale = root.path().join("b.tmp-4000000001");
    std::fs::create_dir(&stale).unwrap();
    std::fs::write(stale.join("model-00001-of-00005.safetensors"), b"partial").unwrap();
    let o = m3(&["convert", "--from", a_s, "--to", b_s, "-q"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(!stale.exists(), "stale temp dir must be removed");
    let before = std::fs::read(b.join("config.json")).unwrap();
    fails_with(
        &m3(&["convert", "--from", a_s, "--to", b_s, "-q"]),
        "already exists",
    );
    // Also synth refuses.
    fails_with(
        &m3(&["synth", "--preset", "tiny", "--out", b_s, "-q"]),
        "already exists",
    );
    assert_eq!(std::fs::read(b.join("config.json")).unwrap(), before);
    // With --force, replaced by a complete output.
    std::fs::write(b.join("junk"), b"x").unwrap();
    let o = m3(&["convert", "--from", a_s, "--to", b_s, "--force", "-q"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(!b.join("junk").exists() && b.join("model.safetensors.index.json").exists());
    // Converting into the input is refused.
    fails_with(
        &m3(&["convert", "--from", a_s, "--to", a_s, "--force"]),
        "input directory",
    );
}

/// `--verify` prints one rel L2 line per converted tensor, a summary, and
/// the conversion says it is lossy.
#[test]
fn verify_reports_rel_l2_summary_and_lossy_note() {
    let root = tempfile::tempdir().unwrap();
    let (a, b) = (root.path().join("a"), root.path().join("b"));
    synth_tiny(&a);
    let o = m3(&[
        "convert",
        "--from",
        a.to_str().unwrap(),
        "--to",
        b.to_str().unwrap(),
        "--verify",
        "-q",
    ]);
    assert!(o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("lossy"), "{err}");
    let out = String::from_utf8_lossy(&o.stdout);
    let summary = out.lines().last().unwrap();
    assert!(
        summary.starts_with("verify: 72 converted tensors, rel_l2 mean"),
        "{summary}"
    );
    assert!(summary.ends_with("copied tensors identical"), "{summary}");
}

/// `m3 convert --mxfp8-to-bf16`: the MXFP8 weights outside the routed
/// experts become their exact bf16 copies (a forward pass dumps the same
/// bytes as on the input), with NVFP4 experts converted in the same run;
/// a block outside the exact range is refused by tensor and leaves no
/// output; MXFP8 experts are refused (the output config is Quark's).
#[test]
fn mxfp8_to_bf16_copies_exactly_and_refuses_inexact_blocks() {
    let root = tempfile::tempdir().unwrap();
    let s = |p: &Path| p.to_str().unwrap().to_string();
    let synth = |dir: &Path, experts: &str| {
        let o = m3(&[
            "synth",
            "--experts",
            experts,
            "--dense",
            "mxfp8",
            "--draft-layers",
            "0",
            "--out",
            &s(dir),
            "-q",
        ]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    };
    let (a, b) = (root.path().join("a"), root.path().join("b"));
    synth(&a, "mxfp4");
    let o = m3(&[
        "convert",
        "--from",
        &s(&a),
        "--to",
        &s(&b),
        "--mxfp8-to-bf16",
        "--verify",
        "-q",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).contains("copied to bf16 with identical values"));
    let dump = |ck: &Path, out: &Path| {
        let o = m3(&[
            "forward",
            "--model",
            &s(ck),
            "--tokens",
            "3,141,59,26,5",
            "--dump",
            &s(out),
        ]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        std::fs::read(out).unwrap()
    };
    let da = dump(&a, &root.path().join("a.st"));
    assert_eq!(
        da,
        dump(&b, &root.path().join("b.st")),
        "bf16 copy changed a tap"
    );

    // NVFP4 experts: both conversions in one run
    let (n, nb) = (root.path().join("n"), root.path().join("nb"));
    synth(&n, "nvfp4");
    let o = m3(&[
        "convert",
        "--from",
        &s(&n),
        "--to",
        &s(&nb),
        "--mxfp8-to-bf16",
        "-q",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));

    // the planted error: a q_proj scale byte of 2 is outside E4M3's exact range
    let mut planted = None;
    for e in std::fs::read_dir(&a).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_none_or(|x| x != "safetensors") {
            continue;
        }
        let mut bytes = std::fs::read(&p).unwrap();
        let len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        let h: serde_json::Value = serde_json::from_slice(&bytes[8..8 + len]).unwrap();
        let hit = h.as_object().unwrap().iter().find_map(|(k, t)| {
            k.ends_with("self_attn.q_proj.weight_scale_inv")
                .then(|| (k.clone(), t["data_offsets"][0].as_u64().unwrap() as usize))
        });
        if let Some((k, begin)) = hit {
            bytes[8 + len + begin] = 2;
            std::fs::write(&p, bytes).unwrap();
            planted = Some(k);
            break;
        }
    }
    let scale = planted.expect("an MXFP8 q_proj scale");
    let c = root.path().join("c");
    let o = m3(&[
        "convert",
        "--from",
        &s(&a),
        "--to",
        &s(&c),
        "--mxfp8-to-bf16",
        "-q",
    ]);
    // one error line (after the "converting ..." notice), naming the weight
    // and the block
    let err = String::from_utf8_lossy(&o.stderr);
    let errors: Vec<&str> = err.lines().filter(|l| l.starts_with("error")).collect();
    assert!(!o.status.success() && errors.len() == 1, "{err}");
    assert!(
        errors[0].contains(scale.trim_end_matches("_scale_inv"))
            && errors[0].contains("row 0, block 0"),
        "{err}"
    );
    assert!(!c.exists(), "a refused conversion left an output");
    let leftovers: Vec<_> = std::fs::read_dir(root.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("c.tmp"))
        .collect();
    assert!(leftovers.is_empty(), "temp output left behind");

    // MXFP8 experts: refused, by name of the reason
    let (x, xo) = (root.path().join("x"), root.path().join("xo"));
    synth(&x, "mxfp8");
    fails_with(
        &m3(&[
            "convert",
            "--from",
            &s(&x),
            "--to",
            &s(&xo),
            "--mxfp8-to-bf16",
        ]),
        "routed experts are mxfp8",
    );
}
