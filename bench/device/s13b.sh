#!/usr/bin/env bash
# Session 13, calls 2-3 (issue 12): the multi-CTA RMSNorm (m3s_rmsnorm:
# 256 threads, a CTA a 256-value slice, the 1024-thread sums), the router
# of a small step in one launch (m3s_router_small) and (call 3) the
# attention merge writing the o projection's f16 rows (no m3s_x_f16)
# against the tree before them (.carry/base.tar.xz: HEAD e8035ca's m3),
# per MoE layer in the same call; correctness under REQUIRE_GPU=1 (runner
# tests: mono bitwise the standard path; parity on both paths); Nsight
# Compute durations of the kernels concerned at b1. Logs to $OUT.
set -u
mkdir -p /tmp/bin /tmp/base && tar -C /tmp/bin -xJf .carry/bin.tar.xz && tar -C /tmp/base -xJf .carry/base.tar.xz
export XDG_CACHE_HOME=/tmp/xdg
export M3_KERNEL_CACHE=/tmp/kc-bin REQUIRE_GPU=1
{
  echo "=== runner tests ($(date +%T))"
  timeout 200 /tmp/bin/test-runner --test-threads=1 2>&1 | grep -E "^test |^test result|panicked" | tail -10
  CK=/tmp/ck; mkdir -p $CK
  /tmp/bin/m3 synth --preset small --experts nvfp4 --dense mxfp8 --out $CK/small-nv --draft-layers 0 -q
  /tmp/bin/m3 synth --preset small --experts mxfp4 --dense mxfp8 --out $CK/small --draft-layers 0 -q
  for m in small small-nv; do
    for p in standard mono; do
      echo "=== parity $m $p ($(date +%T))"
      timeout 60 /tmp/bin/m3 parity --model $CK/$m --reference cpu --backend gpu --path $p --prompts 8 --max-tokens 32 2>&1 | grep -E "^parity|rror" | tail -1
    done
  done
} > $OUT/verify.log 2>&1
cat $OUT/verify.log
unset REQUIRE_GPU
{
  for r in $(seq 1 ${ROUNDS:-2}); do
    for b in base bin; do
      echo "=== layers $b round $r ($(date +%T))"
      M3_KERNEL_CACHE=/tmp/kc-$b timeout 200 /tmp/$b/m3 bench --backend gpu --preset m3.1 --layers 12 --per-layer 6 \
        --batch 1,4,16 --context 4096 --iters 60 --rounds 1 2>&1 | grep -E "^\||MoE|per layer|rror"
      echo "exit ${PIPESTATUS[0]}"
    done
  done
} > $OUT/layers.log 2>&1
grep -E "===|exit|[0-9] / [0-9]" $OUT/layers.log | head -40
NCU=/usr/local/cuda/bin/ncu
for b in base bin; do
  M3_KERNEL_CACHE=/tmp/kc-$b timeout 90 $NCU --target-processes all -k regex:"m3s_rmsnorm|m3s_router|m3s_route|m3s_linear_f32w|m3s_attn_combine|m3s_x_f16" \
    --launch-skip 40 --launch-count 12 --metrics gpu__time_duration.sum --csv \
    /tmp/$b/m3 bench --backend gpu --preset m3.1 --layers 12 --context 4096 --iters 1 --rounds 1 --warmup 0 --batch 1 \
    > $OUT/ncu-$b.csv 2>&1
  echo "ncu $b exit $?"; grep -E "m3s_" $OUT/ncu-$b.csv | awk -F'","' '{print $5, $(NF)}' | head -12
done
