//! The parity suite must catch what it claims to: a planted error in one
//! layer's residual, a flipped expert id, a flipped block id, a missing
//! tap and a NaN are each reported at exactly that layer and op, and a
//! mismatch at a reference near-tie is reported as such, not as a failure.

use m3_golden::{cases_dir, compare, Case, Measure, Tap, Taps, Verdict};

/// A committed case with a dense layer, MoE layers and engaged sparse
/// selection (any long-prompt case has them).
fn long_case() -> Case {
    let dir = cases_dir();
    let names = Case::list(&dir).expect("golden/cases is readable");
    let name = names
        .iter()
        .find(|n| n.contains("long") && !n.contains("full"))
        .unwrap_or_else(|| {
            panic!(
                "no long-prompt case in {} (cargo xtask gen-golden)",
                dir.display()
            )
        });
    Case::load(&dir, name).expect("the committed case loads")
}

/// A dump that equals the reference: the case's taps, with the logits
/// padded back to all T rows (the case keeps only the last rows).
fn perfect_dump(case: &Case) -> Taps {
    let mut taps = Taps::default();
    for (name, tap) in &case.taps.tensors {
        let keep = name.starts_with("residual.")
            || name.starts_with("topk_blocks.")
            || name.starts_with("experts.");
        if keep {
            taps.tensors.insert(name.clone(), tap.clone());
        }
    }
    let Some(Tap::F32 { shape, data }) = case.taps.get("logits") else {
        panic!("case without logits")
    };
    let from = case.meta.logits_rows_from;
    let vocab = shape[1];
    let mut full = vec![0.0f32; from * vocab];
    full.extend_from_slice(data);
    taps.tensors.insert(
        "logits".into(),
        Tap::F32 {
            shape: vec![from + shape[0], vocab],
            data: full,
        },
    );
    taps
}

fn failing(report: &m3_golden::Report) -> Vec<String> {
    report.failures().map(|r| r.tensor.clone()).collect()
}

#[test]
fn perfect_dump_passes_with_zero_error() {
    let case = long_case();
    let rep = compare(&case, &perfect_dump(&case), "test");
    assert!(rep.passed(), "{:?}", failing(&rep));
    for r in &rep.rows {
        match &r.measure {
            Measure::Continuous {
                rel_l2, max_abs, ..
            } => {
                assert_eq!((*rel_l2, *max_abs), (0.0, 0.0), "{}", r.tensor)
            }
            Measure::Discrete { mismatches, .. } => assert_eq!(*mismatches, 0, "{}", r.tensor),
            Measure::Broken(m) => panic!("{}: {m}", r.tensor),
        }
    }
    // Every tap kind is judged: residuals, logits, blocks and experts.
    for t in ["residual.0", "logits", "topk_blocks.1", "experts.1"] {
        assert!(rep.rows.iter().any(|r| r.tensor == t), "no row for {t}");
    }
}

#[test]
fn planted_residual_error_names_exactly_that_layer() {
    let case = long_case();
    let mut dump = perfect_dump(&case);
    let layer = 2;
    let Some(Tap::F32 { data, shape }) = dump.tensors.get_mut(&format!("residual.{layer}")) else {
        panic!("no residual.{layer}")
    };
    // One element of one row, off by 1% of the tensor's RMS times sqrt(n):
    // a real bug of this size (rel-L2 1e-2) must not hide.
    let n = data.len() as f64;
    let rms = (data
        .iter()
        .map(|&v| f64::from(v) * f64::from(v))
        .sum::<f64>()
        / n)
        .sqrt();
    data[5 * shape[1] + 3] += (0.01 * rms * n.sqrt()) as f32;
    let rep = compare(&case, &dump, "test");
    assert!(!rep.passed());
    assert_eq!(failing(&rep), vec![format!("residual.{layer}")]);
    let first = rep.first_divergence().expect("a divergence");
    assert_eq!(first.layer, Some(layer));
}

