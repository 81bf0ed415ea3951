#!/usr/bin/env bash
# Prepared in session 18 (issue 12): where the attention partial's and the
# MXFP4 / MXFP8 linears' instructions go now, per SASS line. Nsight
# Compute on a b4 step at 4k (the partial is instruction-bound there:
# ~20 us a layer, session 18 run 4) and on the index scores at 128k (b1);
# per-line CSVs for bench/tools/sass_profile.py. Caches and clocks
# uncontrolled (replays find them warm: read stalls per line, not times).
set -u
. bench/device/common.sh
m3_setup
NCU=/usr/local/cuda/bin/ncu
B="--backend gpu --preset m3.1 --layers 12 --iters 2 --rounds 1 --warmup 0"
sect="--section SourceCounters --section WarpStateStats --section LaunchStats --section SpeedOfLight --section Occupancy"
timeout 280 $NCU --target-processes all -k 'regex:m3s_(attn_partial_split|mma_fp4_r1|mma_e4m3_r1)$' \
  --launch-skip 40 --launch-count 6 --cache-control none --clock-control none $sect --import-source no \
  -o $OUT/b4 /tmp/bin/m3 bench $B --context 4096 --batch 4 > $OUT/ncu-b4.txt 2>&1
echo "ncu b4 exit $?"
timeout 200 $NCU --target-processes all -k 'regex:m3s_index_(scores|topk)$' \
  --launch-skip 20 --launch-count 4 --cache-control none --clock-control none $sect --import-source no \
  -o $OUT/s128k /tmp/bin/m3 bench $B --context 131072 --batch 1 > $OUT/ncu-128k.txt 2>&1
echo "ncu 128k exit $?"
for r in b4 s128k; do
  [ -f $OUT/$r.ncu-rep ] || continue
  $NCU -i $OUT/$r.ncu-rep --page details --print-units base 2>/dev/null \
    | grep -E "m3s_|Duration|Registers Per|Achieved Occupancy|Warp Cycles Per Issued|Issued Ipc|Grid Size" | head -60
  $NCU -i $OUT/$r.ncu-rep --page source --print-source sass --csv 2>/dev/null | xz -9 > $OUT/$r-sass.csv.xz
  rm -f $OUT/$r.ncu-rep
done
