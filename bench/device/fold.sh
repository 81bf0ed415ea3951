#!/usr/bin/env bash
# Session 5 run 7: the shared expert folded into the expert table
# (--fold-shared-expert). The runner tests (the new fold test: bitwise the
# same, a planted perturbation caught, refusals) and the draft test under
# REQUIRE_GPU=1; `m3 parity` with the fold on small (shared expert in the
# experts' format); then `m3 bench` on the bench model with its shared
# experts in the experts' format, on their own against folded, at batch
# 1 / 16 / 32 / 64, in one call. Logs to $OUT.
set -u
mkdir -p /tmp/bin && tar -C /tmp/bin -xJf .carry/bin.tar.xz
export REQUIRE_GPU=1 M3_KERNEL_CACHE=/tmp/m3-kernels XDG_CACHE_HOME=/tmp/xdg
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
M3=/tmp/bin/m3
step() { echo; echo "=== $* ($(date +%T))"; }
{
  for t in ${TESTS:-runner draft}; do
    step "test $t"
    timeout 240 /tmp/bin/test-$t --test-threads=1 --nocapture 2>&1 | grep -v "^test .* ok$" | grep -vE "^  [0-9] query|prefill layer|^\[|^small-step" | tail -25
    echo "exit ${PIPESTATUS[0]}"
  done
} > $OUT/tests.log 2>&1
{
  for sh in expert folded; do
    step "bench shared experts: $sh"
    timeout 200 $M3 bench --backend gpu --preset m3.1 --layers 12 --batch 1,16,32,64 --context 4096 --iters 40 --rounds 2 --shared-expert $sh --out $OUT/bench-$sh.json 2>&1 | grep -E "^\| decode|ceiling"
  done
} > $OUT/bench.log 2>&1
echo done
