#!/usr/bin/env bash
# Session 16, prepared, not run (no device time left), for the next
# session's first call (issue 12):
# 1. record: the figures of record with this session's defaults, 2
#    rounds; b1-64 at 4k and b1 at 128k;
# 2. stacks: what a launch costs by its size: the same 311 MB of E4M3
#    codes (160 MB of E2M1) as 1, 2, 4, 8 and 16 launches (--kernel-stack
#    1x49152 .. 16x3072), M = 1 and 4, one process per stack.
# SECTIONS picks parts (record stacks). Logs to $OUT.
set -u
mkdir -p /tmp/bin && tar -C /tmp/bin -xJf .carry/bin.tar.xz
export XDG_CACHE_HOME=/tmp/xdg M3_KERNEL_CACHE=/tmp/kc
want() { case " ${SECTIONS:-record stacks} " in *" $1 "*) return 0 ;; esac; return 1; }
want record && {
  echo "=== record ($(date +%T))"
  timeout 300 /tmp/bin/m3 bench --backend gpu --preset m3.1 --layers 12 --per-layer 6 \
    --batch 1,4,16,32,64 --context 4096 --long-context 131072 --iters 40 --rounds 2 \
    --out $OUT/record.json 2>&1 | grep -E "^\||MoE|per layer|rror"
  echo "exit ${PIPESTATUS[0]}"
} > $OUT/record.log 2>&1
want record && grep -E "===|exit [^0]|[0-9] / [0-9]|131072|MoE" $OUT/record.log | head -80
want stacks && {
  for st in 1x49152 2x24576 4x12288 8x6144 16x3072; do
    echo "=== --kernel-stack $st ($(date +%T))"
    timeout 100 /tmp/bin/m3 bench --backend gpu --preset m3.1 --kernels --kernel-stack $st --kernel-rows 1,4 \
      --kernel-formats mxfp8,mxfp4 --kernel-experts "" --iters 40 2>&1 | grep -E "^\||ceiling" | grep -v "^|---" \
      | grep -v "| default |"
  done
} > $OUT/stacks.log 2>&1
want stacks && cat $OUT/stacks.log
