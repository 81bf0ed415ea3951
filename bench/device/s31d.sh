#!/usr/bin/env bash
# Session 31 (issue 13), any card, ~230 s. Three mono variants against the
# defaults, interleaved, 2 rounds, `m3 bench --path both` on m3.1 --layers
# 12 --per-layer 6 at b1 / b4 / b16, each after a 16-step parity gate ->
# ab.log:
# - M3_MONO_ROUTER_SPLIT=1: the router as its three ops (the fused
#   m3s_router_small takes ~36 us of a b1 mono layer's critical path);
# - M3_FUSE_SWIGLU=1: SwiGLU in the gate + up epilogue (two ops and two
#   grid barriers fewer a MoE layer in mono; no gain on the standard path,
#   session 25). It changes the standard path's launches too;
# - M3_MONO_DEFINES=S_MONO_INLINE_SMALL=1: the small ops' bodies (RMSNorm,
#   head norm, SwiGLU, combine, top-k, attention merge) inlined into the
#   interpreter, no call and no register saves for them (NVRTC 13.0: the
#   interpreter keeps 128 registers, stack 744 -> 800 bytes).
# Then the op profile of each at b1 -> prof-split.log, prof-swiglu.log,
# prof-inline.log.
set -u
. bench/device/common.sh
m3_setup
M3_MONO_DEFINES=S_MONO_INLINE_SMALL=1 timeout 120 /tmp/bin/m3 bench --backend gpu --preset tiny --batch 1 --iters 1 \
  --rounds 1 --warmup 1 --path mono --parity-steps 0 > /dev/null 2>&1 &
timeout 120 /tmp/bin/m3 bench --backend gpu --preset tiny --batch 1 --iters 1 --rounds 1 --warmup 1 --path both \
  --parity-steps 0 > /dev/null 2>&1
wait
echo "compiled ($(date +%T))"
B="--backend gpu --preset m3.1 --layers 12 --per-layer 6 --batch 1,4,16 --context 4096 --iters 40 --rounds 1 --path both --parity-steps 16"
for r in 1 2; do
  for v in "M3_MONO_ROUTER_SPLIT=0" "M3_MONO_ROUTER_SPLIT=1" "M3_FUSE_SWIGLU=1" "M3_MONO_DEFINES=S_MONO_INLINE_SMALL=1"; do
    echo "=== $v round $r ($(date +%T))"
    env $v timeout 60 /tmp/bin/m3 bench $B 2>&1 | grep -E "^\| \[.*decode.*/|^mono parity|differ|rror"
  done
done > $OUT/ab.log 2>&1
grep -E "^===|mono\]|differ|rror" $OUT/ab.log
P="--backend gpu --preset m3.1 --layers 12 --context 4096 --iters 1 --rounds 1 --warmup 0 --batch 1 --path mono --profile"
M3_MONO_ROUTER_SPLIT=1 timeout 30 /tmp/bin/m3 bench $P > $OUT/prof-split.log 2>&1
grep -A21 "^mono ops" $OUT/prof-split.log | cut -c1-140
M3_FUSE_SWIGLU=1 timeout 30 /tmp/bin/m3 bench $P > $OUT/prof-swiglu.log 2>&1
grep -A21 "^mono ops" $OUT/prof-swiglu.log | cut -c1-140
M3_MONO_DEFINES=S_MONO_INLINE_SMALL=1 timeout 30 /tmp/bin/m3 bench $P > $OUT/prof-inline.log 2>&1
grep -A21 "^mono ops" $OUT/prof-inline.log | cut -c1-140
