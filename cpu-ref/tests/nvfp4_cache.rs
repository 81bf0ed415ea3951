//! The NVFP4 KV / index cache (ARCHITECTURE.md, *NVFP4 KV cache*) against
//! the op-level golden case `golden/cases/ops/nvfp4-cache.safetensors`,
//! written by the independent numpy reference (`golden/gen/reference.py
//! op-nvfp4-cache`, E4M3 through ml_dtypes): the CPU backend's cache write
//! must give the same packed E2M1 codes and E4M3 block scales, and its
//! reads the same f32 values, bit for bit. Planted errors in the codec
//! (truncated block scales, swapped nibbles, the global scale dividing,
//! a zero scale clamped up, NaN treated as zero, the global ignored) must
//! be caught by the same comparison. Then the cache in the model: its byte
//! accounting, prefill == decode, thread-count independence, and a
//! measurable but bounded distance from the bf16 cache.

mod common;

use common::*;
use std::sync::Arc;

use m3_core::backend::{
    forward_by_ops, ActMode, Backend, KvBudget, LoadSpec, ModelSource, Op, Path, RunOptions,
    StepBatch, TapRequest, Taps,
};
use m3_core::formats::{e2m1, fp8::e4m3};
use m3_core::kv::{CacheData, CacheDtype, CacheTensor};
use m3_cpu_ref::synthetic::{Formats, WeightFormat};
use m3_cpu_ref::CpuBackend;

const BF: RunOptions = RunOptions {
    act: ActMode::Bf16,
    tensor_parallel: 1,
};

struct Case {
    x: Vec<f32>,
    g: Vec<f32>,
    codes: Vec<u8>,
    scales: Vec<u8>,
    y: Vec<f32>,
    rows: usize,
    width: usize,
}

fn load() -> Case {
    let f = OpCase::open("nvfp4-cache.safetensors");
    let (xs, _) = f.raw("x");
    Case {
        x: f.f32s("x"),
        g: f.f32s("g"),
        codes: f.raw("codes").1,
        scales: f.raw("scales").1,
        y: f.f32s("y"),
        rows: xs[0],
        width: xs[1],
    }
}

/// Index of the first value whose bits differ (NaN equal to NaN).
fn first_diff(a: &[f32], b: &[f32]) -> Option<usize> {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .position(|(x, y)| !(x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan())))
}

/// One codec's output for every row of the case: packed codes, scale
/// bytes, reads.
struct Out {
    codes: Vec<u8>,
    scales: Vec<u8>,
    y: Vec<f32>,
}

/// Where `o` departs from the case, or `None` when it matches bit for bit.
fn compare(c: &Case, o: &Out) -> Option<String> {
    if let Some(i) = o.codes.iter().zip(&c.codes).position(|(a, b)| a != b) {
        return Some(format!(
            "codes byte {i}: {:#04x} vs {:#04x}",
            o.codes[i], c.codes[i]
        ));
    }
    if let Some(i) = o.scales.iter().zip(&c.scales).position(|(a, b)| a != b) {
        return Some(format!(
            "scale byte {i}: {:#04x} vs {:#04x}",
            o.scales[i], c.scales[i]
        ));
    }
    first_diff(&o.y, &c.y).map(|i| format!("read {i}: {} vs {}", o.y[i], c.y[i]))
}

/// Each case row written through the CPU backend's `CacheWrite` into slot
/// 1 of a 3-slot nvfp4 tensor with the row's global, then read back.
fn through_the_backend(c: &Case) -> Out {
    let w = c.width;
    let mut out = Out {
        codes: Vec::new(),
        scales: Vec::new(),
        y: Vec::new(),
    };
    for r in 0..c.rows {
        let mut t = CacheTensor::new(CacheDtype::Nvfp4, 3, w, c.g[r]).unwrap();
        CpuBackend::new()
            .run_op(Op::CacheWrite {
                cache: &mut t,
                slots: &[1],
                x: &c.x[r * w..(r + 1) * w],
            })
            .unwrap();
        let CacheData::Nvfp4 { codes, scales } = &t.data else {
            panic!("not an nvfp4 tensor")
        };
        out.codes.extend_from_slice(&codes[w / 2..w]);
        out.scales.extend_from_slice(&scales[w / 16..2 * (w / 16)]);
        let mut y = vec![0f32; w];
        t.read(1, 0, &mut y);
        out.y.extend_from_slice(&y);
    }
    out
}

