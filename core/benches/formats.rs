//! Throughput of the format codecs on a 1024 x 4096 f32 tensor (16 MiB),
//! counted in bytes of f32 (the unquantized side) for both directions, so
//! quantize and dequantize numbers compare directly.
//!
//! Run: `cargo bench -p m3-core --bench formats -- --warm-up-time 1 --measurement-time 2`

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use m3_core::formats::{MxElem, MxTensor, Nvfp4Tensor, ScaleRule};

const ROWS: usize = 1024;
const COLS: usize = 4096;

/// Deterministic values with per-block magnitudes spread over binades, like
/// trained weights (no NaN: those blocks short-circuit).
fn values() -> Vec<f32> {
    let mut s = 0x9E37_79B9_7F4A_7C15u64;
    (0..ROWS * COLS)
        .map(|i| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let u = (s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0;
            let k = ((i / 32) % 9) as i32 - 4;
            u * f32::from_bits(((127 + k) as u32) << 23) * 0.05
        })
        .collect()
}

fn mx_cases() -> Vec<(&'static str, MxElem, ScaleRule)> {
    vec![
        ("mxfp4-floor", MxElem::Fp4E2M1, ScaleRule::Floor),
        ("mxfp4-even", MxElem::Fp4E2M1, ScaleRule::Even),
        ("mxfp4-rceil", MxElem::Fp4E2M1, ScaleRule::Rceil),
        ("mxfp8-e4m3", MxElem::Fp8E4M3, ScaleRule::Floor),
        ("mxfp8-e5m2", MxElem::Fp8E5M2, ScaleRule::Floor),
    ]
}

fn bench(c: &mut Criterion) {
    let x = values();
    let bytes = (x.len() * 4) as u64;

    let mut q = c.benchmark_group("quantize");
    q.throughput(Throughput::Bytes(bytes)).sample_size(10);
    for (name, elem, rule) in mx_cases() {
        q.bench_function(BenchmarkId::from_parameter(name), |b| {
            b.iter(|| MxTensor::quantize(black_box(&x), ROWS, COLS, elem, rule).unwrap())
        });
    }
    q.bench_function(BenchmarkId::from_parameter("nvfp4"), |b| {
        b.iter(|| Nvfp4Tensor::quantize(black_box(&x), ROWS, COLS).unwrap())
    });
    q.finish();

    let mut d = c.benchmark_group("dequantize");
    d.throughput(Throughput::Bytes(bytes)).sample_size(10);
    for (name, elem, rule) in mx_cases() {
        let t = MxTensor::quantize(&x, ROWS, COLS, elem, rule).unwrap();
        d.bench_function(BenchmarkId::from_parameter(name), |b| {
            b.iter(|| black_box(&t).dequantize())
        });
    }
    let t = Nvfp4Tensor::quantize(&x, ROWS, COLS).unwrap();
    d.bench_function(BenchmarkId::from_parameter("nvfp4"), |b| {
        b.iter(|| black_box(&t).dequantize())
    });
    d.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
