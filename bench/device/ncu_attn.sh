#!/usr/bin/env bash
# Session 7: Nsight Compute on the batch-1 step's two slow non-GEMV kernels
# at 4k context (bench/NOTES.md session 7 run 5): m3s_attn_partial (~40 us
# a layer for 64 CTAs of one 128-key block each) and m3s_index_scores
# (~15 us for 32 blocks), plus index_scores at 128k. m3-old: the binary
# with the index grid as committed (run 4 carried both).
set -u
mkdir -p /tmp/bin && tar -C /tmp/bin -xJf .carry/bin.tar.xz
export REQUIRE_GPU=1 M3_KERNEL_CACHE=/tmp/m3-kernels XDG_CACHE_HOME=/tmp/xdg
NCU=/usr/local/cuda/bin/ncu
SEC="--section SpeedOfLight --section WarpStateStats --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis --section SchedulerStats"
B="/tmp/bin/m3-old bench --backend gpu --preset m3.1 --layers 12 --batch 1 --iters 1 --rounds 1 --warmup 0 --profile"
timeout 200 $NCU --target-processes all -k regex:m3s_attn_partial --launch-skip 6 --launch-count 1 $SEC $B --context 4096 > $OUT/ncu-attn.txt 2>&1
timeout 200 $NCU --target-processes all -k regex:m3s_index_scores --launch-skip 6 --launch-count 1 $SEC $B --context 4096 > $OUT/ncu-index4k.txt 2>&1
timeout 200 $NCU --target-processes all -k regex:m3s_index_scores --launch-skip 6 --launch-count 1 $SEC $B --context 131072 > $OUT/ncu-index128k.txt 2>&1
echo done
