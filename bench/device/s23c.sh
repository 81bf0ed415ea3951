#!/usr/bin/env bash
# Session 23 (issue 12), prepared: the timing A/B of the E2M1 tile layout
# and row-scaled x (after s23b.sh's device check passes).
# The kernel microbench, old (ce71302, .carry/old.tar.xz) and new,
# interleaved, 2 rounds: MXFP4 / NVFP4 / MXFP8 on the tall launch and
# 8 x [6144, 6144], 1 and 16 rows, grouped experts 4 and 16; the new
# build's rows `x/row` are the row-scaled form. The MoE layer's A/B is
# s23e.sh (a call of its own).
set -u
. bench/device/common.sh
m3_setup old
for r in 1 2; do
  for b in old bin; do
    for shape in tall stack; do
      if [ $shape = tall ]; then a=(--kernel-stack 1x49152 --kernel-experts ""); else a=(--kernel-experts 4,16); fi
      echo "=== kernels $b $shape round $r ($(date +%T))"
      timeout 200 /tmp/$b/m3 bench --backend gpu --preset m3.1 --kernels "${a[@]}" --kernel-rows 1,16 \
        --kernel-formats mxfp4,nvfp4,mxfp8 2>&1 | grep -E "^\||rror" | grep -v "| default |"
    done
  done
done > $OUT/kernels.log 2>&1
cat $OUT/kernels.log
