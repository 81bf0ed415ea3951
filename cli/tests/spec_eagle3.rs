//! EAGLE3 speculative decoding on the CPU reference backend
//! (ARCHITECTURE.md "EAGLE3 draft"):
//!
//! - the loader reads a synthetic `tiny` checkpoint's `eagle3/` and names
//!   the tensor at fault (wrong shape, `d2t` out of range);
//! - the draft forward of a small hand-built draft equals a straightforward
//!   computation written here with plain loops (and that comparison catches
//!   a planted error);
//! - speculative greedy output with the EAGLE3 drafter (K = 1, 3, 7) is
//!   identical to plain decoding, with acceptance statistics reported.

use std::path::Path;

mod common;

use m3_core::backend::{TapRequest, Taps};
use m3_core::checkpoint::eagle3_loader::load_eagle3;
use m3_core::checkpoint::{Checkpoint, LoadOptions};
use m3_core::config::ModelConfig;
use m3_core::eagle3::{Eagle3Config, Eagle3Weights};
use m3_core::sample::SampleParams;
use m3_core::sched::dspark_drafter::DraftTarget;
use m3_core::sched::eagle3_drafter::Eagle3Drafter;
use m3_core::sched::runner::{Drafter, VerifyMode};
use m3_core::sched::{Request, RequestId};
use m3_core::synth::{write_checkpoint, DenseFormat, ExpertFormat, SynthSpec};
use m3_core::weights::{LinearWeight, ModelWeights};
use m3_cpu_ref::CpuBackend;

/// A synthetic tiny checkpoint with an EAGLE3 draft (and no DSpark one).
fn checkpoint(dir: &Path) -> (ModelWeights, Eagle3Weights) {
    let cfg = ModelConfig::preset("tiny").unwrap();
    let mut spec = SynthSpec::new(cfg.clone(), ExpertFormat::Mxfp4, DenseFormat::Mxfp8);
    spec.draft = None;
    spec.eagle3 = Some(Eagle3Config::for_target(&cfg));
    spec.seed = 5;
    write_checkpoint(&spec, dir).unwrap();
    let m = Checkpoint::open(dir)
        .unwrap()
        .load(&LoadOptions::default())
        .unwrap();
    let w = load_eagle3(dir, &m.config)
        .unwrap()
        .expect("eagle3/ present");
    (m, w)
}

/// Overwrite element `i` of the I64 tensor `name` in the lone shard of
/// `eagle3/` (parsing the safetensors header here).
fn poke_i64(dir: &Path, name: &str, i: usize, value: i64) {
    let ed = dir.join("eagle3");
    let shard = std::fs::read_dir(&ed)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .unwrap();
    let mut bytes = std::fs::read(&shard).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    assert_eq!(header[name]["dtype"], "I64");
    let start = header[name]["data_offsets"][0].as_u64().unwrap() as usize + 8 + n + 8 * i;
    bytes[start..start + 8].copy_from_slice(&value.to_le_bytes());
    std::fs::write(&shard, bytes).unwrap();
}

#[test]
fn loader_reads_eagle3_and_names_bad_tensors() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ck");
    let (m, w) = checkpoint(&dir);
    let c = w.config.clone();
    let h = m.config.hidden_size;
    assert_eq!((w.fc.rows(), w.fc.cols()), (h, 3 * h));
    assert_eq!(
        (w.q.rows(), w.q.cols()),
        (c.num_attention_heads * c.head_dim(), 2 * h)
    );
    assert_eq!(w.lm_head.rows(), c.draft_vocab_size);
    assert_eq!(w.draft_to_target.len(), c.draft_vocab_size);
    // The synthetic map: draft id d is target id 2d + (d & 1).
    assert_eq!(&w.draft_to_target[..4], &[0, 3, 4, 7]);

    // A config that no longer fits the tensors: the error names the tensor.
    let mut bad = c.clone();
    bad.intermediate_size += 32;
    std::fs::write(dir.join("eagle3/config.json"), bad.to_json()).unwrap();
    let e = load_eagle3(&dir, &m.config).unwrap_err().to_string();
    assert!(
        e.contains("eagle3/midlayer.mlp.gate_proj.weight") && e.contains("shape"),
        "{e}"
    );
    // A draft that does not fit the target: the error names the field.
    let mut bad = c.clone();
    bad.target_layer_ids = vec![0, 1, 9];
    std::fs::write(dir.join("eagle3/config.json"), bad.to_json()).unwrap();
    let e = load_eagle3(&dir, &m.config).unwrap_err().to_string();
    assert!(
        e.contains("eagle3/config.json") && e.contains("target_layer_ids"),
        "{e}"
    );
    std::fs::write(dir.join("eagle3/config.json"), c.to_json()).unwrap();
    load_eagle3(&dir, &m.config).unwrap();
    // d2t mapping a draft id past the target vocabulary.
    poke_i64(&dir, "d2t", 5, 10_000);
    let e = load_eagle3(&dir, &m.config).unwrap_err().to_string();
    assert!(e.contains("eagle3/d2t") && e.contains("draft id 5"), "{e}");
    // d2t mapping two draft ids to one target id.
    poke_i64(&dir, "d2t", 5, -2);
    let e = load_eagle3(&dir, &m.config).unwrap_err().to_string();
    assert!(e.contains("eagle3/d2t") && e.contains("already"), "{e}");
    // No draft at all: None.
    std::fs::remove_dir_all(dir.join("eagle3")).unwrap();
    assert!(load_eagle3(&dir, &m.config).unwrap().is_none());
}

