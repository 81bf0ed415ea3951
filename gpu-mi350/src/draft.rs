//! [`GpuDraft`]: the DSpark draft on the device (MODEL.md 6, with the
//! choices written down in `m3_core::sched::dspark_drafter`), the
//! [`DraftForward`] a [`crate::GpuRunner`] hands out.
//!
//! What lives where: the draft's own weights (fc, its decoder layers, final
//! norm, the Markov factors as f32) and every request's context K/V are
//! device buffers of this object; the embedding and the LM head are the
//! target's own (`Arc`s of the runner's [`crate::model::DevModel`], nothing
//! copied). The launches are the standard path's ([`standard::pointwise`],
//! the tensor-core linears, flash-decoding attention), on a stream of the
//! draft's own; every call ends by reading its result back, so the draft and
//! the target's steps never overlap.
//!
//! A proposal of `n` tokens is one forward of `n` query rows plus one Markov
//! bias launch per drafted token (the bias of token `i` needs token
//! `i - 1`, sampled on the host), and reads back `n` logits rows and `n`
//! bias rows. Context rows (the target's residual taps, read back by the
//! runner's step) come in once per committed row: fc, then per draft layer
//! its K and V, written into the request's context buffers.
//!
//! Attention reuses the standard path's kernel over a request's context
//! buffer seen as a single cache page: every query row gets the last
//! written slot as its visible limit (non-causal over `[context | block]`,
//! as the draft wants) while RoPE takes the real positions.
//!
//! The host draft (`OpsDraft` over the CPU reference) and this one sum in
//! different orders, so their logits agree to rounding and their proposals
//! may differ at near ties; verification makes the committed tokens the
//! target's either way.

use std::collections::BTreeMap;
use std::sync::Arc;

use m3_core::backend::BackendError;
use m3_core::config::ModelConfig;
use m3_core::dspark::{DsparkConfig, DsparkWeights};
use m3_core::formats::bf16;
use m3_core::sched::draft_forward::DraftForward;
use m3_core::sched::RequestId;
use m3_core::weights::LinearWeight;

use crate::error::{GpuError, Result};
use crate::model::{DevBuf, DevLinear, DevMlp};
use crate::runner::be_err;
use crate::runtime::api::{Func, Gpu};
use crate::standard::attn::{self, AttnArgs, KvKind};
use crate::standard::linear::{linears, prepare_x, xh_stride, LinOut};
use crate::standard::pointwise::{self as pw, CwSpec};
use crate::standard::{Kernels, Launcher, PathOptions, STANDARD};

/// Context rows added per launch sequence (longer prompts loop).
const CTX_ROWS: usize = 256;
/// Slots a request's context buffers start with (they double as needed).
const CTX_START: usize = 64;
/// Attention chunks per (row, KV head): past `CHUNKS` score tiles a chunk
/// spans several tiles (bounds the partials' scratch).
const CHUNKS: usize = 64;
/// Threads of `m3s_markov_bias`.
const MARKOV_BLOCK: u32 = 256;

/// One draft decoder layer on the device.
struct DraftLayer {
    input_norm: DevBuf,
    post_norm: DevBuf,
    q: DevLinear,
    k: DevLinear,
    v: DevLinear,
    o: DevLinear,
    q_norm: DevBuf,
    k_norm: DevBuf,
    mlp: DevMlp,
}

/// One request's context: positions of the cached rows (ascending; slot
/// `i` holds `positions[i]`) and per draft layer `[cap, kv_heads *
/// head_dim]` bf16 K and V.
struct DevCtx {
    positions: Vec<u32>,
    k: Vec<DevBuf>,
    v: Vec<DevBuf>,
    cap: usize,
}