#[test]
fn small_residual_error_within_tolerance_passes_and_just_past_it_fails() {
    let case = long_case();
    let name = "residual.1";
    let tol = case.meta.tolerances[name];
    for (scale, expect_pass) in [(0.5, true), (2.0, false)] {
        let mut dump = perfect_dump(&case);
        let Some(Tap::F32 { data, .. }) = dump.tensors.get_mut(name) else {
            panic!()
        };
        // A uniform relative error of `scale` x the rel-L2 tolerance, kept
        // under the max-abs tolerance where it should pass.
        let max = data.iter().fold(0.0f32, |m, &v| m.max(v.abs())) as f64;
        let rel = (scale * tol.rel_l2).min(0.9 * tol.max_abs / max.max(1e-30));
        let rel = if expect_pass { rel } else { scale * tol.rel_l2 };
        for v in data.iter_mut() {
            *v = (f64::from(*v) * (1.0 + rel)) as f32;
        }
        let rep = compare(&case, &dump, "test");
        let row = rep.rows.iter().find(|r| r.tensor == name).unwrap();
        assert_eq!(
            row.verdict == Verdict::Pass,
            expect_pass,
            "scale {scale}: {row:?}"
        );
    }
}

fn flip_expert(case: &Case, layer: usize, row: usize) -> Taps {
    let mut dump = perfect_dump(case);
    let Some(Tap::I32 { data, shape }) = dump.tensors.get_mut(&format!("experts.{layer}")) else {
        panic!("no experts.{layer}")
    };
    let k = shape[1];
    let chosen: Vec<i32> = data[row * k..(row + 1) * k].to_vec();
    // Replace the last chosen expert by the smallest id not chosen.
    let other = (0..).find(|e| !chosen.contains(e)).unwrap();
    let mut ids = chosen.clone();
    ids[k - 1] = other;
    ids.sort();
    data[row * k..(row + 1) * k].copy_from_slice(&ids);
    dump
}

#[test]
fn flipped_expert_id_names_that_layer_router() {
    let case = long_case();
    let layer = case
        .meta
        .mlp_kinds
        .iter()
        .rposition(|k| k == "moe")
        .expect("a MoE layer");
    // A row whose reference gap is comfortably above the near-tie margin.
    let Some(Tap::F32 { data: margins, .. }) = case.taps.get(&format!("router_margin.{layer}"))
    else {
        panic!("no router margins")
    };
    let row = margins
        .iter()
        .position(|&m| f64::from(m) > 10.0 * case.meta.near_tie.router_margin)
        .expect("a row that is not a near-tie");
    let rep = compare(&case, &flip_expert(&case, layer, row), "test");
    assert_eq!(failing(&rep), vec![format!("experts.{layer}")]);
    let first = rep.first_divergence().unwrap();
    assert_eq!((first.layer, first.op), (Some(layer), "router top-k"));
    match &first.measure {
        Measure::Discrete {
            mismatches,
            near_ties,
            first_unexplained,
            ..
        } => {
            assert_eq!((*mismatches, *near_ties), (1, 0));
            assert!(first_unexplained
                .as_ref()
                .unwrap()
                .contains(&format!("row {row}")));
        }
        m => panic!("{m:?}"),
    }
}

#[test]
fn flipped_expert_at_a_reference_near_tie_is_reported_not_failed() {
    let mut case = long_case();
    let layer = case.meta.mlp_kinds.iter().position(|k| k == "moe").unwrap();
    let row = 3;
    // Make row 3 a near-tie of the reference (gap below the margin).
    let Some(Tap::F32 { data, .. }) = case.taps.tensors.get_mut(&format!("router_margin.{layer}"))
    else {
        panic!()
    };
    data[row] = (case.meta.near_tie.router_margin * 0.5) as f32;
    let dump = flip_expert(&case, layer, row);
    let rep = compare(&case, &dump, "test");
    assert!(rep.passed());
    let r = rep
        .rows
        .iter()
        .find(|r| r.tensor == format!("experts.{layer}"))
        .unwrap();
    assert_eq!(r.verdict, Verdict::NearTie);
}

