//! Deterministic synthetic checkpoints in exactly the real layout
//! (MODEL.md section 7), for tests, benchmarks and golden cases.
//!
//! ```no_run
//! use m3_core::config::ModelConfig;
//! use m3_core::synth::{write_checkpoint, DenseFormat, ExpertFormat, SynthSpec};
//! let cfg = ModelConfig::preset("tiny").unwrap();
//! let spec = SynthSpec::new(cfg, ExpertFormat::Nvfp4, DenseFormat::Mxfp8);
//! let dir = tempfile::tempdir().unwrap();
//! let ckpt = dir.path().join("tiny");
//! write_checkpoint(&spec, &ckpt).unwrap();
//! ```
//!
//! What is written: `config.json` (the config plus a `quantization_config`
//! in the shape that matches the formats), the shards and
//! `model.safetensors.index.json`, a byte-level BPE `tokenizer.json`, and a
//! `dspark/` draft (`config.json`, shards, index; bf16).
//!
//! Every value is a pure function of `(seed, tensor name, element index)`
//! ([`rng::Stream`]), so the files are byte-identical across runs and
//! machines, and generation streams: one tensor (or one row chunk of one)
//! is generated, written and dropped before the next; the whole model is
//! never in memory. The output directory appears only when complete
//! ([`crate::checkpoint::writer::StagedDir`]).

pub mod eagle3;
pub mod plan;
pub mod quant_config;
pub mod rng;
pub mod tokenizer;

use std::path::Path;
use std::string::String;
use std::vec::Vec;

use serde_json::Value;

use crate::checkpoint::writer::{self, ShardPlan, ShardWriter, StagedDir, WriteError};
use crate::config::ModelConfig;
use crate::dspark::{self, DsparkConfig};
use crate::formats::{self, FormatError, MxElem, MxTensor, Nvfp4Tensor, ScaleRule};

pub use plan::{DenseFormat, ExpertFormat, Storage, Unit};
use rng::Stream;

/// Scale rule of the synthetic MXFP4 weights (Quark exports use `even`).
pub const MXFP4_RULE: ScaleRule = ScaleRule::Even;
/// Scale rule of the synthetic MXFP8 weights (UE8M0 block-32 FP8 exports
/// round the scale up, which is `rceil`).
pub const MXFP8_RULE: ScaleRule = ScaleRule::Rceil;
/// The NVFP4 `input_scale` written beside each NVFP4 weight (a calibration
/// amax of 8 over 6 * 448; unused when activations are quantized on the fly).
pub const NVFP4_INPUT_SCALE: f32 = (8.0f64 / 2688.0) as f32;

/// Elements generated per piece of a row-chunked tensor (4 MiB of f32).
const CHUNK_ELEMS: usize = 1 << 20;

