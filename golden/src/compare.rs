//! Compare a backend's dumped taps with a golden case (teacher forcing:
//! every layer ran on the reference's own input, so layers are judged one
//! by one) and produce the report rows.

use std::fmt;

use crate::case::Case;
use crate::tensors::{Tap, Taps};

/// Outcome of one row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Pass,
    /// Discrete mismatches, every one a near-tie of the reference.
    NearTie,
    Fail,
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Verdict::Pass => "pass",
            Verdict::NearTie => "near-tie",
            Verdict::Fail => "FAIL",
        })
    }
}

/// What a row measured.
#[derive(Clone, Debug, PartialEq)]
pub enum Measure {
    /// Continuous tensor: relative L2 and max-abs error, with the tolerances.
    Continuous {
        rel_l2: f64,
        max_abs: f64,
        tol: crate::case::Tolerance,
    },
    /// Discrete ids: rows (token or head-token) whose id set differs, how
    /// many of them are near-ties (reference gap below `margin`), and the
    /// first unexplained one.
    Discrete {
        rows: usize,
        mismatches: usize,
        near_ties: usize,
        margin: f64,
        first_unexplained: Option<String>,
    },
    /// The tap is missing or has the wrong shape / dtype.
    Broken(String),
}

/// One line of the parity table.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    pub case: String,
    pub tensor: String,
    /// Decoder layer, `None` for `logits`.
    pub layer: Option<usize>,
    /// The op the tensor is the output of (for "first divergence").
    pub op: &'static str,
    pub measure: Measure,
    pub verdict: Verdict,
}

/// All rows of one case, in layer order (within a layer: indexer
/// selection, router choice, layer output), then logits.
#[derive(Clone, Debug, PartialEq)]
pub struct Report {
    pub case: String,
    pub backend: String,
    pub rows: Vec<Row>,
}

impl Report {
    pub fn passed(&self) -> bool {
        self.rows.iter().all(|r| r.verdict != Verdict::Fail)
    }

    /// The first failing row in forward order: the layer and op that
    /// diverge first.
    pub fn first_divergence(&self) -> Option<&Row> {
        self.rows.iter().find(|r| r.verdict == Verdict::Fail)
    }

    /// Rows with a failure.
    pub fn failures(&self) -> impl Iterator<Item = &Row> {
        self.rows.iter().filter(|r| r.verdict == Verdict::Fail)
    }
}

fn rel_l2_max_abs(got: &[f32], want: &[f32]) -> (f64, f64) {
    let mut num = 0.0f64;
    let mut den = 0.0f64;
    let mut max_abs = 0.0f64;
    for (&g, &w) in got.iter().zip(want) {
        let d = f64::from(g) - f64::from(w);
        num += d * d;
        den += f64::from(w) * f64::from(w);
        // NaN anywhere must fail, never compare as "smaller".
        let a = if d.is_nan() { f64::INFINITY } else { d.abs() };
        max_abs = max_abs.max(a);
    }
    let rel = if den > 0.0 {
        (num / den).sqrt()
    } else {
        num.sqrt()
    };
    (if rel.is_nan() { f64::INFINITY } else { rel }, max_abs)
}

/// An F32 tap as (shape, data).
type F32Tap<'a> = (&'a Vec<usize>, &'a Vec<f32>);

/// The case's F32 tap `name` and the dumped one; an error naming what is
/// missing or of another dtype.
fn f32_taps<'a>(
    case: &'a Case,
    name: &str,
    got: Option<&'a Tap>,
) -> Result<(F32Tap<'a>, F32Tap<'a>), String> {
    let want = match case.taps.get(name) {
        Some(Tap::F32 { shape, data }) => (shape, data),
        _ => return Err(format!("case has no F32 {name}")),
    };
    let got = match got {
        Some(Tap::F32 { shape, data }) => (shape, data),
        Some(_) => return Err("dumped tap is not F32".into()),
        None => return Err("missing from the dump".into()),
    };
    Ok((want, got))
}

