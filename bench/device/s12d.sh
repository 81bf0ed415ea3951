#!/usr/bin/env bash
# Session 12, call 4: the fast walk with per-format launch bounds (run 3's
# best: MXFP8 4 / 4, MXFP4 6 / 6, NVFP4 4 / 6 CTAs an SM for one row / one
# tile) against S_H_FAST=0 in the same step rounds; then correctness under
# REQUIRE_GPU=1 (runner tests, parity tiny / small on both paths, the
# linear's f64 variant test); and Nsight Compute on the single-CTA kernels
# of a b1 layer (RMSNorm, router, route). Logs to $OUT.
set -u
mkdir -p /tmp/bin && tar -C /tmp/bin -xJf .carry/bin.tar.xz
export M3_KERNEL_CACHE=/tmp/m3-kernels XDG_CACHE_HOME=/tmp/xdg
S="S_MMA_WARPS=4 S_MMA_MAXBT=2"
timeout 200 /tmp/bin/m3 bench --backend gpu --preset m3.1 --layers 12 --per-layer 6 --context 4096 \
  --batch 1,4,16 --iters 100 --rounds 2 --variants "$S S_H_FAST=0" --out $OUT/step.json > $OUT/step.log 2>&1
echo "step exit $?"; grep -A8 "^per layer" $OUT/step.log
export REQUIRE_GPU=1
{
  timeout 150 /tmp/bin/test-runner --test-threads=1 2>&1 | grep -E "^test .*FAILED|^test result|panicked" | tail -5
  CK=/tmp/ck; mkdir -p $CK
  for m in tiny small; do
    /tmp/bin/m3 synth --preset $m --experts mxfp4 --dense mxfp8 --out $CK/$m --draft-layers 0 -q
    for p in standard mono; do
      timeout 60 /tmp/bin/m3 parity --model $CK/$m --reference cpu --backend gpu --path $p --prompts 8 --max-tokens 32 2>&1 | grep -E "^parity|rror" | tail -1
    done
  done
  /tmp/bin/m3 synth --preset small --experts nvfp4 --dense mxfp8 --out $CK/small-nv --draft-layers 0 -q 2>&1 | tail -1
  timeout 60 /tmp/bin/m3 parity --model $CK/small-nv --reference cpu --backend gpu --prompts 8 --max-tokens 32 2>&1 | grep -E "^parity|rror" | tail -1
} > $OUT/verify.log 2>&1
cat $OUT/verify.log
unset REQUIRE_GPU
NCU=/usr/local/cuda/bin/ncu
B="/tmp/bin/m3 bench --backend gpu --preset m3.1 --layers 12 --context 4096 --iters 1 --rounds 1 --warmup 0 --batch 1"
timeout 80 $NCU --target-processes all -k regex:"m3s_rmsnorm|m3s_router_warp|m3s_route" --launch-skip 60 --launch-count 3 \
  --section SpeedOfLight --section WarpStateStats --section LaunchStats --section SchedulerStats \
  $B > $OUT/ncu-small.txt 2>&1
echo "ncu exit $?"; grep -E "^  m3s_|Duration|Warp Cycles Per Issued|Stall|Registers" $OUT/ncu-small.txt | head -30
REQUIRE_GPU=1 timeout 180 /tmp/bin/test-m3_gpu variants_match_an_f64_reference --test-threads=1 > $OUT/f64.log 2>&1
echo "f64 exit $?"; grep -E "^test |test result|panicked|failing|off" $OUT/f64.log | tail -8
