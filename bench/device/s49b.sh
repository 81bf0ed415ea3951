#!/usr/bin/env bash
# Session 49 (issues 12, 13), any card, ~150 s warm: the runner's mono
# tests after the tensor-core unit became MMA-only (S_MMA_ONLY; mono's op
# ids now come from that unit: the first device run of 49 failed them),
# then the whole runner suite; on an H200 also s45c.sh (the per-layer
# table of record).
set -u
. bench/device/common.sh
m3_setup
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "card: $card"
REQUIRE_GPU=1 timeout 240 /tmp/bin/test-runner --test-threads=1 2>&1 | grep -E "^test |^test result|panicked" \
  | tail -20 > "$OUT/runner.log"
cat "$OUT/runner.log"
case "$card" in
  *H200*) bash bench/device/s45c.sh ;;
esac
m3_cache_report
