#!/usr/bin/env bash
# Session 21, call 5: the fp8 index scores on f16 operands (q with a power
# of two a head, one E4M3 -> f16 conversion a key pair; 297 instructions
# in place of 543 in the two-tile loop, NVRTC 13.5 SASS) and the block
# table by shift for power-of-two pages.
# 1. The indexer tests against f64 (41-5001 blocks a row) and the runner
#    tests (selections against the CPU runner; mono bitwise the standard).
# 2. A/B against the binary of calls 3-4 (/tmp/old/m3), MoE layer at b1 /
#    b4 4k and b1 128k, 2 interleaved rounds; a direct-launch profile of
#    the new one at 4k and 128k (index_scores a launch).
set -u
. bench/device/common.sh
m3_setup old
{
  echo "=== test m3_gpu standard::attn, REQUIRE_GPU=1 ($(date +%T))"
  REQUIRE_GPU=1 timeout 200 /tmp/bin/test-m3_gpu standard::attn --test-threads=1 --nocapture 2>&1 \
    | grep -E "^test result|panicked|failure|blocks a row" | head -20
  echo "=== test runner, REQUIRE_GPU=1 ($(date +%T))"
  REQUIRE_GPU=1 timeout 240 /tmp/bin/test-runner --test-threads=1 --nocapture 2>&1 | grep -E "^test result|panicked|bitwise|FAIL|blocks differ" | tail -12
} > $OUT/test.log 2>&1
cat $OUT/test.log
B="--backend gpu --preset m3.1 --layers 12 --per-layer 6 --iters 40 --rounds 1"
{
  for r in 1 2; do
    for m in /tmp/old/m3 /tmp/bin/m3; do
      echo "=== $m round $r ($(date +%T))"
      timeout 150 $m bench $B --context 4096 --batch 1,4 --long-context 131072 2>&1 | grep -E "^\| decode.*/|rror"
    done
  done
} > $OUT/ab.log 2>&1
cat $OUT/ab.log
timeout 200 /tmp/bin/m3 bench $B --context 4096 --batch 1 --long-context 131072 --profile > $OUT/profile.log 2>&1
grep -E "index_scores|index_topk|^profile" $OUT/profile.log
