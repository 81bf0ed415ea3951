//! Loading the model onto the device tensor by tensor, from host weights
//! (tests, in-memory models) or straight from a checkpoint's mapped shards.
//!
//! From a checkpoint nothing is copied on the host but what a load-time
//! conversion makes (one tensor at a time): each tensor's stored bytes go
//! from the mapped shard to its device allocation (routed experts into
//! their layer's stacked allocation), and the shard pages are then released
//! ([`Checkpoint::release`]), so host memory stays near one tensor whatever
//! the model's size.

use std::borrow::Cow;
use std::sync::Arc;

use m3_core::checkpoint::{Checkpoint, LoadOptions, StoredLinear, WeightFormat};
use m3_core::config::{AttnKind, MlpKind, ModelConfig};
use m3_core::weights::{FfnWeights, LinearWeight, MlpWeights, ModelWeights};

use super::devmem::DevBuf;
use super::weights::{DevFfn, DevIndexer, DevLayer, DevLinear, DevMlp, DevModel, DevNorm, WFmt};
use crate::error::{GpuError, Result};
use crate::runtime::api::Device;

/// Where the device model's tensors come from.
pub enum WeightSource<'a> {
    /// Typed host weights.
    Host(&'a ModelWeights),
    /// A validated checkpoint, streamed tensor by tensor.
    Checkpoint(&'a Checkpoint, LoadOptions),
}

pub use m3_core::backend::runner::LoadProgress;

/// A projection of an MLP.
#[derive(Clone, Copy, Debug)]
enum Proj {
    Gate,
    Up,
    Down,
}

/// One linear weight of the model.
#[derive(Clone, Copy, Debug)]
enum Lin {
    Embed,
    LmHead,
    Q(usize),
    K(usize),
    V(usize),
    O(usize),
    IndexQ(usize),
    IndexK(usize),
    Router(usize),
    Dense(usize, Proj),
    Shared(usize, Proj),
    Expert(usize, usize, Proj),
}

/// One vector of the model (norm weights, the router bias).
#[derive(Clone, Copy, Debug)]
enum Vector {
    FinalNorm,
    InputNorm(usize),
    PostNorm(usize),
    QNorm(usize),
    KNorm(usize),
    IndexQNorm(usize),
    IndexKNorm(usize),
    Bias(usize),
}

/// One optional cache scale.
#[derive(Clone, Copy, Debug)]
enum Scale {
    K(usize),
    V(usize),
    IndexK(usize),
}

fn mlp_of(m: &MlpWeights, p: Proj) -> &LinearWeight {
    match p {
        Proj::Gate => &m.gate,
        Proj::Up => &m.up,
        Proj::Down => &m.down,
    }
}

/// A host weight as stored parts (borrowed, no copy).
fn stored_of(w: &LinearWeight) -> StoredLinear<'_> {
    let (format, codes, scales, global): (WeightFormat, &[u8], &[u8], f32) = match w {
        LinearWeight::Bf16 { data, .. } => {
            (WeightFormat::Bf16, bytemuck::cast_slice(data), &[], 1.0)
        }
        LinearWeight::F32 { data, .. } => (WeightFormat::F32, bytemuck::cast_slice(data), &[], 1.0),
        LinearWeight::Mx(t) => {
            let f = match t.elem() {
                m3_core::formats::MxElem::Fp4E2M1 => WeightFormat::Mxfp4,
                m3_core::formats::MxElem::Fp8E4M3 => WeightFormat::Mxfp8E4M3,
                m3_core::formats::MxElem::Fp8E5M2 => WeightFormat::Mxfp8E5M2,
            };
            (f, t.codes(), t.scales(), 1.0)
        }
        LinearWeight::Nvfp4(t) => (WeightFormat::Nvfp4, t.codes(), t.scales(), t.global()),
    };
    StoredLinear::Borrowed {
        format,
        rows: w.rows(),
        cols: w.cols(),
        codes,
        scales,
        global,
    }
}

/// A linear's device format and parts, whatever its source.
struct Parts<'a> {
    fmt: WFmt,
    rows: usize,
    cols: usize,
    codes: Cow<'a, [u8]>,
    scales: Cow<'a, [u8]>,
    global: f32,
}

