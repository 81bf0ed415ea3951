//! Captured steps: one graph (CUDA graph / hipGraph, through the runtime
//! line) per step shape (rows, logits rows, tensor-core variant), captured
//! on first use and replayed after.
//!
//! Every grid of a step is fixed by its shape and the path's capacity, and
//! every data-dependent choice (positions, blocks, experts, sampling) is
//! read on the device from the persistent step inputs, so a graph stays
//! valid for every later step of its shape.

use std::collections::HashMap;

use super::launch::Launcher;
use crate::error::{GpuError, Result};
use crate::runtime::api::Graph;

/// What a graph is keyed by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GraphKey {
    pub rows: usize,
    pub logits_rows: usize,
    pub variant: usize,
    /// A mono step (standard/mono.rs): its own graph beside the standard
    /// one of the same shape.
    pub mono: bool,
}

/// The captured graphs of one path.
pub struct Graphs {
    map: HashMap<GraphKey, Graph>,
    max: usize,
}

impl Graphs {
    pub fn new(max: usize) -> Self {
        Graphs {
            map: HashMap::new(),
            max,
        }
    }

    /// Graphs captured so far.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Whether `key` has a graph, or room for one.
    pub fn can_hold(&self, key: &GraphKey) -> bool {
        self.map.contains_key(key) || self.map.len() < self.max
    }

    /// Replay the graph of `key`, capturing `enqueue` into it first if
    /// there is none yet.
    pub fn run(
        &mut self,
        l: &Launcher,
        key: GraphKey,
        enqueue: impl FnOnce() -> Result<()>,
    ) -> Result<()> {
        if let std::collections::hash_map::Entry::Vacant(slot) = self.map.entry(key) {
            l.bind()?;
            l.stream().begin_capture()?;
            let r = enqueue();
            let g = l.stream().end_capture()?;
            r?;
            let g = g.ok_or_else(|| GpuError::driver(end_capture_call(l), "empty graph"))?;
            g.upload()?;
            slot.insert(g);
        }
        self.map[&key].launch()
    }

    /// Drop every graph (after a change that moves a buffer or a kernel).
    pub fn clear(&mut self) {
        self.map.clear();
    }
}

/// The vendor's name of the call that ends a capture (for the error of an
/// empty capture, which the runtime reports as no graph).
fn end_capture_call(l: &Launcher) -> &'static str {
    match l.device().vendor() {
        crate::kernels::Vendor::Cuda => "cuStreamEndCapture",
        crate::kernels::Vendor::Hip => "hipStreamEndCapture",
    }
}
