#!/usr/bin/env bash
# Session 10: issue 17's speed figures from one call (the bench model,
# m3.1 --layers 12, context 4096, batch 1 / 16 / 64): as generated, PTPC FP8
# attention + dense MLP, NVFP4 routed experts, the NVFP4 KV cache, and the
# shared expert on its own against folded into the expert table (also at
# 32); then both decode paths at 1 / 4 / 16 (issue 13; and the runtime
# line's CUDA route against session 9's figures). Logs to $OUT.
set -u
mkdir -p /tmp/bin && tar -C /tmp/bin -xJf .carry/bin.tar.xz
export M3_KERNEL_CACHE=/tmp/m3-kernels XDG_CACHE_HOME=/tmp/xdg
M3=/tmp/bin/m3
B="$M3 bench --backend gpu --preset m3.1 --layers 12 --context 4096 --iters 30 --rounds 2"
run() {
  local name=$1; shift
  echo "=== $name: $* ($(date +%T))"
  timeout 200 $B "$@" --out $OUT/$name.json > $OUT/$name.log 2>&1
  echo "exit $?"
  grep -E "^\| decode" $OUT/$name.log | head -8
}
{
  run base --batch 1,16,64
  run ptpc --batch 1,16,64 --online-quant ptpc_fp8
  run nvfp4-experts --batch 1,16,64 --weights nvfp4
  run kv-nvfp4 --batch 1,16,64 --kv-dtype nvfp4
  run shared-expert --batch 1,16,32,64 --shared-expert expert
  run shared-folded --batch 1,16,32,64 --shared-expert folded
} > $OUT/options.log 2>&1
cat $OUT/options.log
timeout 200 $M3 bench --backend gpu --preset m3.1 --layers 12 --per-layer 6 --batch 1,4,16 --context 4096 \
  --iters 40 --rounds 2 --path both --out $OUT/both.json > $OUT/both.log 2>&1
echo "exit $?" >> $OUT/both.log
grep -E "^\| \[|exit" $OUT/both.log | tail -8
rm -f $OUT/*.json
echo done