// ---------------------------------------------------------------------
// The draft forward against a plain-loop computation of the definition.

const H: usize = 8;
const NH: usize = 2;
const NKV: usize = 1;
const D: usize = 4;
const I: usize = 8;
const VOCAB: usize = 16;
const DV: usize = 6;
const THETA: f64 = 10000.0;
const EPS: f32 = 1e-6;
/// Target id of each draft id.
const MAP: [u32; DV] = [1, 3, 4, 8, 11, 15];

/// Round-to-nearest-even to bf16, written here (not the crate's).
fn bf(x: f32) -> f32 {
    let b = x.to_bits();
    let r = b.wrapping_add(0x7fff + ((b >> 16) & 1)) & 0xffff_0000;
    f32::from_bits(r)
}

/// A deterministic bf16-exact value in about [-scale, scale].
fn val(seed: usize, i: usize, scale: f32) -> f32 {
    let k = (seed * 7919 + i * 104_729 + 13) % 33;
    bf((k as f32 - 16.0) / 16.0 * scale)
}

/// Raw (file-form) weights of the hand-built draft, row-major `[out][in]`.
struct Raw {
    fc: Vec<f32>,
    ln_in: Vec<f32>,
    ln_hid: Vec<f32>,
    ln_post: Vec<f32>,
    ln_final: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    o: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    down: Vec<f32>,
    lm: Vec<f32>,
    embed: Vec<f32>,
}

fn raw() -> Raw {
    let m = |seed, n, s| (0..n).map(|i| val(seed, i, s)).collect::<Vec<f32>>();
    let norm = |seed| {
        (0..H)
            .map(|i| 1.0 + val(seed, i, 0.25))
            .collect::<Vec<f32>>()
    };
    Raw {
        fc: m(1, H * 3 * H, 0.5),
        ln_in: norm(2),
        ln_hid: norm(3),
        ln_post: norm(4),
        ln_final: norm(5),
        q: m(6, NH * D * 2 * H, 0.6),
        k: m(7, NKV * D * 2 * H, 0.6),
        v: m(8, NKV * D * 2 * H, 0.6),
        o: m(9, H * NH * D, 0.5),
        gate: m(10, I * H, 0.6),
        up: m(11, I * H, 0.6),
        down: m(12, H * I, 0.4),
        lm: m(13, DV * H, 1.0),
        embed: m(14, VOCAB * H, 1.0),
    }
}

fn lw(rows: usize, cols: usize, data: &[f32]) -> LinearWeight {
    LinearWeight::F32 {
        rows,
        cols,
        data: data.to_vec(),
    }
}

fn weights(r: &Raw) -> Eagle3Weights {
    let config = Eagle3Config {
        hidden_size: H,
        num_attention_heads: NH,
        num_key_value_heads: NKV,
        head_dim: Some(D),
        intermediate_size: I,
        vocab_size: VOCAB,
        draft_vocab_size: DV,
        target_hidden_size: None,
        rope_theta: THETA,
        rms_norm_eps: EPS,
        target_layer_ids: vec![0, 1, 2],
        max_draft_tokens: 7,
    };
    let d2t: Vec<i64> = MAP
        .iter()
        .enumerate()
        .map(|(d, &t)| t as i64 - d as i64)
        .collect();
    let gemma = |w: &[f32]| w.iter().map(|x| x - 1.0).collect::<Vec<f32>>();
    Eagle3Weights {
        fc: lw(H, 3 * H, &r.fc),
        input_norm: gemma(&r.ln_in),
        hidden_norm: gemma(&r.ln_hid),
        post_attn_norm: gemma(&r.ln_post),
        final_norm: gemma(&r.ln_final),
        q: lw(NH * D, 2 * H, &r.q),
        k: lw(NKV * D, 2 * H, &r.k),
        v: lw(NKV * D, 2 * H, &r.v),
        o: lw(H, NH * D, &r.o),
        gate: lw(I, H, &r.gate),
        up: lw(I, H, &r.up),
        down: lw(H, I, &r.down),
        lm_head: lw(DV, H, &r.lm),
        draft_to_target: config.draft_to_target(&d2t).unwrap(),
        config,
    }
}

