#!/usr/bin/env bash
# Session 5 run 5: split-K for plain tensor-core launches that leave the
# device partly idle (linear::split_for). The kernel's f64 check with split
# forced (lib tests), the runner and draft tests, then `m3 bench` with and
# without split (M3_SPLIT_K=0) and the kernel microbench both ways, in one
# call. Logs to $OUT.
set -u
mkdir -p /tmp/bin && tar -C /tmp/bin -xJf .carry/bin.tar.xz
export REQUIRE_GPU=1 M3_KERNEL_CACHE=/tmp/m3-kernels XDG_CACHE_HOME=/tmp/xdg
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
M3=/tmp/bin/m3
step() { echo; echo "=== $* ($(date +%T))"; }
{
  for t in ${TESTS:-m3_gpu runner draft}; do
    step "test $t"
    timeout 240 /tmp/bin/test-$t --test-threads=1 --nocapture 2>&1 | grep -v "^test .* ok$" | grep -vE "^  [0-9] query|prefill layer|^\[" | tail -25
    echo "exit ${PIPESTATUS[0]}"
  done
} > $OUT/tests.log 2>&1
{
  for sk in 1 0; do
    step "bench split_k=$sk"
    M3_SPLIT_K=$sk timeout 150 $M3 bench --backend gpu --preset m3.1 --layers 12 --batch 1,4,16,64 --context 4096 --iters 40 --rounds 2 --per-layer 6 --out $OUT/bench-split$sk.json 2>&1 | grep -E "^\||ceiling|layer"
  done
  for sk in 1 0; do
    step "kernels split_k=$sk"
    M3_SPLIT_K=$sk timeout 150 $M3 bench --backend gpu --preset m3.1 --kernels --kernel-rows 1,4,16 --kernel-experts 4 --iters 30 2>&1 | grep -E "^\|" | head -40
  done
} > $OUT/bench.log 2>&1
echo done
