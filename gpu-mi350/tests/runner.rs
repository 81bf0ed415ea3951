//! The GPU runner (device-resident engine) against the CPU runner, case by
//! case (PERF.md protocol step 4; ggml's test-backend-ops habit: cases as
//! data, tolerances per case). Skips without a GPU (fails under
//! REQUIRE_GPU=1).
//!
//! Per case (a synthetic `tiny` model in the case's weight formats, cache
//! dtype, activation mode, selection and attention kinds):
//! 1. one teacher-free prefill of a prompt past the sparse threshold on
//!    both runners, taps compared layer by layer with the golden library's
//!    one judge (`m3_golden::parity::diagnose`): every residual within the
//!    case's rel-L2 tolerance until the first discrete difference, and that
//!    difference a near tie of the reference (its own score gap below the
//!    golden margins); logits likewise;
//! 2. decode steps fed the reference's greedy token on both sides: each
//!    greedy token equal, or a token swap within the logit margin on both
//!    sides (`m3_golden::parity::judge`);
//! 3. the keyed sampler: stochastic rows sampled on the device equal
//!    `m3_core::sample::sample` of the logits the device returns;
//! 4. a captured graph replay and a direct-launch step on the same inputs
//!    give bit-identical logits; a block copy (copy-on-write) on the device
//!    gives the same logits as the original blocks.
//!
//! Every number is printed before any assertion, so one device run records
//! the whole picture; a planted weight error proves the comparison fails.

mod common;

use std::sync::Arc;

use common::backend_or_skip;
use m3_core::backend::{
    ActMode, Backend, BoxedRunner, KvBudget, LinearInput, LoadSpec, ModelSource, Op, Path,
    ReadBack, StepBatch, StepInput, StepOutput, TapRequest,
};
use m3_core::config::{AttnKind, IndexSelection, ModelConfig};
use m3_core::kv::CacheDtype;
use m3_core::sample::{sample, SampleParams};
use m3_core::weights::{FfnWeights, LinearWeight, ModelWeights};
use m3_cpu_ref::synthetic::{self, Formats, WeightFormat};
use m3_cpu_ref::CpuBackend;
use m3_golden::parity::{diagnose, judge, Margins, Verdict};
use m3_gpu::kernels::Vendor;
use m3_gpu::GpuBackend;

const PAGE: usize = 16;
/// Prompt rows: past 4 blocks of 16, so tiny's sparse selection engages.
const PROMPT: usize = 90;
/// Decode steps after the prefill.
const DECODE: usize = 12;

/// The KV cache dtypes a test sweeps on `gpu`: the NVFP4 cache runs on
/// CUDA only so far (the HIP route refuses it at load, which
/// `a_hip_backend_refuses_ops_and_runs_the_engine` checks, in the lib).
fn caches(gpu: &GpuBackend) -> Vec<CacheDtype> {
    let mut v = vec![CacheDtype::Bf16, CacheDtype::Fp8E4M3];
    if gpu.gpu().vendor() == Vendor::Cuda {
        v.push(CacheDtype::Nvfp4);
    } else {
        println!("on HIP: the NVFP4 cache cases are left out (CUDA only so far)");
    }
    v
}

/// One comparison case.
#[derive(Clone, Copy, Debug)]
struct Case {
    name: &'static str,
    formats: Formats,
    cache: CacheDtype,
    act: ActMode,
    selection: IndexSelection,
    /// Layers 0..n use full attention (M3-style), the rest sparse.
    full_layers: usize,
    /// rel-L2 allowed per residual / logits tensor before any flip: bf16
    /// roundings at every op boundary (2^-9 each) in another summation
    /// order stay under it over 4 layers; a wrong op gives O(1).
    tol: f64,
    /// Judge residuals by their worst row (else by the whole tensor: with
    /// MXFP4 activations one flipped activation code moves a single row).
    worst_row: bool,
    /// Logit gap below which a decode token swap is a near tie. The decode
    /// steps run on each side's own cache, so the sides drift by bf16
    /// roundings (logits rel L2 ~5e-3 over 4 layers, see the prefill
    /// lines); an fp8 cache turns a rounding flip of a key into a whole
    /// E4M3 step (2^-4 relative).
    logit_margin: f64,
}

const MX: Formats = Formats {
    experts: WeightFormat::Mxfp4,
    dense: WeightFormat::Mxfp8,
};

const CASES: &[Case] = &[
    Case {
        name: "mxfp4/mxfp8, fp8 cache",
        formats: MX,
        cache: CacheDtype::Fp8E4M3,
        act: ActMode::Bf16,
        selection: IndexSelection::PerKvHead,
        full_layers: 0,
        tol: 1e-2,
        worst_row: true,
        logit_margin: 5e-2,
    },
    Case {
        // ARCHITECTURE.md, NVFP4 KV cache: each side stores its own K / V,
        // and a bf16-noise difference that crosses an E2M1 midpoint moves a
        // value by a whole E2M1 step (up to 1/3 of the block's scale), so
        // the bounds are the MXFP4-activation case's (golden's floor for a
        // 4-bit rounding on both sides)
        name: "mxfp4/mxfp8, nvfp4 cache",
        formats: MX,
        cache: CacheDtype::Nvfp4,
        act: ActMode::Bf16,
        selection: IndexSelection::PerKvHead,
        full_layers: 0,
        tol: 3e-2,
        worst_row: false,
        logit_margin: 1e-1,
    },
    Case {
        name: "mxfp4/mxfp8, bf16 cache",
        formats: MX,
        cache: CacheDtype::Bf16,
        act: ActMode::Bf16,
        selection: IndexSelection::PerKvHead,
        full_layers: 0,
        tol: 1e-2,
        worst_row: true,
        logit_margin: 2e-2,
    },
    Case {
        name: "bf16 weights, bf16 cache",
        formats: Formats {
            experts: WeightFormat::Bf16,
            dense: WeightFormat::Bf16,
        },
        cache: CacheDtype::Bf16,
        act: ActMode::Bf16,
        selection: IndexSelection::PerKvHead,
        full_layers: 0,
        tol: 1e-2,
        worst_row: true,
        logit_margin: 2e-2,
    },
    Case {
        name: "nvfp4 experts / mxfp8 e5m2 rest",
        formats: Formats {
            experts: WeightFormat::Nvfp4,
            dense: WeightFormat::Mxfp8E5M2,
        },
        cache: CacheDtype::Bf16,
        act: ActMode::Bf16,
        selection: IndexSelection::PerKvHead,
        full_layers: 0,
        tol: 1e-2,
        worst_row: true,
        logit_margin: 2e-2,
    },
    Case {
        name: "mxfp4 a4 (--act mxfp4)",
        formats: MX,
        cache: CacheDtype::Fp8E4M3,
        act: ActMode::Mxfp4,
        selection: IndexSelection::PerKvHead,
        full_layers: 0,
        // golden's stated floor for MXFP4 activations
        tol: 3e-2,
        worst_row: false,
        logit_margin: 5e-2,
    },
    Case {
        name: "shared selection, M3-style full layers 0-1",
        formats: MX,
        cache: CacheDtype::Bf16,
        act: ActMode::Bf16,
        selection: IndexSelection::Shared,
        full_layers: 2,
        tol: 1e-2,
        worst_row: true,
        logit_margin: 2e-2,
    },
];

fn config(case: &Case) -> ModelConfig {
    let mut c = ModelConfig::preset("tiny").expect("tiny preset");
    c.index_selection = case.selection;
    for k in c.attn_kinds.iter_mut().take(case.full_layers) {
        *k = AttnKind::Full;
    }
    c
}

