#!/usr/bin/env bash
# Session 28 (issue 13): served tokens/s with mono on and off, on `small`
# (MXFP4 experts, MXFP8 dense; fp8 cache): `m3 generate` at batch 1 (a
# 64-token prompt, 256 tokens) and `m3 batch` with 16 requests (16-token
# prompts, 128 tokens each), --path standard / mono / auto; the generated
# tokens' digest per path (mono is the standard path's bits: the same
# tokens). served.log.
set -u
. bench/device/common.sh
m3_setup
CK=/tmp/ck; mkdir -p $CK
/tmp/bin/m3 synth --preset small --experts mxfp4 --dense mxfp8 --out $CK/small --draft-layers 0 -q
TOK=$(python3 -c "print(','.join(str((i*7919+13)%4096) for i in range(64)))")
python3 -c "
import json
for i in range(16): print(json.dumps({'id': i, 'tokens': [(i*7919+j*31+5)%4096 for j in range(16)], 'max_tokens': 128}))" > /tmp/req16.jsonl
{
  for p in standard mono auto; do
    echo "=== generate --path $p ($(date +%T))"
    timeout 90 /tmp/bin/m3 generate --model $CK/small --backend gpu --kv-dtype fp8_e4m3 --path $p --tokens "$TOK" \
      --max-tokens 256 --ignore-eos --max-context 512 --max-seqs 1 > /tmp/gen.log 2>&1
    echo "rc $? | $(grep -oE 'decode [0-9.]+ tok/s[^|]*|steps [0-9]+ mono / [0-9]+ standard' /tmp/gen.log | tr '\n' ' ')| tokens md5 $(grep -o 'tokens \[.*\]' /tmp/gen.log | md5sum | cut -c1-12)"
    grep -iE "crossover|mono.*standard.*ms|rror" /tmp/gen.log | head -4
    echo "=== batch 16 --path $p ($(date +%T))"
    timeout 90 /tmp/bin/m3 batch --model $CK/small --backend gpu --kv-dtype fp8_e4m3 --path $p --input /tmp/req16.jsonl \
      --output /tmp/res16-$p.jsonl --ignore-eos --max-seqs 16 --max-context 512 2>&1 | grep -E "requests|rror" | tail -2
    echo "outputs md5 $(python3 -c "
import json
rows = sorted((json.loads(l) for l in open('/tmp/res16-$p.jsonl')), key=lambda r: r.get('id'))
print([r.get('tokens', r.get('output_tokens')) for r in rows])" | md5sum | cut -c1-12)"
  done
} > $OUT/served.log 2>&1
cat $OUT/served.log