/// Why a synthetic checkpoint could not be written.
#[derive(Debug, thiserror::Error)]
pub enum SynthError {
    #[error(transparent)]
    Write(#[from] WriteError),
    #[error("tensor `{tensor}`: {source}")]
    Format {
        tensor: String,
        #[source]
        source: FormatError,
    },
    #[error("{0}")]
    Invalid(String),
}

/// What to generate.
#[derive(Clone, Debug, PartialEq)]
pub struct SynthSpec {
    pub config: ModelConfig,
    pub experts: ExpertFormat,
    pub dense: DenseFormat,
    /// RNG seed: same seed, same bytes.
    pub seed: u64,
    /// Shard byte budget; None: a quarter of the total, clamped to
    /// [256 KiB, 4 GiB] (so `tiny` has several shards and full size ~4 GiB).
    pub shard_bytes: Option<u64>,
    /// The DSpark draft to write under `dspark/` (None: no draft).
    pub draft: Option<DsparkConfig>,
    /// The EAGLE3 draft to write under `eagle3/` (None, the default: none).
    pub eagle3: Option<crate::eagle3::Eagle3Config>,
    /// Write `tokenizer.json` and `generation_config.json`.
    pub tokenizer: bool,
    /// With `tokenizer`: also write a `tokenizer_config.json` whose
    /// `chat_template` is this text (the CLI passes its MiniMax-style
    /// template, so a synthetic checkpoint exercises chat rendering,
    /// reasoning and tool calls end to end).
    pub chat_template: Option<String>,
    /// Replace an existing output directory.
    pub force: bool,
    /// Layers whose attention and indexer projections are stored in bf16
    /// whatever `dense` says, excluded by name in the quantization config:
    /// the Quark MXFP4 export's shape, which keeps some attention layers
    /// unquantized (the input of PTPC FP8 from bf16, issue 17).
    pub bf16_attention_layers: Vec<usize>,
}

impl SynthSpec {
    /// Defaults: seed 0, automatic shard size, a tokenizer, and a draft of
    /// 2 layers for the `tiny` preset and 5 otherwise.
    pub fn new(config: ModelConfig, experts: ExpertFormat, dense: DenseFormat) -> Self {
        let layers = if config.model_type == "tiny" {
            2
        } else {
            DsparkConfig::DEFAULT_LAYERS
        };
        let draft =
            DsparkConfig::for_target(&config, layers, tokenizer::mask_token_id(config.vocab_size));
        SynthSpec {
            config,
            experts,
            dense,
            seed: 0,
            shard_bytes: None,
            draft: Some(draft),
            eagle3: None,
            tokenizer: true,
            chat_template: None,
            force: false,
            bf16_attention_layers: Vec::new(),
        }
    }
}

/// Receives progress in bytes of tensor data written.
pub trait Progress {
    /// Called once, before any data, with the total.
    fn start(&mut self, _total_bytes: u64) {}
    /// `bytes` more were written; `what` is the tensor being written.
    fn advance(&mut self, _bytes: u64, _what: &str) {}
}

/// A [`Progress`] that ignores everything.
pub struct NoProgress;
impl Progress for NoProgress {}

/// What was written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SynthReport {
    /// Shards of the target model.
    pub shards: usize,
    /// Stored tensors of the target model.
    pub tensors: usize,
    /// Bytes of tensor data of the target model.
    pub bytes: u64,
    /// Bytes of tensor data of the drafts (DSpark and EAGLE3; 0 without).
    pub draft_bytes: u64,
}

/// Write a synthetic checkpoint into `dir` (which must not exist or be
/// empty, unless `spec.force`).
pub fn write_checkpoint(spec: &SynthSpec, dir: &Path) -> Result<SynthReport, SynthError> {
    write_checkpoint_with(spec, dir, &mut NoProgress)
}

/// The default shard budget for `total` bytes of tensor data.
pub fn default_shard_bytes(total: u64) -> u64 {
    total.div_ceil(4).clamp(256 << 10, 4 << 30)
}

/// The target's `config.json`: the loader's JSON of the config, plus
/// `quantization_config` and the special token ids.
pub fn config_json(spec: &SynthSpec) -> Result<String, SynthError> {
    let mut v: Value = serde_json::from_str(&spec.config.to_json())
        .map_err(|e| SynthError::Invalid(format!("config.json: {e}")))?;
    let Some(obj) = v.as_object_mut() else {
        return Err(SynthError::Invalid("config.json: not a JSON object".into()));
    };
    if let Some(q) =
        quant_config::for_synth_with(spec.experts, spec.dense, &spec.bf16_attention_layers)
    {
        obj.insert("quantization_config".into(), q);
    }
    if spec.tokenizer {
        obj.insert(
            "eos_token_id".into(),
            tokenizer::eos_token_id(spec.config.vocab_size).into(),
        );
    }
    serde_json::to_string_pretty(&v).map_err(|e| SynthError::Invalid(format!("config.json: {e}")))
}

