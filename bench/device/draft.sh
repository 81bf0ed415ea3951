#!/usr/bin/env bash
# Session 5 run 2: the DSpark draft on the device (GpuRunner::draft_forward).
# The draft test binary (device draft vs CPU draft, planted error, lossless
# speculation on the GPU runner) and the runner tests (refactor regression)
# under REQUIRE_GPU=1; then `m3 generate` / `m3 batch` with --spec-tokens on
# tiny and small (MXFP4 / MXFP8, 2-layer drafts), GPU against CPU and
# against no speculation. Logs to $OUT.
set -u
mkdir -p /tmp/bin && tar -C /tmp/bin -xJf .carry/bin.tar.xz
export REQUIRE_GPU=1 M3_KERNEL_CACHE=/tmp/m3-kernels XDG_CACHE_HOME=/tmp/xdg
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
M3=/tmp/bin/m3
CK=/tmp/ck; mkdir -p $CK
step() { echo; echo "=== $* ($(date +%T))"; }
{
  for t in ${TESTS:-draft runner}; do
    step "test $t"
    timeout 240 /tmp/bin/test-$t --test-threads=1 --nocapture 2>&1 | grep -v "^test .* ok$" | tail -60
    echo "exit ${PIPESTATUS[0]}"
  done
} > $OUT/tests.log 2>&1
{
  $M3 synth --preset tiny --experts mxfp4 --dense mxfp8 --out $CK/tiny --draft-layers 2 -q
  $M3 synth --preset small --experts mxfp4 --dense mxfp8 --out $CK/small --draft-layers 2 -q
  for m in ${GEN_MODELS-tiny small}; do
    TOK=$(python3 -c "print(','.join(str((i*37+11)%500) for i in range(40)))")
    for be in cpu gpu; do
      for k in 0 3; do
        step "generate $m $be spec $k"
        timeout 120 $M3 generate --model $CK/$m --backend $be --tokens "$TOK" --max-tokens 64 --ignore-eos --spec-tokens $k 2>&1 | tail -4
      done
    done
    step "generate $m gpu spec 3, temperature 1, rejection verify"
    timeout 120 $M3 generate --model $CK/$m --backend gpu --tokens "$TOK" --max-tokens 64 --ignore-eos --spec-tokens 3 --verify rejection --temperature 1 --seed 5 2>&1 | tail -3
  done
  python3 -c "
import json
for i in range(16): print(json.dumps({'id': i, 'tokens': [(i*7919+j*31+5)%500 for j in range(24)], 'max_tokens': 64}))" > /tmp/req.jsonl
  # the small-step tensor-core variant (steps of <= 16 rows) sums K in
  # another order than the default: with it on, 16-row decode steps and
  # 64-row verify steps round differently; with it off they cannot
  for var in 1 0; do
    for k in 0 3; do
      step "batch small gpu 16 requests spec $k, small-step variant $var"
      M3_SMALL_STEP_VARIANT=$var timeout 120 $M3 batch --model $CK/small --backend gpu --input /tmp/req.jsonl --output /tmp/res$var-$k.jsonl --ignore-eos --max-seqs 16 --spec-tokens $k 2>&1 | tail -4
    done
    python3 -c "
import json
a=[json.loads(l)['tokens'] for l in open('/tmp/res$var-0.jsonl')]; b=[json.loads(l)['tokens'] for l in open('/tmp/res$var-3.jsonl')]
print('variant $var: batch gpu spec 3 vs spec 0: identical', sum(x==y for x,y in zip(a,b)), 'of', len(a))"
  done
} > $OUT/e2e.log 2>&1
echo done
