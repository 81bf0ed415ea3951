//! CPU model of the kernels' cross-lane code on one 64-lane wavefront (CDNA:
//! gfx942 / gfx950), where no AMD GPU can run it: the shuffles of
//! `hip_freestanding.h` (CUDA's width semantics over `ds_bpermute`), the HIP
//! tile product `m3_mma_bf16_16816` of `compat.h` (32-thread mma groups,
//! two per wavefront), `m3_warp_sum` at width `M3_WARP` = 64, the in-group
//! XOR butterflies (`m3s_act_mxfp4`'s MX-block amax over offsets 16..1,
//! the attention softmax's 8-lane and the indexer's 4-lane sums), and
//! `m3s_router_warp`'s lane layout (experts `lane + 64 i`, top-k by
//! butterfly argmax). Each model transcribes the source lines it names;
//! `models_follow_the_sources` fails when those lines change.
//!
//! All lanes are active in every model: the kernels call these with whole
//! wavefronts (the host launches one-warp kernels with `M3_WARP` threads).

// Lane loops index several per-lane arrays by lane, as the kernels do.
#![allow(clippy::needless_range_loop)]

const W: usize = 64;
type Wave<T> = [T; W];

const COMPAT: &str = include_str!("../kernels/compat.h");
const FREESTANDING: &str = include_str!("../kernels/hip_freestanding.h");
const DECODE: &str = include_str!("../kernels/standard_decode.cu");
const ATTENTION: &str = include_str!("../kernels/standard_attention.cu");

/// `__shfl(v, src, width)` (hip_freestanding.h): lane `src % width` of the
/// caller's `width`-wide segment, per lane.
fn shfl<T: Copy>(v: &Wave<T>, src: impl Fn(usize) -> usize, width: usize) -> Wave<T> {
    std::array::from_fn(|l| v[(src(l) & (width - 1)) | (l & !(width - 1))])
}

/// `__shfl_xor(v, mask, width)`: lane `l ^ mask`, or the lane's own value
/// when the partner is outside its segment.
fn shfl_xor<T: Copy>(v: &Wave<T>, mask: usize, width: usize) -> Wave<T> {
    std::array::from_fn(|l| {
        let idx = l ^ mask;
        let idx = if idx & !(width - 1) != l & !(width - 1) {
            l
        } else {
            idx
        };
        v[idx]
    })
}

fn bf16(x: f32) -> u16 {
    let b = x.to_bits();
    assert_eq!(b & 0xffff, 0, "test values are bf16 values");
    (b >> 16) as u16
}
fn pack(lo: f32, hi: f32) -> u32 {
    bf16(lo) as u32 | (bf16(hi) as u32) << 16
}

/// One lane's mma operands (PTX m16n8k16 layout, compat.h's comment).
#[derive(Clone, Copy, Default)]
struct Frag {
    a: [u32; 4],
    b0: u32,
    b1: u32,
}

/// The HIP `m3_mma_bf16_16816` of compat.h over a wavefront, `width` the
/// shuffles' segment (32 in the source).
fn mma_wave(c: &mut Wave<[f32; 4]>, f: &Wave<Frag>, width: usize) {
    let word = |sel: &dyn Fn(&Frag) -> u32| -> Wave<u32> { std::array::from_fn(|l| sel(&f[l])) };
    for hi in 0..2 {
        for tp in 0..4 {
            // l = threadIdx.x % 32: the lane within its mma group (the
            // block is whole wavefronts, so threadIdx.x % 32 == lane % 32)
            let g = |l: usize| (l % 32) / 4;
            let t = |l: usize| (l % 32) % 4;
            let ag = shfl(
                &word(&|x| if hi == 1 { x.a[2] } else { x.a[0] }),
                |l| g(l) * 4 + tp,
                width,
            );
            let ag8 = shfl(
                &word(&|x| if hi == 1 { x.a[3] } else { x.a[1] }),
                |l| g(l) * 4 + tp,
                width,
            );
            let bsel = word(&|x| if hi == 1 { x.b1 } else { x.b0 });
            let bn0 = shfl(&bsel, |l| (2 * t(l)) * 4 + tp, width);
            let bn1 = shfl(&bsel, |l| (2 * t(l) + 1) * 4 + tp, width);
            for l in 0..W {
                let lo = |w: u32| f32::from_bits(w << 16);
                let hi_ = |w: u32| f32::from_bits(w & 0xffff_0000);
                let (al, ah) = (lo(ag[l]), hi_(ag[l]));
                let (a8l, a8h) = (lo(ag8[l]), hi_(ag8[l]));
                let (b0l, b0h) = (lo(bn0[l]), hi_(bn0[l]));
                let (b1l, b1h) = (lo(bn1[l]), hi_(bn1[l]));
                c[l][0] += al * b0l + ah * b0h;
                c[l][1] += al * b1l + ah * b1h;
                c[l][2] += a8l * b0l + a8h * b0h;
                c[l][3] += a8l * b1l + a8h * b1h;
            }
        }
    }
}

