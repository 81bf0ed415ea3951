#!/usr/bin/env bash
# Session 17, call 5 (issue 12): the routed experts of steps past 8 rows
# launched without PDL (the new default, PathOptions::routed_pdl_max_rows)
# against PDL always (M3_ROUTED_PDL_MAX_ROWS=max); interleaved processes, 2
# rounds, per MoE layer at b1-64, 4k. Logs to $OUT.
set -u
mkdir -p /tmp/bin && tar -C /tmp/bin -xJf .carry/bin.tar.xz
export XDG_CACHE_HOME=/tmp/xdg M3_KERNEL_CACHE=/tmp/kc
{
  for r in 1 2; do
    for e in "M3_NONE=1" "M3_ROUTED_PDL_MAX_ROWS=max"; do
      echo "=== '$e' round $r ($(date +%T))"
      env "$e" timeout 100 /tmp/bin/m3 bench --backend gpu --preset m3.1 --layers 12 --per-layer 6 \
        --batch 1,4,16,32,64 --context 4096 --iters 30 --rounds 1 2>&1 | grep -E "^\| decode.*/|rror"
    done
  done
} > $OUT/edge.log 2>&1
cat $OUT/edge.log