/// `y = bf16(x) W^T` (f32 sums), optionally rounded.
fn lin(x: &[f32], w: &[f32], out: usize, round: bool) -> Vec<f32> {
    let n = x.len();
    (0..out)
        .map(|o| {
            let mut s = 0.0f32;
            for i in 0..n {
                s += bf(x[i]) * w[o * n + i];
            }
            if round {
                bf(s)
            } else {
                s
            }
        })
        .collect()
}

/// Llama RMSNorm: `x / sqrt(mean(x^2) + eps) * w`.
fn rms(x: &[f32], w: &[f32]) -> Vec<f32> {
    let ms = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
    let r = 1.0 / (ms + EPS).sqrt();
    x.iter().zip(w).map(|(v, w)| v * r * w).collect()
}

/// NeoX RoPE over whole heads of width D, then bf16.
fn rope(x: &mut [f32], pos: u32) {
    for head in x.chunks_mut(D) {
        for i in 0..D / 2 {
            let f = THETA.powf(-2.0 * i as f64 / D as f64);
            let a = (pos as f64 * f) as f32;
            let (c, s) = (a.cos(), a.sin());
            let (x0, x1) = (head[i], head[i + D / 2]);
            head[i] = x0 * c - x1 * s;
            head[i + D / 2] = x1 * c + x0 * s;
        }
    }
    for v in x.iter_mut() {
        *v = bf(*v);
    }
}

/// Which planted error the reference makes (`None`: none).
#[derive(Clone, Copy, PartialEq)]
enum Plant {
    None,
    /// The residual of the midlayer is the embedding instead of `h`.
    ResidualFromEmbedding,
}

/// The reference forward of a proposal: committed context rows for
/// positions `0 .. p` from `g` and `ctx`, then steps from position `p` with
/// the given tokens (`toks[0]` the last committed token, then the proposed
/// ones). Returns each step's draft-vocabulary logits.
fn reference(r: &Raw, g: &[Vec<f32>], ctx: &[u32], toks: &[u32], plant: Plant) -> Vec<Vec<f32>> {
    let p = g.len() - 1;
    let row_in = |tok: u32, h: &[f32]| -> Vec<f32> {
        let e = &r.embed[tok as usize * H..(tok as usize + 1) * H];
        let mut a: Vec<f32> = rms(e, &r.ln_in).into_iter().map(bf).collect();
        a.extend(rms(h, &r.ln_hid).into_iter().map(bf));
        a
    };
    let mut keys: Vec<Vec<f32>> = Vec::new();
    let mut vals: Vec<Vec<f32>> = Vec::new();
    for j in 0..p {
        let a = row_in(ctx[j + 1], &g[j]);
        let mut k = lin(&a, &r.k, NKV * D, true);
        rope(&mut k, j as u32);
        keys.push(k);
        vals.push(lin(&a, &r.v, NKV * D, true));
    }
    let mut h = g[p].clone();
    let mut out_logits = Vec::new();
    for (i, &tok) in toks.iter().enumerate() {
        let pos = (p + i) as u32;
        let a = row_in(tok, &h);
        let mut q = lin(&a, &r.q, NH * D, true);
        rope(&mut q, pos);
        let mut k = lin(&a, &r.k, NKV * D, true);
        rope(&mut k, pos);
        keys.push(k);
        vals.push(lin(&a, &r.v, NKV * D, true));
        let mut o = vec![0.0f32; NH * D];
        for hq in 0..NH {
            let g = hq / (NH / NKV);
            let qh = &q[hq * D..(hq + 1) * D];
            let s: Vec<f32> = keys
                .iter()
                .map(|k| (0..D).map(|t| qh[t] * k[g * D + t]).sum::<f32>() / (D as f32).sqrt())
                .collect();
            let mx = s.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
            let e: Vec<f32> = s.iter().map(|x| (x - mx).exp()).collect();
            let z: f32 = e.iter().sum();
            for t in 0..D {
                let acc: f32 = e.iter().zip(&vals).map(|(p, v)| p * v[g * D + t]).sum();
                o[hq * D + t] = bf(acc / z);
            }
        }
        let ao = lin(&o, &r.o, H, true);
        let base: Vec<f32> = if plant == Plant::ResidualFromEmbedding {
            r.embed[tok as usize * H..(tok as usize + 1) * H].to_vec()
        } else {
            h.clone()
        };
        let mut res: Vec<f32> = base.iter().zip(&ao).map(|(a, b)| a + b).collect();
        let m: Vec<f32> = rms(&res, &r.ln_post).into_iter().map(bf).collect();
        let gt = lin(&m, &r.gate, I, true);
        let up = lin(&m, &r.up, I, true);
        let act: Vec<f32> = gt
            .iter()
            .zip(&up)
            .map(|(&g, &u)| bf(g / (1.0 + (-g).exp()) * u))
            .collect();
        let y = lin(&act, &r.down, H, true);
        for (a, b) in res.iter_mut().zip(&y) {
            *a += b;
        }
        let fin: Vec<f32> = rms(&res, &r.ln_final).into_iter().map(bf).collect();
        out_logits.push(lin(&fin, &r.lm, DV, false));
        h = res;
    }
    out_logits
}

