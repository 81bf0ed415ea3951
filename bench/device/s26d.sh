#!/usr/bin/env bash
# Session 26 (issue 12), the device time left after refused starts: one
# call, most telling first, each part into its own $OUT log.
# 1. layer.log: the MoE layer at b1 / b4 / b16, 2 rounds interleaved (and
#    each run's ceiling line: this build measures it through the runtime
#    line, f067e34 through cudarc; they should agree),
#    f067e34 (.carry/f06.tar.xz) against this build (run 3's walks as
#    defaults, RMSNorm's bound computed at load);
# 2. reps.log: the tall launch at one row, one launch a replay against 10
#    back to back (--kernel-reps: what a lone launch's latency costs the
#    microbench's figure);
# 3. check.log: the GPU unit tests of the linears and producers, the
#    runner's mono-bitwise test (REQUIRE_GPU=1);
# 4. kernels.log: grouped experts at 4 and 16 rows against the one-tile
#    walk's old batch (S_H_TILE_UMUL=1) and 5 CTAs an SM (S_R8_MINB=5).
set -u
. bench/device/common.sh
m3_setup f06
m3_ab 2 "--backend gpu --preset m3.1 --layers 12 --per-layer 6 --iters 40 --rounds 1 --batch 1,4,16" \
  /tmp/f06/m3 /tmp/bin/m3 > $OUT/layer.log 2>&1
cat $OUT/layer.log
for r in 1 10 1 10; do
  echo "=== reps $r ($(date +%T))"
  timeout 60 /tmp/bin/m3 bench --backend gpu --preset m3.1 --kernels --kernel-stack 1x49152 --kernel-experts "" \
    --kernel-rows 1 --kernel-reps $r --kernel-formats mxfp4,nvfp4,mxfp8 2>&1 | grep -E "^\||rror" | grep -v "| default |"
done > $OUT/reps.log 2>&1
cat $OUT/reps.log
{
  m3_unit 240 linear pointwise
  echo "=== test runner mono_path_is_bitwise_the_standard_path ($(date +%T))"
  REQUIRE_GPU=1 timeout 100 /tmp/bin/test-runner mono_path_is_bitwise --test-threads=1 --nocapture 2>&1 \
    | grep -E "^test |^test result|panicked|bitwise|FAIL" | tail -12
  echo "=== end ($(date +%T))"
} > $OUT/check.log 2>&1
cat $OUT/check.log
B="S_MMA_WARPS=4 S_MMA_MAXBT=2"
timeout 150 /tmp/bin/m3 bench --backend gpu --preset m3.1 --kernels --kernel-stack 1x6144 --kernel-experts 4,16 \
  --kernel-rows 4,16 --variants "$B S_H_TILE_UMUL=1;$B S_R8_MINB=5" --kernel-formats mxfp4,nvfp4 2>&1 \
  | grep -E "^\||rror" | grep -v "| default |" > $OUT/kernels.log 2>&1
grep "x/row" $OUT/kernels.log
