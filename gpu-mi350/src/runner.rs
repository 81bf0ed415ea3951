//! [`GpuRunner`]: a model loaded on one GPU (`Backend::load` of
//! [`crate::GpuBackend`]), the device-resident engine every command's
//! `--backend gpu` runs on.
//!
//! It owns the weights ([`crate::model::DevModel`], streamed from the
//! checkpoint tensor by tensor), the paged KV + index caches, the step
//! buffers and the captured graphs ([`crate::standard::StandardPath`]). A
//! step uploads the batch's small host arrays once, runs on the device
//! (graph replay for plain steps of up to `graph_max_rows` rows), samples
//! every logits row on the device with core's keyed definition, and reads
//! back the sampled tokens plus only what the caller asked: logits rows and
//! taps. Block copies (copy-on-write) are device-to-device copies.

use m3_core::backend::runner::check_step_input;
use m3_core::backend::{
    BackendError, LoadSpec, ModelRunner, ModelSource, StepInput, StepOutput, Taps,
};
use m3_core::config::ModelConfig;
use m3_core::kv::KvLayout;

use std::sync::Arc;

use m3_core::dspark::DsparkWeights;
use m3_core::sched::draft_forward::DraftForward;

use crate::draft::GpuDraft;
use crate::error::GpuError;
use m3_core::backend::runner::LoadProgress;

use crate::model::load::WeightSource;
use crate::model::DevModel;
use crate::runtime::api::Gpu;
use crate::standard::{Capacity, MonoCrossover, MonoRows, PathOptions, StandardPath};

/// A GPU error as a backend error, naming what failed.
pub(crate) fn be_err(what: &str, e: GpuError) -> BackendError {
    match e {
        GpuError::Input { op, why } => BackendError::Shape {
            op,
            what: format!("{what}: {why}"),
        },
        // "gpu", not a vendor: the error itself names the vendor's call
        // (`cuMemAlloc` / `hipMalloc`)
        other => BackendError::Device {
            backend: "gpu".into(),
            what: format!("{what}: {other}"),
        },
    }
}

/// Context (positions) of the steps the load-time crossover times.
const CROSSOVER_CONTEXT: usize = 2048;
/// Timed replays a path and candidate.
const CROSSOVER_ITERS: usize = 10;

/// `--path auto`: time the mono path against the standard one at load and
/// let it take the steps up to where it stops being faster
/// ([`StandardPath::measure_mono_crossover`]), saying what was measured. A
/// failure leaves the standard path running every step, with a warning.
/// On the simulator, whose times are not speeds, only the two smallest
/// candidates run once (the code path, not a measurement).
fn measure_crossover(gpu: &dyn Gpu, path: &mut StandardPath) -> Option<MonoCrossover> {
    let (cands, iters): (&[usize], usize) = if gpu.simulated() {
        (&StandardPath::MONO_CANDIDATES[..2], 1)
    } else {
        (&StandardPath::MONO_CANDIDATES, CROSSOVER_ITERS)
    };
    match path.measure_mono_crossover(cands, CROSSOVER_CONTEXT, iters) {
        Ok(x) => {
            tracing::info!("--path auto: {}", x.summary());
            Some(x)
        }
        Err(e) => {
            tracing::warn!(
                "--path auto: measuring the mono path failed, the standard path runs every step: {e}"
            );
            None
        }
    }
}

/// The loaded model on one GPU.
pub struct GpuRunner<'g> {
    gpu: &'g dyn Gpu,
    path: StandardPath,
    config: ModelConfig,
    /// Steps run (graph replays or direct).
    pub steps: u64,
    /// What `--path auto` measured at load (`PathOptions::mono_rows`).
    crossover: Option<MonoCrossover>,
}

impl<'g> GpuRunner<'g> {
    /// Load `source` onto `gpu` for `spec`, reporting progress per tensor.
    pub fn load(
        gpu: &'g dyn Gpu,
        source: ModelSource<'_>,
        spec: &LoadSpec,
        opts: PathOptions,
        progress: &mut dyn FnMut(LoadProgress),
    ) -> Result<Self, BackendError> {
        spec.validate()?;
        let ctx = gpu.device();
        let mut model = match &source {
            ModelSource::Weights(w) => DevModel::load(
                ctx,
                &WeightSource::Host(w),
                opts.fold_shared_expert,
                progress,
            ),
            ModelSource::Checkpoint(ck, lopts) => {
                ck.validate().map_err(|e| BackendError::Load {
                    what: e.to_string(),
                })?;
                DevModel::load(
                    ctx,
                    &WeightSource::Checkpoint(ck, *lopts),
                    opts.fold_shared_expert,
                    progress,
                )
            }
        }
        .map_err(|e| BackendError::Load {
            what: e.to_string(),
        })?;
        if let Some(sel) = spec.selection {
            model.config.index_selection = sel;
        }
        let config = model.config.clone();
        let cap = Capacity {
            max_rows: spec.max_rows,
            max_seqs: spec.max_seqs,
            page_size: spec.block_size,
            max_context: spec.max_context,
            cache_dtype: spec.cache_dtype,
            act: spec.act,
        };
        let mut path =
            StandardPath::new(gpu, model, cap, spec.kv, opts).map_err(|e| BackendError::Load {
                what: e.to_string(),
            })?;
        let crossover = if opts.mono_rows == MonoRows::Measured && path.has_mono() {
            measure_crossover(gpu, &mut path)
        } else {
            None
        };
        Ok(GpuRunner {
            gpu,
            path,
            config,
            steps: 0,
            crossover,
        })
    }

