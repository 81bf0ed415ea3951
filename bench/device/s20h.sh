#!/usr/bin/env bash
# Session 20, call 8 (issue 12 item 5): the top-k's warp rounds by two
# `redux.sync` maxima and its candidates ranked by bisection of the warps'
# descending lists. First the new GPU test of the standard path's indexer
# at long contexts against f64 (one-pass top-k, warp rounds from shared and
# from global memory, score CTAs looping over many blocks; 128k rows of
# 1025 blocks), then the MoE layer against 538b319 (old) at b1 4k / 128k,
# interleaved, 2 rounds, then the runner tests.
set -u
. bench/device/common.sh
m3_setup old
{
  echo "=== test m3_gpu long_context_indexer, REQUIRE_GPU=1 ($(date +%T))"
  REQUIRE_GPU=1 timeout 150 /tmp/bin/test-m3_gpu long_context_indexer --test-threads=1 --nocapture 2>&1 | grep -E "^test |test result|panicked|failure|blocks a row|row [0-9]" | head -40
} > $OUT/test.log 2>&1
cat $OUT/test.log
B="--backend gpu --preset m3.1 --layers 12 --per-layer 6 --iters 40 --rounds 1"
{
  for r in 1 2; do
    for b in old bin; do
      echo "=== $b round $r ($(date +%T))"
      timeout 100 /tmp/$b/m3 bench $B --context 4096 --batch 1 --long-context 131072 2>&1 | grep -E "^\| decode.*/|rror"
    done
  done
} > $OUT/ab.log 2>&1
cat $OUT/ab.log
{
  echo "=== runner tests, REQUIRE_GPU=1 ($(date +%T))"
  REQUIRE_GPU=1 timeout 150 /tmp/bin/test-runner --test-threads=1 --nocapture gpu_runner_matches mono_path 2>&1 | grep -E "^test result|panicked|FAIL" | tail -4
  echo "=== golden --backend gpu ($(date +%T))"
  REQUIRE_GPU=1 M3_BIN=/tmp/bin/m3 M3_ROOT=$PWD timeout 100 /tmp/bin/xtask golden --backend gpu --no-free-run 2>&1 | grep -E "golden:|FAIL|fail" | tail -4
} > $OUT/verify.log 2>&1
cat $OUT/verify.log
