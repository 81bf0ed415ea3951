#!/usr/bin/env bash
# Prepared in session 48 (issue 12), any card, ~120 s warm: the 2048-row
# bound of the small-step build and chunk-minor launches (session 48's new
# defaults, measured on the H100 through env overrides) against the old
# 512 one, in the committed code: steps of 1024 / 2048 rows (one sequence
# a row, context 512), 2 rounds interleaved. `old` is the session-47
# default: the 8-warp build past 512 rows, chunk-minor to 512
# (bound.log). On the H200 this is the first measurement of the bound.
# The `old` variant's units compile on the card through Gpu::precompile
# (side by side; its "compiling GPU kernels" lines are printed).
set -u
. bench/device/common.sh
m3_setup
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
D="S_MMA_WARPS=4 S_MMA_MAXBT=2"
variant() {
  local v=$1
  shift
  case "$v" in
    new) "$@" ;;
    old) env M3_SMALL_STEP_MAX_ROWS=512 M3_SMALL_STEP_DEFINES="$D S_CHUNK_MINOR_MAX=512" "$@" ;;
    *) echo "no variant $v" >&2; return 1 ;;
  esac
}
B="--backend gpu --preset m3.1 --layers 12 --per-layer 6 --batch 1024,2048 --context 512 --iters 5 --warmup 2 --rounds 1 --path standard"
m3_variants 2 "$B" new old > "$OUT/bound.log" 2>&1
grep -E "^\| decode|===|rror|compil" "$OUT/bound.log" | cut -c1-200
grep -h "compil" /tmp/compile-new.log /tmp/compile-old.log | cut -c1-200 | tee "$OUT/precompile.log"
