#!/usr/bin/env bash
# (S_H_PIPE was removed after this run: a negative result, bench/NOTES.md session 19 runs 3-4.)
# Session 19 (issue 12): the MX linears are waiting on their weight loads
# (s19c: MXFP4 one-row kernel on one tall launch, 46% of stall samples
# long-scoreboard on the batch's first use, ALU pipe 66%; it keeps 2 KB a
# warp in flight, MXFP8 4 KB). S_H_PIPE=1: the fast walk loads the next
# batch's weights before using this one's. Kernel microbench, tall stack
# and experts, rows 1 / 4 / 16, MXFP4 / MXFP8 / NVFP4, against the
# small-step shape (each case checked against f64).
set -u
. bench/device/common.sh
m3_setup
S="S_MMA_WARPS=4 S_MMA_MAXBT=2"
V="$S S_H_PIPE=1;$S S_H_PIPE=1 S_R1_MINB_FP4=5;$S S_H_PIPE=1 S_R1_MINB=4 S_R8_MINB=4;$S S_H_PIPE=1 S_R1_MINB=3 S_R8_MINB=3;$S S_UNROLL_MUL=2 S_R1_MINB_FP4=4"
for f in mxfp4 mxfp8 nvfp4; do
  echo "=== $f ($(date +%T))"
  timeout 250 /tmp/bin/m3 bench --backend gpu --preset m3.1 --kernels --kernel-stack 1x49152 --kernel-rows 1,4,16 \
    --kernel-formats $f --kernel-experts 4,16 --variants "$V" --out $OUT/$f.json 2>&1 | grep -E "^\||rror" | grep -v "| default |"
done
