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
//! - `attn_out.{l}`: F32 `[T, H]`, the attention block's output after
//!   `o_proj` (bf16 values), before the residual add;
//! - `ffn_in.{l}`: F32 `[T, H]`, the FFN input `h2` (bf16 values; the
//!   router's input on MoE layers);
//! - `ffn_out.{l}`: F32 `[T, H]`, the FFN output `y` before the residual
//!   add (dense: bf16 values; MoE: the f32 sum of weighted experts and the
//!   shared expert);
//! - `logits`: F32 `[rows in logits_rows, vocab]`.
//!
//! Per-layer families are captured only for the layers in
//! [`TapRequest::layers`] (a bit per layer; layers past 127 are always
//! captured).

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

/// Which tensor families to capture, and on which layers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TapRequest {
    pub residual: bool,
    pub topk_blocks: bool,
    pub index_scores: bool,
    pub experts: bool,
    pub logits: bool,
    /// `attn_out.{l}` (the parity diagnosis).
    pub attn_out: bool,
    /// `ffn_in.{l}` (the router input: the parity diagnosis).
    pub ffn_in: bool,
    /// `ffn_out.{l}` (the parity diagnosis).
    pub ffn_out: bool,
    /// Bit `l` set: capture layer `l`'s per-layer families (layers past 127
    /// always). `u128::MAX`: every layer.
    pub layers: u128,
}

impl Default for TapRequest {
    /// Nothing.
    fn default() -> Self {
        TapRequest::NONE
    }
}

impl TapRequest {
    /// Nothing.
    pub const NONE: TapRequest = TapRequest {
        residual: false,
        topk_blocks: false,
        index_scores: false,
        experts: false,
        logits: false,
        attn_out: false,
        ffn_in: false,
        ffn_out: false,
        layers: u128::MAX,
    };
    /// Residuals, selections, experts and logits (not the large indexer
    /// scores nor the diagnosis families).
    pub const STANDARD: TapRequest = TapRequest {
        residual: true,
        topk_blocks: true,
        experts: true,
        logits: true,
        ..TapRequest::NONE
    };
    /// What the per-layer parity diagnosis reads: STANDARD plus the
    /// attention / FFN outputs and the router input.
    pub const DIAGNOSE: TapRequest = TapRequest {
        attn_out: true,
        ffn_in: true,
        ffn_out: true,
        ..TapRequest::STANDARD
    };
    /// Everything.
    pub const ALL: TapRequest = TapRequest {
        index_scores: true,
        ..TapRequest::DIAGNOSE
    };

    /// Whether layer `l`'s per-layer families are captured.
    pub fn layer(&self, l: usize) -> bool {
        l >= 128 || (self.layers >> l) & 1 == 1
    }

    /// Whether any per-layer family is asked for on some layer.
    pub fn any_layer_family(&self) -> bool {
        (self.residual
            || self.topk_blocks
            || self.index_scores
            || self.experts
            || self.attn_out
            || self.ffn_in
            || self.ffn_out)
            && self.layers != 0
    }

    /// Whether anything at all is asked for.
    pub fn any(&self) -> bool {
        self.any_layer_family() || self.logits
    }

    /// Only these layers' per-layer families.
    pub fn only_layers(mut self, layers: &[usize]) -> Self {
        self.layers = 0;
        for &l in layers {
            if l < 128 {
                self.layers |= 1u128 << l;
            }
        }
        self
    }
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
