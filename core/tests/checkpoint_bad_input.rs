//! Broken checkpoints: each gives an `Err` with a one-line message naming
//! the file / tensor / field at fault, and nothing panics.

mod checkpoint_util;

use std::path::Path;

use checkpoint_util::*;
use m3_core::checkpoint::{Checkpoint, CheckpointError, LoadOptions};

const SHARD1: &str = "model-00001-of-00002.safetensors";
const SHARD2: &str = "model-00002-of-00002.safetensors";

/// Open + load; the error message (the test fails if it loads).
fn load_err(dir: &Path, opts: LoadOptions) -> String {
    let r = std::panic::catch_unwind(|| Checkpoint::open(dir).and_then(|c| c.load(&opts)));
    match r {
        Ok(Ok(_)) => panic!("broken checkpoint loaded"),
        Ok(Err(e)) => e.to_string(),
        Err(_) => panic!("loader panicked on bad input"),
    }
}

#[test]
fn control_the_unbroken_checkpoint_loads() {
    // Without this, every test below could pass on a loader that refuses everything.
    let d = build(&Spec::tiny());
    Checkpoint::open(d.path())
        .unwrap()
        .load(&LoadOptions {
            mxfp8_to_bf16_exact: true,
            ..Default::default()
        })
        .unwrap();
}

#[test]
fn truncated_shard() {
    let d = build(&Spec::tiny());
    let p = d.path().join(SHARD2);
    let len = std::fs::metadata(&p).unwrap().len();
    let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
    f.set_len(len - 100).unwrap();
    let e = load_err(d.path(), LoadOptions::default());
    // The last tensor of shard 2 in data order is the lm_head.
    assert_names(&e, &[SHARD2, "lm_head.weight", "past the data area"]);
}

#[test]
fn header_length_past_end_of_file() {
    let d = build(&Spec::tiny());
    let p = d.path().join(SHARD1);
    let mut bytes = std::fs::read(&p).unwrap();
    let n = bytes.len() as u64 + 10;
    bytes[..8].copy_from_slice(&n.to_le_bytes());
    std::fs::write(&p, &bytes).unwrap();
    assert_names(
        &load_err(d.path(), LoadOptions::default()),
        &[SHARD1, "header length", "past the end"],
    );

    // And a file too short to hold the length at all.
    std::fs::write(&p, [1u8, 2, 3]).unwrap();
    assert_names(
        &load_err(d.path(), LoadOptions::default()),
        &[SHARD1, "too short"],
    );

    // And a header that is not JSON.
    std::fs::write(&p, raw_file(b"{\"a\": [1, 2", &[])).unwrap();
    assert_names(
        &load_err(d.path(), LoadOptions::default()),
        &[SHARD1, "not valid JSON"],
    );
}

/// Rewrite one shard's header with `edit` applied to the JSON value.
fn edit_header(path: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut h: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    edit(&mut h);
    let text = serde_json::to_vec(&h).unwrap();
    std::fs::write(path, raw_file(&text, &bytes[8 + n..])).unwrap();
}

#[test]
fn header_lies_about_offsets() {
    let spec = Spec::tiny();
    let names = m3_core::checkpoint::names::TensorNames::new(true);
    let (a, b) = (
        names.layer(0).input_layernorm(),
        names.layer(0).post_attention_layernorm(),
    );

    // Overlapping ranges: b claims a's bytes.
    let d = build(&spec);
    edit_header(&d.path().join(SHARD1), |h| {
        let a_offs = h[&a]["data_offsets"].clone();
        h[&b]["data_offsets"] = a_offs;
    });
    let e = load_err(d.path(), LoadOptions::default());
    assert_names(&e, &[SHARD1, "overlap", "layernorm.weight"]);

    // A range whose size does not match shape x dtype.
    let d = build(&spec);
    edit_header(&d.path().join(SHARD1), |h| {
        let begin = h[&a]["data_offsets"][0].as_u64().unwrap();
        h[&a]["data_offsets"][1] = serde_json::json!(begin + 6);
    });
    assert_names(
        &load_err(d.path(), LoadOptions::default()),
        &[SHARD1, &a, "needs 256"],
    );

    // Reversed offsets.
    let d = build(&spec);
    edit_header(&d.path().join(SHARD1), |h| {
        h[&a]["data_offsets"] = serde_json::json!([10, 2]);
    });
    assert_names(
        &load_err(d.path(), LoadOptions::default()),
        &[SHARD1, &a, "reversed"],
    );
}

