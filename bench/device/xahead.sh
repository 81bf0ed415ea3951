#!/usr/bin/env bash
# Prepared in session 6 for the next one (issue 12): S_X_AHEAD=1, the first
# row tile's x loads software-pipelined one super-chunk ahead (session 6
# run 4's probe put the x loads at ~8% of the batch-1 step). At the
# small-step variant's 128-register cap it spills, so it is timed with
# fewer registers per thread by two routes: S_UNROLL_HALF=1 (half the
# weight loads per batch) and S_MMA_MINB=3 (3 CTAs an SM, ~150-168
# registers). The variants' f64 test (it includes the UNROLL_HALF form),
# then the kernel microbench and the step at --layers 12 / 6, one call.
set -u
mkdir -p /tmp/bin && tar -C /tmp/bin -xJf .carry/bin.tar.xz
export REQUIRE_GPU=1 M3_KERNEL_CACHE=/tmp/m3-kernels XDG_CACHE_HOME=/tmp/xdg
M3=/tmp/bin/m3
S="S_MMA_WARPS=4 S_MMA_MAXBT=2"
V=${VARIANTS:-"$S S_UNROLL_HALF=1;$S S_X_AHEAD=1 S_UNROLL_HALF=1;$S S_X_AHEAD=1 S_MMA_MINB=3"}
{
  timeout 200 /tmp/bin/test-m3_gpu variants --test-threads=1 --nocapture 2>&1 | grep -v "^test .* ok$" | tail -20
  echo "exit ${PIPESTATUS[0]}"
} > $OUT/tests.log 2>&1
timeout 240 $M3 bench --backend gpu --kernels --preset m3.1 --iters 30 --kernel-rows 1,4,16 \
  --kernel-formats mxfp8,mxfp4,nvfp4 --variants "$V" --out $OUT/kernels.json > $OUT/kernels.log 2>&1
echo "exit $?" >> $OUT/kernels.log
timeout 240 $M3 bench --backend gpu --preset m3.1 --layers 12 --per-layer 6 --batch 1,4,16 --context 4096 \
  --iters 40 --rounds 2 --variants "$V" --out $OUT/layers.json 2>&1 | grep -v "^round" > $OUT/layers.log
echo done
