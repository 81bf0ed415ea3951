//! The standard path (device-resident, graph-captured) against the CPU
//! reference on `tiny` (PERF.md protocol step 4): per-layer residuals and
//! logits of a prefill step within a relative-L2 tolerance, identical greedy
//! tokens over 16 decode steps, graph replay bit-identical to direct
//! launches, and a planted weight error caught. Skips without a GPU (fails
//! under REQUIRE_GPU=1).
//!
//! Near ties (ARCHITECTURE.md: "discrete choices must match except at
//! reported near-ties"): when a decode step's selected blocks or chosen
//! experts differ, the reference's own scores decide. Block scores come from
//! the cpu-ref `index_scores.{l}` tap; router scores (`sigmoid(z) + bias`,
//! the key the router ranks by) are recorded by [`RouterScores`], a wrapper
//! around the CPU backend that recomputes them from the router op's own
//! inputs. A flip is a near tie when the reference's score gap between the
//! best block/expert only it chose and the worst one only the GPU chose is
//! below the margin (golden's floors, made relative: see [`near_tie_margin`]).
//! A flip that is not a near tie fails. After a near-tie flip the GPU's
//! state legitimately drifts from the reference's, so the logits tolerance
//! is reported but no longer enforced for the rest of the run; greedy tokens
//! are still compared, and a token difference passes only when both sides'
//! logit gap between the two tokens is below [`LOGIT_MARGIN`]. Both sides
//! are fed the reference's token, so every later step stays comparable.

mod common;

use common::gpu_or_skip;
use std::cell::RefCell;

use m3_core::backend::{
    Backend, BackendError, LinearInput, Op, Path, RunOptions, StepBatch, TapRequest, Taps,
};
use m3_core::config::{IndexSelection, ModelConfig};
use m3_core::kv::{CacheDtype, KvCache, KvLayout};
use m3_core::weights::{FfnWeights, ModelWeights};
use m3_cpu_ref::synthetic::{self, Formats, WeightFormat};
use m3_cpu_ref::CpuBackend;
use m3_gpu::standard::{Capacity, DevModel, StandardPath};
use m3_gpu::CudaGpu;

/// Relative L2 error allowed per residual / logits tensor: bf16 roundings
/// at every op boundary (2^-9 each) in a different summation order, over 4
/// layers, stay well under 1%; a wrong op gives O(1).
const REL_L2_TOL: f64 = 1e-2;

/// Floor of the block-score near-tie margin (score units): golden's
/// `topk_margin` floor (golden/gen/reference.py `near_tie`).
const TOPK_MARGIN: f64 = 2e-2;
/// Floor of the router near-tie margin (biased sigmoid score units):
/// golden's `router_margin` floor.
const ROUTER_MARGIN: f64 = 1e-3;
/// Logit gap below which two greedy tokens are a near tie (the `tiny`
/// divergence seen on the H200 had a reference gap of 7.7e-4).
const LOGIT_MARGIN: f64 = 1e-3;

/// The margin for a reference score `s`: `floor * max(1, |s|)`, so large
/// scores get the same relative slack f32 reordering gives them.
fn near_tie_margin(floor: f64, s: f64) -> f64 {
    floor * s.abs().max(1.0)
}

/// How a reference and a GPU choice set of one row differ, judged on the
/// reference's scores.
#[derive(Debug, Clone, PartialEq)]
struct Flip {
    /// Ids only the reference chose.
    ref_only: Vec<i32>,
    /// Ids only the GPU chose.
    gpu_only: Vec<i32>,
    /// `max score(ref_only) - min score(gpu_only)` (the reference ranked
    /// every `ref_only` id at least this far above some `gpu_only` id);
    /// infinite or NaN when an id has no finite score or the counts differ.
    gap: f64,
    /// The margin it was judged against.
    margin: f64,
    near_tie: bool,
}

