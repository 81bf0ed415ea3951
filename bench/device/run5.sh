#!/usr/bin/env bash
# Session 4 run 5: the small-step variant on by default. m3.1 synthesized in
# the background while the runner tests, parity (every format, a4) and
# golden run; then perf.sh's engine measurements on m3.1.
set -u
mkdir -p /tmp/bin && tar -C /tmp/bin -xJf .carry/bin.tar.xz
(SKIP_CPU=1 BATCHES="64 16" OUT=$OUT timeout 560 bash bench/device/perf.sh) &
sleep 2
TESTS=runner SECTIONS="tests parity golden" OUT=$OUT timeout 420 bash bench/device/validate.sh
wait
echo done
