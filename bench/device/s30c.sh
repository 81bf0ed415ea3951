#!/usr/bin/env bash
# Session 30 (issue 13), any card, the build with the early start and the
# spread on (the new defaults): the GPU runner tests under REQUIRE_GPU=1
# (mono bitwise the standard path, wide mono, the auto path), the op
# profile at b1 and b16 with each op's critical path, then Nsight Compute
# on one mono layer (b1) and the four standard m3s_mma_e4m3_r1 launches of
# one layer: stall reasons, memory throughput, per-SASS-line samples.
set -u
. bench/device/common.sh
m3_setup
echo "=== test runner, REQUIRE_GPU=1 ($(date +%T))"
REQUIRE_GPU=1 timeout 200 /tmp/bin/test-runner --test-threads=1 2>&1 | grep -E "^test |^test result|panicked" | tail -16
timeout 100 /tmp/bin/m3 bench --backend gpu --preset m3.1 --layers 12 --context 4096 --iters 1 --rounds 1 --warmup 0 \
  --batch 1,16 --path mono --profile > $OUT/prof.log 2>&1
grep -A19 "^mono ops" $OUT/prof.log
NCU=/usr/local/cuda/bin/ncu
B="/tmp/bin/m3 bench --backend gpu --preset m3.1 --layers 12 --context 4096 --iters 1 --rounds 1 --warmup 0 --batch 1"
S="--section SourceCounters --section WarpStateStats --section LaunchStats --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy"
timeout 200 $NCU --target-processes all -k regex:m3s_mono --launch-skip 5 --launch-count 1 $S \
  --import-source no -o $OUT/mono1 $B --path mono > $OUT/ncu-mono.txt 2>&1
timeout 120 $NCU --target-processes all -k regex:m3s_mma_e4m3_r1 --launch-skip 20 --launch-count 4 $S \
  --import-source no -o $OUT/std1 $B --path standard > $OUT/ncu-std.txt 2>&1
for r in mono1 std1; do
  $NCU -i $OUT/$r.ncu-rep --print-details all > $OUT/$r.txt 2>&1
  $NCU -i $OUT/$r.ncu-rep --page source --print-source sass --csv 2>/dev/null | xz -9 > $OUT/$r-sass.csv.xz
done
rm -f $OUT/*.ncu-rep
tail -2 $OUT/ncu-mono.txt $OUT/ncu-std.txt
grep -E "Duration|Warp Cycles Per Issued|Memory Throughput|DRAM Throughput|Achieved Occupancy|Registers Per" $OUT/mono1.txt $OUT/std1.txt | head -30
