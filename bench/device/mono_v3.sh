#!/usr/bin/env bash
# Session 9 run 5: the mono linears with half the loads in flight a warp
# (S_UNROLL_HALF=1: no spills inside their loops at 128 registers under the
# call ABI, NVRTC 13.0 here), bit-identity, then against the standard path,
# and the op profile of the new interpreter (default build and this one).
set -u
mkdir -p /tmp/bin && tar -C /tmp/bin -xJf .carry/bin.tar.xz
export REQUIRE_GPU=1 M3_KERNEL_CACHE=/tmp/m3-kernels XDG_CACHE_HOME=/tmp/xdg
M3_MONO_DEFINES="S_UNROLL_HALF=1" timeout 120 /tmp/bin/test-runner mono_path --test-threads=1 --nocapture 2>&1 \
  | grep -E "^test |result|panicked|mono steps" | tail -6 > $OUT/gate.log
cat $OUT/gate.log
B="/tmp/bin/m3 bench --backend gpu --preset m3.1 --layers 12 --context 4096"
M3_MONO_DEFINES="S_UNROLL_HALF=1" timeout 150 $B --per-layer 6 --batch 1,4,16 --iters 40 --rounds 2 --path both --out $OUT/half.json > $OUT/half.log 2>&1
echo "exit $?" >> $OUT/half.log
grep -E "^mono path|^\| \[" $OUT/half.log | tail -7
i=0
for d in "" "S_UNROLL_HALF=1"; do
  M3_MONO_DEFINES="$d" timeout 100 $B --batch 1,16 --iters 5 --rounds 1 --path mono --profile > $OUT/prof$i.log 2>&1
  echo "== profile '$d'"; grep -A23 "^mono ops" $OUT/prof$i.log | grep -E "mono ops|^ +[0-9]+ " | head -44
  i=$((i+1))
done
