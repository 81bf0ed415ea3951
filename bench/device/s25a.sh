#!/usr/bin/env bash
# Session 25 (issues 12, 13): the device time left after the refused starts
# fits one short pass over session 23's plan, most telling first, each
# part into its own $OUT log as it ends (a call cut short keeps the parts
# done). Binary: f067e34 (.carry/bin.tar.xz: session 23's E2M1 tile
# layout, row-scaled x, the two folds off by default, session 25's NVFP4
# scale fold); before: ce71302 (.carry/old.tar.xz).
# 1. check.log: the GPU unit tests of the linears (f64 reference, every
#    variant, nvfp4-wide's subnormal block scales, row-scaled x flag on
#    and off) and of the producers, REQUIRE_GPU=1; the mono path bitwise
#    the standard one with both folds on;
# 2. kernels.log: the kernel microbench, old and new, one round (s23c.sh's
#    cases; the new build with the NVFP4 fold off as a variant beside it);
# 3. layer.log: the MoE layer at b1 / b4 / b16, one round: old; new with
#    M3_ROW_SCALED_X=0; new; new with both folds.
# The rest of the plan (m3_verify, the figures of record) is s25b.sh.
set -u
. bench/device/common.sh
m3_setup old
{
  m3_unit 200 linear pointwise
  echo "=== test runner mono_path_is_bitwise_the_standard_path, both folds on ($(date +%T))"
  M3_FOLD_COMBINE=1 M3_FUSE_SWIGLU=1 REQUIRE_GPU=1 timeout 150 /tmp/bin/test-runner mono_path_is_bitwise \
    --test-threads=1 --nocapture 2>&1 | grep -E "^test |^test result|panicked|bitwise|FAIL" | tail -12
  echo "=== end ($(date +%T))"
} > $OUT/check.log 2>&1
cat $OUT/check.log
for b in bin old; do
  v=()
  [ $b = bin ] && v=(--variants "S_MMA_WARPS=4 S_MMA_MAXBT=2 S_NV_FOLD=0")
  for shape in stack tall; do
    if [ $shape = tall ]; then a=(--kernel-stack 1x49152 --kernel-experts ""); else a=(--kernel-experts 4,16); fi
    echo "=== kernels $b $shape ($(date +%T))"
    timeout 100 /tmp/$b/m3 bench --backend gpu --preset m3.1 --kernels "${a[@]}" "${v[@]}" --kernel-rows 1,16 \
      --kernel-formats mxfp4,nvfp4,mxfp8 2>&1 | grep -E "^\||rror" | grep -v "| default |"
  done
done > $OUT/kernels.log 2>&1
cat $OUT/kernels.log
m3_ab 1 "--backend gpu --preset m3.1 --layers 12 --per-layer 6 --iters 40 --rounds 1 --batch 1,4,16" \
  /tmp/old/m3 "env M3_ROW_SCALED_X=0 /tmp/bin/m3" /tmp/bin/m3 \
  "env M3_FUSE_SWIGLU=1 M3_FOLD_COMBINE=1 /tmp/bin/m3" > $OUT/layer.log 2>&1
cat $OUT/layer.log
