//! Sampling (MODEL.md 4): greedy argmax with the lowest id on ties, or
//! temperature / top-k / top-p driven by a counter-based RNG keyed by
//! `(request seed, position)`, so a request yields the same tokens on every
//! backend and in every batch layout.
//!
//! # The definition (normative)
//!
//! Every backend must pick exactly the token this module's [`sample`] picks
//! from the same f32 logits row. The GPU kernel (`m3-gpu`'s
//! `kernels/sample_keyed.cu`) implements the same definition with radix
//! selection instead of a sort ([`radix`] is its CPU emulation). To make that
//! possible without a sort or sequential float sums, all the arithmetic that
//! decides the token is integer arithmetic on *weights*, and the only float
//! arithmetic (one subtraction, one division and [`exp_det`]) is IEEE-754 f64
//! `+ - * /` in a fixed order with no fused multiply-add, which a GPU
//! reproduces bit for bit.
//!
//! For a logits row `l[0..V)` (f32, `V < 2^23`), params
//! `{temperature T, top_k, top_p, seed}` ([`SampleParams`]) and key position
//! `pos`:
//!
//! 1. **Greedy** if `T` is NaN or `T <= 0`: [`greedy`] (argmax, lowest id on
//!    ties, NaN never wins, an all-NaN or empty row gives 0).
//! 2. **Candidates**: the ids whose logit is not NaN, in the order "logit
//!    descending, ties by lower id first". That is the descending order of
//!    the 64-bit key [`sort_key`]`(l_i, i) = (ord(l_i) << 32) | (0xFFFF_FFFF -
//!    i)`, where `ord` ([`order_bits`]) maps f32 bits to a u32 with the same
//!    order as the floats (`b ^ 0x8000_0000` for non-negative, `!b` for
//!    negative), with -0.0 taken as +0.0 so that the two zeros tie and go by
//!    id. No candidate: token 0.
//! 3. **Weights**: `m` = the largest candidate logit. Candidate `i` weighs
//!    [`weight`]`(l_i, m, T)`: `2^40` if `l_i == m` (which covers `m = +inf`
//!    and `m = -inf`), else `floor(exp_det(x) * 2^40)` with
//!    `x = (l_i as f64 - m as f64) / (T as f64)` (`x <= 0`, -0.0 when
//!    `T = +inf`; `x = -inf` or NaN gives 0). [`exp_det`] is this module's deterministic exp; the factor
//!    before the floor is [`relative_weight`].
//! 4. **top_k**: if `0 < top_k < #candidates`, keep only the first `top_k`
//!    candidates in order.
//! 5. **top_p**: if `top_p < 1` (NaN counts as 1, below 0 as 0): `W` = the sum
//!    of the kept weights (u64: `w <= 2^40` and `V < 2^23`, so no overflow),
//!    `p24 = round(top_p as f64 * 2^24)` ([`top_p_units`]),
//!    `target = max(1, ceil(W * p24 / 2^24))` computed exactly
//!    ([`top_p_target`]); keep the shortest prefix (in order) whose
//!    cumulative weight is `>= target`.
//! 6. **Draw**: `W'` = the sum of the kept weights (`>= 2^40`: the first
//!    candidate weighs `2^40`), `U` = [`uniform_bits`]`(seed, pos)` (53
//!    bits), `r = (U * W') >> 53` in u128 ([`draw_point`]; `0 <= r < W'`);
//!    the token is the first kept candidate whose cumulative weight is `> r`.
//!
//! Every candidate's chance is therefore `w_i / W'` up to `2^-53`, which
//! [`crate::sched::spec_probs::sampling_probs`] reports (both go through
//! [`kept_weights`], so they cannot disagree). Relative to a softmax in exact
//! arithmetic the weights are off by `< 2^-40` of the largest weight (the
//! floor) plus `exp_det`'s error (`< 1e-14` relative).

use alloc::vec;
use alloc::vec::Vec;

/// How one request picks its next token.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SampleParams {
    /// 0 (or below) means greedy.
    pub temperature: f32,
    /// Keep the `top_k` most likely tokens; 0 = all.
    pub top_k: usize,
    /// Keep the smallest prefix (by probability, descending) whose mass
    /// reaches `top_p`; 1.0 = all.
    pub top_p: f32,
    /// The request's seed.
    pub seed: u64,
}

impl Default for SampleParams {
    fn default() -> Self {
        SampleParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            seed: 0,
        }
    }
}

