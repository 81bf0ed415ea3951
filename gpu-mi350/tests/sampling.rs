//! The keyed sampling kernel (`m3s_sample_keyed`) against
//! `m3_core::sample::sample`: on a few hundred random rows (the vocabulary
//! of the real model for a few, small vocabularies for many; ties, +-0.0,
//! +-inf, NaN, random bit patterns, tiny and huge temperatures, every kind of
//! top_k and top_p) every stochastic row's token must be the CPU's, greedy
//! rows must be left as they were, and the relative weights the kernel
//! reports through `scratch` must equal `m3_core::sample::relative_weight`
//! bit for bit (a one-ulp error in the exp hardly ever moves a token, so the
//! token check alone could not see it). Skips without a GPU (fails under
//! REQUIRE_GPU=1).

mod common;

use common::{gpu_or_skip, Rng};
use cudarc::driver::{LaunchConfig, PushKernelArg};
use m3_core::formats::bf16;
use m3_core::sample::{relative_weight, sample, seed_for_uniform_bits, sort_key, SampleParams};
use m3_gpu::sampling::{check, RowSample, SAMPLE_KEYED, SAMPLE_KEYED_THREADS};
use m3_gpu::CudaGpu;

/// What greedy rows must still hold after the kernel.
const SENTINEL: u32 = 0xDEAD_BEEF;

/// The real model's vocabulary.
const BIG_VOCAB: usize = 200_064;

fn pick<T: Copy>(rng: &mut Rng, xs: &[T]) -> T {
    xs[(rng.next_u64() % xs.len() as u64) as usize]
}

/// A logit of a row of `style`: 0 a coarse grid (ties, +-0.0), 1 grid and
/// normal values with -inf and NaN, 2 everything (+inf and extremes too),
/// 3 random bit patterns, 4 bf16-rounded normal values (like real logits:
/// many exact ties).
fn logit(rng: &mut Rng, style: u32) -> f32 {
    let grid = |rng: &mut Rng| {
        let v = ((rng.next_u64() % 32) as f32 - 16.0) * 0.25;
        if v == 0.0 && rng.next_u64().is_multiple_of(2) {
            -0.0
        } else {
            v
        }
    };
    let p = rng.next_u64() % 100;
    match style {
        0 => grid(rng),
        1 => match p {
            0..=4 => f32::NEG_INFINITY,
            5..=9 => f32::NAN,
            10..=54 => grid(rng),
            _ => rng.normal(10.0),
        },
        2 => match p {
            0 => f32::INFINITY,
            1..=3 => f32::NEG_INFINITY,
            4..=6 => f32::NAN,
            7..=9 => pick(rng, &[3.0e38f32, -3.0e38, 1e-45, -1e-45, f32::MIN_POSITIVE]),
            10..=49 => grid(rng),
            _ => rng.normal(10.0),
        },
        3 => rng.any_f32(),
        _ => bf16::to_f32(bf16::from_f32(rng.normal(3.0))),
    }
}

fn random_params(rng: &mut Rng, vocab: usize) -> SampleParams {
    let temperature = if rng.next_u64().is_multiple_of(4) {
        0.01 + (rng.unit() + 1.0) * 2.5
    } else {
        pick(
            rng,
            &[
                1e-45f32,
                1e-30,
                1e-6,
                0.05,
                0.3,
                0.7,
                1.0,
                1.5,
                10.0,
                1e6,
                1e30,
                3.4e38,
                f32::INFINITY,
                0.0, // greedy
                -1.0,
                f32::NAN,
            ],
        )
    };
    let top_k = match rng.next_u64() % 6 {
        0 | 1 => 0,
        2 => 1,
        3 => 2 + (rng.next_u64() % 48) as usize,
        4 => (rng.next_u64() % (vocab as u64 + 10)) as usize,
        _ => usize::MAX,
    };
    let top_p = if rng.next_u64().is_multiple_of(4) {
        (rng.unit() + 1.0) * 0.5
    } else {
        pick(
            rng,
            &[
                0.0f32,
                -1.0,
                1e-30,
                1e-6,
                0.5,
                0.9,
                0.999_999_94,
                1.0,
                1.0,
                2.0,
                f32::NAN,
            ],
        )
    };
    SampleParams {
        temperature,
        top_k,
        top_p,
        seed: rng.next_u64(),
    }
}

