//! DSpark speculative decoding end to end on the CPU reference backend: the
//! draft loaded from a synthetic `tiny` checkpoint's `dspark/`, proposals
//! verified by the scheduler runner.
//!
//! - the loader reads `dspark/` and names the tensor at fault;
//! - speculative greedy output (DSpark drafter, K = 1, 3, 7) is identical to
//!   plain decoding through the same runner and to a manual decoding loop;
//! - an oracle drafter whose distribution is the target's own is accepted
//!   (almost) always by rejection and block verification, a perturbed one
//!   clearly less.

use std::collections::BTreeMap;
use std::path::Path;

mod common;

use m3_core::backend::{forward_by_ops, Path as ExecPath, RunOptions, StepBatch, Taps};
use m3_core::checkpoint::dspark_loader::load_dspark;
use m3_core::checkpoint::{Checkpoint, LoadOptions};
use m3_core::config::ModelConfig;
use m3_core::dspark::DsparkWeights;
use m3_core::kv::{CacheDtype, KvCache, KvLayout};
use m3_core::sample::{uniform, SampleParams};
use m3_core::sched::dspark_drafter::{DraftTarget, DsparkDrafter};
use m3_core::sched::runner::{Drafter, Proposal, VerifyMode};
use m3_core::sched::spec_probs::sampling_probs;
use m3_core::sched::{Request, RequestId};
use m3_core::spec_decode::sample_index;
use m3_core::synth::{write_checkpoint, DenseFormat, ExpertFormat, SynthSpec};
use m3_core::weights::ModelWeights;
use m3_cpu_ref::CpuBackend;

/// A synthetic tiny checkpoint with a 2-layer DSpark draft, loaded.
fn checkpoint(dir: &Path) -> (ModelWeights, DsparkWeights) {
    let cfg = ModelConfig::preset("tiny").unwrap();
    let mut spec = SynthSpec::new(cfg.clone(), ExpertFormat::Mxfp4, DenseFormat::Mxfp8);
    let mut d = spec.draft.clone().expect("synth writes a draft by default");
    d.n_layers = 2;
    spec.draft = Some(d);
    spec.seed = 5;
    write_checkpoint(&spec, dir).unwrap();
    let m = Checkpoint::open(dir)
        .unwrap()
        .load(&LoadOptions::default())
        .unwrap();
    let w = load_dspark(dir, &m.config)
        .unwrap()
        .expect("dspark/ present");
    (m, w)
}

#[test]
fn loader_reads_dspark_and_names_bad_tensors() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ck");
    let (m, w) = checkpoint(&dir);
    let c = &w.config;
    assert_eq!(w.layers.len(), 2);
    assert_eq!(w.fc.rows(), m.config.hidden_size);
    assert_eq!(w.fc.cols(), c.target_layer_ids.len() * m.config.hidden_size);
    assert_eq!(w.markov_e.rows(), m.config.vocab_size);
    assert_eq!(w.markov_w.cols(), m.config.vocab_size);
    assert_eq!(w.final_norm.len(), m.config.hidden_size);

    // A config that no longer fits the tensors: the error names the tensor.
    let mut bad = c.clone();
    bad.ffn_hidden_size += 32;
    std::fs::write(dir.join("dspark/config.json"), bad.to_json()).unwrap();
    let e = load_dspark(&dir, &m.config).unwrap_err().to_string();
    assert!(
        e.contains("dspark/layers.0.mlp.gate_proj.weight") && e.contains("shape"),
        "{e}"
    );
    // A draft that does not fit the target: the error names the field.
    let mut bad = c.clone();
    bad.vocab_size = 1024;
    bad.mask_token_id = 3;
    std::fs::write(dir.join("dspark/config.json"), bad.to_json()).unwrap();
    let e = load_dspark(&dir, &m.config).unwrap_err().to_string();
    assert!(
        e.contains("dspark/config.json") && e.contains("vocab_size"),
        "{e}"
    );
    // No draft at all: None.
    std::fs::remove_dir_all(dir.join("dspark")).unwrap();
    assert!(load_dspark(&dir, &m.config).unwrap().is_none());
}

/// A manual decoding loop, one request alone (an independent path).
fn engine_reference(m: &ModelWeights, r: &Request) -> Vec<u32> {
    common::manual_generate(
        &CpuBackend::new(),
        m,
        &r.prompt,
        r.max_tokens,
        r.sampling,
        CacheDtype::Bf16,
    )
}