/// Knobs of a planted codec: each turns one rule of the definition into a
/// plausible wrong one.
#[derive(Clone, Copy, Default)]
struct Plant {
    truncate_scale: bool,
    swap_nibbles: bool,
    divide_by_global: bool,
    clamp_zero_scale: bool,
    nan_as_zero: bool,
    ignore_global: bool,
}

/// A second, deliberately literal codec with planted errors (all off: the
/// definition itself, which must match the case too).
fn planted(c: &Case, p: Plant) -> Out {
    let w = c.width;
    let mut out = Out {
        codes: Vec::new(),
        scales: Vec::new(),
        y: Vec::new(),
    };
    for r in 0..c.rows {
        let g = if p.ignore_global { 1.0 } else { c.g[r] as f64 };
        for blk in c.x[r * w..(r + 1) * w].chunks_exact(16) {
            let bad = blk.iter().any(|v| !v.is_finite());
            let mut codes = [0u8; 16];
            let s = if bad && !p.nan_as_zero {
                e4m3::NAN
            } else {
                let amax = blk
                    .iter()
                    .filter(|v| v.is_finite())
                    .fold(0.0f64, |m, &v| m.max((v as f64).abs()));
                let q = amax / (6.0 * g);
                let mut s = e4m3::encode_sat(q);
                if p.truncate_scale && (e4m3::decode(s) as f64) > q {
                    s -= 1;
                }
                if p.clamp_zero_scale && s == 0 {
                    s = 1;
                }
                let sv = e4m3::decode(s) as f64;
                if sv > 0.0 {
                    for (k, &v) in codes.iter_mut().zip(blk) {
                        let v = if v.is_finite() { v as f64 } else { 0.0 };
                        *k = e2m1::encode_sat(v / (g * sv));
                    }
                }
                s
            };
            out.scales.push(s);
            for pair in codes.chunks_exact(2) {
                out.codes.push(if p.swap_nibbles {
                    pair[1] | (pair[0] << 4)
                } else {
                    pair[0] | (pair[1] << 4)
                });
            }
            let sg = e4m3::decode(s) as f64;
            for &k in &codes {
                let v = e2m1::decode(k) as f64 * sg;
                out.y
                    .push(if p.divide_by_global { v / g } else { v * g } as f32);
            }
        }
    }
    out
}

#[test]
fn cache_write_and_read_match_the_reference_bit_for_bit() {
    let c = load();
    assert_eq!(compare(&c, &through_the_backend(&c)), None);
    // the case holds what it claims: a zero and an underflowing block
    // (scale byte 0), a saturated scale (0x7E), NaN blocks (0x7F), globals
    // other than 1
    for s in [0x00, 0x7E, 0x7F] {
        assert!(c.scales.contains(&s), "no scale byte {s:#04x}");
    }
    assert!(c.g.iter().any(|&g| g != 1.0 && g.log2().fract() != 0.0));
}

#[test]
fn head_slices_read_like_the_whole_row() {
    let c = load();
    let w = c.width;
    let mut t = CacheTensor::new(CacheDtype::Nvfp4, 1, w, c.g[5]).unwrap();
    t.write(0, &c.x[5 * w..6 * w]).unwrap();
    for (off, n) in [(0, 16), (16, 32), (8, 24), (63, 1)] {
        let mut y = vec![0f32; n];
        t.read(0, off, &mut y);
        assert_eq!(
            first_diff(&y, &c.y[5 * w + off..5 * w + off + n]),
            None,
            "{off}+{n}"
        );
    }
}

#[test]
fn planted_codec_errors_are_caught() {
    let c = load();
    // control: the literal codec without plants matches the case, so the
    // comparison can pass
    assert_eq!(compare(&c, &planted(&c, Plant::default())), None);
    let plants = [
        (
            "block scale truncated instead of RNE",
            Plant {
                truncate_scale: true,
                ..Plant::default()
            },
        ),
        (
            "nibbles swapped (high = even element)",
            Plant {
                swap_nibbles: true,
                ..Plant::default()
            },
        ),
        (
            "global scale divides at decode",
            Plant {
                divide_by_global: true,
                ..Plant::default()
            },
        ),
        (
            "zero block scale clamped to 2^-9",
            Plant {
                clamp_zero_scale: true,
                ..Plant::default()
            },
        ),
        (
            "NaN read as zero",
            Plant {
                nan_as_zero: true,
                ..Plant::default()
            },
        ),
        (
            "global scale ignored",
            Plant {
                ignore_global: true,
                ..Plant::default()
            },
        ),
    ];
    for (what, p) in plants {
        assert!(compare(&c, &planted(&c, p)).is_some(), "not caught: {what}");
    }
}