/// [`write_checkpoint`] reporting progress.
pub fn write_checkpoint_with(
    spec: &SynthSpec,
    dir: &Path,
    progress: &mut dyn Progress,
) -> Result<SynthReport, SynthError> {
    spec.config
        .validate()
        .map_err(|e| SynthError::Invalid(e.to_string()))?;
    if let Some(&l) = spec
        .bf16_attention_layers
        .iter()
        .find(|&&l| l >= spec.config.num_hidden_layers)
    {
        return Err(SynthError::Invalid(format!(
            "bf16 attention layer {l}: the model has {} layers",
            spec.config.num_hidden_layers
        )));
    }
    let units = plan::target_units_with(
        &spec.config,
        spec.experts,
        spec.dense,
        &spec.bf16_attention_layers,
    );
    plan::check_blocks(&units).map_err(SynthError::Invalid)?;
    if let Some(e) = &spec.eagle3 {
        e.validate(Some(&spec.config))
            .map_err(|e| SynthError::Invalid(e.to_string()))?;
    }
    let draft_units = match &spec.draft {
        Some(d) => {
            d.validate(Some(&spec.config))
                .map_err(|e| SynthError::Invalid(e.to_string()))?;
            plan::draft_units(d)
        }
        None => Vec::new(),
    };
    let target = plan_units(&units, spec.shard_bytes);
    let draft = plan_units(&draft_units, spec.shard_bytes);
    let bytes = target.iter().map(ShardPlan::nbytes).sum::<u64>();
    let draft_bytes = draft.iter().map(ShardPlan::nbytes).sum::<u64>();
    progress.start(bytes + draft_bytes);

    let stage = StagedDir::create(dir, spec.force)?;
    let root = stage.path().to_path_buf();
    writer::write_file_atomic(&root.join("config.json"), config_json(spec)?.as_bytes())?;
    if spec.tokenizer {
        let v = spec.config.vocab_size;
        let tok = tokenizer::tokenizer_json(v).map_err(SynthError::Invalid)?;
        writer::write_file_atomic(&root.join("tokenizer.json"), tok.as_bytes())?;
        let gen = tokenizer::generation_config_json(v).map_err(SynthError::Invalid)?;
        writer::write_file_atomic(&root.join("generation_config.json"), gen.as_bytes())?;
        if let Some(t) = &spec.chat_template {
            let tc = tokenizer::tokenizer_config_json(v, t).map_err(SynthError::Invalid)?;
            writer::write_file_atomic(&root.join("tokenizer_config.json"), tc.as_bytes())?;
        }
    }
    write_shards(&root, &target, &units, spec.seed, |n| n.into(), progress)?;
    if let Some(d) = &spec.draft {
        let ddir = root.join(dspark::DIR);
        std::fs::create_dir(&ddir).map_err(|source| WriteError::Io {
            path: ddir.clone(),
            source,
        })?;
        writer::write_file_atomic(&ddir.join("config.json"), d.to_json().as_bytes())?;
        write_shards(
            &ddir,
            &draft,
            &draft_units,
            spec.seed,
            plan::draft_key,
            progress,
        )?;
    }
    let mut draft_bytes = draft_bytes;
    if let Some(e) = &spec.eagle3 {
        draft_bytes += eagle3::write_eagle3(&root, e, spec.seed)?;
    }
    stage.commit()?;
    Ok(SynthReport {
        shards: target.len(),
        tensors: target.iter().map(|s| s.tensors.len()).sum(),
        bytes,
        draft_bytes,
    })
}

/// Shard plan of `units` (a unit's tensors share a shard).
fn plan_units(units: &[Unit], shard_bytes: Option<u64>) -> Vec<ShardPlan> {
    let groups: Vec<_> = units.iter().map(Unit::entries).collect();
    let total: u64 = groups.iter().flatten().map(|t| t.nbytes()).sum();
    writer::plan_shards(
        groups,
        shard_bytes.unwrap_or_else(|| default_shard_bytes(total)),
    )
}

