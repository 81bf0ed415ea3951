#!/usr/bin/env bash
# Session 17, call 2 (issue 12): (1) pre: the fast walk's bulk L2 prefetch
# before the dependency wait (S_PRE_SC = 0, 4, 12, 4096 super-chunks a
# warp) on the step per MoE layer (b1, 4, 16; same process and rounds) and
# on the kernel microbench's 8 x [6144, 6144] stack; (2) ablate: each
# latency-bound launch's marginal cost inside the graph (M3_SKIP_LAUNCHES,
# --layers 12, b1 and b4; outputs wrong, times a diagnosis), a baseline
# first and last. SECTIONS picks parts (pre ablate). Logs to $OUT.
# (Run 2. S_PRE_SC measured slower and was removed since, bench/NOTES.md
# session 17; the pre section now fails on the unknown define.)
set -u
mkdir -p /tmp/bin && tar -C /tmp/bin -xJf .carry/bin.tar.xz
export XDG_CACHE_HOME=/tmp/xdg M3_KERNEL_CACHE=/tmp/kc
want() { case " ${SECTIONS:-pre ablate} " in *" $1 "*) return 0 ;; esac; return 1; }
B="S_MMA_WARPS=4 S_MMA_MAXBT=2"
V="$B;$B S_PRE_SC=4;$B S_PRE_SC=12;$B S_PRE_SC=4096"
want pre && {
  echo "=== stack 8x6144 ($(date +%T))"
  timeout 100 /tmp/bin/m3 bench --backend gpu --preset m3.1 --kernels --kernel-stack 8x6144 --kernel-rows 1,4 \
    --kernel-formats mxfp8,mxfp4 --kernel-experts "" --iters 40 --variants "$V" 2>&1 | grep -E "^\| Mx|rror"
  echo "=== step ($(date +%T))"
  timeout 300 /tmp/bin/m3 bench --backend gpu --preset m3.1 --layers 12 --per-layer 6 --batch 1,4,16 --context 4096 \
    --iters 50 --rounds 2 --variants "$V" 2>&1 | grep -E "per layer|^\| \[.*/|rror"
  echo "exit $?"
} > $OUT/pre.log 2>&1
want pre && cat $OUT/pre.log
want ablate && {
  for s in "" router_small attn_combine attn_partial headnorm_rope index_scores index_topk rmsnorm \
    moe_combine swiglu l2_prefetch m3s_mma_fp4_r1 m3s_mma_e4m3_r1 ""; do
    echo "=== skip '$s' ($(date +%T))"
    M3_SKIP_LAUNCHES=$s timeout 100 /tmp/bin/m3 bench --backend gpu --preset m3.1 --layers 12 --batch 1,4 \
      --context 4096 --iters 40 --rounds 1 2>&1 | grep -E "^\| decode|rror|ABLATION"
  done
} > $OUT/ablate.log 2>&1
want ablate && cat $OUT/ablate.log
