//! The paged KV and index caches on the device, and copy-on-write.
//!
//! One pool of `num_pages` blocks of `page_size` positions, shared by every
//! layer (the scheduler's block ids index all of them). Per layer:
//! `k`, `v` `[slots, kv_heads * head_dim]` and, on sparse layers, the index
//! keys `[slots, index_head_dim]`, in the cache dtype (bf16 bits or E4M3
//! codes with the layer's per-tensor scale; MODEL.md 3.5), or NVFP4
//! (ARCHITECTURE.md, *NVFP4 KV cache*): each tensor is then two buffers,
//! the packed E2M1 codes `[slots, width / 2]` and the E4M3 block scales
//! `[slots, width / 16]` (`m3_core::kv::CacheData::Nvfp4`'s two arrays),
//! the per-tensor scale as the global. The layout is `m3_core::kv`'s, and
//! every buffer holds the same bytes per slot, so a block copy is a byte
//! copy of each buffer.

use m3_core::config::{AttnKind, ModelConfig};
use m3_core::kv::CacheDtype;

use super::launch::Launcher;
use crate::error::{GpuError, Result};
use crate::model::DevBuf;
use crate::runtime::api::Device;

/// One cache tensor on the device: its elements (bf16 bits, E4M3 codes or
/// packed E2M1 codes) and, for NVFP4 only, its block scales.
pub struct DevCache {
    pub data: DevBuf,
    /// NVFP4 block scales `[slots, width / 16]` (E4M3 bytes).
    pub scales: Option<DevBuf>,
}

impl DevCache {
    /// Zeroed storage of `slots` rows of `width` values in `dtype`; `what`
    /// names the tensor in errors.
    fn new(
        ctx: &Device,
        what: &str,
        dtype: CacheDtype,
        slots: usize,
        width: usize,
    ) -> Result<Self> {
        if !width.is_multiple_of(dtype.block()) {
            return Err(GpuError::input(
                "kv cache",
                format!(
                    "{what}: a {} cache row of {width} values is not a whole number of {}-value blocks",
                    dtype.name(),
                    dtype.block()
                ),
            ));
        }
        let (data, scales) = match dtype {
            CacheDtype::Bf16 => (2 * width, 0),
            CacheDtype::Fp8E4M3 => (width, 0),
            CacheDtype::Nvfp4 => (width / 2, width / dtype.block()),
        };
        Ok(DevCache {
            data: DevBuf::zeroed(ctx, slots * data)?,
            scales: if scales > 0 {
                Some(DevBuf::zeroed(ctx, slots * scales)?)
            } else {
                None
            },
        })
    }

    /// Device address of the elements.
    pub fn ptr(&self) -> u64 {
        self.data.ptr()
    }

    /// Device address of the block scales; 0 when the dtype has none (the
    /// kernels' convention).
    pub fn scales_ptr(&self) -> u64 {
        self.scales.as_ref().map_or(0, |b| b.ptr())
    }

    /// Every buffer of the tensor.
    fn bufs(&self) -> impl Iterator<Item = &DevBuf> {
        std::iter::once(&self.data).chain(self.scales.as_ref())
    }

    /// Device bytes of the tensor.
    pub fn bytes(&self) -> usize {
        self.bufs().map(|b| b.bytes()).sum()
    }
}

/// The caches of one layer.
pub struct LayerKv {
    pub k: DevCache,
    pub v: DevCache,
    /// Index keys (sparse layers only).
    pub ik: Option<DevCache>,
}

impl LayerKv {
    /// Every tensor of the layer.
    pub fn tensors(&self) -> impl Iterator<Item = &DevCache> {
        [&self.k, &self.v].into_iter().chain(self.ik.as_ref())
    }
}

/// Every layer's caches.
pub struct DevKv {
    pub layers: Vec<LayerKv>,
    pub page_size: usize,
    pub num_pages: usize,
    pub dtype: CacheDtype,
}

