//! Helpers shared by the cli crate's integration tests.
#![allow(dead_code)]

use std::sync::Arc;

use m3_core::backend::{
    forward_by_ops, ActMode, Backend, KvBudget, LoadSpec, ModelSource, Path, RunOptions, StepBatch,
    Taps,
};
use m3_core::kv::{CacheDtype, KvCache, KvLayout};
use m3_core::sample::{sample, SampleParams};
use m3_core::weights::ModelWeights;

/// The independent reference decoding loop of these tests: one prefill of
/// the whole prompt, then one row per step, on a fresh cache with identity
/// paging, each token `sample(logits, params, position + 1)` over
/// [`forward_by_ops`] directly. No scheduler, no runner: what the scheduler
/// tests compare against.
pub fn manual_generate(
    be: &dyn Backend,
    m: &ModelWeights,
    prompt: &[u32],
    max_tokens: usize,
    params: SampleParams,
    dtype: CacheDtype,
) -> Vec<u32> {
    let page = 16;
    let positions = prompt.len() + max_tokens;
    let layout = KvLayout {
        page_size: page,
        num_pages: positions.div_ceil(page),
        dtype,
    };
    let mut cache = KvCache::new(m, layout).unwrap();
    let table: Vec<u32> = (0..layout.num_pages as u32).collect();
    let opts = RunOptions {
        act: ActMode::Bf16,
        tensor_parallel: 1,
    };
    let mut step = StepBatch::contiguous(0, prompt, 0, &table, page, false);
    let mut out = Vec::with_capacity(max_tokens);
    for i in 0..max_tokens {
        let logits = forward_by_ops(
            be,
            m,
            &mut cache,
            &step,
            Path::Standard,
            &opts,
            &mut Taps::none(),
        )
        .expect("forward");
        let pos = (prompt.len() + i) as u32; // position of the token made
        let t = sample(&logits, &params, pos);
        out.push(t);
        step = StepBatch::contiguous(0, &[t], pos, &table, page, false);
    }
    out
}

/// The load spec of these tests: `blocks` blocks of 16 positions.
pub fn load_spec(blocks: usize, dtype: CacheDtype) -> LoadSpec {
    LoadSpec {
        cache_dtype: dtype,
        block_size: 16,
        kv: KvBudget::Blocks(blocks),
        max_rows: 512,
        max_seqs: 64,
        max_context: 1024,
        act: ActMode::Bf16,
        selection: None,
    }
}

/// `m` as a runner source (a clone: the tiny test models are small).
pub fn source(m: &ModelWeights) -> ModelSource<'static> {
    ModelSource::Weights(Arc::new(m.clone()))
}

/// A deterministic prompt of `len` tokens below 500 (the speculative tests').
pub fn spec_prompt(seed: u32, len: usize) -> Vec<u32> {
    (0..len as u32)
        .map(|i| (seed * 131 + i * 17 + i * i * 3) % 500)
        .collect()
}

/// The scheduler of the speculative tests: 64 blocks of 16, 4 sequences.
pub fn spec_cfg() -> m3_core::sched::SchedulerConfig {
    m3_core::sched::SchedulerConfig {
        block_size: 16,
        num_blocks: 64,
        max_batch_tokens: 64,
        max_seqs: 4,
        enable_prefix_cache: true,
        ..m3_core::sched::SchedulerConfig::default()
    }
}

/// Outputs by request, counters and speculative stats of one run.
pub type SpecRun = (
    std::collections::BTreeMap<m3_core::sched::RequestId, Vec<u32>>,
    m3_core::sched::StepCounters,
    std::collections::BTreeMap<m3_core::sched::RequestId, m3_core::sched::runner::SpecStats>,
);

/// Greedy speculative decoding of `reqs` with `drafter` at `k` draft
/// tokens a step: every request's tokens equal `plain`'s (the same requests
/// decoded without drafts), drafts were proposed and verified, the
/// per-request statistics add up to the scheduler's totals and the mean
/// acceptance length lies in [1, k + 1]. Prints the counts under `label`.
pub fn check_greedy_spec(
    m: &ModelWeights,
    reqs: &[m3_core::sched::Request],
    plain: &std::collections::BTreeMap<m3_core::sched::RequestId, Vec<u32>>,
    k: usize,
    drafter: Box<dyn m3_core::sched::runner::Drafter + '_>,
    label: &str,
) -> SpecRun {
    use m3_core::sched::runner::{SpecStats, VerifyMode};
    let (out, c, per) = run_spec(m, reqs, k, VerifyMode::Greedy, Some(drafter));
    for r in reqs {
        assert_eq!(
            out[&r.id], plain[&r.id],
            "{label} K = {k}, request {}",
            r.id
        );
    }
    assert!(
        c.spec_verifies > 0 && c.spec_proposed > 0,
        "{label} K = {k}: {c:?}"
    );
    let sum = per.values().fold(SpecStats::default(), |a, s| SpecStats {
        verifies: a.verifies + s.verifies,
        proposed: a.proposed + s.proposed,
        accepted: a.accepted + s.accepted,
    });
    assert_eq!(
        (sum.verifies, sum.proposed, sum.accepted),
        (c.spec_verifies, c.spec_proposed, c.spec_accepted),
        "{label} K = {k}: per-request statistics against the totals"
    );
    let mean = c.mean_acceptance_length().unwrap();
    assert!(
        (1.0..=k as f64 + 1.0).contains(&mean),
        "{label} K = {k}: {mean}"
    );
    eprintln!(
        "{label} K = {k}: {} verifies, {} drafted, {} accepted ({:.1}%), mean acceptance length {mean:.3}; per request {:?}",
        c.spec_verifies,
        c.spec_proposed,
        c.spec_accepted,
        100.0 * c.spec_accepted as f64 / c.spec_proposed.max(1) as f64,
        per.iter()
            .map(|(id, s)| (*id, s.mean_acceptance_length()))
            .collect::<Vec<_>>()
    );
    (out, c, per)
}

/// Run `reqs` on `m` through the scheduler runner on the CPU reference
/// (bf16 cache) with `spec` draft tokens a step, `verify`, and `drafter`.
pub fn run_spec(
    m: &ModelWeights,
    reqs: &[m3_core::sched::Request],
    spec: usize,
    verify: m3_core::sched::runner::VerifyMode,
    drafter: Option<Box<dyn m3_core::sched::runner::Drafter + '_>>,
) -> SpecRun {
    let be = m3_cpu_ref::CpuBackend::new();
    let mut runner = be
        .load(
            source(m),
            &load_spec(spec_cfg().num_blocks, CacheDtype::Bf16),
            &mut |_| {},
        )
        .unwrap();
    let mut r = m3_core::sched::runner::SchedRunner::new(&mut *runner, spec_cfg()).unwrap();
    r.spec_tokens = spec;
    r.verify = verify;
    r.drafter = drafter;
    for q in reqs {
        r.sched.add_request(q.clone()).unwrap();
    }
    let out = r.run(|_, _| {}).unwrap();
    r.sched.check_invariants().unwrap();
    (
        out.into_iter().map(|f| (f.id, f.output)).collect(),
        *r.sched.counters(),
        r.spec_stats.clone(),
    )
}
