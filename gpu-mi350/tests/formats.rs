//! Format kernels vs `m3_core::formats`, bit for bit, on random and edge
//! inputs. Skips without a GPU (fails under REQUIRE_GPU=1).

mod common;

use common::{first_f32_mismatch, gpu_or_skip, Rng};
use m3_core::formats::{bf16, convert, e2m1, e8m0, fp8, MxElem, MxTensor, Nvfp4Tensor, ScaleRule};

const ELEMS: [MxElem; 3] = [MxElem::Fp4E2M1, MxElem::Fp8E4M3, MxElem::Fp8E5M2];
const RULES: [ScaleRule; 3] = [ScaleRule::Floor, ScaleRule::Even, ScaleRule::Rceil];

/// First differing index of two byte/word buffers, with both values.
fn first_mismatch<T: PartialEq + Copy>(a: &[T], b: &[T]) -> Option<(usize, T, T)> {
    if a.len() != b.len() {
        panic!("length {} vs {}", a.len(), b.len());
    }
    a.iter()
        .zip(b)
        .enumerate()
        .find(|(_, (x, y))| x != y)
        .map(|(i, (x, y))| (i, *x, *y))
}

fn assert_same<T: PartialEq + Copy + std::fmt::Debug>(what: &str, gpu: &[T], cpu: &[T]) {
    if let Some((i, g, c)) = first_mismatch(gpu, cpu) {
        let n = gpu.iter().zip(cpu).filter(|(x, y)| x != y).count();
        panic!("{what}: {n} mismatches; first at {i}: gpu {g:?} cpu {c:?}");
    }
}

fn assert_same_f32(what: &str, gpu: &[f32], cpu: &[f32]) {
    if let Some(i) = first_f32_mismatch(gpu, cpu) {
        panic!(
            "{what}: first mismatch at {i}: gpu {:e} ({:#010x}) cpu {:e} ({:#010x})",
            gpu[i],
            gpu[i].to_bits(),
            cpu[i],
            cpu[i].to_bits()
        );
    }
}

/// Values that sit on every rounding boundary of the three element types:
/// each representable value, the midpoints between neighbours (ties), and
/// one f64 ulp either side, with both signs; plus zeros, Inf, NaN, huge,
/// subnormal-f64 and the FORMATS.md tie table.
fn edge_values() -> Vec<f64> {
    let mut mags: Vec<f64> = Vec::new();
    for elem in ELEMS {
        let n = if elem == MxElem::Fp4E2M1 { 8u32 } else { 128 };
        let mut vals: Vec<f64> = (0..n)
            .map(|c| elem.decode(c as u8) as f64)
            .filter(|v| v.is_finite())
            .collect();
        vals.sort_by(|a, b| a.total_cmp(b));
        let max = *vals.last().unwrap();
        vals.push(max * 2.0);
        for w in vals.windows(2) {
            let mid = (w[0] + w[1]) / 2.0;
            for v in [w[0], mid, w[1]] {
                mags.push(v);
                mags.push(f64::from_bits(v.to_bits() + 1));
                if v > 0.0 {
                    mags.push(f64::from_bits(v.to_bits() - 1));
                }
            }
        }
    }
    mags.extend([
        0.25,
        0.75,
        1.25,
        1.75,
        2.5,
        3.5,
        5.0,
        464.0,
        480.0,
        57344.0,
        61440.0,
        1e300,
        f64::MAX,
        5e-324,
        1e-30,
    ]);
    mags.extend([f64::INFINITY, f64::NAN]);
    let mut out: Vec<f64> = mags.iter().flat_map(|&m| [m, -m]).collect();
    out.push(-0.0);
    out
}

