//! The device layout of weight codes: how MXFP4 / NVFP4 nibbles and MXFP8
//! E4M3 / E5M2 bytes are ordered in device memory, so that the f16
//! tensor-core linear (`s_mmh_linear` in `kernels/standard_decode.cu`) loads
//! a lane's operands in one 16- (32-) byte load per row and turns them into
//! f16 with a few bit operations per four values.
//!
//! The kernel's step is one 32-value MX block of 16 rows as two m16n8k16
//! products: lane `t` of a lane quad supplies values `4t..4t+4` (first
//! product) and `16+4t..16+4t+4` (second) of its two rows. Rows stay
//! contiguous (a row's bytes where the stored layout has them); inside a row,
//! each 128-value chunk (`nb` = 4 blocks, fewer in a row's last chunk when K
//! is not a multiple of 128) is reordered so lane `t`'s share of block `j`
//! sits at slot `nb * t + j`:
//!
//! * **E2M1 (MXFP4, NVFP4)**: slot = 4 bytes; byte `i` holds value
//!   `32j + 4t + i` in bits 2, 3, 4, 7 (mantissa, exponent low, exponent
//!   high, sign: already the E4M3 bits of the value times 2^-6) and value
//!   `32j + 16 + 4t + i` in bits 0, 1, 5, 6 (mantissa, exponent low, sign,
//!   exponent high: two shifts and two masks put them at 2, 3, 7, 4). A
//!   full chunk gives lane `t` bytes `16t..16t+16` of the chunk.
//! * **E4M3, E5M2 (MXFP8, PTPC)**: slot = 8 bytes, values `32j + 4t + i`
//!   then `32j + 16 + 4t + i` (`i` = 0..4), as stored. In a full chunk lane
//!   `t`'s blocks 0, 1 sit at bytes `16t..16t+16` and blocks 2, 3 at
//!   `64+16t..64+16t+16` (slot `j` at `64 (j / 2) + 16 t + 8 (j % 2)`), so
//!   each of its two 16-byte loads is one quarter of 64 contiguous bytes of
//!   its lane quad: two whole 32-byte sectors a row and load (lane `t`'s 32
//!   bytes at `32t` put every load on four sectors, half of each used, and
//!   the other load fetched them again: bench/NOTES.md session 19). A
//!   partial last chunk keeps slot `nb * t + j` at `8 * slot`.
//!
//! E2M1 rows are then **interleaved by 16-row tiles** (the kernel's tile):
//! a matrix is padded to a multiple of 16 rows (zero codes), and inside
//! tile `T` each chunk's pieces (`16 nb` bytes a row) of its 16 rows sit
//! side by side: row `i`'s piece of the chunk at value `c0` at byte
//! `16 T rb + 16 (c0 / 2) + i (16 nb)` (`rb` = bytes a row). A warp's
//! 16-byte loads of rows `g` (then `g + 8`) of a full chunk are then 512
//! contiguous bytes each, and one warp's walk along K reads its tile's
//! quarter as one contiguous run, where row-major E2M1 gave 8 runs of 64
//! bytes a load: on one tall launch the prototype ran MXFP4 at 1 row 7-9
//! points of the ceiling faster this way (bench/NOTES.md session 23). FP8
//! keeps rows contiguous (it read faster row-major there).
//!
//! The stored (checkpoint) layout is FORMATS.md's: E2M1 two a byte, low
//! nibble first; one E4M3 / E5M2 byte a value. bf16 and f32 stay as stored.

use std::borrow::Cow;

use super::WFmt;

/// Values of a row chunk: four 32-value blocks.
const CHUNK: usize = 128;

/// Rows of a device tile: E2M1 matrices are interleaved and padded by these.
pub const TILE_ROWS: usize = 16;

/// Whether `fmt`'s rows are interleaved by tiles (E2M1 codes).
fn tiled(fmt: WFmt) -> bool {
    matches!(fmt, WFmt::Mxfp4 | WFmt::Nvfp4)
}