impl DevKv {
    /// Bytes one block takes across every layer (K, V and index keys).
    pub fn block_bytes(c: &ModelConfig, page_size: usize, dtype: CacheDtype) -> usize {
        let kv = 2 * dtype.row_bytes(c.num_key_value_heads * c.head_dim);
        (0..c.num_hidden_layers)
            .map(|l| {
                let ik = if c.attn_kinds.get(l) == Some(&AttnKind::Sparse) {
                    dtype.row_bytes(c.index_head_dim)
                } else {
                    0
                };
                page_size * (kv + ik)
            })
            .sum()
    }

    /// Allocate `num_pages` zeroed blocks for every layer of `c`.
    pub fn new(
        ctx: &Device,
        c: &ModelConfig,
        page_size: usize,
        num_pages: usize,
        dtype: CacheDtype,
    ) -> Result<Self> {
        if page_size == 0 || num_pages == 0 {
            return Err(GpuError::input(
                "kv cache",
                format!("{num_pages} blocks of {page_size} positions"),
            ));
        }
        let slots = page_size * num_pages;
        let width = c.num_key_value_heads * c.head_dim;
        // a head's slice of a K / V row is whole blocks too (no block mixes
        // two heads: attention reads one head's slice)
        if !c.head_dim.is_multiple_of(dtype.block()) {
            return Err(GpuError::input(
                "kv cache",
                format!(
                    "head_dim {} (one head of the K / V cache) is not a whole number of {}-value {} blocks",
                    c.head_dim,
                    dtype.block(),
                    dtype.name()
                ),
            ));
        }
        let mut layers = Vec::with_capacity(c.num_hidden_layers);
        for l in 0..c.num_hidden_layers {
            let sparse = c.attn_kinds.get(l) == Some(&AttnKind::Sparse);
            let name = |t: &str| format!("layers.{l}.{t} cache");
            layers.push(LayerKv {
                k: DevCache::new(ctx, &name("k"), dtype, slots, width)?,
                v: DevCache::new(ctx, &name("v"), dtype, slots, width)?,
                ik: if sparse {
                    Some(DevCache::new(
                        ctx,
                        &name("index_k"),
                        dtype,
                        slots,
                        c.index_head_dim,
                    )?)
                } else {
                    None
                },
            });
        }
        Ok(DevKv {
            layers,
            page_size,
            num_pages,
            dtype,
        })
    }

    /// Device bytes of every cache.
    pub fn bytes(&self) -> usize {
        self.layers
            .iter()
            .flat_map(|l| l.tensors())
            .map(|t| t.bytes())
            .sum()
    }

    /// Copy every slot of block `src` into block `dst` in every tensor,
    /// in order on the launcher's stream (a later step sees the copies).
    pub fn copy_blocks(&self, l: &Launcher, pairs: &[(u32, u32)]) -> Result<()> {
        for &(src, dst) in pairs {
            if src as usize >= self.num_pages || dst as usize >= self.num_pages {
                return Err(GpuError::input(
                    "copy_blocks",
                    format!(
                        "block copy {src} -> {dst} outside the pool of {} blocks",
                        self.num_pages
                    ),
                ));
            }
            for layer in &self.layers {
                // every buffer (NVFP4: codes and block scales) holds the
                // same bytes per slot, so a block is bytes / num_pages
                for t in layer.tensors().flat_map(|t| t.bufs()) {
                    let block = t.bytes() / self.num_pages;
                    l.copy(
                        t.at(dst as usize * block),
                        t.at(src as usize * block),
                        block,
                    )?;
                }
            }
        }
        Ok(())
    }
}

/// A host model of the device's NVFP4 cache arithmetic, held bit for bit to
/// `m3_core::kv::CacheTensor` (the CPU reference): the store
/// (`m3_nvfp4_block` in kernels/compat.h, run by `m3s_cache_write` and the
/// harness's `m3_cache_encode_nvfp4`) and the reads (`m3_nvfp4_cache_value`
/// of the indexer and the harness, `m3_nvfp4_bf16` of the attention's
/// tensor-core operands). Each model function is the kernel's code line by
/// line in Rust, so a mismatch here is a mismatch of the kernels' arithmetic;
/// the tests also check the kernel source still has the modelled lines.
#[cfg(test)]
mod nvfp4_model {
    use m3_core::kv::{CacheData, CacheDtype, CacheTensor};

    use crate::kernels::PRELUDE;

