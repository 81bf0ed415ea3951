#!/usr/bin/env bash
# Session 15 (issue 12): the MXFP8 one-row linears' CTAs an SM at the step
# level. The fused qkv launch of a MoE layer is 616 CTAs of 16 rows
# against 528 slots at 4 CTAs an SM (132 SMs): a second wave of 88 CTAs.
# 5 an SM (660 slots) runs it in one wave (NVRTC: 96 registers, a 16-byte
# stack; at 4: 116, none); 3 (396 slots) for contrast. Same process, same
# rounds (--variants; the first equals the small-step build). Logs to $OUT.
set -u
mkdir -p /tmp/bin && tar -C /tmp/bin -xJf .carry/bin.tar.xz
export XDG_CACHE_HOME=/tmp/xdg M3_KERNEL_CACHE=/tmp/kc
B="S_MMA_WARPS=4 S_MMA_MAXBT=2"
timeout 250 /tmp/bin/m3 bench --backend gpu --preset m3.1 --layers 12 --per-layer 6 --batch 1 --context 4096 \
  --iters 40 --rounds 2 --variants "$B;$B S_R1_MINB_FP8=5" > $OUT/minb.log 2>&1
echo "exit $?"
grep -E "^\| |per layer" $OUT/minb.log | grep -v "^|---" | tail -30
