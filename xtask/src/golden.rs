//! `cargo xtask gen-golden` and `cargo xtask golden`.
//!
//! gen-golden: for each spec in `golden/gen/cases.json`, make the case's
//! checkpoint with `m3 synth` (cached by recipe under
//! `target/golden-ckpt/`), apply its config edit, and run the independent
//! numpy reference (`golden/gen/reference.py case`), which writes
//! `golden/cases/NAME.{json,safetensors}` (temp + rename).
//!
//! golden: for each committed case, regenerate (or reuse) the checkpoint,
//! run `m3 forward --teacher <case taps> --dump` on each backend (draft
//! cases add `--eagle3-steps K`: the EAGLE3 drafter on the same backend,
//! fed the teacher's residuals), compare with `m3_golden::compare` and
//! print the parity table; then the free-running greedy report. Exit
//! status non-zero on any failure.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use m3_golden::serde_json;
use m3_golden::{compare, table_header, table_lines, Case, Recipe, Verdict};

use crate::venv;

#[derive(clap::Args)]
pub struct GenGoldenArgs {
    /// Only the case with this name (default: every case of cases.json).
    #[arg(long)]
    case: Option<String>,
    /// Skip the reference's self-test (golden/gen/selftest.py).
    #[arg(long)]
    no_selftest: bool,
}

#[derive(clap::Args)]
pub struct GoldenArgs {
    /// Backends to run: cpu, gpu or all.
    #[arg(long, default_value = "cpu")]
    backend: String,
    /// Only the case with this name.
    #[arg(long)]
    case: Option<String>,
    /// Skip the free-running greedy report.
    #[arg(long)]
    no_free_run: bool,
    /// The GPU's decode path in the free-running report (`m3 generate
    /// --path`: auto, standard or mono). `mono` sends every decode step
    /// of the cases through the mono path (issue 13's parity).
    #[arg(long, default_value = "auto")]
    path: String,
    /// Read the cases from this directory instead of golden/cases.
    #[arg(long)]
    cases_dir: Option<PathBuf>,
}

fn root() -> PathBuf {
    venv::workspace_root()
}

fn run_checked(cmd: &mut Command, what: &str) -> Result<()> {
    let status = cmd.status().with_context(|| format!("starting {what}"))?;
    if !status.success() {
        bail!("{what} failed ({status})");
    }
    Ok(())
}

/// Build the `m3` binary (debug profile: opt-level 1 is enough for tiny),
/// or take the one `M3_BIN` names (no build).
fn build_m3() -> Result<PathBuf> {
    if let Ok(bin) = std::env::var("M3_BIN") {
        let bin = PathBuf::from(bin);
        if !bin.exists() {
            bail!("M3_BIN={}: no such file", bin.display());
        }
        return Ok(bin);
    }
    run_checked(
        Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
            .current_dir(root())
            .args(["build", "--quiet", "-p", "m3-cli"]),
        "cargo build -p m3-cli",
    )?;
    let target = std::env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| root().join("target"));
    let bin = target.join("debug").join("m3");
    if !bin.exists() {
        bail!("{} missing after the build", bin.display());
    }
    Ok(bin)
}

