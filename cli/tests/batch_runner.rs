//! The scheduler on the CPU reference runner (the synthetic `tiny` model in
//! memory: MXFP4 experts, MXFP8 elsewhere). Expected tokens come from a
//! manual decoding loop (`common::manual_generate`: one request at a time,
//! identity paging, `forward_by_ops` directly): an independent path through
//! the same backend.
//! Prompts reach past 64 positions, where the tiny preset's sparse block
//! selection starts, so the block tables really steer attention.

use std::collections::BTreeMap;

mod common;

use m3_core::backend::Backend;
use m3_core::config::ModelConfig;
use m3_core::kv::CacheDtype;
use m3_core::sample::SampleParams;
use m3_core::sched::ngram::NgramDrafter;
use m3_core::sched::runner::{Drafter, SchedRunner};
use m3_core::sched::{FinishedRequest, Request, RequestId, SchedulerConfig, StepCounters};
use m3_core::weights::ModelWeights;
use m3_cpu_ref::synthetic::{self, Formats, WeightFormat};
use m3_cpu_ref::CpuBackend;

fn model() -> ModelWeights {
    let cfg = ModelConfig::preset("tiny").unwrap();
    synthetic::model(
        &cfg,
        Formats {
            experts: WeightFormat::Mxfp4,
            dense: WeightFormat::Mxfp8,
        },
        11,
    )
    .unwrap()
}

fn prompt(seed: u32, len: usize) -> Vec<u32> {
    (0..len as u32)
        .map(|i| (seed * 131 + i * 17 + i * i * 3) % 512)
        .collect()
}

fn requests() -> Vec<Request> {
    let lens = [5usize, 23, 41, 70, 12, 66];
    lens.iter()
        .enumerate()
        .map(|(i, &n)| {
            let mut r = Request::greedy(i as u64, prompt(i as u32 + 1, n), 6 + 2 * i);
            if i == 4 {
                r.sampling = SampleParams {
                    temperature: 0.9,
                    top_k: 40,
                    top_p: 0.95,
                    seed: 77,
                };
            }
            r
        })
        .collect()
}

/// The minimal engine, one request alone.
fn reference(m: &ModelWeights, r: &Request) -> Vec<u32> {
    reference_with(m, r, CacheDtype::Bf16)
}

fn reference_with(m: &ModelWeights, r: &Request, dtype: CacheDtype) -> Vec<u32> {
    common::manual_generate(
        &CpuBackend::new(),
        m,
        &r.prompt,
        r.max_tokens,
        r.sampling,
        dtype,
    )
}

fn cfg(num_blocks: usize, max_batch_tokens: usize, prefix: bool) -> SchedulerConfig {
    SchedulerConfig {
        block_size: 16,
        num_blocks,
        max_batch_tokens,
        max_seqs: 8,
        enable_prefix_cache: prefix,
        ..SchedulerConfig::default()
    }
}

fn run(
    m: &ModelWeights,
    c: SchedulerConfig,
    reqs: &[Request],
    spec: usize,
    drafter: Option<Box<dyn Drafter + '_>>,
) -> (BTreeMap<RequestId, FinishedRequest>, StepCounters) {
    let be = CpuBackend::new();
    let mut runner = be
        .load(
            common::source(m),
            &common::load_spec(c.num_blocks, CacheDtype::Bf16),
            &mut |_| {},
        )
        .unwrap();
    let mut r = SchedRunner::new(&mut *runner, c).unwrap();
    r.spec_tokens = spec;
    r.drafter = drafter;
    for q in reqs {
        r.sched.add_request(q.clone()).unwrap();
    }
    let out = r.run(|_, _| {}).unwrap();
    r.sched.check_invariants().unwrap();
    assert_eq!(r.sched.pool().num_available(), c.num_blocks);
    (
        out.into_iter().map(|f| (f.id, f)).collect(),
        *r.sched.counters(),
    )
}

#[test]
fn batched_equals_alone_equals_minimal_engine() {
    let m = model();
    let reqs = requests();
    let (together, c) = run(&m, cfg(64, 48, true), &reqs, 0, None);
    assert!(c.steps_standard > 0 && c.steps_mono > 0, "{c:?}");
    for r in &reqs {
        let want = reference(&m, r);
        assert_eq!(together[&r.id].output, want, "request {} batched", r.id);
        let (alone, _) = run(&m, cfg(64, 48, true), std::slice::from_ref(r), 0, None);
        assert_eq!(alone[&r.id].output, want, "request {} alone", r.id);
    }
}

#[test]
fn preemption_with_tiny_cache_same_tokens() {
    let m = model();
    let reqs = requests();
    // The largest request needs ceil((70 + 12 - 1) / 16) = 6 blocks.
    let (out, c) = run(&m, cfg(7, 64, true), &reqs, 0, None);
    assert!(c.preemptions > 0, "{c:?}");
    for r in &reqs {
        assert_eq!(out[&r.id].output, reference(&m, r), "request {}", r.id);
    }
}

