#!/usr/bin/env bash
# Session 9 run 4: the mono interpreter with the virtual-block loop inside
# each op's function (register saves once an op, sub-blocks independent)
# and the grid barrier polling with relaxed loads. Bit-identity first
# (default build, and 1 CTA an SM with twice the loads in flight), then
# the builds against the standard path in one call.
set -u
mkdir -p /tmp/bin && tar -C /tmp/bin -xJf .carry/bin.tar.xz
export REQUIRE_GPU=1 M3_KERNEL_CACHE=/tmp/m3-kernels XDG_CACHE_HOME=/tmp/xdg
for d in "" "S_MONO_MINB=1 S_UNROLL_MUL=2"; do
  echo "== runner mono test, M3_MONO_DEFINES='$d'"
  M3_MONO_DEFINES="$d" timeout 120 /tmp/bin/test-runner mono_path --test-threads=1 --nocapture 2>&1 | grep -E "^test |result|panicked|mono steps" | tail -6
done > $OUT/gate.log 2>&1
cat $OUT/gate.log
B="/tmp/bin/m3 bench --backend gpu --preset m3.1 --layers 12 --per-layer 6 --batch 1,4,16 --context 4096 --iters 40 --rounds 2"
i=0
for d in "" "S_MONO_MINB=1" "S_MONO_MINB=1 S_UNROLL_MUL=2"; do
  p=mono; [ $i = 0 ] && p=both
  M3_MONO_DEFINES="$d" timeout 150 $B --path $p --out $OUT/v$i.json > $OUT/v$i.log 2>&1
  echo "exit $?" >> $OUT/v$i.log
  echo "=== v$i M3_MONO_DEFINES='$d'"
  grep -E "^mono path|^\| \[|^\| decode" $OUT/v$i.log | tail -8
  i=$((i+1))
done