#[test]
fn dspark_speculative_greedy_equals_plain_decoding() {
    let tmp = tempfile::tempdir().unwrap();
    let (m, w) = checkpoint(&tmp.path().join("ck"));
    let mut reqs: Vec<Request> = [(1u32, 9usize, 20usize), (2, 30, 14), (3, 4, 24)]
        .iter()
        .enumerate()
        .map(|(i, &(s, n, max))| Request::greedy(i as u64, common::spec_prompt(s, n), max))
        .collect();
    // A stochastic request too: greedy verification reproduces plain
    // decoding token for token whatever the sampler (keyed by position).
    reqs[2].sampling = SampleParams {
        temperature: 0.8,
        top_k: 0,
        top_p: 0.95,
        seed: 9,
    };
    let (plain, _, _) = common::run_spec(&m, &reqs, 0, VerifyMode::Greedy, None);
    for r in &reqs[..2] {
        assert_eq!(
            plain[&r.id],
            engine_reference(&m, r),
            "runner vs engine, request {}",
            r.id
        );
    }
    let be = CpuBackend::new();
    for k in [1usize, 3, 7] {
        let d = DsparkDrafter::new(&be, DraftTarget::of(&m), &w).unwrap();
        common::check_greedy_spec(&m, &reqs, &plain, k, Box::new(d), "dspark");
    }
    // The comparison can fail: rejection verification of the stochastic
    // request (lossless in distribution, not token for token) changes its
    // tokens, and the same equality check sees it.
    let d = DsparkDrafter::new(&be, DraftTarget::of(&m), &w).unwrap();
    let (out, _, _) = common::run_spec(&m, &reqs, 3, VerifyMode::Rejection, Some(Box::new(d)));
    assert_eq!(
        out[&0], plain[&0],
        "greedy requests verify greedily in every mode"
    );
    assert_ne!(out[&2], plain[&2], "a changed output must be caught");
}

/// A drafter that runs the target itself: proposals drawn from the target's
/// own sampling distribution (`perturb = 0`), or from a distribution with
/// `perturb` of its mass moved onto a fixed token set.
struct OracleDrafter<'a> {
    be: &'a CpuBackend,
    m: &'a ModelWeights,
    perturb: f32,
}

impl OracleDrafter<'_> {
    fn dist(&self, p: &[f32]) -> Vec<f32> {
        if self.perturb == 0.0 {
            return p.to_vec();
        }
        // Mass moved onto tokens 0..64 (uniformly), renormalised.
        let n = 64.0;
        p.iter()
            .enumerate()
            .map(|(i, &x)| (1.0 - self.perturb) * x + if i < 64 { self.perturb / n } else { 0.0 })
            .collect()
    }
}

impl Drafter for OracleDrafter<'_> {
    fn propose(&mut self, id: RequestId, context: &[u32], k: usize) -> Vec<u32> {
        self.propose_sampled(id, context, k, &SampleParams::default())
            .tokens
    }

    fn propose_sampled(
        &mut self,
        _id: RequestId,
        context: &[u32],
        k: usize,
        params: &SampleParams,
    ) -> Proposal {
        let page = 16;
        let layout = KvLayout {
            page_size: page,
            num_pages: 8,
            dtype: CacheDtype::Bf16,
        };
        let mut cache = KvCache::new(self.m, layout).unwrap();
        let table: Vec<u32> = (0..8).collect();
        let vocab = self.m.config.vocab_size;
        let (mut tokens, mut probs) = (Vec::new(), Vec::new());
        let mut step = StepBatch::contiguous(0, context, 0, &table, page, false);
        for i in 0..k {
            let logits = forward_by_ops(
                self.be,
                self.m,
                &mut cache,
                &step,
                ExecPath::Standard,
                &RunOptions::default(),
                &mut Taps::none(),
            )
            .unwrap();
            let q = self.dist(&sampling_probs(&logits, params));
            let pos = (context.len() + i) as u32;
            let w: Vec<f64> = q.iter().map(|&x| f64::from(x)).collect();
            let x = sample_index(&w, uniform(params.seed ^ 0xabcd, pos)).unwrap() as u32;
            tokens.push(x);
            probs.extend_from_slice(&q[..vocab]);
            step = StepBatch::contiguous(0, &[x], pos, &table, page, false);
        }
        Proposal {
            tokens,
            probs: Some(probs),
        }
    }
}

