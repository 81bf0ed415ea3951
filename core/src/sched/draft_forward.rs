//! The DSpark draft's forward (MODEL.md 6; the choices this project made
//! are in [`super::dspark_drafter`]'s docs) behind one trait, so the
//! drafter's policy (Markov bias, sampling, context bookkeeping) is the same
//! on every backend:
//!
//! - [`OpsDraft`] composes the forward from [`Backend::run_op`] over host
//!   weights and a host context cache: the CPU reference's draft (and the
//!   op-parity harness's);
//! - a loaded model may run it where its weights are
//!   ([`crate::backend::ModelRunner::draft_forward`]): the GPU runner's
//!   draft keeps the draft weights and every request's context K/V on the
//!   device and shares the target's embedding and LM head there.

use alloc::collections::btree_map::Entry;
use alloc::collections::BTreeMap;
use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec;
use alloc::vec::Vec;

use super::request::RequestId;
use crate::backend::{Backend, BackendError, LinearInput, Op, StepBatch, StepSeq, Taps};
use crate::config::ModelConfig;
use crate::dspark::DsparkWeights;
use crate::kv::{CacheDtype, CacheTensor, KvError};
use crate::weights::{LinearWeight, ModelWeights};

/// The DSpark draft's forward on some backend.
pub trait DraftForward {
    /// Add context rows for request `id`: the committed `positions`
    /// (ascending) and their features `feats` `[positions.len(), fc_in]`
    /// (the target residuals after each of `target_layer_ids`, f32).
    /// Each row's per-layer K/V is computed once, here.
    fn add_context(
        &mut self,
        id: RequestId,
        positions: &[u32],
        feats: &[f32],
    ) -> Result<(), BackendError>;

    /// Logits `[n, vocab]` (f32, before the Markov bias) of the `n` query
    /// rows of a proposal: `last` (the last committed token) at `last_pos`,
    /// then the mask token at `last_pos + 1 ..`. Only context rows at
    /// positions before `last_pos` are attended (the rest are dropped).
    fn draft_logits(
        &mut self,
        id: RequestId,
        last: u32,
        last_pos: u32,
        n: usize,
    ) -> Result<Vec<f32>, BackendError>;

    /// The Markov bias `E_m[prev] . W_m` (`[vocab]`, f32).
    fn markov_bias(&mut self, prev: u32) -> Result<Vec<f32>, BackendError>;

    /// Drop request `id`'s context.
    fn forget(&mut self, id: RequestId);

    /// Context rows currently kept for `id`.
    fn context_rows(&self, id: RequestId) -> usize;
}

/// One request's draft context: positions of the cached context rows
/// (ascending; slot `i` holds `positions[i]`) and their per-layer K/V.
struct RequestCtx {
    positions: Vec<u32>,
    /// Per draft layer, `[cap, kv_heads * head_dim]` bf16.
    k: Vec<CacheTensor>,
    v: Vec<CacheTensor>,
    cap: usize,
}

impl RequestCtx {
    fn new(layers: usize, width: usize) -> Result<Self, KvError> {
        let cap = 64;
        let t = || CacheTensor::new(CacheDtype::Bf16, cap, width, 1.0);
        Ok(RequestCtx {
            positions: Vec::new(),
            k: (0..layers).map(|_| t()).collect::<Result<_, _>>()?,
            v: (0..layers).map(|_| t()).collect::<Result<_, _>>()?,
            cap,
        })
    }

    /// Grow every cache tensor to hold at least `slots` rows.
    fn reserve(&mut self, slots: usize) {
        if slots <= self.cap {
            return;
        }
        let cap = slots.next_power_of_two();
        for t in self.k.iter_mut().chain(self.v.iter_mut()) {
            t.resize_slots(cap);
        }
        self.cap = cap;
    }
}

/// `x [rows, w.cols()] · wᵀ` op by op on `backend` (bf16 input; the output
/// rounded to bf16 when `round_out`): the linear both drafts run.
pub(crate) fn linear(
    backend: &dyn Backend,
    x: &[f32],
    rows: usize,
    w: &LinearWeight,
    round_out: bool,
) -> Result<Vec<f32>, BackendError> {
    let mut o = vec![0.0f32; rows * w.rows()];
    backend.run_op(Op::Linear {
        x,
        rows,
        w,
        input: LinearInput::Bf16,
        round_out,
        out: &mut o,
    })?;
    Ok(o)
}

