"""The M3 / M3.1 forward of MODEL.md sections 2-3, vectorized with numpy.

Written from MODEL.md alone.  Precision policy: every sum is done in f64
(closer to the exact value than any f32 order, so any correct f32
implementation is within its own accumulation error of this one), then
rounded to f32 once, and to bf16 exactly where MODEL.md rounds.  With
`accum="f32"` the linears and attention sums run in f32 instead: the gap
between the two modes measures the rounding noise floor that the case
tolerances are derived from.
"""

from dataclasses import dataclass

import numpy as np

from . import formats as F

ROOT = "model."


@dataclass
class Options:
    kv_dtype: str = "bf16"  # or "fp8_e4m3", "nvfp4"
    act: str = "bf16"  # routed-expert activations: "bf16" or "mxfp4"
    selection: str = "per_kv_head"  # or "shared"
    nvfp4_as_mxfp4: bool = False
    accum: str = "f64"  # "f64" (reference) or "f32" (noise-floor probe)
    online_quant: str = ""  # "" or "ptpc_fp8" (attention + dense-MLP linears)
    online_quant_exclude: str = ""  # comma-separated tensor-name substrings


class Ptpc:
    """A linear converted at load to PTPC FP8: weight codes and row scales."""

    def __init__(self, w):
        if not np.all(np.isfinite(w)):
            raise ValueError("PTPC FP8 needs finite weights")
        self.codes, self.scales = F.ptpc_quantize(w)


# ------------------------------------------------------------------ pieces


class Numerics:
    def __init__(self, accum):
        self.acc = np.float64 if accum == "f64" else np.float32
        # The noise probe: f32 sums in reversed order along K.
        self.reverse = accum == "f32_reversed"

    def matmul(self, x, w):
        """x [T, K] @ w[out, K]^T summed in the accumulation type, -> f32."""
        if isinstance(w, Ptpc):
            # exact by definition, whatever the accumulation mode
            return F.ptpc_linear(x, w.codes, w.scales)
        if self.reverse:
            x, w = x[:, ::-1], w[:, ::-1]
        return (x.astype(self.acc) @ w.astype(self.acc).T).astype(np.float32)

    def linear(self, x, w):
        """MODEL.md 2: input already bf16 (or quantized), output bf16."""
        return F.bf16(self.matmul(x, w))

    def rmsnorm(self, x, w, eps):
        """Gemma RMSNorm over the last axis, each step one f32 operation:
        ms = f32(sum x^2 / n) (the sum in f64), den = sqrt(ms + eps),
        y = (x / den) * (1 + w)."""
        f32 = np.float32
        x64 = x.astype(np.float64)
        ms = np.mean(x64 * x64, axis=-1, keepdims=True).astype(f32)
        den = np.sqrt((ms + f32(eps)).astype(f32))
        y = (x / den).astype(f32) * (f32(1.0) + w.astype(f32))
        return y.astype(f32)


def rope_tables(positions, rotary_dim, theta):
    """cos/sin [T, rd/2] in f32: angle p*f_i in f64, rounded to f32, then
    the f32 sin/cos of that angle (correctly rounded via f64)."""
    half = rotary_dim // 2
    i = np.arange(half, dtype=np.float64)
    f = np.power(np.float64(theta), -2.0 * i / rotary_dim)
    ang = (np.asarray(positions, dtype=np.float64)[:, None] * f[None, :]).astype(np.float32)
    a64 = ang.astype(np.float64)
    return np.cos(a64).astype(np.float32), np.sin(a64).astype(np.float32)


def apply_rope(x, cos, sin, rotary_dim):
    """x [T, heads, d] f32; NeoX pairs (i, i + rd/2); result f32."""
    half = rotary_dim // 2
    out = x.copy()
    x1 = x[..., :half].astype(np.float64)
    x2 = x[..., half:rotary_dim].astype(np.float64)
    c = cos[:, None, :].astype(np.float64)
    s = sin[:, None, :].astype(np.float64)
    out[..., :half] = (x1 * c - x2 * s).astype(np.float32)
    out[..., half:rotary_dim] = (x2 * c + x1 * s).astype(np.float32)
    return out


