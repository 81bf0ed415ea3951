#!/usr/bin/env bash
# Session 12, call 2: (1) the prototype MX linear launched the way the
# engine's microbench launches (8 separate [6144, 6144] launches in one CUDA
# graph) beside its one-launch figure, so the two kernels compare like for
# like; (2) Nsight Compute's duration of every kernel of a b1 and a b16
# decode step (serialized: no gaps, no overlap) to see where a MoE layer's
# 0.19 ms goes. Logs to $OUT.
set -u
mkdir -p /tmp/bin && tar -C /tmp/bin -xJf .carry/bin.tar.xz
export M3_KERNEL_CACHE=/tmp/m3-kernels XDG_CACHE_HOME=/tmp/xdg
FMTS=4,8 ROWS=1,16 F16_ONLY=1 SPLIT=8 SHAPES=4x4x1,8x4x1,8x2x1,16x2x1,4x8x1 \
  timeout 150 python3 bench/proto/fp8mma.py > $OUT/proto.jsonl 2> $OUT/proto.err
echo "proto exit $?"; tail -3 $OUT/proto.err
NCU=/usr/local/cuda/bin/ncu
B="/tmp/bin/m3 bench --backend gpu --preset m3.1 --layers 12 --context 4096 --iters 1 --rounds 1 --warmup 0"
for b in 1 16; do
  timeout 200 $NCU --target-processes all --metrics gpu__time_duration.sum --cache-control none \
    --clock-control none --launch-count 1400 --csv --print-units base $B --batch $b > $OUT/ncu-b$b.csv 2> $OUT/ncu-b$b.err
  echo "ncu b$b exit $? lines $(wc -l < $OUT/ncu-b$b.csv)"
  xz -9 -f $OUT/ncu-b$b.csv
done
ls -la $OUT
