#!/usr/bin/env bash
# Session 20, call 9: the long-context indexer test again, its check now
# aware that past SK_SMEM blocks the top-k marks its picks NaN in the
# scores in place (call 8's failures were exactly those marks).
set -u
. bench/device/common.sh
m3_setup
REQUIRE_GPU=1 timeout 120 /tmp/bin/test-m3_gpu long_context_indexer --test-threads=1 --nocapture 2>&1 \
  | grep -E "^test |test result|panicked|failure|blocks a row|row [0-9]|near tie" | head -40 | tee $OUT/test.log