#[test]
fn wrong_dtype() {
    let d = build_with(&Spec::tiny(), |g| {
        let t = find(g, "layers.0.self_attn.q_norm.weight");
        t.dtype = "U16"; // same byte size, wrong type
    });
    assert_names(
        &load_err(d.path(), LoadOptions::default()),
        &[
            SHARD1,
            "layers.0.self_attn.q_norm.weight",
            "U16",
            "BF16 or F32",
        ],
    );

    // An MXFP8 scale stored as F32 (sizes adjusted so the header is consistent).
    let d = build_with(&Spec::tiny(), |g| {
        let t = find(g, "layers.0.self_attn.k_proj.weight_scale_inv");
        t.dtype = "F32";
        t.data = vec![0; t.data.len() * 4];
    });
    assert_names(
        &load_err(d.path(), LoadOptions::default()),
        &["k_proj.weight_scale_inv", "F32", "E8M0"],
    );
}

#[test]
fn wrong_shape() {
    let d = build_with(&Spec::tiny(), |g| {
        let t = find(g, "layers.1.self_attn.v_proj.weight");
        // [64, 128] -> [32, 256]: same bytes, wrong shape.
        t.shape = vec![32, 256];
    });
    assert_names(
        &load_err(d.path(), LoadOptions::default()),
        &[
            SHARD2,
            "layers.1.self_attn.v_proj.weight",
            "[32, 256]",
            "[64, 128]",
        ],
    );

    let d = build_with(&Spec::tiny(), |g| {
        let t = find(g, "experts.3.w2.weight_scale");
        t.shape = vec![t.shape[1], t.shape[0]];
    });
    assert_names(
        &load_err(d.path(), LoadOptions::default()),
        &["experts.3.w2.weight_scale", "[2, 128]", "[128, 2]"],
    );
}

#[test]
fn missing_tensor() {
    let target = "layers.1.self_attn.index_k_norm.weight";
    let d = build_with(&Spec::tiny(), |g| {
        for group in g.iter_mut() {
            group.retain(|t| !t.name.ends_with(target));
        }
    });
    assert_names(
        &load_err(d.path(), LoadOptions::default()),
        &[target, "missing"],
    );

    // A missing MXFP4 scale makes the weight's format unknowable.
    let d = build_with(&Spec::tiny(), |g| {
        for group in g.iter_mut() {
            group.retain(|t| !t.name.ends_with("experts.5.w3.weight_scale"));
        }
    });
    assert_names(
        &load_err(d.path(), LoadOptions::default()),
        &["experts.5.w3.weight", "without weight_scale"],
    );
}

#[test]
fn index_names_a_missing_shard_or_tensor() {
    let d = build(&Spec::tiny());
    std::fs::remove_file(d.path().join(SHARD2)).unwrap();
    assert_names(
        &load_err(d.path(), LoadOptions::default()),
        &["model.safetensors.index.json", SHARD2, "does not exist"],
    );

    // The index lists a tensor its shard does not hold.
    let d = build(&Spec::tiny());
    let p = d.path().join("model.safetensors.index.json");
    let mut ix: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    ix["weight_map"]["language_model.model.ghost.weight"] = serde_json::json!(SHARD1);
    std::fs::write(&p, ix.to_string()).unwrap();
    assert_names(
        &load_err(d.path(), LoadOptions::default()),
        &[SHARD1, "ghost.weight", "not in the shard"],
    );

    // An index escaping the directory.
    ix["weight_map"]["language_model.model.ghost.weight"] = serde_json::json!("../../etc/passwd");
    std::fs::write(&p, ix.to_string()).unwrap();
    assert_names(
        &load_err(d.path(), LoadOptions::default()),
        &[
            "model.safetensors.index.json",
            "ghost.weight",
            "relative path",
        ],
    );
}

