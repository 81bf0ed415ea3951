//! The EAGLE3 draft head (ARCHITECTURE.md "EAGLE3 draft") as a
//! [`Drafter`], its forward composed op by op from [`Backend::run_op`] over
//! host weights and a host KV cache (like DSpark's [`super::draft_forward::OpsDraft`]),
//! so it runs on any backend.
//!
//! ## What this project computes
//!
//! Let `x_j` be the token at position `j` and `g_j = bf16(fc(concat(
//! residual.{low}[j], residual.{mid}[j], residual.{high}[j])))` the fused
//! target state of position `j` (target residuals *after* each of
//! `target_layer_ids`, captured with [`Taps`]).
//!
//! - **Draft rows.** The draft row of position `j` pairs `g_j` with the
//!   *next* token: input `(embed(x_{j+1}), h = g_j)` at RoPE position `j`;
//!   it predicts `x_{j+2}`. (The reference implementation's shift: the
//!   hidden state of a position and the token sampled from it.)
//! - **One row** (`midlayer`, Llama-style): `a = concat(bf16(rms(e;
//!   input_layernorm)), bf16(rms(h; hidden_norm)))` (`[2H]`, Llama norms:
//!   times `w`); `q, k, v = a W^T` (bf16); NeoX RoPE over the whole head
//!   (no q/k norms), bf16; causal attention over the draft's KV cache
//!   (MODEL.md 3.7 softmax); `r = h + bf16(o W_o^T)` (the residual is the
//!   hidden input, not the embedding); `m = bf16(rms(r;
//!   post_attention_layernorm))`; SiLU-gated MLP `bf16(bf16((g *
//!   sigmoid(g)) * u) W_down^T)` with `g, u` the bf16 gate / up outputs
//!   (sigmoid in f64 through [`crate::sample::exp_det`], so no platform
//!   libm enters); `out = r + mlp`. Logits over the draft vocabulary:
//!   `bf16(rms(out; norm)) lm_head^T` in f32.
//! - **Committed context.** [`Drafter::observe`] stores `g_j` for every
//!   committed position whose target forward ran. At the next proposal,
//!   when `x_{j+1}` is known (it is in the context), the row of `j` gets its
//!   K/V (`k = rope(bf16(a W_k), j)`, `v = bf16(a W_v)`), written once into
//!   the request's bf16 cache; only its K/V is needed, never its output.
//! - **Proposal of N tokens.** With `L` the position of the last committed
//!   token, step 0 is the row of `P = L - 1`: `(embed(x_L), g_P)` at
//!   position `P`; step `i > 0` is `(embed(d_{i-1}), out_{i-1})` at position
//!   `P + i`, `out_{i-1}` the previous step's output *before* the final
//!   norm. Each step attends causally to the committed rows and the steps
//!   before it. Step 0's K/V is committed context (both its inputs are
//!   committed) and is kept; the K/V of steps `i > 0` (rows of draft tokens)
//!   live in slots past the committed ones and are overwritten by the next
//!   proposal, so rejected drafts leave nothing behind.
//! - **Tokens.** Step `i`'s draft-vocabulary distribution is
//!   [`sampling_probs`] of its logits with the request's parameters (greedy:
//!   one-hot on the argmax, lowest draft id on ties); the draft token is
//!   drawn with `uniform(seed ^ salt, position)` and mapped to the target id
//!   `d + d2t[d]`. The reported probabilities are over *target* ids, zero
//!   outside the draft vocabulary, so the rejection and block verifiers stay
//!   lossless.
//!
//! Positions without `g` (skipped by a prefix-cache hit) have no draft row;
//! a proposal whose `g_P` is missing proposes nothing. Backend errors give an
//! empty proposal and are kept in [`Eagle3Drafter::last_error`].

use alloc::collections::btree_map::Entry;
use alloc::collections::BTreeMap;
use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec;
use alloc::vec::Vec;

use super::draft_forward::{linear, tap_features, DraftTarget};
use super::request::{RequestId, SamplingParams};
use super::runner::{Drafter, Proposal};
use super::spec_probs::sampling_probs;
use crate::backend::{Backend, BackendError, Op, StepBatch, StepSeq, TapRequest, Taps};
use crate::eagle3::{Eagle3Config, Eagle3Weights};
use crate::formats::bf16;
use crate::kv::{CacheDtype, CacheTensor};
use crate::sample::{exp_det, greedy, uniform};
use crate::spec_decode::sample_index;
use crate::weights::LinearWeight;