fn parts(s: StoredLinear<'_>) -> Parts<'_> {
    match s {
        StoredLinear::Borrowed {
            format,
            rows,
            cols,
            codes,
            scales,
            global,
        } => Parts {
            fmt: WFmt::of_stored(format),
            rows,
            cols,
            codes: Cow::Borrowed(codes),
            scales: Cow::Borrowed(scales),
            global,
        },
        StoredLinear::Owned(w) => {
            let fmt = WFmt::of(&w);
            let (rows, cols) = (w.rows(), w.cols());
            let (codes, scales, global) = match w {
                LinearWeight::Bf16 { data, .. } => {
                    (bytemuck::cast_slice(&data).to_vec(), Vec::new(), 1.0)
                }
                LinearWeight::F32 { data, .. } => {
                    (bytemuck::cast_slice(&data).to_vec(), Vec::new(), 1.0)
                }
                LinearWeight::Mx(t) => (t.codes().to_vec(), t.scales().to_vec(), 1.0),
                LinearWeight::Nvfp4(t) => (t.codes().to_vec(), t.scales().to_vec(), t.global()),
            };
            Parts {
                fmt,
                rows,
                cols,
                codes: Cow::Owned(codes),
                scales: Cow::Owned(scales),
                global,
            }
        }
    }
}

impl WeightSource<'_> {
    /// The model config.
    pub fn config(&self) -> &ModelConfig {
        match self {
            WeightSource::Host(m) => &m.config,
            WeightSource::Checkpoint(ck, _) => ck.config(),
        }
    }

    fn name(&self, w: Lin) -> String {
        let WeightSource::Checkpoint(ck, _) = self else {
            return format!("{w:?}");
        };
        let n = ck.names();
        let proj = |m: m3_core::checkpoint::names::MlpNames, p: Proj| match p {
            Proj::Gate => m.gate(),
            Proj::Up => m.up(),
            Proj::Down => m.down(),
        };
        match w {
            Lin::Embed => n.embed(),
            Lin::LmHead => n.lm_head(),
            Lin::Q(l) => n.layer(l).q_proj(),
            Lin::K(l) => n.layer(l).k_proj(),
            Lin::V(l) => n.layer(l).v_proj(),
            Lin::O(l) => n.layer(l).o_proj(),
            Lin::IndexQ(l) => n.layer(l).index_q_proj(),
            Lin::IndexK(l) => n.layer(l).index_k_proj(),
            Lin::Router(l) => n.layer(l).router(),
            Lin::Dense(l, p) => proj(n.layer(l).dense_mlp(), p),
            Lin::Shared(l, p) => proj(n.layer(l).shared_expert(), p),
            Lin::Expert(l, e, p) => proj(n.layer(l).expert(e), p),
        }
    }

    /// The stored parts of linear `w` of shape `[rows, cols]`, or its PTPC
    /// FP8 form where online quantization converts it.
    fn linear(&self, w: Lin, rows: usize, cols: usize) -> Result<Parts<'_>> {
        let bad = |why: String| GpuError::input("loading weights", why);
        match self {
            WeightSource::Checkpoint(ck, opts) => {
                let name = self.name(w);
                let routed = matches!(w, Lin::Expert(..));
                // routed experts are never online-quantization targets (and
                // are most of the tensors: skip the target lookup for them)
                let online = if routed {
                    None
                } else {
                    ck.online_linear(&name, rows, cols, opts)
                        .map_err(|e| bad(e.to_string()))?
                };
                if let Some(p) = online {
                    return Ok(Parts {
                        fmt: WFmt::Ptpc,
                        rows,
                        cols,
                        codes: Cow::Owned(p.codes),
                        scales: Cow::Owned(bytemuck::cast_slice(&p.scales).to_vec()),
                        global: 1.0,
                    });
                }
                ck.stored_linear(&name, rows, cols, routed, opts)
                    .map(parts)
                    .map_err(|e| bad(e.to_string()))
            }
            WeightSource::Host(m) => {
                let lw = |l: usize| &m.layers[l];
                let moe = |l: usize| match &lw(l).ffn {
                    FfnWeights::Moe(moe) => Ok(moe),
                    FfnWeights::Dense(_) => Err(bad(format!("layer {l} has no MoE weights"))),
                };
                let ix = |l: usize| {
                    lw(l)
                        .attn
                        .indexer
                        .as_ref()
                        .ok_or_else(|| bad(format!("layer {l} has no indexer weights")))
                };
                let x: &LinearWeight = match w {
                    Lin::Embed => &m.embed,
                    Lin::LmHead => &m.lm_head,
                    Lin::Q(l) => &lw(l).attn.q,
                    Lin::K(l) => &lw(l).attn.k,
                    Lin::V(l) => &lw(l).attn.v,
                    Lin::O(l) => &lw(l).attn.o,
                    Lin::IndexQ(l) => &ix(l)?.q,
                    Lin::IndexK(l) => &ix(l)?.k,
                    Lin::Router(l) => &moe(l)?.router,
                    Lin::Dense(l, p) => match &lw(l).ffn {
                        FfnWeights::Dense(d) => mlp_of(d, p),
                        FfnWeights::Moe(_) => {
                            return Err(bad(format!("layer {l} has no dense MLP")))
                        }
                    },
                    Lin::Shared(l, p) => mlp_of(
                        moe(l)?
                            .shared
                            .as_ref()
                            .ok_or_else(|| bad(format!("layer {l} has no shared expert")))?,
                        p,
                    ),
                    Lin::Expert(l, e, p) => mlp_of(
                        moe(l)?
                            .experts
                            .get(e)
                            .ok_or_else(|| bad(format!("layer {l} has no expert {e}")))?,
                        p,
                    ),
                };
                if (x.rows(), x.cols()) != (rows, cols) {
                    return Err(bad(format!(
                        "{w:?} is [{}, {}], the config wants [{rows}, {cols}]",
                        x.rows(),
                        x.cols()
                    )));
                }
                // a host load with online quantization holds the PTPC form
                // beside the stored weight (`LayerWeights::ptpc`)
                let ptpc = |l: usize| &lw(l).ptpc;
                let online = match w {
                    Lin::Q(l) => ptpc(l).q.as_ref(),
                    Lin::K(l) => ptpc(l).k.as_ref(),
                    Lin::V(l) => ptpc(l).v.as_ref(),
                    Lin::O(l) => ptpc(l).o.as_ref(),
                    Lin::IndexQ(l) => ptpc(l).index_q.as_ref(),
                    Lin::IndexK(l) => ptpc(l).index_k.as_ref(),
                    Lin::Dense(l, Proj::Gate) => ptpc(l).gate.as_ref(),
                    Lin::Dense(l, Proj::Up) => ptpc(l).up.as_ref(),
                    Lin::Dense(l, Proj::Down) => ptpc(l).down.as_ref(),
                    _ => None,
                };
                if let Some(p) = online {
                    return Ok(Parts {
                        fmt: WFmt::Ptpc,
                        rows,
                        cols,
                        codes: Cow::Borrowed(&p.codes),
                        scales: Cow::Borrowed(bytemuck::cast_slice(&p.scales)),
                        global: 1.0,
                    });
                }
                Ok(parts(stored_of(x)))
            }
        }
    }

    fn release(&self, w: Lin) {
        if let WeightSource::Checkpoint(ck, _) = self {
            ck.release(&self.name(w));
        }
    }

    fn vector(&self, v: Vector) -> Result<Vec<f32>> {
        let bad = |why: String| GpuError::input("loading weights", why);
        match self {
            WeightSource::Checkpoint(ck, _) => {
                let n = ck.names();
                let name = match v {
                    Vector::FinalNorm => n.final_norm(),
                    Vector::InputNorm(l) => n.layer(l).input_layernorm(),
                    Vector::PostNorm(l) => n.layer(l).post_attention_layernorm(),
                    Vector::QNorm(l) => n.layer(l).q_norm(),
                    Vector::KNorm(l) => n.layer(l).k_norm(),
                    Vector::IndexQNorm(l) => n.layer(l).index_q_norm(),
                    Vector::IndexKNorm(l) => n.layer(l).index_k_norm(),
                    Vector::Bias(l) => n.layer(l).correction_bias(),
                };
                ck.vector_f32(&name).map_err(|e| bad(e.to_string()))
            }
            WeightSource::Host(m) => {
                let lw = |l: usize| &m.layers[l];
                let ix = |l: usize| {
                    lw(l)
                        .attn
                        .indexer
                        .as_ref()
                        .ok_or_else(|| bad(format!("layer {l} has no indexer weights")))
                };
                Ok(match v {
                    Vector::FinalNorm => m.final_norm.clone(),
                    Vector::InputNorm(l) => lw(l).input_norm.clone(),
                    Vector::PostNorm(l) => lw(l).post_attn_norm.clone(),
                    Vector::QNorm(l) => lw(l).attn.q_norm.clone(),
                    Vector::KNorm(l) => lw(l).attn.k_norm.clone(),
                    Vector::IndexQNorm(l) => ix(l)?.q_norm.clone(),
                    Vector::IndexKNorm(l) => ix(l)?.k_norm.clone(),
                    Vector::Bias(l) => match &lw(l).ffn {
                        FfnWeights::Moe(moe) => moe.correction_bias.clone(),
                        FfnWeights::Dense(_) => {
                            return Err(bad(format!("layer {l} has no router bias")))
                        }
                    },
                })
            }
        }
    }

    fn scale(&self, s: Scale) -> Result<f32> {
        match self {
            WeightSource::Checkpoint(ck, _) => {
                let n = ck.names();
                let name = match s {
                    Scale::K(l) => n.layer(l).k_scale(),
                    Scale::V(l) => n.layer(l).v_scale(),
                    Scale::IndexK(l) => n.layer(l).index_k_scale(),
                };
                ck.scalar_f32_or(&name, 1.0)
                    .map_err(|e| GpuError::input("loading weights", e.to_string()))
            }
            WeightSource::Host(m) => Ok(match s {
                Scale::K(l) => m.layers[l].attn.k_scale,
                Scale::V(l) => m.layers[l].attn.v_scale,
                Scale::IndexK(l) => m.layers[l]
                    .attn
                    .indexer
                    .as_ref()
                    .map_or(1.0, |ix| ix.k_scale),
            }),
        }
    }
}

