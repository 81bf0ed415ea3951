#!/usr/bin/env bash
# Session 8 (issue 13): the first mono path. The runner test that holds it
# bit-identical to the standard path (and proves it was taken), then the
# bench model with every case on both paths in the same rounds
# (`--path both`), per layer, with a per-launch profile.
set -u
mkdir -p /tmp/bin && tar -C /tmp/bin -xJf .carry/bin.tar.xz
export REQUIRE_GPU=1 M3_KERNEL_CACHE=/tmp/m3-kernels XDG_CACHE_HOME=/tmp/xdg
{
  timeout ${TEST_TIMEOUT:-240} /tmp/bin/test-runner mono_path --nocapture --test-threads=1 2>&1 | tail -30
  echo "exit ${PIPESTATUS[0]}"
} > $OUT/test.log 2>&1
cat $OUT/test.log
timeout ${BENCH_TIMEOUT:-300} /tmp/bin/m3 bench --backend gpu --preset m3.1 --layers 12 --per-layer 6 \
  --batch ${BATCH:-1,4,16} --context 4096 --iters 40 --rounds 2 --path both ${PROFILE:---profile} \
  --out $OUT/mono.json > $OUT/bench.log 2>&1
echo "exit $?" >> $OUT/bench.log
grep -E "^mono|^\| |^profile|mono " $OUT/bench.log | grep -v "^| *[a-z_0-9]* *| *0\.0" | head -80
