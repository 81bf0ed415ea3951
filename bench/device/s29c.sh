#!/usr/bin/env bash
# Session 29 (issue 13), any card: why a mono E4M3 op runs longer than
# the same body in its own launch (o_proj at b1: 83 us in mono; the
# standard path's one-row E4M3 launches 26 us on average, o_proj's not
# timed apart; the same 384 blocks of 128 threads, the same one-row walk). Nsight Compute
# on one mono layer launch (b1) and on one standard m3s_mma_e4m3_r1
# launch of the same step: stall reasons, per-SASS-line samples (xz'd
# CSV), memory throughput. Before it, spread.log (S_MONO_SPREAD A/B).
# PART=spread: the A/B only; PART=ncu: Nsight Compute only.
set -u
. bench/device/common.sh
m3_setup
# spread.log first: the mono ops alone in their phase with their blocks
# spread over every CTA's first sub-block before any second
# (S_MONO_SPREAD=1) against CTA-major (the build), interleaved, 2 rounds,
# each after a 16-step parity gate (the spread must keep the bits).
P=${PART:-all}
[ "$P" = ncu ] || {
  for r in 1 2; do
    for d in "" "S_MONO_SPREAD=1"; do
      echo "=== M3_MONO_DEFINES='$d' round $r ($(date +%T))"
      M3_MONO_DEFINES="$d" timeout 150 /tmp/bin/m3 bench --backend gpu --preset m3.1 --layers 12 --per-layer 6 \
        --batch 1,4,16 --context 4096 --iters 40 --rounds 1 --path both --parity-steps 16 2>&1 \
        | grep -E "^\| \[.*decode.*/|differ|rror"
    done
  done
} > $OUT/spread.log 2>&1
[ "$P" = ncu ] || cat $OUT/spread.log
[ "$P" = spread ] && exit 0
NCU=/usr/local/cuda/bin/ncu
B="/tmp/bin/m3 bench --backend gpu --preset m3.1 --layers 12 --context 4096 --iters 1 --rounds 1 --warmup 0 --batch 1"
S="--section SourceCounters --section WarpStateStats --section LaunchStats --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy"
timeout 200 $NCU --target-processes all -k regex:m3s_mono --launch-skip 5 --launch-count 1 $S \
  --import-source no -o $OUT/mono1 $B --path mono > $OUT/ncu-mono.txt 2>&1
timeout 150 $NCU --target-processes all -k regex:m3s_mma_e4m3_r1 --launch-skip 20 --launch-count 4 $S \
  --import-source no -o $OUT/std1 $B --path standard > $OUT/ncu-std.txt 2>&1
for r in mono1 std1; do
  $NCU -i $OUT/$r.ncu-rep --print-details all > $OUT/$r.txt 2>&1
  $NCU -i $OUT/$r.ncu-rep --page source --print-source sass --csv 2>/dev/null | xz -9 > $OUT/$r-sass.csv.xz
done
rm -f $OUT/*.ncu-rep
ls -la $OUT; tail -2 $OUT/ncu-mono.txt $OUT/ncu-std.txt
grep -E "Duration|Warp Cycles Per Issued|Memory Throughput|DRAM Throughput|Achieved Occupancy|Grid Size|Block Size" $OUT/mono1.txt $OUT/std1.txt | head -30