fn continuous(
    case: &Case,
    name: &str,
    got: Option<&Tap>,
    row_from: usize,
) -> Result<(f64, f64), String> {
    let (want, (gshape, gdata)) = f32_taps(case, name, got)?;
    // The case may hold only the last rows (logits of long prompts).
    let width: usize = want.0.iter().skip(1).product();
    let rows_want = want.0.first().copied().unwrap_or(0);
    let expected_shape: Vec<usize> = std::iter::once(rows_want + row_from)
        .chain(want.0.iter().skip(1).copied())
        .collect();
    if *gshape != expected_shape {
        return Err(format!("shape {gshape:?}, expected {expected_shape:?}"));
    }
    let start = row_from * width;
    Ok(rel_l2_max_abs(&gdata[start..], want.1))
}

/// Discrete comparison of `[.., rows, k]` id tensors, `margins` holding the
/// reference's gap per row (same leading shape).
fn discrete(
    case: &Case,
    name: &str,
    got: Option<&Tap>,
    margin_name: &str,
    margin: f64,
) -> Result<(usize, usize, usize, Option<String>), String> {
    let (wshape, wdata) = match case.taps.get(name) {
        Some(Tap::I32 { shape, data }) => (shape, data),
        _ => return Err(format!("case has no I32 {name}")),
    };
    let (gshape, gdata) = match got {
        Some(Tap::I32 { shape, data }) => (shape, data),
        Some(_) => return Err("dumped tap is not I32".into()),
        None => return Err("missing from the dump".into()),
    };
    if gshape != wshape {
        return Err(format!("shape {gshape:?}, expected {wshape:?}"));
    }
    let margins = match case.taps.get(margin_name) {
        Some(Tap::F32 { data, .. }) => data.as_slice(),
        _ => &[][..],
    };
    let k = wshape.last().copied().unwrap_or(1).max(1);
    let t = if wshape.len() >= 2 {
        wshape[wshape.len() - 2]
    } else {
        1
    };
    let rows = wdata.len() / k;
    let (mut mism, mut ties) = (0usize, 0usize);
    let mut first = None;
    for r in 0..rows {
        let w = &wdata[r * k..(r + 1) * k];
        let g = &gdata[r * k..(r + 1) * k];
        if w == g {
            continue;
        }
        mism += 1;
        let m = margins.get(r).map(|&m| f64::from(m)).unwrap_or(f64::NAN);
        if m < margin {
            ties += 1;
        } else if first.is_none() {
            let (head, tok) = (r / t, r % t);
            let at = if wshape.len() == 3 {
                format!("head {head} row {tok}")
            } else {
                format!("row {tok}")
            };
            first = Some(format!(
                "{at}: got {g:?}, want {w:?}, reference gap {m:.3e}"
            ));
        }
    }
    Ok((rows, mism, ties, first))
}

/// Compare `dump` (a backend's taps for the case's prompt, run with
/// `--teacher` = the case's residuals) against `case`.
pub fn compare(case: &Case, dump: &Taps, backend: &str) -> Report {
    let meta = &case.meta;
    let mut rows = Vec::new();
    let cname = meta.name.clone();
    let mut push = |tensor: String, layer: Option<usize>, op: &'static str, measure: Measure| {
        rows.push(Row {
            case: cname.clone(),
            tensor,
            layer,
            op,
            verdict: verdict(&measure),
            measure,
        });
    };
    let disc = |name: &str, margin_name: &str, margin: f64| match discrete(
        case,
        name,
        dump.get(name),
        margin_name,
        margin,
    ) {
        Ok((rows, mismatches, near_ties, first_unexplained)) => Measure::Discrete {
            rows,
            mismatches,
            near_ties,
            margin,
            first_unexplained,
        },
        Err(e) => Measure::Broken(e),
    };
    let cont = |name: &str, row_from: usize| {
        let tol = meta.tolerances.get(name).copied();
        match (tol, continuous(case, name, dump.get(name), row_from)) {
            (Some(tol), Ok((rel_l2, max_abs))) => Measure::Continuous {
                rel_l2,
                max_abs,
                tol,
            },
            (None, _) => Measure::Broken("no tolerance in the case".into()),
            (_, Err(e)) => Measure::Broken(e),
        }
    };
    for l in 0..meta.num_layers {
        let tb = format!("topk_blocks.{l}");
        if case.taps.get(&tb).is_some() {
            let m = disc(&tb, &format!("topk_margin.{l}"), meta.near_tie.topk_margin);
            push(tb, Some(l), "indexer block selection", m);
        } else if dump.get(&tb).is_some() {
            // A full-attention (or dense) layer of the reference must not
            // select blocks / experts in the backend either.
            let m = Measure::Broken("dumped, but the reference layer has none".into());
            push(tb, Some(l), "indexer block selection", m);
        }
        let ex = format!("experts.{l}");
        if case.taps.get(&ex).is_some() {
            let m = disc(
                &ex,
                &format!("router_margin.{l}"),
                meta.near_tie.router_margin,
            );
            push(ex, Some(l), "router top-k", m);
        } else if dump.get(&ex).is_some() {
            let m = Measure::Broken("dumped, but the reference layer has none".into());
            push(ex, Some(l), "router top-k", m);
        }
        let rs = format!("residual.{l}");
        let m = cont(&rs, 0);
        push(rs, Some(l), "layer output (attention + FFN)", m);
    }
    let m = cont("logits", meta.logits_rows_from);
    push("logits".into(), None, "final norm + LM head", m);
    rows.extend(draft_rows(case, dump));
    Report {
        case: meta.name.clone(),
        backend: backend.to_string(),
        rows,
    }
}

