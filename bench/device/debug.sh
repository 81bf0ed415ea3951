#!/usr/bin/env bash
# H200 debugging run (session 3): the GPU against itself (decode vs prefill,
# per kernel variant and graph use), parity with direct launches, and the
# op harness's per-layer differences under teacher forcing.
set -u
BIN=${BIN:-/tmp/bin}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export REQUIRE_GPU=1 M3_KERNEL_CACHE=/tmp/m3-kernels XDG_CACHE_HOME=/tmp/xdg
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
M3=$BIN/m3
CK=/tmp/ck
mkdir -p $CK
synth() { [ -e "$CK/$1/config.json" ] || $M3 synth --preset "$2" --experts "$3" --dense "$4" --out "$CK/$1" --draft-layers 0 -q; }
step() { echo; echo "=== $* ($(date +%T))"; }
{
  step "decode vs prefill"
  timeout 200 $BIN/test-runner decode_matches_prefill --nocapture --test-threads=1 2>&1 | tail -40
} > "$OUT/consistency.log" 2>&1
{
  synth tiny-mx tiny mxfp4 mxfp8
  synth small-mx small mxfp4 mxfp8
  for eager in "" "--enforce-eager"; do
    step "parity small-mx $eager"
    timeout 100 $M3 parity --model $CK/small-mx --reference cpu --backend gpu --prompts 4 --max-tokens 24 $eager 2>&1 | grep -E "^prompt|^parity" | cut -c1-400
  done
  TOK=$(python3 -c "print(','.join(str((i*7919+13)%512) for i in range(40)))")
  for m in tiny-mx small-mx; do
    for be in gpu-ops gpu; do
      step "forward --teacher $m backend $be"
      $M3 forward --model $CK/$m --tokens "$TOK" --backend cpu --dump /tmp/cpu.st --diagnose >/dev/null &&
      $M3 forward --model $CK/$m --tokens "$TOK" --backend $be --teacher /tmp/cpu.st --dump /tmp/gpu.st --diagnose >/dev/null &&
      $M3 forward --model $CK/$m --tokens "$TOK" --backend cpu --teacher /tmp/cpu.st --dump /tmp/cpu2.st --diagnose >/dev/null &&
      python3 - <<'PY'
import numpy as np
from safetensors.numpy import load_file
c, g = load_file("/tmp/cpu2.st"), load_file("/tmp/gpu.st")
def rel(a, b):
    a = a.astype(np.float64); b = b.astype(np.float64)
    return float(np.linalg.norm(b - a) / max(np.linalg.norm(a), 1e-300))
out = []
for k in sorted(c, key=lambda s: (int(s.split('.')[1]) if '.' in s else 99, s)):
    if k in g and c[k].dtype == np.float32:
        out.append(f"{k} {rel(c[k], g[k]):.2e}")
    elif k in g:
        out.append(f"{k} ids-differ {int((c[k] != g[k]).sum())}")
print("; ".join(out))
PY
    done
  done
} > "$OUT/debug.log" 2>&1
echo done
