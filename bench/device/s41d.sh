#!/usr/bin/env bash
# Session 41 (issue 12), any card (an H200 wanted), ~400 s cold: the E2M1
# decode by bit operations alone (s_h_e2m1, /tmp/bin) against the E4M3
# route through F2FP (/tmp/old: HEAD 04a2b0c), the device layout of E2M1
# codes changed with it.
# 1. the kernel microbench, MXFP4 and NVFP4 (MXFP8 as a control: the same
#    code in both), the tall launch 1 x [49152, 6144] at 1, 4, 16 rows and
#    grouped experts 4 / 16 / 64, old then new, ROUNDS rounds (kern.log);
# 2. the MoE layer (m3.1 --layers 12 minus 6, b1 / b4 / b16, standard path),
#    interleaved, 2 rounds (layer.log; a new device layout is a new random
#    model: compare b4 / b16 by GB/s, their MB a layer move);
# 3. correctness on the device (REQUIRE_GPU=1): the linears against f64
#    (variants_match_an_f64_reference, engine_linears_take_k_past_whole_chunks),
#    backend_ops, the runner's tests, golden (check.log).
set -u
. bench/device/common.sh
m3_setup old
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
K="--backend gpu --preset m3.1 --kernels --kernel-reps 1 --kernel-stack 1x49152 --kernel-experts 4,16,64 --kernel-rows 1,4,16 --kernel-formats mxfp4,nvfp4,mxfp8"
for r in $(seq 1 "${ROUNDS:-2}"); do
  for b in old bin; do
    echo "=== kernels $b round $r ($(date +%T))"
    # shellcheck disable=SC2086
    timeout 240 /tmp/$b/m3 bench $K 2>&1 | grep -E "x/row|rror|^ceiling" | cut -c1-150
  done
done > $OUT/kern.log 2>&1
grep -E "===|ceiling|1 x \[49152, 6144\] m1|experts gate\+up 4 of 128 x 2 x \[3072, 6144\] m1|rror" $OUT/kern.log | cut -c1-150
B="--backend gpu --preset m3.1 --layers 12 --per-layer 6 --batch 1,4,16 --context 4096 --iters 40 --rounds 1 --path standard"
m3_ab 2 "$B" /tmp/old/m3 /tmp/bin/m3 > $OUT/layer.log 2>&1
cat $OUT/layer.log | cut -c1-150
[ "${CHECK:-1}" = 1 ] || exit 0
{
  m3_unit 240 variants_match_an_f64_reference
  for t in backend_ops runner; do
    echo "=== test $t, REQUIRE_GPU=1 ($(date +%T))"
    REQUIRE_GPU=1 timeout 300 /tmp/bin/test-$t --test-threads=1 2>&1 | grep -E "^test |^test result|panicked|FAIL" | tail -24
  done
  echo "=== golden --backend gpu ($(date +%T))"
  REQUIRE_GPU=1 M3_BIN=/tmp/bin/m3 M3_ROOT=$PWD timeout 200 /tmp/bin/xtask golden --backend gpu --no-free-run 2>&1 | grep -E "golden:|FAIL|fail" | tail -4
} > $OUT/check.log 2>&1
cat $OUT/check.log