#[test]
fn oracle_drafter_is_accepted_perturbed_less() {
    let cfgm = ModelConfig::preset("tiny").unwrap();
    let m = m3_cpu_ref::synthetic::model(
        &cfgm,
        m3_cpu_ref::synthetic::Formats {
            experts: m3_cpu_ref::synthetic::WeightFormat::Mxfp4,
            dense: m3_cpu_ref::synthetic::WeightFormat::Mxfp8,
        },
        3,
    )
    .unwrap();
    let be = CpuBackend::new();
    let reqs: Vec<Request> = (0..3u64)
        .map(|i| {
            let mut r =
                Request::greedy(i, common::spec_prompt(i as u32 + 4, 6 + 5 * i as usize), 40);
            r.sampling = SampleParams {
                temperature: 1.0,
                top_k: 0,
                top_p: 1.0,
                seed: 100 + i,
            };
            r
        })
        .collect();
    let mut rates = BTreeMap::new();
    for verify in [VerifyMode::Rejection, VerifyMode::Block] {
        for perturb in [0.0f32, 0.6] {
            let d = OracleDrafter {
                be: &be,
                m: &m,
                perturb,
            };
            let (out, c, _) = common::run_spec(&m, &reqs, 3, verify, Some(Box::new(d)));
            for r in &reqs {
                assert_eq!(out[&r.id].len(), r.max_tokens);
            }
            let rate = c.spec_accepted as f64 / c.spec_proposed as f64;
            eprintln!(
                "{verify:?} perturb {perturb}: accepted {}/{} ({rate:.3}), mean acceptance length {:.3}",
                c.spec_accepted,
                c.spec_proposed,
                c.mean_acceptance_length().unwrap()
            );
            rates.insert((format!("{verify:?}"), (perturb * 10.0) as u32), rate);
        }
    }
    for v in ["Rejection", "Block"] {
        let (oracle, bad) = (rates[&(v.to_string(), 0)], rates[&(v.to_string(), 6)]);
        assert!(oracle > 0.97, "{v}: oracle acceptance {oracle}");
        assert!(
            bad < oracle - 0.2,
            "{v}: perturbed {bad} vs oracle {oracle}"
        );
    }
}

/// The target's residual taps for `tokens` (one prefill step).
fn target_taps(be: &CpuBackend, m: &ModelWeights, tokens: &[u32]) -> Taps {
    let layout = KvLayout {
        page_size: 16,
        num_pages: 8,
        dtype: CacheDtype::Bf16,
    };
    let mut cache = KvCache::new(m, layout).unwrap();
    let table: Vec<u32> = (0..8).collect();
    let step = StepBatch::contiguous(0, tokens, 0, &table, 16, false);
    let mut taps = Taps::new(m3_core::backend::TapRequest {
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
    .unwrap();
    taps
}

#[test]
fn dspark_context_is_incremental_and_attention_non_causal() {
    let tmp = tempfile::tempdir().unwrap();
    let (m, w) = checkpoint(&tmp.path().join("ck"));
    let be = CpuBackend::new();
    let p = common::spec_prompt(7, 20);
    let taps = target_taps(&be, &m, &p);
    let pos: Vec<u32> = (0..20).collect();
    let rows: Vec<usize> = (0..20).collect();
    let params = SampleParams {
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
        seed: 1,
    };
    let mut ctx = p.clone();
    ctx.push(42);

    // All context rows at once, or in three observations (one repeated, as
    // after a preemption's recompute): the same draft.
    let mut a = DsparkDrafter::new(&be, DraftTarget::of(&m), &w).unwrap();
    a.observe(0, &pos, &rows, &taps);
    let mut b = DsparkDrafter::new(&be, DraftTarget::of(&m), &w).unwrap();
    b.observe(0, &pos[..7], &rows[..7], &taps);
    b.observe(0, &pos[7..], &rows[7..], &taps);
    b.observe(0, &pos[3..9], &rows[3..9], &taps);
    assert_eq!(a.context_rows(0), 20);
    assert_eq!(b.context_rows(0), 20);
    let pa = a.propose_sampled(0, &ctx, 4, &params);
    let pb = b.propose_sampled(0, &ctx, 4, &params);
    assert!(a.last_error.is_none() && b.last_error.is_none());
    assert_eq!(pa.tokens.len(), 4);
    assert_eq!(pa, pb, "incremental context equals one-shot context");
    let vocab = m.config.vocab_size;
    let probs = pa.probs.clone().unwrap();
    for (i, &t) in pa.tokens.iter().enumerate() {
        let row = &probs[i * vocab..(i + 1) * vocab];
        assert!((row.iter().sum::<f32>() - 1.0).abs() < 1e-4);
        assert!(row[t as usize] > 0.0, "a drawn token has mass");
    }

    // The context matters: without it (or with another prompt's) the draft
    // distribution changes.
    let mut c = DsparkDrafter::new(&be, DraftTarget::of(&m), &w).unwrap();
    let pc = c.propose_sampled(0, &ctx, 4, &params);
    assert_ne!(pc.probs, pa.probs);

    // Non-causal block: query row 0 also attends to the mask rows after it,
    // so its distribution depends on the block length.
    let p1 = a.propose_sampled(0, &ctx, 1, &params).probs.unwrap();
    assert_ne!(&p1[..vocab], &probs[..vocab]);
    // ...and proposing again gives the same (the block rows of a proposal
    // are not kept as context).
    assert_eq!(a.propose_sampled(0, &ctx, 4, &params), pa);
    assert_eq!(a.context_rows(0), 20);

    // Greedy requests get the argmax of the draft distribution.
    let g = a.propose_sampled(0, &ctx, 3, &SampleParams::default());
    assert!(g.probs.unwrap().iter().all(|&x| x == 0.0 || x == 1.0));
    a.forget(0);
    assert_eq!(a.context_rows(0), 0);
}