/// Compare two choice sets (`-1` = padding) on the reference's `scores`
/// (indexed by id); `None` when they hold the same ids.
fn judge_flip(cpu: &[i32], gpu: &[i32], scores: &[f32], floor: f64) -> Option<Flip> {
    let set = |v: &[i32]| {
        let mut v: Vec<i32> = v.iter().copied().filter(|&x| x >= 0).collect();
        v.sort_unstable();
        v.dedup();
        v
    };
    let (c, g) = (set(cpu), set(gpu));
    if c == g {
        return None;
    }
    let ref_only: Vec<i32> = c.iter().copied().filter(|x| !g.contains(x)).collect();
    let gpu_only: Vec<i32> = g.iter().copied().filter(|x| !c.contains(x)).collect();
    let score = |id: i32| -> f64 {
        usize::try_from(id)
            .ok()
            .and_then(|i| scores.get(i))
            .map_or(f64::NAN, |&v| f64::from(v))
    };
    let hi = ref_only
        .iter()
        .map(|&i| score(i))
        .fold(f64::NEG_INFINITY, f64::max);
    let lo = gpu_only
        .iter()
        .map(|&i| score(i))
        .fold(f64::INFINITY, f64::min);
    let any_bad = ref_only
        .iter()
        .chain(&gpu_only)
        .any(|&i| !score(i).is_finite());
    let gap = if ref_only.len() != gpu_only.len() || ref_only.is_empty() || any_bad {
        f64::INFINITY
    } else {
        hi - lo
    };
    let margin = near_tie_margin(floor, if hi.is_finite() { hi } else { 0.0 });
    // NaN compares false: never a near tie
    let near_tie = gap.abs() < margin;
    Some(Flip {
        ref_only,
        gpu_only,
        gap,
        margin,
        near_tie,
    })
}

/// The reference's block scores of KV head `g` for a one-row step, from the
/// `index_scores.{l}` tap `[index_heads, 1, nb]`: index head `g` with
/// per-KV-head selection, the max over index heads with shared selection
/// (what cpu-ref's `block_topk` ranks by).
fn head_scores(all: &[f32], heads: usize, g: usize, sel: IndexSelection) -> Vec<f32> {
    let nb = all.len() / heads.max(1);
    match sel {
        IndexSelection::PerKvHead => all.get(g * nb..(g + 1) * nb).unwrap_or(&[]).to_vec(),
        IndexSelection::Shared => (0..nb)
            .map(|b| {
                (0..heads)
                    .map(|h| all[h * nb + b])
                    .fold(f32::NEG_INFINITY, f32::max)
            })
            .collect(),
    }
}

/// The CPU backend, recording each router call's ranking key
/// (`sigmoid(x W^T) + bias`, `[rows, experts]`) in call order, i.e. one
/// entry per MoE layer of a forward step. The scores are recomputed with
/// the same op the router uses (f32 input, no output rounding) and the same
/// `sigmoid`, so they are the reference's exact keys; the router op itself
/// still runs unchanged.
struct RouterScores {
    cpu: CpuBackend,
    keys: RefCell<Vec<Vec<f32>>>,
}

impl RouterScores {
    fn new() -> Self {
        RouterScores {
            cpu: CpuBackend::new(),
            keys: RefCell::new(Vec::new()),
        }
    }
    /// The keys recorded since the last call (one entry per MoE layer).
    fn take(&self) -> Vec<Vec<f32>> {
        std::mem::take(&mut *self.keys.borrow_mut())
    }
}

impl Backend for RouterScores {
    fn name(&self) -> &str {
        "cpu+router-scores"
    }
    fn run_op(&self, op: Op<'_>) -> Result<(), BackendError> {
        if let Op::Router {
            x,
            rows,
            router,
            bias,
            top_k,
            scaling,
            ids,
            weights,
        } = op
        {
            let ne = router.rows();
            let mut z = vec![0f32; rows * ne];
            self.cpu.run_op(Op::Linear {
                x,
                rows,
                w: router,
                input: LinearInput::F32,
                round_out: false,
                out: &mut z,
            })?;
            let keys: Vec<f32> = z
                .iter()
                .enumerate()
                .map(|(i, &v)| m3_cpu_ref::moe::router_key(v, bias[i % ne]))
                .collect();
            self.keys.borrow_mut().push(keys);
            return self.cpu.run_op(Op::Router {
                x,
                rows,
                router,
                bias,
                top_k,
                scaling,
                ids,
                weights,
            });
        }
        self.cpu.run_op(op)
    }
}