/// A draft's `fc` input for the committed `rows` of a step: per row, the
/// target residual after each layer of `layer_ids` (the `residual.{l}` taps,
/// `width` values each) concatenated in that order, `[rows, ids * width]`.
/// Errs naming the missing tap or row.
pub(crate) fn tap_features(
    taps: &Taps,
    layer_ids: &[usize],
    width: usize,
    rows: &[usize],
) -> Result<Vec<f32>, String> {
    let fc_in = layer_ids.len() * width;
    let mut feats = vec![0.0f32; rows.len() * fc_in];
    for (j, &l) in layer_ids.iter().enumerate() {
        let res = taps
            .f32(&format!("residual.{l}"))
            .ok_or_else(|| format!("the backend did not capture residual.{l}"))?;
        for (i, &r) in rows.iter().enumerate() {
            let src = res
                .get(r * width..(r + 1) * width)
                .ok_or_else(|| format!("residual.{l} has no row {r}"))?;
            feats[i * fc_in + j * width..i * fc_in + (j + 1) * width].copy_from_slice(src);
        }
    }
    Ok(feats)
}

/// What the draft takes from its target: the config it must fit, and the
/// embedding and LM head it shares (host copies: a device runner does not
/// keep its weights on the host, so its caller loads just these two).
#[derive(Clone, Copy, Debug)]
pub struct DraftTarget<'a> {
    pub config: &'a ModelConfig,
    pub embed: &'a LinearWeight,
    pub lm_head: &'a LinearWeight,
}

impl<'a> DraftTarget<'a> {
    /// The parts of a host model.
    pub fn of(m: &'a ModelWeights) -> Self {
        DraftTarget {
            config: &m.config,
            embed: &m.embed,
            lm_head: &m.lm_head,
        }
    }
}

/// The draft forward composed from `run_op` on host data.
pub struct OpsDraft<'a> {
    backend: &'a dyn Backend,
    /// The target's shared parts.
    target: DraftTarget<'a>,
    weights: &'a DsparkWeights,
    /// `W_m` transposed to `[vocab, r]` f32, so the bias is one `Linear`.
    markov_wt: LinearWeight,
    ctx: BTreeMap<RequestId, RequestCtx>,
}

impl<'a> OpsDraft<'a> {
    /// A drafter running `weights` on `backend`, sharing `target`'s
    /// embedding and LM head. Fails if the draft does not fit the target.
    pub fn new(
        backend: &'a dyn Backend,
        target: DraftTarget<'a>,
        weights: &'a DsparkWeights,
    ) -> Result<Self, BackendError> {
        let c = &weights.config;
        c.validate(Some(target.config))
            .map_err(|e| BackendError::Other(e.to_string()))?;
        let (r, vocab) = (c.markov_rank, c.vocab_size);
        if weights.markov_w.rows() != r || weights.markov_w.cols() != vocab {
            return Err(BackendError::Shape {
                op: "dspark",
                what: format!(
                    "markov W_m is {}x{}, expected {r}x{vocab}",
                    weights.markov_w.rows(),
                    weights.markov_w.cols()
                ),
            });
        }
        let mut w = vec![0.0f32; r * vocab];
        backend.run_op(Op::Dequantize {
            w: &weights.markov_w,
            out: &mut w,
        })?;
        let mut wt = vec![0.0f32; r * vocab];
        for j in 0..r {
            for v in 0..vocab {
                wt[v * r + j] = w[j * vocab + v];
            }
        }
        Ok(OpsDraft {
            backend,
            target,
            weights,
            markov_wt: LinearWeight::F32 {
                rows: vocab,
                cols: r,
                data: wt,
            },
            ctx: BTreeMap::new(),
        })
    }

    fn lin(
        &self,
        x: &[f32],
        rows: usize,
        w: &LinearWeight,
        round_out: bool,
    ) -> Result<Vec<f32>, BackendError> {
        linear(self.backend, x, rows, w, round_out)
    }

