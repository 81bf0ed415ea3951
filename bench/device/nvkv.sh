#!/usr/bin/env bash
# Issue 17's GPU half: the NVFP4 KV / index cache on the GPU (ARCHITECTURE.md,
# NVFP4 KV cache). Needs the release binaries of the nvkv-gpu branch packed by
# bench/device/pack.sh into .carry/bin.tar.xz (carry .carry).
#   tests   every GPU test that covers the cache, REQUIRE_GPU=1: the NVRTC
#           compile of every kernel, m3_gpu's unit tests (incl. the GPU ones),
#           backend_ops (cache_write / index_scores / attention with Nvfp4 vs
#           cpu-ref, and the golden op case nvfp4-cache bit-exact through the
#           GPU's cache write), ops, runner (the "nvfp4 cache" case vs the CPU
#           runner, decode == prefill with Nvfp4, mono == standard bitwise
#           with Nvfp4).
#   golden  cargo xtask golden --backend gpu with REQUIRE_GPU=1: the two
#           kvnvfp4 model cases must pass (not skip); then m3 parity cpu vs
#           gpu on tiny with --kv-cache-dtype nvfp4 on both sides.
#   bench   m3 bench --backend gpu, m3.1 --layers 12, batch 1 / 16 / 64, the
#           cache at fp8_e4m3 then nvfp4 in one call (the comparison table at
#           the end).
# SECTIONS, TESTS and BATCH narrow it. Logs under $OUT.
set -u
mkdir -p /tmp/bin && tar -C /tmp/bin -xJf .carry/bin.tar.xz
export REQUIRE_GPU=1 M3_KERNEL_CACHE=/tmp/m3-kernels XDG_CACHE_HOME=/tmp/xdg
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
M3=/tmp/bin/m3
step() { echo; echo "=== $* ($(date +%T))"; }
want() { case " ${SECTIONS:-tests golden bench} " in *" $1 "*) return 0 ;; esac; return 1; }
want tests && {
  step "test compile (every kernel, NVRTC of the device)"
  timeout 300 /tmp/bin/test-compile --test-threads=1 --nocapture 2>&1 | grep -E "^test |NVRTC|result|panicked|error" | tail -12
  echo "exit ${PIPESTATUS[0]}"
  step "test m3_gpu (unit tests, GPU ones included)"
  timeout 200 /tmp/bin/test-m3_gpu ${TESTS:-} --test-threads=1 2>&1 | grep -v "^test .* ok$" | tail -20
  echo "exit ${PIPESTATUS[0]}"
  step "test backend_ops (every op vs cpu-ref, Nvfp4 caches; golden nvfp4-cache op case)"
  timeout 300 /tmp/bin/test-backend_ops --test-threads=1 --nocapture 2>&1 | grep -E "FAIL|Nvfp4|nvfp4|cases,|^test |result|panicked" | tail -24
  echo "exit ${PIPESTATUS[0]}"
  step "test ops"
  timeout 200 /tmp/bin/test-ops --test-threads=1 2>&1 | grep -E "^test .*(ok|FAILED)$|result|panicked" | tail -12
  echo "exit ${PIPESTATUS[0]}"
  step "test runner (nvfp4 cache vs CPU runner, decode == prefill, mono == standard)"
  timeout 480 /tmp/bin/test-runner --test-threads=1 --nocapture 2>&1 | grep -E "^test .*(ok|FAILED)$|nvfp4|Nvfp4|result|panicked|FAIL" | tail -40
  echo "exit ${PIPESTATUS[0]}"
} > $OUT/tests.log 2>&1
want golden && {
  step "golden --backend gpu (REQUIRE_GPU=1: the kvnvfp4 cases must run and pass)"
  M3_BIN=$M3 M3_ROOT=$PWD timeout 300 /tmp/bin/xtask golden --backend gpu 2>&1 | grep -v "^ *[0-9]*: \|^Stack\|^$" | tail -24
  echo "exit ${PIPESTATUS[0]}"
  CK=/tmp/ck; mkdir -p $CK
  $M3 synth --preset tiny --experts mxfp4 --dense mxfp8 --out $CK/tiny --draft-layers 0 -q
  for kv in nvfp4 fp8_e4m3; do
    step "parity tiny, --kv-cache-dtype $kv on both sides (cpu vs gpu)"
    timeout 200 $M3 parity --model $CK/tiny --reference cpu --backend gpu --kv-cache-dtype $kv --prompts 8 --max-tokens 32 2>&1 | grep -E "^parity|MISMATCH|near|error" | tail -6
    echo "exit ${PIPESTATUS[0]}"
  done
} > $OUT/golden.log 2>&1
want bench && {
  step "bench m3.1 --layers 12, cache fp8_e4m3 then nvfp4"
  timeout 420 $M3 bench --backend gpu --preset m3.1 --layers 12 --batch ${BATCH:-1,16,64} --context 4096 --iters 40 --rounds 2 \
    --kv-cache-dtype fp8_e4m3,nvfp4 --out $OUT/bench.json 2>&1 | grep -v "^round"
  echo "exit ${PIPESTATUS[0]}"
} > $OUT/bench.log 2>&1
tail -n 30 $OUT/tests.log $OUT/golden.log $OUT/bench.log
echo done