fn rel_l2(got: &[f32], want: &[f32]) -> f64 {
    assert_eq!(got.len(), want.len(), "length mismatch");
    let (mut e, mut n) = (0f64, 0f64);
    for (&g, &w) in got.iter().zip(want) {
        e += (g as f64 - w as f64).powi(2);
        n += (w as f64).powi(2);
    }
    (e / n.max(1e-300)).sqrt()
}

fn argmax(v: &[f32]) -> u32 {
    m3_core::sample::greedy(v)
}

const PAGE: usize = 16;
const PAGES: usize = 8;
const PROMPT: usize = 80; // > 4 blocks of 16: sparse selection is exercised

fn tiny() -> (ModelConfig, ModelWeights) {
    let cfg = ModelConfig::preset("tiny").expect("tiny preset");
    let formats = Formats {
        experts: WeightFormat::Mxfp4,
        dense: WeightFormat::Mxfp8,
    };
    let m = synthetic::model(&cfg, formats, 7).expect("synthetic tiny");
    (cfg, m)
}

fn path(gpu: &CudaGpu, m: &ModelWeights) -> StandardPath {
    let dm = DevModel::upload(gpu.context(), m).expect("upload");
    StandardPath::new(
        gpu,
        dm,
        Capacity {
            max_rows: PROMPT,
            page_size: PAGE,
            num_pages: PAGES,
            max_context: PAGE * PAGES,
            record_residuals: true,
        },
    )
    .expect("standard path")
}

fn layout() -> KvLayout {
    KvLayout {
        page_size: PAGE,
        num_pages: PAGES,
        dtype: CacheDtype::Fp8E4M3,
    }
}

fn prompt(vocab: usize) -> Vec<u32> {
    (0..PROMPT as u32)
        .map(|i| (i * 7919 + 13) % vocab as u32)
        .collect()
}

