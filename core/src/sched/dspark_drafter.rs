//! The DSpark draft (MODEL.md 6) as a [`Drafter`]: its forward composed from
//! [`Backend::run_op`] (so any backend runs it), proposals sampled with their
//! draft probabilities, and the per-request context it keeps.
//!
//! ## What this project computes (choices where MODEL.md 6 is open)
//!
//! - **Context rows.** For every committed position `j` whose target forward
//!   has run, `c_j = bf16(fc(concat_l residual.{l}[j]))` over
//!   `target_layer_ids` (the target residual *after* layer `l`, captured
//!   with [`Taps`] in the runner's step). Only rows for committed tokens are
//!   kept (verify rows of rejected drafts are dropped). Positions skipped by
//!   a prefix-cache hit have no context row; the draft attends to the rows
//!   it has.
//! - **Context K/V cache.** Context rows are *not* transformed by the draft
//!   layers: draft layer `l` projects them with its own input norm, `k_proj`,
//!   `v_proj`, k-norm and RoPE, `k_j = rope(knorm(bf16(rmsnorm(c_j; ln_l))
//!   Wk), j)`, `v_j = bf16(rmsnorm(c_j; ln_l)) Wv`. So each context row's
//!   per-layer K/V is computed once, when the row is committed, and kept in a
//!   per-request bf16 cache (the draft's KV cache); a proposal computes only
//!   its `N` query rows.
//! - **Query rows.** With `P` the position of the last committed token, the
//!   query rows are `embed(last)` at position `P` and `embed(mask_token_id)`
//!   at `P+1 .. P+N-1` (RoPE at those positions); query row `i` predicts the
//!   token at `P + 1 + i`. Each draft layer is MODEL.md 3 without indexer or
//!   MoE: Gemma RMSNorm, q/k/v, per-head q/k norms, partial NeoX RoPE, full
//!   *non-causal* attention over `[context | block]` (every query row sees
//!   every context row and every block row), `o_proj`, residual, RMSNorm,
//!   SwiGLU-OAI MLP, residual. Then `bf16(rmsnorm(x; norm))` and the
//!   target's LM head in f32.
//! - **Markov bias.** Proposed token `i` is drawn from
//!   `logits_i + E_m[prev] . W_m`, `prev` being the last committed token for
//!   `i = 0` and proposed token `i - 1` after; sampling uses the request's
//!   temperature / top-k / top-p ([`sampling_probs`]), keyed by (seed,
//!   position) with a salt of its own, so greedy requests get the draft's
//!   argmax.
//!
//! Errors of the backend inside a proposal give an empty proposal (that
//! step is verified without drafts) and are kept in
//! [`DsparkDrafter::last_error`].

use alloc::collections::BTreeMap;
use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec;
use alloc::vec::Vec;

use super::request::{RequestId, SamplingParams};
use super::runner::{Drafter, Proposal};
use super::spec_probs::sampling_probs;
use crate::backend::{
    Backend, BackendError, LinearInput, Op, StepBatch, StepSeq, TapRequest, Taps,
};
use crate::config::ModelConfig;
use crate::dspark::DsparkWeights;
use crate::kv::{CacheData, CacheDtype, CacheTensor};
use crate::sample::{greedy, uniform};
use crate::spec_decode::sample_index;
use crate::weights::{LinearWeight, ModelWeights};

/// Salt of the draft's sampling key, so draft draws are independent of the
/// target's (which use `uniform(seed, position)`).
const DRAFT_SALT: u64 = 0x6473_7061_726b_5f64; // "dspark_d"

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
    fn new(layers: usize, width: usize) -> Self {
        let cap = 64;
        let t = || CacheTensor::new(CacheDtype::Bf16, cap, width, 1.0);
        RequestCtx {
            positions: Vec::new(),
            k: (0..layers).map(|_| t()).collect(),
            v: (0..layers).map(|_| t()).collect(),
            cap,
        }
    }

    /// Grow every cache tensor to hold at least `slots` rows.
    fn reserve(&mut self, slots: usize) {
        if slots <= self.cap {
            return;
        }
        let cap = slots.next_power_of_two();
        for t in self.k.iter_mut().chain(self.v.iter_mut()) {
            let n = cap * t.width;
            match &mut t.data {
                CacheData::Bf16(d) => d.resize(n, 0),
                CacheData::Fp8(d) => d.resize(n, 0),
            }
        }
        self.cap = cap;
    }
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

/// The DSpark draft model as a [`Drafter`].
pub struct DsparkDrafter<'a> {
    backend: &'a dyn Backend,
    /// The target's shared parts.
    target: DraftTarget<'a>,
    weights: &'a DsparkWeights,
    /// `W_m` transposed to `[vocab, r]` f32, so the bias is one `Linear`.
    markov_wt: LinearWeight,
    ctx: BTreeMap<RequestId, RequestCtx>,
    /// The last backend error met while drafting (drafting then skipped).
    pub last_error: Option<String>,
    /// Proposals made (for reports).
    pub proposals: u64,
}