/// Apply a case's `config_edit` to a synthetic checkpoint: set the keys in
/// config.json (in `text_config` when the text config lives there) and,
/// for layers turned into full attention, drop their `index_*` tensors
/// from the weight map (MODEL.md 1: only sparse layers carry them).
fn apply_config_edit(dir: &Path, edit: &serde_json::Value) -> Result<()> {
    let cfg_path = dir.join("config.json");
    let text = std::fs::read_to_string(&cfg_path)
        .with_context(|| format!("reading {}", cfg_path.display()))?;
    let mut cfg: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", cfg_path.display()))?;
    let edits = edit
        .as_object()
        .context("config_edit must be a JSON object")?;
    let target = if cfg.get("text_config").is_some_and(|t| t.is_object()) {
        cfg.get_mut("text_config")
    } else {
        Some(&mut cfg)
    }
    .and_then(|v| v.as_object_mut())
    .with_context(|| format!("{}: not a JSON object", cfg_path.display()))?;
    for (k, v) in edits {
        target.insert(k.clone(), v.clone());
    }
    write_atomic(&cfg_path, serde_json::to_string_pretty(&cfg)?.as_bytes())?;
    let full: Vec<usize> = edits
        .get("layer_types")
        .and_then(|v| v.as_array())
        .map(|a| {
            a.iter()
                .enumerate()
                .filter(|(_, t)| t.as_str() == Some("full_attention"))
                .map(|(i, _)| i)
                .collect()
        })
        .unwrap_or_default();
    if !full.is_empty() {
        let idx_path = dir.join("model.safetensors.index.json");
        let text = std::fs::read_to_string(&idx_path)
            .with_context(|| format!("reading {}", idx_path.display()))?;
        let mut idx: serde_json::Value = serde_json::from_str(&text)?;
        let wm = idx
            .get_mut("weight_map")
            .and_then(|w| w.as_object_mut())
            .with_context(|| format!("{}: no weight_map", idx_path.display()))?;
        wm.retain(|name, _| {
            !full
                .iter()
                .any(|l| name.contains(&format!("layers.{l}.self_attn.index_")))
        });
        write_atomic(&idx_path, serde_json::to_string_pretty(&idx)?.as_bytes())?;
    }
    Ok(())
}

/// Add F32 scalar tensors (e.g. FP8 cache scales `self_attn.k_scale`) to
/// every layer of a checkpoint: a new shard plus weight-map entries.
/// `self_attn.index_*` scalars go to sparse layers only.
fn add_scalar_tensors(dir: &Path, scalars: &serde_json::Value) -> Result<()> {
    let cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json"))?)?;
    let text = cfg
        .get("text_config")
        .filter(|t| t.is_object())
        .unwrap_or(&cfg);
    let layers = text
        .get("num_hidden_layers")
        .and_then(|v| v.as_u64())
        .context("config.json: no num_hidden_layers")? as usize;
    let kinds: Vec<String> = text
        .get("layer_types")
        .and_then(|v| v.as_array())
        .map(|a| {
            a.iter()
                .map(|x| x.as_str().unwrap_or("").to_string())
                .collect()
        })
        .unwrap_or_else(|| vec!["minimax_m3_sparse".into(); layers]);
    let map = scalars
        .as_object()
        .context("scalar_tensors must be a JSON object")?;
    let shard = "model-golden-scalars.safetensors";
    let mut taps = m3_golden::Taps::default();
    for l in 0..layers {
        for (name, v) in map {
            if name.contains("index_") && kinds.get(l).map(String::as_str) == Some("full_attention")
            {
                continue;
            }
            let value = v
                .as_f64()
                .with_context(|| format!("scalar_tensors.{name}: not a number"))?
                as f32;
            taps.tensors.insert(
                format!("language_model.model.layers.{l}.{name}"),
                m3_golden::Tap::F32 {
                    shape: vec![],
                    data: vec![value],
                },
            );
        }
    }
    taps.save(&dir.join(shard))?;
    let idx_path = dir.join("model.safetensors.index.json");
    let mut idx: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&idx_path)?)?;
    let wm = idx
        .get_mut("weight_map")
        .and_then(|w| w.as_object_mut())
        .with_context(|| format!("{}: no weight_map", idx_path.display()))?;
    for name in taps.tensors.keys() {
        wm.insert(name.clone(), serde_json::Value::String(shard.into()));
    }
    write_atomic(&idx_path, serde_json::to_string_pretty(&idx)?.as_bytes())
}

fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    m3_golden::write_atomic(path, bytes).map_err(anyhow::Error::from)
}

