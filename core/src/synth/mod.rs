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
    /// Write `tokenizer.json` and `generation_config.json`.
    pub tokenizer: bool,
    /// With `tokenizer`: also write a `tokenizer_config.json` whose
    /// `chat_template` is this text (the CLI passes its MiniMax-style
    /// template, so a synthetic checkpoint exercises chat rendering,
    /// reasoning and tool calls end to end).
    pub chat_template: Option<String>,
    /// Replace an existing output directory.
    pub force: bool,
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
            tokenizer: true,
            chat_template: None,
            force: false,
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
    /// Bytes of tensor data of the draft (0 without a draft).
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
    if let Some(q) = quant_config::for_synth(spec.experts, spec.dense) {
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
    let units = plan::target_units(&spec.config, spec.experts, spec.dense);
    plan::check_blocks(&units).map_err(SynthError::Invalid)?;
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
/// index.
fn write_shards(
    dir: &Path,
    shards: &[ShardPlan],
    units: &[Unit],
    seed: u64,
    key: impl Fn(&str) -> String,
    progress: &mut dyn Progress,
) -> Result<(), SynthError> {
    let mut next = units.iter();
    for shard in shards {
        let mut w = ShardWriter::create(&dir.join(&shard.file), shard)?;
        while let Some(t) = w.current() {
            let want = t.name.clone();
            let Some(unit) = next.next() else {
                return Err(SynthError::Invalid(format!(
                    "{}: no unit left for `{want}`",
                    shard.file
                )));
            };
            if unit.name != want {
                return Err(SynthError::Invalid(format!(
                    "{}: plan expects `{want}`, unit is `{}`",
                    shard.file, unit.name
                )));
            }
            emit_unit(
                &mut w,
                unit,
                Stream::new(seed, &key(&unit.name)),
                progress,
                CHUNK_ELEMS,
            )?;
        }
        w.finish()?;
    }
    writer::write_file_atomic(
        &dir.join(writer::INDEX_FILE),
        writer::index_json(shards)?.as_bytes(),
    )?;
    Ok(())
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

/// Make the row chunks `[r0, r0 + n)` of a `rows`-row tensor with `make` on
/// every core, a batch of chunks at a time, and hand them to `emit` in row
/// order. Chunks are independent (counter-based values; blocks never cross
/// rows), so the bytes do not depend on the thread count.
fn for_row_chunks<T: Send>(
    tensor: &str,
    rows: usize,
    chunk_rows: usize,
    make: impl Fn(usize, usize) -> Result<T, FormatError> + Sync,
    mut emit: impl FnMut(T) -> Result<(), SynthError>,
) -> Result<(), SynthError> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let starts: Vec<usize> = (0..rows).step_by(chunk_rows.max(1)).collect();
    for batch in starts.chunks(threads) {
        let made: Vec<Result<T, FormatError>> = std::thread::scope(|sc| {
            let make = &make;
            let jobs: Vec<_> = batch
                .iter()
                .map(|&r0| sc.spawn(move || make(r0, chunk_rows.min(rows - r0))))
                .collect();
            jobs.into_iter()
                .map(|j| j.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
                .collect()
        });
        for m in made {
            emit(m.map_err(fmt_err(tensor))?)?;
        }
    }
    Ok(())
}

/// Generate one unit and write its tensors, in row chunks where the format
/// allows (bf16, f32, MX: blocks never cross rows), whole for NVFP4 (its
/// global scale needs the whole tensor's amax).
fn emit_unit(
    w: &mut ShardWriter,
    unit: &Unit,
    st: Stream,
    progress: &mut dyn Progress,
    chunk_elems: usize,
) -> Result<(), SynthError> {
    let (rows, cols) = (unit.rows(), unit.cols());
    let chunk_rows = (chunk_elems / cols).max(1);
    let name = unit.name.as_str();
    let entries = unit.entries();
    match unit.storage {
        Storage::F32 | Storage::Bf16 => {
            let f32_out = unit.storage == Storage::F32;
            for_row_chunks(
                name,
                rows,
                chunk_rows,
                |r0, n| {
                    let v = unit_values(unit, &st, r0, n);
                    Ok::<_, FormatError>(if f32_out {
                        le_bytes_f32(&v)
                    } else {
                        v.iter()
                            .flat_map(|&x| formats::bf16::from_f32(x).to_le_bytes())
                            .collect()
                    })
                },
                |bytes: Vec<u8>| {
                    w.write(name, &bytes)?;
                    progress.advance(bytes.len() as u64, name);
                    Ok(())
                },
            )?;
        }
        Storage::Mxfp4 | Storage::Mxfp8 => {
            let (elem, rule) = if unit.storage == Storage::Mxfp4 {
                (MxElem::Fp4E2M1, MXFP4_RULE)
            } else {
                (MxElem::Fp8E4M3, MXFP8_RULE)
            };
            let mut scales = Vec::with_capacity(rows * cols / MxElem::BLOCK);
            for_row_chunks(
                name,
                rows,
                chunk_rows,
                |r0, n| {
                    let v = unit_values(unit, &st, r0, n);
                    MxTensor::quantize(&v, n, cols, elem, rule)
                },
                |q: MxTensor| {
                    w.write(name, q.codes())?;
                    progress.advance(q.codes().len() as u64, name);
                    scales.extend_from_slice(q.scales());
                    Ok(())
                },
            )?;
            w.write(&entries[1].name, &scales)?;
            progress.advance(scales.len() as u64, &entries[1].name);
        }
        Storage::Nvfp4 => {
            let v = unit_values(unit, &st, 0, rows);
            let q = Nvfp4Tensor::quantize(&v, rows, cols).map_err(fmt_err(name))?;
            drop(v);
            let global = q.global().to_le_bytes();
            let input = NVFP4_INPUT_SCALE.to_le_bytes();
            let parts: [(&str, &[u8]); 4] = [
                (name, q.codes()),
                (&entries[1].name, q.scales()),
                (&entries[2].name, &global),
                (&entries[3].name, &input),
            ];
            for (n, b) in parts {
                w.write(n, b)?;
                progress.advance(b.len() as u64, n);
            }
        }
    }
    Ok(())
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
        let shard = ShardPlan {
            file: "s".into(),
            tensors: units.iter().flat_map(Unit::entries).collect(),
        };
        let dir = tempfile::tempdir().unwrap();
        let write = |path: &Path, chunk: usize| {
            let mut w = ShardWriter::create(path, &shard).unwrap();
            for u in &units {
                emit_unit(&mut w, u, Stream::new(9, &u.name), &mut NoProgress, chunk).unwrap();
            }
            w.finish().unwrap();
            std::fs::read(path).unwrap()
        };
        let whole = write(&dir.path().join("a"), 1 << 20);
        let chunked = write(&dir.path().join("b"), 3 * 64);
        assert_eq!(whole.len(), chunked.len());
        assert!(
            whole == chunked,
            "row-chunked bytes differ from whole-tensor bytes"
        );
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
