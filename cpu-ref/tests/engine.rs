//! The minimal engine loop on the reference: greedy generation equals a
//! hand-rolled prefill + argmax loop, and batching requests together does
//! not change any request's tokens (also with keyed stochastic sampling).

mod common;

use common::*;
use m3_core::backend::{ActMode, Backend, Path, RunOptions, StepBatch, Taps};
use m3_core::engine::{Engine, Request, SimplePlanner};
use m3_core::kv::{CacheDtype, KvCache, KvLayout};
use m3_core::sample::{greedy, SampleParams};
use m3_cpu_ref::synthetic::Formats;
use m3_cpu_ref::CpuBackend;

const BF: RunOptions = RunOptions { act: ActMode::Bf16 };

fn generate(m: &m3_core::weights::ModelWeights, reqs: Vec<Request>) -> Vec<Vec<u32>> {
    let cache = KvCache::new(
        m,
        KvLayout {
            page_size: PAGE,
            num_pages: 24,
            dtype: CacheDtype::Bf16,
        },
    );
    let mut eng = Engine::new(&CpuBackend, m, cache, SimplePlanner, BF);
    for r in reqs {
        eng.add(r).expect("add");
    }
    eng.run().expect("run");
    eng.requests
        .iter()
        .map(|r| r.generated().to_vec())
        .collect()
}

#[test]
fn greedy_engine_matches_a_manual_loop() {
    let m = model(&tiny(), Formats::default());
    let prompt = tokens(30, 11);
    let got = generate(
        &m,
        vec![Request::new(1, prompt.clone(), 12, SampleParams::GREEDY)],
    );
    // Manual: one prefill, then one row per step, argmax each time.
    let mut c = cache(&m, CacheDtype::Bf16);
    let bt = block_table(prompt.len() + 12);
    let step = StepBatch::contiguous(1, &prompt, 0, &bt, PAGE, false);
    let mut logits = CpuBackend
        .forward(&m, &mut c, &step, Path::Standard, &BF, &mut Taps::none())
        .unwrap();
    let mut want = Vec::new();
    for i in 0..12 {
        let t = greedy(&logits);
        want.push(t);
        let step = StepBatch::contiguous(1, &[t], (prompt.len() + i) as u32, &bt, PAGE, true);
        logits = CpuBackend
            .forward(&m, &mut c, &step, Path::Standard, &BF, &mut Taps::none())
            .unwrap();
    }
    assert_eq!(got[0], want);
}

#[test]
fn batching_does_not_change_tokens() {
    let m = model(&tiny(), Formats::default());
    let p = SampleParams {
        temperature: 0.9,
        top_k: 50,
        top_p: 0.95,
        seed: 5,
    };
    let reqs = vec![
        Request::new(1, tokens(20, 1), 10, SampleParams::GREEDY),
        Request::new(2, tokens(75, 2), 10, p),
        Request::new(3, tokens(9, 3), 10, SampleParams { seed: 6, ..p }),
    ];
    let together = generate(&m, reqs.clone());
    for (i, r) in reqs.into_iter().enumerate() {
        let alone = generate(&m, vec![r]);
        assert_eq!(alone[0], together[i], "request {i}");
        assert_eq!(alone[0].len(), 10);
    }
    // And the seed matters (the comparison above could fail).
    let other = generate(
        &m,
        vec![Request::new(
            2,
            tokens(75, 2),
            10,
            SampleParams { seed: 99, ..p },
        )],
    );
    assert_ne!(other[0], together[1]);
}
