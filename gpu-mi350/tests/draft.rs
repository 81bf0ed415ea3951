//! The DSpark draft on the device (`GpuRunner::draft_forward`) against the
//! op-by-op draft on the CPU reference, given the same context features
//! (the CPU target's residual taps), and speculative decoding on the GPU
//! runner with it. Skips without a GPU (fails under REQUIRE_GPU=1).
//!
//! 1. Context rows added in one go on the CPU and in pieces on the GPU
//!    (three chunks, one overlapping an earlier one as after a preemption's
//!    recompute, the last one longer than the draft's 256-row launch
//!    chunk so the context buffers grow): the draft logits of 1, 3 and 7
//!    query rows agree within 2e-2 rel-L2 (bf16 rounding of the same
//!    forward summed in other orders), the Markov bias within 1e-5.
//! 2. The comparison can fail: a draft whose layer-0 o-projection is
//!    scaled by 4 on the GPU side is caught.
//! 3. `SchedRunner` on the GPU runner with the device draft, greedy, K = 1,
//!    3 and 7: the outputs equal the same runner's without speculation
//!    (greedy verification commits the target's own tokens) and drafts are
//!    accepted.

mod common;

use std::collections::BTreeMap;

use common::gpu_or_skip;
use m3_core::backend::{
    forward_by_ops, ActMode, Backend, KvBudget, LoadSpec, ModelSource, Path as ExecPath,
    RunOptions, StepBatch, TapRequest, Taps,
};
use m3_core::checkpoint::dspark_loader::load_dspark;
use m3_core::checkpoint::{Checkpoint, LoadOptions};
use m3_core::config::ModelConfig;
use m3_core::dspark::DsparkWeights;
use m3_core::formats::bf16;
use m3_core::kv::{CacheDtype, KvCache, KvLayout};
use m3_core::sched::draft_forward::{DraftForward, DraftTarget, OpsDraft};
use m3_core::sched::dspark_drafter::DsparkDrafter;
use m3_core::sched::runner::{Drafter, SchedRunner, VerifyMode};
use m3_core::sched::{Request, RequestId, SchedulerConfig};
use m3_core::synth::{write_checkpoint, DenseFormat, ExpertFormat, SynthSpec};
use m3_core::weights::{LinearWeight, ModelWeights};
use m3_cpu_ref::CpuBackend;
use m3_gpu::GpuBackend;

/// Context rows (past the draft's 256-row launch chunk).
const CTX: usize = 300;

fn checkpoint(dir: &std::path::Path) -> (ModelWeights, DsparkWeights) {
    let cfg = ModelConfig::preset("tiny").expect("tiny preset");
    let mut spec = SynthSpec::new(cfg, ExpertFormat::Mxfp4, DenseFormat::Mxfp8);
    let mut d = spec.draft.clone().expect("synth writes a draft by default");
    d.n_layers = 2;
    spec.draft = Some(d);
    spec.seed = 5;
    write_checkpoint(&spec, dir).expect("synth tiny");
    let m = Checkpoint::open(dir)
        .and_then(|c| c.load(&LoadOptions::default()))
        .expect("load tiny");
    let w = load_dspark(dir, &m.config)
        .expect("load the draft")
        .expect("dspark/ present");
    (m, w)
}

fn load_spec(blocks: usize) -> LoadSpec {
    LoadSpec {
        cache_dtype: CacheDtype::Bf16,
        block_size: 16,
        kv: KvBudget::Blocks(blocks),
        max_rows: 128,
        max_seqs: 4,
        max_context: 512,
        act: ActMode::Bf16,
        selection: None,
    }
}

fn prompt(seed: u32, len: usize, vocab: usize) -> Vec<u32> {
    (0..len as u32)
        .map(|i| (seed * 131 + i * 17 + i * i * 3) % vocab as u32)
        .collect()
}

/// The CPU target's residual after every layer, for `tokens` at 0...
fn target_taps(be: &CpuBackend, m: &ModelWeights, tokens: &[u32]) -> Taps {
    let pages = tokens.len().div_ceil(16) + 1;
    let layout = KvLayout {
        page_size: 16,
        num_pages: pages,
        dtype: CacheDtype::Bf16,
    };
    let mut cache = KvCache::new(m, layout).unwrap();
    let table: Vec<u32> = (0..pages as u32).collect();
    let step = StepBatch::contiguous(0, tokens, 0, &table, 16, false);
    let mut taps = Taps::new(TapRequest {
        residual: true,
        ..Default::default()
    });
    forward_by_ops(
        be,
        m,
        &mut cache,
        &step,
        ExecPath::Standard,
        &RunOptions::default(),
        &mut taps,
    )
    .expect("cpu forward");
    taps
}

