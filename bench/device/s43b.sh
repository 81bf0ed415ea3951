#!/usr/bin/env bash
# Session 43 (issue 12), the H200 (it says nothing on an H100: there the
# tall launch reads 94.7% / 96.2%), ~150 s cold: s42b.sh's first part
# alone (its FMA variants were removed after their H100 run): the plain
# one-row walk in a 1 x [131072, 6144] launch (~110 us) beside the figure
# of record's 1 x [49152, 6144] (~46 us), MXFP4 / NVFP4 / MXFP8, to split
# the H200's tall-launch 76% into the walk and the launch's length
# (tall-*.log); then s43a.sh (Nsight Compute on the 16-row tile walk).
set -u
. bench/device/common.sh
m3_setup
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
case "$(nvidia-smi --query-gpu=name --format=csv,noheader)" in
  *H200*) TALL=1 ;;
  *) TALL=0; echo "not an H200: the tall launches left out" ;;
esac
for s in 1x131072 1x49152; do
  [ "$TALL" = 1 ] || break
  echo "=== $s ($(date +%T))"
  timeout 150 /tmp/bin/m3 bench --backend gpu --preset m3.1 --kernels --kernel-reps 1 --kernel-stack $s \
    --kernel-experts "" --kernel-rows 1 --kernel-formats mxfp4,nvfp4,mxfp8 --out "$OUT/tall-$s.json" > "$OUT/tall-$s.log" 2>&1
  echo "exit $?"; grep -E "x/row|rror|^ceiling" "$OUT/tall-$s.log" | cut -c1-150
done
[ "${NCU:-1}" = 1 ] || exit 0
bash bench/device/s43a.sh