#[test]
fn prefix_cache_same_tokens_fewer_prefill() {
    prefix_cache_case(CacheDtype::Bf16);
}

/// The copy-on-write copies raw fp8 codes: still the same tokens.
#[test]
fn prefix_cache_fp8_cache() {
    prefix_cache_case(CacheDtype::Fp8E4M3);
}

fn prefix_cache_case(dtype: CacheDtype) {
    let m = model();
    let shared = prompt(9, 48);
    let mut reqs: Vec<Request> = (0..4u64)
        .map(|i| {
            let mut p = shared.clone();
            p.extend(prompt(20 + i as u32, 3 + 5 * i as usize));
            Request::greedy(i, p, 6)
        })
        .collect();
    // Exactly the three shared blocks: a full hit, whose last token is
    // recomputed into a copy (copy-on-write) of the last cached block.
    reqs.push(Request::greedy(4, shared.clone(), 6));
    let mut per_mode = Vec::new();
    for prefix in [false, true] {
        let be = CpuBackend::new();
        let mut runner = be
            .load(
                common::source(&m),
                &common::load_spec(32, dtype),
                &mut |_| {},
            )
            .unwrap();
        let mut r = SchedRunner::new(&mut *runner, cfg(32, 64, prefix)).unwrap();
        let mut out = BTreeMap::new();
        // One after the other, so later requests find the shared blocks cached.
        for q in &reqs {
            r.sched.add_request(q.clone()).unwrap();
            out.extend(
                r.run(|_, _| {})
                    .unwrap()
                    .into_iter()
                    .map(|f| (f.id, f.output)),
            );
        }
        per_mode.push((out, *r.sched.counters()));
    }
    let (off, c_off) = &per_mode[0];
    let (on, c_on) = &per_mode[1];
    assert_eq!(off, on);
    for q in &reqs {
        assert_eq!(on[&q.id], reference_with(&m, q, dtype));
    }
    // 48 shared tokens = 3 full blocks, hit by requests 1..3, and 47 of
    // them by request 4 (one copy-on-write).
    assert_eq!(c_on.prefix_hit_tokens, 3 * 48 + 47);
    assert_eq!(c_on.prefill_tokens, c_off.prefill_tokens - 3 * 48 - 47);
    assert_eq!(c_on.cow_copies, 1);
}

/// Knows each request's plain-decoding output and proposes it, with every
/// third proposal wrong, so verification both accepts and rejects.
struct ScriptedDrafter {
    full: BTreeMap<RequestId, Vec<u32>>,
    calls: usize,
}

impl Drafter for ScriptedDrafter {
    fn propose(&mut self, id: RequestId, context: &[u32], k: usize) -> Vec<u32> {
        let Some(full) = self.full.get(&id) else {
            return Vec::new();
        };
        let mut d: Vec<u32> = full.iter().skip(context.len()).take(k).copied().collect();
        self.calls += 1;
        if self.calls.is_multiple_of(3) && !d.is_empty() {
            let j = self.calls % d.len();
            d[j] = (d[j] + 1) % 512;
        }
        d
    }
}

#[test]
fn speculative_decoding_same_tokens() {
    let m = model();
    let reqs = requests();
    let full: BTreeMap<RequestId, Vec<u32>> = reqs
        .iter()
        .map(|r| {
            let mut t = r.prompt.clone();
            t.extend(reference(&m, r));
            (r.id, t)
        })
        .collect();
    for k in [1usize, 3, 7] {
        let d = ScriptedDrafter {
            full: full.clone(),
            calls: 0,
        };
        let (out, c) = run(&m, cfg(64, 48, true), &reqs, k, Some(Box::new(d)));
        for r in &reqs {
            assert_eq!(
                out[&r.id].output[..],
                full[&r.id][r.prompt.len()..],
                "K={k} request {}",
                r.id
            );
        }
        assert!(
            c.spec_accepted > 0 && c.spec_accepted < c.spec_proposed,
            "K={k}: {c:?}"
        );
        let mal = c.mean_acceptance_length().unwrap();
        assert!(
            mal > 1.0 && mal <= k as f64 + 1.0,
            "K={k}: mean acceptance length {mal}"
        );
    }
    // Prompt lookup on a repetitive prompt: same tokens whatever it proposes.
    let rep: Vec<Request> = (0..3u64)
        .map(|i| Request::greedy(i, [7u32, 8, 9, 10].repeat(6 + i as usize), 10))
        .collect();
    let (out, _) = run(
        &m,
        cfg(64, 48, true),
        &rep,
        4,
        Some(Box::new(NgramDrafter::default())),
    );
    for r in &rep {
        assert_eq!(out[&r.id].output, reference(&m, r));
    }
}
