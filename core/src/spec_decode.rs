//! Speculative decoding verification (MODEL.md 6) as pure functions over
//! probability vectors.
//!
//! A draft proposed `K` tokens `x_1..x_K` after the committed context; the
//! target scored `K + 1` rows (the last committed token and the `K` drafts),
//! giving its next-token distributions `p_t(. | x^0) .. p_t(. | x^K)`. Each
//! verifier returns how many draft tokens are accepted and the tokens to
//! commit: the accepted drafts followed by one token from the target
//! (a correction at the first rejection, or a bonus token after a fully
//! accepted draft), so every verify commits between 1 and `K + 1` tokens.
//!
//! Layouts: `draft_probs` is `K` rows of `vocab` (`p_d(. | x^{i})` for
//! `i < K`, the distribution `x_{i+1}` was drawn from); `target_probs` is
//! `K + 1` rows of `vocab`. Rows need not be normalised (they are divided by
//! their sums where a distribution is sampled). Random numbers come from a
//! [`UniformSource`] so the caller keys them (e.g. by request seed and
//! position) and the result does not depend on the batch layout.
//!
//! ## Block verification (Sun et al., "Block Verification Accelerates
//! Speculative Decoding", arXiv 2403.10444)
//!
//! Per-token verification decides each token on its own; block verification
//! carries a weight `p_i` along the drafted path and decides the accepted
//! length jointly:
//!
//! ```text
//! p_0 = 1
//! p_i = min(1, p_{i-1} * p_t(x_i | x^{i-1}) / p_d(x_i | x^{i-1}))        i = 1..K
//! s_i = sum_x max(0, p_i * p_t(x | x^i) - p_d(x | x^i))                  i < K
//! h_i = s_i / (s_i + 1 - p_i)   for i < K  (0 when s_i = 0),   h_K = p_K
//! draw eta_1..eta_K ~ U(0,1) independently
//! tau = the largest i with eta_i <= h_i, or 0 if none
//! commit x_1..x_tau, then one token from
//!   p_t(. | x^K)                                   if tau = K
//!   norm(max(0, p_tau * p_t(. | x^tau) - p_d(. | x^tau)))   otherwise
//! ```
//!
//! With `K = 1` this is exactly per-token rejection sampling. The paper
//! proves the output is distributed as the target's and the expected accepted
//! length is optimal among verifiers that see only the drafted path's
//! probabilities, hence never below per-token verification. (Our tests check
//! the paper's worked example, 11/9 tokens against 10/9, exactly, and the
//! output distribution by chi-square.) When `s_i = 0` the residual at `i` is
//! empty, so stopping there must be impossible: `h_i = 0`. If rounding ever
//! leaves an all-zero residual where one is sampled, the target row itself
//! is sampled instead.

use alloc::vec::Vec;

/// Source of uniform random numbers in `[0, 1)`.
pub trait UniformSource {
    fn next_uniform(&mut self) -> f64;
}

/// SplitMix64: a small, fast, seedable generator (tests and tools; the
/// engine keys its own counter-based RNG by (seed, position)).
#[derive(Clone, Debug)]
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

impl UniformSource for SplitMix64 {
    fn next_uniform(&mut self) -> f64 {
        // 53 random mantissa bits.
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// Result of verifying one draft.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// Draft tokens accepted (a prefix of the draft).
    pub accepted: usize,
    /// Tokens to commit: the accepted drafts, then the target's token.
    pub tokens: Vec<u32>,
}

/// Shapes that do not match `K` drafts and `K + 1` target rows.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    #[error("speculative verify: {what} has {got} entries, expected {expected}")]
    Shape {
        what: &'static str,
        got: usize,
        expected: usize,
    },
    #[error("speculative verify: draft token {token} is outside the vocabulary ({vocab})")]
    TokenOutOfRange { token: u32, vocab: usize },
    #[error("speculative verify: a target distribution has no positive mass")]
    EmptyDistribution,
}

/// Greedy verification: accept the longest draft prefix equal to the
/// target's argmax tokens (`target_argmax[i]` is the argmax after the
/// committed context plus `i` drafts), then append the target's token at the
/// first mismatch (or the bonus token). Identical to plain greedy decoding.
pub fn verify_greedy(draft: &[u32], target_argmax: &[u32]) -> Result<Verdict, SpecError> {
    if target_argmax.len() != draft.len() + 1 {
        return Err(SpecError::Shape {
            what: "target_argmax",
            got: target_argmax.len(),
            expected: draft.len() + 1,
        });
    }
    let accepted = draft
        .iter()
        .zip(target_argmax)
        .take_while(|(d, t)| d == t)
        .count();
    let mut tokens = draft[..accepted].to_vec();
    tokens.push(target_argmax[accepted]);
    Ok(Verdict { accepted, tokens })
}

