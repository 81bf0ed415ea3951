#!/usr/bin/env bash
# Session 20, call 4 (issue 12 item 5): where a b1 MoE layer's extra ~23 us
# at 128k go. Per-launch profile at b1 4k and 128k (direct launches), then
# in-graph ablations (M3_SKIP_LAUNCHES: outputs wrong, times right) of the
# indexer and attention launches at 4k and 128k.
set -u
. bench/device/common.sh
m3_setup
B="--backend gpu --preset m3.1 --layers 12 --per-layer 6 --iters 40 --rounds 1"
timeout 200 /tmp/bin/m3 bench $B --context 4096 --batch 1 --long-context 131072 --profile > $OUT/profile.log 2>&1
grep -E "^\| decode" $OUT/profile.log | head
{
  for e in "M3_NONE=1" "M3_SKIP_LAUNCHES=index_scores" "M3_SKIP_LAUNCHES=index_topk" "M3_SKIP_LAUNCHES=index_scores,index_topk" \
           "M3_SKIP_LAUNCHES=attn_partial" "M3_SKIP_LAUNCHES=attn_combine" "M3_NONE=1"; do
    echo "=== $e ($(date +%T))"
    env $e timeout 150 /tmp/bin/m3 bench $B --context 4096 --batch 1 --long-context 131072 2>&1 | grep -E "^\| decode.*/|rror|ABLATION"
  done
} > $OUT/ablate.log 2>&1
cat $OUT/ablate.log
