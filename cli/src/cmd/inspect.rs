//! `m3 inspect DIR`: what a checkpoint holds, before anyone runs it.
//!
//! Prints the config summary, a table of tensor families (format, example
//! logical shape, tensor count, parameters, bytes) and warnings for anything
//! odd: unused shards, tensors outside the index or unused by the config,
//! mixed formats inside one family, NaN / non-positive scales. Then it runs
//! the loader's full validation (every shape, dtype and scale against the
//! config) and fails with its one-line error if the checkpoint would not load.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use anyhow::Context;
use m3_core::checkpoint::names::{self, Family};
use m3_core::checkpoint::{Checkpoint, Dtype, QuantConfig, TensorEntry};
use m3_core::config::{AttnKind, IndexSelection, MlpKind, ModelConfig};

/// Print a checkpoint's tensor families, formats, sizes and config.
#[derive(clap::Args)]
pub struct Args {
    /// Checkpoint directory (config.json + safetensors shards).
    pub dir: PathBuf,
    /// Skip reading every scale tensor to look for NaN scales (faster on
    /// full-size checkpoints).
    #[arg(long)]
    pub no_scale_scan: bool,
}

/// Per-family totals.
#[derive(Default)]
struct Row {
    formats: BTreeSet<String>,
    example: Option<String>,
    /// The example is a linear weight (preferred over a vector).
    example_is_linear: bool,
    tensors: usize,
    params: u64,
    bytes: u64,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let ck = Checkpoint::open(&args.dir)
        .with_context(|| format!("inspecting {}", args.dir.display()))?;
    print_config(ck.config(), ck.quant_config());

    let mut rows: BTreeMap<Family, Row> = BTreeMap::new();
    let mut warnings: Vec<String> = ck.warnings().to_vec();
    for t in ck.tensors() {
        let row = rows.entry(t.family).or_default();
        row.tensors += 1;
        row.bytes += t.nbytes as u64;
        match tensor_kind(&ck, &t) {
            Kind::Linear {
                rows: r,
                cols,
                format,
            } => {
                row.formats.insert(format);
                row.params += (r * cols) as u64;
                if !row.example_is_linear {
                    row.example = Some(format!("[{r}, {cols}]"));
                    row.example_is_linear = true;
                }
            }
            Kind::Plain => {
                row.formats.insert(t.dtype.name().to_lowercase());
                row.params += t.shape.iter().product::<usize>() as u64;
                row.example.get_or_insert_with(|| format!("{:?}", t.shape));
            }
            Kind::Scale => {}
            Kind::Unknown(why) => warnings.push(why),
        }
        if !args.no_scale_scan {
            if let Some(w) = scan_scale(&ck, &t) {
                warnings.push(w);
            }
        }
    }

    match dspark_row(&args.dir) {
        Ok(Some(r)) => {
            rows.insert(Family::Dspark, r);
        }
        Ok(None) => {}
        Err(e) => warnings.push(format!("dspark/: {e}")),
    }

    println!();
    println!(
        "{:<18} {:<22} {:<14} {:>8} {:>16} {:>14}",
        "family", "format", "example", "tensors", "params", "bytes"
    );
    let (mut tot_t, mut tot_p, mut tot_b) = (0usize, 0u64, 0u64);
    for (fam, r) in &rows {
        let fmt = r.formats.iter().cloned().collect::<Vec<_>>().join("+");
        println!(
            "{:<18} {:<22} {:<14} {:>8} {:>16} {:>14}",
            fam.label(),
            fmt,
            r.example.as_deref().unwrap_or("-"),
            r.tensors,
            r.params,
            r.bytes
        );
        if r.formats.len() > 1
            && !matches!(
                fam,
                Family::Norm | Family::Router | Family::Vision | Family::Other | Family::Dspark
            )
        {
            warnings.push(format!("family `{}` mixes formats: {fmt}", fam.label()));
        }
        if *fam != Family::Vision {
            tot_t += r.tensors;
            tot_p += r.params;
            tot_b += r.bytes;
        }
    }
    println!(
        "{:<18} {:<22} {:<14} {:>8} {:>16} {:>14}",
        "total (no vision)", "", "", tot_t, tot_p, tot_b
    );
    println!("shards: {}", ck.shard_names().join(", "));
    if ck.vision_skipped() > 0 {
        println!("vision tensors skipped at load: {}", ck.vision_skipped());
    }

    let unused = ck.unused_tensors();
    if !unused.is_empty() {
        let first: Vec<&str> = unused.iter().take(3).map(String::as_str).collect();
        warnings.push(format!(
            "{} tensors not used by the config (e.g. {})",
            unused.len(),
            first.join(", ")
        ));
    }
    let other = rows.get(&Family::Other).map_or(0, |r| r.tensors);
    if other > 0 {
        warnings.push(format!("{other} tensors of no known family"));
    }
    if !warnings.is_empty() {
        println!();
        for w in &warnings {
            println!("warning: {w}");
        }
    }
    ck.validate()
        .context("the checkpoint does not match its config")?;
    println!();
    println!("ok: every tensor the config needs is present with the right dtype and shape");
    Ok(())
}