/// Builds the device model, one tensor at a time.
struct Loader<'s, 'p> {
    ctx: Device,
    src: &'s WeightSource<'s>,
    progress: &'p mut dyn FnMut(LoadProgress),
    state: LoadProgress,
}

impl Loader<'_, '_> {
    fn tick(&mut self, bytes: usize) {
        self.state.tensors_done += 1;
        self.state.bytes_done += bytes as u64;
        (self.progress)(self.state);
    }

    /// `count` matrices `which(i)` stacked into one device allocation.
    fn stack(
        &mut self,
        count: usize,
        rows: usize,
        cols: usize,
        which: impl Fn(usize) -> Lin,
    ) -> Result<DevLinear> {
        let mut dev: Option<DevLinear> = None;
        for i in 0..count {
            let w = which(i);
            let p = self.src.linear(w, rows, cols)?;
            let d = match &mut dev {
                Some(d) => d,
                None => dev.insert(
                    DevLinear::alloc(&self.ctx, p.fmt, rows, cols, count).map_err(|e| {
                        GpuError::input("loading weights", format!("{}: {e}", self.src.name(w)))
                    })?,
                ),
            };
            if p.fmt != d.fmt {
                return Err(GpuError::input(
                    "loading weights",
                    format!(
                        "{}: {:?}, but the other matrices of its stack are {:?} (a stack holds one format)",
                        self.src.name(w),
                        p.fmt,
                        d.fmt
                    ),
                ));
            }
            if (p.rows, p.cols) != (rows, cols) {
                return Err(GpuError::input(
                    "loading weights",
                    format!(
                        "{}: [{}, {}], expected [{rows}, {cols}]",
                        self.src.name(w),
                        p.rows,
                        p.cols
                    ),
                ));
            }
            d.write(i, &p.codes, &p.scales, p.global).map_err(|e| {
                GpuError::input("loading weights", format!("{}: {e}", self.src.name(w)))
            })?;
            let bytes = p.codes.len() + p.scales.len();
            drop(p);
            self.src.release(w);
            self.tick(bytes);
        }
        dev.ok_or_else(|| GpuError::input("loading weights", "an empty stack"))
    }

