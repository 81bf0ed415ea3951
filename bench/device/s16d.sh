#!/usr/bin/env bash
# Session 16, prepared, not run (no device time left): the figures of
# record with this session's defaults (the indexer in two launches,
# M3_FUSE_INDEX=0) beside the one-launch indexer (M3_FUSE_INDEX=1),
# interleaved, 2 rounds; b1-64 at 4k and b1 at 128k. Logs to $OUT.
set -u
mkdir -p /tmp/bin && tar -C /tmp/bin -xJf .carry/bin.tar.xz
export XDG_CACHE_HOME=/tmp/xdg M3_KERNEL_CACHE=/tmp/kc
{
  for r in 1 2; do
    for f in 0 1; do
      echo; echo "=== record M3_FUSE_INDEX=$f round $r ($(date +%T))"
      M3_FUSE_INDEX=$f timeout 200 /tmp/bin/m3 bench --backend gpu --preset m3.1 --layers 12 --per-layer 6 \
        --batch 1,4,16,32,64 --context 4096 --long-context 131072 --iters 40 --rounds 1 \
        --out $OUT/record-$f-$r.json 2>&1 | grep -E "^\||MoE|per layer|rror"
      echo "exit ${PIPESTATUS[0]}"
    done
  done
} > $OUT/record.log 2>&1
grep -E "===|exit [^0]|[0-9] / [0-9]|131072|MoE" $OUT/record.log | head -80
