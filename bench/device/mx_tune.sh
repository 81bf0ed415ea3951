#!/usr/bin/env bash
# Prepared in session 11, not run (device time spent): the first things to
# try on the engine's f16 MX linear (bench/NOTES.md session 11 run 6: 38% of
# the ceiling at MXFP4 m1 where the prototype reached 83%). Run
# verify11.sh first (the refactor since run 6 has not run on a GPU).
# One call: the kernel microbench of the small-step shape with more CTAs an
# SM (launch bounds: fewer registers), other warp counts, interleaved K and
# a larger load batch; then the step at the best-looking one is for the
# next call. Logs to $OUT.
set -u
mkdir -p /tmp/bin && tar -C /tmp/bin -xJf .carry/bin.tar.xz
export M3_KERNEL_CACHE=/tmp/m3-kernels XDG_CACHE_HOME=/tmp/xdg
V="S_MMA_WARPS=4 S_MMA_MAXBT=2 S_MMA_MINB=5;S_MMA_WARPS=4 S_MMA_MAXBT=2 S_MMA_MINB=6"
V="$V;S_MMA_WARPS=2 S_MMA_MAXBT=2;S_MMA_WARPS=8 S_MMA_MAXBT=2"
V="$V;S_MMA_WARPS=4 S_MMA_MAXBT=2 S_MMA_INTERLEAVE=1;S_MMA_WARPS=4 S_MMA_MAXBT=2 S_UNROLL_MUL=2"
timeout 400 /tmp/bin/m3 bench --backend gpu --kernels --preset m3.1 --kernel-formats mxfp4,mxfp8,nvfp4 \
  --kernel-rows 1,4,16 --iters 30 --variants "$V" --out $OUT/tune.json > $OUT/tune.log 2>&1
echo "exit $?"
grep -E "m1 \||m16 \|" $OUT/tune.log | grep "8 x \[" | head -60