    /// `m3_elem_encode_sat` for E2M1 (`e4m3 == false`) and E4M3: RNE
    /// through `rint(ldexp(a, k))` of the exact f64 value, saturating.
    fn encode_sat(e4m3: bool, x: f64, ties_away: bool) -> u32 {
        let (mbits, bias, sign_shift, maxcode, maxv) = if e4m3 {
            (3i32, 7i32, 7u32, 0x7eu32, 448.0f64)
        } else {
            (1, 1, 3, 0x7, 6.0)
        };
        let xb = x.to_bits();
        let sign = (xb >> 63) as u32;
        if (xb & 0x7fff_ffff_ffff_ffff) > 0x7ff0_0000_0000_0000 {
            return if e4m3 { (sign << sign_shift) | 0x7f } else { 0 };
        }
        let a = x.abs();
        if a >= maxv {
            return (sign << sign_shift) | maxcode;
        }
        let rint = |v: f64| {
            if ties_away {
                v.round()
            } else {
                v.round_ties_even()
            }
        };
        let emin = 1 - bias;
        let mut ea = ((a.to_bits() >> 52) & 0x7ff) as i32 - 1023;
        let code = if a == 0.0 || ea < emin {
            rint(a * 2f64.powi(mbits - emin)) as u32
        } else {
            let mut qi = rint(a * 2f64.powi(mbits - ea)) as u32;
            if qi == 1 << (mbits + 1) {
                qi >>= 1;
                ea += 1;
            }
            let c = (((ea + bias) as u32) << mbits) | (qi - (1 << mbits));
            c.min(maxcode)
        };
        (sign << sign_shift) | code
    }

    /// `m3_elem_decode` for E4M3 (exact; 0x7F / 0xFF NaN).
    fn e4m3(c: u32) -> f32 {
        let c = c & 0xff;
        if c & 0x7f == 0x7f {
            return f32::NAN;
        }
        let (e, m) = ((c >> 3) & 0xf, c & 7);
        let v = if e == 0 {
            m as f32 * 2f32.powi(-9)
        } else {
            (1.0 + m as f32 / 8.0) * 2f32.powi(e as i32 - 7)
        };
        if c & 0x80 != 0 {
            -v
        } else {
            v
        }
    }

    /// `m3_fp4_fast`: |E2M1| from the low 3 bits, the sign from bit 3.
    fn fp4(c: u32) -> f32 {
        let mag = c & 7;
        let bits = if mag < 2 {
            if mag != 0 {
                0x3f00_0000
            } else {
                0
            }
        } else {
            (((mag >> 1) + 126) << 23) | ((mag & 1) << 22)
        };
        f32::from_bits(bits | ((c & 8) << 28))
    }

    /// What a planted error changes in [`block`].
    #[derive(Clone, Copy, PartialEq)]
    enum Plant {
        None,
        /// E2M1 ties rounded away from zero (`round`, not `rint`).
        TiesAway,
        /// A block whose scale decodes to 0 divides by it anyway.
        NoZeroScaleRule,
        /// The block scale's quotient taken in f32.
        F32ScaleQuotient,
    }

    /// `m3_nvfp4_block`: the E4M3 scale byte and the 16 unpacked codes.
    fn block(v: &[f32], g: f32, plant: Plant) -> (u32, [u32; 16]) {
        let mut c = [0u32; 16];
        let mut bamax = 0.0f32;
        let mut bad = false;
        for &x in v {
            let a = x.abs();
            // !(a <= FLT_MAX): NaN or Inf
            if a.is_nan() || a > f32::MAX {
                bad = true;
            } else {
                bamax = bamax.max(a);
            }
        }
        if bad {
            return (0x7f, c);
        }
        let g64 = g as f64;
        let q = if plant == Plant::F32ScaleQuotient {
            (bamax / (6.0 * g)) as f64
        } else {
            bamax as f64 / (6.0 * g64)
        };
        let s = encode_sat(true, q, false);
        let sd = e4m3(s) as f64;
        if sd == 0.0 && plant != Plant::NoZeroScaleRule {
            return (s, c);
        }
        let den = g64 * sd;
        for (ci, &x) in c.iter_mut().zip(v) {
            *ci = encode_sat(false, x as f64 / den, plant == Plant::TiesAway);
        }
        (s, c)
    }

