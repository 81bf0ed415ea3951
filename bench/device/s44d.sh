#!/usr/bin/env bash
# Session 44 (issue 12), any card (an H200 wanted), ~420 s cold:
# 1. The NVFP4 check failure seen twice this session on the H100 (the
#    microbench's NVFP4 1 x [16, 6144] plain stack at 4 / 16 rows, "off the
#    f64 reference by inf": an output not finite, reference finite) when
#    MXFP4 cases ran first in the same process (the NVFP4 stack then
#    generated with seeds 7 / 8, not 1 / 2); a process of NVFP4 alone and
#    the simulator with seeds 7 / 8 passed. The check now names the
#    variant, the output row and feature and the value (nvfp4-check-*.log).
# 2. MXFP4 routed launches of 9-16 rows on `m3s_mma_fp4_rs`
#    (S_ROUTED_SMALL=1: the general walks at 5 CTAs an SM, not 4): the
#    grouped m16 microbench over 4 / 16 / 64 experts, L2-fed too
#    (rs.log), then the MoE layer at b16 / b32 (b32: the general entry
#    still), 2 rounds interleaved (rs-layer.log).
set -u
. bench/device/common.sh
m3_setup
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
D="S_MMA_WARPS=4 S_MMA_MAXBT=2"
# three times: the failure was intermittent (the fix: Device::htod now
# waits for its copy to land; a reading until this passes repeatedly)
for i in 1 2 3; do
  echo "=== nvfp4 check $i ($(date +%T))"
  timeout 200 /tmp/bin/m3 bench --backend gpu --preset m3.1 --kernels --kernel-reps 1 --kernel-stack 1x16 \
    --kernel-rows 4,16 --kernel-experts 4 --kernel-formats mxfp4,nvfp4 --out /tmp/nvfp4-check.json \
    > "$OUT/nvfp4-check-$i.log" 2>&1
  echo "exit $?"; grep -E "Nvfp4.*1 x|rror" "$OUT/nvfp4-check-$i.log" | cut -c1-220
done
echo "=== rs ($(date +%T))"
timeout 300 /tmp/bin/m3 bench --backend gpu --preset m3.1 --kernels --kernel-reps 1 --kernel-stack 1x16 \
  --kernel-rows 16 --kernel-experts 4,16,64 --kernel-l2 --kernel-formats mxfp4 \
  --variants "$D S_ROUTED_SMALL=1" --out "$OUT/rs.json" > "$OUT/rs.log" 2>&1
echo "exit $?"; grep -E "experts.*x/row|rror|^ceiling" "$OUT/rs.log" | cut -c1-200
[ "${LAYER:-1}" = 1 ] || exit 0
B="--backend gpu --preset m3.1 --layers 12 --per-layer 6 --batch 16,32 --context 4096 --iters 40 --rounds 1 --path standard"
m3_defines_ab 2 "$B" base= "rs=$D S_ROUTED_SMALL=1" > "$OUT/rs-layer.log" 2>&1
cut -c1-150 "$OUT/rs-layer.log"
