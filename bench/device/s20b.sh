#!/usr/bin/env bash
# Prepared in session 19 (issue 12): two bench variants of the MX fast walk
# against the default on the kernel microbench (each case checked against
# f64): S_H_STRIDE=1 (a CTA's warps take its batches in turn: 512 adjacent
# bytes a row at a time for MXFP4) and S_H_TILES=2 (a CTA of the one-row /
# one-tile entry points takes two 16-row tiles, each warp one x fragment
# for both: half the x loads a weight byte), at 4 and 3 CTAs an SM.
# MXFP4 / MXFP8 / NVFP4, rows 1 / 4 / 16, one tall launch and 8 launches.
set -u
# Ran in session 20 (run 2): both variants negative; the defines were removed after it.
. bench/device/common.sh
m3_setup
S="S_MMA_WARPS=4 S_MMA_MAXBT=2"
V="$S S_H_STRIDE=1;$S S_H_TILES=2 S_R1_MINB=4 S_R8_MINB=4;$S S_H_TILES=2 S_R1_MINB=3 S_R8_MINB=3"
for st in 1x49152 ""; do
  echo "=== stack '$st' ($(date +%T))" >> $OUT/mb.log
  timeout 270 /tmp/bin/m3 bench --backend gpu --preset m3.1 --kernels --kernel-rows 1,4,16 --kernel-formats mxfp4,mxfp8,nvfp4 \
    --kernel-stack "$st" --kernel-experts 4,16 --variants "$V" 2>&1 | grep -E "^\||rror" | grep -v "| default |" >> $OUT/mb.log
done
cat $OUT/mb.log
