//! A counter-based deterministic RNG: every value is a pure function of
//! `(seed, tensor name, element index)`.
//!
//! Why counter-based: a tensor can be generated in any order, in pieces
//! (row chunks), or regenerated (e.g. for a second pass), and the bytes are
//! the same on every run and machine. The integer mixer is SplitMix64; the
//! normal deviates use Box-Muller in f64 with our own `ln` / `sin` / `cos`
//! built only from IEEE basic operations (+ - * / sqrt, all correctly
//! rounded), so no platform libm can change a single bit.

/// SplitMix64 finalizer: a bijective 64-bit mixer.
const fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The SplitMix64 increment (the golden ratio in 64-bit fixed point).
const GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;

/// FNV-1a over the name bytes: stable across Rust versions (unlike `Hash`).
fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The stream of one tensor: a 64-bit key from `(seed, name)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stream {
    key: u64,
}

impl Stream {
    /// The stream of tensor `name` under `seed`.
    pub fn new(seed: u64, name: &str) -> Self {
        Stream {
            key: mix64(mix64(seed ^ GAMMA).wrapping_add(fnv1a64(name.as_bytes()))),
        }
    }

    /// The `i`-th 64-bit word of the stream.
    pub fn word(&self, i: u64) -> u64 {
        mix64(self.key.wrapping_add(i.wrapping_add(1).wrapping_mul(GAMMA)))
    }

    /// Uniform in (0, 1]: `(k + 1) / 2^53`, never 0 (safe for `ln`).
    fn open_unit(&self, i: u64) -> f64 {
        ((self.word(i) >> 11) + 1) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in [0, 1): `k / 2^53`.
    fn half_open_unit(&self, i: u64) -> f64 {
        (self.word(i) >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// The `i`-th standard normal deviate (Box-Muller: pair `i / 2` uses
    /// words `2 (i/2)` and `2 (i/2) + 1`; even `i` takes the cosine, odd the
    /// sine).
    pub fn normal(&self, i: u64) -> f64 {
        let (c, s) = self.normal_pair(i / 2);
        if i.is_multiple_of(2) {
            c
        } else {
            s
        }
    }

    /// The Box-Muller pair `(normal(2 p), normal(2 p + 1))`.
    pub fn normal_pair(&self, p: u64) -> (f64, f64) {
        let u1 = self.open_unit(2 * p);
        let u2 = self.half_open_unit(2 * p + 1);
        let r = (-2.0 * ln(u1)).sqrt();
        let (s, c) = sincos_turns(u2);
        (r * c, r * s)
    }

    /// Fill `out` with `std * normal(start + j)` rounded to f32 (each
    /// Box-Muller pair computed once; equal to calling `normal` per element).
    pub fn fill_normal(&self, start: u64, std: f64, out: &mut [f32]) {
        let mut j = 0;
        if !start.is_multiple_of(2) && !out.is_empty() {
            out[0] = (std * self.normal(start)) as f32;
            j = 1;
        }
        while j + 1 < out.len() {
            let (a, b) = self.normal_pair((start + j as u64) / 2);
            out[j] = (std * a) as f32;
            out[j + 1] = (std * b) as f32;
            j += 2;
        }
        if j < out.len() {
            out[j] = (std * self.normal(start + j as u64)) as f32;
        }
    }
}

/// `1/(2k+1)` for k = 0..=10: the atanh series of `ln`. Computed at compile
/// time with IEEE division, so the same bits everywhere.
const LN_COEF: [f64; 11] = {
    let mut c = [0.0; 11];
    let mut k = 0;
    while k < 11 {
        c[k] = 1.0 / (2 * k + 1) as f64;
        k += 1;
    }
    c
};

/// Terms of the sin / cos series.
const SC_TERMS: usize = 8;
/// `1/((2k+2)(2k+3))`: sin's nested factors.
const SIN_COEF: [f64; SC_TERMS] = {
    let mut c = [0.0; SC_TERMS];
    let mut k = 0;
    while k < SC_TERMS {
        c[k] = 1.0 / ((2 * k + 2) * (2 * k + 3)) as f64;
        k += 1;
    }
    c
};
/// `1/((2k+1)(2k+2))`: cos's nested factors.
const COS_COEF: [f64; SC_TERMS] = {
    let mut c = [0.0; SC_TERMS];
    let mut k = 0;
    while k < SC_TERMS {
        c[k] = 1.0 / ((2 * k + 1) * (2 * k + 2)) as f64;
        k += 1;
    }
    c
};

/// ln 2 split in two parts so `e * LN2_HI` is exact for |e| < 2^11.
const LN2_HI: f64 = f64::from_bits(0x3fe6_2e42_fee0_0000);
const LN2_LO: f64 = f64::from_bits(0x3dea_39ef_3579_3c76);

/// Natural log of a positive normal f64, from basic operations only:
/// `x = m 2^e` with `m` in [sqrt(1/2), sqrt(2)), `ln m = 2 atanh(s)`,
/// `s = (m - 1) / (m + 1)`, |s| < 0.172, series to s^21 (error < 1e-17).
fn ln(x: f64) -> f64 {
    let bits = x.to_bits();
    let mut e = ((bits >> 52) & 0x7ff) as i64 - 1023;
    let mut m = f64::from_bits((bits & 0x000f_ffff_ffff_ffff) | 0x3ff0_0000_0000_0000);
    if m > core::f64::consts::SQRT_2 {
        m *= 0.5;
        e += 1;
    }
    let s = (m - 1.0) / (m + 1.0);
    let s2 = s * s;
    // Horner over odd terms 1/(2k+1), k = 10 .. 0 (s^23 < 3e-18).
    let mut acc = 0.0;
    for c in LN_COEF.iter().rev() {
        acc = acc * s2 + c;
    }
    let ln_m = 2.0 * s * acc;
    let ef = e as f64;
    ef * LN2_HI + (ef * LN2_LO + ln_m)
}

/// `(sin, cos)` of `2 pi t` for t in [0, 1), from basic operations only.
/// The quadrant comes from `4 t` exactly (t is a multiple of 2^-53), the
/// remaining angle is folded to [0, pi/4] and summed by Taylor series.
fn sincos_turns(t: f64) -> (f64, f64) {
    let q4 = t * 4.0; // exact
    let quadrant = q4 as u32 & 3; // floor, t >= 0
    let f = q4 - (q4 as u32) as f64; // in [0, 1), exact
                                     // Angle within the quadrant: f * pi/2; fold at pi/4 to keep the series short.
    let (fold, g) = if f > 0.5 { (true, 1.0 - f) } else { (false, f) };
    let x = g * core::f64::consts::FRAC_PI_2;
    let (mut s, mut c) = sincos_small(x);
    if fold {
        core::mem::swap(&mut s, &mut c);
    }
    match quadrant {
        0 => (s, c),
        1 => (c, -s),
        2 => (-s, -c),
        _ => (-c, s),
    }
}

/// Taylor series of sin and cos for |x| <= pi/4 (terms to x^17: error < 1e-17).
fn sincos_small(x: f64) -> (f64, f64) {
    let x2 = x * x;
    let mut sin_acc = 0.0;
    let mut cos_acc = 0.0;
    // sin x = x (1 - x2/(2*3) (1 - x2/(4*5) (1 - ...))), likewise cos with
    // 1/(1*2), 1/(3*4), ...; innermost term first.
    for k in (0..SC_TERMS).rev() {
        sin_acc = 1.0 - x2 * SIN_COEF[k] * sin_acc;
        cos_acc = 1.0 - x2 * COS_COEF[k] * cos_acc;
    }
    (x * sin_acc, cos_acc)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ln_matches_std_closely() {
        let mut worst = 0.0f64;
        for i in 1..20_000u64 {
            let x = i as f64 / 20_000.0;
            let x = x * x * x; // stress small values too
            let err = (ln(x) - x.ln()).abs() / x.ln().abs().max(1e-300);
            worst = worst.max(err);
        }
        assert!(worst < 1e-14, "ln relative error {worst}");
        assert!((ln(1.0)).abs() < 1e-300);
        let tiny = 1.0 / (1u64 << 53) as f64;
        assert!((ln(tiny) - tiny.ln()).abs() < 1e-13);
    }

    #[test]
    fn sincos_matches_std_closely() {
        let mut worst = 0.0f64;
        for i in 0..40_000u64 {
            let t = i as f64 / 40_000.0;
            let (s, c) = sincos_turns(t);
            let a = 2.0 * core::f64::consts::PI * t;
            worst = worst.max((s - a.sin()).abs()).max((c - a.cos()).abs());
        }
        assert!(worst < 1e-14, "sin/cos abs error {worst}");
    }

    #[test]
    fn normals_have_unit_moments_and_differ_by_name_and_seed() {
        let st = Stream::new(7, "a.weight");
        let n = 200_000u64;
        let (mut m1, mut m2, mut m4) = (0.0, 0.0, 0.0);
        for i in 0..n {
            let z = st.normal(i);
            m1 += z;
            m2 += z * z;
            m4 += z * z * z * z;
        }
        let nf = n as f64;
        let (m1, m2, m4) = (m1 / nf, m2 / nf, m4 / nf);
        assert!(m1.abs() < 0.01, "mean {m1}");
        assert!((m2 - 1.0).abs() < 0.02, "variance {m2}");
        assert!((m4 - 3.0).abs() < 0.1, "kurtosis {m4}");
        assert_ne!(Stream::new(7, "a.weight"), Stream::new(7, "b.weight"));
        assert_ne!(Stream::new(7, "a.weight"), Stream::new(8, "a.weight"));
        assert_eq!(Stream::new(7, "a.weight").normal(5), st.normal(5));
        // Filling from any start and length equals element-wise draws.
        for (start, len) in [(0u64, 7usize), (3, 6), (5, 1), (4, 0)] {
            let mut v = vec![0.0f32; len];
            st.fill_normal(start, 0.5, &mut v);
            let want: Vec<f32> = (0..len)
                .map(|j| (0.5 * st.normal(start + j as u64)) as f32)
                .collect();
            assert_eq!(v, want, "start {start} len {len}");
        }
    }

    #[test]
    fn known_words_are_stable() {
        // SplitMix64 from state 0 gives 0xe220a8397b1dcdaf as its first
        // output (the published reference sequence); `word` is that mixer.
        assert_eq!(mix64(GAMMA), 0xe220_a839_7b1d_cdaf);
    }
}