def cache_cast(x, kv_dtype, scale):
    """The value a cache read returns for x (MODEL.md 3.5)."""
    if kv_dtype == "bf16":
        return F.bf16(x)
    if kv_dtype == "fp8_e4m3":
        q = (x.astype(np.float32) / np.float32(scale)).astype(np.float32)
        return (F.e4m3_roundtrip(q) * np.float32(scale)).astype(np.float32)
    if kv_dtype == "nvfp4":
        # Blocks of 16 along the cached row; a head's head_dim is a multiple
        # of 16, so blocking the last axis ([.., kv_heads, d] or [.., di])
        # cuts the same blocks as the whole row.
        return F.nvfp4_cache_roundtrip(x, scale)
    raise ValueError(f"unknown kv dtype {kv_dtype}")


def swiglu_oai(g, u, alpha, limit):
    """SwiGLU-OAI in f32 (evaluated in f64, rounded once), then bf16."""
    g = np.minimum(g.astype(np.float64), limit)
    u = np.clip(u.astype(np.float64), -limit, limit)
    a = ((u + 1.0) * g) * (1.0 / (1.0 + np.exp(-alpha * g)))
    return F.bf16(a.astype(np.float32))


def select_blocks(scores, n_visible, K, local, init):
    """One (head, row) selection.  scores [nb] f32 (-inf where not visible).
    Returns (ascending block ids, margin): margin is the score gap between
    the last block chosen on merit and the best block left out (+inf when
    no choice was made)."""
    n = int(n_visible)
    if n <= K:
        return list(range(n)), np.inf
    forced = set(range(min(init, n))) | set(range(max(n - local, 0), n))
    free = [b for b in range(n) if b not in forced]
    slots = K - len(forced)
    # Highest score first, ties to the lower block index (stable sort).
    order = sorted(free, key=lambda b: (-float(scores[b]), b))
    chosen = order[:slots]
    margin = np.inf
    if slots > 0 and len(order) > slots:
        margin = float(scores[order[slots - 1]]) - float(scores[order[slots]])
    elif slots == 0 and order:
        margin = np.inf
    return sorted(forced | set(chosen)), margin


# ------------------------------------------------------------------ model


class LayerCache:
    """Dequantized cache contents for one layer: positions 0..P-1."""

    def __init__(self):
        self.k = None  # [P, kvh, d]
        self.v = None
        self.ik = None  # [P, di]

    @staticmethod
    def _cat(a, b):
        return b if a is None else np.concatenate([a, b], axis=0)

    def append(self, k, v, ik):
        self.k = self._cat(self.k, k)
        self.v = self._cat(self.v, v)
        if ik is not None:
            self.ik = self._cat(self.ik, ik)


