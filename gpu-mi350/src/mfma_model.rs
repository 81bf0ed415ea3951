//! A CPU model of the CDNA4 (gfx950) matrix instructions that
//! `kernels/mfma_mx.cu` uses, and an emulation of that file's two linears
//! driven through the model with the kernel's data layout. Host-only; it
//! proves the kernels' layout and numerics without AMD hardware, which has
//! never run them.
//!
//! The instructions, as the AMD CDNA4 ISA guide and LLVM's AMDGPU backend
//! (`llvm.amdgcn.mfma.scale.f32.{16x16x128,32x32x64}.f8f6f4`, clang's
//! `__builtin_amdgcn_mfma_scale_f32_*_f8f6f4(a, b, c, cbsz, blgp, opsel_a,
//! scale_a, opsel_b, scale_b)`) document them:
//!
//! - `D = C + sum_k (A[i][k] * 2^(sa - 127)) * (B[k][j] * 2^(sb - 127))`,
//!   A `M x K`, B `K x N`, f32 C / D, M = N = 16 (K = 128) or 32 (K = 64).
//! - A's codes have the format `cbsz`, B's `blgp` ([`OpFmt`]: 0 E4M3, 1
//!   E5M2, 2 E2M3, 3 E3M2, 4 E2M1; OCP encodings, not gfx942's FNUZ). A
//!   lane's 32 values are packed from bit 0 of its first operand register
//!   up: one byte each (FP8), 6 bits each (FP6, 6 registers), one nibble
//!   each, low nibble first (FP4, 4 registers: FORMATS.md's packing).
//! - Lane `l` holds the 32 consecutive K values `32 (l / mn) ..` of row
//!   `l % mn` of A (column of B) ([`operand_lane`]): one MX block, whose
//!   E8M0 scale is byte `opsel` of the lane's 32-bit scale register
//!   ([`scale_value`]). 0xFF is NaN.
//! - D's register `r` of lane `l` is element ([`acc_lane`]) `(4 (l / 16) + r,
//!   l % 16)` (16 x 16) or `(8 (r / 4) + 4 (l / 32) + r % 4, l % 32)`
//!   (32 x 32), the usual MFMA output layout.
//! - `v_mfma_f32_16x16x32_bf16` (the E4M3 x bf16 linear): 8 bf16 a lane,
//!   lane `l` holds K values `8 (l / 16) ..` of row `l % 16`; D as above.
//!
//! What is bit-exact here: the decode of every code of every operand format,
//! the scale bytes and their selection, and the register layout of A, B and
//! C. What the ISA does not specify to the bit is how the hardware rounds
//! the sum inside one instruction; this model adds the products of each
//! 32-value block exactly (integers), scales each block exactly, adds the
//! blocks in f64 in K order, rounds once to f32 and adds C with one f32
//! rounding. For FP4 / FP6 / E4M3 operands the block sums are exact, so
//! the only difference from any other order is f32 rounding; the tests
//! compare with cpu-ref under the f32 summation bound they state.

use m3_core::formats::{bf16, e2m1, fp8};

/// Lanes of a wave64.
pub const LANES: usize = 64;

/// Operand formats of the scaled MFMA: the `cbsz` (A) / `blgp` (B) codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpFmt {
    /// FP8 E4M3 (OCP: NaN = 0x7F / 0xFF, no Inf, max 448).
    E4M3 = 0,
    /// BF8 E5M2 (OCP: Inf 0x7C, NaN 0x7D-0x7F).
    E5M2 = 1,
    /// FP6 E2M3 (bias 1, max 7.5, no Inf / NaN).
    E2M3 = 2,
    /// BF6 E3M2 (bias 3, max 28, no Inf / NaN).
    E3M2 = 3,
    /// FP4 E2M1 (bias 1, max 6).
    E2M1 = 4,
}

impl OpFmt {
    /// The format of a `cbsz` / `blgp` field (5 to 7 are not formats).
    pub fn from_code(c: u32) -> Option<Self> {
        Some(match c {
            0 => OpFmt::E4M3,
            1 => OpFmt::E5M2,
            2 => OpFmt::E2M3,
            3 => OpFmt::E3M2,
            4 => OpFmt::E2M1,
            _ => return None,
        })
    }