/// Work buffers, sized for [`CTX_ROWS`] rows.
struct Bufs {
    /// Residual `[R, H]` f32.
    x: DevBuf,
    /// Normed rows, `[R, H]` bf16.
    hn: DevBuf,
    /// Context features `[R, fc_in]` bf16.
    feats: DevBuf,
    q0: DevBuf,
    q: DevBuf,
    k0: DevBuf,
    k: DevBuf,
    v: DevBuf,
    o: DevBuf,
    h2: DevBuf,
    g: DevBuf,
    u: DevBuf,
    a: DevBuf,
    /// x of the MX linears in the f16 layout (`linear::prepare_x`).
    xh: DevBuf,
    /// Logits of the query rows `[max_draft_tokens, vocab]` f32.
    logits: DevBuf,
    /// One Markov bias row `[vocab]` f32.
    bias: DevBuf,
    /// Per row u32: tokens, RoPE positions, attention limits, cache slots,
    /// sequence index (all 0).
    tokens: DevBuf,
    rope_pos: DevBuf,
    att_pos: DevBuf,
    slots: DevBuf,
    zeros: DevBuf,
    /// Attention partials.
    ascratch: DevBuf,
}

/// The DSpark draft on one device.
pub struct GpuDraft {
    l: Launcher,
    kern: Kernels,
    markov: Func,
    /// Steps of at most this many rows take the small-step tensor-core
    /// variant (0: never; `PathOptions::small_step_max_rows`).
    small_step_max_rows: usize,
    cfg: DsparkConfig,
    embed: Arc<DevBuf>,
    lm_head: Arc<DevLinear>,
    fc: DevLinear,
    layers: Vec<DraftLayer>,
    final_norm: DevBuf,
    /// `E_m` `[vocab, r]` and `W_m` `[r, vocab]`, f32.
    markov_e: DevBuf,
    markov_w: DevBuf,
    b: Bufs,
    ctx: BTreeMap<RequestId, DevCtx>,
}

/// A host weight as f32 values (the Markov factors are kept in f32).
fn host_f32(w: &LinearWeight) -> Vec<f32> {
    match w {
        LinearWeight::Bf16 { data, .. } => data.iter().map(|&b| bf16::to_f32(b)).collect(),
        LinearWeight::F32 { data, .. } => data.clone(),
        LinearWeight::Mx(t) => t.dequantize(),
        LinearWeight::Nvfp4(t) => t.dequantize(),
    }
}

fn bad(why: String) -> GpuError {
    GpuError::input("dspark draft", why)
}

