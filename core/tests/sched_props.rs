//! Property tests: random request streams (shared prefixes, staggered
//! arrivals, random limits, optional speculation) through the scheduler and
//! the mock backend.
//!
//! Checked after every step: the backend's `StepBatch::validate` accepts
//! the step, the Mono/Standard decision matches the backend's rule, and the
//! pool's accounting (each block free, idle
//! cached or referenced, exactly once; reference counts equal the number of
//! holders, so no block is owned twice and none goes negative — a release
//! below zero is an error that fails the run). At the end: every request
//! finished with the reference output, every block is back and can be
//! allocated again. With a cache too big to preempt, prefix hits reduce the
//! computed prefill tokens by exactly the hit count.

use m3_core::backend::Path;
use m3_core::sched::mock::{mock_next, MockBackend, MockEngine};
use m3_core::sched::runner::to_step_batch;
use m3_core::sched::{FinishReason, Request, Scheduler, SchedulerConfig, StepPath};
use proptest::prelude::*;

const VOCAB: u32 = 13;

fn reference(prompt: &[u32], max_tokens: usize) -> Vec<u32> {
    let mut ctx = prompt.to_vec();
    let mut out = Vec::new();
    for _ in 0..max_tokens {
        let t = mock_next(&ctx, VOCAB);
        out.push(t);
        ctx.push(t);
    }
    out
}

#[derive(Clone, Debug)]
struct Stream {
    block_size: usize,
    max_batch_tokens: usize,
    max_seqs: usize,
    spec_tokens: usize,
    extra_blocks: usize,
    /// (arrival step, prompt, max_tokens)
    reqs: Vec<(usize, Vec<u32>, usize)>,
}

fn stream() -> impl Strategy<Value = Stream> {
    let prefixes = prop::collection::vec(prop::collection::vec(0..VOCAB, 0..20), 3);
    let reqs = prop::collection::vec(
        (
            0usize..12,
            0usize..3,
            prop::collection::vec(0..VOCAB, 1..12),
            1usize..15,
        ),
        1..12,
    );
    (
        1usize..=8,
        1usize..=40,
        1usize..=6,
        0usize..=4,
        0usize..=30,
        prefixes,
        reqs,
    )
        .prop_map(
            |(
                block_size,
                max_batch_tokens,
                max_seqs,
                spec_tokens,
                extra_blocks,
                prefixes,
                reqs,
            )| Stream {
                block_size,
                max_batch_tokens,
                max_seqs,
                spec_tokens,
                extra_blocks,
                reqs: reqs
                    .into_iter()
                    .map(|(at, pi, tail, max)| {
                        let mut p = prefixes[pi].clone();
                        p.extend(tail);
                        (at, p, max)
                    })
                    .collect(),
            },
        )
}

struct Outcome {
    outputs: Vec<(u64, Vec<u32>, FinishReason)>,
    counters: m3_core::sched::StepCounters,
}

fn run(s: &Stream, num_blocks: usize, prefix_cache: bool) -> Result<Outcome, TestCaseError> {
    let cfg = SchedulerConfig {
        block_size: s.block_size,
        num_blocks,
        max_batch_tokens: s.max_batch_tokens,
        max_seqs: s.max_seqs,
        mono_max_rows: 16,
        enable_prefix_cache: prefix_cache,
        max_draft_tokens: 7,
    };
    let mut e = MockEngine {
        sched: Scheduler::new(cfg).map_err(|e| TestCaseError::fail(e.to_string()))?,
        backend: MockBackend::new(num_blocks, s.block_size, VOCAB),
        spec_tokens: s.spec_tokens,
        draft_error_rate: 0.4,
        check_invariants: true,
    };
    let mut done = Vec::new();
    let mut step_no = 0usize;
    let last_arrival = s.reqs.iter().map(|r| r.0).max().unwrap_or(0);
    while step_no <= last_arrival || !e.sched.is_done() {
        for (i, (at, p, max)) in s.reqs.iter().enumerate() {
            if *at == step_no {
                e.sched
                    .add_request(Request::greedy(i as u64, p.clone(), *max))
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
            }
        }
        let step = e
            .step()
            .map_err(|err| TestCaseError::fail(format!("step {step_no}: {err}")))?;
        // The backend's own validator accepts every planned step, and every
        // planned Mono step, verify steps included (the batch carries the
        // planner's decode-only marker), is one the backend's rule allows
        // (the converse does not hold: the backend would also take a
        // one-row prefill chunk per sequence; the planner keeps those on
        // Standard, as prompt work is not decode).
        let batch = to_step_batch(&step);
        batch
            .validate(s.block_size, num_blocks, VOCAB as usize)
            .map_err(|err| TestCaseError::fail(format!("step {step_no}: {err}")))?;
        prop_assert_eq!(
            batch.decode_only,
            !step.rows.is_empty() && step.decode_rows() == step.rows.len()
        );
        if step.path == StepPath::Mono {
            prop_assert!(
                Path::Mono.allows(&batch),
                "step {}: planned Mono, backend refuses",
                step_no
            );
        }
        done.extend(e.sched.take_finished());
        step_no += 1;
        prop_assert!(step_no < 20_000, "no progress");
    }
    prop_assert_eq!(
        e.sched.pool().num_available(),
        num_blocks,
        "blocks conserved"
    );
    let mut pool = e.sched.pool().clone();
    for _ in 0..num_blocks {
        prop_assert!(pool.allocate().is_ok(), "a freed block is not reusable");
    }
    done.sort_by_key(|f| f.id);
    Ok(Outcome {
        outputs: done
            .into_iter()
            .map(|f| (f.id, f.output, f.reason))
            .collect(),
        counters: *e.sched.counters(),
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn random_streams_finish_with_reference_output(s in stream(), cache in any::<bool>()) {
        let need = s.reqs.iter().map(|(_, p, m)| (p.len() + m - 1).div_ceil(s.block_size)).max().unwrap_or(1);
        let out = run(&s, need + s.extra_blocks, cache)?;
        prop_assert_eq!(out.outputs.len(), s.reqs.len(), "every admitted request finishes");
        for (id, toks, reason) in &out.outputs {
            let (_, p, m) = &s.reqs[*id as usize];
            prop_assert_eq!(*reason, FinishReason::Length);
            prop_assert_eq!(toks, &reference(p, *m), "request {}", id);
        }
    }

    #[test]
    fn prefix_hits_reduce_prefill_tokens(s in stream()) {
        let big = 4096;
        let off = run(&s, big, false)?;
        let on = run(&s, big, true)?;
        prop_assert_eq!(off.counters.preemptions + on.counters.preemptions, 0);
        prop_assert_eq!(&off.outputs, &on.outputs);
        let total: u64 = s.reqs.iter().map(|r| r.1.len() as u64).sum();
        prop_assert_eq!(off.counters.prefill_tokens, total);
        let c = on.counters;
        prop_assert_eq!(c.prefill_tokens + c.prefix_hit_tokens, total);
        prop_assert!(c.prefill_tokens <= off.counters.prefill_tokens);
    }
}
