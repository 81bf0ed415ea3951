#!/usr/bin/env bash
# Prepared in session 7, NOT run (the device budget was spent): apply
# bench/device/index_h4.patch first (git apply), build, pack with m3-old =
# the binary before it. m3s_index_scores_h4 (index heads <= 4: 80 registers a
# thread instead of 106) against m3-old (as committed before it), same
# call: golden through the GPU (top-k blocks vs the reference), then the
# batch-1 step at 4k and 128k with each binary, and the indexer's
# per-launch time at 128k.
set -u
mkdir -p /tmp/bin && tar -C /tmp/bin -xJf .carry/bin.tar.xz
export REQUIRE_GPU=1 M3_KERNEL_CACHE=/tmp/m3-kernels XDG_CACHE_HOME=/tmp/xdg
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
{
  M3_BIN=/tmp/bin/m3 M3_ROOT=$PWD timeout 100 /tmp/bin/xtask golden --backend gpu 2>&1 | grep -E "golden:|FAIL|topk_blocks.*fail" | tail -8
  echo "exit ${PIPESTATUS[0]}"
} > $OUT/golden.log 2>&1
for b in m3-old m3; do
  {
    echo "=== $b"
    timeout 60 /tmp/bin/$b bench --backend gpu --preset m3.1 --layers 12 --batch 1 --context 4096 \
      --long-context 131072 --iters 40 --rounds 2 --profile --out $OUT/h4-$b.json 2>&1 | grep -E "^\| decode|^profile|index_scores|index_topk"
    echo "exit ${PIPESTATUS[0]}"
  } >> $OUT/bench.log 2>&1
done
echo done
