//! The tensor / expert parallel math on the CPU (issue 15 item 4): a step
//! computed as if sharded over N ranks (`TensorParallel`: row-parallel
//! partial sums and the expert-parallel combine all-reduced in rank order)
//! reproduces the unsharded reference, teacher-forced layer by layer (each
//! layer fed the reference's residual, so a layer's error is its own), for
//! N = 2, 4 and 8 where the shapes divide; discrete choices identical.
//! The comparison can fail (a planted error), sharding really changes the
//! arithmetic (values differ in their last bits on `small`), and a shape
//! that does not divide is refused with a message, never a panic.

mod common;

use std::collections::BTreeMap;

use common::*;
use m3_core::backend::{
    forward_by_ops, ActMode, Backend, Path, RunOptions, StepBatch, TapData, TapRequest, Taps,
    TensorParallel,
};
use m3_core::config::ModelConfig;
use m3_core::kv::CacheDtype;
use m3_core::weights::ModelWeights;
use m3_cpu_ref::synthetic::{Formats, WeightFormat};
use m3_cpu_ref::CpuBackend;

/// rel-L2 allowed per layer output: f32 partial sums in another order move
/// a few bf16 roundings by one unit (golden's bf16 tolerance).
const TOL: f64 = 1e-2;

fn run(
    be: &dyn Backend,
    m: &ModelWeights,
    toks: &[u32],
    teacher: &BTreeMap<usize, Vec<f32>>,
) -> Result<Taps, String> {
    let mut c = cache(m, CacheDtype::Bf16);
    let step = StepBatch::contiguous(1, toks, 0, &block_table(toks.len()), PAGE, true);
    let mut taps = Taps::new(TapRequest::ALL);
    taps.teacher = teacher.clone();
    let opts = RunOptions {
        act: ActMode::Bf16,
        tensor_parallel: be.tensor_parallel(),
    };
    forward_by_ops(be, m, &mut c, &step, Path::Standard, &opts, &mut taps)
        .map_err(|e| e.to_string())?;
    Ok(taps)
}

fn f32s<'a>(t: &'a Taps, name: &str) -> &'a [f32] {
    match t.tensors.get(name).map(|t| &t.data) {
        Some(TapData::F32(v)) => v,
        _ => panic!("tap {name} missing"),
    }
}

/// Per layer: attention and FFN outputs within TOL of the reference, the
/// chosen experts and blocks identical; logits within TOL. The first
/// failure as an error; Ok(number of values that differ at all).
fn compare(c: &ModelConfig, reference: &Taps, got: &Taps) -> Result<usize, String> {
    let mut differ = 0;
    for l in 0..c.num_hidden_layers {
        for fam in ["attn_out", "ffn_out"] {
            let name = format!("{fam}.{l}");
            let (a, b) = (f32s(got, &name), f32s(reference, &name));
            differ += a
                .iter()
                .zip(b)
                .filter(|(x, y)| x.to_bits() != y.to_bits())
                .count();
            let e = rel_l2(a, b);
            if e > TOL {
                return Err(format!("{name}: rel L2 {e:.2e} > {TOL:.0e}"));
            }
        }
        for fam in ["experts", "topk_blocks"] {
            let name = format!("{fam}.{l}");
            let (a, b) = (got.tensors.get(&name), reference.tensors.get(&name));
            if a.map(|t| &t.data) != b.map(|t| &t.data) {
                return Err(format!("{name}: the discrete choices differ"));
            }
        }
    }
    let e = rel_l2(f32s(got, "logits"), f32s(reference, "logits"));
    if e > TOL {
        return Err(format!("logits: rel L2 {e:.2e}"));
    }
    Ok(differ)
}

#[test]
fn sharded_steps_reproduce_the_unsharded_reference() {
    let mx = Formats {
        experts: WeightFormat::Mxfp4,
        dense: WeightFormat::Mxfp8,
    };
    let bf = Formats {
        experts: WeightFormat::Bf16,
        dense: WeightFormat::Bf16,
    };
    let small = ModelConfig::preset("small").expect("small");
    let mut failures = Vec::new();
    // values that differ in some bit over all runs: the sharded sums really
    // are other sums (tiny's often come out bit-equal, small's do not)
    let mut differ_total = 0usize;
    for (name, cfg, f, n_tok) in [
        ("tiny bf16", tiny(), bf, 90),
        ("tiny mxfp4/mxfp8", tiny(), mx, 90),
        ("small mxfp4/mxfp8", small, mx, 40),
    ] {
        let m = model(&cfg, f);
        let toks = tokens(n_tok, 3);
        let reference = run(&CpuBackend, &m, &toks, &BTreeMap::new()).expect("reference");
        // the reference's residual after every layer, fed to each sharded run
        let teacher: BTreeMap<usize, Vec<f32>> = (0..cfg.num_hidden_layers)
            .map(|l| (l, f32s(&reference, &format!("residual.{l}")).to_vec()))
            .collect();
        let reference_tf =
            run(&CpuBackend, &m, &toks, &teacher).expect("reference, teacher-forced");
        let mut ran = 0;
        for ranks in [2, 4, 8] {
            let be = TensorParallel {
                inner: CpuBackend,
                ranks,
            };
            match run(&be, &m, &toks, &teacher) {
                Ok(t) => match compare(&cfg, &reference_tf, &t) {
                    Ok(differ) => {
                        println!("{name} TP{ranks}: within {TOL:.0e}, choices identical; {differ} output values differ in some bit");
                        ran += 1;
                        differ_total += differ;
                    }
                    Err(e) => failures.push(format!("{name} TP{ranks}: {e}")),
                },
                // a shape that does not divide is a clear refusal, never a panic
                Err(e) if e.contains("do not split") => println!("{name} TP{ranks}: refused: {e}"),
                Err(e) => failures.push(format!("{name} TP{ranks}: {e}")),
            }
        }
        // small divides 2, 4 and 8 ways everywhere; tiny's 64-wide shared
        // expert holds two 32-value MX blocks, so MX tiny stops at TP 2
        let want = if name.starts_with("small") {
            3
        } else if f == mx {
            1
        } else {
            2
        };
        if ran < want {
            failures.push(format!("{name}: {ran} of TP 2 / 4 / 8 ran, want {want}"));
        }
        // the comparison can fail: a planted 5% error in one layer's output
        let mut planted = reference_tf.clone();
        if let Some(t) = planted.tensors.get_mut("ffn_out.1") {
            if let TapData::F32(v) = &mut t.data {
                for x in v.iter_mut().step_by(7) {
                    *x *= 1.5;
                }
            }
        }
        if compare(&cfg, &reference_tf, &planted).is_ok() {
            failures.push(format!("{name}: a planted error passed the comparison"));
        }
    }
    if differ_total == 0 {
        failures.push("no output value differs in any run: the sharded math did not run".into());
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
