#!/usr/bin/env bash
# Session 6 runs 6-7 (issue 12): the MX linears split into fast-decode entry
# points (no fallback decode in the loop) and `_any` ones for matrices with
# a block scale outside the fast range, chosen per launch by the host.
# Tests (the variants' f64 check, now with out-of-range-scale stacks that
# must take the `_any` kernels; the runner), the kernel microbench and the
# step at --layers 12 / 6 with S_FORCE_ANY=1 (the kernels before the split)
# (run 7: E5M2 too; SECTIONS, KARGS, LARGS, BATCH, VARIANTS narrow it;
# after the later E4M3 NaN-code change S_FORCE_ANY=1 no longer equals the
# pre-split E4M3 kernel: see standard_decode.cu)
# as variants, golden and parity through the GPU runner. One call.
set -u
mkdir -p /tmp/bin && tar -C /tmp/bin -xJf .carry/bin.tar.xz
export REQUIRE_GPU=1 M3_KERNEL_CACHE=/tmp/m3-kernels XDG_CACHE_HOME=/tmp/xdg
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
M3=/tmp/bin/m3
step() { echo; echo "=== $* ($(date +%T))"; }
S="S_MMA_WARPS=4 S_MMA_MAXBT=2"
V=${VARIANTS:-"$S S_FORCE_ANY=1;S_FORCE_ANY=1"}
want() { case " ${SECTIONS:-tests kernels layers golden} " in *" $1 "*) return 0 ;; esac; return 1; }
want tests && {
  step "test m3_gpu variants"
  timeout 200 /tmp/bin/test-m3_gpu variants --test-threads=1 --nocapture 2>&1 | grep -v "^test .* ok$" | tail -30
  echo "exit ${PIPESTATUS[0]}"
  step "test runner"
  timeout 200 /tmp/bin/test-runner --test-threads=1 --nocapture 2>&1 | grep -E "^test .*(ok|FAILED)$|result|panicked|bitwise|argmax" | tail -30
  echo "exit ${PIPESTATUS[0]}"
} > $OUT/tests.log 2>&1
want kernels && {
  step "kernel microbench"
  timeout 300 $M3 bench --backend gpu --kernels --preset m3.1 --iters 30 --kernel-rows ${KROWS:-1,4,16} ${KARGS:-} --variants "$V" --out $OUT/kernels.json 2>&1 | grep -v "^round"
  echo "exit ${PIPESTATUS[0]}"
} > $OUT/kernels.log 2>&1
want layers && {
  step "step, --per-layer 6, the kernels before the split as variants"
  timeout 300 $M3 bench --backend gpu --preset m3.1 --layers 12 --per-layer 6 --batch ${BATCH:-1,4,16,64} --context 4096 --iters 40 --rounds 2 ${LARGS:-} \
    --variants "$V" --out $OUT/layers.json 2>&1 | grep -v "^round"
  echo "exit ${PIPESTATUS[0]}"
} > $OUT/layers.log 2>&1
want golden && {
  step "golden --backend gpu"
  M3_BIN=$M3 M3_ROOT=$PWD timeout 200 /tmp/bin/xtask golden --backend gpu 2>&1 | grep -v "^ *[0-9]*: \|^Stack\|^$" | tail -14
  echo "exit ${PIPESTATUS[0]}"
  CK=/tmp/ck; mkdir -p $CK
  for ex in mxfp4 nvfp4; do
    $M3 synth --preset small --experts $ex --dense mxfp8 --out $CK/small-$ex --draft-layers 0 -q
    step "parity small experts $ex"
    timeout 150 $M3 parity --model $CK/small-$ex --reference cpu --backend gpu --prompts 8 --max-tokens 32 2>&1 | grep -E "^parity" | tail -3
    echo "exit ${PIPESTATUS[0]}"
  done
} > $OUT/golden.log 2>&1
echo done