/// Rows a `rows`-row matrix of `fmt` occupies on the device (E2M1: padded
/// to whole tiles).
pub fn device_rows(fmt: WFmt, rows: usize) -> usize {
    if tiled(fmt) {
        rows.div_ceil(TILE_ROWS) * TILE_ROWS
    } else {
        rows
    }
}

/// Whether `fmt`'s codes are permuted on the device.
pub fn permuted(fmt: WFmt) -> bool {
    matches!(
        fmt,
        WFmt::Mxfp4 | WFmt::Nvfp4 | WFmt::Mxfp8E4M3 | WFmt::Mxfp8E5M2 | WFmt::Ptpc
    )
}

/// E2M1 code `c` (sign, exponent 2 bits, mantissa) as the bits of half 0 of
/// a device byte (2, 3, 4, 7) and of half 1 (0, 1, 5, 6).
const fn e2m1_half(c: u8, half: usize) -> u8 {
    let (m, e0, e1, s) = (c & 1, (c >> 1) & 1, (c >> 2) & 1, (c >> 3) & 1);
    if half == 0 {
        (m << 2) | (e0 << 3) | (e1 << 4) | (s << 7)
    } else {
        m | (e0 << 1) | (s << 5) | (e1 << 6)
    }
}

/// The inverse of [`e2m1_half`] on a whole device byte.
const fn e2m1_unhalf(d: u8, half: usize) -> u8 {
    if half == 0 {
        ((d >> 2) & 1) | (((d >> 3) & 1) << 1) | (((d >> 4) & 1) << 2) | (((d >> 7) & 1) << 3)
    } else {
        (d & 1) | (((d >> 1) & 1) << 1) | (((d >> 6) & 1) << 2) | (((d >> 5) & 1) << 3)
    }
}

/// Where value `v` (`32j + 16 hf + 4t + i` of its chunk) of a `cols`-value
/// row goes as an FP8 byte: its device byte in the row.
fn fp8_byte(v: usize, cols: usize) -> usize {
    let c0 = v / CHUNK * CHUNK;
    let nb = ((cols - c0) / 32).min(4);
    let (j, kk) = ((v - c0) / 32, v % 32);
    let (hf, t, i) = (kk / 16, (kk % 16) / 4, kk % 4);
    let slot = if nb == 4 {
        64 * (j / 2) + 16 * t + 8 * (j % 2)
    } else {
        8 * (nb * t + j)
    };
    c0 + slot + 4 * hf + i
}

/// One row (stored `src` -> device `dst`, or back with `back`).
fn row_map(fmt: WFmt, src: &[u8], dst: &mut [u8], cols: usize, back: bool) {
    let nib = matches!(fmt, WFmt::Mxfp4 | WFmt::Nvfp4);
    if nib {
        // one device byte per (slot, i): its half-0 and half-1 values
        for c0 in (0..cols).step_by(CHUNK) {
            let nb = ((cols - c0) / 32).min(4);
            for j in 0..nb {
                for t in 0..4 {
                    for i in 0..4 {
                        let v0 = c0 + 32 * j + 4 * t + i;
                        let v1 = v0 + 16;
                        let d = c0 / 2 + 4 * (nb * t + j) + i;
                        let (b0, b1) = (v0 / 2, v1 / 2);
                        let (s0, s1) = (4 * (v0 % 2), 4 * (v1 % 2));
                        if back {
                            let x = src[d];
                            dst[b0] |= e2m1_unhalf(x, 0) << s0;
                            dst[b1] |= e2m1_unhalf(x, 1) << s1;
                        } else {
                            let (n0, n1) = ((src[b0] >> s0) & 0xf, (src[b1] >> s1) & 0xf);
                            dst[d] = e2m1_half(n0, 0) | e2m1_half(n1, 1);
                        }
                    }
                }
            }
        }
    } else {
        for v in 0..cols {
            let d = fp8_byte(v, cols);
            if back {
                dst[v] = src[d];
            } else {
                dst[d] = src[v];
            }
        }
    }
}

