#!/usr/bin/env bash
# Prepared in session 46 (issues 12, 13), any card, ~300 s cold: route
# records of at most 16 pairs (`M3_ROUTE_CHUNK=1`, a bench option:
# PathOptions::route_chunk) against one record an expert. A routed launch
# of a step of t > 16 rows runs grid (tiles, slots, ceil(t / 16)); a
# slot's z-blocks past its pairs are CTAs that read the record and exit:
# at b64 (128 slots, ~2 pairs a slot) 3 of every 4 CTAs of the gate + up
# and down launches, ~147k a launch on the bench model. The reading (not
# measured) is that those empty CTAs are part of why the MoE layer falls
# from ~75% (b16) to ~62% (b32) and ~53% (b64) on the H100. Chunked
# records put each expert's pairs on ceil(c / 16) slots and the launch on
# one z-block. The MoE layer at b16 (control: one z-block either way) /
# b32 / b64 / b128, 2 rounds interleaved, standard path
# (route.log); then mono at b32 / b64 (wide mono, its parity gate on),
# one round (route-mono.log).
set -u
. bench/device/common.sh
m3_setup
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
B="--backend gpu --preset m3.1 --layers 12 --per-layer 6 --batch 16,32,64,128 --context 4096 --iters 20 --rounds 1 --path standard"
m3_env_ab M3_ROUTE_CHUNK 2 "$B" base= chunk=1 > "$OUT/route.log" 2>&1
cut -c1-150 "$OUT/route.log"
B="--backend gpu --preset m3.1 --layers 12 --per-layer 6 --batch 32,64 --context 4096 --iters 20 --rounds 1 --path both --parity-steps 4"
m3_env_ab M3_ROUTE_CHUNK 1 "$B" base= chunk=1 > "$OUT/route-mono.log" 2>&1
grep -E "^\| decode|parity|identical|differ|rror" "$OUT/route-mono.log" | cut -c1-150
