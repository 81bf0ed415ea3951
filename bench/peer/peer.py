#!/usr/bin/env python3
"""PyTorch peer of m3's GPU bench (PERF.md): the same decode step of the same
model (MODEL.md section 3, preset m3.1 --layers 12 by default) with bf16
weights and ordinary PyTorch ops, timed eager, CUDA-graph captured, and
(--compile) compiled by torch.compile (inductor) then captured.
See bench/peer/README.md for what it models, what differs from m3, and the
byte formula.  Needs only torch (>= 2.4) and the standard library."""
import argparse, json, math, os, subprocess, sys, time

import torch
import torch.nn.functional as F

# (H, L, first_k_dense, heads, kv, d, rotary, vocab, experts, top_k, expert w,
#  shared w, dense w, index heads, index dim, block, top-k blocks): core/src/config.rs
PRESETS = {
    "tiny": (128, 4, 1, 8, 2, 32, 16, 512, 8, 2, 64, 64, 256, 2, 32, 16, 4),
    "small": (1024, 6, 1, 16, 4, 64, 32, 4096, 32, 4, 512, 512, 2048, 4, 64, 64, 8),
    "m3.1": (6144, 60, 3, 64, 4, 128, 64, 200_064, 128, 4, 3072, 3072, 12288, 4, 128, 128, 16),
}
KEYS = ("H L k_dense nh nkv d rot V E topk I Is Id nih di bs kb").split()


class Cfg:
    def __init__(self, preset, layers=None):
        for k, v in zip(KEYS, PRESETS[preset]):
            setattr(self, k, v)
        self.preset, self.theta, self.eps = preset, 5.0e6, 1e-6
        self.rsf, self.alpha, self.limit = 2.0, 1.702, 7.0
        self.init_blocks, self.local_blocks = 0, 1
        if layers:  # ModelConfig::with_layers: keep first_k_dense (clipped), rest MoE
            self.L = layers
        self.attn = ["sparse"] * self.L  # every m3.1 preset layer is sparse (MSA)
        self.mlp = ["dense" if i < self.k_dense else "moe" for i in range(self.L)]


def rmsnorm(x, w, eps):  # Gemma: x / sqrt(mean(x^2) + eps) * (1 + w), f32
    x = x.float()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + w)


def rope(x, cos, sin, rd):  # NeoX partial: pairs (i, i + rd/2), i < rd/2
    h = rd // 2
    x1, x2, rest = x[..., :h], x[..., h:rd], x[..., rd:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest), -1)


def swiglu_oai(gu, alpha, limit):  # gu = [gate | up]
    g, u = gu.float().chunk(2, -1)
    g = g.clamp(max=limit)
    u = u.clamp(-limit, limit)
    return ((u + 1.0) * g * torch.sigmoid(alpha * g)).to(torch.bfloat16)


