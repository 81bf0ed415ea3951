#!/usr/bin/env bash
# Session 44 (issue 12), any card, ~300 s cold: the MoE layer (m3.1
# --layers 12 minus 6, standard path, b1 / b4 / b16, 2 rounds
# interleaved, every variant compiled first) with the cp.async rings
# against the defaults: ring1 = every one-row walk (S_H_ASYNC_ONE=22:
# E4M3, MXFP4, NVFP4), ring2 = that and the E2M1 tile walks
# (S_H_ASYNC_TILE=20) (ring-layer.log).
# (Never ran: the S_H_ASYNC_* defines were removed after s44a.sh measured
# them negative; kept as the record of what was prepared.)
set -u
. bench/device/common.sh
m3_setup
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
D="S_MMA_WARPS=4 S_MMA_MAXBT=2"
B="--backend gpu --preset m3.1 --layers 12 --per-layer 6 --batch 1,4,16 --context 4096 --iters 40 --rounds 1 --path standard"
m3_defines_ab 2 "$B" base= "ring1=$D S_H_ASYNC_ONE=22" "ring2=$D S_H_ASYNC_ONE=22 S_H_ASYNC_TILE=20" \
  > "$OUT/ring-layer.log" 2>&1
cut -c1-150 "$OUT/ring-layer.log"
