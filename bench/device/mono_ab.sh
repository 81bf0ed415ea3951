#!/usr/bin/env bash
# Prepared in session 8, NOT run: the first things for the next session's
# mono work. (1) The runner tests, the mono one first: it checks the mono
# build's m3s_rmsnorm_v1024 (written after session 8's last call) and
# the indirect op calls (S_MONO_INDIRECT=1, now the default) bit for bit
# against the standard path. (2) Both op-call forms against the standard
# path, same call: direct calls (S_MONO_INDIRECT=0, what runs 4-6
# measured) and indirect ones.
set -u
mkdir -p /tmp/bin && tar -C /tmp/bin -xJf .carry/bin.tar.xz
export REQUIRE_GPU=1 M3_KERNEL_CACHE=/tmp/m3-kernels XDG_CACHE_HOME=/tmp/xdg
{
  timeout 240 /tmp/bin/test-runner --test-threads=1 --nocapture 2>&1 | grep -E "^test |result|panicked|mono steps" | tail -16
  echo "exit ${PIPESTATUS[0]}"
} > $OUT/gate.log 2>&1
cat $OUT/gate.log
for ind in 0 1; do
  M3_MONO_DEFINES="S_MONO_INDIRECT=$ind" timeout 150 /tmp/bin/m3 bench --backend gpu --preset m3.1 --layers 12 \
    --per-layer 6 --batch 1,4,16 --context 4096 --iters 40 --rounds 2 --path both --out $OUT/ind$ind.json \
    > $OUT/ind$ind.log 2>&1
  echo "exit $?" >> $OUT/ind$ind.log
  echo "=== S_MONO_INDIRECT=$ind"
  grep -E "^mono|ms per layer|^\| \[" $OUT/ind$ind.log | tail -8
done