/// Byte of a tile's interleaved form where row `i`'s byte `b` (of its
/// row-major device form, `cols` values a row) sits: chunk by chunk, the
/// tile's rows side by side.
fn tile_byte(i: usize, b: usize, cols: usize) -> usize {
    let c0 = b / (CHUNK / 2) * CHUNK;
    let piece = ((cols - c0) / 32).min(4) * 16;
    TILE_ROWS * (c0 / 2) + i * piece + (b - c0 / 2)
}

/// One tile: its real rows, row-major (`rows`, `rb` bytes a row), into its
/// interleaved bytes `t`, or back (`back`).
fn tile_one(t: &mut [u8], rows: &mut [u8], rb: usize, cols: usize, back: bool) {
    for (i, r) in rows.chunks_exact_mut(rb).enumerate() {
        for c0 in (0..cols).step_by(CHUNK) {
            let (b0, b1) = (c0 / 2, (c0 / 2 + CHUNK / 2).min(rb));
            let o = tile_byte(i, b0, cols);
            if back {
                r[b0..b1].copy_from_slice(&t[o..o + b1 - b0]);
            } else {
                t[o..o + b1 - b0].copy_from_slice(&r[b0..b1]);
            }
        }
    }
}

/// E2M1: row-major device rows (`rows`, `rb` bytes a row) interleaved tile
/// by tile into `tiles` ([`device_rows`] rows; padding rows stay zero), or
/// back (`back`), a tile a task.
fn tile_map(tiles: &mut [u8], rows: &mut [u8], rb: usize, cols: usize, back: bool) {
    use rayon::prelude::*;
    let tb = TILE_ROWS * rb;
    tiles
        .par_chunks_mut(tb)
        .zip(rows.par_chunks_mut(tb))
        .for_each(|(t, r)| tile_one(t, r, rb, cols, back));
}

/// Apply [`row_map`] to every row of `codes` (`cols` values a row), on
/// every core for large tensors; E2M1 then interleaved by tiles
/// ([`tile_map`]). `rows`: the matrix's real rows (`back` only: the device
/// form holds [`device_rows`]).
fn map_rows(fmt: WFmt, codes: &[u8], cols: usize, rows: usize, back: bool) -> Vec<u8> {
    let rb = if tiled(fmt) { cols / 2 } else { cols };
    if rb == 0 || !codes.len().is_multiple_of(rb) || !cols.is_multiple_of(32) {
        // not whole rows of whole blocks (the loader checks shapes first):
        // left as stored
        return codes.to_vec();
    }
    if !tiled(fmt) {
        return map_rows_plain(fmt, codes, cols, rb, back);
    }
    if back {
        // un-interleave the real rows, then each row to the stored order
        let mut rowwise = vec![0u8; rows * rb];
        let mut t = codes.to_vec();
        tile_map(&mut t, &mut rowwise, rb, cols, true);
        return map_rows_plain(fmt, &rowwise, cols, rb, true);
    }
    let mut rowwise = map_rows_plain(fmt, codes, cols, rb, false);
    let n = rowwise.len() / rb;
    let mut t = vec![0u8; device_rows(fmt, n) * rb];
    tile_map(&mut t, &mut rowwise, rb, cols, false);
    t
}

/// [`row_map`] over every row (`rb` bytes a row).
fn map_rows_plain(fmt: WFmt, codes: &[u8], cols: usize, rb: usize, back: bool) -> Vec<u8> {
    use rayon::prelude::*;
    let mut out = vec![0u8; codes.len()];
    // rows per task: about 1 MiB
    let per = (PAR_BYTES / rb).max(1) * rb;
    out.par_chunks_mut(per)
        .zip(codes.par_chunks(per))
        .for_each(|(d, s)| {
            for (dr, sr) in d.chunks_exact_mut(rb).zip(s.chunks_exact(rb)) {
                row_map(fmt, sr, dr, cols, back);
            }
        });
    out
}

