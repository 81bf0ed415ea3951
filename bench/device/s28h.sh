#!/usr/bin/env bash
# Session 28, issue 13, on whatever card is lent (H100 if the H200 is
# not): s28a.sh's check and mono parts (check.log, mono.log, mono-u0.log),
# then the in-kernel op profile of a mono layer at b1 / b4 (prof.log),
# against session 27's (bench/results/2026-12-05-s27/mono-prof-pair1.log).
set -u
. bench/device/common.sh
m3_setup
{
  echo "=== test runner mono, REQUIRE_GPU=1 ($(date +%T))"
  REQUIRE_GPU=1 timeout 150 /tmp/bin/test-runner mono_path auto_path wide_mono --test-threads=1 --nocapture 2>&1 \
    | grep -E "^test |^test result|panicked|bitwise|FAIL|crossover" | tail -16
} > $OUT/check.log 2>&1
cat $OUT/check.log
timeout 130 /tmp/bin/m3 bench --backend gpu --preset m3.1 --layers 12 --per-layer 6 \
  --batch 1,4,16,32,64 --context 4096 --iters 40 --rounds 2 --path both > $OUT/mono.log 2>&1
echo "exit $?" >> $OUT/mono.log
grep -E "^device|^\| decode|^crossover|per layer|^mono path|^exit" $OUT/mono.log | tail -24
M3_MONO_DEFINES="S_UNROLL_HALF=0" timeout 90 /tmp/bin/m3 bench --backend gpu --preset m3.1 --layers 12 --per-layer 6 \
  --batch 1,4,16 --context 4096 --iters 40 --rounds 1 --path both > $OUT/mono-u0.log 2>&1
echo "exit $?" >> $OUT/mono-u0.log
grep -E "^\| decode|^crossover|per layer|^mono path|^exit" $OUT/mono-u0.log | tail -16
timeout 90 /tmp/bin/m3 bench --backend gpu --preset m3.1 --layers 12 --batch 1,4 --context 4096 --iters 20 --rounds 1 \
  --path mono --profile > $OUT/prof.log 2>&1
echo "exit $?" >> $OUT/prof.log
grep -E "^mono ops|^ +[0-9]+\+? " $OUT/prof.log | head -40
