#!/usr/bin/env bash
# Session 21, call 3: the radix select as the only form past 256 blocks
# (the warp rounds removed after runs 1-2). The long-context indexer test
# (41-5001 blocks a row against f64; scores now only read, so every score
# is compared) and the attention unit tests, then the device check.
set -u
. bench/device/common.sh
m3_setup
{
  echo "=== test m3_gpu standard::attn, REQUIRE_GPU=1 ($(date +%T))"
  REQUIRE_GPU=1 timeout 200 /tmp/bin/test-m3_gpu standard::attn --test-threads=1 --nocapture 2>&1 \
    | grep -E "^test |test result|panicked|failure|blocks a row" | head -40
} > $OUT/test.log 2>&1
cat $OUT/test.log
m3_verify > $OUT/verify.log 2>&1
cat $OUT/verify.log
