#!/usr/bin/env bash
# Issue 13's table of record in one call (prepared in session 29; best on
# the H200, any card runs it): `m3 bench --path both`, the MoE-layer rows
# (--per-layer 6) of the standard and mono paths from the same rounds,
# after the parity gate (every step's tokens and logits bit for bit):
# mono4k.log / mono4k.json: context 4096, batch 1, 2, 4, 8, 16 (mono) and
# 32, 64 (wide mono), 256-step gate, 2 rounds;
# mono128k.log / mono128k.json: batch 1 at 4096 and one sequence at
# 131072 (--long-context: the bench's long case is one sequence), 32-step
# gate, 2 rounds.
set -u
. bench/device/common.sh
m3_setup
B="--backend gpu --preset m3.1 --layers 12 --per-layer 6 --iters 40 --rounds 2 --path both"
timeout 380 /tmp/bin/m3 bench $B --batch 1,2,4,8,16,32,64 --context 4096 --parity-steps 256 \
  --out $OUT/mono4k.json > $OUT/mono4k.log 2>&1
echo "exit $?" >> $OUT/mono4k.log
grep -E "^device|^crossover|^mono parity|differ|^\| decode|^\| \[.*decode.*/|^exit|rror" $OUT/mono4k.log | tail -40
timeout 180 /tmp/bin/m3 bench $B --batch 1 --context 4096 --long-context 131072 --parity-steps 32 \
  --out $OUT/mono128k.json > $OUT/mono128k.log 2>&1
echo "exit $?" >> $OUT/mono128k.log
grep -E "^crossover|^mono parity|differ|^\| decode|^\| \[.*decode.*/|^exit|rror" $OUT/mono128k.log | tail -30
