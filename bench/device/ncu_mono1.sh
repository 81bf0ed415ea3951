#!/usr/bin/env bash
# Session 9 run 7: source counters of one mono layer at batch 1 (the
# build of record after run 6): where the single-CTA ops (RMSNorm stand-in
# ~21 us, router warp ~25 us) spend their time, per SASS line.
set -u
mkdir -p /tmp/bin && tar -C /tmp/bin -xJf .carry/bin.tar.xz
export M3_KERNEL_CACHE=/tmp/m3-kernels XDG_CACHE_HOME=/tmp/xdg
NCU=/usr/local/cuda/bin/ncu
B="/tmp/bin/m3 bench --backend gpu --preset m3.1 --layers 12 --context 4096 --iters 1 --rounds 1 --warmup 0"
timeout 150 $NCU --target-processes all -k regex:m3s_mono --launch-skip 3 --launch-count 1 \
  --section SourceCounters --section WarpStateStats --section LaunchStats --section SpeedOfLight \
  --import-source no -o $OUT/mono1 $B --batch 1 --path mono > $OUT/ncu-run.txt 2>&1
$NCU -i $OUT/mono1.ncu-rep --print-details all > $OUT/mono1.txt 2>&1
$NCU -i $OUT/mono1.ncu-rep --page source --print-source sass --csv 2>/dev/null | xz -9 > $OUT/mono1-sass.csv.xz
rm -f $OUT/*.ncu-rep
ls -la $OUT; tail -3 $OUT/ncu-run.txt; grep -E "Duration|Warp Cycles Per Issued" $OUT/mono1.txt | head -3