impl GpuDraft {
    /// Upload draft `w` for a target of `target` config whose embedding
    /// and LM head are `embed` / `lm_head` (already on `gpu`).
    pub(crate) fn new(
        gpu: &dyn Gpu,
        opts: &PathOptions,
        target: &ModelConfig,
        embed: Arc<DevBuf>,
        lm_head: Arc<DevLinear>,
        w: &DsparkWeights,
    ) -> Result<Self> {
        let c = &w.config;
        c.validate(Some(target)).map_err(|e| bad(e.to_string()))?;
        let (h, vocab, r) = (c.hidden_size, c.vocab_size, c.markov_rank);
        if w.markov_w.rows() != r || w.markov_w.cols() != vocab {
            return Err(bad(format!(
                "markov W_m is {}x{}, expected {r}x{vocab}",
                w.markov_w.rows(),
                w.markov_w.cols()
            )));
        }
        if w.markov_e.rows() != vocab || w.markov_e.cols() != r {
            return Err(bad(format!(
                "markov E_m is {}x{}, expected {vocab}x{r}",
                w.markov_e.rows(),
                w.markov_e.cols()
            )));
        }
        if lm_head.rows != vocab || lm_head.cols != h {
            return Err(bad(format!(
                "the target's LM head is {}x{}, the draft wants {vocab}x{h}",
                lm_head.rows, lm_head.cols
            )));
        }
        if w.layers.len() != c.n_layers {
            return Err(bad(format!(
                "{} layers, the config says {}",
                w.layers.len(),
                c.n_layers
            )));
        }
        let ctx = gpu.device().clone();
        let l = Launcher::new(&ctx, false)?;
        let kern = Kernels::load(gpu, opts)?;
        let markov = gpu.kernel(&STANDARD, "m3s_markov_bias")?;
        let up = |name: &str, x: &LinearWeight| DevLinear::upload(&ctx, name, &[x]);
        let vec = |x: &[f32], len: usize, name: &str| -> Result<DevBuf> {
            if x.len() != len {
                return Err(bad(format!(
                    "{name} has {} values, expected {len}",
                    x.len()
                )));
            }
            DevBuf::from_slice(&ctx, x)
        };
        let (nh, nkv, d) = (c.num_attention_heads, c.num_key_value_heads, c.head_dim);
        let mut layers = Vec::with_capacity(c.n_layers);
        let mut wmax = 1;
        for (i, lw) in w.layers.iter().enumerate() {
            let n = |s: &str| format!("dspark layer {i} {s}");
            wmax = wmax.max(lw.mlp.gate.rows());
            layers.push(DraftLayer {
                input_norm: vec(&lw.input_norm, h, &n("input norm"))?,
                post_norm: vec(&lw.post_attn_norm, h, &n("post-attention norm"))?,
                q: up(&n("q_proj"), &lw.attn.q)?,
                k: up(&n("k_proj"), &lw.attn.k)?,
                v: up(&n("v_proj"), &lw.attn.v)?,
                o: up(&n("o_proj"), &lw.attn.o)?,
                q_norm: vec(&lw.attn.q_norm, d, &n("q norm"))?,
                k_norm: vec(&lw.attn.k_norm, d, &n("k norm"))?,
                mlp: DevMlp {
                    gate: up(&n("gate_proj"), &lw.mlp.gate)?,
                    up: up(&n("up_proj"), &lw.mlp.up)?,
                    down: up(&n("down_proj"), &lw.mlp.down)?,
                },
            });
        }
        let rr = CTX_ROWS;
        let qn = c.max_draft_tokens.max(1);
        let z = |bytes: usize| DevBuf::zeroed(&ctx, bytes.max(4));
        let hg = nh / nkv.max(1);
        let b = Bufs {
            x: z(rr * h * 4)?,
            hn: z(rr * h * 2)?,
            feats: z(rr * c.fc_in() * 2)?,
            q0: z(rr * nh * d * 2)?,
            q: z(rr * nh * d * 2)?,
            k0: z(rr * nkv * d * 2)?,
            k: z(rr * nkv * d * 2)?,
            v: z(rr * nkv * d * 2)?,
            o: z(rr * nh * d * 2)?,
            h2: z(rr * h * 2)?,
            g: z(rr * wmax * 2)?,
            u: z(rr * wmax * 2)?,
            a: z(rr * wmax * 2)?,
            xh: z(rr * xh_stride(h.max(nh * d).max(wmax).max(c.fc_in())))?,
            logits: z(qn * vocab * 4)?,
            bias: z(vocab * 4)?,
            tokens: z(rr * 4)?,
            rope_pos: z(rr * 4)?,
            att_pos: z(rr * 4)?,
            slots: z(rr * 4)?,
            zeros: z(rr * 4)?,
            ascratch: z(attn::attn_scratch_bytes(qn, nkv, CHUNKS, hg, d))?,
        };
        Ok(GpuDraft {
            kern,
            markov,
            small_step_max_rows: if opts.small_step_variant {
                opts.small_step_max_rows
            } else {
                0
            },
            cfg: c.clone(),
            embed,
            lm_head,
            fc: up("dspark fc", &w.fc)?,
            layers,
            final_norm: vec(&w.final_norm, h, "dspark final norm")?,
            markov_e: DevBuf::from_slice(&ctx, &host_f32(&w.markov_e))?,
            markov_w: DevBuf::from_slice(&ctx, &host_f32(&w.markov_w))?,
            b,
            ctx: BTreeMap::new(),
            l,
        })
    }

