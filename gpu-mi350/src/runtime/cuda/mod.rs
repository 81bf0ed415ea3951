//! The CUDA runtime: NVRTC compilation and the device.

pub mod device;
pub mod nvrtc;

pub use device::{CudaGpu, DeviceInfo, LoadedFrom, ModuleLoad};
