#!/usr/bin/env bash
# Session 31 (issue 13), any card, ~100 s: the mono router as its three
# ops (M3_MONO_ROUTER_SPLIT=1) against the fused `m3s_router_small`,
# interleaved, b1 / b16, 8-step parity gate -> ab.log; then the op profile
# of the split form at b1 -> prof.log (the router's parts apart).
set -u
. bench/device/common.sh
m3_setup
timeout 100 /tmp/bin/m3 bench --backend gpu --preset tiny --batch 1 --iters 1 --rounds 1 --warmup 1 --path both \
  --parity-steps 0 > /dev/null 2>&1
echo "compiled ($(date +%T))"
B="--backend gpu --preset m3.1 --layers 12 --per-layer 6 --batch 1,16 --context 4096 --iters 30 --rounds 1 --path both --parity-steps 8"
for v in 1 0 1 0; do
  echo "=== M3_MONO_ROUTER_SPLIT=$v ($(date +%T))"
  M3_MONO_ROUTER_SPLIT=$v timeout 40 /tmp/bin/m3 bench $B 2>&1 | grep -E "^\| \[.*decode.*/|^mono parity|differ|rror"
done > $OUT/ab.log 2>&1
grep -E "^===|mono\]|differ|rror" $OUT/ab.log
M3_MONO_ROUTER_SPLIT=1 timeout 30 /tmp/bin/m3 bench --backend gpu --preset m3.1 --layers 12 --context 4096 --iters 1 \
  --rounds 1 --warmup 0 --batch 1 --path mono --profile > $OUT/prof.log 2>&1
grep -A21 "^mono ops" $OUT/prof.log | cut -c1-140
