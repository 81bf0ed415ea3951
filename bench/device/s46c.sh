#!/usr/bin/env bash
# Prepared in session 45 (issue 12), any card, ~250 s cold: the routed
# experts' PDL edges again, now that MXFP4 routed launches of 9-64 rows
# run `m3s_mma_fp4_rs` at 5 CTAs an SM. `PathOptions::routed_pdl_max_rows`
# (8: steps past 8 rows launch their routed experts without PDL) was set on
# the H200 in session 17 (-2.4% at 16 rows without PDL, -0.7% at 32 / 64,
# +2-3% at 1, +-0 at 4) on the kernels of then. The MoE layer at b4 / b12
# / b16 / b32: the default against `M3_ROUTED_PDL_MAX_ROWS=max` (PDL
# always) and `=1` (only one-row steps keep it), 2 rounds interleaved
# (pdl.log).
set -u
. bench/device/common.sh
m3_setup
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
B="--backend gpu --preset m3.1 --layers 12 --per-layer 6 --batch 4,12,16,32 --context 4096 --iters 40 --rounds 1 --path standard"
m3_env_ab M3_ROUTED_PDL_MAX_ROWS 2 "$B" base= always=max one=1 > "$OUT/pdl.log" 2>&1
cut -c1-150 "$OUT/pdl.log"
