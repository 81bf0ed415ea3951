#!/usr/bin/env bash
# Session 31 (issue 13), any card. In the order of what matters if the call
# is cut short:
# 1. mono's o-projection L2 prefetch (M3_MONO_L2_PREFETCH_MIB: an op that
#    shares its phase with the head norms; 0 = session 30's program), A/B
#    0 / 16 / 32 / 48 MiB, interleaved, 2 rounds, `m3 bench --path both` on
#    m3.1 --layers 12 --per-layer 6 at b1 / b4 / b16, each after a 16-step
#    parity gate (every step's tokens and logits bit for bit) -> ab.log;
# 2. the op profile (default build) at b1 and b16 with each op's critical
#    path -> prof.log;
# 3. Nsight Compute on one mono layer at b1 (mono1.txt, mono1-sass.csv.xz):
#    where a mono op's warps stall;
# 4. the GPU runner tests under REQUIRE_GPU=1 -> runner.log.
set -u
. bench/device/common.sh
m3_setup
echo "=== compile ($(date +%T))"
timeout 200 /tmp/bin/m3 bench --backend gpu --preset tiny --batch 1 --iters 1 --rounds 1 --warmup 1 --path both \
  --parity-steps 0 > /dev/null 2>&1
echo "compiled ($(date +%T))"
B="--backend gpu --preset m3.1 --layers 12 --per-layer 6 --batch 1,4,16 --context 4096 --iters 40 --rounds 1 --path both --parity-steps 16"
for r in 1 2; do
  for mib in 0 16 32 48; do
    echo "=== M3_MONO_L2_PREFETCH_MIB=$mib round $r ($(date +%T))"
    M3_MONO_L2_PREFETCH_MIB=$mib timeout 60 /tmp/bin/m3 bench $B 2>&1 | grep -E "^\| \[.*decode.*/|^mono parity|differ|rror"
  done
done > $OUT/ab.log 2>&1
grep -E "^===|mono\]" $OUT/ab.log
echo "=== profile ($(date +%T))"
timeout 40 /tmp/bin/m3 bench --backend gpu --preset m3.1 --layers 12 --context 4096 --iters 1 --rounds 1 --warmup 0 \
  --batch 1,16 --path mono --profile > $OUT/prof.log 2>&1
grep -A21 "^mono ops" $OUT/prof.log | cut -c1-150
echo "=== ncu ($(date +%T))"
NCU=/usr/local/cuda/bin/ncu
S="--section SourceCounters --section WarpStateStats --section LaunchStats --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy"
timeout 110 $NCU --target-processes all -k regex:m3s_mono --launch-skip 5 --launch-count 1 $S --import-source no \
  -o $OUT/mono1 /tmp/bin/m3 bench --backend gpu --preset m3.1 --layers 12 --context 4096 --iters 1 --rounds 1 \
  --warmup 0 --batch 1 --path mono > $OUT/ncu-mono.txt 2>&1
$NCU -i $OUT/mono1.ncu-rep --print-details all > $OUT/mono1.txt 2>&1
$NCU -i $OUT/mono1.ncu-rep --page source --print-source sass --csv 2>/dev/null | xz -9 > $OUT/mono1-sass.csv.xz
rm -f $OUT/*.ncu-rep
tail -2 $OUT/ncu-mono.txt
grep -E "Duration|Warp Cycles Per Issued|Memory Throughput|DRAM Throughput|Achieved Occupancy|Stall" $OUT/mono1.txt | head -20
echo "=== test runner, REQUIRE_GPU=1 ($(date +%T))"
REQUIRE_GPU=1 timeout 100 /tmp/bin/test-runner --test-threads=1 2>&1 | grep -E "^test |^test result|panicked" | tail -16 | tee $OUT/runner.log
echo "=== done ($(date +%T))"
