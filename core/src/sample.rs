//! Sampling (MODEL.md 4): greedy argmax with the lowest id on ties, or
//! temperature / top-k / top-p driven by a counter-based RNG keyed by
//! `(request seed, position)`, so a request yields the same tokens on every
//! backend and in every batch layout.

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

/// The uniform draw in `[0, 1)` for `(seed, position)`: a pure function of
/// its key (53 random bits), so every backend and batch order agrees.
pub fn uniform(seed: u64, position: u32) -> f64 {
    let a = mix64(seed ^ 0x6D33_5F73_616D_706C); // "m3_sampl"
    let b = mix64(a.wrapping_add((position as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)));
    (b >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
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

/// Sample one token from `logits` for a row at `position`.
///
/// Order: candidates sorted by logit descending (ties: lower id), truncated
/// to `top_k`; probabilities `softmax(logit / temperature)` in f64 over the
/// kept set; truncated to the shortest prefix whose mass reaches `top_p`;
/// renormalised; the token is the first whose cumulative mass exceeds
/// `uniform(seed, position) * total`.
pub fn sample(logits: &[f32], params: &SampleParams, position: u32) -> u32 {
    if params.is_greedy() || logits.is_empty() {
        return greedy(logits);
    }
    let mut idx: Vec<u32> = (0..logits.len() as u32)
        .filter(|&i| !logits[i as usize].is_nan())
        .collect();
    if idx.is_empty() {
        return 0;
    }
    idx.sort_by(|&a, &b| {
        logits[b as usize]
            .partial_cmp(&logits[a as usize])
            .unwrap_or(core::cmp::Ordering::Equal)
            .then(a.cmp(&b))
    });
    if params.top_k > 0 && params.top_k < idx.len() {
        idx.truncate(params.top_k);
    }
    let t = params.temperature as f64;
    let m = logits[idx[0] as usize] as f64;
    let mut p: Vec<f64> = idx
        .iter()
        .map(|&i| libm_exp((logits[i as usize] as f64 - m) / t))
        .collect();
    let total: f64 = p.iter().sum();
    if params.top_p < 1.0 {
        let target = params.top_p.max(0.0) as f64 * total;
        let mut acc = 0.0;
        let mut keep = p.len();
        for (n, &q) in p.iter().enumerate() {
            acc += q;
            if acc >= target {
                keep = n + 1;
                break;
            }
        }
        p.truncate(keep.max(1));
        idx.truncate(keep.max(1));
    }
    let total: f64 = p.iter().sum();
    let u = uniform(params.seed, position) * total;
    let mut acc = 0.0;
    for (n, &q) in p.iter().enumerate() {
        acc += q;
        if u < acc {
            return idx[n];
        }
    }
    idx[idx.len() - 1]
}

/// `exp` without std: `f64::exp` where std exists, a range-reduced series
/// otherwise (only sampling uses it; bits need not match across builds of
/// different feature sets, only across backends of one build).
#[cfg(feature = "std")]
fn libm_exp(x: f64) -> f64 {
    x.exp()
}

#[cfg(not(feature = "std"))]
fn libm_exp(x: f64) -> f64 {
    if x < -745.0 {
        return 0.0;
    }
    // x = k ln2 + r, |r| <= ln2/2; exp(r) by Taylor to 1e-17.
    let k = (x / core::f64::consts::LN_2 + if x < 0.0 { -0.5 } else { 0.5 }) as i64;
    let r = x - k as f64 * core::f64::consts::LN_2;
    let mut term = 1.0;
    let mut s = 1.0;
    for n in 1..20 {
        term *= r / n as f64;
        s += term;
    }
    let k = k.clamp(-1022, 1023);
    s * f64::from_bits(((k + 1023) as u64) << 52)
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
}
