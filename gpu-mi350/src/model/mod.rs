//! The model on the device: raw allocations ([`devmem`]), the weights in
//! their stored formats ([`weights`]) with E2M1 / E4M3 codes in the
//! kernels' order ([`layout`]), loading them tensor by tensor from a
//! checkpoint or host weights ([`load`]), and PERF.md's bench model
//! generated on the device from a seed ([`generated`]).

pub mod devmem;
pub mod generated;
pub mod layout;
pub mod load;
pub mod weights;

pub use devmem::DevBuf;
pub use weights::{DevFfn, DevIndexer, DevLayer, DevLinear, DevMlp, DevModel, DevNorm, WFmt};