/// Small integers (exact in bf16, and every sum below exact in f32).
fn small(seed: u64, i: usize) -> f32 {
    let mut z = seed
        .wrapping_add(i as u64)
        .wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z ^= z >> 29;
    ((z % 15) as f32) - 7.0
}

/// Two mma groups per wavefront, each with its own A (16x16) and B (16x8):
/// every lane's D fragment is its own group's product.
fn mma_groups(width: usize) -> (Wave<[f32; 4]>, [[[f32; 8]; 16]; 2]) {
    let a: [[[f32; 16]; 16]; 2] = std::array::from_fn(|grp| {
        std::array::from_fn(|r| std::array::from_fn(|k| small(1 + grp as u64, r * 16 + k)))
    });
    let b: [[[f32; 8]; 16]; 2] = std::array::from_fn(|grp| {
        std::array::from_fn(|k| std::array::from_fn(|n| small(7 + grp as u64, k * 8 + n)))
    });
    let f: Wave<Frag> = std::array::from_fn(|l| {
        let (grp, g, t) = (l / 32, (l % 32) / 4, (l % 32) % 4);
        let (a, b) = (&a[grp], &b[grp]);
        Frag {
            a: [
                pack(a[g][2 * t], a[g][2 * t + 1]),
                pack(a[g + 8][2 * t], a[g + 8][2 * t + 1]),
                pack(a[g][2 * t + 8], a[g][2 * t + 9]),
                pack(a[g + 8][2 * t + 8], a[g + 8][2 * t + 9]),
            ],
            b0: pack(b[2 * t][g], b[2 * t + 1][g]),
            b1: pack(b[2 * t + 8][g], b[2 * t + 9][g]),
        }
    });
    let mut c = [[0.0f32; 4]; W];
    mma_wave(&mut c, &f, width);
    let d = std::array::from_fn(|grp| {
        std::array::from_fn(|r| {
            std::array::from_fn(|n| (0..16).map(|k| a[grp][r][k] * b[grp][k][n]).sum())
        })
    });
    (c, d)
}

/// Lane l's D fragment: D[g][2t], D[g][2t+1], D[g+8][2t], D[g+8][2t+1].
fn expected(d: &[[[f32; 8]; 16]; 2], l: usize) -> [f32; 4] {
    let (grp, g, t) = (l / 32, (l % 32) / 4, (l % 32) % 4);
    let d = &d[grp];
    [
        d[g][2 * t],
        d[g][2 * t + 1],
        d[g + 8][2 * t],
        d[g + 8][2 * t + 1],
    ]
}

#[test]
fn hip_tile_product_keeps_two_mma_groups_apart() {
    let (c, d) = mma_groups(32);
    for (l, cl) in c.iter().enumerate() {
        assert_eq!(*cl, expected(&d, l), "lane {l}");
    }
    // the model sees the difference: wavefront-wide shuffles would hand
    // the upper group the lower group's operands
    let (c64, d) = mma_groups(64);
    assert!((32..W).any(|l| c64[l] != expected(&d, l)));
    assert!((0..32).all(|l| c64[l] == expected(&d, l)));
}

/// `m3_warp_sum` at `M3_WARP` lanes.
fn warp_sum(v: &Wave<f32>, warp: usize) -> Wave<f32> {
    let mut v = *v;
    let mut m = warp / 2;
    while m > 0 {
        let o = shfl_xor(&v, m, W);
        for l in 0..W {
            v[l] += o[l];
        }
        m >>= 1;
    }
    v
}

