#!/usr/bin/env bash
# Session 42 (issue 12), any card (~150 s cold): the linear kernels'
# own rate with the memory bus out of the way. The one-row grouped launch
# (1 row picking 64 experts of 128: 64 slots of gate + up [1024, 6144])
# read from memory (64 distinct experts, far past L2) and L2-fed (every
# slot routed to expert 0: one pair, read once from memory and then from
# L2; `--kernel-l2`), beside the tall plain launch, MXFP4, NVFP4, MXFP8
# and bf16 (bf16's L2-fed rate is what L2 supplies to this access
# pattern), 1 and 16 rows:
# 1. /tmp/bin/m3, the landed decode (l2-bin.log);
# 2. /tmp/logic/m3, the E2M1 decode by bit operations alone
#    (bench/results/2026-12-07-s41/d/e2m1_logic.patch on this build;
#    l2-logic.log).
# If the FP4 walks' L2-fed rate on an H100 sits near what they reach from
# the H200's memory (~3.4 TB/s, session 32), the walk itself, not the
# bus, sets the H200's figure, and the H100's L2-fed case is where a
# faster walk shows.
# Outputs l2-bin.* / l2-logic.*: session 42's run 1 wrote them as bin.* /
# logic.*, s41e.sh's names, and replaced s41e's files in that call.
set -u
. bench/device/common.sh
m3_setup logic
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
K="--backend gpu --preset m3.1 --kernels --kernel-reps 1 --kernel-stack 1x49152 --kernel-rows ${ROWS:-1,16}
 --kernel-experts 64 --kernel-top-k 64 --kernel-expert-n 1024 --kernel-l2 --kernel-formats ${FORMATS:-mxfp4,nvfp4,mxfp8,bf16}"
for b in bin logic; do
  echo "=== $b ($(date +%T))"
  # shellcheck disable=SC2086
  timeout 240 "/tmp/$b/m3" bench $K --out "$OUT/l2-$b.json" > "$OUT/l2-$b.log" 2>&1
  echo "exit $?"; grep -E "x/row|Bf16|rror|^ceiling" "$OUT/l2-$b.log" | cut -c1-170
done
