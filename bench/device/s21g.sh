#!/usr/bin/env bash
# Session 21, call 7: the radix select with an early exit (the wanted key
# the last of its byte: every key of the byte taken; ~3.5 passes of 6 in
# a Python model of 400 rows), the scan's suffix sum by shuffles, and
# warp-aggregated histogram atomics (CUDA). The long-context indexer test
# (41-5001 blocks a row against f64), then A/B against 48aecff (/tmp/old)
# at 4k and 128k, and the top-k's in-graph cost (left out) on both.
set -u
. bench/device/common.sh
m3_setup old
{
  echo "=== test m3_gpu standard::attn, REQUIRE_GPU=1 ($(date +%T))"
  REQUIRE_GPU=1 timeout 200 /tmp/bin/test-m3_gpu standard::attn --test-threads=1 --nocapture 2>&1 \
    | grep -E "^test result|panicked|failure|blocks a row" | head -20
} > $OUT/test.log 2>&1
cat $OUT/test.log
B="--backend gpu --preset m3.1 --layers 12 --per-layer 6 --iters 40 --rounds 1"
{
  for r in 1 2; do
    for m in /tmp/old/m3 /tmp/bin/m3; do
      echo "=== $m round $r ($(date +%T))"
      timeout 150 $m bench $B --context 4096 --batch 1 --long-context 131072 2>&1 | grep -E "^\| decode.*/|rror"
      timeout 150 $m bench $B --context 131072 --batch 4 2>&1 | grep -E "^\| decode.*/|rror"
    done
  done
  for m in /tmp/old/m3 /tmp/bin/m3; do
    echo "=== $m M3_SKIP_LAUNCHES=index_topk ($(date +%T))"
    M3_SKIP_LAUNCHES=index_topk timeout 150 $m bench $B --context 4096 --batch 1 --long-context 131072 2>&1 | grep -E "^\| decode.*/|rror"
  done
} > $OUT/ab.log 2>&1
cat $OUT/ab.log