#[test]
fn standard_path_matches_cpu_ref_on_tiny() {
    let Some(gpu) = gpu_or_skip("standard_path_matches_cpu_ref_on_tiny") else {
        return;
    };
    let (cfg, m) = tiny();
    let table: Vec<u32> = (0..PAGES as u32).collect();
    let cpu = RouterScores::new();
    let mut cache = KvCache::new(&m, layout());
    let mut sp = path(&gpu, &m);
    let step = StepBatch::contiguous(0, &prompt(cfg.vocab_size), 0, &table, PAGE, false);
    let mut taps = Taps::new(TapRequest::STANDARD);
    let opts = RunOptions::default();
    let want = cpu
        .forward(&m, &mut cache, &step, Path::Standard, &opts, &mut taps)
        .expect("cpu prefill");
    let got = sp.forward(&step, false).expect("gpu prefill");
    // every number is printed before any assertion, so one device run shows
    // the whole picture
    let mut failures: Vec<String> = Vec::new();
    let res = sp.residuals(PROMPT).expect("residuals");
    let ex = sp.experts_chosen(PROMPT).expect("experts");
    let bl = sp.blocks_selected(PROMPT).expect("blocks");
    for (l, r) in res.iter().enumerate() {
        let w = taps
            .f32(&format!("residual.{l}"))
            .expect("cpu residual tap");
        let e = rel_l2(r, w);
        let ed = taps
            .i32(&format!("experts.{l}"))
            .map_or(0, |c| c.iter().zip(&ex[l]).filter(|(a, b)| a != b).count());
        let bd = taps
            .i32(&format!("topk_blocks.{l}"))
            .map_or(0, |c| c.iter().zip(&bl[l]).filter(|(a, b)| a != b).count());
        println!("prefill residual.{l}: rel L2 {e:.2e}; expert ids differing {ed}, block ids differing {bd}");
        if e > REL_L2_TOL {
            failures.push(format!("residual.{l}: rel L2 {e:.3e} > {REL_L2_TOL}"));
        }
    }
    let e = rel_l2(&got, &want);
    println!("prefill logits: rel L2 {e:.2e}");
    if e > REL_L2_TOL {
        failures.push(format!("prefill logits: rel L2 {e:.3e}"));
    }
    let (mut tc, mut tg) = (argmax(&want), argmax(&got));
    if tc != tg {
        failures.push(format!("prefill: greedy token cpu {tc} gpu {tg}"));
    }
    let mut toks = vec![(tc, tg)];
    // MoE layer index of each recorded router call, in call order
    let moe_layers: Vec<usize> = m
        .layers
        .iter()
        .enumerate()
        .filter(|(_, lw)| matches!(lw.ffn, FfnWeights::Moe(_)))
        .map(|(l, _)| l)
        .collect();
    // the first step with a near-tie flip: from there on the GPU's state
    // may drift from the reference's and logits are reported, not judged
    let mut drift_from: Option<usize> = None;
    // both sides are fed the reference's token (teacher forcing on the
    // reference's greedy stream), so a near-tie token flip does not make
    // every later step incomparable
    let mut fed = tc;
    for i in 0..16 {
        let p = (PROMPT + i) as u32;
        let st = StepBatch::contiguous(0, &[fed], p, &table, PAGE, true);
        let mut dtaps = Taps::new(TapRequest {
            index_scores: true,
            ..TapRequest::STANDARD
        });
        cpu.take();
        let want = cpu
            .forward(&m, &mut cache, &st, Path::Standard, &opts, &mut dtaps)
            .expect("cpu decode");
        let router_keys = cpu.take();
        // direct launches, then the captured graph on the same inputs:
        // identical bits (the K/V rewrite of the same slot is idempotent)
        let direct = sp.forward(&st, false).expect("gpu decode (direct)");
        let got = sp.forward(&st, true).expect("gpu decode (graph)");
        let same = direct
            .iter()
            .zip(&got)
            .all(|(a, b)| a.to_bits() == b.to_bits());
        let dev_tok = sp.greedy(1).expect("device argmax")[0];
        // discrete choices of this step vs the reference, each flip judged
        // on the reference's own scores and printed with its gap
        let (ex, bl) = (
            sp.experts_chosen(1).expect("experts"),
            sp.blocks_selected(1).expect("blocks"),
        );
        let mut step_near_tie = false;
        for l in 0..ex.len() {
            if let Some(c) = dtaps.i32(&format!("experts.{l}")) {
                let keys = moe_layers
                    .iter()
                    .position(|&x| x == l)
                    .and_then(|k| router_keys.get(k));
                if let Some(f) = judge_flip(c, &ex[l], keys.map_or(&[], |v| v), ROUTER_MARGIN) {
                    let what = if f.near_tie {
                        "near tie"
                    } else {
                        "NOT a near tie"
                    };
                    println!(
                        "decode step {i}: experts.{l} cpu {c:?} gpu {:?}: cpu-only {:?} gpu-only {:?}, router key gap {:.3e} (margin {:.1e}): {what}",
                        ex[l], f.ref_only, f.gpu_only, f.gap, f.margin
                    );
                    if f.near_tie {
                        step_near_tie = true;
                    } else {
                        failures.push(format!(
                            "decode step {i}: experts.{l} cpu {c:?} gpu {:?}, router key gap {:.3e} >= margin {:.1e}",
                            ex[l], f.gap, f.margin
                        ));
                    }
                }
            }
            let Some(c) = dtaps.i32(&format!("topk_blocks.{l}")) else {
                continue;
            };
            let kb = cfg.index_topk_blocks;
            let scores = dtaps.f32(&format!("index_scores.{l}")).unwrap_or(&[]);
            for g in 0..cfg.num_key_value_heads {
                let (cg, gg) = (
                    c.get(g * kb..(g + 1) * kb).unwrap_or(&[]),
                    bl[l].get(g * kb..(g + 1) * kb).unwrap_or(&[]),
                );
                let hs = head_scores(scores, cfg.index_n_heads, g, cfg.index_selection);
                if let Some(f) = judge_flip(cg, gg, &hs, TOPK_MARGIN) {
                    let what = if f.near_tie {
                        "near tie"
                    } else {
                        "NOT a near tie"
                    };
                    println!(
                        "decode step {i}: blocks layer {l} kv head {g} cpu {cg:?} gpu {gg:?}: cpu-only {:?} gpu-only {:?}, block score gap {:.3e} (margin {:.1e}): {what}",
                        f.ref_only, f.gpu_only, f.gap, f.margin
                    );
                    if f.near_tie {
                        step_near_tie = true;
                    } else {
                        failures.push(format!(
                            "decode step {i}: blocks layer {l} kv head {g} cpu {cg:?} gpu {gg:?}, block score gap {:.3e} >= margin {:.1e}",
                            f.gap, f.margin
                        ));
                    }
                }
            }
        }
        if step_near_tie && drift_from.is_none() {
            drift_from = Some(i);
        }
        let e = rel_l2(&got, &want);
        tc = argmax(&want);
        tg = argmax(&got);
        let mut sorted = want.clone();
        sorted.sort_by(|a, b| b.total_cmp(a));
        println!(
            "decode step {i}: logits rel L2 {e:.2e}, graph == direct {same}, tokens cpu {tc} gpu {tg} (device argmax {dev_tok}), cpu top-2 gap {:.3e}",
            sorted[0] - sorted[1]
        );
        if !same {
            failures.push(format!(
                "step {i}: graph replay differs from direct launches"
            ));
        }
        if e > REL_L2_TOL {
            match drift_from {
                Some(s0) => println!(
                    "decode step {i}: logits rel L2 {e:.3e} > {REL_L2_TOL} not judged: the GPU drifts after the near-tie flip at step {s0}"
                ),
                None => failures.push(format!("decode step {i}: logits rel L2 {e:.3e}")),
            }
        }
        if dev_tok != tg {
            failures.push(format!(
                "step {i}: device argmax {dev_tok} vs host argmax {tg}"
            ));
        }
        if tc != tg {
            // both sides' gap between the two tokens (the reference's is at
            // least its top-2 gap); NaN never passes
            let at = |v: &[f32], t: u32| v.get(t as usize).map_or(f64::NAN, |&x| f64::from(x));
            let gap_cpu = at(&want, tc) - at(&want, tg);
            let gap_gpu = at(&got, tg) - at(&got, tc);
            let tie = gap_cpu < LOGIT_MARGIN && gap_gpu < LOGIT_MARGIN;
            println!(
                "decode step {i}: greedy token cpu {tc} gpu {tg}: cpu gap {gap_cpu:.3e}, gpu gap {gap_gpu:.3e} (margin {LOGIT_MARGIN:.0e}): {}",
                if tie { "near tie" } else { "NOT a near tie" }
            );
            if !tie {
                failures.push(format!(
                    "step {i}: greedy token cpu {tc} gpu {tg}, cpu gap {gap_cpu:.3e}, gpu gap {gap_gpu:.3e} (margin {LOGIT_MARGIN:.0e})"
                ));
            }
        }
        toks.push((tc, tg));
        fed = tc;
    }
    println!("greedy tokens (cpu, gpu): {toks:?}");
    assert!(
        failures.is_empty(),
        "{} failures: {failures:#?}",
        failures.len()
    );
    assert_eq!(sp.graph_count(), 1, "one graph for (1 row, 1 logits row)");
}

