#!/usr/bin/env python3
"""Self-test of the numpy reference on a `tiny` checkpoint written here (so it
does not depend on `m3 synth`).  Checks:
  - the codecs against ml_dtypes (E2M1 / E4M3 rounding) and the FORMATS.md tie table,
    and the NVFP4 KV-cache codec against ml_dtypes' casts;
  - every weight format round-trips through the writer's quantizer and the
    reader's decoder within its quantization error;
  - prefill of T tokens equals prefill of T-1 then one decode step (last row);
  - teacher forcing with the reference's own residuals reproduces its taps;
  - sparse selection engages past block*topk tokens and differs from all blocks;
  - a planted error in a teacher residual changes exactly the next layer on.
Run: .venv/bin/python golden/gen/selftest.py
"""

import json
import os
import sys
import tempfile

import ml_dtypes
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from m3ref import formats as F  # noqa: E402
from m3ref.checkpoint import Checkpoint, write_safetensors  # noqa: E402
from m3ref.model import Model, Options  # noqa: E402

TINY = dict(
    hidden_size=128, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2, head_dim=32,
    rotary_dim=16, rope_theta=10000.0, vocab_size=512, rms_norm_eps=1e-6, num_local_experts=8,
    num_experts_per_tok=2, intermediate_size=64, shared_intermediate_size=64, dense_intermediate_size=256,
    first_k_dense=1, routed_scaling_factor=2.0, swiglu_alpha=1.702, swiglu_limit=7.0, index_n_heads=2,
    index_head_dim=32, index_block_size=16, index_topk_blocks=4, index_local_blocks=1, index_init_blocks=0,
)


