#!/usr/bin/env bash
# Session 28 (issues 12, 13), one call for what s28a / s28b hold, most
# telling first, each part into its own $OUT log (starts kept failing:
# the budget allows one call).
# 1. m1.log: the kernel microbench (tall 1 x [49152, 6144], experts 4 and
#    16 of 128, at 1 and 16 rows), 10 launches back to back, the build
#    against the one-row walk's batch doubled at fewer CTAs an SM and 4
#    CTAs an SM alone; then the build alone at one launch a replay.
# 2. mono.log: the mono parity gate (256 greedy steps a case on each path,
#    bit for bit) and the mono table at batch 1, 4, 16, 1 round.
# 3. layer.log: the MoE layer at b1 / b4 / b16, the build against the
#    one-tile walk's single batch (S_H_TILE_UMUL=1) and the one-row
#    candidate of part 1, 1 round.
set -u
. bench/device/common.sh
m3_setup
B="S_MMA_WARPS=4 S_MMA_MAXBT=2"
V="$B S_R1_MINB_FP4=4;$B S_H_ONE_UMUL=2 S_R1_MINB_FP4=4 S_R1_MINB_FP8=3;$B S_H_ONE_UMUL=2 S_R1_MINB=3"
{
  echo "=== reps 10 ($(date +%T))"
  timeout 170 /tmp/bin/m3 bench --backend gpu --preset m3.1 --kernels --kernel-stack 1x49152 --kernel-experts 4,16 \
    --kernel-rows 1,16 --kernel-reps 10 --kernel-formats mxfp4,nvfp4,mxfp8 --variants "$V" 2>&1 | grep -E "^\||rror|^ceiling"
  echo "=== reps 1 ($(date +%T))"
  timeout 40 /tmp/bin/m3 bench --backend gpu --preset m3.1 --kernels --kernel-stack 1x49152 --kernel-experts 4,16 \
    --kernel-rows 1,16 --kernel-reps 1 --kernel-formats mxfp4,nvfp4,mxfp8 2>&1 | grep -E "^\||rror|^ceiling"
} > $OUT/m1.log 2>&1
grep -E "x/row|===|rror" $OUT/m1.log
timeout 150 /tmp/bin/m3 bench --backend gpu --preset m3.1 --layers 12 --per-layer 6 --parity-steps 256 \
  --batch 1,4,16 --context 4096 --iters 40 --rounds 1 --path both > $OUT/mono.log 2>&1
echo "exit $?" >> $OUT/mono.log
grep -E "^device|^crossover|^mono path|parity|^  decode|^\| \[.*decode.*/|^exit|rror" $OUT/mono.log | tail -30
timeout 170 /tmp/bin/m3 bench --backend gpu --preset m3.1 --layers 12 --per-layer 6 --batch 1,4,16 --context 4096 \
  --iters 40 --rounds 1 --variants "$B S_H_TILE_UMUL=1;$B S_H_ONE_UMUL=2 S_R1_MINB_FP4=4" > $OUT/layer.log 2>&1
echo "exit $?" >> $OUT/layer.log
grep -E "^ceiling|^\| .*decode.*/|^exit" $OUT/layer.log | tail -14
