#!/usr/bin/env bash
# Session 45 (issue 12), any card (an H200 wanted), ~200 s cold, for the
# last minutes of a budget: the per-layer table at HEAD (MXFP4's routed
# 9-64-row launches on `m3s_mma_fp4_rs` by default) at batch 1-64, 2
# rounds x 40 (layers.log, written as it goes), then the MXFP4 grouped
# gate + up at 16 rows over 4 / 16 / 64 of 128 experts, the tall stack's
# case list (grouped.log).
set -u
. bench/device/common.sh
m3_setup
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader | tee "$OUT/layers.log"
timeout 200 /tmp/bin/m3 bench --backend gpu --preset m3.1 --layers 12 --per-layer 6 --batch 1,2,4,8,16,32,64 \
  --context 4096 --iters 40 --rounds 2 --path standard 2>&1 | grep -E "^\| decode|^per layer|^ceiling|rror" \
  | tee -a "$OUT/layers.log"
echo "=== grouped ($(date +%T))"
timeout 100 /tmp/bin/m3 bench --backend gpu --preset m3.1 --kernels --kernel-reps 1 --kernel-stack 1x16 \
  --kernel-rows 16 --kernel-experts 4,16,64 --kernel-formats mxfp4 > "$OUT/grouped.log" 2>&1
echo "exit $?"; grep -E "experts.*x/row|rror|^ceiling" "$OUT/grouped.log" | cut -c1-160
