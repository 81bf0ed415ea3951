//! `m3 convert`: a checkpoint file to file, NVFP4 routed experts -> MXFP4.
//!
//! Every other tensor, the tokenizer and the `dspark/` draft are copied byte
//! for byte; the output keeps the input's shard files and names. Memory is
//! bounded: tensors are read with positioned reads (not through a memory map
//! whose touched pages would pile up in the resident set) in row chunks, and
//! written as they are produced.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, File};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use clap::ValueEnum;
use m3_core::checkpoint::index::{INDEX_FILE, SINGLE_FILE};
use m3_core::checkpoint::names::{
    self, Family, INPUT_SCALE, WEIGHT_SCALE, WEIGHT_SCALE_2, WEIGHT_SCALE_INV,
};
use m3_core::checkpoint::writer::{self, ShardPlan, ShardWriter, StagedDir, TensorEntry};
use m3_core::checkpoint::{Checkpoint, Dtype, LoadOptions, StoredLinear, WeightFormat};
use m3_core::formats::{convert, MxElem, MxTensor, Nvfp4Tensor, ScaleRule};
use m3_core::synth::quant_config;
use m3_core::weights::LinearWeight;
use serde_json::Value;

use super::synth::Bar;

/// Scale rule of the MXFP4 re-quantization.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum RuleArg {
    /// Quark / aiter: round the block amax up at the mantissa, then floor.
    Even,
    /// OCP: floor(log2(amax)) - emax.
    Floor,
    /// NVIDIA cvt.rp.ue8m0: amax / 6 rounded up to a power of two.
    Rceil,
}

impl RuleArg {
    fn rule(self) -> ScaleRule {
        match self {
            RuleArg::Even => ScaleRule::Even,
            RuleArg::Floor => ScaleRule::Floor,
            RuleArg::Rceil => ScaleRule::Rceil,
        }
    }
    fn label(self) -> &'static str {
        match self {
            RuleArg::Even => "even",
            RuleArg::Floor => "floor",
            RuleArg::Rceil => "rceil",
        }
    }
}

