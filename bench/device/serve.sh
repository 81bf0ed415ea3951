#!/usr/bin/env bash
# Session 4 run 7: `m3 serve` on the GPU runner (small, MXFP4 / MXFP8), driven
# by `m3 bench-serve` at 1 and 16 concurrent streams, beside `m3 bench`'s
# step time of the same preset in the same call. Logs to $OUT.
set -u
mkdir -p /tmp/bin && tar -C /tmp/bin -xJf .carry/bin.tar.xz
export M3_KERNEL_CACHE=/tmp/m3-kernels XDG_CACHE_HOME=/tmp/xdg
M3=/tmp/bin/m3
{
  $M3 synth --preset small --experts mxfp4 --dense mxfp8 --out /tmp/small --draft-layers 0 -q
  timeout 60 $M3 bench --backend gpu --preset small --batch 1,16 --context 128 --iters 50 --rounds 2 --out $OUT/bench-small.json 2>&1 | grep -E "^\| decode|ceiling"
  $M3 serve --model /tmp/small --backend gpu --kv-dtype fp8_e4m3 --port 8011 --max-num-seqs 16 > $OUT/serve-stderr.log 2>&1 &
  SP=$!
  get() { python3 -c "import sys,urllib.request;print(urllib.request.urlopen(sys.argv[1]).read().decode())" "$1"; }
  for i in $(seq 1 60); do get http://127.0.0.1:8011/health >/dev/null 2>&1 && break; sleep 0.5; done
  for c in 1 16; do
    echo "=== bench-serve concurrency $c"
    timeout 60 $M3 bench-serve --url http://127.0.0.1:8011 --concurrency $c --num-prompts $((c * 4)) --input-len 64 --output-len 128 --id-range 4000 --output $OUT/serve-c$c.json 2>&1 | tail -30
  done
  get http://127.0.0.1:8011/metrics | grep -E "^m3_(requests|kv|preempt|running|waiting)" | head -20
  kill -TERM $SP; wait $SP; echo "serve exit $?"
} > $OUT/serve.log 2>&1
echo done
