#!/usr/bin/env bash
# (M3_INDEX_AHEAD existed only in the build this ran with: NOTES session 20 run 3.)
# Session 20, call 3 (issue 12 item 5, the 128k scan): index-score CTAs
# ask L2 for their next A scored blocks (M3_INDEX_AHEAD=A; the first ones
# before the dependency wait), A = 0 (before) / 2 / 4 / 8, interleaved, 2
# rounds: MoE layer at 4k (b1, b4; grids sized for 128k) and at 128k
# (b1 with --long-context, b4 alone). First the values: greedy `m3
# generate` on small (fp8 cache, 700 tokens: index blocks of 64, top-8,
# so the scan is live past 512) with one score CTA a row
# (M3_INDEX_GRID_X=1: every block of a row in one CTA's loop, so the
# look-ahead runs at this length) and A = 0 / 3 against the default grid.
set -u
. bench/device/common.sh
m3_setup
{
  CK=/tmp/ck; mkdir -p $CK
  /tmp/bin/m3 synth --preset small --experts mxfp4 --dense mxfp8 --out $CK/small --draft-layers 0 -q
  for e in "M3_NONE=1" "M3_INDEX_GRID_X=1 M3_INDEX_AHEAD=0" "M3_INDEX_GRID_X=1 M3_INDEX_AHEAD=3"; do
    env $e timeout 120 /tmp/bin/m3 generate --model $CK/small --backend gpu --kv-dtype fp8_e4m3 --prompt "the quick brown fox" \
      --max-tokens 700 --temperature 0 > /tmp/gen.log 2>&1
    echo "generate [$e]: rc $?, token ids md5 $(grep -o 'tokens \[.*\]' /tmp/gen.log | md5sum | cut -c1-12), $(grep -o 'tokens \[.*\]' /tmp/gen.log | wc -c) bytes"
  done
} > $OUT/values.log 2>&1
cat $OUT/values.log
B="--backend gpu --preset m3.1 --layers 12 --per-layer 6 --iters 40 --rounds 1"
{
  for r in 1 2; do
    for a in 0 2 4 8; do
      echo "=== M3_INDEX_AHEAD=$a round $r ($(date +%T))"
      M3_INDEX_AHEAD=$a timeout 150 /tmp/bin/m3 bench $B --context 4096 --batch 1,4 --long-context 131072 2>&1 | grep -E "^\| decode.*/|rror"
      M3_INDEX_AHEAD=$a timeout 150 /tmp/bin/m3 bench $B --context 131072 --batch 4 2>&1 | grep -E "^\| decode.*/|rror"
    done
  done
} > $OUT/ahead.log 2>&1
cat $OUT/ahead.log
