//! The GPU runtime: device discovery, run-time kernel compilation, the
//! module cache, and the runtime line every engine call goes through.
//!
//! - [`api`]: the line: [`api::Gpu`] and the `Device` / `Stream` / `Event`
//!   / `Graph` / `Func` handles over both vendors. Nothing outside
//!   `runtime/` names cudarc or the HIP binding, except the op harness
//!   (`harness/`, CUDA only);
//! - [`cuda`]: CUDA through cudarc (dynamic loading), NVRTC straight to
//!   CUBIN for the device's own `sm_XX`;
//! - [`hip`]: a run-time-loaded HIP + hiprtc binding for MI350 (gfx950),
//!   compiled in CI, **not yet run on hardware**;
//! - [`sim`]: the HIP simulator, a HIP function table that builds the
//!   kernels with the host C++ compiler and runs them on the CPU
//!   (`M3_GPU_RUNTIME=sim`): the HIP route, run where no AMD GPU is;
//! - [`cache`]: compiled modules on disk, keyed by source, arch, flags and
//!   compiler version.

pub mod api;
pub mod cache;
pub mod cuda;
pub mod hip;
pub mod sim;
