//! The device layout of weight codes: how MXFP4 / NVFP4 nibbles and MXFP8
//! E4M3 bytes are ordered in device memory, so that the tensor-core linear
//! (`s_seg_frag` in `kernels/standard_decode.cu`) turns them into bf16
//! operands with a few bit operations per pair of values.
//!
//! The kernel needs, for each 32-value segment of a weight row, 16 bf16x2
//! words where word `w` holds values `2w` (low half) and `2w + 1` (high
//! half). A code placed at the *top* of a 16-bit lane (sign at bit 15) needs
//! no shift for its sign and one shift for its magnitude, and the two lanes
//! of a word are then handled by the same mask-and-shift; so the device
//! layout puts the two values of each word 16 bits apart in one u32:
//!
//! * **E2M1 (MXFP4, NVFP4)**: u32 `i` of a segment (bytes `4i..4i+4`) holds
//!   values `8i..8i+8`; value `8i + 2j` in bits `[12 - 4j, 16 - 4j)` and
//!   value `8i + 2j + 1` in bits `[28 - 4j, 32 - 4j)` (`j` = 0..4). The
//!   kernel takes `(q & 0x80008000) | ((q >> 6) & 0x01c001c0)`, then
//!   `q <<= 4`, four times: each step is one word (value times 2^-126 in
//!   bf16, which one bf16x2 multiply by `2^126 * scale` makes exact).
//! * **E4M3 (MXFP8)**: u32 `i` holds values `4i..4i+4` as bytes
//!   `[4i+2, 4i, 4i+3, 4i+1]`: the top bytes of its two lanes are values
//!   `4i`, `4i+1`, and after `q <<= 8` values `4i+2`, `4i+3`; the kernel
//!   takes `(q & 0x80008000) | ((q >> 4) & 0x07f007f0)` (value times
//!   2^-120).
//!
//! The stored (checkpoint) layout is FORMATS.md's: E2M1 two a byte, low
//! nibble first; one E4M3 byte a value. bf16, E5M2 and f32 stay as stored.
//! Segments never cross rows (K is a multiple of 32), so the permutation is
//! the same for every 4 bytes of a matrix.

use std::borrow::Cow;

use super::WFmt;

/// Whether `fmt`'s codes are permuted on the device.
pub fn permuted(fmt: WFmt) -> bool {
    matches!(
        fmt,
        WFmt::Mxfp4 | WFmt::Nvfp4 | WFmt::Mxfp8E4M3 | WFmt::Ptpc
    )
}

/// One stored u32 of E2M1 codes (nibble `n` = value `n`) in device order.
const fn e2m1_to_device(w: u32) -> u32 {
    let mut d = 0u32;
    let mut j = 0;
    while j < 4 {
        d |= ((w >> (8 * j)) & 0xf) << (12 - 4 * j);
        d |= ((w >> (8 * j + 4)) & 0xf) << (28 - 4 * j);
        j += 1;
    }
    d
}

/// The inverse of [`e2m1_to_device`].
fn e2m1_from_device(d: u32) -> u32 {
    let mut w = 0u32;
    for j in 0..4 {
        w |= ((d >> (12 - 4 * j)) & 0xf) << (8 * j);
        w |= ((d >> (28 - 4 * j)) & 0xf) << (8 * j + 4);
    }
    w
}

/// [`e2m1_to_device`] by stored byte: byte `k` (values `2k`, `2k + 1`)
/// lands in nibbles `3 - k` and `7 - k`, so a u32 is the OR of four table
/// entries (4 KiB; the loader permutes every MXFP4 / NVFP4 byte it uploads,
/// tens of GB for a real checkpoint, so this is on the load path).
const E2M1_BYTE: [[u32; 256]; 4] = {
    let mut t = [[0u32; 256]; 4];
    let mut k = 0;
    while k < 4 {
        let mut b = 0;
        while b < 256 {
            t[k][b] = e2m1_to_device((b as u32) << (8 * k));
            b += 1;
        }
        k += 1;
    }
    t
};

/// Bytes per piece permuted on one thread.
const PAR_CHUNK: usize = 1 << 20;