fn softmax(l: &[f32]) -> Vec<f32> {
    let mx = l.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
    let e: Vec<f64> = l.iter().map(|x| f64::from(x - mx).exp()).collect();
    let z: f64 = e.iter().sum();
    e.iter().map(|x| (x / z) as f32).collect()
}

/// Largest difference between the drafter's target-id distributions and
/// the reference's (scattered through `MAP`).
fn max_diff(got: &[f32], want: &[Vec<f32>]) -> f32 {
    let mut worst = 0.0f32;
    for (i, l) in want.iter().enumerate() {
        let mut row = [0.0f32; VOCAB];
        for (d, p) in softmax(l).into_iter().enumerate() {
            row[MAP[d] as usize] = p;
        }
        for t in 0..VOCAB {
            worst = worst.max((got[i * VOCAB + t] - row[t]).abs());
        }
    }
    worst
}

#[test]
fn draft_forward_matches_a_plain_loop_computation() {
    let r = raw();
    let w = weights(&r);
    let mut target = ModelConfig::preset("tiny").unwrap();
    target.hidden_size = H;
    target.vocab_size = VOCAB;
    let embed = lw(VOCAB, H, &r.embed);
    let dt = DraftTarget {
        config: &target,
        embed: &embed,
        lm_head: &embed,
    };
    let be = CpuBackend::new();
    // Target residuals of positions 0..=3 for taps 0, 1, 2.
    let res = |l: usize| -> Vec<f32> { (0..4 * H).map(|i| val(20 + l, i, 2.0)).collect() };
    let mut taps = Taps::new(TapRequest::default());
    for l in 0..3 {
        taps.put_f32(format!("residual.{l}"), vec![4, H], res(l));
    }
    // g_j computed here: bf16(fc . concat(res0[j], res1[j], res2[j])).
    let g: Vec<Vec<f32>> = (0..4)
        .map(|j| {
            let mut f = Vec::new();
            for l in 0..3 {
                f.extend_from_slice(&res(l)[j * H..(j + 1) * H]);
            }
            lin(&f, &r.fc, H, true)
        })
        .collect();
    let ctx = [2u32, 9, 4, 13, 7];
    let id: RequestId = 1;
    let sampled = SampleParams {
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
        seed: 3,
    };
    for (params, k) in [(SampleParams::default(), 4usize), (sampled, 3)] {
        let mut d = Eagle3Drafter::new(&be, dt, &w).unwrap();
        // Two steps' worth of observations, as the runner would make them.
        d.observe(id, &[0, 1, 2], &[0, 1, 2], &taps);
        d.observe(id, &[3], &[3], &taps);
        let prop = d.try_propose(id, &ctx, k, &params).unwrap();
        assert_eq!(prop.tokens.len(), k);
        // Committed rows: positions 0..=2 from the backlog, and step 0's row 3.
        assert_eq!(d.context_rows(id), 4);
        let mut toks = vec![ctx[4]];
        toks.extend_from_slice(&prop.tokens[..k - 1]);
        let want = reference(&r, &g, &ctx, &toks, Plant::None);
        let probs = prop.probs.as_ref().unwrap();
        let diff = max_diff(probs, &want);
        eprintln!("draft vs reference: max |p diff| {diff:.2e}");
        if params.temperature == 0.0 {
            // Greedy: the argmax of the reference logits, mapped to target ids.
            for (i, l) in want.iter().enumerate() {
                let best = (0..DV).fold(0, |b, j| if l[j] > l[b] { j } else { b });
                assert_eq!(prop.tokens[i], MAP[best], "step {i}: {l:?}");
                assert_eq!(probs[i * VOCAB + MAP[best] as usize], 1.0);
            }
        } else {
            assert!(diff < 2e-3, "draft vs reference: {diff}");
            // Zero outside the draft vocabulary; each row sums to 1.
            for i in 0..k {
                let row = &probs[i * VOCAB..(i + 1) * VOCAB];
                assert!((0..VOCAB as u32)
                    .filter(|t| !MAP.contains(t))
                    .all(|t| row[t as usize] == 0.0));
                assert!((row.iter().sum::<f32>() - 1.0).abs() < 1e-5);
            }
            // The same comparison catches a planted error.
            let bad = reference(&r, &g, &ctx, &toks, Plant::ResidualFromEmbedding);
            let bdiff = max_diff(probs, &bad);
            assert!(bdiff > 2e-2, "the planted error was not caught: {bdiff}");
        }
        // A second proposal after one more committed token reuses the
        // committed rows (row 3 is not recomputed) and drops the draft rows.
        let ctx2 = [2u32, 9, 4, 13, 7, prop.tokens[0]];
        let mut taps2 = Taps::new(TapRequest::default());
        for l in 0..3 {
            taps2.put_f32(format!("residual.{l}"), vec![1, H], res(l)[..H].to_vec());
        }
        d.observe(id, &[4], &[0], &taps2);
        let p2 = d.try_propose(id, &ctx2, 2, &params).unwrap();
        assert_eq!(p2.tokens.len(), 2);
        assert_eq!(d.context_rows(id), 5);
        let mut g2 = g.clone();
        g2.push(g[0].clone()); // position 4 observed with position 0's residuals
        let want2 = reference(&r, &g2, &ctx2, &[ctx2[5], p2.tokens[0]], Plant::None);
        let d2 = max_diff(p2.probs.as_ref().unwrap(), &want2);
        if params.temperature != 0.0 {
            assert!(d2 < 2e-3, "second proposal vs reference: {d2}");
        }
        d.forget(id);
        assert_eq!(d.context_rows(id), 0);
    }
}

