#!/usr/bin/env bash
# Session 5 run 1: `m3 serve` on the GPU runner with PERF.md's bench model as
# a synthesized checkpoint (m3.1 --layers 12, MXFP4 experts, MXFP8 rest, fp8
# cache), driven by `m3 bench-serve` at 1 and 16 concurrent streams, beside
# `m3 bench`'s step time on the same shapes in the same call. Also times
# the (now parallel) synth and the load (host RSS). Logs to $OUT.
set -u
mkdir -p /tmp/bin && tar -C /tmp/bin -xJf .carry/bin.tar.xz
export M3_KERNEL_CACHE=/tmp/m3-kernels XDG_CACHE_HOME=/tmp/xdg
M3=/tmp/bin/m3
CK=/tmp/ck; mkdir -p $CK
step() { echo; echo "=== $* ($(date +%T))"; }
T() { /usr/bin/time -v "$@"; }
get() { python3 -c "import sys,urllib.request;print(urllib.request.urlopen(sys.argv[1]).read().decode())" "$1"; }
{
  nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv; nproc
  step "synth m3.1 --layers 12 (mxfp4 experts, mxfp8 rest), all cores"
  T $M3 synth --preset m3.1 --layers 12 --experts mxfp4 --dense mxfp8 --out $CK/m31 --draft-layers 0 -q 2>&1 | grep -E "wrote|Elapsed|Maximum resident|Percent of CPU"
  step "bench: standard path, batch 1/16, context 128"
  timeout 150 $M3 bench --backend gpu --preset m3.1 --layers 12 --batch 1,16 --context 128 --iters 50 --rounds 2 --out "$OUT/bench31.json" 2>&1 | grep -E "^\| decode|ceiling"
  step "generate batch 1 (load time and RSS)"
  TOK=$(python3 -c "print(','.join(str((i*7919+13)%200000) for i in range(64)))")
  T $M3 generate --model $CK/m31 --backend gpu --kv-dtype fp8_e4m3 --tokens "$TOK" --max-tokens 128 --ignore-eos --max-context 512 --max-seqs 1 2>&1 | grep -E "loaded|backend|tok/s|Maximum resident|Elapsed"
  step "serve"
  $M3 serve --model $CK/m31 --backend gpu --kv-cache-dtype fp8_e4m3 --port 8011 --max-num-seqs 16 --max-model-len 512 > $OUT/serve31-stderr.log 2>&1 &
  SP=$!
  for i in $(seq 1 240); do get http://127.0.0.1:8011/health >/dev/null 2>&1 && break; sleep 0.5; done
  echo "healthy after ~$((i / 2)) s"
  for c in 1 16; do
    step "bench-serve concurrency $c"
    timeout 120 $M3 bench-serve --url http://127.0.0.1:8011 --concurrency $c --num-prompts $((c * 4)) --input-len 64 --output-len 128 --id-range 200000 --seed 7 --output $OUT/serve31-c$c.json > /dev/null 2>$OUT/bench-serve-c$c.err
    python3 -c "
import json
r=json.load(open('$OUT/serve31-c$c.json'))
print({k:r[k] for k in ['completed','failed','duration_s','output_tokens_per_s']})
print('itl', r['itl_ms']); print('ttft', r['ttft_ms'])"
  done
  get http://127.0.0.1:8011/metrics | grep -E "^m3_(requests|kv|preempt|running|waiting|steps)" | head -20
  kill -TERM $SP; wait $SP; echo "serve exit $?"
} > $OUT/serve31.log 2>&1
echo done
