//! `m3 generate --spec-tokens K [--verify ...]` and `m3 batch --spec-tokens K`
//! end to end on synthetic `tiny` checkpoints written by `m3 synth` (with and
//! without a `dspark/` draft).

use std::path::Path;
use std::process::{Command, Output};

fn m3(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_m3"))
        .args(args)
        .output()
        .expect("run m3")
}

fn ok(o: &Output) {
    assert!(
        o.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

fn synth(dir: &Path, name: &str, draft_layers: &str) -> String {
    let ck = dir.join(name);
    let ck_s = ck.to_str().expect("utf-8 path").to_string();
    ok(&m3(&[
        "synth",
        "--out",
        &ck_s,
        "--experts",
        "mxfp4",
        "--draft-layers",
        draft_layers,
        "-q",
    ]));
    ck_s
}

/// The `tokens [...]` list of generate's report line.
fn tokens(o: &Output) -> String {
    let err = String::from_utf8_lossy(&o.stderr);
    let line = err
        .lines()
        .find(|l| l.contains("| tokens ["))
        .unwrap_or_else(|| panic!("no report line in {err}"));
    line.rsplit("| tokens ")
        .next()
        .unwrap_or_default()
        .to_string()
}

#[test]
fn generate_speculative_matches_plain_and_reports_acceptance() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ck = synth(dir.path(), "tiny", "2");
    let base = [
        "generate",
        "--model",
        &ck,
        "--tokens",
        "5,17,99,3,250,7",
        "--max-tokens",
        "12",
        "--ignore-eos",
    ];
    let plain = m3(&base);
    ok(&plain);
    for k in ["1", "3", "7"] {
        let mut a = base.to_vec();
        a.extend(["--spec-tokens", k]);
        let o = m3(&a);
        ok(&o);
        assert_eq!(tokens(&o), tokens(&plain), "--spec-tokens {k}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("drafter dspark"), "{err}");
        assert!(err.contains("mean acceptance length"), "{err}");
    }
    // Sampled, with each verifier: runs and reports.
    for v in ["greedy", "rejection", "block"] {
        let mut a = base.to_vec();
        a.extend(["--spec-tokens", "3", "--verify", v, "--temperature", "0.9"]);
        let o = m3(&a);
        ok(&o);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("verifies"), "{err}");
    }
    // Bad arguments: one clear line.
    let mut a = base.to_vec();
    a.extend(["--spec-tokens", "8"]);
    let o = m3(&a);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("above 7"));
    let mut a = base.to_vec();
    a.extend(["--spec-tokens", "2", "--verify", "maybe"]);
    let o = m3(&a);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("--verify") && err.contains("maybe"), "{err}");
}

#[test]
fn without_a_draft_generate_and_batch_fall_back_to_ngram() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ck = synth(dir.path(), "nodraft", "0");
    let o = m3(&[
        "generate",
        "--model",
        &ck,
        "--tokens",
        "1,2,3,1,2,3,1,2",
        "--max-tokens",
        "6",
        "--ignore-eos",
        "--spec-tokens",
        "2",
    ]);
    ok(&o);
    assert!(String::from_utf8_lossy(&o.stderr).contains("drafter ngram"));

    let with = synth(dir.path(), "draft", "1");
    let input = dir.path().join("in.jsonl");
    std::fs::write(
        &input,
        "{\"tokens\": [5, 6, 7, 8], \"max_tokens\": 5}\n{\"tokens\": [9, 10, 11], \"max_tokens\": 4}\n",
    )
    .unwrap();
    let mut outs = Vec::new();
    for (model, spec) in [(&with, "0"), (&with, "3"), (&ck, "3")] {
        let out = dir.path().join(format!("out{}.jsonl", outs.len()));
        let o = m3(&[
            "batch",
            "--model",
            model,
            "--input",
            input.to_str().unwrap(),
            "--output",
            out.to_str().unwrap(),
            "--spec-tokens",
            spec,
            "--ignore-eos",
        ]);
        ok(&o);
        let err = String::from_utf8_lossy(&o.stderr).to_string();
        if spec != "0" {
            let want = if model == &with {
                "drafter dspark"
            } else {
                "drafter ngram"
            };
            assert!(err.contains(want), "{err}");
        }
        outs.push(std::fs::read_to_string(&out).unwrap());
    }
    // Speculation does not change greedy outputs.
    assert_eq!(outs[0], outs[1]);
}