    /// Bits per code.
    pub const fn bits(self) -> usize {
        match self {
            OpFmt::E4M3 | OpFmt::E5M2 => 8,
            OpFmt::E2M3 | OpFmt::E3M2 => 6,
            OpFmt::E2M1 => 4,
        }
    }

    /// The exact value of `code` (NaN / Inf where the format has them).
    pub fn decode(self, code: u32) -> f64 {
        match self {
            OpFmt::E4M3 => f64::from(fp8::e4m3::decode(code as u8)),
            OpFmt::E5M2 => f64::from(fp8::e5m2::decode(code as u8)),
            OpFmt::E2M1 => f64::from(e2m1::decode((code & 0xf) as u8)),
            OpFmt::E2M3 => minifloat(code & 0x3f, 2, 3, 1),
            OpFmt::E3M2 => minifloat(code & 0x3f, 3, 2, 3),
        }
    }

    /// The value of `code` times 2^16, an integer for every format (the
    /// smallest magnitude of any, E5M2's subnormal, is 2^-16); None for NaN
    /// / Inf.
    fn fixed16(self, code: u32) -> Option<i128> {
        let v = self.decode(code);
        if !v.is_finite() {
            return None;
        }
        let f = v * 65536.0;
        debug_assert_eq!(f, f.trunc());
        Some(f as i128)
    }
}

/// A sign + `e` exponent bits + `m` mantissa bits float without Inf / NaN
/// (the OCP FP6 formats).
fn minifloat(code: u32, e: u32, m: u32, bias: i32) -> f64 {
    let sign = if code >> (e + m) & 1 == 1 { -1.0 } else { 1.0 };
    let ex = (code >> m) & ((1 << e) - 1);
    let man = f64::from(code & ((1 << m) - 1));
    let scale = f64::from(1u32 << m);
    let v = if ex == 0 {
        man / scale * 2f64.powi(1 - bias)
    } else {
        (1.0 + man / scale) * 2f64.powi(ex as i32 - bias)
    };
    sign * v
}

/// Instruction shapes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// `v_mfma_scale_f32_16x16x128_f8f6f4`.
    Scale16x16x128,
    /// `v_mfma_scale_f32_32x32x64_f8f6f4`.
    Scale32x32x64,
    /// `v_mfma_f32_16x16x32_bf16` (no scales).
    Bf16x16x16x32,
}

impl Shape {
    /// M = N.
    pub const fn mn(self) -> usize {
        match self {
            Shape::Scale32x32x64 => 32,
            _ => 16,
        }
    }
    pub const fn k(self) -> usize {
        match self {
            Shape::Scale16x16x128 => 128,
            Shape::Scale32x32x64 => 64,
            Shape::Bf16x16x16x32 => 32,
        }
    }
    /// Consecutive K values a lane holds.
    pub const fn k_per_lane(self) -> usize {
        match self {
            Shape::Bf16x16x16x32 => 8,
            _ => 32,
        }
    }
    /// f32 accumulator registers a lane holds.
    pub const fn acc_regs(self) -> usize {
        self.mn() * self.mn() / LANES
    }
}

/// The operand lane layout, A and B alike: lane `lane` holds row `.0` of A
/// (column `.0` of B), K values `.1 .. .1 + k_per_lane` in register order.
/// The one definition the model and `kernels/mfma_mx.cu` follow.
pub const fn operand_lane(shape: Shape, lane: usize) -> (usize, usize) {
    (lane % shape.mn(), (lane / shape.mn()) * shape.k_per_lane())
}

/// The accumulator layout: register `reg` of lane `lane` is D[.0][.1]
/// (row of A, column of B).
pub const fn acc_lane(shape: Shape, lane: usize, reg: usize) -> (usize, usize) {
    match shape {
        Shape::Scale32x32x64 => (8 * (reg / 4) + 4 * (lane / 32) + reg % 4, lane % 32),
        _ => (4 * (lane / 16) + reg, lane % 16),
    }
}