/// The relative weights the kernel must report for one stochastic row:
/// `relative_weight` bits for candidates kept by top_k, 0 elsewhere.
fn expected_rel(row: &[f32], p: &SampleParams) -> Vec<u64> {
    let mut keys: Vec<u64> = row
        .iter()
        .enumerate()
        .filter(|(_, l)| !l.is_nan())
        .map(|(i, &l)| sort_key(l, i as u32))
        .collect();
    keys.sort_unstable_by(|a, b| b.cmp(a));
    let Some(&top) = keys.first() else {
        return vec![0; row.len()];
    };
    let m = row[(0xFFFF_FFFF - top as u32) as usize];
    let lo = if p.top_k > 0 && p.top_k < keys.len() {
        keys[p.top_k - 1]
    } else {
        0
    };
    row.iter()
        .enumerate()
        .map(|(i, &l)| {
            if l.is_nan() || sort_key(l, i as u32) < lo {
                0
            } else {
                relative_weight(l, m, p.temperature).to_bits()
            }
        })
        .collect()
}

/// Run the kernel on `nrows` rows of `vocab`; returns (tokens, scratch) or
/// (tokens, empty) when `with_scratch` is false (a null `scratch`).
fn run(
    gpu: &CudaGpu,
    logits: &[f32],
    rows: &[RowSample],
    vocab: usize,
    with_scratch: bool,
) -> (Vec<u32>, Vec<u64>) {
    let nrows = rows.len();
    check(nrows, vocab).expect("shape within the kernel's limits");
    assert_eq!(logits.len(), nrows * vocab);
    let f = gpu
        .function(&SAMPLE_KEYED, "m3s_sample_keyed")
        .expect("kernel compiles and loads");
    let d_logits = gpu.upload(logits).unwrap();
    let d_rows = gpu.upload(rows).unwrap();
    let mut d_out = gpu.upload(&vec![SENTINEL; nrows]).unwrap();
    let mut d_scratch = gpu.zeros::<u64>(nrows * vocab).unwrap();
    let (v32, n32) = (vocab as u32, nrows as u32);
    let null: u64 = 0;
    let cfg = LaunchConfig {
        grid_dim: (n32, 1, 1),
        block_dim: (SAMPLE_KEYED_THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    let t0 = std::time::Instant::now();
    {
        let mut b = gpu.stream().launch_builder(&f);
        b.arg(&d_logits).arg(&v32).arg(&d_rows).arg(&n32);
        if with_scratch {
            b.arg(&mut d_scratch);
        } else {
            b.arg(&null);
        }
        b.arg(&mut d_out);
        // SAFETY: the arguments match m3s_sample_keyed's parameter list
        // (const float*, u32, const M3RowSample*, u32, u64* or null, u32*),
        // and every buffer holds what the grid of `nrows` blocks reads or
        // writes.
        unsafe { b.launch(cfg) }.expect("launch");
    }
    gpu.sync().expect("kernel ran");
    let ms = t0.elapsed().as_secs_f64() * 1e3;
    println!("m3s_sample_keyed: {nrows} rows of {vocab} in {ms:.3} ms (launch + sync)");
    let out = gpu.download(&d_out).unwrap();
    let rel = if with_scratch {
        gpu.download(&d_scratch).unwrap()
    } else {
        Vec::new()
    };
    (out, rel)
}

/// One launch's inputs: `vocab`, the rows' logits, params and key positions.
struct Launch {
    vocab: usize,
    logits: Vec<f32>,
    params: Vec<SampleParams>,
    positions: Vec<u32>,
}

/// Random rows: the real vocabulary for a few, small vocabularies for many.
fn random_launches(rng: &mut Rng) -> Vec<Launch> {
    let shapes = [
        (BIG_VOCAB, 8usize),
        (3000, 120),
        (257, 150),
        (17, 100),
        (2, 30),
        (1, 20),
    ];
    let mut launches = Vec::new();
    for &(vocab, nrows) in &shapes {
        let mut l = Launch {
            vocab,
            logits: Vec::with_capacity(nrows * vocab),
            params: Vec::with_capacity(nrows),
            positions: Vec::with_capacity(nrows),
        };
        for r in 0..nrows {
            // Big rows look like real logits, with a few edge-case rows.
            let style = if vocab == BIG_VOCAB {
                [4, 4, 4, 4, 1, 2, 0, 3][r % 8]
            } else {
                (rng.next_u64() % 5) as u32
            };
            l.logits.extend((0..vocab).map(|_| logit(rng, style)));
            l.params.push(random_params(rng, vocab));
            l.positions.push(rng.next_u64() as u32);
        }
        if vocab == BIG_VOCAB {
            // A few big rows with params that surely sample.
            for (r, (t, k, tp)) in [(1.0f32, 0usize, 1.0f32), (0.7, 50, 0.9), (1.3, 0, 0.95)]
                .into_iter()
                .enumerate()
            {
                l.params[r] = SampleParams {
                    temperature: t,
                    top_k: k,
                    top_p: tp,
                    seed: l.params[r].seed,
                };
            }
        }
        launches.push(l);
    }
    launches
}

/// Hand-made rows of 8 logits for edges that random rows seldom hit, each
/// drawn with 16 keys: the -0.0 / +0.0 tie, a top_p boundary met exactly,
/// all -inf, +inf, no candidate, one candidate, infinite and subnormal
/// temperatures, top_p 0 and below, top_k above the candidate count; and
/// draws placed exactly on the boundary between two tokens.
fn edge_launch() -> Launch {
    let (ni, inf, nan) = (f32::NEG_INFINITY, f32::INFINITY, f32::NAN);
    let p = |temperature, top_k, top_p| SampleParams {
        temperature,
        top_k,
        top_p,
        seed: 0,
    };
    let rows: [([f32; 8], SampleParams); 13] = [
        // Ties of -0.0 and +0.0 go by id: top_k 1 keeps id 1, top_k 2 ids 1, 2.
        ([-1.0, -0.0, 0.0, -0.0, ni, nan, -2.0, 0.0], p(1.0, 1, 1.0)),
        ([-1.0, 0.0, -0.0, -0.0, ni, nan, -2.0, 0.0], p(1.0, 2, 1.0)),
        ([-0.0, 0.0, -0.0, 0.0, -0.0, 0.0, -0.0, 0.0], p(0.5, 0, 0.6)),
        // Two tied maxima, top_p 0.5: the target is met by the first alone.
        ([ni, 3.0, ni, 3.0, ni, ni, ni, ni], p(0.8, 0, 0.5)),
        // All -inf: all eight weigh 2^40.
        ([ni; 8], p(1.0, 0, 1.0)),
        // +inf twice: only those two can be drawn.
        ([1.0, inf, 2.0, nan, inf, ni, 0.0, 3.0], p(2.0, 0, 1.0)),
        // No candidate: token 0.
        ([nan; 8], p(1.0, 0, 1.0)),
        // One candidate.
        ([nan, nan, nan, nan, nan, 5.0, nan, nan], p(0.5, 3, 0.2)),
        // Infinite temperature: every finite logit weighs 2^40.
        ([1.0, -30.0, 2.0, 1e30, -1e30, 0.0, 7.0, ni], p(inf, 0, 1.0)),
        // Subnormal temperature: only the maxima weigh.
        (
            [1.0, 0.999_999_94, 1.0, 0.5, 0.0, ni, nan, -0.0],
            p(1e-45, 0, 1.0),
        ),
        // top_p 0 and below: the first candidate.
        ([0.1, 0.2, 0.3, 0.3, 0.2, 0.1, 0.0, -0.1], p(1.0, 0, 0.0)),
        ([0.1, 0.2, 0.3, 0.3, 0.2, 0.1, 0.0, -0.1], p(1.0, 0, -1.0)),
        // top_k above the candidate count, top_p just below 1.
        (
            [0.1, nan, 0.3, nan, 0.2, nan, 0.0, nan],
            p(1.0, 7, 0.999_999_94),
        ),
    ];
    let mut l = Launch {
        vocab: 8,
        logits: Vec::new(),
        params: Vec::new(),
        positions: Vec::new(),
    };
    for (row, params) in rows {
        for key in 0..16u32 {
            l.logits.extend(row);
            l.params.push(SampleParams {
                seed: 1000 + key as u64,
                ..params
            });
            l.positions.push(key * 7919);
        }
    }
    // Draws exactly on a boundary and one below it: eight -inf logits weigh
    // 2^40 each, W' = 2^43, r = U >> 10, so U = c * 2^50 must give token c
    // (the first whose cumulative weight is > r) and U - 1 token c - 1.
    for c in 1..8u64 {
        for u in [c << 50, (c << 50) - 1] {
            let position = 11 * c as u32;
            l.logits.extend([ni; 8]);
            l.params.push(SampleParams {
                temperature: 1.0,
                top_k: 0,
                top_p: 1.0,
                seed: seed_for_uniform_bits(u, position),
            });
            l.positions.push(position);
        }
    }
    l
}

#[test]
fn keyed_sampling_matches_the_cpu() {
    let Some(gpu) = gpu_or_skip("keyed_sampling_matches_the_cpu") else {
        return;
    };
    let mut rng = Rng(0x5A4D_504C_4531);
    let mut launches = random_launches(&mut rng);
    launches.push(edge_launch());
    let (mut stochastic, mut greedy, mut mismatches) = (0usize, 0usize, Vec::new());
    for (s, l) in launches.iter().enumerate() {
        let vocab = l.vocab;
        let rows: Vec<RowSample> = l
            .params
            .iter()
            .zip(&l.positions)
            .map(|(p, &pos)| RowSample::new(p, pos))
            .collect();
        let (out, rel) = run(&gpu, &l.logits, &rows, vocab, true);
        let (out_null, _) = run(&gpu, &l.logits, &rows, vocab, false);
        assert_eq!(out, out_null, "launch {s}: a null scratch changes tokens");
        for (r, p) in l.params.iter().enumerate() {
            let row = &l.logits[r * vocab..(r + 1) * vocab];
            if p.is_greedy() {
                greedy += 1;
                assert_eq!(out[r], SENTINEL, "launch {s} row {r}: greedy row written");
                continue;
            }
            stochastic += 1;
            let want = sample(row, p, l.positions[r]);
            if out[r] != want {
                mismatches.push(format!(
                    "vocab {vocab} row {r}: gpu {} cpu {want}, {p:?} position {}",
                    out[r], l.positions[r]
                ));
            }
            let rel_row = &rel[r * vocab..(r + 1) * vocab];
            let exp = expected_rel(row, p);
            if let Some(i) = (0..vocab).find(|&i| rel_row[i] != exp[i]) {
                mismatches.push(format!(
                    "vocab {vocab} row {r}: relative weight of {i} (logit {:e}) is {:e} on the \
                     GPU, {:e} on the CPU, {p:?}",
                    row[i],
                    f64::from_bits(rel_row[i]),
                    f64::from_bits(exp[i]),
                ));
            }
        }
    }
    println!("{stochastic} stochastic rows, {greedy} greedy rows checked");
    assert!(stochastic > 400 && greedy > 30);
    assert!(
        mismatches.is_empty(),
        "{} mismatches:\n{}",
        mismatches.len(),
        mismatches.join("\n")
    );
}