/// Apply the per-u32 permutation `f` to `codes` (a multiple of 4 bytes),
/// on every core for large tensors.
fn map_words(codes: &[u8], f: impl Fn(u32) -> u32 + Sync) -> Vec<u8> {
    use rayon::prelude::*;
    let mut out = vec![0u8; codes.len()];
    let run = |src: &[u8], dst: &mut [u8]| {
        for (s, d) in src.chunks_exact(4).zip(dst.chunks_exact_mut(4)) {
            let w = u32::from_le_bytes([s[0], s[1], s[2], s[3]]);
            d.copy_from_slice(&f(w).to_le_bytes());
        }
    };
    if codes.len() <= PAR_CHUNK {
        run(codes, &mut out);
    } else {
        out.par_chunks_mut(PAR_CHUNK)
            .zip(codes.par_chunks(PAR_CHUNK))
            .for_each(|(d, s)| run(s, d));
    }
    out
}

fn e2m1_fast(w: u32) -> u32 {
    E2M1_BYTE[0][(w & 0xff) as usize]
        | E2M1_BYTE[1][((w >> 8) & 0xff) as usize]
        | E2M1_BYTE[2][((w >> 16) & 0xff) as usize]
        | E2M1_BYTE[3][(w >> 24) as usize]
}

/// E4M3 stored bytes `[v0, v1, v2, v3]` as device bytes `[v2, v0, v3, v1]`.
fn e4m3_to_device(w: u32) -> u32 {
    ((w >> 16) & 0xff) | ((w & 0xff) << 8) | ((w >> 24) << 16) | (((w >> 8) & 0xff) << 24)
}

/// The inverse of [`e4m3_to_device`].
fn e4m3_from_device(d: u32) -> u32 {
    ((d >> 8) & 0xff) | ((d >> 24) << 8) | ((d & 0xff) << 16) | (((d >> 16) & 0xff) << 24)
}

/// `codes` (stored layout, whole segments: a multiple of 4 bytes) in the
/// device layout of `fmt`; borrowed when the format is not permuted.
pub fn to_device(fmt: WFmt, codes: &[u8]) -> Cow<'_, [u8]> {
    match fmt {
        WFmt::Mxfp4 | WFmt::Nvfp4 => Cow::Owned(map_words(codes, e2m1_fast)),
        WFmt::Mxfp8E4M3 | WFmt::Ptpc => Cow::Owned(map_words(codes, e4m3_to_device)),
        _ => Cow::Borrowed(codes),
    }
}

