#!/usr/bin/env bash
# Session 25 (issue 12): s23c.sh's kernel A/B (ce71302 in .carry/old.tar.xz
# against the new build: the E2M1 tile layout, row-scaled x `x/row`) with
# the new build's NVFP4 scale fold (S_NV_FOLD, f067e34) timed against
# itself turned off: the variant `S_MMA_WARPS=4 S_MMA_MAXBT=2 S_NV_FOLD=0`
# beside the small-step build. 2 rounds, interleaved.
set -u
. bench/device/common.sh
m3_setup old
for r in 1 2; do
  for b in old bin; do
    v=()
    [ $b = bin ] && v=(--variants "S_MMA_WARPS=4 S_MMA_MAXBT=2 S_NV_FOLD=0")
    for shape in tall stack; do
      if [ $shape = tall ]; then a=(--kernel-stack 1x49152 --kernel-experts ""); else a=(--kernel-experts 4,16); fi
      echo "=== kernels $b $shape round $r ($(date +%T))"
      timeout 200 /tmp/$b/m3 bench --backend gpu --preset m3.1 --kernels "${a[@]}" "${v[@]}" --kernel-rows 1,16 \
        --kernel-formats mxfp4,nvfp4,mxfp8 2>&1 | grep -E "^\||rror" | grep -v "| default |"
    done
  done
done > $OUT/kernels.log 2>&1
cat $OUT/kernels.log
