//! Loading bad vector directories gives one clear error naming the file and
//! tensor at fault, never a panic.

use std::fs;
use std::path::Path;

use m3_spec::{default_dir, VectorSet};

/// A copy of the committed vectors in a temp dir, to damage.
fn copy_vectors() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    for e in fs::read_dir(default_dir()).expect("spec/vectors") {
        let e = e.expect("dir entry");
        fs::copy(e.path(), dir.path().join(e.file_name())).expect("copy");
    }
    dir
}

fn load_err(dir: &Path) -> String {
    match VectorSet::load(dir) {
        Ok(_) => panic!("loading a damaged vector dir succeeded"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn committed_vectors_load() {
    let set = VectorSet::load_default().expect("spec/vectors loads");
    assert!(set.total() > 5000, "only {} vectors", set.total());
}

#[test]
fn missing_manifest_names_the_file() {
    let dir = tempfile::tempdir().expect("temp dir");
    let msg = load_err(dir.path());
    assert!(msg.contains("manifest.json"), "{msg}");
}

#[test]
fn truncated_group_file_names_the_file() {
    let dir = copy_vectors();
    let p = dir.path().join("mxfp4_floor.safetensors");
    let bytes = fs::read(&p).expect("read");
    fs::write(&p, &bytes[..bytes.len() / 2]).expect("write");
    let msg = load_err(dir.path());
    assert!(msg.contains("mxfp4_floor.safetensors"), "{msg}");
}

#[test]
fn wrong_shape_in_manifest_names_the_tensor() {
    let dir = copy_vectors();
    let p = dir.path().join("manifest.json");
    let text = fs::read_to_string(&p).expect("read");
    // the first decode group claims one vector more than its tensors hold
    let bad = text.replacen("\"count\": 16,", "\"count\": 17,", 1);
    assert_ne!(bad, text, "the manifest layout changed: update this test");
    fs::write(&p, bad).expect("write");
    let msg = load_err(dir.path());
    assert!(
        msg.contains("decode_e2m1.safetensors") && msg.contains("input"),
        "{msg}"
    );
}

#[test]
fn unknown_group_kind_is_named() {
    let dir = copy_vectors();
    let p = dir.path().join("manifest.json");
    let text = fs::read_to_string(&p).expect("read");
    let bad = text.replacen("\"kind\": \"decode\"", "\"kind\": \"decoder\"", 1);
    fs::write(&p, bad).expect("write");
    let msg = load_err(dir.path());
    assert!(msg.contains("decoder"), "{msg}");
}
