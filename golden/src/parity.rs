//! The parity judge: how two backends' greedy streams and per-layer taps
//! are compared, in one place for every tool (`m3 parity`, the GPU runner's
//! gate test).
//!
//! Why a judgement and not plain equality: two correct backends sum in
//! different f32 orders, which can flip a bf16 rounding upstream and so swap
//! two logits (or two experts, two blocks) that are within a rounding of each
//! other. ARCHITECTURE.md's rule is that discrete choices must match except
//! at reported near ties:
//!
//! - [`judge`]: at the first differing greedy token, both teacher-forced
//!   logits rows of that position: `near-tie` when the reference's gap
//!   between its token and the backend's *and* the backend's gap the other
//!   way are below the margin; `MISMATCH` otherwise (also for any
//!   non-finite logit);
//! - [`diagnose`]: the same teacher-forced step on both, compared layer by
//!   layer over their taps (`residual.{l}`, `attn_out.{l}`, `ffn_out.{l}`,
//!   `experts.{l}`, `topk_blocks.{l}`; the reference's `index_scores.{l}`
//!   and `ffn_in.{l}` give its own score gaps), with every discrete choice
//!   that differs and the reference's gap between the choices;
//! - [`judge_upstream`] / [`final_verdict`]: a logits `MISMATCH` whose first
//!   discrete difference is a near tie of the reference, with every residual
//!   before its layer within [`RESIDUAL_JUMP`], is `near-tie-upstream`.

use std::collections::BTreeSet;

use m3_core::backend::{TapData, Taps};
use m3_core::config::{IndexSelection, ModelConfig};
use serde::Serialize;

/// Residual rel L2 (reference vs backend) above which a layer counts as
/// the jump: below it, two backends differ by summation order only.
pub const RESIDUAL_JUMP: f64 = 1e-2;

/// Most discrete differences listed per diagnosis (the count is always
/// whole).
pub const MAX_LISTED: usize = 64;

/// Golden's router near-tie margin (biased sigmoid score units).
pub const ROUTER_MARGIN: f64 = 1e-3;
/// Golden's indexer near-tie margin (block score units).
pub const TOPK_MARGIN: f64 = 2e-2;
/// The logit margin of a token swap.
pub const LOGIT_MARGIN: f64 = 1e-3;
/// The near-tie margin of an MXFP4 activation code flip: a flipped value
/// may differ by this fraction of `|value| + rms(row)`. The routed experts'
/// input is a bf16 row after an RMSNorm, so two correct backends differ
/// per value by one bf16 rounding step (2^-7 of the value at most) or, for
/// values near zero, by the upstream summation noise, which is a fraction
/// of the row's RMS (rows agree to [`RESIDUAL_JUMP`] = 1e-2 in rel L2, so
/// a typical value moves by up to ~1e-2 of the RMS). 2^-7 (+1%) covers the
/// first exactly and the second at 0.8%.
pub const ACT_CODE_MARGIN: f64 = 1.01 / 128.0;

/// Why a judgement could not be made (bad inputs, not a verdict).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("parity: {0}")]
pub struct ParityError(pub String);

type Result<T> = std::result::Result<T, ParityError>;

macro_rules! bail {
    ($($t:tt)*) => { return Err(ParityError(format!($($t)*))) };
}

/// The judgement of one prompt.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Verdict {
    #[serde(rename = "identical")]
    Identical,
    #[serde(rename = "near-tie")]
    NearTie,
    #[serde(rename = "near-tie-upstream")]
    NearTieUpstream,
    #[serde(rename = "MISMATCH")]
    Mismatch,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Identical => "identical",
            Verdict::NearTie => "near-tie",
            Verdict::NearTieUpstream => "near-tie-upstream",
            Verdict::Mismatch => "MISMATCH",
        }
    }
}

/// The numbers behind a divergence verdict (logits of the same position
/// from both backends).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Judgement {
    pub verdict: Verdict,
    pub ref_tok: u32,
    pub be_tok: u32,
    /// The reference row's top-2 `(id, logit)` (greedy order: ties go to
    /// the lower id; NaN entries skipped).
    pub ref_top2: Vec<(u32, f32)>,
    pub be_top2: Vec<(u32, f32)>,
    /// `ref[ref_tok] - ref[be_tok]`.
    pub ref_gap: f64,
    /// `be[be_tok] - be[ref_tok]`.
    pub be_gap: f64,
    /// The reference's logit of the backend's token, and vice versa.
    pub ref_logit_of_be_tok: f32,
    pub be_logit_of_ref_tok: f32,
    /// `max |be - ref|` over the row.
    pub max_abs: f64,
    /// `||be - ref|| / ||ref||`.
    pub rel_l2: f64,
    /// Whether either row holds a NaN or an infinity.
    pub nonfinite: bool,
    pub margin: f64,
}

/// Top-2 `(id, value)` of `row` in greedy order (strictly greater wins, so
/// ties go to the lower id, as `m3_core::sample::greedy`), NaN skipped.
fn top2(row: &[f32]) -> Vec<(u32, f32)> {
    let mut best: Vec<(u32, f32)> = Vec::with_capacity(2);
    for (i, &v) in row.iter().enumerate() {
        if v.is_nan() {
            continue;
        }
        let e = (i as u32, v);
        match best.as_slice() {
            [] => best.push(e),
            [a] => {
                if v > a.1 {
                    best.insert(0, e);
                } else {
                    best.push(e);
                }
            }
            [a, b] => {
                if v > a.1 {
                    best = vec![e, *a];
                } else if v > b.1 {
                    best[1] = e;
                }
            }
            _ => unreachable!("at most two kept"),
        }
    }
    best
}

