#!/usr/bin/env bash
# Session 28 (issues 12, 13), on an H200. umul.log: the MoE layer at b1 /
# b4 / b16 with the E2M1 one-tile walk's batch single (S_H_TILE_UMUL=1)
# against doubled (2, the default), 2 rounds (the H100's b4 +5%, session
# 27 run 3), and the one-row walk's batch doubled at 4 CTAs an SM
# (s28a's microbench candidate) in the layer. mono.log: `m3 bench --path both` at batch
# 1-64 (32 and 64: the wide mode), the H200 table, after its parity gate:
# 256 greedy steps a case on each path, tokens and last logits bit for
# bit (issue 13 item 4 on the product-format model). Served tokens/s:
# s28c.sh.
set -u
. bench/device/common.sh
m3_setup
B="S_MMA_WARPS=4 S_MMA_MAXBT=2"
timeout 220 /tmp/bin/m3 bench --backend gpu --preset m3.1 --layers 12 --per-layer 6 --batch 1,4,16 --context 4096 \
  --iters 40 --rounds 2 --variants "$B S_H_TILE_UMUL=1;$B S_H_TILE_UMUL=2;$B S_H_ONE_UMUL=2 S_R1_MINB_FP4=4" > $OUT/umul.log 2>&1
echo "exit $?" >> $OUT/umul.log
grep -E "^device|^ceiling|^\| .*decode.*/|^exit" $OUT/umul.log | tail -16
timeout 220 /tmp/bin/m3 bench --backend gpu --preset m3.1 --layers 12 --per-layer 6 --parity-steps 256 \
  --batch 1,4,16,32,64 --context 4096 --iters 40 --rounds 2 --path both > $OUT/mono.log 2>&1
echo "exit $?" >> $OUT/mono.log
grep -E "^device|^\| decode|^crossover|per layer|^mono path|parity|^  decode|^exit" $OUT/mono.log | tail -40
