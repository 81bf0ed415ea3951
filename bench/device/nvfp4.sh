#!/usr/bin/env bash
# Prepared in session 7, NOT run (device budget spent): issue 17's "NVFP4
# experts vs MXFP4" step time. The bench model with NVFP4 routed experts
# (`--weights nvfp4`, new: E4M3 block scales in [1, 1.875], a 2^-s global
# per matrix) beside the MXFP4 one, batch 1 / 16 / 64, 4k context, one
# call; the kernel microbench's NVFP4 rows for the same shapes.
set -u
mkdir -p /tmp/bin && tar -C /tmp/bin -xJf .carry/bin.tar.xz
export REQUIRE_GPU=1 M3_KERNEL_CACHE=/tmp/m3-kernels XDG_CACHE_HOME=/tmp/xdg
for w in mxfp4 nvfp4; do
  {
    echo "=== --weights $w"
    timeout 120 /tmp/bin/m3 bench --backend gpu --preset m3.1 --layers 12 --per-layer 6 --batch 1,16,64 \
      --context 4096 --iters 40 --rounds 2 --weights $w --out $OUT/w-$w.json 2>&1 | grep -v "^round"
    echo "exit ${PIPESTATUS[0]}"
  } >> $OUT/nvfp4.log 2>&1
done
echo done