    /// Device bytes of the draft's own weights and buffers (the shared
    /// embedding and LM head not counted), context buffers included.
    pub fn device_bytes(&self) -> usize {
        let lin = |w: &DevLinear| w.bytes();
        let mut n = lin(&self.fc) + self.final_norm.bytes();
        n += self.markov_e.bytes() + self.markov_w.bytes();
        for lw in &self.layers {
            n += lin(&lw.q) + lin(&lw.k) + lin(&lw.v) + lin(&lw.o);
            n += lin(&lw.mlp.gate) + lin(&lw.mlp.up) + lin(&lw.mlp.down);
            n += lw.input_norm.bytes() + lw.post_norm.bytes();
            n += lw.q_norm.bytes() + lw.k_norm.bytes();
        }
        let b = &self.b;
        for x in [
            &b.x,
            &b.hn,
            &b.feats,
            &b.q0,
            &b.q,
            &b.k0,
            &b.k,
            &b.v,
            &b.o,
            &b.h2,
            &b.g,
            &b.u,
            &b.a,
            &b.logits,
            &b.bias,
            &b.tokens,
            &b.rope_pos,
            &b.att_pos,
            &b.slots,
            &b.zeros,
            &b.ascratch,
        ] {
            n += x.bytes();
        }
        for c in self.ctx.values() {
            n += c.k.iter().chain(&c.v).map(DevBuf::bytes).sum::<usize>();
        }
        n
    }

    fn width(&self) -> usize {
        self.cfg.num_key_value_heads * self.cfg.head_dim
    }

    /// Tensor-core linears of `m` rows sharing input `x`.
    fn lin(&self, mats: &[(&DevLinear, LinOut)], x: u64, m: usize) -> Result<()> {
        let v = usize::from(m <= self.small_step_max_rows && self.kern.lin.mma.len() > 1);
        let x = prepare_x(
            &self.l,
            &self.kern.lin.x_f16,
            mats,
            x.into(),
            m,
            &self.b.xh,
            None,
        )?;
        linears(&self.l, &self.kern.lin, v, mats, x, m, None, CTX_ROWS)
    }

    fn rmsnorm(&self, x: u64, w: &DevBuf, out: u64, rows: usize) -> Result<()> {
        let c = &self.cfg;
        pw::rmsnorm(
            &self.l,
            &pw::RmsNormFuncs {
                plain: &self.kern.rmsnorm,
                mix: None,
            },
            x,
            0,
            w.ptr(),
            c.rms_norm_eps,
            c.hidden_size,
            out,
            0,
            0,
            rows,
            None,
        )
    }

    /// Grow `id`'s context buffers (created if absent) to `slots` rows,
    /// keeping what they hold.
    fn reserve(&mut self, id: RequestId, slots: usize) -> Result<()> {
        let width = self.width();
        let layers = self.cfg.n_layers;
        let ctx = self.l.device().clone();
        let alloc = |cap: usize| -> Result<Vec<DevBuf>> {
            (0..layers)
                .map(|_| DevBuf::zeroed(&ctx, cap * width * 2))
                .collect()
        };
        match self.ctx.get_mut(&id) {
            None => {
                let cap = slots.max(CTX_START).next_power_of_two();
                self.ctx.insert(
                    id,
                    DevCtx {
                        positions: Vec::new(),
                        k: alloc(cap)?,
                        v: alloc(cap)?,
                        cap,
                    },
                );
            }
            Some(st) if slots > st.cap => {
                let cap = slots.next_power_of_two();
                let (k, v) = (alloc(cap)?, alloc(cap)?);
                let keep = st.cap * width * 2;
                for (new, old) in k.iter().zip(&st.k).chain(v.iter().zip(&st.v)) {
                    self.l.copy(new.ptr(), old.ptr(), keep)?;
                }
                // the old buffers are freed below: finish the copies first
                self.l.sync()?;
                st.k = k;
                st.v = v;
                st.cap = cap;
            }
            Some(_) => {}
        }
        Ok(())
    }

    /// `rows` u32 values into `buf`.
    fn put(&self, buf: &DevBuf, vals: &[u32]) -> Result<()> {
        buf.write_async(self.l.stream(), 0, vals)
    }