/// Convert a checkpoint file to file: NVFP4 routed experts become MXFP4
/// (each value decoded exactly, then MX-quantized per 32 with E8M0 scales).
/// This is LOSSY: MXFP4 has one power-of-two scale per 32 values where NVFP4
/// has an E4M3 scale per 16 and a global scale; --verify reports the error.
/// Everything else (other weights, tokenizer, dspark/ draft, other files) is
/// copied byte for byte, and config.json gets a Quark quantization_config.
///
/// Atomic: the output is written into TO.tmp-<pid> and renamed to TO only
/// when complete (and verified, with --verify). An interrupted run leaves
/// only that temp directory, which the next run deletes: re-running
/// restarts cleanly from scratch (it does not resume).
#[derive(clap::Args)]
pub struct Args {
    /// Input checkpoint directory.
    #[arg(long)]
    pub from: PathBuf,
    /// Output checkpoint directory (must not exist unless --force). Atomic:
    /// written as TO.tmp-<pid> and renamed to TO only when complete (and
    /// verified, with --verify); an interrupted run leaves only that temp
    /// directory, which the next run deletes, so re-running restarts cleanly
    /// from scratch (no resume).
    #[arg(long)]
    pub to: PathBuf,
    /// MX scale rule for the re-quantization. NVFP4 -> MXFP4 is lossy (one
    /// power-of-two scale per 32 instead of an E4M3 scale per 16 and a
    /// global scale): --verify reports the error.
    #[arg(long, value_enum, default_value = "even")]
    pub scale_rule: RuleArg,
    /// Re-read the output before publishing it: per-tensor relative L2 error
    /// of each converted tensor against the exact NVFP4 values, and a
    /// byte-for-byte check of every copied tensor.
    #[arg(long)]
    pub verify: bool,
    /// Replace an existing output directory.
    #[arg(long)]
    pub force: bool,
    /// No progress bar.
    #[arg(long, short)]
    pub quiet: bool,
    /// Also convert the MXFP8 weights of attention, the indexer, the dense
    /// MLP and the shared expert to bf16, losslessly (FORMATS.md MXFP8 ->
    /// BF16: every value is already on the bf16 grid); a block whose scale
    /// byte is NaN or outside the exact range is refused, naming the tensor,
    /// row and block, and nothing is written. Routed experts must be MXFP4
    /// or NVFP4 (the output config is Quark's).
    #[arg(long)]
    pub mxfp8_to_bf16: bool,
    /// Worker threads for the conversion (0 = every core). Row chunks of
    /// consecutive expert weights convert in parallel and are written in
    /// order, so the output does not depend on the thread count.
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Elements per row chunk when converting and verifying (bounds memory;
    /// tests make it small to exercise the chunking).
    #[arg(long, default_value_t = ROW_CHUNK_ELEMS, hide = true)]
    pub chunk_elems: usize,
}

/// Bytes per piece when copying a tensor.
const COPY_CHUNK: usize = 8 << 20;
/// Default elements per row chunk when converting or verifying an expert.
const ROW_CHUNK_ELEMS: usize = 1 << 20;

/// The one place that reads input tensors: the loader's validated headers
/// and index ([`Checkpoint`]) for what is where, positioned reads for bytes.
pub struct Source {
    pub ckpt: Checkpoint,
    files: BTreeMap<String, (File, u64)>,
}

impl Source {
    pub fn open(dir: &Path) -> anyhow::Result<Source> {
        let ckpt = Checkpoint::open(dir)?;
        let mut files = BTreeMap::new();
        for s in ckpt.shard_names() {
            let p = dir.join(s);
            let f = File::open(&p).with_context(|| format!("{}", p.display()))?;
            let mut n = [0u8; 8];
            f.read_exact_at(&mut n, 0)
                .with_context(|| format!("{}: header length", p.display()))?;
            files.insert(s.to_string(), (f, 8 + u64::from_le_bytes(n)));
        }
        Ok(Source { ckpt, files })
    }

    /// dtype, shape, shard and byte range (absolute in the shard) of `name`.
    fn locate(&self, name: &str) -> anyhow::Result<(Dtype, Vec<usize>, String, u64, u64)> {
        let (t, shard) = self
            .ckpt
            .info(name)
            .with_context(|| format!("tensor `{name}` is not in the checkpoint"))?;
        let (_, start) = self
            .files
            .get(shard)
            .with_context(|| format!("shard {shard} is not open"))?;
        Ok((
            t.dtype,
            t.shape.clone(),
            shard.to_string(),
            start + t.begin as u64,
            t.nbytes() as u64,
        ))
    }

    /// `len` bytes of tensor `name` from byte `offset` of its data.
    pub fn read(&self, name: &str, offset: u64, len: usize) -> anyhow::Result<Vec<u8>> {
        let (_, _, shard, start, nbytes) = self.locate(name)?;
        anyhow::ensure!(
            offset + len as u64 <= nbytes,
            "{shard}: tensor `{name}`: read past its {nbytes} bytes"
        );
        let (f, _) = &self.files[&shard];
        let mut buf = vec![0u8; len];
        f.read_exact_at(&mut buf, start + offset).with_context(|| {
            format!("{shard}: tensor `{name}`: reading {len} bytes at {offset}")
        })?;
        Ok(buf)
    }

    /// The whole tensor.
    pub fn read_all(&self, name: &str) -> anyhow::Result<Vec<u8>> {
        let (_, _, _, _, nbytes) = self.locate(name)?;
        self.read(name, 0, nbytes as usize)
    }