/// A row's verdict from what it measured.
fn verdict(measure: &Measure) -> Verdict {
    match measure {
        Measure::Continuous {
            rel_l2,
            max_abs,
            tol,
        } => {
            if *rel_l2 <= tol.rel_l2 && *max_abs <= tol.max_abs {
                Verdict::Pass
            } else {
                Verdict::Fail
            }
        }
        Measure::Discrete {
            mismatches,
            near_ties,
            ..
        } => {
            if *mismatches == 0 {
                Verdict::Pass
            } else if near_ties == mismatches {
                Verdict::NearTie
            } else {
                Verdict::Fail
            }
        }
        Measure::Broken(_) => Verdict::Fail,
    }
}

/// Only the draft rows of a draft case (none for a model case): `dump`
/// holds the `draft.*` tensors of `m3_golden::run_eagle3` (or of `m3
/// forward --eagle3-steps`), run on the case's own residuals.
pub fn compare_draft(case: &Case, dump: &Taps, backend: &str) -> Report {
    Report {
        case: case.meta.name.clone(),
        backend: backend.to_string(),
        rows: draft_rows(case, dump),
    }
}

/// The draft rows in forward order: `draft.g`, `draft.hidden`,
/// `draft.logits`, `draft.tokens`.
fn draft_rows(case: &Case, dump: &Taps) -> Vec<Row> {
    let meta = &case.meta;
    let Some(d) = &meta.draft else {
        return Vec::new();
    };
    // Tokens first: a near-tie flip at step i sends later steps elsewhere,
    // so the continuous rows are compared up to step i.
    let (tok, upto) = draft_tokens(case, dump.get("draft.tokens"), d.token_margin);
    let cont = |name: &str, rows: usize| match (
        meta.tolerances.get(name).copied(),
        continuous_rows(case, name, dump.get(name), rows),
    ) {
        (Some(tol), Ok((rel_l2, max_abs))) => Measure::Continuous {
            rel_l2,
            max_abs,
            tol,
        },
        (None, _) => Measure::Broken("no tolerance in the case".into()),
        (_, Err(e)) => Measure::Broken(e),
    };
    [
        (
            "draft.g",
            "eagle3 fc (fused target features)",
            cont("draft.g", usize::MAX),
        ),
        (
            "draft.hidden",
            "eagle3 midlayer (step output)",
            cont("draft.hidden", upto),
        ),
        (
            "draft.logits",
            "eagle3 final norm + draft LM head",
            cont("draft.logits", upto),
        ),
        ("draft.tokens", "eagle3 greedy token + d2t", tok),
    ]
    .into_iter()
    .map(|(tensor, op, measure)| Row {
        case: meta.name.clone(),
        tensor: tensor.into(),
        layer: None,
        op,
        verdict: verdict(&measure),
        measure,
    })
    .collect()
}

