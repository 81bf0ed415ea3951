//! The op-parity harness: [`GpuBackend`] runs every `m3_core::backend::Op`
//! on the device, one op at a time from host slices ([`ops`] holds the
//! per-family launch wrappers), so each op can be compared with the CPU
//! reference on its own (ggml's test-backend-ops habit) and the format
//! kernels can be held to the spec vectors. It is not a serving path: a
//! loaded model runs on [`crate::GpuRunner`]. The harness is CUDA only; a
//! [`GpuBackend`] on a HIP device loads models and refuses ops.

pub mod backend;
pub mod ops;

pub use backend::{GpuBackend, Runtime};