#[test]
fn generate_and_batch_with_the_eagle3_draft() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ck = dir.path().join("eagle");
    let ck = ck.to_str().expect("utf-8 path").to_string();
    ok(&m3(&[
        "synth",
        "--out",
        &ck,
        "--experts",
        "mxfp4",
        "--draft-layers",
        "0",
        "--eagle3",
        "-q",
    ]));
    assert!(Path::new(&ck).join("eagle3/config.json").is_file());
    assert!(!Path::new(&ck).join("dspark").exists());
    let base = [
        "generate",
        "--model",
        &ck,
        "--tokens",
        "5,17,99,3,250,7",
        "--max-tokens",
        "12",
        "--ignore-eos",
    ];
    let plain = m3(&base);
    ok(&plain);
    for (k, draft) in [("1", "eagle3"), ("3", "eagle3"), ("7", "auto")] {
        let mut a = base.to_vec();
        a.extend(["--spec-tokens", k, "--draft", draft]);
        let o = m3(&a);
        ok(&o);
        assert_eq!(
            tokens(&o),
            tokens(&plain),
            "--spec-tokens {k} --draft {draft}"
        );
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("drafter eagle3"), "{err}");
        assert!(err.contains("mean acceptance length"), "{err}");
    }
    // Sampled with the rejection verifier: runs and reports.
    let mut a = base.to_vec();
    a.extend([
        "--spec-tokens",
        "3",
        "--draft",
        "eagle3",
        "--verify",
        "rejection",
        "--temperature",
        "0.9",
    ]);
    let o = m3(&a);
    ok(&o);
    assert!(String::from_utf8_lossy(&o.stderr).contains("verifies"));
    // A draft the checkpoint lacks: one clear error.
    let mut a = base.to_vec();
    a.extend(["--spec-tokens", "3", "--draft", "dspark"]);
    let o = m3(&a);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("no dspark/config.json"), "{err}");
    let nod = synth(dir.path(), "nodraft", "0");
    let o = m3(&[
        "generate",
        "--model",
        &nod,
        "--tokens",
        "1,2,3",
        "--max-tokens",
        "3",
        "--spec-tokens",
        "2",
        "--draft",
        "eagle3",
    ]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("no eagle3/config.json"), "{err}");

    // batch: the same outputs with and without the draft.
    let input = dir.path().join("in.jsonl");
    std::fs::write(
        &input,
        "{\"tokens\": [5, 6, 7, 8], \"max_tokens\": 5}\n{\"tokens\": [9, 10, 11], \"max_tokens\": 4}\n",
    )
    .unwrap();
    let mut outs = Vec::new();
    for spec in ["0", "3"] {
        let out = dir.path().join(format!("out{spec}.jsonl"));
        let o = m3(&[
            "batch",
            "--model",
            &ck,
            "--input",
            input.to_str().unwrap(),
            "--output",
            out.to_str().unwrap(),
            "--spec-tokens",
            spec,
            "--draft",
            "eagle3",
            "--ignore-eos",
        ]);
        ok(&o);
        if spec != "0" {
            let err = String::from_utf8_lossy(&o.stderr);
            assert!(err.contains("drafter eagle3"), "{err}");
        }
        outs.push(std::fs::read_to_string(&out).unwrap());
    }
    assert_eq!(outs[0], outs[1]);
    // The options are documented.
    let o = m3(&["serve", "--help"]);
    assert!(String::from_utf8_lossy(&o.stdout).contains("--draft"));
    let o = m3(&["synth", "--help"]);
    assert!(String::from_utf8_lossy(&o.stdout).contains("--eagle3"));
}
