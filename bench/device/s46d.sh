#!/usr/bin/env bash
# Ran in session 46 (run 1), a record: chunk-minor became the default for
# 17-64 rows after it, so its `base=` now runs chunk-minor too (the
# tile-major grid is `S_CHUNK_MINOR=0`).
# Prepared in session 45 (issue 12), any card, ~250 s cold: plain linear
# launches of more than one 16-row chunk dealt chunk-minor
# (`S_CHUNK_MINOR=1`, a bench option: grid (tiles x chunks, 1, 1), the
# CTAs that read one weight tile run together) against the default grid
# (tiles, chunks), whose chunk 1 re-reads a tile a whole matrix after
# chunk 0 (q | k | v | index ~61 MB and o ~50 MB MXFP8 on the bench model,
# past the H100's 50 MB L2). The MoE layer at b16 (one chunk: a control),
# b32 and b64, 2 rounds interleaved, gated (minor.log).
set -u
. bench/device/common.sh
m3_setup
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
D="S_MMA_WARPS=4 S_MMA_MAXBT=2"
B="--backend gpu --preset m3.1 --layers 12 --per-layer 6 --batch 16,32,64 --context 4096 --iters 40 --rounds 1 --path standard"
m3_defines_ab 2 "$B" base= "minor=$D S_CHUNK_MINOR=1" > "$OUT/minor.log" 2>&1
cut -c1-150 "$OUT/minor.log"