#[test]
fn element_decoders_match_core() {
    let Some(gpu) = gpu_or_skip("element_decoders_match_core") else {
        return;
    };
    let all: Vec<u8> = (0..=255u8).collect();
    let g = gpu.decode_elem(MxElem::Fp4E2M1, &all).unwrap();
    let c: Vec<f32> = all.iter().map(|&b| e2m1::decode(b)).collect();
    assert_same_f32("E2M1 decode", &g, &c);
    let g = gpu.decode_elem(MxElem::Fp8E4M3, &all).unwrap();
    let c: Vec<f32> = all.iter().map(|&b| fp8::e4m3::decode(b)).collect();
    assert_same_f32("E4M3 decode", &g, &c);
    let g = gpu.decode_elem(MxElem::Fp8E5M2, &all).unwrap();
    let c: Vec<f32> = all.iter().map(|&b| fp8::e5m2::decode(b)).collect();
    assert_same_f32("E5M2 decode", &g, &c);
    let g = gpu.decode_e8m0(&all).unwrap();
    let c: Vec<f32> = all.iter().map(|&b| e8m0::decode(b)).collect();
    assert_same_f32("E8M0 decode", &g, &c);
    // E8M0 0x00 is 2^-127, not 0 (FORMATS.md)
    assert_eq!(g[0], 2f32.powi(-127));
}

#[test]
fn element_encoders_match_core() {
    let Some(gpu) = gpu_or_skip("element_encoders_match_core") else {
        return;
    };
    let mut rng = Rng(0xe1e);
    let mut xs = edge_values();
    for _ in 0..20_000 {
        let s = 2f64.powi((rng.next_u64() % 60) as i32 - 30);
        xs.push(rng.unit() as f64 * s);
    }
    for elem in ELEMS {
        let g = gpu.encode_elem(elem, &xs).unwrap();
        let c: Vec<u8> = xs.iter().map(|&x| elem.encode_sat(x)).collect();
        // NaN inputs: any NaN code of the type (FORMATS.md fixes none)
        let g: Vec<u8> = g
            .iter()
            .zip(&xs)
            .map(|(&v, x)| {
                if x.is_nan() && elem != MxElem::Fp4E2M1 {
                    0xff
                } else {
                    v
                }
            })
            .collect();
        let c: Vec<u8> = c
            .iter()
            .zip(&xs)
            .map(|(&v, x)| {
                if x.is_nan() && elem != MxElem::Fp4E2M1 {
                    0xff
                } else {
                    v
                }
            })
            .collect();
        assert_same(&format!("{elem:?} encode_sat"), &g, &c);
    }
}

#[test]
fn bf16_rounding_matches_core() {
    let Some(gpu) = gpu_or_skip("bf16_rounding_matches_core") else {
        return;
    };
    let mut rng = Rng(0xbf16);
    let mut xs: Vec<f32> = (0..50_000).map(|_| rng.any_f32()).collect();
    // ties at every exponent: low half exactly 0x8000 with even and odd kept bit
    for e in 0..255u32 {
        for low in [0x7fffu32, 0x8000, 0x8001, 0x18000, 0x0] {
            xs.push(f32::from_bits((e << 23) | low));
            xs.push(f32::from_bits(0x8000_0000 | (e << 23) | low));
        }
    }
    xs.extend([
        f32::MAX,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        -0.0,
        f32::from_bits(1),
    ]);
    let g = gpu.bf16_round(&xs).unwrap();
    let c: Vec<u16> = xs.iter().map(|&x| bf16::from_f32(x)).collect();
    let norm = |v: &[u16]| {
        v.iter()
            .map(|&h| if (h & 0x7fff) > 0x7f80 { 0x7fc0 } else { h })
            .collect::<Vec<_>>()
    };
    assert_same("bf16 RNE", &norm(&g), &norm(&c));
}

