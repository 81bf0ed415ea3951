//! `m3 batch` end to end on a synthetic `tiny` checkpoint: JSONL in and
//! out, malformed lines reported by line number while the others run, the
//! summary line, tokens equal to `m3 generate`'s, and identical tokens with
//! a tiny cache (preemption) and with speculative decoding.

use std::path::Path;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::Value;

/// The token the `stop` line stops on (request "a"'s fourth output token,
/// filled in once known; 0 before).
static STOP: AtomicU64 = AtomicU64::new(0);

fn m3(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_m3"))
        .args(args)
        .output()
        .expect("spawn m3")
}

fn ok(args: &[&str]) -> Output {
    let o = m3(args);
    assert!(
        o.status.success(),
        "m3 {args:?} failed:\nstdout: {}\nstderr: {}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

const INPUT: &str = r#"{"id": "a", "tokens": [1, 2, 3, 4, 5, 6, 7, 8], "max_tokens": 12}
{"id": "b", "prompt": "hello world, hello world, hello", "max_tokens": 9}
this is not json

{"id": 7, "tokens": [1, 2, 3, 4, 5, 6, 7, 8], "max_tokens": 12, "temperature": 0.8, "seed": 3}
{"id": "bad", "tokens": [99999]}
{"tokens": [10, 11, 12, 10, 11, 12, 10, 11, 12, 10, 11, 12, 10, 11, 12, 10, 11, 12], "max_tokens": 16}
{"id": "ten", "tokens": [1, 2], "max_tokens": "ten"}
{"id": "stop", "tokens": [1, 2, 3, 4, 5, 6, 7, 8], "max_tokens": 12, "stop": [[STOP]]}
"#;

fn batch(dir: &Path, model: &Path, name: &str, extra: &[&str]) -> (Vec<Value>, String, String) {
    let input = dir.join("in.jsonl");
    std::fs::write(
        &input,
        INPUT.replace("STOP", &STOP.load(Ordering::Relaxed).to_string()),
    )
    .unwrap();
    let out = dir.join(name);
    let mut args = vec![
        "batch",
        "--input",
        input.to_str().unwrap(),
        "--output",
        out.to_str().unwrap(),
        "--model",
        model.to_str().unwrap(),
        "--threads",
        "1",
        "--ignore-eos",
    ];
    args.extend_from_slice(extra);
    let o = ok(&args);
    let text = std::fs::read_to_string(&out).unwrap();
    let recs = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    (
        recs,
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn tokens(v: &Value) -> Vec<u64> {
    v["tokens"]
        .as_array()
        .unwrap_or_else(|| panic!("no tokens in {v}"))
        .iter()
        .map(|t| t.as_u64().unwrap())
        .collect()
}

/// `m3 generate`'s token list (its stderr summary ends with `tokens [..]`).
fn generate(model: &Path, extra: &[&str]) -> Vec<u64> {
    let mut args = vec![
        "generate",
        "--model",
        model.to_str().unwrap(),
        "--threads",
        "1",
        "--ignore-eos",
    ];
    args.extend_from_slice(extra);
    let o = ok(&args);
    let err = String::from_utf8_lossy(&o.stderr);
    let list = err
        .rsplit("tokens [")
        .next()
        .unwrap()
        .split(']')
        .next()
        .unwrap();
    list.split(',').map(|t| t.trim().parse().unwrap()).collect()
}

#[test]
fn batch_end_to_end() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("tiny");
    ok(&[
        "synth",
        "--preset",
        "tiny",
        "--experts",
        "mxfp4",
        "--out",
        model.to_str().unwrap(),
    ]);

    let (first, _, _) = batch(tmp.path(), &model, "first.jsonl", &[]);
    STOP.store(tokens(&first[0])[3], Ordering::Relaxed);
    let (recs, stdout, stderr) = batch(tmp.path(), &model, "out.jsonl", &[]);
    // One record per non-empty line, in input order.
    assert_eq!(recs.len(), 8);
    assert!(
        recs[6]["error"]
            .as_str()
            .unwrap()
            .contains("line 8: `max_tokens` must be"),
        "{}",
        recs[6]
    );
    let a = tokens(&recs[0]);
    let cut = a.iter().position(|&t| t == a[3]).unwrap() + 1;
    assert_eq!(recs[7]["finish_reason"], "stop", "{}", recs[7]);
    assert_eq!(tokens(&recs[7]), a[..cut]);
    assert_eq!(recs[0]["id"], "a");
    assert_eq!(recs[2]["line"], 3);
    assert!(recs[2]["error"]
        .as_str()
        .unwrap()
        .starts_with("line 3: not JSON"));
    assert!(stderr.contains("line 3: not JSON"), "{stderr}");
    assert_eq!(recs[4]["id"], "bad");
    assert!(
        recs[4]["error"].as_str().unwrap().contains("line 6"),
        "{}",
        recs[4]
    );
    assert_eq!(
        recs[5]["id"], 7,
        "a line without an id is named by its line number"
    );
    for i in [0, 1, 3, 5] {
        assert_eq!(recs[i]["finish_reason"], "length", "{}", recs[i]);
    }
    assert_eq!(tokens(&recs[0]).len(), 12);
    assert!(recs[1]["text"].is_string());
    for key in [
        "requests/s",
        "output tokens/s",
        "mean acceptance length",
        "preemptions",
    ] {
        assert!(stdout.contains(key), "summary lacks {key}: {stdout}");
    }
    // No temporary file left beside the output.
    let names: Vec<String> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(!names.iter().any(|n| n.contains(".tmp-")), "{names:?}");

    // The same tokens as the single-request engine behind `m3 generate`.
    assert_eq!(
        tokens(&recs[0]),
        generate(
            &model,
            &["--tokens", "1,2,3,4,5,6,7,8", "--max-tokens", "12"]
        )
    );
    assert_eq!(
        tokens(&recs[3]),
        generate(
            &model,
            &[
                "--tokens",
                "1,2,3,4,5,6,7,8",
                "--max-tokens",
                "12",
                "--temperature",
                "0.8",
                "--seed",
                "3"
            ]
        )
    );

    // A cache of 9 blocks of 4 positions (the largest request needs all 9)
    // forces preemption; speculative
    // decoding with prompt lookup: the tokens must not change.
    let small = [
        "--kv-blocks",
        "9",
        "--block-size",
        "4",
        "--max-batch-tokens",
        "8",
    ];
    let (tiny, stdout, _) = batch(tmp.path(), &model, "tiny.jsonl", &small);
    let preempted: u64 = tiny.iter().filter_map(|r| r["preemptions"].as_u64()).sum();
    assert!(preempted > 0, "{stdout}");
    let (spec, stdout, _) = batch(tmp.path(), &model, "spec.jsonl", &["--spec-tokens", "3"]);
    assert!(
        !stdout.contains("mean acceptance length n/a"),
        "no verify ran: {stdout}"
    );
    for i in [0, 1, 3, 5] {
        assert_eq!(tokens(&tiny[i]), tokens(&recs[i]), "tiny cache, record {i}");
        assert_eq!(
            tokens(&spec[i]),
            tokens(&recs[i]),
            "speculative, record {i}"
        );
    }

    // A missing input file is a one-line error naming it.
    let o = m3(&[
        "batch",
        "--input",
        "/nonexistent/in.jsonl",
        "--output",
        "/tmp/x.jsonl",
    ]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("/nonexistent/in.jsonl"));
}
