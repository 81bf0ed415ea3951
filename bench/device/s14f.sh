#!/usr/bin/env bash
# Session 14, last call (issue 12; device time nearly spent, s14e trimmed):
# the 64-row step with the default tensor-core build as it is (8 warps,
# 8 tiles, 128 registers: its MX entries spill 136-176 bytes a thread,
# NVRTC 13.0) against the same build allowed all registers
# (S_MMA_MINB=1: 202-254, no spill). Logs to $OUT.
set -u
mkdir -p /tmp/bin && tar -C /tmp/bin -xJf .carry/bin.tar.xz
export XDG_CACHE_HOME=/tmp/xdg M3_KERNEL_CACHE=/tmp/kc
timeout 200 /tmp/bin/m3 bench --backend gpu --preset m3.1 --layers 12 --batch 32,64 --context 4096 --iters 20 --rounds 1 \
  --variants "S_MMA_MINB=1" > $OUT/variants.log 2>&1
echo "exit $?"
grep -E "^\| .*b(32|64)|rror" $OUT/variants.log
