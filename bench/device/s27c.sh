#!/usr/bin/env bash
# Session 27, on an H200 if one is lent: (1) umul.log: the MoE layer at
# b1 / b4 / b16 with the E2M1 one-tile walk's batch single
# (S_H_TILE_UMUL=1) against doubled (2, session 26's default) as two
# variants of the same run, 2 rounds (the H100's b4 +5%, run 3 of
# session 27); (2) s27b.sh's mono table (pair1.log / pair0.log).
set -u
. bench/device/common.sh
m3_setup
B="S_MMA_WARPS=4 S_MMA_MAXBT=2"
timeout 240 /tmp/bin/m3 bench --backend gpu --preset m3.1 --layers 12 --per-layer 6 --batch 1,4,16 --context 4096 \
  --iters 40 --rounds 2 --variants "$B S_H_TILE_UMUL=1;$B S_H_TILE_UMUL=2" > $OUT/umul.log 2>&1
echo "exit $?" >> $OUT/umul.log
grep -E "^device|^ceiling|^\| .*decode.*/|^exit" $OUT/umul.log | tail -16
bash bench/device/s27b.sh
