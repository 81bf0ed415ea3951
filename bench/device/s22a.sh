#!/usr/bin/env bash
# Prepared in session 21 for session 22's first call.
# 1. The GPU unit tests (test-m3_gpu, REQUIRE_GPU=1): the linear variants
#    against f64 and the long-context indexer, last run before db38290
#    merged their two random generators into standard::TestRng (the same
#    values by construction).
# 2. The device check (m3_verify: runner, backend_ops, golden, parity
#    standard and mono).
set -u
. bench/device/common.sh
m3_setup
{
  echo "=== test m3_gpu, REQUIRE_GPU=1 ($(date +%T))"
  REQUIRE_GPU=1 timeout 400 /tmp/bin/test-m3_gpu --test-threads=1 --nocapture 2>&1 \
    | grep -E "^test .*(ok|FAILED)$|^test result|panicked|failure" | tail -40
} > $OUT/test.log 2>&1
cat $OUT/test.log
m3_verify > $OUT/verify.log 2>&1
cat $OUT/verify.log
