//! `m3 bench` on the CPU: `--online-quant ptpc_fp8` converts the generated
//! weights and the bytes a step moves are counted in the converted form;
//! the GPU bench (a device-generated model) refuses exclusion patterns.

use std::process::Command;

fn m3() -> Command {
    Command::new(env!("CARGO_BIN_EXE_m3"))
}

/// Runs a short CPU bench of `tiny` with bf16 dense weights (so PTPC's
/// one-byte codes halve the converted linears' bytes) and returns its
/// stdout and the `bytes/step` figure in MB.
fn bench(extra: &[&str]) -> (String, f64) {
    let out = m3()
        .args([
            "bench",
            "--preset",
            "tiny",
            "--dense",
            "bf16",
            "--prompt-len",
            "8",
            "--decode-steps",
            "2",
            "--probe-mib",
            "8",
            "--threads",
            "1",
        ])
        .args(extra)
        .output()
        .expect("running m3 bench");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "m3 bench {extra:?} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mb = stdout
        .lines()
        .find_map(|l| l.strip_prefix("bytes/step: "))
        .and_then(|r| r.split_whitespace().next())
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no bytes/step line in:\n{stdout}"));
    (stdout, mb)
}

#[test]
fn online_quant_converts_the_weights_and_counts_their_bytes() {
    let (plain_out, plain) = bench(&[]);
    let (ptpc_out, ptpc) = bench(&["--online-quant", "ptpc_fp8"]);
    assert!(plain_out.contains("online quant none"), "{plain_out}");
    assert!(ptpc_out.contains("online quant ptpc_fp8"), "{ptpc_out}");
    // the attention and dense-MLP linears go from 2 bytes a value to ~1
    assert!(
        ptpc < plain * 0.95,
        "bytes/step {ptpc} MB with PTPC vs {plain} MB without: the converted form was not counted"
    );
    // excluding every attention projection brings part of the bytes back
    let (_, excl) = bench(&[
        "--online-quant",
        "ptpc_fp8",
        "--online-quant-exclude",
        "self_attn.",
    ]);
    assert!(ptpc < excl && excl < plain, "{ptpc} < {excl} < {plain}");
}

#[test]
fn online_quant_bad_inputs_are_one_line_errors() {
    for (args, want) in [
        (
            &[
                "bench",
                "--backend",
                "gpu",
                "--online-quant",
                "ptpc_fp8",
                "--online-quant-exclude",
                "o_proj",
            ][..],
            "no tensor names",
        ),
        (
            &["bench", "--backend", "gpu", "--weights", "fp6"][..],
            "not one of mxfp4, nvfp4, bf16",
        ),
        (
            &[
                "bench",
                "--preset",
                "tiny",
                "--online-quant",
                "ptpc_fp8",
                "--online-quant-exclude",
                "no_such_tensor",
            ][..],
            "no_such_tensor",
        ),
        (
            &["bench", "--preset", "tiny", "--path", "mono"][..],
            "the mono path is the GPU's",
        ),
        (&["bench", "--path", "fast"][..], "invalid value 'fast'"),
    ] {
        let out = m3().args(args).output().expect("running m3 bench");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(err.contains(want), "{args:?}: stderr {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}
