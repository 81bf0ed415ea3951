#!/usr/bin/env bash
# Session 21, call 4 (issue 12, "done when"): the standard path's whole-step
# table by PERF.md's protocol (200 replays a case, 3 interleaved rounds):
# m3.1 --layers 12 / 6 (MoE-layer efficiency), batch 1-64 at 4k, batch 1
# and 4 at 128k (the 128k / 4k bar at batch 1: <= 1.10x the step).
set -u
. bench/device/common.sh
m3_setup
timeout 500 /tmp/bin/m3 bench --backend gpu --preset m3.1 --layers 12 --per-layer 6 --batch 1,2,4,8,16,32,64 \
  --context 4096 --long-context 131072 --iters 200 --rounds 3 --out $OUT/table.json > $OUT/table.log 2>&1
echo "exit $?" >> $OUT/table.log
grep -vE "^round " $OUT/table.log | tail -40
