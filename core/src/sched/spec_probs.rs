//! The sampling distribution as a probability vector, for the speculative
//! verifiers (rejection and block verification need `p_t` and `p_d` rows).

use alloc::vec;
use alloc::vec::Vec;

use super::request::SamplingParams;
use crate::sample::kept_weights;

/// The sampling distribution of `sample` (MODEL.md 4) as a probability
/// vector over the vocabulary: one-hot on the argmax for greedy params, else
/// `w_i / W'` (f64 division, stored as f32) on the kept candidates, `w_i`
/// their integer weights and `W'` the sum of them, and 0 elsewhere. Both this
/// and `crate::sample::sample` are built on `crate::sample::kept_weights`, so
/// this is exactly the distribution `sample` draws from (up to the 2^-53
/// resolution of its uniform), which the rejection and block verifiers need
/// for the target's rows. An empty row gives an empty vector; a row with no
/// candidate (all NaN) is one-hot on token 0, the token `sample` returns.
pub fn sampling_probs(logits: &[f32], params: &SamplingParams) -> Vec<f32> {
    let mut out = vec![0.0f32; logits.len()];
    if logits.is_empty() {
        return out;
    }
    let (ids, w) = kept_weights(logits, params);
    let total = w.iter().fold(0u64, |a, &x| a.saturating_add(x)) as f64;
    for (&i, &x) in ids.iter().zip(&w) {
        if let Some(o) = out.get_mut(i as usize) {
            *o = (x as f64 / total) as f32;
        }
    }
    out
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

    /// The probabilities are the kept weights over their sum, exactly.
    #[test]
    fn is_the_kept_weights_normalised() {
        let logits = [0.5f32, 2.0, f32::NAN, -1.0, 2.0, f32::NEG_INFINITY];
        let params = SamplingParams {
            temperature: 0.6,
            top_k: 4,
            top_p: 0.9,
            seed: 3,
        };
        let (ids, w) = crate::sample::kept_weights(&logits, &params);
        let total: u64 = w.iter().sum();
        let p = sampling_probs(&logits, &params);
        for (t, &q) in p.iter().enumerate() {
            let want = ids
                .iter()
                .position(|&i| i as usize == t)
                .map_or(0.0, |n| (w[n] as f64 / total as f64) as f32);
            assert_eq!(q.to_bits(), want.to_bits(), "token {t}");
        }
        assert_eq!(sampling_probs(&[], &params), Vec::<f32>::new());
        assert_eq!(sampling_probs(&[f32::NAN; 3], &params), vec![1.0, 0.0, 0.0]);
    }
}