/// Write every shard of `shards` under `dir`, the units in order, then the
/// index. Units are generated in batches of consecutive units of a shard,
/// their pieces (row chunks, or a whole NVFP4 tensor) on every core, and
/// written in order: the bytes do not depend on the thread count.
fn write_shards(
    dir: &Path,
    shards: &[ShardPlan],
    units: &[Unit],
    seed: u64,
    key: impl Fn(&str) -> String + Sync,
    progress: &mut dyn Progress,
) -> Result<(), SynthError> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    // about two pieces per thread in flight: bounded memory, busy cores
    let budget = 2 * threads * CHUNK_ELEMS;
    let mut next = 0usize;
    for shard in shards {
        // this shard's units, in order (each followed by its siblings)
        let mut mine: Vec<&Unit> = Vec::new();
        let mut i = 0;
        while i < shard.tensors.len() {
            let want = &shard.tensors[i].name;
            let Some(unit) = units.get(next) else {
                return Err(SynthError::Invalid(format!(
                    "{}: no unit left for `{want}`",
                    shard.file
                )));
            };
            if &unit.name != want {
                return Err(SynthError::Invalid(format!(
                    "{}: plan expects `{want}`, unit is `{}`",
                    shard.file, unit.name
                )));
            }
            mine.push(unit);
            next += 1;
            i += unit.entries().len();
        }
        let mut w = ShardWriter::create(&dir.join(&shard.file), shard)?;
        let mut b0 = 0;
        while b0 < mine.len() {
            // a batch of whole units, at least one, up to the budget
            let (mut b1, mut elems) = (b0, 0usize);
            while b1 < mine.len()
                && (b1 == b0 || elems + mine[b1].rows() * mine[b1].cols() <= budget)
            {
                elems += mine[b1].rows() * mine[b1].cols();
                b1 += 1;
            }
            let batch = &mine[b0..b1];
            let pieces: Vec<(usize, Piece)> = batch
                .iter()
                .enumerate()
                .flat_map(|(u, unit)| {
                    pieces_of(unit, CHUNK_ELEMS)
                        .into_iter()
                        .map(move |p| (u, p))
                })
                .collect();
            let streams: Vec<Stream> = batch
                .iter()
                .map(|u| Stream::new(seed, &key(&u.name)))
                .collect();
            let made = par_map(&pieces, threads, |&(u, p)| {
                make_piece(batch[u], &streams[u], p)
            });
            // write: per unit, every piece's part of entry 0, then of entry 1, ...
            let mut made = made.into_iter();
            for (u, unit) in batch.iter().enumerate() {
                let n = pieces.iter().filter(|(pu, _)| *pu == u).count();
                let outs: Vec<Vec<Vec<u8>>> = (&mut made)
                    .take(n)
                    .collect::<Result<_, _>>()
                    .map_err(fmt_err(&unit.name))?;
                for (e, entry) in unit.entries().iter().enumerate() {
                    for parts in &outs {
                        if let Some(bytes) = parts.get(e) {
                            w.write(&entry.name, bytes)?;
                            progress.advance(bytes.len() as u64, &entry.name);
                        }
                    }
                }
            }
            b0 = b1;
        }
        w.finish()?;
    }
    writer::write_file_atomic(
        &dir.join(writer::INDEX_FILE),
        writer::index_json(shards)?.as_bytes(),
    )?;
    Ok(())
}

/// A piece of a unit generated on its own: rows `r0 .. r0 + n` (bf16, f32,
/// MX: blocks never cross rows), or the whole tensor (NVFP4: its global
/// scale needs the whole tensor's amax).
#[derive(Clone, Copy, Debug)]
enum Piece {
    Rows(usize, usize),
    Whole,
}

fn pieces_of(unit: &Unit, chunk_elems: usize) -> Vec<Piece> {
    let (rows, cols) = (unit.rows(), unit.cols());
    if unit.storage == Storage::Nvfp4 {
        return vec![Piece::Whole];
    }
    let step = (chunk_elems / cols.max(1)).max(1);
    (0..rows)
        .step_by(step)
        .map(|r0| Piece::Rows(r0, step.min(rows - r0)))
        .collect()
}

