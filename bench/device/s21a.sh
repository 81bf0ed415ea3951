#!/usr/bin/env bash
# Prepared in session 20 for session 21's first call (issue 12 item 5).
# 1. The long-context indexer test (REQUIRE_GPU=1): the standard path's
#    index scores and top-k at 41-5001 blocks a row against f64, each case
#    with the warp-round top-k (the default) and the radix select
#    (`index_topk_radix`); run 8's check misread the in-place marks past
#    4096 blocks (corrected since, never run).
# 2. The radix select against the warp rounds (M3_INDEX_TOPK_RADIX=0|1),
#    MoE layer at b1 / b4, 4k and 128k, interleaved, 2 rounds.
# 3. The runner tests with the radix select on (a smoke check: their
#    contexts stay under 256 blocks, where the one-pass ranking runs).
set -u
. bench/device/common.sh
m3_setup
{
  echo "=== test m3_gpu long_context_indexer, REQUIRE_GPU=1 ($(date +%T))"
  REQUIRE_GPU=1 timeout 200 /tmp/bin/test-m3_gpu long_context_indexer --test-threads=1 --nocapture 2>&1 \
    | grep -E "^test |test result|panicked|failure|blocks a row|row [0-9]|near tie" | head -40
} > $OUT/test.log 2>&1
cat $OUT/test.log
B="--backend gpu --preset m3.1 --layers 12 --per-layer 6 --iters 40 --rounds 1"
{
  for r in 1 2; do
    for x in 0 1; do
      echo "=== M3_INDEX_TOPK_RADIX=$x round $r ($(date +%T))"
      M3_INDEX_TOPK_RADIX=$x timeout 150 /tmp/bin/m3 bench $B --context 4096 --batch 1,4 --long-context 131072 2>&1 | grep -E "^\| decode.*/|rror"
      M3_INDEX_TOPK_RADIX=$x timeout 150 /tmp/bin/m3 bench $B --context 131072 --batch 4 2>&1 | grep -E "^\| decode.*/|rror"
    done
  done
} > $OUT/ab.log 2>&1
cat $OUT/ab.log
{
  echo "=== runner tests with the radix select, REQUIRE_GPU=1 ($(date +%T))"
  M3_INDEX_TOPK_RADIX=1 REQUIRE_GPU=1 timeout 200 /tmp/bin/test-runner --test-threads=1 --nocapture gpu_runner_matches mono_path 2>&1 | grep -E "^test result|panicked|FAIL" | tail -4
} > $OUT/verify.log 2>&1
cat $OUT/verify.log