    /// K and V of draft layer `li` for `t` rows of `b.hn` at the RoPE
    /// positions in `b.rope_pos`, written to `slots` of `id`'s buffers.
    fn kv_rows(&self, li: usize, t: usize, kc: u64, vc: u64) -> Result<()> {
        let c = &self.cfg;
        let (b, lw) = (&self.b, &self.layers[li]);
        let (nkv, d) = (c.num_key_value_heads, c.head_dim);
        self.lin(
            &[
                (&lw.k, LinOut::Bf16(b.k0.ptr())),
                (&lw.v, LinOut::Bf16(b.v.ptr())),
            ],
            b.hn.ptr(),
            t,
        )?;
        pw::headnorm_rope(
            &self.l,
            &self.kern.headnorm_rope,
            &[(b.k0.ptr(), nkv, d, lw.k_norm.ptr(), c.rotary_dim, b.k.ptr())],
            None,
            t,
            b.rope_pos.ptr(),
            c.rope_theta,
            c.rms_norm_eps,
        )?;
        self.cache_kv(t, kc, vc)
    }

    /// Write `t` rows of `b.k`, `b.v` to `slots` of the K / V buffers.
    fn cache_kv(&self, t: usize, kc: u64, vc: u64) -> Result<()> {
        let w = self.width();
        let b = &self.b;
        pw::cache_writes(
            &self.l,
            &self.kern.cache_write,
            &[
                CwSpec {
                    x: b.k.ptr(),
                    width: w,
                    scale: 1.0,
                    cache: kc,
                    scales: 0,
                },
                CwSpec {
                    x: b.v.ptr(),
                    width: w,
                    scale: 1.0,
                    cache: vc,
                    scales: 0,
                },
            ],
            t,
            b.slots.ptr(),
            KvKind::Bf16,
        )
    }

    fn try_add_context(&mut self, id: RequestId, positions: &[u32], feats: &[f32]) -> Result<()> {
        let c = self.cfg.clone();
        let (h, fc_in) = (c.hidden_size, c.fc_in());
        if feats.len() != positions.len() * fc_in {
            return Err(bad(format!(
                "{} feature values for {} rows of {fc_in}",
                feats.len(),
                positions.len()
            )));
        }
        // Slots as the host draft assigns them: an existing position is
        // rewritten in place, a new last one appended, a hole skipped.
        let mut known = self
            .ctx
            .get(&id)
            .map(|s| s.positions.clone())
            .unwrap_or_default();
        let mut rows: Vec<(usize, u32)> = Vec::new();
        for (i, &p) in positions.iter().enumerate() {
            match known.binary_search(&p) {
                Ok(s) => rows.push((i, s as u32)),
                Err(s) if s == known.len() => {
                    known.push(p);
                    rows.push((i, s as u32));
                }
                Err(_) => {}
            }
        }
        self.reserve(id, known.len())?;
        for chunk in rows.chunks(CTX_ROWS) {
            let t = chunk.len();
            let mut f16 = Vec::with_capacity(t * fc_in);
            for &(i, _) in chunk {
                f16.extend(
                    feats[i * fc_in..(i + 1) * fc_in]
                        .iter()
                        .map(|&x| bf16::from_f32(x)),
                );
            }
            let b = &self.b;
            b.feats.write_async(self.l.stream(), 0, &f16)?;
            let pos: Vec<u32> = chunk.iter().map(|&(i, _)| positions[i]).collect();
            let slots: Vec<u32> = chunk.iter().map(|&(_, s)| s).collect();
            self.put(&b.rope_pos, &pos)?;
            self.put(&b.slots, &slots)?;
            // c_j = bf16(fc(feats)), as f32 rows for the norms
            self.lin(&[(&self.fc, LinOut::Bf16(b.h2.ptr()))], b.feats.ptr(), t)?;
            self.l.zero(b.x.ptr(), t * h * 4)?;
            pw::add_bf16(&self.l, &self.kern.add_bf16, b.x.ptr(), b.h2.ptr(), t * h)?;
            let st = self
                .ctx
                .get(&id)
                .ok_or_else(|| bad(format!("request {id} has no context buffers")))?;
            for li in 0..c.n_layers {
                self.rmsnorm(b.x.ptr(), &self.layers[li].input_norm, b.hn.ptr(), t)?;
                self.kv_rows(li, t, st.k[li].ptr(), st.v[li].ptr())?;
            }
            // the host arrays above are staged before return; finish the
            // launches before the next chunk rewrites the inputs
            self.l.sync()?;
        }
        if let Some(st) = self.ctx.get_mut(&id) {
            st.positions = known;
        }
        Ok(())
    }

