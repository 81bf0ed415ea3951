#!/usr/bin/env bash
# Prepared in session 46 (issue 12), any card, ~250 s cold: chunk-minor
# plain launches past the default's 64 rows (`S_CHUNK_MINOR_MAX=512`, a
# bench option: every small-step launch, i.e. prefill-sized steps up to
# SMALL_TILE_MAX_ROWS) against the default (tile-major past 64 rows). The
# tile-major grid reads each weight tile once a 16-row chunk: q | k | v |
# index (~61 MB) and o (~50 MB) pass through the H100's 50 MB L2 between
# the re-reads, while x (512 rows x 6144 x 2 B = 6 MB as f16) stays in L2
# under either order: the reading is that chunk-minor removes weight
# re-reads at no cost in x (not measured). Steps of 128 / 256 / 512 rows
# (one sequence a row, context 512), 2 rounds interleaved (prefill.log).
set -u
. bench/device/common.sh
m3_setup
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
D="S_MMA_WARPS=4 S_MMA_MAXBT=2"
B="--backend gpu --preset m3.1 --layers 12 --per-layer 6 --batch 128,256,512 --context 512 --iters 10 --warmup 3 --rounds 1 --path standard"
m3_defines_ab 2 "$B" base= "minor512=$D S_CHUNK_MINOR_MAX=512" > "$OUT/prefill.log" 2>&1
cut -c1-150 "$OUT/prefill.log"