/// Salt of the draft's sampling key, so draft draws are independent of the
/// target's (which use `uniform(seed, position)`).
const DRAFT_SALT: u64 = 0x6561_676c_6533_5f64; // "eagle3_d"

/// One request's draft state.
struct ReqState {
    /// `g_j` (`[H]`, bf16 values) of observed positions whose row has no
    /// K/V yet (its next token was not known when observed).
    pending: BTreeMap<u32, Vec<f32>>,
    /// Positions of the committed rows, ascending; slot `i` holds
    /// `positions[i]`.
    positions: Vec<u32>,
    /// `[cap, kv_heads * head_dim]` bf16.
    k: CacheTensor,
    v: CacheTensor,
    cap: usize,
}

impl ReqState {
    fn new(width: usize) -> Result<Self, BackendError> {
        let cap = 64;
        let t = || {
            CacheTensor::new(CacheDtype::Bf16, cap, width, 1.0).map_err(|e| BackendError::Shape {
                op: "eagle3 draft cache",
                what: e.to_string(),
            })
        };
        Ok(ReqState {
            pending: BTreeMap::new(),
            positions: Vec::new(),
            k: t()?,
            v: t()?,
            cap,
        })
    }

    /// Grow both cache tensors to hold at least `slots` rows.
    fn reserve(&mut self, slots: usize) {
        if slots <= self.cap {
            return;
        }
        let cap = slots.next_power_of_two();
        for t in [&mut self.k, &mut self.v] {
            t.resize_slots(cap);
        }
        self.cap = cap;
    }
}

/// The EAGLE3 draft as a [`Drafter`] (module docs).
pub struct Eagle3Drafter<'a> {
    backend: &'a dyn Backend,
    /// The target's embedding (shared).
    embed: &'a LinearWeight,
    weights: &'a Eagle3Weights,
    state: BTreeMap<RequestId, ReqState>,
    /// The last backend error met while drafting (drafting then skipped).
    pub last_error: Option<String>,
    /// Proposals made (for reports).
    pub proposals: u64,
}

impl<'a> Eagle3Drafter<'a> {
    /// A drafter running `weights` op by op on `backend`, sharing
    /// `target`'s embedding. Fails if the draft does not fit the target.
    pub fn new(
        backend: &'a dyn Backend,
        target: DraftTarget<'a>,
        weights: &'a Eagle3Weights,
    ) -> Result<Self, BackendError> {
        let c = &weights.config;
        c.validate(Some(target.config))
            .map_err(|e| BackendError::Other(e.to_string()))?;
        if target.embed.cols() != c.hidden_size || target.embed.rows() != c.vocab_size {
            return Err(BackendError::Shape {
                op: "eagle3",
                what: format!(
                    "the target embedding is {}x{}, the draft needs {}x{}",
                    target.embed.rows(),
                    target.embed.cols(),
                    c.vocab_size,
                    c.hidden_size
                ),
            });
        }
        if weights.draft_to_target.len() != c.draft_vocab_size {
            return Err(BackendError::Shape {
                op: "eagle3",
                what: format!(
                    "d2t maps {} draft ids, draft_vocab_size is {}",
                    weights.draft_to_target.len(),
                    c.draft_vocab_size
                ),
            });
        }
        Ok(Eagle3Drafter {
            backend,
            embed: target.embed,
            weights,
            state: BTreeMap::new(),
            last_error: None,
            proposals: 0,
        })
    }

    fn config(&self) -> &Eagle3Config {
        &self.weights.config
    }

