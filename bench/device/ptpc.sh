#!/usr/bin/env bash
# Session 7 (issue 17): PTPC FP8 on the GPU runner. Tests (the PTPC linear
# against cpu-ref, the variants' f64 check: the job table grew a field; the
# runner), golden --backend gpu (its PTPC cases no longer skipped), `m3
# parity` CPU PTPC vs GPU PTPC on tiny / small, and the bench model with and
# without --online-quant ptpc_fp8 at batch 1 / 16 / 64. SECTIONS, TESTS and
# BATCH narrow it.
set -u
mkdir -p /tmp/bin && tar -C /tmp/bin -xJf .carry/bin.tar.xz
export REQUIRE_GPU=1 M3_KERNEL_CACHE=/tmp/m3-kernels XDG_CACHE_HOME=/tmp/xdg
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
M3=/tmp/bin/m3
step() { echo; echo "=== $* ($(date +%T))"; }
want() { case " ${SECTIONS:-tests golden layers} " in *" $1 "*) return 0 ;; esac; return 1; }
want tests && {
  step "test m3_gpu ptpc + variants"
  timeout 200 /tmp/bin/test-m3_gpu ${TESTS:-ptpc variants} --test-threads=1 --nocapture 2>&1 | grep -v "^test .* ok$" | tail -30
  echo "exit ${PIPESTATUS[0]}"
  step "test runner"
  timeout 200 /tmp/bin/test-runner --test-threads=1 --nocapture 2>&1 | grep -E "^test .*(ok|FAILED)$|result|panicked" | tail -30
  echo "exit ${PIPESTATUS[0]}"
} > $OUT/tests.log 2>&1
want golden && {
  step "golden --backend gpu"
  M3_BIN=$M3 M3_ROOT=$PWD timeout 200 /tmp/bin/xtask golden --backend gpu 2>&1 | grep -v "^ *[0-9]*: \|^Stack\|^$" | tail -16
  echo "exit ${PIPESTATUS[0]}"
  CK=/tmp/ck; mkdir -p $CK
  for p in tiny small; do
    $M3 synth --preset $p --experts mxfp4 --dense mxfp8 --out $CK/$p --draft-layers 0 -q
    step "parity $p, PTPC on both sides (cpu vs gpu)"
    timeout 200 $M3 parity --model $CK/$p --reference cpu --backend gpu --online-quant ptpc_fp8 --prompts 8 --max-tokens 32 2>&1 | grep -E "^parity|MISMATCH" | tail -4
    echo "exit ${PIPESTATUS[0]}"
  done
} > $OUT/golden.log 2>&1
want layers && {
  for oq in "" "--online-quant ptpc_fp8"; do
    step "bench m3.1 --layers 12 $oq"
    timeout 200 $M3 bench --backend gpu --preset m3.1 --layers 12 --batch ${BATCH:-1,16,64} --context 4096 --iters 40 --rounds 2 $oq \
      --out $OUT/layers${oq:+-ptpc}.json 2>&1 | grep -v "^round"
    echo "exit ${PIPESTATUS[0]}"
  done
} > $OUT/layers.log 2>&1
echo done