/// Judge the divergence of two backends at one position: `ref_row` and
/// `be_row` are the two logits rows, `ref_tok`/`be_tok` the tokens each
/// chose. Same token: `identical`. Otherwise `near-tie` when both gaps
/// (`ref[ref_tok] - ref[be_tok]` and `be[be_tok] - be[ref_tok]`) are below
/// `margin`, else `MISMATCH`; a non-finite logit anywhere in either row is
/// always `MISMATCH`. Errors only for rows of different lengths, an empty
/// row, a token out of range or a margin that is not a finite number >= 0.
pub fn judge(
    ref_row: &[f32],
    be_row: &[f32],
    ref_tok: u32,
    be_tok: u32,
    margin: f64,
) -> Result<Judgement> {
    if ref_row.len() != be_row.len() {
        bail!(
            "logits rows differ in length: reference {} vs backend {}",
            ref_row.len(),
            be_row.len()
        );
    }
    if ref_row.is_empty() {
        bail!("empty logits rows");
    }
    if !(margin.is_finite() && margin >= 0.0) {
        bail!("--margin {margin}: expected a finite number >= 0");
    }
    let n = ref_row.len();
    for (what, t) in [("reference", ref_tok), ("backend", be_tok)] {
        if t as usize >= n {
            bail!("{what} token {t} is out of range (vocab {n})");
        }
    }
    let at = |row: &[f32], t: u32| row[t as usize];
    let nonfinite = ref_row.iter().chain(be_row).any(|v| !v.is_finite());
    let (mut max_abs, mut e2, mut n2) = (0f64, 0f64, 0f64);
    for (&a, &b) in be_row.iter().zip(ref_row) {
        let d = f64::from(a) - f64::from(b);
        // NaN propagates through max only explicitly
        max_abs = if d.is_nan() {
            f64::NAN
        } else {
            max_abs.max(d.abs())
        };
        e2 += d * d;
        n2 += f64::from(b) * f64::from(b);
    }
    let rel_l2 = (e2 / n2.max(1e-300)).sqrt();
    let ref_gap = f64::from(at(ref_row, ref_tok)) - f64::from(at(ref_row, be_tok));
    let be_gap = f64::from(at(be_row, be_tok)) - f64::from(at(be_row, ref_tok));
    let verdict = if ref_tok == be_tok {
        Verdict::Identical
    } else if !nonfinite && ref_gap < margin && be_gap < margin {
        Verdict::NearTie
    } else {
        Verdict::Mismatch
    };
    Ok(Judgement {
        verdict,
        ref_tok,
        be_tok,
        ref_top2: top2(ref_row),
        be_top2: top2(be_row),
        ref_gap,
        be_gap,
        ref_logit_of_be_tok: at(ref_row, be_tok),
        be_logit_of_ref_tok: at(be_row, ref_tok),
        max_abs: if nonfinite { f64::NAN } else { max_abs },
        rel_l2: if nonfinite { f64::NAN } else { rel_l2 },
        nonfinite,
        margin,
    })
}

/// Which discrete choice differs. Declared in the order a layer makes them
/// (the indexer's blocks, the router's experts, then the MXFP4 codes of the
/// experts' input under `--act mxfp4`), which is the order "first
/// difference" follows within a layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub enum ChoiceKind {
    #[serde(rename = "blocks")]
    Blocks,
    #[serde(rename = "experts")]
    Experts,
    /// E2M1 codes of the routed experts' input row (`ffn_in.{l}`, MXFP4
    /// `even` per 32): the ids are the flipped columns.
    #[serde(rename = "act_codes")]
    ActCodes,
}

impl ChoiceKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ChoiceKind::Blocks => "blocks",
            ChoiceKind::Experts => "experts",
            ChoiceKind::ActCodes => "MXFP4 activation codes",
        }
    }
}

/// One layer's comparison (reference vs backend, teacher-forced prefill).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LayerDiag {
    pub layer: usize,
    /// `||be - ref|| / ||ref||` of `residual.{l}`, last row (NaN when either
    /// side is non-finite).
    pub residual_rel_l2_last: f64,
    pub residual_max_abs_last: f64,
    /// The largest per-row rel L2 of `residual.{l}`, and its row.
    pub residual_rel_l2_max_row: f64,
    pub residual_worst_row: usize,
    /// Last row of the attention output after `o_proj` / of the FFN output.
    pub attn_out_rel_l2_last: Option<f64>,
    pub ffn_out_rel_l2_last: Option<f64>,
    /// Rows whose expert sets differ; (KV head, row) pairs whose block
    /// selections differ.
    pub expert_rows_differ: usize,
    pub block_rows_differ: usize,
    /// With MXFP4 expert activations (`--act mxfp4`): the E2M1 codes of the
    /// routed experts' input (`ffn_in.{l}`, MXFP4 `even` per 32) that
    /// differ between the two sides: one flipped code moves a row by a
    /// whole E2M1 step, so the count says how much of a residual's
    /// difference is quantization, not arithmetic. `None` when not counted.
    pub act_code_flips: Option<usize>,
    /// Rows whose residual rel L2 is at or above the jump (or non-finite),
    /// and of those the rows with no discrete difference of their own in
    /// this layer. Under teacher forcing every row of a layer starts from
    /// the reference's residual and a row's choices move only that row, so
    /// a jump with no choice of its own is the layer's arithmetic.
    pub jump_rows: usize,
    pub unexplained_jump_rows: usize,
}

/// One discrete choice that differs.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DiscreteDiff {
    pub layer: usize,
    pub kind: ChoiceKind,
    pub row: usize,
    /// The KV head of a block selection (`None` for experts; 0 for a shared
    /// selection, which every KV head repeats).
    pub kv_head: Option<usize>,
    pub ref_ids: Vec<i32>,
    pub be_ids: Vec<i32>,
    /// Chosen by the reference only / by the backend only.
    pub ref_only: Vec<i32>,
    pub be_only: Vec<i32>,
    /// The reference's own score gap: the highest reference score among
    /// `ref_only` minus the lowest among `be_only` (router: biased sigmoid
    /// score; indexer: block score). `None`: unknown (no scores, or a
    /// non-finite score). For activation codes: the largest difference
    /// `|be - ref| / (|ref| + rms(row))` of a flipped value (of its block's
    /// largest magnitude where the block scale differs), an upper bound on
    /// how far the reference's value is from the boundary the flip crossed.
    pub gap: Option<f64>,
    pub margin: f64,
    /// `|gap| < margin` (a gap is >= 0 when the scores are the ones the
    /// reference chose by); `margin` is the floor scaled by the score the
    /// gap is measured at ([`near_tie_margin`]).
    pub near_tie: bool,
}

/// The upstream rule's result.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Upstream {
    /// The first discrete difference is a near tie and nothing jumped
    /// before its layer.
    pub near_tie: bool,
    pub reason: String,
}

/// The diagnosis of one divergence.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Diagnosis {
    /// Rows of the teacher-forced prefill (the common prefix).
    pub rows: usize,
    pub residual_jump: f64,
    pub layers: Vec<LayerDiag>,
    /// First layer whose residual rel L2 is above `residual_jump` (or
    /// non-finite), on the last row / on any row.
    pub first_jump_layer_last_row: Option<usize>,
    pub first_jump_layer_any_row: Option<usize>,
    /// All discrete differences (the list holds the first `MAX_LISTED`, in
    /// layer, kind, row, KV-head order).
    pub discrete_differences: usize,
    pub discrete: Vec<DiscreteDiff>,
    pub first_discrete: Option<DiscreteDiff>,
    /// Set when router gaps could not be computed ("router gap unknown").
    #[serde(skip_serializing_if = "Option::is_none")]
    pub router_gap_note: Option<String>,
    /// Discrete differences that are not near ties (counted before the
    /// list is cut to `MAX_LISTED`).
    pub not_near_ties: usize,
    /// (layer, row) residual jumps with no discrete difference of their
    /// own at that layer and row: the count, and the first.
    pub unexplained_jumps: usize,
    pub first_unexplained_jump: Option<(usize, usize)>,
    pub upstream: Upstream,
}

