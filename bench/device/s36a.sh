#!/usr/bin/env bash
# Session 36 (issue 13), any card, ~420 s. Two things, one build:
# 1. The mono op profile's new wake split (mono.cu / mono_prelude.h: when
#    each CTA's body passed its dependency wait; mono.rs `wake_times`):
#    for the CTA that finished each op last, how long after the op before
#    ended it saw the barrier complete (wake) and how long its share then
#    ran (run); the mean wake over the CTAs that ran a body. Session 35's
#    b1 profile had the small ops at ~9-12 us each of the critical path
#    (RMSNorm of one row 9.1, head norm 9.5, the merge 11.1): the barrier
#    or the body?
# 2. `S_MONO_WAKE_ACQ=1` (acq): the poller re-reads the count with one
#    acquire load instead of `fence.acq_rel.gpu` (NVRTC 13.0: the 51
#    MEMBAR.ALL.GPU of the inlined waits gone) and releases `seen` at CTA
#    scope; the waiters read it with acquire loads, no fence. Interleaved
#    with the default (base), 2 rounds, b1 / b4 / b16, each after a 16-step
#    gate -> ab.log; then profiles (base b1 / b4 / b16, acq b1) -> prof-*.log.
# 3. `M3_TWICE_LAUNCHES` (new): the small ops each recorded twice in a row
#    (a barrier between), b1 profile -> prof-twice-b1.log: each op's cold
#    run (its code and inputs from L2 or further) against its warm repeat.
set -u
. bench/device/common.sh
m3_setup
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
B="--backend gpu --preset m3.1 --layers 12 --per-layer 6 --batch 1,4,16 --context 4096 --iters 40 --rounds 1 --path both --parity-steps 16"
m3_mono_ab 2 "$B" base= acq=S_MONO_WAKE_ACQ=1 > $OUT/ab.log 2>&1
grep -E "^===|compiled|\[mono\]|differ|rror|failed" $OUT/ab.log | cut -c1-150
P="--backend gpu --preset m3.1 --layers 12 --context 4096 --iters 1 --rounds 1 --warmup 0 --path mono --profile"
for vb in base:1 base:4 base:16 acq:1; do
  v=${vb%%:*} b=${vb#*:}
  variant $v timeout 60 /tmp/bin/m3 bench $P --batch $b > $OUT/prof-$v-b$b.log 2>&1
  echo "=== profile $v b$b (exit $?)"; grep -A20 "^mono ops" $OUT/prof-$v-b$b.log | cut -c1-190
done
variant base env M3_TWICE_LAUNCHES=rmsnorm,headnorm_rope,index_topk,attn_combine,moe_combine \
  timeout 60 /tmp/bin/m3 bench $P --batch 1 --parity-steps 0 > $OUT/prof-twice-b1.log 2>&1
echo "=== profile twice b1 (exit $?)"; grep -A26 "^mono ops" $OUT/prof-twice-b1.log | cut -c1-190
