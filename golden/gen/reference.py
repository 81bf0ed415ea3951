#!/usr/bin/env python3
"""Independent numpy reference of MODEL.md: dumps and golden cases.

  reference.py forward --model DIR --tokens 1,2,3 [--kv-dtype bf16|fp8_e4m3|nvfp4]
      [--act bf16|mxfp4] [--selection per_kv_head|shared] [--nvfp4-as-mxfp4]
      [--teacher IN.safetensors] [--greedy N] --dump OUT.safetensors
  reference.py case --model DIR --spec JSON --out-dir golden/cases
  reference.py forward ... --eagle3-steps K   (also the EAGLE3 draft's taps, below)

Taps (same names and layouts as `m3 forward --dump`):
  residual.{l}     F32 [T, H]               after layer l
  topk_blocks.{l}  I32 [kv_heads, T, topk]  sparse layers; ascending, -1 padded
  experts.{l}      I32 [T, top_k]           MoE layers; ascending
  logits           F32 [T, vocab]           (a case may keep only the last rows)
and the near-tie margins of the reference:
  topk_margin.{l}   F32 [kv_heads, T]  block-score gap at the selection boundary
                                       (+inf where every visible block is taken)
  router_margin.{l} F32 [T]            biased score of the k-th minus (k+1)-th expert
Draft cases (spec "draft": {"kind": "eagle3", "steps": K}; the checkpoint
made with `m3 synth --eagle3`) add the EAGLE3 draft's greedy proposal after
the prompt, its input features being the reference's own residual taps
(m3ref/eagle3.py):
  draft.g          F32 [T, H]               fused target features g_j of every prompt row
  draft.hidden     F32 [K, H]               each step's output before the final norm
  draft.logits     F32 [K, draft_vocab]     each step's draft-vocabulary logits
  draft.tokens     I32 [K]                  the proposed target ids (greedy, via d2t)
  draft.logit_gap  F32 [K]                  top-1 minus top-2 draft logit (near ties)
"""

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from m3ref.checkpoint import Checkpoint, read_safetensors, write_safetensors  # noqa: E402
from m3ref.eagle3 import Eagle3  # noqa: E402
from m3ref.model import Model, Options  # noqa: E402


def parse_tokens(s):
    try:
        return [int(x) for x in s.replace(" ", "").split(",") if x]
    except ValueError:
        raise SystemExit(f"error: --tokens: not a comma-separated list of ids: {s!r}")


def load_teacher(path, L):
    t, _ = read_safetensors(path)
    out = {}
    for l in range(L):
        key = f"residual.{l}"
        if key not in t:
            raise SystemExit(f"error: {path}: teacher tensor {key} missing")
        out[l] = t[key][1].astype(np.float32)
    return out


def run_forward(model, tokens, teacher=None):
    caches = model.new_caches()
    return model.forward(tokens, np.arange(len(tokens)), caches, teacher=teacher)


def rel_l2(a, b):
    a = a.astype(np.float64)
    b = b.astype(np.float64)
    den = np.sqrt(np.sum(b * b))
    return float(np.sqrt(np.sum((a - b) ** 2)) / den) if den > 0 else float(np.sqrt(np.sum(a * a)))


def cmd_forward(a):
    ck = Checkpoint(a.model)
    opts = Options(a.kv_dtype, a.act, a.selection, a.nvfp4_as_mxfp4, a.accum, a.online_quant, a.online_quant_exclude)
    m = Model(ck, opts)
    tokens = parse_tokens(a.tokens)
    teacher = load_teacher(a.teacher, ck.config.num_layers) if a.teacher else None
    t0 = time.time()
    taps = run_forward(m, tokens, teacher)
    out = {k: v for k, v in taps.items()}
    out["tokens"] = np.asarray(tokens, dtype=np.int32)
    if a.eagle3_steps:
        ref = Eagle3(a.model, ck.config, m.embed)
        src = teacher if teacher is not None else {l: taps[f"residual.{l}"] for l in range(ck.config.num_layers)}
        feats = np.concatenate([src[l] for l in ref.cfg.layer_ids], axis=-1)
        out.update(draft_taps(ref.propose(tokens, feats, a.eagle3_steps)))
    if a.greedy:
        toks, gaps, rmin, bmin = m.greedy(tokens, a.greedy)
        out["greedy.tokens"] = np.asarray(toks, dtype=np.int32)
        out["greedy.logit_gap"] = np.asarray(gaps, dtype=np.float32)
    write_safetensors(a.dump, out, {"formats": ",".join(m.formats)})
    print(f"reference: {len(tokens)} tokens, {ck.config.num_layers} layers, {time.time() - t0:.2f} s -> {a.dump}")