    fn try_draft_logits(
        &mut self,
        id: RequestId,
        last: u32,
        last_pos: u32,
        n: usize,
    ) -> Result<Vec<f32>> {
        let c = self.cfg.clone();
        let (h, vocab) = (c.hidden_size, c.vocab_size);
        let (nh, nkv, d) = (c.num_attention_heads, c.num_key_value_heads, c.head_dim);
        if n == 0 || n > c.max_draft_tokens {
            return Err(bad(format!(
                "{n} query rows (1..={} allowed)",
                c.max_draft_tokens
            )));
        }
        if last as usize >= vocab || c.mask_token_id as usize >= vocab {
            return Err(bad(format!(
                "token {last} / mask token {} outside the vocabulary of {vocab}",
                c.mask_token_id
            )));
        }
        let nctx = self
            .ctx
            .get(&id)
            .map_or(0, |st| st.positions.partition_point(|&p| p < last_pos));
        self.reserve(id, nctx + n)?;
        let st = self
            .ctx
            .get_mut(&id)
            .ok_or_else(|| bad(format!("request {id} has no context buffers")))?;
        st.positions.truncate(nctx);
        let st = &self.ctx[&id];
        let b = &self.b;
        let mut toks = vec![c.mask_token_id; n];
        toks[0] = last;
        self.put(&b.tokens, &toks)?;
        self.put(
            &b.rope_pos,
            &(0..n as u32).map(|i| last_pos + i).collect::<Vec<_>>(),
        )?;
        self.put(
            &b.slots,
            &(0..n as u32).map(|i| nctx as u32 + i).collect::<Vec<_>>(),
        )?;
        // every query row sees slots 0 ..= nctx + n - 1: non-causal
        self.put(&b.att_pos, &vec![(nctx + n - 1) as u32; n])?;
        pw::embed(
            &self.l,
            &self.kern.embed,
            b.tokens.ptr(),
            self.embed.ptr(),
            h,
            b.x.ptr(),
            n,
        )?;
        for (li, lw) in self.layers.iter().enumerate() {
            self.rmsnorm(b.x.ptr(), &lw.input_norm, b.hn.ptr(), n)?;
            self.lin(
                &[
                    (&lw.q, LinOut::Bf16(b.q0.ptr())),
                    (&lw.k, LinOut::Bf16(b.k0.ptr())),
                    (&lw.v, LinOut::Bf16(b.v.ptr())),
                ],
                b.hn.ptr(),
                n,
            )?;
            pw::headnorm_rope(
                &self.l,
                &self.kern.headnorm_rope,
                &[
                    (b.q0.ptr(), nh, d, lw.q_norm.ptr(), c.rotary_dim, b.q.ptr()),
                    (b.k0.ptr(), nkv, d, lw.k_norm.ptr(), c.rotary_dim, b.k.ptr()),
                ],
                None,
                n,
                b.rope_pos.ptr(),
                c.rope_theta,
                c.rms_norm_eps,
            )?;
            self.cache_kv(n, st.k[li].ptr(), st.v[li].ptr())?;
            attn::attention(
                &self.l,
                &self.kern.attn,
                &AttnArgs {
                    q: b.q.ptr(),
                    nh,
                    nkv,
                    d,
                    kc: st.k[li].ptr(),
                    vc: st.v[li].ptr(),
                    ksc: 0,
                    vsc: 0,
                    ks: 1.0,
                    vs: 1.0,
                    cache: KvKind::Bf16,
                    pos: b.att_pos.ptr(),
                    row_seq: b.zeros.ptr(),
                    bt: b.zeros.ptr(),
                    bt_off: b.zeros.ptr(),
                    page: st.cap,
                    sel: 0,
                    topk: 0,
                    block: 0,
                    t: n,
                    out: b.o.ptr(),
                    xh: 0,
                    scratch: b.ascratch.ptr(),
                    max_chunks: attn::attn_max_chunks(nctx + n, 0).min(CHUNKS),
                    split: 1,
                },
            )?;
            self.lin(&[(&lw.o, LinOut::AddF32(b.x.ptr()))], b.o.ptr(), n)?;
            self.rmsnorm(b.x.ptr(), &lw.post_norm, b.h2.ptr(), n)?;
            let m = &lw.mlp;
            self.lin(
                &[
                    (&m.gate, LinOut::Bf16(b.g.ptr())),
                    (&m.up, LinOut::Bf16(b.u.ptr())),
                ],
                b.h2.ptr(),
                n,
            )?;
            pw::swiglu(
                &self.l,
                &self.kern.swiglu,
                b.g.ptr(),
                b.u.ptr(),
                c.swiglu_alpha,
                c.swiglu_limit,
                b.a.ptr(),
                n * m.gate.rows,
                0,
                m.gate.rows,
                0,
            )?;
            self.lin(&[(&m.down, LinOut::AddF32(b.x.ptr()))], b.a.ptr(), n)?;
        }
        self.rmsnorm(b.x.ptr(), &self.final_norm, b.hn.ptr(), n)?;
        self.lin(
            &[(&*self.lm_head, LinOut::F32(b.logits.ptr()))],
            b.hn.ptr(),
            n,
        )?;
        let mut out = vec![0.0f32; n * vocab];
        b.logits.read(self.l.stream(), 0, &mut out)?;
        Ok(out)
    }