impl SampleParams {
    /// Greedy decoding.
    pub const GREEDY: SampleParams = SampleParams {
        temperature: 0.0,
        top_k: 0,
        top_p: 1.0,
        seed: 0,
    };

    pub fn is_greedy(&self) -> bool {
        // NaN temperature is treated as greedy (no randomness from garbage).
        self.temperature.is_nan() || self.temperature <= 0.0
    }
}

/// SplitMix64 finalizer: a bijective 64-bit mixer.
fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The 53 random bits behind [`uniform`] for `(seed, position)`: an integer
/// in `[0, 2^53)`, a pure function of its key (u64 wrapping multiply, xor
/// and shifts only, so a GPU reproduces it exactly).
pub fn uniform_bits(seed: u64, position: u32) -> u64 {
    let a = mix64(seed ^ 0x6D33_5F73_616D_706C); // "m3_sampl"
    let b = mix64(a.wrapping_add((position as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)));
    b >> 11
}

/// The inverse of `x ^ (x >> s)` (`s >= 1`).
fn unxorshift(y: u64, s: u32) -> u64 {
    let mut x = y;
    for _ in 0..64 / s {
        x = y ^ (x >> s);
    }
    x
}

/// The inverse of an odd `m` modulo 2^64 (Newton: each step doubles the
/// correct low bits, 3 are right to start with).
fn inverse_odd(m: u64) -> u64 {
    let mut x = m;
    for _ in 0..5 {
        x = x.wrapping_mul(2u64.wrapping_sub(m.wrapping_mul(x)));
    }
    x
}

/// The inverse of [`mix64`].
fn unmix64(z: u64) -> u64 {
    let z = unxorshift(z, 31).wrapping_mul(inverse_odd(0x94D0_49BB_1331_11EB));
    let z = unxorshift(z, 27).wrapping_mul(inverse_odd(0xBF58_476D_1CE4_E5B9));
    unxorshift(z, 30)
}

