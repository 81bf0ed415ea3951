#!/usr/bin/env bash
# Session 6 run 2 (issue 12), a record (S_MMA_ASYNC exists only in commit
# f3101d7). The MX linears' weights through a per-warp
# shared-memory ring filled by cp.async (S_MMA_ASYNC=1). The tensor-core
# variants' f64 test (now with the cp.async variant, bitwise against the
# small-step variant it extends, every format, a K that is not a multiple
# of 128); the kernel microbench with the cp.async variants beside the
# defaults; the bench model's step with each variant forced at batch 1 /
# 4 / 16. Logs and JSON to $OUT.
set -u
mkdir -p /tmp/bin && tar -C /tmp/bin -xJf .carry/bin.tar.xz
export REQUIRE_GPU=1 M3_KERNEL_CACHE=/tmp/m3-kernels XDG_CACHE_HOME=/tmp/xdg
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
M3=/tmp/bin/m3
step() { echo; echo "=== $* ($(date +%T))"; }
V=${VARIANTS:-"S_MMA_WARPS=4 S_MMA_MAXBT=2 S_MMA_ASYNC=1;S_MMA_WARPS=4 S_MMA_MAXBT=2 S_MMA_ASYNC=1 S_MMA_MINB=5;S_MMA_WARPS=4 S_MMA_MAXBT=2 S_MMA_ASYNC=1 S_ASYNC_KB=24;S_MMA_WARPS=2 S_MMA_MAXBT=2 S_MMA_ASYNC=1"}
{
  nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv
  step "test m3_gpu variants"
  timeout 200 /tmp/bin/test-m3_gpu variants --test-threads=1 --nocapture 2>&1 | grep -v "^test .* ok$" | tail -30
  echo "exit ${PIPESTATUS[0]}"
} > $OUT/tests.log 2>&1
{
  step "kernel microbench"
  timeout 300 $M3 bench --backend gpu --kernels --preset m3.1 --iters 30 --variants "$V" --out $OUT/kernels.json 2>&1
  echo "exit $?"
} > $OUT/kernels.log 2>&1
{
  step "step bench, variants forced"
  timeout 240 $M3 bench --backend gpu --preset m3.1 --layers 12 --batch 1,4,16 --context 4096 --iters 40 --rounds 2 \
    --variants "$V" --out $OUT/step.json 2>&1 | grep -v "^round"
  echo "exit ${PIPESTATUS[0]}"
} > $OUT/step.log 2>&1
echo done
