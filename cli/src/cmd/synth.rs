//! `m3 synth`: write a deterministic synthetic checkpoint in the real layout
//! (the generator is `m3_core::synth`; this is its command line).

use std::path::PathBuf;

use anyhow::Context;
use clap::ValueEnum;
use indicatif::{ProgressBar, ProgressStyle};
use m3_core::config::ModelConfig;
use m3_core::dspark::DsparkConfig;
use m3_core::eagle3::Eagle3Config;
use m3_core::synth::{self, tokenizer, DenseFormat, ExpertFormat, Progress, SynthSpec};

/// Routed-expert storage format.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum ExpertsArg {
    Nvfp4,
    Mxfp4,
    Mxfp8,
    Bf16,
}

/// Storage format of attention, indexer, dense MLP and shared expert.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum DenseArg {
    Mxfp8,
    Bf16,
}

/// Write a deterministic synthetic checkpoint: config.json with a matching
/// quantization_config, sharded safetensors + index (text weights under
/// `language_model.`), a byte-level BPE tokenizer.json, a tokenizer_config.json
/// with a MiniMax-style chat template (reasoning `<think>`, tool calls),
/// generation_config.json, a dspark/ draft and (with --eagle3) an eagle3/
/// draft head.
/// Same arguments and seed give byte-identical files. The output appears
/// only when complete (written as DIR.tmp-<pid>, then renamed).
#[derive(clap::Args)]
pub struct Args {
    /// Model shape: tiny, small or m3.1.
    #[arg(long, default_value = "tiny")]
    pub preset: String,
    /// Override the number of layers (keeps first_k_dense).
    #[arg(long)]
    pub layers: Option<usize>,
    /// Routed-expert format.
    #[arg(long, value_enum, default_value = "nvfp4")]
    pub experts: ExpertsArg,
    /// Format of the other linears.
    #[arg(long, value_enum, default_value = "mxfp8")]
    pub dense: DenseArg,
    /// Output checkpoint directory (must not exist unless --force). Written
    /// as OUT.tmp-<pid> and renamed when complete; an interrupted run's temp
    /// directory is deleted by the next run (no resume).
    #[arg(long)]
    pub out: PathBuf,
    /// RNG seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Shard size budget in MiB (fractions allowed). Default: a quarter of
    /// the model, between 0.25 MiB and 4096 MiB.
    #[arg(long)]
    pub shard_mb: Option<f64>,
    /// DSpark draft layers (default 2 for tiny, 5 otherwise; 0 = no draft).
    #[arg(long)]
    pub draft_layers: Option<usize>,
    /// Also write an EAGLE3 draft head under eagle3/ (one Llama-style
    /// midlayer over the fused target layers low / mid / high, a draft
    /// vocabulary of half the target's mapped by d2t; run it with
    /// `--draft eagle3`).
    #[arg(long)]
    pub eagle3: bool,
    /// Replace an existing output directory.
    #[arg(long)]
    pub force: bool,
    /// Layers whose attention and indexer projections are stored bf16
    /// whatever --dense says, excluded by name in the quantization config
    /// (the Quark MXFP4 export's shape: some attention layers unquantized;
    /// what `--online-quant ptpc_fp8` converts from bf16), e.g. `0,2`.
    #[arg(long, value_delimiter = ',', value_name = "LAYER,...")]
    pub bf16_attention_layers: Vec<usize>,
    /// No progress bar.
    #[arg(long, short)]
    pub quiet: bool,
}

/// An indicatif bar in bytes (hidden when `quiet` or stderr is no terminal).
pub struct Bar(pub ProgressBar);

impl Bar {
    pub fn new(quiet: bool) -> Self {
        let bar = if quiet {
            ProgressBar::hidden()
        } else {
            ProgressBar::new(0)
        };
        if let Ok(style) = ProgressStyle::with_template(
            "{bar:40} {bytes}/{total_bytes} {bytes_per_sec} eta {eta} {msg}",
        ) {
            bar.set_style(style);
        }
        Bar(bar)
    }
}

impl Progress for Bar {
    fn start(&mut self, total: u64) {
        self.0.set_length(total);
    }
    fn advance(&mut self, bytes: u64, what: &str) {
        self.0.inc(bytes);
        self.0.set_message(what.to_string());
    }
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let mut cfg = ModelConfig::preset(&args.preset)?;
    if let Some(n) = args.layers {
        cfg = cfg.with_layers(n)?;
    }
    let experts = match args.experts {
        ExpertsArg::Nvfp4 => ExpertFormat::Nvfp4,
        ExpertsArg::Mxfp4 => ExpertFormat::Mxfp4,
        ExpertsArg::Mxfp8 => ExpertFormat::Mxfp8,
        ExpertsArg::Bf16 => ExpertFormat::Bf16,
    };
    let dense = match args.dense {
        DenseArg::Mxfp8 => DenseFormat::Mxfp8,
        DenseArg::Bf16 => DenseFormat::Bf16,
    };
    let mut spec = SynthSpec::new(cfg, experts, dense);
    spec.chat_template = Some(m3_serve::MINIMAX_STYLE_TEMPLATE.to_string());
    spec.seed = args.seed;
    spec.force = args.force;
    spec.bf16_attention_layers = args.bf16_attention_layers.clone();
    if let Some(mb) = args.shard_mb {
        anyhow::ensure!(
            mb.is_finite() && mb > 0.0,
            "--shard-mb must be positive, got {mb}"
        );
        spec.shard_bytes = Some((mb * 1048576.0).ceil() as u64);
    }
    match args.draft_layers {
        Some(0) => spec.draft = None,
        Some(n) => {
            let mask = tokenizer::mask_token_id(spec.config.vocab_size);
            spec.draft = Some(DsparkConfig::for_target(&spec.config, n, mask));
        }
        None => {}
    }
    if args.eagle3 {
        spec.eagle3 = Some(Eagle3Config::for_target(&spec.config));
    }
    let mut bar = Bar::new(args.quiet);
    let report = synth::write_checkpoint_with(&spec, &args.out, &mut bar)
        .with_context(|| format!("m3 synth --out {}", args.out.display()))?;
    bar.0.finish_and_clear();
    eprintln!(
        "wrote {}: {} tensors in {} shards, {:.1} MiB (+ {:.1} MiB of drafts)",
        args.out.display(),
        report.tensors,
        report.shards,
        report.bytes as f64 / 1048576.0,
        report.draft_bytes as f64 / 1048576.0
    );
    Ok(())
}
