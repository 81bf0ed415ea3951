#!/usr/bin/env bash
# Session 23 (issue 12), prepared: the figures of record (PERF.md's
# protocol, as s21d.sh) with the E2M1 tile layout and row-scaled x, after
# s23b.sh's device check and s23c.sh's A/B: the bench model at batch 1-64,
# 4k and 128k, 3 rounds, the MoE-layer efficiency and the projected
# 60-layer step.
set -u
. bench/device/common.sh
m3_setup
m3_record
