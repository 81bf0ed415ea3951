#!/usr/bin/env bash
# Session 10: where the merged tree's +4-5% per MoE layer at batch 1 comes
# from. Four m3 binaries (.carry/ab.tar.xz): base (692aefe + the EAGLE3
# golden work, no GPU change), hip (+ the runtime line), nvkv (+ the NVFP4
# KV cache), main (both merged), interleaved in two rounds each; then the
# per-launch profile at b1 for base and main.
set -u
mkdir -p /tmp/ab && tar -C /tmp/ab -xJf .carry/ab.tar.xz
export XDG_CACHE_HOME=/tmp/xdg
for r in 1 2; do
  for b in base hip nvkv main; do
    M3_KERNEL_CACHE=/tmp/kc-$b timeout 120 /tmp/ab/m3-$b bench --backend gpu --preset m3.1 --layers 12 --per-layer 6 --batch 1,16 \
      --context 4096 --iters 40 --rounds 2 > $OUT/$b-$r.log 2>&1
    echo "== $b round $r: exit $?"
    grep -E "^\| \[auto\]|^\| decode" $OUT/$b-$r.log | tail -2
  done
done
for b in base main; do
  M3_KERNEL_CACHE=/tmp/kc-$b timeout 60 /tmp/ab/m3-$b bench --backend gpu --preset m3.1 --layers 12 --batch 1 --context 4096 \
    --iters 5 --rounds 1 --profile > $OUT/prof-$b.log 2>&1
done
rm -f $OUT/*-2.log
echo done