/// Sample an index from the (unnormalised, non-negative) weights `w` with
/// the uniform `u`: inverse CDF in index order, f64 sums. `None` if the
/// weights have no positive mass.
pub fn sample_index(w: &[f64], u: f64) -> Option<usize> {
    let total: f64 = w.iter().filter(|x| **x > 0.0).sum();
    if total <= 0.0 || !total.is_finite() {
        return None;
    }
    let target = u * total;
    let mut acc = 0.0;
    let mut last = None;
    for (i, &x) in w.iter().enumerate() {
        if x > 0.0 {
            acc += x;
            last = Some(i);
            if target < acc {
                return Some(i);
            }
        }
    }
    last
}

fn row(probs: &[f32], vocab: usize, i: usize) -> &[f32] {
    &probs[i * vocab..(i + 1) * vocab]
}

fn sample_row(p: &[f32], u: f64) -> Result<u32, SpecError> {
    let w: Vec<f64> = p.iter().map(|&x| f64::from(x)).collect();
    sample_index(&w, u)
        .map(|i| i as u32)
        .ok_or(SpecError::EmptyDistribution)
}

/// Sample from `norm(max(0, scale * p_t - p_d))`, falling back to `p_t`.
fn sample_residual(pt: &[f32], pd: &[f32], scale: f64, u: f64) -> Result<u32, SpecError> {
    let w: Vec<f64> = pt
        .iter()
        .zip(pd)
        .map(|(&t, &d)| (scale * f64::from(t) - f64::from(d)).max(0.0))
        .collect();
    match sample_index(&w, u) {
        Some(i) => Ok(i as u32),
        None => sample_row(pt, u),
    }
}

fn check(
    draft: &[u32],
    draft_probs: &[f32],
    target_probs: &[f32],
    vocab: usize,
) -> Result<(), SpecError> {
    let k = draft.len();
    if draft_probs.len() != k * vocab {
        return Err(SpecError::Shape {
            what: "draft_probs",
            got: draft_probs.len(),
            expected: k * vocab,
        });
    }
    if target_probs.len() != (k + 1) * vocab {
        return Err(SpecError::Shape {
            what: "target_probs",
            got: target_probs.len(),
            expected: (k + 1) * vocab,
        });
    }
    if let Some(&token) = draft.iter().find(|&&t| t as usize >= vocab) {
        return Err(SpecError::TokenOutOfRange { token, vocab });
    }
    Ok(())
}

/// `p_t(x) / p_d(x)` capped at 1 (a token the draft gave no mass is accepted
/// iff the target gives it mass).
fn ratio(pt: f64, pd: f64) -> f64 {
    if pd > 0.0 {
        (pt / pd).min(1.0)
    } else if pt > 0.0 {
        1.0
    } else {
        0.0
    }
}

/// Per-token rejection sampling: accept `x_i` with probability
/// `min(1, p_t(x_i) / p_d(x_i))`; at the first rejection sample from
/// `norm(max(p_t - p_d, 0))`; after a fully accepted draft sample the bonus
/// token from the last target row. Uses one uniform per decision.
pub fn verify_rejection<R: UniformSource + ?Sized>(
    draft: &[u32],
    draft_probs: &[f32],
    target_probs: &[f32],
    vocab: usize,
    rng: &mut R,
) -> Result<Verdict, SpecError> {
    check(draft, draft_probs, target_probs, vocab)?;
    for (i, &x) in draft.iter().enumerate() {
        let pt = row(target_probs, vocab, i);
        let pd = row(draft_probs, vocab, i);
        let a = ratio(f64::from(pt[x as usize]), f64::from(pd[x as usize]));
        if rng.next_uniform() >= a {
            let mut tokens = draft[..i].to_vec();
            tokens.push(sample_residual(pt, pd, 1.0, rng.next_uniform())?);
            return Ok(Verdict {
                accepted: i,
                tokens,
            });
        }
    }
    let mut tokens = draft.to_vec();
    tokens.push(sample_row(
        row(target_probs, vocab, draft.len()),
        rng.next_uniform(),
    )?);
    Ok(Verdict {
        accepted: draft.len(),
        tokens,
    })
}

