//! m3 core: everything that is not a backend.
//!
//! `no_std + alloc` by default-off `std`: the number formats, the config and the
//! typed weights build anywhere; the `std` feature adds files (checkpoint
//! loading and writing through safetensors + mmap).
#![cfg_attr(not(feature = "std"), no_std)]

extern crate alloc;

pub mod backend;
#[cfg(feature = "std")]
pub mod checkpoint;
pub mod config;
pub mod dspark;
pub mod eagle3;
pub mod formats;
pub mod kv;
pub mod sample;
pub mod sched;
pub mod spec_decode;
#[cfg(feature = "std")]
pub mod synth;
pub mod weights;
