#!/usr/bin/env bash
# Session 42 (issue 12), the H200 wanted (~240 s cold), prepared after the
# session's device time:
# 1. the plain one-row walk in a launch long enough that its ramp and tail
#    stop mattering (1 x [131072, 6144]: 428 MB MXFP4, ~110 us) beside the
#    figure of record's 1 x [49152, 6144] (~46 us), MXFP4, NVFP4, MXFP8
#    (tall-*.log). Session 42 run 1: the MXFP4 walk reads 76% of the
#    ceiling in the tall launch and 85% in a 111-us grouped launch, of a
#    91% own rate (L2-fed): how much of that is the plain launch's length;
# 2. ALU-pipe work moved to the FMA pipe, the walk's own rate being ALU-
#    pipe bound (session 42 run 5): S_E2M1_HI_FMA=1 (half 1's right shift
#    as IMAD.HI), S_SCALE_FMA=1 (the block scale factors by multiplies),
#    both; the MXFP4 x/row loop's ALU-pipe / all instructions 169 / 246
#    (defaults), 153 / 249, 137 / 287, 126 / 289 (NVRTC 13.0, no new
#    spills). Tall, grouped memory-fed and L2-fed, MXFP4, NVFP4, MXFP8
#    (fma.log);
#    (Session 43 made the defines bitmasks over the walks, 1 the one-row
#    walks, 2 the tile walks, 3 both, ran this script on an H100, and
#    removed both defines as negative: the script cannot run again as it
#    stands; it is the record of what ran.)
# 3. the MoE layer (b1 / b4 / b16, 2 rounds interleaved, common.sh's
#    m3_defines_ab: every variant compiled first) with both in the one-row
#    walks (fma1) and in every walk (fma3) against the defaults
#    (fma-layer.log; LAYER=0 leaves it out, ~120 s).
# Writes names no other script here writes.
set -u
. bench/device/common.sh
m3_setup
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
D="S_MMA_WARPS=4 S_MMA_MAXBT=2"
for s in 1x131072 1x49152; do
  echo "=== $s ($(date +%T))"
  timeout 150 /tmp/bin/m3 bench --backend gpu --preset m3.1 --kernels --kernel-reps 1 --kernel-stack $s \
    --kernel-experts "" --kernel-rows 1 --kernel-formats mxfp4,nvfp4,mxfp8 --out "$OUT/tall-$s.json" > "$OUT/tall-$s.log" 2>&1
  echo "exit $?"; grep -E "x/row|rror|^ceiling" "$OUT/tall-$s.log" | cut -c1-150
done
echo "=== fma ($(date +%T))"
timeout 300 /tmp/bin/m3 bench --backend gpu --preset m3.1 --kernels --kernel-reps 1 --kernel-stack 1x49152 \
  --kernel-rows 1 --kernel-experts 64 --kernel-top-k 64 --kernel-expert-n 1024 --kernel-l2 \
  --kernel-formats mxfp4,nvfp4,mxfp8 \
  --variants "$D S_E2M1_HI_FMA=1;$D S_SCALE_FMA=1;$D S_E2M1_HI_FMA=1 S_SCALE_FMA=1" \
  --out "$OUT/fma.json" > "$OUT/fma.log" 2>&1
echo "exit $?"; grep -E "x/row|rror|^ceiling" "$OUT/fma.log" | cut -c1-190
[ "${LAYER:-1}" = 1 ] || exit 0
B="--backend gpu --preset m3.1 --layers 12 --per-layer 6 --batch 1,4,16 --context 4096 --iters 40 --rounds 1 --path standard"
m3_defines_ab 2 "$B" base= "fma1=$D S_E2M1_HI_FMA=1 S_SCALE_FMA=1" "fma3=$D S_E2M1_HI_FMA=3 S_SCALE_FMA=3" \
  > "$OUT/fma-layer.log" 2>&1
cut -c1-150 "$OUT/fma-layer.log"