/// Code of value `e` (0..32) of a lane's operand registers in format `f`:
/// bits `[e * bits, (e + 1) * bits)` of the registers read as one
/// little-endian integer (register 0 lowest).
pub fn lane_code(f: OpFmt, regs: &[u32; 8], e: usize) -> u32 {
    let b = f.bits();
    let bit = e * b;
    let lo = u64::from(regs[bit / 32]) | (u64::from(*regs.get(bit / 32 + 1).unwrap_or(&0)) << 32);
    ((lo >> (bit % 32)) & ((1u64 << b) - 1)) as u32
}

/// Byte `opsel` of a lane's scale register as its E8M0 exponent (None for
/// 0xFF, NaN).
pub fn scale_exp(reg: u32, opsel: u32) -> Option<i32> {
    let c = (reg >> (8 * (opsel & 3))) & 0xff;
    (c != 0xff).then_some(c as i32 - 127)
}

/// [`scale_exp`] as a value (NaN for 0xFF; 0x00 is 2^-127).
pub fn scale_value(reg: u32, opsel: u32) -> f64 {
    scale_exp(reg, opsel).map_or(f64::NAN, |e| 2f64.powi(e))
}

/// One wave's accumulators: `[lane][reg]` (only `acc_regs` used).
pub type Acc = [[f32; 16]; LANES];

/// Model of `v_mfma_scale_f32_{16x16x128,32x32x64}_f8f6f4`: `a[lane]` /
/// `b[lane]` the operand registers, `sa[lane]` / `sb[lane]` the scale
/// registers (byte `opsel_*` used), `c` the accumulators in.
#[allow(clippy::too_many_arguments)]
pub fn mfma_scale(
    shape: Shape,
    cbsz: u32,
    blgp: u32,
    a: &[[u32; 8]; LANES],
    b: &[[u32; 8]; LANES],
    c: &Acc,
    opsel_a: u32,
    sa: &[u32; LANES],
    opsel_b: u32,
    sb: &[u32; LANES],
) -> Acc {
    assert!(shape != Shape::Bf16x16x16x32, "not a scaled shape");
    let fa = OpFmt::from_code(cbsz).expect("cbsz: not a format");
    let fb = OpFmt::from_code(blgp).expect("blgp: not a format");
    let (mn, kl) = (shape.mn(), shape.k_per_lane());
    let groups = shape.k() / kl;
    // D[i][j] for every element, then scattered to the lanes
    let mut d = vec![0.0f32; mn * mn];
    for i in 0..mn {
        for j in 0..mn {
            let mut sum = 0.0f64;
            let mut nan = false;
            for g in 0..groups {
                // lanes holding row i of A / column j of B for K group g
                let (la, lb) = (i + mn * g, j + mn * g);
                debug_assert_eq!(operand_lane(shape, la), (i, g * kl));
                debug_assert_eq!(operand_lane(shape, lb), (j, g * kl));
                let (ea, eb) = (scale_exp(sa[la], opsel_a), scale_exp(sb[lb], opsel_b));
                let mut block: i128 = 0;
                for e in 0..kl {
                    let x = fa.fixed16(lane_code(fa, &a[la], e));
                    let y = fb.fixed16(lane_code(fb, &b[lb], e));
                    match (x, y) {
                        (Some(x), Some(y)) => block += x * y,
                        _ => nan = true, // NaN or Inf (E5M2) operand
                    }
                }
                match (ea, eb) {
                    // block * 2^-32 * 2^ea * 2^eb; exact in f64 while the
                    // block sum has <= 53 significant bits
                    (Some(ea), Some(eb)) => sum += block as f64 * 2f64.powi(ea + eb - 32),
                    _ => nan = true,
                }
            }
            d[i * mn + j] = if nan { f32::NAN } else { sum as f32 };
        }
    }
    let mut out = *c;
    for (lane, o) in out.iter_mut().enumerate() {
        for (reg, v) in o.iter_mut().enumerate().take(shape.acc_regs()) {
            let (i, j) = acc_lane(shape, lane, reg);
            *v += d[i * mn + j];
        }
    }
    out
}