/// The bytes of one piece, one `Vec` per entry of the unit it holds (in
/// [`Unit::entries`] order: codes, then scales; NVFP4 also its global and
/// input scales).
fn make_piece(unit: &Unit, st: &Stream, p: Piece) -> Result<Vec<Vec<u8>>, FormatError> {
    let (rows, cols) = (unit.rows(), unit.cols());
    Ok(match (unit.storage, p) {
        (Storage::F32, Piece::Rows(r0, n)) => vec![le_bytes_f32(&unit_values(unit, st, r0, n))],
        (Storage::Bf16, Piece::Rows(r0, n)) => vec![unit_values(unit, st, r0, n)
            .iter()
            .flat_map(|&x| formats::bf16::from_f32(x).to_le_bytes())
            .collect()],
        (Storage::Mxfp4 | Storage::Mxfp8, Piece::Rows(r0, n)) => {
            let (elem, rule) = if unit.storage == Storage::Mxfp4 {
                (MxElem::Fp4E2M1, MXFP4_RULE)
            } else {
                (MxElem::Fp8E4M3, MXFP8_RULE)
            };
            let q = MxTensor::quantize(&unit_values(unit, st, r0, n), n, cols, elem, rule)?;
            let (codes, scales) = q.into_parts();
            vec![codes, scales]
        }
        (Storage::Nvfp4, _) => {
            let v = unit_values(unit, st, 0, rows);
            let q = Nvfp4Tensor::quantize(&v, rows, cols)?;
            vec![
                q.codes().to_vec(),
                q.scales().to_vec(),
                q.global().to_le_bytes().to_vec(),
                NVFP4_INPUT_SCALE.to_le_bytes().to_vec(),
            ]
        }
        // only NVFP4 (above) is generated whole
        (_, Piece::Whole) => return make_piece(unit, st, Piece::Rows(0, rows)),
    })
}

/// `f` over `items` on `threads` threads, results in item order.
fn par_map<T: Sync, R: Send>(items: &[T], threads: usize, f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    use core::sync::atomic::{AtomicUsize, Ordering};
    let next = AtomicUsize::new(0);
    let mut out: Vec<(usize, R)> = std::thread::scope(|sc| {
        let jobs: Vec<_> = (0..threads.min(items.len()).max(1))
            .map(|_| {
                sc.spawn(|| {
                    let mut mine = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(item) = items.get(i) else { break };
                        mine.push((i, f(item)));
                    }
                    mine
                })
            })
            .collect();
        jobs.into_iter()
            .flat_map(|j| j.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    });
    out.sort_by_key(|(i, _)| *i);
    out.into_iter().map(|(_, r)| r).collect()
}

/// The f32 values of rows `r0 .. r0 + rows` of `unit` (row-major).
pub fn unit_values(unit: &Unit, stream: &Stream, r0: usize, rows: usize) -> Vec<f32> {
    let cols = unit.cols();
    let mut v = vec![0.0f32; rows * cols];
    stream.fill_normal((r0 * cols) as u64, unit.std, &mut v);
    v
}

/// The exact f32 values `m3 synth` draws for a unit, keyed as the writer
/// keys it (`draft`: a `dspark/` tensor). For tests that check stored
/// tensors against what they should hold.
pub fn values_of(unit: &Unit, seed: u64, draft: bool) -> Vec<f32> {
    let key = if draft {
        plan::draft_key(&unit.name)
    } else {
        unit.name.clone()
    };
    unit_values(unit, &Stream::new(seed, &key), 0, unit.rows())
}

fn fmt_err(tensor: &str) -> impl FnOnce(FormatError) -> SynthError + '_ {
    move |source| SynthError::Format {
        tensor: tensor.into(),
        source,
    }
}