    fn try_markov_bias(&mut self, prev: u32) -> Result<Vec<f32>> {
        let c = &self.cfg;
        let vocab = c.vocab_size;
        if prev as usize >= vocab {
            return Err(bad(format!(
                "token {prev} outside the vocabulary of {vocab}"
            )));
        }
        self.l.launch(
            "markov_bias",
            &self.markov,
            ((vocab as u32).div_ceil(MARKOV_BLOCK), 1, 1),
            MARKOV_BLOCK,
            0,
            &[
                crate::standard::launch::Arg::U64(self.markov_e.ptr()),
                crate::standard::launch::Arg::U64(self.markov_w.ptr()),
                crate::standard::launch::Arg::U32(prev),
                crate::standard::launch::Arg::U32(c.markov_rank as u32),
                crate::standard::launch::Arg::U32(vocab as u32),
                crate::standard::launch::Arg::U64(self.b.bias.ptr()),
            ],
        )?;
        let mut out = vec![0.0f32; vocab];
        self.b.bias.read(self.l.stream(), 0, &mut out)?;
        Ok(out)
    }
}

impl DraftForward for GpuDraft {
    fn add_context(
        &mut self,
        id: RequestId,
        positions: &[u32],
        feats: &[f32],
    ) -> std::result::Result<(), BackendError> {
        self.try_add_context(id, positions, feats)
            .map_err(|e| be_err("dspark draft context", e))
    }

    fn draft_logits(
        &mut self,
        id: RequestId,
        last: u32,
        last_pos: u32,
        n: usize,
    ) -> std::result::Result<Vec<f32>, BackendError> {
        self.try_draft_logits(id, last, last_pos, n)
            .map_err(|e| be_err("dspark draft forward", e))
    }

    fn markov_bias(&mut self, prev: u32) -> std::result::Result<Vec<f32>, BackendError> {
        self.try_markov_bias(prev)
            .map_err(|e| be_err("dspark markov bias", e))
    }

    fn forget(&mut self, id: RequestId) {
        self.ctx.remove(&id);
    }

    fn context_rows(&self, id: RequestId) -> usize {
        self.ctx.get(&id).map_or(0, |c| c.positions.len())
    }
}
