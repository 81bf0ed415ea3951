#!/usr/bin/env bash
# Prepared in session 47 (issue 12), any card, ~250 s cold: where the
# small-step build stops paying. SMALL_TILE_MAX_ROWS (512) came from
# session 15 (H200: the 8-warp build faster from 1024 rows); since then
# the small-step build's routed launches lost their empty CTAs (session
# 47: a MoE layer -42% at 512 rows, the 8-warp build's -19% at 1024) and
# its plain launches run chunk-minor. Steps of 1024 / 2048 rows (one
# sequence a row, context 512), 2 rounds interleaved: the default (8-warp
# past 512 rows) against the small-step build to 4096 rows
# (M3_SMALL_STEP_MAX_ROWS=4096), with chunk-minor to 512 rows (its
# default) and to 4096 (S_CHUNK_MINOR_MAX=4096) (crossover.log).
set -u
. bench/device/common.sh
m3_setup
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
D="S_MMA_WARPS=4 S_MMA_MAXBT=2"
variant() {
  local v=$1
  shift
  case "$v" in
    base) "$@" ;;
    small) env M3_SMALL_STEP_MAX_ROWS=4096 "$@" ;;
    smallminor) env M3_SMALL_STEP_MAX_ROWS=4096 M3_SMALL_STEP_DEFINES="$D S_CHUNK_MINOR_MAX=4096" "$@" ;;
    *) echo "no variant $v" >&2; return 1 ;;
  esac
}
B="--backend gpu --preset m3.1 --layers 12 --per-layer 6 --batch 1024,2048 --context 512 --iters 5 --warmup 2 --rounds 1 --path standard"
m3_variants 2 "$B" base small smallminor > "$OUT/crossover.log" 2>&1
cut -c1-150 "$OUT/crossover.log"
