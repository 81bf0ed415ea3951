//! The CUDA runtime: NVRTC compilation and the device.

pub mod device;
pub mod nvrtc;

pub use device::{cubin_key, CudaGpu, DeviceInfo, LoadedFrom, ModuleLoad};
