#!/usr/bin/env bash
# Session 25 (issue 12): the MoE layer at b1 / b4 / b16, 2 rounds
# interleaved: ce71302 (.carry/old.tar.xz), f067e34 (.carry/f06.tar.xz:
# session 23's layout and row-scaled x, the NVFP4 fold), and the build with
# MXFP8's one-row walk per-block only (.carry/bin.tar.xz); then the three
# builds' per-launch profiles at b1 (direct launches).
set -u
. bench/device/common.sh
m3_setup old f06
m3_ab 2 "--backend gpu --preset m3.1 --layers 12 --per-layer 6 --iters 40 --rounds 1 --batch 1,4,16" \
  /tmp/old/m3 /tmp/f06/m3 /tmp/bin/m3 > $OUT/layer.log 2>&1
cat $OUT/layer.log
for b in old f06 bin; do
  echo "=== profile $b"
  timeout 60 /tmp/$b/m3 bench --backend gpu --preset m3.1 --layers 12 --iters 20 --rounds 1 --batch 1 --profile 2>&1 \
    | grep -E " ms .*%.*x[0-9]+" | head -8
done > $OUT/prof.log 2>&1
cat $OUT/prof.log
