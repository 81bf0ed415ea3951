#!/usr/bin/env bash
# Session 47 (issues 12, 13), any card, ~250 s warm: the per-layer table
# under the session-47 defaults at batch 1-128, 2 rounds x 30, standard
# path (layers.log); then mono against standard at batch 1 / 4 / 16 / 32
# / 64 with the parity gate, 1 round (mono.log).
set -u
. bench/device/common.sh
m3_setup
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader | tee "$OUT/layers.log"
timeout 240 /tmp/bin/m3 bench --backend gpu --preset m3.1 --layers 12 --per-layer 6 --batch 1,2,4,8,16,32,64,128 \
  --context 4096 --iters 30 --rounds 2 --path standard 2>&1 | grep -E "^\| decode|^per layer|^ceiling|rror" \
  | tee -a "$OUT/layers.log"
echo "=== mono ($(date +%T))"
timeout 200 /tmp/bin/m3 bench --backend gpu --preset m3.1 --layers 12 --per-layer 6 --batch 1,4,16,32,64 \
  --context 4096 --iters 20 --rounds 1 --path both --parity-steps 4 > "$OUT/mono.log" 2>&1
echo "exit $?"; grep -E "^\| |parity|rror" "$OUT/mono.log" | cut -c1-150
