//! `m3 serve` as a process: it starts on a synthetic `tiny` checkpoint made
//! by `m3 synth` (chat template included), answers, drains a stream in
//! flight on SIGTERM and exits 0; startup refusals are one-line errors.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

fn synth(dir: &std::path::Path) -> std::path::PathBuf {
    let model = dir.join("tiny");
    let o = Command::new(env!("CARGO_BIN_EXE_m3"))
        .args([
            "synth",
            "--preset",
            "tiny",
            "--experts",
            "mxfp4",
            "-q",
            "--out",
        ])
        .arg(&model)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    for f in ["tokenizer_config.json", "generation_config.json"] {
        assert!(model.join(f).is_file(), "m3 synth wrote no {f}");
    }
    model
}

/// Kills the server if a test fails before it exits.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start(model: &std::path::Path, extra: &[&str]) -> (Server, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_m3"))
        .args(["serve", "--backend", "cpu", "--port", "0", "--model"])
        .arg(model)
        .args(extra)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let err = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            if let Some(rest) = line.split(" on http://").nth(1) {
                let _ = tx.send(rest.split_whitespace().next().unwrap_or("").to_string());
            }
        }
    });
    let addr = rx
        .recv_timeout(Duration::from_secs(120))
        .expect("m3 serve printed no address");
    (Server(child), format!("http://{addr}"))
}

#[test]
fn serves_then_drains_on_sigterm() {
    let tmp = tempfile::tempdir().unwrap();
    let model = synth(tmp.path());
    let (mut server, base) = start(&model, &[]);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let c = reqwest::Client::new();
        // The checkpoint's template is used: a chat answer, reasoning split.
        let v: Value = c
            .post(format!("{base}/v1/chat/completions"))
            .json(&json!({"messages":[{"role":"user","content":"hi"}],"max_tokens":4,"temperature":0,"ignore_eos":true}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(v["usage"]["completion_tokens"], 4, "{v}");
        assert!(v["choices"][0]["message"]["reasoning_content"].is_string(), "{v}");
        // A long stream is in flight when SIGTERM arrives: it completes.
        let mut r = c
            .post(format!("{base}/v1/completions"))
            .json(&json!({"prompt":"abc","max_tokens":400,"temperature":0,"stream":true,"ignore_eos":true}))
            .send()
            .await
            .unwrap();
        let first = r.chunk().await.unwrap().unwrap();
        assert!(first.starts_with(b"data: "));
        let pid = server.0.id().to_string();
        assert!(Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success());
        let mut body = String::new();
        while let Some(ch) = r.chunk().await.unwrap() {
            body.push_str(&String::from_utf8_lossy(&ch));
        }
        // Most of the stream came after the signal.
        let after = body.matches("data: ").count();
        assert!(after > 100, "only {after} events after SIGTERM: was it drained?");
        assert!(body.trim_end().ends_with("data: [DONE]"), "{body}");
        assert!(body.contains("\"finish_reason\":\"length\""), "{body}");
    });
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = server.0.try_wait().unwrap() {
            break s;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "no exit after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "m3 serve exited with {status}");
}

/// `--kv-cache-dtype nvfp4` (ARCHITECTURE.md, NVFP4 KV cache) serves on
/// the CPU backend.
#[test]
fn serves_with_an_nvfp4_kv_cache() {
    let tmp = tempfile::tempdir().unwrap();
    let model = synth(tmp.path());
    let (_server, base) = start(&model, &["--kv-cache-dtype", "nvfp4"]);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let v: Value = reqwest::Client::new()
            .post(format!("{base}/v1/completions"))
            .json(&json!({"prompt":"hello","max_tokens":6,"temperature":0,"ignore_eos":true}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(v["usage"]["completion_tokens"], 6, "{v}");
    });
}

#[test]
fn startup_refusals_are_one_line_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let model = synth(tmp.path());
    let run = |extra: &[&str]| {
        let o = Command::new(env!("CARGO_BIN_EXE_m3"))
            .args(["serve", "--backend", "cpu", "--port", "0", "--model"])
            .arg(&model)
            .args(extra)
            .output()
            .unwrap();
        assert!(!o.status.success(), "m3 serve {extra:?} started");
        String::from_utf8_lossy(&o.stderr).into_owned()
    };
    // (the CPU serves --tensor-parallel-size N as the sharded math's proof)
    let e = run(&["--tensor-parallel-size", "0"]);
    assert!(
        e.contains("--tensor-parallel-size must be at least 1"),
        "{e}"
    );
    let e = run(&["--kv-blocks", "4", "--max-model-len", "4096"]);
    assert!(
        e.contains("--max-model-len 4096") && e.contains("--kv-blocks"),
        "{e}"
    );
    let e = run(&["--host", "not a host"]);
    assert!(e.contains("--host"), "{e}");
    let bad = tmp.path().join("bad.jinja");
    std::fs::write(&bad, "{% if %}").unwrap();
    let e = run(&["--chat-template", bad.to_str().unwrap()]);
    assert!(
        e.contains("--chat-template") && e.contains("syntax error"),
        "{e}"
    );
}
