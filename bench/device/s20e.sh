#!/usr/bin/env bash
# Session 20, call 5 (issue 12 item 5): what bounds the index scores at
# 128k (23 us a direct launch for ~17 MB of keys: ~0.7 TB/s; run 4) and
# the top-k after them. Nsight Compute on a b1 step at 128k, details page
# (stall reasons, memory throughput, occupancy) and per-SASS-line CSV.
set -u
. bench/device/common.sh
m3_setup
NCU=/usr/local/cuda/bin/ncu
B="--backend gpu --preset m3.1 --layers 12 --iters 2 --rounds 1 --warmup 0"
sect="--section SourceCounters --section WarpStateStats --section LaunchStats --section SpeedOfLight --section Occupancy --section MemoryWorkloadAnalysis --section SchedulerStats"
timeout 240 $NCU --target-processes all -k 'regex:m3s_index_(scores|topk)$' \
  --launch-skip 20 --launch-count 2 --cache-control none --clock-control none $sect --import-source no \
  -o $OUT/s128k /tmp/bin/m3 bench $B --context 131072 --batch 1 > $OUT/ncu-128k.txt 2>&1
echo "ncu 128k exit $?"
$NCU -i $OUT/s128k.ncu-rep --page details --print-units base > $OUT/details.txt 2>&1
grep -E "m3s_|Duration|Registers Per|Achieved Occupancy|Theoretical Occ|Warp Cycles Per Issued|Issued Ipc|Grid Size|DRAM Through|Memory Through|L2 Hit|Stall|Block Limit" $OUT/details.txt | head -80
$NCU -i $OUT/s128k.ncu-rep --page raw --csv 2>/dev/null | xz -9 > $OUT/raw.csv.xz
$NCU -i $OUT/s128k.ncu-rep --page source --print-source sass --csv 2>/dev/null | xz -9 > $OUT/sass.csv.xz
rm -f $OUT/s128k.ncu-rep