    /// Tensors of `shard` in data order.
    fn shard_tensors(&self, shard: &str) -> Vec<(String, Dtype, Vec<usize>)> {
        let mut v: Vec<_> = self
            .ckpt
            .tensors()
            .into_iter()
            .filter(|t| t.file == shard)
            .filter_map(|t| {
                self.ckpt
                    .info(&t.name)
                    .map(|(i, _)| (i.begin, t.name, t.dtype, t.shape))
            })
            .collect();
        v.sort_by_key(|x| x.0);
        v.into_iter().map(|(_, n, d, s)| (n, d, s)).collect()
    }
}

/// One NVFP4 routed expert weight to convert.
#[derive(Clone, Debug)]
struct Job {
    rows: usize,
    cols: usize,
    /// Elements per row chunk.
    chunk_elems: usize,
}

fn global_of(src: &Source, weight: &str) -> anyhow::Result<f32> {
    let g = src.read_all(&names::sibling(weight, WEIGHT_SCALE_2))?;
    let b: [u8; 4] = g
        .get(..4)
        .and_then(|s| s.try_into().ok())
        .context("weight_scale_2 is not 4 bytes")?;
    Ok(f32::from_le_bytes(b))
}

/// Rows `r0 .. r0 + n` of an NVFP4 weight as an [`Nvfp4Tensor`].
fn nvfp4_rows(
    src: &Source,
    weight: &str,
    job: &Job,
    global: f32,
    r0: usize,
    n: usize,
) -> anyhow::Result<Nvfp4Tensor> {
    let c = job.cols;
    let codes = src.read(weight, (r0 * c / 2) as u64, n * c / 2)?;
    let scales = src.read(
        &names::sibling(weight, WEIGHT_SCALE),
        (r0 * c / 16) as u64,
        n * c / 16,
    )?;
    Nvfp4Tensor::from_parts(n, c, codes, scales, global)
        .with_context(|| format!("tensor `{weight}`"))
}

fn chunk_rows(chunk_elems: usize, cols: usize) -> usize {
    (chunk_elems / cols).max(1)
}

/// One converted row chunk: MXFP4 codes and E8M0 scales.
type Converted = (Vec<u8>, Vec<u8>);

/// Convert consecutive expert weights (`batch`, in output order) on every
/// core of `pool`: their row chunks are independent (blocks never cross
/// rows), so they are converted in parallel and written in order, each
/// weight's codes then its scales. Memory is bounded by the batch, which
/// the caller keeps to about one chunk per thread.
fn convert_batch(
    src: &Source,
    w: &mut ShardWriter,
    batch: &[(&str, &Job)],
    rule: ScaleRule,
    pool: &rayon::ThreadPool,
    bar: &Bar,
) -> anyhow::Result<()> {
    use rayon::prelude::*;
    // (weight index, first row, rows) of every chunk, in output order
    let mut work = Vec::new();
    let mut globals = Vec::with_capacity(batch.len());
    for (i, (weight, job)) in batch.iter().enumerate() {
        globals.push(global_of(src, weight)?);
        let step = chunk_rows(job.chunk_elems, job.cols);
        work.extend(
            (0..job.rows)
                .step_by(step)
                .map(|r0| (i, r0, step.min(job.rows - r0))),
        );
    }
    let done: Vec<anyhow::Result<Converted>> = pool.install(|| {
        work.par_iter()
            .map(|&(i, r0, n)| {
                let (weight, job) = batch[i];
                let nv = nvfp4_rows(src, weight, job, globals[i], r0, n)?;
                let mx = convert::try_nvfp4_to_mxfp4(&nv, rule)
                    .with_context(|| format!("tensor `{weight}`"))?;
                let (codes, scales) = mx.into_parts();
                Ok((codes, scales))
            })
            .collect()
    });
    let mut done = done.into_iter();
    for (i, (weight, _)) in batch.iter().enumerate() {
        let mut scales = Vec::new();
        for _ in work.iter().filter(|w| w.0 == i) {
            let (codes, sc) = done
                .next()
                .context("internal: a converted chunk is missing")??;
            w.write(weight, &codes)?;
            bar.0.inc(codes.len() as u64);
            scales.extend_from_slice(&sc);
        }
        w.write(&names::sibling(weight, WEIGHT_SCALE), &scales)?;
        bar.0.inc(scales.len() as u64);
    }
    Ok(())
}

/// The bf16 bytes (little-endian) of MXFP8 weight `name`, through the
/// loader's exact conversion (refusing, by tensor, row and block, a block
/// that is not exact in bf16).
fn mxfp8_as_bf16(ck: &Checkpoint, name: &str, rows: usize, cols: usize) -> anyhow::Result<Vec<u8>> {
    let opts = LoadOptions {
        mxfp8_to_bf16_exact: true,
        ..LoadOptions::default()
    };
    match ck.stored_linear(name, rows, cols, false, &opts)? {
        StoredLinear::Owned(LinearWeight::Bf16 { data, .. }) => {
            Ok(data.iter().flat_map(|v| v.to_le_bytes()).collect())
        }
        _ => bail!("tensor `{name}`: not converted to bf16 (not MXFP8?)"),
    }
}

/// Write MXFP8 weight `name` as its exact bf16 copy (the whole tensor in
/// memory: the largest non-expert linear, ~150 MB for M3.1's dense MLP).
fn write_bf16(
    src: &Source,
    w: &mut ShardWriter,
    name: &str,
    rows: usize,
    cols: usize,
    bar: &Bar,
) -> anyhow::Result<()> {
    let bytes = mxfp8_as_bf16(&src.ckpt, name, rows, cols)?;
    w.write(name, &bytes)?;
    bar.0.inc(bytes.len() as u64);
    Ok(())
}

fn copy_one(
    src: &Source,
    w: &mut ShardWriter,
    name: &str,
    nbytes: u64,
    bar: &Bar,
) -> anyhow::Result<()> {
    let mut off = 0u64;
    while off < nbytes {
        let n = (nbytes - off).min(COPY_CHUNK as u64) as usize;
        let b = src.read(name, off, n)?;
        w.write(name, &b)?;
        bar.0.inc(n as u64);
        off += n as u64;
    }
    Ok(())
}

/// Copy `from` (file or directory tree) to `to`.
fn copy_tree(from: &Path, to: &Path) -> anyhow::Result<()> {
    if from.is_dir() {
        fs::create_dir_all(to).with_context(|| format!("{}", to.display()))?;
        for e in fs::read_dir(from).with_context(|| format!("{}", from.display()))? {
            let e = e?;
            copy_tree(&e.path(), &to.join(e.file_name()))?;
        }
    } else {
        fs::copy(from, to)
            .with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
    }
    Ok(())
}

/// The module-name families of the non-expert linears and whether each is
/// MXFP8 (true) or plain (false), from the tensors present.
fn rest_formats(
    src: &Source,
    to_bf16: &BTreeSet<String>,
) -> anyhow::Result<(Vec<&'static str>, Vec<&'static str>)> {
    let mut seen: BTreeMap<&'static str, (usize, usize)> = BTreeMap::new();
    for t in src.ckpt.tensors() {
        if !t.name.ends_with(".weight") {
            continue;
        }
        let fam = match t.family {
            Family::AttnQ | Family::AttnK | Family::AttnV | Family::AttnO | Family::Indexer => {
                quant_config::ATTN
            }
            Family::DenseMlp => quant_config::DENSE_MLP,
            Family::SharedExpert => quant_config::SHARED,
            _ => continue,
        };
        let f = if to_bf16.contains(&t.name) {
            WeightFormat::Bf16
        } else {
            src.ckpt.detect_format(&t.name)?
        };
        let e = seen.entry(fam).or_default();
        match f {
            WeightFormat::Mxfp8E4M3 | WeightFormat::Mxfp8E5M2 => e.0 += 1,
            WeightFormat::Bf16 | WeightFormat::F32 => e.1 += 1,
            other => bail!(
                "tensor `{}` is {}: m3 convert handles NVFP4 only in routed experts",
                t.name,
                other.label()
            ),
        }
    }
    let mut mx8 = Vec::new();
    let mut plain = Vec::new();
    for (fam, (m, p)) in seen {
        if m > 0 && p > 0 {
            tracing::warn!(
                "{fam}: {m} MXFP8 and {p} bf16 weights; the output config calls the family MXFP8"
            );
        }
        if m > 0 {
            mx8.push(fam);
        } else {
            plain.push(fam);
        }
    }
    Ok((mx8, plain))
}

/// The output config.json: the input's, with `quantization_config` (where
/// the input had it: top level or under `text_config`) replaced.
fn output_config(
    src: &Source,
    rule: RuleArg,
    to_bf16: &BTreeSet<String>,
) -> anyhow::Result<Vec<u8>> {
    let (mx8, plain) = rest_formats(src, to_bf16)?;
    let mut q = quant_config::quark(&mx8, &plain);
    q["global_quant_config"]["weight"]["scale_calculation_mode"] = Value::from(rule.label());
    let mut cfg = src.ckpt.config_json().clone();
    let under_text = cfg.get("quantization_config").is_none()
        && cfg
            .get("text_config")
            .and_then(|t| t.get("quantization_config"))
            .is_some();
    let target = if under_text {
        &mut cfg["text_config"]
    } else {
        &mut cfg
    };
    let obj = target
        .as_object_mut()
        .context("config.json: not a JSON object")?;
    obj.insert("quantization_config".into(), q);
    Ok(serde_json::to_vec_pretty(&cfg)?)
}

/// Per-tensor verification result.
struct Checked {
    rel_l2: f64,
}

/// Relative L2 of the converted MXFP4 `weight` in `out` against the exact
/// NVFP4 values in `src`, row chunk by row chunk.
fn verify_one(src: &Source, out: &Source, weight: &str, job: &Job) -> anyhow::Result<Checked> {
    let global = global_of(src, weight)?;
    let (c, mut num, mut den) = (job.cols, 0.0f64, 0.0f64);
    let mut r0 = 0;
    let mut exact = vec![0.0f64; c];
    let mut got = vec![0.0f32; c];
    while r0 < job.rows {
        let n = chunk_rows(job.chunk_elems, c).min(job.rows - r0);
        let nv = nvfp4_rows(src, weight, job, global, r0, n)?;
        let codes = out.read(weight, (r0 * c / 2) as u64, n * c / 2)?;
        let scales = out.read(
            &names::sibling(weight, WEIGHT_SCALE),
            (r0 * c / 32) as u64,
            n * c / 32,
        )?;
        let mx = MxTensor::from_parts(MxElem::Fp4E2M1, n, c, codes, scales)
            .with_context(|| format!("output tensor `{weight}`"))?;
        for r in 0..n {
            nv.row_f64(r, &mut exact);
            mx.dequantize_row(r, &mut got);
            for (&a, &b) in exact.iter().zip(&got) {
                num += (a - b as f64) * (a - b as f64);
                den += a * a;
            }
        }
        r0 += n;
    }
    let rel_l2 = if den > 0.0 {
        (num / den).sqrt()
    } else if num > 0.0 {
        f64::INFINITY
    } else {
        0.0
    };
    Ok(Checked { rel_l2 })
}

/// Byte-compare a copied tensor.
fn same_bytes(src: &Source, out: &Source, name: &str) -> anyhow::Result<bool> {
    let (_, _, _, _, nbytes) = src.locate(name)?;
    let (_, _, _, _, out_bytes) = out.locate(name)?;
    if nbytes != out_bytes {
        return Ok(false);
    }
    let mut off = 0u64;
    while off < nbytes {
        let n = (nbytes - off).min(COPY_CHUNK as u64) as usize;
        if src.read(name, off, n)? != out.read(name, off, n)? {
            return Ok(false);
        }
        off += n as u64;
    }
    Ok(true)
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let from = &args.from;
    if !from.is_dir() {
        bail!("--from {}: no such directory", from.display());
    }
    if !from.join("config.json").is_file() {
        bail!(
            "--from {}: not a checkpoint (no config.json)",
            from.display()
        );
    }
    if !from.join(INDEX_FILE).is_file() && !from.join(SINGLE_FILE).is_file() {
        bail!(
            "--from {}: not a checkpoint (neither {INDEX_FILE} nor {SINGLE_FILE})",
            from.display()
        );
    }
    if let (Ok(a), Ok(b)) = (from.canonicalize(), args.to.canonicalize()) {
        if a == b {
            bail!("--to {} is the input directory", args.to.display());
        }
    }
    // The output (and its temp sibling) must not sit inside the input, or
    // copying the input's other files would copy the output into itself.
    let to_parent = match args.to.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    if let (Ok(a), Ok(p)) = (from.canonicalize(), to_parent.canonicalize()) {
        if p.starts_with(&a) {
            bail!(
                "--to {} is inside the input directory {}",
                args.to.display(),
                from.display()
            );
        }
    }
    let src = Source::open(from).with_context(|| format!("--from {}", from.display()))?;
    let rule = args.scale_rule.rule();

    // What to convert: NVFP4 routed-expert weights, and the siblings they drop.
    let mut jobs: BTreeMap<String, Job> = BTreeMap::new();
    for t in src.ckpt.tensors() {
        if t.family == Family::RoutedExpert && t.name.ends_with(".weight") {
            let (rows, cols, f) = src.ckpt.logical_shape(&t.name)?;
            if f == WeightFormat::Nvfp4 {
                anyhow::ensure!(
                    cols % 32 == 0,
                    "tensor `{}`: {cols} columns is not a multiple of 32 (MXFP4 block)",
                    t.name
                );
                jobs.insert(
                    t.name.clone(),
                    Job {
                        rows,
                        cols,
                        chunk_elems: args.chunk_elems,
                    },
                );
            }
        }
    }
    // What to copy as bf16: MXFP8 weights outside the routed experts.
    let mut to_bf16: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    if args.mxfp8_to_bf16 {
        let mut expert_formats = BTreeSet::new();
        for t in src.ckpt.tensors() {
            let linear = matches!(
                t.family,
                Family::AttnQ
                    | Family::AttnK
                    | Family::AttnV
                    | Family::AttnO
                    | Family::Indexer
                    | Family::DenseMlp
                    | Family::SharedExpert
                    | Family::RoutedExpert
            );
            if !t.name.ends_with(".weight") || !linear {
                continue;
            }
            let (rows, cols, f) = src.ckpt.logical_shape(&t.name)?;
            if t.family == Family::RoutedExpert {
                expert_formats.insert(f.label());
            } else if matches!(f, WeightFormat::Mxfp8E4M3 | WeightFormat::Mxfp8E5M2) {
                to_bf16.insert(t.name.clone(), (rows, cols));
            }
        }
        if let Some(bad) = expert_formats
            .iter()
            .find(|f| !["mxfp4", "nvfp4"].contains(f))
        {
            bail!(
                "--mxfp8-to-bf16: the routed experts are {bad}; m3 convert writes a Quark (MXFP4 experts) config, so it needs MXFP4 or NVFP4 experts (use --mxfp8-to-bf16 at load instead)"
            );
        }
    }
    let bf16_set: BTreeSet<String> = to_bf16.keys().cloned().collect();
    let dropped: BTreeSet<String> = jobs
        .keys()
        .flat_map(|w| [WEIGHT_SCALE, WEIGHT_SCALE_2, INPUT_SCALE].map(|s| names::sibling(w, s)))
        .chain(to_bf16.keys().map(|w| names::sibling(w, WEIGHT_SCALE_INV)))
        .collect();

    // Output plan: the input's shards, expert groups replaced in place.
    let mut plans = Vec::new();
    for shard in src.ckpt.shard_names() {
        let mut tensors = Vec::new();
        for (name, dtype, shape) in src.shard_tensors(shard) {
            if let Some(j) = jobs.get(&name) {
                tensors.push(TensorEntry::new(
                    name.clone(),
                    Dtype::U8,
                    &[j.rows, j.cols / 2],
                ));
                tensors.push(TensorEntry::new(
                    names::sibling(&name, WEIGHT_SCALE),
                    Dtype::U8,
                    &[j.rows, j.cols / 32],
                ));
            } else if let Some(&(rows, cols)) = to_bf16.get(&name) {
                tensors.push(TensorEntry::new(name, Dtype::BF16, &[rows, cols]));
            } else if !dropped.contains(&name) {
                tensors.push(TensorEntry::new(name, dtype, &shape));
            }
        }
        if !tensors.is_empty() {
            plans.push(ShardPlan {
                file: shard.to_string(),
                tensors,
            });
        }
    }
    let total: u64 = plans.iter().map(ShardPlan::nbytes).sum();
    let stage = StagedDir::create(&args.to, args.force).context("--to")?;
    let root = stage.path().to_path_buf();
    if !to_bf16.is_empty() {
        eprintln!(
            "converting {} MXFP8 weights (attention, indexer, dense MLP, shared expert) to bf16, losslessly",
            to_bf16.len()
        );
    }
    if jobs.is_empty() && to_bf16.is_empty() {
        eprintln!(
            "no NVFP4 routed experts in {}: the output is a byte-for-byte copy",
            from.display()
        );
    } else if !jobs.is_empty() {
        eprintln!(
            "converting {} NVFP4 routed-expert weights to MXFP4 (scale rule {}); NVFP4 -> MXFP4 is lossy{}",
            jobs.len(),
            args.scale_rule.label(),
            if args.verify { "" } else { " (--verify reports the error)" }
        );
    }

    let bar = Bar::new(args.quiet);
    bar.0.set_length(total);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(args.threads)
        .build()
        .context("--threads: starting the worker threads")?;
    // a batch of expert weights holds about one row chunk per thread
    let batch_elems = pool.current_num_threads().max(1) * args.chunk_elems.max(1);
    // the MXFP4 scales a weight's conversion writes right after it
    let converted_scales: BTreeSet<String> = jobs
        .keys()
        .map(|w| names::sibling(w, WEIGHT_SCALE))
        .collect();
    let t0 = std::time::Instant::now();
    for plan in &plans {
        let mut w = ShardWriter::create(&root.join(&plan.file), plan)?;
        let mut batch: Vec<(&str, &Job)> = Vec::new();
        let mut elems = 0usize;
        // tensors in output order; a weight's scale entry follows it
        let order: Vec<&str> = plan
            .tensors
            .iter()
            .map(|t| t.name.as_str())
            .filter(|n| !converted_scales.contains(*n))
            .collect();
        for (k, name) in order.iter().enumerate() {
            if let Some(j) = jobs.get(*name) {
                batch.push((name, j));
                elems += j.rows * j.cols;
            } else if let Some(&(rows, cols)) = to_bf16.get(*name) {
                bar.0.set_message(name.to_string());
                write_bf16(&src, &mut w, name, rows, cols, &bar)?;
            } else {
                bar.0.set_message(name.to_string());
                let t = plan
                    .tensors
                    .iter()
                    .find(|t| t.name == *name)
                    .context("internal: a planned tensor is missing")?;
                copy_one(&src, &mut w, name, t.nbytes(), &bar)?;
            }
            let next_is_job = order.get(k + 1).is_some_and(|n| jobs.contains_key(*n));
            if !batch.is_empty() && (elems >= batch_elems || !next_is_job) {
                bar.0.set_message(batch[0].0.to_string());
                convert_batch(&src, &mut w, &batch, rule, &pool, &bar)?;
                batch.clear();
                elems = 0;
            }
        }
        w.finish()?;
    }
    let elapsed = t0.elapsed().as_secs_f64();
    let converted: usize = jobs.values().map(|j| j.rows * j.cols).sum();
    if converted > 0 {
        eprintln!(
            "converted {:.1}M parameters in {elapsed:.2} s on {} threads: {:.0}M parameters/s",
            converted as f64 / 1e6,
            pool.current_num_threads(),
            converted as f64 / elapsed.max(1e-9) / 1e6
        );
    }
    if from.join(INDEX_FILE).is_file() {
        writer::write_file_atomic(
            &root.join(INDEX_FILE),
            writer::index_json(&plans)?.as_bytes(),
        )?;
    }
    let config = if jobs.is_empty() && to_bf16.is_empty() {
        fs::read(from.join("config.json"))
            .with_context(|| format!("{}/config.json", from.display()))?
    } else {
        output_config(&src, args.scale_rule, &bf16_set)?
    };
    writer::write_file_atomic(&root.join("config.json"), &config)?;
    // Everything else: tokenizer, dspark/, generation config, ... (top-level
    // safetensors outside the index are release duplicates: skipped).
    let shard_set: BTreeSet<&str> = src.ckpt.shard_names().into_iter().collect();
    for e in fs::read_dir(from).with_context(|| format!("{}", from.display()))? {
        let e = e?;
        let name = e.file_name().to_string_lossy().into_owned();
        if name == "config.json" || name == INDEX_FILE || shard_set.contains(name.as_str()) {
            continue;
        }
        if e.path().is_file() && name.ends_with(".safetensors") {
            eprintln!("skipping {name}: not in {INDEX_FILE}");
            continue;
        }
        copy_tree(&e.path(), &root.join(&name))?;
    }
    bar.0.finish_and_clear();

    if args.verify {
        let out = Source::open(&root).context("--verify: re-opening the output")?;
        out.ckpt
            .validate()
            .context("--verify: the output does not validate")?;
        let (mut worst, mut sum, mut copied) = (0.0f64, 0.0f64, 0usize);
        for (name, job) in &jobs {
            let c = verify_one(&src, &out, name, job)?;
            println!("{name}: rel_l2 {:.6e}", c.rel_l2);
            worst = worst.max(c.rel_l2);
            sum += c.rel_l2;
        }
        for (name, &(rows, cols)) in &to_bf16 {
            let want = mxfp8_as_bf16(&src.ckpt, name, rows, cols)?;
            let got = out.read_all(name)?;
            anyhow::ensure!(
                got == want,
                "--verify: `{name}` is not the exact bf16 copy of its MXFP8 values"
            );
        }
        if !to_bf16.is_empty() {
            println!(
                "verify: {} MXFP8 weights copied to bf16 with identical values",
                to_bf16.len()
            );
        }
        for t in src.ckpt.tensors() {
            if jobs.contains_key(&t.name)
                || dropped.contains(&t.name)
                || to_bf16.contains_key(&t.name)
            {
                continue;
            }
            if !same_bytes(&src, &out, &t.name)? {
                bail!(
                    "--verify: copied tensor `{}` differs from the input",
                    t.name
                );
            }
            copied += 1;
        }
        let mean = if jobs.is_empty() {
            0.0
        } else {
            sum / jobs.len() as f64
        };
        println!(
            "verify: {} converted tensors, rel_l2 mean {mean:.6e} max {worst:.6e}; {copied} copied tensors identical",
            jobs.len()
        );
    }
    stage.commit()?;
    eprintln!(
        "wrote {} ({} shards, {:.1} MiB)",
        args.to.display(),
        plans.len(),
        total as f64 / 1048576.0
    );
    Ok(())
}
