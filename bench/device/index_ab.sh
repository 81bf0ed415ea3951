#!/usr/bin/env bash
# Prepared in session 7, NOT run (the device budget was spent): an A/B of
# one indexer patch against the binary before it. Apply one of
# bench/device/index_mma.patch (the block scores on tensor cores,
# m3s_index_scores_mma: 80 registers, the attention S phase's fragments)
# or bench/device/index_h4.patch (m3s_index_scores_h4: the scalar kernel
# for <= 4 index heads, 80 registers instead of 106) with `git apply`,
# build, pack, and add the binary before it as m3-old. Golden through the
# GPU (top-k blocks against the reference) and the runner tests first, then
# the batch-1 / 16 step at 4k and 128k with each binary and the indexer's
# per-launch time.
set -u
mkdir -p /tmp/bin && tar -C /tmp/bin -xJf .carry/bin.tar.xz
export REQUIRE_GPU=1 M3_KERNEL_CACHE=/tmp/m3-kernels XDG_CACHE_HOME=/tmp/xdg
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
{
  M3_BIN=/tmp/bin/m3 M3_ROOT=$PWD timeout 100 /tmp/bin/xtask golden --backend gpu 2>&1 | grep -E "golden:|FAIL|topk_blocks.*fail" | tail -8
  echo "exit ${PIPESTATUS[0]}"
  timeout 120 /tmp/bin/test-runner --test-threads=1 2>&1 | grep -E "^test .*(ok|FAILED)$|result|panicked" | tail -10
  echo "exit ${PIPESTATUS[0]}"
} > $OUT/golden.log 2>&1
for b in m3-old m3; do
  {
    echo "=== $b"
    timeout 60 /tmp/bin/$b bench --backend gpu --preset m3.1 --layers 12 --batch 1,16 --context 4096 \
      --long-context 131072 --iters 40 --rounds 2 --profile --out $OUT/ab-$b.json 2>&1 | grep -E "^\| decode|^profile|index_scores|index_topk"
    echo "exit ${PIPESTATUS[0]}"
  } >> $OUT/bench.log 2>&1
done
echo done
