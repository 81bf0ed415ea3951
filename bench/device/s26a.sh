#!/usr/bin/env bash
# Session 26 (issue 12): the kernel microbench with three new variants of
# the MX fast walk beside the small-step build (S_MMA_WARPS=4
# S_MMA_MAXBT=2): S_MMA_INTERLEAVE=1 (a CTA's warps take batches of U
# super-chunks in turn, so they read one contiguous stretch together, as
# session 11's prototype did), S_UNROLL_MUL=2 (twice the bytes in flight),
# both, and S_NV_SPLIT=1 (NVFP4's folded one-tile walk with a row-scaled x
# summing each block apart). Tall launch and the grouped experts, 1 and
# 16 rows, MXFP4 / NVFP4 / MXFP8.
set -u
. bench/device/common.sh
m3_setup
B="S_MMA_WARPS=4 S_MMA_MAXBT=2"
V="$B S_MMA_INTERLEAVE=1;$B S_UNROLL_MUL=2;$B S_MMA_INTERLEAVE=1 S_UNROLL_MUL=2;$B S_NV_SPLIT=1"
for shape in tall experts; do
  if [ $shape = tall ]; then a=(--kernel-stack 1x49152 --kernel-experts ""); else a=(--kernel-stack 1x6144 --kernel-experts 4,16); fi
  echo "=== kernels $shape ($(date +%T))"
  timeout 280 /tmp/bin/m3 bench --backend gpu --preset m3.1 --kernels "${a[@]}" --variants "$V" --kernel-rows 1,16 \
    --kernel-formats mxfp4,nvfp4,mxfp8 2>&1 | grep -E "^\||rror" | grep -v "| default |"
done > $OUT/kernels.log 2>&1
cat $OUT/kernels.log