/// Rel L2 and max abs of `be` against `reference` (NaN for both when either
/// holds a non-finite value or the lengths differ).
pub fn rel_l2(reference: &[f32], be: &[f32]) -> (f64, f64) {
    if reference.len() != be.len() {
        return (f64::NAN, f64::NAN);
    }
    let (mut e2, mut n2, mut mx) = (0.0f64, 0.0f64, 0.0f64);
    for (&a, &b) in reference.iter().zip(be) {
        if !(a.is_finite() && b.is_finite()) {
            return (f64::NAN, f64::NAN);
        }
        let d = f64::from(b) - f64::from(a);
        e2 += d * d;
        n2 += f64::from(a) * f64::from(a);
        mx = mx.max(d.abs());
    }
    ((e2 / n2.max(1e-300)).sqrt(), mx)
}

/// Whether a rel L2 is a jump: above `jump`, or NaN (non-finite values).
pub fn is_jump(rel: f64, jump: f64) -> bool {
    rel.is_nan() || rel >= jump
}

/// E2M1 codes that differ between the MXFP4 (`even`) quantizations of `a`
/// and `b` (`[rows, width]`, row-major); `None` when they cannot be
/// quantized (shapes, non-finite values).
pub fn mxfp4_code_flips(a: &[f32], b: &[f32], width: usize) -> Option<usize> {
    use m3_core::formats::{MxElem, MxTensor, ScaleRule};
    if a.len() != b.len() || width == 0 || !a.len().is_multiple_of(width) {
        return None;
    }
    let rows = a.len() / width;
    let qa = MxTensor::quantize(a, rows, width, MxElem::Fp4E2M1, ScaleRule::Even).ok()?;
    let qb = MxTensor::quantize(b, rows, width, MxElem::Fp4E2M1, ScaleRule::Even).ok()?;
    let (da, db) = (qa.dequantize(), qb.dequantize());
    Some(
        da.iter()
            .zip(&db)
            .filter(|(x, y)| x.to_bits() != y.to_bits())
            .count(),
    )
}

/// The MXFP4 (`even`) activation codes of one row that differ between the
/// reference's values `a` and the backend's `b` (`width` values, a multiple
/// of 32), as a discrete difference of `layer`, `row`; `None` when no code
/// differs or the row cannot be quantized. Near tie when every flipped
/// value (or, where the block scale differs, the block's largest
/// magnitude) differs by less than [`ACT_CODE_MARGIN`] of `|value| +
/// rms(row)`: a boundary lies between the two values, so the reference's
/// value is at most that far from it.
pub fn act_code_diff(layer: usize, row: usize, a: &[f32], b: &[f32]) -> Option<DiscreteDiff> {
    use m3_core::formats::{MxElem, MxTensor, ScaleRule};
    const LISTED: usize = 16;
    let n = a.len();
    if n != b.len() || n == 0 || !n.is_multiple_of(MxElem::BLOCK) {
        return None;
    }
    let qa = MxTensor::quantize(a, 1, n, MxElem::Fp4E2M1, ScaleRule::Even).ok()?;
    let qb = MxTensor::quantize(b, 1, n, MxElem::Fp4E2M1, ScaleRule::Even).ok()?;
    let (da, db) = (qa.dequantize(), qb.dequantize());
    let rms = (a.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>() / n as f64).sqrt();
    let rel = |x: f32, y: f32| {
        let (x, y) = (f64::from(x), f64::from(y));
        (y - x).abs() / (x.abs() + rms).max(f64::MIN_POSITIVE)
    };
    let amax = |v: &[f32]| v.iter().fold(0.0f32, |m, x| m.max(x.abs()));
    let mut flipped: Vec<i32> = Vec::new();
    let mut gap = 0.0f64;
    for (blk, (sa, sb)) in qa.scales().iter().zip(qb.scales()).enumerate() {
        let cols = blk * MxElem::BLOCK..(blk + 1) * MxElem::BLOCK;
        let flips: Vec<usize> = cols
            .clone()
            .filter(|&j| da[j].to_bits() != db[j].to_bits())
            .collect();
        if flips.is_empty() {
            continue;
        }
        if sa == sb {
            for &j in &flips {
                gap = gap.max(rel(a[j], b[j]));
            }
        } else {
            gap = gap.max(rel(amax(&a[cols.clone()]), amax(&b[cols])));
        }
        flipped.extend(flips.iter().map(|&j| j as i32));
    }
    if flipped.is_empty() {
        return None;
    }
    let listed: Vec<i32> = flipped.iter().copied().take(LISTED).collect();
    Some(DiscreteDiff {
        layer,
        kind: ChoiceKind::ActCodes,
        row,
        kv_head: None,
        ref_ids: listed.clone(),
        be_ids: listed,
        ref_only: Vec::new(),
        be_only: Vec::new(),
        gap: gap.is_finite().then_some(gap),
        margin: ACT_CODE_MARGIN,
        near_tie: gap < ACT_CODE_MARGIN,
    })
}

/// The upstream rule under teacher forcing: the backend ran the prefix with
/// every layer's input taken from the reference's residuals, so a layer's
/// difference is its own, not accumulated, and a row's discrete choices
/// (its blocks, its experts, its activation codes) move only that row. A
/// logits `MISMATCH` of the free-running streams is `near-tie-upstream`
/// when every discrete difference is a near tie of the reference, every
/// row whose residual jumps in a layer has a discrete difference of its own
/// in that layer, and the teacher-forced logits (`tf`, both sides from the
/// reference's last residual) pick the same token or a near tie: then every
/// layer agrees on the reference's inputs up to near-tie choices, and the
/// streams parted by accumulated rounding or by such a choice.
pub fn judge_teacher_forced(g: &Diagnosis, tf: &Judgement) -> Upstream {
    let logits_agree = matches!(tf.verdict, Verdict::Identical | Verdict::NearTie) && !tf.nonfinite;
    let fail = |why: String| Upstream {
        near_tie: false,
        reason: why,
    };
    if !logits_agree {
        return fail(format!(
            "teacher-forced on the reference's residuals the logits still differ ({}, rel L2 {:.2e})",
            tf.verdict.as_str(),
            tf.rel_l2
        ));
    }
    if g.not_near_ties > 0 {
        let d = g.discrete.iter().find(|d| !d.near_tie);
        return fail(format!(
            "{} discrete difference(s) are not near ties of the reference{}",
            g.not_near_ties,
            d.map(|d| format!(
                " (first: layer {} row {} {}, gap {} vs margin {:.1e})",
                d.layer,
                d.row,
                d.kind.as_str(),
                d.gap.map_or("unknown".to_string(), |x| format!("{x:.3e}")),
                d.margin
            ))
            .unwrap_or_default()
        ));
    }
    if let Some((l, t)) = g.first_unexplained_jump {
        let r = g
            .layers
            .get(l)
            .map_or(f64::NAN, |d| d.residual_rel_l2_max_row);
        return fail(format!(
            "teacher-forced, {} row(s) jump above residual rel L2 {:.0e} with no discrete choice of their own (first: layer {l} row {t}; the layer's worst row {r:.3e}): a numeric difference",
            g.unexplained_jumps, g.residual_jump
        ));
    }
    let worst = g
        .layers
        .iter()
        .map(|d| d.residual_rel_l2_max_row)
        .fold(0.0, f64::max);
    let jumps: usize = g.layers.iter().map(|d| d.jump_rows).sum();
    let count = |k: ChoiceKind| g.discrete.iter().filter(|d| d.kind == k).count();
    let flips: usize = g.layers.iter().filter_map(|d| d.act_code_flips).sum();
    let choices = if g.discrete_differences == 0 {
        "no discrete choice differs".to_string()
    } else {
        format!(
            "{} discrete difference(s), all near ties of the reference ({} block, {} expert, {} activation-code row(s){}; {} MXFP4 codes flipped in all), explaining the {jumps} row jump(s)",
            g.discrete_differences,
            count(ChoiceKind::Blocks),
            count(ChoiceKind::Experts),
            count(ChoiceKind::ActCodes),
            if g.discrete_differences > g.discrete.len() {
                " among those listed"
            } else {
                ""
            },
            flips
        )
    };
    Upstream {
        near_tie: true,
        reason: format!(
            "teacher-forced on the reference's residuals every layer agrees (worst residual rel L2 {worst:.2e}; {choices}) and the teacher-forced logits agree ({}, rel L2 {:.2e}): the free-running streams parted by accumulated rounding or a near-tie choice",
            tf.verdict.as_str(),
            tf.rel_l2
        ),
    }
}

