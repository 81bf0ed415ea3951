//! `Taps`: named tensors a caller asks a forward step to capture (parity at
//! every layer boundary), and the teacher inputs of a teacher-forced step.
//!
//! Names and layouts (row-major; `T` = rows of the step):
//! - `residual.{l}`: F32 `[T, H]`, the residual stream after layer `l`;
//! - `topk_blocks.{l}`: I32 `[kv_heads, T, index_topk_blocks]`, the selected
//!   index blocks per KV head, ascending, padded with -1 (sparse layers only;
//!   with `index_selection = shared` every KV head repeats the one selection);
//! - `index_scores.{l}`: F32 `[index_heads, T, nb]` with
//!   `nb = max position / block_size + 1`, the block scores (invisible
//!   blocks are -inf) (sparse layers only);
//! - `experts.{l}`: I32 `[T, num_experts_per_tok]`, chosen expert ids,
//!   ascending (MoE layers only);
//! - `logits`: F32 `[rows in logits_rows, vocab]`.

use alloc::collections::BTreeMap;
use alloc::string::String;
use alloc::vec::Vec;

/// The elements of one captured tensor.
#[derive(Clone, Debug, PartialEq)]
pub enum TapData {
    F32(Vec<f32>),
    I32(Vec<i32>),
}

/// One captured tensor.
#[derive(Clone, Debug, PartialEq)]
pub struct TapTensor {
    pub shape: Vec<usize>,
    pub data: TapData,
}

/// Which tensor families to capture.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TapRequest {
    pub residual: bool,
    pub topk_blocks: bool,
    pub index_scores: bool,
    pub experts: bool,
    pub logits: bool,
}

impl TapRequest {
    /// Everything but the (large) indexer scores.
    pub const STANDARD: TapRequest = TapRequest {
        residual: true,
        topk_blocks: true,
        index_scores: false,
        experts: true,
        logits: true,
    };
    /// Everything.
    pub const ALL: TapRequest = TapRequest {
        residual: true,
        topk_blocks: true,
        index_scores: true,
        experts: true,
        logits: true,
    };
}

/// Requested captures, the captured tensors, and optional teacher inputs.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Taps {
    pub request: TapRequest,
    /// Captured tensors by name (see the module doc for names and layouts).
    pub tensors: BTreeMap<String, TapTensor>,
    /// Teacher forcing: `teacher[l]` (F32 `[T, H]`) replaces the residual
    /// after layer `l` as the input of layer `l + 1` (and, for the last
    /// layer, as the input of the final norm and LM head). The layer's own
    /// output is still captured as `residual.{l}`.
    pub teacher: BTreeMap<usize, Vec<f32>>,
}

impl Taps {
    /// Capture nothing.
    pub fn none() -> Self {
        Taps::default()
    }

    /// Capture the families in `request`.
    pub fn new(request: TapRequest) -> Self {
        Taps {
            request,
            ..Taps::default()
        }
    }

    /// Store a tensor (the backend's half of the contract).
    pub fn put_f32(&mut self, name: String, shape: Vec<usize>, data: Vec<f32>) {
        self.tensors.insert(
            name,
            TapTensor {
                shape,
                data: TapData::F32(data),
            },
        );
    }

    /// Store an integer tensor.
    pub fn put_i32(&mut self, name: String, shape: Vec<usize>, data: Vec<i32>) {
        self.tensors.insert(
            name,
            TapTensor {
                shape,
                data: TapData::I32(data),
            },
        );
    }

    /// A captured F32 tensor's elements.
    pub fn f32(&self, name: &str) -> Option<&[f32]> {
        match self.tensors.get(name).map(|t| &t.data) {
            Some(TapData::F32(v)) => Some(v),
            _ => None,
        }
    }

    /// A captured I32 tensor's elements.
    pub fn i32(&self, name: &str) -> Option<&[i32]> {
        match self.tensors.get(name).map(|t| &t.data) {
            Some(TapData::I32(v)) => Some(v),
            _ => None,
        }
    }
}
