#!/usr/bin/env bash
# Session 10's check of the merged tree on the H200: the runtime line (issue
# 16: every CUDA call of the engine now goes through runtime/api.rs), the
# NVFP4 KV cache on the GPU and the EAGLE3 golden draft cases (issue 17).
# Every GPU test under REQUIRE_GPU=1, golden through the GPU under
# REQUIRE_GPU=1 (no case may skip), parity (standard path; the NVFP4 cache;
# the mono path, issue 13 item 4). Logs to $OUT.
set -u
mkdir -p /tmp/bin && tar -C /tmp/bin -xJf .carry/bin.tar.xz
export REQUIRE_GPU=1 M3_KERNEL_CACHE=/tmp/m3-kernels XDG_CACHE_HOME=/tmp/xdg
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
M3=/tmp/bin/m3
step() { echo; echo "=== $* ($(date +%T))"; }
{
  for t in ${TESTS:-runner backend_ops ops draft sampling formats compile m3_gpu}; do
    step "test $t"
    timeout 300 /tmp/bin/test-$t --test-threads=1 2>&1 | grep -E "^test .*FAILED|^test result|panicked|failures:" | tail -12
    echo "exit ${PIPESTATUS[0]}"
  done
} > $OUT/tests.log 2>&1
grep -E "===|exit|result" $OUT/tests.log
{
  step "golden --backend gpu (REQUIRE_GPU=1)"
  M3_BIN=$M3 M3_ROOT=$PWD timeout 300 /tmp/bin/xtask golden --backend gpu 2>&1 | grep -v "^ *[0-9]*: \|^Stack\|^$" | tail -24
  echo "exit ${PIPESTATUS[0]}"
} > $OUT/golden.log 2>&1
tail -6 $OUT/golden.log
{
  CK=/tmp/ck; mkdir -p $CK
  $M3 synth --preset tiny --experts mxfp4 --dense mxfp8 --out $CK/tiny --draft-layers 0 -q
  $M3 synth --preset small --experts mxfp4 --dense mxfp8 --out $CK/small --draft-layers 0 -q
  for m in tiny small; do
    step "parity $m gpu standard"
    timeout 150 $M3 parity --model $CK/$m --reference cpu --backend gpu --prompts 8 --max-tokens 32 2>&1 | grep -E "^parity" | tail -2
    echo "exit ${PIPESTATUS[0]}"
    step "parity $m gpu --path mono"
    timeout 150 $M3 parity --model $CK/$m --reference cpu --backend gpu --path mono --prompts 8 --max-tokens 32 2>&1 | grep -E "^parity" | tail -2
    echo "exit ${PIPESTATUS[0]}"
    step "parity $m gpu --kv-dtype nvfp4 (both sides)"
    timeout 150 $M3 parity --model $CK/$m --reference cpu --backend gpu --kv-dtype nvfp4 --prompts 8 --max-tokens 32 2>&1 | grep -E "^parity" | tail -2
    echo "exit ${PIPESTATUS[0]}"
  done
} > $OUT/parity.log 2>&1
grep -E "===|^parity|exit" $OUT/parity.log
echo done