#[test]
fn flipped_block_id_names_that_layer_indexer() {
    let case = long_case();
    let layer = case
        .meta
        .attn_kinds
        .iter()
        .rposition(|k| k == "sparse")
        .expect("a sparse layer");
    let name = format!("topk_blocks.{layer}");
    let mut dump = perfect_dump(&case);
    let Some(Tap::I32 { data, shape }) = dump.tensors.get_mut(&name) else {
        panic!()
    };
    let (t, k) = (shape[1], shape[2]);
    let Some(Tap::F32 { data: margins, .. }) = case.taps.get(&format!("topk_margin.{layer}"))
    else {
        panic!()
    };
    // Last row of head 0: selection engaged there (T > block * topk); the
    // reference gap there must not be a near-tie for this test.
    let row = t - 1;
    assert!(
        f64::from(margins[row]) > case.meta.near_tie.topk_margin,
        "pick another row"
    );
    let ids = &mut data[row * k..(row + 1) * k];
    assert!(
        ids.iter().all(|&b| b >= 0),
        "selection engaged at the last row"
    );
    let other = (0..).find(|b| !ids.contains(b)).unwrap();
    ids[0] = other;
    ids.sort();
    let rep = compare(&case, &dump, "test");
    assert_eq!(failing(&rep), vec![name]);
    assert_eq!(
        rep.first_divergence().unwrap().op,
        "indexer block selection"
    );
}

#[test]
fn missing_tap_and_nan_fail() {
    let case = long_case();
    let mut dump = perfect_dump(&case);
    dump.tensors.remove("residual.3");
    let rep = compare(&case, &dump, "test");
    assert_eq!(failing(&rep), vec!["residual.3".to_string()]);
    let mut dump = perfect_dump(&case);
    if let Some(Tap::F32 { data, .. }) = dump.tensors.get_mut("logits") {
        let n = data.len();
        data[n - 1] = f32::NAN;
    }
    let rep = compare(&case, &dump, "test");
    assert_eq!(failing(&rep), vec!["logits".to_string()]);
}

#[test]
fn a_selection_where_the_reference_has_none_fails() {
    let case = long_case();
    let mut dump = perfect_dump(&case);
    // Layer 0 is dense: a backend that routes it is wrong.
    assert_eq!(case.meta.mlp_kinds[0], "dense");
    let t = case.meta.tokens.len();
    dump.tensors.insert(
        "experts.0".into(),
        Tap::I32 {
            shape: vec![t, 2],
            data: vec![0; 2 * t],
        },
    );
    let rep = compare(&case, &dump, "test");
    assert_eq!(failing(&rep), vec!["experts.0".to_string()]);
}

#[test]
fn taps_round_trip_through_safetensors() {
    let case = long_case();
    let dump = perfect_dump(&case);
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("d.safetensors");
    dump.save(&p).unwrap();
    assert_eq!(Taps::load(&p).unwrap(), dump);
}

#[test]
fn every_committed_case_loads_and_stays_compact() {
    let dir = cases_dir();
    let names = Case::list(&dir).unwrap();
    assert!(
        names.len() >= 8,
        "expected the committed cases, found {names:?}"
    );
    let mut bytes = 0u64;
    for n in &names {
        let c = Case::load(&dir, n).unwrap();
        assert_eq!(c.meta.name, *n);
        assert_eq!(
            c.meta.tokens.len(),
            c.taps.get("residual.0").unwrap().shape()[0]
        );
        // A reuse case has no tensors of its own.
        let exts: &[&str] = if c.reuses.is_some() {
            &["json"]
        } else {
            &["json", "safetensors"]
        };
        for ext in exts {
            bytes += std::fs::metadata(dir.join(format!("{n}.{ext}")))
                .unwrap()
                .len();
        }
    }
    assert!(bytes < 5 << 20, "golden/cases is {bytes} bytes, over 5 MiB");
}

/// The reuse cases (golden/README.md, *Reuse cases*): held to their
/// reference case's tensors and tolerances, with the lossless option in
/// their options, and a planted error still fails them.
#[test]
fn reuse_cases_hold_to_their_reference_and_can_fail() {
    let dir = cases_dir();
    for (name, reference, flag) in [
        (
            "tiny-bf16-short-fold",
            "tiny-bf16-short",
            "--fold-shared-expert",
        ),
        (
            "tiny-mxfp8-long-kvfp8-bf16",
            "tiny-mxfp8-long-kvfp8",
            "--mxfp8-to-bf16",
        ),
    ] {
        let case = Case::load(&dir, name).expect("the committed reuse case loads");
        let refc = Case::load(&dir, reference).unwrap();
        assert_eq!(case.reuses.as_deref(), Some(reference));
        assert_eq!(case.taps_path, refc.taps_path);
        assert_eq!(case.meta.tolerances, refc.meta.tolerances);
        assert_eq!(case.meta.options.lossless_flags(), vec![flag]);
        assert_eq!(case.meta.options.without_lossless(), refc.meta.options);
        assert!(!dir.join(format!("{name}.safetensors")).exists());
        // The reference's own taps pass; one planted residual error fails.
        let mut dump = perfect_dump(&case);
        assert!(compare(&case, &dump, "test").passed(), "{name}");
        let Some(Tap::F32 { data, .. }) = dump.tensors.get_mut("residual.1") else {
            panic!("no residual.1")
        };
        for v in data.iter_mut() {
            *v *= 1.01;
        }
        let rep = compare(&case, &dump, "test");
        assert_eq!(failing(&rep), vec!["residual.1".to_string()], "{name}");
    }
}

