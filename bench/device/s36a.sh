#!/usr/bin/env bash
# Session 36 (issue 13), any card, ~420 s; its most informative part first
# (so a call cut short still brings the profiles back):
# 1. The mono op profile's new wake split (mono.cu / mono_prelude.h: when
#    each CTA's body passed its dependency wait; mono.rs `wake_times`):
#    for the CTA that finished each op last, how long after the op before
#    ended it saw the barrier complete (wake) and how long its share then
#    ran (run); the mean wake over the CTAs that ran a body. Session 35's
#    b1 profile had the small ops at ~9-12 us each of the critical path
#    (RMSNorm of one row 9.1, head norm 9.5, the merge 11.1): the barrier
#    or the body? Default build, b1 / b4 / b16 -> prof-base-b*.log.
# 2. `M3_TWICE_LAUNCHES` (new): the small ops each recorded twice in a row
#    (a barrier between), b1 -> prof-twice-b1.log: each op's cold run (its
#    code and inputs from L2 or further) against its warm repeat.
# 3. `S_MONO_WAKE_ACQ=1` (acq): the poller re-reads the count with one
#    acquire load instead of `fence.acq_rel.gpu` (NVRTC 13.0: the 51
#    MEMBAR.ALL.GPU of the inlined waits gone) and releases `seen` at CTA
#    scope; the waiters read it with acquire loads, no fence. Interleaved
#    with the default (base), 2 rounds, b1 / b4 / b16, each after a 16-step
#    gate -> ab.log; then acq's b1 profile -> prof-acq-b1.log.
set -u
. bench/device/common.sh
m3_setup
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
echo "=== compile ($(date +%T))"
timeout 300 /tmp/bin/m3 bench --backend gpu --preset m3.1 --layers 4 --batch 1,4,16 --iters 1 --rounds 1 \
  --warmup 1 --parity-steps 0 --path both > $OUT/compile.log 2>&1 || tail -5 $OUT/compile.log
P="--backend gpu --preset m3.1 --layers 12 --context 4096 --iters 1 --rounds 1 --warmup 0 --path mono --profile"
prof() {  # prof NAME BATCH [ENV...]
  local n=$1 b=$2
  shift 2
  env "$@" timeout 60 /tmp/bin/m3 bench $P --batch $b > $OUT/prof-$n-b$b.log 2>&1
  echo "=== profile $n b$b (exit $?, $(date +%T))"; grep -A26 "^mono ops" $OUT/prof-$n-b$b.log | cut -c1-190
}
prof base 1
prof twice 1 M3_TWICE_LAUNCHES=rmsnorm,headnorm_rope,index_topk,attn_combine,moe_combine
prof base 4
prof base 16
B="--backend gpu --preset m3.1 --layers 12 --per-layer 6 --batch 1,4,16 --context 4096 --iters 40 --rounds 1 --path both --parity-steps 16"
m3_mono_ab 2 "$B" base= acq=S_MONO_WAKE_ACQ=1 > $OUT/ab.log 2>&1
grep -E "^===|compiled|\[mono\]|differ|rror|failed" $OUT/ab.log | cut -c1-150
prof acq 1 M3_MONO_DEFINES=S_MONO_WAKE_ACQ=1
