#!/usr/bin/env bash
# Session 19 (issue 12): what bounds the MX linears' body on one tall
# launch. The MXFP4 body (72.5% of the ceiling on one [49152, 6144] launch,
# session 16) converts codes with `cvt.rn.f16x2.e4m3x2` (F2FP), one a byte
# of E2M1 against one per two bytes of E4M3: if F2FP issues below the ALU
# rate, that pipe bounds MXFP4 (and NVFP4) and a decode by bit operations
# alone would lift it. 1. the tall-launch microbench (m1, m16) for MXFP8,
# MXFP4, NVFP4; 2. Nsight Compute on one launch of each one-row kernel:
# pipe utilization and instruction mix; 3. per-SASS-line stalls of the
# MXFP4 one-row kernel.
set -u
. bench/device/common.sh
m3_setup
NCU=/usr/local/cuda/bin/ncu
K="--backend gpu --preset m3.1 --kernels --kernel-stack 1x49152"
echo "=== microbench ($(date +%T))"
timeout 240 /tmp/bin/m3 bench $K --kernel-rows 1,16 --kernel-formats mxfp8,mxfp4,nvfp4 --kernel-experts 4,16 2>&1 | grep -E "^\||rror" | grep -v "| default |"
for f in mxfp8:e4m3 mxfp4:fp4 nvfp4:nvfp4; do
  fmt=${f%%:*}; kn=${f##*:}
  echo "=== ncu $fmt ($(date +%T))"
  timeout 150 $NCU --target-processes all -k "regex:m3s_mma_${kn}_r1\$" --launch-skip 3 --launch-count 1 \
    --cache-control none --clock-control none --section SpeedOfLight --section ComputeWorkloadAnalysis \
    --section InstructionStats --section WarpStateStats --section Occupancy --section SourceCounters --import-source no \
    -o $OUT/p-$fmt /tmp/bin/m3 bench $K --kernel-rows 1 --kernel-formats $fmt --kernel-experts "" > /tmp/ncu-$fmt.txt 2>&1
  echo "ncu exit $?"; tail -2 /tmp/ncu-$fmt.txt
  [ -f $OUT/p-$fmt.ncu-rep ] || continue
  $NCU -i $OUT/p-$fmt.ncu-rep --page details --print-units base > /tmp/d-$fmt.txt 2>&1
  grep -E "Duration|Pipe|pipe|Issue Slots|Executed Ipc|Warp Cycles Per Issued|DRAM Throughput|Registers Per|Achieved Occ" /tmp/d-$fmt.txt | head -40
  $NCU -i $OUT/p-$fmt.ncu-rep --page raw --print-units base 2>/dev/null \
    | grep -E "sm__inst_executed_pipe_[a-z0-9_]*\.sum |sm__pipe_[a-z0-9_]*cycles_active\.avg\.pct_of_peak_sustained_active" \
    | awk '$NF+0 > 1' | head -40
  [ $fmt = mxfp4 ] && $NCU -i $OUT/p-$fmt.ncu-rep --page source --print-source sass --csv 2>/dev/null | xz -9 > $OUT/fp4-sass.csv.xz
  cat /tmp/d-$fmt.txt >> $OUT/details.txt
  rm -f $OUT/p-$fmt.ncu-rep
done
xz -9 $OUT/details.txt
