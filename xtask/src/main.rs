//! `cargo xtask <task>`: project chores that need more than cargo.

use clap::{Parser, Subcommand};

mod ci;
mod fuzz;
mod golden;
mod isa;
mod kernels;
mod serve_e2e;
mod sim;
mod spec;
mod venv;

#[derive(Parser)]
#[command(name = "xtask", about = "m3 project tasks")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Regenerate the format conformance vectors with the Python generator
    /// (numpy + ml_dtypes in .venv); fails if the committed ones drift.
    GenSpec(spec::GenSpecArgs),
    /// Run every conformance vector on the CPU codecs.
    Conform(spec::ConformArgs),
    /// Regenerate the golden cases with the independent Python reference.
    GenGolden(golden::GenGoldenArgs),
    /// Run the golden cases on the available backends and print the parity table.
    Golden(golden::GoldenArgs),
    /// Compile every GPU kernel (NVRTC for sm_90, hipcc for one AMD target).
    Kernels(kernels::KernelsArgs),
    /// Run the safetensors header / index fuzz target for a short while.
    Fuzz(fuzz::FuzzArgs),
    /// `m3 serve` on the tiny default, driven by the `openai` Python client.
    ServeE2e(serve_e2e::ServeE2eArgs),
    /// Everything CI runs: the README's test command.
    /// Run the GPU test suites on the HIP simulator (the HIP route on this
    /// CPU, `M3_GPU_RUNTIME=sim`); `--full` adds the runner suite and the
    /// golden cases.
    Sim(sim::SimArgs),
    Ci(ci::CiArgs),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.task {
        Task::GenSpec(a) => spec::gen_spec(a),
        Task::Conform(a) => spec::conform(a),
        Task::GenGolden(a) => golden::gen_golden(a),
        Task::Golden(a) => golden::golden(a),
        Task::Kernels(a) => kernels::kernels(a),
        Task::Fuzz(a) => fuzz::fuzz(a),
        Task::ServeE2e(a) => serve_e2e::serve_e2e(a),
        Task::Sim(a) => sim::sim(a),
        Task::Ci(a) => ci::ci(a),
    }
}