/// The draft's proposed tokens against the reference's: exact, except a
/// first mismatch where the reference's top-2 gap is below `margin` (a
/// near-tie: later steps then follow another token and are not judged).
/// Returns the measure and how many leading steps the continuous draft
/// tensors are compared on.
fn draft_tokens(case: &Case, got: Option<&Tap>, margin: f64) -> (Measure, usize) {
    let want = match case.taps.get("draft.tokens") {
        Some(Tap::I32 { data, .. }) => data,
        _ => return (Measure::Broken("case has no I32 draft.tokens".into()), 0),
    };
    let got = match got {
        Some(Tap::I32 { shape, data }) if shape.as_slice() == [want.len()] => data,
        Some(t) => {
            return (
                Measure::Broken(format!(
                    "dumped draft.tokens is {:?}, expected I32 [{}]",
                    t.shape(),
                    want.len()
                )),
                0,
            )
        }
        None => return (Measure::Broken("missing from the dump".into()), 0),
    };
    let gaps = match case.taps.get("draft.logit_gap") {
        Some(Tap::F32 { data, .. }) => data.as_slice(),
        _ => &[][..],
    };
    let steps = want.len();
    let Some(i) = got.iter().zip(want).position(|(g, w)| g != w) else {
        let m = Measure::Discrete {
            rows: steps,
            mismatches: 0,
            near_ties: 0,
            margin,
            first_unexplained: None,
        };
        return (m, steps);
    };
    let gap = gaps.get(i).map(|&g| f64::from(g)).unwrap_or(f64::NAN);
    let tie = gap < margin;
    let m = Measure::Discrete {
        rows: steps,
        mismatches: 1,
        near_ties: usize::from(tie),
        margin,
        first_unexplained: (!tie).then(|| {
            format!(
                "step {i}: got token {}, want {}, reference gap {gap:.3e}",
                got[i], want[i]
            )
        }),
    };
    (m, i + 1)
}

/// Relative L2 and max-abs error over the first `rows` rows of `name`
/// (the shapes must agree in full).
fn continuous_rows(
    case: &Case,
    name: &str,
    got: Option<&Tap>,
    rows: usize,
) -> Result<(f64, f64), String> {
    let ((wshape, wdata), (gshape, gdata)) = f32_taps(case, name, got)?;
    if gshape != wshape {
        return Err(format!("shape {gshape:?}, expected {wshape:?}"));
    }
    let width: usize = wshape.iter().skip(1).product();
    let n = rows.saturating_mul(width).min(wdata.len());
    Ok(rel_l2_max_abs(&gdata[..n], &wdata[..n]))
}

/// Header of the table printed by `cargo xtask golden`.
pub fn table_header() -> String {
    format!(
        "{:<28} {:<7} {:<15} {:>10} {:>10} {:>21} {:<9}",
        "case", "backend", "tensor", "rel-L2", "max-abs", "tolerance", "verdict"
    )
}

/// One formatted table line per row.
pub fn table_lines(report: &Report) -> Vec<String> {
    report
        .rows
        .iter()
        .map(|r| {
            let (a, b, tol, extra) = match &r.measure {
                Measure::Continuous {
                    rel_l2,
                    max_abs,
                    tol,
                } => (
                    format!("{rel_l2:.2e}"),
                    format!("{max_abs:.2e}"),
                    format!("{:.1e} / {:.1e}", tol.rel_l2, tol.max_abs),
                    String::new(),
                ),
                Measure::Discrete {
                    rows,
                    mismatches,
                    near_ties,
                    margin,
                    first_unexplained,
                } => (
                    format!("{mismatches}/{rows}"),
                    format!("{near_ties} tie"),
                    format!("exact, gap<{margin:.0e}"),
                    first_unexplained
                        .as_ref()
                        .map(|s| format!("  {s}"))
                        .unwrap_or_default(),
                ),
                Measure::Broken(msg) => ("-".into(), "-".into(), "-".into(), format!("  {msg}")),
            };
            format!(
                "{:<28} {:<7} {:<15} {:>10} {:>10} {:>21} {:<9}{}",
                r.case, report.backend, r.tensor, a, b, tol, r.verdict, extra
            )
        })
        .collect()
}
