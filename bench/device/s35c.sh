#!/usr/bin/env bash
# Session 35 (issue 13), any card, ~300 s. Each op's marginal cost in a b1
# MoE layer on both paths, from one call: `M3_SKIP_LAUNCHES=label` leaves
# that launch out of the standard path's graph and, through the recorder,
# the op (and its grid barrier) out of the mono program (outputs wrong,
# times right; a row counts only where MB/step stays 298.8). m3.1
# --layers 12 --per-layer 6, b1, --path both, no gate; the baseline first
# and last -> skip.log.
set -u
. bench/device/common.sh
m3_setup
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
W="--backend gpu --preset m3.1 --layers 4 --batch 1 --iters 1 --rounds 1 --warmup 1 --parity-steps 0 --path both"
timeout 300 /tmp/bin/m3 bench $W > $OUT/compile.log 2>&1; echo "compile exit $? ($(date +%T))"
B="--backend gpu --preset m3.1 --layers 12 --per-layer 6 --batch 1 --context 4096 --iters 40 --rounds 1 --path both --parity-steps 0"
for s in none rmsnorm headnorm_rope index_scores index_topk attn_partial attn_combine swiglu moe_combine router_small \
  m3s_mma_e4m3_r1 m3s_mma_fp4_r1 none; do
  echo "=== skip $s ($(date +%T))"
  if [ "$s" = none ]; then
    timeout 60 /tmp/bin/m3 bench $B 2>&1
  else
    M3_SKIP_LAUNCHES=$s timeout 60 /tmp/bin/m3 bench $B 2>&1
  fi | grep -E "^\| \[.*decode.*/|rror|ABLATION"
done > $OUT/skip.log 2>&1
cut -c1-130 $OUT/skip.log