/// A reuse case whose recipe, prompt or options differ from its
/// reference's, that adds no lossless option, adds one that cannot apply,
/// reuses a reuse case or names a missing case is refused, naming the
/// case and the field.
#[test]
fn reuse_case_with_a_mismatch_is_refused() {
    let dir = cases_dir();
    let good = |name: &str| -> m3_golden::ReuseMeta {
        let text = std::fs::read_to_string(dir.join(format!("{name}.json"))).unwrap();
        m3_golden::serde_json::from_str(&text).unwrap()
    };
    let refused = |r: m3_golden::ReuseMeta, want: &str| {
        let referenced = Case::load(&dir, &r.reference).unwrap();
        let name = r.name.clone();
        let err = Case::reuse(r, referenced).expect_err(want);
        assert!(
            err.contains(&format!("case {name}")) && err.contains(want),
            "{err}"
        );
    };
    let fold = good("tiny-bf16-short-fold");
    let referenced = Case::load(&dir, &fold.reference).unwrap();
    assert!(Case::reuse(fold.clone(), referenced).is_ok());

    let mut r = fold.clone();
    r.recipe.seed += 1;
    refused(r, "recipe");
    let mut r = fold.clone();
    r.tokens.push(5);
    refused(r, "tokens");
    let mut r = fold.clone();
    r.options.kv_dtype = "fp8_e4m3".into();
    refused(r, "options");
    let mut r = fold.clone();
    r.options.fold_shared_expert = false;
    refused(r, "no lossless serving option");
    let mut r = fold.clone();
    r.options.mxfp8_to_bf16 = true;
    refused(r, "options.mxfp8_to_bf16");
    let mut r = good("tiny-mxfp8-long-kvfp8-bf16");
    r.scalar_tensors = None;
    refused(r, "scalar_tensors");
    // fold on a recipe whose shared expert is not in the experts' format
    let mut r = good("tiny-mxfp8-long-kvfp8-bf16");
    r.recipe = Case::load(&dir, "tiny-mxfp4-a16-long-shared")
        .unwrap()
        .meta
        .recipe;
    r.reference = "tiny-mxfp4-a16-long-shared".into();
    r.scalar_tensors = None;
    r.options.mxfp8_to_bf16 = false;
    r.options.kv_dtype = "bf16".into();
    r.options.selection = "shared".into();
    r.tokens = Case::load(&dir, &r.reference).unwrap().meta.tokens;
    r.options.fold_shared_expert = true;
    refused(r, "options.fold_shared_expert");

    // A reuse of a reuse case, and of a missing case, through Case::load.
    let tmp = tempfile::tempdir().unwrap();
    for f in ["tiny-bf16-short.json", "tiny-bf16-short.safetensors"] {
        std::fs::copy(dir.join(f), tmp.path().join(f)).unwrap();
    }
    let write = |r: &m3_golden::ReuseMeta| {
        std::fs::write(
            tmp.path().join(format!("{}.json", r.name)),
            m3_golden::serde_json::to_string(r).unwrap(),
        )
        .unwrap();
    };
    write(&fold);
    let mut chain = fold.clone();
    chain.name = "chain".into();
    chain.reference = fold.name.clone();
    write(&chain);
    let err = Case::load(tmp.path(), "chain").unwrap_err().to_string();
    assert!(
        err.contains("case chain") && err.contains("itself a reuse case"),
        "{err}"
    );
    let mut missing = fold.clone();
    missing.name = "orphan".into();
    missing.reference = "no-such-case".into();
    write(&missing);
    let err = Case::load(tmp.path(), "orphan").unwrap_err().to_string();
    assert!(
        err.contains("case orphan") && err.contains("no such case"),
        "{err}"
    );
    assert!(Case::list(tmp.path())
        .unwrap()
        .contains(&"orphan".to_string()));
}