    /// A row stored as `m3s_cache_write` stores it: codes packed two a byte
    /// (low nibble = even element), one scale byte a block.
    fn store(row: &[f32], g: f32, plant: Plant) -> (Vec<u8>, Vec<u8>) {
        let mut codes = Vec::new();
        let mut scales = Vec::new();
        for b in row.chunks_exact(16) {
            let (s, c) = block(b, g, plant);
            scales.push(s as u8);
            for p in c.chunks_exact(2) {
                codes.push((p[0] | (p[1] << 4)) as u8);
            }
        }
        (codes, scales)
    }

    /// The CPU reference's bytes of `row` stored with global `g`.
    fn reference(row: &[f32], g: f32) -> (Vec<u8>, Vec<u8>) {
        let mut t = CacheTensor::new(CacheDtype::Nvfp4, 1, row.len(), g).unwrap();
        t.write(0, row).unwrap();
        match t.data {
            CacheData::Nvfp4 { codes, scales } => (codes, scales),
            _ => panic!("not an nvfp4 tensor"),
        }
    }

    use super::super::TestRng;

    /// Global scales: the default, the golden cases' (0.25, 0.375, 1.5),
    /// FP8-calibrated ones, and extremes (a subnormal, huge).
    const GLOBALS: [f32; 9] = [
        1.0,
        0.25,
        0.375,
        1.5,
        0.011_718_75,
        3.7e-3,
        1e-40,
        2.5e4,
        0.3,
    ];

    /// Rows of 64 values: random at many magnitudes, and the edges (zero
    /// and -0 blocks, NaN / Inf blocks, E2M1 ties, the E4M3 scale tie 6.375,
    /// scales past 448, below the least subnormal, subnormal f32 inputs).
    fn rows(g: f32) -> Vec<Vec<f32>> {
        let mut r = TestRng(0x5eed ^ g.to_bits() as u64);
        let mut out = Vec::new();
        for k in 0..400 {
            let mag = 2f32.powi((k % 40) - 24);
            out.push((0..64).map(|_| r.unit() * mag * 6.0 * g).collect());
        }
        // one block of each edge case, the other three random
        let ties = [
            0.25f32, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, -0.25, -0.75, -1.25, -1.75, -2.5, -3.5,
            -5.0, -6.0,
        ];
        let edges: Vec<Vec<f32>> = vec![
            vec![0.0; 16],
            vec![-0.0; 16],
            (0..16)
                .map(|i| if i == 3 { f32::NAN } else { 1.0 })
                .collect(),
            (0..16)
                .map(|i| if i == 9 { f32::NEG_INFINITY } else { -2.0 })
                .collect(),
            (0..16)
                .map(|i| if i == 0 { f32::INFINITY } else { 0.0 })
                .collect(),
            // scale 1.0 exactly: the E2M1 ties themselves (with g = 1)
            ties.iter().map(|&t| t * g).collect(),
            // amax 6.375 g: the scale tie 1.0625 -> 1.0, the amax clips to 6
            (0..16)
                .map(|i| {
                    if i == 0 {
                        6.375 * g
                    } else {
                        i as f32 * 0.3 * g
                    }
                })
                .collect(),
            // past 448 * 6 g: scale saturates
            (0..16).map(|i| (i as f32 - 7.5) * 1000.0 * g).collect(),
            // at and below 2^-10 * 6 g: the scale rounds to 0, the block reads 0
            (0..16)
                .map(|i| {
                    if i % 2 == 0 {
                        6.0 * g * 2f32.powi(-10)
                    } else {
                        -1e-3 * g * 2f32.powi(-10)
                    }
                })
                .collect(),
            (0..16)
                .map(|i| 6.0 * g * 2f32.powi(-11) * (i as f32 / 16.0))
                .collect(),
            // f32 subnormals and a -0 in a live block
            (0..16)
                .map(|i| {
                    if i == 1 {
                        -0.0
                    } else {
                        f32::from_bits(i as u32 * 12_345 + 1)
                    }
                })
                .collect(),
            (0..16)
                .map(|i| {
                    if i == 2 {
                        -0.0
                    } else {
                        (i as f32 - 8.0) * 0.37 * g
                    }
                })
                .collect(),
        ];
        for e in edges {
            let mut row: Vec<f32> = (0..48).map(|_| r.unit() * 3.0 * g).collect();
            row.splice(16..16, e);
            out.push(row);
        }
        out
    }

