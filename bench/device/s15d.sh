#!/usr/bin/env bash
# Session 15, the figures of record (issue 12): m3.1 --layers 12 / 6 at
# batch 1-64 and one 128k sequence with this session's defaults (cache
# writes in the head-norm launch, the small-step tensor-core shape up to
# 512 rows), against the small-step shape up to 16 rows only (session 14's
# default) in the same rounds: it differs at 32 and 64 rows. Logs to $OUT.
set -u
mkdir -p /tmp/bin && tar -C /tmp/bin -xJf .carry/bin.tar.xz
export XDG_CACHE_HOME=/tmp/xdg M3_KERNEL_CACHE=/tmp/kc
step() { echo; echo "=== $* ($(date +%T))"; }
{
  for r in 1 2; do
    for n in 16 512; do
      step "record small-step shape to $n rows, round $r"
      M3_SMALL_STEP_MAX_ROWS=$n timeout 240 /tmp/bin/m3 bench --backend gpu --preset m3.1 --layers 12 --per-layer 6 \
        --batch 1,4,16,32,64 --context 4096 --long-context 131072 --iters 40 --rounds 1 \
        --out $OUT/record-$n-$r.json 2>&1 | grep -E "^\||MoE|per layer|rror"
      echo "exit ${PIPESTATUS[0]}"
    done
  done
} > $OUT/record.log 2>&1
grep -E "===|exit [^0]|[0-9] / [0-9]|131072|MoE" $OUT/record.log | head -80