def write_tiny(dirpath, experts="bf16", dense="bf16", seed=0, hf_spelling=False):
    rng = np.random.default_rng(seed)
    c = TINY
    H, L = c["hidden_size"], c["num_hidden_layers"]
    t = {}
    originals = {}
    P = "language_model.model."

    def put_linear(name, out, inn, fmt):
        w = (rng.standard_normal((out, inn)) / np.sqrt(inn)).astype(np.float32)
        originals[name] = w
        if fmt == "bf16":
            t[name + ".weight"] = w.astype(F.BF16)
        elif fmt == "mxfp8":
            raw, s = F.mx_quantize_generic(w, "e4m3")
            t[name + ".weight"] = ("F8_E4M3", raw)
            t[name + ".weight_scale_inv"] = s
        elif fmt == "mxfp4":
            packed, s = F.mx_quantize_generic(w, "fp4")
            t[name + ".weight"] = packed
            t[name + ".weight_scale"] = s
        elif fmt == "nvfp4":
            packed, s, g = F.nvfp4_quantize(w)
            t[name + ".weight"] = packed
            t[name + ".weight_scale"] = ("F8_E4M3", s)
            t[name + ".weight_scale_2"] = np.array([g], dtype=np.float32).reshape(())
            t[name + ".input_scale"] = np.array([1.0], dtype=np.float32).reshape(())
        return w

    def norm(name, n):
        t[name] = (0.1 * rng.standard_normal(n)).astype(F.BF16)

    t[P + "embed_tokens.weight"] = rng.standard_normal((c["vocab_size"], H)).astype(F.BF16)
    t["language_model.lm_head.weight"] = (rng.standard_normal((c["vocab_size"], H)) / np.sqrt(H)).astype(F.BF16)
    norm(P + "norm.weight", H)
    d, nh, kvh = c["head_dim"], c["num_attention_heads"], c["num_key_value_heads"]
    for l in range(L):
        p = f"{P}layers.{l}."
        norm(p + "input_layernorm.weight", H)
        norm(p + "post_attention_layernorm.weight", H)
        put_linear(p + "self_attn.q_proj", nh * d, H, dense)
        put_linear(p + "self_attn.k_proj", kvh * d, H, dense)
        put_linear(p + "self_attn.v_proj", kvh * d, H, dense)
        put_linear(p + "self_attn.o_proj", H, nh * d, dense)
        norm(p + "self_attn.q_norm.weight", d)
        norm(p + "self_attn.k_norm.weight", d)
        di = c["index_head_dim"]
        put_linear(p + "self_attn.index_q_proj", c["index_n_heads"] * di, H, dense)
        put_linear(p + "self_attn.index_k_proj", di, H, dense)
        norm(p + "self_attn.index_q_norm.weight", di)
        norm(p + "self_attn.index_k_norm.weight", di)
        if l < c["first_k_dense"]:
            w = c["dense_intermediate_size"]
            put_linear(p + "mlp.gate_proj", w, H, dense)
            put_linear(p + "mlp.up_proj", w, H, dense)
            put_linear(p + "mlp.down_proj", H, w, dense)
        else:
            m = p + "block_sparse_moe."
            E, w = c["num_local_experts"], c["intermediate_size"]
            t[m + "gate.weight"] = (rng.standard_normal((E, H)) / np.sqrt(H) * 3).astype(np.float32)
            t[m + "e_score_correction_bias"] = (0.01 * rng.standard_normal(E)).astype(np.float32)
            for e in range(E):
                put_linear(m + f"experts.{e}.w1", w, H, experts)
                put_linear(m + f"experts.{e}.w3", w, H, experts)
                put_linear(m + f"experts.{e}.w2", H, w, experts)
            sw = c["shared_intermediate_size"]
            put_linear(m + "shared_experts.gate_proj", sw, H, dense)
            put_linear(m + "shared_experts.up_proj", sw, H, dense)
            put_linear(m + "shared_experts.down_proj", H, sw, dense)
    os.makedirs(dirpath, exist_ok=True)
    names = sorted(t)
    half = len(names) // 2
    wm = {}
    for i, chunk in enumerate((names[:half], names[half:])):
        fn = f"model-{i + 1:05d}-of-00002.safetensors"
        write_safetensors(os.path.join(dirpath, fn), {n: t[n] for n in chunk})
        wm.update({n: fn for n in chunk})
    with open(os.path.join(dirpath, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": wm}, f)
    cfg = dict(c)
    if hf_spelling:
        cfg = {k: v for k, v in c.items() if not k.startswith("index_") and k != "first_k_dense"}
        cfg["mlp_layer_types"] = ["dense" if l < c["first_k_dense"] else "sparse" for l in range(L)]
        cfg["layer_types"] = ["minimax_m3_sparse"] * L
        cfg["sparse_attention_config"] = {
            "sparse_num_index_heads": 2, "sparse_index_dim": 32, "sparse_block_size": 16,
            "sparse_topk_blocks": 4, "sparse_local_block": 1, "sparse_init_block": 0,
        }
        cfg = {"model_type": "minimax_m3_vl", "text_config": cfg}
    with open(os.path.join(dirpath, "config.json"), "w") as f:
        json.dump(cfg, f)
    return originals


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        check.failed = True


check.failed = False


def test_codecs():
    x = np.linspace(-7, 7, 20001)
    mine = F.e2m1_decode(F.e2m1_encode_sat(x))
    ref = np.clip(x, -6, 6).astype(ml_dtypes.float4_e2m1fn).astype(np.float64)
    check(np.array_equal(mine, ref), "E2M1 saturating RNE encode equals ml_dtypes on [-7, 7]")
    ties = {0.25: 0, 0.75: 1, 1.25: 1, 1.75: 2, 2.5: 2, 3.5: 4, 5.0: 4}
    check(all(F.e2m1_decode(F.e2m1_encode_sat(np.array([k])))[0] == v for k, v in ties.items()), "E2M1 tie table of FORMATS.md")
    check(F.e4m3_roundtrip(np.array([464.0, 480.0, -1e9]))[0] == 448 and F.e4m3_roundtrip(np.array([-1e9]))[0] == -448,
          "E4M3 464 -> 448 and saturation")
    check(F.e8m0_decode(np.array([0]))[0] == 2.0 ** -127, "E8M0 0x00 = 2^-127")
    # even rule: amax 6.5 (mantissa 1.625) stays at e = 2-2 = 0; amax 7 (1.75) carries to e = 1.
    check(F.mx_exponent(np.float32(6.5), 2, 1)[()] == 0 and F.mx_exponent(np.float32(7.0), 2, 1)[()] == 1,
          "MX even rule raises the scale when amax would clip")
    check(F.mx_exponent(np.float32(7.0), 2, 1, "floor")[()] == 0, "MX floor rule")
    test_nvfp4_cache()


def test_nvfp4_cache():
    """The NVFP4 KV-cache codec against a second computation through
    ml_dtypes' float4_e2m1fn and float8_e4m3fn casts (per element, f64)."""
    rng = np.random.default_rng(5)
    for g in (1.0, 0.375, 3.0, 2.0 ** -20, 1e3):
        x = (rng.standard_normal((64, 32)) * np.exp2(rng.integers(-30, 14, size=(64, 2)).repeat(16, axis=1))).astype(np.float32)
        x[0, :16] = 0.0
        x[1, 3] = np.nan
        x[2, 20] = -np.inf
        g32 = float(np.float32(g))
        want = np.empty_like(x)
        for r in range(x.shape[0]):
            for b in range(2):
                blk = x[r, 16 * b : 16 * (b + 1)].astype(np.float64)
                if not np.all(np.isfinite(blk)):
                    want[r, 16 * b : 16 * (b + 1)] = np.nan
                    continue
                s = float(np.array(min(np.abs(blk).max() / (6 * g32), 448.0)).astype(ml_dtypes.float8_e4m3fn).astype(np.float64))
                if s == 0:
                    want[r, 16 * b : 16 * (b + 1)] = 0.0
                    continue
                q = np.clip(blk / (g32 * s), -6, 6).astype(ml_dtypes.float4_e2m1fn).astype(np.float64)
                want[r, 16 * b : 16 * (b + 1)] = (q * s * g32).astype(np.float32)
        got = F.nvfp4_cache_roundtrip(x, g)
        same = np.array_equal(np.isnan(got), np.isnan(want)) and np.array_equal(got[~np.isnan(got)], want[~np.isnan(want)])
        check(same, f"NVFP4 cache codec equals ml_dtypes' E2M1 / E4M3 casts (g = {g})")


def main():
    test_codecs()
    with tempfile.TemporaryDirectory() as tmp:
        for fmt in ("bf16", "mxfp8", "mxfp4", "nvfp4"):
            d = os.path.join(tmp, fmt)
            orig = write_tiny(d, experts=fmt, dense="mxfp8" if fmt != "bf16" else "bf16", hf_spelling=(fmt == "mxfp4"))
            ck = Checkpoint(d)
            w, f = ck.linear("model.layers.1.block_sparse_moe.experts.0.w1")
            rng_w = orig["language_model.model.layers.1.block_sparse_moe.experts.0.w1"]
            err = np.linalg.norm(w - rng_w) / np.linalg.norm(rng_w)
            bound = {"bf16": 4e-3, "mxfp8": 0.05, "mxfp4": 0.25, "nvfp4": 0.2}[fmt]
            check(f == fmt and err < bound, f"{fmt} expert weight decodes within its quantization error ({err:.3g})")
            extra = (Options(kv_dtype="nvfp4"),) if fmt == "bf16" else ()
            for opts in (Options(), Options(kv_dtype="fp8_e4m3", act="mxfp4", selection="shared",
                                             nvfp4_as_mxfp4=(fmt == "nvfp4"))) + extra:
                model_checks(ck, fmt, opts)
    if check.failed:
        raise SystemExit("selftest FAILED")
    print("selftest passed")


def model_checks(ck, fmt, opts):
    tag = f"[{fmt} kv={opts.kv_dtype} act={opts.act} sel={opts.selection} nv->mx={opts.nvfp4_as_mxfp4}]"
    m = Model(ck, opts)
    L = ck.config.num_layers
    rng = np.random.default_rng(1)
    toks = [int(x) for x in rng.integers(0, 512, 100)]
    full = m.forward(toks, np.arange(100), m.new_caches())
    caches = m.new_caches()
    m.forward(toks[:99], np.arange(99), caches)
    step = m.forward(toks[99:], np.array([99]), caches)
    worst = max(
        np.linalg.norm(step[f"residual.{l}"][0] - full[f"residual.{l}"][99]) / np.linalg.norm(full[f"residual.{l}"][99])
        for l in range(L)
    )
    check(worst < 1e-6, f"{tag} prefill(100) == prefill(99)+decode(1) on the last row (rel {worst:.2e})")
    same_disc = all(
        np.array_equal(step[k][..., 0, :] if k.startswith("topk") else step[k][0], full[k][..., 99, :] if k.startswith("topk") else full[k][99])
        for k in full if k.startswith("topk_blocks.") or k.startswith("experts.")
    )
    check(same_disc, f"{tag} prefill and decode choose the same blocks and experts")
    teacher = {l: full[f"residual.{l}"] for l in range(L)}
    tf = m.forward(toks, np.arange(100), m.new_caches(), teacher=teacher)
    check(all(np.array_equal(tf[k], full[k]) for k in full), f"{tag} teacher forcing with own residuals reproduces every tap")
    sel = full["topk_blocks.1"]
    engaged = np.any(sel[:, 99, :] != np.arange(4)) and np.all(sel[:, 99] >= 0) and sel[0, 99, -1] == 6
    check(bool(engaged), f"{tag} sparse selection engaged at row 99 (blocks {sel[:, 99].tolist()}, local block 6 forced)")
    check(bool(np.all(sel[:, 10, 1:] == -1) and np.all(sel[:, 10, 0] == 0)), f"{tag} row 10 sees only block 0 (-1 padded)")
    planted = dict(teacher)
    planted[1] = teacher[1].copy()
    planted[1][5] += 1.0
    pf = m.forward(toks, np.arange(100), m.new_caches(), teacher=planted)
    changed = [l for l in range(L) if not np.array_equal(pf[f"residual.{l}"], full[f"residual.{l}"])]
    check(changed == [2], f"{tag} planted error in teacher residual.1 changes only residual.2 ({changed})")


if __name__ == "__main__":
    main()
