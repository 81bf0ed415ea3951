#!/usr/bin/env bash
# Prepared in session 19 for the next session's first call (issue 12):
# the device checks of what session 19 changed after its device time.
# 1. the tensor-core linears per compiled variant against f64
#    (`variants_match_an_f64_reference`: K = 160 among its shapes, so the
#    `_any` entry points' FP8 word-by-word loads in the coalesced layout;
#    it was not in session 19's verify), now with the S_H_STRIDE and
#    S_H_TILES bench variants (nine compiles on a cold kernel cache: first,
#    with the longest limit);
# 2. m3_verify (REQUIRE_GPU=1): runner, backend_ops (now with
#    engine_linears_take_k_past_whole_chunks), golden, parity standard and
#    mono. Logs are written as they go (a call cut by its limit still
#    returns them).
set -u
. bench/device/common.sh
m3_setup
echo "=== test m3_gpu linears against f64 ($(date +%T))" > $OUT/variants.log
REQUIRE_GPU=1 timeout 360 /tmp/bin/test-m3_gpu variants_match_an_f64_reference ptpc_matches --test-threads=1 --nocapture 2>&1 \
  | grep -E "^test |test result|panicked|fail|FAIL|any_scale" | tail -30 >> $OUT/variants.log
echo "exit ${PIPESTATUS[0]} ($(date +%T))" >> $OUT/variants.log
cat $OUT/variants.log
m3_verify > $OUT/verify.log 2>&1
cat $OUT/verify.log
