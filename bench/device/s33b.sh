#!/usr/bin/env bash
# Session 33 (issue 12), an H200 first (any card tells): the fast walk
# software-pipelined (S_H_PIPE_ONE, standard_decode.cu: batch k + 1's weights
# and scales loaded before batch k's products). NVRTC 13.0 registers of the
# one-row entries: MXFP4 pipelined 122 at 4 CTAs an SM, no spill (at 5 and 6
# it spills in the loop); NVFP4 pipelined with a single batch (U = 2) at 4,
# 5 reloads in the loop; MXFP8 at 4, 5 reloads.
# 1. m1.log: the kernel microbench at one launch a replay (the figure of
#    record), tall 1 x [49152, 6144] and the experts 4 / 16 of 128, 1 and 16
#    rows: the build against P (MXFP4 + NVFP4 pipelined, 4 CTAs an SM), P8
#    (P + MXFP8 pipelined at 3) and P3 (P at 3 CTAs an SM).
# 2. layer.log: the MoE layer at b1 / b4 / b16 against P and P8, 1 round.
set -u
. bench/device/common.sh
m3_setup
B="S_MMA_WARPS=4 S_MMA_MAXBT=2"
P="$B S_H_PIPE_ONE=20 S_H_ONE_UMUL_NV=1 S_R1_MINB_FP4=4"
P8="$B S_H_PIPE_ONE=22 S_H_ONE_UMUL_NV=1 S_R1_MINB_FP4=4 S_R1_MINB_FP8=3"
P3="$B S_H_PIPE_ONE=20 S_H_ONE_UMUL_NV=1 S_R1_MINB_FP4=3 S_R1_MINB_NV=3"
{
  echo "=== reps 1 ($(date +%T))"
  timeout 200 /tmp/bin/m3 bench --backend gpu --preset m3.1 --kernels --kernel-stack 1x49152 --kernel-experts 4,16 \
    --kernel-rows 1,16 --kernel-reps 1 --kernel-formats mxfp4,nvfp4,mxfp8 --variants "$P;$P8;$P3" 2>&1 | grep -E "^\||rror|^ceiling"
} > $OUT/m1.log 2>&1
grep -E "x/row|===|rror" $OUT/m1.log | grep -v "m16" | cut -c1-200
timeout 200 /tmp/bin/m3 bench --backend gpu --preset m3.1 --layers 12 --per-layer 6 --batch 1,4,16 --context 4096 \
  --iters 40 --rounds 1 --variants "$P;$P8" > $OUT/layer.log 2>&1
echo "exit $?" >> $OUT/layer.log
grep -E "^ceiling|^\| .*decode.*/|^exit" $OUT/layer.log | tail -14