/// Bytes per piece permuted on one thread.
const PAR_BYTES: usize = 1 << 20;

/// `codes` (stored layout, whole rows of `cols` values: one matrix) in
/// the device layout of `fmt` ([`device_rows`] rows); borrowed when the
/// format is not permuted.
pub fn to_device(fmt: WFmt, codes: &[u8], cols: usize) -> Cow<'_, [u8]> {
    if permuted(fmt) {
        Cow::Owned(map_rows(fmt, codes, cols, 0, false))
    } else {
        Cow::Borrowed(codes)
    }
}

/// The inverse of [`to_device`]: one matrix's device codes back in the
/// stored layout, its `rows` real rows.
pub fn from_device(fmt: WFmt, codes: &[u8], cols: usize, rows: usize) -> Cow<'_, [u8]> {
    if permuted(fmt) {
        Cow::Owned(map_rows(fmt, codes, cols, rows, true))
    } else {
        Cow::Borrowed(codes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use m3_core::formats::{e2m1, MxElem};

    fn bytes(n: usize, seed: u32) -> Vec<u8> {
        (0..n)
            .map(|i| ((i as u32).wrapping_mul(2_654_435_761) ^ seed).rotate_left(7) as u8)
            .collect()
    }

    #[test]
    fn round_trips() {
        // full chunks, a partial last chunk (K = 160, 96), several rows
        for cols in [128usize, 160, 96, 512, 32] {
            let c = bytes(3 * cols, 9);
            for f in [
                WFmt::Mxfp4,
                WFmt::Nvfp4,
                WFmt::Mxfp8E4M3,
                WFmt::Mxfp8E5M2,
                WFmt::Ptpc,
                WFmt::Bf16,
            ] {
                let n = if matches!(f, WFmt::Mxfp4 | WFmt::Nvfp4) {
                    3 * cols / 2
                } else {
                    3 * cols
                };
                let d = to_device(f, &c[..n], cols);
                assert_eq!(d.len(), n / 3 * device_rows(f, 3), "{f:?} K {cols}");
                assert_eq!(
                    from_device(f, &d, cols, 3).as_ref(),
                    &c[..n],
                    "{f:?} K {cols}"
                );
                assert_eq!(permuted(f), d.as_ref() != &c[..n], "{f:?} K {cols}");
            }
        }
        // large tensors go through the parallel path (a partial last tile)
        let cols = 6144;
        let big = bytes(700 * cols / 2, 5);
        let d = to_device(WFmt::Mxfp4, &big, cols);
        assert_eq!(d.len(), 704 * cols / 2);
        assert_eq!(
            from_device(WFmt::Mxfp4, &d, cols, 700).as_ref(),
            big.as_slice()
        );
    }

    /// Where the kernel (`s_h_fetch` / the fast walk in
    /// `kernels/standard_decode.cu`) reads lane `t`'s u32 of block `j` of row
    /// `r`'s chunk `q` in an E2M1 matrix: its tile's base, the chunk's 16
    /// pieces (1024 bytes when full), the row's piece, the lane's slot.
    fn kernel_e2m1_word(r: usize, q: usize, j: usize, t: usize, cols: usize) -> usize {
        let rb = cols / 2;
        let nb = ((cols - CHUNK * q) / 32).min(4);
        r / 16 * 16 * rb + q * 1024 + (r % 16) * 16 * nb + 4 * (nb * t + j)
    }

    /// The kernel's E2M1 steps (`s_h_e2m1_lo` / `_hi`), emulated: lane t's
    /// u32 of block j as E4M3 bytes of values 4t..4t+4 and 16+4t..16+4t+4.
    fn kernel_e2m1(q: u32) -> ([u8; 4], [u8; 4]) {
        let lo = q & 0x9c9c_9c9c;
        let hi = ((q << 2) & 0x8c8c_8c8c) | ((q >> 2) & 0x1010_1010);
        (lo.to_le_bytes(), hi.to_le_bytes())
    }

    #[test]
    fn the_kernel_decode_gives_every_e2m1_value_at_its_lane() {
        let e4m3 = |c: u8| f64::from(MxElem::Fp8E4M3.decode(c));
        // whole and partial chunks (K = 96: one of 3 blocks), whole and
        // partial tiles (35 rows: the third holds 3)
        for (cols, rows) in [(128usize, 16usize), (96, 3), (160, 35)] {
            for a in 0..16u8 {
                let vals: Vec<u8> = (0..rows * cols)
                    .map(|n| ((n as u8).wrapping_mul(5) ^ (n / 7) as u8).wrapping_add(a * 3) & 0xf)
                    .collect();
                let mut stored = vec![0u8; rows * cols / 2];
                e2m1::pack(&vals, &mut stored);
                let dev = to_device(WFmt::Mxfp4, &stored, cols);
                assert_eq!(dev.len(), rows.div_ceil(16) * 16 * cols / 2);
                for r in 0..rows {
                    for c0 in (0..cols).step_by(CHUNK) {
                        let nb = ((cols - c0) / 32).min(4);
                        for j in 0..nb {
                            for t in 0..4 {
                                let o = kernel_e2m1_word(r, c0 / CHUNK, j, t, cols);
                                let q = u32::from_le_bytes([
                                    dev[o],
                                    dev[o + 1],
                                    dev[o + 2],
                                    dev[o + 3],
                                ]);
                                let (lo, hi) = kernel_e2m1(q);
                                for i in 0..4 {
                                    let v0 = c0 + 32 * j + 4 * t + i;
                                    let want = |v: usize| {
                                        f64::from(e2m1::decode(vals[r * cols + v])) * 2f64.powi(-6)
                                    };
                                    let at = format!("K {cols} row {r} value {v0}");
                                    assert_eq!(e4m3(lo[i]), want(v0), "{at}");
                                    assert_eq!(e4m3(hi[i]), want(v0 + 16), "{at} + 16");
                                    // signed zero keeps its sign
                                    assert_eq!(lo[i] & 0x80, (vals[r * cols + v0] & 8) << 4);
                                }
                            }
                        }
                    }
                }
                // the padding rows of a partial tile hold zero codes
                let real = rows * cols / 2;
                if dev.len() > real {
                    let last = dev.len() - 16 * cols / 2;
                    for r in rows % 16..16 {
                        for q in 0..cols.div_ceil(CHUNK) {
                            let o = kernel_e2m1_word(last / (cols / 2) + r, q, 0, 0, cols);
                            assert_eq!(&dev[o..o + 4], &[0u8; 4], "padding row {r}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn fp8_lanes_hold_their_values() {
        let cols = 160;
        let stored: Vec<u8> = (0..cols).map(|n| n as u8).collect();
        let dev = to_device(WFmt::Mxfp8E4M3, &stored, cols);
        // chunk 0 full: lane t's blocks 0, 1 at 16t, blocks 2, 3 at 64 + 16t
        for t in 0..4 {
            for j in 0..4 {
                let o = 64 * (j / 2) + 16 * t + 8 * (j % 2);
                for i in 0..4 {
                    assert_eq!(dev[o + i] as usize, 32 * j + 4 * t + i);
                    assert_eq!(dev[o + 4 + i] as usize, 32 * j + 16 + 4 * t + i);
                }
            }
        }
        // chunk 1 holds one block: lane t at 128 + 8t
        for t in 0..4 {
            for i in 0..4 {
                assert_eq!(dev[128 + 8 * t + i] as usize, 128 + 4 * t + i);
            }
        }
    }
}
