//! The GPU runtime: device discovery, run-time kernel compilation and the
//! module cache.
//!
//! - [`cuda`]: CUDA through cudarc (dynamic loading), NVRTC straight to
//!   CUBIN for the device's own `sm_XX`;
//! - [`hip`]: a run-time-loaded HIP + hiprtc binding for MI350 (gfx950),
//!   compiled in CI, **not yet run on hardware**;
//! - [`cache`]: compiled modules on disk, keyed by source, arch, flags and
//!   compiler version.

pub mod cache;
pub mod cuda;
pub mod hip;
