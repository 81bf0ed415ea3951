#!/usr/bin/env bash
# Session 28 (issue 13), on any card (the H200 would not start): the mono
# parity gate at 256 greedy steps and the mono table (mono.log, as
# s28b.sh's second part), then the runner's mono tests under
# REQUIRE_GPU=1 (check.log; the kernel cache is warm by then).
set -u
. bench/device/common.sh
m3_setup
timeout 220 /tmp/bin/m3 bench --backend gpu --preset m3.1 --layers 12 --per-layer 6 --parity-steps 256 \
  --batch 1,4,16,32,64 --context 4096 --iters 40 --rounds 2 --path both > $OUT/mono.log 2>&1
echo "exit $?" >> $OUT/mono.log
grep -E "^device|^\| decode|^crossover|per layer|^mono path|parity|^  decode|^exit|rror" $OUT/mono.log | tail -40
{
  echo "=== test runner mono, REQUIRE_GPU=1 ($(date +%T))"
  REQUIRE_GPU=1 timeout 180 /tmp/bin/test-runner mono_path auto_path wide_mono --test-threads=1 --nocapture 2>&1 \
    | grep -E "^test |^test result|panicked|bitwise|FAIL|crossover" | tail -16
} > $OUT/check.log 2>&1
cat $OUT/check.log
