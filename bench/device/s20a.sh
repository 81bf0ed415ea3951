#!/usr/bin/env bash
# Prepared in session 19 for the next session's first call (issue 12).
# 1. verify (REQUIRE_GPU=1, m3_verify): it now includes backend_ops'
#    engine_linears_take_k_past_whole_chunks, the first device run of the
#    `_any` entry points' FP8 word-by-word loads in the coalesced layout
#    (fixed after session 19's device time: K % 128 != 0 with a full chunk
#    read the old slots; no preset has such a K);
# 2. s19h.sh: S_H_STRIDE=1 against the default on the kernel microbench.
set -u
. bench/device/common.sh
m3_setup
m3_verify > $OUT/verify.log 2>&1
cat $OUT/verify.log
REQUIRE_GPU=1 timeout 120 /tmp/bin/test-backend_ops engine_linears --nocapture 2>&1 | grep -E "^K |test result|panicked" > $OUT/klin.log
cat $OUT/klin.log
S="S_MMA_WARPS=4 S_MMA_MAXBT=2"
for st in 1x49152 ""; do
  echo "=== stack '$st' ($(date +%T))" >> $OUT/mb.log
  timeout 200 /tmp/bin/m3 bench --backend gpu --preset m3.1 --kernels --kernel-rows 1,4,16 --kernel-formats mxfp4,mxfp8,nvfp4 \
    --kernel-stack "$st" --kernel-experts 4,16 --variants "$S S_H_STRIDE=1" 2>&1 | grep -E "^\||rror" | grep -v "| default |" >> $OUT/mb.log
done
cat $OUT/mb.log
