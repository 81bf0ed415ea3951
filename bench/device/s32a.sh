#!/usr/bin/env bash
# Session 32 (issue 13), any card, ~350 s. Six mono variants against the
# defaults, interleaved, 2 rounds, `m3 bench --path both` on m3.1 --layers
# 12 --per-layer 6 at b1 / b4 / b16, each after a 16-step parity gate ->
# ab.log:
# - split: M3_MONO_ROUTER_SPLIT=1, the router as its three ops (the fused
#   m3s_router_small takes ~36 us of a b1 mono layer's critical path);
# - swiglu: M3_FUSE_SWIGLU=1, SwiGLU in the gate + up epilogue (two ops and
#   two grid barriers fewer a MoE layer in mono; no gain on the standard
#   path, session 25). It changes the standard path's launches too;
# - inline: S_MONO_INLINE_SMALL=1, the small ops' bodies (RMSNorm, head
#   norm, SwiGLU, combine, top-k, attention merge) inlined into the
#   interpreter: no call, no register saves for them (NVRTC 13.0: 128
#   registers, stack 744 -> 800 bytes);
# - inline+ops: that and S_MONO_OPS_SMEM=1, the op records copied to
#   shared memory at the launch's start (no L2 round trip an op);
# - full: S_UNROLL_HALF=0, every linear's full load batch (session 29's
#   form for the one-row / one-tile ops only measured 7% slower a b1 mono
#   layer, when the CTAs' stacks had 28 KB of L1; the one-row E4M3 / MXFP4
#   walks hold it without loop spills, the general bodies that b16 runs
#   spill in their loops with it);
# - layers: M3_MONO_LAYERS=0, every layer in one m3s_mono launch (no
#   launch boundary between two layers: a grid barrier instead).
# Then the op profile at b1 of split, swiglu and inline+ops ->
# prof-<variant>.log.
set -u
. bench/device/common.sh
m3_setup
run() {  # run VARIANT COMMAND...: the command with the variant's environment
  local v=$1
  shift
  case $v in
    base) "$@" ;;
    split) M3_MONO_ROUTER_SPLIT=1 "$@" ;;
    swiglu) M3_FUSE_SWIGLU=1 "$@" ;;
    inline) M3_MONO_DEFINES="S_MONO_INLINE_SMALL=1" "$@" ;;
    inline+ops) M3_MONO_DEFINES="S_MONO_INLINE_SMALL=1 S_MONO_OPS_SMEM=1" "$@" ;;
    full) M3_MONO_DEFINES="S_UNROLL_HALF=0" "$@" ;;
    layers) M3_MONO_LAYERS=0 "$@" ;;
  esac
}
T="--backend gpu --preset tiny --batch 1 --iters 1 --rounds 1 --warmup 1 --parity-steps 0"
run inline timeout 150 /tmp/bin/m3 bench $T --path mono > /dev/null 2>&1 &
run inline+ops timeout 150 /tmp/bin/m3 bench $T --path mono > /dev/null 2>&1 &
run full timeout 150 /tmp/bin/m3 bench $T --path mono > /dev/null 2>&1 &
timeout 150 /tmp/bin/m3 bench $T --path both > /dev/null 2>&1
wait
echo "compiled ($(date +%T))"
B="--backend gpu --preset m3.1 --layers 12 --per-layer 6 --batch 1,4,16 --context 4096 --iters 40 --rounds 1 --path both --parity-steps 16"
for r in 1 2; do
  for v in base split swiglu inline inline+ops full layers; do
    echo "=== $v round $r ($(date +%T))"
    run $v timeout 60 /tmp/bin/m3 bench $B 2>&1 | grep -E "^\| \[.*decode.*/|^mono parity|differ|rror"
  done
done > $OUT/ab.log 2>&1
grep -E "^===|mono\]|differ|rror" $OUT/ab.log
P="--backend gpu --preset m3.1 --layers 12 --context 4096 --iters 1 --rounds 1 --warmup 0 --batch 1 --path mono --profile"
for v in split swiglu inline+ops; do
  run $v timeout 30 /tmp/bin/m3 bench $P > $OUT/prof-$v.log 2>&1
  echo "=== profile $v"
  grep -A21 "^mono ops" $OUT/prof-$v.log | cut -c1-140
done
