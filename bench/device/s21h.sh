#!/usr/bin/env bash
# Session 21, call 8: the closing check of a07097b+ (the early-exit radix
# top-k): the device check (runner, backend_ops, golden, parity standard
# and mono), the standard path's table by PERF.md's protocol (200 replays,
# 3 rounds; batch 1-64 at 4k, batch 1 at 128k), and what every small
# launch but the router costs a b1 layer in the graph (left out together:
# the linears and the router alone; outputs wrong, times right).
set -u
. bench/device/common.sh
m3_setup
m3_verify > $OUT/verify.log 2>&1
cat $OUT/verify.log
timeout 300 /tmp/bin/m3 bench --backend gpu --preset m3.1 --layers 12 --per-layer 6 --batch 1,2,4,8,16,32,64 \
  --context 4096 --long-context 131072 --iters 200 --rounds 3 --out $OUT/table.json > $OUT/table.log 2>&1
echo "exit $?" >> $OUT/table.log
grep -E "^\| decode|exit" $OUT/table.log | tail -12
B="--backend gpu --preset m3.1 --layers 12 --per-layer 6 --iters 40 --rounds 1 --context 4096 --batch 1"
{
  for e in "M3_NONE=1" "M3_SKIP_LAUNCHES=rmsnorm,swiglu,headnorm_rope,moe_combine,attn_partial,attn_combine,index_scores,index_topk"; do
    echo "=== $e ($(date +%T))"
    env $e timeout 150 /tmp/bin/m3 bench $B 2>&1 | grep -E "^\| decode.*/|rror"
  done
} > $OUT/ablate.log 2>&1
cat $OUT/ablate.log
