#!/usr/bin/env bash
# Session 41 (issue 12), the H200 (any card runs it), ~120 s warm: the MX
# bench model's per-layer figure at b1..64 (4k context) and b1 at 128k
# beside 4k, standard path, landed defaults (s39b.sh's last two steps;
# s40a.sh has the microbench and golden).
set -u
. bench/device/common.sh
m3_setup
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv,noheader
B="--backend gpu --preset m3.1 --layers 12 --per-layer 6 --iters 40 --rounds 2 --path standard"
echo "=== per layer b1..64 ($(date +%T))"
timeout 200 /tmp/bin/m3 bench $B --batch 1,2,4,8,16,32,64 --context 4096 --out $OUT/layers.json > $OUT/layers.log 2>&1
echo "exit $?"; grep -E "^\| .*decode|ceiling" $OUT/layers.log
echo "=== 128k ($(date +%T))"
timeout 150 /tmp/bin/m3 bench $B --batch 1 --context 4096 --long-context 131072 --out $OUT/long.json > $OUT/long.log 2>&1
echo "exit $?"; grep -E "^\| .*decode|128k|131072|x the" $OUT/long.log | head
