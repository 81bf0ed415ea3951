//! Linear (per weight format), RMSNorm and RoPE kernels vs CPU computations
//! in f64. Tolerances are stated at each check. Skips without a GPU (fails
//! under REQUIRE_GPU=1).

mod common;

use common::{gpu_or_skip, Rng};
use m3_core::formats::{bf16, MxElem, MxTensor, Nvfp4Tensor, ScaleRule};
use m3_gpu::{CudaGpu, DeviceLinear, LinearKernel};

fn bf16_bits(rng: &mut Rng, n: usize, s: f32) -> Vec<u16> {
    (0..n).map(|_| bf16::from_f32(rng.normal(s))).collect()
}
fn widen(v: &[u16]) -> Vec<f32> {
    v.iter().map(|&h| bf16::to_f32(h)).collect()
}

/// Check y (bf16 bits, [m, n]) against the exact f64 product of x [m, k]
/// and the dequantized W [n, k]. Tolerance per element: one bf16 rounding
/// (2^-8 |ref|) plus f32 accumulation in another order (2^-17 sum |x w|).
/// Returns the worst error in units of the tolerance (must be <= 1).
fn check_linear(what: &str, y: &[u16], x: &[f32], w: &[f32], m: usize, n: usize, k: usize) -> f64 {
    let mut worst = 0f64;
    for i in 0..m {
        for j in 0..n {
            let (mut r, mut a) = (0f64, 0f64);
            for t in 0..k {
                let p = x[i * k + t] as f64 * w[j * k + t] as f64;
                r += p;
                a += p.abs();
            }
            let got = bf16::to_f32(y[i * n + j]) as f64;
            let tol = r.abs() * 2f64.powi(-8) + a * 2f64.powi(-17) + 1e-30;
            let ratio = (got - r).abs() / tol;
            assert!(
                ratio <= 1.0,
                "{what}: y[{i},{j}] = {got:e}, reference {r:e}, |err| {:e} > tol {tol:e}",
                (got - r).abs()
            );
            worst = worst.max(ratio);
        }
    }
    worst
}

/// The weights of one case: the device copy and the exact f32 values.
fn weights(
    gpu: &CudaGpu,
    fmt: &str,
    n: usize,
    k: usize,
    rng: &mut Rng,
) -> (DeviceLinear, Vec<f32>) {
    let w: Vec<f32> = (0..n * k).map(|_| rng.normal(0.05)).collect();
    match fmt {
        "bf16" => {
            let b: Vec<u16> = w.iter().map(|&v| bf16::from_f32(v)).collect();
            (gpu.upload_linear_bf16(n, k, &b).unwrap(), widen(&b))
        }
        "mxfp8_e4m3" | "mxfp8_e5m2" | "mxfp4" => {
            let elem = match fmt {
                "mxfp4" => MxElem::Fp4E2M1,
                "mxfp8_e4m3" => MxElem::Fp8E4M3,
                _ => MxElem::Fp8E5M2,
            };
            let t = MxTensor::quantize(&w, n, k, elem, ScaleRule::Floor).unwrap();
            (gpu.upload_linear_mx(&t).unwrap(), t.dequantize())
        }
        _ => {
            let t = Nvfp4Tensor::quantize(&w, n, k).unwrap();
            (gpu.upload_linear_nvfp4(&t).unwrap(), t.dequantize())
        }
    }
}

const FORMATS: [&str; 5] = ["bf16", "mxfp8_e4m3", "mxfp8_e5m2", "mxfp4", "nvfp4"];

#[test]
fn linear_matches_cpu_for_every_format() {
    let Some(gpu) = gpu_or_skip("linear_matches_cpu_for_every_format") else {
        return;
    };
    let mut rng = Rng(0x11);
    // n not a multiple of the 8 rows per block; k both below and above one
    // pass of the warp; m 1..11 (11 takes two launches)
    for (n, k) in [(77, 256), (40, 2048), (5, 6144)] {
        for fmt in FORMATS {
            let (dw, wf) = weights(&gpu, fmt, n, k, &mut rng);
            for m in [1, 3, 8, 11] {
                let x = bf16_bits(&mut rng, m * k, 1.0);
                for kern in [
                    LinearKernel::V1,
                    LinearKernel::V2,
                    LinearKernel::V3,
                    LinearKernel::Auto,
                ] {
                    let y = gpu.linear_with(&dw, &x, m, kern).unwrap();
                    let worst = check_linear(
                        &format!("{fmt} {kern:?} n{n} k{k} m{m}"),
                        &y,
                        &widen(&x),
                        &wf,
                        m,
                        n,
                        k,
                    );
                    println!("{fmt:11} {kern:?} n {n:3} k {k:4} m {m:2}: worst error {worst:.3} of tolerance");
                }
            }
        }
    }
}