# ------------------------------------------------------------------- cases


def make_tokens(spec, vocab):
    if "tokens" in spec:
        return [int(t) for t in spec["tokens"]]
    rng = np.random.default_rng(int(spec["token_seed"]))
    return [int(x) for x in rng.integers(0, vocab, size=int(spec["len"]))]


def noise_floor(models, tokens, ref_taps, L):
    """Teacher-forced probes (f32 accumulation in two summation orders)
    against the f64 reference: the rounding noise two correct
    implementations show, per tensor, as the max over the probes."""
    teacher = {l: ref_taps[f"residual.{l}"] for l in range(L)}
    stats = {}
    for model in models:
        probe = run_forward(model, tokens, teacher)
        for k, ref in ref_taps.items():
            if k.startswith("residual.") or k == "logits":
                d = np.abs(probe[k].astype(np.float64) - ref.astype(np.float64))
                s = stats.setdefault(k, {"rel_l2": 0.0, "max_abs": 0.0, "ref_max_abs": float(np.abs(ref).max())})
                s["rel_l2"] = max(s["rel_l2"], rel_l2(probe[k], ref))
                s["max_abs"] = max(s["max_abs"], float(d.max()))
            elif k.startswith("topk_blocks.") or k.startswith("experts."):
                diff = np.any(probe[k] != ref, axis=-1)
                mk = ("topk_margin." if k.startswith("topk") else "router_margin.") + k.split(".")[1]
                gaps = ref_taps[mk][diff]
                s = stats.setdefault(k, {"mismatches": 0, "max_mismatch_gap": None})
                s["mismatches"] = max(s["mismatches"], int(diff.sum()))
                if gaps.size:
                    g = float(gaps.max())
                    s["max_mismatch_gap"] = g if s["max_mismatch_gap"] is None else max(g, s["max_mismatch_gap"])
    return stats


def near_tie(stats):
    """Margins for near-ties: fixed floors, raised to twice the largest gap
    at which the f32-accumulation probe itself flipped a choice."""
    nt = {"router_margin": 1e-3, "topk_margin": 2e-2}
    for k, s in stats.items():
        gap = s.get("max_mismatch_gap")
        if gap is None or k.startswith("draft."):  # the draft's margin is its own
            continue
        key = "topk_margin" if k.startswith("topk_blocks.") else "router_margin"
        nt[key] = max(nt[key], 2 * gap)
    return nt


def tolerances(opts, stats, L):
    """Per-tensor tolerances (see TOLERANCE_NOTE)."""
    tol = {}
    floor_rel = 3e-3 if opts.act == "mxfp4" else 1e-3
    for k in [f"residual.{l}" for l in range(L)] + ["logits"]:
        s = stats[k]
        fr = 3e-4 if k == "logits" else floor_rel
        # 4 bf16 ulps at the tensor's largest magnitude (2^-8 each), or 2 for logits.
        fa = s["ref_max_abs"] * (2.0 ** -7 if k == "logits" else 2.0 ** -6)
        tol[k] = {"rel_l2": max(fr, 4 * s["rel_l2"]), "max_abs": max(fa, 4 * s["max_abs"])}
    return tol


TOLERANCE_NOTE = (
    "Every tap passes bf16 rounding points (h, q/k after RoPE, attention output, linear "
    "outputs; FP4 codes too with mxfp4 activations): a last-bit difference of an f32 sum "
    "flips a bf16 (2^-8 relative) now and then, and a flip in a cached k/v row reaches every "
    "later row. So the per-tensor bound is max(floor, 4x the noise measured here: the f64 "
    "reference against itself with f32 sums in two orders, teacher-forced). Floors: rel-L2 1e-3 "
    "(3e-3 with mxfp4 activations, where a flip moves a whole FP4 step) for residuals, 3e-4 for "
    "logits (an f32 GEMM on a bf16 input: one flipped element of the final norm output moves a "
    "row by ~2^-8/sqrt(H)); max-abs 4 bf16 ulps of the tensor's largest value (2 for logits). "
    "An f32-only path would hold rel-L2 ~1e-5."
)


DRAFT_TENSORS = ("g", "hidden", "logits")


def draft_taps(prop):
    """The draft tensors of a proposal (m3ref/eagle3.py) by tap name."""
    return {f"draft.{k}": prop[k] for k in DRAFT_TENSORS + ("tokens", "logit_gap")}


