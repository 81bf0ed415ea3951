#!/usr/bin/env bash
# (S_H_PIPE was removed after this run: a negative result, bench/NOTES.md session 19 runs 3-4.)
# Session 19 (issue 12): s19d's MXFP4 half (it timed out compiling six
# variants on a cold kernel cache). MXFP4 only, rows 1 / 16, three variants.
set -u
. bench/device/common.sh
m3_setup
S="S_MMA_WARPS=4 S_MMA_MAXBT=2"
V="$S S_H_PIPE=1;$S S_H_PIPE=1 S_R1_MINB=4 S_R8_MINB=4;$S S_UNROLL_MUL=2 S_R1_MINB_FP4=4"
timeout 420 /tmp/bin/m3 bench --backend gpu --preset m3.1 --kernels --kernel-stack 1x49152 --kernel-rows 1,16 \
  --kernel-formats mxfp4 --kernel-experts 4,16 --variants "$V" --out $OUT/mxfp4.json 2>&1 | grep -E "^\||rror" | grep -v "| default |"