    /// Committed draft rows (with K/V) currently kept for `id`.
    pub fn context_rows(&self, id: RequestId) -> usize {
        self.state.get(&id).map_or(0, |s| s.positions.len())
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

    /// RMSNorm over rows of width H (weights in Gemma form, `w - 1`).
    fn norm(&self, x: &[f32], w: &[f32], round: bool) -> Result<Vec<f32>, BackendError> {
        let mut o = vec![0.0f32; x.len()];
        self.backend.run_op(Op::RmsNorm {
            x,
            width: self.config().hidden_size,
            weight: w,
            eps: self.config().rms_norm_eps,
            round_out: round,
            out: &mut o,
        })?;
        Ok(o)
    }

    /// The attention input `[n, 2H]` of rows with tokens `toks` and hidden
    /// inputs `hid` (`[n, H]`).
    fn attn_input(&self, toks: &[u32], hid: &[f32]) -> Result<Vec<f32>, BackendError> {
        let h = self.config().hidden_size;
        let n = toks.len();
        let mut e = vec![0.0f32; n * h];
        self.backend.run_op(Op::Embed {
            table: self.embed,
            tokens: toks,
            out: &mut e,
        })?;
        let en = self.norm(&e, &self.weights.input_norm, true)?;
        let hn = self.norm(hid, &self.weights.hidden_norm, true)?;
        let mut a = vec![0.0f32; n * 2 * h];
        for r in 0..n {
            a[r * 2 * h..r * 2 * h + h].copy_from_slice(&en[r * h..(r + 1) * h]);
            a[r * 2 * h + h..(r + 1) * 2 * h].copy_from_slice(&hn[r * h..(r + 1) * h]);
        }
        Ok(a)
    }

    /// `x` rotated at `positions` (NeoX over the whole head), bf16.
    fn rope(&self, x: &mut [f32], heads: usize, positions: &[u32]) -> Result<(), BackendError> {
        let c = self.config();
        self.backend.run_op(Op::Rope {
            x,
            heads,
            head_dim: c.head_dim(),
            rotary_dim: c.head_dim(),
            theta: c.rope_theta,
            positions,
            round_out: true,
        })
    }

    /// K (rotated) and V rows of attention inputs `a` at `positions`.
    fn kv(&self, a: &[f32], positions: &[u32]) -> Result<(Vec<f32>, Vec<f32>), BackendError> {
        let n = positions.len();
        let mut k = self.lin(a, n, &self.weights.k, true)?;
        self.rope(&mut k, self.config().num_key_value_heads, positions)?;
        let v = self.lin(a, n, &self.weights.v, true)?;
        Ok((k, v))
    }

    /// One draft step: the row `(tok, hid)` at `pos`, written to `slot` of
    /// `st`'s cache and attending to slots `0 ..= slot`. Returns the row's
    /// output before the final norm (`[H]`) and its draft-vocabulary
    /// logits (f32).
    fn step_row(
        &self,
        id: RequestId,
        st: &mut ReqState,
        tok: u32,
        hid: &[f32],
        pos: u32,
        slot: usize,
    ) -> Result<(Vec<f32>, Vec<f32>), BackendError> {
        let c = self.config();
        let (h, nh, nkv, d) = (
            c.hidden_size,
            c.num_attention_heads,
            c.num_key_value_heads,
            c.head_dim(),
        );
        let w = self.weights;
        let a = self.attn_input(&[tok], hid)?;
        let mut q = self.lin(&a, 1, &w.q, true)?;
        self.rope(&mut q, nh, &[pos])?;
        let (k, v) = self.kv(&a, &[pos])?;
        st.reserve(slot + 1);
        let slots = [slot as u32];
        self.backend.run_op(Op::CacheWrite {
            cache: &mut st.k,
            slots: &slots,
            x: &k,
        })?;
        self.backend.run_op(Op::CacheWrite {
            cache: &mut st.v,
            slots: &slots,
            x: &v,
        })?;
        // One page of `cap` slots; the query sits at slot `slot`, so it sees
        // slots `0 ..= slot` (causal).
        let step = StepBatch {
            tokens: vec![tok],
            positions: vec![slot as u32],
            slot_mapping: vec![slot as u32],
            row_seq: vec![0],
            seqs: vec![StepSeq {
                request_id: id,
                block_table: vec![0],
                context_len: slot as u32 + 1,
            }],
            logits_rows: Vec::new(),
            decode_only: false,
        };
        let mut o = vec![0.0f32; nh * d];
        self.backend.run_op(Op::Attention {
            q: &q,
            heads: nh,
            kv_heads: nkv,
            head_dim: d,
            k: &st.k,
            v: &st.v,
            step: &step,
            page_size: st.cap,
            blocks: None,
            out: &mut o,
        })?;
        let ao = self.lin(&o, 1, &w.o, true)?;
        let mut r = hid.to_vec();
        self.backend.run_op(Op::Add {
            acc: &mut r,
            x: &ao,
        })?;
        let m = self.norm(&r, &w.post_attn_norm, true)?;
        let g = self.lin(&m, 1, &w.gate, true)?;
        let u = self.lin(&m, 1, &w.up, true)?;
        let act: Vec<f32> = g.iter().zip(&u).map(|(&g, &u)| silu_mul(g, u)).collect();
        let y = self.lin(&act, 1, &w.down, true)?;
        self.backend.run_op(Op::Add { acc: &mut r, x: &y })?;
        debug_assert_eq!(r.len(), h);
        let rn = self.norm(&r, &w.final_norm, true)?;
        let logits = self.lin(&rn, 1, &w.lm_head, false)?;
        Ok((r, logits))
    }

    /// Give committed rows K/V: every pending `g_j` with `j < p` whose next
    /// token is in `context`, past the last committed row.
    fn commit_pending(
        &self,
        st: &mut ReqState,
        context: &[u32],
        p: u32,
    ) -> Result<(), BackendError> {
        let h = self.config().hidden_size;
        let after = st.positions.last().copied();
        let todo: Vec<u32> = st
            .pending
            .range(..p)
            .map(|(&j, _)| j)
            .filter(|&j| after.is_none_or(|a| j > a) && (j as usize + 1) < context.len())
            .collect();
        if todo.is_empty() {
            return Ok(());
        }
        let toks: Vec<u32> = todo.iter().map(|&j| context[j as usize + 1]).collect();
        let mut hid = Vec::with_capacity(todo.len() * h);
        for j in &todo {
            if let Some(g) = st.pending.get(j) {
                hid.extend_from_slice(g);
            }
        }
        let a = self.attn_input(&toks, &hid)?;
        let (k, v) = self.kv(&a, &todo)?;
        let width = st.k.width;
        let base = st.positions.len();
        st.reserve(base + todo.len());
        let kv_err = |e: crate::kv::KvError| BackendError::Shape {
            op: "eagle3 draft cache",
            what: e.to_string(),
        };
        for (i, &j) in todo.iter().enumerate() {
            st.k.write(base + i, &k[i * width..(i + 1) * width])
                .map_err(kv_err)?;
            st.v.write(base + i, &v[i * width..(i + 1) * width])
                .map_err(kv_err)?;
            st.positions.push(j);
        }
        // Rows at or before the last committed one will never be needed.
        let last = st.positions.last().copied().unwrap_or(0);
        st.pending = st.pending.split_off(&(last + 1));
        Ok(())
    }

    /// Draft up to `k` tokens with their distributions over target ids (see
    /// [`Drafter::propose_sampled`]).
    pub fn try_propose(
        &mut self,
        id: RequestId,
        context: &[u32],
        k: usize,
        params: &SamplingParams,
    ) -> Result<Proposal, BackendError> {
        self.propose_inner(id, context, k, params, None)
    }

    /// [`Self::try_propose`], also returning what each step computed (the
    /// golden draft cases hold these to the independent reference).
    pub fn propose_traced(
        &mut self,
        id: RequestId,
        context: &[u32],
        k: usize,
        params: &SamplingParams,
    ) -> Result<(Proposal, Eagle3Trace), BackendError> {
        let mut trace = Eagle3Trace::default();
        let p = self.propose_inner(id, context, k, params, Some(&mut trace))?;
        Ok((p, trace))
    }

    /// The fused target states `g = bf16(fc(feats))` of `rows` rows, `feats`
    /// `[rows, fc_in]` (the target residuals of `target_layer_ids`,
    /// concatenated): what [`Drafter::observe`] stores per position.
    pub fn fuse(&self, feats: &[f32], rows: usize) -> Result<Vec<f32>, BackendError> {
        let want = rows * self.config().fc_in();
        if feats.len() != want {
            return Err(BackendError::Shape {
                op: "eagle3 fc",
                what: format!(
                    "features hold {} values, {rows} rows of fc_in {} need {want}",
                    feats.len(),
                    self.config().fc_in()
                ),
            });
        }
        self.lin(feats, rows, &self.weights.fc, true)
    }

    fn propose_inner(
        &mut self,
        id: RequestId,
        context: &[u32],
        k: usize,
        params: &SamplingParams,
        mut trace: Option<&mut Eagle3Trace>,
    ) -> Result<Proposal, BackendError> {
        let c = self.config().clone();
        let n = k.min(c.max_draft_tokens);
        if n == 0 || context.len() < 2 {
            return Ok(Proposal::default());
        }
        let last_pos = (context.len() - 1) as u32;
        let last = context[context.len() - 1];
        let p = last_pos - 1;
        let width = c.num_key_value_heads * c.head_dim();
        let mut st = match self.state.remove(&id) {
            Some(st) => st,
            None => ReqState::new(width)?,
        };
        // Rows at or after `p` are not committed context of this proposal
        // (a rollback); pending states past `p` cannot be used yet.
        let keep = st.positions.partition_point(|&q| q < p);
        st.positions.truncate(keep);
        let result = (|| {
            self.commit_pending(&mut st, context, p)?;
            let Some(g) = st.pending.get(&p).cloned() else {
                return Ok(Proposal::default());
            };
            let nctx = st.positions.len();
            let vocab = c.vocab_size;
            let mut tokens = Vec::with_capacity(n);
            let mut probs = vec![0.0f32; n * vocab];
            let (mut tok, mut hid) = (last, g);
            for i in 0..n {
                let (out, logits) =
                    self.step_row(id, &mut st, tok, &hid, p + i as u32, nctx + i)?;
                if i == 0 {
                    // Both inputs of row `p` are committed: keep its K/V.
                    st.positions.push(p);
                    st.pending.remove(&p);
                }
                let pd = sampling_probs(&logits, params);
                let w: Vec<f64> = pd.iter().map(|&x| f64::from(x)).collect();
                let u = uniform(params.seed ^ DRAFT_SALT, last_pos + 1 + i as u32);
                let x = sample_index(&w, u).unwrap_or_else(|| greedy(&logits) as usize);
                let t = self
                    .weights
                    .draft_to_target
                    .get(x)
                    .copied()
                    .ok_or_else(|| BackendError::Shape {
                        op: "eagle3",
                        what: format!("draft id {x} has no target id"),
                    })?;
                for (dj, &pj) in pd.iter().enumerate() {
                    if let Some(&tj) = self.weights.draft_to_target.get(dj) {
                        probs[i * vocab + tj as usize] = pj;
                    }
                }
                if let Some(tr) = trace.as_deref_mut() {
                    tr.draft_ids.push(x as u32);
                    tr.hidden.extend_from_slice(&out);
                    tr.logits.extend_from_slice(&logits);
                }
                tokens.push(t);
                tok = t;
                hid = out;
            }
            Ok(Proposal {
                tokens,
                probs: Some(probs),
            })
        })();
        self.state.insert(id, st);
        if result.as_ref().is_ok_and(|p| !p.tokens.is_empty()) {
            self.proposals += 1;
        }
        result
    }
}

/// What each step of a proposal computed ([`Eagle3Drafter::propose_traced`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Eagle3Trace {
    /// The chosen draft-vocabulary id of each step (before `d2t`).
    pub draft_ids: Vec<u32>,
    /// `[steps, H]`: each step's output before the final norm (the next
    /// step's hidden input).
    pub hidden: Vec<f32>,
    /// `[steps, draft_vocab]`: each step's draft-vocabulary logits (f32).
    pub logits: Vec<f32>,
}

