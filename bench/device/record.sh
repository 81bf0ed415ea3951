#!/usr/bin/env bash
# Session 7 run 8: the figures of record after the split attention (steps
# of <= 4 rows): m3.1 --layers 12 / 6 (--per-layer), batch 1-64, 4k and
# 128k context. Carries the m3 binary only.
set -u
mkdir -p /tmp/bin && tar -C /tmp/bin -xJf .carry/bin.tar.xz
export REQUIRE_GPU=1 M3_KERNEL_CACHE=/tmp/m3-kernels XDG_CACHE_HOME=/tmp/xdg
timeout 300 /tmp/bin/m3 bench --backend gpu --preset m3.1 --layers 12 --per-layer 6 --batch 1,4,16,64 --context 4096 \
  --long-context 131072 --iters 40 --rounds 2 --out $OUT/record.json 2>&1 | grep -v "^round" > $OUT/record.log
echo "exit ${PIPESTATUS[0]}" >> $OUT/record.log
echo done
