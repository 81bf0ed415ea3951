//! The CPU runner (`Backend::load` -> `HostRunner`) under the scheduler:
//! greedy generation equals a hand-rolled prefill + argmax loop over
//! `forward_by_ops`, batching requests together does not change any
//! request's tokens (also with keyed stochastic sampling), and the runner's
//! block copies and read-backs do what they say.

mod common;

use std::sync::Arc;

use common::*;
use m3_core::backend::{
    forward_by_ops, ActMode, Backend, KvBudget, LoadSpec, ModelSource, Path, ReadBack, RunOptions,
    StepBatch, StepInput, Taps,
};
use m3_core::kv::CacheDtype;
use m3_core::sample::{greedy, SampleParams};
use m3_core::sched::runner::SchedRunner;
use m3_core::sched::{Request, SchedulerConfig};
use m3_core::weights::ModelWeights;
use m3_cpu_ref::synthetic::Formats;
use m3_cpu_ref::CpuBackend;

const BF: RunOptions = RunOptions {
    act: ActMode::Bf16,
    tensor_parallel: 1,
};

fn spec(blocks: usize) -> LoadSpec {
    LoadSpec {
        cache_dtype: CacheDtype::Bf16,
        block_size: PAGE,
        kv: KvBudget::Blocks(blocks),
        max_rows: 256,
        max_seqs: 8,
        max_context: 512,
        act: ActMode::Bf16,
        selection: None,
    }
}

/// Every request through the scheduler on the CPU runner; outputs by id.
fn generate(m: &Arc<ModelWeights>, reqs: Vec<Request>) -> Vec<Vec<u32>> {
    let mut runner = CpuBackend
        .load(ModelSource::Weights(m.clone()), &spec(24), &mut |_| {})
        .expect("load");
    let cfg = SchedulerConfig {
        max_batch_tokens: 64,
        ..SchedulerConfig::default()
    };
    let mut sr = SchedRunner::new(&mut *runner, cfg).expect("runner");
    let n = reqs.len();
    for r in reqs {
        sr.sched.add_request(r).expect("add");
    }
    let mut done = sr.run(|_, _| {}).expect("run");
    done.sort_by_key(|f| f.id);
    assert_eq!(done.len(), n);
    done.into_iter().map(|f| f.output).collect()
}

fn request(id: u64, prompt: Vec<u32>, n: usize, p: SampleParams) -> Request {
    let mut r = Request::greedy(id, prompt, n);
    r.sampling = p;
    r
}

#[test]
fn greedy_generation_matches_a_manual_loop() {
    let m = Arc::new(model(&tiny(), Formats::default()));
    let prompt = tokens(30, 11);
    let got = generate(
        &m,
        vec![request(1, prompt.clone(), 12, SampleParams::GREEDY)],
    );
    // Manual: one prefill, then one row per step, argmax each time.
    let mut c = cache(&m, CacheDtype::Bf16);
    let bt = block_table(prompt.len() + 12);
    let step = StepBatch::contiguous(1, &prompt, 0, &bt, PAGE, false);
    let mut logits = forward_by_ops(
        &CpuBackend,
        &m,
        &mut c,
        &step,
        Path::Standard,
        &BF,
        &mut Taps::none(),
    )
    .unwrap();
    let mut want = Vec::new();
    for i in 0..12 {
        let t = greedy(&logits);
        want.push(t);
        let step = StepBatch::contiguous(1, &[t], (prompt.len() + i) as u32, &bt, PAGE, true);
        logits = forward_by_ops(
            &CpuBackend,
            &m,
            &mut c,
            &step,
            Path::Standard,
            &BF,
            &mut Taps::none(),
        )
        .unwrap();
    }
    assert_eq!(got[0], want);
}

#[test]
fn batching_does_not_change_tokens() {
    let m = Arc::new(model(&tiny(), Formats::default()));
    let p = SampleParams {
        temperature: 0.9,
        top_k: 50,
        top_p: 0.95,
        seed: 5,
    };
    let reqs = vec![
        request(1, tokens(20, 1), 10, SampleParams::GREEDY),
        request(2, tokens(75, 2), 10, p),
        request(3, tokens(9, 3), 10, SampleParams { seed: 6, ..p }),
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
        vec![request(
            2,
            tokens(75, 2),
            10,
            SampleParams { seed: 99, ..p },
        )],
    );
    assert_ne!(other[0], together[1]);
}