class Model:
    """Weights, caches and one decode step.  Linear weights are [out, in] bf16;
    gate and up are stored fused ([gate; up]) as one tensor."""

    def __init__(self, c, dev, cache, batch_cap, context, seed, moe):
        self.c, self.dev, self.moe, self.plant = c, dev, moe, None
        self.g = None  # the meta device (smoke.py: shapes and host reads only) has no generator
        if dev.type != "meta":
            self.g = torch.Generator(device=dev)
            self.g.manual_seed(seed)
        bf = torch.bfloat16
        self.S = (context + 1 + c.bs - 1) // c.bs * c.bs  # positions 0..context
        self.NB = self.S // c.bs
        self.cdt = torch.uint8 if cache == "fp8" else bf  # storage dtype (fp8: E4M3FN bytes)
        self.embed = self.lin(c.V, c.H, scale=1.0)
        self.lm_head = self.lin(c.V, c.H)
        self.final_norm = self.norm(c.H)
        self.layers = []
        for l in range(c.L):
            w = dict(in_norm=self.norm(c.H), post_norm=self.norm(c.H),
                     wq=self.lin(c.nh * c.d, c.H), wk=self.lin(c.nkv * c.d, c.H),
                     wv=self.lin(c.nkv * c.d, c.H), wo=self.lin(c.H, c.nh * c.d),
                     q_norm=self.norm(c.d), k_norm=self.norm(c.d),
                     kc=self.cache_t(batch_cap, c.nkv, self.S, c.d),
                     vc=self.cache_t(batch_cap, c.nkv, self.S, c.d))
            if c.attn[l] == "sparse":
                w.update(wiq=self.lin(c.nih * c.di, c.H), wik=self.lin(c.di, c.H),
                         iq_norm=self.norm(c.di), ik_norm=self.norm(c.di),
                         ic=self.cache_t(batch_cap, self.S, c.di))
            if c.mlp[l] == "dense":
                w.update(w_gu=self.lin(2 * c.Id, c.H), w_d=self.lin(c.H, c.Id))
            else:
                w.update(router=torch.randn(c.E, c.H, generator=self.g, device=dev) / math.sqrt(c.H),
                         bias=0.05 * torch.randn(c.E, generator=self.g, device=dev),
                         s_gu=self.lin(2 * c.Is, c.H), s_d=self.lin(c.H, c.Is))
            self.layers.append(w)
        self.pool = None  # set by alloc_experts
        self.f32_out = False  # torch.bmm(bf16, bf16, out_dtype=f32): CUDA, torch >= 2.8
        if dev.type == "cuda":
            try:
                x = torch.ones(1, 2, 16, dtype=bf, device=dev)
                self.f32_out = torch.bmm(x, x.transpose(1, 2), out_dtype=torch.float32).dtype == torch.float32
            except Exception:
                pass
        d2 = torch.arange(0, c.rot // 2, device=dev, dtype=torch.float64)
        self.inv_freq = c.theta ** (-2.0 * d2 / c.rot)

    def alloc_experts(self, pool):
        """Routed experts, allocated last so the pool can be sized to what is
        left: expert id e lives in slot e % pool (README: "expert pool")."""
        self.pool = pool
        for l, w in enumerate(self.layers):
            if self.c.mlp[l] == "moe":
                w["w13"] = self.lin(2 * self.c.I, self.c.H, n=pool)
                w["w2"] = self.lin(self.c.H, self.c.I, n=pool)

    def lin(self, out, inp, n=None, scale=None):  # N(0, 1/fan_in), bf16, in place
        shape = (out, inp) if n is None else (n, out, inp)
        t = torch.empty(shape, dtype=torch.bfloat16, device=self.dev)
        return t.normal_(0.0, scale if scale is not None else 1.0 / math.sqrt(inp), generator=self.g)

    def norm(self, n):
        return 0.2 * (2 * torch.rand(n, generator=self.g, device=self.dev) - 1)

    def cache_t(self, *shape):  # prefilled with random keys/values (no prefill run)
        t = torch.empty(shape, dtype=self.cdt, device=self.dev)
        if self.cdt == torch.bfloat16:
            return t.normal_(generator=self.g)
        for i in range(shape[0]):  # fp8: generate bf16 per sequence, then cast
            t[i].copy_(self.cw(torch.empty(shape[1:], dtype=torch.bfloat16, device=self.dev).normal_(generator=self.g)))
        return t

    # fp8 caches are stored as raw bytes (uint8) so that indexing never depends
    # on float8 support of index kernels; the element is E4M3FN, scale 1.0
    def cw(self, x):  # cache write: saturating round-to-nearest-even
        if self.cdt == torch.bfloat16:
            return x
        return x.float().clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8)

    def cr(self, x):  # cache read
        return x if self.cdt == torch.bfloat16 else x.view(torch.float8_e4m3fn).to(torch.bfloat16)

    # ---- one decode step: rows b at position pos[b] of sequence seq[b] ----
    def step(self, tok, pos, seq):
        """tok, pos, seq: int64 [B] on the device.  Returns (next token [B],
        logits [B, V] f32, record per layer: the selected blocks [B, nkv, K]
        (-1 = unusable; None on full layers), as (blocks, expert slots [B*k])
        on MoE layers).  No host sync: graph-capturable."""
        c, bf = self.c, torch.bfloat16
        B = tok.shape[0]
        ang = (pos.double()[:, None] * self.inv_freq[None, :]).float()
        cos, sin = ang.cos()[:, None, :], ang.sin()[:, None, :]  # [B, 1, rd/2]
        r = self.embed[tok].float()  # residual f32
        rec = []
        for l, w in enumerate(self.layers):
            h = rmsnorm(r, w["in_norm"], c.eps).to(bf)
            q = F.linear(h, w["wq"]).view(B, c.nh, c.d)
            k = F.linear(h, w["wk"]).view(B, c.nkv, c.d)
            v = F.linear(h, w["wv"]).view(B, c.nkv, c.d)
            q = rope(rmsnorm(q, w["q_norm"], c.eps), cos, sin, c.rot).to(bf)
            k = rope(rmsnorm(k, w["k_norm"], c.eps), cos, sin, c.rot).to(bf)
            w["kc"][seq, :, pos] = self.cw(k)
            w["vc"][seq, :, pos] = self.cw(v)
            if c.attn[l] == "sparse":
                sel, ok = self.indexer(w, h, pos, seq, cos, sin)
                rec.append(torch.where(ok, sel, -1))
            else:
                sel = torch.arange(self.NB, device=self.dev).expand(B, c.nkv, self.NB)
                ok = sel * c.bs <= pos[:, None, None]
                rec.append(None)
            o = self.attend(w, q, sel, ok, pos, seq)
            r = r + F.linear(o.reshape(B, c.nh * c.d), w["wo"]).float()
            h2 = rmsnorm(r, w["post_norm"], c.eps).to(bf)
            if c.mlp[l] == "dense":
                r = r + F.linear(swiglu_oai(F.linear(h2, w["w_gu"]), c.alpha, c.limit), w["w_d"]).float()
            else:
                y, slots = self.moe_layer(w, h2, l)
                rec[-1] = (rec[-1], slots)
                r = r + y
        logits = F.linear(rmsnorm(r, self.final_norm, c.eps).to(bf), self.lm_head).float()
        return logits.argmax(-1), logits, rec

    def indexer(self, w, h, pos, seq, cos, sin):
        c, bf, B = self.c, torch.bfloat16, h.shape[0]
        iq = F.linear(h, w["wiq"]).view(B, c.nih, c.di)
        ik = F.linear(h, w["wik"]).view(B, 1, c.di)
        iq = rope(rmsnorm(iq, w["iq_norm"], c.eps), cos, sin, c.rot).to(bf)
        ik = rope(rmsnorm(ik, w["ik_norm"], c.eps), cos, sin, c.rot).to(bf)
        w["ic"][seq, pos] = self.cw(ik[:, 0])
        keys = self.cr(w["ic"][seq])  # [B, S, di]
        if self.f32_out:  # f32 scores (MODEL.md) without upcasting the cache copy
            s = torch.bmm(iq, keys.transpose(1, 2), out_dtype=torch.float32)  # [B, nih, S]
        else:
            s = torch.bmm(iq.float(), keys.float().transpose(1, 2))
        j = torch.arange(self.S, device=self.dev)
        s = s.masked_fill(j[None, None, :] > pos[:, None, None], float("-inf"))
        blk = s.view(B, c.nih, self.NB, c.bs).amax(-1)  # [B, nih, NB]
        bi = torch.arange(self.NB, device=self.dev)[None, None, :]
        last = (pos // c.bs)[:, None, None]
        forced = (bi <= last) & ((bi < c.init_blocks) | (bi > last - c.local_blocks))
        blk = torch.where(forced, torch.full_like(blk, float("inf")), blk)
        kk = min(c.kb, self.NB)
        sel = blk.topk(kk, dim=-1).indices.sort(-1).values  # per KV head g = index head g
        ok = sel <= last  # fewer than K visible blocks: the rest are unusable
        return sel, ok

    def attend(self, w, q, sel, ok, pos, seq):
        c, B = self.c, q.shape[0]
        K = sel.shape[-1]
        kc = w["kc"].view(w["kc"].shape[0], c.nkv, self.NB, c.bs, c.d)
        vc = w["vc"].view(kc.shape)
        b_ix, g_ix = seq[:, None, None], torch.arange(c.nkv, device=self.dev)[None, :, None]
        kg = self.cr(kc[b_ix, g_ix, sel]).view(B, c.nkv, K * c.bs, c.d)  # gather selected blocks
        vg = self.cr(vc[b_ix, g_ix, sel]).view(B, c.nkv, K * c.bs, c.d)
        jpos = (sel[..., None] * c.bs + torch.arange(c.bs, device=self.dev)).view(B, c.nkv, K * c.bs)
        okj = ok[..., None].expand(B, c.nkv, K, c.bs).reshape(B, c.nkv, K * c.bs)  # no repeat_interleave: it can sync
        mask = (jpos <= pos[:, None, None]) & okj
        qg = q.view(B, c.nkv, c.nh // c.nkv, c.d)
        o = F.scaled_dot_product_attention(qg, kg, vg, attn_mask=mask[:, :, None, :])
        return o.to(torch.bfloat16)

    def moe_layer(self, w, h2, l):
        c, B = self.c, h2.shape[0]
        s = torch.sigmoid(F.linear(h2.float(), w["router"]))
        ids = (s + w["bias"]).topk(c.topk, dim=-1).indices  # [B, k]
        if self.plant == l:  # --check: a deliberately wrong expert for row 0
            ids = ids.clone()
            ids[0, 0] = (ids[0, 0] + 1) % c.E
        wt = s.gather(1, ids)
        wt = wt / wt.sum(-1, keepdim=True) * c.rsf
        slots = (ids % self.pool).view(-1)  # [P]
        if self.moe == "grouped":
            y = self.experts_grouped(w, h2, slots, wt.view(-1))
        else:  # gather the chosen experts' weights and batch-matmul them
            x = h2[:, None, :].expand(B, c.topk, c.H).reshape(B * c.topk, c.H, 1)  # [P, H, 1]
            a = swiglu_oai(torch.bmm(w["w13"][slots], x)[..., 0], c.alpha, c.limit)
            o = torch.bmm(w["w2"][slots], a[:, :, None])[..., 0]  # [P, H]
            y = (o.float() * wt.view(-1, 1)).view(B, c.topk, c.H).sum(1)
        sh = F.linear(swiglu_oai(F.linear(h2, w["s_gu"]), c.alpha, c.limit), w["s_d"]).float()
        return y + sh, slots

    def experts_grouped(self, w, h2, slots, wt):
        """torch._grouped_mm over the pool: rows sorted by slot, one group per
        slot; empty groups read no weights."""
        c = self.c
        order = torch.sort(slots, stable=True).indices
        row = order // c.topk
        cnt = torch.zeros(self.pool, dtype=torch.int32, device=self.dev)
        cnt.scatter_add_(0, slots, torch.ones_like(slots, dtype=torch.int32))
        offs = cnt.cumsum(0, dtype=torch.int32)
        xs = h2[row]
        a = swiglu_oai(torch._grouped_mm(xs, w["w13"].transpose(1, 2), offs=offs), c.alpha, c.limit)
        o = torch._grouped_mm(a, w["w2"].transpose(1, 2), offs=offs)
        y = torch.zeros(h2.shape[0], c.H, dtype=torch.float32, device=self.dev)
        return y.index_add_(0, row, o.float() * wt[order][:, None])


def step_bytes(m, B, pos, rec, cache_el):
    """PERF.md's floor, term by term as m3's benchmodel::step_bytes
    (README.md "Bytes a step must move"); cache_el = bytes per cache element."""
    c = m.c
    nb = lambda t: t.numel() * t.element_size()
    b = B * c.H * 2 + nb(m.lm_head) + c.H * 4  # embedding rows, LM head, final norm
    for l, w in enumerate(m.layers):
        b += (2 * c.H + 2 * c.d) * 4 + sum(nb(w[k]) for k in ("wq", "wk", "wv", "wo"))
        r = rec[l]
        sel, slots = r if isinstance(r, tuple) else (r, None)
        if c.attn[l] == "sparse":
            b += nb(w["wiq"]) + nb(w["wik"]) + 2 * c.di * 4 + B * (pos + 1) * c.di * cache_el
            for blk in sel.flatten().tolist():  # [B, nkv, K], per (row, KV head)
                if blk >= 0:
                    lo = blk * c.bs
                    b += 2 * max(0, min(lo + c.bs, pos + 1) - lo) * c.d * cache_el
        else:
            b += B * 2 * (pos + 1) * c.d * c.nkv * cache_el
        if c.mlp[l] == "dense":
            b += nb(w["w_gu"]) + nb(w["w_d"])
        else:
            per = (nb(w["w13"]) + nb(w["w2"])) // m.pool
            b += nb(w["router"]) + nb(w["bias"]) + len(set(slots.tolist())) * per
            b += nb(w["s_gu"]) + nb(w["s_d"])
    return b


def nvidia_smi():
    try:
        q = "name,driver_version,clocks.sm,clocks.mem,clocks.max.sm,clocks.max.mem," \
            "clocks_event_reasons.active,power.draw,temperature.gpu"
        p = subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=30)
        return p.stdout.strip() if p.returncode == 0 else f"nvidia-smi failed: {p.stderr.strip()}"
    except Exception as e:  # never fail without it
        return f"nvidia-smi not available ({e.__class__.__name__})"


def stats(v):
    s = sorted(v)
    q = lambda p: s[int((len(s) - 1) * p + 0.5)] if s else 0.0  # as m3's stats (round half up)
    return q(0.5), q(0.1), q(0.9)


def timed(fn, iters, cuda):
    """Per-step times (ms) of fn(), one event pair per step (wall clock on CPU)."""
    out = []
    if cuda:
        ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
        for a, b in ev:
            a.record(); fn(); b.record()
        torch.cuda.synchronize()
        return [a.elapsed_time(b) for a, b in ev]
    for _ in range(iters):
        t0 = time.perf_counter(); fn(); out.append((time.perf_counter() - t0) * 1e3)
    return out


def ceiling(dev):
    if dev.type != "cuda":
        return dict(note="no ceiling on CPU", quoted_gb_per_s=None)
    n = 2 << 30
    src = torch.empty(n, dtype=torch.uint8, device=dev).fill_(1)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    tc = timed(lambda: dst.copy_(src), 20, True)
    src = dst = None  # free before the read probe
    x = torch.ones((4 << 30) // 4, dtype=torch.float32, device=dev)
    for _ in range(3):
        x.sum()
    tr = timed(lambda: x.sum(), 20, True)
    x = None
    torch.cuda.empty_cache()
    copy = 2 * n / (stats(tc)[0] * 1e-3) / 1e9
    read = (4 << 30) / (stats(tr)[0] * 1e-3) / 1e9
    return dict(copy_gb_per_s=copy, read_gb_per_s=read, quoted_gb_per_s=max(copy, read),
                copy_samples_ms=tc, read_samples_ms=tr)


def auto_pool(c, dev, batches, moe):
    """Largest expert pool (slots per MoE layer, <= E) that fits next to what
    is already allocated, keeping room for step temporaries."""
    n_moe = c.mlp.count("moe")
    if dev.type != "cuda" or n_moe == 0:
        return c.E
    torch.cuda.empty_cache()
    free = torch.cuda.mem_get_info(dev)[0]
    slot = 3 * c.I * c.H * 2
    p_max = max(batches) * c.topk
    # bmm gathers P expert slices per layer (eager + one shared graph pool)
    temp = (2 * p_max * slot if moe == "bmm" else 0) + 6 * max(batches) * c.V * 4 + (4 << 30)
    return max(1, min(c.E, (free - temp) // (n_moe * slot)))


def probe_grouped(dev):
    """torch._grouped_mm as experts_grouped calls it (2D rows x 3D transposed
    weights, empty groups included) against per-group matmuls; raises if not."""
    g = torch.Generator(device=dev)
    g.manual_seed(1)
    w = torch.randn(6, 64, 128, generator=g, device=dev).to(torch.bfloat16)  # [G, out, in]
    x = torch.randn(5, 128, generator=g, device=dev).to(torch.bfloat16)
    cnt = torch.tensor([2, 0, 0, 3, 0, 0], dtype=torch.int32, device=dev)
    y = torch._grouped_mm(x, w.transpose(1, 2), offs=cnt.cumsum(0, dtype=torch.int32))
    ref = torch.cat([x[:2].float() @ w[0].float().T, x[2:].float() @ w[3].float().T])
    err = ((y.float() - ref).abs().max() / ref.abs().max()).item()
    if not err < 2e-2:
        raise RuntimeError(f"torch._grouped_mm probe: relative error {err:.3g}")


def capture(m, st, pool, step=None):
    """CUDA graph of one step (m.step, or a compiled form of it) on static
    buffers st (token fed back in place); the warm-up steps before the
    capture are where torch.compile compiles."""
    step = step or m.step
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            nt, _, _ = step(st["tok"], st["pos"], st["seq"])
            st["tok"].copy_(nt)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, pool=pool):
        nt, lg, rec = step(st["tok"], st["pos"], st["seq"])
        st["tok"].copy_(nt)
    st["grec"], st["glogits"] = rec, lg  # static outputs: read back after replays
    return g


COMPILE_MODES = {"default": "default", "max-autotune": "max-autotune-no-cudagraphs"}


def compiled_step(m, mode):
    """m.step compiled by torch.compile (inductor) in `mode` (default or
    max-autotune, without inductor's own CUDA graphs: capture() takes the
    graph, as for the plain step), shapes static."""
    return torch.compile(m.step, mode=COMPILE_MODES[mode], dynamic=False)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--preset", default="m3.1", choices=sorted(PRESETS))
    ap.add_argument("--tiny", action="store_true", help="= --preset tiny (CPU smoke test)")
    ap.add_argument("--layers", type=int, default=None, help="default 12 for m3.1, else the preset's")
    ap.add_argument("--batch", default="1,4,16")
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cache", default="bf16", choices=["bf16", "fp8"])
    ap.add_argument("--moe", default="auto", choices=["auto", "bmm", "grouped"],
                    help="routed experts: gather+bmm, torch._grouped_mm, or auto (grouped if it works on CUDA)")
    ap.add_argument("--experts-resident", type=int, default=0,
                    help="expert pool slots per MoE layer; 0 = all experts if they fit, else as many as fit")
    ap.add_argument("--no-graph", action="store_true")
    ap.add_argument("--compile", default="off", choices=["off"] + sorted(COMPILE_MODES),
                    help="also time the step compiled by torch.compile (inductor; max-autotune without "
                         "its own CUDA graphs) and captured in a CUDA graph, as mode 'compiled' "
                         "(CUDA only; compile time is printed, ~25 s default, minutes max-autotune)")
    ap.add_argument("--seed", type=int, default=0x5eed)
    ap.add_argument("--out", default=None)
    ap.add_argument("--check", action="store_true", help="self-check on the tiny preset, then exit")
    args = ap.parse_args()
    if args.check:
        from check import check  # bench/peer/check.py
        return check(args)
    preset = "tiny" if args.tiny else args.preset
    c = Cfg(preset, args.layers or (12 if preset == "m3.1" else None))
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    batches = [int(x) for x in args.batch.split(",")]
    smi_before = nvidia_smi()
    dev_name = torch.cuda.get_device_name(dev) if cuda else "cpu"
    print(f"torch {torch.__version__}, device {dev_name}")
    print(f"clocks before: {smi_before}")
    ceil = ceiling(dev)
    q = ceil["quoted_gb_per_s"]
    if cuda:
        print(f"ceiling: copy {ceil['copy_gb_per_s']:.0f} GB/s (read+write of 2 GiB), stream read "
              f"{ceil['read_gb_per_s']:.0f} GB/s (4 GiB x.sum()) -> {q:.0f} GB/s")
    moe = args.moe
    if moe == "auto":
        moe = "grouped" if cuda and hasattr(torch, "_grouped_mm") else "bmm"
    if moe == "grouped" and c.mlp.count("moe"):  # before sizing the pool: bmm needs more room
        try:
            probe_grouped(dev)
        except Exception as e:
            print(f"moe: torch._grouped_mm unusable ({str(e).splitlines()[0][:200]}); using gather+bmm")
            moe = "bmm"
    t0 = time.time()
    m = Model(c, dev, args.cache, max(batches), args.context, args.seed, moe)
    pool = args.experts_resident or auto_pool(c, dev, batches, moe)
    m.alloc_experts(pool)
    if cuda:
        torch.cuda.synchronize()
    print(f"model {preset} --layers {c.L}: mlp {c.mlp}, attention {c.attn}; bf16 weights, f32 router/norms; "
          f"{args.cache} KV/index cache ({m.S} positions, random, no prefill); built in {time.time() - t0:.1f} s")
    print(f"experts: {pool} resident slots per MoE layer of {c.E} " +
          ("(all)" if pool == c.E else f"(expert e -> slot e % {pool}; bytes count distinct slots)"))
    print(f"moe: {'torch._grouped_mm over the expert pool' if moe == 'grouped' else 'gather W[ids] + torch.bmm'}")
    gpool = torch.cuda.graph_pool_handle() if cuda else None  # one pool: graphs never run concurrently
    cases = []
    for b in batches:
        st = dict(tok=torch.tensor([(i * 7919 + 13) % c.V for i in range(b)], device=dev),
                  pos=torch.full((b,), args.context, device=dev, dtype=torch.int64),
                  seq=torch.arange(b, device=dev))

        def eager(st=st):
            nt, _, rec = m.step(st["tok"], st["pos"], st["seq"])
            st["tok"].copy_(nt)  # greedy token fed back; the same cache slot is rewritten
            st["rec"] = rec
        for _ in range(args.warmup):
            eager()
        case = dict(batch=b, st=st, modes={"eager": eager}, samples={}, bytes={}, bytes_fp8={}, notes=[])
        if cuda and not args.no_graph:
            try:
                g = capture(m, st, gpool)
                for _ in range(args.warmup):
                    g.replay()
                case["modes"]["graph"] = g.replay
            except Exception as e:
                msg = f"batch {b}: graph capture failed: {str(e).splitlines()[0][:300]}"
                print(msg)
                case["notes"].append(msg)
        else:
            print(f"batch {b}: graph mode skipped ({'device is not CUDA' if not cuda else '--no-graph'})")
        if cuda and args.compile != "off":
            # its own static buffers: the plain graph keeps st's outputs
            cst = dict(tok=st["tok"].clone(), pos=st["pos"], seq=st["seq"])
            try:
                t0 = time.time()
                cg = capture(m, cst, gpool, compiled_step(m, args.compile))
                for _ in range(args.warmup):
                    cg.replay()
                torch.cuda.synchronize()
                msg = f"batch {b}: torch.compile ({args.compile}) + capture in {time.time() - t0:.1f} s"
                print(msg)
                case["notes"].append(msg)
                case["modes"]["compiled"] = cg.replay
                case["cst"] = cst
            except Exception as e:
                msg = f"batch {b}: compiled mode failed: {str(e).splitlines()[0][:300]}"
                print(msg)
                case["notes"].append(msg)
        cases.append(case)
    if cuda:
        torch.cuda.synchronize()
    ce = 1 if args.cache == "fp8" else 2
    for rnd in range(args.rounds):  # interleaved: every case in every round
        for case in cases:
            b, st = case["batch"], case["st"]
            for mode, fn in case["modes"].items():
                v = timed(fn, args.iters, cuda)
                # read back outside the timed loop
                rec = {"graph": st.get("grec"), "compiled": case.get("cst", {}).get("grec")}.get(mode, st["rec"])
                by = step_bytes(m, b, args.context, rec, ce)
                case["samples"].setdefault(mode, []).append(v)
                case["bytes"].setdefault(mode, []).append(by)
                case["bytes_fp8"].setdefault(mode, []).append(step_bytes(m, b, args.context, rec, 1))
                print(f"round {rnd} batch {b} {mode}: median {stats(v)[0]:.3f} ms, {by / 1e6:.1f} MB/step")
    smi_after = nvidia_smi()
    print(f"clocks after: {smi_after}")
    print(f"\nPyTorch peer, {preset} --layers {c.L}, bf16 weights, {args.cache} caches, context {args.context}, "
          f"moe {moe}, experts resident {pool}/{c.E}, {args.rounds} rounds x {args.iters} steps")
    print("| batch | mode | median ms | p10 ms | p90 ms | MB/step | GB/s | % of ceiling | tok/s |")
    print("|---|---|---|---|---|---|---|---|---|")
    out_cases = []
    for case in cases:
        for mode, rounds in case["samples"].items():
            med, p10, p90 = stats([x for r in rounds for x in r])
            by = sorted(case["bytes"][mode])[len(case["bytes"][mode]) // 2]
            gbs = by / (med * 1e-3) / 1e9
            pct = 100 * gbs / q if q else None
            print(f"| {case['batch']} | {mode} | {med:.3f} | {p10:.3f} | {p90:.3f} | {by / 1e6:.1f} | {gbs:.0f} | "
                  f"{'n/a' if pct is None else f'{pct:.1f}%'} | {case['batch'] / (med * 1e-3):.0f} |")
            out_cases.append(dict(batch=case["batch"], mode=mode, median_ms=med, p10_ms=p10, p90_ms=p90,
                                  bytes_per_step=case["bytes"][mode], gb_per_s=gbs, pct_of_ceiling=pct,
                                  bytes_per_step_if_fp8_cache=case["bytes_fp8"][mode],
                                  tok_per_s=case["batch"] / (med * 1e-3), notes=case["notes"],
                                  samples_ms_per_round=rounds))
    doc = dict(what="bench/peer/peer.py: PyTorch peer of m3's GPU bench, pure decode",
               command=" ".join(sys.argv), torch=torch.__version__, python=sys.version.split()[0],
               device=dev_name, clocks_before=smi_before, clocks_after=smi_after, ceiling=ceil,
               model=dict(preset=preset, layers=c.L, mlp=c.mlp, attn=c.attn,
                          weights="bf16 (router, norms, router bias f32)", cache=args.cache,
                          cache_note="random values, no prefill", context=args.context, seed=args.seed,
                          moe=moe, experts_resident=pool, experts=c.E),
               protocol=dict(warmup=args.warmup, iters=args.iters, rounds=args.rounds,
                             compile=args.compile, compile_mode=COMPILE_MODES.get(args.compile)),
               cases=out_cases)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        tmp = args.out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(doc, f, indent=1)
        os.replace(tmp, args.out)
        print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
