#!/usr/bin/env bash
# Session 35 (issue 13), any card, ~380 s. s35d.sh's inlined one-row
# walks (S_MONO_INLINE_LIN=3, now the CUDA default: b1 -6.5%, b4 +1.2%)
# against the 2-8-row walks inlined too (15: the interpreter 24 / 104
# bytes of spills, NVRTC 13.0) and the 9-16-row general bodies too (63:
# 28 / 132), and the split attention partial inlined beside the default
# (attn: S_MONO_INLINE_ATTN=2, the interpreter 64 / 152 bytes; 10.5 us
# a b1 mono layer against 5.1 on the standard path in session 35's
# ablation). The same bits. Variants base (3), i15, i63, attn, compiled first,
# interleaved, 2 rounds, m3.1 --layers 12 --per-layer 6, b1 / b4 / b16,
# --path both, each after a 16-step gate -> ab.log. (Its first run, in
# session 35, was refused: the whitelist then took 0-3 only.)
set -u
. bench/device/common.sh
m3_setup
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
B="--backend gpu --preset m3.1 --layers 12 --per-layer 6 --batch 1,4,16 --context 4096 --iters 40 --rounds 1 --path both --parity-steps 16"
m3_mono_ab 2 "$B" base= i15=S_MONO_INLINE_LIN=15 i63=S_MONO_INLINE_LIN=63 attn=S_MONO_INLINE_ATTN=2 > $OUT/ab.log 2>&1
grep -E "^===|compiled|\[mono\]|differ|rror|failed" $OUT/ab.log | cut -c1-150
