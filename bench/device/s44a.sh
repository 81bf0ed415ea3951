#!/usr/bin/env bash
# Session 44 (issue 12), any card (an H200 wanted), ~200 s warm: the
# one-row entries' walk through a cp.async ring in shared memory
# (S_H_ASYNC_ONE, a format bitmask: 22 = E4M3, MXFP4, NVFP4). Sessions
# 42-43 read the FP4 one-row walk as latency-bound (long scoreboard 3.5 a
# issue from memory, no unit saturated, the FMA-pipe forms slower than
# their instruction counts): the plain walk has no load in flight while
# it decodes, the register-pipelined walk spills at 6 CTAs an SM. The ring
# keeps D - 1 batches in flight a warp with no registers held (NVRTC 13.0:
# MXFP4 80 registers, 112 B of spill at 6 CTAs an SM, 35 KB of shared
# memory a CTA; at 5 CTAs 96 registers, 16 B; NVFP4 114, none; E4M3 D = 2).
# The microbench's one-row cases, small-step build against the ring at D =
# 3, D = 2, D = 3 with MXFP4 at 5 CTAs an SM, D = 4 at 5 (ring.log /
# ring.json: tall 1 x [49152, 6144], grouped 64 of 128 experts [1024,
# 6144] memory-fed and L2-fed); then Nsight Compute on the MXFP4 tall
# launch, plain and ring (the carve-out the driver took, occupancy,
# stalls: ncu-ring.csv). Then the tile walks through the ring
# (S_H_ASYNC_TILE) on the grouped m16 cases (ring16.log). LAYER=1 adds
# s44b.sh (the MoE layer A/B; better its own call).
# (Ran once, session 44, H100; the S_H_ASYNC_* defines were removed after
# it as negative: the script cannot run again as it is; it is the record.)
set -u
. bench/device/common.sh
m3_setup
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
D="S_MMA_WARPS=4 S_MMA_MAXBT=2"
A="$D S_H_ASYNC_ONE=22"
echo "=== ring ($(date +%T))"
timeout 400 /tmp/bin/m3 bench --backend gpu --preset m3.1 --kernels --kernel-reps 1 --kernel-stack 1x49152 \
  --kernel-rows 1 --kernel-experts 64 --kernel-top-k 64 --kernel-expert-n 1024 --kernel-l2 \
  --kernel-formats mxfp4,nvfp4,mxfp8 \
  --variants "$A;$A S_H_ASYNC_D=2;$A S_R1_MINB_FP4=5;$A S_H_ASYNC_D=4 S_R1_MINB_FP4=5" \
  --out "$OUT/ring.json" > "$OUT/ring.log" 2>&1
echo "exit $?"; grep -E "x/row|rror|^ceiling" "$OUT/ring.log" | cut -c1-200
echo "=== ring m16 ($(date +%T))"
# the tile walks through the ring (S_H_ASYNC_TILE=20: MXFP4, NVFP4) at 16
# rows over 4 / 16 / 64 experts of [3072, 6144] (16, 4 and ~1 rows an
# expert: the two-tile, one-tile and one-row walks of the entry), L2-fed too
timeout 300 /tmp/bin/m3 bench --backend gpu --preset m3.1 --kernels --kernel-reps 1 --kernel-stack 1x16 \
  --kernel-rows 16 --kernel-experts 4,16,64 --kernel-l2 --kernel-formats mxfp4,nvfp4 \
  --variants "$D S_H_ASYNC_TILE=20;$D S_H_ASYNC_TILE=20 S_H_ASYNC_D=2;$D S_H_ASYNC_TILE=20 S_H_ASYNC_ONE=20" \
  --out "$OUT/ring16.json" > "$OUT/ring16.log" 2>&1
echo "exit $?"; grep -E "experts.*x/row|rror|^ceiling" "$OUT/ring16.log" | cut -c1-200
echo "=== ncu ($(date +%T))"
M="gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,launch__shared_mem_config_size"
M="$M,launch__shared_mem_per_block_static,launch__occupancy_limit_shared_mem,launch__occupancy_limit_registers"
M="$M,launch__registers_per_thread,sm__warps_active.avg.pct_of_peak_sustained_active"
M="$M,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active"
M="$M,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio"
M="$M,smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio"
M="$M,smsp__average_warps_issue_stalled_not_selected_per_issue_active.ratio"
M="$M,smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio"
M="$M,smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio"
M="$M,smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio"
M="$M,smsp__average_warps_issue_stalled_wait_per_issue_active.ratio"
timeout 150 /usr/local/cuda/bin/ncu --target-processes all --kernel-name regex:'^m3s_mma_fp4_r1$' --launch-count 40 \
  --clock-control none --metrics "$M" --csv --print-units base \
  /tmp/bin/m3 bench --backend gpu --preset m3.1 --kernels --kernel-reps 1 --iters 1 --kernel-stack 1x49152 \
  --kernel-rows 1 --kernel-experts "" --kernel-formats mxfp4 --variants "$A" > "$OUT/ncu-ring.csv" 2> /tmp/ncu.err
echo "exit $?"; tail -2 /tmp/ncu.err
[ "${LAYER:-0}" = 1 ] || exit 0
bash bench/device/s44b.sh