fn le_bytes_f32(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::{Checkpoint, LoadOptions};

    /// The library entry point other crates' tests use: a tiny checkpoint in
    /// a tempdir that the loader opens, validates and loads, with the
    /// draft's config beside it.
    #[test]
    fn library_writes_a_loadable_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let ckpt = dir.path().join("tiny");
        let cfg = ModelConfig::preset("tiny").unwrap().with_layers(2).unwrap();
        let mut spec = SynthSpec::new(cfg.clone(), ExpertFormat::Mxfp4, DenseFormat::Bf16);
        spec.shard_bytes = Some(64 << 10);
        let report = write_checkpoint(&spec, &ckpt).unwrap();
        assert!(report.shards >= 2, "{report:?}");
        let ck = Checkpoint::open(&ckpt).unwrap();
        let w = ck.load(&LoadOptions::default()).unwrap();
        assert_eq!(w.config, cfg);
        let d = std::fs::read_to_string(ckpt.join("dspark/config.json")).unwrap();
        let d = DsparkConfig::from_json_str(&d).unwrap();
        d.validate(Some(&cfg)).unwrap();
        assert_eq!(d.n_layers, 2);
        // Refuses to overwrite; replaces with `force`.
        assert!(write_checkpoint(&spec, &ckpt).is_err());
        spec.force = true;
        spec.draft = None;
        write_checkpoint(&spec, &ckpt).unwrap();
        assert!(!ckpt.join("dspark").exists());
    }

    /// Row-chunked generation gives the same bytes as whole-tensor
    /// generation, for every chunked storage (chunks of 3 rows and a ragged
    /// last chunk against one chunk).
    #[test]
    fn chunked_units_equal_whole_units() {
        let units: Vec<Unit> = [Storage::Bf16, Storage::F32, Storage::Mxfp8, Storage::Mxfp4]
            .into_iter()
            .enumerate()
            .map(|(i, s)| Unit {
                name: format!("t{i}.weight"),
                shape: vec![70, 64],
                std: 0.3,
                storage: s,
            })
            .collect();
        // every entry's bytes: its part of every piece, in order
        let write = |_: &Path, chunk: usize| -> Vec<u8> {
            let mut out = Vec::new();
            for u in &units {
                let st = Stream::new(9, &u.name);
                let parts: Vec<Vec<Vec<u8>>> = pieces_of(u, chunk)
                    .into_iter()
                    .map(|p| make_piece(u, &st, p).unwrap())
                    .collect();
                for e in 0..u.entries().len() {
                    for p in &parts {
                        out.extend_from_slice(&p[e]);
                    }
                }
            }
            out
        };
        let dir = tempfile::tempdir().unwrap();
        let whole = write(&dir.path().join("a"), 1 << 20);
        let chunked = write(&dir.path().join("b"), 3 * 64);
        assert_eq!(whole.len(), chunked.len());
        assert!(
            whole == chunked,
            "row-chunked bytes differ from whole-tensor bytes"
        );
    }

    /// `par_map` keeps item order whatever the thread count.
    #[test]
    fn par_map_keeps_order() {
        let items: Vec<u64> = (0..97).collect();
        for t in [1, 2, 5, 64] {
            let got = par_map(&items, t, |&x| x * x + 1);
            assert_eq!(
                got,
                items.iter().map(|&x| x * x + 1).collect::<Vec<_>>(),
                "{t} threads"
            );
        }
        assert!(par_map(&[] as &[u8], 4, |&x| x).is_empty());
    }

    /// The bytes on disk (data areas of the shards) add up to the planned
    /// entries' sizes, for every expert format.
    #[test]
    fn data_on_disk_matches_the_plan() {
        let cfg = ModelConfig::preset("tiny").unwrap();
        for e in [
            ExpertFormat::Nvfp4,
            ExpertFormat::Mxfp4,
            ExpertFormat::Mxfp8,
            ExpertFormat::Bf16,
        ] {
            let planned: u64 = plan::target_units(&cfg, e, DenseFormat::Mxfp8)
                .iter()
                .flat_map(Unit::entries)
                .map(|t| t.nbytes())
                .sum();
            let dir = tempfile::tempdir().unwrap();
            let mut spec = SynthSpec::new(cfg.clone(), e, DenseFormat::Mxfp8);
            spec.draft = None;
            spec.tokenizer = false;
            let out = dir.path().join("c");
            let report = write_checkpoint(&spec, &out).unwrap();
            let mut on_disk = 0u64;
            for f in std::fs::read_dir(&out).unwrap() {
                let p = f.unwrap().path();
                if p.extension().is_some_and(|x| x == "safetensors") {
                    let b = std::fs::read(&p).unwrap();
                    let n = u64::from_le_bytes(b[..8].try_into().unwrap());
                    on_disk += b.len() as u64 - 8 - n;
                }
            }
            assert_eq!(on_disk, planned, "{e:?}");
            assert_eq!(report.bytes, planned, "{e:?}");
            assert!(report.shards >= 2, "{e:?}: tiny must have several shards");
        }
    }
}
