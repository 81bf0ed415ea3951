#!/usr/bin/env bash
# Session 6 runs 3-4 (issue 12), a record (S_DEC_PROBE exists only in commit
# 91cda86): what bounds the MX linears at batch 1. Bench-only
# speed probes with WRONG values (S_DEC_PROBE, standard_decode.cu; run 3 had
# VARIANTS="$S;$S S_DEC_PROBE=1;$S S_DEC_PROBE=2" PV="$S S_DEC_PROBE=2"): 1 = the
# E2M1 decode at the instruction count of a bit-plane device layout, 2 = no
# decode at all, 3 no scale loads, 4 no x loads, 5 neither. The bench model's step with each forced at batch 1 / 4 /
# 16, beside the small-step defaults, one call; then a per-launch profile
# at batch 1 for the defaults and probe 2.
set -u
mkdir -p /tmp/bin && tar -C /tmp/bin -xJf .carry/bin.tar.xz
export M3_KERNEL_CACHE=/tmp/m3-kernels XDG_CACHE_HOME=/tmp/xdg
M3=/tmp/bin/m3
S="S_MMA_WARPS=4 S_MMA_MAXBT=2"
V=${VARIANTS:-"$S;$S S_DEC_PROBE=3;$S S_DEC_PROBE=4;$S S_DEC_PROBE=5"}
timeout 240 $M3 bench --backend gpu --preset m3.1 --layers 12 --batch 1,4,16 --context 4096 --iters 40 --rounds 2 \
  --variants "$V" --out $OUT/step.json > $OUT/step.log 2>&1
echo "exit $?" >> $OUT/step.log
timeout 200 $M3 bench --backend gpu --preset m3.1 --layers 12 --batch 1 --context 4096 --iters 20 --rounds 1 \
  --variants "${PV:-$S S_DEC_PROBE=3}" --profile --out $OUT/profile.json > $OUT/profile.log 2>&1
echo "exit $?" >> $OUT/profile.log
echo done
