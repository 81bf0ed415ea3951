#!/usr/bin/env bash
# H200 engine measurements (session 3, issue "one engine on the GPU"):
# PERF.md's bench model as a synthesized checkpoint (m3.1 --layers 12,
# MXFP4 experts, MXFP8 rest), loaded with `m3 generate` / `m3 batch` on the
# GPU runner, against `m3 bench`'s graph-captured step time on the same
# shapes in the same call; peak host RSS of the load; `m3 batch` on the CPU
# for the ratio. Logs to $OUT.
set -u
BIN=${BIN:-/tmp/bin}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export M3_KERNEL_CACHE=/tmp/m3-kernels XDG_CACHE_HOME=/tmp/xdg
M3=$BIN/m3
CK=/tmp/ck
mkdir -p $CK
step() { echo; echo "=== $* ($(date +%T))"; }
T() { if [ -x /usr/bin/time ]; then /usr/bin/time -v "$@"; else "$@"; fi; }
{
  nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw,clocks_throttle_reasons.active --format=csv
  df -h /tmp | tail -1; nproc; free -g | head -2
  step "synth m3.1 --layers 12 (mxfp4 experts, mxfp8 rest)"
  T $M3 synth --preset m3.1 --layers 12 --experts mxfp4 --dense mxfp8 --out $CK/m31 --draft-layers 0 -q 2>&1 | grep -E "wrote|Elapsed|Maximum resident"
  du -sh $CK/m31
  step "bench: standard path, batch 1/16/64, context 128 and 4096"
  timeout 150 $M3 bench --backend gpu --preset m3.1 --layers 12 --batch 1,16,64 --context 128 --iters 50 --rounds 2 --out "$OUT/bench-ctx128.json" 2>&1 | grep -E "^\||ceiling|clocks|graphs"
  step "generate batch 1 (prompt 64 tokens, 128 generated, fp8 cache)"
  TOK=$(python3 -c "print(','.join(str((i*7919+13)%200000) for i in range(64)))")
  T $M3 generate --model $CK/m31 --backend gpu --kv-dtype fp8_e4m3 --tokens "$TOK" --max-tokens 128 --ignore-eos --max-context 512 --max-seqs 1 2>&1 | grep -E "loaded|backend|Maximum resident|Elapsed"
  for n in ${BATCHES:-16 64}; do
    step "batch $n requests gpu (16-token prompts, 128 tokens each)"
    python3 -c "
import json
for i in range($n): print(json.dumps({'id': i, 'tokens': [(i*7919+j*31+5)%200000 for j in range(16)], 'max_tokens': 128}))" > /tmp/req$n.jsonl
    T $M3 batch --model $CK/m31 --backend gpu --kv-dtype fp8_e4m3 --input /tmp/req$n.jsonl --output /tmp/res$n.jsonl --ignore-eos --max-seqs $n --max-context 512 2>&1 | grep -E "loaded|requests|Maximum resident|Elapsed"
  done
  [ -n "${SKIP_CPU:-}" ] || {
  step "batch 16 requests cpu (16-token prompts, 4 tokens each)"
  python3 -c "
import json
for i in range(16): print(json.dumps({'id': i, 'tokens': [(i*7919+j*31+5)%200000 for j in range(16)], 'max_tokens': 4}))" > /tmp/reqc.jsonl
  timeout 200 $M3 batch --model $CK/m31 --backend cpu --kv-dtype fp8_e4m3 --input /tmp/reqc.jsonl --output /tmp/resc.jsonl --ignore-eos --max-seqs 16 --max-context 512 2>&1 | grep -E "loaded|requests"
  step "batch 16 requests gpu, same 4-token job"
  $M3 batch --model $CK/m31 --backend gpu --kv-dtype fp8_e4m3 --input /tmp/reqc.jsonl --output /tmp/resg.jsonl --ignore-eos --max-seqs 16 --max-context 512 2>&1 | grep -E "loaded|requests"
  python3 -c "
import json
a=[json.loads(l)['tokens'] for l in open('/tmp/resc.jsonl')]; b=[json.loads(l)['tokens'] for l in open('/tmp/resg.jsonl')]
print('cpu vs gpu, 16 requests x 4 tokens: identical', sum(x==y for x,y in zip(a,b)), 'of', len(a))"
  }
} > "$OUT/perf.log" 2>&1
echo done
