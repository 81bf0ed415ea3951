//! [`HostRunner`]: a loaded model whose weights and paged caches live in
//! host memory, stepped by [`forward_by_ops`] over any backend's `run_op`.
//! It is the CPU reference's runner, and, over the GPU's op-by-op backend,
//! the op-parity harness's.

use alloc::boxed::Box;
use alloc::string::ToString;
use alloc::sync::Arc;
use alloc::vec::Vec;

use super::runner::{
    check_step_input, KvBudget, LoadProgress, LoadSpec, ModelRunner, ModelSource, StepInput,
};
use super::{forward_by_ops, Backend, BackendError, RunOptions, StepOutput, Taps};
use crate::config::ModelConfig;
use crate::kv::{KvCache, KvLayout};
use crate::sample::sample;
use crate::weights::ModelWeights;

/// Host weights + host paged cache, run op by op on `B`.
pub struct HostRunner<'b, B: Backend + ?Sized> {
    backend: &'b B,
    weights: Arc<ModelWeights>,
    cache: KvCache,
    opts: RunOptions,
}

impl<'b, B: Backend + ?Sized> HostRunner<'b, B> {
    /// Load `source` for `backend` (a checkpoint is read into host memory).
    pub fn load(
        backend: &'b B,
        source: ModelSource<'_>,
        spec: &LoadSpec,
    ) -> Result<Self, BackendError> {
        spec.validate()?;
        let mut weights = match source {
            ModelSource::Weights(w) => w,
            #[cfg(feature = "std")]
            ModelSource::Checkpoint(ck, opts) => {
                Arc::new(ck.load(&opts).map_err(|e| BackendError::Load {
                    what: e.to_string(),
                })?)
            }
            #[cfg(not(feature = "std"))]
            ModelSource::_Lifetime(_) => unreachable!(),
        };
        if let Some(sel) = spec.selection {
            if weights.config.index_selection != sel {
                Arc::make_mut(&mut weights).config.index_selection = sel;
            }
        }
        let num_pages = match spec.kv {
            KvBudget::Blocks(n) => n,
            KvBudget::MemoryFraction(_) => spec.host_default_blocks(),
        };
        let layout = KvLayout {
            page_size: spec.block_size,
            num_pages,
            dtype: spec.cache_dtype,
        };
        let cache = KvCache::new(&weights, layout).map_err(|e| BackendError::Load {
            what: alloc::format!("--kv-cache-dtype {}: {e}", layout.dtype.name()),
        })?;
        Ok(HostRunner {
            backend,
            weights,
            cache,
            opts: RunOptions {
                act: spec.act,
                tensor_parallel: backend.tensor_parallel(),
            },
        })
    }

    /// The host weights (shared, e.g. with a draft model).
    pub fn weights(&self) -> &Arc<ModelWeights> {
        &self.weights
    }

    /// The host cache (tests inspect it).
    pub fn cache(&self) -> &KvCache {
        &self.cache
    }
}

/// Copy every slot of page `src` into page `dst` in every K, V and index
/// tensor of `cache`, raw (no requantization).
pub fn copy_host_page(cache: &mut KvCache, src: u32, dst: u32) -> Result<(), BackendError> {
    let ps = cache.layout.page_size;
    let pages = cache.layout.num_pages;
    if src as usize >= pages || dst as usize >= pages {
        return Err(BackendError::Shape {
            op: "copy_blocks",
            what: alloc::format!("block copy {src} -> {dst} outside the pool of {pages} blocks"),
        });
    }
    for layer in &mut cache.layers {
        for t in [
            Some(&mut layer.k),
            Some(&mut layer.v),
            layer.index_k.as_mut(),
        ]
        .into_iter()
        .flatten()
        {
            t.copy_slots(src as usize * ps, dst as usize * ps, ps)
                .map_err(|e| BackendError::Shape {
                    op: "copy_blocks",
                    what: e.to_string(),
                })?;
        }
    }
    Ok(())
}

impl<B: Backend + ?Sized> ModelRunner for HostRunner<'_, B> {
    fn backend_name(&self) -> &str {
        self.backend.name()
    }

    fn config(&self) -> &ModelConfig {
        &self.weights.config
    }

    fn kv_layout(&self) -> KvLayout {
        self.cache.layout
    }

    fn step(&mut self, input: &StepInput<'_>) -> Result<StepOutput, BackendError> {
        check_step_input(input)?;
        let batch = input.batch;
        let mut taps = Taps::new(input.read.taps);
        if let Some(t) = input.teacher {
            taps.teacher = t.clone();
        }
        let logits = forward_by_ops(
            self.backend,
            &self.weights,
            &mut self.cache,
            batch,
            input.path,
            &self.opts,
            &mut taps,
        )?;
        taps.teacher.clear();
        let vocab = self.weights.config.vocab_size;
        let tokens = batch
            .logits_rows
            .iter()
            .zip(input.sampling)
            .enumerate()
            .map(|(i, (&row, params))| {
                let pos = batch.positions[row as usize];
                sample(&logits[i * vocab..(i + 1) * vocab], params, pos + 1)
            })
            .collect();
        let mut out = Vec::with_capacity(input.read.logits.len() * vocab);
        for &i in &input.read.logits {
            let i = i as usize;
            out.extend_from_slice(&logits[i * vocab..(i + 1) * vocab]);
        }
        Ok(StepOutput {
            tokens,
            logits: out,
            taps,
        })
    }

    fn copy_blocks(&mut self, pairs: &[(u32, u32)]) -> Result<(), BackendError> {
        for &(s, d) in pairs {
            copy_host_page(&mut self.cache, s, d)?;
        }
        Ok(())
    }

    fn device_bytes(&self) -> usize {
        0
    }
}

/// [`HostRunner::load`] boxed (what [`Backend::load`]'s default returns).
pub fn load_host<'b, B: Backend + ?Sized>(
    backend: &'b B,
    source: ModelSource<'_>,
    spec: &LoadSpec,
    progress: &mut dyn FnMut(LoadProgress),
) -> Result<Box<dyn ModelRunner + 'b>, BackendError> {
    let r = HostRunner::load(backend, source, spec)?;
    progress(LoadProgress {
        tensors_done: 1,
        tensors_total: 1,
        bytes_done: 0,
    });
    Ok(Box::new(r))
}
