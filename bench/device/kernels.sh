#!/usr/bin/env bash
# H200, issue 12 (session 4): the tensor-core linear's correctness tests
# (f64 reference per variant, decode == prefill), the kernel microbench
# (`m3 bench --kernels`), the bench model at --layers 12 and 6 in one run
# (the per-layer figure), golden through the GPU runner and `m3 parity`
# with --act mxfp4 on small. Logs and JSON to $OUT.
set -u
BIN=${BIN:-/tmp/bin}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export REQUIRE_GPU=1 M3_KERNEL_CACHE=/tmp/m3-kernels XDG_CACHE_HOME=/tmp/xdg
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
M3=$BIN/m3
step() { echo; echo "=== $* ($(date +%T))"; }
want() { case " ${SECTIONS:-tests kernels layers golden parity} " in *" $1 "*) return 0 ;; esac; return 1; }
want tests && {
  nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv
  for t in m3_gpu runner; do
    step "test $t"
    timeout 150 "$BIN/test-$t" --test-threads=1 --nocapture 2>&1 | grep -v "^test .* ok$" | tail -40
    echo "exit ${PIPESTATUS[0]}"
  done
} > "$OUT/tests.log" 2>&1
want kernels && {
  step "kernel microbench"
  timeout 240 $M3 bench --backend gpu --kernels --preset m3.1 --iters ${KITERS:-30} ${KARGS:-} --out "$OUT/kernels.json" 2>&1
  echo "exit $?"
} > "$OUT/kernels.log" 2>&1
want layers && {
  step "bench m3.1 --layers 12 --per-layer 6"
  timeout 240 $M3 bench --backend gpu --preset m3.1 --layers 12 --per-layer 6 --batch 1,4,16,64 --iters 50 --rounds 2 ${LARGS:-} --out "$OUT/layers.json" 2>&1 | grep -v "^round"
  echo "exit ${PIPESTATUS[0]}"
} > "$OUT/layers.log" 2>&1
want golden && {
  step "golden --backend gpu"
  M3_BIN=$M3 M3_ROOT=$PWD timeout 200 "$BIN/xtask" golden --backend gpu 2>&1 | tail -20
  echo "exit ${PIPESTATUS[0]}"
} > "$OUT/golden.log" 2>&1
want parity && {
  CK=/tmp/ck; mkdir -p $CK
  for m in "tiny-mx tiny" "small-mx small"; do
    set -- $m
    [ -e "$CK/$1/config.json" ] || $M3 synth --preset "$2" --experts mxfp4 --dense mxfp8 --out "$CK/$1" --draft-layers 0 -q
    for act in bf16 mxfp4; do
      step "parity $1 act $act"
      timeout 150 $M3 parity --model $CK/$1 --reference cpu --backend gpu --prompts 8 --max-tokens 32 \
        --act $act --diagnose 2>&1 | grep -v "^    layer" | grep -E "^prompt|upstream|^parity|first discrete" | tail -30
      echo "exit ${PIPESTATUS[0]}"
    done
  done
} > "$OUT/parity.log" 2>&1
echo done