    fn one(&mut self, w: Lin, rows: usize, cols: usize) -> Result<DevLinear> {
        self.stack(1, rows, cols, |_| w)
    }

    fn mlp(
        &mut self,
        count: usize,
        w: usize,
        h: usize,
        which: impl Fn(usize, Proj) -> Lin,
    ) -> Result<DevMlp> {
        Ok(DevMlp {
            gate: self.stack(count, w, h, |i| which(i, Proj::Gate))?,
            up: self.stack(count, w, h, |i| which(i, Proj::Up))?,
            down: self.stack(count, h, w, |i| which(i, Proj::Down))?,
        })
    }

    /// Vector `v`'s `len` values on the host (an error names it otherwise).
    fn host_vector(&self, v: Vector, len: usize) -> Result<Vec<f32>> {
        let x = self.src.vector(v)?;
        if x.len() != len {
            return Err(GpuError::input(
                "loading weights",
                format!("{v:?} has {} values, expected {len}", x.len()),
            ));
        }
        Ok(x)
    }

    fn vector(&mut self, v: Vector, len: usize) -> Result<DevBuf> {
        let b = DevBuf::from_slice(&self.ctx, &self.host_vector(v, len)?)?;
        self.tick(4 * len);
        Ok(b)
    }

    /// An RMSNorm weight of `len` values, with its bound.
    fn norm(&mut self, v: Vector, len: usize) -> Result<DevNorm> {
        let b = DevNorm::new(&self.ctx, &self.host_vector(v, len)?)?;
        self.tick(4 * len);
        Ok(b)
    }
}