/// SiLU-gated activation of one element: `bf16((g * sigmoid(g)) * u)`,
/// the sigmoid in f64 with the deterministic [`exp_det`], then f32.
pub fn silu_mul(g: f32, u: f32) -> f32 {
    let s = (1.0 / (1.0 + exp_det(-f64::from(g)))) as f32;
    bf16::round((g * s) * u)
}

impl Drafter for Eagle3Drafter<'_> {
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
                self.last_error = Some(format!("eagle3 draft: {e}"));
                Proposal::default()
            }
        }
    }

    fn taps(&self) -> TapRequest {
        TapRequest {
            residual: true,
            ..TapRequest::NONE
        }
        .only_layers(&self.config().target_layer_ids)
    }

    fn observe(&mut self, id: RequestId, positions: &[u32], rows: &[usize], taps: &Taps) {
        if rows.is_empty() {
            return;
        }
        let c = self.config().clone();
        let feats = match tap_features(taps, &c.target_layer_ids, c.target_hidden(), rows) {
            Ok(f) => f,
            Err(e) => {
                self.last_error = Some(format!("eagle3 draft: {e}"));
                return;
            }
        };
        let g = match self.lin(&feats, rows.len(), &self.weights.fc, true) {
            Ok(g) => g,
            Err(e) => {
                self.last_error = Some(format!("eagle3 draft: {e}"));
                return;
            }
        };
        let h = c.hidden_size;
        let width = c.num_key_value_heads * c.head_dim();
        let st = match self.state.entry(id) {
            Entry::Occupied(o) => o.into_mut(),
            Entry::Vacant(v) => match ReqState::new(width) {
                Ok(st) => v.insert(st),
                Err(e) => {
                    self.last_error = Some(format!("eagle3 draft: {e}"));
                    return;
                }
            },
        };
        for (i, &p) in positions.iter().enumerate() {
            if let Some(row) = g.get(i * h..(i + 1) * h) {
                st.pending.insert(p, row.to_vec());
            }
        }
    }

    fn forget(&mut self, id: RequestId) {
        self.state.remove(&id);
    }
}
