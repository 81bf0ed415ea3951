//! m3 GPU backend: single-source CUDA/HIP kernels compiled at run time.
//!
//! - [`kernels`]: the embedded sources (`kernels/*.cu` + the `compat.h`
//!   prelude) and their compiler flags.
//! - [`cuda`]: device discovery that never panics, NVRTC straight to CUBIN
//!   for the device's `sm_XX`, modules cached in memory and on disk
//!   ([`cache`]).
//! - [`hip`]: a small run-time-loaded HIP/hiprtc binding for MI350 (gfx950),
//!   **untested on hardware**.
//! - [`ops`]: the operations (format kernels bit-exact with
//!   `m3_core::formats`, linear per weight format, RMSNorm, RoPE) and the
//!   bandwidth probes.
//!
//! Callers try [`CudaGpu::open`]; any error means "use the CPU backend".

pub mod backend;
pub mod benchmodel;
pub mod cache;
pub mod cuda;
mod error;
pub mod hip;
pub mod kernels;
pub mod ops;
pub mod standard;

pub use backend::GpuBackend;
pub use cuda::{CudaGpu, DeviceInfo};
pub use error::{GpuError, Result};
pub use ops::formats::Quantized;
pub use ops::linear::{DeviceLinear, LinearKernel, WeightFormat};
pub use ops::probe::Timing;