impl DevModel {
    /// Load `src` onto the device of `ctx`, calling `progress` after every
    /// tensor. Every layer's K/V scales and format mix are checked against
    /// what the kernels take; errors name the tensor.
    /// With `fold_shared`, each MoE layer's shared expert becomes the last
    /// matrix of its expert stacks (it must have the experts' format and
    /// width).
    pub fn load(
        ctx: &Device,
        src: &WeightSource<'_>,
        fold_shared: bool,
        progress: &mut dyn FnMut(LoadProgress),
    ) -> Result<Self> {
        let c = src.config().clone();
        if let WeightSource::Checkpoint(ck, opts) = src {
            // online quantization's exclusion patterns, checked before any
            // tensor moves (a pattern that excludes nothing is an error)
            ck.online_targets(opts)
                .map_err(|e| GpuError::input("loading weights", e.to_string()))?;
        }
        let total = tensor_count(&c);
        let mut ld = Loader {
            ctx: ctx.clone(),
            src,
            progress,
            state: LoadProgress {
                tensors_total: total,
                ..LoadProgress::default()
            },
        };
        let h = c.hidden_size;
        let (qd, kvd) = (
            c.num_attention_heads * c.head_dim,
            c.num_key_value_heads * c.head_dim,
        );
        let embed = ld.one(Lin::Embed, c.vocab_size, h)?;
        if embed.fmt != WFmt::Bf16 {
            return Err(GpuError::input(
                "loading weights",
                format!(
                    "{}: the embedding must be bf16 (it is {:?})",
                    src.name(Lin::Embed),
                    embed.fmt
                ),
            ));
        }
        let mut layers = Vec::with_capacity(c.num_hidden_layers);
        for l in 0..c.num_hidden_layers {
            let sparse = c.attn_kinds.get(l) == Some(&AttnKind::Sparse);
            let indexer = if sparse {
                let di = c.index_head_dim;
                Some(DevIndexer {
                    q: ld.one(Lin::IndexQ(l), c.index_n_heads * di, h)?,
                    k: ld.one(Lin::IndexK(l), di, h)?,
                    q_norm: ld.vector(Vector::IndexQNorm(l), di)?,
                    k_norm: ld.vector(Vector::IndexKNorm(l), di)?,
                    k_scale: src.scale(Scale::IndexK(l))?,
                })
            } else {
                None
            };
            let ffn = match c.mlp_kinds.get(l) {
                Some(MlpKind::Dense) => {
                    DevFfn::Dense(ld.mlp(1, c.dense_intermediate_size, h, |_, p| Lin::Dense(l, p))?)
                }
                _ => {
                    let ne = c.num_local_experts;
                    let router = ld.one(Lin::Router(l), ne, h)?;
                    let bias = ld.vector(Vector::Bias(l), ne)?;
                    let fold = fold_shared && c.shared_intermediate_size > 0;
                    if fold && c.shared_intermediate_size != c.intermediate_size {
                        return Err(GpuError::input(
                            "--fold-shared-expert",
                            format!(
                                "the shared expert is {} wide and the routed experts {}: only one width folds into the expert table",
                                c.shared_intermediate_size, c.intermediate_size
                            ),
                        ));
                    }
                    let experts = ld
                        .mlp(ne + usize::from(fold), c.intermediate_size, h, |e, p| {
                            if e == ne {
                                Lin::Shared(l, p)
                            } else {
                                Lin::Expert(l, e, p)
                            }
                        })
                        .map_err(|e| {
                            if fold {
                                GpuError::input(
                                    "--fold-shared-expert",
                                    format!("layer {l}: {e} (the shared expert folds into the expert table only in the experts' format)"),
                                )
                            } else {
                                e
                            }
                        })?;
                    let shared = if c.shared_intermediate_size > 0 && !fold {
                        Some(ld.mlp(1, c.shared_intermediate_size, h, |_, p| Lin::Shared(l, p))?)
                    } else {
                        None
                    };
                    DevFfn::Moe {
                        router,
                        bias,
                        experts,
                        shared,
                        folded: fold,
                    }
                }
            };
            layers.push(DevLayer {
                input_norm: ld.norm(Vector::InputNorm(l), h)?,
                post_norm: ld.norm(Vector::PostNorm(l), h)?,
                q: ld.one(Lin::Q(l), qd, h)?,
                k: ld.one(Lin::K(l), kvd, h)?,
                v: ld.one(Lin::V(l), kvd, h)?,
                o: ld.one(Lin::O(l), h, qd)?,
                q_norm: ld.vector(Vector::QNorm(l), c.head_dim)?,
                k_norm: ld.vector(Vector::KNorm(l), c.head_dim)?,
                indexer,
                k_scale: src.scale(Scale::K(l))?,
                v_scale: src.scale(Scale::V(l))?,
                ffn,
            });
        }
        let final_norm = ld.norm(Vector::FinalNorm, h)?;
        let lm_head = ld.one(Lin::LmHead, c.vocab_size, h)?;
        Ok(DevModel {
            config: c,
            embed: Arc::new(embed.codes),
            layers,
            final_norm,
            lm_head: Arc::new(lm_head),
        })
    }

