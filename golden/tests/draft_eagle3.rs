//! The EAGLE3 draft cases on the CPU reference, in process: the synthetic
//! checkpoint of the case's recipe (`m3_core::synth`, what `m3 synth
//! --eagle3` writes), m3's drafter run by `m3_golden::run_eagle3` on the
//! reference's own residuals, held to the reference's proposal. Then planted
//! errors (one draft weight, the draft-to-target map) that the comparison
//! must catch, each at the row it breaks first. (`cargo xtask golden` runs
//! the same cases through `m3 forward --eagle3-steps` on each backend.)

use std::collections::BTreeMap;

use m3_core::checkpoint::eagle3_loader::load_eagle3;
use m3_core::checkpoint::{Checkpoint, LoadOptions};
use m3_core::config::ModelConfig;
use m3_core::eagle3::{Eagle3Config, Eagle3Weights};
use m3_core::formats::bf16;
use m3_core::sched::dspark_drafter::DraftTarget;
use m3_core::synth::{write_checkpoint, DenseFormat, ExpertFormat, SynthSpec};
use m3_core::weights::{LinearWeight, ModelWeights};
use m3_cpu_ref::CpuBackend;
use m3_golden::{cases_dir, compare_draft, run_eagle3, table_lines, Case, Report, Tap, Taps};

/// A loaded draft case with its regenerated checkpoint's target and draft.
struct Setup {
    case: Case,
    target: ModelWeights,
    draft: Eagle3Weights,
    _dir: tempfile::TempDir,
}

fn setup(name: &str) -> Setup {
    let case = Case::load(&cases_dir(), name).expect("committed case");
    let r = &case.meta.recipe;
    assert!(r.eagle3, "{name}: not a draft case");
    assert!(case.meta.config_edit.is_none() && case.meta.scalar_tensors.is_none());
    let mut cfg = ModelConfig::preset(&r.preset).unwrap();
    if let Some(l) = r.layers {
        cfg = cfg.with_layers(l).unwrap();
    }
    let experts = match r.experts.as_str() {
        "bf16" => ExpertFormat::Bf16,
        "mxfp4" => ExpertFormat::Mxfp4,
        "mxfp8" => ExpertFormat::Mxfp8,
        "nvfp4" => ExpertFormat::Nvfp4,
        other => panic!("{name}: recipe experts {other}"),
    };
    let dense = match r.dense.as_str() {
        "bf16" => DenseFormat::Bf16,
        "mxfp8" => DenseFormat::Mxfp8,
        other => panic!("{name}: recipe dense {other}"),
    };
    let mut spec = SynthSpec::new(cfg, experts, dense);
    spec.seed = r.seed;
    spec.eagle3 = Some(Eagle3Config::for_target(&spec.config));
    let dir = tempfile::tempdir().unwrap();
    let ck_dir = dir.path().join("ckpt");
    write_checkpoint(&spec, &ck_dir).unwrap();
    let ck = Checkpoint::open(&ck_dir).unwrap();
    let target = ck.load(&LoadOptions::default()).unwrap();
    let draft = load_eagle3(&ck_dir, ck.config())
        .unwrap()
        .expect("an eagle3/ draft");
    Setup {
        case,
        target,
        draft,
        _dir: dir,
    }
}

/// m3's drafter on the CPU reference with `draft`, held to the case.
fn run(s: &Setup, draft: &Eagle3Weights) -> Report {
    let meta = &s.case.meta;
    let steps = meta.draft.as_ref().expect("draft meta").steps;
    let file = s.case.taps_path.display().to_string();
    let mut features = BTreeMap::new();
    for &l in &draft.config.target_layer_ids {
        let (_, r) = s.case.taps.f32(&format!("residual.{l}"), &file).unwrap();
        features.insert(l, r.to_vec());
    }
    let target = DraftTarget {
        config: &s.target.config,
        embed: &s.target.embed,
        lm_head: &s.target.lm_head,
    };
    let out = run_eagle3(
        &CpuBackend::new(),
        target,
        draft,
        &meta.tokens,
        &features,
        steps,
    )
    .unwrap();
    let rep = compare_draft(&s.case, &Taps::from_core(&out), "cpu");
    for l in table_lines(&rep) {
        println!("{l}");
    }
    rep
}

/// `(row, col)` of a bf16 linear moved by `delta`.
fn perturb(w: &mut LinearWeight, row: usize, col: usize, delta: f32) {
    match w {
        LinearWeight::Bf16 { cols, data, .. } => {
            let i = row * *cols + col;
            data[i] = bf16::from_f32(bf16::to_f32(data[i]) + delta);
        }
        other => panic!("the synthetic draft is bf16, got {other:?}"),
    }
}

fn first_failure(rep: &Report) -> String {
    assert!(!rep.passed(), "a planted error passed");
    rep.first_divergence().map(|r| r.tensor.clone()).unwrap()
}

#[test]
fn eagle3_cases_pass_on_the_cpu_reference() {
    for name in ["tiny-eagle3-short", "tiny-eagle3-long"] {
        let s = setup(name);
        let rep = run(&s, &s.draft);
        assert_eq!(rep.rows.len(), 4, "{name}: the four draft rows");
        assert!(rep.passed(), "{name}: {:?}", rep.first_divergence());
    }
}

#[test]
fn planted_draft_errors_are_caught_where_they_enter() {
    let s = setup("tiny-eagle3-short");
    // Control: the unplanted draft passes on the same setup.
    assert!(run(&s, &s.draft).passed());

    // One fc weight: the fused features of every row move.
    let mut d = s.draft.clone();
    perturb(&mut d.fc, 3, 5, 1.0);
    assert_eq!(first_failure(&run(&s, &d)), "draft.g");

    // One o_proj weight: g is untouched, each step's output moves.
    let mut d = s.draft.clone();
    perturb(&mut d.o, 7, 11, 1.0);
    let rep = run(&s, &d);
    assert_eq!(first_failure(&rep), "draft.hidden");
    assert_eq!(rep.rows[0].tensor, "draft.g");
    assert!(rep.rows[0].verdict == m3_golden::Verdict::Pass);

    // One entry of the final norm: the outputs are right, the logits not.
    let mut d = s.draft.clone();
    d.final_norm[9] += 0.5;
    assert_eq!(first_failure(&run(&s, &d)), "draft.logits");

    // The draft-to-target map of the first proposed token sent elsewhere:
    // every tensor of step 0 matches, its token does not.
    let want0 = match s.case.taps.get("draft.tokens") {
        Some(Tap::I32 { data, .. }) => data[0] as u32,
        _ => panic!("draft.tokens"),
    };
    let mut d = s.draft.clone();
    let x = d
        .draft_to_target
        .iter()
        .position(|&t| t == want0)
        .expect("the proposed token is in the draft vocabulary");
    let y = (x + 1) % d.draft_to_target.len();
    d.draft_to_target.swap(x, y);
    let rep = run(&s, &d);
    assert_eq!(first_failure(&rep), "draft.tokens");
    let failing: Vec<&str> = rep.failures().map(|r| r.tensor.as_str()).collect();
    assert_eq!(failing, ["draft.tokens"], "later steps are not judged");
}
