#!/usr/bin/env bash
# (SI_G existed only in the builds this ran with: run6/si_scores_g.patch.)
# Session 20, call 7 (issue 12 item 5): the fp8 index scores with a lane's
# key share as two 16-byte chunks at compile time (di <= 128) and SI_G =
# 1 / 2 blocks at once (.carry/g1, g2), against 538b319 (old); SI_G = 4
# measured +1.5-2.9% in call 6. Values: greedy `m3 generate` on small with
# one score CTA a row, g1 and g2 against old. Then interleaved, 2 rounds.
set -u
. bench/device/common.sh
m3_setup old g1 g2
{
  CK=/tmp/ck; mkdir -p $CK
  /tmp/bin/m3 synth --preset small --experts mxfp4 --dense mxfp8 --out $CK/small --draft-layers 0 -q
  for b in old g1 g2; do
    M3_INDEX_GRID_X=1 timeout 120 /tmp/$b/m3 generate --model $CK/small --backend gpu --kv-dtype fp8_e4m3 --prompt "the quick brown fox" \
      --max-tokens 700 --temperature 0 > /tmp/gen.log 2>&1
    echo "generate [$b, M3_INDEX_GRID_X=1]: rc $?, token ids md5 $(grep -o 'tokens \[.*\]' /tmp/gen.log | md5sum | cut -c1-12), $(grep -o 'tokens \[.*\]' /tmp/gen.log | wc -c) bytes"
  done
} > $OUT/values.log 2>&1
cat $OUT/values.log
B="--backend gpu --preset m3.1 --layers 12 --per-layer 6 --iters 40 --rounds 1"
{
  for r in 1 2; do
    for b in old g1 g2; do
      echo "=== $b round $r ($(date +%T))"
      timeout 150 /tmp/$b/m3 bench $B --context 4096 --batch 1,4 --long-context 131072 2>&1 | grep -E "^\| decode.*/|rror"
      timeout 150 /tmp/$b/m3 bench $B --context 131072 --batch 4 2>&1 | grep -E "^\| decode.*/|rror"
    done
  done
} > $OUT/ab.log 2>&1
cat $OUT/ab.log
