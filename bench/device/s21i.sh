#!/usr/bin/env bash
# Session 21, call 9 (issue 12 item 5): the speculative verify step (one
# sequence, K + 1 = 4 rows) against its byte floor, first measured since
# session 4; the batch-1 and batch-4 decode steps in the same rounds.
set -u
. bench/device/common.sh
m3_setup
timeout 200 /tmp/bin/m3 bench --backend gpu --preset m3.1 --layers 12 --per-layer 6 --context 4096 --batch 1,4 \
  --verify-k 3 --iters 100 --rounds 2 --out $OUT/verify.json > $OUT/verify.log 2>&1
echo "exit $?" >> $OUT/verify.log
grep -E "^ceiling|^\| (decode|verify)|exit" $OUT/verify.log