    /// The standard path (bench and tests look inside).
    pub fn path(&mut self) -> &mut StandardPath {
        &mut self.path
    }

    /// The mono crossover measured at load (`MonoRows::Measured` with the
    /// mono kernel loaded, and the measurement ran).
    pub fn mono_crossover(&self) -> Option<&MonoCrossover> {
        self.crossover.as_ref()
    }

    /// The device.
    pub fn gpu(&self) -> &dyn Gpu {
        self.gpu
    }
}

impl ModelRunner for GpuRunner<'_> {
    fn backend_name(&self) -> &str {
        match self.gpu.vendor() {
            crate::kernels::Vendor::Cuda => "cuda",
            crate::kernels::Vendor::Hip => "hip",
        }
    }

    /// The path's mono threshold: every decode step up to 64 rows with
    /// `--path mono`, up to the crossover measured at load with `--path
    /// auto`, 0 without the mono kernel (`supports_mono` is then false).
    fn mono_max_rows(&self) -> usize {
        self.path.mono_max_rows()
    }

    fn config(&self) -> &ModelConfig {
        &self.config
    }

    fn kv_layout(&self) -> KvLayout {
        let c = self.path.capacity();
        KvLayout {
            page_size: c.page_size,
            num_pages: self.path.num_pages(),
            dtype: c.cache_dtype,
        }
    }

    fn step(&mut self, input: &StepInput<'_>) -> Result<StepOutput, BackendError> {
        check_step_input(input)?;
        let batch = input.batch;
        if !input.path.allows(batch) {
            return Err(BackendError::IllegalPath {
                path: input.path,
                rows: batch.rows(),
                pure: batch.is_pure_decode(),
            });
        }
        let shape = self
            .path
            .prepare(batch, input.sampling)
            .map_err(|e| be_err("step", e))?;
        let teacher = input.teacher.filter(|t| !t.is_empty());
        let taps_req = input.read.taps;
        let mut taps = Taps::new(taps_req);
        if taps_req.any_layer_family() || teacher.is_some() {
            let tb = self
                .path
                .launch_with(shape, taps_req, teacher)
                .map_err(|e| be_err("step", e))?;
            if let Some(tb) = &tb {
                taps = self.path.read_taps(tb).map_err(|e| be_err("taps", e))?;
            }
        } else {
            // the planner's mono steps on the mono path when it is loaded
            // (`supports_mono`), every other step on the standard one
            self.path
                .set_mono(input.path == m3_core::backend::Path::Mono && self.path.has_mono())
                .map_err(|e| be_err("step", e))?;
            self.path
                .launch(shape, true)
                .map_err(|e| be_err("step", e))?;
        }
        self.steps += 1;
        let tokens = self
            .path
            .read_tokens(shape.logits_rows)
            .map_err(|e| be_err("reading tokens", e))?;
        let mut logits = Vec::new();
        if taps_req.logits {
            let all: Vec<u32> = (0..shape.logits_rows as u32).collect();
            let l = self
                .path
                .read_logits(&all)
                .map_err(|e| be_err("reading logits", e))?;
            taps.put_f32(
                "logits".into(),
                vec![shape.logits_rows, self.config.vocab_size],
                l.clone(),
            );
            if !input.read.logits.is_empty() {
                let v = self.config.vocab_size;
                for &i in &input.read.logits {
                    logits.extend_from_slice(&l[i as usize * v..(i as usize + 1) * v]);
                }
            }
        } else if !input.read.logits.is_empty() {
            logits = self
                .path
                .read_logits(&input.read.logits)
                .map_err(|e| be_err("reading logits", e))?;
        }
        Ok(StepOutput {
            tokens,
            logits,
            taps,
        })
    }

    fn copy_blocks(&mut self, pairs: &[(u32, u32)]) -> Result<(), BackendError> {
        self.path
            .kv
            .copy_blocks(self.path.launcher(), pairs)
            .map_err(|e| be_err("copy_blocks", e))
    }

    fn device_bytes(&self) -> usize {
        self.path.device_bytes()
    }

    /// The DSpark draft on this device ([`GpuDraft`]): its weights
    /// uploaded, the target's embedding and LM head shared.
    fn draft_forward(
        &self,
        w: &DsparkWeights,
    ) -> Option<Result<Box<dyn DraftForward>, BackendError>> {
        let m = &self.path.model;
        Some(
            GpuDraft::new(
                self.gpu,
                &self.path.options(),
                &self.config,
                Arc::clone(&m.embed),
                Arc::clone(&m.lm_head),
                w,
            )
            .map(|d| Box::new(d) as Box<dyn DraftForward>)
            .map_err(|e| be_err("loading the DSpark draft", e)),
        )
    }
}