/// Test tensors for the block quantizers: blocks at many magnitudes (from
/// f32 subnormals to near f32::MAX), zero blocks, NaN / Inf blocks, blocks
/// whose amax sits on a scale boundary.
fn block_tensor(rows: usize, cols: usize, seed: u64, block: usize) -> Vec<f32> {
    let mut rng = Rng(seed);
    let mut x = vec![0f32; rows * cols];
    for (bi, b) in x.chunks_mut(block).enumerate() {
        let kind = rng.next_u64() % 16;
        let e = (rng.next_u64() % 270) as i32 - 145;
        let s = 2f64.powi(e);
        for v in b.iter_mut() {
            *v = (rng.unit() as f64 * s) as f32;
        }
        match kind {
            0 => b.iter_mut().for_each(|v| *v = 0.0),
            1 => b[bi % block] = f32::NAN,
            2 => {
                b[(bi * 7) % block] = if bi % 2 == 0 {
                    f32::INFINITY
                } else {
                    f32::NEG_INFINITY
                }
            }
            3 => b[0] = (1.75 * 2f64.powi(127)) as f32, // the `even` carry to 2^128
            4 => b[1] = -6.0 * 2f32.powi(e.clamp(-120, 120)), // exact max-magnitude element
            5 => b[2] = f32::MAX,
            6 => b
                .iter_mut()
                .for_each(|v| *v = f32::from_bits(rng.next_u64() as u32 & 0x007f_ffff)),
            _ => {}
        }
    }
    x
}

#[test]
fn mx_quantize_matches_core_for_every_elem_and_rule() {
    let Some(gpu) = gpu_or_skip("mx_quantize_matches_core_for_every_elem_and_rule") else {
        return;
    };
    let (rows, cols) = (37, 32 * 24);
    for (i, elem) in ELEMS.into_iter().enumerate() {
        for (j, rule) in RULES.into_iter().enumerate() {
            let x = block_tensor(rows, cols, 100 + (i * 3 + j) as u64, 32);
            let g = gpu.mx_quantize(&x, rows, cols, elem, rule).unwrap();
            let c = MxTensor::quantize(&x, rows, cols, elem, rule).unwrap();
            assert_same(&format!("{elem:?}/{rule:?} scales"), &g.scales, c.scales());
            assert_same(&format!("{elem:?}/{rule:?} codes"), &g.codes, c.codes());
        }
    }
}

#[test]
fn mx_dequantize_matches_core() {
    let Some(gpu) = gpu_or_skip("mx_dequantize_matches_core") else {
        return;
    };
    let (rows, cols) = (19, 32 * 16);
    let mut rng = Rng(7);
    for elem in ELEMS {
        let codes: Vec<u8> = (0..elem.packed_len(rows * cols))
            .map(|_| rng.next_u64() as u8)
            .collect();
        let mut scales: Vec<u8> = (0..rows * cols / 32)
            .map(|_| rng.next_u64() as u8)
            .collect();
        scales[..4].copy_from_slice(&[0x00, 0xff, 0xfe, 0x7f]);
        let g = gpu
            .mx_dequantize(elem, &codes, &scales, rows, cols)
            .unwrap();
        let c = MxTensor::from_parts(elem, rows, cols, codes, scales)
            .unwrap()
            .dequantize();
        assert_same_f32(&format!("{elem:?} dequantize"), &g, &c);
    }
}

#[test]
fn nvfp4_quantize_and_dequantize_match_core() {
    let Some(gpu) = gpu_or_skip("nvfp4_quantize_and_dequantize_match_core") else {
        return;
    };
    let (rows, cols) = (23, 16 * 40);
    for (seed, scale) in [(1u64, 1.0f32), (2, 1e-30), (3, 3e37), (4, 0.0)] {
        let mut x = block_tensor(rows, cols, seed, 16);
        // keep a finite amax well inside range for most tensors; the seed-3
        // tensor keeps its huge values
        if seed != 3 {
            x.iter_mut()
                .filter(|v| v.is_finite())
                .for_each(|v| *v = (*v as f64 * 1e-30).clamp(-1e3, 1e3) as f32 * scale + 0.0);
        }
        let g = gpu.nvfp4_quantize(&x, rows, cols).unwrap();
        let c = Nvfp4Tensor::quantize(&x, rows, cols).unwrap();
        assert_eq!(
            g.global.to_bits(),
            c.global().to_bits(),
            "seed {seed}: global scale gpu {} cpu {}",
            g.global,
            c.global()
        );
        assert_same(&format!("seed {seed} NVFP4 scales"), &g.scales, c.scales());
        assert_same(&format!("seed {seed} NVFP4 codes"), &g.codes, c.codes());
        let gd = gpu
            .nvfp4_dequantize(c.codes(), c.scales(), c.global(), rows, cols)
            .unwrap();
        assert_same_f32(
            &format!("seed {seed} NVFP4 dequantize"),
            &gd,
            &c.dequantize(),
        );
    }
    // random stored bytes (any scale code, NaN scales included) decode alike
    let mut rng = Rng(99);
    let codes: Vec<u8> = (0..rows * cols / 2).map(|_| rng.next_u64() as u8).collect();
    let scales: Vec<u8> = (0..rows * cols / 16)
        .map(|_| rng.next_u64() as u8)
        .collect();
    let t = Nvfp4Tensor::from_parts(rows, cols, codes, scales, 3.0e-3).unwrap();
    let gd = gpu
        .nvfp4_dequantize(t.codes(), t.scales(), t.global(), rows, cols)
        .unwrap();
    assert_same_f32("random NVFP4 dequantize", &gd, &t.dequantize());
}

