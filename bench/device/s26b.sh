#!/usr/bin/env bash
# Session 26 (issue 12): after run 3 the build's defaults are the E2M1
# one-tile walk with twice the batch (S_H_TILE_UMUL=2), MXFP8's walks of
# several rows interleaved over the warps (S_MMA_INTERLEAVE=2) and NVFP4's
# split sum (S_NV_SPLIT=1). Against each of them switched back, and the
# one-tile entries' CTAs an SM (S_R8_MINB=5: the doubled batch spills
# at 6's 80 registers, NVRTC 13.5). Grouped experts 4 and 16 of 128 at 1,
# 4, 8, 16 rows; the tall launch at 1 and 16.
set -u
. bench/device/common.sh
m3_setup
B="S_MMA_WARPS=4 S_MMA_MAXBT=2"
V="$B S_R8_MINB=5;$B S_H_TILE_UMUL=1;$B S_MMA_INTERLEAVE=0;$B S_NV_SPLIT=0"
for shape in experts tall; do
  if [ $shape = tall ]; then a=(--kernel-stack 1x49152 --kernel-experts "" --kernel-rows 1,16)
  else a=(--kernel-stack 1x6144 --kernel-experts 4,16 --kernel-rows 1,4,8,16); fi
  echo "=== kernels $shape ($(date +%T))"
  timeout 280 /tmp/bin/m3 bench --backend gpu --preset m3.1 --kernels "${a[@]}" --variants "$V" \
    --kernel-formats mxfp4,nvfp4,mxfp8 2>&1 | grep -E "^\||rror" | grep -v "| default |"
done > $OUT/kernels.log 2>&1
grep -E "x/row|===" $OUT/kernels.log
