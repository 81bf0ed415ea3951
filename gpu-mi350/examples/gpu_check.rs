//! The H200 session script: device facts, kernel compile times (cold and
//! from the disk cache), the in-run bandwidth ceiling (device-to-device copy
//! and a streaming-read kernel) and the linear kernels' achieved GB/s.
//!
//! `gpu_check [out.json]`; prints a table, writes the numbers as JSON.

use std::fmt::Write as _;
use std::time::Instant;

use m3_gpu::kernels;
use m3_gpu::{CudaGpu, LinearKernel, Timing, WeightFormat};

/// SplitMix64 bytes: weights for timing (values do not change the work).
fn random_bytes(n: usize, seed: u64, map: impl Fn(u64) -> u64) -> Vec<u8> {
    let mut s = seed;
    let mut v = Vec::with_capacity(n + 8);
    while v.len() < n {
        s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = s;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        v.extend_from_slice(&map(z ^ (z >> 31)).to_le_bytes());
    }
    v.truncate(n);
    v
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out = std::env::args().nth(1);
    let mut json = String::from("{\n");
    let cold_dir = std::env::temp_dir().join(format!("m3-kernels-cold-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&cold_dir);

    let t0 = Instant::now();
    let mut gpu = CudaGpu::open(0)?;
    let open_ms = t0.elapsed().as_secs_f64() * 1e3;
    gpu.set_disk_cache(Some(cold_dir.clone()));
    let i = gpu.info().clone();
    println!("device: {} (cc {}.{}, {}), {} SMs, peak SM clock {} MHz, peak mem clock {} MHz, bus {} bits, L2 {} MiB, mem {:.1} GiB, NVRTC {}.{}",
        i.name, i.cc.0, i.cc.1, i.arch, i.sm_count, i.sm_clock_khz / 1000, i.mem_clock_khz / 1000, i.bus_width_bits,
        i.l2_bytes >> 20, i.total_mem_bytes as f64 / (1u64 << 30) as f64, i.nvrtc.0, i.nvrtc.1);
    writeln!(json, "  \"device\": \"{}\", \"arch\": \"{}\", \"sms\": {}, \"nvrtc\": \"{}.{}\", \"open_ms\": {open_ms:.1},",
        i.name, i.arch, i.sm_count, i.nvrtc.0, i.nvrtc.1)?;

    // cold compiles (empty cache dir), then a second device handle that loads
    // the same modules from the disk cache
    for k in kernels::ALL {
        gpu.module(k)?;
    }
    let mut gpu2 = CudaGpu::open(0)?;
    gpu2.set_disk_cache(Some(cold_dir.clone()));
    for k in kernels::ALL {
        gpu2.module(k)?;
    }
    json.push_str("  \"modules\": [");
    for (a, b) in gpu.loads().iter().zip(gpu2.loads()) {
        println!(
            "module {:8} cold {:?} {:8.1} ms ({} B cubin), warm {:?} {:6.2} ms",
            a.name, a.from, a.ms, a.cubin_bytes, b.from, b.ms
        );
        write!(
            json,
            "{{\"name\": \"{}\", \"cold_ms\": {:.1}, \"warm_ms\": {:.2}, \"cubin_bytes\": {}}}, ",
            a.name, a.ms, b.ms, a.cubin_bytes
        )?;
    }
    json.push_str("{}],\n");
    drop(gpu2);
    let _ = std::fs::remove_dir_all(&cold_dir);

    // ceiling: D2D copy (read + write counted) and streaming read, 4 GiB
    let bytes = 4usize << 30;
    let copy = m3_gpu::standard::bench::probe_copy(&gpu, bytes / 2, 20)?;
    let read = m3_gpu::standard::bench::probe_read(&gpu, bytes, 20)?;
    let copy_gbps = copy.gbps(bytes);
    let read_gbps = read.gbps(bytes);
    let ceiling = copy_gbps.max(read_gbps);
    println!("ceiling: d2d copy of 2 GiB: {copy_gbps:.0} GB/s (r+w; median {:.3} ms, p10 {:.3}, p90 {:.3}); stream read of 4 GiB: {read_gbps:.0} GB/s (median {:.3} ms, p10 {:.3}, p90 {:.3})",
        copy.median_ms, copy.p10_ms, copy.p90_ms, read.median_ms, read.p10_ms, read.p90_ms);
    writeln!(json, "  \"copy_gbps\": {copy_gbps:.1}, \"read_gbps\": {read_gbps:.1}, \"ceiling_gbps\": {ceiling:.1},")?;

    // linear kernels, K = 6144: N = 49152 (eight stacked 6144 x 6144,
    // larger than L2) and N = 6144 (one square matrix, L2-resident)
    let k = 6144usize;
    json.push_str("  \"linear\": [");
    println!(
        "{:11} {:>3} {:>6} {:>3} {:>10} {:>10} {:>9} {:>7}",
        "format", "ver", "N", "M", "MB", "median us", "GB/s", "% ceil"
    );
    for fmt in [
        WeightFormat::Bf16,
        WeightFormat::Mxfp8E4M3,
        WeightFormat::Mxfp4,
        WeightFormat::Nvfp4,
    ] {
        for n in [49152usize, 6144] {
            let codes = match fmt {
                // finite bf16 weights of magnitude ~2^-8..2^0
                WeightFormat::Bf16 => random_bytes(fmt.code_bytes(n, k), 1, |z| {
                    z & 0x807f_807f_807f_807f | 0x3c00_3c00_3c00_3c00
                }),
                // E4M3 without the NaN codes
                WeightFormat::Mxfp8E4M3 => {
                    random_bytes(fmt.code_bytes(n, k), 2, |z| z & 0xf7f7_f7f7_f7f7_f7f7)
                }
                _ => random_bytes(fmt.code_bytes(n, k), 3, |z| z),
            };
            let scales = match fmt {
                WeightFormat::Nvfp4 => random_bytes(fmt.scale_bytes(n, k), 4, |z| {
                    z & 0x3f3f_3f3f_3f3f_3f3f | 0x2020_2020_2020_2020
                }),
                _ => random_bytes(fmt.scale_bytes(n, k), 5, |z| {
                    z & 0x0707_0707_0707_0707 | 0x7878_7878_7878_7878
                }),
            };
            let w = gpu.upload_linear(fmt, n, k, &codes, &scales, 1.0 / 2688.0)?;
            for m in [1usize, 2, 4, 8, 16] {
                let xs: Vec<u16> = random_bytes(2 * m * k, 6, |z| {
                    z & 0x807f_807f_807f_807f | 0x3f00_3f00_3f00_3f00
                })
                .chunks_exact(2)
                .map(|c| u16::from_le_bytes([c[0], c[1]]))
                .collect();
                let x = gpu.upload(&xs)?;
                let mut outs = Vec::new();
                for kern in [LinearKernel::V1, LinearKernel::V2, LinearKernel::V3] {
                    let mut y = gpu.zeros::<u16>(m * n)?;
                    let t: Timing =
                        gpu.time(20, 200, || gpu.linear_into_with(&w, &x, m, &mut y, kern))?;
                    outs.push(gpu.download(&y)?);
                    let mb = w.bytes() as f64 / 1e6;
                    let gbps = t.gbps(w.bytes());
                    println!(
                        "{:11} {:>3} {:>6} {:>3} {:>10.1} {:>10.1} {:>9.0} {:>6.1}%",
                        format!("{fmt:?}"),
                        format!("{kern:?}"),
                        n,
                        m,
                        mb,
                        t.median_ms * 1e3,
                        gbps,
                        100.0 * gbps / ceiling
                    );
                    write!(json, "{{\"format\": \"{fmt:?}\", \"kernel\": \"{kern:?}\", \"n\": {n}, \"k\": {k}, \"m\": {m}, \"bytes\": {}, \"median_us\": {:.2}, \"p10_us\": {:.2}, \"p90_us\": {:.2}, \"gbps\": {gbps:.1}}}, ",
                        w.bytes(), t.median_ms * 1e3, t.p10_ms * 1e3, t.p90_ms * 1e3)?;
                }
                // the generations may sum in different orders: they agree to a few bf16 ulps
                let far: usize = outs[1..]
                    .iter()
                    .map(|o| {
                        outs[0]
                            .iter()
                            .zip(o)
                            .filter(|(a, b)| {
                                let (a, b) = (
                                    f32::from_bits((**a as u32) << 16),
                                    f32::from_bits((**b as u32) << 16),
                                );
                                !((a - b).abs() <= 2f32.powi(-6) * a.abs().max(b.abs()) + 1e-30
                                    || (a.is_nan() && b.is_nan()))
                            })
                            .count()
                    })
                    .sum();
                if far > 0 {
                    println!("WARNING {fmt:?} n {n} m {m}: {far} outputs differ by more than 2^-6 relative between kernel generations");
                }
            }
        }
    }
    json.push_str("{}]\n}\n");
    if let Some(p) = out {
        let tmp = format!("{p}.tmp");
        std::fs::write(&tmp, &json)?;
        std::fs::rename(&tmp, &p)?;
    }
    Ok(())
}