/// The upstream rule. `residual` is each layer's worst-row residual rel L2
/// (NaN counts as a jump); `diffs` every discrete difference in (layer,
/// kind, row, head) order. Near tie upstream when there is a first
/// difference, every residual *before* its layer is below `jump`, and every
/// difference of the same layer and kind (all made from the same inputs) is
/// a near tie of the reference.
pub fn judge_upstream(residual: &[f64], diffs: &[DiscreteDiff], jump: f64) -> Upstream {
    let first_jump = residual.iter().position(|&r| is_jump(r, jump));
    let Some(first) = diffs.first() else {
        return Upstream {
            near_tie: false,
            reason: match first_jump {
                Some(l) => format!(
                    "no discrete choice differs, yet the residual rel L2 exceeds {jump:.0e} at layer {l}: a numeric difference"
                ),
                None => format!(
                    "no discrete choice differs and every residual is within rel L2 {jump:.0e}: the difference is after the last layer (final norm, LM head) or below the threshold"
                ),
            },
        };
    };
    if let Some(l) = first_jump.filter(|&l| l < first.layer) {
        return Upstream {
            near_tie: false,
            reason: format!(
                "the residual rel L2 exceeds {jump:.0e} at layer {l} ({:.3e}), before the first discrete difference (layer {}): a numeric difference, not a flip",
                residual[l], first.layer
            ),
        };
    }
    let stage: Vec<&DiscreteDiff> = diffs
        .iter()
        .take_while(|d| d.layer == first.layer && d.kind == first.kind)
        .collect();
    if let Some(d) = stage.iter().find(|d| !d.near_tie) {
        return Upstream {
            near_tie: false,
            reason: format!(
                "layer {} row {}{} {}: the reference's gap {} is not below the margin {:.1e}",
                d.layer,
                d.row,
                d.kv_head
                    .map(|h| format!(" kv head {h}"))
                    .unwrap_or_default(),
                d.kind.as_str(),
                d.gap.map_or("unknown".to_string(), |g| format!("{g:.3e}")),
                d.margin
            ),
        };
    }
    let worst = stage
        .iter()
        .filter_map(|d| d.gap)
        .fold(f64::NEG_INFINITY, f64::max);
    Upstream {
        near_tie: true,
        reason: format!(
            "the first discrete difference (layer {}, {}, {} of them) is a near tie of the reference (largest gap {worst:.3e} < margin {:.1e}) and every residual before layer {} is within rel L2 {jump:.0e}",
            first.layer,
            first.kind.as_str(),
            stage.len(),
            first.margin,
            first.layer
        ),
    }
}

/// A prompt's verdict: the logits' own, except that a `MISMATCH` with
/// finite logits whose diagnosis found a near tie upstream is
/// `near-tie-upstream`.
pub fn final_verdict(j: &Judgement, upstream: Option<&Upstream>) -> Verdict {
    match (j.verdict, upstream) {
        (Verdict::Mismatch, Some(u)) if u.near_tie && !j.nonfinite => Verdict::NearTieUpstream,
        (v, _) => v,
    }
}

/// The non-negative ids of a padded selection, as a set.
fn id_set(v: &[i32]) -> BTreeSet<i32> {
    v.iter().copied().filter(|&i| i >= 0).collect()
}

/// `max score(ref_only) - min score(be_only)`; `None` when a score is
/// missing or the result is not finite.
#[cfg(test)]
fn score_gap(score: impl Fn(i32) -> Option<f64>, ref_only: &[i32], be_only: &[i32]) -> Option<f64> {
    score_gap_at(score, ref_only, be_only).map(|(g, _)| g)
}

/// The gap of [`score_gap`] and the score it is measured at (the highest
/// reference score among `ref_only`).
fn score_gap_at(
    score: impl Fn(i32) -> Option<f64>,
    ref_only: &[i32],
    be_only: &[i32],
) -> Option<(f64, f64)> {
    let mut hi = f64::NEG_INFINITY;
    for &a in ref_only {
        hi = hi.max(score(a)?);
    }
    let mut lo = f64::INFINITY;
    for &b in be_only {
        lo = lo.min(score(b)?);
    }
    let g = hi - lo;
    g.is_finite().then_some((g, hi))
}

/// The margin a gap measured at reference score `s` is judged against:
/// `floor * max(1, |s|)`, so large scores get the relative slack that f32
/// reordering gives them (block scores are dot products of O(d) size).
pub fn near_tie_margin(floor: f64, s: f64) -> f64 {
    floor * s.abs().max(1.0)
}

