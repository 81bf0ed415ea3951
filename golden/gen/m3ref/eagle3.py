"""The EAGLE3 draft head of ARCHITECTURE.md ("EAGLE3 draft"), with numpy.

Written from that section alone (not from the Rust code).  A draft is one
Llama-style decoder layer (`midlayer`) over fused target hidden states:

  g_j   = bf16(fc(bf16(concat(residual.low[j], residual.mid[j], residual.high[j]))))
  row   (token x, hidden h) at RoPE position p:
          a   = concat(bf16(llama_rms(embed(x); input_layernorm)), bf16(llama_rms(h; hidden_norm)))
          q, k, v = bf16(a Wq^T), bf16(a Wk^T), bf16(a Wv^T); q, k NeoX-rotated over the
                whole head, bf16 (no q/k norms)
          o   = bf16(softmax(q k^T / sqrt(d)) v), causal over the draft's own cache
          r   = h + bf16(o Wo^T)                 (the residual is h, not the embedding)
          m   = bf16(llama_rms(r; post_attention_layernorm))
          out = r + bf16(bf16(silu(bf16(m Wg^T)) * bf16(m Wu^T)) Wd^T)
          logits = bf16(llama_rms(out; norm)) lm_head^T   (f32, draft vocabulary)
  Llama RMSNorm multiplies by w (not Gemma's 1 + w).

The draft row of position j pairs g_j with the next token x_{j+1}.  For a
prompt x_0..x_{T-1} with P = T - 2: rows j < P are committed context (only
their K/V matter), step 0 is (x_{T-1}, g_P) at position P, step i > 0 is
(d_{i-1}, out_{i-1}) at position P + i, where d_{i-1} is the previous step's
greedy draft id (argmax, lowest id on ties) mapped to a target id by
`d2t` (target = draft + d2t[draft]).

Precision policy as in model.py: sums in f64 (or f32 for the noise probes,
through the same `Numerics`), rounded to f32 once, to bf16 where the
definition rounds.
"""

import json
import os
from dataclasses import dataclass

import numpy as np

from . import formats as F
from .checkpoint import CheckpointError, read_safetensors
from .model import Numerics, rope_tables, apply_rope

DIR = "eagle3"


@dataclass
class Eagle3Config:
    hidden_size: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    draft_vocab_size: int
    target_hidden_size: int
    rope_theta: float
    eps: float
    layer_ids: list
    max_draft_tokens: int


