#!/usr/bin/env bash
# Session 28, on an H200 (issue 12). Each part into its own $OUT log.
# 1. m1.log: the kernel microbench, tall 1 x [49152, 6144] and experts 4
#    and 16 of 128, at 1 and 16 rows (the 16-row experts are the other
#    bar), one launch a replay against 10 back to back (--kernel-reps);
#    the build against the one-row walk's batch doubled at fewer CTAs an
#    SM (session 26 run 3 measured the doubled batch only at the 6-CTA
#    bound, where it spills) and 4 CTAs an SM alone.
# 2. umul.log: the MoE layer at b1 / b4 / b16 with the E2M1 one-tile
#    walk's batch single (S_H_TILE_UMUL=1) against doubled (2, the
#    default), 2 rounds (the H100's b4 +5%, session 27 run 3).
set -u
. bench/device/common.sh
m3_setup
B="S_MMA_WARPS=4 S_MMA_MAXBT=2"
V="$B S_R1_MINB_FP4=4;$B S_H_ONE_UMUL=2 S_R1_MINB_FP4=4 S_R1_MINB_FP8=3;$B S_H_ONE_UMUL=2 S_R1_MINB=3"
for r in 10 1; do
  echo "=== reps $r ($(date +%T))"
  timeout 200 /tmp/bin/m3 bench --backend gpu --preset m3.1 --kernels --kernel-stack 1x49152 --kernel-experts 4,16 \
    --kernel-rows 1,16 --kernel-reps $r --kernel-formats mxfp4,nvfp4,mxfp8 --variants "$V" 2>&1 | grep -E "^\||rror|^ceiling"
done > $OUT/m1.log 2>&1
grep -E "x/row|===|rror" $OUT/m1.log
timeout 180 /tmp/bin/m3 bench --backend gpu --preset m3.1 --layers 12 --per-layer 6 --batch 1,4,16 --context 4096 \
  --iters 40 --rounds 2 --variants "$B S_H_TILE_UMUL=1;$B S_H_TILE_UMUL=2" > $OUT/umul.log 2>&1
echo "exit $?" >> $OUT/umul.log
grep -E "^device|^ceiling|^\| .*decode.*/|^exit" $OUT/umul.log | tail -16
