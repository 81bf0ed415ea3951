#!/usr/bin/env bash
# Session 41 (issue 12), any card, ~250 s warm: bench/proto/pipes.py again
# (s41a.sh's run stopped at the module load: error 201), then the MoE layer
# (m3.1 --layers 12 minus 6, b1 / b4 / b16, standard path) with the L1
# prefetch of the one-row walks' next batch (S_W_PF_L1) on for the FP4
# formats (20 = MXFP4 + NVFP4) or MXFP4 alone (4), interleaved, ROUNDS
# rounds (2) against the defaults (ab.log).
set -u
. bench/device/common.sh
m3_setup
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
echo "=== pipes ($(date +%T))"
timeout 60 python3 bench/proto/pipes.py > $OUT/pipes.log 2>&1
echo "exit $?"; cat $OUT/pipes.log
D="S_MMA_WARPS=4 S_MMA_MAXBT=2"
variant() {
  local v=$1
  shift
  case $v in
    base) "$@" ;;
    pf20) env M3_SMALL_STEP_DEFINES="$D S_W_PF_L1=20" "$@" ;;
    pf4) env M3_SMALL_STEP_DEFINES="$D S_W_PF_L1=4" "$@" ;;
    *) echo "no variant $v" >&2; return 1 ;;
  esac
}
B="--backend gpu --preset m3.1 --layers 12 --per-layer 6 --batch 1,4,16 --context 4096 --iters 40 --rounds 1 --path standard"
for r in $(seq 1 "${ROUNDS:-2}"); do
  for v in ${VARIANTS:-base pf20 pf4}; do
    echo "=== $v round $r ($(date +%T))"
    # shellcheck disable=SC2086
    variant $v timeout 150 /tmp/bin/m3 bench $B 2>&1 | grep -E "^\| (\[[^]]*\] )?decode[^|]*\| [0-9.]+ / |rror"
  done
done > $OUT/ab.log 2>&1
cat $OUT/ab.log | cut -c1-160