class Model:
    def __init__(self, ckpt, opts):
        self.ck = ckpt
        self.cfg = ckpt.config
        self.opts = opts
        self.num = Numerics(opts.accum)
        c = self.cfg
        if opts.selection == "per_kv_head" and any(k == "sparse" for k in c.attn_kinds):
            if c.index_heads != c.n_kv_heads:
                raise ValueError(
                    f"index_n_heads {c.index_heads} must equal num_key_value_heads {c.n_kv_heads} in per-KV-head mode"
                )
        self.embed = ckpt.f32(ROOT + "embed_tokens.weight")
        lm = "lm_head.weight" if ckpt.has("lm_head.weight") else ROOT + "lm_head.weight"
        self.lm_head = ckpt.linear(lm[: -len(".weight")])[0]
        self.final_norm = ckpt.f32(ROOT + "norm.weight")
        self.layers = [self._load_layer(l) for l in range(c.num_layers)]
        self.formats = sorted({fmt for lw in self.layers for fmt in lw["formats"]})

    def _load_layer(self, l):
        c, ck = self.cfg, self.ck
        p = f"{ROOT}layers.{l}."
        fm = set()

        def lin(base, nv=False, ptpc=False):
            w, f = ck.linear(p + base, nvfp4_as_mxfp4=nv)
            fm.add(f)
            if ptpc and self.opts.online_quant:
                if self.opts.online_quant != "ptpc_fp8":
                    raise ValueError(f"unknown online quantization {self.opts.online_quant!r}")
                pats = [q.strip() for q in self.opts.online_quant_exclude.split(",") if q.strip()]
                if not any(q in p + base + ".weight" for q in pats):
                    fm.add("ptpc_fp8")
                    return Ptpc(w)
            return w

        lw = {
            "in_norm": ck.f32(p + "input_layernorm.weight"),
            "post_norm": ck.f32(p + "post_attention_layernorm.weight"),
            "q": lin("self_attn.q_proj", ptpc=True),
            "k": lin("self_attn.k_proj", ptpc=True),
            "v": lin("self_attn.v_proj", ptpc=True),
            "o": lin("self_attn.o_proj", ptpc=True),
            "q_norm": ck.f32(p + "self_attn.q_norm.weight"),
            "k_norm": ck.f32(p + "self_attn.k_norm.weight"),
            "k_scale": ck.scalar_or(p + "self_attn.k_scale", 1.0),
            "v_scale": ck.scalar_or(p + "self_attn.v_scale", 1.0),
            "ik_scale": ck.scalar_or(p + "self_attn.index_k_scale", 1.0),
        }
        if c.attn_kinds[l] == "sparse":
            lw["iq"] = lin("self_attn.index_q_proj", ptpc=True)
            lw["ik"] = lin("self_attn.index_k_proj", ptpc=True)
            lw["iq_norm"] = ck.f32(p + "self_attn.index_q_norm.weight")
            lw["ik_norm"] = ck.f32(p + "self_attn.index_k_norm.weight")
        if c.mlp_kinds[l] == "dense":
            lw["gate"] = lin("mlp.gate_proj", ptpc=True)
            lw["up"] = lin("mlp.up_proj", ptpc=True)
            lw["down"] = lin("mlp.down_proj", ptpc=True)
        else:
            m = p + "block_sparse_moe."
            lw["router"] = ck.f32(m + "gate.weight")
            lw["bias"] = ck.f32(m + "e_score_correction_bias")
            nv = self.opts.nvfp4_as_mxfp4
            lw["experts"] = [
                tuple(lin(f"block_sparse_moe.experts.{e}.{n}", nv) for n in ("w1", "w3", "w2"))
                for e in range(c.n_experts)
            ]
            if c.shared_width > 0:
                lw["shared"] = tuple(
                    lin(f"block_sparse_moe.shared_experts.{n}_proj") for n in ("gate", "up", "down")
                )
        lw["formats"] = fm
        return lw

    # -------------------------------------------------------------- layer

    def layer(self, l, r, positions, cache):
        """One decoder layer on rows r [T, H] at `positions`, appending to
        `cache`.  Returns (r'', taps dict)."""
        c, lw, num, o = self.cfg, self.layers[l], self.num, self.opts
        T = r.shape[0]
        taps = {}
        h = F.bf16(num.rmsnorm(r, lw["in_norm"], c.eps))
        d = c.head_dim
        q = num.linear(h, lw["q"]).reshape(T, c.n_heads, d)
        k = num.linear(h, lw["k"]).reshape(T, c.n_kv_heads, d)
        v = num.linear(h, lw["v"]).reshape(T, c.n_kv_heads, d)
        cos, sin = rope_tables(positions, c.rotary_dim, c.rope_theta)
        q = F.bf16(apply_rope(num.rmsnorm(q, lw["q_norm"], c.eps), cos, sin, c.rotary_dim))
        k = F.bf16(apply_rope(num.rmsnorm(k, lw["k_norm"], c.eps), cos, sin, c.rotary_dim))
        kc = cache_cast(k, o.kv_dtype, lw["k_scale"])
        vc = cache_cast(v, o.kv_dtype, lw["v_scale"])
        ikc = None
        sparse = c.attn_kinds[l] == "sparse"
        if sparse:
            di = c.index_dim
            iq = num.linear(h, lw["iq"]).reshape(T, c.index_heads, di)
            ik = num.linear(h, lw["ik"]).reshape(T, 1, di)
            iq = F.bf16(apply_rope(num.rmsnorm(iq, lw["iq_norm"], c.eps), cos, sin, c.rotary_dim))
            ik = F.bf16(apply_rope(num.rmsnorm(ik, lw["ik_norm"], c.eps), cos, sin, c.rotary_dim))
            ikc = cache_cast(ik[:, 0, :], o.kv_dtype, lw["ik_scale"])
        cache.append(kc, vc, ikc)
        P = cache.k.shape[0]
        pos = np.asarray(positions, dtype=np.int64)
        jpos = np.arange(P)
        causal = jpos[None, :] <= pos[:, None]  # [T, P]
        if sparse:
            allowed, sel, margin = self.indexer(iq, cache.ik, pos, causal)
            taps["topk_blocks"] = sel
            taps["topk_margin"] = margin
        else:
            allowed = np.broadcast_to(causal[None], (c.n_kv_heads, T, P))
        attn = self.attention(q, cache.k, cache.v, allowed)
        r1 = (r + num.linear(attn, lw["o"])).astype(np.float32)
        h2 = F.bf16(num.rmsnorm(r1, lw["post_norm"], c.eps))
        if c.mlp_kinds[l] == "dense":
            y = self.mlp(h2, lw["gate"], lw["up"], lw["down"], quant=False)
        else:
            y, experts, rmargin = self.moe(h2, lw)
            taps["experts"] = experts
            taps["router_margin"] = rmargin
        r2 = (r1 + y).astype(np.float32)
        return r2, taps

    def indexer(self, iq, ikc, pos, causal):
        """Block scores and selection.  iq [T, G, di] bf16, ikc [P, di]."""
        c = self.cfg
        T, G, _ = iq.shape
        P = ikc.shape[0]
        B, K = c.block_size, c.topk_blocks
        nb = -(-P // B)
        dots = np.einsum("tgd,pd->gtp", iq.astype(self.num.acc), ikc.astype(self.num.acc)).astype(np.float32)
        dots = np.where(causal[None], dots, -np.inf)
        padded = np.full((G, T, nb * B), -np.inf, dtype=np.float32)
        padded[:, :, :P] = dots
        bscores = padded.reshape(G, T, nb, B).max(axis=-1)  # [G, T, nb]
        if self.opts.selection == "shared":
            bscores = bscores.max(axis=0, keepdims=True)
        n_vis = pos // B + 1
        sel_heads = bscores.shape[0]
        sel = np.full((c.n_kv_heads, T, K), -1, dtype=np.int32)
        margin = np.full((c.n_kv_heads, T), np.inf, dtype=np.float32)
        allowed = np.zeros((c.n_kv_heads, T, P), dtype=bool)
        blk = np.arange(P) // B
        for g in range(sel_heads):
            for t in range(T):
                ids, m = select_blocks(bscores[g, t], n_vis[t], K, c.local_blocks, c.init_blocks)
                heads = range(c.n_kv_heads) if sel_heads == 1 else [g]
                for kv in heads:
                    sel[kv, t, : len(ids)] = ids
                    margin[kv, t] = m
                    allowed[kv, t] = np.isin(blk, ids) & causal[t]
        return allowed, sel, margin

    def attention(self, q, kc, vc, allowed):
        """q [T, nh, d], kc/vc [P, kvh, d], allowed [kvh, T, P] -> [T, nh*d] bf16."""
        c = self.cfg
        T, nh, d = q.shape
        grp = nh // c.n_kv_heads
        acc = self.num.acc
        kv_of = np.arange(nh) // grp
        kh = kc[:, kv_of, :].astype(acc)  # [P, nh, d]
        vh = vc[:, kv_of, :].astype(acc)
        s = np.einsum("thd,phd->htp", q.astype(acc), kh) / np.sqrt(acc(d))
        s = s.astype(np.float32).astype(acc)
        mask = allowed[kv_of]  # [nh, T, P]
        s = np.where(mask, s, -np.inf)
        s = s - s.max(axis=-1, keepdims=True)
        p = np.exp(s)
        p = p / p.sum(axis=-1, keepdims=True)
        out = np.einsum("htp,phd->thd", p, vh).astype(np.float32)
        return F.bf16(out.reshape(T, nh * d))

    def mlp(self, x, wg, wu, wd, quant):
        c, num = self.cfg, self.num
        if quant:
            x = F.mxfp4_fake_quant(x, "even")
        g = num.linear(x, wg)
        u = num.linear(x, wu)
        a = swiglu_oai(g, u, c.swiglu_alpha, c.swiglu_limit)
        if quant:
            a = F.mxfp4_fake_quant(a, "even")
        return num.linear(a, wd)

    def moe(self, h2, lw):
        c = self.cfg
        T = h2.shape[0]
        z = self.num.matmul(h2, lw["router"])  # f32 logits
        s = (1.0 / (1.0 + np.exp(-z.astype(np.float64)))).astype(np.float32)
        biased = (s + lw["bias"][None, :]).astype(np.float32)
        k = c.top_k
        order = np.argsort(-biased.astype(np.float64), axis=1, kind="stable")
        chosen = np.sort(order[:, :k], axis=1).astype(np.int32)  # ascending ids
        rows = np.arange(T)[:, None]
        bs = biased[rows, order]
        rmargin = (
            (bs[:, k - 1].astype(np.float64) - bs[:, k].astype(np.float64)).astype(np.float32)
            if c.n_experts > k
            else np.full(T, np.inf, dtype=np.float32)
        )
        sc = s[rows, chosen]  # [T, k] unbiased, ascending expert order
        tot = np.zeros(T, dtype=np.float32)
        for j in range(k):
            tot = (tot + sc[:, j]).astype(np.float32)
        w = ((sc / tot[:, None]).astype(np.float32) * np.float32(c.routed_scaling)).astype(np.float32)
        quant = self.opts.act == "mxfp4"
        contrib = np.zeros((T, k, c.hidden_size), dtype=np.float32)
        for e in range(c.n_experts):
            hit = chosen == e  # [T, k]
            rr, jj = np.nonzero(hit)
            if rr.size == 0:
                continue
            w1, w3, w2 = lw["experts"][e]
            oe = self.mlp(h2[rr], w1, w3, w2, quant)
            contrib[rr, jj] = (w[rr, jj][:, None] * oe).astype(np.float32)
        y = np.zeros((T, c.hidden_size), dtype=np.float32)
        for j in range(k):  # ascending expert id
            y = (y + contrib[:, j]).astype(np.float32)
        if "shared" in lw:
            y = (y + self.mlp(h2, *lw["shared"], quant=False)).astype(np.float32)
        return y, chosen, rmargin

    # ------------------------------------------------------------- model

    def logits(self, r_last):
        hn = F.bf16(self.num.rmsnorm(r_last, self.final_norm, self.cfg.eps))
        return self.num.matmul(hn, self.lm_head)

    def check_tokens(self, tokens):
        bad = [t for t in tokens if not 0 <= t < self.cfg.vocab_size]
        if bad:
            raise ValueError(f"token id {bad[0]} out of range 0..{self.cfg.vocab_size}")

    def forward(self, tokens, positions, caches, teacher=None):
        """Run rows `tokens` at `positions` through every layer.
        teacher: optional {layer: residual [T, H]} replacing layer l's input
        by the teacher's residual.{l-1}.  Returns (taps, final residual)."""
        self.check_tokens(tokens)
        r = self.embed[np.asarray(tokens, dtype=np.int64)].astype(np.float32)
        taps = {}
        for l in range(self.cfg.num_layers):
            if teacher is not None and l > 0:
                r = teacher[l - 1].astype(np.float32)
            r, lt = self.layer(l, r, positions, caches[l])
            taps[f"residual.{l}"] = r
            for name, val in lt.items():
                taps[f"{name}.{l}"] = val
        if teacher is not None:
            r = teacher[self.cfg.num_layers - 1].astype(np.float32)
        taps["logits"] = self.logits(r)
        return taps

    def new_caches(self):
        return [LayerCache() for _ in range(self.cfg.num_layers)]

    def greedy(self, prompt, n):
        """Prefill then n-1 single-token decode steps: returns the n greedy
        tokens and, per token, the logit gap top1 - top2 and the smallest
        router / block margin of the step that produced it."""
        caches = self.new_caches()
        taps = self.forward(prompt, np.arange(len(prompt)), caches)
        out, gaps, rmin, bmin = [], [], [], []
        pos = len(prompt)
        while True:
            lg = taps["logits"][-1].astype(np.float64)
            tok = int(np.argmax(lg))  # lowest id on ties
            srt = np.sort(lg)
            out.append(tok)
            gaps.append(float(srt[-1] - srt[-2]))
            rm = [float(np.min(v[-1:])) for k_, v in taps.items() if k_.startswith("router_margin.")]
            bm = [float(np.min(v[:, -1:])) for k_, v in taps.items() if k_.startswith("topk_margin.")]
            rmin.append(min(rm) if rm else float("inf"))
            bmin.append(min(bm) if bm else float("inf"))
            if len(out) == n:
                break
            taps = self.forward([tok], np.array([pos]), caches)
            pos += 1
        return out, gaps, rmin, bmin