#[test]
fn warp_sum_covers_all_64_lanes() {
    let v: Wave<f32> = std::array::from_fn(|l| small(3, l));
    let total: f32 = v.iter().sum();
    assert!(warp_sum(&v, 64).iter().all(|&s| s == total));
    // a 32-lane butterfly (CUDA's M3_WARP) would leave two half sums
    let half = warp_sum(&v, 32);
    assert_eq!(half[0], v[..32].iter().sum::<f32>());
    assert_eq!(half[63], v[32..].iter().sum::<f32>());
}

#[test]
fn xor_butterflies_stay_in_their_aligned_groups() {
    // m3s_act_mxfp4 (offsets 16..1: one MX block of 32 per half
    // wavefront), the attention softmax (4, 2, 1: 8 lanes a head) and the
    // indexer (2, 1: 4 lanes a key), all at width M3_WARP = 64
    let v: Wave<u32> = std::array::from_fn(|l| (l as u32).wrapping_mul(2_654_435_761) >> 7);
    for group in [2usize, 4, 8, 16, 32, 64] {
        let mut m = v;
        let mut off = group / 2;
        while off > 0 {
            let o = shfl_xor(&m, off, W);
            for l in 0..W {
                m[l] = m[l].max(o[l]);
            }
            off >>= 1;
        }
        for l in 0..W {
            let g0 = l / group * group;
            assert_eq!(
                m[l],
                *v[g0..g0 + group].iter().max().unwrap(),
                "group {group}, lane {l}"
            );
        }
    }
}

/// `s_router_row` (both router kernels) over one wavefront of `warp`
/// lanes: expert `lane + i * warp` in slot i < 1024 / warp of a lane, the
/// k rounds of butterfly argmax (lower id on ties, NaN as -inf), the owner
/// lane marking its pick used. It also models the source's fit form
/// (`S_ROUTER_FIT`: 4 slots a lane where ne <= 4 * warp): the slots it
/// leaves out only ever hold experts >= ne, which never take part; that
/// the source takes the fit form only there is `models_follow_the_sources`'
/// check.
fn router_wave(z: &[f32], bias: &[f32], k: usize, warp: usize) -> Vec<i32> {
    let ne = z.len();
    let per_lane = 1024 / warp;
    assert!(ne <= 1024 && warp <= W);
    let sig = |x: f32| 1.0 / (1.0 + (-x).exp());
    let v: Vec<[f32; 32]> = (0..warp)
        .map(|lane| {
            std::array::from_fn(|i| {
                let e = lane + i * warp;
                if e >= ne || i >= per_lane {
                    return f32::NEG_INFINITY;
                }
                let x = sig(z[e]) + bias[e];
                if x.is_nan() {
                    f32::NEG_INFINITY
                } else {
                    x
                }
            })
        })
        .collect();
    let mut used = vec![0u32; warp];
    let mut ch = Vec::new();
    for _ in 0..k {
        let mut bv: Wave<f32> = [0.0; W];
        let mut bi: Wave<i32> = [-1; W];
        for lane in 0..warp {
            for i in 0..per_lane {
                let e = lane + i * warp;
                if e >= ne || (used[lane] >> i) & 1 == 1 {
                    continue;
                }
                if bi[lane] < 0 || v[lane][i] > bv[lane] {
                    bv[lane] = v[lane][i];
                    bi[lane] = e as i32;
                }
            }
        }
        let mut o = warp / 2;
        while o > 0 {
            let (ov, oi) = (shfl_xor(&bv, o, W), shfl_xor(&bi, o, W));
            for l in 0..W {
                if oi[l] >= 0 && (bi[l] < 0 || ov[l] > bv[l] || (ov[l] == bv[l] && oi[l] < bi[l])) {
                    bv[l] = ov[l];
                    bi[l] = oi[l];
                }
            }
            o >>= 1;
        }
        // every lane of the warp agrees on the pick
        assert!((0..warp).all(|l| bi[l] == bi[0]));
        let b = bi[0];
        if b >= 0 {
            used[b as usize % warp] |= 1 << (b as usize / warp);
        }
        ch.push(b);
    }
    ch.sort();
    ch
}

