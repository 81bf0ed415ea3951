#!/usr/bin/env python3
"""Smoke test of bench/peer/peer.py that needs no GPU (a few seconds on CPU):
1. one decode step of the full-width bench model (m3.1 --layers 12, batch 4,
   context 4096) on the meta device, both MoE paths, both cache types: shapes
   are right and the step has no data-dependent host read (a .item(),
   .tolist(), nonzero or data-sized output raises on meta), i.e. nothing in
   it forces a host sync that would break CUDA-graph capture;
2. the byte floor of that model at batch 1 equals the hand count in README.md;
3. peer.py --check (batch vs single, planted error, numpy reference) passes;
4. a tiny CPU bench run writes a JSON with the expected fields."""
import json, os, subprocess, sys, tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import peer  # noqa: E402

meta = torch.device("meta")
c = peer.Cfg("m3.1", 12)
for moe in ("bmm", "grouped"):
    for cache in ("bf16", "fp8"):
        m = peer.Model(c, meta, cache, 4, 4096, 0, moe)
        m.alloc_experts(c.E)
        z = torch.zeros(4, dtype=torch.int64, device=meta)
        nt, lg, rec = m.step(z, z + 4096, torch.arange(4, device=meta))
        assert nt.shape == (4,) and lg.shape == (4, c.V) and lg.dtype == torch.float32
        assert len(rec) == 12 and rec[0].shape == (4, c.nkv, c.kb) and rec[3][1].shape == (16,)
        print(f"ok: m3.1 --layers 12 step on meta, moe {moe}, cache {cache}: no host reads")

sel = torch.arange(17, 33).view(1, 1, 16).expand(1, c.nkv, 16)  # 15 full blocks + the local one
rec = [(sel, torch.arange(4)) if c.mlp[l] == "moe" else sel for l in range(12)]
for cache, el, want in (("bf16", 2, 11_663_470_080), ("fp8", 1, 11_633_571_840)):
    m = peer.Model(c, meta, cache, 1, 4096, 0, "bmm")
    m.alloc_experts(c.E)
    got = peer.step_bytes(m, 1, 4096, rec, el)
    assert got == want, (cache, got, want)
    print(f"ok: byte floor, batch 1, {cache} caches: {got} B (README hand count)")

py = sys.executable
r = subprocess.run([py, os.path.join(HERE, "peer.py"), "--device", "cpu", "--check"], capture_output=True, text=True)
print(r.stdout.strip())
assert r.returncode == 0, r.stderr
with tempfile.TemporaryDirectory() as d:
    out = os.path.join(d, "peer.json")
    r = subprocess.run([py, os.path.join(HERE, "peer.py"), "--device", "cpu", "--tiny", "--batch", "1,2",
                        "--iters", "5", "--warmup", "2", "--rounds", "2", "--out", out],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    doc = json.load(open(out))
    assert [(x["batch"], x["mode"]) for x in doc["cases"]] == [(1, "eager"), (2, "eager")]
    for x in doc["cases"]:
        assert len(x["samples_ms_per_round"]) == 2 and all(len(v) == 5 for v in x["samples_ms_per_round"])
        assert len(x["bytes_per_step"]) == 2 and x["bytes_per_step"][0] > x["bytes_per_step_if_fp8_cache"][0]
    print("ok: tiny CPU bench JSON:", ", ".join(sorted(doc)))
print("smoke: PASS")