/// The comparison above can fail: a planted error in one layer's weights
/// (post-attention norm of the last layer, on the GPU copy only) must push
/// that residual past the tolerance.
#[test]
fn planted_weight_error_is_caught() {
    let Some(gpu) = gpu_or_skip("planted_weight_error_is_caught") else {
        return;
    };
    let (cfg, m) = tiny();
    let mut bad = m.clone();
    let last = bad.layers.len() - 1;
    for w in bad.layers[last].post_attn_norm.iter_mut().step_by(3) {
        *w += 1.0;
    }
    let table: Vec<u32> = (0..PAGES as u32).collect();
    let mut cache = KvCache::new(&m, layout());
    let step = StepBatch::contiguous(0, &prompt(cfg.vocab_size), 0, &table, PAGE, false);
    let mut taps = Taps::new(TapRequest::STANDARD);
    CpuBackend::new()
        .forward(
            &m,
            &mut cache,
            &step,
            Path::Standard,
            &RunOptions::default(),
            &mut taps,
        )
        .expect("cpu prefill");
    let mut sp = path(&gpu, &bad);
    sp.forward(&step, false).expect("gpu prefill");
    let res = sp.residuals(PROMPT).expect("residuals");
    let ok = rel_l2(
        &res[last - 1],
        taps.f32(&format!("residual.{}", last - 1)).expect("tap"),
    );
    let e = rel_l2(
        &res[last],
        taps.f32(&format!("residual.{last}")).expect("tap"),
    );
    println!(
        "planted: residual.{} rel L2 {ok:.2e} (untouched), residual.{last} {e:.2e}",
        last - 1
    );
    assert!(
        ok <= REL_L2_TOL,
        "layers before the planted error still match"
    );
    assert!(e > REL_L2_TOL, "planted error not caught: rel L2 {e:.3e}");
}

