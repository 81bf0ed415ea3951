#!/usr/bin/env bash
# Session 19 (issue 12): the figures of record with the coalesced FP8
# layout (b1-64 at 4k, b1 at 128k), and Nsight Compute's L2 view of the
# MXFP8 one-row kernel on one tall launch (s19c had 86% L2, 47% excess).
set -u
. bench/device/common.sh
m3_setup
B="--backend gpu --preset m3.1 --layers 12 --per-layer 6 --iters 40"
timeout 240 /tmp/bin/m3 bench $B --batch 1,4,16,32,64 --context 4096 --long-context 131072 --rounds 2 \
  --out $OUT/record.json > $OUT/record.log 2>&1
echo "exit $?"; grep -E "^\| decode.*/" $OUT/record.log
timeout 100 /usr/local/cuda/bin/ncu --target-processes all -k 'regex:m3s_mma_e4m3_r1$' --launch-skip 3 --launch-count 1 \
  --cache-control none --clock-control none --section SpeedOfLight --section SourceCounters --import-source no \
  /tmp/bin/m3 bench --backend gpu --preset m3.1 --kernels --kernel-stack 1x49152 --kernel-rows 1 --kernel-formats mxfp8 \
  --kernel-experts "" > $OUT/ncu.txt 2>&1
grep -E "Duration|DRAM Throughput|L2 Cache Throughput|L1/TEX Cache|excessive" $OUT/ncu.txt
