#!/usr/bin/env bash
# Session 9 run 3: Nsight Compute on one mono layer launch (b16 and b1) and
# on the standard path's MXFP4 expert kernel at b16 (the op that takes most
# of a mono b16 layer, 2.4x its standard time in run 2), full set, plus the
# per-SASS-line source counters of the mono b16 launch (xz'd CSV).
set -u
mkdir -p /tmp/bin && tar -C /tmp/bin -xJf .carry/bin.tar.xz
export M3_KERNEL_CACHE=/tmp/m3-kernels XDG_CACHE_HOME=/tmp/xdg
NCU=/usr/local/cuda/bin/ncu
B="/tmp/bin/m3 bench --backend gpu --preset m3.1 --layers 12 --context 4096 --iters 1 --rounds 1 --warmup 0"
timeout 200 $NCU --target-processes all -k regex:m3s_mono --launch-skip 3 --launch-count 1 --set full \
  --import-source no -o $OUT/mono16 $B --batch 16 --path mono > $OUT/ncu-run.txt 2>&1
timeout 150 $NCU --target-processes all -k regex:m3s_mma_fp4 --launch-skip 2 --launch-count 1 --set full \
  -o $OUT/std16 $B --batch 16 --path standard >> $OUT/ncu-run.txt 2>&1
timeout 150 $NCU --target-processes all -k regex:m3s_mono --launch-skip 3 --launch-count 1 --set full \
  -o $OUT/mono1 $B --batch 1 --path mono >> $OUT/ncu-run.txt 2>&1
for r in mono16 std16 mono1; do
  $NCU -i $OUT/$r.ncu-rep --print-details all > $OUT/$r.txt 2>&1
done
$NCU -i $OUT/mono16.ncu-rep --page source --print-source sass --csv 2>/dev/null | xz -9 > $OUT/mono16-sass.csv.xz
$NCU -i $OUT/std16.ncu-rep --page source --print-source sass --csv 2>/dev/null | xz -9 > $OUT/std16-sass.csv.xz
rm -f $OUT/*.ncu-rep
ls -la $OUT; tail -5 $OUT/ncu-run.txt
for r in mono16 std16 mono1; do echo "== $r"; grep -E "Duration|DRAM Throughput|Achieved Occupancy|Registers Per|Local Memory|L1/TEX Hit|L2 Hit|Executed Ipc A|No Eligible|Warp Cycles Per Issued" $OUT/$r.txt | head -14; done
