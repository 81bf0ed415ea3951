#!/usr/bin/env bash
# Session 12, call 1: verify11 (the refactor since session 11 run 6, never
# run on a GPU) then the mx_tune sweep, in one call (each cold start costs
# ~70 s of lease). Logs to $OUT.
set -u
bash bench/device/verify11.sh
sed -i 's/timeout 400/timeout 330/' bench/device/mx_tune.sh
bash bench/device/mx_tune.sh