def draft_case(ck, model, taps, tokens, spec):
    """The reference's EAGLE3 proposal for a draft case, its noise floor
    and tolerances.  Returns (tensors, sidecar entry, tolerances, stats)."""
    if spec.get("kind") != "eagle3":
        raise ValueError(f"draft kind {spec.get('kind')!r}: only eagle3 draft cases exist")
    n = int(spec["steps"])
    ref = Eagle3(ck.path, ck.config, model.embed)
    if not 1 <= n <= ref.cfg.max_draft_tokens:
        raise ValueError(f"draft steps {n}: must be 1..{ref.cfg.max_draft_tokens} (max_draft_tokens)")
    feats = ref.features(taps)
    prop = ref.propose(tokens, feats, n)
    # Noise probes: f32 sums in two orders on the reference's own features,
    # following the reference's tokens (a flipped token is counted, with the
    # reference's gap at it, instead of sending the probe elsewhere).
    stats = {}
    for acc in ("f32", "f32_reversed"):
        probe = Eagle3(ck.path, ck.config, model.embed, accum=acc).propose(tokens, feats, n, forced=prop["tokens"])
        for k in DRAFT_TENSORS:
            a, b = probe[k], prop[k]
            s = stats.setdefault(f"draft.{k}", {"rel_l2": 0.0, "max_abs": 0.0, "ref_max_abs": float(np.abs(b).max())})
            s["rel_l2"] = max(s["rel_l2"], rel_l2(a, b))
            s["max_abs"] = max(s["max_abs"], float(np.abs(a.astype(np.float64) - b.astype(np.float64)).max()))
        diff = probe["tokens"] != prop["tokens"]
        s = stats.setdefault("draft.tokens", {"mismatches": 0, "max_mismatch_gap": None})
        s["mismatches"] = max(s["mismatches"], int(diff.sum()))
        if diff.any():
            g = float(prop["logit_gap"][diff].max())
            s["max_mismatch_gap"] = g if s["max_mismatch_gap"] is None else max(g, s["max_mismatch_gap"])
    tol = {}
    for k in DRAFT_TENSORS:
        s = stats[f"draft.{k}"]
        fr = 3e-4 if k == "logits" else 1e-3
        fa = s["ref_max_abs"] * (2.0 ** -7 if k == "logits" else 2.0 ** -6)
        tol[f"draft.{k}"] = {"rel_l2": max(fr, 4 * s["rel_l2"]), "max_abs": max(fa, 4 * s["max_abs"])}
    # Two correct logits rows may each move by the logits tolerance.
    margin = 2 * tol["draft.logits"]["max_abs"]
    if stats["draft.tokens"]["max_mismatch_gap"] is not None:
        margin = max(margin, 2 * stats["draft.tokens"]["max_mismatch_gap"])
    entry = {
        "kind": "eagle3",
        "steps": n,
        "target_layer_ids": ref.cfg.layer_ids,
        "draft_vocab_size": ref.cfg.draft_vocab_size,
        "token_margin": margin,
        "min_logit_gap": float(prop["logit_gap"].min()),
        "note": DRAFT_NOTE,
    }
    return draft_taps(prop), entry, tol, stats


DRAFT_NOTE = (
    "EAGLE3 draft (ARCHITECTURE.md, EAGLE3 draft), greedy, K steps after the prompt, fed the "
    "reference's own residual taps of target_layer_ids (teacher-forced: a backend is judged on "
    "the draft alone). draft.g, draft.hidden and draft.logits have tolerances derived like the "
    "model's (max(floor, 4x the f32-vs-f64 noise)); draft.tokens are exact except at a step whose "
    "reference top-2 gap (draft.logit_gap) is below token_margin; after such a near-tie the later "
    "steps follow another token and are not compared."
)