fn spec(case: &Case) -> LoadSpec {
    LoadSpec {
        cache_dtype: case.cache,
        block_size: PAGE,
        kv: KvBudget::Blocks(24),
        max_rows: 128,
        max_seqs: 4,
        max_context: 256,
        act: case.act,
        selection: None,
    }
}

fn prompt(vocab: usize) -> Vec<u32> {
    (0..PROMPT as u32)
        .map(|i| (i * 7919 + 13) % vocab as u32)
        .collect()
}

fn step(
    r: &mut BoxedRunner<'_>,
    batch: &StepBatch,
    sampling: &[SampleParams],
    taps: TapRequest,
) -> StepOutput {
    r.step(&StepInput {
        batch,
        path: Path::Standard,
        sampling,
        read: &ReadBack {
            logits: (0..batch.logits_rows.len() as u32).collect(),
            taps,
        },
        teacher: None,
    })
    .unwrap_or_else(|e| panic!("{} step: {e}", r.backend_name()))
}

/// The reference's biased router scores of layer `l` from its router input.
fn router_scores(m: &ModelWeights, l: usize, x: &[f32], rows: usize) -> Result<Vec<f32>, String> {
    let FfnWeights::Moe(moe) = &m.layers[l].ffn else {
        return Err(format!("layer {l} is dense"));
    };
    let ne = moe.router.rows();
    let mut z = vec![0.0f32; rows * ne];
    CpuBackend::new()
        .run_op(Op::Linear {
            x,
            rows,
            w: &moe.router,
            input: LinearInput::F32,
            round_out: false,
            out: &mut z,
        })
        .map_err(|e| e.to_string())?;
    for (i, v) in z.iter_mut().enumerate() {
        *v = m3_cpu_ref::moe::router_key(*v, moe.correction_bias[i % ne]);
    }
    Ok(z)
}

/// `Ok` when `e` is a number no larger than `tol` (NaN fails).
fn within(e: f64, tol: f64) -> Result<(), f64> {
    if e <= tol {
        Ok(())
    } else {
        Err(e)
    }
}

fn rel_l2(a: &[f32], b: &[f32]) -> f64 {
    m3_golden::parity::rel_l2(a, b).0
}

/// Run one case; every finding is printed, failures returned.
fn run_case(gpu: &GpuBackend, case: &Case, m: Arc<ModelWeights>) -> Vec<String> {
    let mut fail = Vec::new();
    let c = m.config.clone();
    let vocab = c.vocab_size;
    let cpu_be = CpuBackend::new();
    let mut cpu = cpu_be
        .load(ModelSource::Weights(m.clone()), &spec(case), &mut |_| {})
        .expect("cpu load");
    let mut dev = gpu
        .load(ModelSource::Weights(m.clone()), &spec(case), &mut |_| {})
        .expect("gpu load");
    let table: Vec<u32> = (0..(PROMPT + DECODE).div_ceil(PAGE) as u32).collect();
    // 1. prefill, layer by layer
    let p = prompt(vocab);
    let pre = StepBatch::contiguous(0, &p, 0, &table, PAGE, false);
    let rt = step(&mut cpu, &pre, &[SampleParams::GREEDY], TapRequest::ALL);
    let bt = step(
        &mut dev,
        &pre,
        &[SampleParams::GREEDY],
        TapRequest::DIAGNOSE,
    );
    let mut scores = |l: usize, x: &[f32], rows: usize| router_scores(&m, l, x, rows);
    match diagnose(
        &c,
        PROMPT,
        &rt.taps,
        &bt.taps,
        &mut scores,
        Margins::default(),
        case.act == ActMode::Mxfp4,
    ) {
        Err(e) => fail.push(format!("{}: diagnosis failed: {e}", case.name)),
        Ok(g) => {
            let first_flip = g.first_discrete.as_ref().map(|d| d.layer);
            for d in &g.layers {
                println!(
                    "[{}] prefill layer {}: residual rel L2 last row {:.2e}, worst row {:.2e}; attn out {:.2e}; ffn out {:.2e}; experts differ {} rows, blocks differ {} head-rows; MXFP4 activation codes flipped {:?}",
                    case.name,
                    d.layer,
                    d.residual_rel_l2_last,
                    d.residual_rel_l2_max_row,
                    d.attn_out_rel_l2_last.unwrap_or(f64::NAN),
                    d.ffn_out_rel_l2_last.unwrap_or(f64::NAN),
                    d.expert_rows_differ,
                    d.block_rows_differ,
                    d.act_code_flips
                );
                let before_flip = first_flip.is_none_or(|f| d.layer < f);
                let name = format!("residual.{}", d.layer);
                let judged = if case.worst_row {
                    d.residual_rel_l2_max_row
                } else {
                    match (rt.taps.f32(&name), bt.taps.f32(&name)) {
                        (Some(a), Some(b)) => rel_l2(a, b),
                        _ => f64::NAN,
                    }
                };
                if before_flip && within(judged, case.tol).is_err() {
                    fail.push(format!(
                        "{}: prefill {name} rel L2 {judged:.3e} > {:.1e}",
                        case.name, case.tol
                    ));
                }
            }
            if let Some(d) = &g.first_discrete {
                println!(
                    "[{}] first discrete difference: layer {} {:?} row {}: gap {:?} margin {:.1e} near tie {}; upstream: {}",
                    case.name, d.layer, d.kind, d.row, d.gap, d.margin, d.near_tie, g.upstream.reason
                );
                if !g.upstream.near_tie {
                    fail.push(format!(
                        "{}: prefill flip: {}",
                        case.name, g.upstream.reason
                    ));
                }
            } else {
                let e = rel_l2(&rt.logits, &bt.logits);
                println!("[{}] prefill logits rel L2 {e:.2e}", case.name);
                if within(e, case.tol).is_err() {
                    fail.push(format!("{}: prefill logits rel L2 {e:.3e}", case.name));
                }
            }
        }
    }
    // 2. decode, both sides fed the reference's greedy token
    let mut fed = rt.tokens[0];
    let (mut same, mut ties) = (0, 0);
    for i in 0..DECODE {
        let pos = (PROMPT + i) as u32;
        let st = StepBatch::contiguous(0, &[fed], pos, &table, PAGE, true);
        let a = step(&mut cpu, &st, &[SampleParams::GREEDY], TapRequest::NONE);
        let b = step(&mut dev, &st, &[SampleParams::GREEDY], TapRequest::NONE);
        match judge(
            &a.logits,
            &b.logits,
            a.tokens[0],
            b.tokens[0],
            case.logit_margin,
        ) {
            Ok(j) if j.verdict == Verdict::Identical => same += 1,
            Ok(j) if j.verdict == Verdict::NearTie => {
                ties += 1;
                println!(
                    "[{}] decode step {i}: near tie cpu {} gpu {} (gaps {:.2e} / {:.2e})",
                    case.name, j.ref_tok, j.be_tok, j.ref_gap, j.be_gap
                );
            }
            Ok(j) => fail.push(format!(
                "{}: decode step {i}: cpu {} gpu {} (gaps {:.3e} / {:.3e}, logits rel L2 {:.3e})",
                case.name, j.ref_tok, j.be_tok, j.ref_gap, j.be_gap, j.rel_l2
            )),
            Err(e) => fail.push(format!("{}: decode step {i}: {e}", case.name)),
        }
        // the device's own argmax is the greedy token of its own logits
        if b.tokens[0] != m3_core::sample::greedy(&b.logits) {
            fail.push(format!(
                "{}: decode step {i}: device argmax {} != greedy of its logits",
                case.name, b.tokens[0]
            ));
        }
        fed = a.tokens[0];
    }
    println!(
        "[{}] decode: {same} of {DECODE} greedy tokens identical, {ties} near ties",
        case.name
    );
    fail
}

