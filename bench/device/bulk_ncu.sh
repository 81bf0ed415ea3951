#!/usr/bin/env bash
# Session 10 run 2: why the bulk-copy weight stream is slower. Nsight
# Compute on one MXFP4 expert launch (b1 step) with the register path and
# with S_MMA_BULK=1 S_BULK_NS=2, and the microbench of whole-range stages
# (S_BULK_NS=1 S_UNROLL_MUL=3: one 768-byte copy a row and warp).
set -u
mkdir -p /tmp/bin && tar -C /tmp/bin -xJf .carry/bin.tar.xz
export REQUIRE_GPU=1 M3_KERNEL_CACHE=/tmp/m3-kernels XDG_CACHE_HOME=/tmp/xdg
M3=/tmp/bin/m3
NCU=/usr/local/cuda/bin/ncu
S="S_MMA_WARPS=4 S_MMA_MAXBT=2"
B="$M3 bench --backend gpu --preset m3.1 --layers 4 --context 4096 --iters 1 --rounds 1 --warmup 0 --batch 1"
for v in reg bulk; do
  if [ $v = bulk ]; then export M3_SMALL_STEP_DEFINES="$S S_MMA_BULK=1 S_BULK_NS=2"; else export M3_SMALL_STEP_DEFINES="$S"; fi
  timeout 150 $NCU --target-processes all -k regex:m3s_mma_fp4 --launch-skip 2 --launch-count 1 \
    --section SourceCounters --section WarpStateStats --section LaunchStats --section SpeedOfLight --section Occupancy --section MemoryWorkloadAnalysis \
    --import-source no -o $OUT/$v $B > $OUT/ncu-$v-run.txt 2>&1
  $NCU -i $OUT/$v.ncu-rep --print-details all > $OUT/$v.txt 2>&1
  $NCU -i $OUT/$v.ncu-rep --page source --print-source sass --csv 2>/dev/null | xz -9 > $OUT/$v-sass.csv.xz
  rm -f $OUT/$v.ncu-rep
  grep -E "Duration|Achieved Occupancy|Warp Cycles Per Issued|Stall (Long|Barrier|Short|Wait|No Inst|LG|MIO|Math|Branch|Not Sel|Dispatch|Sleep|Membar|Misc)|DRAM Throughput|Registers Per|Shared Memory Config|Dynamic Shared|Block Limit" $OUT/$v.txt | head -40
done
unset M3_SMALL_STEP_DEFINES
V="$S;$S S_MMA_BULK=1 S_BULK_NS=1 S_UNROLL_MUL=3;$S S_MMA_BULK=1 S_BULK_NS=2 S_UNROLL_MUL=2 S_BULK_XROWS=0"
timeout 240 $M3 bench --backend gpu --kernels --preset m3.1 --iters 30 --kernel-rows 1,16 --variants "$V" --out $OUT/kernels.json > $OUT/kernels.log 2>&1
grep -E "^\| (Mxfp4|E4m3)" $OUT/kernels.log | grep -E "8 x|64 of" | head -30
echo done