def finite_json(x):
    """JSON has no Infinity/NaN: non-finite floats become null."""
    if isinstance(x, dict):
        return {k: finite_json(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [finite_json(v) for v in x]
    if isinstance(x, (float, np.floating)):
        return float(x) if np.isfinite(x) else None
    if isinstance(x, np.integer):
        return int(x)
    return x


def cmd_case(a):
    spec = json.loads(a.spec)
    name = spec["name"]
    o = spec.get("options", {})
    opts = Options(
        o.get("kv_dtype", "bf16"),
        o.get("act", "bf16"),
        o.get("selection", "per_kv_head"),
        bool(o.get("nvfp4_as_mxfp4", False)),
        online_quant=o.get("online_quant", ""),
        online_quant_exclude=o.get("online_quant_exclude", ""),
    )
    ck = Checkpoint(a.model)
    cfg = ck.config
    L = cfg.num_layers
    t0 = time.time()
    m = Model(ck, opts)
    tokens = make_tokens(spec["prompt"], cfg.vocab_size)
    T = len(tokens)
    taps = run_forward(m, tokens)
    t_fwd = time.time() - t0
    probes = [
        Model(
            ck,
            Options(
                opts.kv_dtype, opts.act, opts.selection, opts.nvfp4_as_mxfp4, acc, opts.online_quant, opts.online_quant_exclude
            ),
        )
        for acc in ("f32", "f32_reversed")
    ]
    stats = noise_floor(probes, tokens, taps, L)
    keep = int(spec.get("logits_rows", T))
    keep = min(keep, T)
    tol = tolerances(opts, stats, L)
    out = dict(taps)
    out["logits"] = taps["logits"][T - keep :]
    out["tokens"] = np.asarray(tokens, dtype=np.int32)
    draft_entry = None
    if "draft" in spec:
        dt, draft_entry, dtol, dstats = draft_case(ck, m, taps, tokens, spec["draft"])
        out.update(dt)
        tol.update(dtol)
        stats.update(dstats)
    sidecar = {
        "name": name,
        "description": spec.get("description", ""),
        "recipe": spec["recipe"],
        "config_edit": spec.get("config_edit"),
        "scalar_tensors": spec.get("scalar_tensors"),
        "options": {
            "kv_dtype": opts.kv_dtype,
            "act": opts.act,
            "selection": opts.selection,
            "nvfp4_as_mxfp4": opts.nvfp4_as_mxfp4,
            **({"online_quant": opts.online_quant} if opts.online_quant else {}),
            **({"online_quant_exclude": opts.online_quant_exclude} if opts.online_quant_exclude else {}),
        },
        "tokens": tokens,
        "num_layers": L,
        "attn_kinds": cfg.attn_kinds,
        "mlp_kinds": cfg.mlp_kinds,
        "weight_formats": m.formats,
        "logits_rows_from": T - keep,
        "tolerances": tol,
        "near_tie": near_tie(stats),
        "near_tie_note": "a discrete mismatch (a head-row of topk_blocks.{l} or a row of experts.{l}) "
        "is a near-tie when the reference's own gap there (topk_margin.{l} in block-score units, "
        "router_margin.{l} in biased-sigmoid units) is below these margins: a bf16 flip of one "
        "element of h, iq or ik moves a score by about 2^-8 of one product term",
        "noise_floor_f32_vs_f64": stats,
        "tolerance_note": TOLERANCE_NOTE,
        "generator": "golden/gen/reference.py (numpy, f64 sums, written from MODEL.md/FORMATS.md)",
    }
    if draft_entry is not None:
        sidecar["draft"] = draft_entry
    if "logits_rows" in spec and keep < T:
        sidecar["logits_note"] = f"logits kept for the last {keep} of {T} rows (case size)"
    g = int(spec.get("greedy", 0))
    if g:
        toks, gaps, rmin, bmin = m.greedy(tokens, g)
        sidecar["greedy"] = {"n": g, "tokens": toks, "logit_gap": gaps, "min_router_margin": rmin, "min_topk_margin": bmin}
    for l in range(L):
        for key in (f"topk_margin.{l}", f"router_margin.{l}"):
            if key in taps:
                v = taps[key]
                fin = v[np.isfinite(v)]
                sidecar.setdefault("margin_summary", {})[key] = float(fin.min()) if fin.size else None
    os.makedirs(a.out_dir, exist_ok=True)
    write_safetensors(os.path.join(a.out_dir, name + ".safetensors"), out, {"case": name})
    jp = os.path.join(a.out_dir, name + ".json")
    tmp = jp + f".tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(finite_json(sidecar), f, indent=1)
        f.write("\n")
    os.replace(tmp, jp)
    worst = max(stats[f"residual.{l}"]["rel_l2"] for l in range(L))
    extra = ""
    if draft_entry is not None:
        extra = f", eagle3 draft {draft_entry['steps']} steps -> {out['draft.tokens'].tolist()}"
    print(f"case {name}: T={T}, formats {','.join(m.formats)}, forward {t_fwd:.2f} s, noise floor rel-L2 <= {worst:.2e}{extra}")


def cmd_op_ptpc(a):
    """The op-level PTPC FP8 case (ARCHITECTURE.md, Online quantization):
    inputs x (bf16 values; a zero row, a row with a NaN, rows spanning many
    binades) and a weight w (bf16 values; a zero row, rows whose w / sw land
    on E4M3 rounding ties), and the expected weight codes and scales,
    activation codes and scales, and outputs before and after bf16
    rounding, all from m3ref.formats (numpy + ml_dtypes)."""
    from m3ref import formats as F

    rng = np.random.default_rng(20251017)
    T, K, N = 6, 96, 40
    x = rng.standard_normal((T, K)) * np.exp2(rng.integers(-6, 7, size=(T, 1)))
    x[2] = 0.0
    x[4, 5] = np.nan
    x[5] *= np.exp2(rng.integers(-20, 4, size=K))  # many binades in one row
    x = F.bf16(x)
    w = rng.standard_normal((N, K)) * np.exp2(rng.integers(-12, 2, size=(N, 1)))
    w[3] = 0.0
    # Ties: amax 448 * 2^-4 gives sw = 2^-4 exactly; E4M3 midpoints then tie.
    for r, e in ((7, -4), (8, 0)):
        w[r] = F.e4m3_roundtrip(rng.standard_normal(K) * 8) * np.exp2(e)
        w[r, 0] = 448.0 * np.exp2(e)
        w[r, 1:9] = np.array([1.0625, 1.1875, 2.125, 2.375, -1.0625, -17.0, 0.0048828125, -0.0146484375]) * np.exp2(e)
    w = F.bf16(w)
    qw, sw = F.ptpc_quantize(w)
    finite = np.all(np.isfinite(x), axis=-1)
    qa, sa = F.ptpc_quantize(np.where(finite[:, None], x, 0).astype(np.float32))
    y = F.ptpc_linear(x, qw, sw)
    out = {
        "x": x.astype(np.float32),
        "w": w.astype(np.float32),
        "w_codes": qw,
        "w_scales": sw,
        "x_codes": qa,
        "x_scales": sa,
        "x_finite": finite.astype(np.uint8),
        "y_f32": y,
        "y_bf16": F.bf16(y),
    }
    write_safetensors(a.out, out, {"case": "op-ptpc-linear", "generator": "golden/gen/reference.py op-ptpc"})
    print(f"op-ptpc: x [{T}, {K}], w [{N}, {K}] -> {a.out}")


def cmd_op_nvfp4_cache(a):
    """The op-level NVFP4 KV-cache case (ARCHITECTURE.md, NVFP4 KV cache):
    rows x [R, 64] (four blocks of 16 each) with a global scale g [R] per
    row (each row stands for its own cache tensor), and the expected packed
    E2M1 codes [R, 32], E4M3 block scales [R, 4] and reads [R, 64], all from
    m3ref.formats (numpy + ml_dtypes).  Rows 0-4 are chosen blocks (ties,
    zero and underflowing blocks, a saturated scale, a scale that rounds
    down, NaN / Inf blocks); the rest are random, bf16 (as the model caches)
    or full f32, across many binades and global scales."""
    from m3ref import formats as F

    W = 64
    ties = [6, 3, -1.5, 0.75, 0.25, 0.2, -0.0, 5, 2.5, 3.5, 1.25, 1.75, -6, 0, 0.5, 4]
    rows, gs = [], []

    def row(blocks, g):
        r = np.concatenate([np.asarray(b, dtype=np.float64) for b in blocks])
        assert r.size == W
        rows.append(r)
        gs.append(g)

    rng = np.random.default_rng(20251104)
    z = np.zeros(16)
    # 0: E2M1 ties at s = 1 (bamax 6), a block at s = 2^-3, two random blocks
    row([ties, [0.75, 0.3, -0.1875] + [0.0] * 13, rng.standard_normal(16), rng.standard_normal(16) * 100], 1.0)
    # 1: the same ties with a non-power-of-two global (g = 3: s = 1 again)
    row([np.array(ties) * 3, np.array(ties) * 0.75, rng.standard_normal(16) * 3, z], 3.0)
    # 2: all zero; bamax / 6 below half the least E4M3 subnormal (s -> 0);
    #    exactly on it (2^-10: ties to 0); just past it (s = 2^-9)
    tiny = rng.uniform(-1, 1, 16) * 0.005
    edge = np.zeros(16)
    edge[3] = 6 * 2.0 ** -10
    edge[4] = -2.0 ** -12
    past = rng.uniform(-1, 1, 16) * 2.0 ** -8
    past[0] = 2.0 ** -7
    row([z, tiny, edge, past], 1.0)
    # 3: a saturated scale (bamax / 6 past 448), a scale that rounds down so
    #    the block's amax saturates to 6 (bamax / 6 = 1.0625 ties to 1.0), an
    #    E4M3 tie that rounds up (1.1875 -> 1.25), and -0.0 kept in a live block
    sat = [3000, 100, -2688, 1000, 448, -1e5] + [0.0] * 10
    down = [6.375, -3.1875, 1.0] + [0.0] * 13
    up = [6 * 1.1875, 2.0, -1.0] + [0.0] * 13
    negz = [-0.0, 1.0, -0.0, -2.0] + [0.5] * 12
    row([sat, down, up, negz], 1.0)
    # 4: NaN, +Inf and -Inf blocks beside a finite one (g = 0.25)
    nanb = rng.standard_normal(16)
    nanb[5] = np.nan
    infb = rng.standard_normal(16)
    infb[0] = np.inf
    ninfb = rng.standard_normal(16)
    ninfb[15] = -np.inf
    row([nanb, infb, ninfb, rng.standard_normal(16)], 0.25)
    # 5..: random rows: binades 2^-24 .. 2^12 per block, global scales from
    #      tiny to large, bf16 values (as cached) and raw f32 values
    for i, g in enumerate([1.0, 0.25, 2.0 ** -20, 0.1, 7.3, 1e-3, 1e3, 0.0625, 1.7, 1.0, 5e-2]):
        blocks = [rng.standard_normal(16) * np.exp2(rng.integers(-24, 13)) for _ in range(4)]
        r = np.concatenate(blocks)
        row([F.bf16(r) if i % 2 == 0 else r.astype(np.float32)], g)
    x = np.stack(rows).astype(np.float32)
    g = np.asarray(gs, dtype=np.float32)
    codes = np.zeros((len(rows), W // 2), np.uint8)
    scales = np.zeros((len(rows), W // 16), np.uint8)
    y = np.zeros((len(rows), W), np.float32)
    for i in range(len(rows)):
        codes[i], scales[i] = F.nvfp4_cache_quantize(x[i], g[i])
        y[i] = F.nvfp4_cache_dequant(codes[i], scales[i], g[i])
    out = {"x": x, "g": g, "codes": codes, "scales": scales, "y": y}
    write_safetensors(a.out, out, {"case": "op-nvfp4-cache", "generator": "golden/gen/reference.py op-nvfp4-cache"})
    print(f"op-nvfp4-cache: x [{len(rows)}, {W}] -> {a.out}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("forward")
    f.add_argument("--model", required=True)
    f.add_argument("--tokens", required=True)
    f.add_argument("--kv-dtype", default="bf16", choices=["bf16", "fp8_e4m3", "nvfp4"])
    f.add_argument("--act", default="bf16", choices=["bf16", "mxfp4"])
    f.add_argument("--selection", default="per_kv_head", choices=["per_kv_head", "shared"])
    f.add_argument("--nvfp4-as-mxfp4", action="store_true")
    f.add_argument("--accum", default="f64", choices=["f64", "f32", "f32_reversed"])
    f.add_argument("--online-quant", default="", choices=["", "ptpc_fp8"])
    f.add_argument("--online-quant-exclude", default="")
    f.add_argument("--teacher")
    f.add_argument("--greedy", type=int, default=0)
    f.add_argument("--eagle3-steps", type=int, default=0, help="also the EAGLE3 draft's K-step greedy proposal")
    f.add_argument("--dump", required=True)
    c = sub.add_parser("case")
    c.add_argument("--model", required=True)
    c.add_argument("--spec", required=True, help="the case's JSON spec (golden/gen/cases.json entry)")
    c.add_argument("--out-dir", required=True)
    op = sub.add_parser("op-ptpc", help="write the op-level PTPC FP8 linear case")
    op.add_argument("--out", required=True, help="OUT.safetensors")
    opn = sub.add_parser("op-nvfp4-cache", help="write the op-level NVFP4 KV-cache case")
    opn.add_argument("--out", required=True, help="OUT.safetensors")
    a = p.parse_args()
    try:
        {"forward": cmd_forward, "case": cmd_case, "op-ptpc": cmd_op_ptpc, "op-nvfp4-cache": cmd_op_nvfp4_cache}[
            a.cmd
        ](a)
    except (ValueError, KeyError, OSError) as e:
        raise SystemExit(f"error: {e}")


if __name__ == "__main__":
    main()
