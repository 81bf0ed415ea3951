#!/usr/bin/env bash
# Session 21, call 2.
# 1. The radix select against the warp rounds between 32k and 128k
#    (M3_INDEX_TOPK_RADIX=0|1, contexts 40960 and 65536: 321 and 513
#    blocks a row), b1 / b4, 2 rounds: whether the warp rounds still win
#    anywhere (else they go).
# 2. Where a b1 / b4 MoE layer's time goes in the graph: the step with each
#    kind of small launch left out (M3_SKIP_LAUNCHES: outputs wrong, times
#    right), and with every small launch left out (the linears alone).
set -u
. bench/device/common.sh
m3_setup
B="--backend gpu --preset m3.1 --layers 12 --per-layer 6 --iters 40 --rounds 1"
{
  for r in 1 2; do
    for x in 0 1; do
      echo "=== M3_INDEX_TOPK_RADIX=$x round $r ($(date +%T))"
      M3_INDEX_TOPK_RADIX=$x timeout 150 /tmp/bin/m3 bench $B --context 40960 --batch 1,4 --long-context 65536 2>&1 | grep -E "^\| decode.*/|rror"
    done
  done
} > $OUT/radix.log 2>&1
cat $OUT/radix.log
SMALL="rmsnorm,swiglu,headnorm_rope,router_small,moe_combine,attn_partial,attn_combine,index_scores,index_topk"
{
  for e in "M3_NONE=1" "M3_SKIP_LAUNCHES=rmsnorm" "M3_SKIP_LAUNCHES=swiglu" "M3_SKIP_LAUNCHES=headnorm_rope" \
           "M3_SKIP_LAUNCHES=router_small" "M3_SKIP_LAUNCHES=moe_combine" "M3_SKIP_LAUNCHES=rmsnorm,swiglu" \
           "M3_SKIP_LAUNCHES=attn_partial,attn_combine,index_scores,index_topk" \
           "M3_SKIP_LAUNCHES=$SMALL" "M3_SKIP_LAUNCHES=m3s_mma_e4m3_r1" "M3_SKIP_LAUNCHES=m3s_mma_fp4_r1" "M3_NONE=1"; do
    echo "=== $e ($(date +%T))"
    env $e timeout 150 /tmp/bin/m3 bench $B --context 4096 --batch 1,4 2>&1 | grep -E "^\| decode.*/|rror"
  done
} > $OUT/ablate.log 2>&1
cat $OUT/ablate.log