/// Model of `v_mfma_f32_16x16x32_bf16`: `a[lane]` / `b[lane]` 8 bf16 each.
pub fn mfma_bf16_16x16x32(a: &[[u16; 8]; LANES], b: &[[u16; 8]; LANES], c: &Acc) -> Acc {
    let shape = Shape::Bf16x16x16x32;
    let (mn, kl) = (shape.mn(), shape.k_per_lane());
    let mut d = vec![0.0f32; mn * mn];
    for i in 0..mn {
        for j in 0..mn {
            let mut sum = 0.0f64; // bf16 x bf16 is exact in f64
            for g in 0..shape.k() / kl {
                let (la, lb) = (i + mn * g, j + mn * g);
                for e in 0..kl {
                    sum += f64::from(bf16::to_f32(a[la][e])) * f64::from(bf16::to_f32(b[lb][e]));
                }
            }
            d[i * mn + j] = sum as f32;
        }
    }
    let mut out = *c;
    for (lane, o) in out.iter_mut().enumerate() {
        for (reg, v) in o.iter_mut().enumerate().take(shape.acc_regs()) {
            let (i, j) = acc_lane(shape, lane, reg);
            *v += d[i * mn + j];
        }
    }
    out
}

/// `mx_e4m3_to_bf16` of `kernels/mfma_mx.cu`, step for step.
pub fn e4m3_to_bf16(c: u32) -> u16 {
    let sign = (c & 0x80) << 8;
    let mag = c & 0x7f;
    let b = if mag == 0x7f {
        sign | 0x7fc0
    } else if mag >= 8 {
        sign | ((mag + (120 << 3)) << 4)
    } else if mag == 0 {
        sign
    } else {
        let top = 31 - mag.leading_zeros();
        sign | ((127 - 9 + top) << 7) | ((mag << (7 - top)) & 0x7f)
    };
    b as u16
}

/// The kernels' tiling (`MX_WAVES`, `MX_TILE`, `MX_BLOCK` of
/// `kernels/mfma_mx.cu`, checked against it by a test).
pub const WAVES: usize = 4;
pub const TILE: usize = 16;
pub const BLOCK: usize = 256;
/// E8M0 2^0: the scale of lanes past K.
pub const SCALE_ONE: u32 = 127;

/// Errors to plant in the emulation, so a test shows it would catch them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plant {
    None,
    /// The weight scale byte of one lane is off by one (x2).
    ScaleByte {
        lane: usize,
    },
    /// Row and K group of the operand lanes swapped (`l % 4`, `l / 4`).
    SwapLanes,
    /// The weight's FP4 nibbles read high first (on both operands alike the
    /// error would cancel: it permutes K the same way in x and W).
    NibbleOrder,
    /// The accumulator read back as if it were D^T.
    TransposedAcc,
}

fn operand_lane_planted(shape: Shape, lane: usize, plant: Plant) -> (usize, usize) {
    if plant == Plant::SwapLanes {
        let groups = LANES / shape.mn();
        (lane / groups, (lane % groups) * shape.k_per_lane())
    } else {
        operand_lane(shape, lane)
    }
}

fn acc_lane_planted(shape: Shape, lane: usize, reg: usize, plant: Plant) -> (usize, usize) {
    let (i, j) = acc_lane(shape, lane, reg);
    if plant == Plant::TransposedAcc {
        (j, i)
    } else {
        (i, j)
    }
}

fn swap_nibbles(q: u32) -> u32 {
    ((q & 0x0f0f_0f0f) << 4) | ((q >> 4) & 0x0f0f_0f0f)
}

/// Add the waves' tiles in wave order (f32) and store `y` `[m, n]`, as
/// `mx_reduce_store` does.
#[allow(clippy::too_many_arguments)]
fn reduce_store(
    shape: Shape,
    accs: &[Acc; WAVES],
    m0: usize,
    n0: usize,
    m: usize,
    n: usize,
    plant: Plant,
    y: &mut [f32],
) {
    let mut red = [[0.0f32; TILE * TILE]; WAVES];
    for (w, acc) in accs.iter().enumerate() {
        for (lane, regs) in acc.iter().enumerate() {
            for (reg, &v) in regs.iter().enumerate().take(shape.acc_regs()) {
                let (tok, ch) = acc_lane_planted(shape, lane, reg, plant);
                red[w][tok * TILE + ch] = v;
            }
        }
    }
    for t in 0..BLOCK {
        let mut s = red[0][t];
        for r in &red[1..] {
            s += r[t];
        }
        let (tok, ch) = (m0 + t / TILE, n0 + t % TILE);
        if tok < m && ch < n {
            y[tok * n + ch] = s;
        }
    }
}

