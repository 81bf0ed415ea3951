#!/usr/bin/env bash
# Session 39 (issue 12), the H200, ~400 s: the table with the
# landed defaults in one call: golden through the GPU runner, the kernel
# microbench (`m3 bench --kernels`), the MX bench model's per-layer figure
# at b1..64 (4k context) and at b1 with the 128k context beside 4k.
set -u
. bench/device/common.sh
m3_setup
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv,noheader
echo "=== golden --backend gpu ($(date +%T))"
M3_BIN=/tmp/bin/m3 M3_ROOT=$PWD timeout 120 /tmp/bin/xtask golden --backend gpu > $OUT/golden.log 2>&1
echo "exit $?"; grep -E "golden:|FAIL" $OUT/golden.log | tail -3
echo "=== kernel microbench ($(date +%T))"
timeout 150 /tmp/bin/m3 bench --backend gpu --kernels --preset m3.1 --iters 30 --out $OUT/kernels.json > $OUT/kernels.log 2>&1
echo "exit $?"; grep -E "^\|" $OUT/kernels.log | head -60
B="--backend gpu --preset m3.1 --layers 12 --per-layer 6 --iters 40 --rounds 2 --path standard"
echo "=== per layer b1..64 ($(date +%T))"
timeout 150 /tmp/bin/m3 bench $B --batch 1,2,4,8,16,32,64 --context 4096 --out $OUT/layers.json > $OUT/layers.log 2>&1
echo "exit $?"; grep -E "^\| .*decode|ceiling" $OUT/layers.log
echo "=== 128k ($(date +%T))"
timeout 120 /tmp/bin/m3 bench $B --batch 1 --context 4096 --long-context 131072 --out $OUT/long.json > $OUT/long.log 2>&1
echo "exit $?"; grep -E "^\| .*decode|128k|131072|x the" $OUT/long.log | head
