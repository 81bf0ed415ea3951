#!/usr/bin/env bash
# H200 validation of the GPU runner (bench/NOTES.md, session 3): the GPU
# test binaries under REQUIRE_GPU=1, golden through `m3 forward --backend
# gpu`, `m3 parity` on tiny and small in every weight format, per-layer
# teacher-forced rel-L2 of gpu vs cpu, and `m3 generate` on the GPU.
#
# Run from the repo root on the device with the carried binaries unpacked
# in $BIN (see bench/device/pack.sh). Logs go to $OUT (at most 8 files).
set -u
BIN=${BIN:-/tmp/bin}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export REQUIRE_GPU=1 M3_KERNEL_CACHE=/tmp/m3-kernels XDG_CACHE_HOME=/tmp/xdg
# the test binaries find spec vectors and golden cases by their build path
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
M3=$BIN/m3
step() { echo; echo "=== $* ($(date +%T))"; }
# SECTIONS picks what runs (default: all): tests golden parity forward generate
SECTIONS=${SECTIONS:-tests golden parity forward generate}
want() { case " $SECTIONS " in *" $1 "*) return 0 ;; esac; return 1; }

want tests && {
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw,clocks_throttle_reasons.active --format=csv
  for t in ${TESTS:-runner sampling compile ops formats spec_vectors backend_ops}; do
    step "test $t"
    timeout 120 "$BIN/test-$t" --test-threads=1 --nocapture 2>&1 | grep -v "^test .* ok$" | tail -80
    echo "exit ${PIPESTATUS[0]}"
  done
} > "$OUT/tests.log" 2>&1

want golden && {
  step "golden --backend gpu"
  M3_BIN=$M3 M3_ROOT=$PWD timeout 400 "$BIN/xtask" golden --backend gpu 2>&1 | tail -60
  echo "exit ${PIPESTATUS[0]}"
} > "$OUT/golden.log" 2>&1

CK=/tmp/ck
mkdir -p $CK
synth() { # name preset experts dense [draft-layers]
  [ -e "$CK/$1/config.json" ] || $M3 synth --preset "$2" --experts "$3" --dense "$4" --out "$CK/$1" --draft-layers "${5:-0}" -q
}
if want parity || want forward || want generate; then
  {
    synth tiny-mx tiny mxfp4 mxfp8 2
    synth tiny-nv tiny nvfp4 mxfp8
    synth tiny-bf tiny bf16 bf16
    synth small-mx small mxfp4 mxfp8
    synth small-nv small nvfp4 mxfp8
  } > "$OUT/synth.log" 2>&1
fi
want parity && {
  for m in tiny-mx tiny-nv tiny-bf small-mx small-nv; do
    for kv in bf16 fp8_e4m3; do
      step "parity $m kv $kv"
      timeout 200 $M3 parity --model $CK/$m --reference cpu --backend gpu --prompts 8 --max-tokens 32 \
        --kv-dtype $kv --diagnose 2>&1 | grep -v "^    layer" | tail -30
      echo "exit ${PIPESTATUS[0]}"
    done
  done
  for m in tiny-mx small-mx; do
    step "parity $m act mxfp4"
    timeout 200 $M3 parity --model $CK/$m --reference cpu --backend gpu --prompts 8 --max-tokens 32 \
      --act mxfp4 --diagnose 2>&1 | grep -v "^    layer" | tail -30
    echo "exit ${PIPESTATUS[0]}"
  done
  step "parity tiny-mx shared selection"
  timeout 200 $M3 parity --model $CK/tiny-mx --reference cpu --backend gpu --prompts 8 --max-tokens 32 \
    --selection shared --diagnose 2>&1 | grep -v "^    layer" | tail -30
  echo "exit ${PIPESTATUS[0]}"
} > "$OUT/parity.log" 2>&1

want forward && {
  # teacher-forced per-layer rel L2: the CPU's own dump is the teacher
  TOK=$(python3 -c "print(','.join(str((i*7919+13)%512) for i in range(120)))")
  for m in ${FORWARD_MODELS:-tiny-mx tiny-nv tiny-bf small-mx}; do
    for act in bf16 mxfp4; do
      step "forward --teacher $m act $act"
      $M3 forward --model $CK/$m --tokens "$TOK" --act $act --backend cpu --dump /tmp/cpu.st --diagnose >/dev/null &&
      $M3 forward --model $CK/$m --tokens "$TOK" --act $act --backend gpu --teacher /tmp/cpu.st --dump /tmp/gpu.st --diagnose &&
      $M3 forward --model $CK/$m --tokens "$TOK" --act $act --backend cpu --teacher /tmp/cpu.st --dump /tmp/cpu2.st --diagnose >/dev/null &&
      python3 - <<'PY'
import numpy as np
from safetensors.numpy import load_file
c, g = load_file("/tmp/cpu2.st"), load_file("/tmp/gpu.st")
def rel(a, b):
    a = a.astype(np.float64); b = b.astype(np.float64)
    return float(np.linalg.norm(b - a) / max(np.linalg.norm(a), 1e-300))
for k in sorted(c, key=lambda s: (s.split('.')[0], int(s.split('.')[1]) if '.' in s else -1)):
    if k in g and c[k].dtype == np.float32:
        print(f"{k:16s} rel L2 {rel(c[k], g[k]):.3e}")
    elif k in g:
        print(f"{k:16s} ids differ {int((c[k] != g[k]).sum())} of {c[k].size}")
PY
    done
  done
} > "$OUT/forward.log" 2>&1

want generate && {
  step "generate tiny-mx gpu"
  $M3 generate --model $CK/tiny-mx --backend gpu --max-tokens 64 --ignore-eos 2>&1 | tail -3
  step "generate tiny-mx cpu"
  $M3 generate --model $CK/tiny-mx --backend cpu --max-tokens 64 --ignore-eos 2>&1 | tail -3
  step "generate tiny-mx gpu, temperature 0.8 (gpu and cpu must agree)"
  $M3 generate --model $CK/tiny-mx --backend gpu --max-tokens 32 --temperature 0.8 --top-p 0.9 --seed 3 --ignore-eos 2>&1 | tail -1
  $M3 generate --model $CK/tiny-mx --backend cpu --max-tokens 32 --temperature 0.8 --top-p 0.9 --seed 3 --ignore-eos 2>&1 | tail -1
  step "generate tiny-mx gpu --spec-tokens 3 (dspark)"
  $M3 generate --model $CK/tiny-mx --backend gpu --max-tokens 32 --spec-tokens 3 --ignore-eos 2>&1 | tail -2
  step "batch tiny-mx gpu 16 requests"
  python3 -c "
import json
for i in range(16): print(json.dumps({'id': i, 'tokens': [(i*31+j*7)%500+3 for j in range(5+i)], 'max_tokens': 24}))" > /tmp/req.jsonl
  $M3 batch --model $CK/tiny-mx --backend gpu --input /tmp/req.jsonl --output /tmp/res-gpu.jsonl --ignore-eos 2>&1 | tail -2
  $M3 batch --model $CK/tiny-mx --backend cpu --input /tmp/req.jsonl --output /tmp/res-cpu.jsonl --ignore-eos 2>&1 | tail -2
  python3 -c "
import json
a=[json.loads(l) for l in open('/tmp/res-gpu.jsonl')]; b=[json.loads(l) for l in open('/tmp/res-cpu.jsonl')]
print('batch: requests with identical tokens gpu vs cpu:', sum(x['tokens']==y['tokens'] for x,y in zip(a,b)), 'of', len(a))"
} > "$OUT/generate.log" 2>&1
echo done