    fn mismatches(plant: Plant) -> usize {
        let mut n = 0;
        for g in GLOBALS {
            for row in rows(g) {
                if store(&row, g, plant) != reference(&row, g) {
                    n += 1;
                }
            }
        }
        n
    }

    /// The kernels still have the lines modelled above.
    #[test]
    fn the_model_is_the_kernels_code() {
        for line in [
            "if (!(a <= 3.402823466e38f)) bad = true;  // NaN or Inf",
            "const u32 s = m3_elem_encode_sat(M3_ELEM_E4M3, __ddiv_rn((double)bamax, __dmul_rn(6.0, g)));",
            "const double den = __dmul_rn(g, sd);",
            "c[j] = m3_elem_encode_sat(M3_ELEM_E2M1, __ddiv_rn((double)v[j], den));",
            "return __fmul_rn(__fmul_rn(m3_fp4_fast(code), m3_e4m3_fast(sbyte)), g);",
            "return m3_bits(__fmul_rn(m3_fp4_fast(code), s)) >> 16;",
            "double q = rint(ldexp(a, mbits - ea));",
        ] {
            assert!(PRELUDE.contains(line), "compat.h no longer has `{line}`");
        }
        let std = super::super::STANDARD.body;
        for line in [
            "sc[b] = (u8)m3_nvfp4_block(v, (double)scale, c);",
            "w0 |= (c[2 * j] | (c[2 * j + 1] << 4)) << (8 * j);",
            "w1 |= (c[8 + 2 * j] | (c[8 + 2 * j + 1] << 4)) << (8 * j);",
        ] {
            assert!(std.contains(line), "s_cache_store no longer has `{line}`");
        }
    }

    /// The device store equals `CacheTensor::write` bit for bit on every
    /// input; and the comparison is sharp: each planted error is caught.
    #[test]
    fn store_matches_the_cpu_bit_for_bit_and_planted_errors_are_caught() {
        assert_eq!(mismatches(Plant::None), 0);
        for p in [
            Plant::TiesAway,
            Plant::NoZeroScaleRule,
            Plant::F32ScaleQuotient,
        ] {
            assert!(mismatches(p) > 0, "a planted error passed");
        }
    }

    /// The reads: the indexer's and the harness's value is the CPU's for
    /// every code, scale byte and global (NaN for NaN scales); the
    /// attention's bf16 operand e2m1 * s is exact (the f32 product's low
    /// half is zero), so scaling the f32 dot by g equals the CPU's order up
    /// to the f32 sums.
    #[test]
    fn reads_match_the_cpu_bit_for_bit() {
        for g in GLOBALS {
            for s in 0..=255u32 {
                let mut t = CacheTensor::new(CacheDtype::Nvfp4, 1, 16, g).unwrap();
                if let CacheData::Nvfp4 { codes, scales } = &mut t.data {
                    // the 16 codes 0..15 in order
                    for (i, b) in codes.iter_mut().enumerate() {
                        *b = (2 * i as u8) | ((2 * i as u8 + 1) << 4);
                    }
                    scales[0] = s as u8;
                }
                let mut cpu = [0f32; 16];
                t.read(0, 0, &mut cpu);
                for (c, &want) in cpu.iter().enumerate() {
                    let sd = e4m3(s);
                    let got = (fp4(c as u32) * sd) * g;
                    assert!(
                        got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                        "code {c:#x} scale {s:#x} g {g}: device {got:e}, cpu {want:e}"
                    );
                    let p = fp4(c as u32) * sd;
                    if !p.is_nan() {
                        assert_eq!(
                            p.to_bits() & 0xffff,
                            0,
                            "e2m1 {c:#x} * e4m3 {s:#x} is not a bf16 value"
                        );
                    }
                }
            }
        }
    }
}
