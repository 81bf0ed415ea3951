#!/usr/bin/env bash
# Session 11 (issue 12): the f16-MMA MX linear prototype (bench/proto/fp8mma.py,
# standalone: NVRTC + driver by ctypes, torch for memory and the f64
# reference) and the engine's own kernel microbench in the same call, so the
# ratio between them is from one machine state. Logs to $OUT.
set -u
mkdir -p /tmp/bin && tar -C /tmp/bin -xJf .carry/bin.tar.xz
export M3_KERNEL_CACHE=/tmp/m3-kernels XDG_CACHE_HOME=/tmp/xdg
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $OUT/smi.txt
timeout 200 /tmp/bin/m3 bench --backend gpu --kernels --preset m3.1 --kernel-formats mxfp4,mxfp8 \
  --kernel-rows 1,2,4,8,16 --iters 30 --out $OUT/engine_kernels.json > $OUT/engine_kernels.log 2>&1
echo "engine exit $?"; grep -iE "mxfp|ceiling" $OUT/engine_kernels.log | head -30
F16_ONLY=1 timeout 300 python3 bench/proto/fp8mma.py > $OUT/proto.jsonl 2>&1
echo "proto exit $?"; cat $OUT/proto.jsonl | python3 -c "
import sys,json
for l in sys.stdin:
    try: r=json.loads(l)
    except Exception: print(l.strip()); continue
    print(' '.join(f'{k}={v}' for k,v in r.items() if k not in ('max_err_rel','x_resid')))"