/// The weights `p_0..p_K` and stop probabilities `h_1..h_K` of block
/// verification (module docs), as `(p, h)` with `p.len() == K + 1` and
/// `h.len() == K` (`h[i - 1]` is `h_i`). Exposed for tests and analysis.
pub fn block_weights(
    draft: &[u32],
    draft_probs: &[f32],
    target_probs: &[f32],
    vocab: usize,
) -> Result<(Vec<f64>, Vec<f64>), SpecError> {
    check(draft, draft_probs, target_probs, vocab)?;
    let k = draft.len();
    let mut p = Vec::with_capacity(k + 1);
    let mut h = Vec::with_capacity(k);
    p.push(1.0f64);
    for i in 1..=k {
        let x = draft[i - 1] as usize;
        let pt = f64::from(row(target_probs, vocab, i - 1)[x]);
        let pd = f64::from(row(draft_probs, vocab, i - 1)[x]);
        let prev = p[i - 1];
        let pi = if pd > 0.0 {
            (prev * pt / pd).min(1.0)
        } else if pt > 0.0 {
            prev.min(1.0)
        } else {
            0.0
        };
        p.push(pi);
        if i == k {
            h.push(pi);
        } else {
            let s: f64 = row(target_probs, vocab, i)
                .iter()
                .zip(row(draft_probs, vocab, i))
                .map(|(&t, &d)| (pi * f64::from(t) - f64::from(d)).max(0.0))
                .sum();
            h.push(if s > 0.0 { s / (s + 1.0 - pi) } else { 0.0 });
        }
    }
    Ok((p, h))
}

/// Block verification (Sun et al.; module docs). Uses `K` uniforms for the
/// stop decisions and one for the final token.
pub fn verify_block<R: UniformSource + ?Sized>(
    draft: &[u32],
    draft_probs: &[f32],
    target_probs: &[f32],
    vocab: usize,
    rng: &mut R,
) -> Result<Verdict, SpecError> {
    let (p, h) = block_weights(draft, draft_probs, target_probs, vocab)?;
    let k = draft.len();
    let mut tau = 0;
    for (i, &hi) in h.iter().enumerate() {
        if rng.next_uniform() <= hi {
            tau = i + 1;
        }
    }
    let u = rng.next_uniform();
    let y = if tau == k {
        sample_row(row(target_probs, vocab, k), u)?
    } else {
        sample_residual(
            row(target_probs, vocab, tau),
            row(draft_probs, vocab, tau),
            p[tau],
            u,
        )?
    };
    let mut tokens = draft[..tau].to_vec();
    tokens.push(y);
    Ok(Verdict {
        accepted: tau,
        tokens,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec;

    #[test]
    fn greedy_accepts_matching_prefix() {
        let v = verify_greedy(&[5, 6, 7], &[5, 6, 9, 1]).unwrap();
        assert_eq!(
            v,
            Verdict {
                accepted: 2,
                tokens: vec![5, 6, 9]
            }
        );
        let v = verify_greedy(&[5, 6], &[5, 6, 8]).unwrap();
        assert_eq!(
            v,
            Verdict {
                accepted: 2,
                tokens: vec![5, 6, 8]
            }
        );
        let v = verify_greedy(&[], &[3]).unwrap();
        assert_eq!(
            v,
            Verdict {
                accepted: 0,
                tokens: vec![3]
            }
        );
        assert!(verify_greedy(&[1], &[1]).is_err());
    }

    #[test]
    fn sample_index_inverse_cdf() {
        let w = [0.0, 1.0, 0.0, 3.0];
        assert_eq!(sample_index(&w, 0.0), Some(1));
        assert_eq!(sample_index(&w, 0.24), Some(1));
        assert_eq!(sample_index(&w, 0.26), Some(3));
        assert_eq!(sample_index(&w, 0.999_999), Some(3));
        assert_eq!(sample_index(&[0.0, 0.0], 0.5), None);
    }

    #[test]
    fn block_with_one_token_is_per_token() {
        // h_1 = p_1 = min(1, pt/pd): the per-token acceptance probability.
        let pd = [0.5f32, 0.25, 0.25];
        let pt = [0.25f32, 0.5, 0.25, 0.2, 0.3, 0.5];
        let (p, h) = block_weights(&[0], &pd, &pt, 3).unwrap();
        assert_eq!(p, vec![1.0, 0.5]);
        assert_eq!(h, vec![0.5]);
    }
}