/// The inverse of [`to_device`]: device codes back in the stored layout.
pub fn from_device(fmt: WFmt, codes: &[u8]) -> Cow<'_, [u8]> {
    match fmt {
        WFmt::Mxfp4 | WFmt::Nvfp4 => Cow::Owned(map_words(codes, e2m1_from_device)),
        WFmt::Mxfp8E4M3 | WFmt::Ptpc => Cow::Owned(map_words(codes, e4m3_from_device)),
        _ => Cow::Borrowed(codes),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Device byte `b` of an E4M3 u32 holds stored byte `E4M3_SRC[b]`.
    const E4M3_SRC: [usize; 4] = [2, 0, 3, 1];
    use m3_core::formats::{bf16, e2m1, MxElem};

    fn bytes(n: usize, seed: u32) -> Vec<u8> {
        (0..n)
            .map(|i| ((i as u32).wrapping_mul(2_654_435_761) ^ seed).rotate_left(7) as u8)
            .collect()
    }

    #[test]
    fn the_fast_permutations_equal_their_definitions() {
        for i in 0..200_000u32 {
            let w = i.wrapping_mul(2_654_435_761) ^ (i << 7);
            assert_eq!(e2m1_fast(w), e2m1_to_device(w));
            let b = w.to_le_bytes();
            let d = e4m3_to_device(w).to_le_bytes();
            for (k, &src) in E4M3_SRC.iter().enumerate() {
                assert_eq!(d[k], b[src]);
            }
        }
        // large tensors go through the parallel path: same bytes
        let big = bytes(3 * PAR_CHUNK + 12, 5);
        let small: Vec<u8> = big
            .chunks(PAR_CHUNK)
            .flat_map(|c| to_device(WFmt::Mxfp4, c).into_owned())
            .collect();
        assert_eq!(to_device(WFmt::Mxfp4, &big).as_ref(), small.as_slice());
    }

    #[test]
    fn round_trips() {
        let c = bytes(64, 9);
        for f in [
            WFmt::Mxfp4,
            WFmt::Nvfp4,
            WFmt::Mxfp8E4M3,
            WFmt::Mxfp8E5M2,
            WFmt::Bf16,
        ] {
            let d = to_device(f, &c);
            assert_eq!(from_device(f, &d).as_ref(), c.as_slice(), "{f:?}");
            assert_eq!(permuted(f), d.as_ref() != c.as_slice(), "{f:?}");
        }
    }

    /// The kernel's E2M1 steps, emulated: word `w` of a segment, as
    /// (bits of the low lane, bits of the high lane) before the scale.
    fn kernel_fp4_words(seg: &[u8]) -> Vec<(u16, u16)> {
        let mut out = Vec::new();
        for q in seg.chunks_exact(4) {
            let mut q = u32::from_le_bytes([q[0], q[1], q[2], q[3]]);
            for _ in 0..4 {
                let w = (q & 0x8000_8000) | ((q >> 6) & 0x01c0_01c0);
                out.push((w as u16, (w >> 16) as u16));
                q <<= 4;
            }
        }
        out
    }

    fn kernel_e4m3_words(seg: &[u8]) -> Vec<(u16, u16)> {
        let mut out = Vec::new();
        for q in seg.chunks_exact(4) {
            let mut q = u32::from_le_bytes([q[0], q[1], q[2], q[3]]);
            for _ in 0..2 {
                let w = (q & 0x8000_8000) | ((q >> 4) & 0x07f0_07f0);
                out.push((w as u16, (w >> 16) as u16));
                q <<= 8;
            }
        }
        out
    }

    /// bf16 bits as f64 (subnormals included).
    fn bf(b: u16) -> f64 {
        f64::from(bf16::to_f32(b))
    }

    #[test]
    fn the_kernel_decode_gives_every_e2m1_value_in_word_order() {
        // every pair of codes, in every position of a segment
        for a in 0..16u8 {
            for b in 0..16u8 {
                let vals: Vec<u8> = (0..32).map(|n| (n as u8 * 5 + a * 3 + b) & 0xf).collect();
                let mut stored = vec![0u8; 16];
                e2m1::pack(&vals, &mut stored);
                let words = kernel_fp4_words(&to_device(WFmt::Mxfp4, &stored));
                assert_eq!(words.len(), 16);
                for (w, &(lo, hi)) in words.iter().enumerate() {
                    let want = |n: usize| f64::from(e2m1::decode(vals[n])) * 2f64.powi(-126);
                    assert_eq!(bf(lo), want(2 * w), "word {w} low, codes {vals:?}");
                    assert_eq!(bf(hi), want(2 * w + 1), "word {w} high, codes {vals:?}");
                    // signed zero keeps its sign
                    assert_eq!(lo & 0x8000, u16::from(vals[2 * w] & 8) << 12);
                }
            }
        }
    }

    #[test]
    fn the_kernel_decode_gives_every_e4m3_value_in_word_order() {
        for base in (0..=255u8).step_by(32) {
            let stored: Vec<u8> = (0..32).map(|n| base.wrapping_add(n as u8)).collect();
            let words = kernel_e4m3_words(&to_device(WFmt::Mxfp8E4M3, &stored));
            assert_eq!(words.len(), 16);
            for (w, &(lo, hi)) in words.iter().enumerate() {
                for (n, got) in [(2 * w, lo), (2 * w + 1, hi)] {
                    let c = stored[n];
                    if c & 0x7f == 0x7f {
                        continue; // NaN codes: not values (the loader's concern)
                    }
                    let want = f64::from(MxElem::Fp8E4M3.decode(c)) * 2f64.powi(-120);
                    assert_eq!(bf(got), want, "value {n} code {c:#04x}");
                }
            }
        }
    }
}
