#!/usr/bin/env bash
# Session 21, call 6: why the f16 index scores (34% faster a launch at 128k,
# direct) change nothing in the graph at 128k. In-graph ablations at b1
# 4k / 128k, old (calls 3-4) and new binaries: as is, without the
# o-projection L2 prefetch beside the attention chain, without the index
# scores / the top-k (outputs wrong, times right).
set -u
. bench/device/common.sh
m3_setup old
B="--backend gpu --preset m3.1 --layers 12 --per-layer 6 --iters 40 --rounds 1 --context 4096 --batch 1 --long-context 131072"
{
  for e in "M3_NONE=1" "M3_L2_PREFETCH_MIB=0" "M3_SKIP_LAUNCHES=index_scores" "M3_SKIP_LAUNCHES=index_topk" \
           "M3_SKIP_LAUNCHES=index_scores,index_topk" "M3_BESIDE=off"; do
    for m in /tmp/old/m3 /tmp/bin/m3; do
      echo "=== $m $e ($(date +%T))"
      env $e timeout 150 $m bench $B 2>&1 | grep -E "^\| decode.*/|rror"
    done
  done
} > $OUT/ablate.log 2>&1
cat $OUT/ablate.log
