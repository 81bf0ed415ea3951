//! Why the GPU backend refused: every variant is a one-line message a caller
//! can print before falling back to the CPU backend.

use std::path::PathBuf;

/// Errors of the GPU runtime. Discovery errors (`NoDriver`, `NoDevice`,
/// `NoCompiler`, `UnsupportedArch`, `NoGpu`) mean "use the CPU backend"; the
/// others are bugs or bad inputs and name what failed.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    /// The driver library (libcuda / libamdhip64) could not be loaded.
    #[error("no GPU driver: {0}")]
    NoDriver(String),
    /// The driver loaded but reports no usable device.
    #[error("no GPU device: {0}")]
    NoDevice(String),
    /// Neither vendor opened a device (`GpuBackend::open` tries CUDA, then
    /// HIP): both reasons, so a user on either vendor's machine sees why
    /// theirs did not open.
    #[error("CUDA: {cuda}; HIP: {hip}")]
    NoGpu {
        cuda: Box<GpuError>,
        hip: Box<GpuError>,
    },
    /// The run-time compiler (NVRTC / hiprtc) could not be loaded.
    #[error("no kernel compiler: {0}")]
    NoCompiler(String),
    /// The compiler cannot target this device.
    #[error("device architecture {arch} is not supported by the kernel compiler: {why}")]
    UnsupportedArch { arch: String, why: String },
    /// A kernel source failed to compile; `log` is the compiler's log.
    #[error("kernel source {name} failed to compile for {arch}: {log}")]
    Compile {
        name: String,
        arch: String,
        log: String,
    },
    /// A driver call failed.
    #[error("driver call {call} failed: {msg}")]
    Driver { call: &'static str, msg: String },
    /// Bad shapes or buffer lengths handed to an op.
    #[error("invalid input to {op}: {why}")]
    Input { op: &'static str, why: String },
    /// The on-disk module cache could not be read or written.
    #[error("kernel cache {path}: {msg}")]
    Cache { path: PathBuf, msg: String },
}

impl GpuError {
    /// Wrap a driver error, naming the call that returned it.
    pub(crate) fn driver(call: &'static str, e: impl std::fmt::Display) -> Self {
        GpuError::Driver {
            call,
            msg: e.to_string(),
        }
    }
    /// A shape / length error for `op`.
    pub(crate) fn input(op: &'static str, why: impl Into<String>) -> Self {
        GpuError::Input {
            op,
            why: why.into(),
        }
    }
}

/// Result alias of this crate.
pub type Result<T> = std::result::Result<T, GpuError>;
