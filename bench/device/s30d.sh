#!/usr/bin/env bash
# Session 30 (issue 13), any card, the build with the early start and the
# spread on (the new defaults), in the order of what matters if the call
# is cut short:
# 1. the GPU runner tests under REQUIRE_GPU=1 (mono bitwise the standard
#    path, wide mono, the auto path's crossover);
# 2. issue 13's table: `m3 bench --path both` at 4k, batch 1, 2, 4, 8, 16
#    (mono) and 32, 64 (wide), each after a 64-step parity gate (every
#    step's tokens and logits bit for bit), 2 rounds -> mono4k.json / .log;
# 3. the op profile at b1 and b16 with each op's critical path (prof.log);
# 4. batch 1 at 4k and one sequence at 128k, 8-step gate -> mono128k.*;
# 5. Nsight Compute on one mono layer at b1 (mono1.txt, mono1-sass.csv.xz).
set -u
. bench/device/common.sh
m3_setup
echo "=== test runner, REQUIRE_GPU=1 ($(date +%T))"
REQUIRE_GPU=1 timeout 120 /tmp/bin/test-runner --test-threads=1 2>&1 | grep -E "^test |^test result|panicked" | tail -16
B="--backend gpu --preset m3.1 --layers 12 --per-layer 6 --iters 40 --rounds 2 --path both"
echo "=== 4k table ($(date +%T))"
timeout 220 /tmp/bin/m3 bench $B --batch 1,2,4,8,16,32,64 --context 4096 --parity-steps 64 \
  --out $OUT/mono4k.json > $OUT/mono4k.log 2>&1
echo "exit $?" >> $OUT/mono4k.log
grep -E "^device|^crossover|^mono parity|differ|^\| \[.*decode.*/|^exit|rror" $OUT/mono4k.log | tail -30
echo "=== profile ($(date +%T))"
timeout 40 /tmp/bin/m3 bench --backend gpu --preset m3.1 --layers 12 --context 4096 --iters 1 --rounds 1 --warmup 0 \
  --batch 1,16 --path mono --profile > $OUT/prof.log 2>&1
grep -A19 "^mono ops" $OUT/prof.log
echo "=== 128k ($(date +%T))"
timeout 100 /tmp/bin/m3 bench $B --batch 1 --context 4096 --long-context 131072 --parity-steps 8 \
  --out $OUT/mono128k.json > $OUT/mono128k.log 2>&1
echo "exit $?" >> $OUT/mono128k.log
grep -E "^mono parity|differ|^\| \[.*decode.*/|^exit|rror" $OUT/mono128k.log | tail -12
echo "=== ncu ($(date +%T))"
NCU=/usr/local/cuda/bin/ncu
S="--section SourceCounters --section WarpStateStats --section LaunchStats --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy"
timeout 100 $NCU --target-processes all -k regex:m3s_mono --launch-skip 5 --launch-count 1 $S --import-source no \
  -o $OUT/mono1 /tmp/bin/m3 bench --backend gpu --preset m3.1 --layers 12 --context 4096 --iters 1 --rounds 1 \
  --warmup 0 --batch 1 --path mono > $OUT/ncu-mono.txt 2>&1
$NCU -i $OUT/mono1.ncu-rep --print-details all > $OUT/mono1.txt 2>&1
$NCU -i $OUT/mono1.ncu-rep --page source --print-source sass --csv 2>/dev/null | xz -9 > $OUT/mono1-sass.csv.xz
rm -f $OUT/*.ncu-rep
tail -2 $OUT/ncu-mono.txt
grep -E "Duration|Warp Cycles Per Issued|Memory Throughput|DRAM Throughput|Achieved Occupancy" $OUT/mono1.txt | head