#[test]
fn gpu_runner_matches_the_cpu_runner_case_by_case() {
    let Some(mut gpu) = backend_or_skip("gpu_runner_matches_the_cpu_runner_case_by_case") else {
        return;
    };
    let mut failures = Vec::new();
    for case in CASES {
        if !caches(&gpu).contains(&case.cache) {
            continue;
        }
        let m = synthetic::model(&config(case), case.formats, 7).expect("synthetic tiny");
        failures.extend(run_case(&gpu, case, Arc::new(m)));
    }
    // the first case with the prefill on the default (8-warp) tensor-core
    // build: the prompt is past `PathOptions::small_step_max_rows` here, as
    // steps of over 2048 rows are by default
    let wide = Case {
        name: "mxfp4/mxfp8, fp8 cache, prefill on the 8-warp build",
        ..CASES[0]
    };
    gpu.path_options.small_step_max_rows = PROMPT - 1;
    let m = synthetic::model(&config(&wide), wide.formats, 7).expect("synthetic tiny");
    failures.extend(run_case(&gpu, &wide, Arc::new(m)));
    gpu.path_options.small_step_max_rows =
        m3_gpu::standard::PathOptions::default().small_step_max_rows;
    // The comparison can fail: a planted error (one routed expert's gate
    // scaled by 3) must be caught (on HIP in the first case's fp8 cache).
    let case = if caches(&gpu).contains(&CASES[1].cache) {
        &CASES[1]
    } else {
        &CASES[0]
    };
    let good = synthetic::model(&config(case), case.formats, 7).expect("synthetic tiny");
    let mut bad = good.clone();
    if let FfnWeights::Moe(moe) = &mut bad.layers[1].ffn {
        for e in moe.experts.iter_mut() {
            if let LinearWeight::Mx(t) = &mut e.gate {
                let mut s = t.scales().to_vec();
                for b in s.iter_mut() {
                    *b = b.saturating_add(2);
                }
                e.gate = LinearWeight::Mx(
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
        }
    }
    let planted = planted_gap(&gpu, case, good, bad);
    println!("planted error: {planted:?}");
    if planted.is_empty() {
        failures.push("a planted weight error was not caught".into());
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// The case run with the CPU on `good` and the GPU on `bad`: its failures.
fn planted_gap(
    gpu: &GpuBackend,
    case: &Case,
    good: ModelWeights,
    bad: ModelWeights,
) -> Vec<String> {
    let c = good.config.clone();
    let good = Arc::new(good);
    let cpu_be = CpuBackend::new();
    let mut cpu = cpu_be
        .load(ModelSource::Weights(good.clone()), &spec(case), &mut |_| {})
        .expect("cpu load");
    let mut dev = gpu
        .load(
            ModelSource::Weights(Arc::new(bad)),
            &spec(case),
            &mut |_| {},
        )
        .expect("gpu load");
    let table: Vec<u32> = (0..PROMPT.div_ceil(PAGE) as u32).collect();
    let pre = StepBatch::contiguous(0, &prompt(c.vocab_size), 0, &table, PAGE, false);
    let rt = step(&mut cpu, &pre, &[SampleParams::GREEDY], TapRequest::ALL);
    let bt = step(
        &mut dev,
        &pre,
        &[SampleParams::GREEDY],
        TapRequest::DIAGNOSE,
    );
    let mut scores = |l: usize, x: &[f32], rows: usize| router_scores(&good, l, x, rows);
    let mut out = Vec::new();
    match diagnose(
        &c,
        PROMPT,
        &rt.taps,
        &bt.taps,
        &mut scores,
        Margins::default(),
        false,
    ) {
        Err(e) => out.push(e.to_string()),
        Ok(g) => {
            let first_flip = g.first_discrete.as_ref().map(|d| d.layer);
            for d in &g.layers {
                if first_flip.is_none_or(|f| d.layer < f) && d.residual_rel_l2_max_row > case.tol {
                    out.push(format!(
                        "residual.{} rel L2 {:.3e}",
                        d.layer, d.residual_rel_l2_max_row
                    ));
                }
            }
            if g.first_discrete.is_some() && !g.upstream.near_tie {
                out.push(g.upstream.reason);
            }
        }
    }
    out
}

#[test]
fn device_sampling_graphs_and_block_copies() {
    let Some(gpu) = backend_or_skip("device_sampling_graphs_and_block_copies") else {
        return;
    };
    let case = &CASES[0];
    let m = Arc::new(synthetic::model(&config(case), case.formats, 11).expect("synthetic tiny"));
    let vocab = m.config.vocab_size;
    let mut dev = gpu
        .load(ModelSource::Weights(m.clone()), &spec(case), &mut |_| {})
        .expect("gpu load");
    let table: Vec<u32> = (0..8).collect();
    let p = prompt(vocab);
    let pre = StepBatch::contiguous(0, &p[..40], 0, &table, PAGE, true);
    // 3. keyed sampling of every prompt row, temperature 0.8 / top-k 50 /
    // top-p 0.9, against the CPU definition on the device's own logits
    let params: Vec<SampleParams> = (0..40)
        .map(|i| SampleParams {
            temperature: if i % 5 == 0 { 0.0 } else { 0.8 },
            top_k: if i % 3 == 0 { 0 } else { 50 },
            top_p: if i % 2 == 0 { 1.0 } else { 0.9 },
            seed: 100 + i as u64,
        })
        .collect();
    let out = step(&mut dev, &pre, &params, TapRequest::NONE);
    let mut wrong = 0;
    for (i, prm) in params.iter().enumerate() {
        let row = &out.logits[i * vocab..(i + 1) * vocab];
        let want = sample(row, prm, i as u32 + 1);
        if out.tokens[i] != want {
            wrong += 1;
            println!(
                "row {i}: device sampled {}, cpu definition {want}",
                out.tokens[i]
            );
        }
    }
    println!("keyed sampling: {wrong} of 40 rows differ from the CPU definition");
    assert_eq!(wrong, 0);
    // 4a. a graph replay (plain decode step) and a direct launch (the same
    // step with taps) give identical logits
    let st = StepBatch::contiguous(0, &[p[40]], 40, &table, PAGE, true);
    let g1 = step(&mut dev, &st, &[SampleParams::GREEDY], TapRequest::NONE);
    let g2 = step(&mut dev, &st, &[SampleParams::GREEDY], TapRequest::NONE);
    let d = step(&mut dev, &st, &[SampleParams::GREEDY], TapRequest::STANDARD);
    assert!(bits(&g1.logits, &g2.logits), "graph replays differ");
    assert!(
        bits(&g1.logits, &d.logits),
        "graph vs direct launches differ"
    );
    // 4b. copy-on-write: blocks 0..3 copied to 8..11, the same step over the
    // copies gives the same logits
    dev.copy_blocks(&[(0, 8), (1, 9), (2, 10)]).expect("copy");
    let copied: Vec<u32> = vec![8, 9, 10, 3, 4, 5, 6, 7];
    let mut st2 = StepBatch::contiguous(0, &[p[40]], 40, &copied, PAGE, true);
    st2.seqs[0].block_table = copied.clone();
    let c = step(&mut dev, &st2, &[SampleParams::GREEDY], TapRequest::NONE);
    assert!(
        bits(&g1.logits, &c.logits),
        "copied blocks give other logits"
    );
    // and a copy outside the pool is an error, not a crash
    assert!(dev.copy_blocks(&[(0, 10_000)]).is_err());
}

/// One decode-consistency configuration.
#[derive(Clone, Copy, Debug)]
struct Consistency {
    preset: &'static str,
    cache: CacheDtype,
    act: ActMode,
    graphs: bool,
}

/// The GPU against itself: the logits of a prompt's rows from one prefill
/// step, and from a shorter prefill followed by one decode step per row
/// (the incremental path every generation takes), agree within bf16 noise.
/// Printed per configuration (preset, cache, activations, kernel variant,
/// graphs), so a failure names the path at fault.
#[test]
fn decode_matches_prefill_on_the_gpu() {
    let Some(mut gpu) = backend_or_skip("decode_matches_prefill_on_the_gpu") else {
        return;
    };
    let mut failures = Vec::new();
    let mut configs = Vec::new();
    for preset in ["tiny", "small"] {
        for cache in caches(&gpu) {
            for act in [ActMode::Bf16, ActMode::Mxfp4] {
                for graphs in [true, false] {
                    configs.push(Consistency {
                        preset,
                        cache,
                        act,
                        graphs,
                    });
                }
            }
        }
    }
    let mut models = std::collections::BTreeMap::new();
    for cfg in configs {
        let m = models
            .entry(cfg.preset)
            .or_insert_with(|| {
                let c = ModelConfig::preset(cfg.preset).expect("preset");
                Arc::new(synthetic::model(&c, MX, 5).expect("synthetic model"))
            })
            .clone();
        gpu.path_options.graph_max_rows = if cfg.graphs { 128 } else { 0 };
        // bit for bit needs the same kernels for both: the small-step
        // variant (4 warps) splits K across warps in another order than the
        // default (8 warps) the 40-row prefill runs; it is checked against
        // the default within summation noise in the next test
        gpu.path_options.small_step_variant = false;
        gpu.path_options.small_step_attn_split = false;
        let spec = LoadSpec {
            cache_dtype: cfg.cache,
            block_size: PAGE,
            kv: KvBudget::Blocks(8),
            max_rows: 64,
            max_seqs: 1,
            max_context: 128,
            act: cfg.act,
            selection: None,
        };
        let mut dev = gpu
            .load(ModelSource::Weights(m.clone()), &spec, &mut |_| {})
            .expect("gpu load");
        let vocab = m.config.vocab_size;
        let n = 40;
        let half = 20;
        let p = prompt(vocab)[..n].to_vec();
        let table: Vec<u32> = (0..8).collect();
        let all = step(
            &mut dev,
            &StepBatch::contiguous(0, &p, 0, &table, PAGE, true),
            &vec![SampleParams::GREEDY; n],
            TapRequest::NONE,
        );
        let first = step(
            &mut dev,
            &StepBatch::contiguous(0, &p[..half], 0, &table, PAGE, true),
            &vec![SampleParams::GREEDY; half],
            TapRequest::NONE,
        );
        let row = |o: &StepOutput, i: usize| o.logits[i * vocab..(i + 1) * vocab].to_vec();
        let mut worst_prefill: f64 = 0.0;
        for i in 0..half {
            worst_prefill = worst_prefill.max(rel_l2(&row(&all, i), &row(&first, i)));
        }
        let (mut worst_decode, mut argmax_differ) = (0f64, 0usize);
        let mut per_row = Vec::new();
        for i in half..n {
            let d = step(
                &mut dev,
                &StepBatch::contiguous(0, &p[i..i + 1], i as u32, &table, PAGE, true),
                &[SampleParams::GREEDY],
                TapRequest::NONE,
            );
            let e = rel_l2(&row(&all, i), &row(&d, 0));
            per_row.push(format!("{e:.1e}"));
            worst_decode = worst_decode.max(if e.is_nan() { f64::INFINITY } else { e });
            if d.tokens[0] != all.tokens[i] {
                argmax_differ += 1;
            }
        }
        println!(
            "[{} cache {:?} act {:?} graphs {}] prefill-20 vs prefill-40 worst row rel L2 {worst_prefill:.2e}; decode vs prefill worst row {worst_decode:.2e}, argmax differs in {argmax_differ} of {}; per row {}",
            cfg.preset,
            cfg.cache,
            cfg.act,
            cfg.graphs,
            n - half,
            per_row.join(" ")
        );
        // the same kernels on the same inputs: bit for bit (a decode row
        // is computed as its prefill row is)
        if within(worst_decode, 1e-6).is_err() || within(worst_prefill, 1e-6).is_err() {
            failures.push(format!(
                "{cfg:?}: decode {worst_decode:.3e}, prefill {worst_prefill:.3e}"
            ));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// A decode step's per-layer taps against its prefill row's, on `small`
/// (K = 1024), layer by layer (attention and FFN outputs, router input,
/// residual): bit for bit with the small-step variant off (the same
/// kernels as the prefill), and within summation noise (rel L2 < 1e-2, the
/// parity judge's jump) with it on: its 4 warps add K's partial sums in
/// another order than the prefill's 8, which moves bf16 roundings from
/// layer 1 on (layer 0's sums of bf16 embeddings are exact in f32 either
/// way). Session 3 read that departure as a kernel bug (bench/NOTES.md);
/// session 4 found it is the order, and the variant agrees with the CPU
/// reference as the default does.
#[test]
fn decode_taps_match_prefill_taps_by_layer() {
    let Some(mut gpu) = backend_or_skip("decode_taps_match_prefill_taps_by_layer") else {
        return;
    };
    let c = ModelConfig::preset("small").expect("preset");
    let mut failures = Vec::new();
    for small_step in [false, true] {
        gpu.path_options.small_step_variant = small_step;
        gpu.path_options.small_step_attn_split = small_step;
        let tol = if small_step { 1e-2 } else { 1e-6 };
        let m = Arc::new(synthetic::model(&c, MX, 5).expect("synthetic model"));
        let spec = LoadSpec {
            cache_dtype: CacheDtype::Bf16,
            block_size: PAGE,
            kv: KvBudget::Blocks(8),
            max_rows: 64,
            max_seqs: 1,
            max_context: 128,
            act: ActMode::Bf16,
            selection: None,
        };
        let mut dev = gpu
            .load(ModelSource::Weights(m.clone()), &spec, &mut |_| {})
            .expect("gpu load");
        let h = c.hidden_size;
        let p = prompt(c.vocab_size)[..24].to_vec();
        let table: Vec<u32> = (0..8).collect();
        let all = step(
            &mut dev,
            &StepBatch::contiguous(0, &p, 0, &table, PAGE, true),
            &[SampleParams::GREEDY; 24],
            TapRequest::DIAGNOSE,
        );
        step(
            &mut dev,
            &StepBatch::contiguous(0, &p[..20], 0, &table, PAGE, true),
            &[SampleParams::GREEDY; 20],
            TapRequest::NONE,
        );
        for i in 20..24 {
            // plain decode steps (graphs), the last one tapped
            let tapped = i == 23;
            let d = step(
                &mut dev,
                &StepBatch::contiguous(0, &p[i..i + 1], i as u32, &table, PAGE, true),
                &[SampleParams::GREEDY],
                if tapped {
                    TapRequest::DIAGNOSE
                } else {
                    TapRequest::NONE
                },
            );
            if !tapped {
                continue;
            }
            for l in 0..c.num_hidden_layers {
                let mut line =
                    format!("small-step variant {small_step}: decode row {i} layer {l}:");
                for fam in ["attn_out", "ffn_in", "ffn_out", "residual"] {
                    let name = format!("{fam}.{l}");
                    if let (Some(a), Some(b)) = (all.taps.f32(&name), d.taps.f32(&name)) {
                        let e = rel_l2(&a[i * h..(i + 1) * h], &b[..h]);
                        line += &format!(" {fam} {e:.2e}");
                        if within(e, tol).is_err() {
                            failures.push(format!(
                            "small-step variant {small_step}: {name}: rel L2 {e:.3e} (tolerance {tol:.0e})"
                        ));
                        }
                    }
                }
                println!("{line}");
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// `m` with every MoE layer's shared expert's gate and up swapped: a
/// perturbation the shared-expert checks must see.
fn swap_shared_gate_up(m: &ModelWeights) -> Arc<ModelWeights> {
    let mut bad = m.clone();
    for l in bad.layers.iter_mut() {
        if let FfnWeights::Moe(moe) = &mut l.ffn {
            if let Some(s) = moe.shared.as_mut() {
                std::mem::swap(&mut s.gate, &mut s.up);
            }
        }
    }
    Arc::new(bad)
}

/// Logits of a 40-row prefill of sequence 0, then of 4 one-row decode
/// steps (graph-replayed), on a GPU runner of `m` loaded as `case` says.
fn prefill_then_decode(
    gpu: &GpuBackend,
    m: &Arc<ModelWeights>,
    case: &Case,
    vocab: usize,
) -> Vec<Vec<f32>> {
    let mut dev = gpu
        .load(ModelSource::Weights(m.clone()), &spec(case), &mut |_| {})
        .expect("gpu load");
    let table: Vec<u32> = (0..8).collect();
    let p = prompt(vocab);
    let mut outs = vec![
        step(
            &mut dev,
            &StepBatch::contiguous(0, &p[..40], 0, &table, PAGE, true),
            &[SampleParams::GREEDY; 40],
            TapRequest::NONE,
        )
        .logits,
    ];
    for (i, &tok) in p.iter().enumerate().take(44).skip(40) {
        let st = StepBatch::contiguous(0, &[tok], i as u32, &table, PAGE, true);
        outs.push(step(&mut dev, &st, &[SampleParams::GREEDY], TapRequest::NONE).logits);
    }
    outs
}

/// Whether a path option leaves the logits bit for bit as they were, over
/// [`prefill_then_decode`] of `m`: run with `set(.., false)` then with
/// `set(.., true)` (`same`); and whether that comparison can fail: `bad`,
/// run with `set(.., true)`, must differ from `m` (`caught`).
fn bitwise_ab(
    gpu: &mut GpuBackend,
    m: &Arc<ModelWeights>,
    bad: &Arc<ModelWeights>,
    case: &Case,
    vocab: usize,
    set: impl Fn(&mut m3_gpu::standard::PathOptions, bool),
) -> (bool, bool) {
    set(&mut gpu.path_options, false);
    let off = prefill_then_decode(gpu, m, case, vocab);
    set(&mut gpu.path_options, true);
    let on = prefill_then_decode(gpu, m, case, vocab);
    let planted = prefill_then_decode(gpu, bad, case, vocab);
    (same_bits(&off, &on), !same_bits(&on, &planted))
}

/// `--fold-shared-expert`: the shared expert loaded as one more matrix of
/// the expert stacks and run in the grouped launches gives bit-identical
/// logits (a prefill and graph-replayed decode steps), because it is the
/// same kernel on the same rows and its output enters the combine at the
/// same point. The check can fail: the folded path on a model whose shared
/// expert is perturbed must differ (it really uses the folded matrices).
/// Folding what cannot fold is a load error naming the reason.
#[test]
fn folded_shared_expert_is_bitwise_the_same() {
    let Some(mut gpu) = backend_or_skip("folded_shared_expert_is_bitwise_the_same") else {
        return;
    };
    let mut failures = Vec::new();
    for (preset, fmt) in [
        ("tiny", WeightFormat::Bf16),
        ("tiny", WeightFormat::Mxfp4),
        ("small", WeightFormat::Mxfp4),
    ] {
        let mut c = ModelConfig::preset(preset).expect("preset");
        c.shared_intermediate_size = c.intermediate_size;
        let formats = Formats {
            experts: fmt,
            dense: fmt,
        };
        let m = Arc::new(synthetic::model(&c, formats, 5).expect("synthetic"));
        let bad = swap_shared_gate_up(&m);
        let vocab = c.vocab_size;
        let case = Case {
            name: "fold",
            ..CASES[0]
        };
        let (same, caught) = bitwise_ab(&mut gpu, &m, &bad, &case, vocab, |o, on| {
            o.fold_shared_expert = on
        });
        println!(
            "{preset} {fmt:?}: folded == plain bitwise over a 40-row prefill and 4 decode steps: {same}; a perturbed shared expert differs: {caught}"
        );
        if !same {
            failures.push(format!("{preset} {fmt:?}: folded logits differ from plain"));
        }
        if !caught {
            failures.push(format!(
                "{preset} {fmt:?}: the folded path ignored a perturbed shared expert"
            ));
        }
    }
    // what cannot fold: the shared expert in another format, and MXFP4
    // expert inputs
    let c = ModelConfig::preset("tiny").expect("tiny");
    let mixed = Arc::new(
        synthetic::model(
            &c,
            Formats {
                experts: WeightFormat::Mxfp4,
                dense: WeightFormat::Bf16,
            },
            5,
        )
        .expect("synthetic"),
    );
    gpu.path_options.fold_shared_expert = true;
    let e = gpu
        .load(ModelSource::Weights(mixed), &spec(&CASES[0]), &mut |_| {})
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    println!("mixed formats: {e}");
    if !e.contains("fold") {
        failures.push(format!(
            "folding a bf16 shared expert into MXFP4 experts: {e:?}"
        ));
    }
    let m = Arc::new(synthetic::model(&c, Formats::default(), 5).expect("synthetic"));
    let mut sp = spec(&CASES[0]);
    sp.act = ActMode::Mxfp4;
    let e = gpu
        .load(ModelSource::Weights(m), &sp, &mut |_| {})
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    println!("act mxfp4: {e}");
    if !e.contains("mxfp4") {
        failures.push(format!("folding with --act mxfp4: {e:?}"));
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// The shared expert on its own stream beside the router and the routed
/// experts (`PathOptions::beside`, a second graph branch a MoE layer, with
/// the o projection's weights brought into L2 beside attention) gives the
/// one-stream logits bit for bit over a 40-row prefill and 4 captured
/// decode steps: the two chains write no buffer the other touches. The
/// check can fail: the same run on a model whose shared experts have gate
/// and up swapped differs.
#[test]
fn shared_expert_beside_is_bitwise_the_same() {
    use m3_gpu::standard::Beside;
    let Some(mut gpu) = backend_or_skip("shared_expert_beside_is_bitwise_the_same") else {
        return;
    };
    let mut failures = Vec::new();
    for (preset, experts, dense) in [
        ("tiny", WeightFormat::Bf16, WeightFormat::Bf16),
        ("tiny", WeightFormat::Mxfp4, WeightFormat::Mxfp8),
        ("small", WeightFormat::Mxfp4, WeightFormat::Mxfp8),
        ("small", WeightFormat::Nvfp4, WeightFormat::Mxfp8),
    ] {
        let c = ModelConfig::preset(preset).expect("preset");
        let m = Arc::new(synthetic::model(&c, Formats { experts, dense }, 5).expect("synthetic"));
        let bad = swap_shared_gate_up(&m);
        let vocab = c.vocab_size;
        let case = Case {
            name: "beside",
            ..CASES[0]
        };
        let (same, caught) = bitwise_ab(&mut gpu, &m, &bad, &case, vocab, |o, on| {
            o.beside = if on { Beside::On } else { Beside::Off }
        });
        println!(
            "{preset} {experts:?} / {dense:?}: beside == one stream bitwise over a 40-row prefill and 4 decode steps: {same}; swapped shared gate / up differs: {caught}"
        );
        if !same {
            failures.push(format!(
                "{preset} {experts:?} / {dense:?}: the shared expert beside changed the logits"
            ));
        }
        if !caught {
            failures.push(format!(
                "{preset} {experts:?} / {dense:?}: a perturbed shared expert went unseen"
            ));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// [`bitwise_ab`] over synthetic models (preset, expert and dense
/// formats) with `set(options, on, extra)` (`extra` per model): the
/// failures, named with `what`.
fn bitwise_over_models(
    gpu: &mut GpuBackend,
    what: &str,
    models: &[(&str, WeightFormat, WeightFormat, bool)],
    set: impl Fn(&mut m3_gpu::standard::PathOptions, bool, bool),
) -> Vec<String> {
    let mut failures = Vec::new();
    for &(preset, experts, dense, extra) in models {
        let c = ModelConfig::preset(preset).expect("preset");
        let m = Arc::new(synthetic::model(&c, Formats { experts, dense }, 5).expect("synthetic"));
        let bad = swap_shared_gate_up(&m);
        let case = Case {
            name: "bitwise over models",
            ..CASES[0]
        };
        let (same, caught) = bitwise_ab(gpu, &m, &bad, &case, c.vocab_size, |o, on| {
            set(o, on, extra)
        });
        let at = format!("{preset} {experts:?} / {dense:?} ({extra})");
        println!("{at}: {what} bitwise: {same}; swapped shared gate / up differs: {caught}");
        if !same {
            failures.push(format!("{at}: {what} changed the logits"));
        }
        if !caught {
            failures.push(format!("{at}: a perturbed shared expert went unseen"));
        }
    }
    failures
}

/// SwiGLU in the gate + up launch's epilogue (`PathOptions::fuse_swiglu`:
/// one launch fewer an MLP, the routed experts', the shared expert's and a
/// dense layer's) gives the logits of gate + up, then `m3s_swiglu`, bit for
/// bit over a 40-row prefill and 4 captured decode steps, in each MX expert
/// format. The check can fail: the fused run on a model whose shared
/// experts have gate and up swapped differs.
#[test]
fn fused_swiglu_is_bitwise_the_same() {
    let Some(mut gpu) = backend_or_skip("fused_swiglu_is_bitwise_the_same") else {
        return;
    };
    let mx8 = WeightFormat::Mxfp8;
    let failures = bitwise_over_models(
        &mut gpu,
        "SwiGLU in the gate + up epilogue == its own launch",
        &[
            ("tiny", WeightFormat::Mxfp4, mx8, false),
            ("small", WeightFormat::Mxfp4, mx8, false),
            ("small", WeightFormat::Nvfp4, mx8, false),
        ],
        |o, on, _| o.fuse_swiglu = on,
    );
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Route records of at most a CTA's rows (`PathOptions::route_chunk`: an
/// expert of c pairs on ceil(c / 16) slots, the routed linears on one
/// z-block) give the logits of one record an expert bit for bit over a
/// 40-row prefill (experts of more than 16 of its pairs: several records)
/// and 4 captured decode steps, in each MX expert format. The check can
/// fail: the run on a model whose shared experts have gate and up swapped
/// differs.
#[test]
fn chunked_routes_are_bitwise_the_same() {
    let Some(mut gpu) = backend_or_skip("chunked_routes_are_bitwise_the_same") else {
        return;
    };
    let mx8 = WeightFormat::Mxfp8;
    let failures = bitwise_over_models(
        &mut gpu,
        "route records of at most 16 pairs == one record an expert",
        &[
            ("tiny", WeightFormat::Mxfp4, mx8, false),
            ("small", WeightFormat::Mxfp4, mx8, true),
            ("small", WeightFormat::Nvfp4, mx8, false),
        ],
        |o, on, swiglu| {
            o.route_chunk = on;
            o.fuse_swiglu = swiglu;
        },
    );
    assert!(failures.is_empty(), "{failures:#?}");
}

/// The d <= 128 attention partials (`PathOptions::attn_d128`: one output
/// d group a warp, the split one built for more CTAs an SM) give the
/// logits of the plain partials bit for bit over a 40-row prefill (the
/// sparse partial) and 4 captured decode steps (the split one; with
/// `extra` every step up to 64 rows takes the split). The check can fail:
/// the run on a model whose shared experts have gate and up swapped
/// differs.
#[test]
fn d128_attention_is_bitwise_the_same() {
    let Some(mut gpu) = backend_or_skip("d128_attention_is_bitwise_the_same") else {
        return;
    };
    let mx8 = WeightFormat::Mxfp8;
    let failures = bitwise_over_models(
        &mut gpu,
        "the _d128 attention partials == the plain ones",
        &[
            ("tiny", WeightFormat::Mxfp4, mx8, false),
            ("small", WeightFormat::Mxfp4, mx8, true),
        ],
        |o, on, extra| {
            o.attn_d128 = on;
            if extra {
                o.attn_split_max_rows = 64;
            }
        },
    );
    assert!(failures.is_empty(), "{failures:#?}");
}

/// A MoE layer's combine taken into the next layer's input RMSNorm
/// (`PathOptions::fold_combine`: one launch a MoE layer fewer, the
/// residual in two buffers in turn) gives the logits of the separate
/// combine launch bit for bit over a 40-row prefill and 4 captured decode
/// steps, with and without SwiGLU in the gate + up epilogue (`extra`; the
/// mono path with both: `mono_path_is_bitwise_the_standard_path` under
/// `M3_FOLD_COMBINE=1 M3_FUSE_SWIGLU=1`). The check can fail: the folded
/// run on a model whose shared experts have gate and up swapped differs.
#[test]
fn folded_combine_is_bitwise_the_same() {
    let Some(mut gpu) = backend_or_skip("folded_combine_is_bitwise_the_same") else {
        return;
    };
    let (bf, mx8) = (WeightFormat::Bf16, WeightFormat::Mxfp8);
    let failures = bitwise_over_models(
        &mut gpu,
        "the MoE combine in the next RMSNorm == its own launch",
        &[
            ("tiny", WeightFormat::Mxfp4, mx8, false),
            ("tiny", bf, bf, false),
            ("small", WeightFormat::Mxfp4, mx8, true),
            ("small", WeightFormat::Nvfp4, mx8, false),
        ],
        |o, on, swiglu| {
            o.fold_combine = on;
            o.fuse_swiglu = swiglu;
        },
    );
    assert!(failures.is_empty(), "{failures:#?}");
}

/// K, V and the index key written to their caches by the head-norm launch
/// (`PathOptions::fuse_cache_writes`, the default) give the logits of the
/// separate cache-write launch bit for bit, in each cache kind, over a
/// 40-row prefill and 4 captured decode steps (whose attention reads only
/// the caches). The check can fail: the fused run on a model with its last
/// layer's K and V projections swapped differs.
#[test]
fn fused_cache_writes_are_bitwise_the_same() {
    let Some(mut gpu) = backend_or_skip("fused_cache_writes_are_bitwise_the_same") else {
        return;
    };
    let mut failures = Vec::new();
    let c = ModelConfig::preset("tiny").expect("tiny");
    let m = Arc::new(synthetic::model(&c, MX, 7).expect("synthetic"));
    let mut bad = (*m).clone();
    let last = bad.layers.len() - 1;
    let a = &mut bad.layers[last].attn;
    std::mem::swap(&mut a.k, &mut a.v);
    let bad = Arc::new(bad);
    for cache in caches(&gpu) {
        let case = Case {
            name: "fused cache writes",
            cache,
            ..CASES[0]
        };
        let (same, caught) = bitwise_ab(&mut gpu, &m, &bad, &case, c.vocab_size, |o, on| {
            o.fuse_cache_writes = on
        });
        println!(
            "{cache:?} cache: fused == separate cache writes bitwise: {same}; swapped K / V differs: {caught}"
        );
        if !same {
            failures.push(format!(
                "{cache:?} cache: the fused cache writes changed the logits"
            ));
        }
        if !caught {
            failures.push(format!(
                "{cache:?} cache: swapped K / V projections went unseen"
            ));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Whether two runs' logits (one vector a step) are the same bits.
fn same_bits(a: &[Vec<f32>], b: &[Vec<f32>]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| bits(x, y))
}

/// Whether two vectors are the same length and the same bits.
fn bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// The GPU of a mono test, or `None` (printed as skipped): no device (see
/// `backend_or_skip`), or a HIP device (the mono tests run on CUDA and
/// the simulator's two flavours).
fn mono_backend(test: &str) -> Option<GpuBackend> {
    let be = backend_or_skip(test)?;
    if be.gpu().vendor() != Vendor::Cuda && !be.gpu().simulated() {
        println!("skipped: {test}: the mono tests run on CUDA and the simulator");
        return None;
    }
    Some(be)
}

/// `tiny` with MXFP4 weights, and the same model with layer `li`'s K and
/// V projections swapped (the last layer past the end): the planted
/// mistake a bitwise comparison must catch.
fn tiny_mxfp4_and_planted(li: usize) -> (ModelConfig, Arc<ModelWeights>, Arc<ModelWeights>) {
    let c = ModelConfig::preset("tiny").expect("preset");
    let formats = Formats {
        experts: WeightFormat::Mxfp4,
        dense: WeightFormat::Mxfp4,
    };
    let m = synthetic::model(&c, formats, 7).expect("synthetic");
    let mut bad = m.clone();
    let li = li.min(bad.layers.len() - 1);
    let a = &mut bad.layers[li].attn;
    std::mem::swap(&mut a.k, &mut a.v);
    (c, Arc::new(m), Arc::new(bad))
}

/// Run `st` on `path` greedily; every logits row back.
fn greedy_logits(
    r: &mut m3_gpu::GpuRunner<'_>,
    st: &StepBatch,
    path: Path,
) -> Result<Vec<f32>, m3_core::backend::BackendError> {
    use m3_core::backend::ModelRunner;
    let sampling = vec![SampleParams::GREEDY; st.logits_rows.len()];
    let o = r.step(&StepInput {
        batch: st,
        path,
        sampling: &sampling,
        read: &ReadBack {
            logits: (0..st.logits_rows.len() as u32).collect(),
            taps: TapRequest::NONE,
        },
        teacher: None,
    })?;
    Ok(o.logits)
}

/// One sequence on pages 0-11: a prefill of `steps[0]` rows
/// (`Path::Standard`), then each later count of rows as a step marked
/// decode-only (a verify step's shape) and sent as the planner sends its
/// mono steps (`Path::Mono`, which a runner runs on the standard path
/// where it has no mono path or the step is past its threshold). Every
/// step's logits, in order.
fn prefill_then_mono(
    r: &mut m3_gpu::GpuRunner<'_>,
    prompt: &[u32],
    steps: &[usize],
) -> Result<Vec<Vec<f32>>, String> {
    let table: Vec<u32> = (0..12).collect();
    let mut outs = Vec::new();
    let mut pos = 0usize;
    for (i, &n) in steps.iter().enumerate() {
        let toks = &prompt[pos..pos + n];
        let mut st = StepBatch::contiguous(0, toks, pos as u32, &table, PAGE, true);
        let path = if i == 0 {
            Path::Standard
        } else {
            st.decode_only = true;
            Path::Mono
        };
        if !path.allows(&st) {
            return Err(format!("{n}-row step not allowed on {path:?}"));
        }
        let logits =
            greedy_logits(r, &st, path).map_err(|e| format!("{n}-row step at {pos}: {e}"))?;
        outs.push(logits);
        pos += n;
    }
    Ok(outs)
}

/// The mono path (one persistent launch a layer running the standard
/// kernels' bodies as a recorded program, standard/mono.rs) gives the
/// standard path's logits bit for bit: every `Path::Mono` step after a
/// 40-row prefill (decode rows, 4- and 16-row verify-shaped steps, and a
/// 24-row one of the wide mode), captured graphs as a runner runs them;
/// the runner reports
/// `supports_mono` exactly when it has the mono kernel. The mono runner must really have taken
/// the mono path for those steps, and the check can fail: the mono path on
/// a model with its last layer's K and V projections swapped differs.
#[test]
fn mono_path_is_bitwise_the_standard_path() {
    use m3_core::backend::ModelRunner;
    use m3_gpu::standard::PathOptions;
    use m3_gpu::GpuRunner;
    let Some(be) = backend_or_skip("mono_path_is_bitwise_the_standard_path") else {
        return;
    };
    let dev = be.gpu();
    if dev.vendor() != Vendor::Cuda && !dev.simulated() {
        println!(
            "skipped: mono_path_is_bitwise_the_standard_path: the mono path runs on CUDA only"
        );
        return;
    }
    let mut failures = Vec::new();
    // (the NVFP4 cache: the mono program records the standard path's
    // cache-write, indexer and attention launches with their NVFP4 args)
    // (small with MXFP8 dense linears: their interleaved walk past one row
    // is where a mono build that dealt K to the warps by its halved batch
    // summed in another order; bench/NOTES.md session 28)
    for (preset, fmt, dense, cache) in [
        (
            "tiny",
            WeightFormat::Bf16,
            WeightFormat::Bf16,
            CacheDtype::Fp8E4M3,
        ),
        (
            "tiny",
            WeightFormat::Mxfp4,
            WeightFormat::Mxfp4,
            CacheDtype::Fp8E4M3,
        ),
        (
            "small",
            WeightFormat::Mxfp4,
            WeightFormat::Mxfp4,
            CacheDtype::Fp8E4M3,
        ),
        (
            "small",
            WeightFormat::Mxfp4,
            WeightFormat::Mxfp8,
            CacheDtype::Fp8E4M3,
        ),
        (
            "tiny",
            WeightFormat::Mxfp4,
            WeightFormat::Mxfp4,
            CacheDtype::Nvfp4,
        ),
    ] {
        if !caches(&be).contains(&cache) {
            continue;
        }
        let c = ModelConfig::preset(preset).expect("preset");
        let formats = Formats {
            experts: fmt,
            dense,
        };
        let m = Arc::new(synthetic::model(&c, formats, 7).expect("synthetic"));
        let mut bad = (*m).clone();
        let last = bad.layers.len() - 1;
        let a = &mut bad.layers[last].attn;
        std::mem::swap(&mut a.k, &mut a.v);
        let bad = Arc::new(bad);
        let vocab = c.vocab_size;
        // (steps run on the mono path, logits of every step)
        let run = |m: &Arc<ModelWeights>, mono: bool| -> Result<(u64, Vec<Vec<f32>>), String> {
            // (M3_MONO_DEFINES selects a mono build to check)
            let opts = PathOptions {
                mono,
                ..PathOptions::default().with_env_overrides()
            };
            let mut r = GpuRunner::load(
                dev,
                ModelSource::Weights(m.clone()),
                &LoadSpec {
                    cache_dtype: cache,
                    ..spec(&CASES[0])
                },
                opts,
                &mut |_| {},
            )
            .map_err(|e| format!("load: {e}"))?;
            let p = prompt(vocab);
            // prefill 40 rows (Path::Standard), then steps of 1, 1, 4, 1, 16,
            // 1 and 24 rows (the wide mode) marked decode-only (a verify
            // step's shape) and sent as the planner sends its mono steps:
            // Path::Mono, which a runner without the mono kernel runs on
            // the standard path
            let outs = prefill_then_mono(&mut r, &p, &[40, 1, 1, 4, 1, 16, 1, 24])?;
            if r.supports_mono() != mono {
                return Err(format!(
                    "supports_mono {} with PathOptions::mono {mono}",
                    r.supports_mono()
                ));
            }
            Ok((r.path().mono_steps(), outs))
        };
        let (std_n, plain) = match run(&m, false) {
            Ok(v) => v,
            Err(e) => {
                failures.push(format!(
                    "{preset} {fmt:?}/{dense:?} {cache:?} standard: {e}"
                ));
                continue;
            }
        };
        let (mono_n, mono) = match run(&m, true) {
            Ok(v) => v,
            Err(e) => {
                failures.push(format!("{preset} {fmt:?}/{dense:?} {cache:?} mono: {e}"));
                continue;
            }
        };
        let planted = run(&bad, true).map(|(_, o)| o);
        let same = same_bits(&plain, &mono);
        let first_diff = plain.iter().zip(&mono).position(|(a, b)| !bits(a, b));
        let caught = match &planted {
            Ok(pl) => !same_bits(&plain, pl),
            Err(_) => false,
        };
        println!(
            "{preset} {fmt:?}/{dense:?} {cache:?}: mono steps {mono_n} (standard runner {std_n}); mono == standard bitwise over 8 steps: {same} (first differing step {first_diff:?}); a perturbed model differs: {caught}"
        );
        if std_n != 0 || mono_n != 7 {
            failures.push(format!(
                "{preset} {fmt:?}/{dense:?} {cache:?}: mono steps {mono_n} (want 7), standard runner {std_n} (want 0)"
            ));
        }
        if !same {
            failures.push(format!(
                "{preset} {fmt:?}/{dense:?} {cache:?}: mono logits differ from standard (first at step {first_diff:?})"
            ));
        }
        if !caught {
            failures.push(format!(
                "{preset} {fmt:?}: a perturbed model gave the same logits on the mono path ({:?})",
                planted.err()
            ));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// `--path auto` (`MonoRows::Measured`): the runner times both paths at
/// load and takes the mono path exactly up to the crossover it measured
/// (`mono_max_rows`, `supports_mono`); the timing steps write into cache
/// pages nobody holds, so the steps that follow give the standard
/// runner's logits bit for bit (whichever path they take), and the planted
/// model shows the comparison can fail.
#[test]
fn auto_path_measures_its_crossover_and_changes_no_result() {
    use m3_core::backend::ModelRunner;
    use m3_gpu::standard::{MonoRows, PathOptions};
    use m3_gpu::GpuRunner;
    let Some(be) = mono_backend("auto_path_measures_its_crossover_and_changes_no_result") else {
        return;
    };
    let dev = be.gpu();
    let (c, m, bad) = tiny_mxfp4_and_planted(0);
    let vocab = c.vocab_size;
    let sp = spec(&CASES[0]);
    let run = |m: &Arc<ModelWeights>,
               opts: PathOptions|
     -> (
        Vec<Vec<f32>>,
        u64,
        usize,
        Option<m3_gpu::standard::MonoCrossover>,
    ) {
        let mut r = GpuRunner::load(dev, ModelSource::Weights(m.clone()), &sp, opts, &mut |_| {})
            .expect("load");
        let crossover = r.mono_crossover().cloned();
        let max = r.mono_max_rows();
        let outs = prefill_then_mono(&mut r, &prompt(vocab), &[40, 1, 1, 2, 1]).expect("steps");
        (outs, r.path().mono_steps(), max, crossover)
    };
    let standard = PathOptions::default();
    let auto = PathOptions {
        mono: true,
        mono_rows: MonoRows::Measured,
        ..PathOptions::default()
    };
    let (want, _, std_max, none) = run(&m, standard);
    assert_eq!((std_max, none.is_none()), (0, true), "standard runner");
    let (got, mono_n, max, x) = run(&m, auto);
    let x = x.expect("--path auto measured no crossover");
    println!("{}", x.summary());
    let rows: Vec<usize> = x.times.iter().map(|t| t.0).collect();
    let want_rows: Vec<usize> = if dev.simulated() {
        vec![1, 2]
    } else {
        m3_gpu::standard::StandardPath::MONO_CANDIDATES.to_vec()
    };
    assert_eq!(rows, want_rows, "timed candidates");
    let first_loss = x
        .times
        .iter()
        .position(|(_, s, m)| m.partial_cmp(s) != Some(std::cmp::Ordering::Less));
    let expect_max = match first_loss {
        Some(0) => 0,
        Some(i) => x.times[i - 1].0,
        None => x.times.last().map_or(0, |t| t.0),
    };
    assert_eq!(
        (x.max_rows, max),
        (expect_max, expect_max),
        "crossover and mono_max_rows"
    );
    // the decode steps of 1 and 2 rows took mono exactly where it won
    let want_mono = [1usize, 1, 2, 1].iter().filter(|&&n| n <= max).count() as u64;
    assert_eq!(mono_n, want_mono, "mono steps");
    assert!(same_bits(&want, &got), "--path auto changed the logits");
    let (planted, _, _, _) = run(&bad, auto);
    assert!(
        !same_bits(&want, &planted),
        "a perturbed model gave the same logits"
    );
}

/// The wide mode over several sequences: four sequences prefilled on the
/// standard path, then a 32-row decode-only step (8 verify-shaped rows a
/// sequence: the router's general form, the grouped experts over 32 rows,
/// attention over four block tables) and a 4-row decode step, on the mono
/// path; the logits are the standard runner's bit for bit, both steps
/// took the mono path, and a planted model differs.
#[test]
fn wide_mono_over_several_sequences_is_bitwise_the_standard_path() {
    use m3_gpu::standard::PathOptions;
    use m3_gpu::GpuRunner;
    let Some(be) = mono_backend("wide_mono_over_several_sequences_is_bitwise_the_standard_path")
    else {
        return;
    };
    let dev = be.gpu();
    let (c, m, bad) = tiny_mxfp4_and_planted(usize::MAX);
    let vocab = c.vocab_size as u32;
    const SEQS: usize = 4;
    const PREFILL: usize = 20;
    // sequence b on pages 4b..4b+4 (64 positions)
    let table = |b: usize| -> Vec<u32> { (4 * b as u32..4 * b as u32 + 4).collect() };
    let tok = |b: usize, p: usize| ((b * 7919 + p * 31 + 13) as u32) % vocab;
    // n rows a sequence at positions from..from + n, decode-only
    let step_of = |from: usize, n: usize| {
        m3_gpu::standard::bench::timing_step(&[n; SEQS], from, PAGE, vocab as usize, table)
    };
    let run = |m: &Arc<ModelWeights>, mono: bool| -> (Vec<Vec<f32>>, u64) {
        let opts = PathOptions {
            mono,
            ..PathOptions::default()
        };
        let mut r = GpuRunner::load(
            dev,
            ModelSource::Weights(m.clone()),
            &spec(&CASES[0]),
            opts,
            &mut |_| {},
        )
        .expect("load");
        let mut outs = Vec::new();
        let mut go = |st: &StepBatch, path: Path| {
            assert!(
                path.allows(st),
                "{} rows not allowed on {path:?}",
                st.rows()
            );
            outs.push(greedy_logits(&mut r, st, path).expect("step"));
        };
        for b in 0..SEQS {
            let toks: Vec<u32> = (0..PREFILL).map(|p| tok(b, p)).collect();
            go(
                &StepBatch::contiguous(b as u64, &toks, 0, &table(b), PAGE, false),
                Path::Standard,
            );
        }
        go(&step_of(PREFILL, 8), Path::Mono);
        go(&step_of(PREFILL + 8, 1), Path::Mono);
        let n = r.path().mono_steps();
        (outs, n)
    };
    let (want, std_n) = run(&m, false);
    let (got, mono_n) = run(&m, true);
    assert_eq!(
        (std_n, mono_n),
        (0, 2),
        "mono steps (standard runner, mono runner)"
    );
    assert!(
        same_bits(&want, &got),
        "the wide mono steps differ from the standard path"
    );
    let (planted, _) = run(&bad, true);
    assert!(
        !same_bits(&want, &planted),
        "a perturbed model gave the same logits"
    );
}
