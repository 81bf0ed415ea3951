#!/usr/bin/env bash
# Session 38 (issue 13), any card, ~300 s. Session 35 run 3's marginal
# costs at b4 and b16: `M3_SKIP_LAUNCHES=label` leaves the launch out of
# the standard path's graph and the op (with its grid barrier) out of the
# mono program (outputs wrong, times right; a row counts only where
# MB/step is the baseline's). Where does mono's b16 deficit (~300 us a MoE
# layer) sit: the mono b16 profile has the sparse attention partial at
# 75 us a layer, qkv at 53 and o at 43 (their bytes at the ceiling: 20,
# 16). m3.1 --layers 12 --per-layer 6, b4 and b16, --path both, no gate;
# the baseline first and last -> skip.log; then the standard path's
# direct-launch profile at b16 -> prof-std-b16.log.
set -u
. bench/device/common.sh
m3_setup
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
W="--backend gpu --preset m3.1 --layers 4 --batch 4,16 --iters 1 --rounds 1 --warmup 1 --parity-steps 0 --path both"
timeout 300 /tmp/bin/m3 bench $W > $OUT/compile.log 2>&1; echo "compile exit $? ($(date +%T))"
B="--backend gpu --preset m3.1 --layers 12 --per-layer 6 --batch 4,16 --context 4096 --iters 30 --rounds 1 --path both --parity-steps 0"
for s in none attn_partial attn_combine index_scores index_topk headnorm_rope rmsnorm router_small moe_combine \
  m3s_mma_e4m3_r8,m3s_mma_e4m3 m3s_mma_fp4_r8,m3s_mma_fp4 none; do
  echo "=== skip $s ($(date +%T))"
  if [ "$s" = none ]; then
    timeout 60 /tmp/bin/m3 bench $B 2>&1
  else
    M3_SKIP_LAUNCHES=$s timeout 60 /tmp/bin/m3 bench $B 2>&1
  fi | grep -E "^\| \[.*decode.*/|rror|ABLATION"
done > $OUT/skip.log 2>&1
cut -c1-130 $OUT/skip.log
timeout 60 /tmp/bin/m3 bench --backend gpu --preset m3.1 --layers 12 --context 4096 --iters 1 --rounds 1 --warmup 0 \
  --path standard --profile --batch 16 > $OUT/prof-std-b16.log 2>&1
echo "=== standard profile b16 (exit $?)"; grep -B2 -A30 "^profile decode" $OUT/prof-std-b16.log | cut -c1-120 | head -40
# The sparse attention partial inlined into the interpreter too
# (S_MONO_INLINE_ATTN 6 = 2 | 4; NVRTC 13.0: called, its function spills
# 920 / 1324 bytes; inlined, the interpreter 724 / 1084, from 104 / 232),
# against the default, gated, 1 round b1 / b4 / b16 -> ab.log.
B="--backend gpu --preset m3.1 --layers 12 --per-layer 6 --batch 1,4,16 --context 4096 --iters 40 --rounds 1 --path both --parity-steps 16"
m3_mono_ab 1 "$B" base= sparse=S_MONO_INLINE_ATTN=6 > $OUT/ab.log 2>&1
grep -E "^===|compiled|\[mono\]|differ|rror|failed" $OUT/ab.log | cut -c1-150
