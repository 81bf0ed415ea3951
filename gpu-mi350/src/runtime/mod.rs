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
//! - [`cache`]: compiled modules on disk, keyed by source, arch, flags and
//!   compiler version.

pub mod api;
pub mod cache;
pub mod cuda;
pub mod hip;
