#!/usr/bin/env bash
# Session 9: where the mono step's time goes. `--profile` with `--path
# both`: the standard path's per-launch event profile and the mono path's
# in-kernel op profile (globaltimer stamps: per op, work / straggle /
# barrier summed over the layers), b1 and b16, 4k context.
set -u
mkdir -p /tmp/bin && tar -C /tmp/bin -xJf .carry/bin.tar.xz
export M3_KERNEL_CACHE=/tmp/m3-kernels XDG_CACHE_HOME=/tmp/xdg
timeout 240 /tmp/bin/m3 bench --backend gpu --preset m3.1 --layers 12 --batch 1,16 --context 4096 \
  --iters 20 --rounds 1 --path both --profile --out $OUT/prof.json > $OUT/prof.log 2>&1
echo "exit $?" >> $OUT/prof.log
grep -vE "^round" $OUT/prof.log | head -150