/// A seed whose [`uniform_bits`] at `position` are `u53` (`< 2^53`): tests
/// use it to put a draw exactly on a boundary between two tokens (the
/// mixers are bijections, so this inverts them).
#[doc(hidden)]
pub fn seed_for_uniform_bits(u53: u64, position: u32) -> u64 {
    let b = u53 << 11;
    let a = unmix64(b).wrapping_sub((position as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    unmix64(a) ^ 0x6D33_5F73_616D_706C
}

/// The uniform draw in `[0, 1)` for `(seed, position)`:
/// `uniform_bits(seed, position) * 2^-53`, so every backend and batch order
/// agrees.
pub fn uniform(seed: u64, position: u32) -> f64 {
    uniform_bits(seed, position) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// Argmax, lowest id on ties; NaN logits never win.
pub fn greedy(logits: &[f32]) -> u32 {
    let mut best = 0usize;
    let mut bv = f32::NEG_INFINITY;
    let mut found = false;
    for (i, &v) in logits.iter().enumerate() {
        if !v.is_nan() && (!found || v > bv) {
            best = i;
            bv = v;
            found = true;
        }
    }
    best as u32
}

/// The weight of the largest logit, `2^40` (weights are fixed point with 40
/// fractional bits: weight / 2^40 is the unnormalised probability).
pub const WEIGHT_ONE: u64 = 1 << 40;

/// `ord(x)`: the f32's bits as a u32 with the same order as the floats
/// (`b ^ 0x8000_0000` for non-negative, `!b` for negative), -0.0 taken as
/// +0.0. Meaningful for non-NaN `x` only.
pub fn order_bits(x: f32) -> u32 {
    let b = if x == 0.0 { 0 } else { x.to_bits() };
    if b & 0x8000_0000 == 0 {
        b ^ 0x8000_0000
    } else {
        !b
    }
}

/// The inverse of [`order_bits`] (a zero comes back as +0.0).
pub fn from_order_bits(o: u32) -> f32 {
    f32::from_bits(if o & 0x8000_0000 != 0 {
        o ^ 0x8000_0000
    } else {
        !o
    })
}

/// The candidate order's key: `(ord(logit) << 32) | (0xFFFF_FFFF - id)`.
/// Descending keys are logits descending, ties by lower id first; keys of
/// distinct ids differ. Meaningful for non-NaN logits only.
pub fn sort_key(logit: f32, id: u32) -> u64 {
    ((order_bits(logit) as u64) << 32) | (0xFFFF_FFFF - id) as u64
}

/// The token id inside a [`sort_key`].
pub fn key_token(key: u64) -> u32 {
    0xFFFF_FFFF - key as u32
}

/// `log2(e)` rounded to f64 (bits `0x3FF7_1547_652B_82FE`).
pub const LOG2E: f64 = f64::from_bits(0x3FF7_1547_652B_82FE);
/// The high part of `ln 2` (Cody-Waite, 32 significant bits, so `k * LN2_HI`
/// is exact for `|k| < 2^21`; bits `0x3FE6_2E42_FEE0_0000`).
pub const LN2_HI: f64 = f64::from_bits(0x3FE6_2E42_FEE0_0000);
/// `ln 2 - LN2_HI` rounded to f64 (bits `0x3DEA_39EF_3579_3C76`).
pub const LN2_LO: f64 = f64::from_bits(0x3DEA_39EF_3579_3C76);
/// `EXP_DET_COEFFS[n]` = `1/n!` rounded to f64 (the Taylor series of `exp`
/// at 0, degree 13: truncation error `< 5e-18` on `|r| <= 0.35`). Given as
/// bits so that the GPU source can carry the very same constants.
pub const EXP_DET_COEFFS: [f64; 14] = [
    f64::from_bits(0x3FF0_0000_0000_0000),
    f64::from_bits(0x3FF0_0000_0000_0000),
    f64::from_bits(0x3FE0_0000_0000_0000),
    f64::from_bits(0x3FC5_5555_5555_5555),
    f64::from_bits(0x3FA5_5555_5555_5555),
    f64::from_bits(0x3F81_1111_1111_1111),
    f64::from_bits(0x3F56_C16C_16C1_6C17),
    f64::from_bits(0x3F2A_01A0_1A01_A01A),
    f64::from_bits(0x3EFA_01A0_1A01_A01A),
    f64::from_bits(0x3EC7_1DE3_A556_C734),
    f64::from_bits(0x3E92_7E4F_B778_9F5C),
    f64::from_bits(0x3E5A_E645_67F5_44E4),
    f64::from_bits(0x3E21_EED8_EFF8_D898),
    f64::from_bits(0x3DE6_1246_13A8_6D09),
];

/// `2^k` from its bits, for `-1022 <= k <= 1023`.
fn pow2(k: i32) -> f64 {
    f64::from_bits(((k + 1023) as u64) << 52)
}

/// A deterministic `exp` for f64: only IEEE-754 f64 `+ - * /`, comparisons,
/// a truncating f64 -> i32 conversion and powers of two built from bits, in
/// the fixed order below, with no fused multiply-add, so every IEEE machine
/// (a GPU compiled with `--fmad=false` included) gets the same bits. Needs no
/// std.
///
/// - `x` NaN or `x < -745`: 0 (`exp(-745)` is the smallest subnormal).
/// - `x > 709`: +inf (not `exp`, but the sampler only asks for `x <= 0`).
/// - else: `t = x * LOG2E`; `k = trunc(t + (t < 0 ? -0.5 : 0.5))` (round
///   half away from zero of the rounded `t`); `r = (x - k * LN2_HI) -
///   k * LN2_LO`; `p` = Horner over [`EXP_DET_COEFFS`] from degree 13 down
///   (`p = p * r + c`); the result is `p * 2^k`, or for `k < -1022`
///   `(p * 2^(k + 1000)) * 2^-1000` (one rounding into the subnormals).
///
/// Relative error `< 1e-14` against `f64::exp` where the result is normal
/// (tested; measured about 2e-16); for subnormal results, within a few units
/// of `2^-1074`.
pub fn exp_det(x: f64) -> f64 {
    if x.is_nan() || x < -745.0 {
        return 0.0;
    }
    if x > 709.0 {
        return f64::INFINITY;
    }
    let t = x * LOG2E;
    // |t + 0.5| < 1024: the truncating conversion is exact and in range.
    let k = (t + if t < 0.0 { -0.5 } else { 0.5 }) as i32;
    let kf = k as f64;
    let hi = x - kf * LN2_HI;
    let lo = kf * LN2_LO;
    let r = hi - lo;
    let mut p = EXP_DET_COEFFS[13];
    for n in (0..13).rev() {
        p = p * r + EXP_DET_COEFFS[n];
    }
    if k >= -1022 {
        p * pow2(k)
    } else {
        (p * pow2(k + 1000)) * pow2(-1000)
    }
}

/// `exp((l - m) / t)` the deterministic way: 1 when `l == m`, else
/// [`exp_det`]`((l as f64 - m as f64) / t as f64)` (f64 subtraction and
/// division; for a candidate `l` of a row whose largest candidate logit is
/// `m`, at `t > 0`, the quotient is `<= 0`, `-inf` or NaN, the last two
/// giving 0). In `[0, 1]`. The GPU kernel can report these values (its
/// `scratch` output), which a test compares bit for bit.
pub fn relative_weight(l: f32, m: f32, t: f32) -> f64 {
    if l == m {
        return 1.0;
    }
    exp_det((l as f64 - m as f64) / t as f64)
}

/// A candidate's weight: `floor(relative_weight(l, m, t) * 2^40)`, so
/// `2^40` when `l == m`.
pub fn weight(l: f32, m: f32, t: f32) -> u64 {
    // The product is exact (a power-of-two scale) and in [0, 2^40]:
    // truncation is the floor.
    (relative_weight(l, m, t) * WEIGHT_ONE as f64) as u64
}

/// top_p in units of `2^-24`: `None` when top_p does not cut (`top_p >= 1`
/// or NaN), else `Some(round(max(top_p, 0) as f64 * 2^24))` (half away from
/// zero, computed as `trunc(v + 0.5)`, which is exact since `v` carries f32
/// precision).
pub fn top_p_units(top_p: f32) -> Option<u64> {
    if top_p.is_nan() || top_p >= 1.0 {
        return None;
    }
    let p = if top_p > 0.0 { top_p as f64 } else { 0.0 };
    Some((p * (1u64 << 24) as f64 + 0.5) as u64)
}

/// The top_p cut's mass: `max(1, ceil(total * p24 / 2^24))`, exact (u128).
pub fn top_p_target(total: u64, p24: u64) -> u64 {
    let t = (total as u128 * p24 as u128).div_ceil(1 << 24);
    (t as u64).max(1)
}

/// The draw's point in `[0, total)`: `(u53 * total) >> 53`, exact (u128),
/// for `u53 < 2^53` ([`uniform_bits`]).
pub fn draw_point(u53: u64, total: u64) -> u64 {
    ((u53 as u128 * total as u128) >> 53) as u64
}

/// The distribution [`sample`] draws from, as integer weights: the kept
/// candidates' ids in order (steps 2 to 5 of the module doc) and their
/// weights. Greedy params give the argmax alone, and a row without
/// candidates gives id 0 alone (weight [`WEIGHT_ONE`]). A token's
/// probability is its weight over the sum of the weights.
pub fn kept_weights(logits: &[f32], params: &SampleParams) -> (Vec<u32>, Vec<u64>) {
    if params.is_greedy() {
        return (vec![greedy(logits)], vec![WEIGHT_ONE]);
    }
    let mut keys: Vec<u64> = logits
        .iter()
        .enumerate()
        .filter(|(_, l)| !l.is_nan())
        .map(|(i, &l)| sort_key(l, i as u32))
        .collect();
    if keys.is_empty() {
        return (vec![0], vec![WEIGHT_ONE]);
    }
    keys.sort_unstable_by(|a, b| b.cmp(a));
    if params.top_k > 0 && params.top_k < keys.len() {
        keys.truncate(params.top_k);
    }
    let ids: Vec<u32> = keys.iter().map(|&k| key_token(k)).collect();
    let m = logits[ids[0] as usize];
    let t = params.temperature;
    let mut w: Vec<u64> = ids
        .iter()
        .map(|&i| weight(logits[i as usize], m, t))
        .collect();
    let mut ids = ids;
    if let Some(p24) = top_p_units(params.top_p) {
        let total = w.iter().fold(0u64, |a, &x| a.saturating_add(x));
        let target = top_p_target(total, p24);
        let mut acc = 0u64;
        let mut keep = w.len();
        for (n, &x) in w.iter().enumerate() {
            acc = acc.saturating_add(x);
            if acc >= target {
                keep = n + 1;
                break;
            }
        }
        ids.truncate(keep);
        w.truncate(keep);
    }
    (ids, w)
}

/// Step 6: the first id whose cumulative weight exceeds
/// `draw_point(u53, sum of weights)`.
fn draw(ids: &[u32], w: &[u64], u53: u64) -> u32 {
    let total = w.iter().fold(0u64, |a, &x| a.saturating_add(x));
    let r = draw_point(u53, total);
    let mut acc = 0u64;
    for (&id, &x) in ids.iter().zip(w) {
        acc = acc.saturating_add(x);
        if acc > r {
            return id;
        }
    }
    ids.last().copied().unwrap_or(0)
}

/// Sample one token from `logits` for a row at key position `position`,
/// exactly as the module doc defines it (the reference: a sort).
pub fn sample(logits: &[f32], params: &SampleParams, position: u32) -> u32 {
    if params.is_greedy() {
        return greedy(logits);
    }
    let (ids, w) = kept_weights(logits, params);
    draw(&ids, &w, uniform_bits(params.seed, position))
}

/// The GPU kernel's algorithm on the CPU (`m3-gpu`'s
/// `kernels/sample_keyed.cu` does the same passes, one thread block per row):
/// no sort, only passes over the row that build 256-bin histograms.
///
/// Every step of the definition is one *radix select*: the largest key `K*`
/// among the candidates with key `>= lo` such that the mass (a count, or the
/// weights) of the candidates with `lo <= key`, `key >= K*` reaches a
/// threshold. It takes 8 passes over the 64-bit [`sort_key`], most
/// significant 8 bits first: each pass histograms the candidates whose key
/// matches the prefix found so far, and a suffix scan of the 256 bins picks
/// the bin where the running mass (plus the mass of the keys above the
/// prefix) first reaches the threshold. The first pass's bins sum to the
/// total, from which the threshold is computed where it depends on it.
///
/// - A pass that finds the candidate count and `ord` of the largest logit
///   (one reduction each; `m` comes back through [`from_order_bits`]).
/// - top_k active: `K_k` = the select by count with threshold `top_k` (the
///   top_k-th key); the kept candidates are those with key `>= K_k`.
/// - top_p active: `K_p` = the select by weight over keys `>= K_k` with
///   threshold [`top_p_target`]`(W, p24)`, `W` the first pass's total.
/// - Draw: `K_s` = the select by weight over keys `>= max(K_k, K_p)` with
///   threshold [`draw_point`]`(U, W') + 1`, `W'` the first pass's total; the
///   token is [`key_token`]`(K_s)`.
///
/// Equivalence with [`sample`]: in the sorted order, the mass of the keys
/// `>= K` is the prefix sum up to `K`'s place, so "largest key whose suffix
/// mass reaches the threshold" is "first place whose prefix sum reaches it",
/// which is how [`kept_weights`] cuts top_k and top_p and how the draw picks
/// (`> r` is `>= r + 1` in integers). Candidates of weight 0 never end a
/// weighted select (the threshold is at least 1), so they need no special
/// case. `core/tests/sample_props.rs` checks the equivalence on random rows.
pub mod radix {
    use super::*;

    /// The per-element rules the select uses, as data so that the tests can
    /// plant a wrong rule and watch the comparison with [`sample`] fail.
    #[doc(hidden)]
    #[derive(Clone, Copy)]
    pub struct Rules {
        /// The candidate key ([`sort_key`]).
        pub key: fn(f32, u32) -> u64,
        /// A candidate's weight ([`weight`]).
        pub weight: fn(f32, f32, f32) -> u64,
        /// The top_p threshold ([`top_p_target`]).
        pub top_p_target: fn(u64, u64) -> u64,
    }

    /// The rules of the definition.
    #[doc(hidden)]
    pub const RULES: Rules = Rules {
        key: sort_key,
        weight,
        top_p_target,
    };

    /// [`super::sample`] computed the GPU kernel's way (radix selects).
    pub fn sample(logits: &[f32], params: &SampleParams, position: u32) -> u32 {
        sample_with(logits, params, position, &RULES)
    }

    /// [`sample`] with the given rules.
    #[doc(hidden)]
    pub fn sample_with(logits: &[f32], params: &SampleParams, position: u32, rules: &Rules) -> u32 {
        if params.is_greedy() {
            // The kernel leaves greedy rows to the argmax kernel.
            return greedy(logits);
        }
        let (mut n, mut omax) = (0u64, 0u32);
        for &l in logits.iter().filter(|l| !l.is_nan()) {
            n += 1;
            omax = omax.max(order_bits(l));
        }
        if n == 0 {
            return 0;
        }
        let m = from_order_bits(omax);
        let t = params.temperature;
        let top_k = u32::try_from(params.top_k).unwrap_or(u32::MAX) as u64;
        let lo_k = if top_k > 0 && top_k < n {
            select(logits, rules.key, 0, &|_| 1, &|_| top_k)
        } else {
            0
        };
        let w = |l: f32| (rules.weight)(l, m, t);
        let lo_p = match top_p_units(params.top_p) {
            Some(p24) => select(logits, rules.key, lo_k, &w, &|total| {
                (rules.top_p_target)(total, p24)
            }),
            None => lo_k,
        };
        let u = uniform_bits(params.seed, position);
        let ks = select(logits, rules.key, lo_p, &w, &|total| {
            draw_point(u, total) + 1
        });
        key_token(ks)
    }

    /// One radix select (8 passes of 256 bins): the largest key `K*` such
    /// that the mass of the candidates with key `>= max(lo, K*)` reaches
    /// `threshold(total mass of the candidates with key >= lo)`.
    fn select(
        logits: &[f32],
        key: fn(f32, u32) -> u64,
        lo: u64,
        mass: &dyn Fn(f32) -> u64,
        threshold: &dyn Fn(u64) -> u64,
    ) -> u64 {
        let (mut prefix, mut mask, mut above, mut thr) = (0u64, 0u64, 0u64, 0u64);
        for pass in 0..8 {
            let shift = 56 - 8 * pass;
            let mut hist = [0u64; 256];
            for (i, &l) in logits.iter().enumerate() {
                if l.is_nan() {
                    continue;
                }
                let k = key(l, i as u32);
                if k >= lo && k & mask == prefix {
                    hist[((k >> shift) & 0xFF) as usize] += mass(l);
                }
            }
            if pass == 0 {
                thr = threshold(hist.iter().sum());
            }
            // Bins from the top: the first where the running mass reaches
            // the threshold (the kernel does this with a parallel suffix
            // scan; one bin satisfies `S(d) >= thr > S(d + 1)`).
            let mut d = 0;
            for b in (0..256).rev() {
                if above + hist[b] >= thr {
                    d = b;
                    break;
                }
                above += hist[b];
            }
            prefix |= (d as u64) << shift;
            mask |= 0xFF << shift;
        }
        prefix
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_ties_go_to_lowest_id() {
        assert_eq!(greedy(&[1.0, 3.0, 3.0, 2.0]), 1);
        assert_eq!(greedy(&[f32::NAN, -1.0, -1.0]), 1);
    }

    #[test]
    fn sampling_is_keyed_and_respects_top_k() {
        let logits = [0.0f32, 1.0, 2.0, 3.0, 2.5];
        let p = SampleParams {
            temperature: 1.0,
            top_k: 2,
            top_p: 1.0,
            seed: 7,
        };
        let mut seen = [0usize; 5];
        for pos in 0..400 {
            let a = sample(&logits, &p, pos);
            assert_eq!(a, sample(&logits, &p, pos), "same key, same token");
            seen[a as usize] += 1;
        }
        // Only the two best (ids 3 and 4) may ever be drawn, both are.
        assert_eq!(seen[0] + seen[1] + seen[2], 0);
        assert!(seen[3] > 0 && seen[4] > 0);
        // e^3 / (e^3 + e^2.5) = 0.6225: the draw frequency tracks it.
        let f = seen[3] as f64 / 400.0;
        assert!((f - 0.6225).abs() < 0.08, "frequency {f}");
    }

    #[test]
    fn tiny_top_p_is_greedy() {
        let logits = [0.0f32, 5.0, 4.9];
        let p = SampleParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 0.01,
            seed: 1,
        };
        for pos in 0..50 {
            assert_eq!(sample(&logits, &p, pos), 1);
        }
    }

    #[test]
    fn uniform_is_in_range_and_varies() {
        let a = uniform(1, 0);
        let b = uniform(1, 1);
        let c = uniform(2, 0);
        assert!((0.0..1.0).contains(&a) && a != b && a != c);
    }

    /// `uniform` keeps its values from before `uniform_bits` existed (the
    /// formula of that version, written out).
    #[test]
    fn uniform_is_unchanged() {
        for (seed, pos) in [(0u64, 0u32), (1, 0), (7, 123), (u64::MAX, u32::MAX)] {
            let a = mix64(seed ^ 0x6D33_5F73_616D_706C);
            let b = mix64(a.wrapping_add((pos as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)));
            let old = (b >> 11) as f64 * (1.0 / (1u64 << 53) as f64);
            assert_eq!(uniform(seed, pos).to_bits(), old.to_bits());
            assert!(uniform_bits(seed, pos) < 1 << 53);
        }
    }

    #[test]
    fn seeds_for_chosen_draws() {
        for (u, pos) in [
            (0u64, 0u32),
            (1, 5),
            (1 << 50, 77),
            ((1 << 53) - 1, u32::MAX),
        ] {
            assert_eq!(uniform_bits(seed_for_uniform_bits(u, pos), pos), u);
        }
    }

    /// A draw exactly on a boundary takes the next token (`cum > r`): eight
    /// -inf logits weigh 2^40 each, `W' = 2^43`, so `r = U >> 10`.
    #[test]
    fn draw_boundaries_are_strict() {
        let l = [f32::NEG_INFINITY; 8];
        for c in 0..8u64 {
            for (u, want) in [(c << 50, c), ((c << 50).wrapping_sub(1), c.wrapping_sub(1))] {
                if u >= 1 << 53 {
                    continue;
                }
                let p = SampleParams {
                    temperature: 1.0,
                    top_k: 0,
                    top_p: 1.0,
                    seed: seed_for_uniform_bits(u, 3),
                };
                assert_eq!(sample(&l, &p, 3) as u64, want, "U = {u:#x}");
                assert_eq!(radix::sample(&l, &p, 3) as u64, want, "U = {u:#x}");
            }
        }
    }

    #[test]
    fn top_p_over_zeros_keeps_the_prefix() {
        // Eight tied zeros (either sign), W = 8 * 2^40, top_p 0.6: the target
        // 4.8 * 2^40 needs five of them, by id.
        let l = [-0.0f32, 0.0, -0.0, 0.0, -0.0, 0.0, -0.0, 0.0];
        let p = SampleParams {
            temperature: 0.5,
            top_k: 0,
            top_p: 0.6,
            seed: 1,
        };
        assert_eq!(
            kept_weights(&l, &p),
            (vec![0, 1, 2, 3, 4], vec![WEIGHT_ONE; 5])
        );
    }

    #[test]
    fn exp_constants_are_what_they_claim() {
        let mut fact = 1u64;
        for (n, &c) in EXP_DET_COEFFS.iter().enumerate() {
            if n > 0 {
                fact *= n as u64;
            }
            // n! <= 13! < 2^53 is exact, so this is 1/n! correctly rounded.
            assert_eq!(c.to_bits(), (1.0 / fact as f64).to_bits(), "1/{n}!");
        }
        assert_eq!(LOG2E, core::f64::consts::LOG2_E);
        assert_eq!(LN2_HI.to_bits() & 0x1F_FFFF, 0, "32 significant bits");
        assert!((LN2_HI + LN2_LO - core::f64::consts::LN_2).abs() < 1e-25);
    }

    #[cfg(feature = "std")]
    #[test]
    fn exp_det_is_accurate() {
        let mut worst = 0f64;
        let n = 2_000_000;
        for j in 0..=n {
            // A dense grid over [-745, 0] plus a sweep near 0.
            for x in [-745.0 * j as f64 / n as f64, -(j as f64) * 1e-7] {
                let (got, want) = (exp_det(x), x.exp());
                if want >= f64::MIN_POSITIVE {
                    let rel = ((got - want) / want).abs();
                    worst = worst.max(rel);
                    assert!(rel < 1e-14, "exp_det({x}) = {got:e}, exp = {want:e}");
                } else {
                    let err = (got - want).abs();
                    assert!(err <= 4.0 * 5e-324 + 1e-14 * want, "subnormal exp_det({x})");
                }
            }
        }
        assert!(worst < 1e-15, "worst relative error {worst:e}");
        assert_eq!(exp_det(0.0), 1.0);
        assert_eq!(exp_det(-0.0), 1.0);
        assert_eq!(exp_det(f64::NEG_INFINITY), 0.0);
        assert_eq!(exp_det(f64::NAN), 0.0);
        assert_eq!(exp_det(-745.5), 0.0);
        assert!(exp_det(-745.0) > 0.0);
        assert_eq!(exp_det(710.0), f64::INFINITY);
        assert!((exp_det(1.0) - core::f64::consts::E).abs() < 1e-15);
    }

    #[test]
    fn keys_order_like_the_floats() {
        let xs = [
            f32::NEG_INFINITY,
            -3.0e38,
            -1.0,
            -1.0e-45,
            0.0,
            1.0e-45,
            1.0,
            3.0e38,
            f32::INFINITY,
        ];
        for w in xs.windows(2) {
            assert!(order_bits(w[0]) < order_bits(w[1]), "{} < {}", w[0], w[1]);
        }
        assert_eq!(order_bits(-0.0), order_bits(0.0));
        for &x in &xs {
            assert_eq!(from_order_bits(order_bits(x)), x);
        }
        // Ties by id: the lower id has the larger key.
        assert!(sort_key(1.0, 3) > sort_key(1.0, 4));
        assert!(sort_key(-0.0, 4) > sort_key(0.0, 5));
        assert_eq!(key_token(sort_key(2.0, 77)), 77);
    }

    #[test]
    fn weights_follow_the_definition() {
        assert_eq!(weight(3.0, 3.0, 0.5), WEIGHT_ONE);
        assert_eq!(weight(-0.0, 0.0, 0.5), WEIGHT_ONE);
        assert_eq!(weight(f32::INFINITY, f32::INFINITY, 1.0), WEIGHT_ONE);
        assert_eq!(weight(1.0, f32::INFINITY, 1.0), 0);
        assert_eq!(weight(f32::NEG_INFINITY, 1.0, 1.0), 0);
        assert_eq!(weight(f32::NEG_INFINITY, 1.0, f32::INFINITY), 0);
        assert_eq!(
            weight(f32::NEG_INFINITY, f32::NEG_INFINITY, 1.0),
            WEIGHT_ONE
        );
        assert_eq!(weight(-1.0, 1.0, f32::INFINITY), WEIGHT_ONE);
        assert_eq!(weight(0.0, 1.0, 1e-45), 0);
        // floor(e^-1 * 2^40)
        let want = (0.367_879_441_171_442_33 * WEIGHT_ONE as f64) as u64;
        assert!(weight(0.0, 1.0, 1.0).abs_diff(want) <= 1);
    }

    #[test]
    fn top_p_arithmetic() {
        assert_eq!(top_p_units(1.0), None);
        assert_eq!(top_p_units(f32::NAN), None);
        assert_eq!(top_p_units(2.0), None);
        assert_eq!(top_p_units(0.0), Some(0));
        assert_eq!(top_p_units(-3.0), Some(0));
        assert_eq!(top_p_units(0.5), Some(1 << 23));
        assert_eq!(top_p_units(1e-30), Some(0));
        assert_eq!(top_p_units(0.999_999_94), Some((1 << 24) - 1));
        assert_eq!(top_p_target(1 << 41, 1 << 23), 1 << 40);
        assert_eq!(top_p_target(3, 1 << 23), 2);
        assert_eq!(top_p_target(1 << 40, 0), 1);
        let big = (1u64 << 63) - 1;
        assert_eq!(top_p_target(big, (1 << 24) - 1), big - (big >> 24));
        assert_eq!(draw_point(0, 12345), 0);
        assert_eq!(draw_point((1 << 53) - 1, 1 << 40), (1 << 40) - 1);
    }

    #[test]
    fn greedy_params_and_degenerate_rows() {
        let l = [0.5f32, 2.0, 2.0, f32::NAN];
        for t in [0.0, -1.0, f32::NAN] {
            let p = SampleParams {
                temperature: t,
                ..SampleParams::default()
            };
            assert_eq!(sample(&l, &p, 3), 1);
            assert_eq!(radix::sample(&l, &p, 3), 1);
            assert_eq!(kept_weights(&l, &p), (vec![1], vec![WEIGHT_ONE]));
        }
        let p = SampleParams {
            temperature: 1.0,
            ..SampleParams::default()
        };
        assert_eq!(sample(&[], &p, 0), 0);
        assert_eq!(sample(&[f32::NAN, f32::NAN], &p, 0), 0);
        assert_eq!(radix::sample(&[f32::NAN, f32::NAN], &p, 0), 0);
        // +inf dominates: only the +inf logits can be drawn, by id.
        let l = [1.0, f32::INFINITY, 3.0, f32::INFINITY];
        let (ids, w) = kept_weights(&l, &p);
        assert_eq!(ids, vec![1, 3, 2, 0]);
        assert_eq!(w, vec![WEIGHT_ONE, WEIGHT_ONE, 0, 0]);
    }

    #[test]
    fn top_p_half_of_two_ties_keeps_one() {
        // W = 2^41, p24 = 2^23: target 2^40, reached by the first alone.
        let l = [f32::NEG_INFINITY, 4.0, 4.0];
        let p = SampleParams {
            temperature: 0.7,
            top_k: 0,
            top_p: 0.5,
            seed: 9,
        };
        assert_eq!(kept_weights(&l, &p), (vec![1], vec![WEIGHT_ONE]));
        for pos in 0..64 {
            assert_eq!(sample(&l, &p, pos), 1);
            assert_eq!(radix::sample(&l, &p, pos), 1);
        }
    }
}
