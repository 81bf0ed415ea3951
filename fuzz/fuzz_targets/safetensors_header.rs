//! Arbitrary bytes into the safetensors header validator and the
//! `model.safetensors.index.json` parser: errors are fine, panics are bugs
//! (including the invariants `fuzz_one` asserts on success).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    m3_core::checkpoint::safetensors_file::fuzz_one(data);
});