/// The checkpoint of a recipe (+ edit), made once with `m3 synth` under
/// `target/golden-ckpt/<key>` (temp dir + rename, so a cached one is whole).
fn checkpoint(
    m3: &Path,
    recipe: &Recipe,
    edit: Option<&serde_json::Value>,
    scalars: Option<&serde_json::Value>,
) -> Result<PathBuf> {
    let base = root().join("target").join("golden-ckpt");
    std::fs::create_dir_all(&base).with_context(|| format!("creating {}", base.display()))?;
    let mut key = recipe.cache_key(edit);
    if let Some(sc) = scalars {
        key.push_str(&format!("-{}", Recipe::short_hash(&sc.to_string())));
    }
    let dir = base.join(&key);
    if dir.join("config.json").exists() {
        return Ok(dir);
    }
    let tmp = base.join(format!(".tmp-{key}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    let mut cmd = Command::new(m3);
    cmd.args(["synth", "--preset", &recipe.preset])
        .args(["--experts", &recipe.experts, "--dense", &recipe.dense])
        .args(["--seed", &recipe.seed.to_string()])
        .arg("--out")
        .arg(&tmp);
    if let Some(l) = recipe.layers {
        cmd.args(["--layers", &l.to_string()]);
    }
    if recipe.eagle3 {
        cmd.arg("--eagle3");
    }
    cmd.arg("-q").stdout(std::process::Stdio::null());
    run_checked(&mut cmd, &format!("m3 synth for {key}"))?;
    if let Some(e) = edit {
        apply_config_edit(&tmp, e)?;
    }
    if let Some(sc) = scalars {
        add_scalar_tensors(&tmp, sc)?;
    }
    std::fs::rename(&tmp, &dir)
        .with_context(|| format!("renaming {} to {}", tmp.display(), dir.display()))?;
    Ok(dir)
}

pub fn gen_golden(args: GenGoldenArgs) -> Result<()> {
    let gen = root().join("golden").join("gen");
    let specs_path = gen.join("cases.json");
    let specs: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(&specs_path)
            .with_context(|| format!("reading {}", specs_path.display()))?,
    )
    .with_context(|| format!("parsing {}", specs_path.display()))?;
    let cases = specs
        .get("cases")
        .and_then(|c| c.as_array())
        .with_context(|| format!("{}: no \"cases\" list", specs_path.display()))?;
    // Reuse cases need neither the reference (python) nor a checkpoint.
    let needs_reference = cases.iter().any(|s| {
        s.get("reference").is_none()
            && args
                .case
                .as_deref()
                .is_none_or(|c| s.get("name").and_then(|n| n.as_str()) == Some(c))
    });
    let (py, m3) = if needs_reference {
        let py = venv::python(&[])?;
        if !args.no_selftest {
            run_checked(
                Command::new(&py).arg(gen.join("selftest.py")),
                "golden/gen/selftest.py",
            )?;
        }
        (py, build_m3()?)
    } else {
        (PathBuf::new(), PathBuf::new())
    };
    let out_dir = m3_golden::cases_dir();
    std::fs::create_dir_all(&out_dir)?;
    let mut done = 0;
    for spec in cases {
        let name = spec
            .get("name")
            .and_then(|n| n.as_str())
            .with_context(|| format!("{}: a case without a name", specs_path.display()))?;
        if args.case.as_deref().is_some_and(|c| c != name) {
            continue;
        }
        if spec.get("reference").is_some() {
            write_reuse_case(spec, name, cases, &out_dir)
                .with_context(|| format!("{}: case {name}", specs_path.display()))?;
            done += 1;
            continue;
        }
        let recipe: Recipe =
            serde_json::from_value(spec.get("recipe").cloned().unwrap_or_default())
                .with_context(|| format!("{}: case {name}: bad recipe", specs_path.display()))?;
        let ckpt = checkpoint(
            &m3,
            &recipe,
            spec.get("config_edit"),
            spec.get("scalar_tensors"),
        )?;
        run_checked(
            Command::new(&py)
                .arg(gen.join("reference.py"))
                .args(["case", "--model"])
                .arg(&ckpt)
                .args(["--spec", &spec.to_string(), "--out-dir"])
                .arg(&out_dir),
            &format!("reference.py case {name}"),
        )?;
        done += 1;
    }
    if done == 0 {
        bail!("no case matched");
    }
    eprintln!(
        "gen-golden: {done} case(s) written to {}",
        out_dir.display()
    );
    Ok(())
}

/// A reuse case's sidecar (golden/README.md, *Reuse cases*), from its
/// spec and its reference's committed case: no reference run, no tensors.
/// The spec's recipe, config edit, scalar tensors and prompt must be its
/// reference spec's, its options the reference's plus lossless ones
/// (`Case::reuse` checks the written sidecar against the committed case).
fn write_reuse_case(
    spec: &serde_json::Value,
    name: &str,
    specs: &[serde_json::Value],
    out_dir: &Path,
) -> Result<()> {
    let reference = spec
        .get("reference")
        .and_then(|r| r.as_str())
        .context("reference: not a case name")?;
    let rspec = specs
        .iter()
        .find(|s| s.get("name").and_then(|n| n.as_str()) == Some(reference))
        .with_context(|| format!("reference {reference}: no such case in cases.json"))?;
    if rspec.get("reference").is_some() {
        bail!("reference {reference} is itself a reuse case: name a case with tensors");
    }
    for field in ["recipe", "config_edit", "scalar_tensors", "prompt"] {
        if spec.get(field) != rspec.get(field) {
            bail!(
                "{field} differs from its reference {reference}'s: a reuse case runs the reference's checkpoint and prompt"
            );
        }
    }
    let lossless = ["fold_shared_expert", "mxfp8_to_bf16"];
    let mut added = serde_json::Map::new();
    let mut rest = serde_json::Map::new();
    if let Some(o) = spec.get("options").and_then(|o| o.as_object()) {
        for (k, v) in o {
            if lossless.contains(&k.as_str()) {
                added.insert(k.clone(), v.clone());
            } else {
                rest.insert(k.clone(), v.clone());
            }
        }
    }
    let ropts = rspec
        .get("options")
        .cloned()
        .unwrap_or_else(|| serde_json::json!({}));
    if serde_json::Value::Object(rest) != ropts {
        bail!("options differ from its reference {reference}'s but for {lossless:?}");
    }
    let committed = Case::load(out_dir, reference).with_context(|| {
        format!(
            "reference {reference}: its committed case (cargo xtask gen-golden --case {reference})"
        )
    })?;
    let mut options = serde_json::to_value(&committed.meta.options)?;
    if let Some(o) = options.as_object_mut() {
        o.extend(added);
    }
    let reuse = m3_golden::ReuseMeta {
        name: name.to_string(),
        description: spec
            .get("description")
            .and_then(|d| d.as_str())
            .unwrap_or_default()
            .to_string(),
        reference: reference.to_string(),
        recipe: committed.meta.recipe.clone(),
        config_edit: committed.meta.config_edit.clone(),
        scalar_tensors: committed.meta.scalar_tensors.clone(),
        tokens: committed.meta.tokens.clone(),
        options: serde_json::from_value(options).context("options")?,
    };
    Case::reuse(reuse.clone(), committed).map_err(anyhow::Error::msg)?;
    let path = out_dir.join(format!("{name}.json"));
    write_atomic(&path, serde_json::to_string_pretty(&reuse)?.as_bytes())?;
    eprintln!("gen-golden: {name}: reuse case of {reference} (no tensors)");
    Ok(())
}

/// `m3 forward` flags for a case's options. Returns `Err(reason)` when this
/// build of `m3 forward` lacks a flag the case needs.
fn forward_flags(case: &Case, help: &str) -> std::result::Result<Vec<String>, String> {
    let o = &case.meta.options;
    let mut f = vec![
        "--kv-dtype".to_string(),
        o.kv_dtype.clone(),
        "--act".into(),
        o.act.clone(),
        "--selection".into(),
        o.selection.clone(),
    ];
    if o.nvfp4_as_mxfp4 {
        // The loader option that converts NVFP4 routed experts to MXFP4,
        // when `m3 forward` has one (else the checkpoint is converted file
        // to file first: see `model_for`).
        if let Some(flag) = load_time_conversion_flag(help) {
            f.push(flag.to_string());
        }
    }
    f.extend(online_quant_flags(case, help)?);
    // Lossless serving options of a reuse case (golden/README.md, *Reuse
    // cases*): the reference case's tensors hold for them as they are.
    for flag in o.lossless_flags() {
        if !help.contains(flag) {
            return Err(format!("m3 forward has no {flag}"));
        }
        f.push(flag.to_string());
    }
    Ok(f)
}

/// `--online-quant` (and `--online-quant-exclude`) of a case, or why this
/// build of `m3` cannot run it.
fn online_quant_flags(case: &Case, help: &str) -> std::result::Result<Vec<String>, String> {
    let o = &case.meta.options;
    let mut f = Vec::new();
    if let Some(q) = &o.online_quant {
        if !help.contains("--online-quant") {
            return Err("m3 forward has no --online-quant".into());
        }
        f.extend(["--online-quant".to_string(), q.clone()]);
        if let Some(x) = &o.online_quant_exclude {
            f.extend(["--online-quant-exclude".to_string(), x.clone()]);
        }
    }
    Ok(f)
}

fn load_time_conversion_flag(help: &str) -> Option<&'static str> {
    ["--nvfp4-as-mxfp4", "--nvfp4-to-mxfp4", "--convert-nvfp4"]
        .into_iter()
        .find(|fl| help.contains(fl))
}

