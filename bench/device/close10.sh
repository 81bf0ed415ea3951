#!/usr/bin/env bash
# Session 10's closing call: the NVFP4 cache's bodies as entry points of
# their own (the fp8 path back to its registers), GpuBackend opening CUDA
# or HIP. Runner and backend-ops tests and golden under REQUIRE_GPU=1, then
# the step per MoE layer against the tree before this session's merges
# (.carry/ab.tar.xz: m3-base), interleaved, same call.
set -u
mkdir -p /tmp/bin /tmp/ab && tar -C /tmp/bin -xJf .carry/bin.tar.xz && tar -C /tmp/ab -xJf .carry/ab.tar.xz
export M3_KERNEL_CACHE=/tmp/m3-kernels XDG_CACHE_HOME=/tmp/xdg
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
{
  for t in runner backend_ops; do
    echo "=== test $t ($(date +%T))"
    REQUIRE_GPU=1 timeout 240 /tmp/bin/test-$t --test-threads=1 2>&1 | grep -E "^test .*FAILED|^test result|panicked" | tail -8
    echo "exit ${PIPESTATUS[0]}"
  done
  echo "=== golden ($(date +%T))"
  REQUIRE_GPU=1 M3_BIN=/tmp/bin/m3 M3_ROOT=$PWD timeout 200 /tmp/bin/xtask golden --backend gpu 2>&1 | grep -E "^golden:|FAIL|skip" | tail -6
  echo "exit ${PIPESTATUS[0]}"
} > $OUT/gate.log 2>&1
cat $OUT/gate.log
for r in 1 2; do
  for b in base new; do
    M3_KERNEL_CACHE=/tmp/kc-$b timeout 120 /tmp/ab/m3-$b bench --backend gpu --preset m3.1 --layers 12 --per-layer 6 --batch 1,16 \
      --context 4096 --iters 40 --rounds 2 > $OUT/$b-$r.log 2>&1
    echo "== $b round $r: exit $?"
    grep -E "^\| decode" $OUT/$b-$r.log | tail -2
  done
done
echo done
