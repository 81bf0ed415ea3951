//! `m3`: load, check, convert and run MiniMax-M3 / M3.1 checkpoints.

use clap::{Parser, Subcommand};

mod args;
mod cmd;
mod drafting;

/// m3: an inference engine for the MiniMax-M3 / M3.1 family (sparse-attention
/// MoE, MXFP4 / NVFP4 / MXFP8 weights).
#[derive(Parser)]
#[command(name = "m3", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

// parsed once a process: the variants' sizes do not matter
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Quantize a 2-D F32 tensor `x` (safetensors) to MXFP4 / MXFP8 / NVFP4.
    Quant(cmd::quant::QuantArgs),
    /// Dequantize an interchange file written by `m3 quant` back to F32 `x`.
    Dequant(cmd::quant::DequantArgs),
    /// Write a deterministic synthetic checkpoint in the real layout.
    Synth(cmd::synth::Args),
    /// Print a checkpoint's tensor families, formats, sizes and config.
    Inspect(cmd::inspect::Args),
    /// Convert a checkpoint file to file (NVFP4 routed experts -> MXFP4).
    Convert(cmd::convert::Args),
    /// Run one prefill and dump per-layer taps to safetensors.
    Forward(cmd::forward::Args),
    /// Generate text (defaults to a synthetic `tiny` checkpoint).
    Generate(cmd::generate::Args),
    /// Measure prefill / decode speed of a backend.
    #[command(after_long_help = cmd::bench::ENV_HELP)]
    Bench(cmd::bench::Args),
    /// Offline batch generation through the scheduler (JSONL in, JSONL out).
    Batch(cmd::batch::Args),
    /// Greedy parity of two backends (identical / near-tie / MISMATCH).
    Parity(cmd::parity::Args),
    /// OpenAI-compatible HTTP server (defaults to a synthetic `tiny` checkpoint).
    Serve(cmd::serve::Args),
    /// Benchmark a running server: concurrent streaming requests, TTFT /
    /// inter-token latency / throughput percentiles as JSON.
    BenchServe(cmd::bench_serve::Args),
}

fn main() -> std::process::ExitCode {
    let filter = tracing_subscriber::EnvFilter::try_from_env("M3_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .without_time()
        .with_target(false)
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Quant(a) => cmd::quant::run_quant(a),
        Command::Dequant(a) => cmd::quant::run_dequant(a),
        Command::Synth(a) => cmd::synth::run(a),
        Command::Inspect(a) => cmd::inspect::run(a),
        Command::Convert(a) => cmd::convert::run(a),
        Command::Forward(a) => cmd::forward::run(a),
        Command::Generate(a) => cmd::generate::run(a),
        Command::Bench(a) => cmd::bench::run(a),
        Command::Batch(a) => cmd::batch::run(a),
        Command::Parity(a) => cmd::parity::run(a),
        Command::Serve(a) => cmd::serve::run(a),
        Command::BenchServe(a) => cmd::bench_serve::run(a),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // One line: the error and its causes, joined.
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