/// The DSpark draft under `DIR/dspark/` (its own index and shards, each
/// header validated), summarised by dtype: parameters count stored elements
/// of non-scale tensors, FP4-packed U8 `.weight` tensors counted twice.
fn dspark_row(dir: &std::path::Path) -> anyhow::Result<Option<Row>> {
    use m3_core::checkpoint::index::{parse_index, INDEX_FILE, SINGLE_FILE};
    use m3_core::checkpoint::safetensors_file::SafetensorsFile;
    let d = dir.join("dspark");
    let index = d.join(INDEX_FILE);
    let (shards, wanted): (Vec<String>, Option<BTreeSet<String>>) = if index.is_file() {
        let ix = parse_index(
            "dspark/model.safetensors.index.json",
            &std::fs::read(&index).with_context(|| format!("reading {}", index.display()))?,
        )?;
        (ix.shards(), Some(ix.weight_map.keys().cloned().collect()))
    } else if d.join(SINGLE_FILE).is_file() {
        (vec![SINGLE_FILE.to_string()], None)
    } else {
        return Ok(None);
    };
    let mut row = Row::default();
    for s in shards {
        let f = SafetensorsFile::open(&d.join(&s), &format!("dspark/{s}"))?;
        for t in &f.header.tensors {
            if wanted.as_ref().is_some_and(|w| !w.contains(&t.name)) {
                continue;
            }
            row.tensors += 1;
            row.bytes += t.nbytes() as u64;
            row.formats.insert(t.dtype.name().to_lowercase());
            let is_scale = names::split_suffix(&t.name).is_some_and(|(_, x)| x != names::WEIGHT);
            if !is_scale {
                let packed = t.dtype == Dtype::U8 && t.name.ends_with(".weight");
                row.params += (t.numel() * if packed { 2 } else { 1 }) as u64;
                if t.shape.len() == 2 && !row.example_is_linear {
                    row.example = Some(format!("{:?}", t.shape));
                    row.example_is_linear = true;
                }
            }
        }
    }
    Ok(Some(row))
}

enum Kind {
    /// A 2-D weight: logical shape and detected format.
    Linear {
        rows: usize,
        cols: usize,
        format: String,
    },
    /// A plain tensor (norm, bias, cache scale, vision).
    Plain,
    /// A scale tensor beside a weight (counted in bytes, not parameters).
    Scale,
    /// A weight whose format cannot be told (the reason, as a warning).
    Unknown(String),
}

fn tensor_kind(ck: &Checkpoint, t: &TensorEntry) -> Kind {
    if let Some((_, suffix)) = names::split_suffix(&t.name) {
        if suffix != names::WEIGHT {
            return Kind::Scale;
        }
    }
    if t.shape.len() != 2 || !t.name.ends_with(".weight") || t.family == Family::Vision {
        return Kind::Plain;
    }
    match ck.logical_shape(&t.name) {
        Ok((rows, cols, f)) => Kind::Linear {
            rows,
            cols,
            format: f.label().to_string(),
        },
        Err(e) => Kind::Unknown(e.to_string()),
    }
}

/// Count NaN scale codes (E8M0 0xFF; E4M3 0x7F / 0xFF) and non-finite or
/// non-positive NVFP4 global scales.
fn scan_scale(ck: &Checkpoint, t: &TensorEntry) -> Option<String> {
    let (_, suffix) = names::split_suffix(&t.name)?;
    let bytes = ck.raw_bytes(&t.name).ok()?;
    let nan = match (suffix, t.dtype) {
        (names::WEIGHT_SCALE | names::WEIGHT_SCALE_INV, Dtype::U8 | Dtype::F8E8M0) => {
            bytes.iter().filter(|b| **b == 0xFF).count()
        }
        (names::WEIGHT_SCALE, Dtype::F8E4M3) => bytes.iter().filter(|b| **b & 0x7F == 0x7F).count(),
        (names::WEIGHT_SCALE_2 | names::INPUT_SCALE, Dtype::F32) if bytes.len() == 4 => {
            let x = f32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
            return (!(x.is_finite() && x > 0.0)).then(|| {
                format!(
                    "{} ({}): scale {x} is not finite and positive",
                    t.name, t.file
                )
            });
        }
        _ => 0,
    };
    (nan > 0).then(|| {
        format!(
            "{} ({}): {nan} NaN scale bytes (those blocks decode to NaN)",
            t.name, t.file
        )
    })
}

fn print_config(c: &ModelConfig, q: &QuantConfig) {
    let sparse = c
        .attn_kinds
        .iter()
        .filter(|k| **k == AttnKind::Sparse)
        .count();
    let dense = c.mlp_kinds.iter().filter(|k| **k == MlpKind::Dense).count();
    println!("model_type       {}", c.model_type);
    println!(
        "layers           {} ({} sparse / {} full attention; {} dense / {} MoE FFN)",
        c.num_hidden_layers,
        sparse,
        c.num_hidden_layers - sparse,
        dense,
        c.num_hidden_layers - dense
    );
    println!(
        "hidden           {}   vocab {}",
        c.hidden_size, c.vocab_size
    );
    println!(
        "attention        {} heads / {} kv heads, head_dim {}, rotary_dim {}, rope_theta {}",
        c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.rotary_dim, c.rope_theta
    );
    println!(
        "moe              {} experts top-{}, width {}, shared {}, dense {}, scaling {}",
        c.num_local_experts,
        c.num_experts_per_tok,
        c.intermediate_size,
        c.shared_intermediate_size,
        c.dense_intermediate_size,
        c.routed_scaling_factor
    );
    if sparse > 0 {
        println!(
            "indexer          {} heads x {}, block {}, top-{} blocks (local {}, init {}), selection {}",
            c.index_n_heads,
            c.index_head_dim,
            c.index_block_size,
            c.index_topk_blocks,
            c.index_local_blocks,
            c.index_init_blocks,
            match c.index_selection {
                IndexSelection::PerKvHead => "per_kv_head",
                IndexSelection::Shared => "shared",
            }
        );
    }
    let qs = match q {
        QuantConfig::None => "none".to_string(),
        QuantConfig::Quark { .. } => "quark".to_string(),
        QuantConfig::ModelOpt { .. } => "modelopt NVFP4".to_string(),
        QuantConfig::Fp8 => "fp8 (MXFP8)".to_string(),
    };
    println!("quantization     {qs}");
}
