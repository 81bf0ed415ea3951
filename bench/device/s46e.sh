#!/usr/bin/env bash
# Session 46 (issue 12), any card, ~400 s cold: chunk-minor plain launches
# of 17-64 rows now the default (CHUNK_MINOR_MAX_ROWS). The MoE layer at
# b32 / b64 against `S_CHUNK_MINOR=0`, one round (ab.log); the linears'
# bitwise unit test (chunk-minor against the tile-major grid; unit.log);
# then the device check (verify.log). AB=0 leaves the A/B out (~200 s
# warm without it).
set -u
. bench/device/common.sh
m3_setup
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
D="S_MMA_WARPS=4 S_MMA_MAXBT=2"
B="--backend gpu --preset m3.1 --layers 12 --per-layer 6 --batch 32,64 --context 4096 --iters 40 --rounds 1 --path standard"
if [ "${AB:-1}" = 1 ]; then
  m3_defines_ab 1 "$B" base= "tilemajor=$D S_CHUNK_MINOR=0" > "$OUT/ab.log" 2>&1
  cut -c1-150 "$OUT/ab.log"
fi
m3_unit 300 the_halved_batch > "$OUT/unit.log" 2>&1; cat "$OUT/unit.log"
m3_verify > "$OUT/verify.log" 2>&1; cat "$OUT/verify.log"