/// cpu-ref's rule: top-k of sigmoid(z) + bias, lower id on ties, NaN last.
fn router_ref(z: &[f32], bias: &[f32], k: usize) -> Vec<i32> {
    let sig = |x: f32| 1.0 / (1.0 + (-x).exp());
    let mut s: Vec<(f32, usize)> = (0..z.len())
        .map(|e| {
            let x = sig(z[e]) + bias[e];
            (if x.is_nan() { f32::NEG_INFINITY } else { x }, e)
        })
        .collect();
    s.sort_by(|a, b| b.0.partial_cmp(&a.0).unwrap().then(a.1.cmp(&b.1)));
    let mut ids: Vec<i32> = s[..k].iter().map(|&(_, e)| e as i32).collect();
    ids.sort();
    ids
}

#[test]
fn router_lane_layout_is_right_on_64_lanes() {
    for (ne, k, seed) in [
        (256usize, 8usize, 1u64),
        (1024, 16, 2),
        (100, 16, 3),
        (64, 1, 4),
        (1000, 4, 5),
        (128, 4, 6),
    ] {
        // coarse values, so that ties happen
        let z: Vec<f32> = (0..ne).map(|e| small(seed, e) / 4.0).collect();
        let mut bias: Vec<f32> = (0..ne).map(|e| small(seed + 100, e) / 8.0).collect();
        bias[ne / 2] = f32::NAN;
        let want = router_ref(&z, &bias, k);
        assert_eq!(router_wave(&z, &bias, k, 64), want, "ne {ne} k {k}");
        assert_eq!(router_wave(&z, &bias, k, 32), want, "32-lane warp, ne {ne}");
    }
}

#[test]
fn models_follow_the_sources() {
    let has = |src: &str, what: &str, line: &str| {
        assert!(src.contains(line), "{what} no longer has `{line}`")
    };
    for line in [
        "const int idx = (src & (width - 1)) | (l & ~(width - 1));",
        "int idx = l ^ mask;",
        "if ((idx & ~(width - 1)) != (l & ~(width - 1))) idx = l;",
    ] {
        has(FREESTANDING, "hip_freestanding.h", line);
    }
    for line in [
        "#define M3_WARP 64",
        "const int l = (int)(threadIdx.x % 32u), g = l / 4, t = l % 4;",
        // register k of the fragments (a0..a3, b0, b1) from lane `lane`
        "M3_DEV u32 m3_frag_reg(const u32* a, u32 b0, u32 b1, int k) { return k < 4 ? a[k] : (k == 4 ? b0 : b1); }",
        "#define M3_FRAG(k, lane) __shfl(m3_frag_reg(a, b0, b1, (k)), (lane), 32)",
        "u32 ag = M3_FRAG(hi ? 2 : 0, g * 4 + tp);",
        "u32 ag8 = M3_FRAG(hi ? 3 : 1, g * 4 + tp);",
        "u32 bn0 = M3_FRAG(hi ? 5 : 4, (2 * t) * 4 + tp);",
        "u32 bn1 = M3_FRAG(hi ? 5 : 4, (2 * t + 1) * 4 + tp);",
        "c[0] += al * b0l + ah * b0h;",
        "c[3] += a8l * b1l + a8h * b1h;",
        "for (int m = M3_WARP / 2; m > 0; m >>= 1) v += M3_SHFL_XOR(v, m);",
    ] {
        has(COMPAT, "compat.h", line);
    }
    for line in [
        "u32 e = lane + i * M3_WARP;",
        "if (oi >= 0 && (bi < 0 || ov > bv || (ov == bv && oi < bi))) { bv = ov; bi = oi; }",
        "template <u32 PL>\nM3_DEV void s_router_row_pl(",
        "#define S_ROUTER_FIT_PL 4u",
        "if (S_ROUTER_FIT && ne <= S_ROUTER_FIT_PL * M3_WARP)",
        "s_router_row_pl<1024u / M3_WARP>(z, bias, ne, k, scaling, t, ids_g, wts, sh, ids);",
        "if (bi >= 0 && (u32)bi % M3_WARP == lane) {",
        "used |= 1u << ib;",
        "for (int m = 16; m > 0; m >>= 1) {",
    ] {
        has(DECODE, "standard_decode.cu", line);
    }
    for line in [
        "mt = si_max(mt, M3_SHFL_XOR(mt, 4));",
        "v += M3_SHFL_XOR(v, 2);",
        "const u32 grp = tid / 32u, l32 = tid % 32u, lg = l32 / 4u, lt = l32 % 4u;",
    ] {
        has(ATTENTION, "standard_attention.cu", line);
    }
}