/// A difference record, if the two selections differ.
#[allow(clippy::too_many_arguments)]
fn diff_of(
    layer: usize,
    kind: ChoiceKind,
    row: usize,
    kv_head: Option<usize>,
    r: &[i32],
    b: &[i32],
    score: impl Fn(i32) -> Option<f64>,
    margin: f64,
) -> Option<DiscreteDiff> {
    let (rs, bs) = (id_set(r), id_set(b));
    if rs == bs {
        return None;
    }
    let ref_only: Vec<i32> = rs.difference(&bs).copied().collect();
    let be_only: Vec<i32> = bs.difference(&rs).copied().collect();
    let at = score_gap_at(score, &ref_only, &be_only);
    let gap = at.map(|(g, _)| g);
    let margin = at.map_or(margin, |(_, s)| near_tie_margin(margin, s));
    Some(DiscreteDiff {
        layer,
        kind,
        row,
        kv_head,
        ref_ids: rs.into_iter().collect(),
        be_ids: bs.into_iter().collect(),
        ref_only,
        be_only,
        gap,
        margin,
        // a negative gap (the reference's own scores preferring what it did
        // not choose) means the scores are not the ones it chose by: only
        // within the margin is that still a tie
        near_tie: gap.is_some_and(|g| g.abs() < margin),
    })
}

/// Margins of the discrete choices.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Margins {
    pub router: f64,
    pub topk: f64,
}

impl Default for Margins {
    /// Golden's margins.
    fn default() -> Self {
        Margins {
            router: ROUTER_MARGIN,
            topk: TOPK_MARGIN,
        }
    }
}

/// Where the reference's biased router scores of a layer come from:
/// `(layer, router input rows [T, H] (the reference's `ffn_in.{l}`), rows)`
/// -> `[T, experts]` scores `sigmoid(z) + bias`, computed with the
/// reference's own router.
pub type RouterScores<'a> =
    dyn FnMut(usize, &[f32], usize) -> std::result::Result<Vec<f32>, String> + 'a;

