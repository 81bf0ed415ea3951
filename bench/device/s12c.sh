#!/usr/bin/env bash
# Session 12, call 3: the small-step fast walk (s_h_fast; one-row and
# one-tile entry points) against the walk before (S_H_FAST=0), same call:
# the kernel microbench (each case checked against f64 before it is timed)
# and the m3.1 step at 12 / 6 layers, batch 1, 4, 16. Logs to $OUT.
set -u
mkdir -p /tmp/bin && tar -C /tmp/bin -xJf .carry/bin.tar.xz
export M3_KERNEL_CACHE=/tmp/m3-kernels XDG_CACHE_HOME=/tmp/xdg
S="S_MMA_WARPS=4 S_MMA_MAXBT=2"
timeout 300 /tmp/bin/m3 bench --backend gpu --kernels --preset m3.1 --kernel-formats mxfp4,mxfp8,nvfp4 \
  --kernel-rows 1,4,16 --kernel-experts 4,64 --iters 30 \
  --variants "$S S_H_FAST=0;$S S_R1_MINB=6 S_R8_MINB=6;$S S_R1_MINB=4 S_R8_MINB=4" \
  --out $OUT/kernels.json > $OUT/kernels.log 2>&1
echo "kernels exit $?"
grep -E " m(1|4|16) \|" $OUT/kernels.log | grep -v "| default |" | cut -c1-150 | head -80
timeout 250 /tmp/bin/m3 bench --backend gpu --preset m3.1 --layers 12 --per-layer 6 --context 4096 \
  --batch 1,4,16 --iters 100 --rounds 2 --variants "$S S_H_FAST=0" --out $OUT/step.json > $OUT/step.log 2>&1
echo "step exit $?"
tail -30 $OUT/step.log
