#!/usr/bin/env bash
# Session 16, call 2 (issue 12): is the MX one-row linear's gap to the bar
# in its body or in its launches? (1) the engine's kernel microbench on one
# tall [49152, 6144] launch beside the usual 8 x [6144, 6144] launches, and
# the session-11 prototype on the same two shapes, same call; (2) Nsight
# Compute's duration and DRAM bytes of every kernel of a b1 decode step
# (serialized), to see where a MoE layer's time goes now.
# SECTIONS picks parts (micro ncu). Logs to $OUT.
set -u
mkdir -p /tmp/bin && tar -C /tmp/bin -xJf .carry/bin.tar.xz
export XDG_CACHE_HOME=/tmp/xdg M3_KERNEL_CACHE=/tmp/kc
want() { case " ${SECTIONS:-micro ncu} " in *" $1 "*) return 0 ;; esac; return 1; }
want micro && {
  for st in 1x49152 8x6144; do
    echo "=== engine --kernel-stack $st ($(date +%T))"
    timeout 120 /tmp/bin/m3 bench --backend gpu --preset m3.1 --kernels --kernel-stack $st --kernel-rows 1,4,16 \
      --kernel-formats mxfp8,mxfp4,nvfp4 --kernel-experts "" --iters 50 2>&1 | grep -E "^\||ceiling" | grep -v "^|---"
  done
  echo "=== prototype ($(date +%T))"
  FMTS=4,8 ROWS=1,16 F16_ONLY=1 SPLIT=8 SHAPES=4x8x1,4x4x1 timeout 150 python3 bench/proto/fp8mma.py 2>&1 | tail -12
} > $OUT/micro.log 2>&1
want micro && cat $OUT/micro.log
want ncu && {
  NCU=/usr/local/cuda/bin/ncu
  timeout 240 $NCU --target-processes all --metrics gpu__time_duration.sum,dram__bytes_read.sum --cache-control none \
    --clock-control none --launch-count 1400 --csv --print-units base \
    /tmp/bin/m3 bench --backend gpu --preset m3.1 --layers 12 --context 4096 --iters 1 --rounds 1 --warmup 0 --batch 1 \
    > $OUT/ncu-b1.csv 2> $OUT/ncu-b1.err
  echo "ncu exit $? lines $(wc -l < $OUT/ncu-b1.csv)"; tail -3 $OUT/ncu-b1.err
  xz -9 -f $OUT/ncu-b1.csv
}
ls -la $OUT
