//! Format conformance for m3: the vectors made by the independent Python
//! generator (`spec/gen/gen_vectors.py`, numpy + ml_dtypes + exact rationals,
//! written from FORMATS.md only), a [`FormatOps`] trait for the codec surface
//! a backend offers, the CPU implementation over `m3_core::formats`
//! ([`CpuOps`]), and a runner that checks every vector bit for bit
//! ([`run`]).
//!
//! A GPU backend plugs its kernels in by implementing [`FormatOps`] and
//! calling [`run`] on the same [`VectorSet`].

mod compare;
mod cpu;
mod error;
mod ops;
mod runner;
mod vectors;

pub use cpu::CpuOps;
pub use error::SpecError;
pub use ops::{ElemKind, FormatOps, MxParts, Nvfp4Parts, OpError, PtpcParts};
pub use runner::{run, GroupReport, Mismatch, Report, MAX_MISMATCHES};
pub use vectors::{
    default_dir, BlockCase, CacheCastCase, Group, GroupData, Mxfp8Bf16Case, Nvfp4Case,
    Nvfp4ToMxCase, PtpcCase, VectorSet,
};