/// The checkpoint a case runs on: the synthetic one, or for a case with
/// NVFP4 experts served as MXFP4 when `m3 forward` has no load-time
/// conversion flag, its `m3 convert --scale-rule even` copy (cached beside
/// it; the conversion is the same FORMATS.md rule file to file).
fn model_for(
    m3: &Path,
    ckpt: &Path,
    case: &Case,
    help: &str,
) -> Result<(PathBuf, Option<&'static str>)> {
    if !case.meta.options.nvfp4_as_mxfp4 || load_time_conversion_flag(help).is_some() {
        return Ok((ckpt.to_path_buf(), None));
    }
    let name = ckpt
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let conv = ckpt.with_file_name(format!("{name}-as-mxfp4"));
    if !conv.join("config.json").exists() {
        let tmp = ckpt.with_file_name(format!(".tmp-{name}-as-mxfp4-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        run_checked(
            Command::new(m3)
                .args(["convert", "-q", "--scale-rule", "even", "--from"])
                .arg(ckpt)
                .arg("--to")
                .arg(&tmp)
                .stdout(std::process::Stdio::null()),
            "m3 convert (NVFP4 -> MXFP4)",
        )?;
        std::fs::rename(&tmp, &conv)
            .with_context(|| format!("renaming {} to {}", tmp.display(), conv.display()))?;
    }
    Ok((
        conv,
        Some("NVFP4 -> MXFP4 by `m3 convert` (m3 forward has no load-time flag)"),
    ))
}

enum Outcome {
    Ran(m3_golden::Report),
    Skipped(String),
}

fn run_backend(
    m3: &Path,
    ckpt: &Path,
    case: &Case,
    backend: &str,
    help: &str,
    work: &Path,
) -> Result<Outcome> {
    let flags = match forward_flags(case, help) {
        Ok(f) => f,
        Err(reason) => return Ok(Outcome::Skipped(reason)),
    };
    if case.meta.options.fold_shared_expert && backend == "cpu" {
        // The CPU reference takes the flag and ignores it: a pass there
        // would test nothing.
        return Ok(Outcome::Skipped(
            "--fold-shared-expert is a GPU runner option (the CPU reference runs the shared expert one way)".into(),
        ));
    }
    let out = work.join(format!("{}-{backend}.safetensors", case.meta.name));
    let _ = std::fs::remove_file(&out);
    let mut cmd = Command::new(m3);
    cmd.arg("forward")
        .arg("--model")
        .arg(ckpt)
        .args(["--tokens", &case.tokens_arg()])
        .args(&flags)
        .arg("--teacher")
        .arg(&case.taps_path)
        .arg("--dump")
        .arg(&out);
    if let Some(d) = &case.meta.draft {
        // The draft's proposal, from the teacher's (reference) residuals.
        if d.kind != "eagle3" {
            bail!(
                "case {}: draft kind {}: only eagle3 draft cases run",
                case.meta.name,
                d.kind
            );
        }
        if !help.contains("--eagle3-steps") {
            return Ok(Outcome::Skipped("m3 forward has no --eagle3-steps".into()));
        }
        cmd.args(["--eagle3-steps", &d.steps.to_string()]);
    }
    if help.contains("--backend") {
        cmd.args(["--backend", backend]);
    } else if backend != "cpu" {
        return Ok(Outcome::Skipped("m3 forward has no --backend flag".into()));
    }
    let res = cmd.output().context("starting m3 forward")?;
    if !res.status.success() {
        let err = String::from_utf8_lossy(&res.stderr);
        let line = err
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("")
            .trim()
            .to_string();
        if backend != "cpu" {
            return Ok(Outcome::Skipped(format!(
                "m3 forward --backend {backend}: {line}"
            )));
        }
        bail!("m3 forward on case {} failed: {line}", case.meta.name);
    }
    let dump = m3_golden::Taps::load(&out)?;
    Ok(Outcome::Ran(compare(case, &dump, backend)))
}

/// Greedy tokens from Rust on `backend`, free running: `m3 generate`
/// (prefill, then one token at a time with the caches kept; on the GPU
/// with `--path path`), parsed from its `tokens [..]` summary. Cases with
/// a non-default selection mode fall back to repeated `m3 forward`
/// prefills (argmax of the last logits row, lowest id on ties), since
/// `m3 generate` has no `--selection`.
#[allow(clippy::too_many_arguments)]
fn rust_greedy(
    m3: &Path,
    ckpt: &Path,
    case: &Case,
    n: usize,
    work: &Path,
    help: &str,
    backend: &str,
    path: &str,
) -> Result<(Vec<u32>, String)> {
    let o = &case.meta.options;
    if o.selection == "per_kv_head" {
        let mut cmd = Command::new(m3);
        cmd.arg("generate").args(["--backend", backend]);
        if backend == "gpu" {
            cmd.args(["--path", path]);
        }
        let out = cmd
            .arg("--model")
            .arg(ckpt)
            .args([
                "--tokens",
                &case.tokens_arg(),
                "--max-tokens",
                &n.to_string(),
            ])
            .args([
                "--temperature",
                "0",
                "--kv-dtype",
                &o.kv_dtype,
                "--act",
                &o.act,
                "--ignore-eos",
            ])
            .args(online_quant_flags(case, help).map_err(anyhow::Error::msg)?)
            .args(o.lossless_flags())
            .output()
            .context("starting m3 generate")?;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if out.status.success() {
            if let Some(list) = text
                .rsplit("tokens [")
                .next()
                .and_then(|t| t.split(']').next())
            {
                let toks: std::result::Result<Vec<u32>, _> =
                    list.split(',').map(|t| t.trim().parse::<u32>()).collect();
                if let Ok(t) = toks {
                    if t.len() == n {
                        // the summary's "steps M mono / S standard"
                        let mono = text
                            .rsplit("| steps ")
                            .next()
                            .and_then(|r| r.split(" mono").next())
                            .and_then(|m| m.trim().parse::<u64>().ok());
                        if backend == "gpu" && path == "mono" && mono.is_none_or(|m| m == 0) {
                            bail!(
                                "m3 generate --path mono ran no step on the mono path ({mono:?})"
                            );
                        }
                        return Ok((
                            t,
                            match (backend, mono) {
                                ("gpu", Some(m)) => {
                                    format!("m3 generate --path {path}, {m} steps on the mono path")
                                }
                                _ => "m3 generate".into(),
                            },
                        ));
                    }
                }
            }
        }
    }
    let flags = forward_flags(case, help).map_err(anyhow::Error::msg)?;
    let mut toks = case.meta.tokens.clone();
    let mut out = Vec::new();
    let dump = work.join(format!("{}-greedy.safetensors", case.meta.name));
    for _ in 0..n {
        let ids: Vec<String> = toks.iter().map(|t| t.to_string()).collect();
        run_checked(
            Command::new(m3)
                .arg("forward")
                .arg("--model")
                .arg(ckpt)
                .args(["--tokens", &ids.join(",")])
                .args(&flags)
                .args(["--backend", backend])
                .arg("--dump")
                .arg(&dump)
                .stdout(std::process::Stdio::null()),
            "m3 forward (greedy step)",
        )?;
        let taps = m3_golden::Taps::load(&dump)?;
        let (shape, data) = taps.f32("logits", &dump.display().to_string())?;
        let vocab = shape.get(1).copied().unwrap_or(0);
        let last = &data[data.len() - vocab..];
        let mut best = 0usize;
        for (i, &v) in last.iter().enumerate() {
            if v > last[best] {
                best = i;
            }
        }
        out.push(best as u32);
        toks.push(best as u32);
    }
    Ok((out, "repeated m3 forward prefills".into()))
}

pub fn golden(args: GoldenArgs) -> Result<()> {
    let backends: Vec<&str> = match args.backend.as_str() {
        "cpu" => vec!["cpu"],
        "gpu" => vec!["gpu"],
        "all" => vec!["cpu", "gpu"],
        other => bail!("--backend {other}: expected cpu, gpu or all"),
    };
    if !["auto", "standard", "mono"].contains(&args.path.as_str()) {
        bail!("--path {}: expected auto, standard or mono", args.path);
    }
    let require_gpu = std::env::var("REQUIRE_GPU").is_ok_and(|v| v == "1");
    let dir = args.cases_dir.clone().unwrap_or_else(m3_golden::cases_dir);
    let mut names = Case::list(&dir)?;
    if let Some(c) = &args.case {
        names.retain(|n| n == c);
        if names.is_empty() {
            bail!("no case named {c} in {}", dir.display());
        }
    }
    if names.is_empty() {
        bail!(
            "no golden cases in {} (run cargo xtask gen-golden)",
            dir.display()
        );
    }
    let m3 = build_m3()?;
    let help_out = Command::new(&m3).args(["forward", "--help"]).output()?;
    let help = String::from_utf8_lossy(&help_out.stdout).into_owned();
    let work = root().join("target").join("golden-out");
    std::fs::create_dir_all(&work)?;
    println!("{}", table_header());
    let mut failed: Vec<String> = Vec::new();
    let mut skipped: Vec<String> = Vec::new();
    let mut near_ties = 0usize;
    let mut notes: Vec<String> = Vec::new();
    let mut cases = Vec::new();
    for name in &names {
        let case = Case::load(&dir, name)?;
        let scalars = case
            .meta
            .scalar_tensors
            .as_ref()
            .map(|m| serde_json::json!(m));
        let ckpt = checkpoint(
            &m3,
            &case.meta.recipe,
            case.meta.config_edit.as_ref(),
            scalars.as_ref(),
        )?;
        let (ckpt, note) = model_for(&m3, &ckpt, &case, &help)?;
        if let Some(n) = note {
            notes.push(format!("{name}: {n}"));
        }
        for &b in &backends {
            match run_backend(&m3, &ckpt, &case, b, &help, &work)? {
                Outcome::Ran(rep) => {
                    for line in table_lines(&rep) {
                        println!("{line}");
                    }
                    near_ties += rep
                        .rows
                        .iter()
                        .filter(|r| r.verdict == Verdict::NearTie)
                        .count();
                    if let Some(r) = rep.first_divergence() {
                        let layer = match r.layer {
                            Some(l) => format!("layer {l}"),
                            None if r.tensor.starts_with("draft.") => "the EAGLE3 draft".into(),
                            None => "after the last layer".into(),
                        };
                        failed.push(format!(
                            "{name} [{b}]: first divergence at {layer}, {} ({})",
                            r.op, r.tensor
                        ));
                    }
                }
                Outcome::Skipped(why) => {
                    println!("{name:<28} {b:<7} skipped: {why}");
                    if b == "gpu" && require_gpu {
                        failed.push(format!("{name} [gpu]: skipped under REQUIRE_GPU=1: {why}"));
                    } else {
                        skipped.push(format!("{name} [{b}]: {why}"));
                    }
                }
            }
        }
        cases.push((case, ckpt));
    }
    if !args.no_free_run {
        println!(
            "\nfree-running greedy ({} vs reference; not a pass criterion unless they differ without a near-tie):",
            backends.join(", ")
        );
        for ((case, ckpt), &b) in cases
            .iter()
            .flat_map(|c| backends.iter().map(move |b| (c, b)))
        {
            let Some(g) = &case.meta.greedy else { continue };
            // the run's name in the report: the case, and the backend (with
            // the GPU's decode path) where more than the CPU runs
            let name = match (b, backends.as_slice()) {
                (_, ["cpu"]) => case.meta.name.clone(),
                ("gpu", _) => format!("{} [gpu, --path {}]", case.meta.name, args.path),
                _ => format!("{} [{b}]", case.meta.name),
            };
            if b == "gpu" && case.meta.options.online_quant.is_some() && args.path == "mono" {
                // (the mono path refuses PTPC linears: their quantize
                // runs 1024-thread blocks)
                println!(
                    "{name}: free-running report skipped: the mono path takes no --online-quant"
                );
                skipped.push(format!(
                    "{name} free-running: --path mono with --online-quant"
                ));
                continue;
            }
            match rust_greedy(&m3, ckpt, case, g.n, &work, &help, b, &args.path) {
                Ok((rust, how)) => {
                    match rust.iter().zip(&g.tokens).position(|(a, b)| a != b) {
                        None => println!(
                            "{name}: {} greedy tokens identical ({how} vs the numpy reference)",
                            g.n
                        ),
                        Some(i) => {
                            let gap = g.logit_gap.get(i).copied().flatten().unwrap_or(f64::NAN);
                            let upto = |v: &[Option<f64>]| {
                                v.iter()
                                    .take(i + 1)
                                    .map(|m| m.unwrap_or(f64::INFINITY))
                                    .fold(f64::INFINITY, f64::min)
                            };
                            let rm = upto(&g.min_router_margin);
                            let tm = upto(&g.min_topk_margin);
                            let nt = &case.meta.near_tie;
                            // Two correct logits rows may each move by the
                            // logits tolerance: a smaller top-2 gap is a tie.
                            let logit_tie = 2.0
                                * case
                                    .meta
                                    .tolerances
                                    .get("logits")
                                    .map(|t| t.max_abs)
                                    .unwrap_or(0.0);
                            let tie =
                                gap < logit_tie || rm < nt.router_margin || tm < nt.topk_margin;
                            println!(
                                "{name}: first divergence at generated token {i} ({how}): rust {} vs reference {}; reference logit gap {gap:.3e}, min router gap {rm:.3e} and min block gap {tm:.3e} over steps 0..={i}: {}",
                                rust[i],
                                g.tokens[i],
                                if tie { "explained by a near-tie" } else { "NOT explained by a near-tie" }
                            );
                            if !tie {
                                failed.push(format!(
                                    "{name}: free-running divergence without a near-tie"
                                ));
                            }
                        }
                    }
                }
                Err(e) => {
                    println!("{name}: free-running report skipped: {e:#}");
                    if b == "gpu" && require_gpu {
                        failed.push(format!("{name} free-running: under REQUIRE_GPU=1: {e:#}"));
                    } else {
                        skipped.push(format!("{name} free-running: {e:#}"));
                    }
                }
            }
        }
    }
    println!();
    for n in &notes {
        println!("note: {n}");
    }
    for s in &skipped {
        println!("skipped: {s}");
    }
    if near_ties > 0 {
        println!("{near_ties} row(s) with near-tie mismatches only (reported, not failures)");
    }
    if !failed.is_empty() {
        for f in &failed {
            println!("FAIL {f}");
        }
        bail!("{} golden failure(s)", failed.len());
    }
    println!("golden: all {} case(s) pass", names.len());
    Ok(())
}
