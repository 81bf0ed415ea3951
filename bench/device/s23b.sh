#!/usr/bin/env bash
# Session 23 (issue 12): E2M1 weights interleaved by 16-row tiles
# (model/layout.rs), run 1's prototype finding carried into the engine.
# 1. the device check: the linear variants against f64 (K = 160 shapes:
#    partial chunks, the new partial-piece address), then m3_verify
#    (runner, backend_ops incl. K = 160 / 224 engine linears, golden,
#    parity small standard and mono);
# 2. the kernel microbench, old (HEAD before, .carry/old.tar.xz) and new,
#    interleaved: MXFP4 / NVFP4 on the tall launch and 8 x [6144, 6144],
#    1 / 4 / 16 rows, grouped experts 4 and 16;
# 3. the MoE layer, old and new, 2 rounds at batch 1, 4, 16.
set -u
. bench/device/common.sh
m3_setup old
{
  echo "=== test m3_gpu linear, REQUIRE_GPU=1 ($(date +%T))"
  REQUIRE_GPU=1 timeout 300 /tmp/bin/test-m3_gpu linear --test-threads=1 --nocapture 2>&1 \
    | grep -E "^test .*(ok|FAILED)$|^test result|panicked|failure" | tail -30
  m3_verify
} > $OUT/verify.log 2>&1
cat $OUT/verify.log
for r in 1 2; do
  for b in old bin; do
    for shape in tall stack; do
      if [ $shape = tall ]; then a=(--kernel-stack 1x49152 --kernel-experts ""); else a=(--kernel-experts 4,16); fi
      echo "=== kernels $b $shape round $r ($(date +%T))"
      timeout 200 /tmp/$b/m3 bench --backend gpu --preset m3.1 --kernels "${a[@]}" --kernel-rows 1,4,16 \
        --kernel-formats mxfp4,nvfp4 2>&1 | grep -E "^\||rror" | grep -v "| default |"
    done
  done
done > $OUT/kernels.log 2>&1
cat $OUT/kernels.log
m3_ab 2 "--backend gpu --preset m3.1 --layers 12 --per-layer 6 --iters 40 --rounds 1 --batch 1,4,16" /tmp/old/m3 /tmp/bin/m3 > $OUT/layer.log 2>&1
cat $OUT/layer.log