/// The standard path's kernel sources compile with NVRTC for sm_90 and
/// define every entry point (runs wherever libnvrtc loads, GPU or not).
#[test]
fn standard_kernels_compile_for_sm90() {
    use m3_gpu::cuda::nvrtc;
    if let Err(e) = nvrtc::available() {
        if common::require_gpu() {
            panic!("REQUIRE_GPU=1 but NVRTC is unavailable: {e}");
        }
        println!("skipped: no NVRTC: {e}");
        return;
    }
    for k in [m3_gpu::standard::STANDARD, m3_gpu::standard::GEN] {
        let bin =
            nvrtc::compile_cubin(k.name, &k.full_source(), "sm_90", &k.nvrtc_options("sm_90"))
                .unwrap_or_else(|e| panic!("{e}"));
        for e in k.entries {
            assert!(
                bin.windows(e.len()).any(|w| w == e.as_bytes()),
                "{}: entry {e} missing from the CUBIN",
                k.name
            );
        }
    }
}

/// The near-tie judgement can fail: same sets are no flip, a swap whose
/// reference gap is under the margin is a near tie, a wide gap (the planted
/// error), a NaN score, an invisible (-inf) block and an unequal count are
/// not. Runs without a GPU.
#[test]
fn near_tie_judgement() {
    let scores = [5.0f32, 1.0, 0.9995, 0.2, f32::NAN, f32::NEG_INFINITY];
    // same ids, other order and padding
    assert_eq!(
        judge_flip(&[0, 1, -1], &[1, 0, -1], &scores, TOPK_MARGIN),
        None
    );
    // 1 vs 2: gap 5e-4 < 2e-2 * max(1, 1.0)
    let f = judge_flip(&[0, 1], &[0, 2], &scores, TOPK_MARGIN).expect("a flip");
    assert!(f.near_tie, "{f:?}");
    assert_eq!(
        (f.ref_only.as_slice(), f.gpu_only.as_slice()),
        (&[1][..], &[2][..])
    );
    // 1 vs 3: gap 0.8, a real ranking difference (the planted error)
    let f = judge_flip(&[0, 1], &[0, 3], &scores, TOPK_MARGIN).expect("a flip");
    assert!(!f.near_tie, "gap 0.8 judged a near tie: {f:?}");
    assert!((f.gap - 0.8).abs() < 1e-6, "{f:?}");
    for bad in [4, 5] {
        let f = judge_flip(&[0, 1], &[0, bad], &scores, TOPK_MARGIN).expect("a flip");
        assert!(!f.near_tie, "non-finite score judged a near tie: {f:?}");
    }
    let f = judge_flip(&[0, 1], &[0, 1, 2], &scores, TOPK_MARGIN).expect("a flip");
    assert!(!f.near_tie, "unequal counts judged a near tie: {f:?}");
    // the margin is relative above 1
    assert!((near_tie_margin(ROUTER_MARGIN, -40.0) - 4e-2).abs() < 1e-12);
    assert!((near_tie_margin(ROUTER_MARGIN, 0.3) - 1e-3).abs() < 1e-12);
}

