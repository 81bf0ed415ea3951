//! The sampling distribution as a probability vector, for the speculative
//! verifiers (rejection and block verification need `p_t` and `p_d` rows).

use alloc::vec;
use alloc::vec::Vec;

use super::request::SamplingParams;
use crate::sample::greedy;

/// The sampling distribution of `sample` (MODEL.md 4) as a probability
/// vector over the vocabulary: one-hot on the argmax for greedy params,
/// else `softmax(logits / temperature)` over the top-k, cut to the top-p
/// prefix, renormalised (zeros elsewhere). It is exactly the distribution
/// `crate::sample::sample` draws from, which the rejection and block
/// verifiers need for the target's rows.
pub fn sampling_probs(logits: &[f32], params: &SamplingParams) -> Vec<f32> {
    let mut out = vec![0.0f32; logits.len()];
    if logits.is_empty() {
        return out;
    }
    if params.is_greedy() {
        out[greedy(logits) as usize] = 1.0;
        return out;
    }
    let mut idx: Vec<u32> = (0..logits.len() as u32)
        .filter(|&i| !logits[i as usize].is_nan())
        .collect();
    if idx.is_empty() {
        out[0] = 1.0;
        return out;
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
    let t = f64::from(params.temperature);
    let m = f64::from(logits[idx[0] as usize]);
    let mut p: Vec<f64> = idx
        .iter()
        .map(|&i| exp((f64::from(logits[i as usize]) - m) / t))
        .collect();
    let total: f64 = p.iter().sum();
    if params.top_p < 1.0 {
        let target = f64::from(params.top_p.max(0.0)) * total;
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
    for (&i, &q) in idx.iter().zip(&p) {
        out[i as usize] = (q / total) as f32;
    }
    out
}

#[cfg(feature = "std")]
fn exp(x: f64) -> f64 {
    x.exp()
}

#[cfg(not(feature = "std"))]
fn exp(x: f64) -> f64 {
    // Same series as the sampler's no_std fallback.
    if x < -745.0 {
        return 0.0;
    }
    let k = (x / core::f64::consts::LN_2 + if x < 0.0 { -0.5 } else { 0.5 }) as i64;
    let r = x - k as f64 * core::f64::consts::LN_2;
    let (mut term, mut s) = (1.0, 1.0);
    for n in 1..20 {
        term *= r / n as f64;
        s += term;
    }
    s * f64::from_bits(((k.clamp(-1022, 1023) + 1023) as u64) << 52)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sample::sample;

    /// `sample` draws from exactly this distribution: the empirical
    /// frequencies over many keyed draws match it, and tokens outside its
    /// support are never drawn.
    #[test]
    fn matches_the_sampler() {
        let logits = [0.5f32, 2.0, 1.0, -1.0, 1.9, 0.0];
        for (top_k, top_p) in [(0, 1.0), (3, 1.0), (0, 0.6)] {
            let params = SamplingParams {
                temperature: 0.8,
                top_k,
                top_p,
                seed: 11,
            };
            let p = sampling_probs(&logits, &params);
            assert!((p.iter().sum::<f32>() - 1.0).abs() < 1e-5);
            let n = 20_000;
            let mut seen = [0usize; 6];
            for pos in 0..n {
                seen[sample(&logits, &params, pos) as usize] += 1;
            }
            for t in 0..6 {
                let f = seen[t] as f32 / n as f32;
                assert!(
                    (f - p[t]).abs() < 0.015,
                    "top_k {top_k} top_p {top_p} token {t}: freq {f} vs p {}",
                    p[t]
                );
                if p[t] == 0.0 {
                    assert_eq!(seen[t], 0);
                }
            }
        }
        let g = sampling_probs(&logits, &SamplingParams::default());
        assert_eq!(g, vec![0.0, 1.0, 0.0, 0.0, 0.0, 0.0]);
    }
}
