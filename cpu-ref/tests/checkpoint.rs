//! The reference on real on-disk checkpoints: `m3_core::synth` writes a
//! `tiny` checkpoint, the loader reads it, and the forward runs on it.

mod common;

use common::*;
use m3_core::backend::{ActMode, RunOptions, TapRequest};
use m3_core::checkpoint::{Checkpoint, LoadOptions};
use m3_core::kv::CacheDtype;
use m3_core::synth::{write_checkpoint, DenseFormat, ExpertFormat, SynthSpec};

#[test]
fn synthetic_checkpoints_load_and_run_deterministically() {
    let dir = tempfile::tempdir().expect("tempdir");
    let toks = tokens(70, 9);
    for (i, experts) in [
        ExpertFormat::Nvfp4,
        ExpertFormat::Mxfp4,
        ExpertFormat::Bf16,
        ExpertFormat::Mxfp8,
    ]
    .into_iter()
    .enumerate()
    {
        let mut spec = SynthSpec::new(tiny(), experts, DenseFormat::Mxfp8);
        spec.draft = None;
        let path = dir.path().join(format!("c{i}"));
        write_checkpoint(&spec, &path).expect("synth");
        let m = Checkpoint::open(&path)
            .and_then(|c| c.load(&LoadOptions::default()))
            .expect("load");
        let opts = RunOptions {
            act: ActMode::Bf16,
            tensor_parallel: 1,
        };
        let a =
            pool(1).install(|| prefill(&m, &toks, CacheDtype::Bf16, opts, TapRequest::STANDARD));
        let b =
            pool(3).install(|| prefill(&m, &toks, CacheDtype::Bf16, opts, TapRequest::STANDARD));
        taps_bit_equal(&a, &b).unwrap_or_else(|e| panic!("{experts:?}: {e}"));
        assert!(
            a.f32("logits").unwrap().iter().all(|v| v.is_finite()),
            "{experts:?}"
        );
    }
}
