#!/usr/bin/env bash
# (SI_G existed only in the builds this ran with: run6/si_scores_g.patch.)
# Session 20, call 6 (issue 12 item 5): the tensor-core index scores take
# SI_G = 4 of a CTA's blocks at once (every block's key tile in flight
# before the first products, one barrier for the four) at 128 registers
# (two CTAs an SM), against 538b319 (one block at a time). Values first:
# greedy `m3 generate` on small (fp8 cache, 700 tokens, scan live past
# 512) old / new at the default grid and new with one score CTA a row
# (M3_INDEX_GRID_X=1: ~11 blocks in one CTA, so groups of four, forced
# blocks among them); the runner test (GPU vs CPU case by case). Then
# interleaved, 2 rounds: MoE layer at 4k (b1, b4) and 128k (b1, b4).
set -u
. bench/device/common.sh
m3_setup old
{
  CK=/tmp/ck; mkdir -p $CK
  /tmp/bin/m3 synth --preset small --experts mxfp4 --dense mxfp8 --out $CK/small --draft-layers 0 -q
  for c in "old M3_NONE=1" "bin M3_NONE=1" "bin M3_INDEX_GRID_X=1" "old M3_INDEX_GRID_X=1"; do
    set -- $c
    env $2 timeout 120 /tmp/$1/m3 generate --model $CK/small --backend gpu --kv-dtype fp8_e4m3 --prompt "the quick brown fox" \
      --max-tokens 700 --temperature 0 > /tmp/gen.log 2>&1
    echo "generate [$c]: rc $?, token ids md5 $(grep -o 'tokens \[.*\]' /tmp/gen.log | md5sum | cut -c1-12), $(grep -o 'tokens \[.*\]' /tmp/gen.log | wc -c) bytes"
  done
  echo "=== runner test (standard vs CPU, mono bitwise), REQUIRE_GPU=1 ($(date +%T))"
  REQUIRE_GPU=1 timeout 200 /tmp/bin/test-runner --test-threads=1 --nocapture gpu_runner_matches mono_path 2>&1 | grep -E "^test |^test result|panicked|FAIL" | tail -6
} > $OUT/values.log 2>&1
cat $OUT/values.log
B="--backend gpu --preset m3.1 --layers 12 --per-layer 6 --iters 40 --rounds 1"
{
  for r in 1 2; do
    for b in old bin; do
      echo "=== $b round $r ($(date +%T))"
      timeout 150 /tmp/$b/m3 bench $B --context 4096 --batch 1,4 --long-context 131072 2>&1 | grep -E "^\| decode.*/|rror"
      timeout 150 /tmp/$b/m3 bench $B --context 131072 --batch 4 2>&1 | grep -E "^\| decode.*/|rror"
    done
  done
} > $OUT/ab.log 2>&1
cat $OUT/ab.log
