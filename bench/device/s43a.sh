#!/usr/bin/env bash
# Session 43 (issue 12), any card (an H200 wanted), ~60 s warm: what the
# 16-row tile walk waits on. Session 42 run 1 (H200, L2-fed) put the
# 16-row walks' own rate at 58.9% (MXFP4), 52.0% (NVFP4), 83.5% (MXFP8)
# and 75.5% (bf16) of the memory ceiling against 90.6 / 90.7 / 134.5 /
# 139.3% at one row. bf16 decodes nothing and still drops, so the reading
# to test: at 16 rows a CTA re-reads x (16 rows x K x 2 bytes for its 16
# features: 4x the MXFP4 code bytes it streams, 1x bf16's), and the x
# traffic from L2 (or L1) sets the pace, not the decode. Nsight Compute at
# real clocks on the grouped m16 launches (64 of 128 experts, 16 rows an
# expert, [1024, 6144] gate + up), memory-fed and L2-fed, MXFP4 and MXFP8,
# x/row (the figure's form): L2 and L1 traffic and hit rates, pipes,
# stalls, achieved occupancy (ncu-m16.csv.xz; per case the launches of
# the default build, the small-step build with x per block, then x/row;
# the 1 x [16, 6144] stack is there only because a stack cannot be left
# out).
set -u
. bench/device/common.sh
m3_setup
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
ncu=/usr/local/cuda/bin/ncu
M="gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum"
M="$M,lts__t_sector_hit_rate.pct,lts__t_sectors_srcunit_tex_op_read.sum,lts__throughput.avg.pct_of_peak_sustained_elapsed"
M="$M,l1tex__t_sector_hit_rate.pct,l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum,l1tex__throughput.avg.pct_of_peak_sustained_active"
M="$M,sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread,launch__occupancy_limit_registers"
M="$M,sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active"
M="$M,sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active"
M="$M,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio"
M="$M,smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio"
M="$M,smsp__average_warps_issue_stalled_not_selected_per_issue_active.ratio"
M="$M,smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio"
M="$M,smsp__average_warps_issue_stalled_wait_per_issue_active.ratio"
M="$M,smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio"
M="$M,smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio"
M="$M,smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio"
echo "=== ncu m16 ($(date +%T))"
timeout 200 $ncu --target-processes all --kernel-name regex:'^m3s_mma_(fp4|e4m3)$' --launch-count 150 \
  --clock-control none --metrics "$M" --csv --print-units base \
  /tmp/bin/m3 bench --backend gpu --preset m3.1 --kernels --kernel-reps 1 --iters 1 --kernel-stack 1x16 \
  --kernel-rows 16 --kernel-experts 64 --kernel-top-k 64 --kernel-expert-n 1024 --kernel-l2 \
  --kernel-formats mxfp4,mxfp8 > /tmp/ncu-m16.csv 2> /tmp/ncu-m16.err
echo "exit $?"
xz -9c /tmp/ncu-m16.csv > "$OUT/ncu-m16.csv.xz"
grep -c '"gpu__time_duration.sum"' /tmp/ncu-m16.csv
tail -3 /tmp/ncu-m16.err