    fn norm(
        &self,
        x: &[f32],
        width: usize,
        w: &[f32],
        round: bool,
    ) -> Result<Vec<f32>, BackendError> {
        let mut o = vec![0.0f32; x.len()];
        self.backend.run_op(Op::RmsNorm {
            x,
            width,
            weight: w,
            eps: self.weights.config.rms_norm_eps,
            round_out: round,
            out: &mut o,
        })?;
        Ok(o)
    }

    /// Layer `l`'s K and V rows (K normed, rotated at `positions`, bf16) of
    /// the input rows `x` (`[positions.len(), H]`), normed by the layer's
    /// input norm first unless `hn` is already normed.
    fn kv(
        &self,
        l: usize,
        hn: &[f32],
        positions: &[u32],
    ) -> Result<(Vec<f32>, Vec<f32>), BackendError> {
        let c = &self.weights.config;
        let lw = &self.weights.layers[l];
        let n = positions.len();
        let k0 = self.lin(hn, n, &lw.attn.k, true)?;
        let v = self.lin(hn, n, &lw.attn.v, true)?;
        let mut k = self.norm(&k0, c.head_dim, &lw.attn.k_norm, false)?;
        self.backend.run_op(Op::Rope {
            x: &mut k,
            heads: c.num_key_value_heads,
            head_dim: c.head_dim,
            rotary_dim: c.rotary_dim,
            theta: c.rope_theta,
            positions,
            round_out: true,
        })?;
        Ok((k, v))
    }
}

