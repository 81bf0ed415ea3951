#!/usr/bin/env bash
# Session 22, issue 13: the chain-of-phases prototype (bench/proto/chain.py):
# a b1 MoE layer's 14 dependent phases with ideal streaming bodies, a launch a
# phase (with and without PDL) against one persistent kernel a layer (grid
# barrier; first batch before the wait; L2 / shared-memory staging of the
# next big phase).
set -u
cd bench/proto
timeout 500 python3 chain.py 2>&1 | tee $OUT/chain.log
nvidia-smi --query-gpu=clocks.sm,clocks.mem,power.draw --format=csv >> $OUT/chain.log 2>&1