#[test]
fn config_missing_a_field() {
    let d = build(&Spec::tiny());
    let p = d.path().join("config.json");
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    cfg.as_object_mut().unwrap().remove("num_key_value_heads");
    std::fs::write(&p, cfg.to_string()).unwrap();
    let e = load_err(d.path(), LoadOptions::default());
    assert_names(&e, &["config.json", "num_key_value_heads", "missing"]);
    let CheckpointError::Config { .. } = Checkpoint::open(d.path()).err().unwrap() else {
        panic!("expected a Config error")
    };

    std::fs::remove_file(&p).unwrap();
    assert_names(
        &load_err(d.path(), LoadOptions::default()),
        &["config.json"],
    );
}

#[test]
fn nan_scale_refused_by_lossless_mxfp8_conversion() {
    let d = build_with(&Spec::tiny(), |g| {
        let t = find(g, "layers.1.self_attn.o_proj.weight_scale_inv");
        // o_proj is [H = 128, heads * d = 256]: scales [128, 256 / 32 = 8]; row 2, block 3.
        t.data[2 * 8 + 3] = 0xFF;
    });
    // Kept as MXFP8 the NaN block is legal (it decodes to NaN) ...
    Checkpoint::open(d.path())
        .unwrap()
        .load(&LoadOptions::default())
        .unwrap();
    // ... but a lossless conversion must refuse it, naming tensor and block.
    let e = load_err(
        d.path(),
        LoadOptions {
            mxfp8_to_bf16_exact: true,
            ..Default::default()
        },
    );
    assert_names(
        &e,
        &["layers.1.self_attn.o_proj.weight", "row 2", "block 3"],
    );
}

#[test]
fn not_a_checkpoint_dir() {
    let d = tempfile::tempdir().unwrap();
    assert_names(
        &load_err(&d.path().join("nope"), LoadOptions::default()),
        &["nope", "not a directory"],
    );
    std::fs::write(
        d.path().join("config.json"),
        m3_core::config::ModelConfig::preset("tiny")
            .unwrap()
            .to_json(),
    )
    .unwrap();
    assert_names(
        &load_err(d.path(), LoadOptions::default()),
        &["model.safetensors.index.json", "model.safetensors"],
    );
}

#[test]
fn mutated_headers_never_panic() {
    // A short in-test version of `cargo xtask fuzz`: byte flips, truncations
    // and header-length rewrites of a real shard go through the validator.
    let d = build(&Spec::tiny());
    let good = std::fs::read(d.path().join(SHARD2)).unwrap();
    let mut rng = Rng::new(7);
    let mut accepted = 0;
    for i in 0..3000 {
        let mut b = good.clone();
        match i % 3 {
            0 => {
                let j = rng.next() as usize % b.len().min(4096);
                b[j] ^= 1 << (rng.next() % 8);
            }
            1 => b.truncate(rng.next() as usize % b.len()),
            _ => {
                let n = u64::from_le_bytes(b[..8].try_into().unwrap()) as i64
                    + (rng.next() % 33) as i64
                    - 16;
                b[..8].copy_from_slice(&(n as u64).to_le_bytes());
            }
        }
        let r = std::panic::catch_unwind(|| {
            m3_core::checkpoint::safetensors_file::fuzz_one(&b);
            m3_core::checkpoint::safetensors_file::parse_header("m", &b).is_ok()
        });
        accepted += r.expect("validator panicked") as usize;
    }
    // Some mutations (e.g. a flipped bit inside a name) stay valid; most do not.
    assert!(accepted > 0 && accepted < 3000, "{accepted}");
}