// ---------------------------------------------------------------------
// End to end through the scheduler runner.

#[test]
fn eagle3_speculative_greedy_equals_plain_decoding() {
    let tmp = tempfile::tempdir().unwrap();
    let (m, w) = checkpoint(&tmp.path().join("ck"));
    let mut reqs: Vec<Request> = [(1u32, 9usize, 20usize), (2, 30, 14), (3, 4, 24)]
        .iter()
        .enumerate()
        .map(|(i, &(s, n, max))| Request::greedy(i as u64, common::spec_prompt(s, n), max))
        .collect();
    // A stochastic request too: greedy verification reproduces plain
    // decoding token for token whatever the sampler.
    reqs[2].sampling = SampleParams {
        temperature: 0.8,
        top_k: 0,
        top_p: 0.95,
        seed: 9,
    };
    let (plain, _, _) = common::run_spec(&m, &reqs, 0, VerifyMode::Greedy, None);
    let be = CpuBackend::new();
    for k in [1usize, 3, 7] {
        let d = Eagle3Drafter::new(&be, DraftTarget::of(&m), &w).unwrap();
        common::check_greedy_spec(&m, &reqs, &plain, k, Box::new(d), "eagle3");
    }
    // Rejection verification of the stochastic request runs on the
    // draft's target-id distributions (lossless in distribution, so its
    // tokens may differ); greedy requests still verify greedily.
    let d = Eagle3Drafter::new(&be, DraftTarget::of(&m), &w).unwrap();
    let (out, c, _) = common::run_spec(&m, &reqs, 3, VerifyMode::Rejection, Some(Box::new(d)));
    assert_eq!(out[&0], plain[&0]);
    assert_eq!(out[&1], plain[&1]);
    assert_eq!(out[&2].len(), plain[&2].len());
    assert!(c.spec_verifies > 0);
}
