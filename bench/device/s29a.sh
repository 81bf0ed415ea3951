#!/usr/bin/env bash
# Session 29 (issues 12, 13), on an H200, one call, most telling first:
# 1. m1.log: the kernel microbench (tall 1 x [49152, 6144], experts 4 and
#    16 of 128, 1 and 16 rows), the build's per-format fast-walk batches
#    (session 28: MXFP4 one-tile 1, NVFP4 2; one-row 1 / 2 / 1) against the
#    one-tile walk's batch doubled for every format (S_H_TILE_UMUL=2, the
#    session-27 build's), 10 launches back to back and then one a replay.
# 2. layer.log: the MoE layer at b1 / b4 / b16, the same two, 2 rounds.
# 3. mono.log: the mono parity gate (256 greedy steps a case, bit for bit)
#    and the H200 mono table at batch 1-64 (32, 64: wide), 1 round.
set -u
. bench/device/common.sh
m3_setup
B="S_MMA_WARPS=4 S_MMA_MAXBT=2"
K="--backend gpu --preset m3.1 --kernels --kernel-stack 1x49152 --kernel-experts 4,16 --kernel-rows 1,16 --kernel-formats mxfp4,nvfp4,mxfp8"
{
  echo "=== reps 10 ($(date +%T))"
  timeout 150 /tmp/bin/m3 bench $K --kernel-reps 10 --variants "$B S_H_TILE_UMUL=2" 2>&1 | grep -E "^\||rror|^ceiling"
  echo "=== reps 1 ($(date +%T))"
  timeout 40 /tmp/bin/m3 bench $K --kernel-reps 1 2>&1 | grep -E "^\||rror|^ceiling"
} > $OUT/m1.log 2>&1
grep -E "x/row|===|rror" $OUT/m1.log
timeout 170 /tmp/bin/m3 bench --backend gpu --preset m3.1 --layers 12 --per-layer 6 --batch 1,4,16 --context 4096 \
  --iters 40 --rounds 2 --variants "$B S_H_TILE_UMUL=2" --out $OUT/layer.json > $OUT/layer.log 2>&1
echo "exit $?" >> $OUT/layer.log
grep -E "^ceiling|^\| .*decode.*/|^exit" $OUT/layer.log | tail -14
timeout 200 /tmp/bin/m3 bench --backend gpu --preset m3.1 --layers 12 --per-layer 6 --parity-steps 256 \
  --batch 1,4,16,32,64 --context 4096 --iters 40 --rounds 1 --path both --out $OUT/mono.json > $OUT/mono.log 2>&1
echo "exit $?" >> $OUT/mono.log
grep -E "^device|^crossover|^mono path|parity|^  decode|^\| \[.*decode.*/|^\| decode|^exit|rror" $OUT/mono.log | tail -40
