#!/usr/bin/env bash
# Session 45 (issue 12), any card, ~300 s cold: MXFP4 routed launches of
# 9-64 rows on `m3s_mma_fp4_rs` (the general walks at 5 CTAs an SM), now
# the default (`S_ROUTED_SMALL`, ROUTED_SMALL_ROWS), against the general
# entry at 4 (`S_ROUTED_SMALL=0`): the MoE layer at b12 / b16 / b32 / b64,
# 2 rounds interleaved (ab.log). Session 44 measured the first form at b16
# (-3.3%, H100); s44d.sh the second, then 9-16 rows (b16 -3.8%). The warm-up runs --path both at 1 / 4
# / 16 rows, so mono's parity gate sees the alias too (compile-*.log).
set -u
. bench/device/common.sh
m3_setup
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
B="--backend gpu --preset m3.1 --layers 12 --per-layer 6 --batch 12,16,32,64 --context 4096 --iters 40 --rounds 1 --path standard"
m3_defines_ab 2 "$B" rs= "general=S_MMA_WARPS=4 S_MMA_MAXBT=2 S_ROUTED_SMALL=0" > "$OUT/ab.log" 2>&1
cut -c1-150 "$OUT/ab.log"
grep -hE "mono parity|differ|rror" /tmp/compile-*.log | cut -c1-200 | head -8
