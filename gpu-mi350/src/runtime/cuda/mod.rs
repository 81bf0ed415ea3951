//! The CUDA runtime: NVRTC compilation and the device.

pub mod device;
pub mod nvrtc;

pub use device::{compile_units, CubinUnit, CudaGpu, DeviceInfo, LoadedFrom, ModuleLoad};
