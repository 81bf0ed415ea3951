//! Criterion: the reference's linear layer per weight format (PERF.md,
//! CPU), `[1024, 1024]` weights, 1 row (decode) and 32 rows (prefill).
//! Throughput is in weight elements per second, so formats compare directly.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use m3_core::backend::LinearInput;
use m3_cpu_ref::linear::linear;
use m3_cpu_ref::synthetic::{self, WeightFormat};

fn bench(c: &mut Criterion) {
    let (n, k) = (1024, 1024);
    let mut g = c.benchmark_group("cpu_ref_linear");
    g.sample_size(10);
    for fmt in [
        WeightFormat::Bf16,
        WeightFormat::Mxfp8,
        WeightFormat::Mxfp4,
        WeightFormat::Nvfp4,
    ] {
        let w = synthetic::linear(1, "w", n, k, 0.05, fmt).expect("weight");
        for rows in [1usize, 32] {
            let x = synthetic::uniform(2, "x", rows * k, 1.0);
            let mut y = vec![0.0f32; rows * n];
            g.throughput(Throughput::Elements((n * k * rows) as u64));
            g.bench_with_input(
                BenchmarkId::new(format!("{fmt:?}"), rows),
                &rows,
                |b, &rows| {
                    b.iter(|| {
                        linear(&x, rows, &w, LinearInput::Bf16, true, &mut y).expect("linear")
                    })
                },
            );
        }
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
