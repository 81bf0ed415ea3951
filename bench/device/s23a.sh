#!/usr/bin/env bash
# Session 23 (issue 12): why the engine's MXFP4 body stops at ~71% of the
# ceiling where session 11's prototype reached ~85% with the same decode.
# The prototype (bench/proto/fp8mma.py, f16 route) differs from the engine
# in two ways that can be switched on there: the weights' device layout
# (tile-major [N/16][K/64][32 lanes][16 B]: a warp's load is 512 contiguous
# bytes; row-major as model/layout.rs: 8 rows x 64 B) and the x scale (one
# power of two a row; the engine's one a 32-value block, multiplied per
# block: XEXP=1). 1. the engine's tall-launch microbench for reference;
# 2. the prototype in all four combinations, MXFP4 and MXFP8, 1 and 16 rows.
set -u
. bench/device/common.sh
m3_setup
K="--backend gpu --preset m3.1 --kernels --kernel-stack 1x49152"
echo "=== engine microbench ($(date +%T))"
timeout 200 /tmp/bin/m3 bench $K --kernel-rows 1,16 --kernel-formats mxfp4,mxfp8 --kernel-experts "" 2>&1 | grep -E "^\||rror" | grep -v "| default |"
for lay in tile rows; do
  for xe in 0 1; do
    echo "=== prototype LAYOUT=$lay XEXP=$xe ($(date +%T))"
    LAYOUT=$lay XEXP=$xe F16_ONLY=1 FMTS=${FMTS:-4,8} ROWS=1,16 SHAPES=${SHAPES:-4x4x1x1,4x8x1x1,4x4x6x1} \
      timeout 200 python3 bench/proto/fp8mma.py 2>&1 | tee -a $OUT/proto.jsonl | python3 -c '
import json, sys
for l in sys.stdin:
    try: r = json.loads(l)
    except Exception: print(l.rstrip()); continue
    if "fmt" in r: print(r["fmt"], r["layout"], "xexp", r["xexp"], "M", r["M"], "W%dU%dB%d" % (r["WARPS"], r["UNR"], r.get("MINB", 1)), "regs", r["regs"], r["ms"], "ms", r["pct_ceiling"], "%", "err", r["max_err_rel"])
    else: print(r)'
  done
done