#[test]
fn nvfp4_cache_takes_9_16_of_a_byte_per_value() {
    // tiny: 4 sparse layers; K and V rows of 2 heads x 32, index-K rows of
    // 32. nvfp4: (2 x (32 + 4) + (16 + 2)) x 4 = 360 bytes a position;
    // bf16: (2 x 128 + 64) x 4 = 1280; fp8: 640.
    let m = model(&tiny(), Formats::default());
    let per = |d| cache(&m, d).bytes_per_position();
    assert_eq!(per(CacheDtype::Nvfp4), 360);
    assert_eq!(per(CacheDtype::Bf16), 1280);
    assert_eq!(per(CacheDtype::Fp8E4M3), 640);
}

fn mx_model() -> m3_core::weights::ModelWeights {
    model(
        &tiny(),
        Formats {
            experts: WeightFormat::Mxfp4,
            dense: WeightFormat::Mxfp8,
        },
    )
}

#[test]
fn prefill_equals_decode_and_threads_do_not_matter() {
    let m = mx_model();
    let toks = tokens(90, 3);
    let a = pool(1).install(|| prefill(&m, &toks, CacheDtype::Nvfp4, BF, TapRequest::STANDARD));
    let b = pool(3).install(|| prefill(&m, &toks, CacheDtype::Nvfp4, BF, TapRequest::STANDARD));
    assert!(
        taps_bit_equal(&a, &b).is_ok(),
        "thread count changed the bits"
    );
    // the last row again, as a decode step after a prefill of the rest:
    // each row is quantized on its own, so the cache holds the same bytes
    let mut c = cache(&m, CacheDtype::Nvfp4);
    let bt = block_table(toks.len());
    let n = toks.len();
    let run = |c: &mut m3_core::kv::KvCache, toks: &[u32], pos: u32| {
        let step = StepBatch::contiguous(1, toks, pos, &bt, PAGE, true);
        let mut taps = Taps::new(TapRequest::STANDARD);
        forward_by_ops(&CpuBackend, &m, c, &step, Path::Standard, &BF, &mut taps).unwrap();
        taps
    };
    run(&mut c, &toks[..n - 1], 0);
    let last = run(&mut c, &toks[n - 1..], (n - 1) as u32);
    let v = m.config.vocab_size;
    let full = a.f32("logits").unwrap();
    assert_eq!(
        first_diff(last.f32("logits").unwrap(), &full[(n - 1) * v..]),
        None
    );
}

#[test]
fn nvfp4_cache_moves_logits_more_than_fp8_and_stays_bounded() {
    let m = mx_model();
    let toks = tokens(90, 4);
    let base = prefill(&m, &toks, CacheDtype::Bf16, BF, TapRequest::STANDARD);
    let l = base.f32("logits").unwrap();
    let e = |d| {
        rel_l2(
            prefill(&m, &toks, d, BF, TapRequest::STANDARD)
                .f32("logits")
                .unwrap(),
            l,
        )
    };
    let (f8, f4) = (e(CacheDtype::Fp8E4M3), e(CacheDtype::Nvfp4));
    // 3 mantissa bits against 1 (+ a block scale): FP4 must cost more
    assert!(f8 > 0.0 && f4 > f8, "fp8 {f8}, nvfp4 {f4}");
    assert!(f4 < 0.5, "nvfp4 rel L2 {f4}");
}

#[test]
fn a_head_dim_that_is_not_whole_blocks_is_refused_at_load() {
    // head_dim 24: K / V rows of 48 values are whole blocks, but a head
    // would split one, so the nvfp4 cache is refused (bf16 is not)
    let mut cfg = tiny();
    cfg.head_dim = 24;
    let m = Arc::new(model(&cfg, Formats::default()));
    let spec = |cache_dtype| LoadSpec {
        cache_dtype,
        block_size: PAGE,
        kv: KvBudget::Blocks(4),
        max_rows: 64,
        max_seqs: 2,
        max_context: 64,
        act: ActMode::Bf16,
        selection: None,
    };
    let load = |d| CpuBackend.load(ModelSource::Weights(m.clone()), &spec(d), &mut |_| {});
    assert!(load(CacheDtype::Bf16).is_ok());
    let e = load(CacheDtype::Nvfp4).err().expect("refused").to_string();
    assert!(
        e.contains("--kv-cache-dtype nvfp4") && e.contains("head_dim") && e.contains("24"),
        "{e}"
    );
}
