#!/usr/bin/env bash
# Session 25 (issues 12, 13), after s25a.sh: m3_verify on the f067e34
# build (runner incl. the fold bit-equality tests, backend_ops, golden
# through the GPU, parity small standard and mono) into $OUT/verify.log,
# then the figures of record (m3_record: PERF.md's protocol) into
# $OUT/table.json / table.log; FOLDS=1 records with both folds on
# (M3_FUSE_SWIGLU=1 M3_FOLD_COMBINE=1), for when s25a's layer A/B shows
# that they pay.
set -u
. bench/device/common.sh
m3_setup
m3_verify > $OUT/verify.log 2>&1
cat $OUT/verify.log
if [ "${FOLDS:-0}" = 1 ]; then export M3_FUSE_SWIGLU=1 M3_FOLD_COMBINE=1; fi
m3_record