def parse_config(c):
    def req(name):
        if c.get(name) is None:
            raise CheckpointError(f"{DIR}/config.json: missing required field {name}")
        return c[name]

    H = int(req("hidden_size"))
    nh = int(req("num_attention_heads"))
    ids = c.get("target_layer_ids")
    if ids is None:
        ids = c.get("eagle_aux_hidden_state_layer_ids")
    if not isinstance(ids, list) or len(ids) != 3:
        raise CheckpointError(f"{DIR}/config.json: target_layer_ids must list 3 layers, got {ids!r}")
    return Eagle3Config(
        hidden_size=H,
        n_heads=nh,
        n_kv_heads=int(req("num_key_value_heads")),
        head_dim=int(c.get("head_dim") or H // nh),
        intermediate_size=int(req("intermediate_size")),
        vocab_size=int(req("vocab_size")),
        draft_vocab_size=int(req("draft_vocab_size")),
        target_hidden_size=int(c.get("target_hidden_size") or H),
        rope_theta=float(c.get("rope_theta") or 1e4),
        eps=float(c.get("rms_norm_eps") or 1e-6),
        layer_ids=[int(x) for x in ids],
        max_draft_tokens=int(c.get("max_draft_tokens") or 7),
    )


def read_tensors(d):
    """{name: (dtype, array)} of the draft's shards (index or one file)."""
    idx = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(idx):
        with open(idx) as f:
            wm = json.load(f)["weight_map"]
    else:
        wm = None
    out = {}
    shards = sorted(set(wm.values())) if wm is not None else ["model.safetensors"]
    for s in shards:
        t, _ = read_safetensors(os.path.join(d, s))
        out.update(t)
    if wm is not None:
        for name in wm:
            if name not in out:
                raise CheckpointError(f"{DIR}: tensor {name} listed in weight_map is missing")
    return out


def llama_rmsnorm(x, w, eps):
    """Llama RMSNorm over the last axis, each step one f32 operation:
    ms = f32(sum x^2 / n) (the sum in f64), den = sqrt(ms + eps),
    y = (x / den) * w."""
    f32 = np.float32
    x64 = x.astype(np.float64)
    ms = np.mean(x64 * x64, axis=-1, keepdims=True).astype(f32)
    den = np.sqrt((ms + f32(eps)).astype(f32))
    return ((x / den).astype(f32) * w.astype(f32)).astype(f32)


def silu_mul(g, u):
    """bf16((g * sigmoid(g)) * u), evaluated in f64 and rounded to f32 once."""
    g64 = g.astype(np.float64)
    a = (g64 / (1.0 + np.exp(-g64))) * u.astype(np.float64)
    return F.bf16(a.astype(np.float32))


class DraftCache:
    """The draft's own K/V rows (bf16 values) and their positions."""

    def __init__(self):
        self.k = None  # [P, kvh, d]
        self.v = None
        self.pos = np.zeros(0, dtype=np.int64)

    def append(self, k, v, pos):
        self.k = k if self.k is None else np.concatenate([self.k, k], axis=0)
        self.v = v if self.v is None else np.concatenate([self.v, v], axis=0)
        self.pos = np.concatenate([self.pos, np.asarray(pos, dtype=np.int64)])


class Eagle3:
    def __init__(self, model_dir, target_cfg, embed, accum="f64"):
        """The draft under `model_dir/eagle3/` for a target of config
        `target_cfg` whose embedding (f32 [vocab, H]) is `embed`."""
        d = os.path.join(model_dir, DIR)
        with open(os.path.join(d, "config.json")) as f:
            self.cfg = c = parse_config(json.load(f))
        if c.hidden_size != target_cfg.hidden_size or c.target_hidden_size != target_cfg.hidden_size:
            raise CheckpointError(f"{DIR}/config.json: hidden_size {c.hidden_size} does not fit the target's")
        if c.vocab_size != target_cfg.vocab_size:
            raise CheckpointError(f"{DIR}/config.json: vocab_size {c.vocab_size} != target {target_cfg.vocab_size}")
        if any(not 0 <= l < target_cfg.num_layers for l in c.layer_ids):
            raise CheckpointError(f"{DIR}/config.json: target_layer_ids {c.layer_ids} out of range")
        self.num = Numerics(accum)
        self.embed = embed
        t = read_tensors(d)
        H, hd = c.hidden_size, c.head_dim
        qd, kvd, im = c.n_heads * hd, c.n_kv_heads * hd, c.intermediate_size

        def get(name, shape):
            if name not in t:
                raise CheckpointError(f"{DIR}: tensor {name} missing")
            dt, a = t[name]
            if dt not in ("BF16", "F32"):
                raise CheckpointError(f"{DIR}: tensor {name}: dtype {dt}, expected BF16 or F32")
            if list(a.shape) != list(shape):
                raise CheckpointError(f"{DIR}: tensor {name}: shape {list(a.shape)}, expected {list(shape)}")
            return a.astype(np.float32)

        self.fc = get("fc.weight", (H, 3 * c.target_hidden_size))
        p = "midlayer."
        self.in_norm = get(p + "input_layernorm.weight", (H,))
        self.hid_norm = get(p + "hidden_norm.weight", (H,))
        self.post_norm = get(p + "post_attention_layernorm.weight", (H,))
        self.q = get(p + "self_attn.q_proj.weight", (qd, 2 * H))
        self.k = get(p + "self_attn.k_proj.weight", (kvd, 2 * H))
        self.v = get(p + "self_attn.v_proj.weight", (kvd, 2 * H))
        self.o = get(p + "self_attn.o_proj.weight", (H, qd))
        self.gate = get(p + "mlp.gate_proj.weight", (im, H))
        self.up = get(p + "mlp.up_proj.weight", (im, H))
        self.down = get(p + "mlp.down_proj.weight", (H, im))
        self.norm = get("norm.weight", (H,))
        self.lm_head = get("lm_head.weight", (c.draft_vocab_size, H))
        if "d2t" not in t or t["d2t"][0] != "I64" or list(t["d2t"][1].shape) != [c.draft_vocab_size]:
            raise CheckpointError(f"{DIR}: tensor d2t must be I64 [{c.draft_vocab_size}]")
        tgt = np.arange(c.draft_vocab_size, dtype=np.int64) + t["d2t"][1].astype(np.int64)
        if np.any(tgt < 0) or np.any(tgt >= c.vocab_size) or len(set(tgt.tolist())) != tgt.size:
            raise CheckpointError(f"{DIR}: tensor d2t does not map draft ids injectively into 0..{c.vocab_size}")
        self.draft_to_target = tgt

    # ------------------------------------------------------------ pieces

    def fuse(self, feats):
        """g = bf16(fc(bf16(feats))), feats [T, 3 H] f32."""
        return self.num.linear(F.bf16(feats), self.fc)

    def attn_input(self, tokens, hid):
        c = self.cfg
        e = self.embed[np.asarray(tokens, dtype=np.int64)].astype(np.float32)
        en = F.bf16(llama_rmsnorm(e, self.in_norm, c.eps))
        hn = F.bf16(llama_rmsnorm(hid.astype(np.float32), self.hid_norm, c.eps))
        return np.concatenate([en, hn], axis=-1)

    def qkv(self, a, positions):
        c, num = self.cfg, self.num
        T, d = a.shape[0], c.head_dim
        cos, sin = rope_tables(positions, d, c.rope_theta)
        q = num.linear(a, self.q).reshape(T, c.n_heads, d)
        k = num.linear(a, self.k).reshape(T, c.n_kv_heads, d)
        v = num.linear(a, self.v).reshape(T, c.n_kv_heads, d)
        q = F.bf16(apply_rope(q, cos, sin, d))
        k = F.bf16(apply_rope(k, cos, sin, d))
        return q, k, v

    def attention(self, q, pos, cache):
        """q [T, nh, d] at positions `pos`; keys: every cached row at a
        position <= the query's.  -> [T, nh * d] bf16."""
        c = self.cfg
        T, nh, d = q.shape
        acc = self.num.acc
        kv_of = np.arange(nh) // (nh // c.n_kv_heads)
        kh = cache.k[:, kv_of, :].astype(acc)  # [P, nh, d]
        vh = cache.v[:, kv_of, :].astype(acc)
        s = np.einsum("thd,phd->htp", q.astype(acc), kh) / np.sqrt(acc(d))
        s = s.astype(np.float32).astype(acc)
        visible = cache.pos[None, :] <= np.asarray(pos, dtype=np.int64)[:, None]  # [T, P]
        s = np.where(visible[None], s, -np.inf)
        s = s - s.max(axis=-1, keepdims=True)
        p = np.exp(s)
        p = p / p.sum(axis=-1, keepdims=True)
        out = np.einsum("htp,phd->thd", p, vh).astype(np.float32)
        return F.bf16(out.reshape(T, nh * d))

    def add_context(self, tokens, hid, positions, cache):
        """Committed rows: only their K/V, appended to `cache`."""
        if len(tokens) == 0:
            return
        _, k, v = self.qkv(self.attn_input(tokens, hid), positions)
        cache.append(k, v, positions)

    def step(self, token, hid, pos, cache):
        """One draft row: returns (out [H] before the final norm, logits
        [draft_vocab] f32); its K/V is appended to `cache`."""
        c, num = self.cfg, self.num
        q, k, v = self.qkv(self.attn_input([token], hid[None, :]), [pos])
        cache.append(k, v, [pos])
        o = self.attention(q, [pos], cache)
        r = (hid[None, :].astype(np.float32) + num.linear(o, self.o)).astype(np.float32)
        m = F.bf16(llama_rmsnorm(r, self.post_norm, c.eps))
        act = silu_mul(num.linear(m, self.gate), num.linear(m, self.up))
        out = (r + num.linear(act, self.down)).astype(np.float32)
        logits = num.matmul(F.bf16(llama_rmsnorm(out, self.norm, c.eps)), self.lm_head)
        return out[0], logits[0]

    def features(self, taps):
        """The fc input [T, 3 H] from a forward's residual.{l} taps."""
        return np.concatenate([taps[f"residual.{l}"] for l in self.cfg.layer_ids], axis=-1).astype(np.float32)

    def propose(self, tokens, feats, n, forced=None):
        """Greedy proposal of n tokens after prompt `tokens` (T >= 2), the
        target features feats [T, 3 H].  With `forced` (target ids), step
        i > 0 takes forced[i-1] instead of its own previous token (the noise
        probes follow the reference's tokens).  Returns a dict: g [T, H],
        hidden [n, H], logits [n, draft_vocab], draft_ids [n], tokens [n]
        (target ids), logit_gap [n] (top-1 minus top-2 draft logit)."""
        T = len(tokens)
        if T < 2:
            raise ValueError("an EAGLE3 proposal needs at least 2 prompt tokens")
        g = self.fuse(feats)
        P = T - 2
        cache = DraftCache()
        self.add_context([tokens[j + 1] for j in range(P)], g[:P], np.arange(P), cache)
        tok, hid = tokens[T - 1], g[P]
        hidden, logits, ids, out_toks, gaps = [], [], [], [], []
        for i in range(n):
            out, lg = self.step(tok, hid, P + i, cache)
            d = int(np.argmax(lg))  # lowest draft id on ties
            srt = np.sort(lg.astype(np.float64))
            hidden.append(out)
            logits.append(lg)
            ids.append(d)
            out_toks.append(int(self.draft_to_target[d]))
            gaps.append(float(srt[-1] - srt[-2]))
            tok = out_toks[-1] if forced is None else int(forced[i])
            hid = out
        return {
            "g": g,
            "hidden": np.stack(hidden).astype(np.float32),
            "logits": np.stack(logits).astype(np.float32),
            "draft_ids": np.asarray(ids, dtype=np.int32),
            "tokens": np.asarray(out_toks, dtype=np.int32),
            "logit_gap": np.asarray(gaps, dtype=np.float32),
        }