    /// Device bytes of every weight.
    pub fn bytes(&self) -> usize {
        let mlp = |m: &DevMlp| m.gate.bytes() + m.up.bytes() + m.down.bytes();
        let mut n = self.embed.bytes() + self.final_norm.bytes() + self.lm_head.bytes();
        for l in &self.layers {
            n += l.input_norm.bytes()
                + l.post_norm.bytes()
                + l.q.bytes()
                + l.k.bytes()
                + l.v.bytes()
                + l.o.bytes()
                + l.q_norm.bytes()
                + l.k_norm.bytes();
            if let Some(ix) = &l.indexer {
                n += ix.q.bytes() + ix.k.bytes() + ix.q_norm.bytes() + ix.k_norm.bytes();
            }
            n += match &l.ffn {
                DevFfn::Dense(m) => mlp(m),
                DevFfn::Moe {
                    router,
                    bias,
                    experts,
                    shared,
                    ..
                } => router.bytes() + bias.bytes() + mlp(experts) + shared.as_ref().map_or(0, mlp),
            };
        }
        n
    }
}

/// Tensors [`DevModel::load`] reads (the progress total).
fn tensor_count(c: &ModelConfig) -> usize {
    let mut n = 4; // embed, final norm, lm head, + 1 slack for rounding
    for l in 0..c.num_hidden_layers {
        n += 2 + 4 + 2; // norms, q k v o, q/k norms
        if c.attn_kinds.get(l) == Some(&AttnKind::Sparse) {
            n += 4;
        }
        n += match c.mlp_kinds.get(l) {
            Some(MlpKind::Dense) => 3,
            _ => 2 + 3 * c.num_local_experts + if c.shared_intermediate_size > 0 { 3 } else { 0 },
        };
    }
    n - 1
}