#[test]
fn nvfp4_to_mxfp4_matches_core_for_every_rule() {
    let Some(gpu) = gpu_or_skip("nvfp4_to_mxfp4_matches_core_for_every_rule") else {
        return;
    };
    let (rows, cols) = (17, 32 * 20);
    let mut rng = Rng(5);
    for (k, g) in [1.0f32, 2.5e-4, 7.3e33, 1e-38].into_iter().enumerate() {
        let codes: Vec<u8> = (0..rows * cols / 2).map(|_| rng.next_u64() as u8).collect();
        // mostly finite scales, a few NaN (0x7f / 0xff) and zero
        let scales: Vec<u8> = (0..rows * cols / 16)
            .map(|i| {
                if i % 97 == 3 {
                    0x7f
                } else if i % 89 == 5 {
                    0
                } else {
                    (rng.next_u64() % 0x7f) as u8
                }
            })
            .collect();
        let t = Nvfp4Tensor::from_parts(rows, cols, codes, scales, g).unwrap();
        for rule in RULES {
            let gm = gpu
                .nvfp4_to_mxfp4(t.codes(), t.scales(), t.global(), rows, cols, rule)
                .unwrap();
            let cm = convert::nvfp4_to_mxfp4(&t, rule);
            assert_same(
                &format!("case {k} {rule:?} scales"),
                &gm.scales,
                cm.scales(),
            );
            assert_same(&format!("case {k} {rule:?} codes"), &gm.codes, cm.codes());
        }
    }
}

#[test]
fn the_comparisons_catch_a_planted_error() {
    // The bit-exact helpers above must fail on a single-bit difference.
    let a = vec![1u8, 2, 3];
    let mut b = a.clone();
    b[2] ^= 1;
    assert!(std::panic::catch_unwind(|| assert_same("planted", &a, &b)).is_err());
    let x = vec![1.0f32, f32::NAN, 2.0];
    let mut y = x.clone();
    y[2] = f32::from_bits(y[2].to_bits() + 1);
    assert!(first_f32_mismatch(&x, &y) == Some(2));
    assert!(first_f32_mismatch(&x, &x).is_none());
    // and a GPU result with one planted wrong code is caught too
    let Some(gpu) = gpu_or_skip("the_comparisons_catch_a_planted_error") else {
        return;
    };
    let xs = block_tensor(4, 64, 11, 32);
    let mut g = gpu
        .mx_quantize(&xs, 4, 64, MxElem::Fp4E2M1, ScaleRule::Floor)
        .unwrap();
    let c = MxTensor::quantize(&xs, 4, 64, MxElem::Fp4E2M1, ScaleRule::Floor).unwrap();
    assert_same("unplanted", &g.codes, c.codes());
    g.codes[5] ^= 0x10;
    assert!(std::panic::catch_unwind(|| assert_same("planted", &g.codes, c.codes())).is_err());
}