#[test]
fn linear_check_catches_a_planted_error() {
    let Some(gpu) = gpu_or_skip("linear_check_catches_a_planted_error") else {
        return;
    };
    let mut rng = Rng(0x12);
    let (n, k, m) = (16, 256, 2);
    let (dw, mut wf) = weights(&gpu, "mxfp4", n, k, &mut rng);
    let x = bf16_bits(&mut rng, m * k, 1.0);
    let y = gpu.linear(&dw, &x, m).unwrap();
    check_linear("unplanted", &y, &widen(&x), &wf, m, n, k);
    // one weight of the reference off by a small amount (as a wrong scale or
    // a wrong nibble would be) must be caught
    wf[3 * k + 5] += 0.5;
    let xs = widen(&x);
    assert!(std::panic::catch_unwind(|| check_linear("planted", &y, &xs, &wf, m, n, k)).is_err());
}

fn rmsnorm_ref(x: &[f32], w: &[f32], eps: f32, n: usize) -> Vec<f64> {
    x.chunks(n)
        .flat_map(|r| {
            let ms = r.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / n as f64;
            let d = (ms + eps as f64).sqrt();
            r.iter()
                .zip(w)
                .map(move |(&v, &wi)| v as f64 / d * (1.0 + wi as f64))
                .collect::<Vec<_>>()
        })
        .collect()
}

#[test]
fn rmsnorm_matches_cpu() {
    let Some(gpu) = gpu_or_skip("rmsnorm_matches_cpu") else {
        return;
    };
    let mut rng = Rng(0x21);
    for (rows, n) in [(5, 6144), (9, 128), (3, 1000)] {
        let x: Vec<f32> = (0..rows * n).map(|_| rng.normal(3.0)).collect();
        let w: Vec<f32> = (0..n).map(|_| rng.normal(0.1)).collect();
        let (y, yb) = gpu.rmsnorm(&x, &w, 1e-6, rows, n).unwrap();
        let r = rmsnorm_ref(&x, &w, 1e-6, n);
        for i in 0..rows * n {
            // f32 math over n terms: relative 1e-5 of the value scale
            let tol = 1e-5 * (r[i].abs() + 1e-3);
            assert!(
                (y[i] as f64 - r[i]).abs() <= tol,
                "rmsnorm [{rows}x{n}] y[{i}] = {} ref {}",
                y[i],
                r[i]
            );
            assert_eq!(
                yb[i],
                bf16::from_f32(y[i]),
                "bf16 output is the RNE of the f32 output at {i}"
            );
        }
    }
}

/// Reference RoPE in f64 (angle, sin, cos all f64).
fn rope_ref(x: &[f32], pos: &[u32], theta: f64, heads: usize, d: usize, rd: usize) -> Vec<f64> {
    let mut out: Vec<f64> = x.iter().map(|&v| v as f64).collect();
    let half = rd / 2;
    for (t, &p) in pos.iter().enumerate() {
        for h in 0..heads {
            let o = (t * heads + h) * d;
            for i in 0..half {
                let a = p as f64 * theta.powf(-2.0 * i as f64 / rd as f64);
                let (s, c) = a.sin_cos();
                let (x0, x1) = (x[o + i] as f64, x[o + i + half] as f64);
                out[o + i] = x0 * c - x1 * s;
                out[o + i + half] = x1 * c + x0 * s;
            }
        }
    }
    out
}

#[test]
fn rope_matches_cpu_up_to_position_2_pow_20() {
    let Some(gpu) = gpu_or_skip("rope_matches_cpu_up_to_position_2_pow_20") else {
        return;
    };
    let mut rng = Rng(0x31);
    let (heads, d, rd, theta) = (3, 128, 64, 5e6);
    let pos = [0u32, 1, 2, 127, 4095, 65_537, (1 << 20) - 1];
    let x: Vec<f32> = (0..pos.len() * heads * d)
        .map(|_| rng.normal(1.0))
        .collect();
    let y = gpu.rope(&x, &pos, theta, heads, d, rd).unwrap();
    let r = rope_ref(&x, &pos, theta, heads, d, rd);
    for i in 0..x.len() {
        let got = bf16::to_f32(y[i]) as f64;
        // bf16 rounding (2^-8 relative) + f32 sin/cos of the reduced angle
        let tol = r[i].abs() * 2f64.powi(-8) + 2e-6 * 4.0;
        assert!(
            (got - r[i]).abs() <= tol,
            "rope element {i} (pos {}): {got} vs {}",
            pos[i / (heads * d)],
            r[i]
        );
    }
    // dims >= rotary_dim pass through exactly (as bf16)
    for t in 0..pos.len() * heads {
        for i in rd..d {
            assert_eq!(y[t * d + i], bf16::from_f32(x[t * d + i]));
        }
    }
}