/// Rows `rows` of the draft's context features from `taps`.
fn feats(w: &DsparkWeights, taps: &Taps, rows: std::ops::Range<usize>) -> Vec<f32> {
    let c = &w.config;
    let (h, fc_in) = (c.hidden_size, c.fc_in());
    let mut f = vec![0.0f32; rows.len() * fc_in];
    for (j, &l) in c.target_layer_ids.iter().enumerate() {
        let res = taps.f32(&format!("residual.{l}")).expect("residual tap");
        for (i, r) in rows.clone().enumerate() {
            f[i * fc_in + j * h..i * fc_in + (j + 1) * h].copy_from_slice(&res[r * h..(r + 1) * h]);
        }
    }
    f
}

fn rel_l2(a: &[f32], b: &[f32]) -> f64 {
    let num: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| (f64::from(*x) - f64::from(*y)).powi(2))
        .sum();
    let den: f64 = b.iter().map(|y| f64::from(*y).powi(2)).sum();
    (num / den.max(1e-30)).sqrt()
}

/// Worst rel-L2 of the GPU draft against the CPU one over a few proposals.
fn worst_gap(
    cpu: &mut dyn DraftForward,
    gpu: &mut dyn DraftForward,
    last: u32,
    vocab: usize,
) -> (f64, f64) {
    let (mut lg, mut mb) = (0.0f64, 0.0f64);
    for n in [1usize, 3, 7] {
        let a = cpu.draft_logits(0, last, CTX as u32, n).expect("cpu draft");
        let b = gpu.draft_logits(0, last, CTX as u32, n).expect("gpu draft");
        assert_eq!(a.len(), n * vocab);
        assert_eq!(b.len(), n * vocab);
        for i in 0..n {
            let g = rel_l2(
                &b[i * vocab..(i + 1) * vocab],
                &a[i * vocab..(i + 1) * vocab],
            );
            println!("  {n} query rows, row {i}: logits rel-L2 {g:.3e}");
            lg = lg.max(g);
        }
    }
    for prev in [0u32, 7, last, (vocab - 1) as u32] {
        let a = cpu.markov_bias(prev).expect("cpu bias");
        let b = gpu.markov_bias(prev).expect("gpu bias");
        mb = mb.max(rel_l2(&b, &a));
    }
    (lg, mb)
}