/// Compare two teacher-forced steps of `rows` rows layer by layer: `rt` the
/// reference's taps, `bt` the backend's (see the module doc).
pub fn diagnose(
    c: &ModelConfig,
    rows: usize,
    rt: &Taps,
    bt: &Taps,
    router_scores: &mut RouterScores<'_>,
    margins: Margins,
    count_act_flips: bool,
) -> Result<Diagnosis> {
    let h = c.hidden_size;
    let Some(last) = rows.checked_sub(1) else {
        bail!("empty prefix")
    };
    let row =
        |v: &[f32], t: usize| -> Vec<f32> { v.get(t * h..(t + 1) * h).unwrap_or(&[]).to_vec() };
    let nl = c.num_hidden_layers;
    let mut layers = Vec::with_capacity(nl);
    let mut diffs: Vec<DiscreteDiff> = Vec::new();
    let mut router_notes: Vec<String> = Vec::new();
    let (mut unexplained, mut first_unexplained) = (0usize, None);
    for l in 0..nl {
        let name = format!("residual.{l}");
        let (Some(ra), Some(ba)) = (rt.f32(&name), bt.f32(&name)) else {
            bail!("no {name} tap from both backends (a backend that ignores taps cannot be diagnosed)");
        };
        if ra.len() != rows * h || ba.len() != rows * h {
            bail!(
                "{name}: {} and {} values, expected {}",
                ra.len(),
                ba.len(),
                rows * h
            );
        }
        let (last_rel, last_abs) = rel_l2(&row(ra, last), &row(ba, last));
        let (mut worst, mut worst_row) = (0.0f64, 0usize);
        let mut jumped: Vec<usize> = Vec::new();
        for t in 0..rows {
            let (r, _) = rel_l2(&row(ra, t), &row(ba, t));
            if is_jump(r, RESIDUAL_JUMP) {
                jumped.push(t);
            }
            if !worst.is_nan() && (r.is_nan() || r > worst) {
                worst = r;
                worst_row = t;
            }
        }
        let first_diff_of_layer = diffs.len();
        let side = |name: &str| match (
            rt.f32(&format!("{name}.{l}")),
            bt.f32(&format!("{name}.{l}")),
        ) {
            (Some(a), Some(b)) if a.len() == rows * h && b.len() == rows * h => {
                Some(rel_l2(&row(a, last), &row(b, last)).0)
            }
            _ => None,
        };
        let mut ld = LayerDiag {
            layer: l,
            residual_rel_l2_last: last_rel,
            residual_max_abs_last: last_abs,
            residual_rel_l2_max_row: worst,
            residual_worst_row: worst_row,
            attn_out_rel_l2_last: side("attn_out"),
            ffn_out_rel_l2_last: side("ffn_out"),
            expert_rows_differ: 0,
            block_rows_differ: 0,
            act_code_flips: None,
            jump_rows: jumped.len(),
            unexplained_jump_rows: 0,
        };
        // the indexer's blocks
        let tb = format!("topk_blocks.{l}");
        if let (Some(ra), Some(ba)) = (rt.i32(&tb), bt.i32(&tb)) {
            let k = c.index_topk_blocks.max(1);
            let nkv = c.num_key_value_heads;
            if ra.len() == ba.len() && ra.len() == nkv * rows * k {
                let scores = rt.tensors.get(&format!("index_scores.{l}")).and_then(|t| {
                    match (&t.data, t.shape.as_slice()) {
                        (TapData::F32(v), &[nih, tt, nb])
                            if tt == rows && v.len() == nih * tt * nb =>
                        {
                            Some((v.as_slice(), nih, nb))
                        }
                        _ => None,
                    }
                });
                let shared = c.index_selection == IndexSelection::Shared;
                let heads = if shared { 1 } else { nkv };
                for g in 0..heads {
                    for t in 0..rows {
                        let at = (g * rows + t) * k;
                        let score = |b: i32| -> Option<f64> {
                            let (v, nih, nb) = scores?;
                            let b = usize::try_from(b).ok().filter(|&b| b < nb)?;
                            let s = if shared {
                                (0..nih)
                                    .map(|q| v[(q * rows + t) * nb + b])
                                    .fold(f32::NEG_INFINITY, f32::max)
                            } else if g < nih {
                                v[(g * rows + t) * nb + b]
                            } else {
                                return None;
                            };
                            Some(f64::from(s))
                        };
                        if let Some(d) = diff_of(
                            l,
                            ChoiceKind::Blocks,
                            t,
                            Some(g),
                            &ra[at..at + k],
                            &ba[at..at + k],
                            score,
                            margins.topk,
                        ) {
                            ld.block_rows_differ += 1;
                            diffs.push(d);
                        }
                    }
                }
            }
        }
        // the router's experts
        let te = format!("experts.{l}");
        if let (Some(ra), Some(ba)) = (rt.i32(&te), bt.i32(&te)) {
            let k = c.num_experts_per_tok.max(1);
            if ra.len() == ba.len() && ra.len() == rows * k {
                let differ: Vec<usize> = (0..rows)
                    .filter(|&t| id_set(&ra[t * k..(t + 1) * k]) != id_set(&ba[t * k..(t + 1) * k]))
                    .collect();
                let scores = if differ.is_empty() {
                    None
                } else {
                    match rt.f32(&format!("ffn_in.{l}")) {
                        None => {
                            router_notes
                                .push(format!("layer {l}: no router input (ffn_in) captured"));
                            None
                        }
                        Some(x) => match router_scores(l, x, rows) {
                            Ok(s) => Some(s),
                            Err(e) => {
                                router_notes.push(e);
                                None
                            }
                        },
                    }
                };
                let ne = scores.as_ref().map_or(0, |s| s.len() / rows.max(1));
                for t in differ {
                    let score = |e: i32| -> Option<f64> {
                        let s = scores.as_ref()?;
                        let e = usize::try_from(e).ok().filter(|&e| e < ne)?;
                        Some(f64::from(s[t * ne + e]))
                    };
                    if let Some(d) = diff_of(
                        l,
                        ChoiceKind::Experts,
                        t,
                        None,
                        &ra[t * k..(t + 1) * k],
                        &ba[t * k..(t + 1) * k],
                        score,
                        margins.router,
                    ) {
                        ld.expert_rows_differ += 1;
                        diffs.push(d);
                    }
                }
            }
        }
        // the MXFP4 codes of the routed experts' input (`--act mxfp4`)
        if count_act_flips && c.mlp_kinds.get(l) == Some(&m3_core::config::MlpKind::Moe) {
            if let (Some(a), Some(b)) = (
                rt.f32(&format!("ffn_in.{l}")),
                bt.f32(&format!("ffn_in.{l}")),
            ) {
                ld.act_code_flips = mxfp4_code_flips(a, b, h);
                if a.len() == rows * h && b.len() == rows * h {
                    for t in 0..rows {
                        if let Some(d) = act_code_diff(l, t, &row(a, t), &row(b, t)) {
                            diffs.push(d);
                        }
                    }
                }
            }
        }
        let own: BTreeSet<usize> = diffs[first_diff_of_layer..].iter().map(|d| d.row).collect();
        for &t in &jumped {
            if !own.contains(&t) {
                ld.unexplained_jump_rows += 1;
                unexplained += 1;
                first_unexplained.get_or_insert((l, t));
            }
        }
        layers.push(ld);
    }
    diffs.sort_by_key(|d| (d.layer, d.kind, d.row, d.kv_head));
    let not_near_ties = diffs.iter().filter(|d| !d.near_tie).count();
    let worst: Vec<f64> = layers.iter().map(|d| d.residual_rel_l2_max_row).collect();
    let upstream = judge_upstream(&worst, &diffs, RESIDUAL_JUMP);
    let jump = |f: fn(&LayerDiag) -> f64| layers.iter().position(|d| is_jump(f(d), RESIDUAL_JUMP));
    Ok(Diagnosis {
        rows,
        residual_jump: RESIDUAL_JUMP,
        first_jump_layer_last_row: jump(|d| d.residual_rel_l2_last),
        first_jump_layer_any_row: jump(|d| d.residual_rel_l2_max_row),
        discrete_differences: diffs.len(),
        first_discrete: diffs.first().cloned(),
        discrete: diffs.into_iter().take(MAX_LISTED).collect(),
        router_gap_note: (!router_notes.is_empty())
            .then(|| format!("router gap unknown: {}", router_notes.join("; "))),
        not_near_ties,
        unexplained_jumps: unexplained,
        first_unexplained_jump: first_unexplained,
        layers,
        upstream,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A synthetic logits row: `base` everywhere, then the given entries.
    fn row(n: usize, set: &[(usize, f32)]) -> Vec<f32> {
        let mut v: Vec<f32> = (0..n).map(|i| (i as f32) * 1e-3 - 1.0).collect();
        for &(i, x) in set {
            v[i] = x;
        }
        v
    }

    #[test]
    fn identical_argmax_is_identical() {
        let a = row(64, &[(7, 3.0), (9, 2.0)]);
        let b = row(64, &[(7, 3.1), (9, 2.2)]);
        let j = judge(&a, &b, 7, 7, 1e-3).expect("judge");
        assert_eq!(j.verdict, Verdict::Identical);
        assert_eq!(j.ref_top2, vec![(7, 3.0), (9, 2.0)]);
        assert_eq!(j.be_top2, vec![(7, 3.1), (9, 2.2)]);
        assert!((j.max_abs - 0.2).abs() < 1e-6, "{j:?}");
        assert!(j.rel_l2 > 0.0 && !j.nonfinite);
    }

    #[test]
    fn a_true_near_tie_is_a_near_tie() {
        // the tiny case seen on the H200: 152 vs 176, gap 7.7e-4
        let a = row(512, &[(152, 2.44118), (176, 2.44042)]);
        let b = row(512, &[(152, 2.44030), (176, 2.44070)]);
        let j = judge(&a, &b, 152, 176, 1e-3).expect("judge");
        assert_eq!(j.verdict, Verdict::NearTie, "{j:?}");
        assert!((j.ref_gap - 7.6e-4).abs() < 1e-5, "{j:?}");
        assert!((j.be_gap - 4.0e-4).abs() < 1e-5, "{j:?}");
        assert_eq!(j.ref_logit_of_be_tok, 2.44042);
        assert_eq!(j.be_logit_of_ref_tok, 2.44030);
        // a tighter margin turns the same numbers into a mismatch
        let j = judge(&a, &b, 152, 176, 5e-4).expect("judge");
        assert_eq!(j.verdict, Verdict::Mismatch);
    }

    #[test]
    fn a_real_mismatch_is_caught() {
        // the planted error: the backend prefers a token the reference
        // ranks far lower
        let a = row(128, &[(3, 5.0), (4, 4.9), (60, 1.0)]);
        let b = row(128, &[(3, 4.0), (4, 3.9), (60, 6.0)]);
        let j = judge(&a, &b, 3, 60, 1e-3).expect("judge");
        assert_eq!(j.verdict, Verdict::Mismatch, "{j:?}");
        assert!((j.ref_gap - 4.0).abs() < 1e-6 && (j.be_gap - 2.0).abs() < 1e-6);
        // a small reference gap does not excuse a backend that is sure
        let a = row(128, &[(3, 5.0), (60, 4.9995)]);
        let j = judge(&a, &b, 3, 60, 1e-3).expect("judge");
        assert_eq!(j.verdict, Verdict::Mismatch, "{j:?}");
    }

    #[test]
    fn nan_logits_are_a_mismatch_not_a_panic() {
        let a = row(32, &[(1, 2.0), (2, 1.9995), (5, f32::NAN)]);
        let b = row(32, &[(1, 1.9995), (2, 2.0)]);
        let j = judge(&a, &b, 1, 2, 1e-3).expect("judge");
        assert_eq!(j.verdict, Verdict::Mismatch, "{j:?}");
        assert!(j.nonfinite && j.max_abs.is_nan() && j.rel_l2.is_nan());
        assert_eq!(j.ref_top2, vec![(1, 2.0), (2, 1.9995)], "NaN skipped");
        // all-NaN rows and NaN at the chosen ids: still no panic
        let nan = vec![f32::NAN; 32];
        let j = judge(&nan, &nan, 0, 1, 1e-3).expect("judge");
        assert_eq!(j.verdict, Verdict::Mismatch);
        assert!(j.ref_top2.is_empty());
    }

    #[test]
    fn bad_inputs_are_errors() {
        let a = row(8, &[]);
        assert!(judge(&a, &a[..7], 0, 1, 1e-3).is_err());
        assert!(judge(&a, &a, 0, 8, 1e-3).is_err());
        assert!(judge(&[], &[], 0, 0, 1e-3).is_err());
        assert!(judge(&a, &a, 0, 1, f64::NAN).is_err());
        assert!(judge(&a, &a, 0, 1, -1.0).is_err());
    }

    #[test]
    fn top2_follows_greedy_tie_order() {
        let v = [1.0, 3.0, 3.0, 2.0];
        assert_eq!(top2(&v), vec![(1, 3.0), (2, 3.0)]);
        assert_eq!(top2(&v)[0].0, m3_core::sample::greedy(&v));
        assert_eq!(top2(&[0.5]), vec![(0, 0.5)]);
    }

    /// A discrete difference with the given reference gap (margin: golden's
    /// router margin 1e-3, or topk 2e-2 for blocks).
    fn flip(layer: usize, kind: ChoiceKind, row: usize, gap: Option<f64>) -> DiscreteDiff {
        let margin = match kind {
            ChoiceKind::Experts => 1e-3,
            ChoiceKind::Blocks | ChoiceKind::ActCodes => 2e-2,
        };
        diff_of(
            layer,
            kind,
            row,
            (kind == ChoiceKind::Blocks).then_some(0),
            &[1, 4],
            &[1, 5],
            |e| match e {
                4 => gap.map(|g| 0.5 + g),
                5 => gap.map(|_| 0.5),
                _ => Some(0.9),
            },
            margin,
        )
        .expect("the selections differ")
    }

    #[test]
    fn a_near_tie_flip_upstream_is_accepted() {
        // residuals at summation noise until the flip at layer 2, large after
        let residual = [2e-4, 3e-4, 0.4, 0.6];
        let d = flip(2, ChoiceKind::Experts, 40, Some(3e-4));
        assert_eq!((d.ref_only.clone(), d.be_only.clone()), (vec![4], vec![5]));
        assert!(
            (d.gap.expect("gap") - 3e-4).abs() < 1e-12 && d.near_tie,
            "{d:?}"
        );
        let u = judge_upstream(&residual, std::slice::from_ref(&d), RESIDUAL_JUMP);
        assert!(u.near_tie, "{u:?}");
        // the logits MISMATCH becomes near-tie-upstream, and only that
        let a = row(64, &[(7, 3.0), (9, 1.0)]);
        let b = row(64, &[(7, 1.0), (9, 3.0)]);
        let j = judge(&a, &b, 7, 9, 1e-3).expect("judge");
        assert_eq!(j.verdict, Verdict::Mismatch);
        assert_eq!(final_verdict(&j, Some(&u)), Verdict::NearTieUpstream);
        assert_eq!(final_verdict(&j, None), Verdict::Mismatch);
        // an indexer flip at layer 0 (nothing before it) within topk margin
        let b0 = flip(0, ChoiceKind::Blocks, 12, Some(5e-3));
        assert!(judge_upstream(&[0.2, 0.5], &[b0], RESIDUAL_JUMP).near_tie);
        // non-finite logits stay a MISMATCH whatever the upstream says
        let nan = row(64, &[(7, 3.0), (9, f32::NAN)]);
        let j = judge(&nan, &b, 7, 9, 1e-3).expect("judge");
        assert_eq!(final_verdict(&j, Some(&u)), Verdict::Mismatch);
    }

    #[test]
    fn a_residual_jump_before_any_flip_is_a_mismatch() {
        // layer 1 already differs by 5e-2 (a numeric bug); the near-tie flip
        // at layer 2 is its consequence, not an excuse
        let residual = [2e-4, 5e-2, 0.4];
        let d = flip(2, ChoiceKind::Experts, 3, Some(1e-4));
        let u = judge_upstream(&residual, &[d], RESIDUAL_JUMP);
        assert!(!u.near_tie && u.reason.contains("layer 1"), "{u:?}");
        // a non-finite residual counts as a jump
        let d = flip(2, ChoiceKind::Experts, 3, Some(1e-4));
        assert!(!judge_upstream(&[1e-4, f64::NAN, 0.4], &[d], RESIDUAL_JUMP).near_tie);
        // no flip at all but a jump: numeric
        let u = judge_upstream(&residual, &[], RESIDUAL_JUMP);
        assert!(!u.near_tie && u.reason.contains("layer 1"), "{u:?}");
        assert!(!judge_upstream(&[1e-4, 2e-4], &[], RESIDUAL_JUMP).near_tie);
    }

    #[test]
    fn a_flip_that_is_not_a_near_tie_is_a_mismatch() {
        // the planted error: the backend picks an expert the reference
        // scores 4e-2 lower, with every residual before it at noise level
        let residual = [2e-4, 3e-4, 0.4];
        let d = flip(2, ChoiceKind::Experts, 7, Some(4e-2));
        assert!(!d.near_tie);
        let u = judge_upstream(&residual, &[d], RESIDUAL_JUMP);
        assert!(
            !u.near_tie && u.reason.contains("not below the margin"),
            "{u:?}"
        );
        // one near tie and one real flip in the same layer and kind: mismatch
        let ds = [
            flip(2, ChoiceKind::Experts, 3, Some(1e-4)),
            flip(2, ChoiceKind::Experts, 9, Some(4e-2)),
        ];
        assert!(!judge_upstream(&residual, &ds, RESIDUAL_JUMP).near_tie);
        // an unknown gap (no router scores) is never a near tie
        let d = flip(2, ChoiceKind::Experts, 3, None);
        assert!(d.gap.is_none() && !d.near_tie);
        assert!(!judge_upstream(&residual, &[d], RESIDUAL_JUMP).near_tie);
        // a block gap within the router margin but judged by topk's: tie;
        // beyond topk's: not
        assert!(flip(1, ChoiceKind::Blocks, 0, Some(1.5e-2)).near_tie);
        assert!(!flip(1, ChoiceKind::Blocks, 0, Some(3e-2)).near_tie);
    }

    #[test]
    fn gaps_and_rel_l2_handle_edge_cases() {
        // padded selections: -1 ignored, order ignored
        assert!(diff_of(
            0,
            ChoiceKind::Blocks,
            0,
            Some(0),
            &[0, 3, -1],
            &[3, 0, -1],
            |_| None,
            1.0
        )
        .is_none());
        // worst pair: max over ref-only minus min over backend-only
        let s = |e: i32| Some([0.0, 0.9, 0.8, 0.7, 0.1][e as usize]);
        assert_eq!(score_gap(s, &[1, 2], &[3, 4]), Some(0.9 - 0.1));
        assert_eq!(score_gap(|_| Some(f64::NEG_INFINITY), &[1], &[2]), None);
        let (r, m) = rel_l2(&[3.0, 4.0], &[3.0, 4.5]);
        assert!((r - 0.1).abs() < 1e-12 && (m - 0.5).abs() < 1e-12);
        assert!(rel_l2(&[1.0], &[f32::INFINITY]).0.is_nan());
        assert!(rel_l2(&[1.0], &[1.0, 2.0]).0.is_nan());
    }

    /// A diagnosis of 3 layers x 4 rows: `first_jump` the layer whose row 0
    /// jumps (explained when `diffs` holds a difference at that layer and
    /// row 0).
    fn diag(first_jump: Option<usize>, diffs: Vec<DiscreteDiff>) -> Diagnosis {
        let explained = |l: usize| diffs.iter().any(|d| d.layer == l && d.row == 0);
        let unexplained = first_jump.filter(|&l| !explained(l));
        let layer = |l: usize| LayerDiag {
            layer: l,
            residual_rel_l2_last: 1e-4,
            residual_max_abs_last: 1e-4,
            residual_rel_l2_max_row: if Some(l) == first_jump { 0.5 } else { 2e-4 },
            residual_worst_row: 0,
            attn_out_rel_l2_last: None,
            ffn_out_rel_l2_last: None,
            expert_rows_differ: 0,
            block_rows_differ: 0,
            act_code_flips: None,
            jump_rows: usize::from(Some(l) == first_jump),
            unexplained_jump_rows: usize::from(Some(l) == unexplained),
        };
        let worst: Vec<f64> = (0..3).map(|l| layer(l).residual_rel_l2_max_row).collect();
        Diagnosis {
            rows: 4,
            residual_jump: RESIDUAL_JUMP,
            layers: (0..3).map(layer).collect(),
            first_jump_layer_last_row: None,
            first_jump_layer_any_row: first_jump,
            discrete_differences: diffs.len(),
            first_discrete: diffs.first().cloned(),
            upstream: judge_upstream(&worst, &diffs, RESIDUAL_JUMP),
            not_near_ties: diffs.iter().filter(|d| !d.near_tie).count(),
            unexplained_jumps: usize::from(unexplained.is_some()),
            first_unexplained_jump: unexplained.map(|l| (l, 0)),
            discrete: diffs,
            router_gap_note: None,
        }
    }

    #[test]
    fn teacher_forced_agreement_explains_a_free_running_mismatch() {
        // free-running logits disagree (a real MISMATCH by the logits
        // alone), but teacher-forced every layer agrees and so do the
        // teacher-forced logits: near-tie-upstream
        let a = row(64, &[(7, 3.0), (9, 1.0)]);
        let b = row(64, &[(7, 1.0), (9, 3.0)]);
        let free = judge(&a, &b, 7, 9, 1e-3).expect("judge");
        let tf_same = judge(&a, &a, 7, 7, 1e-3).expect("judge");
        let u = judge_teacher_forced(&diag(None, vec![]), &tf_same);
        assert!(u.near_tie, "{u:?}");
        assert_eq!(final_verdict(&free, Some(&u)), Verdict::NearTieUpstream);
        // the comparison can fail: teacher-forced logits that still
        // disagree, a teacher-forced layer that jumps, or a flip that is
        // not a near tie keep the MISMATCH
        let tf_diff = judge(&a, &b, 7, 9, 1e-3).expect("judge");
        assert!(!judge_teacher_forced(&diag(None, vec![]), &tf_diff).near_tie);
        assert!(!judge_teacher_forced(&diag(Some(1), vec![]), &tf_same).near_tie);
        let d = flip(1, ChoiceKind::Experts, 0, Some(4e-2));
        assert!(!judge_teacher_forced(&diag(None, vec![d]), &tf_same).near_tie);
        // a row that jumps at its own near-tie choice is explained; the same
        // jump on a layer whose only choice is another layer's is not
        let d = flip(1, ChoiceKind::Experts, 0, Some(3e-4));
        let u = judge_teacher_forced(&diag(Some(1), vec![d.clone()]), &tf_same);
        assert!(u.near_tie, "{u:?}");
        let u = judge_teacher_forced(&diag(Some(2), vec![d]), &tf_same);
        assert!(!u.near_tie && u.reason.contains("layer 2 row 0"), "{u:?}");
    }

    #[test]
    fn activation_code_flips_are_near_ties_only_within_a_bf16_step() {
        // a row of 64 values; value 5 sits just above the E2M1 rounding
        // boundary between 2 and 3 (x scale) and the backend's is one bf16
        // step below it: one code flips, a near tie
        let mut a: Vec<f32> = (0..64).map(|i| ((i as f32) * 0.37).sin()).collect();
        a[0] = 6.0; // block 0's scale: 1
        a[5] = 2.515625; // one bf16 step (2^-6) above the 2.5 boundary: 3
        let mut b = a.clone();
        b[5] = 2.5; // on the boundary, ties to even: 2
        let d = act_code_diff(3, 7, &a, &b).expect("a code differs");
        assert_eq!((d.layer, d.row, d.kind), (3, 7, ChoiceKind::ActCodes));
        assert_eq!(d.ref_ids, vec![5]);
        assert!(d.near_tie, "{d:?}");
        assert!(act_code_diff(3, 7, &a, &a).is_none());
        // the planted error: a value moved by 10% flips a code too, and is
        // not a near tie
        let mut c = a.clone();
        c[5] = 2.25;
        let d = act_code_diff(3, 7, &a, &c).expect("a code differs");
        assert!(!d.near_tie && d.gap.is_some_and(|g| g > 0.05), "{d:?}");
        // a block whose scale moves: judged on the block's largest value
        let mut e = a.clone();
        e[0] = 12.5; // the scale doubles: many codes move, gap ~1.08
        let d = act_code_diff(0, 0, &a, &e).expect("codes differ");
        assert!(!d.near_tie, "{d:?}");
        // shapes that cannot be judged
        assert!(act_code_diff(0, 0, &a[..30], &b[..30]).is_none());
        assert!(act_code_diff(0, 0, &a, &b[..32]).is_none());
    }

    #[test]
    fn mxfp4_code_flips_are_counted() {
        let a: Vec<f32> = (0..64).map(|i| (i as f32 * 0.37).sin()).collect();
        assert_eq!(mxfp4_code_flips(&a, &a, 32), Some(0));
        // one value's sign flipped (not its block's largest magnitude, so
        // the block scale stays): exactly one code differs
        let mut b = a.clone();
        b[5] = -b[5];
        assert_eq!(mxfp4_code_flips(&a, &b, 32), Some(1));
        assert_eq!(mxfp4_code_flips(&a, &a[..32], 32), None);
    }
}