/// The reference scores the gate judges with are the ones the reference
/// ranked by: on one CPU decode step of `tiny`, the top-k of the recorded
/// router keys is the `experts.{l}` tap of the matching MoE layer, and
/// cpu-ref's block selection over [`head_scores`] is `topk_blocks.{l}`.
/// Runs without a GPU.
#[test]
fn reference_scores_reproduce_reference_choices() {
    let (cfg, m) = tiny();
    let table: Vec<u32> = (0..PAGES as u32).collect();
    let cpu = RouterScores::new();
    let mut cache = KvCache::new(&m, layout());
    let opts = RunOptions::default();
    let pr = prompt(cfg.vocab_size);
    let step = StepBatch::contiguous(0, &pr, 0, &table, PAGE, false);
    cpu.forward(
        &m,
        &mut cache,
        &step,
        Path::Standard,
        &opts,
        &mut Taps::none(),
    )
    .expect("cpu prefill");
    let p = PROMPT as u32;
    let st = StepBatch::contiguous(0, &[pr[0]], p, &table, PAGE, true);
    let mut taps = Taps::new(TapRequest::ALL);
    cpu.take();
    cpu.forward(&m, &mut cache, &st, Path::Standard, &opts, &mut taps)
        .expect("cpu decode");
    let keys = cpu.take();
    let k = cfg.num_experts_per_tok;
    let moe: Vec<usize> = (0..m.layers.len())
        .filter(|&l| matches!(m.layers[l].ffn, FfnWeights::Moe(_)))
        .collect();
    assert_eq!(keys.len(), moe.len(), "one router record per MoE layer");
    let (mut checked_e, mut checked_b) = (0, 0);
    for (j, &l) in moe.iter().enumerate() {
        let mut order: Vec<usize> = (0..keys[j].len()).collect();
        order.sort_by(|&a, &b| keys[j][b].total_cmp(&keys[j][a]));
        let mut top: Vec<i32> = order[..k].iter().map(|&e| e as i32).collect();
        top.sort_unstable();
        let tap = taps.i32(&format!("experts.{l}")).expect("experts tap");
        assert_eq!(top.as_slice(), tap, "layer {l}: router keys vs experts tap");
        checked_e += 1;
    }
    let kb = cfg.index_topk_blocks;
    for l in 0..m.layers.len() {
        let (Some(sel), Some(sc)) = (
            taps.i32(&format!("topk_blocks.{l}")),
            taps.f32(&format!("index_scores.{l}")),
        ) else {
            continue;
        };
        for g in 0..cfg.num_key_value_heads {
            let hs = head_scores(sc, cfg.index_n_heads, g, cfg.index_selection);
            let mut out = vec![-1i32; kb];
            m3_cpu_ref::attn::select_blocks(
                &hs,
                p as usize,
                cfg.index_block_size,
                kb,
                cfg.index_init_blocks,
                cfg.index_local_blocks,
                &mut out,
            );
            assert_eq!(
                out.as_slice(),
                &sel[g * kb..(g + 1) * kb],
                "layer {l} head {g}"
            );
            checked_b += 1;
        }
    }
    println!("checked {checked_e} router layers, {checked_b} (layer, kv head) selections");
    assert!(
        checked_e > 0 && checked_b > 0,
        "tiny has MoE and sparse layers"
    );
}