#[test]
fn device_draft_matches_the_cpu_draft_and_speculates_losslessly() {
    let Some(cuda) = gpu_or_skip("device_draft_matches_the_cpu_draft") else {
        return;
    };
    let tmp = tempfile::tempdir().expect("tempdir");
    let (m, w) = checkpoint(&tmp.path().join("ck"));
    let vocab = m.config.vocab_size;
    let cpu = CpuBackend::new();
    let gpu = GpuBackend::new(cuda);
    let m = std::sync::Arc::new(m);
    let runner = gpu
        .load(ModelSource::Weights(m.clone()), &load_spec(64), &mut |_| {})
        .expect("gpu runner");

    // 1. the same context, the same proposals' logits
    let toks = prompt(3, CTX + 1, vocab);
    let taps = target_taps(&cpu, &m, &toks[..CTX]);
    let last = toks[CTX];
    let mut c = OpsDraft::new(&cpu, DraftTarget::of(&m), &w).expect("cpu draft");
    c.add_context(
        0,
        &(0..CTX as u32).collect::<Vec<_>>(),
        &feats(&w, &taps, 0..CTX),
    )
    .expect("cpu context");
    let mut g = runner
        .draft_forward(&w)
        .expect("the GPU runner has a device draft")
        .expect("gpu draft");
    let pos = |r: std::ops::Range<usize>| (r.start as u32..r.end as u32).collect::<Vec<_>>();
    for r in [0..20, 10..30, 30..CTX] {
        g.add_context(0, &pos(r.clone()), &feats(&w, &taps, r))
            .expect("gpu context");
    }
    assert_eq!(g.context_rows(0), CTX);
    let (lg, mb) = worst_gap(&mut c, &mut *g, last, vocab);
    println!("device draft vs cpu draft: logits rel-L2 <= {lg:.3e}, markov bias {mb:.3e}");
    let mut failures = Vec::new();
    if lg > 2e-2 {
        failures.push(format!("draft logits rel-L2 {lg:.3e} > 2e-2"));
    }
    if mb > 1e-5 {
        failures.push(format!("markov bias rel-L2 {mb:.3e} > 1e-5"));
    }
    // proposals (greedy) side by side
    let mut dc = DsparkDrafter::new(&cpu, DraftTarget::of(&m), &w).expect("cpu drafter");
    let mut dg = DsparkDrafter::with_forward(&w.config, g);
    let rows: Vec<usize> = (0..CTX).collect();
    let p = pos(0..CTX);
    dc.observe(1, &p, &rows, &taps);
    dg.observe(1, &p, &rows, &taps);
    let pc = dc.propose(1, &toks, 7);
    let pg = dg.propose(1, &toks, 7);
    println!("greedy proposals: cpu {pc:?}, gpu {pg:?}");
    assert!(dg.last_error.is_none(), "{:?}", dg.last_error);
    if pg.len() != 7 {
        failures.push(format!("the device draft proposed {} tokens", pg.len()));
    }
    dg.forget(1);
    assert_eq!(dg.context_rows(1), 0);

    // 2. a planted error is caught: layer 0's o-projection scaled by 4 on
    // the GPU side (fc alone would not do: every layer norms its input)
    let mut bad = w.clone();
    let o = &mut bad.layers[0].attn.o;
    match o {
        LinearWeight::Mx(t) => {
            let s: Vec<u8> = t.scales().iter().map(|b| b.saturating_add(2)).collect();
            *o = LinearWeight::Mx(
                m3_core::formats::MxTensor::from_parts(
                    t.elem(),
                    t.rows(),
                    t.cols(),
                    t.codes().to_vec(),
                    s,
                )
                .expect("same sizes"),
            );
        }
        LinearWeight::Bf16 { data, .. } => {
            for x in data.iter_mut() {
                *x = bf16::from_f32(4.0 * bf16::to_f32(*x));
            }
        }
        other => panic!("unexpected o_proj format {other:?}"),
    }
    let mut gb = runner
        .draft_forward(&bad)
        .expect("device draft")
        .expect("gpu draft");
    gb.add_context(0, &pos(0..CTX), &feats(&w, &taps, 0..CTX))
        .expect("gpu context");
    let (planted, _) = worst_gap(&mut c, &mut *gb, last, vocab);
    println!("planted o_proj error: logits rel-L2 {planted:.3e}");
    if planted <= 2e-2 {
        failures.push(format!("a planted o_proj error gave only {planted:.3e}"));
    }
    drop(runner);

    // 3. lossless speculative decoding on the GPU runner
    let reqs: Vec<Request> = (0..3u64)
        .map(|i| Request::greedy(i, prompt(i as u32 + 1, 24 + 9 * i as usize, vocab), 40))
        .collect();
    let run = |k: usize| -> (BTreeMap<RequestId, Vec<u32>>, u64, u64) {
        let mut r = gpu
            .load(ModelSource::Weights(m.clone()), &load_spec(64), &mut |_| {})
            .expect("gpu runner");
        let d = (k > 0).then(|| {
            let f = r
                .draft_forward(&w)
                .expect("device draft")
                .expect("gpu draft");
            DsparkDrafter::with_forward(&w.config, f)
        });
        let cfg = SchedulerConfig {
            max_batch_tokens: 64,
            max_seqs: 4,
            max_draft_tokens: k,
            enable_prefix_cache: true,
            ..SchedulerConfig::default()
        };
        let mut sr = SchedRunner::new(&mut *r, cfg).expect("sched");
        sr.spec_tokens = k;
        sr.verify = VerifyMode::Greedy;
        sr.drafter = d.map(|d| Box::new(d) as Box<dyn Drafter>);
        for q in &reqs {
            sr.sched.add_request(q.clone()).expect("add");
        }
        let out = sr.run(|_, _| {}).expect("run");
        let c = *sr.sched.counters();
        (
            out.into_iter().map(|f| (f.id, f.output)).collect(),
            c.spec_proposed,
            c.spec_accepted,
        )
    };
    let (plain, _, _) = run(0);
    for k in [1usize, 3, 7] {
        let (out, proposed, accepted) = run(k);
        println!("K = {k}: {proposed} drafted, {accepted} accepted");
        for q in &reqs {
            if out[&q.id] != plain[&q.id] {
                failures.push(format!(
                    "K = {k}, request {}: speculative output differs from plain decoding",
                    q.id
                ));
            }
        }
        if proposed == 0 {
            failures.push(format!("K = {k}: nothing was drafted"));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