#[test]
fn runner_step_reads_back_what_was_asked_and_copies_blocks() {
    let m = Arc::new(model(&tiny(), Formats::default()));
    let mut runner = CpuBackend
        .load(ModelSource::Weights(m.clone()), &spec(PAGES), &mut |_| {})
        .expect("load");
    let layout = runner.kv_layout();
    assert_eq!((layout.page_size, layout.num_pages), (PAGE, PAGES));
    let toks = tokens(20, 4);
    let bt = block_table(toks.len());
    let step = StepBatch::contiguous(1, &toks, 0, &bt, PAGE, true);
    let sampling = vec![SampleParams::GREEDY; toks.len()];
    let read = ReadBack {
        logits: vec![3, 19],
        ..ReadBack::default()
    };
    let out = runner
        .step(&StepInput {
            batch: &step,
            path: Path::Standard,
            sampling: &sampling,
            read: &read,
            teacher: None,
        })
        .expect("step");
    let vocab = m.config.vocab_size;
    assert_eq!(out.tokens.len(), toks.len());
    assert_eq!(out.logits.len(), 2 * vocab);
    // The tokens are the argmax of the logits the runner computed.
    let mut c = cache(&m, CacheDtype::Bf16);
    let all = forward_by_ops(
        &CpuBackend,
        &m,
        &mut c,
        &step,
        Path::Standard,
        &BF,
        &mut Taps::none(),
    )
    .unwrap();
    for (i, &t) in out.tokens.iter().enumerate() {
        assert_eq!(t, greedy(&all[i * vocab..(i + 1) * vocab]), "row {i}");
    }
    assert_eq!(out.logits_row(1, vocab), &all[19 * vocab..20 * vocab]);
    // A wrong sampling list is refused, not guessed at.
    assert!(runner
        .step(&StepInput {
            batch: &step,
            path: Path::Standard,
            sampling: &sampling[1..],
            read: &read,
            teacher: None,
        })
        .is_err());
    // Block copies outside the pool are refused.
    assert!(runner.copy_blocks(&[(0, PAGES as u32)]).is_err());
    runner.copy_blocks(&[(bt[0], 0)]).expect("copy");
}

/// A runner that reports a mono path up to `max` rows (the CPU runs every
/// step one way) and records each step's rows and path.
struct MonoUpTo<'a> {
    inner: &'a mut dyn m3_core::backend::ModelRunner,
    max: usize,
    seen: Vec<(usize, Path)>,
}

impl m3_core::backend::ModelRunner for MonoUpTo<'_> {
    fn backend_name(&self) -> &str {
        self.inner.backend_name()
    }
    fn config(&self) -> &m3_core::config::ModelConfig {
        self.inner.config()
    }
    fn kv_layout(&self) -> m3_core::kv::KvLayout {
        self.inner.kv_layout()
    }
    fn mono_max_rows(&self) -> usize {
        self.max
    }
    fn step(
        &mut self,
        input: &StepInput<'_>,
    ) -> Result<m3_core::backend::StepOutput, m3_core::backend::BackendError> {
        self.seen.push((input.batch.rows(), input.path));
        self.inner.step(input)
    }
    fn copy_blocks(&mut self, pairs: &[(u32, u32)]) -> Result<(), m3_core::backend::BackendError> {
        self.inner.copy_blocks(pairs)
    }
}

/// The planner marks Mono exactly the pure decode steps up to the runner's
/// own threshold (`ModelRunner::mono_max_rows`, the GPU's measured
/// crossover), not the configured 16: with 6 requests decoding together
/// and a threshold of 3, the 6-row decode steps go standard and the last
/// ones (3 rows or fewer) mono; a runner with no mono path is sent none.
#[test]
fn the_planner_takes_the_runners_mono_threshold() {
    let m = Arc::new(model(&tiny(), Formats::default()));
    for max in [0usize, 3, 64] {
        let mut cpu = CpuBackend
            .load(ModelSource::Weights(m.clone()), &spec(24), &mut |_| {})
            .expect("load");
        let mut r = MonoUpTo {
            inner: &mut *cpu,
            max,
            seen: Vec::new(),
        };
        let planned;
        {
            let cfg = SchedulerConfig {
                max_batch_tokens: 64,
                ..SchedulerConfig::default()
            };
            let mut sr = SchedRunner::new(&mut r, cfg).expect("runner");
            for i in 0..6u64 {
                sr.sched
                    .add_request(request(
                        i,
                        tokens(5 + i as usize, i as u32),
                        2 + i as usize,
                        SampleParams::GREEDY,
                    ))
                    .expect("add");
            }
            sr.run(|_, _| {}).expect("run");
            planned = sr.sched.counters().steps_mono;
        }
        let mono: Vec<usize> = r
            .seen
            .iter()
            .filter(|(_, p)| *p == Path::Mono)
            .map(|(n, _)| *n)
            .collect();
        let decode_rows: Vec<usize> = r.seen.iter().map(|(n, _)| *n).collect();
        // the planner marked exactly the steps that ran mono (with no mono
        // path it still marks the small ones; they run standard)
        if max > 0 {
            assert_eq!(planned, mono.len() as u64, "planned vs run: {:?}", r.seen);
        }
        match max {
            0 => assert!(mono.is_empty(), "{:?}", r.seen),
            _ => {
                assert!(!mono.is_empty(), "no mono step up to {max}: {:?}", r.seen);
                assert!(mono.iter().all(|&n| n <= max), "{:?}", r.seen);
            }
        }
        if max == 3 {
            // the 6-row decode steps exist and went standard
            assert!(
                r.seen
                    .iter()
                    .any(|&(n, p)| n > 3 && n <= 6 && p == Path::Standard),
                "{decode_rows:?}"
            );
        }
    }
}
