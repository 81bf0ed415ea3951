#!/usr/bin/env bash
# Session 15 (issue 12): where a step of 16 / 32 / 64 rows spends its
# time with the small-step linears (per-launch profile: direct launches, a
# gap after each). Logs to $OUT.
set -u
mkdir -p /tmp/bin && tar -C /tmp/bin -xJf .carry/bin.tar.xz
export XDG_CACHE_HOME=/tmp/xdg M3_KERNEL_CACHE=/tmp/kc
for b in 16 32 64; do
  timeout 100 /tmp/bin/m3 bench --backend gpu --preset m3.1 --layers 12 --batch $b --context 4096 \
    --iters 3 --rounds 1 --profile 2>&1 | grep -A24 "^profile"
done > $OUT/profile.log 2>&1
cat $OUT/profile.log