/// `m3x_mfma_fp4_a4` emulated through [`mfma_scale`]: `xq` `[m, k/2]` /
/// `xs` `[m, k/32]` the MXFP4 activations, `w` `[n, k/2]` / `ws`
/// `[n, k/32]` the MXFP4 weight (stored layout), `y` `[m, n]` f32.
#[allow(clippy::too_many_arguments)]
pub fn linear_fp4_a4(
    xq: &[u8],
    xs: &[u8],
    w: &[u8],
    ws: &[u8],
    m: usize,
    n: usize,
    k: usize,
    plant: Plant,
) -> Vec<f32> {
    assert!(k.is_multiple_of(32) && k > 0);
    let shape = Shape::Scale16x16x128;
    let (kb, steps) = (k / 32, k.div_ceil(128));
    let mut y = vec![0.0f32; m * n];
    // one 16-byte block of row `row` (or zeros), as a lane's registers
    let load = |codes: &[u8], row: usize, rows: usize, blk: usize, weight: bool| -> [u32; 8] {
        let mut r = [0u32; 8];
        if row < rows && blk < kb {
            let base = row * (k / 2) + 16 * blk;
            for (q, c) in r.iter_mut().zip(codes[base..base + 16].chunks_exact(4)) {
                *q = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                if weight && plant == Plant::NibbleOrder {
                    *q = swap_nibbles(*q);
                }
            }
        }
        r
    };
    let scale = |s: &[u8], row: usize, rows: usize, blk: usize| -> u32 {
        if row < rows && blk < kb {
            u32::from(s[row * kb + blk])
        } else {
            SCALE_ONE
        }
    };
    for m0 in (0..m).step_by(TILE) {
        for n0 in (0..n).step_by(TILE) {
            let mut accs = [[[0.0f32; 16]; LANES]; WAVES];
            for (wave, acc) in accs.iter_mut().enumerate() {
                for s in (wave..steps).step_by(WAVES) {
                    let mut a = [[0u32; 8]; LANES];
                    let mut b = [[0u32; 8]; LANES];
                    let (mut sa, mut sb) = ([0u32; LANES], [0u32; LANES]);
                    for lane in 0..LANES {
                        let (r, k0) = operand_lane_planted(shape, lane, plant);
                        let blk = (s * 128 + k0) / 32;
                        a[lane] = load(xq, m0 + r, m, blk, false);
                        b[lane] = load(w, n0 + r, n, blk, true);
                        sa[lane] = scale(xs, m0 + r, m, blk);
                        sb[lane] = scale(ws, n0 + r, n, blk);
                        if plant == (Plant::ScaleByte { lane }) && n0 + r < n && blk < kb {
                            sb[lane] = (sb[lane] + 1) & 0xff;
                        }
                    }
                    *acc = mfma_scale(shape, 4, 4, &a, &b, acc, 0, &sa, 0, &sb);
                }
            }
            reduce_store(shape, &accs, m0, n0, m, n, plant, &mut y);
        }
    }
    y
}