impl<'a> DsparkDrafter<'a> {
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
        Ok(DsparkDrafter {
            backend,
            target,
            weights,
            markov_wt: LinearWeight::F32 {
                rows: vocab,
                cols: r,
                data: wt,
            },
            ctx: BTreeMap::new(),
            last_error: None,
            proposals: 0,
        })
    }

    /// Context rows currently kept for `id`.
    pub fn context_rows(&self, id: RequestId) -> usize {
        self.ctx.get(&id).map_or(0, |c| c.positions.len())
    }

    fn lin(
        &self,
        x: &[f32],
        rows: usize,
        w: &LinearWeight,
        round_out: bool,
    ) -> Result<Vec<f32>, BackendError> {
        let mut o = vec![0.0f32; rows * w.rows()];
        self.backend.run_op(Op::Linear {
            x,
            rows,
            w,
            input: LinearInput::Bf16,
            round_out,
            out: &mut o,
        })?;
        Ok(o)
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

    /// Add context rows: `feats` `[positions.len(), fc_in]`.
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
        let st = self
            .ctx
            .entry(id)
            .or_insert_with(|| RequestCtx::new(c.n_layers, width));
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
                st.k[l].write(slot, &k[i * width..(i + 1) * width]);
                st.v[l].write(slot, &v[i * width..(i + 1) * width]);
            }
        }
        Ok(())
    }

    /// The draft forward for `n` query rows after `context` (module docs):
    /// logits `[n, vocab]` before the Markov bias.
    fn draft_logits(
        &mut self,
        id: RequestId,
        context: &[u32],
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
        let last_pos = (context.len() - 1) as u32;
        let last = context[context.len() - 1];
        let mut st = self
            .ctx
            .remove(&id)
            .unwrap_or_else(|| RequestCtx::new(c.n_layers, width));
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

    /// `E_m[prev] . W_m` (`[vocab]`, f32).
    fn markov_bias(&self, prev: u32) -> Result<Vec<f32>, BackendError> {
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

    /// Draft `k` tokens with their distributions (see [`Drafter::propose_sampled`]).
    pub fn try_propose(
        &mut self,
        id: RequestId,
        context: &[u32],
        k: usize,
        params: &SamplingParams,
    ) -> Result<Proposal, BackendError> {
        let n = k.min(self.weights.config.max_draft_tokens);
        if n == 0 || context.is_empty() {
            return Ok(Proposal::default());
        }
        let vocab = self.weights.config.vocab_size;
        let logits = self.draft_logits(id, context, n)?;
        let last_pos = (context.len() - 1) as u32;
        let mut prev = context[context.len() - 1];
        let mut tokens = Vec::with_capacity(n);
        let mut probs = Vec::with_capacity(n * vocab);
        for i in 0..n {
            let bias = self.markov_bias(prev)?;
            let li: Vec<f32> = logits[i * vocab..(i + 1) * vocab]
                .iter()
                .zip(&bias)
                .map(|(a, b)| a + b)
                .collect();
            let p = sampling_probs(&li, params);
            let pos = last_pos + 1 + i as u32;
            let w: Vec<f64> = p.iter().map(|&x| f64::from(x)).collect();
            let u = uniform(params.seed ^ DRAFT_SALT, pos);
            let x = sample_index(&w, u).map_or_else(|| greedy(&li), |t| t as u32);
            tokens.push(x);
            probs.extend_from_slice(&p);
            prev = x;
        }
        self.proposals += 1;
        Ok(Proposal {
            tokens,
            probs: Some(probs),
        })
    }
}

impl Drafter for DsparkDrafter<'_> {
    fn propose(&mut self, id: RequestId, context: &[u32], k: usize) -> Vec<u32> {
        self.propose_sampled(id, context, k, &SamplingParams::default())
            .tokens
    }

    fn propose_sampled(
        &mut self,
        id: RequestId,
        context: &[u32],
        k: usize,
        params: &SamplingParams,
    ) -> Proposal {
        match self.try_propose(id, context, k, params) {
            Ok(p) => p,
            Err(e) => {
                self.last_error = Some(format!("dspark draft: {e}"));
                Proposal::default()
            }
        }
    }

    fn taps(&self) -> TapRequest {
        TapRequest {
            residual: true,
            ..TapRequest::NONE
        }
        .only_layers(&self.weights.config.target_layer_ids)
    }

    fn observe(&mut self, id: RequestId, positions: &[u32], rows: &[usize], taps: &Taps) {
        if rows.is_empty() {
            return;
        }
        let c = &self.weights.config;
        let h = c.hidden_size;
        let fc_in = c.fc_in();
        let mut feats = vec![0.0f32; rows.len() * fc_in];
        for (j, &l) in c.target_layer_ids.iter().enumerate() {
            let Some(res) = taps.f32(&format!("residual.{l}")) else {
                self.last_error = Some(format!(
                    "dspark draft: the backend did not capture residual.{l}"
                ));
                return;
            };
            for (i, &r) in rows.iter().enumerate() {
                let Some(src) = res.get(r * h..(r + 1) * h) else {
                    self.last_error = Some(format!("dspark draft: residual.{l} has no row {r}"));
                    return;
                };
                feats[i * fc_in + j * h..i * fc_in + (j + 1) * h].copy_from_slice(src);
            }
        }
        if let Err(e) = self.add_context(id, positions, &feats) {
            self.last_error = Some(format!("dspark draft: {e}"));
        }
    }

    fn forget(&mut self, id: RequestId) {
        self.ctx.remove(&id);
    }
}
