//! m3 GPU backend: single-source CUDA/HIP kernels compiled at run time, and
//! the device-resident engine (ARCHITECTURE.md, "The Backend trait").
//!
//! Code map (one home per concept):
//! - [`runtime`]: device discovery that never panics, NVRTC straight to
//!   CUBIN for the device's `sm_XX`, the module cache on disk, a
//!   run-time-loaded HIP + hiprtc binding for MI350 (**untested on
//!   hardware**), and the runtime line ([`runtime::api`]: [`Gpu`] and its
//!   handles) that everything below calls instead of either vendor.
//! - [`kernels`]: the embedded kernel sources (`kernels/*.cu` + the
//!   `compat.h` prelude) and their compiler flags; [`sampling`]: the keyed
//!   sampling kernel's Rust side.
//! - [`mfma_model`]: a CPU model of gfx950's scaled MFMA instructions and
//!   of [`mfma_mx`]'s kernels (the gfx950-only native MX linears, never run
//!   on AMD hardware: compiled and ISA-checked in CI, proven by the model).
//! - [`model`]: the model on the device: raw allocations, weights in their
//!   stored formats, loading from a checkpoint tensor by tensor, and
//!   PERF.md's bench model generated on the device.
//! - [`standard`]: the standard path (a step = a fixed launch sequence over
//!   device-resident state, captured into graphs), one code path for CUDA
//!   and HIP above the runtime line.
//! - [`runner`]: [`GpuRunner`], the loaded model behind
//!   `m3_core::backend::ModelRunner` that every `--backend gpu` command
//!   runs on; [`draft`]: the DSpark draft it runs beside the target
//!   (device weights, device context K/V, the target's embedding and LM
//!   head shared).
//! - [`harness`]: [`GpuBackend`]: `Backend::load` -> [`GpuRunner`] on CUDA
//!   or HIP, and `Backend::run_op` op by op from host slices (the op-parity
//!   harness and the format kernels' conformance; CUDA only).
//!
//! Callers try [`GpuBackend::open`] (CUDA, else HIP) or [`CudaGpu::open`];
//! any error means "use the CPU backend" and says why.

pub mod draft;
mod error;
pub mod harness;
pub mod kernels;
pub mod mfma_model;
pub mod mfma_mx;
pub mod model;
pub mod runner;
pub mod runtime;
pub mod sampling;
pub mod standard;

pub use cuda::{CudaGpu, DeviceInfo};
pub use error::{GpuError, Result};
pub use harness::ops;
pub use harness::{GpuBackend, Runtime};
pub use model::generated as benchmodel;
pub use ops::formats::Quantized;
pub use ops::linear::{DeviceLinear, LinearKernel, WeightFormat};
pub use ops::probe::Timing;
pub use runner::GpuRunner;
pub use runtime::api::{Device, Func, Gpu};
pub use runtime::hip::HipGpu;
pub use runtime::{cache, cuda, hip};