/// `m3x_mfma_e4m3_bf16` emulated through [`mfma_bf16_16x16x32`]: `x`
/// `[m, k]` bf16 bits, `w` `[n, k]` E4M3 / `ws` `[n, k/32]` (stored
/// layout), `y` `[m, n]` f32.
#[allow(clippy::too_many_arguments)]
pub fn linear_e4m3_bf16(
    x: &[u16],
    w: &[u8],
    ws: &[u8],
    m: usize,
    n: usize,
    k: usize,
    plant: Plant,
) -> Vec<f32> {
    assert!(k.is_multiple_of(32) && k > 0);
    let shape = Shape::Bf16x16x16x32;
    let kb = k / 32;
    let mut y = vec![0.0f32; m * n];
    let zero = [[0.0f32; 16]; LANES];
    for m0 in (0..m).step_by(TILE) {
        for n0 in (0..n).step_by(TILE) {
            let mut accs = [[[0.0f32; 16]; LANES]; WAVES];
            for (wave, acc) in accs.iter_mut().enumerate() {
                for blk in (wave..kb).step_by(WAVES) {
                    let mut a = [[0u16; 8]; LANES];
                    let mut b = [[0u16; 8]; LANES];
                    let mut sc = [1.0f32; LANES];
                    for lane in 0..LANES {
                        let (r, k0) = operand_lane_planted(shape, lane, plant);
                        let kk = 32 * blk + k0;
                        if m0 + r < m {
                            a[lane].copy_from_slice(&x[(m0 + r) * k + kk..(m0 + r) * k + kk + 8]);
                        }
                        if n0 + r < n {
                            for (e, o) in b[lane].iter_mut().enumerate() {
                                *o = e4m3_to_bf16(u32::from(w[(n0 + r) * k + kk + e]));
                            }
                            let mut s = u32::from(ws[(n0 + r) * kb + blk]);
                            if plant == (Plant::ScaleByte { lane }) {
                                s = (s + 1) & 0xff;
                            }
                            sc[lane] = scale_value(s, 0) as f32;
                        }
                    }
                    let p = mfma_bf16_16x16x32(&a, &b, &zero);
                    for lane in 0..LANES {
                        for i in 0..4 {
                            // the kernel's acc[i] += p[i] * sc: p * 2^e is exact
                            // (no f32 under/overflow), so fused or not is the same
                            acc[lane][i] += p[lane][i] * sc[lane];
                        }
                    }
                }
            }
            reduce_store(shape, &accs, m0, n0, m, n, plant, &mut y);
        }
    }
    y
}

#[cfg(test)]
mod tests {
    use super::*;
    use m3_core::formats::MxElem;

    #[test]
    fn decode_matches_m3_core_for_every_code() {
        for c in 0..256u32 {
            let same = |a: f64, b: f32| (a.is_nan() && b.is_nan()) || a == f64::from(b);
            assert!(same(OpFmt::E4M3.decode(c), MxElem::Fp8E4M3.decode(c as u8)));
            assert!(same(OpFmt::E5M2.decode(c), MxElem::Fp8E5M2.decode(c as u8)));
            if c < 16 {
                assert_eq!(OpFmt::E2M1.decode(c), f64::from(e2m1::decode(c as u8)));
            }
        }
        // FP6: the OCP extremes and a subnormal
        assert_eq!(OpFmt::E2M3.decode(0x1f), 7.5);
        assert_eq!(OpFmt::E2M3.decode(0x01), 0.125);
        assert_eq!(OpFmt::E2M3.decode(0x3f), -7.5);
        assert_eq!(OpFmt::E3M2.decode(0x1f), 28.0);
        assert_eq!(OpFmt::E3M2.decode(0x01), 0.0625);
        assert_eq!(OpFmt::E3M2.decode(0x04), 0.25);
        for f in [0, 1, 2, 3, 4] {
            assert_eq!(OpFmt::from_code(f).unwrap() as u32, f);
        }
        assert!(OpFmt::from_code(5).is_none());
    }

    #[test]
    fn kernel_e4m3_to_bf16_is_exact_for_every_code() {
        for c in 0..256u32 {
            let want = MxElem::Fp8E4M3.decode(c as u8);
            let got = bf16::to_f32(e4m3_to_bf16(c));
            if want.is_nan() {
                assert!(got.is_nan(), "{c:#x}");
            } else {
                assert_eq!(got.to_bits(), want.to_bits(), "{c:#x}");
            }
        }
    }

    #[test]
    fn lane_codes_unpack_each_format() {
        let regs = [
            0x7654_3210,
            0xfedc_ba98,
            0x0403_0201,
            0x0807_0605,
            0,
            0,
            0,
            0xff00_0000,
        ];
        // FP4: low nibble first
        for e in 0..16 {
            assert_eq!(lane_code(OpFmt::E2M1, &regs, e), e as u32);
        }
        assert_eq!(lane_code(OpFmt::E4M3, &regs, 0), 0x10);
        assert_eq!(lane_code(OpFmt::E4M3, &regs, 9), 0x02);
        assert_eq!(lane_code(OpFmt::E4M3, &regs, 31), 0xff);
        // FP6: 6-bit fields across register boundaries (bits 30..36)
        let mut r6 = [0u32; 8];
        r6[0] = 0b11 << 30;
        r6[1] = 0b1010;
        assert_eq!(lane_code(OpFmt::E2M3, &r6, 5), 0b10_1011);
    }

