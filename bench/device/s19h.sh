#!/usr/bin/env bash
# Session 19 (issue 12): S_H_STRIDE=1, the fast walk's batches dealt to a
# CTA's warps in turn (the CTA reads 4 U adjacent super-chunks of its rows
# at a time: 512 bytes a row for MXFP4, against 128 from each warp's own
# run), against the default contiguous runs. Kernel microbench, MXFP4 and
# MXFP8, rows 1 / 4, one tall launch and 8 launches (each case checked
# against f64). Written as it goes: the session's last ~200 s of device.
set -u
. bench/device/common.sh
m3_setup
S="S_MMA_WARPS=4 S_MMA_MAXBT=2"
for st in 1x49152 ""; do
  echo "=== stack '$st' ($(date +%T))" >> $OUT/mb.log
  timeout 170 /tmp/bin/m3 bench --backend gpu --preset m3.1 --kernels --kernel-rows 1,4 --kernel-formats mxfp4,mxfp8 \
    --kernel-stack "$st" --kernel-experts 4 --variants "$S S_H_STRIDE=1" 2>&1 | grep -E "^\||rror" | grep -v "| default |" >> $OUT/mb.log
done
cat $OUT/mb.log