impl DraftForward for OpsDraft<'_> {
    fn add_context(
        &mut self,
        id: RequestId,
        positions: &[u32],
        feats: &[f32],
    ) -> Result<(), BackendError> {
        let c = self.weights.config.clone();
        let h = c.hidden_size;
        let n = positions.len();
        let cr = self.lin(feats, n, &self.weights.fc, true)?;
        let width = c.num_key_value_heads * c.head_dim;
        let mut kv = Vec::with_capacity(c.n_layers);
        for l in 0..c.n_layers {
            let hn = self.norm(&cr, h, &self.weights.layers[l].input_norm, true)?;
            kv.push(self.kv(l, &hn, positions)?);
        }
        let kv_err = |e: KvError| BackendError::Shape {
            op: "draft context",
            what: e.to_string(),
        };
        let st = match self.ctx.entry(id) {
            Entry::Occupied(o) => o.into_mut(),
            Entry::Vacant(v) => v.insert(RequestCtx::new(c.n_layers, width).map_err(kv_err)?),
        };
        for (i, &p) in positions.iter().enumerate() {
            let slot = match st.positions.binary_search(&p) {
                Ok(s) => s,
                Err(s) if s == st.positions.len() => {
                    st.reserve(s + 1);
                    st.positions.push(p);
                    s
                }
                // A hole before the last kept row (not produced by the
                // scheduler): keep the rows ascending, skip it.
                Err(_) => continue,
            };
            for (l, (k, v)) in kv.iter().enumerate() {
                st.k[l]
                    .write(slot, &k[i * width..(i + 1) * width])
                    .map_err(kv_err)?;
                st.v[l]
                    .write(slot, &v[i * width..(i + 1) * width])
                    .map_err(kv_err)?;
            }
        }
        Ok(())
    }

    fn draft_logits(
        &mut self,
        id: RequestId,
        last: u32,
        last_pos: u32,
        n: usize,
    ) -> Result<Vec<f32>, BackendError> {
        let c = self.weights.config.clone();
        let (h, nh, nkv, d) = (
            c.hidden_size,
            c.num_attention_heads,
            c.num_key_value_heads,
            c.head_dim,
        );
        let width = nkv * d;
        let mut st = match self.ctx.remove(&id) {
            Some(st) => st,
            None => RequestCtx::new(c.n_layers, width).map_err(|e| BackendError::Shape {
                op: "draft context",
                what: e.to_string(),
            })?,
        };
        // Only rows strictly before the last committed token are context.
        let keep = st.positions.partition_point(|&p| p < last_pos);
        st.positions.truncate(keep);
        let nctx = keep;
        st.reserve(nctx + n);
        let result = (|| {
            let mut toks = vec![c.mask_token_id; n];
            toks[0] = last;
            let mut x = vec![0.0f32; n * h];
            self.backend.run_op(Op::Embed {
                table: self.target.embed,
                tokens: &toks,
                out: &mut x,
            })?;
            let qpos: Vec<u32> = (0..n as u32).map(|i| last_pos + i).collect();
            let slots: Vec<u32> = (0..n).map(|i| (nctx + i) as u32).collect();
            // Attention sees slots 0 .. nctx + n: every query row gets the
            // last mask position, so nothing is masked (non-causal).
            let att_step = StepBatch {
                tokens: vec![0; n],
                positions: vec![(nctx + n - 1) as u32; n],
                slot_mapping: slots.clone(),
                row_seq: vec![0; n],
                seqs: vec![StepSeq {
                    request_id: id,
                    block_table: vec![0],
                    context_len: (nctx + n) as u32,
                }],
                logits_rows: Vec::new(),
                decode_only: false,
            };
            for l in 0..c.n_layers {
                let lw = &self.weights.layers[l];
                let hn = self.norm(&x, h, &lw.input_norm, true)?;
                let q0 = self.lin(&hn, n, &lw.attn.q, true)?;
                let mut q = self.norm(&q0, d, &lw.attn.q_norm, false)?;
                self.backend.run_op(Op::Rope {
                    x: &mut q,
                    heads: nh,
                    head_dim: d,
                    rotary_dim: c.rotary_dim,
                    theta: c.rope_theta,
                    positions: &qpos,
                    round_out: true,
                })?;
                let (k, v) = self.kv(l, &hn, &qpos)?;
                self.backend.run_op(Op::CacheWrite {
                    cache: &mut st.k[l],
                    slots: &slots,
                    x: &k,
                })?;
                self.backend.run_op(Op::CacheWrite {
                    cache: &mut st.v[l],
                    slots: &slots,
                    x: &v,
                })?;
                let mut o = vec![0.0f32; n * nh * d];
                self.backend.run_op(Op::Attention {
                    q: &q,
                    heads: nh,
                    kv_heads: nkv,
                    head_dim: d,
                    k: &st.k[l],
                    v: &st.v[l],
                    step: &att_step,
                    page_size: st.cap,
                    blocks: None,
                    out: &mut o,
                })?;
                let ao = self.lin(&o, n, &lw.attn.o, true)?;
                self.backend.run_op(Op::Add {
                    acc: &mut x,
                    x: &ao,
                })?;
                let h2 = self.norm(&x, h, &lw.post_attn_norm, true)?;
                let mut y = vec![0.0f32; n * h];
                self.backend.run_op(Op::Mlp {
                    x: &h2,
                    rows: n,
                    w: &lw.mlp,
                    alpha: c.swiglu_alpha,
                    limit: c.swiglu_limit,
                    out: &mut y,
                })?;
                self.backend.run_op(Op::Add { acc: &mut x, x: &y })?;
            }
            let xn = self.norm(&x, h, &self.weights.final_norm, true)?;
            self.lin(&xn, n, self.target.lm_head, false)
        })();
        self.ctx.insert(id, st);
        result
    }

    fn markov_bias(&mut self, prev: u32) -> Result<Vec<f32>, BackendError> {
        let r = self.weights.config.markov_rank;
        let mut e = vec![0.0f32; r];
        self.backend.run_op(Op::Embed {
            table: &self.weights.markov_e,
            tokens: &[prev],
            out: &mut e,
        })?;
        let mut b = vec![0.0f32; self.weights.config.vocab_size];
        self.backend.run_op(Op::Linear {
            x: &e,
            rows: 1,
            w: &self.markov_wt,
            input: LinearInput::F32,
            round_out: false,
            out: &mut b,
        })?;
        Ok(b)
    }

    fn forget(&mut self, id: RequestId) {
        self.ctx.remove(&id);
    }

    fn context_rows(&self, id: RequestId) -> usize {
        self.ctx.get(&id).map_or(0, |c| c.positions.len())
    }
}