    #[test]
    fn layouts_cover_each_element_once() {
        for shape in [
            Shape::Scale16x16x128,
            Shape::Scale32x32x64,
            Shape::Bf16x16x16x32,
        ] {
            let mn = shape.mn();
            let mut seen = vec![0u32; mn * mn];
            for lane in 0..LANES {
                for reg in 0..shape.acc_regs() {
                    let (i, j) = acc_lane(shape, lane, reg);
                    seen[i * mn + j] += 1;
                }
            }
            assert!(seen.iter().all(|&s| s == 1), "{shape:?}");
            let mut ks = vec![0u32; mn * shape.k()];
            for lane in 0..LANES {
                let (r, k0) = operand_lane(shape, lane);
                for e in 0..shape.k_per_lane() {
                    ks[r * shape.k() + k0 + e] += 1;
                }
            }
            assert!(ks.iter().all(|&s| s == 1), "{shape:?}");
        }
    }

    /// One nonzero product lands at the element the layout functions name,
    /// scaled by both E8M0 bytes that op_sel picks.
    #[test]
    fn one_product_lands_where_the_layout_says() {
        for shape in [Shape::Scale16x16x128, Shape::Scale32x32x64] {
            let mn = shape.mn();
            for (i, j, kk) in [(0, 0, 0), (3, 7, 45), (mn - 1, 1, shape.k() - 1)] {
                let mut a = [[0u32; 8]; LANES];
                let mut b = [[0u32; 8]; LANES];
                let (g, e) = (kk / 32, kk % 32);
                // FP8 E4M3: 1.5 = 0x3c, 2.0 = 0x40
                a[i + mn * g][e / 4] = 0x3c << (8 * (e % 4));
                b[j + mn * g][e / 4] = 0x40 << (8 * (e % 4));
                let mut sa = [0x7f7f_7f7fu32; LANES];
                let mut sb = [0x7f7f_7f7fu32; LANES];
                sa[i + mn * g] = 0x7f80_7f7f; // byte 2 = 2^1
                sb[j + mn * g] = 0x7f7f_7d7f; // byte 1 = 2^-2
                let c = [[1.0f32; 16]; LANES];
                let d = mfma_scale(shape, 0, 0, &a, &b, &c, 2, &sa, 1, &sb);
                for (lane, regs) in d.iter().enumerate() {
                    for (reg, &v) in regs.iter().enumerate().take(shape.acc_regs()) {
                        let want = if acc_lane(shape, lane, reg) == (i, j) {
                            1.0 + 1.5 * 2.0 * 2.0 * 0.25
                        } else {
                            1.0
                        };
                        assert_eq!(v, want, "{shape:?} lane {lane} reg {reg}");
                    }
                }
            }
        }
    }

    #[test]
    fn nan_scale_and_nan_codes_give_nan() {
        let shape = Shape::Scale16x16x128;
        let a = [[0x3838_3838u32; 8]; LANES];
        let b = a;
        let ones = [0x7fu32; LANES];
        let mut sa = ones;
        sa[0] = 0xff; // row 0 of A, K group 0
        let d = mfma_scale(shape, 0, 0, &a, &b, &[[0.0; 16]; LANES], 0, &sa, 0, &ones);
        for (lane, regs) in d.iter().enumerate() {
            for (reg, &v) in regs.iter().enumerate().take(4) {
                assert_eq!(v.is_nan(), acc_lane(shape, lane, reg).0 == 0);
            }
        }
        let mut b2 = b;
        b2[5][0] = 0x7f; // E4M3 NaN in column 5
        let d = mfma_scale(
            shape,
            0,
            0,
            &a,
            &b2,
            &[[0.0; 16]; LANES],
            0,
            &ones,
            0,
            &ones,
        );
        assert!(d[5][0].is_nan() && !d[6][0].is_nan());
        assert_eq!(scale_value(0x00, 0), 2f64.powi(-127));
    }
}
